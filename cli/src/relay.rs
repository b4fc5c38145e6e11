//! The relay: presents connected workers over HTTP.
//!
//! ```sh
//! worker-relay relay --listen 127.0.0.1:8080 --tokens tokens.txt
//! # the same program, from the repository:
//! cargo run --release --example relay -- --listen 127.0.0.1:8080 --tokens tokens.txt
//! ```
//!
//! `tokens.txt` holds lines `<worker-id> <connect-token>`. Workers dial
//! `ws://127.0.0.1:8080/connect` (or `/connect/<id>`, behind a balancer);
//! worker `<id>` is served at `http://127.0.0.1:8080/w/<id>/…`. Slow
//! callers' responses overflow to unlinked temporary files in `$TMPDIR`
//! (the gateway's default, `TempFileOverflow`: 8 GiB for all workers;
//! `--overflow-budget BYTES` changes that bound, and 0 keeps nothing on
//! disk: a caller reading more slowly than its worker sends then pauses
//! reading from that worker, for at most 10 s at a time, as nginx's
//! `proxy_max_temp_file_size 0` does). `--max-connections N` caps open HTTP
//! connections (default 10,000; keep it below `ulimit -n`), and
//! `--header-timeout SECS` bounds how long a client may take to send a
//! request head (default 10). `--threads N` sets the runtime's threads
//! (default 1: one event loop, as one nginx worker process; on a small
//! machine shared with the workers it is the fastest, BENCHMARKS.md issue
//! 42; for more cores, `--threads N` or one relay per core behind
//! `--reuse-port`).
//!
//! `--tls-cert FILE --tls-key FILE` (PEM: the chain, leaf first, and its
//! key) serves HTTPS instead: workers dial `wss://HOST:PORT/connect`,
//! callers use HTTP/1.1 or HTTP/2 (ALPN). `SIGHUP` re-reads both files: new
//! handshakes get the new certificate, open connections go on. Without
//! TLS, HTTP/2 with prior knowledge is served beside HTTP/1.1.
//!
//! `SIGTERM` (or Ctrl-C) drains the relay: no new connection is accepted,
//! the requests in flight finish (at most `--grace SECS`, default 30), idle
//! caller connections close, and each worker is closed with 1012 (service
//! restart) as soon as its own streams are done, so it reconnects at once
//! (to the next relay, or to this one restarted). The relay then exits 0
//! (`drained; exiting`) or, if the grace expired with requests still in
//! flight, says how many it cut and exits 3, so a deploy script or a
//! supervisor can tell a restart that cut requests from a clean one (1 is
//! a failure to start, 2 a bad command line; under systemd, 3 marks the
//! unit failed unless `SuccessExitStatus=3`). The accept loop stops at
//! a moment when every connection it has accepted has sent its request,
//! and the workers go only once the requests of the connections still
//! queued then have reached the gateway (the server's `Intake`; each wait at most 2 s): behind a
//! proxy that opens a connection per request, no request is dropped or
//! answered 503 by a restart (`tests/e2e_rolling.rs`).
//!
//! `--reuse-port` listens with `SO_REUSEPORT`, so a new relay process can
//! take the same port while the old one drains (an in-place restart: the
//! port is never down). `--reconnect-wait SECS` (default 10; 0 answers 503 at once) lets a request
//! for a known worker that is not connected wait that long for it to
//! connect before the 503, so requests arriving during a restart wait for
//! the worker's reconnect instead of failing.
//!
//! `SIGHUP` also re-reads the tokens file, atomically: new handshakes and
//! callers see the new table at once, a connected worker whose token was
//! removed or changed is closed (1008), every other connection is left
//! alone. A file that cannot be read or parsed keeps the old table, and the
//! log says why.
//!
//! `--admin HOST:PORT` serves `GET /metrics` (Prometheus) and `GET /workers`
//! (JSON) there, never on the public listener (docs/operations.md);
//! `--log-format json` logs one JSON object per line, the access log
//! (target `worker_relay::access`) among them. `--stall-timeout SECS`
//! (default 60) bounds how long a caller may read nothing of its response.
//! `--help` prints the options and exit statuses.

use crate::logging::plural;
use crate::{admin, logging, runtime, shutdown};
use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use worker_relay::connect::TokenTable;
use worker_relay::frame::CloseCode;
use worker_relay::proto::RelayConfig;
use worker_relay_hyper::gateway::{Gateway, CONNECT_PATH};
use worker_relay_hyper::server::{serve_with_shutdown, Intake, ServerConfig, ServerTls};
use worker_relay_hyper::TempFileOverflow;

