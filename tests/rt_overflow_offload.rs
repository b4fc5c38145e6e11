//! Issue 39, in the async layer (on `futures::executor`, one thread): an
//! overflow store that runs its work on a thread of its own
//! (`Overflow::spawn`) holds up nobody but its stream. While its
//! operations are stuck, the connection serves its other requests; once
//! they go on, the spilled response comes back whole and in order; a
//! store that fails gives up its stream alone.
mod common;

use bytes::Bytes;
use common::mem::{socket_pair, FuturesTimer};
use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use futures::{SinkExt, StreamExt};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use worker_relay::frame::{Headers, RequestHead, ResponseHead};
use worker_relay::proto::{OverflowConfig, RelayConfig, WorkerConfig};
use worker_relay::rt::{self, BodyError, MemoryOverflow, Overflow, OverflowFile, OverflowJob};

const MIB: usize = 1 << 20;

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// A memory store on a thread of its own, whose operations wait while the
/// gate is shut, and fail while `failing` is set.
struct Gated {
    inner: MemoryOverflow,
    gate: Arc<(Mutex<bool>, Condvar)>,
    failing: Arc<AtomicBool>,
    /// Operations that have run, or are running.
    started: Arc<AtomicUsize>,
    jobs: Mutex<mpsc::Sender<OverflowJob>>,
}

struct GatedFile {
    inner: Box<dyn OverflowFile>,
    gate: Arc<(Mutex<bool>, Condvar)>,
    failing: Arc<AtomicBool>,
    started: Arc<AtomicUsize>,
}

fn pass(
    gate: &(Mutex<bool>, Condvar),
    failing: &AtomicBool,
    started: &AtomicUsize,
) -> io::Result<()> {
    started.fetch_add(1, Ordering::SeqCst);
    let mut open = gate.0.lock().unwrap();
    while !*open {
        open = gate.1.wait(open).unwrap();
    }
    if failing.load(Ordering::SeqCst) {
        return Err(io::Error::other("the disk went bad"));
    }
    Ok(())
}

impl Gated {
    fn new() -> Arc<Gated> {
        let (tx, rx) = mpsc::channel::<OverflowJob>();
        std::thread::spawn(move || rx.into_iter().for_each(|job| job()));
        Arc::new(Gated {
            inner: MemoryOverflow::default(),
            gate: Arc::new((Mutex::new(false), Condvar::new())),
            failing: Arc::default(),
            started: Arc::default(),
            jobs: Mutex::new(tx),
        })
    }

    fn open(&self) {
        *self.gate.0.lock().unwrap() = true;
        self.gate.1.notify_all();
    }
}

impl Overflow for Gated {
    fn create(&self) -> io::Result<Box<dyn OverflowFile>> {
        pass(&self.gate, &self.failing, &self.started)?;
        Ok(Box::new(GatedFile {
            inner: self.inner.create()?,
            gate: self.gate.clone(),
            failing: self.failing.clone(),
            started: self.started.clone(),
        }))
    }

    fn spawn(&self, job: OverflowJob) -> Result<(), OverflowJob> {
        self.jobs.lock().unwrap().send(job).map_err(|e| e.0)
    }
}

impl OverflowFile for GatedFile {
    fn append(&mut self, data: Bytes) -> io::Result<()> {
        pass(&self.gate, &self.failing, &self.started)?;
        self.inner.append(data)
    }
    fn read(&mut self, max: usize) -> io::Result<Bytes> {
        pass(&self.gate, &self.failing, &self.started)?;
        self.inner.read(max)
    }
}

