//! The closing handshake (RFC 6455 §7.1.1), once the machine has closed.
//!
//! A side that stopped reading and dropped its socket while the peer was
//! still sending would leave bytes unread: its TCP stack answers them with
//! a reset, and a reset can erase the close message from the peer's
//! receive buffer before the peer reads it (a worker streaming a response
//! when the relay revoked it saw a reset, never the relay's 1008). So the
//! driver, once the close message (ours, or the WebSocket library's answer
//! to the peer's) is flushed:
//!
//! 1. reads on, discarding what comes, until the peer's close message (the
//!    relay, the WebSocket server) or the end of the stream (the worker, the
//!    client: the server closes the TCP connection first, so that it, not
//!    the client, holds TIME_WAIT);
//! 2. closes the socket (`Sink::poll_close`; `ws::WsSocket`
//!    then shuts its write side: TLS `close_notify`, TCP FIN);
//! 3. ends, and the socket is dropped with nothing left unread.
//!
//! The machine's close deadline (`close_timeout`) bounds it all: a peer
//! that never answers the close and never ends the stream is dropped then
//! ([`DriverError::CloseTimeout`](super::DriverError::CloseTimeout)).
//! Once the close messages are exchanged, only the socket's end is left to
//! wait for, and the deadline ends the connection in good order; so does a
//! socket that fails after the peer's close (a peer that dropped it at
//! once, before our answer).

use super::{outcome, Io, Machine, Pass, READS_PER_PASS};
use crate::frame::Message;
use crate::proto::CloseCause;
use crate::rt::side::{lock, SharedState};
use futures_core::Stream;
use futures_sink::Sink;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

/// Where the closing handshake is.
#[derive(Debug, Default)]
pub(super) struct Closing {
    /// The driver has seen the machine closed.
    started: bool,
    /// The peer's close message has been read (by the machine, or here).
    peer_closed: bool,
}

impl<S> Io<S> {
    /// Whether the close messages have been exchanged: ours (or the
    /// library's answer) is flushed and the peer's has been read. What is
    /// left, the socket's end, is not worth an error at the deadline.
    pub(super) fn close_exchanged(&self) -> bool {
        self.closing.started && self.closing.peer_closed && self.pending.is_none() && self.flushed
    }

    /// Whether the peer's close message has been read (by the machine, or
    /// here after ours).
    pub(super) fn peer_closed<M: Machine>(&self, m: &M) -> bool {
        self.closing.peer_closed || matches!(m.close_cause(), Some(CloseCause::Peer(_)))
    }

    /// Whether nothing more needs reading before the socket is closed.
    fn read_done<M: Machine>(&self) -> bool {
        self.eof || (M::SERVER && self.closing.peer_closed)
    }
}

impl<S, E> Io<S>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin,
{
    /// One pass of a closed connection, after `transmit` (which sends what
    /// the machine queued, its close message last, and flushes).
    pub(super) fn poll_closing<Sh: SharedState>(
        &mut self,
        shared: &Mutex<Sh>,
        cx: &mut Context<'_>,
        mut progress: bool,
    ) -> Pass<E> {
        if !self.closing.started {
            self.closing.started = true;
            // A message held for a paused machine will never be fed.
            self.held = None;
            let peer = matches!(lock(shared).conn().close_cause(), Some(CloseCause::Peer(_)));
            self.closing.peer_closed = peer;
            // The library's answer to the peer's close waits in it: the
            // next `transmit` flushes it.
            self.flushed = false;
            return Pass::Progress;
        }
        let sent = self.pending.is_none() && self.flushed;
        if sent && !self.read_done::<Sh::Conn>() {
            progress |= self.discard::<Sh::Conn>(cx);
        }
        if sent
            && self.read_done::<Sh::Conn>()
            && Pin::new(&mut self.socket).poll_close(cx).is_ready()
        {
            return Pass::Done(outcome(lock(shared).conn().close_cause()));
        }
        progress |= self.tick(shared, cx);
        if let Some(done) = self.abandon(lock(shared).conn()) {
            return done;
        }
        if progress {
            Pass::Progress
        } else {
            Pass::Idle
        }
    }

    /// Reads and drops what the peer still sends, until [`Io::read_done`],
    /// at most [`READS_PER_PASS`] messages. True if anything was read.
    fn discard<M: Machine>(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        for _ in 0..READS_PER_PASS {
            if self.read_done::<M>() {
                break;
            }
            match Pin::new(&mut self.socket).poll_next(cx) {
                Poll::Ready(Some(Ok(Message::Close(_)))) => self.closing.peer_closed = true,
                Poll::Ready(Some(Ok(_))) => {}
                // An error after the close ends the stream as well: there
                // is nothing more to read.
                Poll::Ready(Some(Err(_)) | None) => self.eof = true,
                Poll::Pending => break,
            }
            progress = true;
        }
        progress
    }
}
