//! The socket loop both drivers share: transmit, receive (only while the
//! machine wants to read), and the machine's timer.

use super::side::{lock, SharedState};
use super::timer::{Sleep, Timer};
use crate::frame::{CloseCode, CloseFrame, Message};
use crate::proto::pacer::SendPacer;
use crate::proto::{
    BodyRead, CloseCause, Connection, FinishError, HandleError, Side, StreamKey, WriteError,
};
use bytes::Bytes;
use futures_core::Stream;
use futures_sink::Sink;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

/// The inputs and drains the driver needs from a state machine.
pub(crate) trait Machine {
    /// Whether this side is the WebSocket server (the relay), which closes
    /// the TCP connection first once the close messages are exchanged
    /// (RFC 6455 §7.1.1); the client (the worker) waits for it.
    const SERVER: bool;
    fn handle_message(&mut self, msg: Message, now: Instant) -> Result<(), HandleError>;
    fn handle_lost(&mut self);
    fn handle_timeout(&mut self, now: Instant);
    fn advance_time(&mut self, now: Instant);
    fn close_timed_out(&self) -> bool;
    fn poll_transmit(&mut self) -> Option<Message>;
    fn poll_timeout(&self) -> Option<Instant>;
    fn wants_read(&self) -> bool;
    fn is_closed(&self) -> bool;
    fn close_cause(&self) -> Option<&CloseCause>;
    fn send_body(&mut self, key: StreamKey, data: Bytes) -> Result<usize, WriteError>;
    fn finish(&mut self, key: StreamKey) -> Result<(), FinishError>;
    fn read_body(&mut self, key: StreamKey) -> BodyRead;
    fn chunk_size(&self) -> usize;
    fn set_chunk_size(&mut self, n: usize);
}

/// Either side's machine: what both have the same way is called directly,
/// the rest through the side's hooks.
impl<P: Side> Machine for Connection<P> {
    const SERVER: bool = P::SERVER;
    fn handle_message(&mut self, msg: Message, now: Instant) -> Result<(), HandleError> {
        P::handle_message(self, msg, now)
    }
    fn handle_lost(&mut self) {
        Connection::handle_lost(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        P::handle_timeout(self, now)
    }
    fn advance_time(&mut self, now: Instant) {
        Connection::advance_time(self, now)
    }
    fn close_timed_out(&self) -> bool {
        Connection::close_timed_out(self)
    }
    fn poll_transmit(&mut self) -> Option<Message> {
        P::poll_transmit(self)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        P::poll_timeout(self)
    }
    fn wants_read(&self) -> bool {
        P::wants_read(self)
    }
    fn is_closed(&self) -> bool {
        Connection::is_closed(self)
    }
    fn close_cause(&self) -> Option<&CloseCause> {
        Connection::close_cause(self)
    }
    fn send_body(&mut self, key: StreamKey, data: Bytes) -> Result<usize, WriteError> {
        P::send_body(self, key, data)
    }
    fn finish(&mut self, key: StreamKey) -> Result<(), FinishError> {
        P::finish(self, key)
    }
    fn read_body(&mut self, key: StreamKey) -> BodyRead {
        P::read_body(self, key)
    }
    fn chunk_size(&self) -> usize {
        Connection::chunk_size(self)
    }
    fn set_chunk_size(&mut self, n: usize) {
        Connection::set_chunk_size(self, n)
    }
}

/// How a connection ended in good order: a driver's `Ok` value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Closed {
    /// The peer sent a close message (its code and reason, if it gave them).
    ByPeer(Option<CloseFrame>),
    /// The peer's side of the socket ended without a close message.
    Eof,
    /// This side closed it (`close` on a handle) with this code.
    Locally(CloseCode),
}

impl std::fmt::Display for Closed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Closed::ByPeer(Some(c)) if c.reason.is_empty() => {
                write!(f, "the peer closed the connection (code {})", c.code.0)
            }
            Closed::ByPeer(Some(c)) => write!(
                f,
                "the peer closed the connection (code {}: {})",
                c.code.0, c.reason
            ),
            Closed::ByPeer(None) => write!(f, "the peer closed the connection"),
            Closed::Eof => write!(f, "the peer's side of the socket ended"),
            Closed::Locally(c) => write!(f, "closed by this side (code {})", c.0),
        }
    }
}

