//! Where the examples' log lines go: into a buffer in memory, which a
//! thread of its own writes to stderr. An ordinary line is written at once;
//! access-log lines (one per request) gather for up to 50 ms or 64 KiB, as
//! nginx's `access_log … buffer=… flush=…` does, so that a request costs
//! the serving thread a copy under a lock, not a write nor a thread wake-up.
//! (A wake-up per line was a fifth of a relay's CPU on one core: BENCHMARKS.md.)
//! A serving thread never waits for the output: past 4 MiB unwritten
//! (stderr is not being read, or the thread could not start) a line is
//! dropped and counted, as `tracing-appender`'s non-blocking writer does
//! (lossy by default); once the output takes lines again, the count is
//! written where the lines were lost, after the lines before them and
//! before any after (`<name>: N log lines dropped: …`, or a JSON object). A
//! write error drops the batch, counted the same way. At the end the guard
//! waits at most a second for the rest to be written (a stuck stderr must
//! not keep a stopping process alive), as `tracing-appender`'s guard does.
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
/// Past this much unwritten, lines are dropped (and counted).
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
    /// The guard, at the end, waits on it.
    room: Condvar,
    /// The line saying how many lines were dropped.
    notice: Notice,
}

/// Makes the line that says how many lines were dropped (with its `\n`).
pub type Notice = Box<dyn Fn(u64) -> String + Send + Sync>;

#[derive(Default)]
struct State {
    buf: Vec<u8>,
    /// A line that should not wait is in `buf`.
    urgent: bool,
    closed: bool,
    /// The writing thread has written all and ended.
    finished: bool,
    /// Lines dropped since the output last took a batch.
    dropped: u64,
}

/// A writer to `out` and its guard, the writing thread started; `notice`
/// makes the line that says how many lines were dropped.
pub fn start<W: Write + Send + 'static>(out: W, notice: Notice) -> (BatchWriter, Guard) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        wake: Condvar::new(),
        room: Condvar::new(),
        notice,
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

    /// Never waits for the output: past the bound the line is dropped.
    fn push(&self, line: &[u8], urgent: bool) {
        let mut st = self.lock();
        if st.closed && st.finished {
            // The guard is gone (the program is ending) and the output
            // took everything: straight out.
            drop(st);
            let _ = io::stderr().write_all(line);
            return;
        }
        if st.buf.len() + line.len() > BOUND {
            st.dropped += 1;
            return;
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
            // Dropped while this batch waited: they come after it.
            let dropped = std::mem::take(&mut st.dropped);
            let closed = st.closed && st.buf.is_empty();
            drop(st);
            if dropped > 0 || !batch.is_empty() {
                let lines = batch.iter().filter(|&&b| b == b'\n').count() as u64;
                if dropped > 0 {
                    batch.extend_from_slice((self.notice)(dropped).as_bytes());
                }
                if out.write_all(&batch).and_then(|()| out.flush()).is_err() {
                    // Lost: counted, to be told when the output works.
                    self.lock().dropped += lines + dropped;
                }
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

impl BatchWriter {
    /// Where access-log lines can be written without an event: batched as
    /// the access target's events are.
    pub fn access_lines(&self) -> AccessLines {
        AccessLines(self.shared.clone())
    }
}

/// Writes access-log lines into the batch ([`BatchWriter::access_lines`]).
#[derive(Clone)]
pub struct AccessLines(Arc<Shared>);

impl AccessLines {
    /// One line, with its `\n`, into the batch (dropped and counted past
    /// the bound, as any line).
    pub fn push(&self, line: &[u8]) {
        self.0.push(line, false);
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
            urgent: meta.target() != worker_relay_hyper::gateway::ACCESS_TARGET,
        }
    }
}
