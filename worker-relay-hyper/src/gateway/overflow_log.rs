//! The gateway's overflow store, saying in the log why a slow caller's
//! stream was given up: its budget spent, or the disk full (`ENOSPC`), or
//! any other error of the store. The access log then shows `end=overflow`
//! for the request, and this line says what to fix.
//!
//! Its work runs where the store says, else on tokio's blocking pool: a
//! slow disk then holds up the slow caller's stream alone, not the worker
//! connection's lock, driver and threads.
//!
//! It also keeps the gauge `worker_relay_overflow_bytes` (feature
//! `metrics`): the bytes each store holds, appended and not yet read back,
//! for any store the gateway is given (`rt` records no metrics).

use bytes::Bytes;
use std::io;
use std::sync::Arc;
use worker_relay::rt::{Overflow, OverflowFile, OverflowJob};

/// `inner`, with every error it returns logged once, at `warn`.
pub(super) struct Logged(pub(super) Arc<dyn Overflow>);

impl Overflow for Logged {
    fn create(&self) -> io::Result<Box<dyn OverflowFile>> {
        match self.0.create() {
            Ok(file) => Ok(Box::new(LoggedFile { file, held: 0 })),
            Err(e) => Err(logged("cannot make a store", e)),
        }
    }

    fn spawn(&self, job: OverflowJob) -> Result<(), OverflowJob> {
        let job = match self.0.spawn(job) {
            Ok(()) => return Ok(()),
            Err(job) => job,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(job);
                Ok(())
            }
            // Outside a runtime (a body dropped after it): inline.
            Err(_) => Err(job),
        }
    }
}

/// A store and the bytes it holds (appended, not read back yet).
struct LoggedFile {
    file: Box<dyn OverflowFile>,
    held: u64,
}

impl OverflowFile for LoggedFile {
    fn append(&mut self, data: Bytes) -> io::Result<()> {
        let n = data.len() as u64;
        self.file
            .append(data)
            .map_err(|e| logged("cannot keep more", e))?;
        self.held += n;
        gauge(n as i64);
        Ok(())
    }

    fn read(&mut self, max: usize) -> io::Result<Bytes> {
        let data = self
            .file
            .read(max)
            .map_err(|e| logged("cannot read back", e))?;
        let n = (data.len() as u64).min(self.held);
        self.held -= n;
        gauge(-(n as i64));
        Ok(data)
    }
}

impl Drop for LoggedFile {
    fn drop(&mut self) {
        gauge(-(self.held as i64));
    }
}

/// `worker_relay_overflow_bytes` changed by `delta`.
fn gauge(delta: i64) {
    #[cfg(feature = "metrics")]
    if delta != 0 {
        crate::observe::relay::overflow_bytes(delta);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = delta;
}

/// An error ends its stream, so each stream logs at most one.
fn logged(what: &str, e: io::Error) -> io::Error {
    tracing::warn!(
        "overflow store: {what} of a slow caller's response ({e}); the stream is given up \
         (a full disk or the store's budget: see GatewayBuilder::overflow)"
    );
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Full;
    impl Overflow for Full {
        fn create(&self) -> io::Result<Box<dyn OverflowFile>> {
            Ok(Box::new(FullFile))
        }
    }
    struct FullFile;
    impl OverflowFile for FullFile {
        fn append(&mut self, _: Bytes) -> io::Result<()> {
            Err(io::Error::from_raw_os_error(28))
        }
        fn read(&mut self, _: usize) -> io::Result<Bytes> {
            Ok(Bytes::new())
        }
    }

    #[test]
    fn the_stores_error_goes_through_unchanged() {
        let store = Logged(Arc::new(Full));
        let mut file = store.create().expect("made");
        let e = file.append(Bytes::from_static(b"x")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(28), "ENOSPC kept: {e}");
        assert!(file.read(1).expect("read").is_empty());
    }
}
