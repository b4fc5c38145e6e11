//! [`Expected`]: the bytes one body must still deliver, in order.

use bytes::Bytes;
use std::collections::VecDeque;
use std::fmt;

/// The bytes one body must still deliver, in order, and whether more may
/// come: what an application queued and the wire has not carried yet (bytes
/// arrive with [`push`](Expected::push) as it queues them, and
/// [`seal`](Expected::seal) marks its `finish`), or a body known in advance
/// ([`whole`](Expected::whole)), checked as it goes out on the wire or out of
/// `read_body`.
///
/// Each piece seen is checked with [`take`](Expected::take): it must be
/// exactly the next bytes. The body is complete
/// ([`assert_complete`](Expected::assert_complete)) once it is sealed and
/// every byte was taken.
#[derive(Debug, Clone, Default)]
pub struct Expected {
    queued: VecDeque<Bytes>,
    sealed: bool,
    taken: usize,
}

impl Expected {
    /// An empty body more bytes may still be queued to.
    pub fn new() -> Expected {
        Expected::default()
    }

    /// A body known in advance: exactly `body`, sealed.
    pub fn whole(body: Bytes) -> Expected {
        let mut e = Expected::new();
        e.push(body);
        e.seal();
        e
    }

    /// Queues `data` after what is queued. Panics once the body is sealed
    /// (a mistake of the model: nothing may be queued after `finish`).
    pub fn push(&mut self, data: Bytes) {
        assert!(
            !self.sealed,
            "model: bytes queued after the body was sealed"
        );
        if !data.is_empty() {
            self.queued.push_back(data);
        }
    }

    /// No byte may be queued any more (the application's `finish`).
    pub fn seal(&mut self) {
        self.sealed = true;
    }

    /// Whether the body is sealed.
    pub fn is_sealed(&self) -> bool {
        self.sealed
    }

    /// Forgets what is queued (the machine dropped it: the stream ended).
    pub fn drop_queued(&mut self) {
        self.queued.clear();
    }

    /// Whether nothing is queued (every byte queued so far was taken).
    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// The bytes taken so far.
    pub fn taken(&self) -> usize {
        self.taken
    }

    /// Takes `data` off the front of what is queued. Panics, naming `what`,
    /// if `data` is not exactly the next bytes (or more than are queued).
    pub fn take(&mut self, data: &[u8], what: impl fmt::Display) {
        let mut rest = data;
        while !rest.is_empty() {
            let at = self.taken;
            let Some(front) = self.queued.front_mut() else {
                panic!(
                    "{what}: {} bytes more than expected, at byte {at}",
                    rest.len()
                );
            };
            let n = front.len().min(rest.len());
            if front[..n] != rest[..n] {
                let j = (0..n).find(|&j| front[j] != rest[j]).unwrap_or(0);
                panic!(
                    "{what}: bytes differ from the expected ones, at byte {}",
                    at + j
                );
            }
            rest = &rest[n..];
            self.taken += n;
            let _ = front.split_to(n);
            if front.is_empty() {
                self.queued.pop_front();
            }
        }
    }

    /// Panics, naming `what`, unless the body is complete: sealed, and every
    /// byte of it taken.
    pub fn assert_complete(&self, what: impl fmt::Display) {
        assert!(self.sealed, "{what}: end before the body was finished");
        let left: usize = self.queued.iter().map(Bytes::len).sum();
        assert!(
            left == 0,
            "{what}: end after {} bytes, {left} short of the body",
            self.taken
        );
    }
}
