//! Issue 23, memory defaults, in the async layer (on `futures::executor`):
//! the overflow store's budget is one for every connection it serves; a
//! stream that would cross it is given up alone; what the store held returns
//! to it; `rt::relay` without a store keeps a small one in memory.
mod common;

use bytes::Bytes;
use common::mem::{socket_pair, FuturesTimer};
use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use futures::{SinkExt, StreamExt};
use std::path::Path;
use std::sync::Arc;
use worker_relay::frame::{Headers, RequestHead, ResponseHead};
use worker_relay::proto::{OverflowConfig, RelayConfig, WorkerConfig};
use worker_relay::rt::{self, BodyError, Overflow};
use worker_relay_hyper::TempFileOverflow;

const MIB: usize = 1 << 20;

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
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
                if req.head.path() == "/open" {
                    // n MiB, then the stream stays open: no `end`.
                    let n: usize = req.head.query().parse().unwrap();
                    for _ in 0..n {
                        if sink.send(Bytes::from(pattern(MIB))).await.is_err() {
                            return;
                        }
                    }
                    futures::future::pending::<()>().await;
                }
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

/// A relay connection and its worker on `pool`; the relay's overflow in
/// `store` when given (else `rt::relay`'s default).
fn connection(
    pool: &LocalPool,
    config: RelayConfig,
    store: Option<Arc<dyn Overflow>>,
) -> rt::RelayHandle {
    let (relay_sock, worker_sock) = socket_pair();
    let (handle, relay) = match store {
        Some(store) => rt::relay_with_overflow(relay_sock, FuturesTimer, config, store),
        None => rt::relay(relay_sock, FuturesTimer, config),
    };
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

/// The overflow files this process holds open in `dir` (unlinked).
fn open_in(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.starts_with(dir) && t.to_string_lossy().ends_with(" (deleted)"))
        })
        .count()
}

fn overflow(memory_per_stream: usize) -> RelayConfig {
    let mut ov = OverflowConfig::default();
    ov.memory_per_stream = memory_per_stream;
    RelayConfig::builder().overflow(Some(ov)).build().unwrap()
}

/// Before issue 23, `rt::relay` held a slow caller's response in memory up
/// to the machine's bounds (1 GiB per response, 4 GiB per connection).
#[test]
fn rt_relay_holds_at_most_64_mib_of_slow_responses_in_memory() {
    let mut pool = LocalPool::new();
    let h = connection(&pool, overflow(MIB), None);
    let big = pool.run_until(get(&h, "/big", "80")).unwrap();
    // Not read: the response goes to the overflow until its budget is spent.
    pool.run_until_stalled();
    let health = pool.run_until(get(&h, "/health", "")).unwrap();
    assert_eq!(pool.run_until(read_all(health.body)).unwrap(), b"ok");
    let got = pool.run_until(read_all(big.body));
    assert_eq!(got.map(|b| b.len()), Err(BodyError::Overflow));
    assert_eq!(h.stats().overflow_bytes, 0, "freed");
}

/// `total` unread bytes of one response: at most 64 KiB of them in memory,
/// the rest in the store, which holds no more than `total`.
fn held_between(store: &TempFileOverflow, in_memory: u64, total: u64) {
    assert!(in_memory <= 64 << 10, "{in_memory} in memory");
    let held = store.held();
    assert!(
        held <= total && held + in_memory >= total,
        "{held} in the store, {in_memory} in memory, of {total}"
    );
}

#[test]
fn one_file_store_bounds_every_connection_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(TempFileOverflow::new(dir.path(), 6 * MIB as u64));
    let mut pool = LocalPool::new();
    let config = overflow(64 << 10);
    let one = connection(&pool, config.clone(), Some(store.clone()));
    let two = connection(&pool, config, Some(store.clone()));

    // Connection one: 4 MiB wait, unread, in the store's files.
    let a = pool.run_until(get(&one, "/big", "4")).unwrap();
    pool.run_until_stalled();
    // What is not in memory (at most its 64 KiB, fewer than
    // `max_unread_chunks` chunks, or a refill) is in the store, which may
    // still count a refill until the caller reads it.
    held_between(&store, one.stats().body_buffered_in, 4 * MIB as u64);
    assert!(open_in(dir.path()) >= 1, "in a file");
    // Connection two: its slow response would cross the budget: given up.
    let b = pool.run_until(get(&two, "/big", "4")).unwrap();
    pool.run_until_stalled();
    assert!(store.held() <= 6 * MIB as u64);
    assert_eq!(
        pool.run_until(read_all(b.body)).map(|b| b.len()),
        Err(BodyError::Overflow)
    );
    // The others are untouched: connection two serves on, and the first
    // response comes back whole, in order.
    let c = pool.run_until(get(&two, "/big", "1")).unwrap();
    assert_eq!(pool.run_until(read_all(c.body)).unwrap(), pattern(MIB));
    let got = pool.run_until(read_all(a.body)).unwrap();
    assert_eq!(got.len(), 4 * MIB);
    assert!(got.chunks(MIB).all(|c| c == pattern(MIB)), "bytes differ");

    // Everything returned to the budget, the files closed, none named.
    pool.run_until_stalled();
    assert_eq!(store.held(), 0);
    assert_eq!(open_in(dir.path()), 0);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // And the budget serves again.
    let d = pool.run_until(get(&one, "/big", "5")).unwrap();
    pool.run_until_stalled();
    held_between(&store, one.stats().body_buffered_in, 5 * MIB as u64);
    assert_eq!(pool.run_until(read_all(d.body)).unwrap().len(), 5 * MIB);
    drop(pool);
    assert_eq!(store.held(), 0);
}

