//! What the gateway and the tunnel tell an operator: metrics, recorded
//! through the [`metrics`](https://docs.rs/metrics) facade when the
//! `metrics` feature is on (the program installs the exporter; without one
//! every record is a no-op), and the access log, one `tracing` event per
//! forwarded request with the target [`ACCESS_TARGET`](crate::gateway::ACCESS_TARGET).
//!
//! The names and labels are documented in `docs/operations.md`; dashboards
//! and alerts depend on them, so they do not change. The `worker` label is
//! bounded by the token table (and the authorisation hook's admitted
//! workers): a request for an id the relay does not know is labelled
//! `unknown`.

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

#[cfg(feature = "metrics")]
macro_rules! record {
    ($($t:tt)*) => { { $($t)* } };
}

#[cfg(not(feature = "metrics"))]
macro_rules! record {
    ($($t:tt)*) => {};
}

/// Gives every metric of `side` its help text and unit, for the recorder
/// installed now (call it after installing one: a description given to
/// none is lost). Cheap; called when a gateway is built and when a tunnel
/// starts.
#[cfg(feature = "metrics")]
pub(crate) fn describe(relay_side: bool) {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    if relay_side {
        describe_gauge!(
            "worker_relay_workers_connected",
            "Workers holding a connection to this relay now."
        );
        describe_counter!(
            "worker_relay_handshakes_total",
            "Workers' WebSocket handshakes by the relay's answer."
        );
        describe_counter!("worker_relay_requests_total", "Callers' requests that ended, by the status the caller got (aborted: failed after its head).");
        describe_histogram!(
            "worker_relay_request_duration_seconds",
            Unit::Seconds,
            "From a request's arrival to the end of its response."
        );
        describe_histogram!(
            "worker_relay_response_start_seconds",
            Unit::Seconds,
            "From a request's arrival to its response head, for requests that reached the worker."
        );
        describe_gauge!(
            "worker_relay_streams_open",
            "Requests in flight to the worker now."
        );
        describe_counter!(
            "worker_relay_bytes_total",
            Unit::Bytes,
            "Body bytes carried: up from callers, down to them."
        );
        describe_counter!(
            "worker_relay_stream_ends_total",
            "How each stream on a worker's connection ended."
        );
        describe_gauge!(
            "worker_relay_overflow_bytes",
            Unit::Bytes,
            "Bytes of slow callers' responses held in the overflow stores now."
        );
        describe_counter!(
            "worker_relay_keepalive_timeouts_total",
            "Worker connections dropped because the keepalive found them dead."
        );
    } else {
        describe_gauge!(
            "worker_relay_worker_connected",
            "1 while the worker holds a connection to its relay, else 0."
        );
        describe_counter!(
            "worker_relay_worker_connects_total",
            "The worker's dials by their outcome."
        );
        describe_counter!(
            "worker_relay_worker_requests_total",
            "Requests the worker served, by the status it sent (aborted: failed after its head)."
        );
        describe_gauge!(
            "worker_relay_worker_streams_open",
            "Requests in flight at the worker now."
        );
        describe_counter!(
            "worker_relay_worker_bytes_total",
            Unit::Bytes,
            "Body bytes: up from callers, down to them."
        );
    }
}

/// The relay's side.
#[cfg(feature = "registry")]
pub(crate) mod relay {
    /// A worker's handshake ended: `accepted`, `unauthorized`,
    /// `bad_request`, `refused` (503: draining, a duplicate refused) or
    /// `rate_limited` (429, flap damping).
    pub fn handshake(result: &'static str) {
        let _ = result;
        record!(
            metrics::counter!("worker_relay_handshakes_total", "result" => result).increment(1)
        );
    }

    /// How many workers are connected now.
    pub fn workers_connected(n: usize) {
        let _ = n;
        record!(metrics::gauge!("worker_relay_workers_connected").set(n as f64));
    }

    /// A worker connection was declared dead by its keepalive.
    pub fn keepalive_timeout() {
        record!(metrics::counter!("worker_relay_keepalive_timeouts_total").increment(1));
    }

    /// Bytes of slow callers' responses now in the overflow stores (a
    /// change of `delta`).
    #[cfg(feature = "metrics")]
    pub fn overflow_bytes(delta: i64) {
        let _ = delta;
        record!({
            let g = metrics::gauge!("worker_relay_overflow_bytes");
            if delta >= 0 {
                g.increment(delta as f64)
            } else {
                g.decrement(-delta as f64)
            }
        });
    }
}

/// The worker's side.
#[cfg(feature = "tunnel")]
pub(crate) mod worker {
    /// Whether the worker is connected now.
    pub fn connected(up: bool) {
        let _ = up;
        record!(metrics::gauge!("worker_relay_worker_connected").set(if up { 1.0 } else { 0.0 }));
    }

    /// A dial ended: `connected`, `refused` (for good) or `failed` (retried).
    pub fn connect(result: &'static str) {
        let _ = result;
        record!(
            metrics::counter!("worker_relay_worker_connects_total", "result" => result)
                .increment(1)
        );
    }

    /// A connection's per-request meters: the handles registered once,
    /// with the recorder installed when the connection opened, rather than
    /// a key (and its label list) built and looked up for every request.
    /// Cloned into each request's task: one shared set per connection.
    #[derive(Clone, Default)]
    pub struct Meters {
        #[cfg(feature = "metrics")]
        inner: std::sync::Arc<Inner>,
    }

    #[cfg(feature = "metrics")]
    struct Inner {
        open: metrics::Gauge,
        up: metrics::Counter,
        down: metrics::Counter,
        /// `worker_relay_worker_requests_total` by status, as they come.
        requests: std::sync::Mutex<Vec<(Box<str>, metrics::Counter)>>,
    }

