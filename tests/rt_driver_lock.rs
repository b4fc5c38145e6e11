//! A driver never holds its side's lock while it is on the socket: a handle
//! on another thread (a caller opening a request, a body read, a stats
//! probe) does not wait for a `sendto` or a `recvfrom`.
//!
//! The socket here asks another thread to take the lock (through
//! `RelayHandle::stats` or `close`) from inside the driver's socket calls,
//! and waits for it, bounded: a driver that held the lock there would make
//! the probe time out.

mod common;

use bytes::Bytes;
use common::mem::{socket_pair, FuturesTimer, MemSocket};
use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use futures::{Sink, SinkExt, Stream, StreamExt};
use std::pin::Pin;
use std::sync::{mpsc, Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use worker_relay::frame::{CloseCode, Headers, Message, RequestHead, ResponseHead};
use worker_relay::proto::{RelayConfig, WorkerConfig};
use worker_relay::rt::{self, Closed, RelayHandle};

/// How long a probe waits for the other thread to get the lock.
const PROBE_WAIT: Duration = Duration::from_secs(5);

/// What the socket does from inside a socket call of the driver.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Call {
    Flush,
    Next,
}

/// Runs `f` on the handle on another thread and waits for it: true if it
/// finished within [`PROBE_WAIT`].
fn on_other_thread(handle: &RelayHandle, f: fn(&RelayHandle)) -> bool {
    let h = handle.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f(&h);
        let _ = tx.send(());
    });
    rx.recv_timeout(PROBE_WAIT).is_ok()
}

#[derive(Default)]
struct Probes {
    handle: Option<RelayHandle>,
    /// (call, whether the other thread got the lock in time)
    seen: Vec<(Call, bool)>,
    /// Close the connection from the other thread at the next message read.
    close_at_next_read: bool,
    /// Close it from the other thread at the next flush.
    close_at_next_flush: bool,
    /// What the driver handed the socket, in order.
    sent: Vec<Message>,
}

/// The relay's end of an in-memory socket that probes the lock.
struct Probing {
    inner: MemSocket,
    probes: Arc<Mutex<Probes>>,
}

impl Probing {
    /// From inside a socket call: another thread closes the connection
    /// (`close`) or reads its stats, and the call waits for it.
    fn probe(&self, call: Call, close: bool) {
        let f: fn(&RelayHandle) = if close {
            |h| h.close(CloseCode::NORMAL, "bye")
        } else {
            |h| {
                h.stats();
            }
        };
        let handle = self.probes.lock().unwrap().handle.clone();
        if let Some(h) = handle {
            let ok = on_other_thread(&h, f);
            self.probes.lock().unwrap().seen.push((call, ok));
        }
    }
}

impl Stream for Probing {
    type Item = Result<Message, futures::channel::mpsc::SendError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            let close = std::mem::take(&mut self.probes.lock().unwrap().close_at_next_read);
            self.probe(Call::Next, close);
        }
        polled
    }
}

impl Sink<Message> for Probing {
    type Error = futures::channel::mpsc::SendError;
    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Pin::new(&mut self.inner).poll_ready(cx)
    }
    fn start_send(mut self: Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
        self.probes.lock().unwrap().sent.push(item.clone());
        Pin::new(&mut self.inner).start_send(item)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let close = std::mem::take(&mut self.probes.lock().unwrap().close_at_next_flush);
        self.probe(Call::Flush, close);
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
}

/// The worker side answers every request with `ok`.
async fn answer_ok(mut incoming: rt::Incoming) {
    while let Some(req) = incoming.next().await {
        let mut sink = req
            .responder
            .respond(ResponseHead::new(200, Headers::new()).unwrap())
            .unwrap();
        sink.send(Bytes::from_static(b"ok")).await.unwrap();
        sink.close().await.unwrap();
    }
}

/// How a driver ended, when it has.
type Outcome = futures::channel::oneshot::Receiver<Result<Closed, String>>;

