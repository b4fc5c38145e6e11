//! Issue 23: an interactive upload through the relay and worker examples
//! (see BENCHMARKS.md). A plain harness; run it with
//! `benches/interactive.sh`, which builds the release examples first.
//!
//! A fresh `relay` and `worker` (the release examples) are started on
//! 127.0.0.1, tokens from a temporary file (mode 0600) and the environment.
//! One client opens `POST /w/ia/echo` with `Transfer-Encoding: chunked`
//! (the worker's `/echo` streams each piece back as it arrives) and plays
//! ping-pong: send a 64-byte piece, wait until its echo is back, ten times;
//! `INTERACTIVE_RUNS` runs (default 5), each on a new connection. When a
//! piece's echo is not back within `WAIT` (2 s) the next piece goes anyway,
//! and the echo's time is taken whenever it comes (up to 2 s after the end
//! of the upload; else "never"). Target: each round trip within 100 ms.
//!
//! `INTERACTIVE_BIN=DIR` measures the examples in `DIR` instead (another
//! build, e.g. an older commit's).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const WORKER: &str = "ia";
const ROUND_TRIPS: usize = 10;
/// The longest a round trip is waited for.
const WAIT: Duration = Duration::from_secs(2);
const TARGET: Duration = Duration::from_millis(100);

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

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Sends each line of a child's stderr to `tx`.
fn watch_stderr(child: &mut Child, tx: mpsc::Sender<String>) {
    let stderr = child.stderr.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
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
    // Dropped (killed) in this order: the worker first.
    _worker: Proc,
    _relay: Proc,
    addr: SocketAddr,
    auth: String,
    worker_token: String,
    _dir: TempDir,
}

fn start(bin: &Path) -> Running {
    let dir = std::env::temp_dir().join(format!("worker-relay-ia-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let dir = TempDir(dir);
    let (connect_token, worker_token) = (random_token(), random_token());
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
    watch_stderr(&mut relay, tx);
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
    watch_stderr(&mut worker, wtx);
    let worker = Proc(worker);
    wait_for(&wrx, "the worker to connect", |l| {
        l.contains("connected to").then(String::new)
    });
    let run = Running {
        _worker: worker,
        _relay: relay,
        addr,
        auth: format!("Bearer {worker_token}"),
        worker_token,
        _dir: dir,
    };
    // The relay registers the socket just after the handshake.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !health(&run) {
        assert!(
            Instant::now() < deadline,
            "the worker never answered /health"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    run
}

/// The baseline: the worker example serving the same app directly
/// (`worker --listen`), no relay.
fn start_direct(bin: &Path, worker_token: &str) -> (Proc, SocketAddr) {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut worker = Command::new(bin.join("worker"))
        .args(["--listen", &addr.to_string()])
        .env("STRATA_WORKER_TOKEN", worker_token)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the worker example");
    let (tx, rx) = mpsc::channel();
    watch_stderr(&mut worker, tx);
    let worker = Proc(worker);
    wait_for(&rx, "the direct app to listen", |l| {
        l.contains("serving the app directly").then(String::new)
    });
    (worker, addr)
}

fn health(run: &Running) -> bool {
    let Ok(mut s) = TcpStream::connect(run.addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let head = format!(
        "GET /w/{WORKER}/health HTTP/1.1\r\nhost: x\r\nauthorization: {}\r\nconnection: close\r\n\r\n",
        run.auth
    );
    let mut got = String::new();
    s.write_all(head.as_bytes()).is_ok()
        && s.read_to_string(&mut got).is_ok()
        && got.starts_with("HTTP/1.1 200")
}

/// One run: ten round trips on one connection: for each piece, how long
/// after it was sent its echo came back (`None`: not even by the end of
/// the upload). A piece whose echo is not back within [`WAIT`] is followed
/// by the next one all the same.
fn run_once(addr: SocketAddr, target: &str, auth: &str) -> Vec<Option<Duration>> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let head = format!(
        "POST {target} HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\n\
         content-type: text/plain\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    let pieces: Vec<String> = (0..ROUND_TRIPS)
        .map(|i| format!("{:<63}\n", format!("piece {i:02} of an interactive upload")))
        .collect();
    let mut sent_at = Vec::new();
    let mut times = vec![None; ROUND_TRIPS];
    let mut got = Vec::new();
    // Reads until `until` or until piece `want`'s echo is back.
    let mut read = |s: &mut TcpStream, sent_at: &[Instant], want: Option<usize>, until: Instant| {
        let mut buf = [0u8; 4096];
        loop {
            for (i, at) in sent_at.iter().enumerate() {
                let piece = pieces[i].as_bytes();
                if times[i].is_none() && got.windows(piece.len()).any(|w| w == piece) {
                    times[i] = Some(at.elapsed());
                }
            }
            if want.is_some_and(|i| times[i].is_some()) {
                return;
            }
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                return;
            };
            s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match s.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(_) => {} // timed out: the deadline check ends the wait
            }
        }
    };
    for (i, piece) in pieces.iter().enumerate() {
        sent_at.push(Instant::now());
        s.write_all(format!("{:x}\r\n{piece}\r\n", piece.len()).as_bytes())
            .unwrap();
        read(&mut s, &sent_at, Some(i), Instant::now() + WAIT);
    }
    // The end of the upload; what is still missing may come with it.
    let _ = s.write_all(b"0\r\n\r\n");
    read(&mut s, &sent_at, None, Instant::now() + WAIT);
    times
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let bin = std::env::var_os("INTERACTIVE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
                .join("release")
                .join("examples")
        });
    if !bench || !bin.join("relay").exists() || !bin.join("worker").exists() {
        eprintln!(
            "interactive: skipped (run `bash benches/interactive.sh`: it builds the release examples, then runs this)"
        );
        return;
    }
    let runs: usize = std::env::var("INTERACTIVE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let run = start(&bin);
    let (_direct, direct) = start_direct(&bin, &run.worker_token);
    let ms = |d: &Option<Duration>| match d {
        Some(d) => format!("{:.2}", d.as_secs_f64() * 1e3),
        None => "never".to_owned(),
    };
    println!("\nInteractive upload: the round trip of a 64-byte piece and its echo, ms, through the relay and worker examples and directly (`worker --listen`), runs alternating ({})\n", bin.display());
    let cols: Vec<String> = (1..=ROUND_TRIPS).map(|i| i.to_string()).collect();
    println!(
        "| run | path | {} | max | all within {} ms? |",
        cols.join(" | "),
        TARGET.as_millis()
    );
    println!("|---|---|{}---|---|", "---|".repeat(ROUND_TRIPS));
    let mut all = true;
    let relay_target = format!("/w/{WORKER}/echo");
    for r in 1..=runs {
        for (path, addr, target) in [
            ("relay", run.addr, relay_target.as_str()),
            ("direct", direct, "/echo"),
        ] {
            let times = run_once(addr, target, &run.auth);
            let max = times
                .iter()
                .copied()
                .max_by_key(|t| t.unwrap_or(Duration::MAX))
                .flatten();
            let met = times.iter().all(|t| t.is_some_and(|t| t <= TARGET));
            if path == "relay" {
                all &= met;
            }
            let row: Vec<String> = times.iter().map(ms).collect();
            println!(
                "| {r} | {path} | {} | {} | {} |",
                row.join(" | "),
                ms(&max),
                if met { "yes" } else { "no" }
            );
        }
    }
    println!(
        "\nevery round trip through the relay within {} ms: {}",
        TARGET.as_millis(),
        if all { "yes" } else { "no" }
    );
}
