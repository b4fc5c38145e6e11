//! The `relay_machine` target: a model of the relay's invariants.

use crate::prelude::*;

// The second half of the harness (the peer's frames, the checks after each
// step), in a file of its own beside this one.
#[path = "relay_checks.rs"]
mod checks;

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
    sent: u64,
    /// The body the caller queued and the wire has not carried yet; sealed
    /// by the caller's `finish`.
    out: Expected,
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
    /// The wire rules of what the relay emits, and the ids whose `request`
    /// is on the wire and whose stream has not ended on the wire (tagged
    /// with their streams).
    wire: WireCheck<StreamKey>,
    expect_end: BTreeMap<StreamKey, (RelayEnd, bool)>,
    expect_response: BTreeMap<StreamKey, ResponseHead>,
    closed: bool,
    /// When the machine closed (its close deadline runs from then).
    closed_at: Option<Instant>,
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

/// The spec's hop-by-hop headers, restated here on purpose: the oracle
/// reads the spec itself rather than trusting the crate's own list.
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
        let wire = WireCheck::new(Side::Relay, cfg.chunk_size().clamp(1, MAX_CHUNK_BODY))
            .pings(cfg.keepalive().is_some());
        RelayHarness {
            r,
            mint: KeyMint::default(),
            cfg,
            now,
            seq: 0,
            keys: BTreeMap::new(),
            active: BTreeSet::new(),
            ids_live: BTreeMap::new(),
            wire,
            expect_end: BTreeMap::new(),
            expect_response: BTreeMap::new(),
            closed: false,
            closed_at: None,
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

    fn wire_ids(&self) -> Vec<StreamId> {
        self.wire.ids()
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

    /// The close deadline the machine runs once closed.
    fn close_deadline(&self) -> Option<Instant> {
        self.closed_at?.checked_add(self.cfg.close_timeout())
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
        // Past the close deadline, the transport is to be dropped.
        if let Some(d) = self.close_deadline() {
            assert_eq!(self.r.close_timed_out(), d <= self.now, "close deadline");
        }
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
                sent: 0,
                out: Expected::new(),
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
            k.out.push(data.slice(..n));
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
                k.out.seal();
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
            k.out.drop_queued();
            self.ids_live.remove(&k.id);
            if k.head_emitted {
                k.abort_expected = true;
            } else {
                k.head_dropped = true;
            }
            self.ends += 1;
        }
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
}
