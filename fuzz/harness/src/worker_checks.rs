//! The `worker_machine` target, continued: the relay's frames reaching the
//! worker, and the checks of everything the worker emits and reports, after
//! every step.

use super::*;

impl WorkerHarness {
    /// Feeds one message from the relay and updates the relay's view.
    pub(super) fn feed(&mut self, msg: Message) {
        let was_closed = self.w.is_closed();
        let wants = self.w.wants_read();
        let is_data = msg.is_data();
        let len = msg.len() as u64;
        let class = classify(&msg, true, &self.cfg.head_limits());
        trace!("relay -> worker: {} = {class:?}", short(&msg));
        let fed = msg.clone();
        let r = self.w.handle_message(msg, self.now);
        if was_closed {
            assert_eq!(r, Ok(()), "a closed worker ignores input");
            return;
        }
        if is_data && !wants {
            assert!(
                matches!(&r, Err(HandleError::ReadPaused(m)) if m == &fed),
                "a paused worker hands the message back: {r:?}"
            );
            return;
        }
        assert_eq!(
            r,
            Ok(()),
            "handle_message refused a message while wants_read"
        );
        if is_data {
            self.bytes_in += len;
        }
        match class {
            Class::TooLarge => {
                assert!(self.w.is_closed(), "an oversized message must close");
                self.expect_close = Some(1009);
            }
            Class::Close => assert!(self.w.is_closed(), "a close must close"),
            Class::Request(id, head) => self.on_request_fed(id, head),
            Class::End(id) => {
                if let Some(&key) = self.live_by_id.get(&id) {
                    let k = self.keys.get_mut(&key).expect("live key");
                    let short = k.req_cl.is_some_and(|cl| k.received < cl);
                    if k.body.state == BState::Open && short {
                        self.protocol_error(key);
                    } else {
                        k.body.end();
                    }
                }
            }
            Class::Abort(id) => {
                // The relay's stream is over: nothing more may go out for it,
                // not even the worker's own 400/503 answer or `abort`.
                self.refusals.remove(&id);
                self.proto_aborts.remove(&id);
                self.alive.remove(&id);
                self.pending.remove(&id);
                self.wire.release(id);
                self.sent_heads.remove(&id);
                if let Some(&k) = self.live_by_id.get(&id) {
                    self.keys.get_mut(&k).expect("live key").body.fail();
                    self.expect_end.insert(k, WorkerEnd::ClientAborted);
                }
            }
            Class::Chunk(id, data) => {
                if let Some(&key) = self.live_by_id.get(&id) {
                    let k = self.keys.get_mut(&key).expect("live key");
                    if k.body.state == BState::Open {
                        k.received += data.len() as u64;
                        if k.req_cl.is_some_and(|cl| k.received > cl) {
                            self.protocol_error(key);
                            return;
                        }
                    }
                    k.body.push(data);
                }
            }
            Class::Response(..) | Class::BadResponse(_) | Class::Other => {}
        }
    }

    /// A `request` (or one the worker answers 400/414/431 itself) reached
    /// the worker: the relay's view of what it asked for.
    fn on_request_fed(&mut self, id: StreamId, head: Result<RequestHead, u16>) {
        let live = self.live_keys.len();
        let refused = match &head {
            Err(_) => true,
            Ok(h) => {
                let limit = if is_control_route(h) {
                    self.cfg.max_streams()
                } else {
                    (self.cfg.max_streams())
                        .saturating_sub(self.cfg.reserved_streams())
                        .max(1)
                };
                h.headers().content_length().is_err() || live >= limit
            }
        };
        if !self.live_by_id.contains_key(&id)
            && !self.refusals.contains(&id)
            && !self.proto_aborts.contains(&id)
            && refused
        {
            // Answered by the worker itself: 400, 431, 414 or 503.
            self.refusals.insert(id);
        }
        if self.alive.contains(&id) || self.tainted.contains(&id) {
            // The relay reused an id in flight: no promise holds for it.
            self.tainted.insert(id);
            self.wire.exempt(id);
        } else {
            self.alive.insert(id);
            *self.pending.entry(id).or_default() += 1;
            if let Ok(head) = head {
                self.sent_heads.insert(id, head);
            }
        }
        self.just_requested = Some(id);
    }

