//! The relay's memory per idle worker with 5,000 workers connected (issue
//! 15; see BENCHMARKS.md). A plain harness; run it with
//! `bash benches/idle_workers.sh`, which builds the release relay example
//! first.
//!
//! Each phase starts a fresh release `relay` example process on 127.0.0.1:
//! its tokens in a temporary file (mode 0600, never on a command line), its
//! log (one line per worker connect) in a file beside them. Only the relay
//! process is measured: `VmRSS`, `VmHWM` and `RssAnon` from
//! `/proc/<pid>/status`, its open fds from `/proc/<pid>/fd`.
//!
//! - `idle workers`: N real workers (default 5,000; `IDLE_WORKERS=N`) run
//!   in this process, each `ws::dial` + `tunnel::serve` of a one-route axum
//!   app with the default `WorkerConfig` (what a worker built on the crate
//!   is), connected in batches of 100, then idle. The relay's RSS is read
//!   with no worker connected (after startup and one warm-up worker that
//!   connected, served one request and left), then 5 s and 25 s after the
//!   last of the N registered: at 25 s every connection has been through a
//!   keepalive round (a ping every 20 s each way), so the buffers a ping and
//!   its pong touch are counted. Per worker = (RSS at 25 s − RSS at 0) / N.
//! - `after one request each`: then every worker serves one `GET` through
//!   the relay (a new caller connection each, 100 at a time), and the RSS is
//!   read again 5 s and 25 s later: what a worker connection keeps after
//!   its first request.
//! - The baselines, on a fresh relay (same binary, a token file of N workers too, started
//!   with `--header-timeout 600` so idle connections stay open): N TCP
//!   connections that sent nothing (hyper waiting for a request head; read
//!   at 5 s and 10 s), then the same N after one request each (answered 404
//!   by the relay itself, "unknown worker"): idle HTTP/1.1 keep-alive
//!   connections, read at 5 s and 25 s. The keep-alive connection is the
//!   relay's HTTP stack at rest, what a worker connection would cost if
//!   the relay held it as plain HTTP (a worker connection is an HTTP
//!   connection whose one request was the upgrade); the ratio is per idle
//!   worker ÷ per idle keep-alive connection, measured in the same run.
//!
//! Target: ≤ 16 KiB of relay RSS per idle worker. Exits non-zero if the
//! relay never held all N workers (or all N baseline connections), or the
//! bench ran past its 5-minute deadline. Talks only to 127.0.0.1.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use worker_relay::connect::{Token, WorkerHandshake};
use worker_relay::proto::WorkerConfig;
use worker_relay_hyper::{tunnel, ws};

/// Connections opened at once: below the relay's listen backlog (128, the
/// tokio/std default), which a larger burst overflows (those SYNs are
/// dropped and retried by the kernel 1 s later).
const BATCH: usize = 100;
/// Caller requests in flight at once (the control).
const REQUESTS_AT_ONCE: usize = 100;
const TARGET_KIB: f64 = 16.0;
/// After the last connection: "quiet", then past one keepalive round (20 s).
const SETTLE: Duration = Duration::from_secs(5);
const PAST_PING: Duration = Duration::from_secs(25);
/// The whole bench, at most.
const DEADLINE: Duration = Duration::from_secs(300);
/// Every wait on the network, at most.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The relay running now, killed (by its pid) by the watchdog at the deadline.
static RELAY_PID: AtomicU32 = AtomicU32::new(0);

fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    (0..2)
        .map(|i| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(i);
            format!("{:016x}", h.finish())
        })
        .collect()
}

/// KiB figures of one process from `/proc/<pid>/status`.
#[derive(Clone, Copy, Default)]
struct Mem {
    rss: u64,
    hwm: u64,
    anon: u64,
}

fn mem(pid: u32) -> Mem {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Mem {
        rss: field("VmRSS:"),
        hwm: field("VmHWM:"),
        anon: field("RssAnon:"),
    }
}

