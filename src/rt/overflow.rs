//! Where the relay driver puts a response its caller reads more slowly than
//! the worker sends it (see `RelayConfig::overflow`): one store per stream,
//! appended to in order and read back in order, every store of one
//! [`Overflow`] drawing on one budget.

use bytes::Bytes;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A store operation to run away from the connection: see
/// [`Overflow::spawn`].
pub type OverflowJob = Box<dyn FnOnce() + Send + 'static>;

/// Makes an overflow store for a stream, when its first chunk spills.
///
/// Where its work runs is the store's choice, through
/// [`spawn`](Self::spawn). By default (a store in memory) the driver calls
/// [`create`](Self::create) and the stores' methods inline, from its `poll`
/// or a body reader's, under the connection's lock: keep them quick then.
/// A store that may block (a file on a disk that can be slow) hands its
/// work to a thread or a blocking pool instead, and the connection goes on
/// meanwhile: each stream's operations still run one at a time, in order,
/// and their results come back to the driver, which is woken for them.
/// A store is dropped when its stream is done with it (inline, or handed
/// to `spawn` the same way): remove what it holds then (an unlinked
/// temporary file does that by itself).
///
/// While a connection's stores are behind, it hands them at most 1 MiB of
/// appends not done yet (and the chunk that crossed it); further chunks
/// wait in the connection's memory, within its
/// [`max_unread_bytes`](crate::proto::RelayConfig::max_unread_bytes), and
/// past that the connection pauses reading as it does without an overflow.
///
/// An error from [`create`](Self::create) or a store's method gives up that
/// stream alone: its caller's body fails with
/// [`BodyError::Overflow`](super::BodyError::Overflow), the worker is sent
/// `abort`, and the other streams go on. That is how a store says its
/// budget is spent.
pub trait Overflow: Send + Sync + 'static {
    /// A new, empty store.
    fn create(&self) -> io::Result<Box<dyn OverflowFile>>;

    /// Runs `job` (making a store, its appends and reads, dropping it)
    /// away from the connection: on a thread of the store's, or a runtime's
    /// blocking pool (`tokio::task::spawn_blocking`). The job may block;
    /// it never takes the connection's lock.
    ///
    /// Returns the job (`Err`) to have it run inline, under the
    /// connection's lock: the default, right for a store in memory. A job
    /// dropped without being run fails its stream
    /// ([`BodyError::Overflow`](super::BodyError::Overflow)).
    ///
    /// A store whose work runs on a thread of its own, on any executor:
    ///
    /// ```
    /// use std::sync::{mpsc, Arc};
    /// use worker_relay::rt::{MemoryOverflow, Overflow, OverflowFile, OverflowJob};
    ///
    /// struct OnThread<S> {
    ///     store: S,
    ///     jobs: mpsc::Sender<OverflowJob>,
    /// }
    ///
    /// impl<S> OnThread<S> {
    ///     fn new(store: S) -> std::io::Result<OnThread<S>> {
    ///         let (jobs, rx) = mpsc::channel::<OverflowJob>();
    ///         std::thread::Builder::new()
    ///             .name("overflow".into())
    ///             .spawn(move || rx.into_iter().for_each(|job| job()))?;
    ///         Ok(OnThread { store, jobs })
    ///     }
    /// }
    ///
    /// impl<S: Overflow> Overflow for OnThread<S> {
    ///     fn create(&self) -> std::io::Result<Box<dyn OverflowFile>> {
    ///         self.store.create()
    ///     }
    ///     fn spawn(&self, job: OverflowJob) -> Result<(), OverflowJob> {
    ///         // The thread gone: run it inline.
    ///         self.jobs.send(job).map_err(|e| e.0)
    ///     }
    /// }
    ///
    /// let store: Arc<dyn Overflow> = Arc::new(OnThread::new(MemoryOverflow::default())?);
    /// // rt::relay_with_overflow(socket, timer, config, store)
    /// # let (tx, rx) = mpsc::channel();
    /// # assert!(store.spawn(Box::new(move || tx.send(()).unwrap())).is_ok());
    /// # rx.recv().unwrap();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    fn spawn(&self, job: OverflowJob) -> Result<(), OverflowJob> {
        Err(job)
    }
}

/// One stream's overflow: a byte queue.
pub trait OverflowFile: Send {
    /// Appends `data` at the end.
    fn append(&mut self, data: Bytes) -> io::Result<()>;
    /// Takes up to `max` bytes from the front (fewer is fine, none only when
    /// empty).
    fn read(&mut self, max: usize) -> io::Result<Bytes>;
}

/// The bytes every store of one [`Overflow`] holds together, and their
/// bound.
#[derive(Debug)]
pub(crate) struct Budget {
    limit: u64,
    held: AtomicU64,
}