    /// The model of the worker failing a request whose body broke its
    /// Content-Length: body gone, queued response dropped, `abort` due.
    fn protocol_error(&mut self, key: StreamKey) {
        let k = self.keys.get_mut(&key).expect("live key");
        k.body.fail();
        k.out.drop_queued();
        self.proto_aborts.insert(k.id);
        self.protocol_errors += 1;
        self.expect_end.insert(key, WorkerEnd::ProtocolError);
    }

    pub(super) fn transmit(&mut self, n: usize) {
        for _ in 0..n {
            let Some(m) = self.w.poll_transmit() else {
                return;
            };
            self.on_emit(m);
        }
    }

    /// Checks one message the worker emitted: the wire rules in
    /// [`WireCheck`], then what is this model's own.
    fn on_emit(&mut self, m: Message) {
        trace!("worker emits {}", short(&m));
        let seen = self.wire.observe(&m);
        if let Seen::Close { code, .. } = seen {
            assert!(self.w.is_closed(), "close emitted by an open worker");
            assert_eq!(Some(code), self.expect_close, "worker closed with {code}");
            return;
        }
        assert!(!self.w.is_closed(), "worker emitted {m:?} while closed");
        self.bytes_out += m.len() as u64;
        match seen {
            Seen::Ping(p) => self.last_ping = Some(p),
            Seen::Response { id, head } => self.on_response_emitted(id, head),
            Seen::Chunk {
                data,
                tag: Some(key),
                ..
            } => {
                let k = self.keys.get_mut(&key).expect("owner");
                if k.fail_before {
                    assert_eq!(&data[..], ISE, "the 500 body goes out in one piece");
                }
                let what = format_args!("worker: response body of {key:?} on the wire");
                k.out.take(&data, what);
            }
            // The body of the worker's own refusal: its Content-Length holds.
            Seen::Chunk { tag: None, .. } => {}
            Seen::End { id, tag } => self.on_end_emitted(id, tag),
            Seen::Abort { id, tag } => self.on_abort_emitted(id, tag),
            // An id the relay reused while in flight: no promise holds for
            // it, but an `end` completes its refusal (if any), and an
            // `abort` its protocol error.
            Seen::Exempt(Decoded::Control(ControlFrame::End { id })) => {
                self.refusals.remove(&id);
            }
            Seen::Exempt(Decoded::Control(ControlFrame::Abort { id })) => {
                self.proto_aborts.remove(&id);
            }
            Seen::Exempt(_) => {}
            other => panic!("worker emitted {other:?}"),
        }
    }

    /// A `response` went out for `id`: only for a request the relay sent and
    /// has not aborted, at most one per request; the app's head unchanged,
    /// or the worker's own well-formed answer.
    fn on_response_emitted(&mut self, id: StreamId, head: ResponseHead) {
        let p = self.pending.entry(id).or_default();
        assert!(
            *p > 0,
            "response for id {id}, which the relay did not request or has aborted"
        );
        *p -= 1;
        let owner = self.live_by_id.get(&id).copied().filter(|k| {
            let k = &self.keys[k];
            k.resp != Resp::NotStarted && !k.wire_opened
        });
        let kind = match owner {
            Some(key) => {
                let k = self.keys.get_mut(&key).expect("live");
                k.wire_opened = true;
                if k.fail_before {
                    assert_eq!(head.status(), 500, "a failed request answers 500");
                    BodyKind::Answer
                } else {
                    assert_eq!(Some(&head), k.head.as_ref(), "response head changed");
                    if k.bodiless {
                        BodyKind::Empty
                    } else {
                        BodyKind::Streamed
                    }
                }
            }
            None => {
                let s = head.status();
                assert!(
                    [400, 414, 431, 503].contains(&s),
                    "response {s} for id {id} nobody gave"
                );
                if s == 503 {
                    assert_eq!(head.headers().get("retry-after"), Some("1"));
                }
                BodyKind::Answer
            }
        };
        self.wire.open(id, owner, kind);
    }

