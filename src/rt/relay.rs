//! The relay side on any executor: send a request, get the response head and
//! a body stream, or a typed error.

use super::driver::{Closed, DriverError};
use super::overflow::{MemoryOverflow, Overflow};
use super::overflow_io::{Done, Io, StreamStore, APPENDING_MAX};
use super::side::{self, lock, poll_body, BodySink, DriverCore, SharedState, Wakers};
use super::timer::Timer;
use super::BodyError;
use crate::frame::{Message, RequestHead, ResponseHead};
use crate::proto::local_map::LocalMap;
use crate::proto::{
    CloseCause, FinishError, OpenError, RelayConfig, RelayConnection, RelayEnd, RelayEvent, Stats,
    StreamKey,
};
use bytes::Bytes;
use futures_core::Stream;
use futures_sink::Sink;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// Why a request through the relay failed before its response head arrived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The connection to the worker is gone (answer 502).
    #[error("the worker connection was lost")]
    WorkerGone,
    /// The worker aborted the request (answer 502).
    #[error("the worker aborted the request")]
    WorkerAborted,
    /// The worker broke the protocol on this stream: a bad response head
    /// (1xx, a status outside 200..=599, a bad Content-Length, over the
    /// head limits), or frames out of order (answer 502).
    #[error("the worker broke the protocol")]
    ProtocolError,
    /// The request was given up on this side: its [`RequestSink`] was
    /// dropped before it was closed (typically because the caller's body
    /// failed, as a malformed chunked body does). Answer 400.
    #[error("the request body was abandoned before its end")]
    RequestAborted,
    /// The connection to the worker went before the request's head was
    /// sent: the worker never saw it (answer 503, or send it again on the
    /// worker's next connection if its body can be had again).
    #[error("the worker connection closed before the request was sent")]
    Unsent,
    /// The request could not be opened; [`OpenError::status`] says what
    /// to answer (503, 405, 431, 414, 400, …).
    #[error(transparent)]
    Open(#[from] OpenError),
}

impl RelayError {
    /// The HTTP status to answer the caller with: 502 when the worker is
    /// gone, aborted or broke the protocol, 503 when it never saw the
    /// request, 400 for an abandoned request
    /// body, and [`OpenError::status`] for a request that was refused.
    pub fn status(&self) -> u16 {
        match self {
            RelayError::WorkerGone | RelayError::WorkerAborted | RelayError::ProtocolError => 502,
            RelayError::RequestAborted => 400,
            RelayError::Unsent => 503,
            RelayError::Open(e) => e.status(),
        }
    }
}

impl From<RelayEnd> for RelayError {
    fn from(e: RelayEnd) -> RelayError {
        match e {
            RelayEnd::WorkerAborted => RelayError::WorkerAborted,
            RelayEnd::ProtocolError => RelayError::ProtocolError,
            RelayEnd::Unsent => RelayError::Unsent,
            _ => RelayError::WorkerGone,
        }
    }
}

#[derive(Default)]
struct Slot {
    head: Option<ResponseHead>,
    ended: Option<RelayEnd>,
    /// The request sink was dropped unclosed: the stream was aborted here.
    abandoned: bool,
    /// The stream's overflow store, from its first spill (its work runs
    /// where the store says, off this lock).
    store: Option<StreamStore>,
    /// The overflow store failed: the stream was aborted here.
    store_failed: bool,
    /// `other` is the response future's.
    wakers: Wakers,
}

struct Shared {
    conn: RelayConnection,
    /// Keyed by this side's own keys: the cheap hasher.
    slots: LocalMap<StreamKey, Slot>,
    driver: Option<Waker>,
    overflow: Arc<dyn Overflow>,
    /// What the streams' stores completed.
    io: Io,
    clock: Arc<dyn Timer>,
}

impl Shared {
    /// Appends a spilled chunk to its stream's store (made on first use).
    fn spill(&mut self, key: StreamKey, data: Bytes) {
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        slot.store
            .get_or_insert_with(|| StreamStore::new(key, &self.io, &self.overflow))
            .append(data);
    }

