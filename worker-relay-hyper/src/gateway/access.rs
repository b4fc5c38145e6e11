//! One forwarded request as the operator sees it: its metrics and its
//! access log line, recorded once, when it is over (its response body
//! ended, failed, or was dropped).

use super::access_log::{AccessLog, AccessRecord};
use crate::observe::ByteCount;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use worker_relay::connect::WorkerId;

/// The `tracing` target of the access log: one event per request that
/// reached [`Forward`](super::Forward), at `info`, when its response is
/// over, with the fields `worker`, `method`, `path` (without the query),
/// `status` (or `aborted`: the response failed after it started),
/// `bytes_up` (the caller's body), `bytes_down` (the response body),
/// `duration_ms` (milliseconds to the microsecond: at most 3 decimals),
/// `end` (how it ended: `completed`, `caller_gone`,
/// `worker_abort`, `lost`, `stall`, `overflow`, `protocol_error`,
/// `timeout`, `caller_failed`, or `answered` for the gateway's own answer)
/// and `peer`. No header value, so no token, is ever logged.
pub const ACCESS_TARGET: &str = "worker_relay::access";

/// The longest path an access log line carries (the rest is cut).
const MAX_LOGGED_PATH: usize = 1024;

pub(super) struct Access {
    /// The worker's id if it is a known one, else `unknown` (the label is
    /// bounded by the token table).
    worker: Option<WorkerId>,
    method: http::Method,
    /// The request's path, cut to [`MAX_LOGGED_PATH`] bytes. A copy: the
    /// URI shares hyper's read buffer, which a long response would keep
    /// alive (up to the largest head hyper reads, per request).
    path: String,
    peer: Option<SocketAddr>,
    start: Instant,
    status: u16,
    /// A stream was opened on the worker's connection.
    stream: bool,
    /// How it ended.
    pub end: &'static str,
    /// The response failed after it started.
    pub failed: bool,
    pub up: ByteCount,
    pub down: u64,
    /// The response body is over (ended or failed).
    over: bool,
    /// The response's Content-Length: a server stops reading the body
    /// once it has that many bytes, without asking for its end.
    length: Option<u64>,
    /// Where the record goes; `None`: the `tracing` event.
    log: Option<std::sync::Arc<dyn AccessLog>>,
    /// Where the metric handles are, and this worker's.
    #[cfg(feature = "metrics")]
    meters: (
        std::sync::Arc<super::Inner>,
        Option<std::sync::Arc<super::meters::WorkerMeters>>,
    ),
}

impl Access {
    /// `peer`: the caller's address if the service was told it for its
    /// connection; else the request's [`PeerAddr`](crate::PeerAddr), if any.
    pub fn new(
        parts: &http::request::Parts,
        inner: &std::sync::Arc<super::Inner>,
        peer: Option<SocketAddr>,
    ) -> Access {
        Access {
            worker: None,
            method: parts.method.clone(),
            path: logged_path(parts.uri.path()).to_owned(),
            peer: peer.or_else(|| parts.extensions.get::<crate::PeerAddr>().map(|p| p.0)),
            start: Instant::now(),
            status: 0,
            stream: false,
            end: "answered",
            failed: false,
            up: ByteCount::default(),
            down: 0,
            over: false,
            length: None,
            log: inner.access_log.clone(),
            #[cfg(feature = "metrics")]
            meters: (inner.clone(), None),
        }
    }

    /// The request is for this known worker (its metrics from now on).
    pub fn worker(&mut self, worker: &WorkerId) {
        let _ = worker;
        #[cfg(feature = "metrics")]
        {
            self.meters.1 = Some(self.meters.0.meters.worker(worker.as_str()));
        }
    }

    /// The known worker's id, for the line.
    pub fn set_worker(&mut self, worker: WorkerId) {
        self.worker = Some(worker);
    }

    /// This request's worker's metric handles.
    #[cfg(feature = "metrics")]
    fn meters(&mut self) -> std::sync::Arc<super::meters::WorkerMeters> {
        let (inner, mine) = &mut self.meters;
        mine.get_or_insert_with(|| inner.meters.worker("unknown"))
            .clone()
    }

    /// A stream was opened for it on the worker's connection.
    pub fn stream_opened(&mut self) {
        if self.stream {
            return; // sent again on another connection: one stream to count
        }
        self.stream = true;
        self.end = "completed";
        record!(self.meters().streams_open.increment(1.0));
    }

    /// The response head is going to the caller.
    pub fn head(&mut self, status: u16, headers: &http::HeaderMap) {
        self.status = status;
        // No body follows (RFC 9110 §6.4.1): nothing will be read.
        if self.method == http::Method::HEAD || status == 204 || status == 304 {
            self.length = Some(0);
        } else {
            self.length = headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok());
        }
        if self.stream {
            record!(self
                .meters()
                .response_start
                .record(self.start.elapsed().as_secs_f64()));
        }
    }
}

impl Access {
    /// Whether the response body is over (ended or failed).
    pub fn is_over(&self) -> bool {
        self.over
    }

    /// The response body ended cleanly.
    pub fn ended(&mut self) {
        self.over = true;
    }

    /// The response body failed after the response started.
    pub fn failed_with(&mut self, e: &worker_relay::rt::BodyError) {
        use worker_relay::rt::BodyError;
        self.over = true;
        self.failed = true;
        self.end = match e {
            BodyError::Aborted => "worker_abort",
            BodyError::ProtocolError => "protocol_error",
            BodyError::Stalled => "stall",
            BodyError::Overflow => "overflow",
            BodyError::RequestAborted => "caller_failed",
            _ => "lost",
        };
    }
}

impl Drop for Access {
    fn drop(&mut self) {
        if self.status == 0 {
            // Dropped before its head: the caller left (nginx's 499).
            self.status = 499;
            self.end = "caller_gone";
        } else if !self.over && self.length == Some(self.down) {
            // All of it was read: the server did not need to ask for its end.
        } else if !self.over && self.stream {
            self.end = "caller_gone";
        }
        let took: Duration = self.start.elapsed();
        // Without an allocation: a line per request.
        let code = http::StatusCode::from_u16(self.status).ok();
        let status = match code.as_ref() {
            Some(code) if !self.failed => code.as_str(),
            _ if !self.failed => "-",
            _ => "aborted",
        };
        let up = self.up.get();
        record!({
            let m = self.meters();
            m.request(status);
            m.duration.record(took.as_secs_f64());
            if up > 0 {
                m.up.increment(up);
            }
            if self.down > 0 {
                m.down.increment(self.down);
            }
            if self.stream {
                m.streams_open.decrement(1.0);
                m.stream_end(self.end);
            }
        });
        let record = AccessRecord {
            worker: self.worker.as_ref().map_or("unknown", WorkerId::as_str),
            method: self.method.as_str(),
            path: &self.path,
            status,
            bytes_up: up,
            bytes_down: self.down,
            duration: took,
            end: self.end,
            peer: self.peer,
        };
        match &self.log {
            Some(log) => log.record(&record),
            None => record.trace(),
        }
    }
}

/// The path the line carries: without the query, cut to
/// [`MAX_LOGGED_PATH`] bytes.
fn logged_path(path: &str) -> &str {
    if path.len() <= MAX_LOGGED_PATH {
        return path;
    }
    let mut cut = MAX_LOGGED_PATH;
    while !path.is_char_boundary(cut) {
        cut -= 1;
    }
    &path[..cut]
}
