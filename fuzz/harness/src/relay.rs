//! The `relay_machine` target: a model of the relay's invariants.

#![allow(unused_imports)]
use crate::*;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use worker_relay::connect::{
    decide_upgrade, Backoff, BackoffConfig, KeepaliveConfig, Rejected, Token, TokenTable, UrlError,
    UrlMap, Verdict, WorkerId, SEC_WEBSOCKET_PROTOCOL,
};
use worker_relay::frame::{
    self, CloseCode, ControlFrame, Decoded, FrameError, HeadLimits, Headers, Message, RequestHead,
    ResponseHead, StreamId, MAX_CHUNK_BODY, MAX_MESSAGE_LEN, SUBPROTOCOL,
};
use worker_relay::proto::{
    is_control_route, BodyRead, FinishError, HandleError, OpenError, RelayConfig, RelayConnection,
    RelayEnd, RelayEvent, RespondError, StreamKey, UnknownStream, WorkerConfig, WorkerConnection,
    WorkerEnd, WorkerEvent, WriteError, MAX_PENDING_REFUSALS,
};

/// The relay's view of one stream (one caller's request).
#[derive(Debug)]
pub(crate) struct RKey {
    id: StreamId,
    /// The `request` frame's head as it must go out (hop-by-hop headers gone).
    head: RequestHead,
    /// In flight for the relay (its id is taken): `stream_id()` is `Some`.
    live: bool,
    /// The relay still holds the stream (`open_streams()` counts it).
    held: bool,
    /// The application aborted the stream or forgot it: no event may follow.
    forgotten: bool,
    /// The application aborted it while it was in flight: that is its end.
    aborted_live: bool,
    ended: Option<RelayEnd>,
    head_emitted: bool,
    /// The `request` frame must never go out (the stream ended first).
    head_dropped: bool,
    cl: Option<u64>,
    writing: bool,
    finished: bool,
    sent: u64,
    out: VecDeque<Bytes>,
    wire_sent: u64,
    end_emitted: bool,
    abort_expected: bool,
    abort_emitted: bool,
    started: bool,
    /// The response's Content-Length (none for a bodiless response), and
    /// the body bytes received.
    response_length: Option<u64>,
    received: u64,
    /// No response body is expected: a HEAD request, a 204 or 304.
    bodiless: bool,
    /// Since when data has waited for the application unread (or, orphaned,
    /// the worker's `end` has been awaited): the stall deadline's start.
    stall_since: Option<Instant>,
    /// The caller let go of a response complete by its Content-Length
    /// before the worker's `end`, its own request finished: the relay waits
    /// for that `end` quietly (no `abort`, no event; the id stays taken,
    /// `stream_id()` is `None`; what is queued of the request still goes).
    orphaned: bool,
    body: BodyModel,
}

impl RKey {
    fn response_complete(&self) -> bool {
        self.started && (self.bodiless || self.response_length == Some(self.received))
    }
}

pub(crate) struct RelayHarness {
    r: RelayConnection,
    /// Where keys this connection never handed out come from.
    mint: KeyMint,
    cfg: RelayConfig,
    now: Instant,
    seq: u32,
    keys: BTreeMap<StreamKey, RKey>,
    /// The streams the relay still holds or has in flight (what the checks
    /// after each step look at; a stream leaves once checked gone).
    active: BTreeSet<StreamKey>,
    /// The relay's ids in flight.
    ids_live: BTreeMap<StreamId, StreamKey>,
    /// Ids whose `request` is on the wire and whose stream has not ended on
    /// the wire.
    wire: BTreeMap<StreamId, StreamKey>,
    expect_end: BTreeMap<StreamKey, (RelayEnd, bool)>,
    expect_response: BTreeMap<StreamKey, ResponseHead>,
    closed: bool,
    close_sent: bool,
    expect_close: Option<u16>,
    last_ping: Option<Bytes>,
    bytes_in: u64,
    bytes_out: u64,
    opened: u64,
    ends: u64,
    protocol_errors: u64,
    /// Since when reading has been paused (the read-pause bound's start).
    paused_since: Option<Instant>,
}

