//! Issue 23: a closing connection has a deadline, and the drivers' clock is
//! fresh and single.
//!
//! - The machines arm a close deadline (`close_timeout`, 5 s) the moment a
//!   connection starts closing, whoever closed it; past it
//!   `close_timed_out()` tells the driver to drop the transport.
//! - The drivers end a close that a peer who stopped reading would hold
//!   forever: [`DriverError::CloseTimeout`].
//! - Commands act at the time they are issued, not at the last input: a
//!   caller that reads restarts its stall deadline from now.
//! - `TokioTimer` reads tokio's clock, the one its sleeps follow: under
//!   `tokio::time::pause()` a driver does not spin.

mod common;

use common::clock::ManualClock;
use common::mem::socket_pair;
use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use futures::{SinkExt, StreamExt};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use worker_relay::frame::{CloseCode, Headers, Message, RequestHead, ResponseHead};
use worker_relay::proto::{
    CloseCause, RelayConfig, RelayConnection, WorkerConfig, WorkerConnection,
};
use worker_relay::rt::{self, BodyError, DriverError, Sleep, Timer};
use worker_relay_hyper::TokioTimer;

const SECOND: Duration = Duration::from_secs(1);

fn get(path: &str) -> RequestHead {
    RequestHead::new("GET", path, "", Headers::new()).unwrap()
}

// ----- the machines -----

#[test]
fn a_closing_relay_has_a_deadline_from_the_moment_it_closes() {
    let t0 = Instant::now();
    let mut relay = RelayConnection::default();
    relay.handle_timeout(t0);
    relay.advance_time(t0 + 3 * SECOND);
    relay.close(CloseCode::GOING_AWAY, "bye");
    // From the close (t0 + 3 s), not from the last input (t0).
    assert_eq!(relay.poll_timeout(), Some(t0 + 8 * SECOND));
    relay.handle_timeout(t0 + 8 * SECOND - Duration::from_millis(1));
    assert!(!relay.close_timed_out());
    relay.handle_timeout(t0 + 8 * SECOND);
    assert!(relay.close_timed_out());
    assert_eq!(relay.poll_timeout(), None, "nothing more to wait for");
    // The cause stays what it was.
    assert_eq!(
        relay.close_cause(),
        Some(&CloseCause::Local(CloseCode::GOING_AWAY))
    );
}

#[test]
fn a_peers_close_and_a_worker_close_have_the_deadline_too() {
    let t0 = Instant::now();
    let config = WorkerConfig::builder()
        .close_timeout(Duration::from_millis(250))
        .build()
        .unwrap();
    let mut worker = WorkerConnection::new(config);
    worker.handle_timeout(t0);
    worker.handle_message(Message::Close(None), t0).unwrap();
    assert!(worker.is_closed());
    assert_eq!(worker.poll_timeout(), Some(t0 + Duration::from_millis(250)));
    worker.handle_timeout(t0 + SECOND);
    assert!(worker.close_timed_out());

    // A machine closed before it ever saw the time arms it at the first.
    let mut relay = RelayConnection::default();
    relay.close(CloseCode::NORMAL, "");
    assert_eq!(relay.poll_timeout(), None);
    relay.advance_time(t0);
    assert_eq!(relay.poll_timeout(), Some(t0 + 5 * SECOND));
}

#[test]
fn the_close_timeout_must_be_longer_than_zero() {
    let e = RelayConfig::builder()
        .close_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(e.field, "close_timeout");
    assert_eq!(RelayConfig::default().close_timeout(), 5 * SECOND);
    assert_eq!(WorkerConfig::default().close_timeout(), 5 * SECOND);
}

// ----- the drivers -----

fn quiet_relay() -> RelayConfig {
    RelayConfig::builder().keepalive(None).build().unwrap()
}

/// A relay whose worker end of the socket is never read: its output backs
/// up, then the application closes it. The driver ends at the deadline
/// with `CloseTimeout`, not never.
#[test]
fn a_close_the_peer_never_reads_ends_at_the_deadline() {
    let mut pool = LocalPool::new();
    let clock = ManualClock::default();
    let (relay_sock, _frozen_worker) = socket_pair();
    let (handle, driver) = rt::relay(relay_sock, clock.clone(), quiet_relay());
    let (tx, mut rx) = futures::channel::oneshot::channel();
    pool.spawner()
        .spawn_local(async move {
            let _ = tx.send(driver.await);
        })
        .unwrap();
    // More requests than the socket holds: the driver waits to write.
    let pending: Vec<_> = (0..16)
        .map(|i| handle.send_empty(get(&format!("/r{i}"))).unwrap())
        .collect();
    pool.run_until_stalled();
    handle.close(CloseCode::GOING_AWAY, "shutting down");
    pool.run_until_stalled();
    assert!(rx.try_recv().unwrap().is_none(), "still flushing");
    clock.advance(5 * SECOND - Duration::from_millis(1));
    pool.run_until_stalled();
    assert!(rx.try_recv().unwrap().is_none(), "before the deadline");
    clock.advance(Duration::from_millis(1));
    pool.run_until_stalled();
    match rx.try_recv().unwrap() {
        Some(Err(DriverError::CloseTimeout(CloseCause::Local(code)))) => {
            assert_eq!(code, CloseCode::GOING_AWAY)
        }
        other => panic!("expected a close timeout, got {other:?}"),
    }
    drop(pending);
}

