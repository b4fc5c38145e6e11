//! The state machine both sides share: [`Connection`], and what it does
//! the same way on either side.

use super::config::Config;
use super::core::Core;
use super::inbound::Held;
use super::local_map::LocalMap;
use super::side::Side;
use super::{CloseCause, Keepalive, StreamKey, UnknownStream};
use crate::frame::CloseCode;
use std::collections::VecDeque;
use std::fmt;
use std::time::Instant;

/// One connection's state machine: [`RelayConnection`](super::RelayConnection)
/// (`Connection<Relay>`) or [`WorkerConnection`](super::WorkerConnection)
/// (`Connection<Worker>`). Sans-IO: see the crate docs for the run loop.
///
/// The methods both sides have, the same way, are written once for every
/// [`Side`]; each side's inputs, commands and drains follow in its own
/// `impl` block (see the alias of each side for the whole list).
pub struct Connection<P: Side> {
    pub(super) config: Config<P>,
    pub(super) streams: LocalMap<StreamKey, P::Stream>,
    pub(super) next_key: u64,
    pub(super) core: Core,
    pub(super) events: VecDeque<P::Event>,
    /// Unread body bytes held in memory, all streams, and the streams
    /// holding `max_unread_chunks` unread chunks.
    pub(super) held: Held,
    /// What only this side keeps.
    pub(super) side: P::State,
}

impl<P: Side> fmt::Debug for Connection<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(P::CONNECTION_NAME)
            .field("config", &self.config)
            .field("streams", &self.streams)
            .field("next_key", &self.next_key)
            .field("core", &self.core)
            .field("events", &self.events)
            .field("held", &self.held)
            .field("side", &self.side)
            .finish()
    }
}

/// A connection with the default configuration.
impl<P: Side> Default for Connection<P> {
    fn default() -> Self {
        Connection::new(Config::default())
    }
}

impl<P: Side> Connection<P> {
    /// A connection whose handshake has just completed.
    pub fn new(config: Config<P>) -> Connection<P> {
        Connection {
            core: Core::new(&config.common),
            config,
            streams: LocalMap::default(),
            next_key: 1,
            events: VecDeque::new(),
            held: Held::default(),
            side: P::State::default(),
        }
    }

    /// Bounds in force.
    pub fn config(&self) -> &Config<P> {
        &self.config
    }

    /// Why the connection closed (`None` while it is open).
    pub fn close_cause(&self) -> Option<&CloseCause> {
        self.core.cause.as_ref()
    }

    /// Whether the connection is closed (nothing more is read; the
    /// close message, if any, is the last one `poll_transmit` returns).
    pub fn is_closed(&self) -> bool {
        self.core.closed
    }

    /// Whether the connection, closed, has not finished closing within
    /// its `close_timeout`: the peer has not taken what was left to send
    /// (the close message last), or the socket has not closed. Drop the
    /// transport now, whatever is still unsent. Set by `handle_timeout`
    /// at the deadline (`poll_timeout` gives it once closed).
    pub fn close_timed_out(&self) -> bool {
        self.core.close_timed_out
    }

    /// Tells the machine the time without running its deadlines (that
    /// is `handle_timeout`'s job): the commands that follow act at `now`
    /// (`read_body` and `send_body` restart a stall deadline from it,
    /// `close` starts the close deadline). `handle_message` and
    /// `handle_timeout` advance it too; call this before commands issued
    /// long after the last input. Time only moves forward.
    pub fn advance_time(&mut self, now: Instant) {
        self.core.advance(now);
    }

    /// Sets the size of the body chunks cut from now on, within 1 and
    /// the configured `chunk_size`: the driver's measure of how fast its
    /// socket drains ([`SendPacer`](crate::proto::pacer::SendPacer)),
    /// so that what sits below the scheduler stays a few milliseconds
    /// long and a control frame never waits for seconds of one body.
    pub fn set_chunk_size(&mut self, n: usize) {
        self.core.out.set_chunk_size(n);
    }

    /// The size of the body chunks cut now.
    pub fn chunk_size(&self) -> usize {
        self.core.out.chunk_size()
    }

    /// Body bytes `send_body` would take now on this stream.
    pub fn send_capacity(&self, key: StreamKey) -> usize {
        self.core.out.capacity(key)
    }

    /// The socket is gone (end of stream, an error): every stream still
    /// open ends with its `ConnectionLost`.
    pub fn handle_lost(&mut self) {
        self.lose(CloseCause::Lost);
    }

    /// Closes the connection with `code`: every stream still open ends
    /// with its `ConnectionLost`, and the close message is the last one
    /// emitted.
    pub fn close(&mut self, code: CloseCode, reason: &str) {
        self.close_with(code, reason, CloseCause::Local(code));
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<P::Event> {
        // Room freed by a dropped queue (an abort, an early answer)
        // wakes refused senders even when nothing is transmitted.
        for key in self.core.out.take_writable() {
            self.events.push_back(P::writable(key));
        }
        self.events.pop_front()
    }

    /// The stream for a command: `Ok(None)` for a stream that existed
    /// and has gone (its commands are swallowed), an error for a key
    /// never issued.
    pub(super) fn stream_mut(
        &mut self,
        key: StreamKey,
    ) -> Result<Option<&mut P::Stream>, UnknownStream> {
        if key.0 == 0 || key.0 >= self.next_key {
            return Err(UnknownStream);
        }
        Ok(self.streams.get_mut(&key))
    }

    /// The keepalive's part of `handle_timeout`; false once it found
    /// the peer dead and closed the connection (1011).
    pub(super) fn keepalive_tick(&mut self, now: Instant) -> bool {
        let paused = !P::wants_read(self);
        if self.core.handle_timeout(now, paused) {
            self.close_with(
                Keepalive::CLOSE_CODE,
                Keepalive::CLOSE_REASON,
                CloseCause::KeepaliveTimeout,
            );
            return false;
        }
        true
    }

    pub(super) fn close_with(&mut self, code: CloseCode, reason: &str, cause: CloseCause) {
        P::end_all(self, Some((code, reason)), cause);
    }

    pub(super) fn lose(&mut self, cause: CloseCause) {
        P::end_all(self, None, cause);
    }
}