/// Drives a [`RelayConnection`] with an arbitrary sequence of operations —
/// callers opening streams (hop-by-hop headers, Content-Lengths), sending
/// body, finishing, going away, reading responses; messages from the worker
/// (responses, chunks, `end`, `abort`, out of order, for unknown ids,
/// garbage, pings, pongs, closes, oversized messages); connection loss;
/// virtual time; partial drains — and checks after every step:
///
/// - stream ids unique among streams in flight (`stream_id()` of live
///   streams distinct; a `request` never goes out under an id still in
///   flight on the wire), the id allocator wrapping past 2³²−1;
/// - every emitted message at most 1 MiB + 4 bytes, a valid frame the relay
///   may send; the `request` head is the caller's minus hop-by-hop headers;
///   chunk bytes are exactly what the caller queued, in order, within
///   `chunk_size`; `end` only after `finish` and the whole body, matching
///   the Content-Length; `abort` only for a stream the caller gave up on or
///   the worker broke; nothing for a stream after its `end`/`abort`;
/// - every stream ends exactly once: one `Ended` event with the reason and
///   `response_started` the worker's frames imply, or the caller's `abort`
///   while it was in flight; no event after the caller's `abort`;
/// - bounds: open streams ≤ `max_streams`, queued body ≤ `max_queued`,
///   `send_body` takes `min(len, send_capacity)`, unread chunks per stream ≤
///   `max_unread_chunks`, unread bytes as `stats()` reports them,
///   `wants_read()` exactly when no bound is reached;
/// - `read_body` returns exactly the bytes the worker sent, then `End`
///   (completed) or `Gone` (failed).
///
/// At the end the connection is lost and every stream must have ended.
pub fn relay_machine(data: &[u8]) {
    let mut c = Cursor::new(data);
    let mut h = RelayHarness::new(&mut c);
    let mut steps = 0;
    while !c.is_empty() && steps < MAX_STEPS {
        h.step(&mut c);
        steps += 1;
    }
    h.finish();
}

pub(crate) const HOP_BY_HOP_NAMES: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
];

impl RelayHarness {
    fn new(c: &mut Cursor<'_>) -> RelayHarness {
        let f = c.u8();
        let mut b = RelayConfig::builder();
        if f & 1 == 1 {
            // Small bounds, so they are reached quickly (kept valid: the
            // builder refuses zero bounds, a reserve as large as the stream
            // bound, and a per-stream queue over the total).
            let m = c.u8();
            let max_streams = 1 + usize::from(m % 8);
            let per_stream = 1 + usize::from(c.u16());
            b = b
                .max_streams(max_streams)
                .reserved_streams(usize::from(m / 8 % 4).min(max_streams - 1))
                .max_unread_chunks(1 + usize::from(c.u8() % 16))
                .max_unread_bytes(1 + usize::from(c.u16()))
                .max_queued_per_stream(per_stream)
                .max_queued(per_stream.max(usize::from(c.u16())))
                .chunk_size(1 + usize::from(c.u16() % 2048));
        }
        if f & 2 == 2 {
            b = b.keepalive(gen_keepalive(c, RelayConfig::default().keepalive()));
        }
        if f & 8 == 8 {
            // Short deadlines, so stalls and pause bounds fire often.
            b = b
                .stall_timeout(Duration::from_secs(1 + u64::from(f >> 4)))
                .read_pause_timeout(Duration::from_secs(1 + u64::from((f >> 4) % 4)));
        }
        let cfg = b.build().expect("generated configs are valid");
        let now = base_instant();
        let mut r = RelayConnection::new(cfg.clone());
        if f & 4 == 4 {
            // Start near the top of the id space: the allocator must wrap.
            let top = u32::MAX - u32::from(c.u8() % 4);
            r.set_next_stream_id(StreamId::new(top).expect("nonzero"));
        }
        r.handle_timeout(now);
        RelayHarness {
            r,
            mint: KeyMint::default(),
            cfg,
            now,
            seq: 0,
            keys: BTreeMap::new(),
            active: BTreeSet::new(),
            ids_live: BTreeMap::new(),
            wire: BTreeMap::new(),
            expect_end: BTreeMap::new(),
            expect_response: BTreeMap::new(),
            closed: false,
            close_sent: false,
            expect_close: None,
            last_ping: None,
            bytes_in: 0,
            bytes_out: 0,
            opened: 0,
            ends: 0,
            protocol_errors: 0,
            paused_since: None,
        }
    }

    fn chunk_limit(&self) -> usize {
        self.cfg.chunk_size().clamp(1, MAX_CHUNK_BODY)
    }

    /// Whether the relay must pause reading (no overflow in this model).
    fn model_paused(&self) -> bool {
        let mut bytes = 0usize;
        for key in &self.active {
            let k = &self.keys[key];
            if k.held {
                bytes += k.body.bytes;
                if k.body.held.len() >= self.cfg.max_unread_chunks() {
                    return true;
                }
            }
        }
        bytes >= self.cfg.max_unread_bytes()
    }

    fn track_pause(&mut self) {
        if self.closed || !self.model_paused() {
            self.paused_since = None;
        } else if self.paused_since.is_none() {
            self.paused_since = Some(self.now);
        }
    }