/// The peer closes, then reads nothing more: our reply cannot be flushed
/// behind the output it never took. Same deadline.
#[test]
fn a_peer_that_closes_and_stops_reading_is_dropped_at_the_deadline() {
    let mut pool = LocalPool::new();
    let clock = ManualClock::default();
    let (relay_sock, mut worker_end) = socket_pair();
    let (handle, driver) = rt::relay(relay_sock, clock.clone(), quiet_relay());
    let (tx, mut rx) = futures::channel::oneshot::channel();
    pool.spawner()
        .spawn_local(async move {
            let _ = tx.send(driver.await);
        })
        .unwrap();
    let pending: Vec<_> = (0..16)
        .map(|i| handle.send_empty(get(&format!("/r{i}"))).unwrap())
        .collect();
    pool.run_until_stalled();
    pool.run_until(worker_end.tx.send(Message::Close(None)))
        .unwrap();
    pool.run_until_stalled();
    assert!(handle.is_closed());
    assert!(rx.try_recv().unwrap().is_none());
    clock.advance(5 * SECOND);
    pool.run_until_stalled();
    assert!(
        matches!(
            rx.try_recv().unwrap(),
            Some(Err(DriverError::CloseTimeout(CloseCause::Peer(None))))
        ),
        "the driver must end at the deadline"
    );
    drop(pending);
}

/// A close that completes in time ends as before (`Closed::Locally`), and
/// no close deadline is left behind for a connection that ended. It
/// completes when the peer answers the close (issue 39: not when the
/// relay's close message is merely flushed).
#[test]
fn a_close_that_completes_ends_normally() {
    let mut pool = LocalPool::new();
    let clock = ManualClock::default();
    let (relay_sock, mut worker_end) = socket_pair();
    let (handle, driver) = rt::relay(relay_sock, clock.clone(), quiet_relay());
    let (tx, mut rx) = futures::channel::oneshot::channel();
    pool.spawner()
        .spawn_local(async move {
            let _ = tx.send(driver.await);
        })
        .unwrap();
    pool.run_until_stalled();
    handle.close(CloseCode::GOING_AWAY, "bye");
    let msg = pool.run_until(worker_end.rx.next()).unwrap();
    assert!(matches!(msg, Message::Close(Some(_))));
    pool.run_until_stalled();
    assert!(rx.try_recv().unwrap().is_none(), "waits for the answer");
    pool.run_until(worker_end.tx.send(msg)).unwrap();
    pool.run_until_stalled();
    assert_eq!(
        rx.try_recv().unwrap().map(|r| r.unwrap()),
        Some(rt::Closed::Locally(CloseCode::GOING_AWAY))
    );
}

/// Issue 39: after its close message the relay reads on, dropping what
/// comes, until the peer's close: a worker still streaming is not left
/// writing into a socket nobody reads (whose TCP reset could erase the
/// close before the worker reads it). The socket holds 4 messages; 32 go
/// through only if the relay reads them.
#[test]
fn after_its_close_the_relay_reads_on_until_the_peers_close() {
    let mut pool = LocalPool::new();
    let clock = ManualClock::default();
    let (relay_sock, mut worker_end) = socket_pair();
    let (handle, driver) = rt::relay(relay_sock, clock.clone(), quiet_relay());
    let (tx, mut rx) = futures::channel::oneshot::channel();
    pool.spawner()
        .spawn_local(async move {
            let _ = tx.send(driver.await);
        })
        .unwrap();
    pool.run_until_stalled();
    handle.close(CloseCode::POLICY_VIOLATION, "token revoked");
    pool.run_until_stalled();
    for i in 0..32u8 {
        let chunk = Message::Binary(bytes::Bytes::from(vec![0, 0, 0, 1, i]));
        pool.run_until(worker_end.tx.send(chunk))
            .expect("the relay reads after its close");
    }
    pool.run_until_stalled();
    assert!(
        rx.try_recv().unwrap().is_none(),
        "waits for the peer's close"
    );
    let close = pool.run_until(worker_end.rx.next()).unwrap();
    assert!(matches!(close, Message::Close(Some(f)) if f.reason == "token revoked"));
    pool.run_until(worker_end.tx.send(Message::Close(None)))
        .unwrap();
    pool.run_until_stalled();
    assert_eq!(
        rx.try_recv().unwrap().map(|r| r.unwrap()),
        Some(rt::Closed::Locally(CloseCode::POLICY_VIOLATION))
    );
    // The relay closed its side.
    assert_eq!(pool.run_until(worker_end.rx.next()), None);
}

