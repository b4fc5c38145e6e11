//! Peak memory of the example processes while 1 GiB streams through them
//! (see BENCHMARKS.md). A plain harness; run it with `benches/memory.sh`,
//! which builds the release examples first.
//!
//! For each scenario a fresh `relay` and `worker` (the release examples) are
//! started on 127.0.0.1: the relay reads its tokens from a temporary file
//! (mode 0600), the worker from its environment; no token is on a command
//! line. Then one client sends a 1 GiB upload through the relay, while a
//! sampler reads `VmRSS` of both processes every 10 ms; at the end `VmHWM`
//! (the kernel's peak RSS) of each is reported.
//!
//! - `echo-slow-reader`: `POST /w/mem/echo` (1 GiB); the client sends as fast as
//!   it can but reads the echoed body at `MEMORY_READ_MIBPS` MiB/s (default 64):
//!   the worker's app cannot write faster than that, so it reads the upload
//!   at that pace — a slowly reading app — and the relay in front of it must
//!   hold the rest back (the worker example has no route whose app reads
//!   slowly by itself; this is the closest).
//! - `sha256-full-speed`: `POST /w/mem/sha256` (1 GiB) at full speed.
//!
//! - `slow-caller`: `GET /w/mem/bytes?n=100 MiB` read at 100 KB/s for 60 s
//!   (then at full speed to the end), and the same download by a caller that
//!   stops reading after the head; meanwhile `GET /health` every 200 ms. The
//!   baseline is 15 s of the same `/health` loop with nothing else running,
//!   measured first in the same run. Reported: /health p50/p99/max in both
//!   phases, the relay's peak RSS and overflow bytes on disk (its unlinked
//!   temporary files, read from `/proc/<pid>/fd`), and what became of each
//!   download.
//!
//! Target: peak RSS ≤ 64 MiB for each process in each scenario; in
//! `slow-caller`, /health p99 ≤ 100 ms while the slow and stalled downloads run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const WORKER: &str = "mem";
const TARGET_KIB: u64 = 64 * 1024;

fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    (0..4)
        .map(|i| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(i);
            format!("{:016x}", h.finish())
        })
        .collect()
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// A child killed (by its own pid) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Forwards a child's stderr to ours (prefixed) and sends each line to `tx`.
fn watch_stderr(child: &mut Child, tag: &'static str, tx: mpsc::Sender<String>) {
    let stderr = child.stderr.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            eprintln!("  [{tag}] {line}");
            let _ = tx.send(line);
        }
    });
}

fn wait_for(rx: &mpsc::Receiver<String>, what: &str, f: impl Fn(&str) -> Option<String>) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(v) = f(&line) {
                    return v;
                }
            }
            Err(_) => break,
        }
    }
    panic!("timed out waiting for {what}");
}

