//! The worker side on any executor: a stream of incoming requests, each with
//! its head, a body stream and a responder.

use super::driver::{Closed, DriverError};
use super::side::{self, lock, poll_body, BodySink, DriverCore, SharedState, Wakers};
use super::timer::Timer;
use super::BodyError;
use crate::frame::{CloseCode, Message, RequestHead, ResponseHead, StreamId};
use crate::proto::local_map::LocalMap;
use crate::proto::{
    RespondError, Stats, StreamKey, WorkerConfig, WorkerConnection, WorkerEnd, WorkerEvent,
};
use bytes::Bytes;
use futures_core::Stream;
use futures_sink::Sink;
use std::collections::VecDeque;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

#[derive(Default)]
struct Slot {
    gone: Option<WorkerEnd>,
    /// `other` is `client_gone`'s.
    wakers: Wakers,
}

struct Shared {
    conn: WorkerConnection,
    /// Keyed by this side's own keys: the cheap hasher.
    slots: LocalMap<StreamKey, Slot>,
    incoming: VecDeque<(StreamKey, StreamId, RequestHead)>,
    incoming_waker: Option<Waker>,
    driver: Option<Waker>,
    finished: bool,
    clock: Arc<dyn Timer>,
}

impl SharedState for Shared {
    type Conn = WorkerConnection;

    fn conn(&mut self) -> &mut WorkerConnection {
        &mut self.conn
    }

    fn driver_waker(&mut self) -> &mut Option<Waker> {
        &mut self.driver
    }

    fn clock(&self) -> &dyn Timer {
        &*self.clock
    }

    fn done(&mut self) {
        self.finished = true;
        if let Some(w) = self.incoming_waker.take() {
            w.wake();
        }
    }

    fn write_error(&self, key: StreamKey) -> Option<BodyError> {
        match self.slots.get(&key).and_then(|s| s.gone) {
            Some(WorkerEnd::ClientAborted | WorkerEnd::ConnectionLost) => {
                Some(BodyError::ClientGone)
            }
            Some(WorkerEnd::ProtocolError) => Some(BodyError::ProtocolError),
            _ => None,
        }
    }

    fn wakers(&mut self, key: StreamKey) -> Option<&mut Wakers> {
        self.slots.get_mut(&key).map(|s| &mut s.wakers)
    }

    fn read_gone(&mut self, key: StreamKey) -> BodyError {
        match self.slots.get(&key).and_then(|s| s.gone) {
            Some(WorkerEnd::ProtocolError) => BodyError::ProtocolError,
            _ => BodyError::ClientGone,
        }
    }

    fn release(&mut self, key: StreamKey) {
        self.slots.remove(&key);
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
                WorkerEvent::Readable { key } => self.wakers(key).map_or((), Wakers::wake_read),
                WorkerEvent::Writable { key } => self.wakers(key).map_or((), Wakers::wake_write),
                WorkerEvent::Ended { key, reason } => {
                    // Not taken by the app yet: nobody will read or answer
                    // it, so it goes (else request+abort pairs from the
                    // peer would pile up here past `max_streams`).
                    if let Some(at) = self.incoming.iter().position(|(k, ..)| *k == key) {
                        self.incoming.remove(at);
                        self.slots.remove(&key);
                        continue;
                    }
                    if let Some(s) = self.slots.get_mut(&key) {
                        s.gone = Some(reason);
                        s.wakers.wake_all();
                    }
                }
            }
        }
    }
}

type SharedRef = Arc<Mutex<Shared>>;

/// Creates the worker side of a connection over `socket`. Poll the
/// [`WorkerDriver`] (spawn it) and take requests from [`Incoming`].
///
/// A worker that echoes every request body, each request on its own task
/// ([`relay`](super::relay) shows both sides together):
///
/// ```
/// use futures::{SinkExt, StreamExt};
/// use worker_relay::frame::{Headers, ResponseHead};
/// use worker_relay::rt::Incoming;
///
/// async fn echo(mut incoming: Incoming) {
///     while let Some(req) = incoming.next().await {
///         tokio::spawn(async move {
///             let head = ResponseHead::new(200, Headers::new())?;
///             let mut sink = req.responder.respond(head)?;
///             let mut body = req.body;
///             while let Some(piece) = body.next().await {
///                 sink.send(piece?).await?; // an Err: the client has gone
///             }
///             sink.close().await?; // `end`; dropping the sink unclosed aborts
///             Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
///         });
///     }
/// }
/// # let _ = echo;
/// ```
pub fn worker<S, T, E>(socket: S, timer: T, config: WorkerConfig) -> (Incoming, WorkerDriver<S, T>)
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
    T: Timer,
{
    let clock: Arc<dyn Timer> = Arc::new(timer);
    let shared = Arc::new(Mutex::new(Shared {
        conn: WorkerConnection::new(config),
        slots: LocalMap::default(),
        incoming: VecDeque::new(),
        incoming_waker: None,
        driver: None,
        finished: false,
        clock: clock.clone(),
    }));
    (
        Incoming {
            shared: shared.clone(),
        },
        WorkerDriver::new(shared, socket, clock),
    )
}

