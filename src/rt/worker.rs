//! The worker side on any executor: a stream of incoming requests, each with
//! its head, a body stream and a responder.

use super::driver::{DriverError, Io, Pass};
use super::timer::Timer;
use super::BodyError;
use crate::frame::{CloseCode, Message, RequestHead, ResponseHead, StreamId};
use crate::proto::{
    BodyRead, Stats, StreamError, StreamKey, WorkerConfig, WorkerConnection, WorkerEnd, WorkerEvent,
};
use bytes::Bytes;
use futures_core::Stream;
use futures_sink::Sink;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

#[derive(Default)]
struct Slot {
    gone: Option<WorkerEnd>,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
    gone_waker: Option<Waker>,
}

struct Shared {
    conn: WorkerConnection,
    slots: HashMap<StreamKey, Slot>,
    incoming: VecDeque<(StreamKey, StreamId, RequestHead)>,
    incoming_waker: Option<Waker>,
    driver: Option<Waker>,
    finished: bool,
}

impl Shared {
    fn wake_driver(&mut self) {
        if let Some(w) = self.driver.take() {
            w.wake();
        }
    }

    fn dispatch(&mut self) {
        while let Some(ev) = self.conn.poll_event() {
            match ev {
                WorkerEvent::Request { key, id, head } => {
                    self.slots.insert(key, Slot::default());
                    self.incoming.push_back((key, id, head));
                    if let Some(w) = self.incoming_waker.take() {
                        w.wake();
                    }
                }
                WorkerEvent::Readable { key } => {
                    if let Some(w) = self.slots.get_mut(&key).and_then(|s| s.read_waker.take()) {
                        w.wake();
                    }
                }
                WorkerEvent::Writable { key } => {
                    if let Some(w) = self.slots.get_mut(&key).and_then(|s| s.write_waker.take()) {
                        w.wake();
                    }
                }
                WorkerEvent::Ended { key, reason } => {
                    if let Some(s) = self.slots.get_mut(&key) {
                        s.gone = Some(reason);
                        for w in [
                            s.read_waker.take(),
                            s.write_waker.take(),
                            s.gone_waker.take(),
                        ]
                        .into_iter()
                        .flatten()
                        {
                            w.wake();
                        }
                    }
                }
            }
        }
    }
}

type SharedRef = Arc<Mutex<Shared>>;

fn lock(s: &SharedRef) -> MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Creates the worker side of a connection over `socket`. Poll the
/// [`WorkerDriver`] (spawn it) and take requests from [`Incoming`].
pub fn worker<S, T, E>(socket: S, timer: T, config: WorkerConfig) -> (Incoming, WorkerDriver<S, T>)
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
    T: Timer,
{
    let shared = Arc::new(Mutex::new(Shared {
        conn: WorkerConnection::new(config),
        slots: HashMap::new(),
        incoming: VecDeque::new(),
        incoming_waker: None,
        driver: None,
        finished: false,
    }));
    (
        Incoming {
            shared: shared.clone(),
        },
        WorkerDriver {
            shared,
            io: Io::new(socket, timer),
        },
    )
}

/// The future that runs one worker connection; completes when it closes.
pub struct WorkerDriver<S, T> {
    shared: SharedRef,
    io: Io<S, T>,
}

impl<S, T, E> Future for WorkerDriver<S, T>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
    T: Timer + Unpin,
{
    type Output = Result<(), DriverError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut sh = lock(&this.shared);
        sh.driver = Some(cx.waker().clone());
        loop {
            let pass = this.io.poll_io(&mut sh.conn, cx);
            sh.dispatch();
            match pass {
                Pass::Progress => continue,
                Pass::Idle => return Poll::Pending,
                Pass::Done(r) => {
                    sh.finished = true;
                    if let Some(w) = sh.incoming_waker.take() {
                        w.wake();
                    }
                    return Poll::Ready(r);
                }
            }
        }
    }
}

/// The requests arriving on one worker connection: a [`Stream`] that ends
/// when the connection closes.
pub struct Incoming {
    shared: SharedRef,
}

impl Incoming {
    /// The connection's counters.
    pub fn stats(&self) -> Stats {
        lock(&self.shared).conn.stats()
    }

    /// Closes the connection.
    pub fn close(&self, code: CloseCode, reason: &str) {
        let mut sh = lock(&self.shared);
        sh.conn.close(code, reason);
        sh.dispatch();
        sh.wake_driver();
    }
}

