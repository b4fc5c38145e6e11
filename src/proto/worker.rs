//! The worker side: turns the relay's frames into requests for the
//! application, and the application's responses into frames.

use super::config::ConfigError;
use super::connection::Connection;
use super::core::Input;
use super::inbound::{BodyRead, Held, InBody};
use super::length::{no_body, Length};
use super::outbound::SendAbort;
use super::side::{sealed::Sealed, Worker};
use super::{
    CloseCause, FinishError, HandleError, RespondError, Stats, StreamKey, UnknownStream,
    WorkerConfig, WriteError,
};
use crate::frame::{
    self, CloseCode, ControlFrame, Decoded, FrameError, Headers, Message, RequestHead,
    ResponseHead, StreamId,
};
use bytes::Bytes;
use std::collections::HashMap;
use std::time::Instant;

/// The body [`WorkerConnection::fail`] sends before a head: the text of the
/// 500 response a stream failed before its response gets (`text/plain`, no
/// Content-Length), as Strata's worker sends it.
pub const FAILED_BODY: &[u8] = b"Internal Server Error";

/// Refusals (400 for a malformed request, 503 over `max_streams`, `abort`
/// for a request body that broke its Content-Length) the worker queues
/// before it stops reading until they have gone out: a relay that keeps
/// sending such requests without reading cannot grow the queue.
pub const MAX_PENDING_REFUSALS: usize = 64;

/// How a worker stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerEnd {
    /// The response went out complete (`end` emitted).
    Completed,
    /// The application failed after its response started (`abort` emitted).
    Failed,
    /// The relay aborted the stream: its client has gone.
    ClientAborted,
    /// The relay broke the protocol on this stream: the request body was
    /// longer or shorter than its Content-Length. The request body fails
    /// (`read_body` gives `Gone`), whatever of the response was queued is
    /// dropped, and the worker sent `abort`.
    ProtocolError,
    /// The connection closed or was lost.
    ConnectionLost,
}