    /// The model of the relay giving up a stream whose application did not
    /// keep up: `abort` if in flight, and its data dropped.
    fn give_up(&mut self, key: StreamKey) {
        let k = self.keys.get_mut(&key).expect("a held stream");
        k.stall_since = None;
        if k.live {
            self.end_on_wire(key, RelayEnd::CallerStalled, true);
        } else {
            k.body.fail();
        }
    }

    /// The model of the deadlines `handle_timeout(now)` runs: stalls in
    /// order of their start, then the read-pause bound.
    fn run_deadlines(&mut self) {
        if self.closed {
            return;
        }
        let stall = self.cfg.stall_timeout();
        let mut due: Vec<(Instant, StreamKey)> = self
            .keys
            .iter()
            .filter_map(|(key, k)| k.stall_since.map(|t| (t, *key)))
            .filter(|(t, _)| t.checked_add(stall).is_some_and(|d| d <= self.now))
            .collect();
        due.sort();
        for (_, key) in due {
            trace!("model: {key:?} stalled");
            self.give_up(key);
        }
        self.track_pause();
        let over = self
            .paused_since
            .and_then(|p| p.checked_add(self.cfg.read_pause_timeout()))
            .is_some_and(|d| d <= self.now);
        if over {
            let limit = self.cfg.max_unread_chunks();
            let held: Vec<StreamKey> = self
                .active
                .iter()
                .copied()
                .filter(|k| self.keys[k].held)
                .collect();
            let mut culprits: Vec<StreamKey> = held
                .iter()
                .copied()
                .filter(|k| self.keys[k].body.held.len() >= limit)
                .collect();
            if culprits.is_empty() {
                culprits.extend(
                    held.iter()
                        .copied()
                        .filter(|k| self.keys[k].body.bytes > 0)
                        .max_by_key(|k| (self.keys[k].body.bytes, std::cmp::Reverse(*k))),
                );
            }
            for key in culprits {
                trace!("model: {key:?} holds reading paused too long");
                self.give_up(key);
            }
        }
        self.track_pause();
    }

    fn wire_ids(&self) -> Vec<StreamId> {
        self.wire.keys().copied().collect()
    }

    fn pick_key(&mut self, c: &mut Cursor<'_>) -> StreamKey {
        let b = c.u8();
        let held = || self.active.iter().filter(|k| self.keys[k].held);
        let n = held().count();
        if b < 200 && n > 0 {
            return *held().nth(usize::from(b) % n).expect("in range");
        }
        if b < 250 && !self.keys.is_empty() {
            let i = usize::from(c.u8()) % self.keys.len();
            return *self.keys.keys().nth(i).expect("in range");
        }
        let next = self.keys.keys().next_back().map_or(1, |k| k.get() + 1);
        let at_least = next + u64::from(c.u8());
        self.mint.key(at_least)
    }

    fn step(&mut self, c: &mut Cursor<'_>) {
        match c.u8() % 24 {
            // ----- callers
            0..=3 => {
                let head = gen_request_head(c);
                self.open(head);
            }
            4..=6 => {
                let key = self.pick_key(c);
                let data = gen_body(c, &mut self.seq);
                self.send_body(key, data);
            }
            7 | 8 => {
                let key = self.pick_key(c);
                self.finish_cmd(key);
            }
            9 => {
                let key = self.pick_key(c);
                self.r.abort(key);
                trace!("relay app: abort({key:?})");
                self.app_abort(key);
            }
            10 | 11 => {
                let key = self.pick_key(c);
                for _ in 0..1 + c.u8() % 20 {
                    self.read(key);
                }
            }
            // ----- the worker's frames
            12 | 13 => {
                let id = gen_id(c, &self.wire_ids());
                let head = gen_response_head(c);
                self.feed(ControlFrame::Response { id, head }.to_message());
            }
            14..=16 => {
                let id = gen_id(c, &self.wire_ids());
                let body = gen_body(c, &mut self.seq);
                self.feed(Message::Binary(frame::encode_chunk(id, &body)));
            }
            17 => {
                let id = gen_id(c, &self.wire_ids());
                self.feed(ControlFrame::End { id }.to_message());
            }
            18 => {
                let id = gen_id(c, &self.wire_ids());
                self.feed(ControlFrame::Abort { id }.to_message());
            }
            19 => {
                let id = gen_id(c, &self.wire_ids());
                let msg = match c.u8() % 3 {
                    0 => ControlFrame::Request {
                        id,
                        head: gen_request_head(c),
                    }
                    .to_message(),
                    _ => gen_misc_message(c, id, self.last_ping.as_ref()),
                };
                self.feed(msg);
            }
            20 => match c.u8() % 8 {
                0 => {
                    let code = c.pick(APP_CLOSE_CODES);
                    self.r.close(CloseCode(code), "relay closes");
                    trace!("relay app: close({code})");
                    if !self.closed {
                        self.expect_close = Some(code);
                    }
                }
                1 => {
                    trace!("relay: handle_lost");
                    self.r.handle_lost();
                }
                _ => self.advance(c),
            },
            21 => self.advance(c),
            // ----- the socket takes messages
            _ => {
                let n = match c.u8() {
                    0..=127 => 1 + usize::from(c.u8() % 8),
                    _ => usize::MAX,
                };
                self.transmit(n);
            }
        }
        self.after_step();
    }

