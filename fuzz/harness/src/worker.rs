//! The `worker_machine` target: a model of the worker's invariants.

use crate::prelude::*;

// The second half of the harness (the peer's frames, the checks after each
// step), in a file of its own beside this one.
#[path = "worker_checks.rs"]
mod checks;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resp {
    NotStarted,
    Started,
    Finished,
}

/// The application's view of one worker request.
#[derive(Debug)]
pub(crate) struct WKey {
    id: StreamId,
    ended: Option<WorkerEnd>,
    body: BodyModel,
    resp: Resp,
    head: Option<ResponseHead>,
    /// `fail` before the response: the worker answers 500 itself.
    fail_before: bool,
    /// `fail` (or a short Content-Length) after the response started.
    failed: bool,
    cl: Option<u64>,
    sent: u64,
    /// Response bytes taken by `send_body` and not on the wire yet; sealed
    /// once the response is finished (or failed). A failed request's whole
    /// 500 body.
    out: Expected,
    wire_opened: bool,
    /// The request is a HEAD.
    head_request: bool,
    /// The request's Content-Length and the body bytes received while read.
    req_cl: Option<u64>,
    received: u64,
    /// The response has no body (HEAD, 204, 304): body bytes are swallowed.
    bodiless: bool,
}

/// The body of the 500 the worker answers for a request that failed before
/// its response.
const ISE: &[u8] = b"Internal Server Error";

pub(crate) struct WorkerHarness {
    w: WorkerConnection,
    /// Where keys this connection never handed out come from.
    mint: KeyMint,
    cfg: WorkerConfig,
    now: Instant,
    seq: u32,
    // The relay's view: what it asked for on the wire.
    alive: BTreeSet<StreamId>,
    pending: BTreeMap<StreamId, u32>,
    tainted: BTreeSet<StreamId>,
    sent_heads: BTreeMap<StreamId, RequestHead>,
    just_requested: Option<StreamId>,
    /// The wire rules of what the worker emits, and the responses open on
    /// the wire (between their `response` and their `end`/`abort`), tagged
    /// with their requests (`None`: the worker's own 400/414/431/503).
    wire: WireCheck<Option<StreamKey>>,
    // The application's view.
    keys: BTreeMap<StreamKey, WKey>,
    live_by_id: BTreeMap<StreamId, StreamKey>,
    /// The requests not ended yet (what the checks after each step look at).
    live_keys: BTreeSet<StreamKey>,
    /// Ids the worker answers itself (400, 503) whose `end` has not gone out.
    refusals: BTreeSet<StreamId>,
    /// Ids whose request body broke its Content-Length: an `abort` is due.
    proto_aborts: BTreeSet<StreamId>,
    protocol_errors: u64,
    expect_end: BTreeMap<StreamKey, WorkerEnd>,
    closed: bool,
    /// When the machine closed (its close deadline runs from then).
    closed_at: Option<Instant>,
    expect_close: Option<u16>,
    last_ping: Option<Bytes>,
    bytes_in: u64,
    bytes_out: u64,
    requests_seen: u64,
    ended_seen: u64,
}

/// Drives a [`WorkerConnection`] with an arbitrary sequence of operations —
/// messages from the relay (mostly well-formed frames, some garbage, pings,
/// pongs, closes, oversized messages), application commands (`respond`,
/// `send_body`, `finish`, `fail`, `read_body`, `discard_body`, `close`),
/// connection loss, virtual time moving forward and partial drains of
/// `poll_transmit` — and checks after every step:
///
/// - every emitted message is at most 1 MiB + 4 bytes and a valid frame the
///   worker may send (never a `request` or a pong), nothing after a close;
/// - a `response` only for a request the relay sent and has not aborted, at
///   most one per request; no chunk, `end` or `abort` for a stream after its
///   `end`/`abort` (the worker's or the relay's); chunk bytes are exactly
///   what the application queued, in order; `end` carries exactly the
///   Content-Length; the 500/400/503 answers are well-formed;
/// - unread chunks per request ≤ `max_unread_chunks` (≤ 16), unread bytes as
///   `stats()` reports them, refusals (400/503) waiting to go out ≤
///   [`MAX_PENDING_REFUSALS`]; `wants_read()` exactly when no bound is
///   reached, `ReadPaused` exactly when `wants_read()` was false;
/// - `read_body` returns exactly the bytes the relay sent, then the right end;
/// - command results follow the documented rules; `send_body` takes
///   `min(len, send_capacity)`; queued output within its bounds;
/// - events: a `Request` per request accepted with its head unchanged, fresh
///   keys, and `Ended` exactly once per request with the right reason.
///
/// At the end the connection is lost and every request must have ended.
pub fn worker_machine(data: &[u8]) {
    let mut c = Cursor::new(data);
    let mut h = WorkerHarness::new(&mut c);
    let mut steps = 0;
    while !c.is_empty() && steps < MAX_STEPS {
        h.step(&mut c);
        steps += 1;
    }
    h.finish();
}