    /// The worker's `end` for `id` (its response complete by its
    /// Content-Length, as the [`WireCheck`] saw): of a refusal pending, or of
    /// a response the app finished, with every byte the app queued.
    fn on_end_emitted(&mut self, id: StreamId, owner: Option<StreamKey>) {
        // An id has a stream or a pending refusal, never both: this `end`
        // completes the refusal if there is one.
        let refusal = self.refusals.remove(&id);
        assert_eq!(refusal, owner.is_none(), "end of a refusal not pending");
        self.alive.remove(&id);
        self.sent_heads.remove(&id);
        if let Some(key) = owner {
            let k = &self.keys[&key];
            assert_eq!(k.resp, Resp::Finished, "end before the app finished");
            assert!(!k.failed, "end for a failed response");
            k.out
                .assert_complete(format_args!("worker: response body of {key:?}"));
            self.expect_end.insert(key, WorkerEnd::Completed);
        }
    }

    /// The worker's `abort` for `id`: of a request whose body broke its
    /// Content-Length (response or not), or of a response the app failed.
    fn on_abort_emitted(&mut self, id: StreamId, owner: Option<Option<StreamKey>>) {
        let proto = self.proto_aborts.remove(&id);
        if proto {
            // The relay broke the body's Content-Length: the stream is over,
            // response or not.
            self.alive.remove(&id);
            self.pending.remove(&id);
            self.sent_heads.remove(&id);
            return;
        }
        let owner = owner.unwrap_or_else(|| {
            panic!("worker abort for id {id}, not open (after its end or abort?)")
        });
        self.alive.remove(&id);
        self.sent_heads.remove(&id);
        let key = owner.expect("the worker aborts only its own responses");
        assert!(
            self.keys[&key].failed,
            "abort for a response that did not fail"
        );
        self.expect_end.insert(key, WorkerEnd::Failed);
    }

    pub(super) fn after_step(&mut self) {
        if self.w.is_closed() && !self.closed {
            self.closed = true;
            self.closed_at = Some(self.now);
            self.refusals.clear();
            self.proto_aborts.clear();
            for key in &self.live_keys {
                self.expect_end.insert(*key, WorkerEnd::ConnectionLost);
            }
        }
        while let Some(e) = self.w.poll_event() {
            self.on_event(e);
        }
        self.check();
    }

    fn on_event(&mut self, e: WorkerEvent) {
        trace!("worker event {e:?}");
        match e {
            WorkerEvent::Request { key, id, head } => {
                assert!(!self.keys.contains_key(&key), "key {key:?} reused");
                assert!(
                    self.keys.keys().next_back().map_or(true, |k| *k < key),
                    "keys must increase"
                );
                assert_eq!(
                    Some(id),
                    self.just_requested,
                    "Request event without a request"
                );
                if !self.tainted.contains(&id) {
                    assert_eq!(
                        self.sent_heads.get(&id),
                        Some(&head),
                        "the request head changed on its way"
                    );
                }
                assert!(
                    self.live_by_id.insert(id, key).is_none(),
                    "two requests open under id {id}"
                );
                self.requests_seen += 1;
                self.live_keys.insert(key);
                self.keys.insert(
                    key,
                    WKey {
                        id,
                        ended: None,
                        body: BodyModel::new(),
                        resp: Resp::NotStarted,
                        head: None,
                        fail_before: false,
                        failed: false,
                        cl: None,
                        sent: 0,
                        out: Expected::new(),
                        wire_opened: false,
                        head_request: head.method() == "HEAD",
                        req_cl: head.headers().content_length().expect("accepted requests"),
                        received: 0,
                        bodiless: false,
                    },
                );
            }
            WorkerEvent::Readable { key } | WorkerEvent::Writable { key } => {
                let k = self.keys.get(&key).expect("event for an unknown key");
                assert!(k.ended.is_none(), "{e:?} after Ended");
            }
            WorkerEvent::Ended { key, reason } => {
                let k = self.keys.get_mut(&key).expect("Ended for an unknown key");
                assert!(k.ended.is_none(), "request ended twice");
                k.ended = Some(reason);
                k.body.clear();
                self.live_keys.remove(&key);
                let id = k.id;
                self.ended_seen += 1;
                let want = self.expect_end.remove(&key);
                if !self.tainted.contains(&id) {
                    assert_eq!(want, Some(reason), "request {key:?} (id {id}) ended");
                }
                if self.live_by_id.get(&id) == Some(&key) {
                    self.live_by_id.remove(&id);
                }
            }
            other => panic!("an event this model does not know: {other:?}"),
        }
    }

