//! Processes and in-process stacks for the end-to-end tests.
#![allow(dead_code)]

use crate::worker_app;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use worker_relay::connect::{Token, TokenTable, WorkerId};
use worker_relay::proto::{OverflowConfig, RelayConfig};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::{serve, ServerConfig};

pub const CONNECT_TOKEN: &str = "ct-0123456789abcdef0123456789abcdef";
pub const WORKER_TOKEN: &str = "wt-fedcba9876543210fedcba9876543210";

#[path = "../support/example_bin.rs"]
mod example_bin;
pub use example_bin::example_bin;

/// The socket address right after the first `marker` in `line`
/// (`listening on 127.0.0.1:4242 (http)` -> `127.0.0.1:4242`).
pub fn addr_after(line: &str, marker: &str) -> Option<SocketAddr> {
    let rest = &line[line.find(marker)? + marker.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A child process killed on drop, with its stderr collected.
pub struct Proc {
    pub child: Child,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn spawn(mut cmd: Command) -> Proc {
        cmd.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let mut child = cmd.spawn().expect("spawn");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Proc { child, stderr }
    }

    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Waits (bounded) until a stderr line contains `needle`.
    pub fn wait_log(&self, needle: &str, within: Duration) -> bool {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if self
                .stderr
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains(needle))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Waits (bounded) for a stderr line with one of `markers` followed
    /// by a socket address (an example logging where it listens), and
    /// returns that address.
    pub fn wait_addr(&self, markers: &[&str], within: Duration) -> Option<SocketAddr> {
        let end = Instant::now() + within;
        loop {
            let found = self
                .stderr
                .lock()
                .unwrap()
                .iter()
                .find_map(|l| markers.iter().find_map(|m| addr_after(l, m)));
            if found.is_some() || Instant::now() >= end {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The relay example's public address, from its line `listening on
    /// ADDR (http); …` (text or JSON log), waiting at most 20 s.
    pub fn listen_addr(&self) -> SocketAddr {
        // Anchored so that `admin listening on ADDR` never matches.
        let markers = ["relay: listening on ", "\"message\":\"listening on "];
        self.wait_addr(&markers, Duration::from_secs(20))
            .unwrap_or_else(|| panic!("no `listening on ADDR` line: {}", self.log()))
    }

    /// The address of the example's admin endpoint (`admin listening on
    /// ADDR`), waiting at most 20 s.
    pub fn admin_addr(&self) -> SocketAddr {
        self.wait_addr(&["admin listening on "], Duration::from_secs(20))
            .unwrap_or_else(|| panic!("no `admin listening on ADDR` line: {}", self.log()))
    }

    /// Waits (bounded) for the exit status.
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A fresh directory under the temp dir, unique to this process.
pub fn scratch_dir(what: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("worker-relay-{what}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A tokens file in a fresh temp dir.
pub fn tokens_file(lines: &str) -> PathBuf {
    let path = scratch_dir("e2e").join("tokens.txt");
    std::fs::write(&path, lines).unwrap();
    path
}

/// The variable that names an installed `worker-relay` binary (the wheel's,
/// `cargo install`'s) for the tests that run the relay and the worker as
/// processes: `WORKER_RELAY_BIN=/path/to/worker-relay`. Unset (the
/// default), they run this build's examples.
pub const INSTALLED_BIN: &str = "WORKER_RELAY_BIN";

/// A command that runs the program `name` (`relay` or `worker`): this
/// build's example, or `$WORKER_RELAY_BIN name` when that is set (said once
/// per test process on stderr, so a log shows which binary ran).
pub fn program(name: &str) -> Command {
    match std::env::var_os(INSTALLED_BIN).filter(|p| !p.is_empty()) {
        Some(bin) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "e2e: the relay and the worker are {} (${INSTALLED_BIN})",
                    std::path::Path::new(&bin).display()
                )
            });
            let mut cmd = Command::new(bin);
            cmd.arg(name);
            cmd
        }
        None => Command::new(example_bin(name)),
    }
}

/// The relay example as a process on a port of its own (`--listen
/// 127.0.0.1:0`); returns it and its port once it accepts connections.
pub fn relay_process() -> (Proc, u16) {
    relay_process_with(&[])
}

/// The relay example serving TLS with the certificate and key of these
/// PEM files; returns it and its port once it accepts connections.
pub fn relay_process_tls(cert: &std::path::Path, key: &std::path::Path) -> (Proc, u16) {
    relay_process_with(&[
        "--tls-cert".as_ref(),
        cert.as_os_str(),
        "--tls-key".as_ref(),
        key.as_os_str(),
    ])
}

/// The relay example with `args` besides its listen address (port 0) and
/// tokens file; returns it and its port once it accepts connections.
pub fn relay_process_with(args: &[&std::ffi::OsStr]) -> (Proc, u16) {
    relay_process_on(0, args)
}

/// [`relay_process_with`] on `port`: 0 for a port of its own, or the port
/// a relay of the same test had (a restart where the workers dial).
pub fn relay_process_on(port: u16, args: &[&std::ffi::OsStr]) -> (Proc, u16) {
    let tokens = tokens_file(&format!(
        "# e2e\n\nabc {CONNECT_TOKEN}\nidle ct-idle-worker-token\n"
    ));
    let mut cmd = program("relay");
    cmd.arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--tokens")
        .arg(&tokens)
        .args(args);
    let p = Proc::spawn(cmd);
    // The relay logs its address once bound; bound means accepting (the
    // backlog queues a connection until the accept loop runs).
    let port = p.listen_addr().port();
    (p, port)
}

/// The worker example as a process, tokens in its environment only.
pub fn worker_process(port: u16, connect_token: &str) -> Proc {
    let url = format!("ws://127.0.0.1:{port}/connect");
    worker_process_with(&url, connect_token, &[])
}

/// The worker example as a process dialling `url`, with `args` besides
/// (`--threads 1`, …), tokens in its environment only.
pub fn worker_process_with(url: &str, connect_token: &str, args: &[&str]) -> Proc {
    let mut cmd = program("worker");
    cmd.arg("--connect")
        .arg(url)
        .args(args)
        .env("STRATA_WORKER_CONNECT_TOKEN", connect_token)
        .env("STRATA_WORKER_TOKEN", WORKER_TOKEN);
    Proc::spawn(cmd)
}

/// A relay and a worker in this process (the examples' code), on a fresh port.
pub async fn in_process_stack() -> (SocketAddr, Gateway) {
    in_process_stack_with(default_config()).await
}

/// The tokens of the e2e workers `abc` and `idle`.
pub fn token_table() -> TokenTable {
    let mut table = TokenTable::new();
    table
        .insert(
            WorkerId::new("abc").unwrap(),
            Token::new(CONNECT_TOKEN).unwrap(),
        )
        .unwrap();
    table
        .insert(
            WorkerId::new("idle").unwrap(),
            Token::new("ct-idle-worker-token").unwrap(),
        )
        .unwrap();
    table
}

/// The relay example's connection settings: the crate's, with slow
/// callers' responses overflowing.
pub fn default_config() -> RelayConfig {
    RelayConfig::builder()
        .overflow(Some(OverflowConfig::default()))
        .build()
        .unwrap()
}

/// A relay as the example runs it (overflow to temporary files), with
/// `config`, on a fresh port, no worker.
pub async fn relay_only(config: RelayConfig) -> (SocketAddr, Gateway) {
    relay_serving(Gateway::builder(token_table()).relay_config(config).build()).await
}

/// `relay` served on a fresh port.
async fn relay_serving(relay: Gateway) -> (SocketAddr, Gateway) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, relay.service(), ServerConfig::default()));
    (addr, relay)
}

/// [`in_process_stack`] with the relay's connections bounded by `config`.
pub async fn in_process_stack_with(config: RelayConfig) -> (SocketAddr, Gateway) {
    let (addr, relay) = relay_only(config).await;
    with_worker(addr, relay).await
}

/// [`in_process_stack`] whose relay waits at most `wait` for a known worker
/// that is not connected before it answers 503 (the default: 10 s).
pub async fn in_process_stack_waiting(wait: Duration) -> (SocketAddr, Gateway) {
    let relay = Gateway::builder(token_table())
        .relay_config(default_config())
        .reconnect_wait(wait)
        .build();
    let (addr, relay) = relay_serving(relay).await;
    with_worker(addr, relay).await
}

/// The example worker's app in this process, dialling the relay at `addr`;
/// returns once it is connected.
async fn with_worker(addr: SocketAddr, relay: Gateway) -> (SocketAddr, Gateway) {
    tokio::spawn(worker_app::run(worker_app::WorkerOptions {
        connect_url: format!("ws://{addr}/connect"),
        connect_token: Some(Token::new(CONNECT_TOKEN).unwrap()),
        worker_token: Some(Token::new(WORKER_TOKEN).unwrap()),
        name: "e2e-worker".into(),
        dialer: Default::default(),
    }));
    wait_connected(&relay, "abc").await;
    (addr, relay)
}

pub async fn wait_connected(relay: &Gateway, id: &str) {
    let end = Instant::now() + Duration::from_secs(20);
    while !relay.is_connected(id) {
        assert!(Instant::now() < end, "worker {id} did not connect");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn auth() -> String {
    format!("Bearer {WORKER_TOKEN}")
}

pub fn pattern(n: usize) -> bytes::Bytes {
    (0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into()
}
