//! A conformance kit for the Worker Relay Protocol: it drives a relay or a
//! worker written in any language over the network, case by case, and
//! reports which section of the spec each failure breaks.
//!
//! ```sh
//! # A relay: the kit plays worker `abc` (its connect token in the
//! # environment) and the HTTP callers.
//! STRATA_WORKER_CONNECT_TOKEN=… cargo run --example conformance -- \
//!     relay --url http://127.0.0.1:8080 --worker-id abc
//!
//! # A worker: the kit plays the relay; point the worker at
//! # ws://127.0.0.1:9000/connect.
//! STRATA_WORKER_CONNECT_TOKEN=… STRATA_WORKER_TOKEN=… cargo run --example conformance -- \
//!     worker --listen 127.0.0.1:9000 --app example
//! ```
//!
//! One line per case, `PASS|FAIL|SKIP|INFO <case> <section> <figure>`, then
//! `N passed, N failed`; `--json FILE` for CI; exit status 1 if a case
//! failed. The frames are built and read with the crate's `frame` layer,
//! but the kit talks raw WebSocket and raw HTTP (not the crate's state
//! machines), so it can send what a broken peer would.

#[path = "conformance/cli.rs"]
mod cli;
#[path = "conformance/exec.rs"]
mod exec;
#[path = "conformance/http.rs"]
mod http;
#[path = "conformance/junit.rs"]
mod junit;
#[path = "conformance/kit.rs"]
mod kit;
#[path = "conformance/relay_cases_caller.rs"]
mod relay_cases_caller;
#[path = "conformance/relay_cases_conn.rs"]
mod relay_cases_conn;
#[path = "conformance/relay_cases_faults.rs"]
mod relay_cases_faults;
#[path = "conformance/relay_cases_http.rs"]
mod relay_cases_http;
#[path = "conformance/relay_cases_interactive.rs"]
mod relay_cases_interactive;
#[path = "conformance/relay_cases_slow.rs"]
mod relay_cases_slow;
#[path = "conformance/relay_cases_token.rs"]
mod relay_cases_token;
#[path = "conformance/relay_cases_unread.rs"]
mod relay_cases_unread;
#[path = "conformance/relay_ctx.rs"]
mod relay_ctx;
#[path = "conformance/relay_observe.rs"]
mod relay_observe;
#[path = "conformance/report.rs"]
mod report;
#[path = "conformance/runner.rs"]
mod runner;
#[path = "conformance/tcp_state.rs"]
mod tcp_state;
#[path = "conformance/worker_app_contract.rs"]
mod worker_app_contract;
#[path = "conformance/worker_cases_bounds.rs"]
mod worker_cases_bounds;
#[path = "conformance/worker_cases_conn.rs"]
mod worker_cases_conn;
#[path = "conformance/worker_cases_interactive.rs"]
mod worker_cases_interactive;
#[path = "conformance/worker_cases_robust.rs"]
mod worker_cases_robust;
#[path = "conformance/worker_cases_streams.rs"]
mod worker_cases_streams;
#[path = "conformance/worker_ctx.rs"]
mod worker_ctx;
#[path = "conformance/worker_observe.rs"]
mod worker_observe;
#[path = "conformance/ws_send.rs"]
mod ws_send;

use std::process::ExitCode;

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
