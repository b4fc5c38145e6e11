//! Issue 14 in the async layer, on `futures::executor` (no tokio): a slow
//! reader's response waits in the overflow while the connection serves
//! others; sequential write-then-await cannot deadlock; a frozen peer is
//! dropped even with a write pending; the driver says why it stopped.
mod common;

use bytes::Bytes;
use common::mem::{socket_pair, FuturesTimer};
use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use futures::{SinkExt, StreamExt};
use std::time::{Duration, Instant};
use worker_relay::frame::{CloseCode, Headers, RequestHead, ResponseHead};
use worker_relay::proto::KeepaliveConfig;
use worker_relay::proto::{OverflowConfig, RelayConfig, WorkerConfig};
use worker_relay::rt::{self, BodyError, Closed, DriverError, RelayError};

fn head(method: &str, path: &str) -> RequestHead {
    RequestHead::new(method, path, "", Headers::new()).unwrap()
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// Serves `/big?n` (n MiB), `/echo` and `/health`, each request on its own task.
fn spawn_app(pool: &LocalPool, mut incoming: rt::Incoming) {
    let sp = pool.spawner();
    let sp2 = sp.clone();
    sp.spawn_local(async move {
        while let Some(req) = incoming.next().await {
            sp2.spawn_local(async move {
                let rt::IncomingRequest {
                    head,
                    mut body,
                    responder,
                    ..
                } = req;
                let mut sink = responder
                    .respond(ResponseHead::new(200, Headers::new()).unwrap())
                    .unwrap();
                match head.path() {
                    "/big" => {
                        let n: usize = head.query().parse().unwrap();
                        for _ in 0..n {
                            if sink.send(Bytes::from(pattern(1 << 20))).await.is_err() {
                                return;
                            }
                        }
                    }
                    "/echo" => {
                        while let Some(Ok(piece)) = body.next().await {
                            if sink.send(piece).await.is_err() {
                                return;
                            }
                        }
                    }
                    _ => sink.send(Bytes::from_static(b"ok")).await.unwrap(),
                }
                let _ = sink.close().await;
            })
            .unwrap();
        }
    })
    .unwrap();
}

struct Stack {
    pool: LocalPool,
    handle: rt::RelayHandle,
}

fn stack(config: RelayConfig) -> Stack {
    let pool = LocalPool::new();
    let (handle, incoming) = common::mem::spawn_pair(&pool, config, WorkerConfig::default());
    spawn_app(&pool, incoming);
    Stack { pool, handle }
}

fn with_overflow() -> RelayConfig {
    RelayConfig::builder()
        .overflow(Some(OverflowConfig::default()))
        .build()
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
fn an_unread_response_waits_in_the_overflow_while_others_are_served() {
    let mut s = stack(with_overflow());
    let h = s.handle.clone();
    let big = h
        .send_empty(RequestHead::new("GET", "/big", "24", Headers::new()).unwrap())
        .unwrap();
    let big = s.pool.run_until(big).unwrap();
    // The big body is not read; the connection keeps serving others.
    for _ in 0..10 {
        let r = s
            .pool
            .run_until(h.send_empty(head("GET", "/health")).unwrap())
            .unwrap();
        assert_eq!(s.pool.run_until(read_all(r.body)).unwrap(), b"ok");
    }
    s.pool.run_until_stalled();
    let st = h.stats();
    assert!(
        st.overflow_bytes >= 16 << 20,
        "the unread response went to the overflow: {st:?}"
    );
    assert!(st.body_buffered_in <= 2 << 20, "memory stays small: {st:?}");
    // Read at last: every byte, in order.
    let got = s.pool.run_until(read_all(big.body)).unwrap();
    assert_eq!(got.len(), 24 << 20);
    assert!(got.chunks(1 << 20).all(|c| c == pattern(1 << 20)));
    assert_eq!(h.stats().overflow_bytes, 0);
}

/// Issue 14, item 4: write the whole body, then await the response. The
/// worker's app answers while it reads, so its response piles up unread:
/// with an overflow it waits there and the exchange completes.
#[test]
fn sequential_write_then_await_completes() {
    let mut s = stack(with_overflow());
    let h = s.handle.clone();
    const N: usize = 48 << 20;
    let body = Bytes::from(pattern(N));
    let got = s.pool.run_until(async move {
        let (mut sink, resp) = h.send_request(head("POST", "/echo")).unwrap();
        for piece in body.chunks(1 << 20) {
            sink.send(Bytes::copy_from_slice(piece)).await.unwrap();
        }
        sink.close().await.unwrap();
        let resp = resp.await.unwrap();
        read_all(resp.body).await.unwrap()
    });
    assert_eq!(got.len(), N);
    assert!(got == pattern(N), "echo differs");
}

/// Without an overflow the same misuse cannot hang either: the response
/// holds reading paused, and past `read_pause_timeout` the stream is given
/// up, so the writer gets an error.
#[test]
fn without_overflow_the_sequential_misuse_fails_instead_of_hanging() {
    let mut s = stack(
        RelayConfig::builder()
            .read_pause_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
    );
    let h = s.handle.clone();
    let t = Instant::now();
    let outcome = s.pool.run_until(async move {
        let (mut sink, resp) = h.send_request(head("POST", "/echo")).unwrap();
        let piece = Bytes::from(pattern(1 << 20));
        for _ in 0..256 {
            sink.send(piece.clone()).await?;
        }
        drop(resp);
        Ok(())
    });
    assert_eq!(outcome, Err(BodyError::Stalled));
    // Past the 300 ms pause timeout; generous for a loaded machine (the
    // misuse without it hangs for ever).
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

/// Issue 14, items 2 and 3: a peer that takes nothing (frozen) while a
/// write is pending is dropped at the keepalive deadline, the driver says
/// so, and the callers fail.
#[test]
fn a_frozen_peer_is_dropped_even_with_a_write_pending() {
    let mut pool = LocalPool::new();
    let (relay_sock, frozen_peer) = socket_pair();
    let config = RelayConfig::builder()
        .keepalive(Some(
            KeepaliveConfig::new(Duration::from_millis(100), Duration::from_millis(200)).unwrap(),
        ))
        .build()
        .unwrap();
    let (h, driver) = rt::relay(relay_sock, FuturesTimer, config);
    let (done_tx, done_rx) = futures::channel::oneshot::channel();
    pool.spawner()
        .spawn_local(async move {
            let _ = done_tx.send(driver.await);
        })
        .unwrap();
    let t = Instant::now();
    let (mut sink, resp) = h.send_request(head("POST", "/upload")).unwrap();
    let upload = async move {
        let piece = Bytes::from(pattern(1 << 20));
        loop {
            if sink.send(piece.clone()).await.is_err() {
                return;
            }
        }
    };
    pool.spawner().spawn_local(upload).unwrap();
    let result = pool.run_until(done_rx).unwrap();
    assert!(
        matches!(result, Err(DriverError::KeepaliveTimeout)),
        "{result:?}"
    );
    let took = t.elapsed();
    // The 100 ms + 200 ms keepalive deadline; the upper bound generous
    // for a loaded machine (a driver without the deadline never ends).
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(30),
        "{took:?}"
    );
    assert_eq!(pool.run_until(resp).err(), Some(RelayError::WorkerGone));
    drop(frozen_peer);
}

/// Issue 14, item 3: the driver tells a close by the peer (with its code)
/// from one by this side.
#[test]
fn the_driver_says_who_closed() {
    let mut pool = LocalPool::new();
    let (relay_sock, worker_sock) = socket_pair();
    let (h, relay_driver) = rt::relay(relay_sock, FuturesTimer, RelayConfig::default());
    let (incoming, worker_driver) = rt::worker(worker_sock, FuturesTimer, WorkerConfig::default());
    let (rtx, rrx) = futures::channel::oneshot::channel();
    let (wtx, wrx) = futures::channel::oneshot::channel();
    let sp = pool.spawner();
    sp.spawn_local(async move {
        let _ = rtx.send(relay_driver.await);
    })
    .unwrap();
    sp.spawn_local(async move {
        let _ = wtx.send(worker_driver.await);
    })
    .unwrap();
    pool.run_until_stalled();
    incoming.close(CloseCode::GOING_AWAY, "restarting");
    let worker = pool.run_until(wrx).unwrap();
    let relay = pool.run_until(rrx).unwrap();
    assert_eq!(worker.unwrap(), Closed::Locally(CloseCode::GOING_AWAY));
    let Closed::ByPeer(Some(frame)) = relay.unwrap() else {
        panic!("the relay must see the worker's close");
    };
    assert_eq!(
        (frame.code, frame.reason.as_str()),
        (CloseCode::GOING_AWAY, "restarting")
    );
    assert!(h.is_closed());
}

/// A peer that never stops sending: every read is ready at once (chunks
/// for a stream that is not open, which the machines drop). It gives up
/// after `limit` messages so that a driver without a bound fails the test
/// instead of hanging it.
struct Flood {
    reads: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    limit: usize,
}

impl futures::Stream for Flood {
    type Item = Result<worker_relay::frame::Message, std::io::Error>;
    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::sync::atomic::Ordering;
        if self.reads.fetch_add(1, Ordering::Relaxed) >= self.limit {
            return std::task::Poll::Pending;
        }
        let chunk = Bytes::from_static(&[0, 0, 0, 7, b'x']);
        std::task::Poll::Ready(Some(Ok(worker_relay::frame::Message::Binary(chunk))))
    }
}

impl futures::Sink<worker_relay::frame::Message> for Flood {
    type Error = std::io::Error;
    fn poll_ready(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), std::io::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn start_send(
        self: std::pin::Pin<&mut Self>,
        _: worker_relay::frame::Message,
    ) -> Result<(), std::io::Error> {
        Ok(())
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), std::io::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), std::io::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Counts its wakes.
struct CountWake(std::sync::atomic::AtomicUsize);

impl futures::task::ArcWake for CountWake {
    fn wake_by_ref(arc: &std::sync::Arc<Self>) {
        arc.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Polls `driver` twice against a flood and checks each poll did a bounded
/// share of work, then yielded with a wake-up for itself.
fn assert_yields<F: std::future::Future + Unpin>(
    mut driver: F,
    reads: &std::sync::atomic::AtomicUsize,
) {
    use std::sync::atomic::Ordering;
    let wakes = std::sync::Arc::new(CountWake(Default::default()));
    let waker = futures::task::waker(wakes.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    let mut before = 0;
    for poll in 1..=2 {
        assert!(std::pin::Pin::new(&mut driver).poll(&mut cx).is_pending());
        let now = reads.load(Ordering::Relaxed);
        let read = now - before;
        assert!(
            read > 0 && read <= 10_000,
            "poll {poll} read {read} messages"
        );
        assert_eq!(
            wakes.0.load(Ordering::Relaxed),
            poll,
            "the driver wakes itself"
        );
        before = now;
    }
}

/// A flooding peer gets a bounded share of the executor: each poll of a
/// driver reads a bounded number of messages, then yields (waking itself),
/// so the tasks beside it on the same thread still run.
#[test]
fn a_flooding_peer_cannot_monopolise_the_driver() {
    let limit = 1_000_000;
    let reads = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flood = Flood {
        reads: reads.clone(),
        limit,
    };
    let (_h, driver) = rt::relay(flood, FuturesTimer, RelayConfig::default());
    assert_yields(Box::pin(driver), &reads);

    let reads = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flood = Flood {
        reads: reads.clone(),
        limit,
    };
    let (_incoming, driver) = rt::worker(flood, FuturesTimer, WorkerConfig::default());
    assert_yields(Box::pin(driver), &reads);
}

/// A relay that opens and aborts requests faster than the app takes them:
/// the aborted ones leave the worker's queue of untaken requests (it stays
/// within the stream limit) and the app is handed only the live request.
#[test]
fn requests_aborted_before_the_app_takes_them_do_not_pile_up() {
    use worker_relay::frame::{ControlFrame, StreamId};
    let mut pool = LocalPool::new();
    let (mut relay_sock, worker_sock) = socket_pair();
    let (mut incoming, worker_driver) =
        rt::worker(worker_sock, FuturesTimer, WorkerConfig::default());
    pool.spawner()
        .spawn_local(async move {
            let _ = worker_driver.await;
        })
        .unwrap();
    // More pairs than the worker's stream limit (1024 by default): without
    // the removal every one of them would wait in the queue.
    let pairs = 3_000u32;
    let live = StreamId::new(pairs + 1).unwrap();
    pool.run_until(async {
        for n in 1..=pairs {
            let id = StreamId::new(n).unwrap();
            let request = ControlFrame::Request {
                id,
                head: head("GET", "/aborted"),
            };
            relay_sock.send(request.to_message()).await.unwrap();
            relay_sock
                .send(ControlFrame::Abort { id }.to_message())
                .await
                .unwrap();
        }
        let request = ControlFrame::Request {
            id: live,
            head: head("GET", "/live"),
        };
        relay_sock.send(request.to_message()).await.unwrap();
        relay_sock
            .send(ControlFrame::End { id: live }.to_message())
            .await
            .unwrap();
    });
    let first = pool.run_until(incoming.next()).expect("a request");
    assert_eq!(
        first.head.path(),
        "/live",
        "aborted requests were handed out"
    );
    // Nothing was refused for too many streams: the relay saw no abort
    // for the live stream, and no other message at all.
    pool.run_until_stalled();
    assert!(
        relay_sock.rx.try_recv().is_err(),
        "the worker sent something"
    );
}
