//! Issue 25: a rolling restart under load, with real processes over
//! loopback. The scale-out setup of `tests/e2e_scaleout.rs` (nginx with
//! `tests/scaleout/nginx.conf.template`, 3 relay example processes, 30
//! worker example processes dialling nginx at `/connect/<id>`), a steady
//! load through nginx (small GETs, 1 MiB uploads echoed and checked byte
//! for byte, 3 s requests), and each relay restarted in place in turn: a
//! new relay on the same port (`--reuse-port`), once it listens `SIGTERM`
//! to the old one, which must drain and exit 0, and its workers must be
//! back on the new one before the next relay is restarted.
//!
//! Not one request may fail: every answer must be the expected status and
//! body, with no retry by the client; nor may nginx log a failed request
//! to a relay (it would have marked that relay down, `max_fails`, and
//! moved its workers). The p99 latency of the small GETs during the
//! restarts is compared with a baseline window measured first, in the
//! same run (BENCHMARKS.md, "Issue 25: a rolling restart behind nginx").
//!
//! `#[ignore]`: it needs nginx; `bash .ci/scaleout` installs it and runs
//! this test.

#[path = "../examples/common/client.rs"]
mod client;
#[path = "scaleout/nginx.rs"]
mod nginx;
#[path = "scaleout/support.rs"]
mod scaleout;
#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use scaleout::{connect_tokens, recovery, three_relays, Scratch};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{auth, worker_process_with, Proc};

const WORKERS: usize = 30;
/// Every relay, the first ones and their successors alike.
const RELAY_ARGS: [&str; 5] = ["--reuse-port", "--reconnect-wait", "10", "--grace", "30"];
/// The load: a small GET every 4 ms (250/s), a 1 MiB upload every 100 ms,
/// a 3 s request every 200 ms (about 15 in flight), each on a new
/// connection to nginx, sent on schedule whatever the answers' pace (an
/// open loop: a slow answer does not hold back the next request, so the
/// latency figures include the waits).
const SMALL_EVERY: Duration = Duration::from_millis(4);
const UPLOAD_EVERY: Duration = Duration::from_millis(100);
const LONG_EVERY: Duration = Duration::from_millis(200);
const UPLOAD_BYTES: usize = 1 << 20;
const LONG_MS: u64 = 3000;
/// A request not answered in full within this is a failure.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The window measured before the first restart.
const BASELINE: Duration = Duration::from_secs(10);
/// The issue's floor on the load, over the whole run.
const MIN_RATE: f64 = 200.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Small,
    Upload,
    Long,
}

/// One request's outcome: when it was sent (since the load's start), how
/// long its full answer took, and what was wrong with it, if anything.
struct Record {
    kind: Kind,
    start: Duration,
    latency: Duration,
    failure: Option<String>,
}

/// The load's shared state.
struct Load {
    nginx: SocketAddr,
    ids: Vec<String>,
    t0: Instant,
    stop: AtomicBool,
    in_flight: AtomicUsize,
    records: Mutex<Vec<Record>>,
    /// A pattern 250 bytes longer than an upload: upload `n` is the slice
    /// at `n % 251`, so consecutive uploads differ.
    pattern: Bytes,
}

impl Load {
    fn new(nginx: SocketAddr, ids: Vec<String>) -> Arc<Load> {
        Arc::new(Load {
            nginx,
            ids,
            t0: Instant::now(),
            stop: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            records: Mutex::new(Vec::new()),
            pattern: support::pattern(UPLOAD_BYTES + 250),
        })
    }

    /// Sends a `kind` request every `every` until stopped, to the workers
    /// in turn (starting with the `first`).
    async fn generate(self: Arc<Load>, kind: Kind, every: Duration, first: usize) {
        let mut tick = tokio::time::interval(every);
        let mut n = first;
        while !self.stop.load(Ordering::SeqCst) {
            tick.tick().await;
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(self.clone().one(kind, n));
            n += 1;
        }
    }