struct Running {
    // Dropped (killed) in this order: the worker first, so it does not log a lost relay.
    worker: Proc,
    relay: Proc,
    addr: SocketAddr,
    auth: String,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start(bin: &Path) -> Running {
    let dir = std::env::temp_dir().join(format!("worker-relay-memory-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let dir = TempDir(dir);
    let connect_token = random_token();
    let worker_token = random_token();
    let tokens = dir.0.join("tokens.txt");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tokens)
            .unwrap();
        writeln!(f, "{WORKER} {connect_token}").unwrap();
    }

    let mut relay = Command::new(bin.join("relay"))
        .args(["--listen", "127.0.0.1:0", "--tokens"])
        .arg(&tokens)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the relay example");
    let (tx, rx) = mpsc::channel();
    watch_stderr(&mut relay, "relay", tx);
    let relay = Proc(relay);
    let addr: SocketAddr = wait_for(&rx, "the relay to listen", |l| {
        let rest = l.strip_prefix("relay: listening on ")?;
        Some(rest.split([';', ' ']).next()?.to_owned())
    })
    .parse()
    .unwrap();

    let mut worker = Command::new(bin.join("worker"))
        .args(["--connect", &format!("ws://{addr}/connect")])
        .env("STRATA_WORKER_CONNECT_TOKEN", &connect_token)
        .env("STRATA_WORKER_TOKEN", &worker_token)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the worker example");
    let (wtx, wrx) = mpsc::channel();
    watch_stderr(&mut worker, "worker", wtx);
    let worker = Proc(worker);
    wait_for(&wrx, "the worker to connect", |l| {
        l.contains("connected to").then(String::new)
    });
    let run = Running {
        relay,
        worker,
        addr,
        auth: format!("Bearer {worker_token}"),
        _dir: dir,
    };
    // The relay registers the socket just after the handshake: wait for /health.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok((200, _)) = request(&run, "GET", "/health", 0, None) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker never answered /health"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    run
}

/// Sends `upload` bytes (a repeated pattern) to `path` through the relay and
/// reads the answer, at most `read_bps` bytes per second when given.
/// Returns (status, body bytes read).
fn request(
    run: &Running,
    method: &str,
    path: &str,
    upload: u64,
    read_bps: Option<u64>,
) -> std::io::Result<(u16, u64)> {
    let mut s = TcpStream::connect(run.addr)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    s.set_write_timeout(Some(Duration::from_secs(120)))?;
    let head = format!(
        "{method} /w/{WORKER}{path} HTTP/1.1\r\nhost: {}\r\nauthorization: {}\r\n\
         content-type: application/octet-stream\r\ncontent-length: {upload}\r\n\
         connection: close\r\n\r\n",
        run.addr, run.auth
    );
    s.write_all(head.as_bytes())?;
    let mut w = s.try_clone()?;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let piece: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
        let mut sent = 0;
        while sent < upload {
            let n = (upload - sent).min(MIB) as usize;
            w.write_all(&piece[..n])?;
            sent += n as u64;
        }
        Ok(())
    });

    let mut r = BufReader::with_capacity(64 << 10, s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length: Option<u64> = None;
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((n, v)) = l.split_once(':') {
            if n.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok();
            }
        }
    }
    let length = length.unwrap_or(0);
    let mut buf = vec![0u8; 64 << 10];
    let (t0, mut got) = (Instant::now(), 0u64);
    while got < length {
        let want = ((length - got) as usize).min(buf.len());
        let n = r.read(&mut buf[..want])?;
        if n == 0 {
            break;
        }
        got += n as u64;
        if let Some(bps) = read_bps {
            let due = Duration::from_secs_f64(got as f64 / bps as f64);
            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    writer.join().expect("writer thread")?;
    Ok((status, got))
}

struct Peak {
    idle_kib: u64,
    max_sampled_kib: Arc<AtomicU64>,
}

fn scenario(bin: &Path, name: &str, path: &str, read_bps: Option<u64>) -> Vec<String> {
    eprintln!("memory: scenario {name}");
    let run = start(bin);
    let pids = [("relay", run.relay.0.id()), ("worker", run.worker.0.id())];
    let stop = Arc::new(AtomicBool::new(false));
    let peaks: Vec<Peak> = pids
        .iter()
        .map(|(_, pid)| Peak {
            idle_kib: rss_kib(*pid).map_or(0, |r| r.0),
            max_sampled_kib: Arc::new(AtomicU64::new(0)),
        })
        .collect();
    let sampler = {
        let stop = stop.clone();
        let maxes: Vec<(u32, Arc<AtomicU64>)> = pids
            .iter()
            .zip(&peaks)
            .map(|((_, pid), p)| (*pid, p.max_sampled_kib.clone()))
            .collect();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for (pid, max) in &maxes {
                    if let Some((rss, _)) = rss_kib(*pid) {
                        max.fetch_max(rss, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let t = Instant::now();
    let (status, got) = request(&run, "POST", path, GIB, read_bps).expect("the upload");
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    assert_eq!(status, 200, "{name}: status");
    if path == "/echo" {
        assert_eq!(got, GIB, "{name}: echoed bytes");
    }
    let mut rows = Vec::new();
    for ((proc_name, pid), p) in pids.iter().zip(&peaks) {
        let hwm = rss_kib(*pid).map_or(0, |r| r.1);
        let max = p.max_sampled_kib.load(Ordering::Relaxed);
        rows.push(format!(
            "| {name} | {proc_name} | {:.1} | {:.1} | {:.1} | ≤ 64 | {} | {:.1} s ({:.0} MiB/s) |",
            p.idle_kib as f64 / 1024.0,
            max as f64 / 1024.0,
            hwm as f64 / 1024.0,
            if hwm <= TARGET_KIB { "met" } else { "missed" },
            secs,
            GIB as f64 / MIB as f64 / secs,
        ));
    }
    rows
}

/// One `GET /health` through the relay; how long it took.
fn health(run: &Running) -> Duration {
    let t = Instant::now();
    let (status, _) = request(run, "GET", "/health", 0, None).expect("/health");
    assert_eq!(status, 200);
    t.elapsed()
}

/// `/health` every 200 ms for `d`: the sorted times.
fn health_loop(run: &Running, d: Duration) -> Vec<Duration> {
    let mut times = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < d {
        let took = health(run);
        times.push(took);
        std::thread::sleep(Duration::from_millis(200).saturating_sub(took));
    }
    times.sort();
    times
}

fn pct(times: &[Duration], p: usize) -> Duration {
    times[(times.len() * p / 100).min(times.len() - 1)]
}

/// The relay's overflow files open now (unlinked temporary files in the
/// temporary directory): their total size.
fn overflow_bytes(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| {
                t.starts_with(std::env::temp_dir()) && t.to_string_lossy().ends_with(" (deleted)")
            })
        })
        .map(|e| std::fs::metadata(e.path()).map_or(0, |m| m.len()))
        .sum()
}

/// Starts a GET of `n` bytes; returns the socket after the head was read.
fn start_download(run: &Running, n: u64) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(run.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let head = format!(
        "GET /w/{WORKER}/bytes?n={n} HTTP/1.1\r\nhost: x\r\nauthorization: {}\r\n\r\n",
        run.auth
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut r = BufReader::with_capacity(64 << 10, s);
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line.trim_end().is_empty() {
            return r;
        }
    }
}

fn slow_caller(bin: &Path) -> String {
    const N: u64 = 100 * MIB;
    eprintln!("memory: scenario slow-caller (baseline 15 s, then 60 s)");
    let run = start(bin);
    let relay_pid = run.relay.0.id();
    let base = health_loop(&run, Duration::from_secs(15));
    let stop = Arc::new(AtomicBool::new(false));
    let max_overflow = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, max) = (stop.clone(), max_overflow.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                max.fetch_max(overflow_bytes(relay_pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let mut stalled = start_download(&run, N);
    let slow = {
        let mut r = start_download(&run, N);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut got = 0u64;
            let mut buf = vec![0u8; 64 << 10];
            while got < N {
                let slow = t0.elapsed() < Duration::from_secs(60);
                let want = if slow { 10_000 } else { buf.len() };
                match r.read(&mut buf[..want]) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => got += k as u64,
                }
                if slow {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            got
        })
    };
    let loaded = health_loop(&run, Duration::from_secs(60));
    // Past its stall deadline the stalled caller has been given up.
    std::thread::sleep(Duration::from_secs(5));
    let mut stalled_got = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while let Ok(k) = stalled.read(&mut buf) {
        if k == 0 {
            break;
        }
        stalled_got += k as u64;
    }
    let slow_got = slow.join().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let left = overflow_bytes(relay_pid);
    let hwm = rss_kib(relay_pid).map_or(0, |r| r.1);
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    format!(
        "| slow-caller | {} / {} / {} ({} checks) | {} / {} / {} ({} checks) | {:.2}× | {:.1} MiB ({}) | {} MiB peak, {} left | slow caller: {} of {} MiB; stalled: given up after {:.1} MiB |",
        ms(pct(&base, 50)),
        ms(pct(&base, 99)),
        ms(*base.last().unwrap()),
        base.len(),
        ms(pct(&loaded, 50)),
        ms(pct(&loaded, 99)),
        ms(*loaded.last().unwrap()),
        loaded.len(),
        pct(&loaded, 99).as_secs_f64() / pct(&base, 99).as_secs_f64(),
        hwm as f64 / 1024.0,
        if hwm <= TARGET_KIB && pct(&loaded, 99) <= Duration::from_millis(100) { "met" } else { "missed" },
        max_overflow.load(Ordering::Relaxed) / MIB,
        left,
        slow_got / MIB,
        N / MIB,
        stalled_got as f64 / MIB as f64,
    )
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let bin = target.join("release").join("examples");
    if !bench || !bin.join("relay").exists() || !bin.join("worker").exists() {
        eprintln!(
            "memory: skipped (run `bash benches/memory.sh`: it builds the release examples, then runs this)"
        );
        return;
    }
    let mibps: u64 = std::env::var("MEMORY_READ_MIBPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let mut rows = Vec::new();
    rows.extend(scenario(
        &bin,
        &format!("echo-slow-reader ({mibps} MiB/s)"),
        "/echo",
        Some(mibps * MIB),
    ));
    rows.extend(scenario(
        &bin,
        &format!("slow-sink app ({mibps} MiB/s)"),
        &format!("/slow-sink?mibps={mibps}"),
        None,
    ));
    rows.extend(scenario(&bin, "sha256-full-speed", "/sha256", None));
    let slow = slow_caller(&bin);
    println!("\nPeak RSS while 1 GiB is uploaded through the relay (MiB)\n");
    println!("| scenario | process | idle RSS | max sampled RSS | VmHWM (peak) | target | met? | upload took |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    println!("\nA slow and a stalled caller (100 MiB each) while /health is asked every 200 ms\n");
    println!("| scenario | /health p50 / p99 / max, baseline | the same during the downloads | p99 ratio | relay peak RSS (target ≤ 64 MiB, p99 ≤ 100 ms) | overflow on disk | downloads |");
    println!("|---|---|---|---|---|---|---|");
    println!("{slow}");
}
