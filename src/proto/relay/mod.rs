//! The relay side: turns HTTP requests into frames for the worker, and the
//! worker's frames into responses. A stream whose caller is slow costs only
//! itself: its response goes to an overflow store the application provides,
//! and past a budget or a stall deadline that stream alone is given up.

mod config;
mod slow;
mod wire;

use super::config::ConfigError;
use super::connection::Connection;
use super::core::Input;
use super::inbound::{BodyRead, InBody};
use super::length::Length;
use super::local_map::LocalMap;
use super::outbound::SendAbort;
use super::side::{sealed::Sealed, Relay};
use super::{
    CloseCause, FinishError, HandleError, OpenError, RefillError, Stats, StreamKey, WriteError,
};
use crate::frame::{CloseCode, ControlFrame, Decoded, Message, RequestHead, StreamId};
use bytes::Bytes;
use config::RelayExtra;
pub use config::{OverflowConfig, RelayConfig, RelayConfigBuilder, RelayEnd, RelayEvent};
use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Stream {
    id: StreamId,
    /// The request direction is still ours to write (no `finish` yet).
    writing: bool,
    /// The stream is still in flight on the wire (its id is taken).
    on_wire: bool,
    response_started: bool,
    /// The request body against its Content-Length.
    request: Length,
    body: InBody,
    /// The request is a HEAD: its response carries no body.
    head_request: bool,
    /// No response body is expected (a HEAD request, a 204 or 304
    /// response): chunks are dropped, Content-Length is not checked.
    bodiless: bool,
    /// The response body against its Content-Length (none if bodiless).
    response: Length,
    /// The application let go of a response complete by its Content-Length
    /// before the worker's `end` arrived, with its own request complete too:
    /// wait for that `end` quietly (what is queued of the request still goes).
    orphaned: bool,
    /// Since when data has waited for the application without a read (or,
    /// orphaned, the worker's `end` has been awaited).
    stall_since: Option<Instant>,
    /// Bytes of this stream waiting in `spills` (not yet in the store).
    backlog: usize,
    /// A `Refill` event is outstanding.
    refill_asked: bool,
    /// The stream held reading paused for `spill_after` in vain: it spills
    /// without waiting until it is back within its memory.
    waited: bool,
}

impl Stream {
    /// Every byte of the response body has arrived (only `end` may be missing).
    fn response_complete(&self) -> bool {
        self.response_started && (self.bodiless || self.response.complete())
    }

    /// Bytes in the application's overflow store (handed out by `poll_spill`).
    fn stored(&self) -> u64 {
        self.body.spilled() - self.backlog as u64
    }
}

/// The relay side of one connection. Sans-IO: see the crate docs for the run loop.
///
/// - Inputs: [`handle_message`](Self::handle_message), [`handle_lost`](Self::handle_lost),
///   [`handle_timeout`](Self::handle_timeout), and the application's commands
///   ([`open_stream`](Self::open_stream), [`send_body`](Self::send_body),
///   [`finish`](Self::finish), [`abort`](Self::abort), [`read_body`](Self::read_body),
///   [`refill`](Self::refill), [`close`](Self::close)).
/// - Drains: [`poll_transmit`](Self::poll_transmit), [`poll_event`](Self::poll_event),
///   [`poll_spill`](Self::poll_spill), [`poll_timeout`](Self::poll_timeout).
/// - Getters: [`wants_read`](Self::wants_read), [`is_closed`](Self::is_closed),
///   [`close_cause`](Self::close_cause), [`send_capacity`](Self::send_capacity),
///   [`stats`](Self::stats).
///
/// # Slow callers
///
/// The protocol has no per-stream flow control, so the relay decides what a
/// caller that reads slowly costs the others. Each stream holds at most
/// `max_unread_chunks` unread chunks in memory. With
/// [`RelayConfig::overflow`], further chunks go to the application's
/// overflow store ([`poll_spill`](Self::poll_spill): append them to the
/// stream's store in order) and come back through
/// [`RelayEvent::Refill`] / [`refill`](Self::refill) as the caller reads, so
/// reading the socket never waits for one caller for long: at most
/// [`OverflowConfig::spill_after`] (default zero) each time a stream
/// outgrows its memory with nothing in the overflow, for its caller to
/// read what it holds and spare the store a copy (a stream alone on its
/// connection may wait [`OverflowConfig::spill_after_alone`]). Without it, reading pauses,
/// but never for longer than `read_pause_timeout`. Either way a stream whose
/// application reads nothing for `stall_timeout`, or that outgrows its
/// overflow budget, is given up alone ([`RelayEnd::CallerStalled`],
/// [`RelayEnd::OverflowExceeded`]).
pub type RelayConnection = Connection<Relay>;