/// The kernel's count of connections dropped at a full accept queue
/// (`TcpExtListenOverflows`, system-wide; only this bench connects here).
fn listen_overflows() -> u64 {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let at = names
            .split_whitespace()
            .position(|n| n == "ListenOverflows");
        return at
            .and_then(|i| values.split_whitespace().nth(i))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
    }
    0
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A release relay example process, killed (by its own pid) when dropped.
struct Relay {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    _dir: TempDir,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        RELAY_PID.store(0, Ordering::SeqCst);
    }
}

impl Relay {
    fn start(bin: &Path, tokens: &[(String, String)], tag: &str, args: &[&str]) -> Relay {
        let dir =
            std::env::temp_dir().join(format!("worker-relay-idle-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("a temporary directory");
        let dir = TempDir(dir);
        let file = dir.0.join("tokens.txt");
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .expect("the token file");
            for (id, token) in tokens {
                writeln!(f, "{id} {token}").unwrap();
            }
        }
        let log = dir.0.join("relay.log");
        let child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--tokens"])
            .arg(&file)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the relay's log file"))
            .spawn()
            .expect("start the relay example");
        RELAY_PID.store(child.id(), Ordering::SeqCst);
        let mut relay = Relay {
            child,
            addr: "127.0.0.1:0".parse().unwrap(),
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let text = std::fs::read_to_string(&relay.log).unwrap_or_default();
            let addr = text.lines().find_map(|l| {
                let rest = l.strip_prefix("relay: listening on ")?;
                rest.split([';', ' ']).next()?.parse().ok()
            });
            if let Some(addr) = addr {
                relay.addr = addr;
                return relay;
            }
            if let Ok(Some(status)) = relay.child.try_wait() {
                panic!("the relay exited ({status}) before listening:\n{text}");
            }
            assert!(
                Instant::now() < deadline,
                "the relay never listened:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Log lines that match `f`.
    fn log_lines(&self, f: impl Fn(&str) -> bool) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| f(l))
            .count()
    }

    /// Waits (at most `IO_TIMEOUT` × 3) until `n` log lines match `f`; how many did.
    async fn wait_log(&self, n: usize, f: impl Fn(&str) -> bool) -> usize {
        let deadline = Instant::now() + IO_TIMEOUT * 3;
        loop {
            let got = self.log_lines(&f);
            if got >= n || Instant::now() >= deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The relay's figures at one moment.
#[derive(Clone, Copy, Default)]
struct Sample {
    mem: Mem,
    fds: usize,
}

fn sample(pid: u32) -> Sample {
    Sample {
        mem: mem(pid),
        fds: fds(pid),
    }
}

/// One phase's figures.
struct Phase {
    name: String,
    n: usize,
    held: usize,
    zero: Sample,
    settled: Sample,
    after: Sample,
    /// How long the N connections (or the N requests) took, and how many
    /// SYNs the relay's full accept queue dropped meanwhile.
    opened_in: Duration,
    dropped: u64,
}

impl Phase {
    /// KiB per connection from `zero` to `at`.
    fn per(&self, at: &Sample) -> f64 {
        (at.mem.rss as f64 - self.zero.mem.rss as f64) / self.n as f64
    }

    fn per_anon(&self, at: &Sample) -> f64 {
        (at.mem.anon as f64 - self.zero.mem.anon as f64) / self.n as f64
    }
}

/// The workers' app.
fn app() -> axum::Router {
    axum::Router::new().route("/hello", axum::routing::get(|| async { "hello\n" }))
}

/// Decrements a count when the worker's task ends (or is aborted).
struct Alive(Arc<AtomicUsize>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Dials as the worker of `token` and serves `app()` on its own task.
async fn worker(
    url: String,
    token: String,
    alive: Arc<AtomicUsize>,
) -> Result<JoinHandle<()>, String> {
    let handshake = WorkerHandshake::new(Some(Token::new(token).map_err(|e| e.to_string())?));
    // 5,000 dialled connections in one process: the relay's small read
    // buffer, not a worker's 128 KiB each (640 MiB here).
    let socket = ws::Dialer::new()
        .timeout(IO_TIMEOUT)
        .read_buffer(ws::READ_BUFFER)
        .dial(&url, &handshake)
        .await
        .map_err(|v| format!("{v:?}"))?;
    alive.fetch_add(1, Ordering::SeqCst);
    let guard = Alive(alive);
    Ok(tokio::spawn(async move {
        let _guard = guard;
        let _ = tunnel::serve(socket, WorkerConfig::default(), app()).await;
    }))
}

/// Connects the workers of `tokens`, `BATCH` at a time, retrying failed
/// dials twice. Returns their tasks (fewer than asked if some never got in).
async fn connect_workers(
    url: &str,
    tokens: &[(String, String)],
    alive: &Arc<AtomicUsize>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::with_capacity(tokens.len());
    let mut pending: Vec<&(String, String)> = tokens.iter().collect();
    for round in 0..3 {
        let mut failed = Vec::new();
        let mut last = String::new();
        for batch in pending.chunks(BATCH) {
            let dials: Vec<_> = batch
                .iter()
                .map(|(_, t)| tokio::spawn(worker(url.to_owned(), t.clone(), alive.clone())))
                .collect();
            for (entry, dial) in batch.iter().zip(dials) {
                match dial.await {
                    Ok(Ok(task)) => tasks.push(task),
                    Ok(Err(e)) => {
                        failed.push(*entry);
                        last = e;
                    }
                    Err(e) => {
                        failed.push(*entry);
                        last = e.to_string();
                    }
                }
            }
        }
        if failed.is_empty() {
            break;
        }
        eprintln!(
            "idle_workers: {} dials failed in round {} (last: {last}){}",
            failed.len(),
            round + 1,
            if round < 2 { "; retrying" } else { "" }
        );
        pending = failed;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tasks
}

/// One request, `connection: close`; the status.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
    let exchange = async {
        let mut s = TcpStream::connect(addr).await?;
        let head = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        s.write_all(head.as_bytes()).await?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(status_of(&answer))
    };
    tokio::time::timeout(IO_TIMEOUT, exchange)
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)?
}

fn status_of(answer: &[u8]) -> u16 {
    std::str::from_utf8(&answer[..answer.len().min(16)])
        .ok()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Sends one request (`path`) on `s` and reads its whole answer (a
/// Content-Length body), leaving the connection open; the status.
async fn exchange(s: &mut TcpStream, path: &str) -> std::io::Result<u16> {
    let exchange = async {
        let head = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
        s.write_all(head.as_bytes()).await?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer);
            let Some(end) = text.find("\r\n\r\n") else {
                continue;
            };
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .ok_or(std::io::ErrorKind::InvalidData)?;
            if answer.len() >= end + 4 + length {
                return Ok(status_of(&answer));
            }
        }
    };
    tokio::time::timeout(IO_TIMEOUT, exchange)
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)?
}

/// A TCP connection to `addr`, within the timeout.
async fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    tokio::time::timeout(IO_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)?
}

/// Still open: a socket the relay had closed would read EOF at once.
fn still_open(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.try_read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Sleeps until `at`.
async fn until(at: Instant) {
    tokio::time::sleep_until(at.into()).await;
}

fn tokens(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("idle-{i:05}"), random_token()))
        .collect()
}

fn is_idle_connect(l: &str) -> bool {
    l.starts_with("relay: worker idle-") && l.ends_with(" connected")
}

/// N idle workers, then one request each: the `idle workers` and `after one
/// request each` rows.
async fn workers_phase(bin: &Path, n: usize) -> (Phase, Phase, u64) {
    let mut table = tokens(n);
    table.push(("warm-up".into(), random_token()));
    let relay = Relay::start(bin, &table, "workers", &[]);
    let (warm, table) = table.split_last().unwrap();
    let url = format!("ws://{}/connect", relay.addr);
    let pid = relay.pid();
    let alive = Arc::new(AtomicUsize::new(0));

    // Warm-up: one worker connects, serves a request, leaves.
    let task = worker(url.clone(), warm.1.clone(), alive.clone())
        .await
        .expect("the warm-up worker connects");
    let registered = relay
        .wait_log(1, |l| l == "relay: worker warm-up connected")
        .await;
    assert_eq!(registered, 1, "the warm-up worker never registered");
    let status = get(relay.addr, "/w/warm-up/hello").await;
    assert!(matches!(status, Ok(200)), "warm-up request: {status:?}");
    task.abort();
    relay
        .wait_log(1, |l| l.starts_with("relay: worker warm-up disconnected"))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let zero = sample(pid);
    let own_zero = mem(std::process::id()).rss;

    eprintln!("idle_workers: connecting {n} workers, {BATCH} at a time");
    let (t, overflows) = (Instant::now(), listen_overflows());
    let tasks = connect_workers(&url, table, &alive).await;
    let held = relay.wait_log(n, is_idle_connect).await;
    let connected_in = t.elapsed();
    let dropped = listen_overflows() - overflows;
    let last = Instant::now();
    eprintln!(
        "idle_workers: {} workers dialled, {held} registered by the relay in {:.1} s; \
         waiting {} s (past one keepalive round)",
        tasks.len(),
        connected_in.as_secs_f64(),
        PAST_PING.as_secs()
    );
    until(last + SETTLE).await;
    let settled = sample(pid);
    until(last + PAST_PING).await;
    let idle = sample(pid);
    let own = mem(std::process::id()).rss.saturating_sub(own_zero);
    let still = alive.load(Ordering::SeqCst);

    // The control: one request through each worker, then idle again.
    eprintln!("idle_workers: one request through each worker, {REQUESTS_AT_ONCE} at a time");
    let (t, overflows) = (Instant::now(), listen_overflows());
    let mut ok = 0;
    for batch in table.chunks(REQUESTS_AT_ONCE) {
        let requests: Vec<_> = batch
            .iter()
            .map(|(id, _)| {
                let (addr, path) = (relay.addr, format!("/w/{id}/hello"));
                tokio::spawn(async move { get(addr, &path).await })
            })
            .collect();
        for r in requests {
            if matches!(r.await, Ok(Ok(200))) {
                ok += 1;
            }
        }
    }
    let served_in = t.elapsed();
    let served_dropped = listen_overflows() - overflows;
    eprintln!(
        "idle_workers: {ok} of {n} requests answered 200 in {:.1} s; waiting {} s",
        served_in.as_secs_f64(),
        PAST_PING.as_secs()
    );
    let t_served = Instant::now();
    until(t_served + SETTLE).await;
    let served_settled = sample(pid);
    until(t_served + PAST_PING).await;
    let after_requests = sample(pid);
    let still_after = alive.load(Ordering::SeqCst);
    for task in &tasks {
        task.abort();
    }
    drop(relay);

    let name = |s: &str, still: usize| {
        if still == n {
            s.to_string()
        } else {
            format!("{s} ({still} of {n} still connected)")
        }
    };
    let idle_phase = Phase {
        name: name("idle workers", still),
        n,
        held,
        zero,
        settled,
        after: idle,
        opened_in: connected_in,
        dropped,
    };
    let control = Phase {
        name: name(
            &format!("idle workers, after one request each ({ok} × 200)"),
            still_after,
        ),
        n,
        held: held.min(ok),
        zero,
        settled: served_settled,
        after: after_requests,
        opened_in: served_in,
        dropped: served_dropped,
    };
    (idle_phase, control, own)
}

/// The baselines, on one fresh relay: N TCP connections that sent nothing
/// (hyper waiting for a request head), then the same N after one request
/// each (answered 404 by the relay, "unknown worker"), idle keep-alive
/// connections.
async fn baseline_phase(bin: &Path, n: usize) -> (Phase, Phase) {
    let table = tokens(n);
    let relay = Relay::start(bin, &table, "baseline", &["--header-timeout", "600"]);
    let (addr, pid) = (relay.addr, relay.pid());
    // Warm-up: one keep-alive connection, one 404, closed.
    let mut warm = connect(addr).await.expect("the warm-up connection");
    let status = exchange(&mut warm, "/w/nobody/").await;
    assert!(matches!(status, Ok(404)), "warm-up: {status:?}");
    drop(warm);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let zero = sample(pid);

    eprintln!("idle_workers: baseline: opening {n} TCP connections, {BATCH} at a time");
    let (t, overflows) = (Instant::now(), listen_overflows());
    let mut conns = Vec::with_capacity(n);
    let mut last_err = String::new();
    for _ in 0..3 {
        while conns.len() < n {
            let opens: Vec<_> = (0..(n - conns.len()).min(BATCH))
                .map(|_| tokio::spawn(connect(addr)))
                .collect();
            let mut failed = false;
            for o in opens {
                match o.await {
                    Ok(Ok(s)) => conns.push(s),
                    Ok(Err(e)) => (failed, last_err) = (true, e.to_string()),
                    Err(e) => (failed, last_err) = (true, e.to_string()),
                }
            }
            // A connect completes in the kernel before the relay accepts it:
            // wait for the relay to accept the batch (one fd each) before the
            // next, as a worker's dial waits for its 101.
            let deadline = Instant::now() + IO_TIMEOUT;
            while fds(pid) < zero.fds + conns.len() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            if failed {
                break;
            }
        }
    }
    // Every connection accepted (one fd each in the relay), at most 30 s.
    let deadline = Instant::now() + IO_TIMEOUT * 3;
    while fds(pid) < zero.fds + conns.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (bare_in, bare_dropped) = (t.elapsed(), listen_overflows() - overflows);
    eprintln!(
        "idle_workers: baseline: {} connections in {:.1} s{}",
        conns.len(),
        bare_in.as_secs_f64(),
        if conns.len() < n {
            format!(" (last error: {last_err})")
        } else {
            String::new()
        }
    );
    let last = Instant::now();
    until(last + SETTLE).await;
    let bare_settled = sample(pid);
    until(last + SETTLE * 2).await;
    let bare_after = sample(pid);
    let bare_open = conns.iter().filter(|s| still_open(s)).count();
    let bare = Phase {
        name: "baseline: idle TCP connections that sent nothing".into(),
        n,
        held: bare_open.min(bare_after.fds.saturating_sub(zero.fds)),
        zero,
        settled: bare_settled,
        after: bare_after,
        opened_in: bare_in,
        dropped: bare_dropped,
    };

    eprintln!("idle_workers: baseline: one request on each, {REQUESTS_AT_ONCE} at a time");
    let (t, overflows) = (Instant::now(), listen_overflows());
    let mut kept = Vec::with_capacity(conns.len());
    while !conns.is_empty() {
        let at = conns.len().saturating_sub(REQUESTS_AT_ONCE);
        let batch: Vec<_> = conns
            .drain(at..)
            .map(|mut s| {
                tokio::spawn(async move {
                    let status = exchange(&mut s, "/w/nobody/").await;
                    (status, s)
                })
            })
            .collect();
        for b in batch {
            if let Ok((Ok(404), s)) = b.await {
                kept.push(s);
            }
        }
    }
    let (asked_in, asked_dropped) = (t.elapsed(), listen_overflows() - overflows);
    eprintln!(
        "idle_workers: baseline: {} of {n} answered 404 in {:.1} s",
        kept.len(),
        asked_in.as_secs_f64()
    );
    let last = Instant::now();
    until(last + SETTLE).await;
    let settled = sample(pid);
    until(last + PAST_PING).await;
    let idle = sample(pid);
    let open = kept.iter().filter(|s| still_open(s)).count();
    drop(kept);
    drop(relay);
    let keep_alive = Phase {
        name: "baseline: idle HTTP/1.1 keep-alive connections (one 404 each)".into(),
        n,
        held: open.min(idle.fds.saturating_sub(zero.fds)),
        zero,
        settled,
        after: idle,
        opened_in: asked_in,
        dropped: asked_dropped,
    };
    (bare, keep_alive)
}

/// Raises the soft file limit to what `n` connections need (this process
/// holds the workers' sockets; the relay inherits the limit). `Err` with a
/// message if the hard limit is too low.
fn raise_file_limit(n: usize) -> Result<libc::rlim_t, String> {
    let need = n as libc::rlim_t + 1024;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err("getrlimit(RLIMIT_NOFILE) failed".into());
        }
        if lim.rlim_cur >= need {
            return Ok(lim.rlim_cur);
        }
        if lim.rlim_max < need {
            return Err(format!(
                "the file limit is {} (hard {}); {n} workers need {need}: raise it (ulimit -n) \
                 or set IDLE_WORKERS lower",
                lim.rlim_cur, lim.rlim_max
            ));
        }
        lim.rlim_cur = need;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
            return Err(format!("setrlimit(RLIMIT_NOFILE, {need}) failed"));
        }
    }
    Ok(need)
}

