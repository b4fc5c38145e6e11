//! A conformance kit for the Worker Relay Protocol: it drives a relay or a
//! worker written in any language over the network, case by case, and
//! reports which section of the spec each failure breaks.
//!
//! ```sh
//! # A relay: the kit plays worker `abc` (its connect token in the
//! # environment) and the HTTP callers.
//! STRATA_WORKER_CONNECT_TOKEN=… worker-relay-conformance \
//!     relay --url http://127.0.0.1:8080 --worker-id abc
//!
//! # A worker: the kit plays the relay; point the worker at
//! # ws://127.0.0.1:9000/connect.
//! STRATA_WORKER_CONNECT_TOKEN=… STRATA_WORKER_TOKEN=… worker-relay-conformance \
//!     worker --listen 127.0.0.1:9000 --app example
//! ```
//!
//! One line per case, `PASS|FAIL|SKIP|INFO <case> <section> <figure>`, then
//! `N passed, N failed`; `--json FILE` for CI; exit status 1 if a case
//! failed. The frames are built and read with the crate's `frame` layer,
//! but the kit talks raw WebSocket and raw HTTP (not the crate's state
//! machines), so it can send what a broken peer would.

use std::process::ExitCode;
use worker_relay_conformance::{cli, kit, report, runner};

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match cli::parse(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("conformance: {e}\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    if cfg.list {
        let lines = match cfg.mode {
            cli::Mode::Relay(_) => runner::list(&kit::relay_cases(), &cfg.selection),
            cli::Mode::Worker(_) => runner::list(&kit::worker_cases(), &cfg.selection),
        };
        for l in lines {
            println!("{l}");
        }
        return ExitCode::SUCCESS;
    }
    let run = match kit::run(&cfg, true).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("conformance: {e}");
            return ExitCode::from(2);
        }
    };
    let summary = report::summarize(&run.results);
    println!("{}", summary.line());
    if let Some(path) = &cfg.json {
        if let Err(e) = kit::write_json(path, &run) {
            eprintln!("conformance: cannot write {path}: {e}");
            return ExitCode::from(2);
        }
    }
    if let Some(path) = &cfg.junit {
        if let Err(e) = kit::write_junit(path, &run, cfg.strict) {
            eprintln!("conformance: cannot write {path}: {e}");
            return ExitCode::from(2);
        }
    }
    if summary.failed > 0 || (cfg.strict && summary.warned > 0) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