/// The usage line, for the program as it was invoked (`relay`, or
/// `worker-relay relay`).
fn usage(program: &str) -> String {
    format!(
        "usage: {program} --listen HOST:PORT --tokens FILE \
         [--tls-cert FILE --tls-key FILE] \
         [--max-connections N] [--header-timeout SECS] [--grace SECS] \
         [--reconnect-wait SECS] [--reuse-port] [--threads N] \
         [--stall-timeout SECS] [--overflow-budget BYTES] [--admin HOST:PORT] \
         [--log-format text|json]"
    )
}

/// `--help`: the usage, the options, the exit statuses.
const HELP: &str = "\
Presents the workers that dial it at http://HOST:PORT/w/<id>/...

options:
  --listen HOST:PORT         where callers and workers connect (required)
  --tokens FILE              lines `<worker-id> <connect-token>` (required; SIGHUP re-reads it)
  --tls-cert FILE            PEM chain, leaf first: serve HTTPS and wss:// (with --tls-key)
  --tls-key FILE             its PEM key (SIGHUP re-reads both)
  --max-connections N        open HTTP connections at most (default 10000)
  --header-timeout SECS      time a client has to send a request head (default 10)
  --grace SECS               on SIGTERM, time the requests in flight have to finish (default 30)
  --reconnect-wait SECS      time a request waits for its known worker to connect (default 10)
  --reuse-port               listen with SO_REUSEPORT (a new relay can take the port)
  --threads N                runtime threads (default 1: one event loop)
  --stall-timeout SECS       time a caller may read nothing of its response (default 60)
  --overflow-budget BYTES    disk for slow callers' responses (default 8 GiB; 0: none)
  --admin HOST:PORT          serve GET /metrics and GET /workers there
  --log-format text|json     the log's format (default text)
  -h, --help                 this help

exit status:
  0  stopped by SIGTERM or Ctrl-C, every request in flight finished
  1  could not start (listen, runtime, metrics recorder)
  2  a bad command line, tokens file or TLS files
  3  stopped by SIGTERM or Ctrl-C, but --grace expired first: the requests
     still in flight were cut (the log says how many)
";

/// The options that take a value.
const WITH_VALUE: &[&str] = &[
    "--listen",
    "--tokens",
    "--tls-cert",
    "--tls-key",
    "--max-connections",
    "--header-timeout",
    "--grace",
    "--reconnect-wait",
    "--threads",
    "--stall-timeout",
    "--overflow-budget",
    "--admin",
    "--log-format",
];

/// Exit status of a drain that `--grace` cut.
const GRACE_EXPIRED: u8 = 3;

/// The relay program: `args` are its options (without the program's name),
/// `program` the name it was invoked as, for the usage and the errors
/// (`relay` for the example, `worker-relay relay` for the installed
/// binary). Returns the exit status `--help` documents.
pub fn main(program: &str, args: Vec<String>) -> ExitCode {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}\n\n{HELP}", usage(program));
        return ExitCode::SUCCESS;
    }
    let Some(json) = logging::json_requested(&args) else {
        return bad_arg(program, "--log-format");
    };
    let log = logging::init("relay", json);
    let (mut admin, mut stall, mut overflow_budget) = (None, None, None);
    let (mut listen, mut tokens, mut server) = (None, None, ServerConfig::default());
    let (mut threads, mut cert, mut key) = (None, None, None);
    let mut grace = Duration::from_secs(30);
    let (mut reconnect_wait, mut reuse_port) = (worker_relay_hyper::gateway::RECONNECT_WAIT, false);
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        if a == "--reuse-port" {
            reuse_port = true;
            continue;
        }
        let number = |v: Option<String>| v.and_then(|v| v.parse::<u64>().ok());
        match (a.as_str(), args.next()) {
            ("--listen", v) => listen = v,
            ("--admin", Some(v)) => admin = Some(v),
            ("--log-format", Some(_)) => {} // read by logging::json_requested
            ("--tokens", v) => tokens = v,
            ("--tls-cert", Some(v)) => cert = Some(v),
            ("--tls-key", Some(v)) => key = Some(v),
            ("--max-connections", v) if number(v.clone()).is_some() => {
                server = server.max_connections(number(v).unwrap_or(1) as usize)
            }
            ("--header-timeout", v) if number(v.clone()).is_some() => {
                server = server.header_read_timeout(Duration::from_secs(number(v).unwrap_or(1)))
            }
            ("--reconnect-wait", v) if number(v.clone()).is_some() => {
                reconnect_wait = Duration::from_secs(number(v).unwrap_or(0))
            }
            ("--stall-timeout", v) if number(v.clone()).is_some_and(|n| n > 0) => {
                stall = number(v).map(Duration::from_secs)
            }
            ("--overflow-budget", v) if number(v.clone()).is_some() => overflow_budget = number(v),
            ("--grace", v) if number(v.clone()).is_some() => {
                grace = Duration::from_secs(number(v).unwrap_or(30))
            }
            ("--threads", v) if number(v.clone()).is_some_and(|n| n > 0) => {
                threads = number(v).map(|n| n as usize)
            }
            _ => return bad_arg(program, &a),
        }
    }
    let (Some(listen), Some(tokens)) = (listen, tokens) else {
        return bad(program, "--listen and --tokens are required".into());
    };
    let tls = match (cert, key) {
        (None, None) => None,
        (Some(cert), Some(key)) => match ServerTls::from_pem_files(cert, key) {
            Ok(tls) => Some(tls),
            Err(e) => return fail(2, format!("TLS: {e}")),
        },
        _ => return bad(program, "--tls-cert and --tls-key go together".into()),
    };
    if let Some(tls) = &tls {
        server = server.tls(tls.clone());
    }
    match runtime::build(Some(threads.unwrap_or(runtime::ONE_LOOP))) {
        Ok(rt) => {
            let opts = Options {
                grace,
                reconnect_wait,
                reuse_port,
                admin,
                stall,
                overflow_budget,
                access_log: log.access_log(),
            };
            rt.block_on(run(listen, tokens, server, tls, opts))
        }
        Err(e) => fail(1, format!("cannot start the runtime: {e}")),
    }
}

