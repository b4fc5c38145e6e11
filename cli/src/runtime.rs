//! The programs' tokio runtime: `--threads N` threads (1: everything on
//! the calling thread), or one per core by default.

/// A runtime with `threads` worker threads.
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