/// A relay driver over a probing socket, a worker driver answering `ok`;
/// returns the handle, the probes and the two drivers' outcomes.
fn setup(pool: &LocalPool) -> (RelayHandle, Arc<Mutex<Probes>>, Outcome, Outcome) {
    let (relay_sock, worker_sock) = socket_pair();
    let probes = Arc::new(Mutex::new(Probes::default()));
    let socket = Probing {
        inner: relay_sock,
        probes: probes.clone(),
    };
    let (handle, relay_driver) = rt::relay(socket, FuturesTimer, RelayConfig::default());
    let (incoming, worker_driver) = rt::worker(worker_sock, FuturesTimer, WorkerConfig::default());
    probes.lock().unwrap().handle = Some(handle.clone());
    let (done_tx, done_rx) = futures::channel::oneshot::channel();
    let sp = pool.spawner();
    sp.spawn_local(async move {
        let r = relay_driver.await.map_err(|e| e.to_string());
        let _ = done_tx.send(r);
    })
    .unwrap();
    let (worker_tx, worker_rx) = futures::channel::oneshot::channel();
    sp.spawn_local(async move {
        let r = worker_driver.await.map_err(|e| e.to_string());
        let _ = worker_tx.send(r);
    })
    .unwrap();
    sp.spawn_local(answer_ok(incoming)).unwrap();
    (handle, probes, done_rx, worker_rx)
}

async fn get_ok(handle: &RelayHandle) {
    let head = RequestHead::new("GET", "/", "", Headers::new()).unwrap();
    let resp = handle.send_empty(head).unwrap().await.unwrap();
    assert_eq!(resp.head.status(), 200);
    let mut body = resp.body;
    let mut got = Vec::new();
    while let Some(piece) = body.next().await {
        got.extend_from_slice(&piece.unwrap());
    }
    assert_eq!(got, b"ok");
}

#[test]
fn handles_take_the_lock_while_the_driver_is_on_the_socket() {
    let mut pool = LocalPool::new();
    let (handle, probes, _done, _worker) = setup(&pool);
    pool.run_until(async {
        for _ in 0..3 {
            get_ok(&handle).await;
        }
    });
    let probes = probes.lock().unwrap();
    let flushes = probes
        .seen
        .iter()
        .filter(|(c, _)| *c == Call::Flush)
        .count();
    let reads = probes.seen.iter().filter(|(c, _)| *c == Call::Next).count();
    assert!(flushes >= 3, "flushes probed: {flushes}");
    assert!(reads >= 3, "reads probed: {reads}");
    let blocked: Vec<_> = probes.seen.iter().filter(|(_, ok)| !ok).collect();
    assert!(blocked.is_empty(), "the lock was held in {blocked:?}");
}

#[test]
fn a_close_while_a_message_is_read_ends_the_driver_in_good_order() {
    let mut pool = LocalPool::new();
    let (handle, probes, done, _worker) = setup(&pool);
    pool.run_until(async {
        get_ok(&handle).await;
        // The close lands between the driver's `wants_read()` and the
        // message it reads: the machine, closed, does not take it.
        probes.lock().unwrap().close_at_next_read = true;
        let head = RequestHead::new("GET", "/", "", Headers::new()).unwrap();
        let answer = handle.send_empty(head).unwrap().await;
        // The close came before the response head was handled.
        assert!(answer.is_err(), "a response arrived after the close");
    });
    let outcome = pool.run_until(done).unwrap();
    assert_eq!(outcome, Ok(Closed::Locally(CloseCode::NORMAL)));
    assert!(handle.is_closed());
    let probes = probes.lock().unwrap();
    assert!(
        probes.seen.iter().all(|(_, ok)| *ok),
        "the lock was held in {:?}",
        probes.seen
    );
}

#[test]
fn a_close_while_the_driver_flushes_still_sends_the_close_message() {
    let mut pool = LocalPool::new();
    let (handle, probes, done, worker) = setup(&pool);
    pool.run_until(get_ok(&handle));
    // The close lands after the driver found nothing more to send and
    // while it flushes: the close message must still go out before the
    // socket is closed.
    probes.lock().unwrap().close_at_next_flush = true;
    let head = RequestHead::new("GET", "/", "", Headers::new()).unwrap();
    let _answer = handle.send_empty(head).unwrap();
    let outcome = pool.run_until(done).unwrap();
    assert_eq!(outcome, Ok(Closed::Locally(CloseCode::NORMAL)));
    let probes_now = probes.lock().unwrap();
    assert!(
        matches!(probes_now.sent.last(), Some(Message::Close(Some(_)))),
        "the last message sent is not the close: {:?}",
        probes_now.sent.last()
    );
    drop(probes_now);
    let worker = pool.run_until(worker).unwrap();
    assert!(
        matches!(&worker, Ok(Closed::ByPeer(Some(c))) if c.code == CloseCode::NORMAL),
        "the worker saw {worker:?}"
    );
}
