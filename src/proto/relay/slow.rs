//! How a stream whose caller does not keep up is held, then given up: the
//! tallies of what is buffered, the overflow's spill and refill, the stall
//! deadlines and the read-pause bound. The policy is described on
//! [`RelayConnection`].

use super::{OverflowConfig, RelayConnection, RelayEnd, RelayEvent, Stream};
use crate::proto::inbound::InBody;
use crate::proto::outbound::SendAbort;
use crate::proto::StreamKey;
use std::time::{Duration, Instant};

impl RelayConnection {
    /// Runs `f` on a stream's body, keeping the connection's tallies (bytes
    /// held, streams at their chunk bound, bytes spilled) in step.
    pub(super) fn body_op<R>(&mut self, key: StreamKey, f: impl FnOnce(&mut InBody) -> R) -> R {
        let limit = self.config.common.max_unread_chunks;
        let b = &mut self.streams.get_mut(&key).expect("a held stream").body;
        let spilled = b.spilled();
        let r = self.held.op(b, limit, f);
        self.side.spilled_total = self.side.spilled_total - spilled + b.spilled();
        r
    }

    /// Forgets a stream and everything it holds (memory, spills, deadline).
    pub(super) fn remove_stream(&mut self, key: StreamKey) -> Option<Stream> {
        if !self.streams.contains_key(&key) {
            return None;
        }
        self.drop_spills(key);
        self.body_op(key, InBody::discard);
        self.set_stall(key, None);
        self.streams.remove(&key)
    }

    /// Drops the stream's chunks still waiting for the overflow store, and
    /// any refill asked for it (its overflow is about to go).
    pub(super) fn drop_spills(&mut self, key: StreamKey) {
        let Some(s) = self.streams.get_mut(&key) else {
            return;
        };
        if s.refill_asked {
            s.refill_asked = false;
            self.events
                .retain(|e| !matches!(e, RelayEvent::Refill { key: k, .. } if *k == key));
        }
        if s.backlog > 0 {
            self.side.spills.retain(|(k, _)| *k != key);
            self.side.spill_backlog -= s.backlog;
            s.backlog = 0;
        }
    }

    /// Starts, restarts or stops a stream's stall deadline.
    pub(super) fn set_stall(&mut self, key: StreamKey, since: Option<Instant>) {
        let Some(s) = self.streams.get_mut(&key) else {
            return;
        };
        if let Some(old) = s.stall_since.take() {
            self.side.stalls.remove(&(old, key));
        }
        // A closed connection runs no deadlines: what arrived stays readable.
        if let Some(t) = since.filter(|_| !self.core.closed) {
            s.stall_since = Some(t);
            self.side.stalls.insert((t, key));
        }
    }

    /// Data now waits for the application: start its deadline if none runs.
    pub(super) fn note_waiting(&mut self, key: StreamKey) {
        let Some(s) = self.streams.get(&key) else {
            return;
        };
        if s.stall_since.is_none() && s.body.waiting() {
            self.set_stall(key, self.core.now);
        }
    }

    /// Asks for the stream's next overflow bytes once nothing is held in
    /// memory for it and the store has some.
    pub(super) fn maybe_refill(&mut self, key: StreamKey) {
        let max = self
            .config
            .extra
            .overflow
            .map_or(0, |o| o.memory_per_stream.max(1));
        let Some(s) = self.streams.get_mut(&key) else {
            return;
        };
        if !s.refill_asked && s.body.chunks() == 0 && s.stored() > 0 {
            s.refill_asked = true;
            self.events.push_back(RelayEvent::Refill { key, max });
        }
    }

    /// Ends the wait of a stream past its memory bound
    /// (`OverflowConfig::spill_after`): once its caller has read all it
    /// held, or it has gone, or the connection closed; or, at its deadline,
    /// in vain (the stream then spills without waiting).
    pub(super) fn settle_wait(&mut self) {
        let Some((key, since)) = self.side.waiting_for else {
            return;
        };
        let ov = self
            .config
            .extra
            .overflow
            .expect("a wait needs an overflow");
        let closed = self.core.closed;
        let now = self.core.now;
        let wait = spill_wait(&ov, self.streams.len() == 1);
        let Some(s) = self.streams.get_mut(&key) else {
            self.side.waiting_for = None;
            return;
        };
        // Caught up: the caller has read everything held for it. So only a
        // caller that reads at least `memory_per_stream` per `spill_after`
        // can keep reading paused.
        let caught_up = s.body.bytes() == 0;
        let in_vain = now.is_some_and(|now| now.duration_since(since) >= wait);
        if closed || caught_up || !s.body.is_reading() {
            self.side.waiting_for = None;
        } else if in_vain {
            s.waited = true;
            self.side.waiting_for = None;
        }
    }

    /// Keeps `paused_since` in step with `wants_read()`, after settling a
    /// wait before a spill.
    pub(super) fn track_pause(&mut self) {
        self.settle_wait();
        if self.core.closed || self.wants_read() {
            self.side.paused_since = None;
        } else if self.side.paused_since.is_none() {
            self.side.paused_since = self.core.now;
        }
    }

    /// The streams that hold reading paused: those at their chunk bound, or
    /// else the one holding the most memory.
    pub(super) fn pause_culprits(&self) -> Vec<StreamKey> {
        let limit = self.config.common.max_unread_chunks;
        let mut keys: Vec<StreamKey> = self
            .streams
            .iter()
            .filter(|(_, s)| s.body.chunks() >= limit)
            .map(|(k, _)| *k)
            .collect();
        if keys.is_empty() {
            keys.extend(
                self.streams
                    .iter()
                    .filter(|(_, s)| s.body.bytes() + s.backlog > 0)
                    .max_by_key(|(k, s)| (s.body.bytes() + s.backlog, std::cmp::Reverse(**k)))
                    .map(|(k, _)| *k),
            );
        }
        keys.sort();
        keys
    }

    /// Gives up a stream whose application did not keep up: `abort` to the
    /// worker if it is in flight, and everything buffered dropped.
    pub(super) fn give_up(&mut self, key: StreamKey, reason: RelayEnd) {
        self.set_stall(key, None);
        let Some(s) = self.streams.get(&key) else {
            return;
        };
        if s.on_wire {
            self.end_on_wire(key, reason, SendAbort::Always);
        } else {
            // Ended on the wire already: only the caller's data is dropped,
            // and its reader told (reads give `Gone`).
            self.drop_spills(key);
            self.body_op(key, InBody::fail);
            self.events.push_back(RelayEvent::Readable { key });
        }
    }
}

/// How long a stream past its memory bound waits for its caller before it
/// spills: `spill_after`, or `spill_after_alone` if longer while it is the
/// only stream in flight (reading paused then holds up no other stream).
pub(super) fn spill_wait(ov: &OverflowConfig, alone: bool) -> Duration {
    if alone {
        ov.spill_after.max(ov.spill_after_alone)
    } else {
        ov.spill_after
    }
}
