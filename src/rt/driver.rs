//! The socket loop both drivers share: transmit, receive (only while the
//! machine wants to read), and the machine's timer.

use super::timer::{Sleep, Timer};
use crate::frame::Message;
use crate::proto::{HandleError, RelayConnection, WorkerConnection};
use futures_core::Stream;
use futures_sink::Sink;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

/// The inputs and drains the driver needs from a state machine.
pub(crate) trait Machine {
    fn handle_message(&mut self, msg: Message, now: Instant) -> Result<(), HandleError>;
    fn handle_lost(&mut self);
    fn handle_timeout(&mut self, now: Instant);
    fn poll_transmit(&mut self) -> Option<Message>;
    fn poll_timeout(&self) -> Option<Instant>;
    fn wants_read(&self) -> bool;
    fn is_closed(&self) -> bool;
}

macro_rules! impl_machine {
    ($t:ty) => {
        impl Machine for $t {
            fn handle_message(&mut self, msg: Message, now: Instant) -> Result<(), HandleError> {
                <$t>::handle_message(self, msg, now)
            }
            fn handle_lost(&mut self) {
                <$t>::handle_lost(self)
            }
            fn handle_timeout(&mut self, now: Instant) {
                <$t>::handle_timeout(self, now)
            }
            fn poll_transmit(&mut self) -> Option<Message> {
                <$t>::poll_transmit(self)
            }
            fn poll_timeout(&self) -> Option<Instant> {
                <$t>::poll_timeout(self)
            }
            fn wants_read(&self) -> bool {
                <$t>::wants_read(self)
            }
            fn is_closed(&self) -> bool {
                <$t>::is_closed(self)
            }
        }
    };
}

impl_machine!(RelayConnection);
impl_machine!(WorkerConnection);

/// Why a driver stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError<E> {
    /// The socket failed.
    #[error("socket error: {0}")]
    Socket(E),
}

/// The socket half of a driver, with its sleep.
pub(crate) struct Io<S, T> {
    pub socket: S,
    pub timer: T,
    sleep: Option<(Instant, Sleep)>,
    /// A message taken from the machine that the socket has not accepted yet.
    pending: Option<Message>,
    flushed: bool,
    eof: bool,
    started: bool,
}

/// What one pass of [`Io::poll_io`] did.
pub(crate) enum Pass<E> {
    /// Something moved: run the event dispatch and go round again.
    Progress,
    /// Nothing can move until a waker fires.
    Idle,
    /// The connection is over and the close has been flushed.
    Done(Result<(), DriverError<E>>),
}

impl<S, T, E> Io<S, T>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
    T: Timer,
{
    pub fn new(socket: S, timer: T) -> Io<S, T> {
        Io {
            socket,
            timer,
            sleep: None,
            pending: None,
            flushed: true,
            eof: false,
            started: false,
        }
    }

    /// One pass over the socket and the timer.
    pub fn poll_io<M: Machine>(&mut self, m: &mut M, cx: &mut Context<'_>) -> Pass<E> {
        let mut progress = false;
        if !self.started {
            // Arms the machine's timers (the keepalive).
            self.started = true;
            m.handle_timeout(self.timer.now());
        }

        // Transmit.
        loop {
            if self.pending.is_none() {
                self.pending = m.poll_transmit();
            }
            let Some(msg) = self.pending.take() else {
                break;
            };
            match Pin::new(&mut self.socket).poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return self.fail(m, e),
                Poll::Pending => {
                    self.pending = Some(msg);
                    break;
                }
            }
            if let Err(e) = Pin::new(&mut self.socket).start_send(msg) {
                return self.fail(m, e);
            }
            self.flushed = false;
            progress = true;
        }
        if !self.flushed {
            match Pin::new(&mut self.socket).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.flushed = true,
                Poll::Ready(Err(e)) => return self.fail(m, e),
                Poll::Pending => {}
            }
        }

        // Closed: once everything (the close message last) is flushed, close the socket.
        if m.is_closed() && self.pending.is_none() {
            return match Pin::new(&mut self.socket).poll_close(cx) {
                Poll::Ready(_) => Pass::Done(Ok(())),
                Poll::Pending if progress => Pass::Progress,
                Poll::Pending => Pass::Idle,
            };
        }

        // Receive, only while the machine wants to.
        while !self.eof && m.wants_read() {
            match Pin::new(&mut self.socket).poll_next(cx) {
                Poll::Ready(Some(Ok(msg))) => {
                    let now = self.timer.now();
                    // wants_read() was checked just above, so this cannot pause.
                    let _ = m.handle_message(msg, now);
                    progress = true;
                }
                Poll::Ready(Some(Err(e))) => return self.fail(m, e),
                Poll::Ready(None) => {
                    self.eof = true;
                    m.handle_lost();
                    progress = true;
                }
                Poll::Pending => break,
            }
        }

        // The machine's timer.
        let deadline = m.poll_timeout();
        if self.sleep.as_ref().map(|(d, _)| *d) != deadline {
            self.sleep = deadline.map(|d| (d, self.timer.sleep_until(d)));
        }
        if let Some((_, sleep)) = self.sleep.as_mut() {
            if sleep.as_mut().poll(cx).is_ready() {
                self.sleep = None;
                m.handle_timeout(self.timer.now());
                progress = true;
            }
        }

        if progress {
            Pass::Progress
        } else {
            Pass::Idle
        }
    }

    fn fail<M: Machine>(&mut self, m: &mut M, e: E) -> Pass<E> {
        m.handle_lost();
        Pass::Done(Err(DriverError::Socket(e)))
    }
}
