//! Issue 24: what TLS costs through the relay (see BENCHMARKS.md). A plain
//! harness; `bash benches/tls.sh` builds the release relay example and
//! runs it.
//!
//! In this process, on one tokio runtime (the machine's 2 cores): a CA and
//! a certificate for `localhost` made now; the relay (the crate's gateway
//! on `server::serve` with `ServerTls`) and the worker example's app
//! dialling it over `wss://` (`ws::Dialer` trusting the CA); and the same
//! app served **directly** by plain hyper behind tokio-rustls: the
//! baseline, in the same run. Every caller connection is HTTPS
//! (HTTP/1.1, rustls with `ring` on both ends).
//!
//! - small requests: `GET /health` one at a time on a keep-alive
//!   connection, `TLS_ROUNDS` (default 3000) each, alternating relay and
//!   direct; requests per second and p50/p99;
//! - bulk: `POST /sha256` with 1 GiB and `GET /bytes?n=1 GiB`, 3 rounds
//!   each, alternating; MiB/s (the median round);
//! - worker handshakes: the relay example as a process with 1,000 workers'
//!   tokens, once serving TLS and once plain; 1,000 workers dial it (32 at
//!   a time, each connection held until all are in), and the relay's CPU
//!   (utime + stime from `/proc/<pid>/stat`) over the burst, per handshake.
//!
//! Every wait is bounded; 127.0.0.1 only; tokens in a 0600 file, never on a
//! command line.

#[path = "support/cpu.rs"]
mod cpu;
mod support;
#[path = "../tests/tls/support.rs"]
mod tls;
#[path = "../tests/tls/client.rs"]
mod tls_client;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use futures_util::StreamExt;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Conn, WORKER};
use worker_relay::connect::{Token, TokenTable, WorkerHandshake, WorkerId};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::{ServerConfig, ServerTls};
use worker_relay_hyper::ws::Dialer;

const GIB: u64 = 1 << 30;
const HANDSHAKE_WORKERS: usize = 1000;

struct Stack {
    relay: SocketAddr,
    direct: SocketAddr,
    auth: String,
    client: Arc<rustls::ClientConfig>,
}

