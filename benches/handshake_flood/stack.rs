//! The processes of the handshake flood: the relay and worker examples
//! with a 10,000-token file, and the relay's CPU from `/proc`.

use super::{probe, PIDS, WORKERS};
pub use cpu::cpu_seconds;

#[path = "../support/cpu.rs"]
mod cpu;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A relay and a worker example process, killed when dropped.
pub struct Stack {
    pub relay: Child,
    worker: Child,
    pub addr: SocketAddr,
    pub worker_token: String,
    _dir: TempDir,
}

impl Stack {
    pub fn start(bin: &Path) -> Result<Stack, String> {
        let dir = std::env::temp_dir().join(format!("worker-relay-flood-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).map_err(|e| e.to_string())?;
        let dir = TempDir(dir);
        let (connect_token, worker_token) = (random_token(), random_token());
        let mut text = format!("abc {connect_token}\n");
        for i in 1..WORKERS {
            text.push_str(&format!("w{i:05} {}\n", random_token()));
        }
        let tokens = dir.0.join("tokens.txt");
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tokens)
                .map_err(|e| e.to_string())?;
            f.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
        }
        let log = dir.0.join("relay.log");
        let relay = Command::new(bin.join("relay"))
            .args(["--listen", "127.0.0.1:0", "--tokens"])
            .arg(&tokens)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.join("relay").display()))?;
        PIDS[0].store(relay.id(), Ordering::SeqCst);
        let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
        let addr: SocketAddr = wait_for(Duration::from_secs(30), || {
            read_log().lines().find_map(|l| {
                let rest = l.strip_prefix("relay: listening on ")?;
                rest.split(';').next()?.parse().ok()
            })
        })
        .ok_or_else(|| format!("the relay never listened:\n{}", read_log()))?;
        let worker = Command::new(bin.join("worker"))
            .arg("--connect")
            .arg(format!("ws://{addr}/connect"))
            .env("STRATA_WORKER_CONNECT_TOKEN", &connect_token)
            .env("STRATA_WORKER_TOKEN", &worker_token)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.join("worker").display()))?;
        PIDS[1].store(worker.id(), Ordering::SeqCst);
        let stack = Stack {
            relay,
            worker,
            addr,
            worker_token,
            _dir: dir,
        };
        wait_for(Duration::from_secs(30), || {
            read_log().contains("worker abc connected").then_some(())
        })
        .ok_or_else(|| format!("the worker never connected:\n{}", read_log()))?;
        match probe(&stack) {
            Ok(200) => Ok(stack),
            other => Err(format!("GET /w/abc/health: {other:?}")),
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for child in [&mut self.worker, &mut self.relay] {
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in &PIDS {
            pid.store(0, Ordering::SeqCst);
        }
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `f` every 50 ms until it gives a value, for at most `limit`.
fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// 32 random hex digits.
fn random_token() -> String {
    (0..2u32)
        .map(|i| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(i);
            format!("{:016x}", h.finish())
        })
        .collect()
}