/// Issue 39: a peer that takes the close message and then neither answers
/// it nor ends the socket holds the relay only until the close deadline.
#[test]
fn a_peer_that_never_answers_the_close_is_dropped_at_the_deadline() {
    let mut pool = LocalPool::new();
    let clock = ManualClock::default();
    let (relay_sock, mut worker_end) = socket_pair();
    let (handle, driver) = rt::relay(relay_sock, clock.clone(), quiet_relay());
    let (tx, mut rx) = futures::channel::oneshot::channel();
    pool.spawner()
        .spawn_local(async move {
            let _ = tx.send(driver.await);
        })
        .unwrap();
    pool.run_until_stalled();
    handle.close(CloseCode::GOING_AWAY, "bye");
    let msg = pool.run_until(worker_end.rx.next()).unwrap();
    assert!(matches!(msg, Message::Close(Some(_))));
    clock.advance(5 * SECOND - Duration::from_millis(1));
    pool.run_until_stalled();
    assert!(rx.try_recv().unwrap().is_none(), "before the deadline");
    clock.advance(Duration::from_millis(1));
    pool.run_until_stalled();
    match rx.try_recv().unwrap() {
        Some(Err(DriverError::CloseTimeout(CloseCause::Local(code)))) => {
            assert_eq!(code, CloseCode::GOING_AWAY)
        }
        other => panic!("expected a close timeout, got {other:?}"),
    }
}

/// A worker driver over the in-memory socket, and its outcome.
fn worker_over_mem(
    pool: &LocalPool,
    clock: &ManualClock,
) -> (
    common::mem::MemSocket,
    futures::channel::oneshot::Receiver<
        Result<rt::Closed, DriverError<futures::channel::mpsc::SendError>>,
    >,
) {
    let (relay_end, worker_sock) = socket_pair();
    let wcfg = WorkerConfig::builder().keepalive(None).build().unwrap();
    let (incoming, driver) = rt::worker(worker_sock, clock.clone(), wcfg);
    let (tx, rx) = futures::channel::oneshot::channel();
    pool.spawner()
        .spawn_local(async move {
            let _incoming = incoming;
            let _ = tx.send(driver.await);
        })
        .unwrap();
    (relay_end, rx)
}

/// Issue 39: the worker, the WebSocket client, answers the relay's close
/// and then waits for the relay to end the socket (RFC 6455 §7.1.1: the
/// server closes the TCP connection first) before it closes its own side.
#[test]
fn the_worker_answers_the_close_and_lets_the_relay_end_the_socket_first() {
    let mut pool = LocalPool::new();
    let clock = ManualClock::default();
    let (mut relay_end, mut rx) = worker_over_mem(&pool, &clock);
    pool.run_until_stalled();
    let close = worker_relay::frame::CloseFrame {
        code: CloseCode::REPLACED,
        reason: worker_relay::connect::REPLACED.into(),
    };
    pool.run_until(relay_end.tx.send(Message::Close(Some(close.clone()))))
        .unwrap();
    let answer = pool.run_until(relay_end.rx.next()).unwrap();
    assert_eq!(answer, Message::Close(Some(close.clone())));
    pool.run_until_stalled();
    assert!(
        rx.try_recv().unwrap().is_none(),
        "waits for the relay's end"
    );
    drop(relay_end);
    pool.run_until_stalled();
    assert_eq!(
        rx.try_recv().unwrap().map(|r| r.unwrap()),
        Some(rt::Closed::ByPeer(Some(close)))
    );
}

/// A relay that never ends the socket after the close messages were
/// exchanged holds the worker until the close deadline, which ends it in
/// good order: the close was complete, and the tunnel reads its reason.
#[test]
fn a_relay_that_never_ends_the_socket_releases_the_worker_at_the_deadline() {
    let mut pool = LocalPool::new();
    let clock = ManualClock::default();
    let (mut relay_end, mut rx) = worker_over_mem(&pool, &clock);
    pool.run_until_stalled();
    pool.run_until(relay_end.tx.send(Message::Close(None)))
        .unwrap();
    let answer = pool.run_until(relay_end.rx.next()).unwrap();
    assert_eq!(answer, Message::Close(None));
    clock.advance(5 * SECOND - Duration::from_millis(1));
    pool.run_until_stalled();
    assert!(rx.try_recv().unwrap().is_none(), "before the deadline");
    clock.advance(Duration::from_millis(1));
    pool.run_until_stalled();
    assert_eq!(
        rx.try_recv().unwrap().map(|r| r.unwrap()),
        Some(rt::Closed::ByPeer(None))
    );
    drop(relay_end);
}