impl Stream for Incoming {
    type Item = Request;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Request>> {
        let mut sh = lock(&self.shared);
        if let Some((key, id, head)) = sh.incoming.pop_front() {
            let guard = Arc::new(Guard {
                shared: self.shared.clone(),
                key,
            });
            return Poll::Ready(Some(Request {
                id,
                head,
                body: RequestBody {
                    guard: guard.clone(),
                    done: false,
                },
                responder: Responder { guard, used: false },
            }));
        }
        if sh.finished || sh.conn.is_closed() {
            return Poll::Ready(None);
        }
        sh.incoming_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// One request: its head, its body and the way to answer it.
pub struct Request {
    /// The wire id (for logs).
    pub id: StreamId,
    /// The request head.
    pub head: RequestHead,
    /// The request body. Dropping it discards the rest.
    pub body: RequestBody,
    /// Answers the request. Dropping it unanswered fails the request (500).
    pub responder: Responder,
}

struct Guard {
    shared: SharedRef,
    key: StreamKey,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut sh = lock(&self.shared);
        sh.slots.remove(&self.key);
    }
}

/// The request body: a [`Stream`] of [`Bytes`]; an `Err` item means the
/// client has gone.
pub struct RequestBody {
    guard: Arc<Guard>,
    done: bool,
}

impl Stream for RequestBody {
    type Item = Result<Bytes, BodyError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let mut sh = lock(&this.guard.shared);
        let key = this.guard.key;
        match sh.conn.read_body(key) {
            BodyRead::Data(d) => {
                // Reading may have un-paused the socket.
                sh.wake_driver();
                Poll::Ready(Some(Ok(d)))
            }
            BodyRead::End => {
                this.done = true;
                Poll::Ready(None)
            }
            BodyRead::Gone => {
                this.done = true;
                Poll::Ready(Some(Err(BodyError::ClientGone)))
            }
            BodyRead::Pending => {
                if let Some(s) = sh.slots.get_mut(&key) {
                    s.read_waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if !self.done {
            let mut sh = lock(&self.guard.shared);
            sh.conn.discard_body(self.guard.key);
            sh.wake_driver();
        }
    }
}

/// Answers one request.
pub struct Responder {
    guard: Arc<Guard>,
    used: bool,
}

impl Responder {
    /// Starts the response; write the body into the sink and close it.
    /// After the client has gone, this still succeeds and what follows is
    /// swallowed.
    pub fn respond(mut self, head: ResponseHead) -> Result<ResponseSink, StreamError> {
        self.used = true;
        let mut sh = lock(&self.guard.shared);
        sh.conn.respond(self.guard.key, head)?;
        sh.wake_driver();
        drop(sh);
        Ok(ResponseSink {
            guard: self.guard.clone(),
            pending: None,
            closed: false,
        })
    }

    /// Fails the request before a response: the relay receives 500.
    pub fn fail(mut self) {
        self.used = true;
        fail(&self.guard);
    }

    /// Resolves when the client has gone (the relay aborted or the
    /// connection was lost). Never resolves for a request answered in full.
    pub fn client_gone(&self) -> ClientGone {
        ClientGone {
            guard: self.guard.clone(),
        }
    }
}

fn fail(guard: &Guard) {
    let mut sh = lock(&guard.shared);
    let _ = sh.conn.fail(guard.key);
    sh.wake_driver();
}

impl Drop for Responder {
    fn drop(&mut self) {
        if !self.used {
            fail(&self.guard);
        }
    }
}

/// Resolves when the request's client has gone.
pub struct ClientGone {
    guard: Arc<Guard>,
}

impl Future for ClientGone {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut sh = lock(&self.guard.shared);
        match sh.slots.get_mut(&self.guard.key) {
            Some(s) => match s.gone {
                Some(WorkerEnd::ClientAborted | WorkerEnd::ConnectionLost) => Poll::Ready(()),
                _ => {
                    s.gone_waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            },
            None => Poll::Pending,
        }
    }
}

/// The response body: a [`Sink`] of [`Bytes`]; `close` sends `end`.
/// Dropping it before closing fails the response (the relay gets `abort`).
pub struct ResponseSink {
    guard: Arc<Guard>,
    pending: Option<Bytes>,
    closed: bool,
}

impl ResponseSink {
    /// Fails the response after it started: the relay receives `abort`.
    pub fn fail(mut self) {
        self.closed = true;
        fail(&self.guard);
    }

    fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
        let mut sh = lock(&self.guard.shared);
        let key = self.guard.key;
        while let Some(mut data) = self.pending.take() {
            if matches!(
                sh.slots.get(&key).and_then(|s| s.gone),
                Some(WorkerEnd::ClientAborted | WorkerEnd::ConnectionLost)
            ) {
                return Poll::Ready(Err(BodyError::ClientGone));
            }
            let n = sh
                .conn
                .send_body(key, data.clone())
                .map_err(BodyError::Stream)?;
            if n > 0 {
                sh.wake_driver();
            }
            let _ = data.split_to(n);
            if !data.is_empty() {
                self.pending = Some(data);
                if n == 0 {
                    if let Some(s) = sh.slots.get_mut(&key) {
                        s.write_waker = Some(cx.waker().clone());
                    }
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl Sink<Bytes> for ResponseSink {
    type Error = BodyError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
        self.get_mut().poll_push(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Bytes) -> Result<(), BodyError> {
        let this = self.get_mut();
        if this.closed {
            return Err(BodyError::Stream(StreamError::AlreadyFinished));
        }
        if !item.is_empty() {
            this.pending = Some(item);
        }
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
        self.get_mut().poll_push(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(Ok(()));
        }
        match this.poll_push(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        this.closed = true;
        let mut sh = lock(&this.guard.shared);
        let r = sh.conn.finish(this.guard.key).map_err(BodyError::Stream);
        sh.wake_driver();
        Poll::Ready(r)
    }
}

impl Drop for ResponseSink {
    fn drop(&mut self) {
        if !self.closed {
            fail(&self.guard);
        }
    }
}
