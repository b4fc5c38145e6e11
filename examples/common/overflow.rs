//! The relay's overflow on disk: one temporary file per slow response,
//! unlinked as soon as it is made (the kernel frees it when the relay drops
//! it, or dies), so nothing is left behind.
#![allow(dead_code)] // shared by several examples and tests, each using a part

use bytes::Bytes;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use worker_relay::rt::{Overflow, OverflowFile};

/// Makes the temporary files in `dir`.
pub struct TempFiles {
    dir: PathBuf,
    next: AtomicU64,
}

impl TempFiles {
    pub fn new(dir: PathBuf) -> TempFiles {
        TempFiles {
            dir,
            next: AtomicU64::new(0),
        }
    }
}

/// The name prefix of the relay's overflow files (they show in
/// `/proc/<pid>/fd` as `… (deleted)` while in use).
pub const PREFIX: &str = "worker-relay-overflow-";

impl Overflow for TempFiles {
    fn create(&self) -> io::Result<Box<dyn OverflowFile>> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{PREFIX}{}-{n}", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        // Unlinked at once: the data lives as long as the handle.
        let kept = std::fs::remove_file(&path).err().map(|_| path);
        Ok(Box::new(TempFile {
            file,
            read_at: 0,
            write_at: 0,
            kept,
        }))
    }
}

struct TempFile {
    file: File,
    read_at: u64,
    write_at: u64,
    /// Where the file still is, if it could not be unlinked while open.
    kept: Option<PathBuf>,
}

impl OverflowFile for TempFile {
    fn append(&mut self, data: Bytes) -> io::Result<()> {
        self.file.seek(SeekFrom::Start(self.write_at))?;
        self.file.write_all(&data)?;
        self.write_at += data.len() as u64;
        Ok(())
    }

    fn read(&mut self, max: usize) -> io::Result<Bytes> {
        let n = (self.write_at - self.read_at).min(max as u64) as usize;
        let mut buf = vec![0u8; n];
        self.file.seek(SeekFrom::Start(self.read_at))?;
        self.file.read_exact(&mut buf)?;
        self.read_at += n as u64;
        if self.read_at == self.write_at {
            // Everything was read back: start over, so the file never grows
            // past what is waiting at once.
            self.read_at = 0;
            self.write_at = 0;
            self.file.set_len(0)?;
        }
        Ok(Bytes::from(buf))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.kept.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}