    /// Asks the stream's store for its next bytes; they go back to the
    /// machine when the store has read them ([`Shared::on_done`]).
    fn refill(&mut self, key: StreamKey, max: usize) {
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        let Some(store) = slot.store.as_ref() else {
            return self.store_failed(key);
        };
        store.read(max);
        // The reader waiting for these bytes is woken when they come,
        // without a round trip through the driver.
        self.io.watch(slot.wakers.read.as_ref());
    }

    /// What a stream's store completed.
    fn on_done(&mut self, key: StreamKey, done: Done) {
        if !self.slots.contains_key(&key) {
            return;
        }
        match done {
            Done::Read(data) => {
                if self.conn.refill(key, data).is_err() {
                    self.store_failed(key);
                }
            }
            Done::Failed => self.store_failed(key),
        }
    }

    /// The overflow store failed: the stream cannot be delivered in order.
    fn store_failed(&mut self, key: StreamKey) {
        self.conn.abort(key);
        // The abort goes out from the driver: wake it, whoever served this
        // refill (a reader's task; or the driver's own dispatch, after
        // which an idle pass would leave the abort queued).
        if let Some(w) = self.driver.take() {
            w.wake();
        }
        if let Some(slot) = self.slots.get_mut(&key) {
            slot.store_failed = true;
            slot.store = None;
            slot.wakers.wake_all();
        }
    }
}

impl SharedState for Shared {
    type Conn = RelayConnection;

    fn conn(&mut self) -> &mut RelayConnection {
        &mut self.conn
    }

    fn driver_waker(&mut self) -> &mut Option<Waker> {
        &mut self.driver
    }

    fn clock(&self) -> &dyn Timer {
        &*self.clock
    }

    fn write_error(&self, key: StreamKey) -> Option<BodyError> {
        let end = self.slots.get(&key).and_then(|s| s.ended)?;
        end.is_failure().then(|| BodyError::from(end))
    }

    fn wakers(&mut self, key: StreamKey) -> Option<&mut Wakers> {
        self.slots.get_mut(&key).map(|s| &mut s.wakers)
    }

    fn read_gone(&mut self, key: StreamKey) -> BodyError {
        let closed = self.conn.is_closed();
        match self.slots.remove(&key) {
            Some(Slot {
                store_failed: true, ..
            }) => BodyError::Overflow,
            // Completed on the wire, then given up: its reader took nothing
            // for the stall deadline.
            Some(Slot {
                ended: Some(RelayEnd::Completed),
                ..
            }) if !closed => BodyError::Stalled,
            Some(Slot {
                ended: Some(end), ..
            }) => end.into(),
            Some(Slot {
                abandoned: true, ..
            }) => BodyError::RequestAborted,
            _ => BodyError::ConnectionLost,
        }
    }

    fn serve_reads(&mut self) {
        // Refills are the overflow store's reads; doing them here saves
        // the reader a round trip through the driver for each
        // `memory_per_stream` of a spilled stream.
        self.dispatch();
    }

    fn read_end(&mut self, key: StreamKey) {
        self.slots.remove(&key);
    }

    fn release(&mut self, key: StreamKey) {
        // `abort` is a no-op for a stream that has already finished and been read.
        self.conn.abort(key);
        self.slots.remove(&key);
        self.wake_driver();
    }

    fn dispatch(&mut self) {
        loop {
            let mut moved = false;
            // While the stores work, the driver is woken when they finish.
            for (key, done) in self.io.take_done(self.driver.as_ref()) {
                moved = true;
                self.on_done(key, done);
            }
            while self.io.appending() < APPENDING_MAX {
                let Some((key, data)) = self.conn.poll_spill() else {
                    break;
                };
                moved = true;
                self.spill(key, data);
            }
            while let Some(ev) = self.conn.poll_event() {
                moved = true;
                self.on_event(ev);
            }
            if !moved {
                return;
            }
        }
    }
}

