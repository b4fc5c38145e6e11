//! A relay connection's overflow stores, run off its lock: each stream's
//! appends and reads queue up in order, and one job at a time works through
//! them with the stream's [`OverflowFile`], wherever the store's
//! [`Overflow::spawn`] runs it (inline for a store that declines). What a
//! job finds comes back through [`Io`], which the connection drains under its
//! lock and which wakes the tasks waiting for it.

use super::overflow::{Overflow, OverflowFile, OverflowJob};
use super::side::lock;
use crate::proto::StreamKey;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::task::Waker;

/// Bytes a connection hands to its stores and has not seen appended yet,
/// before it takes another chunk from the machine: past it, spilled chunks
/// wait in the machine, counted in its `max_unread_bytes`, so a store that
/// cannot keep up costs memory only within the connection's bounds.
pub(crate) const APPENDING_MAX: usize = crate::frame::MAX_CHUNK_BODY;

/// What a store's job reports back to its connection.
#[derive(Debug)]
pub(crate) enum Done {
    /// The bytes of a refill, read from the store.
    Read(Bytes),
    /// The store failed (`create`, `append` or `read`): the stream is given
    /// up, its later operations were dropped.
    Failed,
}

/// A connection's side of its stores: what their jobs completed, and whom
/// to wake for it.
#[derive(Clone, Default)]
pub(crate) struct Io(Arc<Mutex<IoState>>);

#[derive(Default)]
struct IoState {
    done: VecDeque<(StreamKey, Done)>,
    /// Woken at the next completion.
    wakers: Vec<Waker>,
    /// Operations queued or running in the connection's stores.
    pending: usize,
    /// Bytes of the appends among them.
    appending: usize,
}

impl Io {
    /// Bytes handed to the stores and not appended yet.
    pub(crate) fn appending(&self) -> usize {
        lock(&self.0).appending
    }

    /// Takes what the stores completed; while operations are still pending,
    /// `waker` (if any) is woken at the next completion.
    pub(crate) fn take_done(&self, waker: Option<&Waker>) -> VecDeque<(StreamKey, Done)> {
        let mut st = lock(&self.0);
        if st.pending > 0 {
            if let Some(w) = waker {
                st.watch(w);
            }
        }
        std::mem::take(&mut st.done)
    }

    /// Wakes `waker` at the next completion, if an operation is pending.
    pub(crate) fn watch(&self, waker: Option<&Waker>) {
        let mut st = lock(&self.0);
        if let (true, Some(w)) = (st.pending > 0, waker) {
            st.watch(w);
        }
    }

    /// Records the end of operations (`ops` of them, `appended` bytes of
    /// appends), and `done` if any; wakes the watchers.
    fn complete(&self, ops: usize, appended: usize, done: Option<(StreamKey, Done)>) {
        let wakers = {
            let mut st = lock(&self.0);
            st.pending -= ops;
            st.appending -= appended;
            st.done.extend(done);
            std::mem::take(&mut st.wakers)
        };
        wakers.into_iter().for_each(Waker::wake);
    }
}

impl IoState {
    fn watch(&mut self, w: &Waker) {
        if !self.wakers.iter().any(|x| x.will_wake(w)) {
            self.wakers.push(w.clone());
        }
    }
}

enum Op {
    Append(Bytes),
    Read(usize),
}

impl Op {
    fn appending(&self) -> usize {
        match self {
            Op::Append(d) => d.len(),
            Op::Read(_) => 0,
        }
    }
}

/// One stream's store: made by its first operation, dropped (away from the
/// connection, like its operations) when this handle is.
pub(crate) struct StreamStore {
    key: StreamKey,
    pipe: Arc<Mutex<Pipe>>,
    io: Io,
    overflow: Arc<dyn Overflow>,
}

#[derive(Default)]
struct Pipe {
    /// The store, once made; with the running job while it works.
    file: Option<Box<dyn OverflowFile>>,
    ops: VecDeque<Op>,
    /// A job is working through `ops`.
    running: bool,
    /// The stream is done with the store: drop it, and what is queued.
    closed: bool,
    /// The store failed: what is queued is dropped.
    failed: bool,
}

impl Pipe {
    /// Drops the queued operations; their count and appended bytes.
    fn drop_ops(&mut self) -> (usize, usize) {
        let appending = self.ops.iter().map(Op::appending).sum();
        let n = self.ops.len();
        self.ops.clear();
        (n, appending)
    }
}

impl StreamStore {
    pub(crate) fn new(key: StreamKey, io: &Io, overflow: &Arc<dyn Overflow>) -> StreamStore {
        StreamStore {
            key,
            pipe: Arc::default(),
            io: io.clone(),
            overflow: overflow.clone(),
        }
    }

    /// Appends `data` after everything queued before it.
    pub(crate) fn append(&self, data: Bytes) {
        if !data.is_empty() {
            self.push(Op::Append(data));
        }
    }

    /// Reads up to `max` bytes from the front, after everything queued
    /// before it; they come back as [`Done::Read`].
    pub(crate) fn read(&self, max: usize) {
        self.push(Op::Read(max));
    }

    fn push(&self, op: Op) {
        {
            let mut st = lock(&self.io.0);
            st.pending += 1;
            st.appending += op.appending();
        }
        let start = {
            let mut p = lock(&self.pipe);
            p.ops.push_back(op);
            !std::mem::replace(&mut p.running, true)
        };
        if start {
            let job = Drain {
                key: self.key,
                pipe: self.pipe.clone(),
                io: self.io.clone(),
                overflow: self.overflow.clone(),
                ran: false,
            };
            run(&self.overflow, Box::new(move || job.run()));
        }
    }
}