impl Budget {
    pub(crate) fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            held: AtomicU64::new(0),
        })
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Counts `n` more bytes, or fails if that would cross the limit.
    pub(crate) fn take(&self, n: u64, kind: io::ErrorKind) -> io::Result<()> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&h| h <= self.limit)
            })
            .map(|_| ())
            .map_err(|_| {
                io::Error::new(
                    kind,
                    format!("the overflow budget of {} bytes is spent", self.limit),
                )
            })
    }

    /// Returns `n` bytes counted by [`take`](Self::take).
    pub(crate) fn give(&self, n: u64) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Overflow held in memory: what [`rt::relay`](super::relay) uses when no
/// store is given, since it assumes no runtime and no file system. Every
/// store it makes draws on one budget of unread bytes (default
/// [`DEFAULT_BUDGET`](Self::DEFAULT_BUDGET)); an append past it gives up that
/// stream alone. Bytes return to the budget as they are read back, or when
/// their stream is dropped.
///
/// Clones share the budget: give one store to several connections to bound
/// them together.
#[derive(Debug, Clone)]
pub struct MemoryOverflow {
    budget: Arc<Budget>,
}

impl MemoryOverflow {
    /// The default budget, 64 MiB for all the streams of the store: small
    /// next to the RAM of any host, and 64 one-MiB chunks, so a few slow
    /// callers of large responses are served while a flood of them cannot
    /// take the process's memory. Use a file-backed store (feature
    /// `tempfile`) for more.
    pub const DEFAULT_BUDGET: u64 = 64 << 20;

    /// A store whose streams hold at most `budget` bytes together.
    pub fn new(budget: u64) -> MemoryOverflow {
        MemoryOverflow {
            budget: Budget::new(budget),
        }
    }

    /// The bytes its streams hold now, all together.
    pub fn held(&self) -> u64 {
        self.budget.held()
    }

    /// The bound of [`held`](Self::held).
    pub fn budget(&self) -> u64 {
        self.budget.limit()
    }
}

impl Default for MemoryOverflow {
    /// A store with [`DEFAULT_BUDGET`](Self::DEFAULT_BUDGET).
    fn default() -> MemoryOverflow {
        MemoryOverflow::new(MemoryOverflow::DEFAULT_BUDGET)
    }
}

impl Overflow for MemoryOverflow {
    fn create(&self) -> io::Result<Box<dyn OverflowFile>> {
        Ok(Box::new(MemoryFile {
            chunks: VecDeque::new(),
            held: 0,
            budget: self.budget.clone(),
        }))
    }
}

struct MemoryFile {
    chunks: VecDeque<Bytes>,
    held: u64,
    budget: Arc<Budget>,
}

impl OverflowFile for MemoryFile {
    fn append(&mut self, data: Bytes) -> io::Result<()> {
        if !data.is_empty() {
            let n = data.len() as u64;
            self.budget.take(n, io::ErrorKind::OutOfMemory)?;
            self.held += n;
            self.chunks.push_back(data);
        }
        Ok(())
    }

    fn read(&mut self, max: usize) -> io::Result<Bytes> {
        let Some(front) = self.chunks.front_mut() else {
            return Ok(Bytes::new());
        };
        let data = if front.len() > max {
            front.split_to(max.max(1))
        } else {
            self.chunks.pop_front().unwrap_or_default()
        };
        self.held -= data.len() as u64;
        self.budget.give(data.len() as u64);
        Ok(data)
    }
}

impl Drop for MemoryFile {
    fn drop(&mut self) {
        self.budget.give(self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_overflow_is_a_byte_queue() {
        let mut f = MemoryOverflow::default().create().unwrap();
        f.append(Bytes::from_static(b"hello")).unwrap();
        f.append(Bytes::new()).unwrap();
        f.append(Bytes::from_static(b" world")).unwrap();
        assert_eq!(f.read(3).unwrap(), "hel");
        assert_eq!(f.read(100).unwrap(), "lo");
        assert_eq!(f.read(100).unwrap(), " world");
        assert!(f.read(100).unwrap().is_empty());
    }

    #[test]
    fn the_stores_of_one_memory_overflow_share_its_budget() {
        let store = MemoryOverflow::new(10);
        let (mut a, mut b) = (store.create().unwrap(), store.clone().create().unwrap());
        a.append(Bytes::from_static(b"123456")).unwrap();
        let err = b.append(Bytes::from_static(b"12345")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory);
        b.append(Bytes::from_static(b"1234")).unwrap();
        assert_eq!(store.held(), 10);
        // Read back: returned to the budget.
        assert_eq!(a.read(4).unwrap(), "1234");
        assert_eq!(store.held(), 6);
        b.append(Bytes::from_static(b"5678")).unwrap();
        // Dropped: returned too.
        drop(a);
        drop(b);
        assert_eq!(store.held(), 0);
        let mut c = store.create().unwrap();
        c.append(Bytes::from(vec![7; 10])).unwrap();
        assert!(c.append(Bytes::from_static(b"x")).is_err());
    }
}
