//! The relay side: turns HTTP requests into frames for the worker, and the
//! worker's frames into responses.

use super::core::{Core, Input};
use super::inbound::{BodyRead, InBody};
use super::outbound::{Outbound, SendAbort};
use super::{HandleError, Stats, StreamError, StreamKey};
use crate::connect::{Keepalive, KeepaliveConfig};
use crate::frame::{
    CloseCode, ControlFrame, Decoded, FrameError, HeadLimits, Message, RequestHead, ResponseHead,
    StreamId, MAX_CHUNK_BODY, MAX_MESSAGE_LEN,
};
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// Bounds of a [`RelayConnection`]. Every queue is finite.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Requests in flight at once on this connection (streams held, counting
    /// those whose response body is not read yet). Default 1024.
    pub max_streams: usize,
    /// Of `max_streams`, how many only the protocol's control routes may
    /// use (`GET /health` and `POST /v1/executions/{id}/cancel`, see
    /// [`is_control_route`](super::is_control_route)), so a burst of long
    /// dispatches cannot lock out a cancel or a health check. Other requests
    /// are refused past `max_streams - reserved_streams` (never less than 1).
    /// Default 16.
    pub reserved_streams: usize,
    /// Request body bytes queued per stream before its sink is not ready.
    /// Default 2 MiB.
    pub max_queued_per_stream: usize,
    /// Request body bytes queued over all streams. Default 8 MiB.
    pub max_queued: usize,
    /// Unread response chunks held per stream before reading pauses. Default 16.
    pub max_unread_chunks: usize,
    /// Unread response bytes held over all streams before reading pauses.
    /// Default 64 MiB.
    pub max_unread_bytes: usize,
    /// Largest body chunk emitted. Default and maximum 1 MiB.
    pub chunk_size: usize,
    /// Pings and the pong deadline (spec: every 20 s, dead after 20 s without
    /// a pong). Armed by the first `handle_timeout(now)`. Default: off (the worker pings; the relay's WebSocket library answers).
    pub keepalive: Option<KeepaliveConfig>,
    /// Bounds on every request head opened and every response head read.
    /// A request over them is refused by `open_stream`
    /// ([`StreamError::HeadOverLimit`]: 431, 414 or 400); a response over
    /// them fails its stream ([`RelayEnd::ProtocolError`]: 502).
    pub head_limits: HeadLimits,
    /// Methods `open_stream` refuses ([`StreamError::MethodNotAllowed`]:
    /// 405), compared case-insensitively. Default `CONNECT` (a tunnel the
    /// protocol cannot carry) and `TRACE` (it would echo the caller's
    /// credentials back through the worker).
    pub refused_methods: Vec<String>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            max_streams: 1024,
            reserved_streams: 16,
            max_queued_per_stream: 2 << 20,
            max_queued: 8 << 20,
            max_unread_chunks: 16,
            max_unread_bytes: 64 << 20,
            chunk_size: MAX_CHUNK_BODY,
            keepalive: None,
            head_limits: HeadLimits::default(),
            refused_methods: vec!["CONNECT".into(), "TRACE".into()],
        }
    }
}

impl RelayConfig {
    /// Whether `open_stream` refuses `method` (see
    /// [`refused_methods`](Self::refused_methods)); a relay can ask before
    /// it maps the request (a `CONNECT` has no path to map).
    pub fn refuses_method(&self, method: &str) -> bool {
        self.refused_methods
            .iter()
            .any(|m| m.eq_ignore_ascii_case(method))
    }
}

/// How a relay stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayEnd {
    /// The worker's response is complete (`end` received); read the rest of its body.
    Completed,
    /// The worker sent `abort`.
    WorkerAborted,
    /// The worker broke the protocol on this stream: body or `end` before a
    /// response, a second response, a response head that is malformed, over
    /// the [`HeadLimits`], not a final status in 200..=599 (1xx, 101
    /// included: the protocol has no interim responses) or with an invalid or
    /// conflicting Content-Length, or a body longer or shorter than its
    /// Content-Length. The relay sent `abort` unless the worker had ended
    /// the stream itself. Answer 502 before the response started, end the
    /// caller's response as failed after.
    ProtocolError,
    /// The connection closed or was lost.
    ConnectionLost,
}