/// Why a driver stopped abnormally.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError<E> {
    /// The socket failed.
    #[error("socket error: {0}")]
    Socket(E),
    /// The peer answered no ping within the keepalive timeout and took
    /// nothing we sent in that time: presumed frozen or gone. The transport
    /// was dropped at once, whatever was waiting to be written.
    #[error(
        "keepalive timeout: the peer neither answered a ping nor read for the keepalive timeout"
    )]
    KeepaliveTimeout,
    /// The peer sent a message over 1 MiB + 4 bytes; closed with 1009.
    #[error("the peer sent a message over 1 MiB + 4 bytes (closed with 1009)")]
    MessageTooBig,
    /// The connection was closing (by either side, for this reason) and
    /// did not finish within its `close_timeout`: the peer took nothing
    /// more (not even the close message), or it neither answered our close
    /// message nor ended the stream. The transport was dropped, whatever
    /// was still unsent. (Once both close messages are exchanged, a socket
    /// that does not end by the deadline is dropped in good order: the
    /// driver ends with [`Closed`].)
    #[error("{0}, and the close did not complete in time: the transport was dropped")]
    CloseTimeout(crate::proto::CloseCause),
}

/// The socket half of a driver, with its clock and sleep.
pub(crate) struct Io<S> {
    pub socket: S,
    pub timer: Arc<dyn Timer>,
    sleep: Option<(Instant, Sleep)>,
    /// A message taken from the machine that the socket has not accepted yet.
    pending: Option<Message>,
    /// A message read from the socket that the machine, paused, handed
    /// back: fed again before anything more is read.
    held: Option<Message>,
    flushed: bool,
    eof: bool,
    started: bool,
    /// What the socket drains, and so how much to hand it between flushes
    /// and how large a chunk the machine cuts (`proto::pacer`).
    pacer: SendPacer,
    /// The chunk size last given to the machine.
    chunk: usize,
    /// Where the closing handshake is, once the machine has closed.
    closing: closing::Closing,
    /// Whether the socket may have something to read (`read_gate.rs`).
    read_gate: read_gate::ReadGate,
}

/// Messages read in one pass of [`Io::poll_io`].
pub(crate) const READS_PER_PASS: usize = 64;

/// Passes of [`Io::poll_io`] in one poll of a driver before it yields to
/// the executor (waking itself), so that a peer that never stops sending
/// cannot starve the other tasks of its thread.
pub(crate) const PASSES_PER_POLL: usize = 16;

/// What one pass of [`Io::poll_io`] did.
pub(crate) enum Pass<E> {
    /// Something moved: run the event dispatch and go round again.
    Progress,
    /// Nothing can move until a waker fires.
    Idle,
    /// The connection is over and the close has been flushed (or, after a
    /// keepalive timeout, abandoned).
    Done(Result<Closed, DriverError<E>>),
}

impl<S> Io<S> {
    pub fn new(socket: S, timer: Arc<dyn Timer>) -> Io<S> {
        Io {
            socket,
            timer,
            sleep: None,
            pending: None,
            held: None,
            flushed: true,
            eof: false,
            started: false,
            pacer: SendPacer::new(crate::frame::MAX_CHUNK_BODY),
            chunk: 0,
            closing: closing::Closing::default(),
            read_gate: read_gate::ReadGate::new(),
        }
    }
}

