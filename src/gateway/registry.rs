//! Who is connected: one relay connection per worker id, and the news of
//! workers coming and going.

use crate::connect::WorkerId;
use crate::frame::CloseCode;
use crate::rt::RelayHandle;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::broadcast;

/// What happens when a worker connects while a connection of the same id is
/// still registered (a restarted worker whose old socket is not dead yet, or
/// two processes given one token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DuplicatePolicy {
    /// The new connection takes over; the old one is closed with 1008
    /// ("replaced by a new connection") and its requests in flight fail
    /// with 502. The default: a restarted worker is reachable at once.
    #[default]
    Replace,
    /// The new connection is refused with 503 and `Retry-After: 1` (so the
    /// worker retries with its backoff) until the old one is gone, at the
    /// latest when its keepalive declares it dead.
    Refuse,
}

/// A worker came or went.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Presence {
    /// The worker's connection is registered: requests go to it now.
    Connected {
        /// The worker.
        worker: WorkerId,
    },
    /// The worker's registered connection ended: no connection of it is left.
    /// (A connection replaced by a newer one ends without this news: the
    /// worker is still connected.)
    Disconnected {
        /// The worker.
        worker: WorkerId,
        /// Why, for logs.
        reason: String,
    },
}

struct Conn {
    generation: u64,
    handle: RelayHandle,
}

pub(crate) struct Registry {
    workers: Mutex<HashMap<WorkerId, Conn>>,
    generation: AtomicU64,
    presence: broadcast::Sender<Presence>,
    policy: DuplicatePolicy,
}

/// A registered connection; dropping it (the connection started closing, or
/// its task ended, even by a panic or a cancel) removes it from the
/// registry, unless a newer connection of the same worker has replaced it.
pub(crate) struct Registration<'a> {
    registry: &'a Registry,
    worker: WorkerId,
    generation: u64,
    pub reason: String,
}

impl Registry {
    pub fn new(policy: DuplicatePolicy, presence_capacity: usize) -> Registry {
        Registry {
            workers: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(1),
            presence: broadcast::channel(presence_capacity.max(1)).0,
            policy,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<WorkerId, Conn>> {
        // A panic elsewhere while holding the lock left a consistent map:
        // every update is one insert or remove.
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn policy(&self) -> DuplicatePolicy {
        self.policy
    }

    /// The worker's connection, unless it has started closing (its
    /// registration is about to go: the worker counts as not connected).
    pub fn handle(&self, worker: &str) -> Option<RelayHandle> {
        let handle = self.lock().get(worker)?.handle.clone();
        (!handle.is_closed()).then_some(handle)
    }

    pub fn workers(&self) -> Vec<WorkerId> {
        self.lock().keys().cloned().collect()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Presence> {
        self.presence.subscribe()
    }

    /// Registers `handle` as `worker`'s connection, replacing (and closing)
    /// any earlier one, or refusing if the policy says so and one is there.
    pub fn register(&self, worker: WorkerId, handle: RelayHandle) -> Option<Registration<'_>> {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let old = {
            let mut workers = self.lock();
            // A closing connection is on its way out: it refuses nobody.
            let open = workers.get(&worker).is_some_and(|c| !c.handle.is_closed());
            if self.policy == DuplicatePolicy::Refuse && open {
                return None;
            }
            workers.insert(worker.clone(), Conn { generation, handle })
        };
        if let Some(old) = old {
            tracing::info!("worker {worker} reconnected; closing its previous connection");
            old.handle
                .close(CloseCode::POLICY_VIOLATION, "replaced by a new connection");
        }
        let _ = self.presence.send(Presence::Connected {
            worker: worker.clone(),
        });
        Some(Registration {
            registry: self,
            worker,
            generation,
            reason: "the connection's task ended".into(),
        })
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let current = {
            let mut workers = self.registry.lock();
            let current = workers
                .get(&self.worker)
                .is_some_and(|c| c.generation == self.generation);
            if current {
                workers.remove(&self.worker);
            }
            current
        };
        if !current {
            return; // replaced: the newer connection is the worker's presence
        }
        let _ = self.registry.presence.send(Presence::Disconnected {
            worker: self.worker.clone(),
            reason: std::mem::take(&mut self.reason),
        });
    }
}