impl RelayEnd {
    /// Whether the caller's request failed (every end but `Completed`).
    pub fn is_failure(self) -> bool {
        self != RelayEnd::Completed
    }
}

impl RelayEvent {
    /// The stream the event is about.
    pub fn key(&self) -> StreamKey {
        match self {
            RelayEvent::Response { key, .. }
            | RelayEvent::Readable { key }
            | RelayEvent::Writable { key }
            | RelayEvent::Ended { key, .. } => *key,
        }
    }
}

/// What a [`RelayConnection`] tells the application.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RelayEvent {
    /// The worker's response head.
    Response {
        /// The stream.
        key: StreamKey,
        /// The head.
        head: ResponseHead,
    },
    /// The response body has data, or its end, to read.
    Readable {
        /// The stream.
        key: StreamKey,
    },
    /// The request body sink may take bytes again.
    Writable {
        /// The stream.
        key: StreamKey,
    },
    /// The stream ended on the wire; exactly once per stream not aborted by
    /// the application. Answer 502 if `!response_started && reason.is_failure()`;
    /// end the caller's response as failed if it started and failed.
    Ended {
        /// The stream.
        key: StreamKey,
        /// Why.
        reason: RelayEnd,
        /// Whether the response head had arrived.
        response_started: bool,
    },
}

#[derive(Debug)]
struct Stream {
    id: StreamId,
    /// The request direction is still ours to write (no `finish` yet).
    writing: bool,
    /// The stream is still in flight on the wire (its id is taken).
    on_wire: bool,
    response_started: bool,
    content_length: Option<u64>,
    sent: u64,
    body: InBody,
    /// The request is a HEAD: its response carries no body.
    head_request: bool,
    /// No response body is expected (a HEAD request, a 204 or 304
    /// response): chunks are dropped, Content-Length is not checked.
    bodiless: bool,
    /// The response's Content-Length, if it announced one (and has a body).
    response_length: Option<u64>,
    /// Response body bytes received so far.
    received: u64,
    /// The application let go of a response complete by its Content-Length
    /// before the worker's `end` arrived, with its own request complete too:
    /// wait for that `end` quietly (what is queued of the request still goes).
    orphaned: bool,
}

impl Stream {
    /// Every byte of the response body has arrived (only `end` may be missing).
    fn response_complete(&self) -> bool {
        self.response_started && (self.bodiless || self.response_length == Some(self.received))
    }
}

/// The relay side of one connection. Sans-IO: see the crate docs for the run loop.
///
/// - Inputs: [`handle_message`](Self::handle_message), [`handle_lost`](Self::handle_lost),
///   [`handle_timeout`](Self::handle_timeout), and the application's commands
///   ([`open_stream`](Self::open_stream), [`send_body`](Self::send_body),
///   [`finish`](Self::finish), [`abort`](Self::abort), [`read_body`](Self::read_body),
///   [`close`](Self::close)).
/// - Drains: [`poll_transmit`](Self::poll_transmit), [`poll_event`](Self::poll_event),
///   [`poll_timeout`](Self::poll_timeout).
/// - Getters: [`wants_read`](Self::wants_read), [`is_closed`](Self::is_closed),
///   [`send_capacity`](Self::send_capacity), [`stats`](Self::stats).
#[derive(Debug)]
pub struct RelayConnection {
    config: RelayConfig,
    streams: HashMap<StreamKey, Stream>,
    ids: HashMap<StreamId, StreamKey>,
    next_key: u64,
    next_id: StreamId,
    core: Core,
    events: VecDeque<RelayEvent>,
    unread_bytes: usize,
}

