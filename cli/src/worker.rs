//! The worker: dials a relay and serves a small app through it, or, with
//! `--upstream`, forwards every request to a local HTTP server.
//!
//! ```sh
//! STRATA_WORKER_CONNECT_TOKEN=… STRATA_WORKER_TOKEN=… \
//!     worker-relay worker --connect ws://127.0.0.1:8080/connect \
//!     [--upstream http://127.0.0.1:8000 [--upstream-connections N]] [--ca-file CA.pem]
//! # the same program, from the repository:
//! #   cargo run --release --example worker -- --connect …
//! ```
//!
//! `wss://` URLs trust the platform's roots (`SSL_CERT_FILE` honoured) and,
//! with `--ca-file`, the certificates of that PEM file too (a private CA).
//! A plain `ws://` URL is refused unless its host is loopback (`localhost`,
//! `127.0.0.1`, `::1`): the connect token would cross the network in the
//! clear (the spec: "use wss:// anywhere but a test"). `--allow-insecure`
//! overrides that, for a network you trust.
//!
//! `--upstream-connections N` bounds the connections to the upstream server
//! (default 32), kept alive, one request at a time each; further requests
//! wait for one.
//!
//! `--listen ADDR` instead of `--connect` serves the same app on ADDR
//! directly, without a relay: the baseline the benchmarks compare with.
//! `--threads N` sets the runtime's threads (default 1 with `--connect`:
//! every request comes through one connection, and a thread per core only
//! added hand-offs between threads, BENCHMARKS.md issue 42; one per core
//! with `--listen`).
//!
//! `SIGTERM` (or Ctrl-C) drains the worker: new requests are answered 503
//! with `Retry-After: 1`, those in flight finish (at most 30 s), then the
//! connection is closed with 1001 and the process exits 0.
//!
//! Exit status: 0 after a drain, 1 when the relay refused the worker for
//! good (or it could not start), 2 for a bad command line or token.
//! `--help` prints the options.
//!
//! Both tokens are read from the environment (never the command line) and
//! removed from it at start, their bytes zeroed first, so a process running
//! under the same uid cannot read them from `/proc/<pid>/environ`.

use crate::{admin, logging, runtime, secrets, shutdown, tunnel_upstream, worker_app};
use std::process::ExitCode;
use worker_relay::connect::Token;
use worker_relay_hyper::ws::Dialer;

/// The usage lines, for the program as it was invoked (`worker`, or
/// `worker-relay worker`).
fn usage(program: &str) -> String {
    format!(
        "usage: {program} --connect wss://HOST:PORT/connect [--ca-file CA.pem] [--allow-insecure] [--upstream http://HOST:PORT [--upstream-connections N]] [--threads N] [--admin HOST:PORT] [--log-format text|json]\n       {program} --listen HOST:PORT [--threads N]   (the app served directly, no relay)"
    )
}

