//! Where the relay driver puts a response its caller reads more slowly than
//! the worker sends it (see `RelayConfig::overflow`): one store per stream,
//! appended to in order and read back in order.

use bytes::Bytes;
use std::collections::VecDeque;
use std::io;

/// Makes an overflow store for a stream, when its first chunk spills.
///
/// The driver calls it, and the stores' methods, from inside its `poll`:
/// keep them quick (a temporary file in the page cache is; nginx writes its
/// temporary files from its event loop the same way). A store is dropped
/// when its stream is done with it: remove what it holds then (an unlinked
/// temporary file does that by itself).
pub trait Overflow: Send + Sync + 'static {
    /// A new, empty store.
    fn create(&self) -> io::Result<Box<dyn OverflowFile>>;
}

/// One stream's overflow: a byte queue.
pub trait OverflowFile: Send {
    /// Appends `data` at the end.
    fn append(&mut self, data: Bytes) -> io::Result<()>;
    /// Takes up to `max` bytes from the front (fewer is fine, none only when
    /// empty).
    fn read(&mut self, max: usize) -> io::Result<Bytes>;
}

/// Overflow held in memory (the default when `RelayConfig::overflow` is set
/// and no store is given): bounded by `OverflowConfig`'s budgets, it lets a
/// slow caller's response wait without pausing the other streams.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryOverflow;

impl Overflow for MemoryOverflow {
    fn create(&self) -> io::Result<Box<dyn OverflowFile>> {
        Ok(Box::<MemoryFile>::default())
    }
}

#[derive(Default)]
struct MemoryFile {
    chunks: VecDeque<Bytes>,
}

impl OverflowFile for MemoryFile {
    fn append(&mut self, data: Bytes) -> io::Result<()> {
        if !data.is_empty() {
            self.chunks.push_back(data);
        }
        Ok(())
    }

    fn read(&mut self, max: usize) -> io::Result<Bytes> {
        let Some(front) = self.chunks.front_mut() else {
            return Ok(Bytes::new());
        };
        if front.len() > max {
            return Ok(front.split_to(max.max(1)));
        }
        Ok(self.chunks.pop_front().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_overflow_is_a_byte_queue() {
        let mut f = MemoryOverflow.create().unwrap();
        f.append(Bytes::from_static(b"hello")).unwrap();
        f.append(Bytes::new()).unwrap();
        f.append(Bytes::from_static(b" world")).unwrap();
        assert_eq!(f.read(3).unwrap(), "hel");
        assert_eq!(f.read(100).unwrap(), "lo");
        assert_eq!(f.read(100).unwrap(), " world");
        assert!(f.read(100).unwrap().is_empty());
    }
}