    fn advance(&mut self, c: &mut Cursor<'_>) {
        let d = gen_duration(c);
        if c.u8() % 4 == 0 {
            if let Some(t) = self.r.poll_timeout() {
                self.now = self.now.max(t);
            }
        }
        self.now = self.now.checked_add(d).unwrap_or(self.now);
        let was_closed = self.r.is_closed();
        trace!("relay: handle_timeout(+{:?})", self.now - base_instant());
        self.r.handle_timeout(self.now);
        if !was_closed && self.r.is_closed() {
            assert!(
                self.cfg.keepalive().is_some(),
                "closed on a timeout without keepalive"
            );
            self.expect_close = Some(1011);
        } else {
            self.run_deadlines();
        }
        let t = self.r.poll_timeout();
        if let Some(t) = t {
            assert!(
                t > self.now,
                "timer at {t:?} not after now after handle_timeout"
            );
        }
        self.r.handle_timeout(self.now);
        assert_eq!(self.r.poll_timeout(), t);
    }

    fn open(&mut self, head: RequestHead) {
        let before = self.r.open_streams();
        let filtered = head.headers().without_hop_by_hop();
        let res = self.r.open_stream(head.clone());
        trace!(
            "relay app: open_stream({} {}) = {res:?}",
            head.method(),
            head.path()
        );
        if self.closed {
            assert_eq!(res, Err(OpenError::ConnectionClosed));
            return;
        }
        if ["CONNECT", "TRACE"]
            .iter()
            .any(|m| m.eq_ignore_ascii_case(head.method()))
        {
            assert_eq!(res, Err(OpenError::MethodNotAllowed));
            return;
        }
        let expected = RequestHead::new(head.method(), head.path(), head.query(), filtered.clone())
            .expect("still valid");
        if let Err(e) = self.cfg.head_limits().check_request(&expected) {
            assert_eq!(res, Err(OpenError::HeadOverLimit(e)));
            return;
        }
        let Ok(cl) = filtered.content_length() else {
            assert_eq!(res, Err(OpenError::InvalidContentLength));
            return;
        };
        let limit = if is_control_route(&head) {
            self.cfg.max_streams()
        } else {
            (self.cfg.max_streams())
                .saturating_sub(self.cfg.reserved_streams())
                .max(1)
        };
        if before >= limit {
            assert_eq!(res, Err(OpenError::TooManyStreams { limit }));
            return;
        }
        let key = res.expect("open_stream within the bounds");
        assert!(
            self.keys.keys().next_back().map_or(true, |k| *k < key),
            "keys must increase"
        );
        let id = self.r.stream_id(key).expect("a new stream is in flight");
        assert!(
            !self.ids_live.contains_key(&id),
            "id {id} handed out while in flight"
        );
        self.ids_live.insert(id, key);
        self.active.insert(key);
        self.opened += 1;
        self.keys.insert(
            key,
            RKey {
                id,
                head: expected,
                live: true,
                held: true,
                forgotten: false,
                aborted_live: false,
                ended: None,
                head_emitted: false,
                head_dropped: false,
                cl,
                writing: true,
                finished: false,
                sent: 0,
                out: VecDeque::new(),
                wire_sent: 0,
                end_emitted: false,
                abort_expected: false,
                abort_emitted: false,
                started: false,
                response_length: None,
                received: 0,
                bodiless: false,
                stall_since: None,
                orphaned: false,
                body: BodyModel::new(),
            },
        );
    }

