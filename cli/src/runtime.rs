//! The programs' tokio runtime: `--threads N` threads (1: everything on
//! the calling thread, a current-thread runtime).
//!
//! The relay and the dialling worker default to [`ONE_LOOP`]: one thread,
//! as one nginx worker process. Every request of a worker goes through its
//! one WebSocket connection, driven by one task; with a thread per core,
//! each request crossed threads on its way to that task and back, and each
//! crossing was a futex wake and a context switch. On two cores shared
//! with the load generator, relay + worker used about twice the CPU per
//! request on the multi-thread runtime (BENCHMARKS.md, issue 42). For more
//! cores: `--threads N`, or one relay per core behind `--reuse-port`
//! (docs/scale-out.md). `worker --listen` (many connections, no relay)
//! keeps a thread per core.

/// The relay's and the dialling worker's threads unless `--threads` says.
pub const ONE_LOOP: usize = 1;

/// A runtime with `threads` worker threads, or one per core for `None`.
pub fn build(threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().build()
}