async fn run(
    listen: String,
    tokens: String,
    server: ServerConfig,
    tls: Option<ServerTls>,
    opts: Options,
) -> ExitCode {
    let Options {
        grace,
        reconnect_wait,
        reuse_port,
        admin,
        stall,
        overflow_budget,
        access_log,
    } = opts;
    // The recorder first: what the gateway records before it is lost.
    let metrics = match admin.as_ref().map(|_| admin::install()) {
        None => None,
        Some(Ok(handle)) => Some(handle),
        Some(Err(e)) => return fail(1, format!("cannot install the metrics recorder: {e}")),
    };
    let table = match std::fs::read_to_string(&tokens).map(|t| TokenTable::parse(&t)) {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return fail(2, format!("{tokens}: {e}")),
        Err(e) => return fail(2, format!("cannot read {tokens}: {e}")),
    };
    let listener = match bind(&listen, reuse_port).await {
        Ok(l) => l,
        Err(e) => return fail(1, format!("cannot listen on {listen}: {e}")),
    };
    let addr = listener.local_addr().map_or(listen, |a| a.to_string());
    // The signal handlers before the line that says the relay is up: a
    // signal sent once a supervisor (or a test) has read it must find them,
    // not the default action that kills the process.
    let mut terminate = shutdown::Terminate::install();
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    let workers: Vec<String> = table.workers().map(|w| w.to_string()).collect();
    let (ws, http) = if tls.is_some() {
        ("wss", "https")
    } else {
        ("ws", "http")
    };
    tracing::info!(
        "listening on {addr} ({http}); workers dial {ws}://{addr}{CONNECT_PATH} (or {CONNECT_PATH}/<id>); \
         known workers: {}",
        workers.join(", ")
    );

    // Slow callers' responses wait in unlinked temporary files in $TMPDIR,
    // within 8 GiB for all the workers (the gateway's default store,
    // `TempFileOverflow`).
    let mut gateway = Gateway::builder(table).reconnect_wait(reconnect_wait);
    if stall.is_some() || overflow_budget == Some(0) {
        match relay_config(gateway.current_relay_config(), stall, overflow_budget) {
            Ok(c) => gateway = gateway.relay_config(c),
            Err(e) => return fail(2, format!("--stall-timeout: {e}")),
        }
    }
    if let Some(budget) = overflow_budget.filter(|&b| b > 0) {
        gateway = gateway.overflow(Arc::new(TempFileOverflow::new(
            std::env::temp_dir(),
            budget,
        )));
    }
    if let Some(log) = access_log {
        gateway = gateway.access_log(log);
    }
    let gateway = gateway.build();
    if let (Some(addr), Some(handle)) = (admin, metrics) {
        let workers = workers_page(gateway.clone());
        if let Err(e) = admin::serve(&addr, handle, workers).await {
            return fail(1, format!("cannot listen on {addr} (admin): {e}"));
        }
    }
    tokio::spawn(reload_on_sighup(hup, gateway.clone(), tokens, tls));
    // Callers first, then the workers (the protocol has no "go away"
    // frame). The server stops accepting only when every connection it has
    // accepted has brought its request, and its intake closes once the
    // requests of the connections still queued then are in the gateway:
    // `Gateway::drain` answers any request that comes after it 503.
    let intake = Intake::new();
    let server = server.intake(intake.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = serve_with_shutdown(listener, gateway.service(), server, async {
        let _ = stopped.await;
    });
    let mut serving = std::pin::pin!(serving);
    tokio::select! {
        () = &mut serving => return ExitCode::SUCCESS,
        why = terminate.recv() => tracing::info!(
            "{why}: draining (no new connections; requests in flight finish, at most {} s; \
             then each worker is closed with 1012)",
            grace.as_secs()
        ),
    }
    let _ = stop.send(());
    let served = tokio::select! {
        () = serving.as_mut() => true,
        () = intake.closed() => false,
    };
    let drained = async {
        if served {
            gateway.drain(grace, CloseCode::SERVICE_RESTART).await;
        } else {
            tokio::join!(serving, gateway.drain(grace, CloseCode::SERVICE_RESTART));
        }
    };
    match watch_grace(&gateway, grace, drained).await {
        Drain::Finished => {
            tracing::info!("drained; exiting");
            ExitCode::SUCCESS
        }
        Drain::Cut(requests) => {
            tracing::warn!(
                "grace expired ({} s): cut {} still in flight; exiting with status {GRACE_EXPIRED}",
                grace.as_secs(),
                plural::count(requests, "request")
            );
            ExitCode::from(GRACE_EXPIRED)
        }
        Drain::Stuck => {
            tracing::warn!(
                "grace expired ({} s) and the drain did not finish 10 s later; \
                 exiting anyway, with status {GRACE_EXPIRED}",
                grace.as_secs()
            );
            ExitCode::from(GRACE_EXPIRED)
        }
    }
}

/// How a drain ended.
enum Drain {
    /// Every request in flight finished within the grace.
    Finished,
    /// The grace expired with this many requests in flight: the drain
    /// closed their workers' connections, cutting them.
    Cut(usize),
    /// No request was in flight when the grace expired, but the drain had
    /// still not finished 10 s later.
    Stuck,
}

/// The gateway's connection settings `base` with `--stall-timeout` and
/// `--overflow-budget 0` applied: the rest (the overflow's 256 KiB in
/// memory per stream and its waits before a spill) stays the gateway's.
fn relay_config(
    base: &RelayConfig,
    stall: Option<Duration>,
    overflow_budget: Option<u64>,
) -> Result<RelayConfig, worker_relay::proto::ConfigError> {
    let mut config = base.to_builder();
    if overflow_budget == Some(0) {
        // No overflow: slow callers pause reading instead.
        config = config.overflow(None);
    }
    if let Some(stall) = stall {
        config = config.stall_timeout(stall);
    }
    config.build()
}

/// Runs `drained` (the gateway's drain, which closes every worker when
/// `grace` expires, whatever it is doing) and watches its grace: the
/// requests in flight when it expires are the ones the drain cuts. They are
/// counted every 10 ms until then (the last count before the drain's own
/// clock runs out: a worker closed is soon gone from the gateway's list).
async fn watch_grace(
    gateway: &Gateway,
    grace: Duration,
    drained: impl Future<Output = ()>,
) -> Drain {
    // Before the drain's clock starts (at its first poll below): this one
    // runs out first.
    let end = tokio::time::Instant::now() + grace;
    let mut drained = std::pin::pin!(drained);
    let mut in_flight: u64;
    loop {
        in_flight = gateway.workers().iter().map(|w| w.stats.streams_open).sum();
        let tick = (tokio::time::Instant::now() + Duration::from_millis(10)).min(end);
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(tick) => {}
            () = drained.as_mut() => return Drain::Finished,
        }
        if tokio::time::Instant::now() >= end {
            break;
        }
    }
    let finished = tokio::time::timeout(Duration::from_secs(10), drained)
        .await
        .is_ok();
    match (in_flight, finished) {
        (0, true) => Drain::Finished,
        (0, false) => Drain::Stuck,
        (n, _) => Drain::Cut(usize::try_from(n).unwrap_or(usize::MAX)),
    }
}