/// A spilled response is read back in its reader's task: the reader does
/// not wait for the driver to run for each `memory_per_stream` it reads
/// from the store (a round trip per 64 KiB here, through another thread
/// on a multi-thread runtime).
#[test]
fn a_spilled_response_is_read_back_without_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(TempFileOverflow::new(dir.path(), 64 * MIB as u64));
    let mut pool = LocalPool::new();
    let h = connection(&pool, overflow(64 << 10), Some(store.clone()));
    let big = pool.run_until(get(&h, "/big", "4")).unwrap();
    // The worker sends it all; the caller reads nothing yet.
    pool.run_until_stalled();
    assert!(store.held() >= 3 * MIB as u64, "spilled: {}", store.held());
    // Neither driver runs from here on: the body is polled by hand.
    let mut body = big.body;
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut got = Vec::new();
    let mut pendings = 0;
    loop {
        match body.poll_next_unpin(&mut cx) {
            std::task::Poll::Ready(Some(piece)) => got.extend_from_slice(&piece.unwrap()),
            std::task::Poll::Ready(None) => break,
            std::task::Poll::Pending => {
                pendings += 1;
                assert!(
                    pendings <= 4,
                    "the reader waits for the driver after {} of {} bytes",
                    got.len(),
                    4 * MIB
                );
            }
        }
    }
    assert_eq!(got.len(), 4 * MIB);
    assert!(got.chunks(MIB).all(|c| c == pattern(MIB)), "bytes differ");
    drop(body);
    pool.run_until_stalled();
    assert_eq!(store.held(), 0);
}

/// A store in memory whose reads fail once `failing` is set (a disk gone
/// bad).
struct FailingReads {
    failing: Arc<std::sync::atomic::AtomicBool>,
}

struct FailRead {
    queue: std::collections::VecDeque<Bytes>,
    failing: Arc<std::sync::atomic::AtomicBool>,
}

impl Overflow for FailingReads {
    fn create(&self) -> std::io::Result<Box<dyn worker_relay::rt::OverflowFile>> {
        Ok(Box::new(FailRead {
            queue: Default::default(),
            failing: self.failing.clone(),
        }))
    }
}

impl worker_relay::rt::OverflowFile for FailRead {
    fn append(&mut self, data: Bytes) -> std::io::Result<()> {
        self.queue.push_back(data);
        Ok(())
    }
    fn read(&mut self, max: usize) -> std::io::Result<Bytes> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("the disk went bad"));
        }
        let Some(mut front) = self.queue.pop_front() else {
            return Ok(Bytes::new());
        };
        if front.len() > max {
            let rest = front.split_off(max);
            self.queue.push_front(rest);
        }
        Ok(front)
    }
}

/// A refill that fails gives the stream up, and its `abort` goes to the
/// worker at once: the driver that served the refill, or the reader's task
/// that did, wakes the driver for it.
#[test]
fn a_failed_refill_sends_the_abort_at_once() {
    let mut pool = LocalPool::new();
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let store = Arc::new(FailingReads {
        failing: failing.clone(),
    });
    let h = connection(&pool, overflow(64 << 10), Some(store));
    let open = pool.run_until(get(&h, "/open", "2")).unwrap();
    pool.run_until_stalled();
    assert_eq!(h.stats().streams_open, 1);
    let sent_before = h.stats().bytes_out;
    // From here the store's reads fail.
    failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut body = open.body;
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let mut read = 0;
    // Each read is followed by the drivers' turn: the refill a read asks
    // for is served (and fails) in the driver, which then has nothing to
    // read or send but the abort.
    while h.stats().streams_open == 1 {
        match body.poll_next_unpin(&mut cx) {
            std::task::Poll::Ready(Some(Ok(piece))) => read += piece.len(),
            other => panic!("after {read} bytes: {other:?}"),
        }
        pool.run_until_stalled();
        assert!(read < 2 * MIB, "read {read}");
    }
    assert!(
        h.stats().bytes_out > sent_before,
        "the abort was not sent (bytes out {} before, {} after)",
        sent_before,
        h.stats().bytes_out
    );
    assert!(matches!(
        body.poll_next_unpin(&mut cx),
        std::task::Poll::Ready(Some(Err(BodyError::Overflow)))
    ));
}
