//! What both state machines share: the output scheduler, the keepalive, the
//! close message, the counters, and the first look at each message read.

use super::config::Common;
use super::outbound::{Outbound, Sent};
use super::{CloseCause, HandleError, Stats};
use super::{Keepalive, KeepaliveConfig};
use crate::frame::{
    self, CloseCode, CloseFrame, Decoded, FrameError, HeadLimits, Message, StreamId,
};
use std::time::Instant;

/// What a message read from the socket is, for the side-specific machine.
pub(crate) enum Input {
    /// Nothing for the machine (a ping, a pong, anything after close).
    Nothing,
    /// A decoded frame.
    Frame(Decoded),
    /// A text frame that did not decode (not too large): why, and its
    /// `type` and id when those were readable.
    BadText(FrameError, Option<(&'static str, StreamId)>),
    /// A binary frame that did not decode (not too large).
    BadBinary,
    /// A message over the limit: close with this code.
    TooLarge(CloseCode),
    /// The peer closed the connection (with this close frame).
    Closed(Option<CloseFrame>),
}

/// The most application data a ping may carry (RFC 6455 §5.5: a control
/// frame's payload is at most 125 bytes).
const MAX_PING_DATA: usize = 125;

#[derive(Debug)]
pub(crate) struct Core {
    pub out: Outbound,
    keepalive_config: Option<KeepaliveConfig>,
    keepalive: Option<Keepalive>,
    closing: Option<Message>,
    pub closed: bool,
    /// Why it closed, once it has.
    pub cause: Option<CloseCause>,
    pub stats: Stats,
    /// Bounds on every head read.
    pub limits: HeadLimits,
    /// The latest time seen (inputs carry it; commands and drains use it).
    pub now: Option<Instant>,
    /// When the socket last took a message from us.
    last_taken: Option<Instant>,
    /// How long a closing connection may take (`close_timeout`).
    close_timeout: std::time::Duration,
    /// When the close gives up waiting (set once closed and the time is known).
    close_deadline: Option<Instant>,
    /// The close deadline passed: the transport is to be dropped.
    pub close_timed_out: bool,
    /// Answer the peer's pings (`answer_pings`).
    answer_pings: bool,
}

impl Core {
    pub fn new(config: &Common) -> Core {
        let out = Outbound::new(
            config.max_queued_per_stream,
            config.max_queued,
            config.chunk_size,
        );
        let (keepalive, limits) = (config.keepalive, config.head_limits);
        Core {
            limits,
            cause: None,
            now: None,
            last_taken: None,
            close_timeout: config.close_timeout,
            close_deadline: None,
            close_timed_out: false,
            out,
            keepalive_config: keepalive,
            keepalive: None,
            closing: None,
            closed: false,
            stats: Stats::default(),
            answer_pings: config.answer_pings,
        }
    }

    /// First look at a message read from the socket. A data message while
    /// reading is paused is handed back untouched.
    ///
    /// `wanted(type, id)` says whether a control frame is for the machine at
    /// all (a `response` for a stream in flight, say); one that is not is
    /// ignored as soon as its type and id are read, so a huge frame for no
    /// stream costs almost nothing.
    pub fn take(
        &mut self,
        msg: Message,
        now: Instant,
        wants_read: bool,
        wanted: &dyn Fn(&str, u64) -> bool,
    ) -> Result<Input, HandleError> {
        // Never earlier than the machine's time: a driver stamps what it
        // reads in a pass with the pass's time, and a handle may have
        // advanced the machine since.
        let now = self.advance(now);
        if self.closed {
            return Ok(Input::Nothing);
        }
        if msg.is_data() {
            if !wants_read {
                return Err(HandleError::ReadPaused(msg));
            }
            self.stats.bytes_in += msg.len() as u64;
        }
        let decoded = match msg {
            Message::Close(f) => return Ok(Input::Closed(f)),
            Message::Pong(p) => {
                if let Some(ka) = self.keepalive.as_mut() {
                    ka.handle_pong(now, &p);
                }
                return Ok(Input::Nothing);
            }
            // The WebSocket library answers pings, unless the machine is
            // asked to (`answer_pings`): one pong, for the latest ping.
            Message::Ping(p) => {
                if self.answer_pings && p.len() <= MAX_PING_DATA {
                    self.out.push_pong(p);
                }
                return Ok(Input::Nothing);
            }
            Message::Text(t) => {
                match frame::decode_control_limited(&t, Some(&self.limits), Some(wanted)) {
                    Ok(Some(f)) => Ok(Decoded::Control(f)),
                    Ok(None) => Ok(Decoded::Unknown),
                    Err(r) if !matches!(r.error, FrameError::TooLarge { .. }) => {
                        self.stats.messages_ignored += 1;
                        return Ok(Input::BadText(r.error, r.known));
                    }
                    Err(r) => Err(r.error),
                }
            }
            Message::Binary(b) => frame::decode_binary(b),
        };
        Ok(match decoded {
            Ok(Decoded::Unknown) => {
                self.stats.messages_ignored += 1;
                Input::Nothing
            }
            Ok(d) => Input::Frame(d),
            Err(e @ FrameError::TooLarge { .. }) => Input::TooLarge(e.close_code()),
            Err(_) => {
                self.stats.messages_ignored += 1;
                Input::BadBinary
            }
        })
    }

    /// Time only moves forward. A connection closed before any time was
    /// known starts its close deadline now.
    pub fn advance(&mut self, now: Instant) -> Instant {
        let now = self.now.map_or(now, |t| t.max(now));
        self.now = Some(now);
        if self.closed && self.close_deadline.is_none() {
            self.start_close_deadline();
        }
        now
    }

    fn start_close_deadline(&mut self) {
        // A timeout too long to add means no deadline.
        self.close_deadline = self.now.and_then(|t| t.checked_add(self.close_timeout));
    }

    /// Advances time: arms the keepalive on the first call, queues a due ping
    /// ahead of everything, and says whether the connection is dead.
    ///
    /// Dead means no pong within the timeout of a ping **and** no sign of
    /// life otherwise. While reading is `paused` for backpressure the pong
    /// may be waiting unread behind body chunks, which is not the peer's
    /// fault, so its deadline restarts. While our output waits for the socket
    /// and the socket took a message less than a timeout ago, the peer is
    /// reading (slowly: a slow app, a slow caller behind it), so the deadline
    /// runs from that last message. A frozen peer takes nothing: dead one
    /// timeout after the last message it took.
    pub fn handle_timeout(&mut self, now: Instant, paused: bool) -> bool {
        let now = self.advance(now);
        if self.closed {
            if self.close_deadline.is_some_and(|d| d <= now) {
                self.close_timed_out = true;
            }
            return false;
        }
        let Some(cfg) = self.keepalive_config else {
            return false;
        };
        let ka = self
            .keepalive
            .get_or_insert_with(|| Keepalive::new(cfg, now));
        if paused {
            ka.extend_deadline(now);
        }
        self.defer_while_output_waits();
        let Some(ka) = self.keepalive.as_mut() else {
            return false;
        };
        ka.handle_timeout(now);
        if let Some(ping) = ka.poll_ping() {
            self.out.push_urgent(ping);
        }
        ka.is_dead()
    }

    /// While output waits for the socket, the pong deadline runs from the
    /// last message the socket took (see [`handle_timeout`](Self::handle_timeout)).
    /// A side calls this again after what its own timers queued (the
    /// relay's give-ups queue aborts), so that a second `handle_timeout` at
    /// the same instant finds nothing left to change.
    pub fn defer_while_output_waits(&mut self) {
        let (Some(cfg), Some(ka)) = (self.keepalive_config, self.keepalive.as_mut()) else {
            return;
        };
        if self.out.has_queued() {
            if let Some(at) = self.last_taken.and_then(|t| t.checked_add(cfg.timeout)) {
                ka.defer_deadline(at);
            }
        }
    }

    /// When the keepalive (or, once closed, the close deadline) wants
    /// `handle_timeout` next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed {
            return self.close_deadline.filter(|_| !self.close_timed_out);
        }
        self.keepalive.as_ref().and_then(Keepalive::poll_timeout)
    }