impl WorkerHarness {
    fn new(c: &mut Cursor<'_>) -> WorkerHarness {
        let f = c.u8();
        let mut b = WorkerConfig::builder();
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
            b = b.keepalive(gen_keepalive(c, WorkerConfig::default().keepalive()));
        }
        let cfg = b.build().expect("generated configs are valid");
        let now = base_instant();
        let mut w = WorkerConnection::new(cfg.clone());
        w.handle_timeout(now);
        let wire = WireCheck::new(Side::Worker, cfg.chunk_size().clamp(1, MAX_CHUNK_BODY))
            .pings(cfg.keepalive().is_some());
        WorkerHarness {
            w,
            mint: KeyMint::default(),
            cfg,
            now,
            seq: 0,
            alive: BTreeSet::new(),
            pending: BTreeMap::new(),
            tainted: BTreeSet::new(),
            sent_heads: BTreeMap::new(),
            just_requested: None,
            wire,
            keys: BTreeMap::new(),
            live_by_id: BTreeMap::new(),
            live_keys: BTreeSet::new(),
            refusals: BTreeSet::new(),
            proto_aborts: BTreeSet::new(),
            protocol_errors: 0,
            expect_end: BTreeMap::new(),
            closed: false,
            closed_at: None,
            expect_close: None,
            last_ping: None,
            bytes_in: 0,
            bytes_out: 0,
            requests_seen: 0,
            ended_seen: 0,
        }
    }

    fn alive_ids(&self) -> Vec<StreamId> {
        self.alive.iter().copied().collect()
    }

    /// A key for a command: mostly a live one, sometimes any issued one,
    /// rarely one never issued.
    fn pick_key(&mut self, c: &mut Cursor<'_>) -> StreamKey {
        let b = c.u8();
        let live = &self.live_keys;
        if b < 200 && !live.is_empty() {
            return *live
                .iter()
                .nth(usize::from(b) % live.len())
                .expect("in range");
        }
        if b < 250 && !self.keys.is_empty() {
            let i = usize::from(c.u8()) % self.keys.len();
            return *self.keys.keys().nth(i).expect("in range");
        }
        let next = self.keys.keys().next_back().map_or(1, |k| k.get() + 1);
        let at_least = next + u64::from(c.u8());
        self.mint.key(at_least)
    }

    fn is_unknown(&self, key: StreamKey) -> bool {
        !self.keys.contains_key(&key)
    }

    /// The result of a command on a key the application never saw: refused,
    /// or (for a key the worker used for its own answers) swallowed.
    fn check_unknown<T: PartialEq + std::fmt::Debug, E: PartialEq + std::fmt::Debug>(
        key: StreamKey,
        got: &Result<T, E>,
        swallowed: T,
        unknown: E,
    ) {
        let refused = got == &Err(unknown);
        assert!(
            refused || (key.get() != 0 && got == &Ok(swallowed)),
            "command on unknown key {key:?}: {got:?}"
        );
    }

    fn step(&mut self, c: &mut Cursor<'_>) {
        self.just_requested = None;
        match c.u8() % 24 {
            // ----- the relay's frames
            0..=2 => {
                let id = self.fresh_id(c);
                let head = gen_request_head(c);
                self.feed(ControlFrame::Request { id, head }.to_message());
            }
            3..=5 => {
                let id = gen_id(c, &self.alive_ids());
                let body = gen_body(c, &mut self.seq);
                self.feed(Message::Binary(frame::encode_chunk(id, &body)));
            }
            6 => {
                let id = gen_id(c, &self.alive_ids());
                self.feed(ControlFrame::End { id }.to_message());
            }
            7 => {
                let id = gen_id(c, &self.alive_ids());
                self.feed(ControlFrame::Abort { id }.to_message());
            }
            8 => {
                let id = gen_id(c, &self.alive_ids());
                let msg = match c.u8() % 3 {
                    0 => ControlFrame::Response {
                        id,
                        head: gen_response_head(c),
                    }
                    .to_message(),
                    1 => {
                        // A second request for a stream in flight (a relay bug).
                        ControlFrame::Request {
                            id,
                            head: gen_request_head(c),
                        }
                        .to_message()
                    }
                    _ => gen_misc_message(c, id, self.last_ping.as_ref()),
                };
                self.feed(msg);
            }
            // ----- the application
            9 | 10 => {
                let key = self.pick_key(c);
                let head = gen_response_head(c);
                self.respond(key, head);
            }
            11..=13 => {
                let key = self.pick_key(c);
                let data = gen_body(c, &mut self.seq);
                self.send_body(key, data);
            }
            14 => {
                let key = self.pick_key(c);
                self.finish_cmd(key);
            }
            15 => {
                let key = self.pick_key(c);
                self.fail(key);
            }
            16 | 17 => {
                let key = self.pick_key(c);
                for _ in 0..1 + c.u8() % 20 {
                    self.read(key);
                }
            }
            18 => {
                let key = self.pick_key(c);
                self.w.discard_body(key);
                trace!("worker app: discard_body({key:?})");
                if let Some(k) = self.keys.get_mut(&key).filter(|k| k.ended.is_none()) {
                    k.body.discard();
                }
            }
            19 => match c.u8() % 8 {
                0 => {
                    let code = c.pick(APP_CLOSE_CODES);
                    self.w.close(CloseCode(code), "app closes");
                    trace!("worker app: close({code})");
                    if !self.closed {
                        self.expect_close = Some(code);
                    }
                }
                1 => {
                    trace!("worker: handle_lost");
                    self.w.handle_lost();
                }
                _ => self.advance(c),
            },
            20 => self.advance(c),
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

    /// An id for a new request: one not in flight (as a relay picks), rarely
    /// any id.
    fn fresh_id(&self, c: &mut Cursor<'_>) -> StreamId {
        let b = c.u8();
        if b >= 240 {
            return StreamId::new(c.u32()).unwrap_or(StreamId::MAX);
        }
        let mut id = StreamId::new(1 + u32::from(b % 8)).expect("nonzero");
        for _ in 0..64 {
            if !self.alive.contains(&id) && !self.tainted.contains(&id) {
                break;
            }
            id = id.next_wrapping();
        }
        id
    }

    /// The close deadline the machine runs once closed.
    fn close_deadline(&self) -> Option<Instant> {
        self.closed_at?.checked_add(self.cfg.close_timeout())
    }

    fn advance(&mut self, c: &mut Cursor<'_>) {
        let d = gen_duration(c);
        if c.u8() % 4 == 0 {
            if let Some(t) = self.w.poll_timeout() {
                self.now = self.now.max(t);
            }
        }
        self.now = self.now.checked_add(d).unwrap_or(self.now);
        let was_closed = self.w.is_closed();
        trace!("worker: handle_timeout(+{:?})", self.now - base_instant());
        self.w.handle_timeout(self.now);
        // Past the close deadline, the transport is to be dropped.
        if let Some(d) = self.close_deadline() {
            assert_eq!(self.w.close_timed_out(), d <= self.now, "close deadline");
        }
        let t = self.w.poll_timeout();
        if let Some(t) = t {
            assert!(
                t > self.now,
                "timer at {t:?} not after now after handle_timeout"
            );
        }
        // Extra calls are harmless.
        self.w.handle_timeout(self.now);
        assert_eq!(self.w.poll_timeout(), t);
        if !was_closed && self.w.is_closed() {
            assert!(
                self.cfg.keepalive().is_some(),
                "closed on a timeout without keepalive"
            );
            self.expect_close = Some(1011);
        }
    }

    fn respond(&mut self, key: StreamKey, head: ResponseHead) {
        let r = self.w.respond(key, head.clone());
        trace!("worker app: respond({key:?}, {}) = {r:?}", head.status());
        if self.is_unknown(key) {
            return Self::check_unknown(key, &r, (), RespondError::UnknownStream);
        }
        let k = self.keys.get_mut(&key).expect("known");
        if k.ended.is_some() {
            assert_eq!(r, Ok(()), "commands on an ended request are swallowed");
            return;
        }
        if k.resp != Resp::NotStarted {
            assert_eq!(r, Err(RespondError::AlreadyResponded));
            return;
        }
        let status = head.status();
        if !(200..=599).contains(&status) {
            assert_eq!(r, Err(RespondError::InvalidHead(FrameError::InvalidStatus)));
            return;
        }
        match head.headers().content_length() {
            Err(_) => assert_eq!(r, Err(RespondError::InvalidContentLength)),
            Ok(cl) => {
                assert_eq!(r, Ok(()));
                k.resp = Resp::Started;
                k.bodiless = k.head_request || status == 204 || status == 304;
                k.cl = if k.bodiless { None } else { cl };
                k.head = Some(head);
            }
        }
    }

    fn send_body(&mut self, key: StreamKey, data: Bytes) {
        let cap = self.w.send_capacity(key);
        assert!(cap <= self.cfg.max_queued_per_stream().max(1));
        assert!(cap <= self.cfg.max_queued().max(1));
        let len = data.len();
        let r = self.w.send_body(key, data.clone());
        trace!("worker app: send_body({key:?}, {len} bytes) = {r:?} (capacity {cap})");
        if self.is_unknown(key) {
            return Self::check_unknown(key, &r, len, WriteError::UnknownStream);
        }
        let k = self.keys.get_mut(&key).expect("known");
        if k.ended.is_some() {
            assert_eq!(r, Ok(len));
            return;
        }
        match k.resp {
            Resp::NotStarted => assert_eq!(r, Err(WriteError::NotResponded)),
            Resp::Finished => assert_eq!(r, Err(WriteError::AlreadyFinished)),
            Resp::Started if k.bodiless => assert_eq!(r, Ok(len), "a bodiless body is swallowed"),
            Resp::Started => match k.cl {
                Some(limit) if k.sent + len as u64 > limit => {
                    assert_eq!(r, Err(WriteError::ContentLengthExceeded { limit }))
                }
                _ => {
                    let n = r.expect("send_body on a started response");
                    assert_eq!(
                        n,
                        len.min(cap),
                        "send_body took {n} of {len}, capacity {cap}"
                    );
                    k.sent += n as u64;
                    if n > 0 {
                        k.out.push(data.slice(..n));
                    }
                }
            },
        }
    }

    fn finish_cmd(&mut self, key: StreamKey) {
        let r = self.w.finish(key);
        trace!("worker app: finish({key:?}) = {r:?}");
        if self.is_unknown(key) {
            return Self::check_unknown(key, &r, (), FinishError::UnknownStream);
        }
        let k = self.keys.get_mut(&key).expect("known");
        if k.ended.is_some() {
            assert_eq!(r, Ok(()));
            return;
        }
        match k.resp {
            Resp::NotStarted => assert_eq!(r, Err(FinishError::NotResponded)),
            Resp::Finished => assert_eq!(r, Err(FinishError::AlreadyFinished)),
            Resp::Started => {
                match k.cl.filter(|&cl| k.sent < cl) {
                    Some(expected) => {
                        assert_eq!(
                            r,
                            Err(FinishError::ContentLengthShort {
                                expected,
                                sent: k.sent
                            })
                        );
                        k.failed = true;
                    }
                    None => assert_eq!(r, Ok(())),
                }
                k.resp = Resp::Finished;
                k.out.seal();
                k.body.discard();
            }
        }
    }

    fn fail(&mut self, key: StreamKey) {
        let r = self.w.fail(key);
        trace!("worker app: fail({key:?}) = {r:?}");
        if self.is_unknown(key) {
            return Self::check_unknown(key, &r, (), UnknownStream);
        }
        assert_eq!(r, Ok(()));
        let k = self.keys.get_mut(&key).expect("known");
        if k.ended.is_some() {
            return;
        }
        match k.resp {
            Resp::Finished => {}
            Resp::NotStarted => {
                k.resp = Resp::Finished;
                k.fail_before = true;
                k.out = Expected::whole(Bytes::from_static(ISE));
                k.body.discard();
            }
            Resp::Started => {
                k.resp = Resp::Finished;
                k.failed = true;
                k.out.seal();
                k.body.discard();
            }
        }
    }

    fn read(&mut self, key: StreamKey) {
        let got = self.w.read_body(key);
        trace!("worker app: read_body({key:?}) = {}", short_read(&got));
        match self.keys.get_mut(&key) {
            Some(k) if k.ended.is_none() => k.body.read(&got, "worker"),
            _ => assert_eq!(got, BodyRead::Gone, "read_body of a request not open"),
        }
    }
}