/// `--help`: the usage, the options, the exit statuses.
const HELP: &str = "\
Dials a relay and serves a small app (or, with --upstream, a local HTTP
server) through it. Tokens come from the environment only:
STRATA_WORKER_CONNECT_TOKEN (presented to the relay) and STRATA_WORKER_TOKEN
(callers' `Authorization: Bearer`).

options:
  --connect URL                 the relay's wss:// (or loopback ws://) connect URL
  --ca-file CA.pem              trust this PEM's certificates too (a private CA)
  --allow-insecure              allow ws:// to a host that is not loopback
  --upstream http://HOST:PORT   forward every request to this server instead of the app
  --upstream-connections N      connections to the upstream at most (default 32)
  --listen HOST:PORT            serve the app directly there, no relay
  --threads N                   runtime threads (default 1; with --listen one per core)
  --admin HOST:PORT             serve GET /metrics there
  --log-format text|json        the log's format (default text)
  -h, --help                    this help

exit status:
  0  stopped by SIGTERM or Ctrl-C after draining
  1  the relay refused the worker for good, or it could not start
  2  a bad command line, URL, CA file or token
";

/// The options that take a value.
const WITH_VALUE: &[&str] = &[
    "--connect",
    "--ca-file",
    "--upstream",
    "--upstream-connections",
    "--listen",
    "--threads",
    "--admin",
    "--log-format",
];

/// The worker program: `args` are its options (without the program's
/// name), `program` the name it was invoked as, for the usage and the
/// errors (`worker` for the example, `worker-relay worker` for the
/// installed binary). Returns the exit status `--help` documents.
///
/// Call it first thing in the process's `main`, before any other thread
/// exists: it takes both tokens out of the environment (their bytes zeroed
/// in place, then removed) before anything else, `--help` included.
pub fn main(program: &str, args: Vec<String>) -> ExitCode {
    // First thing, before any thread exists: take the secrets out of the environment.
    let connect_token = secrets::take_env("STRATA_WORKER_CONNECT_TOKEN");
    let worker_token = secrets::take_env("STRATA_WORKER_TOKEN");

    let (mut url, mut upstream, mut listen, mut threads) = (None, None, None, None);
    let mut connections = tunnel_upstream::DEFAULT_CONNECTIONS;
    let (mut ca_file, mut allow_insecure) = (None, false);
    let mut admin = None;
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}\n\n{HELP}", usage(program));
        return ExitCode::SUCCESS;
    }
    let Some(json) = logging::json_requested(&args) else {
        return bad_arg(program, "--log-format");
    };
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        if a == "--allow-insecure" {
            allow_insecure = true;
            continue;
        }
        match (a.as_str(), args.next()) {
            ("--ca-file", Some(v)) => ca_file = Some(v),
            ("--admin", Some(v)) => admin = Some(v),
            ("--log-format", Some(_)) => {} // read by logging::json_requested
            ("--connect", v) => url = v,
            ("--listen", Some(v)) => match v.parse::<std::net::SocketAddr>() {
                Ok(a) => listen = Some(a),
                Err(_) => return bad_arg(program, &a),
            },
            ("--threads", Some(v)) => match v.parse::<usize>() {
                Ok(n) if n > 0 => threads = Some(n),
                _ => return bad_arg(program, &a),
            },
            ("--upstream", Some(v)) => upstream = Some(v),
            ("--upstream-connections", Some(v)) => match v.parse::<usize>() {
                Ok(n) if n > 0 => connections = n,
                _ => return bad_arg(program, &a),
            },
            _ => return bad_arg(program, &a),
        }
    }
    let upstream = match upstream.map(|u| tunnel_upstream::Upstream::new(&u, connections)) {
        Some(None) => return bad_arg(program, "--upstream"),
        Some(Some(u)) => Some(u),
        None => None,
    };
    if let Some(addr) = listen {
        return serve_directly(addr, worker_token, threads, json);
    }
    let Some(url) = url else {
        return bad(program, "--connect (or --listen) is required".into());
    };
    // Where the token would go, decided before any lookup or dial (the
    // library's check, which every dial makes too).
    let mut dialer = Dialer::new().allow_cleartext_token(allow_insecure);
    if let Err(e) = dialer.check(&url, false) {
        eprintln!("worker: {e}");
        return ExitCode::from(2);
    }
    if let Err(e) = dialer.check(&url, true) {
        eprintln!("worker: {e} (--allow-insecure)");
        return ExitCode::from(2);
    }
    if let Some(path) = ca_file {
        let added = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|pem| dialer.clone().ca_pem(&pem).map_err(|e| e.to_string()));
        match added {
            Ok(d) => dialer = d,
            Err(e) => {
                eprintln!("worker: --ca-file {path}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let token = |v: Option<String>, name: &str| {
        Token::from_env_value(v).map_err(|e| eprintln!("worker: {name}: {e}"))
    };
    let (Ok(connect_token), Ok(worker_token)) = (
        token(connect_token, "STRATA_WORKER_CONNECT_TOKEN"),
        token(worker_token, "STRATA_WORKER_TOKEN"),
    ) else {
        return ExitCode::from(2);
    };
    let _log = logging::init("worker", json);
    if worker_token.is_none() {
        tracing::warn!("STRATA_WORKER_TOKEN is not set: anyone who can reach the relay URL can use this worker");
    }
    let opts = worker_app::WorkerOptions {
        connect_url: url,
        connect_token,
        worker_token,
        name: "worker".into(),
        dialer,
    };
    let runtime = match runtime::build(Some(threads.unwrap_or(runtime::ONE_LOOP))) {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // SIGTERM or Ctrl-C: new requests answered 503, those in flight finish
    // (at most GRACE), then the connection is closed with 1001.
    let code = runtime.block_on(async {
        // Before anything that logs a readiness line.
        let terminate = shutdown::Terminate::install();
        if let Some(addr) = admin {
            let started = admin::install().map_err(|e| e.to_string());
            let served = match started {
                Ok(handle) => admin::serve(&addr, handle, axum::Router::new())
                    .await
                    .map_err(|e| format!("cannot listen on {addr} (admin): {e}")),
                Err(e) => Err(format!("cannot install the metrics recorder: {e}")),
            };
            if let Err(e) = served {
                tracing::error!("{e}");
                return 1;
            }
        }
        match upstream {
            Some(upstream) => {
                worker_app::run_until(opts, upstream.service(), signalled(terminate), GRACE).await
            }
            None => {
                worker_app::run_until(opts, worker_app::app(), signalled(terminate), GRACE).await
            }
        }
    });
    ExitCode::from(code as u8)
}

/// How long the requests in flight may take after `SIGTERM`.
const GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// The shutdown signal, logged.
async fn signalled(mut terminate: shutdown::Terminate) {
    let why = terminate.recv().await;
    tracing::info!("{why}: draining");
}

/// `--listen`: the app on `addr`, no relay, until the process is killed.
fn serve_directly(
    addr: std::net::SocketAddr,
    worker_token: Option<String>,
    threads: Option<usize>,
    json: bool,
) -> ExitCode {
    let Ok(worker_token) = Token::from_env_value(worker_token) else {
        eprintln!("worker: STRATA_WORKER_TOKEN is not a valid token");
        return ExitCode::from(2);
    };
    let _log = logging::init("worker", json);
    let runtime = match runtime::build(threads) {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async {
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("cannot listen on {addr}: {e}");
                return ExitCode::from(1);
            }
        };
        tracing::info!("serving the app directly on http://{addr} (no relay)");
        worker_app::serve_directly(listener, worker_token).await;
        ExitCode::SUCCESS
    })
}

/// A bad command line: the error and the usage on stderr, status 2.
fn bad(program: &str, error: String) -> ExitCode {
    crate::bad_command_line(program, &usage(program), error)
}

/// `arg` unknown, or without a valid value.
fn bad_arg(program: &str, arg: &str) -> ExitCode {
    crate::bad_option(program, &usage(program), WITH_VALUE, arg)
}
