//! What the relay and worker drivers share: the driver's poll loop and the
//! body sink's bookkeeping, over a side's shared state.

use super::driver::{Closed, DriverError, Io, Machine, Pass, PASSES_PER_POLL};
use super::timer::Timer;
use super::BodyError;
use crate::frame::Message;
use crate::proto::BodyRead;
use crate::proto::{FinishError, StreamKey, WriteError};
use bytes::Bytes;
use futures_core::Stream;
use futures_sink::Sink;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// The wakers a stream's handles wait on: its body reader, its body
/// writer, and one more (the relay's response future, the worker's
/// `client_gone`).
#[derive(Default)]
pub(crate) struct Wakers {
    pub read: Option<Waker>,
    pub write: Option<Waker>,
    pub other: Option<Waker>,
}

impl Wakers {
    /// Wakes the body reader, if one waits.
    pub fn wake_read(&mut self) {
        if let Some(w) = self.read.take() {
            w.wake();
        }
    }

    /// Wakes the body writer, if one waits.
    pub fn wake_write(&mut self) {
        if let Some(w) = self.write.take() {
            w.wake();
        }
    }

    /// Wakes the task waiting for anything else (the response head).
    pub fn wake_other(&mut self) {
        if let Some(w) = self.other.take() {
            w.wake();
        }
    }

    pub fn wake_all(&mut self) {
        for w in [self.read.take(), self.write.take(), self.other.take()]
            .into_iter()
            .flatten()
        {
            w.wake();
        }
    }
}

/// A side's state shared between its driver, its handles and its bodies.
pub(crate) trait SharedState {
    type Conn: Machine;
    fn conn(&mut self) -> &mut Self::Conn;
    /// Turns the machine's events into wake-ups.
    fn dispatch(&mut self);
    fn driver_waker(&mut self) -> &mut Option<Waker>;
    /// The driver's clock.
    fn clock(&self) -> &dyn Timer;
    /// The driver has stopped.
    fn done(&mut self) {}
    /// Why the stream's output can no longer be written, if it cannot.
    fn write_error(&self, key: StreamKey) -> Option<BodyError>;
    /// The stream's wakers, while its handles live.
    fn wakers(&mut self, key: StreamKey) -> Option<&mut Wakers>;
    /// The error a body read that found the stream gone stands for.
    fn read_gone(&mut self, key: StreamKey) -> BodyError;
    /// A body was read to its end.
    fn read_end(&mut self, _key: StreamKey) {}
    /// Serves, in the reader's task, what the machine asked of the side
    /// for a body read (the relay's overflow refills), rather than waking
    /// the driver for it and waiting.
    fn serve_reads(&mut self) {}
    /// The last handle on the stream went away.
    fn release(&mut self, key: StreamKey);

    /// Tells the machine the time before a command: a deadline the command
    /// (re)starts counts from now, not from the last input.
    fn stamp(&mut self) {
        let now = self.clock().now();
        self.conn().advance_time(now);
    }

    fn send_body(&mut self, key: StreamKey, data: Bytes) -> Result<usize, WriteError> {
        self.stamp();
        self.conn().send_body(key, data)
    }

    fn finish(&mut self, key: StreamKey) -> Result<(), FinishError> {
        self.stamp();
        self.conn().finish(key)
    }

    fn set_write_waker(&mut self, key: StreamKey, waker: Waker) {
        if let Some(w) = self.wakers(key) {
            w.write = Some(waker);
        }
    }

    fn wake_driver(&mut self) {
        if let Some(w) = self.driver_waker().take() {
            w.wake();
        }
    }
}

/// A handle's hold on one stream; the last one to go tells the side.
pub(crate) struct Guard<Sh: SharedState> {
    pub shared: Arc<Mutex<Sh>>,
    pub key: StreamKey,
}

impl<Sh: SharedState> Drop for Guard<Sh> {
    fn drop(&mut self) {
        let mut sh = lock(&self.shared);
        sh.stamp();
        sh.release(self.key);
    }
}