async fn start(files: &tls::TlsFiles) -> Stack {
    let connect_token = Token::new(support::random_token()).unwrap();
    let worker_token = Token::new(support::random_token()).unwrap();
    let mut tokens = TokenTable::new();
    tokens
        .insert(WorkerId::new(WORKER).unwrap(), connect_token.clone())
        .unwrap();
    let server_tls = ServerTls::from_pem_files(&files.cert, &files.key).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = listener.local_addr().unwrap();
    let gateway = Gateway::new(tokens);
    tokio::spawn(worker_relay_hyper::server::serve(
        listener,
        gateway.service(),
        ServerConfig::default().tls(server_tls.clone()),
    ));
    let dialer = Dialer::new().ca_pem(files.ca.pem().as_bytes()).unwrap();
    tokio::spawn(worker_app::run(worker_app::WorkerOptions {
        connect_url: format!("wss://localhost:{}/connect", relay_addr.port()),
        connect_token: Some(connect_token),
        worker_token: Some(worker_token.clone()),
        name: "bench-worker".into(),
        dialer,
    }));
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected(WORKER) {
        assert!(
            Instant::now() < end,
            "the worker did not connect over wss://"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let direct = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let direct_addr = direct.local_addr().unwrap();
    let mut direct_tls = Arc::unwrap_or_clone(server_tls.rustls_config());
    direct_tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio::spawn(support::serve_direct_tls(
        direct,
        worker_token.clone(),
        Arc::new(direct_tls),
    ));
    Stack {
        relay: relay_addr,
        direct: direct_addr,
        auth: format!("Bearer {}", worker_token.expose_secret()),
        client: tls_client::client_config(&files.ca.pem(), &[b"http/1.1"]),
    }
}

impl Stack {
    fn target(&self, via_relay: bool, path: &str) -> (SocketAddr, String) {
        if via_relay {
            (self.relay, format!("/w/{WORKER}{path}"))
        } else {
            (self.direct, path.to_owned())
        }
    }
}

fn percentile(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1e6
}

fn main() {
    // `cargo bench` passes --bench; a plain harness ignores it.
    let rt = support::runtime();
    let files = tls::TlsFiles::new();
    let stack = rt.block_on(start(&files));
    let rounds: usize = std::env::var("TLS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);

    // Small requests on keep-alive HTTPS connections.
    let (small, small_direct) = rt.block_on(async {
        let (ra, rt_) = stack.target(true, "/health");
        let (da, dt) = stack.target(false, "/health");
        let mut relay = Conn::open_tls(ra, stack.client.clone()).await.unwrap();
        let mut direct = Conn::open_tls(da, stack.client.clone()).await.unwrap();
        let (mut r, mut d) = (Vec::new(), Vec::new());
        for i in 0..rounds + 100 {
            let t = Instant::now();
            let (s, _) = relay.send("GET", &rt_, &stack.auth, None).await.unwrap();
            assert_eq!(s, 200);
            let tr = t.elapsed();
            let t = Instant::now();
            let (s, _) = direct.send("GET", &dt, &stack.auth, None).await.unwrap();
            assert_eq!(s, 200);
            if i >= 100 {
                r.push(tr);
                d.push(t.elapsed());
            }
        }
        (r, d)
    });
    let rate = |v: &[Duration]| v.len() as f64 / v.iter().sum::<Duration>().as_secs_f64();
    let (rr, dr) = (rate(&small), rate(&small_direct));
    let (mut small, mut small_direct) = (small, small_direct);
    println!("| small requests (GET /health, keep-alive HTTPS, {rounds} each) | relay | direct | relay/direct |");
    println!("|---|---|---|---|");
    println!(
        "| requests/s, one at a time | {rr:.0} | {dr:.0} | {:.2} |",
        rr / dr
    );
    println!(
        "| p50 / p99 µs | {:.0} / {:.0} | {:.0} / {:.0} | |",
        percentile(&mut small, 0.5),
        percentile(&mut small, 0.99),
        percentile(&mut small_direct, 0.5),
        percentile(&mut small_direct, 0.99)
    );

    // 1 GiB each way.
    let body = Bytes::from(vec![0xa5u8; GIB as usize]);
    println!();
    println!("| 1 GiB over HTTPS (median of 3) | relay MiB/s | direct MiB/s | relay/direct |");
    println!("|---|---|---|---|");
    for (name, method, path) in [
        ("upload (POST /sha256)", "POST", "/sha256".to_owned()),
        ("download (GET /bytes)", "GET", format!("/bytes?n={GIB}")),
    ] {
        let mut speeds = [Vec::new(), Vec::new()];
        for _ in 0..3 {
            for (i, via_relay) in [true, false].into_iter().enumerate() {
                let (addr, target) = stack.target(via_relay, &path);
                let body = (method == "POST").then(|| body.clone());
                let t = Instant::now();
                let (status, _) = rt
                    .block_on(async {
                        let mut c = Conn::open_tls(addr, stack.client.clone()).await?;
                        c.send(method, &target, &stack.auth, body).await
                    })
                    .unwrap();
                assert_eq!(status, 200);
                speeds[i].push(1024.0 / t.elapsed().as_secs_f64());
            }
        }
        for s in &mut speeds {
            s.sort_by(f64::total_cmp);
        }
        let (r, d) = (speeds[0][1], speeds[1][1]);
        println!("| {name} | {r:.0} | {d:.0} | {:.2} |", r / d);
    }

    // Worker handshakes against the relay example as a process.
    let relay_bin = std::env::var("TLS_BENCH_RELAY").unwrap_or_else(|_| {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().and_then(|d| d.parent()).unwrap();
        dir.join("examples/relay").to_string_lossy().into_owned()
    });
    assert!(
        Path::new(&relay_bin).exists(),
        "{relay_bin} is missing: run benches/tls.sh (it builds the release examples)"
    );
    println!();
    println!("| {HANDSHAKE_WORKERS} workers dialling, 32 at a time | burst s | relay CPU s | relay CPU per handshake |");
    println!("|---|---|---|---|");
    let mut per = Vec::new();
    for tls in [true, false] {
        let (secs, cpu) = rt.block_on(handshakes(&relay_bin, &files, tls));
        let each = cpu / HANDSHAKE_WORKERS as f64;
        per.push(each);
        println!(
            "| {} | {secs:.2} | {cpu:.2} | {:.0} µs |",
            if tls { "wss:// (TLS 1.3)" } else { "ws://" },
            each * 1e6
        );
    }
    println!("| wss / ws | | | {:.1}× |", per[0] / per[1].max(1e-9));
}

/// Starts the relay example with 1,000 workers' tokens (serving TLS with
/// `files` if `tls`), lets every worker dial it once, holding all the
/// connections; returns the burst's wall time and the relay's CPU seconds.
async fn handshakes(relay_bin: &str, files: &tls::TlsFiles, tls: bool) -> (f64, f64) {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<(String, String)> = (0..HANDSHAKE_WORKERS)
        .map(|i| (format!("w{i:04}"), support::random_token()))
        .collect();
    let path = dir.path().join("tokens.txt");
    let text: String = tokens.iter().map(|(w, t)| format!("{w} {t}\n")).collect();
    std::fs::write(&path, text).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = Command::new(relay_bin);
    cmd.arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--tokens")
        .arg(&path)
        .arg("--threads")
        .arg("1")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if tls {
        cmd.arg("--tls-cert")
            .arg(&files.cert)
            .arg("--tls-key")
            .arg(&files.key);
    }
    let mut child = cmd.spawn().unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < end, "the relay did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = child.id();
    let dialer = Dialer::new().ca_pem(files.ca.pem().as_bytes()).unwrap();
    let url = if tls {
        format!("wss://localhost:{port}/connect")
    } else {
        format!("ws://127.0.0.1:{port}/connect")
    };
    let cpu0 = cpu::cpu_seconds(pid);
    let t = Instant::now();
    let held: Vec<_> = futures_util::stream::iter(tokens)
        .map(|(_, token)| {
            let (dialer, url) = (dialer.clone(), url.clone());
            async move {
                let hs = WorkerHandshake::new(Token::new(token).ok());
                dialer.dial(&url, &hs).await.expect("a worker's dial")
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let secs = t.elapsed().as_secs_f64();
    // Let the relay finish registering the last ones.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cpu = cpu::cpu_seconds(pid) - cpu0;
    assert_eq!(held.len(), HANDSHAKE_WORKERS);
    drop(held);
    let _ = child.kill();
    let _ = child.wait();
    (secs, cpu)
}
