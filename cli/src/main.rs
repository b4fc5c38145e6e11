//! `worker-relay`: the relay (`worker-relay relay`) and the worker
//! (`worker-relay worker`) of the Worker Relay Protocol, one binary.

use std::process::ExitCode;

/// `--help` without a command.
const HELP: &str = "\
The Worker Relay Protocol's relay and worker: a worker behind NAT dials one
WebSocket out to a relay, which presents it at an HTTP URL and forwards each
request over that socket.

usage: worker-relay relay --listen HOST:PORT --tokens FILE [options]
       worker-relay worker --connect wss://HOST:PORT/connect [options]
       worker-relay --help | --version

commands:
  relay       presents the workers that dial it at http://HOST:PORT/w/<id>/...
              (worker-relay relay --help: its options and exit statuses)
  worker      dials a relay and serves a small app, or a local HTTP server
              (--upstream), through it; tokens from the environment only
              (worker-relay worker --help: its options and exit statuses)

options:
  -h, --help      this help
  -V, --version   the version

exit status:
  0  --help, --version
  2  no command, or an unknown one
  otherwise the command's (its --help says which)
";

fn main() -> ExitCode {
    // Nothing here starts a thread or reads the environment: the worker
    // takes its tokens out of the environment first thing in
    // `worker::main`, while the process still has one thread.
    let mut args = std::env::args().skip(1);
    let command = args.next();
    let rest: Vec<String> = args.collect();
    match command.as_deref() {
        Some("relay") => worker_relay_cli::relay::main("worker-relay relay", rest),
        Some("worker") => worker_relay_cli::worker::main("worker-relay worker", rest),
        Some("-h" | "--help" | "help") => {
            print!("{}", help());
            ExitCode::SUCCESS
        }
        Some("-V" | "--version") => {
            println!("worker-relay {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some(other) => bad(&format!("unknown command {other}")),
        None => bad("a command is required: relay or worker"),
    }
}

/// The help, the version on its first line.
fn help() -> String {
    format!("worker-relay {}\n\n{HELP}", env!("CARGO_PKG_VERSION"))
}

/// A bad command line: the error and the usage on stderr, status 2.
fn bad(error: &str) -> ExitCode {
    eprintln!(
        "worker-relay: {error}\n\
         usage: worker-relay relay --listen HOST:PORT --tokens FILE [options]\n       \
         worker-relay worker --connect wss://HOST:PORT/connect [options]\n\
         (worker-relay --help for more)"
    );
    ExitCode::from(2)
}
