//! The worker example: dials a relay and serves a small app through it.
//!
//! ```sh
//! STRATA_WORKER_CONNECT_TOKEN=… STRATA_WORKER_TOKEN=… \
//!     cargo run --release --example worker -- --connect ws://127.0.0.1:8080/connect
//! ```
//!
//! Both tokens are read from the environment (never the command line) and
//! removed from it at start, their bytes zeroed first, so a process running
//! under the same uid cannot read them from `/proc/<pid>/environ`.

#[path = "common/secrets.rs"]
mod secrets;
#[path = "common/worker_app.rs"]
mod worker_app;
#[path = "common/ws.rs"]
mod ws;

use std::process::ExitCode;
use worker_relay::connect::Token;

fn main() -> ExitCode {
    // First thing, before any thread exists: take the secrets out of the environment.
    let connect_token = secrets::take_env("STRATA_WORKER_CONNECT_TOKEN");
    let worker_token = secrets::take_env("STRATA_WORKER_TOKEN");

    let mut url = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--connect" => url = args.next(),
            _ => {
                eprintln!("usage: worker --connect ws://HOST:PORT/connect");
                return ExitCode::from(2);
            }
        }
    }
    let Some(url) = url.filter(|u| u.starts_with("ws://") || u.starts_with("wss://")) else {
        eprintln!("usage: worker --connect ws://HOST:PORT/connect");
        return ExitCode::from(2);
    };
    let token = |v: Option<String>, name: &str| match Token::from_env_value(v) {
        Ok(t) => Ok(t),
        Err(e) => {
            eprintln!("worker: {name}: {e}");
            Err(ExitCode::from(2))
        }
    };
    let connect_token = match token(connect_token, "STRATA_WORKER_CONNECT_TOKEN") {
        Ok(t) => t,
        Err(c) => return c,
    };
    let worker_token = match token(worker_token, "STRATA_WORKER_TOKEN") {
        Ok(t) => t,
        Err(c) => return c,
    };
    if worker_token.is_none() {
        eprintln!("worker: STRATA_WORKER_TOKEN is not set: anyone who can reach the relay URL can use this worker");
    }
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let code = runtime.block_on(worker_app::run(worker_app::WorkerOptions {
        connect_url: url,
        connect_token,
        worker_token,
        name: "worker".into(),
    }));
    ExitCode::from(code as u8)
}
