//! The relay example: the relay program of the crate `worker-relay-cli`
//! (`cli/src/relay.rs`, installed as `worker-relay relay`), as an example.
//!
//! ```sh
//! cargo run --release --example relay -- --listen 127.0.0.1:8080 --tokens tokens.txt
//! ```
//!
//! `--help` prints the options and exit statuses.

fn main() -> std::process::ExitCode {
    worker_relay_cli::relay::main("relay", std::env::args().skip(1).collect())
}