impl<S, E> Io<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
{
    /// One pass over the socket and the timer. Bounded: it reads at most
    /// [`READS_PER_PASS`] messages, so a peer that floods cannot keep the
    /// driver to itself.
    ///
    /// The side's lock is taken for each step on the machine and never
    /// held across a step on the socket: a handle on another thread (a
    /// caller opening a request, a body read) never waits for a `sendto`
    /// or a `recvfrom`.
    pub fn poll_io<Sh: SharedState>(
        &mut self,
        shared: &Mutex<Sh>,
        cx: &mut Context<'_>,
    ) -> Pass<E> {
        let now = self.timer.now();
        {
            let mut sh = lock(shared);
            let m = sh.conn();
            if !self.started {
                // Arms the machine's timers (the keepalive).
                self.started = true;
                m.handle_timeout(now);
                // The machine's configured chunk size is the pacer's most.
                self.pacer = SendPacer::new(m.chunk_size());
            } else {
                // What the machine sends now, it sends at this time.
                m.advance_time(now);
            }
            // After the peer's close nothing more may be sent (the
            // WebSocket library answers it itself): a message taken from
            // the machine before it saw the close is dropped, not sent.
            if matches!(m.close_cause(), Some(CloseCause::Peer(_))) {
                self.pending = None;
            }
        }
        let mut progress = match self.transmit(shared, cx) {
            Ok(moved) => moved,
            Err(done) => return done,
        };
        let closed = {
            let mut sh = lock(shared);
            if let Some(done) = self.abandon(sh.conn()) {
                return done;
            }
            let closed = sh.conn().is_closed();
            // A handle may have closed the machine since `transmit` last
            // found nothing to send: what it queued (the close message
            // last) goes out before the socket is closed. Once closed, the
            // machine queues nothing more, so `None` here is final.
            if closed && self.pending.is_none() {
                self.pending = sh.conn().poll_transmit();
                progress |= self.pending.is_some();
            }
            closed
        };
        // Closed: the closing handshake (`closing.rs`); the close deadline
        // bounds it.
        if closed {
            return self.poll_closing(shared, cx, progress);
        }
        progress |= match self.receive(shared, cx, now) {
            Ok(moved) => moved,
            Err(done) => return done,
        };
        progress |= self.tick(shared, cx);
        if progress {
            Pass::Progress
        } else {
            Pass::Idle
        }
    }

    /// Whether to drop the transport at once, whatever waits to be written:
    /// a peer declared dead does not read, and a close past its deadline
    /// has waited long enough (in good order if the close messages were
    /// exchanged, `closing.rs`).
    fn abandon<M: Machine>(&mut self, m: &M) -> Option<Pass<E>> {
        let err = if m.close_cause().is_some_and(CloseCause::is_abrupt) {
            DriverError::KeepaliveTimeout
        } else if m.close_timed_out() {
            if self.close_exchanged() {
                // Only the socket's end was left to wait for.
                return Some(Pass::Done(outcome(m.close_cause())));
            }
            let cause = m.close_cause().cloned().unwrap_or(CloseCause::Lost);
            DriverError::CloseTimeout(cause)
        } else {
            return None;
        };
        self.pending = None;
        self.held = None;
        Some(Pass::Done(Err(err)))
    }

    /// Hands the machine's messages to the socket while it accepts them,
    /// at most a chunk's worth (the pacer's) between two completed flushes,
    /// and flushes. `Ok(true)` if anything was sent.
    ///
    /// What the socket has taken is out of the scheduler's hands: a control
    /// frame queued now goes after all of it. So on a slow link, where the
    /// pacer's chunk is a few milliseconds of data, the next message is
    /// chosen only once the last batch is below us.
    fn transmit<Sh: SharedState>(
        &mut self,
        shared: &Mutex<Sh>,
        cx: &mut Context<'_>,
    ) -> Result<bool, Pass<E>> {
        let mut progress = false;
        loop {
            while !self.pacer.batch_full() {
                if self.pending.is_none() {
                    let mut sh = lock(shared);
                    let m = sh.conn();
                    if self.chunk != self.pacer.chunk_size() {
                        self.chunk = self.pacer.chunk_size();
                        m.set_chunk_size(self.chunk);
                    }
                    self.pending = m.poll_transmit();
                }
                let Some(msg) = self.pending.take() else {
                    break;
                };
                match Pin::new(&mut self.socket).poll_ready(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Err(self.fail(shared, e)),
                    Poll::Pending => {
                        self.pending = Some(msg);
                        self.pacer.on_blocked();
                        break;
                    }
                }
                let len = msg.len();
                if let Err(e) = Pin::new(&mut self.socket).start_send(msg) {
                    return Err(self.fail(shared, e));
                }
                self.pacer.on_sent_at(len, || self.timer.now());
                self.flushed = false;
                progress = true;
            }
            if self.flushed {
                if self.pending.is_none() {
                    self.pacer.on_idle();
                }
                break;
            }
            match Pin::new(&mut self.socket).poll_flush(cx) {
                Poll::Ready(Ok(())) => {
                    self.flushed = true;
                    self.pacer.on_flushed(self.timer.now());
                }
                Poll::Ready(Err(e)) => return Err(self.fail(shared, e)),
                Poll::Pending => {
                    self.pacer.on_blocked();
                    break;
                }
            }
        }
        Ok(progress)
    }

