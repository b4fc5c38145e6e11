//! The bytes every store of one `TempFileOverflow` holds together, and
//! their bound. (The core's `MemoryOverflow` keeps a budget of its own, not
//! part of its public API.)

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The bytes every store of one `Overflow` holds together, and their
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