    /// Marks the connection closed for `cause`; `close` is the close message
    /// to send last (none when the peer closed or the socket was lost).
    /// Returns false if it was already closed.
    pub fn mark_closed(&mut self, close: Option<(CloseCode, &str)>, cause: CloseCause) -> bool {
        if self.closed {
            return false;
        }
        self.closed = true;
        self.cause = Some(cause);
        self.start_close_deadline();
        self.closing = close.map(|(code, reason)| {
            Message::Close(Some(CloseFrame {
                code,
                reason: reason.to_string(),
            }))
        });
        self.out.clear();
        true
    }

    /// The next message to send (the close message last), and what it ended.
    pub fn poll_transmit(&mut self) -> Option<(Message, Sent)> {
        if let Some(m) = self.closing.take() {
            return Some((m, Sent::default()));
        }
        if self.closed {
            return None;
        }
        let (msg, sent) = self.out.poll_transmit()?;
        self.last_taken = self.now;
        self.stats.bytes_out += msg.len() as u64;
        Some((msg, sent))
    }

    /// The counters, with the live figures filled in.
    pub fn stats(&self, streams_open: usize, buffered_in: usize) -> Stats {
        let (q, qmax) = self.out.queued();
        Stats {
            streams_open: streams_open as u64,
            body_buffered_in: buffered_in as u64,
            body_queued_out: q as u64,
            body_queued_out_max: qmax as u64,
            ..self.stats
        }
    }

    /// Records the unread-bytes high-water mark.
    pub fn note_buffered_in(&mut self, unread: usize) {
        self.stats.body_buffered_in_max = self.stats.body_buffered_in_max.max(unread as u64);
    }
}
