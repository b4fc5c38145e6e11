//! What the relay and worker drivers share: the driver's poll loop and the
//! body sink's bookkeeping, over a side's shared state.

use super::driver::{Closed, DriverError, Io, Machine, Pass};
use super::timer::Timer;
use super::BodyError;
use crate::frame::Message;
use crate::proto::{FinishError, StreamKey, WriteError};
use bytes::Bytes;
use futures_core::Stream;
use futures_sink::Sink;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// A side's state shared between its driver, its handles and its bodies.
pub(crate) trait Side {
    type Conn: Machine;
    fn conn(&mut self) -> &mut Self::Conn;
    /// Turns the machine's events into wake-ups.
    fn dispatch(&mut self);
    fn driver_waker(&mut self) -> &mut Option<Waker>;
    /// The driver has stopped.
    fn done(&mut self) {}
    /// Why the stream's output can no longer be written, if it cannot.
    fn write_error(&self, key: StreamKey) -> Option<BodyError>;
    fn send_body(&mut self, key: StreamKey, data: Bytes) -> Result<usize, WriteError>;
    fn finish(&mut self, key: StreamKey) -> Result<(), FinishError>;
    fn set_write_waker(&mut self, key: StreamKey, waker: Waker);

    fn wake_driver(&mut self) {
        if let Some(w) = self.driver_waker().take() {
            w.wake();
        }
    }
}

/// Locks shared state; a panic elsewhere does not poison it for the others.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One poll of a driver: socket and timer passes until nothing moves.
pub(crate) fn poll_driver<Sh, S, T, E>(
    shared: &Mutex<Sh>,
    io: &mut Io<S, T>,
    cx: &mut Context<'_>,
) -> Poll<Result<Closed, DriverError<E>>>
where
    Sh: Side,
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
    T: Timer,
{
    let mut sh = lock(shared);
    *sh.driver_waker() = Some(cx.waker().clone());
    loop {
        let pass = io.poll_io(sh.conn(), cx);
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
}

/// The bookkeeping of a body sink: the piece the machine has not taken yet.
#[derive(Default)]
pub(crate) struct SinkCore {
    pending: Option<Bytes>,
    pub closed: bool,
}

impl SinkCore {
    /// Hands the pending piece to the machine as far as its queue allows.
    pub fn poll_push<Sh: Side>(
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
    pub fn poll_close<Sh: Side>(
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
    pub fn finish_now<Sh: Side>(
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

/// `Sink<Bytes>` for a body sink type with fields `guard` (holding `shared`
/// and `key`) and `core: SinkCore`.
macro_rules! impl_body_sink {
    ($t:ty) => {
        impl futures_sink::Sink<bytes::Bytes> for $t {
            type Error = $crate::rt::BodyError;

            fn poll_ready(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Self::Error>> {
                let this = self.get_mut();
                this.core.poll_push(&this.guard.shared, this.guard.key, cx)
            }

            fn start_send(
                self: std::pin::Pin<&mut Self>,
                item: bytes::Bytes,
            ) -> Result<(), Self::Error> {
                self.get_mut().core.start_send(item)
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Self::Error>> {
                let this = self.get_mut();
                this.core.poll_push(&this.guard.shared, this.guard.key, cx)
            }

            fn poll_close(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Self::Error>> {
                let this = self.get_mut();
                this.core.poll_close(&this.guard.shared, this.guard.key, cx)
            }
        }
    };
}
pub(crate) use impl_body_sink;