fn kib(k: u64) -> String {
    format!("{:.1} MiB", k as f64 / 1024.0)
}

fn main() -> ExitCode {
    let bench = std::env::args().any(|a| a == "--bench");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let bin = target.join("release").join("examples").join("relay");
    if !bench || !bin.exists() {
        eprintln!(
            "idle_workers: skipped (run `bash benches/idle_workers.sh`: it builds the release \
             relay example, then runs this)"
        );
        return ExitCode::SUCCESS;
    }
    let n: usize = std::env::var("IDLE_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(5000);
    let limit = match raise_file_limit(n) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("idle_workers: {e}");
            return ExitCode::from(2);
        }
    };
    // The watchdog: past the deadline, kill the relay (by its pid) and fail.
    std::thread::spawn(|| {
        std::thread::sleep(DEADLINE);
        let pid = RELAY_PID.load(Ordering::SeqCst);
        if pid != 0 {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        eprintln!("idle_workers: still running after {DEADLINE:?}: gave up");
        std::process::exit(1);
    });
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let ((idle, control, own), (bare, base)) = rt.block_on(async {
        let w = workers_phase(&bin, n).await;
        let b = baseline_phase(&bin, n).await;
        (w, b)
    });
    drop(rt);
    let total = started.elapsed();

    println!(
        "\nRelay memory per idle connection, {n} connections (file limit {limit}; \
         MALLOC_ARENA_MAX={})\n",
        std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "unset".into())
    );
    println!(
        "| phase | held | RSS, none connected | RSS +5 s | RSS +25 s (at the end) | per connection \
         (VmRSS) | per connection (RssAnon) | VmHWM | relay fds (none → all) | opened in \
         (SYNs dropped) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for p in [&idle, &control, &bare, &base] {
        println!(
            "| {} | {} of {} | {} | {} | {} | {:.1} KiB | {:.1} KiB | {} | {} → {} | {:.1} s ({}) |",
            p.name,
            p.held,
            p.n,
            kib(p.zero.mem.rss),
            kib(p.settled.mem.rss),
            kib(p.after.mem.rss),
            p.per(&p.after),
            p.per_anon(&p.after),
            kib(p.after.mem.hwm),
            p.zero.fds,
            p.after.fds,
            p.opened_in.as_secs_f64(),
            p.dropped,
        );
    }
    let per_worker = idle.per(&idle.after);
    let per_conn = base.per(&base.after);
    let met = per_worker <= TARGET_KIB;
    println!(
        "\nper idle worker: {per_worker:.1} KiB of relay RSS (+5 s: {:.1} KiB); target ≤ {TARGET_KIB} KiB: {}",
        idle.per(&idle.settled),
        if met { "met" } else { "missed" }
    );
    let per_bare = bare.per(&bare.after);
    println!(
        "per idle HTTP keep-alive connection (baseline, same relay binary): {per_conn:.1} KiB; \
         an idle worker costs {:.2}× that ({:+.1} KiB)",
        per_worker / per_conn,
        per_worker - per_conn
    );
    println!(
        "per TCP connection that sent nothing (same relay binary): {per_bare:.1} KiB; \
         an idle worker costs {:.2}× that ({:+.1} KiB)",
        per_worker / per_bare,
        per_worker - per_bare
    );
    println!(
        "after one request through each worker: {:.1} KiB per worker ({:+.1} KiB vs idle)",
        control.per(&control.after),
        control.per(&control.after) - per_worker
    );
    println!(
        "(info) this process, holding the {n} workers' side: +{:.1} KiB RSS per worker",
        own as f64 / n as f64
    );
    println!("bench took {:.0} s", total.as_secs_f64());

    let fd_ok = idle.after.fds >= idle.zero.fds + n;
    if idle.held < n || !fd_ok || bare.held < n || base.held < n {
        eprintln!(
            "idle_workers: the relay never held all {n}: {} workers registered ({} fds), \
             {} and {} baseline connections open",
            idle.held, idle.after.fds, bare.held, base.held
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
