//! Issue 26: a real Prometheus (Debian's package) scrapes the relay's and
//! the worker's admin endpoints (docs/operations.md).
//!
//! - `the_operations_doc_names_every_metric` (runs in `cargo test`): every
//!   metric of the interface is in `docs/operations.md` with its type.
//! - `alert_rules_pass_promtool` (`#[ignore]`: it needs promtool; run by
//!   `bash .ci/prometheus`, which installs it): `promtool check rules
//!   docs/alerts.yml`, and `promtool test rules` with
//!   `tests/prometheus/alerts.test.yml` (each alert fires on the series that
//!   should fire it, not on a healthy neighbour).
//! - `prometheus_scrapes_relay_and_worker` (`#[ignore]`, the same): the
//!   relay and worker examples with `--admin`, a known mix of requests
//!   (20 × 200, 3 × 404, 1 × 401 from the worker, 1 × 404 for a worker the
//!   relay does not know, 1 handshake with a wrong token), a `prometheus`
//!   on 127.0.0.1 scraping both every second with
//!   `docs/alerts.yml` loaded; queries through its HTTP API return exactly
//!   those counts; `promtool check metrics` passes on both expositions;
//!   every metric exposed is documented with its type; `/workers` lists the
//!   worker; the access log has one line per request with its fields, the
//!   refused handshake's line its peer's address; and
//!   no token of the run appears in any log (relay and worker at `trace`),
//!   exposition or `/workers`.

#[path = "../examples/common/client.rs"]
mod client;
#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{addr_after, example_bin, scratch_dir, Proc};
use worker_relay::connect::{Refused, Token, Verdict, WorkerHandshake};
use worker_relay_hyper::ws;

/// The operations page and the alert rules it ships.
const OPERATIONS_DOC: &str = include_str!("../docs/operations.md");
const ALERTS: &str = "docs/alerts.yml";
const ALERTS_TEST: &str = "tests/prometheus/alerts.test.yml";

/// The metrics of the interface (issue 26) and their Prometheus types.
const METRICS: &[(&str, &str)] = &[
    ("worker_relay_workers_connected", "gauge"),
    ("worker_relay_handshakes_total", "counter"),
    ("worker_relay_requests_total", "counter"),
    ("worker_relay_request_duration_seconds", "histogram"),
    ("worker_relay_response_start_seconds", "histogram"),
    ("worker_relay_streams_open", "gauge"),
    ("worker_relay_bytes_total", "counter"),
    ("worker_relay_stream_ends_total", "counter"),
    ("worker_relay_overflow_bytes", "gauge"),
    ("worker_relay_keepalive_timeouts_total", "counter"),
    ("worker_relay_worker_connected", "gauge"),
    ("worker_relay_worker_connects_total", "counter"),
    ("worker_relay_worker_requests_total", "counter"),
    ("worker_relay_worker_streams_open", "gauge"),
    ("worker_relay_worker_bytes_total", "counter"),
];

/// What the mix makes the relay expose at once (others, such as stall
/// ends, appear only once something increments them).
const RELAY_EXPOSED: &[&str] = &[
    "worker_relay_workers_connected",
    "worker_relay_handshakes_total",
    "worker_relay_requests_total",
    "worker_relay_request_duration_seconds",
    "worker_relay_response_start_seconds",
    "worker_relay_streams_open",
    "worker_relay_bytes_total",
    "worker_relay_stream_ends_total",
];
const WORKER_EXPOSED: &[&str] = &[
    "worker_relay_worker_connected",
    "worker_relay_worker_connects_total",
    "worker_relay_worker_requests_total",
    "worker_relay_worker_streams_open",
    "worker_relay_worker_bytes_total",
];

/// The access log's fields (target `worker_relay::access`).
const ACCESS_FIELDS: &[&str] = &[
    "worker",
    "method",
    "path",
    "status",
    "bytes_up",
    "bytes_down",
    "duration_ms",
    "end",
    "peer",
];

/// The mix: to worker `abc`, successes, unknown paths (404 from the
/// worker's app) and a request with a wrong worker token (401 from the
/// worker's app); and requests for a worker the relay does not know (404
/// from the relay, labelled `worker="unknown"`, no stream opened).
const OK: usize = 20;
const NOT_FOUND: usize = 3;
const UNAUTHORIZED: usize = 1;
const REQUESTS: usize = OK + NOT_FOUND + UNAUTHORIZED;
const UNKNOWN_WORKER: usize = 1;