    #[cfg(feature = "metrics")]
    impl Default for Inner {
        fn default() -> Inner {
            Inner {
                open: metrics::gauge!("worker_relay_worker_streams_open"),
                up: metrics::counter!("worker_relay_worker_bytes_total", "direction" => "up"),
                down: metrics::counter!("worker_relay_worker_bytes_total", "direction" => "down"),
                requests: std::sync::Mutex::new(Vec::new()),
            }
        }
    }

    /// The most statuses a connection keeps a handle for; an app that
    /// answers with more distinct ones has the rest looked up each time.
    #[cfg(feature = "metrics")]
    const STATUSES_KEPT: usize = 32;

    impl Meters {
        /// Handles on the recorder installed now.
        pub fn new() -> Meters {
            Meters::default()
        }

        /// A request is being served; the guard counts it open until
        /// dropped.
        pub fn stream_open(&self) -> StreamGuard {
            #[cfg(feature = "metrics")]
            {
                self.inner.open.increment(1.0);
                StreamGuard(self.inner.open.clone())
            }
            #[cfg(not(feature = "metrics"))]
            StreamGuard(())
        }

        /// A request was answered with `status` (a number, or `aborted`
        /// for a response that failed after it started).
        pub fn request(&self, status: &str) {
            let _ = status;
            #[cfg(feature = "metrics")]
            {
                let mut kept = self
                    .inner
                    .requests
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some((_, c)) = kept.iter().find(|(s, _)| &**s == status) {
                    return c.increment(1);
                }
                let counter = metrics::counter!("worker_relay_worker_requests_total", "status" => status.to_owned());
                counter.increment(1);
                if kept.len() < STATUSES_KEPT {
                    kept.push((status.into(), counter));
                }
            }
        }

        /// Body bytes: `up` from the relay (requests).
        pub fn bytes_up(&self, n: u64) {
            let _ = n;
            #[cfg(feature = "metrics")]
            if n > 0 {
                self.inner.up.increment(n);
            }
        }

        /// Body bytes: `down` to the relay (responses).
        pub fn bytes_down(&self, n: u64) {
            let _ = n;
            #[cfg(feature = "metrics")]
            if n > 0 {
                self.inner.down.increment(n);
            }
        }
    }

    /// Counts a request open on the worker while it lives.
    pub struct StreamGuard(
        #[cfg(feature = "metrics")] metrics::Gauge,
        #[cfg(not(feature = "metrics"))] (),
    );

    impl Drop for StreamGuard {
        fn drop(&mut self) {
            #[cfg(feature = "metrics")]
            self.0.decrement(1.0);
        }
    }

    #[cfg(all(test, feature = "metrics"))]
    mod tests {
        use super::*;
        use crate::observe::test_recorder::Counts;

        #[test]
        fn a_connections_meters_count_every_request_and_byte() {
            let counts = Counts::default();
            let m = metrics::with_local_recorder(&counts, || {
                let m = Meters::new();
                for s in 100..200 {
                    m.request(&s.to_string());
                    m.request("200");
                    m.bytes_up(s);
                    m.bytes_down(2 * s);
                }
                m.bytes_up(0);
                // Clones share the handles.
                let c = m.clone();
                c.request("aborted");
                m.request("aborted");
                m
            });
            assert_eq!(m.inner.requests.lock().unwrap().len(), STATUSES_KEPT);
            assert_eq!(
                counts.get("worker_relay_worker_requests_total{status=200}"),
                100
            );
            for s in 100..200 {
                let key = format!("worker_relay_worker_requests_total{{status={s}}}");
                assert_eq!(counts.get(&key), 1, "{key}");
            }
            let sum: u64 = (100..200).sum();
            assert_eq!(
                counts.get("worker_relay_worker_bytes_total{direction=up}"),
                sum
            );
            assert_eq!(
                counts.get("worker_relay_worker_bytes_total{direction=down}"),
                2 * sum
            );
            assert_eq!(
                counts.get("worker_relay_worker_requests_total{status=aborted}"),
                2
            );
            // 100..=199, `200` and `aborted`; two byte series.
            assert_eq!(counts.series(), 102 + 2);
            // A kept handle still counts once the recorder is out of scope.
            m.request("100");
            assert_eq!(
                counts.get("worker_relay_worker_requests_total{status=100}"),
                2
            );
        }
    }
}

/// A shared count of body bytes.
#[derive(Debug, Clone, Default)]
pub(crate) struct ByteCount(Arc<AtomicU64>);

impl ByteCount {
    pub fn add(&self, n: usize) {
        self.0.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A body whose data bytes are counted as they are read.
pub(crate) struct Counted<B> {
    body: B,
    count: ByteCount,
}

impl<B> Counted<B> {
    pub fn new(body: B, count: ByteCount) -> Counted<B> {
        Counted { body, count }
    }
}

impl<B: Body + Unpin> Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.count.add(data.remaining());
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A recorder for tests: every counter's count by its name and labels
/// (`name{k=v,…}`), gauges and histograms dropped.
#[cfg(all(test, feature = "metrics"))]
pub(crate) mod test_recorder {
    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    pub struct Counts(Mutex<HashMap<String, Arc<AtomicU64>>>);

    impl Counts {
        /// The count of `name{labels}` (0 if never registered).
        pub fn get(&self, key: &str) -> u64 {
            self.0
                .lock()
                .unwrap()
                .get(key)
                .map_or(0, |c| c.load(Ordering::Relaxed))
        }

        /// How many series were registered.
        pub fn series(&self) -> usize {
            self.0.lock().unwrap().len()
        }
    }

    impl Recorder for Counts {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            Counter::from_arc(self.0.lock().unwrap().entry(name).or_default().clone())
        }

        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }

        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }
}