    /// Request `n` of `kind`, its answer checked and recorded.
    async fn one(self: Arc<Load>, kind: Kind, n: usize) {
        let id = &self.ids[n % self.ids.len()];
        let a = auth();
        let (method, target, body, expected) = match kind {
            Kind::Small => (
                "GET",
                format!("/w/{id}/health"),
                Bytes::new(),
                Bytes::from_static(br#"{"status":"ok"}"#),
            ),
            Kind::Upload => {
                let at = n % 251;
                let body = self.pattern.slice(at..at + UPLOAD_BYTES);
                ("POST", format!("/w/{id}/echo"), body.clone(), body)
            }
            Kind::Long => (
                "GET",
                format!("/w/{id}/sleep?ms={LONG_MS}"),
                Bytes::new(),
                Bytes::from(format!("slept {LONG_MS} ms")),
            ),
        };
        let mut headers = vec![("authorization", a.as_str())];
        if kind == Kind::Upload {
            headers.push(("content-type", "application/octet-stream"));
        }
        let sent = Instant::now();
        let answer = tokio::time::timeout(
            REQUEST_TIMEOUT,
            client::request(self.nginx, method, &target, &headers, body),
        )
        .await;
        let latency = sent.elapsed();
        let failure = match answer {
            Ok(Ok(a)) if a.status == 200 && a.complete && a.body == expected => None,
            Ok(Ok(a)) => Some(format!(
                "{} (complete: {}), {} bytes{}",
                a.status,
                a.complete,
                a.body.len(),
                describe_body(&a.body, &expected)
            )),
            Ok(Err(e)) => Some(format!("no answer: {e}")),
            Err(_) => Some(format!("no full answer within {REQUEST_TIMEOUT:?}")),
        };
        let record = Record {
            kind,
            start: sent - self.t0,
            latency,
            failure: failure.map(|f| format!("{method} {target}: {f}")),
        };
        self.records.lock().unwrap().push(record);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    fn since_start(&self) -> Duration {
        self.t0.elapsed()
    }
}

/// What a wrong body was, briefly: a short text as is, else where it
/// first differs from the expected one.
fn describe_body(body: &[u8], expected: &[u8]) -> String {
    if body.len() <= 200 {
        return format!(": {:?}", String::from_utf8_lossy(body));
    }
    match body.iter().zip(expected).position(|(a, b)| a != b) {
        Some(i) => format!(", first wrong byte at {i}"),
        None => format!(", expected {}", expected.len()),
    }
}

/// The `q` quantile of `latencies` (sorted here).
fn quantile(latencies: &mut [Duration], q: f64) -> Duration {
    if latencies.is_empty() {
        return Duration::ZERO;
    }
    latencies.sort();
    let rank = ((q * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
    latencies[rank - 1]
}

/// The latency of the small GETs sent within `from..to`: how many, and a
/// line of their p50, p90, p99, slowest, and how many took over 100 ms.
fn small_latency(records: &[Record], from: Duration, to: Duration) -> String {
    let mut l: Vec<Duration> = records
        .iter()
        .filter(|r| r.kind == Kind::Small && r.start >= from && r.start < to)
        .map(|r| r.latency)
        .collect();
    let slow = l
        .iter()
        .filter(|t| **t > Duration::from_millis(100))
        .count();
    let [p50, p90, p99] = [0.50, 0.90, 0.99].map(|q| quantile(&mut l, q));
    let max = l.last().copied().unwrap_or_default();
    format!(
        "{:.1} s, {} requests: p50 {p50:.2?}, p90 {p90:.2?}, p99 {p99:.2?}, max {max:.2?}; \
         {slow} over 100 ms",
        (to - from).as_secs_f64(),
        l.len()
    )
}

/// `f` on a blocking thread (the waits of `Proc` sleep their thread; the
/// runtime's threads serve the load meanwhile).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// The processes of the run (each killed when dropped, if still there).
struct Procs {
    relays: Vec<Proc>,
    /// Relays that were restarted, for their logs.
    retired: Vec<Proc>,
    _workers: Vec<Proc>,
}

impl Procs {
    fn dump(&self) {
        for (i, r) in self.retired.iter().enumerate() {
            eprintln!("--- retired relay {i} ---\n{}", r.log());
        }
        for (i, r) in self.relays.iter().enumerate() {
            eprintln!("--- relay {i} ---\n{}", r.log());
        }
    }
}

/// The lines of nginx's error log above `info` and `notice` (which log
/// every connection a client closes).
fn nginx_warnings(nginx: &nginx::Nginx) -> Vec<String> {
    let log = std::fs::read_to_string(nginx.dir.join("error.log")).unwrap_or_default();
    log.lines()
        .filter(|l| !l.contains("[info]") && !l.contains("[notice]"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nginx: run `bash .ci/scaleout`"]
async fn a_rolling_restart_under_load_fails_no_request() {
    let scratch = Scratch::new();
    let tokens = connect_tokens(WORKERS);
    let (relays, addrs) = three_relays(&scratch, &tokens, &RELAY_ARGS);
    let tokens_file = scratch.0.join("tokens.txt");
    let (proxy, listen) = nginx::Nginx::start(&scratch.0, |listen| {
        nginx::render(&scratch.0, listen, [addrs[0], addrs[1], addrs[2]])
    });
    let workers = tokens
        .iter()
        .map(|(id, secret)| {
            let url = format!("ws://{listen}/connect/{id}");
            worker_process_with(&url, secret, &["--threads", "1"])
        })
        .collect();
    let mut procs = Procs {
        relays,
        retired: Vec::new(),
        _workers: workers,
    };
    let run = scenario(listen, &addrs, tokens_file, &mut procs);
    let outcome = tokio::time::timeout(Duration::from_secs(300), run).await;
    if !matches!(outcome, Ok(Ok(()))) {
        procs.dump();
    }
    let warnings = nginx_warnings(&proxy);
    println!("nginx logged {} warnings and errors", warnings.len());
    for l in &warnings {
        println!("  {l}");
    }
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(why)) => panic!("{why}"),
        Err(_) => panic!("the rolling-restart test took longer than 300 s"),
    }
    // Not even a request that nginx passed on to another relay: a relay
    // that failed one is marked down (`max_fails`) and its workers move.
    // (A worker's tunnel reset as its relay closes it is no caller's.)
    let callers: Vec<&String> = warnings
        .iter()
        .filter(|l| !l.contains("while proxying upgraded connection"))
        .collect();
    assert!(
        callers.is_empty(),
        "nginx logged failures of callers' requests: {callers:#?}"
    );
}

/// The test proper; `Err` says what failed (the caller prints the logs).
async fn scenario(
    nginx: SocketAddr,
    addrs: &[SocketAddr],
    tokens_file: PathBuf,
    procs: &mut Procs,
) -> Result<(), String> {
    let ids: Vec<String> = (0..WORKERS).map(|i| format!("w{i:02}")).collect();
    let up = recovery(nginx, &ids, Instant::now()).await;
    if let Some((id, _, seen)) = up.iter().find(|(_, t, _)| *t == Duration::MAX) {
        return Err(format!(
            "worker {id} never reachable through nginx: {seen:?}"
        ));
    }
    let per_relay: Vec<usize> = procs
        .relays
        .iter()
        .map(|r| held_workers(&r.log()).len())
        .collect();
    println!("all {WORKERS} workers reachable through nginx; workers per relay: {per_relay:?}");

    let load = Load::new(nginx, ids.clone());
    let generators = [
        (Kind::Small, SMALL_EVERY),
        (Kind::Upload, UPLOAD_EVERY),
        (Kind::Long, LONG_EVERY),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (kind, every))| tokio::spawn(load.clone().generate(kind, every, i * 10)))
    .collect::<Vec<_>>();

    // The baseline, after a second of warm-up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let baseline_from = load.since_start();
    tokio::time::sleep(BASELINE).await;
    let baseline_to = load.since_start();

    // Each relay restarted in place in turn.
    let restarts_from = load.since_start();
    for (i, addr) in addrs.iter().enumerate() {
        let summary = restart(i, *addr, &tokens_file, procs).await?;
        println!("relay {i} ({addr}): {summary}");
    }
    let restarts_to = load.since_start();

    // A while more, then the load stops and what is in flight finishes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    load.stop.store(true, Ordering::SeqCst);
    let stopped_at = load.since_start();
    for g in generators {
        g.await.map_err(|e| e.to_string())?;
    }
    let end = Instant::now() + REQUEST_TIMEOUT + Duration::from_secs(5);
    while load.in_flight.load(Ordering::SeqCst) > 0 {
        if Instant::now() > end {
            return Err("requests still in flight after the timeout".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let records = std::mem::take(&mut *load.records.lock().unwrap());
    let count = |k: Kind| records.iter().filter(|r| r.kind == k).count();
    let failures: Vec<String> = records
        .iter()
        .filter_map(|r| {
            r.failure
                .as_ref()
                .map(|f| format!("{:.3}s: {f}", r.start.as_secs_f64()))
        })
        .collect();
    let rate = records.len() as f64 / stopped_at.as_secs_f64();
    println!(
        "{} requests in {:.1} s ({rate:.0} req/s): {} small GETs, {} uploads of 1 MiB echoed, \
         {} requests of {LONG_MS} ms; {} failed",
        records.len(),
        stopped_at.as_secs_f64(),
        count(Kind::Small),
        count(Kind::Upload),
        count(Kind::Long),
        failures.len()
    );
    println!(
        "small GETs, baseline ({})",
        small_latency(&records, baseline_from, baseline_to)
    );
    println!(
        "small GETs, during the restarts ({})",
        small_latency(&records, restarts_from, restarts_to)
    );
    if !failures.is_empty() {
        let shown = failures.iter().take(50).cloned().collect::<Vec<_>>();
        return Err(format!(
            "{} of {} requests failed (the first 50):\n{}",
            failures.len(),
            records.len(),
            shown.join("\n")
        ));
    }
    if rate < MIN_RATE {
        return Err(format!("the load was {rate:.0} req/s, under {MIN_RATE}"));
    }
    if [Kind::Small, Kind::Upload, Kind::Long]
        .iter()
        .any(|&k| count(k) == 0)
    {
        return Err("a kind of request was never sent".into());
    }
    Ok(())
}

/// Restarts relay `i` on `addr` in place: a new relay on the same port,
/// once it listens `SIGTERM` to the old one, which must exit 0; then its
/// workers must be on the new one. Says how long each step took.
async fn restart(
    i: usize,
    addr: SocketAddr,
    tokens: &std::path::Path,
    procs: &mut Procs,
) -> Result<String, String> {
    let started = Instant::now();
    let tokens = tokens.to_path_buf();
    let new = blocking(move || scaleout::relay(addr.port(), &tokens, &RELAY_ARGS).0).await;
    let listening = started.elapsed();
    let old = std::mem::replace(&mut procs.relays[i], new);
    let held = held_workers(&old.log());
    // SAFETY: kill(2) on a process this test started; no memory involved.
    if unsafe { libc::kill(old.child.id() as libc::pid_t, libc::SIGTERM) } != 0 {
        return Err(format!("cannot signal relay {i}"));
    }
    let signalled = Instant::now();
    let (old, exit) = blocking(move || {
        let mut old = old;
        let exit = old.wait_exit(Duration::from_secs(45));
        // The exit can come before the reader thread has the last line.
        old.wait_log("drained; exiting", Duration::from_secs(5));
        (old, exit)
    })
    .await;
    let exited = signalled.elapsed();
    procs.retired.push(old);
    if exit != Some(0) {
        return Err(format!("relay {i} exited with {exit:?} after SIGTERM"));
    }
    // Its workers, on the new relay.
    let new_log = procs.relays[i].stderr.clone();
    let wanted = held.clone();
    let missing = blocking(move || {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let log = new_log.lock().unwrap().join("\n");
            let missing: Vec<String> = wanted
                .iter()
                .filter(|id| !log.contains(&format!("worker {id} connected")))
                .cloned()
                .collect();
            if missing.is_empty() || Instant::now() > end {
                return missing;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await;
    if !missing.is_empty() {
        return Err(format!(
            "relay {i}: workers {missing:?} not back on its successor within 20 s"
        ));
    }
    Ok(format!(
        "the new relay listened after {listening:.2?}; the old one drained and exited 0 \
         {exited:.2?} after SIGTERM; its {} workers were all on the new one {:.2?} after SIGTERM",
        held.len(),
        signalled.elapsed()
    ))
}

/// The workers a relay holds, from its log: those connected and not
/// disconnected since.
fn held_workers(log: &str) -> Vec<String> {
    let mut held: Vec<String> = Vec::new();
    for line in log.lines() {
        let Some(rest) = line.split("worker ").nth(1) else {
            continue;
        };
        let id = rest
            .split([' ', ':'])
            .next()
            .unwrap_or_default()
            .to_string();
        if rest.starts_with(&format!("{id} connected")) {
            if !held.contains(&id) {
                held.push(id);
            }
        } else if rest.starts_with(&format!("{id} disconnected")) {
            held.retain(|h| *h != id);
        }
    }
    held.sort();
    held
}
