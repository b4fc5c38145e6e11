//! The byte cursor every harness reads its input with, and the virtual clock's origin.

use std::sync::OnceLock;
use std::time::Instant;

/// Reads fuzzer bytes as the values the harnesses need. Once the input is
/// exhausted every read returns zeros (or an empty slice), so any input,
/// however short, is a complete program.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    data: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// A cursor over `data`.
    pub fn new(data: &'a [u8]) -> Cursor<'a> {
        Cursor { data }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte, or 0.
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next two bytes, big-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, big-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// Whether the next byte is odd.
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// Up to `n` bytes (fewer if the input ends).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// One of `items` (which must not be empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[usize::from(self.u8()) % items.len()]
    }

    /// A length-prefixed byte string of at most `max` bytes.
    pub fn short_bytes(&mut self, max: usize) -> &'a [u8] {
        let n = usize::from(self.u8()) % (max + 1);
        self.bytes(n)
    }
}

/// A fixed point every run measures its virtual time from. Only differences
/// matter to the machines, so one process-wide base keeps runs reproducible.
pub(crate) fn base_instant() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}