/// What only a relay connection keeps.
#[derive(Debug)]
pub struct RelayState {
    /// Ids this side hands out (never the peer's choice).
    ids: LocalMap<StreamId, StreamKey>,
    next_id: StreamId,
    /// Chunks for the overflow store, in order.
    spills: VecDeque<(StreamKey, Bytes)>,
    spill_backlog: usize,
    /// Bytes spilled and not refilled yet, all streams.
    spilled_total: u64,
    /// Streams with a stall deadline running, by its start.
    stalls: BTreeSet<(Instant, StreamKey)>,
    /// Since when reading has been paused.
    paused_since: Option<Instant>,
    /// The stream past its memory bound that holds reading paused for its
    /// caller to catch up (`OverflowConfig::spill_after`), and since when.
    waiting_for: Option<(StreamKey, Instant)>,
}

impl Default for RelayState {
    fn default() -> RelayState {
        RelayState {
            ids: LocalMap::default(),
            next_id: StreamId::MIN,
            spills: VecDeque::new(),
            spill_backlog: 0,
            spilled_total: 0,
            stalls: BTreeSet::new(),
            paused_since: None,
            waiting_for: None,
        }
    }
}

impl Sealed for Relay {
    const CONNECTION_NAME: &'static str = "RelayConnection";
    const CONFIG_NAME: &'static str = "RelayConfig";
    const CONFIG_BUILDER_NAME: &'static str = "RelayConfigBuilder";
    const SERVER: bool = true;
    type Stream = Stream;
    type State = RelayState;
    type Extra = RelayExtra;

    fn writable(key: StreamKey) -> RelayEvent {
        RelayEvent::Writable { key }
    }

    fn validate(config: &RelayConfig) -> Result<(), ConfigError> {
        config.validate()
    }

    fn end_all(c: &mut RelayConnection, close: Option<(CloseCode, &str)>, cause: CloseCause) {
        c.end_all(close, cause)
    }

    fn wants_read(c: &RelayConnection) -> bool {
        c.wants_read()
    }

    fn handle_message(
        c: &mut RelayConnection,
        msg: Message,
        now: Instant,
    ) -> Result<(), HandleError> {
        c.handle_message(msg, now)
    }

    fn handle_timeout(c: &mut RelayConnection, now: Instant) {
        c.handle_timeout(now)
    }

    fn poll_transmit(c: &mut RelayConnection) -> Option<Message> {
        c.poll_transmit()
    }

    fn poll_timeout(c: &RelayConnection) -> Option<Instant> {
        c.poll_timeout()
    }

    fn send_body(
        c: &mut RelayConnection,
        key: StreamKey,
        data: Bytes,
    ) -> Result<usize, WriteError> {
        c.send_body(key, data)
    }

    fn finish(c: &mut RelayConnection, key: StreamKey) -> Result<(), FinishError> {
        c.finish(key)
    }

    fn read_body(c: &mut RelayConnection, key: StreamKey) -> BodyRead {
        c.read_body(key)
    }
}

impl Connection<Relay> {
    // ----- getters -----

    /// Whether the driver may read the next message from the socket: false
    /// while a response body holds `max_unread_chunks` unread chunks in
    /// memory (without an overflow store), or all hold `max_unread_bytes`
    /// (chunks waiting for the overflow store included), while a stream
    /// waits for its caller before it spills
    /// ([`OverflowConfig::spill_after`]), and after the connection closed.
    /// A pause never outlasts `read_pause_timeout`.
    pub fn wants_read(&self) -> bool {
        !self.core.closed
            && self.side.waiting_for.is_none()
            && self.held.full == 0
            && self.held.bytes + self.side.spill_backlog < self.config.common.max_unread_bytes
    }

    /// The wire id of a stream still in flight.
    pub fn stream_id(&self, key: StreamKey) -> Option<StreamId> {
        self.streams
            .get(&key)
            .filter(|s| s.on_wire && !s.orphaned)
            .map(|s| s.id)
    }

