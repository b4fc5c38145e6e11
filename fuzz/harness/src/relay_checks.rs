//! The `relay_machine` target, continued: what the relay does on its own
//! (the worker's frames, its deadlines) and the checks of everything it
//! emits and reports, after every step.

use super::*;

impl RelayHarness {
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
    pub(super) fn run_deadlines(&mut self) {
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
            k.out.drop_queued();
            if !k.head_emitted {
                k.head_dropped = true;
            }
            self.ids_live.remove(&k.id);
            if send_abort {
                k.abort_expected = true;
            } else {
                self.wire.release_for(k.id, &key);
            }
            self.ends += 1;
            return;
        }
        k.live = false;
        k.writing = false;
        k.out.drop_queued();
        self.ids_live.remove(&k.id);
        if !k.head_emitted {
            k.head_dropped = true;
        }
        if send_abort {
            k.abort_expected = true;
        } else {
            self.wire.release_for(k.id, &key);
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

    pub(super) fn feed(&mut self, msg: Message) {
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
                    self.on_response_fed(key, head);
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
                    self.on_chunk_fed(key, data);
                }
            }
            Class::Request(..) | Class::Other => {}
        }
    }

    /// The worker's `response` for the stream `key` in flight: it starts
    /// the response, or (a second one, a bad status or Content-Length) is a
    /// protocol error.
    fn on_response_fed(&mut self, key: StreamKey, head: ResponseHead) {
        let k = self.keys.get_mut(&key).expect("live");
        let status = head.status();
        match head.headers().content_length() {
            Ok(cl) if !k.started && (200..=599).contains(&status) => {
                k.started = true;
                k.bodiless = k.head.method() == "HEAD" || status == 204 || status == 304;
                k.response_length = cl.filter(|_| !k.bodiless);
                self.expect_response.insert(key, head);
            }
            _ => self.end_on_wire(key, RelayEnd::ProtocolError, true),
        }
    }

    /// A chunk of the worker's for the stream `key` in flight: body for the
    /// caller (swallowed for a bodiless response), or a protocol error
    /// (before the response, or past its Content-Length).
    fn on_chunk_fed(&mut self, key: StreamKey, data: Bytes) {
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

    pub(super) fn transmit(&mut self, n: usize) {
        for _ in 0..n {
            let Some(m) = self.r.poll_transmit() else {
                return;
            };
            self.on_emit(m);
        }
    }

    /// Checks one message the relay emitted: the wire rules in
    /// [`WireCheck`], then what is this model's own.
    fn on_emit(&mut self, m: Message) {
        trace!("relay emits {}", short(&m));
        let seen = self.wire.observe(&m);
        if let Seen::Close { code, .. } = seen {
            assert!(self.r.is_closed(), "close emitted by an open relay");
            assert_eq!(Some(code), self.expect_close, "relay closed with {code}");
            return;
        }
        assert!(!self.r.is_closed(), "relay emitted {m:?} while closed");
        self.bytes_out += m.len() as u64;
        match seen {
            Seen::Ping(p) => self.last_ping = Some(p),
            Seen::Request { id, head } => self.on_request_emitted(id, head),
            Seen::Chunk { data, tag, .. } => {
                let k = self.keys.get_mut(&tag).expect("on the wire");
                assert!(k.live, "chunk for a stream that has ended");
                k.out.take(
                    &data,
                    format_args!("relay: request body of {tag:?} on the wire"),
                );
            }
            Seen::End { tag, .. } => {
                let k = self.keys.get_mut(&tag).expect("on the wire");
                assert!(k.live, "end for a stream that has ended");
                k.out
                    .assert_complete(format_args!("relay: request body of {tag:?} on the wire"));
                k.end_emitted = true;
            }
            Seen::Abort { id, tag } => {
                let key = self
                    .keys
                    .iter()
                    .find(|(_, k)| k.id == id && k.abort_expected && !k.abort_emitted)
                    .map(|(key, _)| *key)
                    .unwrap_or_else(|| panic!("relay abort for id {id} nobody asked for"));
                if let Some(owner) = tag {
                    assert_eq!(owner, key, "abort for id {id} now owned by another stream");
                }
                self.keys.get_mut(&key).expect("found").abort_emitted = true;
            }
            other => panic!("relay emitted {other:?}"),
        }
    }

    /// A `request` head went out under `id`: it is the head of the one
    /// stream holding that id whose head has not gone out, as its caller
    /// gave it minus hop-by-hop headers.
    fn on_request_emitted(&mut self, id: StreamId, head: RequestHead) {
        let cands: Vec<StreamKey> = self
            .keys
            .iter()
            .filter(|(_, k)| k.id == id && !k.head_emitted && !k.head_dropped)
            .map(|(key, _)| *key)
            .collect();
        assert_eq!(cands.len(), 1, "request for id {id}: streams {cands:?}");
        let key = cands[0];
        let k = self.keys.get_mut(&key).expect("candidate");
        assert!(k.live, "request of a stream that has ended");
        assert_eq!(head, k.head, "request head");
        for (n, _) in head.headers().iter() {
            let hop = HOP_BY_HOP_NAMES.iter().any(|h| h.eq_ignore_ascii_case(n))
                || n.len() >= 6 && n[..6].eq_ignore_ascii_case("proxy-");
            assert!(!hop, "hop-by-hop header {n} forwarded");
        }
        k.head_emitted = true;
        self.wire.open(id, key, BodyKind::Streamed);
    }

    pub(super) fn after_step(&mut self) {
        if self.r.is_closed() && !self.closed {
            self.closed = true;
            self.closed_at = Some(self.now);
            let live: Vec<StreamKey> = self.ids_live.values().copied().collect();
            for key in live {
                // A stream whose request never went out ends `Unsent`: the
                // worker never saw it.
                let reason = if self.keys[&key].head_emitted {
                    RelayEnd::ConnectionLost
                } else {
                    RelayEnd::Unsent
                };
                self.end_on_wire(key, reason, false);
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
            // Closed, the only timer left is the close deadline,
            // until it has passed.
            let deadline = self.close_deadline().filter(|_| !self.r.close_timed_out());
            assert_eq!(self.r.poll_timeout(), deadline);
        }
    }

    pub(super) fn finish(mut self) {
        self.transmit(usize::MAX);
        self.after_step();
        if !self.closed {
            for (key, k) in &self.keys {
                if k.live {
                    assert!(k.out.is_empty(), "{key:?}: queued body not sent");
                    assert!(k.head_emitted, "{key:?}: request never sent");
                    assert_eq!(
                        k.end_emitted,
                        k.out.is_sealed(),
                        "{key:?}: finish without end"
                    );
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