    fn send_body(&mut self, key: StreamKey, data: Bytes) {
        let cap = self.r.send_capacity(key);
        assert!(cap <= self.cfg.max_queued_per_stream().max(1));
        assert!(cap <= self.cfg.max_queued().max(1));
        let len = data.len();
        let res = self.r.send_body(key, data.clone());
        trace!("relay app: send_body({key:?}, {len} bytes) = {res:?} (capacity {cap})");
        let Some(k) = self.keys.get_mut(&key) else {
            assert_eq!(res, Err(WriteError::UnknownStream));
            return;
        };
        if !k.live || k.orphaned {
            assert_eq!(res, Ok(len), "body for an ended stream is swallowed");
            return;
        }
        if !k.writing {
            assert_eq!(res, Err(WriteError::AlreadyFinished));
            return;
        }
        if let Some(limit) = k.cl.filter(|&l| k.sent + len as u64 > l) {
            assert_eq!(res, Err(WriteError::ContentLengthExceeded { limit }));
            return;
        }

        let n = res.expect("send_body on a stream in flight");
        assert_eq!(
            n,
            len.min(cap),
            "send_body took {n} of {len}, capacity {cap}"
        );
        k.sent += n as u64;
        if n > 0 {
            k.out.push_back(data.slice(..n));
            // Sending restarts a running stall deadline.
            if k.stall_since.is_some() {
                k.stall_since = Some(self.now);
            }
        }
    }

    fn finish_cmd(&mut self, key: StreamKey) {
        let res = self.r.finish(key);
        trace!("relay app: finish({key:?}) = {res:?}");
        let Some(k) = self.keys.get_mut(&key) else {
            assert_eq!(res, Err(FinishError::UnknownStream));
            return;
        };
        if !k.live || k.orphaned {
            assert_eq!(res, Ok(()));
            return;
        }
        if !k.writing {
            assert_eq!(res, Err(FinishError::AlreadyFinished));
            return;
        }
        match k.cl.filter(|&cl| k.sent < cl) {
            Some(expected) => {
                assert_eq!(
                    res,
                    Err(FinishError::ContentLengthShort {
                        expected,
                        sent: k.sent
                    })
                );
                // The relay aborted the stream.
                self.app_abort(key);
            }
            None => {
                assert_eq!(res, Ok(()));
                k.writing = false;
                k.finished = true;
            }
        }
    }

    /// The model of `RelayConnection::abort(key)`.
    fn app_abort(&mut self, key: StreamKey) {
        let Some(k) = self.keys.get_mut(&key) else {
            return;
        };
        if !k.held {
            return;
        }
        self.expect_end.remove(&key);
        self.expect_response.remove(&key);
        if k.live && !k.orphaned && !k.writing && k.response_complete() {
            // Complete for the caller, and the request is complete: wait for
            // the worker's `end` quietly (for at most the stall deadline);
            // the queued request still goes out.
            k.orphaned = true;
            k.stall_since = Some(self.now);
            k.forgotten = true;
            k.aborted_live = true;
            k.body.discard();
            return;
        }
        k.held = false;
        k.forgotten = true;
        k.body.clear();
        if k.live {
            k.live = false;
            k.aborted_live = true;
            k.writing = false;
            k.out.clear();
            self.ids_live.remove(&k.id);
            if k.head_emitted {
                k.abort_expected = true;
            } else {
                k.head_dropped = true;
            }
            self.ends += 1;
        }
    }

    /// The model of the relay ending a stream on the wire.
    fn end_on_wire(&mut self, key: StreamKey, reason: RelayEnd, send_abort: bool) {
        let k = self.keys.get_mut(&key).expect("live key");
        assert!(k.live);
        if reason == RelayEnd::ProtocolError {
            self.protocol_errors += 1;
        }
        if reason == RelayEnd::Completed {
            // Content-Length accounting: a response completes only with
            // every byte it announced.
            if let Some(cl) = k.response_length {
                assert_eq!(k.received, cl, "completed short of its Content-Length");
            }
        }
        if k.orphaned {
            // Let go of by the caller: it ends without an event; what is
            // still queued of the request is dropped.
            k.stall_since = None;
            k.live = false;
            k.held = false;
            k.writing = false;
            k.body.clear();
            k.out.clear();
            if !k.head_emitted {
                k.head_dropped = true;
            }
            self.ids_live.remove(&k.id);
            if send_abort {
                k.abort_expected = true;
            } else if self.wire.get(&k.id) == Some(&key) {
                self.wire.remove(&k.id);
            }
            self.ends += 1;
            return;
        }
        k.live = false;
        k.writing = false;
        k.out.clear();
        self.ids_live.remove(&k.id);
        if !k.head_emitted {
            k.head_dropped = true;
        }
        if send_abort {
            k.abort_expected = true;
        } else if self.wire.get(&k.id) == Some(&key) {
            self.wire.remove(&k.id);
        }
        if !reason.is_failure() {
            k.body.end();
        } else if k.started && !reason.drops_body() {
            k.body.fail_after_data();
        } else if k.started {
            k.body.fail();
            k.stall_since = None;
        } else {
            k.held = false;
            k.body.clear();
            k.stall_since = None;
        }
        self.expect_end.insert(key, (reason, k.started));
        self.ends += 1;
    }