impl Shared {
    fn on_event(&mut self, ev: RelayEvent) {
        match ev {
            RelayEvent::Refill { key, max } => self.refill(key, max),
            RelayEvent::Response { key, head } => {
                if let Some(s) = self.slots.get_mut(&key) {
                    s.head = Some(head);
                    s.wakers.wake_other();
                }
            }
            RelayEvent::Readable { key } => {
                let spilled = self.conn.spilled(key);
                if let Some(s) = self.slots.get_mut(&key) {
                    if spilled == 0 {
                        // Nothing of it is in the overflow any more (read
                        // back, or dropped when the stream was given up):
                        // free the store now, not when the reader wakes.
                        s.store = None;
                    }
                    s.wakers.wake_read();
                }
            }
            RelayEvent::Writable { key } => self.wakers(key).map_or((), Wakers::wake_write),
            RelayEvent::Ended { key, reason, .. } => {
                if let Some(s) = self.slots.get_mut(&key) {
                    s.ended = Some(reason);
                    s.wakers.wake_all();
                }
            }
        }
    }
}

type SharedRef = Arc<Mutex<Shared>>;

/// Creates the relay side of a connection over `socket` (a WebSocket mapped
/// to the crate's [`Message`]). Spawn or poll the [`RelayDriver`]; send
/// requests through the [`RelayHandle`] (cheap to clone).
///
/// Both sides over an in-memory pipe, on tokio (any executor will do; the
/// WebSocket and the timer here are `worker-relay-hyper`'s, the crate
/// beside this one: `ws::WsSocket`, tokio-tungstenite's socket as this
/// crate's messages, and `TokioTimer`):
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use futures::{SinkExt, StreamExt};
/// use tokio_tungstenite::{tungstenite::protocol::Role, WebSocketStream};
/// use worker_relay::frame::{Headers, RequestHead, ResponseHead};
/// use worker_relay::proto::{RelayConfig, WorkerConfig};
/// use worker_relay::rt;
/// use worker_relay_hyper::{ws::WsSocket, TokioTimer};
///
/// let (a, b) = tokio::io::duplex(64 << 10);
/// let relay_socket = WsSocket::server(a).await;
/// let worker_socket = WsSocket(WebSocketStream::from_raw_socket(b, Role::Client, None).await);
///
/// // The relay: a handle to send requests with, and a driver to spawn.
/// let (handle, driver) = rt::relay(relay_socket, TokioTimer, RelayConfig::default());
/// tokio::spawn(driver);
///
/// // The worker: answers every request with "hello".
/// let (mut incoming, driver) = rt::worker(worker_socket, TokioTimer, WorkerConfig::default());
/// tokio::spawn(driver);
/// tokio::spawn(async move {
///     while let Some(req) = incoming.next().await {
///         let mut body = req.responder.respond(ResponseHead::new(200, Headers::new())?)?;
///         body.send("hello".into()).await?;
///         body.close().await?;
///     }
///     Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
/// });
///
/// let response = handle
///     .send_empty(RequestHead::new("GET", "/greeting", "", Headers::new())?)?
///     .await?;
/// assert_eq!(response.head.status(), 200);
/// let body: Vec<_> = response.body.map(|piece| piece.unwrap()).collect().await;
/// assert_eq!(body.concat(), b"hello");
/// # Ok(()) }
/// ```
///
/// With [`RelayConfig::overflow`](crate::proto::RelayConfig::overflow) set,
/// a slow caller's response waits in memory: a [`MemoryOverflow`] of this
/// connection's own, within its default 64 MiB budget. Give a store of your
/// own (temporary files, one budget for several connections) with
/// [`relay_with_overflow`].
pub fn relay<S, T, E>(socket: S, timer: T, config: RelayConfig) -> (RelayHandle, RelayDriver<S, T>)
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
    T: Timer,
{
    relay_with_overflow(socket, timer, config, Arc::new(MemoryOverflow::default()))
}