impl Default for RelayConnection {
    fn default() -> Self {
        RelayConnection::new(RelayConfig::default())
    }
}

impl RelayConnection {
    /// A connection whose handshake has just completed.
    pub fn new(config: RelayConfig) -> RelayConnection {
        let keepalive = config.keepalive;
        let out = Outbound::new(
            config.max_queued_per_stream,
            config.max_queued,
            config.chunk_size,
        );
        RelayConnection {
            streams: HashMap::new(),
            ids: HashMap::new(),
            next_key: 1,
            next_id: StreamId::MIN,
            core: Core::new(out, keepalive, config.head_limits),
            config,
            events: VecDeque::new(),
            unread_bytes: 0,
        }
    }

    // ----- getters -----

    /// Whether the driver may read the next message from the socket: false
    /// while a response body holds `max_unread_chunks` unread chunks (or all
    /// hold `max_unread_bytes`), and after the connection closed.
    pub fn wants_read(&self) -> bool {
        !self.core.closed
            && self.unread_bytes < self.config.max_unread_bytes
            && self
                .streams
                .values()
                .all(|s| s.body.chunks() < self.config.max_unread_chunks)
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.core.closed
    }

    /// Request body bytes `send_body` would take now.
    pub fn send_capacity(&self, key: StreamKey) -> usize {
        self.core.out.capacity(key)
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

    /// The connection's counters.
    pub fn stats(&self) -> Stats {
        self.core.stats(self.streams.len(), self.unread_bytes)
    }

    /// Bounds in force.
    pub fn config(&self) -> &RelayConfig {
        &self.config
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
        let ids = &self.ids;
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
                if let Some(&key) = self.ids.get(&id) {
                    self.end_on_wire(key, RelayEnd::ProtocolError, SendAbort::Always)
                }
            }
            Input::BadText(..) => {}
            Input::TooLarge(code) => self.close_with(code, "message too big"),
            Input::Closed => self.lose(),
            Input::Frame(Decoded::Unknown) | Input::BadBinary | Input::Nothing => {}
        }
        Ok(())
    }

    /// The socket is gone: every stream in flight ends with
    /// [`RelayEnd::ConnectionLost`].
    pub fn handle_lost(&mut self) {
        self.lose();
    }

    /// Advances time to `now`: arms the keepalive on the first call, emits a
    /// ping when one is due (ahead of queued body chunks), and closes the
    /// connection (1011) when a pong is overdue. Extra calls are harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        let paused = !self.wants_read();
        if self.core.handle_timeout(now, paused) {
            self.close_with(Keepalive::CLOSE_CODE, Keepalive::CLOSE_REASON);
        }
    }

    // ----- application commands -----

    /// Opens a stream for an HTTP request: picks its id, strips hop-by-hop
    /// headers and queues the `request` frame. Send the body with
    /// [`send_body`](Self::send_body) and end it with [`finish`](Self::finish)
    /// (a request without a body: `finish` at once).
    ///
    /// Refused, in this order ([`StreamError::status`] gives the answer):
    /// a closed connection (502), a method of
    /// [`refused_methods`](RelayConfig::refused_methods) (405), a head over
    /// the [`head_limits`](RelayConfig::head_limits) (400, 414 or 431), an
    /// invalid or conflicting Content-Length (400), and too many streams in
    /// flight (503; the last [`reserved_streams`](RelayConfig::reserved_streams)
    /// are kept for the control routes).
    pub fn open_stream(&mut self, mut head: RequestHead) -> Result<StreamKey, StreamError> {
        if self.core.closed {
            return Err(StreamError::ConnectionClosed);
        }
        if self.config.refuses_method(head.method()) {
            return Err(StreamError::MethodNotAllowed);
        }
        let filtered = head.headers().without_hop_by_hop();
        *head.headers_mut() = filtered;
        self.config.head_limits.check_request(&head)?;
        let content_length = head
            .headers()
            .content_length()
            .map_err(|_| StreamError::InvalidContentLength)?;
        let limit = if super::is_control_route(&head) {
            self.config.max_streams
        } else {
            self.config
                .max_streams
                .saturating_sub(self.config.reserved_streams)
                .max(1)
        };
        if self.streams.len() >= limit {
            return Err(StreamError::TooManyStreams { limit });
        }
        let head_request = head.method() == "HEAD";
        let id = self.alloc_id();
        let frame = ControlFrame::Request { id, head };
        let text = frame.encode();
        let len = text.len();
        if len > MAX_MESSAGE_LEN {
            return Err(FrameError::TooLarge {
                len,
                limit: MAX_MESSAGE_LEN,
            }
            .into());
        }
        let key = StreamKey(self.next_key);
        self.next_key += 1;
        self.next_id = id.next_wrapping();
        self.ids.insert(id, key);
        self.streams.insert(
            key,
            Stream {
                id,
                writing: true,
                on_wire: true,
                response_started: false,
                content_length,
                sent: 0,
                body: InBody::new(),
                head_request,
                bodiless: false,
                response_length: None,
                received: 0,
                orphaned: false,
            },
        );
        self.core.out.push_stream_message(key, Message::Text(text));
        self.core.out.open(key, id);
        self.core.stats.streams_opened += 1;
        Ok(key)
    }

    /// Queues request body bytes; returns how many were taken (zero-copy), 0
    /// when the queue is full: wait for [`RelayEvent::Writable`]. After the
    /// worker's response has ended, bytes are swallowed (never sent).
    pub fn send_body(&mut self, key: StreamKey, data: Bytes) -> Result<usize, StreamError> {
        let len = data.len();
        let Some(s) = self.stream_mut(key)? else {
            return Ok(len);
        };
        if !s.on_wire || s.orphaned {
            return Ok(len);
        }
        if !s.writing {
            return Err(StreamError::AlreadyFinished);
        }
        if let Some(limit) = s.content_length {
            if s.sent + len as u64 > limit {
                return Err(StreamError::ContentLengthExceeded { limit });
            }
        }
        let n = self.core.out.write(key, data);
        if let Some(s) = self.streams.get_mut(&key) {
            s.sent += n as u64;
        }
        Ok(n)
    }

    /// Ends the request body: `end` goes out after what is queued. A body
    /// shorter than its Content-Length aborts the stream instead.
    pub fn finish(&mut self, key: StreamKey) -> Result<(), StreamError> {
        let Some(s) = self.stream_mut(key)? else {
            return Ok(());
        };
        if !s.on_wire || s.orphaned {
            return Ok(());
        }
        if !s.writing {
            return Err(StreamError::AlreadyFinished);
        }
        if let Some(expected) = s.content_length.filter(|&cl| s.sent < cl) {
            let sent = s.sent;
            self.abort(key);
            return Err(StreamError::ContentLengthShort { expected, sent });
        }
        s.writing = false;
        self.core.out.finish(key);
        Ok(())
    }

    /// The caller has gone: sends `abort` (if the stream is still in flight)
    /// and forgets the stream. No event follows for it.
    ///
    /// The two halves of the stream are looked at separately. A response
    /// that has received every byte its Content-Length announced (or a
    /// response without a body: to HEAD, 204, 304) is complete for the
    /// caller even if the worker's `end` has not arrived yet (an HTTP server
    /// drops the body at that point). If the request is complete too
    /// (`finish` was called), nothing is aborted: what is queued of the
    /// request still goes out, and the worker's `end` is awaited and consumed
    /// quietly. If the request body is still open, the worker's app would
    /// wait for the rest of it forever: the stream is aborted.
    pub fn abort(&mut self, key: StreamKey) {
        self.events.retain(|e| e.key() != key);
        if let Some(s) = self.streams.get_mut(&key) {
            if s.on_wire && !s.orphaned && !s.writing && s.response_complete() {
                s.orphaned = true;
                let dropped = s.body.discard();
                self.unread_bytes -= dropped;
                return;
            }
        }
        let Some(s) = self.streams.remove(&key) else {
            return;
        };
        self.unread_bytes -= s.body.bytes();
        if s.on_wire {
            self.ids.remove(&s.id);
            self.core.out.abort(key, s.id, SendAbort::IfHeadSent);
            self.core.stats.streams_closed += 1;
        }
    }

    /// Reads the next piece of the response body. After `End` or `Gone` the
    /// stream is forgotten.
    pub fn read_body(&mut self, key: StreamKey) -> BodyRead {
        let Some(s) = self.streams.get_mut(&key) else {
            return BodyRead::Gone;
        };
        let r = s.body.read();
        match &r {
            BodyRead::Data(d) => self.unread_bytes -= d.len(),
            BodyRead::End | BodyRead::Gone if !s.on_wire => {
                self.streams.remove(&key);
            }
            _ => {}
        }
        r
    }

    /// Closes the connection with `code`; every stream in flight ends with
    /// [`RelayEnd::ConnectionLost`].
    pub fn close(&mut self, code: CloseCode, reason: &str) {
        self.close_with(code, reason);
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

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<RelayEvent> {
        // Room freed by a dropped queue (an abort, the worker's early answer)
        // wakes refused senders even when nothing is transmitted.
        for key in self.core.out.take_writable() {
            self.events.push_back(RelayEvent::Writable { key });
        }
        self.events.pop_front()
    }

    /// When `handle_timeout` wants to be called next (`None`: no timer).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.core.poll_timeout()
    }

    /// Test hook: the id the next stream will try first.
    #[doc(hidden)]
    pub fn __set_next_id(&mut self, id: StreamId) {
        self.next_id = id;
    }

    // ----- internals -----

    /// The next free id after the last one handed out, wrapping at
    /// 2³²−1 and skipping ids in flight. Ids are not reused as soon as they
    /// are freed: after an `abort` the worker may still have frames of the
    /// old stream on the wire, and Strata's worker keeps an id busy until
    /// its app returns (a reused id would be silently ignored there).
    fn alloc_id(&self) -> StreamId {
        let mut id = self.next_id;
        // At most `max_streams` ids are taken, so this ends within that many steps.
        while self.ids.contains_key(&id) {
            id = id.next_wrapping();
        }
        id
    }

    fn stream_mut(&mut self, key: StreamKey) -> Result<Option<&mut Stream>, StreamError> {
        if key.0 == 0 || key.0 >= self.next_key {
            return Err(StreamError::UnknownStream);
        }
        Ok(self.streams.get_mut(&key))
    }

    /// Ends a stream on the wire (the worker's end/abort, a protocol error).
    fn end_on_wire(&mut self, key: StreamKey, reason: RelayEnd, send_abort: SendAbort) {
        if reason == RelayEnd::ProtocolError {
            self.core.stats.protocol_errors += 1;
        }
        if self.streams[&key].orphaned {
            // The application has let go of it: end it without an event.
            let s = self.streams.remove(&key).expect("in flight");
            self.ids.remove(&s.id);
            self.core.out.abort(key, s.id, send_abort);
            self.core.stats.streams_closed += 1;
            return;
        }
        let s = self.streams.get_mut(&key).expect("in flight");
        s.on_wire = false;
        s.writing = false;
        let (id, started) = (s.id, s.response_started);
        self.ids.remove(&id);
        self.core.out.abort(key, id, send_abort);
        if !reason.is_failure() {
            s.body.end();
        } else if started {
            // The caller gets what arrived, then the failure.
            s.body.fail_after_data();
        } else {
            let s = self.streams.remove(&key).expect("in flight");
            self.unread_bytes -= s.body.bytes();
        }
        self.core.stats.streams_closed += 1;
        self.events.push_back(RelayEvent::Ended {
            key,
            reason,
            response_started: started,
        });
        if !reason.is_failure() || started {
            self.events.push_back(RelayEvent::Readable { key });
        }
    }

    fn on_control(&mut self, c: ControlFrame) {
        let Some(&key) = self.ids.get(&c.id()) else {
            self.core.stats.messages_ignored += 1;
            return;
        };
        let started = self.streams[&key].response_started;
        match c {
            ControlFrame::Response { head, .. } if !started => self.on_response(key, head),
            ControlFrame::End { .. } if started => {
                let s = &self.streams[&key];
                let short = !s.bodiless && s.response_length.is_some_and(|cl| s.received < cl);
                // The worker has ended its side either way: no `abort`.
                let reason = if short {
                    RelayEnd::ProtocolError
                } else {
                    RelayEnd::Completed
                };
                self.end_on_wire(key, reason, SendAbort::Never)
            }
            ControlFrame::Abort { .. } => {
                self.end_on_wire(key, RelayEnd::WorkerAborted, SendAbort::Never)
            }
            ControlFrame::Request { .. } => self.core.stats.messages_ignored += 1,
            // A second response, or `end` before any response.
            _ => self.end_on_wire(key, RelayEnd::ProtocolError, SendAbort::Always),
        }
    }

    /// The response head: only a final status (200..=599) with a valid
    /// Content-Length starts a response; anything else fails the stream.
    fn on_response(&mut self, key: StreamKey, head: ResponseHead) {
        let status = head.status();
        let length = head.headers().content_length();
        let (true, Ok(length)) = ((200..=599).contains(&status), length) else {
            self.end_on_wire(key, RelayEnd::ProtocolError, SendAbort::Always);
            return;
        };
        let s = self.streams.get_mut(&key).expect("in flight");
        s.response_started = true;
        s.bodiless = s.head_request || status == 204 || status == 304;
        s.response_length = if s.bodiless { None } else { length };
        self.events.push_back(RelayEvent::Response { key, head });
    }

    fn on_chunk(&mut self, id: StreamId, data: Bytes) {
        let Some(&key) = self.ids.get(&id) else {
            self.core.stats.messages_ignored += 1;
            return;
        };
        let s = self.streams.get_mut(&key).expect("in flight");
        if !s.response_started {
            self.end_on_wire(key, RelayEnd::ProtocolError, SendAbort::Always);
            return;
        }
        if s.bodiless {
            // A body where HTTP allows none (HEAD, 204, 304): not forwarded.
            self.core.stats.messages_ignored += 1;
            return;
        }
        if s.response_length
            .is_some_and(|cl| s.received + data.len() as u64 > cl)
        {
            self.end_on_wire(key, RelayEnd::ProtocolError, SendAbort::Always);
            return;
        }
        s.received += data.len() as u64;
        let was_empty = s.body.chunks() == 0;
        let held = s.body.push(data);
        self.unread_bytes += held;
        self.core.note_buffered_in(self.unread_bytes);
        if held > 0 && was_empty && !s.orphaned {
            self.events.push_back(RelayEvent::Readable { key });
        }
    }

    fn close_with(&mut self, code: CloseCode, reason: &str) {
        self.end_all(Some((code, reason)));
    }

    fn lose(&mut self) {
        self.end_all(None);
    }

    /// The connection is over: every stream in flight ends with `ConnectionLost`.
    fn end_all(&mut self, close: Option<(CloseCode, &str)>) {
        if !self.core.mark_closed(close) {
            return;
        }
        let mut keys: Vec<StreamKey> = self.ids.values().copied().collect();
        keys.sort();
        for key in keys {
            self.end_on_wire(key, RelayEnd::ConnectionLost, SendAbort::Never);
        }
        self.core.out.clear();
    }
}