    fn read(&mut self, key: StreamKey) {
        let got = self.r.read_body(key);
        trace!("relay app: read_body({key:?}) = {}", short_read(&got));
        match self.keys.get_mut(&key) {
            Some(k) if k.held => {
                k.body.read(&got, "relay");
                if !k.live && matches!(got, BodyRead::End | BodyRead::Gone) {
                    k.held = false;
                    k.stall_since = None;
                }
                if matches!(got, BodyRead::Data(_)) {
                    // The caller took something: its deadline restarts.
                    let waiting = !k.body.held.is_empty() && !self.closed;
                    k.stall_since = waiting.then_some(self.now);
                }
            }
            _ => assert_eq!(got, BodyRead::Gone, "read_body of a stream not held"),
        }
    }

    fn feed(&mut self, msg: Message) {
        let was_closed = self.r.is_closed();
        let wants = self.r.wants_read();
        let is_data = msg.is_data();
        let len = msg.len() as u64;
        let class = classify(&msg, false, &self.cfg.head_limits());
        trace!("worker -> relay: {} = {class:?}", short(&msg));
        let fed = msg.clone();
        let res = self.r.handle_message(msg, self.now);
        if was_closed {
            assert_eq!(res, Ok(()), "a closed relay ignores input");
            return;
        }
        if is_data && !wants {
            assert!(
                matches!(&res, Err(HandleError::ReadPaused(m)) if m == &fed),
                "a paused relay hands the message back: {res:?}"
            );
            return;
        }
        assert_eq!(
            res,
            Ok(()),
            "handle_message refused a message while wants_read"
        );
        if is_data {
            self.bytes_in += len;
        }
        let live_key = |id: &StreamId| self.ids_live.get(id).copied();
        match class {
            Class::TooLarge => {
                assert!(self.r.is_closed(), "an oversized message must close");
                self.expect_close = Some(1009);
            }
            Class::Close => assert!(self.r.is_closed(), "a close must close"),
            Class::Response(id, head) => {
                if let Some(key) = live_key(&id) {
                    let k = self.keys.get_mut(&key).expect("live");
                    let status = head.status();
                    match head.headers().content_length() {
                        Ok(cl) if !k.started && (200..=599).contains(&status) => {
                            k.started = true;
                            k.bodiless =
                                k.head.method() == "HEAD" || status == 204 || status == 304;
                            k.response_length = cl.filter(|_| !k.bodiless);
                            self.expect_response.insert(key, head);
                        }
                        _ => self.end_on_wire(key, RelayEnd::ProtocolError, true),
                    }
                }
            }
            Class::BadResponse(id) => {
                if let Some(key) = live_key(&id) {
                    self.end_on_wire(key, RelayEnd::ProtocolError, true);
                }
            }
            Class::End(id) => {
                if let Some(key) = live_key(&id) {
                    let k = &self.keys[&key];
                    if !k.started {
                        self.end_on_wire(key, RelayEnd::ProtocolError, true);
                    } else if k.response_length.is_some_and(|cl| k.received < cl) {
                        self.end_on_wire(key, RelayEnd::ProtocolError, false);
                    } else {
                        self.end_on_wire(key, RelayEnd::Completed, false);
                    }
                }
            }
            Class::Abort(id) => {
                if let Some(key) = live_key(&id) {
                    self.end_on_wire(key, RelayEnd::WorkerAborted, false);
                }
            }
            Class::Chunk(id, data) => {
                if let Some(key) = live_key(&id) {
                    let k = self.keys.get_mut(&key).expect("live");
                    let over = |k: &RKey| {
                        k.response_length
                            .is_some_and(|cl| k.received + data.len() as u64 > cl)
                    };
                    if !k.started || (!k.bodiless && over(k)) {
                        self.end_on_wire(key, RelayEnd::ProtocolError, true);
                    } else if !k.bodiless {
                        k.received += data.len() as u64;
                        let pushed = !data.is_empty() && k.body.state == BState::Open;
                        k.body.push(data);
                        if pushed && k.stall_since.is_none() {
                            k.stall_since = Some(self.now);
                        }
                    }
                }
            }
            Class::Request(..) | Class::Other => {}
        }
    }

    fn transmit(&mut self, n: usize) {
        for _ in 0..n {
            let Some(m) = self.r.poll_transmit() else {
                return;
            };
            self.on_emit(m);
        }
    }