    /// Streams the application holds (in flight, or ended with body unread).
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Response bytes of `key` in the overflow (in the store, or waiting in
    /// `poll_spill`); 0 for an unknown stream.
    pub fn spilled(&self, key: StreamKey) -> u64 {
        self.streams.get(&key).map_or(0, |s| s.body.spilled())
    }

    /// The connection's counters.
    pub fn stats(&self) -> Stats {
        let mut s = self.core.stats(self.streams.len(), self.held.bytes);
        s.overflow_bytes = self.side.spilled_total;
        s
    }

    // ----- inputs -----

    /// Feeds one message read from the socket.
    ///
    /// Frames of unknown type, frames for a stream not in flight and
    /// malformed frames are ignored, except a malformed or over-limit
    /// `response` for a stream in flight, which fails that stream
    /// ([`RelayEnd::ProtocolError`]). A message over 1 MiB + 4 bytes closes
    /// the connection with 1009. While `wants_read()` is false a data message
    /// is handed back in [`HandleError::ReadPaused`].
    pub fn handle_message(&mut self, msg: Message, now: Instant) -> Result<(), HandleError> {
        let wants_read = self.wants_read();
        // Only the worker's frames for a stream in flight matter.
        let ids = &self.side.ids;
        let wanted = |ty: &str, id: u64| {
            ty != "request"
                && u32::try_from(id)
                    .ok()
                    .and_then(StreamId::new)
                    .is_some_and(|id| ids.contains_key(&id))
        };
        match self.core.take(msg, now, wants_read, &wanted)? {
            Input::Frame(Decoded::Control(c)) => self.on_control(c),
            Input::Frame(Decoded::Chunk(c)) => self.on_chunk(c.id, c.data),
            Input::BadText(_, Some(("response", id))) => {
                if let Some(&key) = self.side.ids.get(&id) {
                    self.end_on_wire(key, RelayEnd::ProtocolError, SendAbort::Always)
                }
            }
            Input::BadText(..) => {}
            Input::TooLarge(code) => {
                self.close_with(code, "message too big", CloseCause::MessageTooBig)
            }
            Input::Closed(frame) => self.lose(CloseCause::Peer(frame)),
            Input::Frame(Decoded::Unknown) | Input::BadBinary | Input::Nothing => {}
        }
        self.track_pause();
        Ok(())
    }

    /// Advances time to `now`: arms the keepalive on the first call, emits a
    /// ping when one is due (ahead of queued body chunks), closes the
    /// connection (1011) when the worker is presumed dead, and gives up the
    /// streams past their stall deadline or holding reading paused past
    /// `read_pause_timeout`. Extra calls are harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.core.advance(now);
        if !self.keepalive_tick(now) {
            return;
        }
        self.settle_wait();
        while let Some(&(since, key)) = self.side.stalls.first() {
            match since.checked_add(self.config.extra.stall_timeout.0) {
                Some(deadline) if deadline <= now => self.give_up(key, RelayEnd::CallerStalled),
                _ => break,
            }
        }
        // Those give-ups may have ended the pause.
        self.track_pause();
        let pause_over = self
            .side
            .paused_since
            .and_then(|p| p.checked_add(self.config.extra.read_pause_timeout.0))
            .is_some_and(|d| d <= now);
        if pause_over && !self.core.closed {
            for key in self.pause_culprits() {
                self.give_up(key, RelayEnd::CallerStalled);
            }
        }
        self.track_pause();
        // The give-ups queued aborts: output now waits for the socket.
        self.core.defer_while_output_waits();
    }

    // ----- application commands -----

