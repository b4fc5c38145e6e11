//! Forgetting workers some time after they leave: the workers the
//! authorisation hook let in, and what the gateway keeps per worker (why
//! its last connection ended, its flap record, its metric handles), so
//! that a hook admitting ever new ids does not grow the gateway without
//! bound.
//!
//! Each worker that leaves (its connection ended, the hook let it in, the
//! token table dropped it) is idle from then on; once idle for the
//! gateway's forget time and not connected, it is forgotten. Forgetting is
//! done by whoever touches the gateway next (a handshake, a disconnect, a
//! caller's request for a hook's worker): oldest first, so each look costs
//! only what is due.

use super::upload::after;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;
use worker_relay::connect::WorkerId;

/// How long a worker that is not connected is remembered, by default (see
/// [`GatewayBuilder::forget_after`](super::GatewayBuilder::forget_after)).
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

pub(super) struct Forgetting {
    after: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The workers the authorisation hook let in, and not forgotten since.
    admitted: HashSet<WorkerId>,
    /// Since when each worker has been idle (left, or let in by the hook
    /// without a connection yet).
    idle: HashMap<WorkerId, Instant>,
    /// The same, oldest first; an entry older than the worker's `idle`
    /// time is stale.
    queue: VecDeque<(Instant, WorkerId)>,
}

impl Forgetting {
    pub fn new(after: Duration) -> Forgetting {
        Forgetting {
            after,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the maps consistent enough: at worst a worker
        // is forgotten late.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The authorisation hook let `worker` in: it is known from now on
    /// (until forgotten), and idle until it connects.
    pub fn admit(&self, worker: &WorkerId) {
        let mut state = self.lock();
        state.admitted.insert(worker.clone());
        state.mark_idle(worker);
    }

    /// Whether the authorisation hook let `worker` in, and it has not been
    /// forgotten since.
    pub fn admitted(&self, worker: &str) -> bool {
        self.lock().admitted.contains(worker)
    }

    /// `worker` left (its connection ended, or the token table dropped it):
    /// idle from now on.
    pub fn left(&self, worker: &WorkerId) {
        self.lock().mark_idle(worker);
    }

    /// The workers idle for the forget time and not `connected`, forgotten
    /// here (no longer admitted); the caller forgets the rest of what it
    /// keeps about them. A worker still connected is idle again only once
    /// it leaves.
    pub fn due(&self, connected: impl Fn(&str) -> bool) -> Vec<WorkerId> {
        let now = Instant::now();
        let mut state = self.lock();
        let mut gone = Vec::new();
        while let Some((since, _)) = state.queue.front() {
            if after(*since, self.after) > now {
                break;
            }
            let (since, worker) = state.queue.pop_front().expect("looked at");
            if state.idle.get(&worker) != Some(&since) {
                continue; // idle again since: a newer entry stands for it
            }
            state.idle.remove(&worker);
            if !connected(worker.as_str()) {
                state.admitted.remove(&worker);
                gone.push(worker);
            }
        }
        gone
    }

    /// How many workers are remembered: let in by the hook, or idle.
    #[cfg(test)]
    pub fn remembered(&self) -> (usize, usize, usize) {
        let state = self.lock();
        (state.admitted.len(), state.idle.len(), state.queue.len())
    }
}

impl State {
    fn mark_idle(&mut self, worker: &WorkerId) {
        let now = Instant::now();
        self.idle.insert(worker.clone(), now);
        self.queue.push_back((now, worker.clone()));
    }
}