    fn on_emit(&mut self, m: Message) {
        trace!("relay emits {}", short(&m));
        assert!(!self.close_sent, "relay emitted {m:?} after its close");
        assert!(
            m.len() <= MAX_MESSAGE_LEN,
            "relay emitted {} bytes",
            m.len()
        );
        if let Some((code, reason)) = close_code_of(&m) {
            assert!(self.r.is_closed(), "close emitted by an open relay");
            assert_eq!(Some(code), self.expect_close, "relay closed with {code}");
            assert!(reason <= 123, "close reason of {reason} bytes");
            self.close_sent = true;
            return;
        }
        assert!(!self.r.is_closed(), "relay emitted {m:?} while closed");
        self.bytes_out += m.len() as u64;
        let d = match &m {
            Message::Close(None) => panic!("relay closed without a code"),
            Message::Ping(p) => {
                assert!(self.cfg.keepalive().is_some(), "ping without keepalive");
                self.last_ping = Some(p.clone());
                return;
            }
            Message::Pong(_) => panic!("relay emitted a pong"),
            _ => frame::decode(&m)
                .expect("data message")
                .unwrap_or_else(|e| panic!("relay emitted an invalid frame {m:?}: {e}")),
        };
        match d {
            Decoded::Control(ControlFrame::Request { id, head }) => {
                let cands: Vec<StreamKey> = self
                    .keys
                    .iter()
                    .filter(|(_, k)| k.id == id && !k.head_emitted && !k.head_dropped)
                    .map(|(key, _)| *key)
                    .collect();
                assert_eq!(cands.len(), 1, "request for id {id}: streams {cands:?}");
                let key = cands[0];
                assert!(
                    !self.wire.contains_key(&id),
                    "request under id {id}, still in flight on the wire"
                );
                let k = self.keys.get_mut(&key).expect("candidate");
                assert!(k.live, "request of a stream that has ended");
                assert_eq!(head, k.head, "request head");
                for (n, _) in head.headers().iter() {
                    let hop = HOP_BY_HOP_NAMES.iter().any(|h| h.eq_ignore_ascii_case(n))
                        || n.len() >= 6 && n[..6].eq_ignore_ascii_case("proxy-");
                    assert!(!hop, "hop-by-hop header {n} forwarded");
                }
                k.head_emitted = true;
                self.wire.insert(id, key);
            }
            Decoded::Chunk(ch) => {
                let chunk_limit = self.chunk_limit();
                let key = *self
                    .wire
                    .get(&ch.id)
                    .unwrap_or_else(|| panic!("relay chunk for id {}, not in flight", ch.id));
                let k = self.keys.get_mut(&key).expect("on the wire");
                assert!(k.live, "chunk for a stream that has ended");
                assert!(!k.end_emitted, "chunk after end");
                assert!(!ch.data.is_empty(), "relay emitted an empty chunk");
                assert!(ch.data.len() <= chunk_limit, "chunk over chunk_size");
                assert!(
                    consume(&mut k.out, &ch.data),
                    "request bytes on the wire differ from what the caller sent"
                );
                k.wire_sent += ch.data.len() as u64;
                if let Some(cl) = k.cl {
                    assert!(k.wire_sent <= cl, "body longer than its Content-Length");
                }
            }
            Decoded::Control(ControlFrame::End { id }) => {
                let key = *self
                    .wire
                    .get(&id)
                    .unwrap_or_else(|| panic!("relay end for id {id}, not in flight"));
                let k = self.keys.get_mut(&key).expect("on the wire");
                assert!(k.live, "end for a stream that has ended");
                assert!(!k.end_emitted, "second end");
                assert!(k.finished, "end before finish");
                assert!(k.out.is_empty(), "end before the whole body");
                if let Some(cl) = k.cl {
                    assert_eq!(k.wire_sent, cl, "end short of the Content-Length");
                }
                k.end_emitted = true;
            }
            Decoded::Control(ControlFrame::Abort { id }) => {
                let key = self
                    .keys
                    .iter()
                    .find(|(_, k)| k.id == id && k.abort_expected && !k.abort_emitted)
                    .map(|(key, _)| *key)
                    .unwrap_or_else(|| panic!("relay abort for id {id} nobody asked for"));
                if let Some(&owner) = self.wire.get(&id) {
                    assert_eq!(owner, key, "abort for id {id} now owned by another stream");
                    self.wire.remove(&id);
                }
                self.keys.get_mut(&key).expect("found").abort_emitted = true;
            }
            other => panic!("relay emitted {other:?}"),
        }
    }