/// The future that runs one worker connection; completes when it closes.
pub struct WorkerDriver<S, T> {
    core: DriverCore<Shared, S>,
    /// The clock is shared with the handles, behind `dyn Timer`.
    _timer: PhantomData<fn() -> T>,
}

impl<S, T> WorkerDriver<S, T> {
    fn new(shared: SharedRef, socket: S, timer: Arc<dyn Timer>) -> Self {
        WorkerDriver {
            core: DriverCore::new(shared, socket, timer),
            _timer: PhantomData,
        }
    }
}

impl<S, T, E> Future for WorkerDriver<S, T>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
    T: Timer,
{
    type Output = Result<Closed, DriverError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().core.poll(cx)
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

    /// Closes the connection. The close message goes out after what is
    /// queued; the driver then reads on (dropping what the relay still
    /// sends) until the relay's answering close and the end of the stream
    /// (the relay, the server, ends the TCP connection first), and closes
    /// the socket. A relay that has not taken the close and answered it
    /// within the connection's `close_timeout` has its transport dropped
    /// ([`DriverError::CloseTimeout`](super::DriverError::CloseTimeout)).
    pub fn close(&self, code: CloseCode, reason: &str) {
        let mut sh = lock(&self.shared);
        sh.stamp();
        sh.conn.close(code, reason);
        sh.dispatch();
        sh.wake_driver();
    }
}

impl Stream for Incoming {
    type Item = IncomingRequest;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<IncomingRequest>> {
        let mut sh = lock(&self.shared);
        if let Some((key, id, head)) = sh.incoming.pop_front() {
            let guard = Arc::new(Guard {
                shared: self.shared.clone(),
                key,
            });
            return Poll::Ready(Some(IncomingRequest {
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
pub struct IncomingRequest {
    /// The wire id (for logs).
    pub id: StreamId,
    /// The request head.
    pub head: RequestHead,
    /// The request body. Dropping it discards the rest.
    pub body: RequestBody,
    /// Answers the request. Dropping it unanswered fails the request (500).
    pub responder: Responder,
}

type Guard = side::Guard<Shared>;

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
        poll_body(&this.guard, &mut this.done, cx)
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
    pub fn respond(mut self, head: ResponseHead) -> Result<ResponseSink, RespondError> {
        self.used = true;
        let mut sh = lock(&self.guard.shared);
        sh.conn.respond(self.guard.key, head)?;
        sh.wake_driver();
        drop(sh);
        Ok(ResponseSink {
            sink: BodySink::new(self.guard.clone()),
        })
    }

    /// Fails the request before a response: the relay receives 500.
    pub fn fail(mut self) {
        self.used = true;
        fail(&self.guard);
    }

    /// Resolves when the client has gone (the relay aborted, broke the
    /// protocol on this stream, or the connection was lost). Never resolves for a request answered in full.
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
                Some(
                    WorkerEnd::ClientAborted | WorkerEnd::ConnectionLost | WorkerEnd::ProtocolError,
                ) => Poll::Ready(()),
                _ => {
                    s.wakers.other = Some(cx.waker().clone());
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
    sink: BodySink<Shared>,
}

impl ResponseSink {
    /// Fails the response after it started: the relay receives `abort`,
    /// after the body already flushed. A piece given to `start_send` and
    /// not yet flushed is dropped: flush first to have it sent.
    pub fn fail(mut self) {
        self.sink.core.closed = true;
        fail(&self.sink.guard);
    }
}

impl ResponseSink {
    /// Bytes the connection has taken from this sink so far (queued to
    /// send; bytes handed to `start_send` and not yet flushed do not count):
    /// a measure of the body's progress.
    pub fn bytes_taken(&self) -> u64 {
        self.sink.bytes_taken()
    }
}

impl Sink<Bytes> for ResponseSink {
    type Error = BodyError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
        Pin::new(&mut self.get_mut().sink).poll_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Bytes) -> Result<(), BodyError> {
        Pin::new(&mut self.get_mut().sink).start_send(item)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
        Pin::new(&mut self.get_mut().sink).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
        Pin::new(&mut self.get_mut().sink).poll_close(cx)
    }
}

impl Drop for ResponseSink {
    fn drop(&mut self) {
        if !self.sink.core.closed {
            fail(&self.sink.guard);
        }
    }
}
