//! Incoming body buffers: chunks received and not yet read by the application.

use bytes::Bytes;
use std::collections::VecDeque;

/// The result of reading a stream's incoming body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyRead {
    /// The next piece of the body.
    Data(Bytes),
    /// Nothing buffered yet; an event will say when there is.
    Pending,
    /// The body is complete and fully read.
    End,
    /// The body will not complete: the peer aborted, the connection was lost,
    /// or the stream is not known (already finished or never opened).
    Gone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    Ended,
    Gone,
    Discarding,
}

/// One stream's unread incoming body: the chunks held here, and (relay
/// side) the bytes held in the application's overflow store, which come
/// back through [`InBody::refill`] before anything held here after them.
#[derive(Debug)]
pub(crate) struct InBody {
    queue: VecDeque<Bytes>,
    bytes: usize,
    state: State,
    spilled: u64,
}

impl InBody {
    pub fn new() -> InBody {
        InBody {
            queue: VecDeque::new(),
            bytes: 0,
            state: State::Open,
            spilled: 0,
        }
    }

    /// Bytes held in the overflow store.
    pub fn spilled(&self) -> u64 {
        self.spilled
    }

    /// Whether data waits for the application, here or in the overflow.
    pub fn waiting(&self) -> bool {
        !self.queue.is_empty() || self.spilled > 0
    }

    /// Records `n` received bytes sent to the overflow store instead of
    /// being held here; false (nothing recorded) unless the body is open.
    pub fn spill(&mut self, n: usize) -> bool {
        if self.state != State::Open {
            return false;
        }
        self.spilled += n as u64;
        true
    }

    /// Bytes back from the overflow store, in order: held here again.
    /// Returns the bytes now held (0 once the body was discarded or failed
    /// without data).
    pub fn refill(&mut self, data: Bytes) -> usize {
        let n = data.len();
        if self.state == State::Discarding || n == 0 {
            return 0;
        }
        self.spilled = self.spilled.saturating_sub(n as u64);
        self.bytes += n;
        self.queue.push_back(data);
        n
    }

    /// Number of unread chunks.
    pub fn chunks(&self) -> usize {
        self.queue.len()
    }

    /// Unread bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether more chunks may still arrive.
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open | State::Discarding)
    }

    /// Whether more chunks may still arrive and the application still reads them.
    pub fn is_reading(&self) -> bool {
        self.state == State::Open
    }

    /// Buffers a received chunk; returns the bytes now held (0 when discarding).
    /// Empty chunks carry nothing and are not held.
    pub fn push(&mut self, data: Bytes) -> usize {
        match self.state {
            State::Open if !data.is_empty() => {
                let n = data.len();
                self.bytes += n;
                self.queue.push_back(data);
                n
            }
            _ => 0,
        }
    }

    /// The sender finished the body.
    pub fn end(&mut self) {
        if matches!(self.state, State::Open | State::Discarding) {
            self.state = State::Ended;
        }
    }

    /// The body will not complete; unread data is dropped (the overflow's
    /// too). Returns the bytes dropped from here.
    pub fn fail(&mut self) -> usize {
        self.state = State::Gone;
        self.spilled = 0;
        self.clear()
    }

    /// The body will not complete, but what arrived stays readable: reads
    /// return it, then `Gone`.
    pub fn fail_after_data(&mut self) {
        if self.state != State::Discarding {
            self.state = State::Gone;
        }
    }

    /// The application will not read the rest: drop what is held (and the
    /// overflow's) and what arrives later. Returns the bytes dropped here.
    pub fn discard(&mut self) -> usize {
        if self.state == State::Open {
            self.state = State::Discarding;
        }
        self.spilled = 0;
        self.clear()
    }

    fn clear(&mut self) -> usize {
        let n = self.bytes;
        self.queue.clear();
        self.bytes = 0;
        n
    }

    /// Takes the next piece; `Data` reduces the unread count.
    pub fn read(&mut self) -> BodyRead {
        if let Some(b) = self.queue.pop_front() {
            self.bytes -= b.len();
            return BodyRead::Data(b);
        }
        if self.spilled > 0 {
            // The rest waits in the overflow store.
            return BodyRead::Pending;
        }
        match self.state {
            State::Open => BodyRead::Pending,
            State::Ended => BodyRead::End,
            State::Gone | State::Discarding => BodyRead::Gone,
        }
    }
}

