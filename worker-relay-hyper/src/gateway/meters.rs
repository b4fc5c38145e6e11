//! The relay's per-worker metric handles, made once per worker (and per
//! status, per end reason) rather than looked up by name and labels on
//! every request: a look-up builds the labels and hashes them, several
//! times per request.
//!
//! Handles are bound to the recorder installed when they are made: a
//! gateway's are made from its first request on, so install the recorder
//! before the gateway serves.

use metrics::{Counter, Gauge, Histogram};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

/// Every worker's handles, by worker label (bounded by the token table and
/// the authorisation hook's admitted workers, plus `unknown`; a worker's
/// go when it is forgotten, some time after it left).
#[derive(Default)]
pub(super) struct Meters {
    by_worker: RwLock<HashMap<String, Arc<WorkerMeters>>>,
}

/// One worker's handles.
pub(super) struct WorkerMeters {
    worker: String,
    pub duration: Histogram,
    pub response_start: Histogram,
    pub up: Counter,
    pub down: Counter,
    pub streams_open: Gauge,
    /// By status, as they come (a short list: a scan costs less than a
    /// hash), at most [`STATUSES_KEPT`].
    statuses: Mutex<Vec<(Box<str>, Counter)>>,
    /// By end reason (the gateway's few static reasons).
    ends: Mutex<Vec<(&'static str, Counter)>>,
}

/// The most statuses a worker keeps handles for: one that answers with more
/// distinct statuses has the rest looked up by the recorder each time.
const STATUSES_KEPT: usize = 32;

impl Meters {
    pub fn worker(&self, worker: &str) -> Arc<WorkerMeters> {
        if let Some(m) = self
            .by_worker
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(worker)
        {
            return m.clone();
        }
        let mut map = self.by_worker.write().unwrap_or_else(|e| e.into_inner());
        map.entry(worker.to_owned())
            .or_insert_with(|| Arc::new(WorkerMeters::new(worker)))
            .clone()
    }
}

impl Meters {
    /// Drops `worker`'s handles (a request holding them keeps them; the
    /// next one makes new ones, for the same series).
    pub fn forget(&self, worker: &str) {
        self.by_worker
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(worker);
    }

    /// How many workers have handles.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_worker
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

impl WorkerMeters {
    fn new(worker: &str) -> WorkerMeters {
        let w = worker.to_owned();
        WorkerMeters {
            duration: metrics::histogram!("worker_relay_request_duration_seconds", "worker" => w.clone()),
            response_start: metrics::histogram!("worker_relay_response_start_seconds", "worker" => w.clone()),
            up: metrics::counter!("worker_relay_bytes_total", "worker" => w.clone(), "direction" => "up"),
            down: metrics::counter!("worker_relay_bytes_total", "worker" => w.clone(), "direction" => "down"),
            streams_open: metrics::gauge!("worker_relay_streams_open", "worker" => w.clone()),
            worker: w,
            statuses: Mutex::default(),
            ends: Mutex::default(),
        }
    }

    /// `worker_relay_requests_total{worker, status}`.
    pub fn request(&self, status: &str) {
        let mut statuses = self.statuses.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, c)) = statuses.iter().find(|(s, _)| &**s == status) {
            return c.increment(1);
        }
        let c = metrics::counter!("worker_relay_requests_total", "worker" => self.worker.clone(), "status" => status.to_owned());
        c.increment(1);
        if statuses.len() < STATUSES_KEPT {
            statuses.push((status.into(), c));
        }
    }

    /// `worker_relay_stream_ends_total{worker, reason}`.
    pub fn stream_end(&self, reason: &'static str) {
        let mut ends = self.ends.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, c)) = ends.iter().find(|(r, _)| *r == reason) {
            return c.increment(1);
        }
        let c = metrics::counter!("worker_relay_stream_ends_total", "worker" => self.worker.clone(), "reason" => reason);
        c.increment(1);
        ends.push((reason, c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::test_recorder::Counts;

    #[test]
    fn every_status_and_end_is_counted_past_the_handles_kept() {
        let counts = Counts::default();
        let m = metrics::with_local_recorder(&counts, || {
            let m = WorkerMeters::new("w1");
            // 200 first, then 100 other statuses, 200 again after each.
            m.request("200");
            for s in 300..400 {
                m.request(&s.to_string());
                m.request("200");
            }
            for _ in 0..3 {
                m.stream_end("completed");
                m.stream_end("caller_gone");
            }
            m
        });
        assert_eq!(m.statuses.lock().unwrap().len(), STATUSES_KEPT);
        assert_eq!(
            counts.get("worker_relay_requests_total{worker=w1,status=200}"),
            101
        );
        for s in 300..400 {
            let key = format!("worker_relay_requests_total{{worker=w1,status={s}}}");
            assert_eq!(counts.get(&key), 1, "{key}");
        }
        // A kept handle still counts once the recorder is out of scope.
        m.request("301");
        assert_eq!(
            counts.get("worker_relay_requests_total{worker=w1,status=301}"),
            2
        );
        for reason in ["completed", "caller_gone"] {
            let key = format!("worker_relay_stream_ends_total{{worker=w1,reason={reason}}}");
            assert_eq!(counts.get(&key), 3, "{key}");
        }
    }
}
