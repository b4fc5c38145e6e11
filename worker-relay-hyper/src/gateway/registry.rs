//! Who is connected: one relay connection per worker id, and the news of
//! workers coming and going.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, watch};
use worker_relay::connect::WorkerId;
use worker_relay::frame::CloseCode;
use worker_relay::rt::RelayHandle;

/// Flap damping, by default (see
/// [`GatewayBuilder::flap_damping`](super::GatewayBuilder::flap_damping)): a
/// worker id whose open connection was replaced this many times within
/// [`FLAP_WINDOW`] (two processes given one token, say, each
/// replacing the other as soon as its backoff allows) has its new
/// handshakes answered 429 until the oldest of those replacements is that
/// old: the duplicate's backoff grows (a refused handshake does not reset
/// it, as a successful one does), and the serving connection is left
/// alone.
pub const FLAP_REPLACEMENTS: usize = 3;

/// See [`FLAP_REPLACEMENTS`].
pub const FLAP_WINDOW: Duration = Duration::from_secs(30);

/// What happens when a worker connects while a connection of the same id is
/// still registered (a restarted worker whose old socket is not dead yet, or
/// two processes given one token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DuplicatePolicy {
    /// The new connection takes over, as after an HTTP/2 GOAWAY: new
    /// requests go to it, the old one finishes the streams it has (for at
    /// most [`GatewayBuilder::replace_grace`](super::GatewayBuilder::replace_grace)) and is then closed with
    /// [`CloseCode::REPLACED`](worker_relay::frame::CloseCode::REPLACED) (4000) and
    /// [`REPLACED`](worker_relay::connect::REPLACED). The default: a restarted worker is
    /// reachable at once, and a redeploy (the new process started, then the
    /// old one stopped) loses no request.
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
    peer: Option<SocketAddr>,
    since: std::time::SystemTime,
    /// The authorisation hook let it in (no token table did).
    by_hook: bool,
}

/// A connected worker, as [`Gateway::workers`](super::Gateway::workers)
/// reports it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// The worker.
    pub worker: WorkerId,
    /// When its connection was registered.
    pub connected_since: std::time::SystemTime,
    /// Its peer's address, when the server knows it.
    pub peer: Option<SocketAddr>,
    /// Its connection's counters.
    pub stats: worker_relay::proto::Stats,
    /// Why its previous connection ended, if it had one since the relay
    /// started.
    pub last_error: Option<String>,
}

#[derive(Default)]
struct State {
    conns: HashMap<WorkerId, Conn>,
    /// When each worker's open connection was replaced, within the flap
    /// window, and until when a warning about it has been logged.
    replaced: HashMap<WorkerId, (VecDeque<Instant>, Option<Instant>)>,
    /// Why each worker's last registered connection ended (forgotten some
    /// time after it left: `forget.rs`).
    last_end: HashMap<WorkerId, String>,
    /// For each worker that requests wait for (not connected), its
    /// registered connection as it comes and goes: each waiter is woken by
    /// its own worker's news only. Removed when its last waiter leaves, or
    /// all at once when the gateway drains (the waiters then give up).
    waiting: HashMap<WorkerId, watch::Sender<Option<RelayHandle>>>,
}

pub(crate) struct Registry {
    state: Mutex<State>,
    generation: AtomicU64,
    presence: broadcast::Sender<Presence>,
    policy: DuplicatePolicy,
    /// Flap damping: this many replacements within this window; `None`:
    /// off.
    flap: Option<(usize, Duration)>,
    /// How long a replaced connection may take to finish its streams.
    replace_grace: Duration,
    /// How many times waiters looked at their worker's connection (for
    /// tests: a waiter must not wake for other workers' news).
    #[cfg(test)]
    pub wakeups: AtomicU64,
}

