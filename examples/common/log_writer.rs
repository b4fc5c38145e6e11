//! Where the examples' log lines go: into a buffer in memory, which a
//! thread of its own writes to stderr. An ordinary line is written at once;
//! access-log lines (one per request) gather for up to 50 ms or 64 KiB, as
//! nginx's `access_log … buffer=… flush=…` does, so that a request costs
//! the serving thread a copy under a lock, not a write nor a thread wake-up.
//! (A wake-up per line was a fifth of a relay's CPU on one core: BENCHMARKS.md.)
//! Past 4 MiB unwritten (stderr is not being read), writers wait, as a
//! line is never dropped for want of room. A write error drops the batch.
//! At the end the guard waits at most a second for the rest to be written
//! (a stuck stderr must not keep a stopping process alive), as
//! `tracing-appender`'s guard does.
#![allow(dead_code)] // shared by several examples, each using a part

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing_subscriber::fmt::MakeWriter;

/// How long an access-log line may wait for company.
const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// The batch is written at once when it grows past this.
const HIGH_WATER: usize = 64 << 10;
/// Writers wait while this much is unwritten.
const BOUND: usize = 4 << 20;
/// How long dropping the guard waits for the rest to be written.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// The writer of the examples' subscriber (`tracing_subscriber`'s
/// `MakeWriter`).
pub struct BatchWriter {
    shared: Arc<Shared>,
}

/// Keep it until the program ends: dropping it writes what is left and
/// stops the thread.
#[must_use = "dropping the guard stops the log"]
pub struct Guard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    /// The writing thread waits on it.
    wake: Condvar,
    /// Writers past the bound, and the guard at the end, wait on it.
    room: Condvar,
}

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    /// A line that should not wait is in `buf`.
    urgent: bool,
    closed: bool,
    /// The writing thread has written all and ended.
    finished: bool,
}

/// A writer to `out` and its guard, the writing thread started.
pub fn start<W: Write + Send + 'static>(out: W) -> (BatchWriter, Guard) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        wake: Condvar::new(),
        room: Condvar::new(),
    });
    let thread = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("log".into())
            .spawn(move || {
                shared.run(out);
                shared.lock().finished = true;
                shared.room.notify_all();
            })
            .ok()
    };
    let writer = BatchWriter {
        shared: shared.clone(),
    };
    (writer, Guard { shared, thread })
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, line: &[u8], urgent: bool) {
        let mut st = self.lock();
        if st.closed {
            // The guard is gone (the program is ending): straight out.
            drop(st);
            let _ = io::stderr().write_all(line);
            return;
        }
        while st.buf.len() >= BOUND && !st.closed {
            st = self.room.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let was_empty = st.buf.is_empty();
        st.buf.extend_from_slice(line);
        st.urgent |= urgent;
        // Wake the thread to start a batch's clock, or to write now.
        if was_empty || urgent || st.buf.len() >= HIGH_WATER {
            self.wake.notify_one();
        }
    }

    fn run<W: Write>(&self, mut out: W) {
        let mut batch = Vec::new();
        loop {
            let mut st = self.lock();
            while st.buf.is_empty() && !st.closed {
                st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if !st.urgent && !st.closed && st.buf.len() < HIGH_WATER {
                st = self
                    .wake
                    .wait_timeout(st, FLUSH_EVERY)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            std::mem::swap(&mut st.buf, &mut batch);
            st.urgent = false;
            let closed = st.closed && st.buf.is_empty();
            drop(st);
            self.room.notify_all();
            if !batch.is_empty() {
                let _ = out.write_all(&batch).and_then(|()| out.flush());
                batch.clear();
            }
            if closed {
                return;
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.closed = true;
        self.shared.wake.notify_one();
        self.shared.room.notify_all();
        let Some(thread) = self.thread.take() else {
            return;
        };
        let (st, _) = self
            .shared
            .room
            .wait_timeout_while(st, CLOSE_WAIT, |st| !st.finished)
            .unwrap_or_else(|e| e.into_inner());
        let finished = st.finished;
        drop(st);
        if finished {
            let _ = thread.join();
        }
        // Otherwise the output is stuck: the thread is left to the
        // process's end, with what it holds.
    }
}

/// One event's writer: its text goes into the buffer in one piece.
pub struct Line<'a> {
    shared: &'a Shared,
    urgent: bool,
}

impl Write for Line<'_> {
    fn write(&mut self, text: &[u8]) -> io::Result<usize> {
        self.shared.push(text, self.urgent);
        Ok(text.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchWriter {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            shared: &self.shared,
            urgent: true,
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line<'a> {
        Line {
            shared: &self.shared,
            urgent: meta.target() != worker_relay::gateway::ACCESS_TARGET,
        }
    }
}