/// What a [`WorkerConnection`] tells the application.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerEvent {
    /// A new request; read its body with [`WorkerConnection::read_body`].
    Request {
        /// The handle for every command on this request.
        key: StreamKey,
        /// The wire id (for logs).
        id: StreamId,
        /// The request head.
        head: RequestHead,
    },
    /// The request body has data, or its end, to read.
    Readable {
        /// The request.
        key: StreamKey,
    },
    /// The response sink may take bytes again.
    Writable {
        /// The request.
        key: StreamKey,
    },
    /// The stream ended; exactly once per request.
    Ended {
        /// The request.
        key: StreamKey,
        /// Why.
        reason: WorkerEnd,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resp {
    NotStarted,
    Started,
    Finished,
}

#[derive(Debug)]
pub struct Stream {
    id: StreamId,
    body: InBody,
    /// The request body against its Content-Length.
    request: Length,
    /// The request is a HEAD: its response carries no body.
    head_request: bool,
    resp: Resp,
    failed: bool,
    /// The response has no body (HEAD, 204, 304): body bytes are swallowed.
    bodiless: bool,
    /// The response body against its Content-Length (none if bodiless).
    response: Length,
}

/// The worker side of one connection. Sans-IO: see the crate docs for the run loop.
///
/// - Inputs: [`handle_message`](Self::handle_message), [`handle_lost`](Self::handle_lost),
///   [`handle_timeout`](Self::handle_timeout), and the application's commands
///   ([`respond`](Self::respond), [`send_body`](Self::send_body),
///   [`finish`](Self::finish), [`fail`](Self::fail), [`read_body`](Self::read_body),
///   [`discard_body`](Self::discard_body), [`close`](Self::close)).
/// - Drains: [`poll_transmit`](Self::poll_transmit), [`poll_event`](Self::poll_event),
///   [`poll_timeout`](Self::poll_timeout).
/// - Getters: [`wants_read`](Self::wants_read), [`is_closed`](Self::is_closed),
///   [`send_capacity`](Self::send_capacity), [`stats`](Self::stats).
pub type WorkerConnection = Connection<Worker>;

/// What only a worker connection keeps.
#[derive(Debug, Default)]
pub struct WorkerState {
    /// Keyed by the relay's ids: the standard library's keyed hasher.
    ids: HashMap<StreamId, StreamKey>,
    /// Requests answered at once by the machine itself (400, 503) whose
    /// answer has not gone out yet: a relay `abort` drops it.
    answering: HashMap<StreamId, StreamKey>,
}

impl Sealed for Worker {
    const CONNECTION_NAME: &'static str = "WorkerConnection";
    const CONFIG_NAME: &'static str = "WorkerConfig";
    const CONFIG_BUILDER_NAME: &'static str = "WorkerConfigBuilder";
    const SERVER: bool = false;
    type Stream = Stream;
    type State = WorkerState;
    type Extra = ();

    fn writable(key: StreamKey) -> WorkerEvent {
        WorkerEvent::Writable { key }
    }

    fn validate(config: &WorkerConfig) -> Result<(), ConfigError> {
        config.common.validate()
    }

    fn end_all(c: &mut WorkerConnection, close: Option<(CloseCode, &str)>, cause: CloseCause) {
        c.end_all(close, cause)
    }

    fn wants_read(c: &WorkerConnection) -> bool {
        c.wants_read()
    }

    fn handle_message(
        c: &mut WorkerConnection,
        msg: Message,
        now: Instant,
    ) -> Result<(), HandleError> {
        c.handle_message(msg, now)
    }

    fn handle_timeout(c: &mut WorkerConnection, now: Instant) {
        c.handle_timeout(now)
    }

    fn poll_transmit(c: &mut WorkerConnection) -> Option<Message> {
        c.poll_transmit()
    }

    fn poll_timeout(c: &WorkerConnection) -> Option<Instant> {
        c.poll_timeout()
    }

    fn send_body(
        c: &mut WorkerConnection,
        key: StreamKey,
        data: Bytes,
    ) -> Result<usize, WriteError> {
        c.send_body(key, data)
    }

    fn finish(c: &mut WorkerConnection, key: StreamKey) -> Result<(), FinishError> {
        c.finish(key)
    }

    fn read_body(c: &mut WorkerConnection, key: StreamKey) -> BodyRead {
        c.read_body(key)
    }
}

impl Connection<Worker> {
    // ----- getters -----

    /// Whether the driver may read the next message from the socket. False
    /// while any request body holds `max_unread_chunks` unread chunks (or all
    /// hold `max_unread_bytes`), while [`MAX_PENDING_REFUSALS`] refusals (400, 503) wait
    /// to go out to a relay that does not read, and after the connection
    /// closed.
    pub fn wants_read(&self) -> bool {
        !self.core.closed
            && self.side.answering.len() < MAX_PENDING_REFUSALS
            && self.held.bytes < self.config.common.max_unread_bytes
            && self.held.full == 0
    }

    /// The connection's counters.
    pub fn stats(&self) -> Stats {
        self.core.stats(self.streams.len(), self.held.bytes)
    }

    // ----- inputs -----

    /// Feeds one message read from the socket.
    ///
    /// Malformed frames, frames of unknown type and frames for a stream that
    /// is not open are ignored (counted in [`Stats::messages_ignored`]). A
    /// message over 1 MiB + 4 bytes closes the connection with 1009.
    pub fn handle_message(&mut self, msg: Message, now: Instant) -> Result<(), HandleError> {
        let wants_read = self.wants_read();
        // The relay's `response` frames are never for the worker.
        let wanted = |ty: &str, _id: u64| ty != "response";
        match self.core.take(msg, now, wants_read, &wanted)? {
            Input::Frame(Decoded::Control(c)) => self.on_control(c),
            Input::Frame(Decoded::Chunk(c)) => self.on_chunk(c.id, c.data),
            Input::BadText(e, known) => self.on_bad_text(&e, known),
            Input::TooLarge(code) => {
                self.close_with(code, "message too big", CloseCause::MessageTooBig)
            }
            Input::Closed(frame) => self.lose(CloseCause::Peer(frame)),
            Input::Frame(Decoded::Unknown) | Input::BadBinary | Input::Nothing => {}
        }
        Ok(())
    }

    /// Advances time to `now`: arms the keepalive on the first call, emits a
    /// ping when one is due (ahead of queued body chunks), and closes the
    /// connection (1011) when a pong is overdue. Extra calls are harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.keepalive_tick(now);
    }

    // ----- application commands -----

    /// Starts the response. The status must be a final one, 200..=599 (the
    /// protocol has no interim responses). A response to HEAD, and a 204 or
    /// 304, has no body whatever its Content-Length says: body bytes sent
    /// for it are swallowed and `finish` does not check the length.
    pub fn respond(&mut self, key: StreamKey, head: ResponseHead) -> Result<(), RespondError> {
        let Some(s) = self.stream_mut(key)? else {
            return Ok(());
        };
        if s.resp != Resp::NotStarted {
            return Err(RespondError::AlreadyResponded);
        }
        let status = head.status();
        if !(200..=599).contains(&status) {
            return Err(FrameError::InvalidStatus.into());
        }
        let content_length = head
            .headers()
            .content_length()
            .map_err(|_| RespondError::InvalidContentLength)?;
        let bodiless = no_body(s.head_request, status);
        let content_length = if bodiless { None } else { content_length };
        let text = ControlFrame::Response { id: s.id, head }.encode_checked()?;
        s.resp = Resp::Started;
        s.bodiless = bodiless;
        s.response = Length::new(content_length);
        let id = s.id;
        self.core.out.push_stream_message(key, Message::Text(text));
        self.core.out.open(key, id);
        Ok(())
    }

    /// Queues response body bytes; returns how many were taken (zero-copy
    /// slices of `data`), 0 when the queue is full: wait for
    /// [`WorkerEvent::Writable`]. Bytes for a stream whose client has gone are
    /// swallowed.
    pub fn send_body(&mut self, key: StreamKey, data: Bytes) -> Result<usize, WriteError> {
        let len = data.len();
        let Some(s) = self.stream_mut(key)? else {
            return Ok(len);
        };
        match s.resp {
            Resp::NotStarted => return Err(WriteError::NotResponded),
            Resp::Finished => return Err(WriteError::AlreadyFinished),
            Resp::Started => {}
        }
        if s.bodiless {
            return Ok(len);
        }
        s.response.check_write(len)?;
        let n = self.core.out.write(key, data);
        if let Some(s) = self.streams.get_mut(&key) {
            s.response.add(n);
        }
        Ok(n)
    }

    /// Ends the response: `end` goes out after the queued body. Whatever of
    /// the request body was not read is discarded.
    pub fn finish(&mut self, key: StreamKey) -> Result<(), FinishError> {
        let Some(s) = self.stream_mut(key)? else {
            return Ok(());
        };
        match s.resp {
            Resp::NotStarted => return Err(FinishError::NotResponded),
            Resp::Finished => return Err(FinishError::AlreadyFinished),
            Resp::Started => {}
        }
        if let Err(e) = s.response.check_finish() {
            self.fail(key).map_err(|_| FinishError::UnknownStream)?;
            return Err(e);
        }
        s.resp = Resp::Finished;
        self.discard_body(key);
        self.core.out.finish(key);
        Ok(())
    }

    /// The application failed: before the response, answers 500 with a short
    /// text body; after, sends `abort` (after the head and the body already
    /// queued, so the relay's caller sees the response start, then fail).
    pub fn fail(&mut self, key: StreamKey) -> Result<(), UnknownStream> {
        let Some(s) = self.stream_mut(key)? else {
            return Ok(());
        };
        match s.resp {
            Resp::Finished => Ok(()),
            Resp::NotStarted => {
                // Exactly what Strata's worker sends (no content-length).
                let headers =
                    Headers::try_from_pairs([("content-type", "text/plain; charset=utf-8")])
                        .expect("static headers are valid");
                let head = ResponseHead::new(500, headers).expect("500 is valid");
                s.resp = Resp::Finished;
                let id = s.id;
                self.discard_body(key);
                // Head, body and end as control messages: 21 bytes, never
                // refused (or cut) by a full body queue.
                self.core
                    .out
                    .push_stream_control(key, &ControlFrame::Response { id, head });
                self.core.out.push_stream_message(
                    key,
                    Message::Binary(frame::encode_chunk(id, FAILED_BODY)),
                );
                self.core.out.open(key, id);
                self.core.out.finish(key);
                Ok(())
            }
            Resp::Started => {
                s.resp = Resp::Finished;
                s.failed = true;
                self.discard_body(key);
                // The head and the body produced so far go out, then `abort`.
                self.core.out.finish_aborted(key);
                Ok(())
            }
        }
    }

    /// Reads the next piece of the request body.
    pub fn read_body(&mut self, key: StreamKey) -> BodyRead {
        let Some(s) = self.streams.get_mut(&key) else {
            return BodyRead::Gone;
        };
        let limit = self.config.common.max_unread_chunks;
        self.held.op(&mut s.body, limit, InBody::read)
    }

    /// The application will not read the rest of the request body: drop what
    /// is held and whatever arrives later.
    pub fn discard_body(&mut self, key: StreamKey) {
        if let Some(s) = self.streams.get_mut(&key) {
            let limit = self.config.common.max_unread_chunks;
            self.held.op(&mut s.body, limit, InBody::discard);
        }
    }

    // ----- drains -----

    /// The next message to write to the socket.
    pub fn poll_transmit(&mut self) -> Option<Message> {
        let (msg, sent) = self.core.poll_transmit()?;
        for key in self.core.out.take_writable() {
            self.events.push_back(WorkerEvent::Writable { key });
        }
        if let Some(key) = sent.ended {
            self.side.answering.retain(|_, k| *k != key);
            if let Some(s) = self.streams.remove(&key) {
                self.side.ids.remove(&s.id);
                self.held
                    .forget(&s.body, self.config.common.max_unread_chunks);
                let reason = if s.failed {
                    WorkerEnd::Failed
                } else {
                    WorkerEnd::Completed
                };
                self.ended(key, reason);
            }
        }
        Some(msg)
    }

    /// When `handle_timeout` wants to be called next (`None`: no timer).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.core.poll_timeout()
    }

    // ----- internals -----

    fn ended(&mut self, key: StreamKey, reason: WorkerEnd) {
        self.core.stats.streams_closed += 1;
        self.events.push_back(WorkerEvent::Ended { key, reason });
    }

    fn on_control(&mut self, c: ControlFrame) {
        match c {
            ControlFrame::Request { id, head } => self.on_request(id, head),
            ControlFrame::End { id } => match self.side.ids.get(&id) {
                Some(&key) => {
                    let s = self.streams.get_mut(&key).expect("ids and streams agree");
                    if s.body.is_reading() && s.request.short() {
                        self.protocol_error(key);
                    } else if s.body.is_open() {
                        s.body.end(); // changes neither bytes nor chunks
                        self.events.push_back(WorkerEvent::Readable { key });
                    } else {
                        self.core.stats.messages_ignored += 1;
                    }
                }
                None => self.core.stats.messages_ignored += 1,
            },
            ControlFrame::Abort { id } => match self.side.ids.remove(&id) {
                Some(key) => {
                    let s = self.streams.remove(&key).expect("ids and streams agree");
                    self.held
                        .forget(&s.body, self.config.common.max_unread_chunks);
                    self.core.out.abort(key, id, SendAbort::Never);
                    self.ended(key, WorkerEnd::ClientAborted);
                }
                None => match self.side.answering.remove(&id) {
                    // Our own refusal has not gone out: it must not now.
                    Some(key) => self.core.out.abort(key, id, SendAbort::Never),
                    None => self.core.stats.messages_ignored += 1,
                },
            },
            ControlFrame::Response { .. } => self.core.stats.messages_ignored += 1,
        }
    }

    /// A text frame that does not decode. Ignored, as Strata's worker ignores
    /// it, except a `request` whose id is usable but whose other fields are
    /// not (a header with CR/LF, a path without `/`, …) or are over the
    /// [`HeadLimits`]: that one is answered 400 (or 431/414 for a head over a
    /// bound), so the relay's caller gets an answer instead of waiting forever.
    fn on_bad_text(&mut self, err: &FrameError, known: Option<(&'static str, StreamId)>) {
        let Some(("request", id)) = known else {
            return;
        };
        if self.side.ids.contains_key(&id) || self.side.answering.contains_key(&id) {
            return;
        }
        let status = match err {
            FrameError::HeadOverLimit(e) => e.status(),
            _ => 400,
        };
        self.refuse(id, status, &format!("Bad Request: {err}"));
    }

    /// Answers a request the machine refuses itself with a short text body.
    fn refuse(&mut self, id: StreamId, status: u16, text: &str) {
        let headers = Headers::try_from_pairs([("content-type", "text/plain; charset=utf-8")])
            .expect("static headers are valid");
        self.answer_now(
            id,
            ResponseHead::new(status, headers).expect("valid"),
            text.as_bytes(),
        );
    }

    /// Answers a request the machine refuses itself (no stream is opened):
    /// head, body and `end` as control messages, dropped if the relay aborts
    /// the id before they have gone out.
    fn answer_now(&mut self, id: StreamId, head: ResponseHead, body: &[u8]) {
        if self.side.answering.contains_key(&id) {
            return;
        }
        let key = StreamKey(self.next_key);
        self.next_key += 1;
        self.side.answering.insert(id, key);
        let out = &mut self.core.out;
        out.push_stream_control(key, &ControlFrame::Response { id, head });
        if !body.is_empty() {
            out.push_stream_message(key, Message::Binary(frame::encode_chunk(id, body)));
        }
        out.open(key, id);
        out.finish(key);
    }

    fn on_request(&mut self, id: StreamId, head: RequestHead) {
        if self.side.ids.contains_key(&id) || self.side.answering.contains_key(&id) {
            self.core.stats.messages_ignored += 1;
            return;
        }
        let Ok(request_length) = head.headers().content_length() else {
            self.core.stats.messages_ignored += 1;
            self.refuse(id, 400, "Bad Request: invalid Content-Length");
            return;
        };
        let limit = self.config.common.stream_limit(&head);
        if self.streams.len() >= limit {
            // Refuse at once; later frames for this id are not open and ignored.
            self.core.stats.messages_ignored += 1;
            let headers = Headers::try_from_pairs([("content-length", "0"), ("retry-after", "1")])
                .expect("valid");
            self.answer_now(id, ResponseHead::new(503, headers).expect("valid"), b"");
            return;
        }
        let head_request = head.method() == "HEAD";
        let key = StreamKey(self.next_key);
        self.next_key += 1;
        self.side.ids.insert(id, key);
        self.streams.insert(
            key,
            Stream {
                id,
                body: InBody::new(),
                request: Length::new(request_length),
                head_request,
                resp: Resp::NotStarted,
                failed: false,
                bodiless: false,
                response: Length::default(),
            },
        );
        self.core.stats.streams_opened += 1;
        self.events
            .push_back(WorkerEvent::Request { key, id, head });
    }

    fn on_chunk(&mut self, id: StreamId, data: Bytes) {
        let Some(&key) = self.side.ids.get(&id) else {
            self.core.stats.messages_ignored += 1;
            return;
        };
        let s = self.streams.get_mut(&key).expect("ids and streams agree");
        if !s.body.is_open() {
            self.core.stats.messages_ignored += 1;
            return;
        }
        if s.body.is_reading() {
            if !s.request.fits(data.len()) {
                self.protocol_error(key);
                return;
            }
            s.request.add(data.len());
        }
        let was_empty = s.body.chunks() == 0;
        let limit = self.config.common.max_unread_chunks;
        let held = self.held.op(&mut s.body, limit, |b| b.push(data));
        self.core.note_buffered_in(self.held.bytes);
        if held > 0 && was_empty {
            self.events.push_back(WorkerEvent::Readable { key });
        }
    }

    /// The relay broke the protocol on an open stream (a request body longer
    /// or shorter than its Content-Length): the body fails, the response is
    /// dropped, `abort` goes out, and the application is told.
    fn protocol_error(&mut self, key: StreamKey) {
        let s = self.streams.remove(&key).expect("open stream");
        self.side.ids.remove(&s.id);
        self.held
            .forget(&s.body, self.config.common.max_unread_chunks);
        self.core.out.abort(key, s.id, SendAbort::Always);
        // Like the machine's own refusals: a relay `abort` that crosses this
        // one drops it, and it counts against MAX_PENDING_REFUSALS.
        self.side.answering.insert(s.id, key);
        self.core.stats.protocol_errors += 1;
        self.ended(key, WorkerEnd::ProtocolError);
    }

    /// The connection is over: every open request is told its client has gone.
    fn end_all(&mut self, close: Option<(CloseCode, &str)>, cause: CloseCause) {
        if !self.core.mark_closed(close, cause) {
            return;
        }
        self.side.ids.clear();
        self.side.answering.clear();
        let mut keys: Vec<StreamKey> = self.streams.keys().copied().collect();
        keys.sort();
        for key in keys {
            self.streams.remove(&key);
            self.ended(key, WorkerEnd::ConnectionLost);
        }
        self.held = Held::default();
    }
}
