//! The worker example: the worker program of the crate `worker-relay-cli`
//! (`cli/src/worker.rs`, installed as `worker-relay worker`), as an example.
//!
//! ```sh
//! STRATA_WORKER_CONNECT_TOKEN=… STRATA_WORKER_TOKEN=… \
//!     cargo run --release --example worker -- --connect ws://127.0.0.1:8080/connect
//! ```
//!
//! `--help` prints the options and exit statuses. The tokens are taken out
//! of the environment (zeroed, then removed) first thing in
//! `worker::main`, while this process has one thread.

fn main() -> std::process::ExitCode {
    worker_relay_cli::worker::main("worker", std::env::args().skip(1).collect())
}