/// The stall deadline restarts when the caller reads, at the time it
/// reads: 30 s after the data arrived, a read gives the stream a fresh
/// 60 s (before the fix it was given up at 60 s after the data arrived,
/// the last input the machine had seen).
#[test]
fn a_read_restarts_the_stall_deadline_from_now_not_from_the_last_input() {
    let mut pool = LocalPool::new();
    let clock = ManualClock::default();
    let (relay_sock, worker_sock) = socket_pair();
    let (handle, relay_driver) = rt::relay(relay_sock, clock.clone(), quiet_relay());
    let wcfg = WorkerConfig::builder().keepalive(None).build().unwrap();
    let (mut incoming, worker_driver) = rt::worker(worker_sock, clock.clone(), wcfg);
    let sp = pool.spawner();
    sp.spawn_local(async move {
        let _ = relay_driver.await;
    })
    .unwrap();
    sp.spawn_local(async move {
        let _ = worker_driver.await;
    })
    .unwrap();
    // The worker answers three pieces and keeps the response open.
    sp.spawn_local(async move {
        let req = incoming.next().await.unwrap();
        let head = ResponseHead::new(200, Headers::new()).unwrap();
        let mut sink = req.responder.respond(head).unwrap();
        for piece in ["a", "b", "c"] {
            sink.send(piece.into()).await.unwrap();
        }
        futures::future::pending::<()>().await;
        drop(sink);
    })
    .unwrap();
    let response = handle.send_empty(get("/stream")).unwrap();
    let mut body = pool.run_until(response).unwrap().body;
    pool.run_until_stalled();
    assert_eq!(clock.elapsed(), Duration::ZERO);

    clock.advance(30 * SECOND);
    pool.run_until_stalled();
    let piece = pool.run_until(body.next()).unwrap().unwrap();
    assert_eq!(piece, "a");

    // 61 s after the data arrived, 31 s after the read: alive.
    clock.advance(31 * SECOND);
    pool.run_until_stalled();
    let piece = pool.run_until(body.next()).unwrap();
    assert_eq!(piece.unwrap(), "b", "given up from the stale time");

    // 60 s after that read: given up.
    clock.advance(60 * SECOND);
    pool.run_until_stalled();
    let end = pool.run_until(body.next()).unwrap();
    assert_eq!(end, Err(BodyError::Stalled));
}

/// TokioTimer, counting its sleeps, and refusing to sleep any more once a
/// driver has asked for more than `limit` (a spinning driver then stops,
/// so the test fails instead of hanging).
struct CountingTokio {
    sleeps: Arc<AtomicUsize>,
    limit: usize,
}

impl Timer for CountingTokio {
    fn now(&self) -> Instant {
        TokioTimer.now()
    }
    fn sleep_until(&self, deadline: Instant) -> Sleep {
        if self.sleeps.fetch_add(1, Ordering::Relaxed) >= self.limit {
            return Box::pin(futures::future::pending());
        }
        TokioTimer.sleep_until(deadline)
    }
}

/// Under `tokio::time::pause()` the drivers follow tokio's clock: 30
/// virtual seconds of an idle connection with keepalive take a handful of
/// sleeps (one per ping), not a busy loop.
#[tokio::test(start_paused = true)]
async fn tokio_timer_is_one_clock_under_a_paused_runtime() {
    let sleeps = Arc::new(AtomicUsize::new(0));
    let timer = || CountingTokio {
        sleeps: sleeps.clone(),
        limit: 10_000,
    };
    let (relay_sock, worker_sock) = socket_pair();
    let (handle, relay_driver) = rt::relay(relay_sock, timer(), RelayConfig::default());
    let (_incoming, worker_driver) = rt::worker(worker_sock, timer(), WorkerConfig::default());
    tokio::spawn(relay_driver);
    tokio::spawn(worker_driver);
    let start = tokio::time::Instant::now();
    tokio::time::sleep(30 * SECOND).await;
    assert_eq!(start.elapsed(), 30 * SECOND);
    let n = sleeps.load(Ordering::Relaxed);
    assert!(n < 50, "{n} sleeps in 30 virtual seconds: the driver spun");
    assert!(!handle.is_closed());
}
