//! Issue 23's memory check: the README's axum embed of the gateway, unchanged
//! (default settings), while slow callers download large responses from
//! several workers. Run it with `benches/overflow_rss.sh` (see BENCHMARKS.md).
//!
//! The relay runs in a process of its own (this binary again, with
//! `OVERFLOW_RSS_ROLE=relay`), so its RSS is measured alone. It runs the
//! README's snippet as written, in a fresh directory holding `tokens.txt`,
//! but listens on a free port instead of 8080, and with `TMPDIR` set to a
//! fresh directory, so its overflow files can be told from anyone else's.
//! The workers are the release `worker` example (tokens from the
//! environment). Each caller runs `GET /w/<worker>/bytes?n=N` on a thread of
//! its own, reads at a fixed rate and hashes what it reads; the relay's
//! `VmRSS`, `VmHWM` and overflow files (deleted files under its `TMPDIR` in
//! `/proc/<pid>/fd`) are sampled every second.
//!
//! Settings (environment), defaults being the measurement, which
//! takes about 35 minutes (200 MiB at 100 KB/s):
//!
//! - `OVERFLOW_RSS_MIB` (200): each response, MiB;
//! - `OVERFLOW_RSS_KBPS` (100): each caller's read rate, KB/s (1000 bytes);
//! - `OVERFLOW_RSS_CALLERS` (20), `OVERFLOW_RSS_WORKERS` (4);
//! - `OVERFLOW_RSS_BIN` (`target/release/examples`): where `worker` is.
//!
//! Exits 1 unless every download completed byte for byte and no overflow
//! file is left; the RSS figures are reported against the 64 MiB target.

use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const TARGET_MIB: f64 = 64.0;

fn main() -> ExitCode {
    if std::env::var("OVERFLOW_RSS_ROLE").as_deref() == Ok("relay") {
        return match relay() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("relay: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if std::env::args().any(|a| a == "--list") {
        return ExitCode::SUCCESS; // `cargo bench -- --list`
    }
    measure()
}

/// The README's snippet ("Using the crate"), but for the port.
#[tokio::main]
async fn relay() -> Result<(), Box<dyn std::error::Error>> {
    use axum::{routing::get, Router};
    use worker_relay_hyper::{gateway::Gateway, worker_relay::connect::TokenTable};

    let listen = std::env::var("OVERFLOW_RSS_LISTEN")?;
    let gateway = Gateway::new(TokenTable::parse(&std::fs::read_to_string("tokens.txt")?)?);
    let app = Router::new()
        .route("/status", get(|| async { "the app's own route" }))
        .route_service("/connect", gateway.connect()) // workers dial here
        .route_service("/connect/{id}", gateway.connect()) // or here, naming themselves
        .route_service("/w/{*rest}", gateway.forward()); // callers: /w/<id>/…
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn token() -> String {
    use std::hash::{BuildHasher, Hasher};
    (0..2)
        .map(|i| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(i);
            format!("{:016x}", h.finish())
        })
        .collect()
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
}

/// A child killed (by its own pid) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` with its stderr forwarded (tagged); waits (15 s at most)
/// for a line containing `ready`.
fn start(mut cmd: Command, tag: String, ready: &str) -> Proc {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {tag}: {e}"));
    let stderr = child.stderr.take().expect("piped");
    let child = Proc(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("  [{tag}] {line}");
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(ready) => return child,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    panic!("timed out waiting for `{ready}`");
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// The deleted files `pid` holds open under `dir` (its overflow files),
/// and their bytes.
fn open_deleted(pid: u32, dir: &Path) -> (usize, u64) {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return (0, 0);
    };
    fds.flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.starts_with(dir) && t.to_string_lossy().ends_with(" (deleted)"))
        })
        .map(|e| std::fs::metadata(e.path()).map_or(0, |m| m.len()))
        .fold((0, 0), |(n, b), len| (n + 1, b + len))
}