    /// Reads messages into the machine while it wants them, at most
    /// [`READS_PER_PASS`]. `Ok(true)` if anything was read.
    ///
    /// The socket is read without the lock, so the machine may have
    /// paused between its `wants_read()` and the message: it then hands
    /// the message back, and the driver holds it (one message, at most
    /// 1 MiB + 4 bytes) until the machine wants to read again.
    ///
    /// Once a read has answered `Pending`, the socket is read again only
    /// when its waker has fired (`read_gate.rs`), not on every wake-up of
    /// the driver.
    ///
    /// What is read in a pass is taken at the pass's time, `now`: a clock
    /// read per pass, not per message (a small request's answer is three).
    fn receive<Sh: SharedState>(
        &mut self,
        shared: &Mutex<Sh>,
        cx: &mut Context<'_>,
        now: Instant,
    ) -> Result<bool, Pass<E>> {
        let mut progress = false;
        let mut wants = {
            let mut sh = lock(shared);
            if let Some(msg) = self.held.take() {
                progress |= self.feed(sh.conn(), msg, now);
            }
            sh.conn().wants_read()
        };
        if self.eof || !wants || !self.read_gate.open(cx.waker()) {
            return Ok(progress);
        }
        for _ in 0..READS_PER_PASS {
            if self.eof || !wants {
                break;
            }
            let read = Pin::new(&mut self.socket).poll_next(&mut self.read_gate.context());
            self.read_gate.set_parked(read.is_pending());
            match read {
                Poll::Ready(Some(Ok(msg))) => {
                    let mut sh = lock(shared);
                    progress |= self.feed(sh.conn(), msg, now);
                    wants = sh.conn().wants_read();
                }
                Poll::Ready(Some(Err(e))) => return Err(self.fail(shared, e)),
                Poll::Ready(None) => {
                    self.eof = true;
                    lock(shared).conn().handle_lost();
                    progress = true;
                }
                Poll::Pending => break,
            }
        }
        Ok(progress)
    }

    /// Feeds one message to the machine, or holds it if the machine has
    /// paused reading since it last said it wanted to read. True if the
    /// machine took it.
    fn feed<M: Machine>(&mut self, m: &mut M, msg: Message, now: Instant) -> bool {
        if !m.wants_read() {
            self.held = Some(msg);
            return false;
        }
        match m.handle_message(msg, now) {
            Ok(()) => true,
            Err(HandleError::ReadPaused(msg)) => {
                self.held = Some(msg);
                false
            }
        }
    }

    /// Follows the machine's deadline with the sleep; true if it fired.
    fn tick<Sh: SharedState>(&mut self, shared: &Mutex<Sh>, cx: &mut Context<'_>) -> bool {
        let deadline = lock(shared).conn().poll_timeout();
        if self.sleep.as_ref().map(|(d, _)| *d) != deadline {
            self.sleep = deadline.map(|d| (d, self.timer.sleep_until(d)));
        }
        if let Some((_, sleep)) = self.sleep.as_mut() {
            if sleep.as_mut().poll(cx).is_ready() {
                self.sleep = None;
                let now = self.timer.now();
                lock(shared).conn().handle_timeout(now);
                return true;
            }
        }
        false
    }

    fn fail<Sh: SharedState>(&mut self, shared: &Mutex<Sh>, e: E) -> Pass<E> {
        let mut sh = lock(shared);
        let m = sh.conn();
        // After the peer's close, a socket that fails (the peer closed it
        // at once, before our answer) ends the close, not in error.
        if self.peer_closed(m) {
            return Pass::Done(outcome(m.close_cause()));
        }
        m.handle_lost();
        Pass::Done(Err(DriverError::Socket(e)))
    }
}

/// The driver's result for a connection closed in good order.
fn outcome<E>(cause: Option<&CloseCause>) -> Result<Closed, DriverError<E>> {
    match cause {
        Some(CloseCause::Peer(frame)) => Ok(Closed::ByPeer(frame.clone())),
        Some(CloseCause::Local(code)) => Ok(Closed::Locally(*code)),
        Some(CloseCause::KeepaliveTimeout) => Err(DriverError::KeepaliveTimeout),
        Some(CloseCause::MessageTooBig) => Err(DriverError::MessageTooBig),
        Some(CloseCause::Lost) | None => Ok(Closed::Eof),
    }
}

mod closing;
mod read_gate;
#[cfg(test)]
mod tests;