/// The level the examples log at in this run: the most verbose, where
/// libraries log headers.
const LOG_LEVEL: &str = "trace";

#[test]
fn the_operations_doc_names_every_metric() {
    for (name, kind) in METRICS {
        let row = OPERATIONS_DOC
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}`")))
            .unwrap_or_else(|| panic!("docs/operations.md has no table row for `{name}`"));
        assert!(
            row.contains(&format!("| {kind} |")),
            "docs/operations.md: `{name}` is a {kind}: {row}"
        );
    }
    for field in ACCESS_FIELDS {
        assert!(
            OPERATIONS_DOC.contains(&format!("| `{field}` |")),
            "docs/operations.md does not describe the access log's `{field}`"
        );
    }
    assert!(OPERATIONS_DOC.contains("alerts.yml"));
}

#[test]
#[ignore = "needs prometheus: run bash .ci/prometheus"]
fn alert_rules_pass_promtool() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let check = run_bounded(
        Command::new(tool("PROMTOOL", "promtool"))
            .arg("check")
            .arg("rules")
            .arg(root.join(ALERTS)),
        None,
        Duration::from_secs(30),
    );
    assert!(check.ok, "promtool check rules {ALERTS}:\n{}", check.output);
    let test = run_bounded(
        Command::new(tool("PROMTOOL", "promtool"))
            .arg("test")
            .arg("rules")
            .arg(root.join(ALERTS_TEST)),
        None,
        Duration::from_secs(60),
    );
    assert!(
        test.ok,
        "promtool test rules {ALERTS_TEST}:\n{}",
        test.output
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs prometheus: run bash .ci/prometheus"]
async fn prometheus_scrapes_relay_and_worker() {
    let scratch = Scratch::new();
    let secrets = Secrets::new();
    let mut run = Run::default();
    let outcome = tokio::time::timeout(
        Duration::from_secs(180),
        scenario(&scratch, &secrets, &mut run),
    )
    .await;
    if !matches!(outcome, Ok(Ok(()))) {
        for (name, p) in run.procs() {
            eprintln!("--- {name} (last 60 lines) ---\n{}", tail(&p.log(), 60));
        }
    }
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(why)) => panic!("{why}"),
        Err(_) => panic!("the Prometheus test took longer than 180 s"),
    }
}

/// The processes of the run, for the logs on a failure.
#[derive(Default)]
struct Run {
    relay: Option<Proc>,
    worker: Option<Proc>,
    prometheus: Option<Prometheus>,
}

impl Run {
    fn procs(&self) -> Vec<(&'static str, &Proc)> {
        let mut out = Vec::new();
        if let Some(p) = &self.relay {
            out.push(("relay", p));
        }
        if let Some(p) = &self.worker {
            out.push(("worker", p));
        }
        if let Some(p) = &self.prometheus {
            out.push(("prometheus", &p.proc));
        }
        out
    }
}

/// The test proper; `Err` says what failed (the caller prints the logs).
async fn scenario(scratch: &Scratch, secrets: &Secrets, run: &mut Run) -> Result<(), String> {
    // The relay, its tokens in a 0600 file, its admin endpoint on another port.
    let tokens = scratch.0.join("tokens.txt");
    std::fs::write(&tokens, format!("abc {}\n", secrets.connect)).unwrap();
    let owner_only = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(&tokens, owner_only).unwrap();
    let mut cmd = Command::new(example_bin("relay"));
    cmd.arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--tokens")
        .arg(&tokens)
        .arg("--admin")
        .arg("127.0.0.1:0")
        .arg("--log-format")
        .arg("json")
        .env("RUST_LOG", LOG_LEVEL);
    let relay = run.relay.insert(Proc::spawn(cmd));
    let relay_addr = logged_addr(relay, "relay", "\"message\":\"listening on ").await?;
    let relay_admin = wait_admin(relay, "relay").await?;

    // The worker, its tokens in its environment only.
    let mut cmd = Command::new(example_bin("worker"));
    cmd.arg("--connect")
        .arg(format!("ws://{relay_addr}/connect"))
        .arg("--admin")
        .arg("127.0.0.1:0")
        .env("STRATA_WORKER_CONNECT_TOKEN", &secrets.connect)
        .env("STRATA_WORKER_TOKEN", &secrets.worker)
        .env("RUST_LOG", LOG_LEVEL);
    let worker = run.worker.insert(Proc::spawn(cmd));
    let worker_admin = wait_admin(worker, "worker").await?;

    // Connected, as the relay's /workers says (no request to the worker yet).
    let workers = wait_workers(relay_admin).await?;
    check_workers(&workers)?;

    // One handshake with a token the relay does not know.
    let wrong = WorkerHandshake::new(Some(Token::new(&secrets.wrong_connect).unwrap()));
    let refused = ws::dial(
        &format!("ws://{relay_addr}/connect"),
        &wrong,
        Duration::from_secs(5),
    )
    .await
    .map(drop)
    .map_err(Verdict::from);
    if refused != Err(Verdict::Refused(Refused::Status(401))) {
        return Err(format!("a handshake with a wrong token: {refused:?}"));
    }

    // The mix.
    let bearer = format!("Bearer {}", secrets.worker);
    let wrong_bearer = format!("Bearer {}", secrets.wrong_worker);
    let mut got = BTreeMap::new();
    let mix = std::iter::repeat_n(("/w/abc/health", bearer.as_str()), OK)
        .chain(std::iter::repeat_n(
            ("/w/abc/no-such-page?q=not-in-the-log", bearer.as_str()),
            NOT_FOUND,
        ))
        .chain(std::iter::repeat_n(
            ("/w/abc/health", wrong_bearer.as_str()),
            UNAUTHORIZED,
        ))
        .chain(std::iter::repeat_n(
            ("/w/nobody/health", bearer.as_str()),
            UNKNOWN_WORKER,
        ));
    for (target, authorization) in mix {
        let status = get(relay_addr, target, &[("authorization", authorization)])
            .await
            .map(|(status, _)| status)
            .map_err(|e| format!("GET {target}: {e}"))?;
        *got.entry(status).or_insert(0usize) += 1;
    }
    let want = BTreeMap::from([
        (200, OK),
        (401, UNAUTHORIZED),
        (404, NOT_FOUND + UNKNOWN_WORKER),
    ]);
    if got != want {
        return Err(format!("the mix's statuses: {got:?}, expected {want:?}"));
    }

    // A real Prometheus scraping both admin endpoints every second.
    let prometheus = run
        .prometheus
        .insert(Prometheus::start(scratch, relay_admin, worker_admin).await?);
    let api = prometheus.addr;
    let n = |v: usize| v as f64;
    let expectations: &[(&str, f64)] = &[
        ("up{job=\"relay\"}", 1.0),
        ("up{job=\"worker\"}", 1.0),
        // The query: the request count, each side.
        ("sum(worker_relay_requests_total{status=\"200\"})", n(OK)),
        (
            "sum(worker_relay_worker_requests_total{status=\"200\"})",
            n(OK),
        ),
        (
            "sum(worker_relay_requests_total{worker=\"abc\",status=\"404\"})",
            n(NOT_FOUND),
        ),
        (
            "sum(worker_relay_requests_total{worker=\"unknown\",status=\"404\"})",
            n(UNKNOWN_WORKER),
        ),
        (
            "sum(worker_relay_requests_total{status=\"401\"})",
            n(UNAUTHORIZED),
        ),
        (
            "sum(worker_relay_requests_total)",
            n(REQUESTS + UNKNOWN_WORKER),
        ),
        (
            "sum(worker_relay_worker_requests_total{status=\"404\"})",
            n(NOT_FOUND),
        ),
        (
            "sum(worker_relay_worker_requests_total{status=\"401\"})",
            n(UNAUTHORIZED),
        ),
        ("sum(worker_relay_worker_requests_total)", n(REQUESTS)),
        (
            "sum(worker_relay_requests_total{worker=\"abc\"})",
            n(REQUESTS),
        ),
        // Histogram counts: one observation per request.
        (
            "sum(worker_relay_request_duration_seconds_count{worker=\"abc\"})",
            n(REQUESTS),
        ),
        (
            "sum(worker_relay_request_duration_seconds_bucket{worker=\"abc\",le=\"+Inf\"})",
            n(REQUESTS),
        ),
        (
            "sum(worker_relay_request_duration_seconds_count)",
            n(REQUESTS + UNKNOWN_WORKER),
        ),
        // The time to the head only for requests that reached the worker.
        (
            "sum(worker_relay_response_start_seconds_count)",
            n(REQUESTS),
        ),
        (
            "sum(worker_relay_stream_ends_total{worker=\"abc\",reason=\"completed\"})",
            n(REQUESTS),
        ),
        // Streams only for requests that reached the worker.
        ("sum(worker_relay_stream_ends_total)", n(REQUESTS)),
        ("sum(worker_relay_streams_open)", 0.0),
        ("sum(worker_relay_worker_streams_open)", 0.0),
        ("sum(worker_relay_workers_connected)", 1.0),
        ("sum(worker_relay_worker_connected)", 1.0),
        (
            "sum(worker_relay_handshakes_total{result=\"accepted\"})",
            1.0,
        ),
        (
            "sum(worker_relay_handshakes_total{result=\"unauthorized\"})",
            1.0,
        ),
        ("sum(worker_relay_handshakes_total)", 2.0),
        (
            "sum(worker_relay_worker_connects_total{result=\"connected\"})",
            1.0,
        ),
        ("sum(worker_relay_worker_connects_total)", 1.0),
        // Bytes: the responses' bodies went down, each side.
        (
            "sum(worker_relay_bytes_total{direction=\"down\"}) > bool 0",
            1.0,
        ),
        (
            "sum(worker_relay_worker_bytes_total{direction=\"down\"}) > bool 0",
            1.0,
        ),
    ];
    let started = Instant::now();
    for (query, want) in expectations {
        wait_query(api, query, *want, Duration::from_secs(60)).await?;
    }
    println!(
        "prometheus: all {} queries returned the expected values {:.1?} after it started",
        expectations.len(),
        started.elapsed()
    );
    wait_rules_healthy(api).await?;

    // The expositions: promtool's lint passes, every metric is documented
    // with its type, what the mix touched is there.
    let mut expositions = Vec::new();
    for (name, admin, exposed) in [
        ("relay", relay_admin, RELAY_EXPOSED),
        ("worker", worker_admin, WORKER_EXPOSED),
    ] {
        let (status, body) = get(admin, "/metrics", &[])
            .await
            .map_err(|e| format!("GET {name} /metrics: {e}"))?;
        let text = String::from_utf8(body.to_vec()).map_err(|e| format!("{name} /metrics: {e}"))?;
        if status != 200 {
            return Err(format!("{name} /metrics: {status}\n{text}"));
        }
        let lint = run_bounded(
            Command::new(tool("PROMTOOL", "promtool"))
                .arg("check")
                .arg("metrics"),
            Some(text.as_bytes()),
            Duration::from_secs(30),
        );
        if !lint.ok {
            return Err(format!(
                "promtool check metrics on the {name}'s exposition:\n{}\n--- exposition ---\n{text}",
                lint.output
            ));
        }
        let types = types_of(&text);
        for (metric, kind) in &types {
            if !metric.starts_with("worker_relay_") {
                continue;
            }
            match METRICS.iter().find(|(m, _)| m == metric) {
                Some((_, k)) if k == kind => {}
                Some((_, k)) => {
                    return Err(format!("{name}: {metric} is a {kind}, documented as a {k}"))
                }
                None => return Err(format!("{name}: {metric} ({kind}) is not documented")),
            }
        }
        for metric in exposed {
            if !types.contains_key(*metric) {
                return Err(format!(
                    "{name}: {metric} is not exposed after the mix\n{text}"
                ));
            }
        }
        println!(
            "{name}: promtool check metrics passed ({} metric families, {} lines)",
            types.len(),
            text.lines().count()
        );
        expositions.push(text);
    }

    // The access log: one line per request, with its fields; the refused
    // handshake's line names its peer.
    let relay_log = run.relay.as_ref().unwrap().log();
    check_access_log(&relay_log)?;
    if !relay_log.contains("refused a worker from 127.0.0.1:") {
        return Err("no line of the refused handshake with its peer's address".into());
    }

    // No token anywhere: the logs of every process (the relay and the
    // worker at trace), the expositions, /workers.
    let workers = get(relay_admin, "/workers", &[])
        .await
        .map(|(_, body)| String::from_utf8_lossy(&body).into_owned())
        .map_err(|e| format!("GET /workers: {e}"))?;
    let mut places = vec![
        ("the relay's log", relay_log),
        ("the worker's log", run.worker.as_ref().unwrap().log()),
        (
            "prometheus's log",
            run.prometheus.as_ref().unwrap().proc.log(),
        ),
        ("/workers", workers),
    ];
    places.extend(
        expositions
            .into_iter()
            .zip(["the relay's /metrics", "the worker's /metrics"])
            .map(|(text, name)| (name, text)),
    );
    for (place, text) in &places {
        for secret in secrets.all() {
            if text.contains(secret) {
                return Err(format!("a token of the run appears in {place}"));
            }
        }
    }
    println!(
        "no token in any log ({} lines of relay log, {} of worker log, {} of prometheus log)",
        places[0].1.lines().count(),
        places[1].1.lines().count(),
        places[2].1.lines().count()
    );
    Ok(())
}

/// The tokens of the run, drawn at random (never on a command line).
struct Secrets {
    connect: String,
    worker: String,
    wrong_connect: String,
    wrong_worker: String,
}

impl Secrets {
    fn new() -> Secrets {
        Secrets {
            connect: random_token("ct-"),
            worker: random_token("wt-"),
            wrong_connect: random_token("ct-wrong-"),
            wrong_worker: random_token("wt-wrong-"),
        }
    }

    fn all(&self) -> [&str; 4] {
        [
            &self.connect,
            &self.worker,
            &self.wrong_connect,
            &self.wrong_worker,
        ]
    }
}

fn random_token(prefix: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut secret = String::from(prefix);
    for i in 0..2 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        secret.push_str(&format!("{:016x}", h.finish()));
    }
    secret
}

/// A private directory for the tokens file and Prometheus's configuration
/// and storage (removed at the end).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        let dir = scratch_dir("prometheus");
        let owner_only = std::os::unix::fs::PermissionsExt::from_mode(0o700);
        std::fs::set_permissions(&dir, owner_only).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tool: `$<var>`, else `name` on the PATH, else Debian's `/usr/bin/<name>`.
fn tool(var: &str, name: &str) -> PathBuf {
    let candidates = [
        std::env::var_os(var).map(PathBuf::from),
        Some(PathBuf::from(name)),
        Some(Path::new("/usr/bin").join(name)),
    ];
    for bin in candidates.into_iter().flatten() {
        let ok = Command::new(&bin)
            .arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return bin;
        }
    }
    panic!("{name} is not installed: run `bash .ci/prometheus` (it installs it with apt-get)");
}

/// A finished command: whether it exited 0, and its stdout and stderr.
struct Ran {
    ok: bool,
    output: String,
}

/// Runs `cmd` with `input` on its stdin; killed if it takes longer than
/// `within`.
fn run_bounded(cmd: &mut Command, input: Option<&[u8]>, within: Duration) -> Ran {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.unwrap_or_default().to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut pipes = [
        Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ]
    .map(|mut pipe| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    })
    .into_iter();
    let end = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = writer.join();
    let out = pipes.next().unwrap().join().unwrap();
    let err = pipes.next().unwrap().join().unwrap();
    let output = match status {
        Some(s) => format!("{s}\n{out}{err}"),
        None => format!("killed after {within:?}\n{out}{err}"),
    };
    Ran {
        ok: status.is_some_and(|s| s.success()),
        output,
    }
}

/// Waits (bounded) for `name`'s line `admin listening on ADDR`, then for
/// its admin endpoint to answer `/metrics`; returns ADDR.
async fn wait_admin(p: &Proc, name: &str) -> Result<SocketAddr, String> {
    let admin = logged_addr(p, name, "admin listening on ").await?;
    match get(admin, "/metrics", &[]).await {
        Ok((200, _)) => Ok(admin),
        other => Err(format!("the {name}'s GET /metrics: {other:?}")),
    }
}

/// The address right after `marker` in the first of `p`'s log lines that
/// has one (at most 20 s): where a process started on port 0 listens.
async fn logged_addr(p: &Proc, name: &str, marker: &str) -> Result<SocketAddr, String> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let found = (p.stderr.lock().unwrap().iter()).find_map(|l| addr_after(l, marker));
        if let Some(addr) = found {
            return Ok(addr);
        }
        if Instant::now() > end {
            return Err(format!("the {name} did not log `{marker}ADDR` within 20 s"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET target` at `addr` on a new connection (at most 10 s): status and body.
async fn get(
    addr: SocketAddr,
    target: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, Bytes), String> {
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        client::request(addr, "GET", target, headers, Bytes::new()),
    )
    .await
    .map_err(|_| "no answer within 10 s".to_string())?
    .map_err(|e| e.to_string())?;
    if !answer.complete {
        return Err(format!("the body of a {} ended early", answer.status));
    }
    Ok((answer.status, answer.body))
}