    /// Opens a stream for an HTTP request: picks its id, strips hop-by-hop
    /// headers and queues the `request` frame. Send the body with
    /// [`send_body`](Self::send_body) and end it with [`finish`](Self::finish)
    /// (a request without a body: `finish` at once).
    ///
    /// Refused, in this order ([`OpenError::status`] gives the answer):
    /// a closed connection (502), a method of
    /// [`refused_methods`](RelayConfig::refused_methods) (405), a head over
    /// the [`head_limits`](RelayConfig::head_limits) (400, 414 or 431), an
    /// invalid or conflicting Content-Length (400), and too many streams in
    /// flight (503; the last [`reserved_streams`](RelayConfig::reserved_streams)
    /// are kept for the control routes).
    pub fn open_stream(&mut self, mut head: RequestHead) -> Result<StreamKey, OpenError> {
        if self.core.closed {
            return Err(OpenError::ConnectionClosed);
        }
        if self.config.refuses_method(head.method()) {
            return Err(OpenError::MethodNotAllowed);
        }
        head.headers_mut().strip_hop_by_hop();
        self.config.common.head_limits.check_request(&head)?;
        let content_length = head
            .headers()
            .content_length()
            .map_err(|_| OpenError::InvalidContentLength)?;
        let limit = self.config.common.stream_limit(&head);
        if self.streams.len() >= limit {
            return Err(OpenError::TooManyStreams { limit });
        }
        let head_request = head.method() == "HEAD";
        let id = self.alloc_id();
        let text = ControlFrame::Request { id, head }.encode_checked()?;
        let key = StreamKey(self.next_key);
        self.next_key += 1;
        self.side.next_id = id.next_wrapping();
        self.side.ids.insert(id, key);
        self.streams.insert(
            key,
            Stream {
                id,
                writing: true,
                on_wire: true,
                response_started: false,
                request: Length::new(content_length),
                body: InBody::new(),
                head_request,
                bodiless: false,
                response: Length::default(),
                orphaned: false,
                stall_since: None,
                backlog: 0,
                refill_asked: false,
                waited: false,
            },
        );
        self.core.out.push_head(key, Message::Text(text));
        self.core.out.open(key, id);
        self.core.stats.streams_opened += 1;
        Ok(key)
    }

    /// Queues request body bytes; returns how many were taken (zero-copy), 0
    /// when the queue is full: wait for [`RelayEvent::Writable`]. After the
    /// worker's response has ended, bytes are swallowed (never sent).
    pub fn send_body(&mut self, key: StreamKey, data: Bytes) -> Result<usize, WriteError> {
        let len = data.len();
        let Some(s) = self.stream_mut(key)? else {
            return Ok(len);
        };
        if !s.on_wire || s.orphaned {
            return Ok(len);
        }
        if !s.writing {
            return Err(WriteError::AlreadyFinished);
        }
        s.request.check_write(len)?;
        let n = self.core.out.write(key, data);
        if let Some(s) = self.streams.get_mut(&key) {
            s.request.add(n);
            // An application still sending the request is busy with the
            // stream, not stalled (it reads the response after, as many
            // HTTP/1 clients do): its deadline restarts.
            if n > 0 && s.stall_since.is_some() {
                self.set_stall(key, self.core.now);
            }
        }
        Ok(n)
    }

    /// Ends the request body: `end` goes out after what is queued. A body
    /// shorter than its Content-Length aborts the stream instead.
    pub fn finish(&mut self, key: StreamKey) -> Result<(), FinishError> {
        let Some(s) = self.stream_mut(key)? else {
            return Ok(());
        };
        if !s.on_wire || s.orphaned {
            return Ok(());
        }
        if !s.writing {
            return Err(FinishError::AlreadyFinished);
        }
        if let Err(e) = s.request.check_finish() {
            self.abort(key);
            return Err(e);
        }
        s.writing = false;
        self.core.out.finish(key);
        Ok(())
    }

    /// The caller has gone: sends `abort` (if the stream is still in flight)
    /// and forgets the stream, what it buffered and what it spilled (delete
    /// the stream's overflow store). No event follows for it.
    ///
    /// The two halves of the stream are looked at separately. A response
    /// that has received every byte its Content-Length announced (or a
    /// response without a body: to HEAD, 204, 304) is complete for the
    /// caller even if the worker's `end` has not arrived yet (an HTTP server
    /// drops the body at that point). If the request is complete too
    /// (`finish` was called), nothing is aborted: what is queued of the
    /// request still goes out, and the worker's `end` is awaited and consumed
    /// quietly, for at most `stall_timeout`. If the request body is still
    /// open, the worker's app would wait for the rest of it forever: the
    /// stream is aborted.
    pub fn abort(&mut self, key: StreamKey) {
        self.events.retain(|e| e.key() != key);
        let orphan = self
            .streams
            .get(&key)
            .is_some_and(|s| s.on_wire && !s.orphaned && !s.writing && s.response_complete());
        if orphan {
            self.drop_spills(key);
            self.body_op(key, InBody::discard);
            let now = self.core.now;
            let s = self.streams.get_mut(&key).expect("checked");
            s.orphaned = true;
            self.set_stall(key, now);
            self.track_pause();
            return;
        }
        let Some(s) = self.remove_stream(key) else {
            return;
        };
        if s.on_wire {
            self.side.ids.remove(&s.id);
            self.core.out.abort(key, s.id, SendAbort::IfHeadSent);
            self.core.stats.streams_closed += 1;
        }
        self.track_pause();
    }