impl Drop for StreamStore {
    fn drop(&mut self) {
        let (file, (ops, appending)) = {
            let mut p = lock(&self.pipe);
            p.closed = true;
            if p.running {
                // The job drops the store, and what is queued.
                return;
            }
            (p.file.take(), p.drop_ops())
        };
        self.io.complete(ops, appending, None);
        if let Some(file) = file {
            // Closing a file may wait for the disk too.
            run(&self.overflow, Box::new(move || drop(file)));
        }
    }
}

/// Runs `job` where the store says, or here.
fn run(overflow: &Arc<dyn Overflow>, job: OverflowJob) {
    if let Err(job) = overflow.spawn(job) {
        job();
    }
}

/// The job working through one stream's operations, in order.
struct Drain {
    key: StreamKey,
    pipe: Arc<Mutex<Pipe>>,
    io: Io,
    overflow: Arc<dyn Overflow>,
    ran: bool,
}

impl Drain {
    fn run(mut self) {
        self.ran = true;
        loop {
            let (op, file) = {
                let mut p = lock(&self.pipe);
                if p.closed || p.failed {
                    p.running = false;
                    let file = p.file.take();
                    let (ops, appending) = p.drop_ops();
                    drop(p);
                    drop(file);
                    self.io.complete(ops, appending, None);
                    return;
                }
                let Some(op) = p.ops.pop_front() else {
                    p.running = false;
                    return;
                };
                (op, p.file.take())
            };
            let appending = op.appending();
            let mut file = match file {
                Some(f) => Ok(f),
                None => self.overflow.create(),
            };
            let mut done = match (&mut file, op) {
                (Ok(f), Op::Append(data)) => f.append(data).err().map(|_| Done::Failed),
                (Ok(f), Op::Read(max)) => Some(f.read(max).map_or(Done::Failed, Done::Read)),
                (Err(_), _) => Some(Done::Failed),
            };
            {
                let mut p = lock(&self.pipe);
                p.file = file.ok();
                p.failed |= matches!(done, Some(Done::Failed));
                if p.closed {
                    // The stream is done with this store (it may have
                    // another by now): nothing of it goes back.
                    done = None;
                }
            }
            self.io.complete(1, appending, done.map(|d| (self.key, d)));
        }
    }
}

impl Drop for Drain {
    fn drop(&mut self) {
        if self.ran {
            return;
        }
        // Dropped unrun (its executor shut down): the stream cannot go on.
        let (file, (ops, appending), closed) = {
            let mut p = lock(&self.pipe);
            p.running = false;
            p.failed = true;
            (p.file.take(), p.drop_ops(), p.closed)
        };
        drop(file);
        let done = (!closed).then_some((self.key, Done::Failed));
        self.io.complete(ops, appending, done);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::MemoryOverflow;

    /// A memory store whose jobs wait in a queue until the test runs them.
    #[derive(Default)]
    struct Deferred {
        inner: MemoryOverflow,
        jobs: Mutex<Vec<OverflowJob>>,
    }

    impl Overflow for Deferred {
        fn create(&self) -> std::io::Result<Box<dyn OverflowFile>> {
            self.inner.create()
        }
        fn spawn(&self, job: OverflowJob) -> Result<(), OverflowJob> {
            self.jobs.lock().unwrap().push(job);
            Ok(())
        }
    }

    fn run_jobs(d: &Deferred) -> usize {
        let jobs = std::mem::take(&mut *d.jobs.lock().unwrap());
        let n = jobs.len();
        jobs.into_iter().for_each(|j| j());
        n
    }

    fn key() -> StreamKey {
        StreamKey(1)
    }

    #[test]
    fn operations_run_in_order_in_one_job_off_the_caller() {
        let d = Arc::new(Deferred::default());
        let ov: Arc<dyn Overflow> = d.clone();
        let io = Io::default();
        let s = StreamStore::new(key(), &io, &ov);
        s.append(Bytes::from_static(b"hello "));
        s.append(Bytes::from_static(b"world"));
        s.read(8);
        s.read(100);
        assert_eq!(io.appending(), 11, "nothing ran yet");
        assert!(io.take_done(None).is_empty());
        assert_eq!(run_jobs(&d), 1, "one job for the stream");
        let done: Vec<_> = io.take_done(None).into_iter().collect();
        // (A memory store's read stops at the end of a chunk.)
        assert!(matches!(&done[..], [(_, Done::Read(a)), (_, Done::Read(b))]
            if a == "hello " && b == "world"));
        assert_eq!(io.appending(), 0);
        assert_eq!(d.inner.held(), 0);
    }

    #[test]
    fn a_dropped_store_is_closed_by_its_job_and_a_job_dropped_unrun_fails_it() {
        let d = Arc::new(Deferred::default());
        let ov: Arc<dyn Overflow> = d.clone();
        let io = Io::default();
        let s = StreamStore::new(key(), &io, &ov);
        s.append(Bytes::from_static(b"abc"));
        run_jobs(&d);
        assert_eq!(d.inner.held(), 3);
        s.append(Bytes::from_static(b"def"));
        drop(s);
        // The job sees the stream gone: it drops the store and the append.
        run_jobs(&d);
        assert_eq!((d.inner.held(), io.appending()), (0, 0));
        assert!(io.take_done(None).is_empty());

        let s = StreamStore::new(key(), &io, &ov);
        s.append(Bytes::from_static(b"abc"));
        d.jobs.lock().unwrap().clear();
        assert!(matches!(
            io.take_done(None).pop_front(),
            Some((_, Done::Failed))
        ));
        assert_eq!(io.appending(), 0);
    }
}