    fn after_step(&mut self) {
        if self.r.is_closed() && !self.closed {
            self.closed = true;
            let live: Vec<StreamKey> = self.ids_live.values().copied().collect();
            for key in live {
                self.end_on_wire(key, RelayEnd::ConnectionLost, false);
            }
            for k in self.keys.values_mut() {
                // Whatever was queued is gone with the connection, and no
                // deadline runs any more.
                k.abort_expected &= k.abort_emitted;
                k.stall_since = None;
            }
        }
        while let Some(e) = self.r.poll_event() {
            self.on_event(e);
        }
        self.check();
        self.track_pause();
    }

    fn on_event(&mut self, e: RelayEvent) {
        trace!("relay event {e:?}");
        let key = e.key();
        let k = self
            .keys
            .get_mut(&key)
            .unwrap_or_else(|| panic!("{e:?} for an unknown key"));
        assert!(!k.forgotten, "{e:?} after the caller aborted the stream");
        match e {
            RelayEvent::Response { head, .. } => {
                assert_eq!(
                    self.expect_response.remove(&key),
                    Some(head),
                    "Response event"
                );
            }
            RelayEvent::Readable { .. } | RelayEvent::Writable { .. } => {}
            RelayEvent::Refill { .. } => panic!("a refill without an overflow configured"),
            RelayEvent::Ended {
                reason,
                response_started,
                ..
            } => {
                assert!(k.ended.is_none(), "stream {key:?} ended twice");
                k.ended = Some(reason);
                assert_eq!(
                    self.expect_end.remove(&key),
                    Some((reason, response_started)),
                    "Ended event of {key:?}"
                );
            }
            other => panic!("an event this model does not know: {other:?}"),
        }
    }

    fn check(&mut self) {
        assert!(
            self.expect_end.is_empty(),
            "missing Ended: {:?}",
            self.expect_end
        );
        assert!(
            self.expect_response.is_empty(),
            "missing Response: {:?}",
            self.expect_response
        );
        let s = self.r.stats();
        let mut held = 0usize;
        let mut held_bytes = 0u64;
        let mut paused = false;
        let mut live = 0;
        let mut gone = Vec::new();
        for key in &self.active {
            let k = &self.keys[key];
            live += usize::from(k.live);
            if !k.held && !k.live {
                gone.push(*key);
            }
            let id = self.r.stream_id(*key);
            assert_eq!(
                id,
                (k.live && !k.orphaned).then_some(k.id),
                "stream_id of {key:?}"
            );
            if k.held {
                held += 1;
                held_bytes += k.body.bytes as u64;
                let chunks = k.body.held.len();
                assert!(
                    chunks <= self.cfg.max_unread_chunks(),
                    "{chunks} unread chunks held"
                );
                paused |= chunks >= self.cfg.max_unread_chunks();
            }
        }
        for key in gone {
            self.active.remove(&key);
        }
        assert_eq!(live, self.ids_live.len(), "ids in flight are unique");
        assert_eq!(self.r.open_streams(), held, "open_streams");
        assert!(
            held <= self.cfg.max_streams(),
            "more streams than max_streams"
        );
        assert_eq!(s.body_buffered_in, held_bytes, "unread bytes");
        paused |= held_bytes >= self.cfg.max_unread_bytes() as u64;
        assert_eq!(self.r.wants_read(), !self.closed && !paused, "wants_read");
        assert_eq!(s.streams_opened, self.opened);
        assert_eq!(s.streams_closed, self.ends);
        assert_eq!(s.protocol_errors, self.protocol_errors, "protocol errors");
        assert_eq!(s.streams_open, held as u64);
        assert_eq!(s.bytes_in, self.bytes_in);
        assert_eq!(s.bytes_out, self.bytes_out);
        assert!(s.body_queued_out <= self.cfg.max_queued().max(1) as u64);
        assert!(s.body_queued_out_max <= self.cfg.max_queued().max(1) as u64);
        if self.closed {
            assert_eq!(self.r.poll_timeout(), None);
        }
    }

    fn finish(mut self) {
        self.transmit(usize::MAX);
        self.after_step();
        if !self.closed {
            for (key, k) in &self.keys {
                if k.live {
                    assert!(k.out.is_empty(), "{key:?}: queued body not sent");
                    assert!(k.head_emitted, "{key:?}: request never sent");
                    assert_eq!(k.end_emitted, k.finished, "{key:?}: finish without end");
                }
                assert_eq!(
                    k.abort_expected, k.abort_emitted,
                    "{key:?}: abort never sent"
                );
            }
        }
        self.r.handle_lost();
        self.transmit(usize::MAX);
        self.after_step();
        assert!(self.r.poll_transmit().is_none());
        for (key, k) in &self.keys {
            assert!(
                k.ended.is_some() != k.aborted_live,
                "{key:?} must end exactly once: {:?}, aborted {}",
                k.ended,
                k.aborted_live
            );
        }
    }
}