/// A worker that answers `/big?n` with n MiB and anything else with "ok".
fn spawn_app(pool: &LocalPool, mut incoming: rt::Incoming) {
    let sp = pool.spawner();
    let sp2 = sp.clone();
    sp.spawn_local(async move {
        while let Some(req) = incoming.next().await {
            sp2.spawn_local(async move {
                let head = ResponseHead::new(200, Headers::new()).unwrap();
                let mut sink = req.responder.respond(head).unwrap();
                if req.head.path() == "/big" {
                    let n: usize = req.head.query().parse().unwrap();
                    for _ in 0..n {
                        if sink.send(Bytes::from(pattern(MIB))).await.is_err() {
                            return;
                        }
                    }
                } else {
                    let _ = sink.send(Bytes::from_static(b"ok")).await;
                }
                let _ = sink.close().await;
            })
            .unwrap();
        }
    })
    .unwrap();
}

fn connection(pool: &LocalPool, store: Arc<Gated>) -> rt::RelayHandle {
    let mut ov = OverflowConfig::default();
    ov.memory_per_stream = 64 << 10;
    let config = RelayConfig::builder().overflow(Some(ov)).build().unwrap();
    let (relay_sock, worker_sock) = socket_pair();
    let (handle, relay) = rt::relay_with_overflow(relay_sock, FuturesTimer, config, store);
    let (incoming, worker) = rt::worker(worker_sock, FuturesTimer, WorkerConfig::default());
    let sp = pool.spawner();
    sp.spawn_local(async move {
        let _ = relay.await;
    })
    .unwrap();
    sp.spawn_local(async move {
        let _ = worker.await;
    })
    .unwrap();
    spawn_app(pool, incoming);
    handle
}

fn get(h: &rt::RelayHandle, path: &str, query: &str) -> rt::ResponseFuture {
    h.send_empty(RequestHead::new("GET", path, query, Headers::new()).unwrap())
        .unwrap()
}

async fn read_all(mut body: rt::ResponseBody) -> Result<Vec<u8>, BodyError> {
    let mut out = Vec::new();
    while let Some(piece) = body.next().await {
        out.extend_from_slice(&piece?);
    }
    Ok(out)
}

#[test]
fn a_stuck_store_holds_up_only_its_stream() {
    let store = Gated::new();
    let mut pool = LocalPool::new();
    let h = connection(&pool, store.clone());
    let big = pool.run_until(get(&h, "/big", "4")).unwrap();
    // The worker sends it all; the store is stuck at its first operation.
    pool.run_until_stalled();
    assert!(store.started.load(Ordering::SeqCst) >= 1);
    assert!(h.stats().overflow_bytes > 0, "nothing spilled");
    assert_eq!(store.inner.held(), 0, "the gate is shut");
    // Meanwhile, on this one thread, the connection serves on.
    for _ in 0..3 {
        let health = pool.run_until(get(&h, "/health", "")).unwrap();
        assert_eq!(pool.run_until(read_all(health.body)).unwrap(), b"ok");
    }
    // The store goes on: every byte back, in order.
    store.open();
    let got = pool.run_until(read_all(big.body)).unwrap();
    assert_eq!(got.len(), 4 * MIB);
    assert!(got.chunks(MIB).all(|c| c == pattern(MIB)), "bytes differ");
    assert_eq!(store.inner.held(), 0);
    assert_eq!(h.stats().overflow_bytes, 0);
}

#[test]
fn a_store_failing_off_the_connection_gives_up_its_stream_alone() {
    let store = Gated::new();
    store.failing.store(true, Ordering::SeqCst);
    let mut pool = LocalPool::new();
    let h = connection(&pool, store.clone());
    let big = pool.run_until(get(&h, "/big", "4")).unwrap();
    pool.run_until_stalled();
    store.open();
    let got = pool.run_until(read_all(big.body));
    assert_eq!(got.map(|b| b.len()), Err(BodyError::Overflow));
    let health = pool.run_until(get(&h, "/health", "")).unwrap();
    assert_eq!(pool.run_until(read_all(health.body)).unwrap(), b"ok");
    pool.run_until_stalled();
    assert_eq!(h.stats().overflow_bytes, 0, "freed");
    assert_eq!(h.stats().streams_open, 0);
}