/// One poll of a body stream (the relay's response body, the worker's
/// request body): the next piece, the end, or the side's error.
pub(crate) fn poll_body<Sh: SharedState>(
    guard: &Guard<Sh>,
    done: &mut bool,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Bytes, BodyError>>> {
    if *done {
        return Poll::Ready(None);
    }
    let mut sh = lock(&guard.shared);
    let key = guard.key;
    sh.stamp();
    // A refill the last read asked for: read it from the store now.
    sh.serve_reads();
    match sh.conn().read_body(key) {
        BodyRead::Data(d) => {
            // Reading may have un-paused the socket.
            sh.wake_driver();
            Poll::Ready(Some(Ok(d)))
        }
        BodyRead::End => {
            *done = true;
            sh.read_end(key);
            Poll::Ready(None)
        }
        BodyRead::Pending => {
            if let Some(w) = sh.wakers(key) {
                w.read = Some(cx.waker().clone());
            }
            // This read may have asked for a refill: served now, it wakes
            // the reader at once.
            sh.serve_reads();
            Poll::Pending
        }
        _ => {
            *done = true;
            Poll::Ready(Some(Err(sh.read_gone(key))))
        }
    }
}

/// What each side's driver future holds and does: the shared state and the
/// socket loop. `RelayDriver` and `WorkerDriver` wrap one each.
pub(crate) struct DriverCore<Sh, S> {
    shared: Arc<Mutex<Sh>>,
    io: Io<S>,
}

impl<Sh: SharedState, S> DriverCore<Sh, S> {
    pub fn new(shared: Arc<Mutex<Sh>>, socket: S, timer: Arc<dyn Timer>) -> Self {
        DriverCore {
            shared,
            io: Io::new(socket, timer),
        }
    }

    /// One poll of the driver future.
    pub fn poll<E>(&mut self, cx: &mut Context<'_>) -> Poll<Result<Closed, DriverError<E>>>
    where
        S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
    {
        poll_driver(&self.shared, &mut self.io, cx)
    }
}

/// Locks shared state; a panic elsewhere does not poison it for the others.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One poll of a driver: socket and timer passes until nothing moves, at
/// most [`PASSES_PER_POLL`] of them.
pub(crate) fn poll_driver<Sh, S, E>(
    shared: &Mutex<Sh>,
    io: &mut Io<S>,
    cx: &mut Context<'_>,
) -> Poll<Result<Closed, DriverError<E>>>
where
    Sh: SharedState,
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
{
    *lock(shared).driver_waker() = Some(cx.waker().clone());
    for _ in 0..PASSES_PER_POLL {
        let pass = io.poll_io(shared, cx);
        let mut sh = lock(shared);
        sh.dispatch();
        match pass {
            Pass::Progress => continue,
            Pass::Idle => return Poll::Pending,
            Pass::Done(r) => {
                sh.done();
                return Poll::Ready(r);
            }
        }
    }
    // Still moving: yield, and come back at once.
    cx.waker().wake_by_ref();
    Poll::Pending
}

/// The bookkeeping of a body sink: the piece the machine has not taken yet.
#[derive(Default)]
pub(crate) struct SinkCore {
    pending: Option<Bytes>,
    pub closed: bool,
    /// Bytes the machine has taken so far (a pump's measure of progress).
    pub taken: u64,
}

impl SinkCore {
    /// Hands the pending piece to the machine as far as its queue allows.
    pub fn poll_push<Sh: SharedState>(
        &mut self,
        shared: &Mutex<Sh>,
        key: StreamKey,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), BodyError>> {
        let mut sh = lock(shared);
        while let Some(mut data) = self.pending.take() {
            if let Some(e) = sh.write_error(key) {
                return Poll::Ready(Err(e));
            }
            let n = sh.send_body(key, data.clone())?;
            if n > 0 {
                self.taken += n as u64;
                sh.wake_driver();
            }
            let _ = data.split_to(n);
            if !data.is_empty() {
                self.pending = Some(data);
                if n == 0 {
                    sh.set_write_waker(key, cx.waker().clone());
                    sh.wake_driver();
                    return Poll::Pending;
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    pub fn start_send(&mut self, item: Bytes) -> Result<(), BodyError> {
        if self.closed {
            return Err(BodyError::Write(WriteError::AlreadyFinished));
        }
        debug_assert!(self.pending.is_none(), "start_send without poll_ready");
        if !item.is_empty() {
            self.pending = Some(item);
        }
        Ok(())
    }

    /// Pushes what is pending, then ends the stream's output.
    pub fn poll_close<Sh: SharedState>(
        &mut self,
        shared: &Mutex<Sh>,
        key: StreamKey,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), BodyError>> {
        if self.closed {
            return Poll::Ready(Ok(()));
        }
        match self.poll_push(shared, key, cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        Poll::Ready(self.finish_now(shared, key))
    }

    /// Ends the stream's output now (nothing may be pending).
    pub fn finish_now<Sh: SharedState>(
        &mut self,
        shared: &Mutex<Sh>,
        key: StreamKey,
    ) -> Result<(), BodyError> {
        self.closed = true;
        let mut sh = lock(shared);
        let r = sh.finish(key).map_err(BodyError::Finish);
        sh.wake_driver();
        r
    }
}

/// A body sink (the relay's request body, the worker's response body): the
/// stream it writes and the bookkeeping of what it holds. `RequestSink`
/// and `ResponseSink` wrap one each.
pub(crate) struct BodySink<Sh: SharedState> {
    pub guard: Arc<Guard<Sh>>,
    pub core: SinkCore,
}

impl<Sh: SharedState> BodySink<Sh> {
    pub fn new(guard: Arc<Guard<Sh>>) -> Self {
        BodySink {
            guard,
            core: SinkCore::default(),
        }
    }

    /// Bytes the connection has taken from this sink so far.
    pub fn bytes_taken(&self) -> u64 {
        self.core.taken
    }
}

impl<Sh: SharedState> Sink<Bytes> for BodySink<Sh> {
    type Error = BodyError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
        let this = self.get_mut();
        this.core.poll_push(&this.guard.shared, this.guard.key, cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Bytes) -> Result<(), BodyError> {
        self.get_mut().core.start_send(item)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
        let this = self.get_mut();
        this.core.poll_push(&this.guard.shared, this.guard.key, cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), BodyError>> {
        let this = self.get_mut();
        this.core.poll_close(&this.guard.shared, this.guard.key, cx)
    }
}
