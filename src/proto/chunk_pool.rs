//! Outgoing body chunks of 64 KiB or more are written into reused buffers.
//!
//! A fresh 1 MiB buffer per chunk costs more than the copy into it: glibc's
//! `malloc` hands out such blocks with `mmap` or trims them back to the
//! kernel on free, so every chunk page-faults its memory in again (1 GiB
//! through both machines ran at 0.18× memcpy that way; BENCHMARKS.md). The
//! pool keeps up to [`KEEP`] buffers for the whole process, shared by every
//! connection: a chunk's buffer comes back when the last holder of its
//! `Bytes` (the WebSocket writer, usually) drops it. Smaller chunks are
//! allocated as before: the allocator reuses small blocks well.

use crate::frame::{encode_chunk, StreamId, MAX_CHUNK_BODY};
use bytes::Bytes;
use std::sync::{Mutex, MutexGuard};

/// Chunks this large or larger use the pool.
const MIN_POOLED: usize = 64 << 10;
/// Buffers kept for reuse, at most (about 8 MiB for the whole process).
const KEEP: usize = 8;
/// Where the body starts may move by up to this much, to keep the copy
/// aligned as `encode_chunk` does.
const ALIGN: usize = 64;
const ID_LEN: usize = 4;
/// Every pooled buffer's capacity: the largest chunk, its id and the shift.
const BUF_CAP: usize = ALIGN - 1 + ID_LEN + MAX_CHUNK_BODY;

static FREE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

fn free() -> MutexGuard<'static, Vec<Vec<u8>>> {
    // A panic while the lock was held left a valid list of buffers.
    FREE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer that goes back to the pool when its `Bytes` is dropped.
struct Pooled(Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.0);
        if buf.capacity() == BUF_CAP {
            let mut free = free();
            if free.len() < KEEP {
                free.push(buf);
            }
        }
    }
}

/// The bytes of one binary message: the 4-byte id, then `body` (as
/// [`encode_chunk`], in a reused buffer when the body is large).
pub(crate) fn encode(id: StreamId, body: &[u8]) -> Bytes {
    if body.len() < MIN_POOLED || body.len() > MAX_CHUNK_BODY {
        return encode_chunk(id, body);
    }
    let mut buf = free().pop().unwrap_or_default();
    if buf.capacity() != BUF_CAP {
        buf = Vec::with_capacity(BUF_CAP);
    }
    buf.clear();
    // The body lands at its source's address modulo 64 (see `encode_chunk`).
    let body_at = buf.as_ptr() as usize + ID_LEN;
    let skip = (body.as_ptr() as usize).wrapping_sub(body_at) % ALIGN;
    buf.resize(skip, 0);
    buf.extend_from_slice(&id.get().to_be_bytes());
    buf.extend_from_slice(body);
    Bytes::from_owner(Pooled(buf)).slice(skip..)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Chunk;

    fn id(n: u32) -> StreamId {
        StreamId::new(n).unwrap()
    }

    #[test]
    fn large_and_small_chunks_encode_as_encode_chunk_does() {
        for len in [0, 1, MIN_POOLED - 1, MIN_POOLED, MAX_CHUNK_BODY] {
            let body: Vec<u8> = (0..len + 3).map(|i| (i % 251) as u8).collect();
            for start in [0, 1, 3] {
                let piece = &body[start..start + len];
                assert_eq!(encode(id(9), piece), encode_chunk(id(9), piece));
            }
        }
        let big = vec![7u8; MAX_CHUNK_BODY + 1];
        assert_eq!(encode(id(1), &big), encode_chunk(id(1), &big));
    }

    #[test]
    fn a_dropped_chunk_gives_its_buffer_back_for_the_next() {
        let body = vec![1u8; MIN_POOLED];
        let first = encode(id(1), &body);
        let at = first.as_ptr() as usize;
        drop(first);
        // Another test may take the buffer first: try a few times.
        let reused = (0..50).any(|_| {
            let c = encode(id(2), &body);
            let same = (c.as_ptr() as usize).abs_diff(at) < ALIGN;
            assert_eq!(Chunk::decode(c).unwrap().data, body);
            same
        });
        assert!(reused, "the buffer was not reused");
    }

    #[test]
    fn the_pool_keeps_at_most_keep_buffers() {
        let body = vec![1u8; MIN_POOLED];
        let held: Vec<Bytes> = (0..KEEP * 2)
            .map(|n| encode(id(n as u32 + 1), &body))
            .collect();
        drop(held);
        assert!(free().len() <= KEEP);
    }
}
