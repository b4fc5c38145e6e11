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
    statuses: Mutex<HashMap<String, Counter>>,
    ends: Mutex<HashMap<&'static str, Counter>>,
}

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
        if let Some(c) = statuses.get(status) {
            return c.increment(1);
        }
        let c = metrics::counter!("worker_relay_requests_total", "worker" => self.worker.clone(), "status" => status.to_owned());
        c.increment(1);
        statuses.insert(status.to_owned(), c);
    }

    /// `worker_relay_stream_ends_total{worker, reason}`.
    pub fn stream_end(&self, reason: &'static str) {
        let mut ends = self.ends.lock().unwrap_or_else(|e| e.into_inner());
        ends.entry(reason)
            .or_insert_with(|| {
                metrics::counter!("worker_relay_stream_ends_total", "worker" => self.worker.clone(), "reason" => reason)
            })
            .increment(1);
    }
}
