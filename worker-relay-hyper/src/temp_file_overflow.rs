//! The overflow on disk (feature `tempfile`): each slow stream's bytes in
//! temporary files that have no name from the moment they are made.

use crate::budget::Budget;
use bytes::Bytes;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use worker_relay::rt::{Overflow, OverflowFile};

/// A stream's bytes go into a new file once its last one holds this many,
/// and a file is freed once it is read to its end: a stream that is read
/// while it is written never holds more than this on disk beyond what
/// waits, and holds at most one file per 64 MiB that waits.
const SEGMENT: u64 = 64 << 20;

/// Overflow in temporary files: what a `gateway::Gateway` (feature `gateway`)
/// uses by default. Each slow stream gets files made with
/// [`tempfile::tempfile_in`], which have no name from the start (`O_TMPFILE`
/// on Linux, or unlinked at once): the kernel frees them when the stream
/// drops them, and nothing is left behind if the process dies. While in use
/// they show in `/proc/<pid>/fd` as `<dir>/… (deleted)`.
///
/// Writes and reads are synchronous. With `rt::relay_with_overflow` they
/// run inline, from inside the relay driver's `poll` under the connection's
/// lock, as nginx writes `proxy_temp_path` files from its event loop: they
/// go to the page cache, and the disk catches up in the background. A
/// `gateway::Gateway` runs them on tokio's blocking pool instead (see
/// [`Overflow::spawn`]), so a disk that stalls holds up the slow caller's
/// stream alone, not the worker's connection; do the same elsewhere by
/// wrapping the store in an [`Overflow`] whose `spawn` hands the jobs to a
/// thread.
///
/// Every file the store makes draws on one budget of bytes on disk (default
/// [`DEFAULT_BUDGET`](Self::DEFAULT_BUDGET)), so one store shared by all of
/// a gateway's connections bounds them together. An append past it fails,
/// which gives up that stream alone
/// ([`BodyError::Overflow`](worker_relay::rt::BodyError::Overflow)). A stream's
/// bytes are in files of up to 64 MiB; a file's bytes return to the budget
/// when it has been read to its end, or when its stream is dropped. So the
/// disk in use follows the callers' reading, and the store's open files
/// number at most one per slow stream plus one per 64 MiB of its budget
/// (128 with the default).
#[derive(Debug, Clone)]
pub struct TempFileOverflow {
    dir: Arc<Path>,
    budget: Arc<Budget>,
    segment: u64,
}

impl TempFileOverflow {
    /// The default budget, 8 GiB for all the streams of the store: room for
    /// eight responses at nginx's `proxy_max_temp_file_size` (1 GiB), or 40
    /// slow callers each 200 MiB behind, or two workers at their 4 GiB
    /// [`OverflowConfig::max_total`](worker_relay::proto::OverflowConfig::max_total);
    /// small enough next to the temporary directory of a server that a flood
    /// of slow callers fails their streams, not the disk.
    pub const DEFAULT_BUDGET: u64 = 8 << 30;

    /// A store making its files in `dir`, holding at most `budget` bytes in
    /// them together.
    pub fn new(dir: impl Into<PathBuf>, budget: u64) -> TempFileOverflow {
        TempFileOverflow {
            dir: dir.into().into(),
            budget: Budget::new(budget),
            segment: SEGMENT,
        }
    }

    /// Where the files are made.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The bytes in its files now, all together.
    pub fn held(&self) -> u64 {
        self.budget.held()
    }

    /// The bound of [`held`](Self::held).
    pub fn budget(&self) -> u64 {
        self.budget.limit()
    }
}

impl Default for TempFileOverflow {
    /// A store in [`std::env::temp_dir`] (`$TMPDIR`, else `/tmp` on Unix)
    /// with [`DEFAULT_BUDGET`](Self::DEFAULT_BUDGET).
    fn default() -> TempFileOverflow {
        TempFileOverflow::new(std::env::temp_dir(), TempFileOverflow::DEFAULT_BUDGET)
    }
}

impl Overflow for TempFileOverflow {
    fn create(&self) -> io::Result<Box<dyn OverflowFile>> {
        Ok(Box::new(TempFiles {
            dir: self.dir.clone(),
            budget: self.budget.clone(),
            segment: self.segment,
            segments: VecDeque::new(),
        }))
    }
}

/// One stream's files, oldest first: read from the front, written at the
/// back.
struct TempFiles {
    dir: Arc<Path>,
    budget: Arc<Budget>,
    segment: u64,
    segments: VecDeque<Segment>,
}

struct Segment {
    file: File,
    /// Bytes written (and counted in the budget).
    len: u64,
    /// Bytes read back.
    read: u64,
}

impl TempFiles {
    /// The file to append to, a new one when the last is full.
    fn back(&mut self) -> io::Result<&mut Segment> {
        if self.segments.back().is_none_or(|s| s.len >= self.segment) {
            let file = tempfile::tempfile_in(&self.dir)?;
            self.segments.push_back(Segment {
                file,
                len: 0,
                read: 0,
            });
        }
        Ok(self.segments.back_mut().expect("pushed"))
    }
}

