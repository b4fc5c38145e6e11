//! What the worker's frames do to the relay's streams: responses, chunks,
//! `end`, `abort`, protocol errors, and the end of the connection.

use super::slow::spill_wait;
use super::{RelayConnection, RelayEnd, RelayEvent};
use crate::frame::{CloseCode, ControlFrame, ResponseHead, StreamId};
use crate::proto::inbound::InBody;
use crate::proto::length::{no_body, Length};
use crate::proto::outbound::SendAbort;
use crate::proto::{CloseCause, StreamKey};
use bytes::Bytes;

impl RelayConnection {
    /// The next free id after the last one handed out, wrapping at
    /// 2³²−1 and skipping ids in flight. Ids are not reused as soon as they
    /// are freed: after an `abort` the worker may still have frames of the
    /// old stream on the wire, and Strata's worker keeps an id busy until
    /// its app returns (a reused id would be silently ignored there).
    pub(super) fn alloc_id(&self) -> StreamId {
        let mut id = self.side.next_id;
        // At most `max_streams` ids are taken, so this ends within that many steps.
        while self.side.ids.contains_key(&id) {
            id = id.next_wrapping();
        }
        id
    }

    /// Ends a stream on the wire (the worker's end/abort, a protocol error,
    /// the relay giving up on it).
    pub(super) fn end_on_wire(&mut self, key: StreamKey, reason: RelayEnd, send_abort: SendAbort) {
        if reason == RelayEnd::ProtocolError {
            self.core.stats.protocol_errors += 1;
        }
        if self.streams[&key].orphaned {
            // The application has let go of it: end it without an event.
            let s = self.remove_stream(key).expect("in flight");
            self.side.ids.remove(&s.id);
            self.core.out.abort(key, s.id, send_abort);
            self.core.stats.streams_closed += 1;
            return;
        }
        let s = self.streams.get_mut(&key).expect("in flight");
        s.on_wire = false;
        s.writing = false;
        let (id, started, spilled) = (s.id, s.response_started, s.body.spilled() > 0);
        self.side.ids.remove(&id);
        self.core.out.abort(key, id, send_abort);
        if !reason.is_failure() {
            self.body_op(key, InBody::end);
        } else if started
            && !reason.drops_body()
            && !(reason == RelayEnd::ConnectionLost && spilled)
        {
            // The caller gets what arrived, then the failure.
            self.body_op(key, InBody::fail_after_data);
        } else if started {
            // Nothing more is read: what is buffered goes (a lost connection
            // cannot hand the overflow back in order either).
            self.drop_spills(key);
            self.body_op(key, InBody::fail);
            self.set_stall(key, None);
        } else {
            self.remove_stream(key);
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

    pub(super) fn on_control(&mut self, c: ControlFrame) {
        let Some(&key) = self.side.ids.get(&c.id()) else {
            self.core.stats.messages_ignored += 1;
            return;
        };
        let started = self.streams[&key].response_started;
        match c {
            ControlFrame::Response { head, .. } if !started => self.on_response(key, head),
            ControlFrame::End { .. } if started => {
                let s = &self.streams[&key];
                let short = !s.bodiless && s.response.short();
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
    pub(super) fn on_response(&mut self, key: StreamKey, head: ResponseHead) {
        let status = head.status();
        let length = head.headers().content_length();
        let (true, Ok(length)) = ((200..=599).contains(&status), length) else {
            self.end_on_wire(key, RelayEnd::ProtocolError, SendAbort::Always);
            return;
        };
        let s = self.streams.get_mut(&key).expect("in flight");
        s.response_started = true;
        s.bodiless = no_body(s.head_request, status);
        s.response = Length::new(if s.bodiless { None } else { length });
        self.events.push_back(RelayEvent::Response { key, head });
    }

    pub(super) fn on_chunk(&mut self, id: StreamId, data: Bytes) {
        let Some(&key) = self.side.ids.get(&id) else {
            self.core.stats.messages_ignored += 1;
            return;
        };
        let alone = self.streams.len() == 1;
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
        let n = data.len();
        if !s.response.fits(n) {
            self.end_on_wire(key, RelayEnd::ProtocolError, SendAbort::Always);
            return;
        }
        s.response.add(n);
        if n == 0 || !s.body.is_reading() {
            return;
        }
        // With an overflow, a body never holds `max_unread_chunks` in
        // memory: that would pause reading the whole connection, and the
        // chunk that would have spilled is never read (small chunks from a
        // paced worker reach the count long before `memory_per_stream`).
        let spill = self.config.extra.overflow.filter(|ov| {
            s.body.spilled() > 0
                || s.body.chunks() + 1 >= self.config.common.max_unread_chunks
                || s.body.bytes() + n > ov.memory_per_stream
                || self.held.bytes + n > self.config.common.max_unread_bytes
        });
        if spill.is_none() {
            s.waited = false;
        }
        // Waiting holds the chunk in hand: only while that keeps within the
        // connection's bounds, so that reading resumes when the wait ends.
        let wait = spill.is_some_and(|ov| {
            !spill_wait(&ov, alone).is_zero()
                && !s.waited
                && s.body.spilled() == 0
                && s.body.chunks() + 1 < self.config.common.max_unread_chunks
                && self.held.bytes + self.side.spill_backlog + n
                    < self.config.common.max_unread_bytes
        });
        if let (true, Some(now)) = (wait, self.core.now) {
            // Past its memory with nothing in the overflow: hold this chunk
            // and pause reading for a while, for the caller to catch up.
            self.side.waiting_for = Some((key, now));
        } else if let Some(ov) = spill {
            if s.body.spilled() + n as u64 > ov.max_per_stream
                || self.side.spilled_total + n as u64 > ov.max_total
            {
                self.end_on_wire(key, RelayEnd::OverflowExceeded, SendAbort::Always);
                return;
            }
            s.backlog += n;
            self.side.spill_backlog += n;
            self.side.spills.push_back((key, data));
            self.body_op(key, |b| b.spill(n));
            self.note_waiting(key);
            return;
        }
        let was_empty = s.body.chunks() == 0;
        let held = self.body_op(key, |b| b.push(data));
        self.core.note_buffered_in(self.held.bytes);
        if held > 0 && was_empty {
            self.events.push_back(RelayEvent::Readable { key });
        }
        self.note_waiting(key);
    }

    /// The connection is over: every stream in flight ends with `ConnectionLost`,
    /// or `Unsent` if its `request` frame had not gone out.
    pub(super) fn end_all(&mut self, close: Option<(CloseCode, &str)>, cause: CloseCause) {
        if self.core.closed {
            return;
        }
        let mut keys: Vec<StreamKey> = self.side.ids.values().copied().collect();
        keys.sort();
        let unsent: Vec<StreamKey> = keys
            .iter()
            .copied()
            .filter(|k| self.core.out.head_queued(*k))
            .collect();
        if !self.core.mark_closed(close, cause) {
            return;
        }
        for key in keys {
            let reason = if unsent.contains(&key) {
                RelayEnd::Unsent
            } else {
                RelayEnd::ConnectionLost
            };
            self.end_on_wire(key, reason, SendAbort::Never);
        }
        // Data that arrived before the end stays readable, with no deadline;
        // what is in the overflow cannot come back once the driver stops.
        let waiting: Vec<StreamKey> = self.side.stalls.iter().map(|(_, k)| *k).collect();
        for key in waiting {
            self.set_stall(key, None);
        }
        let spilled: Vec<StreamKey> = self
            .streams
            .iter()
            .filter(|(_, s)| s.body.spilled() > 0)
            .map(|(k, _)| *k)
            .collect();
        for key in spilled {
            self.drop_spills(key);
            self.body_op(key, InBody::fail);
            self.events.push_back(RelayEvent::Readable { key });
        }
        self.core.out.clear();
        self.side.paused_since = None;
    }
}