/// On every `SIGHUP`: re-reads the tokens file and, with TLS, the
/// certificate and key. What cannot be read or parsed is logged and the
/// old stays.
async fn reload_on_sighup(
    hup: std::io::Result<tokio::signal::unix::Signal>,
    gateway: Gateway,
    tokens: String,
    tls: Option<ServerTls>,
) {
    let Ok(mut hup) = hup else {
        tracing::warn!("cannot listen for SIGHUP: nothing will be reloaded");
        return;
    };
    while hup.recv().await.is_some() {
        match std::fs::read_to_string(&tokens).map(|t| TokenTable::parse(&t)) {
            Ok(Ok(table)) => {
                let workers = table.len();
                let revoked = gateway.replace_tokens(table);
                tracing::info!(
                    "SIGHUP: reloaded {tokens}: {}; closed {} whose token was revoked",
                    plural::count(workers, "worker"),
                    revoked.len()
                );
            }
            Ok(Err(e)) => tracing::error!("SIGHUP: kept the old tokens: {tokens}: {e}"),
            Err(e) => tracing::error!("SIGHUP: kept the old tokens: cannot read {tokens}: {e}"),
        }
        if let Some(tls) = &tls {
            match tls.reload() {
                Ok(()) => tracing::info!("SIGHUP: reloaded the TLS certificate and key"),
                Err(e) => tracing::error!("SIGHUP: kept the old certificate: {e}"),
            }
        }
    }
}