/// [`relay`] with `overflow` holding what slow callers have not read yet
/// (when [`RelayConfig::overflow`](crate::proto::RelayConfig::overflow) is
/// set; its budgets bound what goes there).
pub fn relay_with_overflow<S, T, E>(
    socket: S,
    timer: T,
    config: RelayConfig,
    overflow: Arc<dyn Overflow>,
) -> (RelayHandle, RelayDriver<S, T>)
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
    T: Timer,
{
    let clock: Arc<dyn Timer> = Arc::new(timer);
    let shared = Arc::new(Mutex::new(Shared {
        conn: RelayConnection::new(config),
        slots: LocalMap::default(),
        driver: None,
        overflow,
        io: Io::default(),
        clock: clock.clone(),
    }));
    (
        RelayHandle {
            shared: shared.clone(),
        },
        RelayDriver::new(shared, socket, clock),
    )
}

/// The future that runs one relay connection; completes when it closes.
pub struct RelayDriver<S, T> {
    core: DriverCore<Shared, S>,
    /// The clock is shared with the handles, behind `dyn Timer`.
    _timer: PhantomData<fn() -> T>,
}

impl<S, T> RelayDriver<S, T> {
    fn new(shared: SharedRef, socket: S, timer: Arc<dyn Timer>) -> Self {
        RelayDriver {
            core: DriverCore::new(shared, socket, timer),
            _timer: PhantomData,
        }
    }
}

impl<S, T, E> Future for RelayDriver<S, T>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
    T: Timer,
{
    type Output = Result<Closed, DriverError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().core.poll(cx)
    }
}

/// Sends requests over one relay connection.
#[derive(Clone)]
pub struct RelayHandle {
    shared: SharedRef,
}

impl std::fmt::Debug for RelayHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayHandle").finish_non_exhaustive()
    }
}

impl RelayHandle {
    /// Opens a stream for `head`. Write the body into the returned sink and
    /// close it (a request without a body: close it at once, or use
    /// [`RelayHandle::send_empty`]); await the response.
    ///
    /// Dropping the sink before closing it, or the response future or body
    /// before the end, aborts the stream (the caller has gone).
    ///
    /// ```
    /// use futures::SinkExt;
    /// use worker_relay::frame::{Headers, RequestHead};
    /// use worker_relay::rt::{RelayHandle, WorkerResponse};
    ///
    /// type BoxError = Box<dyn std::error::Error + Send + Sync>;
    ///
    /// /// `POST /echo` with a small body: written in full before the
    /// /// answer is awaited, which is fine while the body fits the
    /// /// connection's queue (see the module docs for large bodies).
    /// async fn post(handle: &RelayHandle, body: &'static [u8]) -> Result<WorkerResponse, BoxError> {
    ///     let mut headers = Headers::new();
    ///     headers.try_push("content-length", body.len().to_string())?;
    ///     let (mut sink, response) =
    ///         handle.send_request(RequestHead::new("POST", "/echo", "", headers)?)?;
    ///     sink.send(body.into()).await?;
    ///     sink.close().await?; // `end`
    ///     Ok(response.await?)
    /// }
    /// ```
    pub fn send_request(
        &self,
        head: RequestHead,
    ) -> Result<(RequestSink, ResponseFuture), RelayError> {
        let mut sh = lock(&self.shared);
        let key = sh.conn.open_stream(head)?;
        sh.slots.insert(key, Slot::default());
        sh.wake_driver();
        drop(sh);
        let guard = Arc::new(Guard {
            shared: self.shared.clone(),
            key,
        });
        Ok((
            RequestSink {
                sink: BodySink::new(guard.clone()),
            },
            ResponseFuture { guard: Some(guard) },
        ))
    }

    /// Sends a request without a body.
    pub fn send_empty(&self, head: RequestHead) -> Result<ResponseFuture, RelayError> {
        let (mut sink, resp) = self.send_request(head)?;
        sink.finish_now()?;
        Ok(resp)
    }

    /// Whether the connection has closed.
    pub fn is_closed(&self) -> bool {
        lock(&self.shared).conn.is_closed()
    }

    /// The connection's counters.
    pub fn stats(&self) -> Stats {
        lock(&self.shared).conn.stats()
    }