/// The relay's `/workers` once it lists a worker (at most 20 s).
async fn wait_workers(admin: SocketAddr) -> Result<serde_json::Value, String> {
    let end = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while Instant::now() < end {
        if let Ok((200, body)) = get(admin, "/workers", &[]).await {
            last = String::from_utf8_lossy(&body).into_owned();
            if let Ok(v @ serde_json::Value::Array(_)) = serde_json::from_slice(&body) {
                if v.as_array().is_some_and(|a| !a.is_empty()) {
                    return Ok(v);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "the relay's /workers listed no worker within 20 s: {last}"
    ))
}

/// `/workers`: worker abc, with every field of the interface.
fn check_workers(workers: &serde_json::Value) -> Result<(), String> {
    let list = workers.as_array().unwrap();
    let [abc] = list.as_slice() else {
        return Err(format!("/workers: one worker expected: {workers}"));
    };
    for field in [
        "id",
        "connected_since_unix",
        "peer",
        "streams_open",
        "bytes_in",
        "bytes_out",
        "last_error",
    ] {
        if abc.get(field).is_none() {
            return Err(format!("/workers: no `{field}`: {workers}"));
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let since = abc["connected_since_unix"].as_f64().unwrap_or(0.0);
    let fine = abc["id"] == "abc"
        && abc["peer"]
            .as_str()
            .is_some_and(|p| p.starts_with("127.0.0.1:"))
        && abc["streams_open"] == 0
        && (now - 120.0..=now + 1.0).contains(&since);
    if !fine {
        return Err(format!("/workers: {workers}"));
    }
    Ok(())
}

/// The access log's lines (JSON, target `worker_relay::access`) in the
/// relay's log: one per request of the mix, each with every field.
fn check_access_log(log: &str) -> Result<(), String> {
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    let mut lines = 0;
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["target"] != "worker_relay::access" {
            continue;
        }
        lines += 1;
        // tracing-subscriber's JSON puts the fields under "fields" unless
        // flattened.
        let fields = if v["fields"].is_object() {
            &v["fields"]
        } else {
            &v
        };
        for f in ACCESS_FIELDS {
            if fields.get(f).is_none() {
                return Err(format!("an access line without `{f}`: {line}"));
            }
        }
        let text = |f: &str| match &fields[f] {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let path = text("path");
        if path.contains('?') || path.contains("not-in-the-log") {
            return Err(format!("an access line with the query: {line}"));
        }
        let expected = match text("worker").as_str() {
            // The relay's own answer: no stream was opened.
            "unknown" => path == "/w/nobody/health" && text("end") == "answered",
            "abc" => path.starts_with("/w/abc/") && text("end") == "completed",
            _ => false,
        };
        if !expected || text("method") != "GET" {
            return Err(format!("an access line: {line}"));
        }
        if !text("peer").starts_with("127.0.0.1:") {
            return Err(format!(
                "an access line without the caller's address: {line}"
            ));
        }
        *statuses.entry(text("status")).or_insert(0) += 1;
    }
    let want = BTreeMap::from([
        ("200".to_string(), OK),
        ("401".to_string(), UNAUTHORIZED),
        ("404".to_string(), NOT_FOUND + UNKNOWN_WORKER),
    ]);
    let all = REQUESTS + UNKNOWN_WORKER;
    if lines != all || statuses != want {
        return Err(format!(
            "the access log: {lines} lines with statuses {statuses:?}, expected {all}: {want:?}"
        ));
    }
    println!("access log: {lines} lines, statuses {statuses:?}, every field");
    Ok(())
}

/// `# TYPE` lines of an exposition: metric family → type.
fn types_of(exposition: &str) -> BTreeMap<String, String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect()
}

/// A `prometheus` process on 127.0.0.1 with its configuration and storage
/// in the scratch directory; SIGTERM then SIGKILL on drop.
struct Prometheus {
    proc: Proc,
    addr: SocketAddr,
}

impl Prometheus {
    /// Starts Prometheus scraping `relay` (job `relay`) and `worker` (job
    /// `worker`) every second, with the alert rules loaded; returns once
    /// it is ready (at most 30 s).
    async fn start(
        scratch: &Scratch,
        relay: SocketAddr,
        worker: SocketAddr,
    ) -> Result<Prometheus, String> {
        let alerts = Path::new(env!("CARGO_MANIFEST_DIR")).join(ALERTS);
        let config = format!(
            "global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {alerts}
scrape_configs:
  - job_name: relay
    static_configs:
      - targets: [\"{relay}\"]
  - job_name: worker
    static_configs:
      - targets: [\"{worker}\"]
",
            alerts = alerts.display()
        );
        let file = scratch.0.join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let mut cmd = Command::new(tool("PROMETHEUS", "prometheus"));
        cmd.arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                scratch.0.join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .current_dir(&scratch.0);
        let proc = Proc::spawn(cmd);
        // Where it listens, once bound: `msg="Listening on"
        // address=127.0.0.1:PORT` (the line before it has the `:0` asked).
        let addr = logged_addr(&proc, "prometheus", "msg=\"Listening on\" address=").await;
        let mut prometheus = Prometheus { proc, addr: addr? };
        let addr = prometheus.addr;
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, _)) = get(addr, "/-/ready", &[]).await {
                return Ok(prometheus);
            }
            if let Ok(Some(status)) = prometheus.proc.child.try_wait() {
                return Err(format!("prometheus exited ({status})"));
            }
            if Instant::now() > end {
                return Err("prometheus was not ready within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of the child this test started.
        unsafe {
            libc::kill(self.proc.child.id() as libc::pid_t, libc::SIGTERM);
        }
        if self.proc.wait_exit(Duration::from_secs(5)).is_none() {
            self.proc.kill();
        }
    }
}

/// The value of an instant query (`None`: an empty result).
async fn query(api: SocketAddr, q: &str) -> Result<Option<f64>, String> {
    let target = format!("/api/v1/query?query={}", percent_encode(q));
    let (status, body) = get(api, &target, &[]).await?;
    let v: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| format!("{status}: {e}: {}", String::from_utf8_lossy(&body)))?;
    if v["status"] != "success" {
        return Err(format!("{q}: {v}"));
    }
    let result = v["data"]["result"]
        .as_array()
        .ok_or_else(|| format!("{q}: {v}"))?;
    match result.as_slice() {
        [] => Ok(None),
        [one] => one["value"][1]
            .as_str()
            .and_then(|s| s.parse().ok())
            .map(Some)
            .ok_or_else(|| format!("{q}: {v}")),
        _ => Err(format!("{q}: more than one series: {v}")),
    }
}

/// Waits (bounded) until `q` returns `want`.
async fn wait_query(api: SocketAddr, q: &str, want: f64, within: Duration) -> Result<(), String> {
    let end = Instant::now() + within;
    let mut last = Ok(None);
    while Instant::now() < end {
        last = query(api, q).await;
        if last == Ok(Some(want)) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let targets = get(api, "/api/v1/targets", &[])
        .await
        .map(|(_, b)| String::from_utf8_lossy(&b).into_owned());
    Err(format!(
        "prometheus: `{q}` returned {last:?} for {within:?}, expected {want}\ntargets: {targets:?}"
    ))
}

/// Waits (bounded) until Prometheus has evaluated every alert rule of
/// docs/alerts.yml without an error.
async fn wait_rules_healthy(api: SocketAddr) -> Result<(), String> {
    let end = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < end {
        if let Ok((200, body)) = get(api, "/api/v1/rules", &[]).await {
            last = String::from_utf8_lossy(&body).into_owned();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let rules: Vec<&serde_json::Value> = v["data"]["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().into_iter().flatten())
                .collect();
            let evaluated = |r: &&serde_json::Value| {
                r["health"] == "ok"
                    && r["lastEvaluation"]
                        .as_str()
                        .is_some_and(|t| !t.starts_with("0001-"))
            };
            if !rules.is_empty() && rules.iter().all(evaluated) {
                let firing: Vec<&str> = rules
                    .iter()
                    .filter(|r| r["state"] == "firing")
                    .filter_map(|r| r["name"].as_str())
                    .collect();
                if !firing.is_empty() {
                    return Err(format!("alerts firing on a healthy run: {firing:?}"));
                }
                println!(
                    "prometheus: the {} alert rules of {ALERTS} loaded and evaluated, none firing",
                    rules.len()
                );
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!(
        "prometheus: the alert rules were not all evaluated healthy within 30 s: {last}"
    ))
}

/// `s` with every byte but the unreserved ones percent-encoded.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