/// The options of a relay's life: its drain and restarts, its admin
/// endpoint.
struct Options {
    grace: Duration,
    reconnect_wait: Duration,
    reuse_port: bool,
    admin: Option<String>,
    stall: Option<Duration>,
    /// `--overflow-budget`: bytes on disk for slow callers, 0 for none.
    overflow_budget: Option<u64>,
    /// Where access records go (the text log's own writer), if not to
    /// `tracing`.
    access_log: Option<Arc<dyn worker_relay_hyper::gateway::AccessLog>>,
}

/// `GET /workers`: the connected workers as JSON (id, since when, from
/// where, streams open, bytes each way, why the previous connection ended).
fn workers_page(gateway: Gateway) -> axum::Router {
    axum::Router::new().route(
        "/workers",
        axum::routing::get(move || {
            let workers: Vec<serde_json::Value> = gateway
                .workers()
                .into_iter()
                .map(|w| {
                    let since = w
                        .connected_since
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs());
                    serde_json::json!({
                        "id": w.worker.as_str(),
                        "connected_since_unix": since,
                        "peer": w.peer.map(|p| p.to_string()),
                        "streams_open": w.stats.streams_open,
                        "bytes_in": w.stats.bytes_in,
                        "bytes_out": w.stats.bytes_out,
                        "last_error": w.last_error,
                    })
                })
                .collect();
            let body = serde_json::Value::Array(workers).to_string();
            async move { ([(http::header::CONTENT_TYPE, "application/json")], body) }
        }),
    )
}

/// Listens on `addr`; with `reuse_port`, with `SO_REUSEPORT` set, so that
/// a new relay can listen on the same port while this one drains.
async fn bind(addr: &str, reuse_port: bool) -> std::io::Result<tokio::net::TcpListener> {
    if !reuse_port {
        return tokio::net::TcpListener::bind(addr).await;
    }
    let addr = tokio::net::lookup_host(addr)
        .await?
        .next()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// A bad command line: the error and the usage on stderr, status 2.
fn bad(program: &str, error: String) -> ExitCode {
    crate::bad_command_line(program, &usage(program), error)
}

/// `arg` unknown, or without a valid value.
fn bad_arg(program: &str, arg: &str) -> ExitCode {
    crate::bad_option(program, &usage(program), WITH_VALUE, arg)
}

fn fail(code: u8, message: String) -> ExitCode {
    tracing::error!("{message}");
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_timeout_keeps_the_gateways_overflow_settings() {
        let table = TokenTable::new();
        let builder = Gateway::builder(table);
        let base = builder.current_relay_config();
        let theirs = base.overflow().expect("the gateway overflows by default");
        let stall = Duration::from_secs(7);

        let config = relay_config(base, Some(stall), None).unwrap();
        assert_eq!(config.stall_timeout(), stall);
        let ours = config.overflow().expect("still overflowing");
        assert_eq!(ours.memory_per_stream, theirs.memory_per_stream);
        assert_eq!(ours.spill_after, theirs.spill_after);
        assert_eq!(ours.spill_after_alone, theirs.spill_after_alone);
        assert!(ours.spill_after_alone > Duration::ZERO);

        // `--overflow-budget 0`: no overflow, the stall timeout as given.
        let config = relay_config(base, Some(stall), Some(0)).unwrap();
        assert!(config.overflow().is_none());
        assert_eq!(config.stall_timeout(), stall);
        let config = relay_config(base, None, Some(0)).unwrap();
        assert_eq!(config.stall_timeout(), base.stall_timeout());
    }
}