    /// Why the connection closed, once it has started closing (it may
    /// still be flushing its close message, for at most its
    /// `close_timeout`).
    pub fn close_cause(&self) -> Option<CloseCause> {
        lock(&self.shared).conn.close_cause().cloned()
    }

    /// Closes the connection; requests in flight fail with
    /// [`RelayError::WorkerGone`]. The close message goes out after what is
    /// queued; the driver then reads on (dropping what the worker still
    /// sends) until the worker's answering close, and closes the socket. A
    /// worker that has not taken the close and answered it within the
    /// connection's `close_timeout` has its transport dropped
    /// ([`DriverError::CloseTimeout`](super::DriverError::CloseTimeout)).
    pub fn close(&self, code: crate::frame::CloseCode, reason: &str) {
        let mut sh = lock(&self.shared);
        sh.stamp();
        sh.conn.close(code, reason);
        sh.dispatch();
        sh.wake_driver();
    }
}

/// Aborts the stream when the caller's last handle on it goes away early.
type Guard = side::Guard<Shared>;

/// The request body: a [`Sink`] of [`Bytes`]. `close` sends `end`.
pub struct RequestSink {
    sink: BodySink<Shared>,
}

impl RequestSink {
    /// Ends a body-less request. Its only failure: a Content-Length that
    /// announced a body (the stream is aborted), an invalid request.
    fn finish_now(&mut self) -> Result<(), OpenError> {
        match self
            .sink
            .core
            .finish_now(&self.sink.guard.shared, self.sink.guard.key)
        {
            Err(BodyError::Finish(FinishError::ContentLengthShort { .. })) => {
                Err(OpenError::InvalidContentLength)
            }
            _ => Ok(()),
        }
    }
}

impl RequestSink {
    /// Bytes the connection has taken from this sink so far (queued to
    /// send; bytes handed to `start_send` and not yet flushed do not count):
    /// a measure of the body's progress.
    pub fn bytes_taken(&self) -> u64 {
        self.sink.bytes_taken()
    }
}

impl Sink<Bytes> for RequestSink {
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

impl Drop for RequestSink {
    fn drop(&mut self) {
        if !self.sink.core.closed {
            let mut sh = lock(&self.sink.guard.shared);
            sh.stamp();
            sh.conn.abort(self.sink.guard.key);
            if let Some(slot) = sh.slots.get_mut(&self.sink.guard.key) {
                // Whoever awaits the response learns it will not come.
                slot.abandoned = true;
                slot.wakers.wake_all();
            }
            sh.wake_driver();
        }
    }
}

/// Resolves to the worker's response head and body stream.
pub struct ResponseFuture {
    guard: Option<Arc<Guard>>,
}

/// The worker's response: its head and body.
pub struct WorkerResponse {
    /// The response head.
    pub head: ResponseHead,
    /// The response body.
    pub body: ResponseBody,
}

impl Future for ResponseFuture {
    type Output = Result<WorkerResponse, RelayError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let guard = this.guard.as_ref().expect("polled after completion");
        let mut sh = lock(&guard.shared);
        let key = guard.key;
        let Some(slot) = sh.slots.get_mut(&key) else {
            return Poll::Ready(Err(RelayError::WorkerGone));
        };
        if let Some(head) = slot.head.take() {
            drop(sh);
            let guard = this.guard.take().expect("checked");
            return Poll::Ready(Ok(WorkerResponse {
                head,
                body: ResponseBody { guard, done: false },
            }));
        }
        if let Some(end) = slot.ended {
            return Poll::Ready(Err(end.into()));
        }
        if slot.abandoned {
            return Poll::Ready(Err(RelayError::RequestAborted));
        }
        slot.wakers.other = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// The response body: a [`Stream`] of [`Bytes`]. An `Err` item means the
/// response failed and must be ended as failed (not completed).
pub struct ResponseBody {
    guard: Arc<Guard>,
    done: bool,
}

impl Stream for ResponseBody {
    type Item = Result<Bytes, BodyError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        poll_body(&this.guard, &mut this.done, cx)
    }
}