/// The worker example's `/bytes?n=N` body.
fn pattern_sha256(n: u64) -> Vec<u8> {
    let block: Vec<u8> = (0..251 * 4096).map(|i| (i % 251) as u8).collect();
    let mut h = Sha256::new();
    let mut left = n;
    while left > 0 {
        let k = left.min(block.len() as u64);
        h.update(&block[..k as usize]);
        left -= k;
    }
    h.finalize().to_vec()
}

struct Download {
    status: u16,
    bytes: u64,
    sha256: Vec<u8>,
    error: Option<String>,
}

/// `GET path` through the relay, read at `bps` bytes per second.
fn download(addr: SocketAddr, path: &str, auth: &str, bps: u64) -> Download {
    let mut d = Download {
        status: 0,
        bytes: 0,
        sha256: Vec::new(),
        error: None,
    };
    if let Err(e) = download_into(&mut d, addr, path, auth, bps) {
        d.error = Some(e.to_string());
    }
    d
}

fn download_into(
    d: &mut Download,
    addr: SocketAddr,
    path: &str,
    auth: &str,
    bps: u64,
) -> std::io::Result<()> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: {auth}\r\nconnection: close\r\n\r\n"
    )?;
    let mut r = BufReader::with_capacity(16 << 10, s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    d.status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = None;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
            break;
        }
        if let Some((n, v)) = line.split_once(':') {
            if n.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<u64>().ok();
            }
        }
    }
    let length = length.ok_or_else(|| std::io::Error::other("no content-length"))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 10_000];
    let t0 = Instant::now();
    while d.bytes < length {
        let want = ((length - d.bytes) as usize).min(buf.len());
        let n = r.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        h.update(&buf[..n]);
        d.bytes += n as u64;
        let due = Duration::from_secs_f64(d.bytes as f64 / bps as f64);
        if let Some(wait) = due.checked_sub(t0.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    d.sha256 = h.finalize().to_vec();
    Ok(())
}

fn measure() -> ExitCode {
    let mib = env_u64("OVERFLOW_RSS_MIB", 200);
    let kbps = env_u64("OVERFLOW_RSS_KBPS", 100).max(1);
    let callers = env_u64("OVERFLOW_RSS_CALLERS", 20).max(1);
    let workers = env_u64("OVERFLOW_RSS_WORKERS", 4).max(1);
    let bin = PathBuf::from(
        std::env::var("OVERFLOW_RSS_BIN").unwrap_or_else(|_| "target/release/examples".into()),
    );
    let n = mib * MIB;
    let bps = kbps * 1000;
    eprintln!(
        "overflow_rss: {callers} callers × {mib} MiB at {kbps} KB/s from {workers} workers \
         (about {:.0} s)",
        n as f64 / bps as f64
    );

    let dir =
        std::env::temp_dir().join(format!("worker-relay-overflow-rss-{}", std::process::id()));
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).expect("a fresh directory");
    let ids: Vec<String> = (0..workers).map(|i| format!("w{i}")).collect();
    let tokens: Vec<String> = ids.iter().map(|_| token()).collect();
    let table: String = ids
        .iter()
        .zip(&tokens)
        .map(|(i, t)| format!("{i} {t}\n"))
        .collect();
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join("tokens.txt"))
            .expect("tokens.txt");
        f.write_all(table.as_bytes()).expect("tokens.txt");
    }

    let addr = free_addr();
    let mut cmd = Command::new(std::env::current_exe().expect("this binary"));
    cmd.current_dir(&dir)
        .env("OVERFLOW_RSS_ROLE", "relay")
        .env("OVERFLOW_RSS_LISTEN", addr.to_string())
        .env("TMPDIR", &tmp);
    let relay = start(cmd, "relay".into(), "listening on");
    let pid = relay.0.id();
    let idle_kib = rss_kib(pid).map_or(0, |r| r.0);

    let worker_token = token();
    let _workers: Vec<Proc> = tokens
        .iter()
        .zip(&ids)
        .map(|(t, id)| {
            let mut cmd = Command::new(bin.join("worker"));
            cmd.args([
                "--connect",
                &format!("ws://{addr}/connect"),
                "--threads",
                "1",
            ])
            .env("STRATA_WORKER_CONNECT_TOKEN", t)
            .env("STRATA_WORKER_TOKEN", &worker_token);
            start(cmd, format!("worker {id}"), "connected to")
        })
        .collect();
    let auth = format!("Bearer {worker_token}");
    // The relay registers a socket just after its handshake: wait for /health.
    for id in &ids {
        let deadline = Instant::now() + Duration::from_secs(10);
        while download(addr, &format!("/w/{id}/health"), &auth, u64::MAX / 2).status != 200 {
            assert!(Instant::now() < deadline, "worker {id} never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let expected = pattern_sha256(n);

    let stop = Arc::new(AtomicBool::new(false));
    let (max_rss, max_disk, max_files) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let sampler = {
        let (stop, max_rss, max_disk, max_files) = (
            stop.clone(),
            max_rss.clone(),
            max_disk.clone(),
            max_files.clone(),
        );
        let tmp = tmp.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut tick = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (rss, hwm) = rss_kib(pid).unwrap_or((0, 0));
                let (files, disk) = open_deleted(pid, &tmp);
                max_rss.fetch_max(rss, Ordering::Relaxed);
                max_disk.fetch_max(disk, Ordering::Relaxed);
                max_files.fetch_max(files as u64, Ordering::Relaxed);
                if tick % 30 == 0 {
                    eprintln!(
                        "  {:5.0} s: relay RSS {:.1} MiB (peak {:.1}), overflow {files} files, \
                         {:.0} MiB",
                        t0.elapsed().as_secs_f64(),
                        rss as f64 / 1024.0,
                        hwm as f64 / 1024.0,
                        disk as f64 / MIB as f64,
                    );
                }
                tick += 1;
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };

    let t0 = Instant::now();
    let threads: Vec<_> = (0..callers)
        .map(|i| {
            let path = format!("/w/{}/bytes?n={n}", ids[(i % workers) as usize]);
            let auth = auth.clone();
            std::thread::spawn(move || download(addr, &path, &auth, bps))
        })
        .collect();
    let results: Vec<Download> = threads
        .into_iter()
        .map(|t| t.join().expect("caller"))
        .collect();
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");

    // The streams are over; their files go when the driver drops them.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left = open_deleted(pid, &tmp);
    while left.0 > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        left = open_deleted(pid, &tmp);
    }
    let entries = std::fs::read_dir(&tmp).map_or(usize::MAX, |d| d.count());
    let (rss, hwm) = rss_kib(pid).unwrap_or((0, 0));
    drop(relay);
    let _ = std::fs::remove_dir_all(&dir);

    let ok = results
        .iter()
        .filter(|d| d.status == 200 && d.bytes == n && d.sha256 == expected)
        .count();
    for (i, d) in results
        .iter()
        .enumerate()
        .filter(|(_, d)| d.sha256 != expected)
    {
        eprintln!(
            "  caller {i}: status {}, {} of {n} bytes, {}",
            d.status,
            d.bytes,
            d.error.as_deref().unwrap_or("wrong bytes")
        );
    }
    let mib_of = |kib: u64| kib as f64 / 1024.0;
    println!(
        "overflow_rss: {callers} callers × {mib} MiB at {kbps} KB/s from {workers} workers, {secs:.0} s"
    );
    println!(
        "  relay RSS: idle {:.1} MiB, max sampled {:.1} MiB, peak (VmHWM) {:.1} MiB, at the end \
         {:.1} MiB; target ≤ {TARGET_MIB} MiB: {}",
        mib_of(idle_kib),
        mib_of(max_rss.load(Ordering::Relaxed)),
        mib_of(hwm),
        mib_of(rss),
        if mib_of(hwm) <= TARGET_MIB {
            "met"
        } else {
            "missed"
        }
    );
    println!(
        "  overflow on disk: at most {:.0} MiB in {} files at once",
        max_disk.load(Ordering::Relaxed) as f64 / MIB as f64,
        max_files.load(Ordering::Relaxed)
    );
    println!("  downloads complete byte for byte: {ok} of {callers}");
    println!(
        "  afterwards: {} overflow files open, {} entries in the relay's TMPDIR",
        left.0, entries
    );
    if ok as u64 == callers && left.0 == 0 && entries == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