/// What the bodies of one connection hold, kept in step by [`Held::op`]:
/// the bytes, and how many bodies are at the chunk bound (reading pauses
/// while any is). Both machines keep one, so that `wants_read` costs the
/// same with 10,000 streams open as with one.
#[derive(Debug, Default)]
pub(crate) struct Held {
    /// Bytes held by every body.
    pub bytes: usize,
    /// Bodies holding `limit` chunks or more.
    pub full: usize,
}

impl Held {
    /// Runs `f` on `body`, keeping the tallies in step.
    pub fn op<R>(
        &mut self,
        body: &mut InBody,
        limit: usize,
        f: impl FnOnce(&mut InBody) -> R,
    ) -> R {
        let (bytes, full) = (body.bytes(), body.chunks() >= limit);
        let r = f(body);
        self.bytes = self.bytes - bytes + body.bytes();
        match (full, body.chunks() >= limit) {
            (false, true) => self.full += 1,
            (true, false) => self.full -= 1,
            _ => {}
        }
        r
    }

    /// `body` leaves the connection with what it holds.
    pub fn forget(&mut self, body: &InBody, limit: usize) {
        self.bytes -= body.bytes();
        if body.chunks() >= limit {
            self.full -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_in_order_then_end() {
        let mut b = InBody::new();
        assert_eq!(b.read(), BodyRead::Pending);
        b.push(Bytes::from_static(b"ab"));
        b.push(Bytes::new());
        b.push(Bytes::from_static(b"c"));
        assert_eq!((b.chunks(), b.bytes()), (2, 3));
        b.end();
        assert_eq!(b.read(), BodyRead::Data(Bytes::from_static(b"ab")));
        assert_eq!(b.read(), BodyRead::Data(Bytes::from_static(b"c")));
        assert_eq!(b.read(), BodyRead::End);
        assert_eq!(b.push(Bytes::from_static(b"late")), 0);
    }

    #[test]
    fn fail_after_data_keeps_what_arrived() {
        let mut b = InBody::new();
        b.push(Bytes::from_static(b"ab"));
        b.fail_after_data();
        assert!(!b.is_open());
        assert_eq!(b.push(Bytes::from_static(b"late")), 0);
        assert_eq!(b.read(), BodyRead::Data(Bytes::from_static(b"ab")));
        assert_eq!(b.read(), BodyRead::Gone);
    }

    #[test]
    fn spilled_bytes_come_back_before_the_end() {
        let mut b = InBody::new();
        b.push(Bytes::from_static(b"ab"));
        assert!(b.spill(3));
        b.end();
        assert!(b.waiting());
        assert_eq!(b.read(), BodyRead::Data(Bytes::from_static(b"ab")));
        assert_eq!(b.read(), BodyRead::Pending, "the rest is in the overflow");
        assert_eq!(b.refill(Bytes::from_static(b"cd")), 2);
        assert_eq!(b.spilled(), 1);
        assert_eq!(b.read(), BodyRead::Data(Bytes::from_static(b"cd")));
        assert_eq!(b.read(), BodyRead::Pending);
        b.refill(Bytes::from_static(b"e"));
        assert_eq!(b.read(), BodyRead::Data(Bytes::from_static(b"e")));
        assert_eq!(b.read(), BodyRead::End);
        assert!(!b.waiting());
        assert!(!b.spill(1), "nothing spills after the end");
    }

    #[test]
    fn discard_and_fail_drop_everything() {
        let mut b = InBody::new();
        b.push(Bytes::from_static(b"ab"));
        assert_eq!(b.discard(), 2);
        assert_eq!(b.push(Bytes::from_static(b"cd")), 0);
        assert!(b.is_open());
        assert_eq!(b.read(), BodyRead::Gone);
        let mut b = InBody::new();
        b.push(Bytes::from_static(b"ab"));
        assert_eq!(b.fail(), 2);
        assert!(!b.is_open());
        assert_eq!(b.read(), BodyRead::Gone);
    }

    #[test]
    fn held_follows_bytes_and_bodies_at_the_bound() {
        let mut held = Held::default();
        let mut b = InBody::new();
        held.op(&mut b, 2, |b| b.push(Bytes::from_static(b"ab")));
        assert_eq!((held.bytes, held.full), (2, 0));
        held.op(&mut b, 2, |b| b.push(Bytes::from_static(b"cde")));
        assert_eq!((held.bytes, held.full), (5, 1));
        held.op(&mut b, 2, InBody::read);
        assert_eq!((held.bytes, held.full), (3, 0));
        held.op(&mut b, 2, |b| b.push(Bytes::from_static(b"f")));
        assert_eq!((held.bytes, held.full), (4, 1));
        held.forget(&b, 2);
        assert_eq!((held.bytes, held.full), (0, 0));
    }
}