    fn check(&mut self) {
        // Ends of requests under a reused id are not predicted exactly.
        let (tainted, keys) = (&self.tainted, &self.keys);
        self.expect_end
            .retain(|k, _| !tainted.contains(&keys[k].id));
        assert!(
            self.expect_end.is_empty(),
            "missing Ended: {:?}",
            self.expect_end
        );
        let s = self.w.stats();
        let mut held_bytes = 0u64;
        let mut live = 0u64;
        let mut paused = false;
        for k in self.live_keys.iter().map(|key| &self.keys[key]) {
            live += 1;
            held_bytes += k.body.bytes as u64;
            let chunks = k.body.held.len();
            assert!(
                chunks <= self.cfg.max_unread_chunks() && chunks <= 16,
                "{chunks} unread chunks held (bound {})",
                self.cfg.max_unread_chunks()
            );
            paused |= chunks >= self.cfg.max_unread_chunks();
        }
        assert_eq!(s.body_buffered_in, held_bytes, "unread bytes");
        assert!(s.body_buffered_in < (self.cfg.max_unread_bytes() + MAX_CHUNK_BODY) as u64);
        paused |= held_bytes >= self.cfg.max_unread_bytes() as u64;
        let pending = self.refusals.len() + self.proto_aborts.len();
        paused |= pending >= MAX_PENDING_REFUSALS;
        assert!(pending <= MAX_PENDING_REFUSALS, "refusals pile up");
        assert_eq!(self.w.wants_read(), !self.closed && !paused, "wants_read");
        assert_eq!(s.streams_open, live, "streams open");
        assert_eq!(s.streams_opened, self.requests_seen);
        assert_eq!(s.streams_closed, self.ended_seen);
        assert_eq!(s.protocol_errors, self.protocol_errors, "protocol errors");
        assert_eq!(s.bytes_in, self.bytes_in);
        assert_eq!(s.bytes_out, self.bytes_out);
        assert!(s.body_queued_out <= self.cfg.max_queued().max(1) as u64);
        assert!(s.body_queued_out_max <= self.cfg.max_queued().max(1) as u64);
        assert!(s.body_buffered_in_max >= s.body_buffered_in);
        if self.closed {
            assert_eq!(live, 0);
            // Closed, the only timer left is the close deadline,
            // until it has passed.
            let deadline = self.close_deadline().filter(|_| !self.w.close_timed_out());
            assert_eq!(self.w.poll_timeout(), deadline);
        }
    }

    pub(super) fn finish(mut self) {
        // The socket takes everything: every finished or failed response
        // goes out completely.
        self.transmit(usize::MAX);
        self.after_step();
        if !self.closed {
            for (key, k) in &self.keys {
                if self.tainted.contains(&k.id) {
                    continue;
                }
                if k.ended.is_none() && k.resp == Resp::Started {
                    assert!(k.out.is_empty(), "{key:?}: queued body not sent");
                }
                assert!(
                    k.ended.is_some() || k.resp != Resp::Finished,
                    "{key:?}: finished but its end never went out"
                );
            }
        }
        // Then the connection goes: every request ends, nothing more goes out.
        self.w.handle_lost();
        self.transmit(usize::MAX);
        self.after_step();
        assert!(self.w.poll_transmit().is_none());
        for (key, k) in &self.keys {
            assert!(k.ended.is_some(), "{key:?} never ended");
        }
        assert_eq!(self.w.stats().streams_open, 0);
    }
}
