//! Incoming body buffers: chunks received and not yet read by the application.

use bytes::Bytes;
use std::collections::VecDeque;

/// The result of reading a stream's incoming body.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// One stream's unread incoming body.
#[derive(Debug)]
pub(crate) struct InBody {
    queue: VecDeque<Bytes>,
    bytes: usize,
    state: State,
}

impl InBody {
    pub fn new() -> InBody {
        InBody {
            queue: VecDeque::new(),
            bytes: 0,
            state: State::Open,
        }
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

    /// The body will not complete; unread data is dropped. Returns the bytes dropped.
    pub fn fail(&mut self) -> usize {
        self.state = State::Gone;
        self.clear()
    }

    /// The body will not complete, but what arrived stays readable: reads
    /// return it, then `Gone`.
    pub fn fail_after_data(&mut self) {
        if self.state != State::Discarding {
            self.state = State::Gone;
        }
    }

    /// The application will not read the rest: drop what is held and what
    /// arrives later. Returns the bytes dropped.
    pub fn discard(&mut self) -> usize {
        if self.state == State::Open {
            self.state = State::Discarding;
        }
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
        match self.state {
            State::Open => BodyRead::Pending,
            State::Ended => BodyRead::End,
            State::Gone | State::Discarding => BodyRead::Gone,
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
}