/// The most [`Presence`] events a subscriber may lag behind: a larger
/// capacity asked for is this one (tokio's channel allocates it up front,
/// and panics past `usize::MAX / 2`).
pub const MAX_PRESENCE_CAPACITY: usize = 1 << 16;

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
    pub fn new(
        policy: DuplicatePolicy,
        presence_capacity: usize,
        flap: Option<(usize, Duration)>,
        replace_grace: Duration,
    ) -> Registry {
        Registry {
            replace_grace,
            flap: flap.filter(|(n, w)| *n > 0 && !w.is_zero()),
            state: Mutex::new(State::default()),
            generation: AtomicU64::new(1),
            presence: broadcast::channel(presence_capacity.clamp(1, MAX_PRESENCE_CAPACITY)).0,
            policy,
            #[cfg(test)]
            wakeups: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock left a consistent map:
        // every update is one insert or remove.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn policy(&self) -> DuplicatePolicy {
        self.policy
    }

    /// The worker's connection, unless it has started closing (its
    /// registration is about to go: the worker counts as not connected).
    pub fn handle(&self, worker: &str) -> Option<RelayHandle> {
        let handle = self.lock().conns.get(worker)?.handle.clone();
        (!handle.is_closed()).then_some(handle)
    }

    pub fn workers(&self) -> Vec<WorkerId> {
        self.lock().conns.keys().cloned().collect()
    }

    /// The open connections a token table let in (not the authorisation
    /// hook), with their workers.
    pub fn by_table(&self) -> Vec<(WorkerId, RelayHandle)> {
        self.lock()
            .conns
            .iter()
            .filter(|(_, c)| !c.by_hook && !c.handle.is_closed())
            .map(|(w, c)| (w.clone(), c.handle.clone()))
            .collect()
    }

    /// Forgets what is kept about `worker` (why its last connection ended,
    /// its flap record) unless it is registered.
    pub fn forget(&self, worker: &WorkerId) {
        let mut state = self.lock();
        if !state.conns.contains_key(worker) {
            state.last_end.remove(worker);
            state.replaced.remove(worker);
        }
    }

    /// `worker`'s connection once it has an open one, if that is before
    /// `deadline` and the gateway is not `draining` (none once it is).
    /// Woken by `worker`'s own news only, without this registry's lock.
    pub async fn wait_for(
        &self,
        worker: &WorkerId,
        deadline: tokio::time::Instant,
        draining: &std::sync::atomic::AtomicBool,
    ) -> Option<RelayHandle> {
        let rx = {
            let mut state = self.lock();
            // Under the lock: a drain clears the waiters after setting its
            // flag, so a waiter either sees the flag or is cleared.
            if draining.load(Ordering::SeqCst) {
                return None;
            }
            let current = state.conns.get(worker).map(|c| c.handle.clone());
            let tx = state
                .waiting
                .entry(worker.clone())
                .or_insert_with(|| watch::channel(current).0);
            tx.subscribe()
        };
        let mut waiter = Waiter {
            registry: self,
            worker,
            rx: Some(rx),
        };
        let rx = waiter.rx.as_mut().expect("set above");
        let open = rx.wait_for(|h| {
            #[cfg(test)]
            self.wakeups.fetch_add(1, Ordering::Relaxed);
            h.as_ref().is_some_and(|h| !h.is_closed())
        });
        let found = match tokio::time::timeout_at(deadline, open).await {
            Ok(Ok(handle)) => handle.clone(),
            // Past the deadline, or the gateway drains (the sender gone).
            Ok(Err(_)) | Err(_) => None,
        };
        found
    }

    /// Wakes every request waiting for a worker, to give up: the gateway
    /// drains.
    pub fn release_waiters(&self) {
        self.lock().waiting.clear();
    }

    /// How many workers' last ends are kept.
    #[cfg(test)]
    pub fn last_ends(&self) -> usize {
        self.lock().last_end.len()
    }

    /// How many workers requests wait for.
    #[cfg(test)]
    pub fn waited_for(&self) -> usize {
        self.lock().waiting.len()
    }

    pub fn infos(&self) -> Vec<WorkerInfo> {
        let state = self.lock();
        let mut infos: Vec<WorkerInfo> = state
            .conns
            .iter()
            .filter(|(_, c)| !c.handle.is_closed())
            .map(|(w, c)| WorkerInfo {
                worker: w.clone(),
                connected_since: c.since,
                peer: c.peer,
                stats: c.handle.stats(),
                last_error: state.last_end.get(w).cloned(),
            })
            .collect();
        infos.sort_by(|a, b| a.worker.cmp(&b.worker));
        infos
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Presence> {
        self.presence.subscribe()
    }

    /// Whether `worker`'s new handshakes are damped now (see
    /// [`FLAP_REPLACEMENTS`]): how long until they are not. Logs one
    /// warning per damping period, naming the worker and both peers (never
    /// the token).
    pub fn damped(&self, worker: &WorkerId, peer: Option<SocketAddr>) -> Option<Duration> {
        let (limit, window) = self.flap?;
        let now = Instant::now();
        let mut state = self.lock();
        let current = state
            .conns
            .get(worker)
            .filter(|c| !c.handle.is_closed())
            .map(|c| c.peer);
        let (times, warned) = state.replaced.get_mut(worker)?;
        times.retain(|t| now.duration_since(*t) < window);
        let serving = current?;
        if times.len() < limit {
            return None;
        }
        // A window too long to add is for ever (a century).
        let until = times[times.len() - limit];
        let until = until
            .checked_add(window)
            .or_else(|| until.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
            .unwrap_or(until);
        if warned.is_none_or(|w| w < now) {
            *warned = Some(until);
            let addr = |a: Option<SocketAddr>| a.map_or("?".into(), |a| a.to_string());
            tracing::warn!(
                "worker {worker}: its connection was replaced {} times in {} s; two processes \
                 may share its token (serving: {}, dialling: {}); answering its new handshakes \
                 429 for {} s",
                times.len(),
                window.as_secs(),
                addr(serving),
                addr(peer),
                until.duration_since(now).as_secs().max(1)
            );
        }
        Some(until.duration_since(now).max(Duration::from_secs(1)))
    }

    /// Registers `handle` as `worker`'s connection, replacing (and closing)
    /// any earlier one, or refusing if the policy says so and one is there.
    /// The news goes out while the registry is locked, so subscribers get
    /// it in order.
    pub fn register(
        &self,
        worker: WorkerId,
        handle: RelayHandle,
        peer: Option<SocketAddr>,
        by_hook: bool,
    ) -> Option<Registration<'_>> {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let mut state = self.lock();
        // A closing connection is on its way out: it refuses nobody.
        let open = state
            .conns
            .get(&worker)
            .is_some_and(|c| !c.handle.is_closed());
        if self.policy == DuplicatePolicy::Refuse && open {
            return None;
        }
        if let Some(waiting) = state.waiting.get(&worker) {
            waiting.send_replace(Some(handle.clone()));
        }
        let conn = Conn {
            generation,
            handle,
            peer,
            since: std::time::SystemTime::now(),
            by_hook,
        };
        if let Some(old) = state.conns.insert(worker.clone(), conn) {
            if open {
                tracing::info!(
                    "worker {worker} reconnected; its previous connection finishes its streams \
                     (at most {} s), then closes",
                    self.replace_grace.as_secs()
                );
            }
            tokio::spawn(retire(old.handle, self.replace_grace));
            if let (true, Some((_, window))) = (open, self.flap) {
                let now = Instant::now();
                let (times, _) = state.replaced.entry(worker.clone()).or_default();
                times.retain(|t| now.duration_since(*t) < window);
                times.push_back(now);
                // Only the last `limit` count (a long window must not
                // keep every replacement).
                let limit = self.flap.map_or(0, |(n, _)| n);
                while times.len() > limit {
                    times.pop_front();
                }
            }
        }
        crate::observe::relay::workers_connected(state.conns.len());
        let _ = self.presence.send(Presence::Connected {
            worker: worker.clone(),
        });
        drop(state);
        Some(Registration {
            registry: self,
            worker,
            generation,
            reason: "the connection's task ended".into(),
        })
    }
}

/// Closes a replaced connection ([`CloseCode::REPLACED`], 4000,
/// [`REPLACED`](worker_relay::connect::REPLACED)) once
/// its streams are done and slow callers have taken their responses out of
/// the overflow store, once `grace` has passed, or once it has taken
/// nothing of what waits for it for [`STUCK`] (a peer that stopped
/// reading: a live process being redeployed reads). No new stream is
/// opened on it meanwhile; it is no longer registered.
async fn retire(handle: RelayHandle, grace: Duration) {
    let start = tokio::time::Instant::now();
    let mut sent = (handle.stats().bytes_out, start);
    while !handle.is_closed() {
        let now = tokio::time::Instant::now();
        let stats = handle.stats();
        if stats.bytes_out != sent.0 {
            sent = (stats.bytes_out, now);
        }
        let idle = stats.streams_open == 0 && stats.overflow_bytes == 0;
        let stuck = stats.body_queued_out > 0 && now.duration_since(sent.1) >= STUCK;
        if idle || stuck || now.duration_since(start) >= grace {
            handle.close(CloseCode::REPLACED, worker_relay::connect::REPLACED);
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a replaced connection may take nothing of the data queued for
/// it before it is closed without waiting for its streams.
const STUCK: Duration = Duration::from_secs(5);

impl Registration<'_> {
    /// Whether this is still its worker's registered connection (not
    /// replaced by a newer one).
    pub fn is_current(&self) -> bool {
        self.registry
            .lock()
            .conns
            .get(&self.worker)
            .is_some_and(|c| c.generation == self.generation)
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let mut state = self.registry.lock();
        let current = state
            .conns
            .get(&self.worker)
            .is_some_and(|c| c.generation == self.generation);
        if !current {
            return; // replaced: the newer connection is the worker's presence
        }
        state.conns.remove(&self.worker);
        if let Some(waiting) = state.waiting.get(&self.worker) {
            waiting.send_replace(None);
        }
        crate::observe::relay::workers_connected(state.conns.len());
        state
            .last_end
            .insert(self.worker.clone(), self.reason.clone());
        if state
            .replaced
            .get(&self.worker)
            .is_some_and(|(times, _)| times.is_empty())
        {
            state.replaced.remove(&self.worker);
        }
        let _ = self.registry.presence.send(Presence::Disconnected {
            worker: self.worker.clone(),
            reason: std::mem::take(&mut self.reason),
        });
    }
}

/// A request waiting for its worker; when the last one for a worker
/// leaves, the worker's entry goes.
struct Waiter<'a> {
    registry: &'a Registry,
    worker: &'a WorkerId,
    rx: Option<watch::Receiver<Option<RelayHandle>>>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut state = self.registry.lock();
        if state
            .waiting
            .get(self.worker)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            state.waiting.remove(self.worker);
        }
    }
}