impl OverflowFile for TempFiles {
    fn append(&mut self, data: Bytes) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let n = data.len() as u64;
        self.budget.take(n, io::ErrorKind::StorageFull)?;
        let written = self.back().and_then(|s| {
            s.file.seek(SeekFrom::Start(s.len))?;
            s.file.write_all(&data)?;
            s.len += n;
            Ok(())
        });
        if written.is_err() {
            // Not counted in any segment. (A partial write stays in the
            // file until it is dropped, which a failed stream soon is.)
            self.budget.give(n);
        }
        written
    }

    fn read(&mut self, max: usize) -> io::Result<Bytes> {
        let more = self.segments.len() > 1;
        let Some(front) = self.segments.front_mut() else {
            return Ok(Bytes::new());
        };
        let n = (front.len - front.read).min(max as u64);
        let mut buf = Vec::with_capacity(n as usize);
        front.file.seek(SeekFrom::Start(front.read))?;
        (&mut front.file).take(n).read_to_end(&mut buf)?;
        if buf.len() as u64 != n {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        front.read += n;
        if front.read == front.len && front.len > 0 {
            // Read to its end: its bytes return to the budget, and the
            // file is freed (or, the last one, emptied to be written again).
            self.budget.give(front.len);
            (front.len, front.read) = (0, 0);
            if more {
                self.segments.pop_front();
            } else {
                front.file.set_len(0)?;
            }
        }
        Ok(Bytes::from(buf))
    }
}

impl Drop for TempFiles {
    fn drop(&mut self) {
        let held: u64 = self.segments.iter().map(|s| s.len).sum();
        self.budget.give(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store in a fresh directory, with `segment`-byte files.
    fn store(budget: u64, segment: u64) -> (TempFileOverflow, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TempFileOverflow::new(dir.path(), budget);
        store.segment = segment;
        (store, dir)
    }

    /// The files this process holds open in `dir`, unlinked.
    #[cfg(target_os = "linux")]
    fn open_in(dir: &Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter(|e| {
                std::fs::read_link(e.path()).is_ok_and(|t| {
                    t.starts_with(dir) && t.to_string_lossy().ends_with(" (deleted)")
                })
            })
            .count()
    }

    fn pattern(from: usize, n: usize) -> Bytes {
        (from..from + n).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn bytes_come_back_in_order_in_pieces_of_any_size() {
        let (store, dir) = store(1 << 20, 1000);
        let mut f = store.create().unwrap();
        let (mut written, mut got) = (0, Vec::new());
        // Appends and reads interleaved, across many 1000-byte files.
        for round in 0..50 {
            for n in [1, 700, 0, 2500, 999] {
                f.append(pattern(written, n)).unwrap();
                written += n;
            }
            let piece = f.read(37 * round + 1).unwrap();
            assert!(!piece.is_empty() && piece.len() <= 37 * round + 1);
            got.extend_from_slice(&piece);
        }
        assert!(store.held() > 0);
        loop {
            let piece = f.read(4096).unwrap();
            if piece.is_empty() {
                break;
            }
            got.extend_from_slice(&piece);
        }
        assert_eq!(got, pattern(0, written));
        assert_eq!(store.held(), 0, "read back: returned to the budget");
        // Drained, it takes bytes again.
        f.append(pattern(0, 10)).unwrap();
        assert_eq!(f.read(100).unwrap(), pattern(0, 10));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_file_read_to_its_end_is_freed() {
        let (store, _dir) = store(1 << 20, 1000);
        let mut f = store.create().unwrap();
        for i in 0..5 {
            f.append(pattern(i * 1000, 1000)).unwrap();
        }
        assert_eq!(store.held(), 5000);
        // Half of the first file read: it is still on disk, and counted.
        assert_eq!(f.read(500).unwrap(), pattern(0, 500));
        assert_eq!(store.held(), 5000);
        #[cfg(target_os = "linux")]
        assert_eq!(open_in(store.dir()), 5);
        assert_eq!(f.read(800).unwrap(), pattern(500, 500));
        assert_eq!(store.held(), 4000);
        #[cfg(target_os = "linux")]
        assert_eq!(open_in(store.dir()), 4);
    }

    #[test]
    fn the_files_of_one_store_share_its_budget() {
        let (store, _dir) = store(10_000, 3000);
        let mut a = store.create().unwrap();
        let mut b = store.clone().create().unwrap();
        a.append(pattern(0, 3000)).unwrap();
        a.append(pattern(3000, 3000)).unwrap();
        let err = b.append(pattern(0, 5000)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        b.append(pattern(0, 4000)).unwrap();
        assert_eq!(store.held(), 10_000);
        assert!(a.append(pattern(0, 1)).is_err(), "full for every file");
        // The first file of `a` (3000 bytes) read to its end: returned.
        assert_eq!(a.read(4096).unwrap(), pattern(0, 3000));
        assert_eq!(store.held(), 7000);
        b.append(pattern(4000, 3000)).unwrap();
        drop(a);
        drop(b);
        assert_eq!(store.held(), 0, "dropped: returned");
        let mut c = store.create().unwrap();
        c.append(pattern(0, 10_000)).unwrap();
    }

    #[test]
    fn nothing_is_left_in_the_directory() {
        let (store, dir) = store(1 << 20, 1000);
        let mut files: Vec<_> = (0..3).map(|_| store.create().unwrap()).collect();
        for f in &mut files {
            for i in 0..3 {
                f.append(pattern(i * 1000, 1000)).unwrap();
            }
        }
        // In use, the files have no name in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        #[cfg(target_os = "linux")]
        assert_eq!(open_in(dir.path()), 9);
        drop(files);
        assert_eq!(store.held(), 0);
        #[cfg(target_os = "linux")]
        assert_eq!(open_in(dir.path()), 0, "the files are closed");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_directory_that_cannot_hold_files_fails_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = TempFileOverflow::new(dir.path().join("missing"), 1 << 20);
        let mut f = store.create().unwrap();
        assert!(f.append(pattern(0, 10)).is_err());
        assert_eq!(store.held(), 0, "a failed append is not counted");
    }
}