    /// Reads the next piece of the response body. After `End` or `Gone` the
    /// stream is forgotten.
    pub fn read_body(&mut self, key: StreamKey) -> BodyRead {
        let Some(s) = self.streams.get(&key) else {
            return BodyRead::Gone;
        };
        let on_wire = s.on_wire;
        let r = self.body_op(key, InBody::read);
        match &r {
            BodyRead::Data(_) => {
                // The caller took something: its stall deadline restarts.
                let waiting = self.streams[&key].body.waiting();
                self.set_stall(key, if waiting { self.core.now } else { None });
                self.maybe_refill(key);
            }
            BodyRead::Pending => self.maybe_refill(key),
            BodyRead::End | BodyRead::Gone if !on_wire => {
                self.remove_stream(key);
            }
            _ => {}
        }
        self.track_pause();
        r
    }

    /// Hands back the next bytes of `key`'s overflow store, after a
    /// [`RelayEvent::Refill`]: the oldest bytes not refilled yet, in the
    /// order [`poll_spill`](Self::poll_spill) gave them. Bytes for a stream
    /// that has gone, or whose overflow was dropped meanwhile (it was given
    /// up), are swallowed; more than the store holds is refused.
    pub fn refill(&mut self, key: StreamKey, data: Bytes) -> Result<(), RefillError> {
        let Some(s) = self.stream_mut(key)? else {
            return Ok(());
        };
        let stored = s.stored();
        if data.is_empty() || s.orphaned || stored == 0 {
            return Ok(());
        }
        if data.len() as u64 > stored {
            return Err(RefillError::TooLong { stored });
        }
        s.refill_asked = false;
        let was_empty = s.body.chunks() == 0;
        let held = self.body_op(key, |b| b.refill(data));
        self.core.note_buffered_in(self.held.bytes);
        if held > 0 && was_empty {
            self.events.push_back(RelayEvent::Readable { key });
        }
        self.track_pause();
        Ok(())
    }

    // ----- drains -----

    /// The next message to write to the socket.
    pub fn poll_transmit(&mut self) -> Option<Message> {
        let (msg, _sent) = self.core.poll_transmit()?;
        for key in self.core.out.take_writable() {
            self.events.push_back(RelayEvent::Writable { key });
        }
        Some(msg)
    }

    /// The next chunk to append to its stream's overflow store (only with
    /// [`RelayConfig::overflow`]). Drain it with the other outputs: chunks
    /// waiting here count against `max_unread_bytes`.
    pub fn poll_spill(&mut self) -> Option<(StreamKey, Bytes)> {
        let (key, data) = self.side.spills.pop_front()?;
        self.side.spill_backlog -= data.len();
        if let Some(s) = self.streams.get_mut(&key) {
            s.backlog -= data.len();
        }
        self.maybe_refill(key);
        self.track_pause();
        Some((key, data))
    }

    /// When `handle_timeout` wants to be called next (`None`: no timer):
    /// the keepalive, the earliest stall deadline, the read-pause bound,
    /// the end of a wait before a spill; once closed, the close deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.core.closed {
            return self.core.poll_timeout();
        }
        let stall = self
            .side
            .stalls
            .first()
            .and_then(|(since, _)| since.checked_add(self.config.extra.stall_timeout.0));
        let pause = self
            .side
            .paused_since
            .and_then(|p| p.checked_add(self.config.extra.read_pause_timeout.0));
        let alone = self.streams.len() == 1;
        let wait = self.side.waiting_for.and_then(|(_, since)| {
            since.checked_add(
                self.config
                    .extra
                    .overflow
                    .map_or(Duration::ZERO, |o| slow::spill_wait(&o, alone)),
            )
        });
        [self.core.poll_timeout(), stall, pause, wait]
            .into_iter()
            .flatten()
            .min()
    }

    /// Sets the wire id the next stream tries first (it still skips ids in
    /// flight, and moves on from there, wrapping at 2³²−1). Ids need not be
    /// sequential; a relay may start elsewhere than 1, or resume a sequence.
    pub fn set_next_stream_id(&mut self, id: StreamId) {
        self.side.next_id = id;
    }
}
