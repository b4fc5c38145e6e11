//! Interop with the real Strata worker: our relay example (a process) in front
//! of `strata-worker --connect` (PyPI `strata-notebook[notebook]==0.11.0`).
//!
//! Ignored by default: the tests need the worker installed. `bash .ci/interop`
//! creates the Python environment, builds the examples and runs them with
//! `STRATA_WORKER_BIN` set. See tests/interop/README.md.
//!
//! Every wait is bounded; every process is killed on drop (the worker with its
//! whole process tree: it starts each cell in a session of its own).

#[path = "../examples/common/client.rs"]
mod client;
#[path = "e2e/support.rs"]
mod support;
#[path = "tls/support.rs"]
mod tls;
#[path = "tls/client.rs"]
mod tls_client;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use client::Answer;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{relay_process, relay_process_on, Proc, CONNECT_TOKEN, WORKER_TOKEN};
use tls::TlsFiles;

/// The worker id `relay_process` maps to `CONNECT_TOKEN`.
const WORKER: &str = "abc";
/// How long the worker may take to start (Python imports) and connect.
const CONNECT_WITHIN: Duration = Duration::from_secs(60);
/// The longest any single HTTP exchange may take.
const REQUEST_LIMIT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

fn worker_bin() -> String {
    match std::env::var("STRATA_WORKER_BIN") {
        Ok(p) if !p.is_empty() => {
            assert!(
                std::path::Path::new(&p).exists(),
                "STRATA_WORKER_BIN={p} does not exist: run `bash .ci/interop`"
            );
            p
        }
        _ => panic!(
            "STRATA_WORKER_BIN is not set: these tests need the real strata-worker; \
             run `bash .ci/interop` (it installs strata-notebook[notebook]==0.11.0 \
             into target/interop-venv and sets the variable)"
        ),
    }
}

/// The worker's `--log-level`: `INTEROP_LOG_LEVEL`, or info. At debug the
/// worker logs every frame (and, through websockets, its connect token).
fn default_log_level() -> String {
    std::env::var("INTEROP_LOG_LEVEL").unwrap_or_else(|_| "info".into())
}

/// `strata-worker --connect …` in its own process group; on drop the group and
/// every descendant's group get SIGTERM, then SIGKILL, until none is left.
struct StrataWorker {
    proc: Proc,
}

impl StrataWorker {
    fn spawn_with(port: u16, connect_token: &str, log_level: &str) -> StrataWorker {
        let url = format!("ws://127.0.0.1:{port}/connect");
        StrataWorker::spawn_at(&url, connect_token, log_level, None)
    }

    /// The worker dialling `url`; with `ca_file`, trusting that CA through
    /// `SSL_CERT_FILE` (its `websockets` client uses Python's default TLS
    /// context, which reads it).
    fn spawn_at(
        url: &str,
        connect_token: &str,
        log_level: &str,
        ca_file: Option<&std::path::Path>,
    ) -> StrataWorker {
        let mut cmd = Command::new(worker_bin());
        cmd.arg("--connect")
            .arg(url)
            .arg("--log-level")
            .arg(log_level);
        // A clean environment for the worker: no inherited STRATA_* settings,
        // no proxies (its WebSocket client honours *_PROXY), and the tokens in
        // the environment only, never on the command line.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("STRATA_") || k.to_ascii_lowercase().ends_with("_proxy") {
                cmd.env_remove(&k);
            }
        }
        cmd.env("STRATA_WORKER_CONNECT_TOKEN", connect_token)
            .env("STRATA_WORKER_TOKEN", WORKER_TOKEN)
            .env("PYTHONUNBUFFERED", "1")
            .env_remove("SSL_CERT_FILE")
            .env_remove("SSL_CERT_DIR")
            .process_group(0);
        if let Some(ca) = ca_file {
            cmd.env("SSL_CERT_FILE", ca);
        }
        StrataWorker {
            proc: Proc::spawn(cmd),
        }
    }

    fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    fn log(&self) -> String {
        self.proc.log()
    }

    /// Live (not zombie) descendants of the worker, with their process groups.
    fn descendants(&self) -> Vec<ProcInfo> {
        descendants_of(self.pid())
    }

    fn stop(&mut self) {
        let own_group = unsafe { libc::getpgrp() } as u32;
        let leader = self.pid();
        // Cells run in sessions of their own: collect their groups too.
        let mut groups: HashSet<u32> = HashSet::from([leader]);
        let mut pids: HashSet<u32> = HashSet::new();
        for p in self.descendants() {
            groups.insert(p.pgrp);
            pids.insert(p.pid);
        }
        groups.retain(|&g| g > 1 && g != own_group);
        for sig in [libc::SIGTERM, libc::SIGKILL] {
            for &g in &groups {
                unsafe { libc::kill(-(g as i32), sig) };
            }
            for &p in &pids {
                unsafe { libc::kill(p as i32, sig) };
            }
            let end = Instant::now() + Duration::from_secs(5);
            loop {
                let _ = self.proc.child.try_wait(); // reap the leader
                let left =
                    groups.iter().any(|&g| group_alive(g)) || pids.iter().any(|&p| proc_alive(p));
                if !left || Instant::now() >= end {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.proc.child.try_wait();
        let left: Vec<u32> = pids.iter().copied().filter(|&p| proc_alive(p)).collect();
        if !left.is_empty() {
            eprintln!("interop: WARNING: worker processes survived SIGKILL: {left:?}");
        }
    }

    /// Waits (bounded) for the exit status of the worker itself.
    fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        self.proc.wait_exit(within)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if std::env::var_os("INTEROP_VERBOSE").is_some() {
            eprintln!("{}", self.logs());
        }
    }
}

impl Drop for StrataWorker {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug, Clone)]
struct ProcInfo {
    pid: u32,
    ppid: u32,
    pgrp: u32,
    state: char,
    cmdline: String,
}

/// `/proc/<pid>/stat` fields after the command name (which may hold spaces).
fn proc_info(pid: u32) -> Option<ProcInfo> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgrp = f.next()?.parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default();
    Some(ProcInfo {
        pid,
        ppid,
        pgrp,
        state,
        cmdline,
    })
}

fn all_procs() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(proc_info)
        .collect()
}

fn descendants_of(root: u32) -> Vec<ProcInfo> {
    let procs = all_procs();
    let mut children: HashMap<u32, Vec<&ProcInfo>> = HashMap::new();
    for p in &procs {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        for c in children.get(&pid).into_iter().flatten() {
            todo.push(c.pid);
            if c.state != 'Z' {
                out.push((*c).clone());
            }
        }
    }
    out
}

fn proc_alive(pid: u32) -> bool {
    proc_info(pid).is_some_and(|p| p.state != 'Z')
}

fn group_alive(pgrp: u32) -> bool {
    all_procs().iter().any(|p| p.pgrp == pgrp && p.state != 'Z')
}

/// A relay example process on a fresh port and a strata-worker connected to it.
struct Stack {
    port: u16,
    relay: Proc,
    worker: StrataWorker,
    rt: tokio::runtime::Runtime,
    /// The certificate the relay serves, for a stack over TLS.
    tls: Option<TlsFiles>,
}

impl Stack {
    fn start() -> Stack {
        Stack::start_with(&default_log_level())
    }

    fn start_with(log_level: &str) -> Stack {
        Stack::start_on(log_level, None)
    }

    /// The relay serving TLS (a CA made now), strata-worker dialling
    /// `wss://localhost`, callers over HTTPS.
    fn start_tls() -> Stack {
        Stack::start_on(&default_log_level(), Some(TlsFiles::new()))
    }

    fn start_on(log_level: &str, tls: Option<TlsFiles>) -> Stack {
        let (relay, port) = relay_on(0, tls.as_ref());
        Stack::start_behind(port, relay, log_level, tls)
    }

    /// A strata-worker connected to `relay`, already listening on `port`.
    fn start_behind(port: u16, relay: Proc, log_level: &str, tls: Option<TlsFiles>) -> Stack {
        let t = Instant::now();
        let worker = match &tls {
            None => StrataWorker::spawn_with(port, CONNECT_TOKEN, log_level),
            Some(files) => StrataWorker::spawn_at(
                &format!("wss://localhost:{port}/connect"),
                CONNECT_TOKEN,
                log_level,
                Some(&files.ca_file),
            ),
        };
        let connected = format!("worker {WORKER} connected");
        assert!(
            relay.wait_log(&connected, CONNECT_WITHIN),
            "strata-worker did not connect within {CONNECT_WITHIN:?}\n--- relay ---\n{}\n--- worker ---\n{}",
            relay.log(),
            worker.log()
        );
        eprintln!(
            "interop: strata-worker started and connected{} in {} ms",
            if tls.is_some() { " over wss://" } else { "" },
            t.elapsed().as_millis()
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        Stack {
            port,
            relay,
            worker,
            rt,
            tls,
        }
    }

    /// Kills the relay and starts it again on the same port (and
    /// certificate).
    fn restart_relay(&mut self) {
        self.relay.kill();
        self.relay = relay_on(self.port, self.tls.as_ref()).0;
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Where callers send requests: the relay, over TLS for a TLS stack.
    fn endpoint(&self) -> Endpoint {
        Endpoint {
            addr: self.addr(),
            tls: self
                .tls
                .as_ref()
                .map(|f| tls_client::client_config(&f.ca.pem(), &[b"http/1.1"])),
        }
    }

    fn logs(&self) -> String {
        format!(
            "--- relay ---\n{}\n--- strata-worker ---\n{}",
            self.relay.log(),
            self.worker.log()
        )
    }

    /// One request to `/w/<WORKER><path>`, bounded; returns the answer and how long it took.
    fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> (Answer, Duration) {
        let fut = send(self.endpoint(), method, path, headers, body);
        self.rt.block_on(fut)
    }
}

/// The relay example on `port` (0: a port of its own), serving TLS with
/// `tls`'s certificate if given; returns it and its port.
fn relay_on(port: u16, tls: Option<&TlsFiles>) -> (Proc, u16) {
    match tls {
        None => relay_process_on(port, &[]),
        Some(f) => relay_process_on(
            port,
            &[
                "--tls-cert".as_ref(),
                f.cert.as_os_str(),
                "--tls-key".as_ref(),
                f.key.as_os_str(),
            ],
        ),
    }
}

/// Where a caller connects: the relay's address, and the TLS client
/// settings if it serves TLS.
#[derive(Clone)]
struct Endpoint {
    addr: SocketAddr,
    tls: Option<Arc<rustls::ClientConfig>>,
}

async fn send(
    ep: Endpoint,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> (Answer, Duration) {
    let target = format!("/w/{WORKER}{path}");
    let t = Instant::now();
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(ep.addr).await?;
        let _ = tcp.set_nodelay(true);
        let host = ep.addr.to_string();
        match ep.tls {
            None => client::request_on(tcp, &host, method, &target, headers, body).await,
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from("localhost")?;
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await?;
                client::request_on(tls, "localhost", method, &target, headers, body).await
            }
        }
    };
    let answer = tokio::time::timeout(REQUEST_LIMIT, exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {target}: no answer within {REQUEST_LIMIT:?}"))
        .unwrap_or_else(|e| panic!("{method} {target}: {e}"));
    (answer, t.elapsed())
}

fn auth() -> String {
    format!("Bearer {WORKER_TOKEN}")
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(2000)]).into_owned()
}

// ---------------------------------------------------------------------------
// multipart/form-data and tar, by hand
// ---------------------------------------------------------------------------

struct Part<'a> {
    name: &'a str,
    filename: &'a str,
    content_type: &'a str,
    data: &'a [u8],
}

/// A multipart/form-data body; every part is a file part (Strata requires the
/// `metadata` part to carry a filename). Returns (body, content-type).
fn multipart(parts: &[Part]) -> (Bytes, String) {
    let boundary = format!("interop-{:016x}", rand_u64());
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"; filename=\"{}\"\r\nContent-Type: {}\r\n\r\n",
                p.name, p.filename, p.content_type
            )
            .as_bytes(),
        );
        out.extend_from_slice(p.data);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (
        out.into(),
        format!("multipart/form-data; boundary={boundary}"),
    )
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.finish()
}

fn build_id(tag: &str) -> String {
    format!("interop-{tag}-{:08x}", rand_u64() as u32)
}

/// The metadata of a `notebook_cell@v1` execution.
fn metadata(build_id: &str, source: &str, timeout_seconds: u64, inputs: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "protocol_version": "v1",
        "build_id": build_id,
        "transform": {
            "ref": "notebook_cell@v1",
            "params": {"source": source, "timeout_seconds": timeout_seconds},
        },
        "inputs": inputs,
    }))
    .unwrap()
}

/// A tar member: name and contents.
struct Member {
    name: String,
    data: Vec<u8>,
}

fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn octal(field: &[u8]) -> usize {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        // base-256 (GNU) for large sizes
        return field[1..]
            .iter()
            .fold(0usize, |n, &b| (n << 8) | b as usize);
    }
    let s = cstr(field);
    let s = s.trim_matches(|c: char| c == ' ' || c == '\0');
    if s.is_empty() {
        0
    } else {
        usize::from_str_radix(s, 8).unwrap_or_else(|_| panic!("tar: bad octal field {s:?}"))
    }
}

/// Regular files of a ustar/pax/GNU tar archive, in order.
fn untar(tar: &[u8]) -> Vec<Member> {
    let mut out = Vec::new();
    let mut off = 0;
    let mut long_name: Option<String> = None;
    while off + 512 <= tar.len() {
        let h = &tar[off..off + 512];
        if h.iter().all(|&b| b == 0) {
            break; // end-of-archive blocks
        }
        let stored: usize = octal(&h[148..156]);
        let sum: usize = h
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    b as usize
                }
            })
            .sum();
        assert_eq!(stored, sum, "tar: bad header checksum at offset {off}");
        let size = octal(&h[124..136]);
        let kind = h[156];
        let mut name = cstr(&h[0..100]);
        if &h[257..262] == b"ustar" {
            let prefix = cstr(&h[345..500]);
            if !prefix.is_empty() {
                name = format!("{prefix}/{name}");
            }
        }
        let start = off + 512;
        assert!(start + size <= tar.len(), "tar: member {name} truncated");
        let data = &tar[start..start + size];
        off = start + size.div_ceil(512) * 512;
        match kind {
            // pax extended header: records "<len> key=value\n"; only `path` matters here
            b'x' => {
                let mut rest = data;
                while let Some(sp) = rest.iter().position(|&b| b == b' ') {
                    let len: usize = std::str::from_utf8(&rest[..sp]).unwrap().parse().unwrap();
                    let rec = String::from_utf8_lossy(&rest[sp + 1..len - 1]).into_owned();
                    if let Some(p) = rec.strip_prefix("path=") {
                        long_name = Some(p.to_owned());
                    }
                    rest = &rest[len..];
                }
            }
            b'L' => long_name = Some(cstr(data)),
            b'0' | 0 => out.push(Member {
                name: long_name.take().unwrap_or(name),
                data: data.to_vec(),
            }),
            _ => long_name = None, // directories, global headers, links: not needed
        }
    }
    out
}

/// The manifest of a Strata output bundle (a tar), and its members.
fn bundle(answer: &Answer) -> (Value, Vec<Member>) {
    assert_eq!(
        answer.headers.get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/x-tar"[..]),
        "not a tar: {:?} {}",
        answer.headers,
        text(&answer.body)
    );
    assert!(answer.complete, "the tar body did not complete");
    let members = untar(&answer.body);
    let manifest = members
        .iter()
        .find(|m| m.name == "manifest.json")
        .unwrap_or_else(|| {
            panic!(
                "no manifest.json in the tar: {:?}",
                members.iter().map(|m| &m.name).collect::<Vec<_>>()
            )
        });
    let manifest: Value = serde_json::from_slice(&manifest.data).expect("manifest.json is JSON");
    (manifest, members)
}

/// The JSON contents of variable `name` in a bundle.
fn variable(manifest: &Value, members: &[Member], name: &str) -> Value {
    let var = &manifest["variables"][name];
    assert!(var.is_object(), "no variable {name} in {manifest:#}");
    let file = var["file"].as_str().expect("variable file");
    let member = members
        .iter()
        .find(|m| m.name == file)
        .unwrap_or_else(|| panic!("variable {name}: {file} not in the tar"));
    serde_json::from_slice(&member.data).expect("variable file is JSON")
}

fn execute_headers<'a>(auth: &'a str, content_type: &'a str) -> [(&'a str, &'a str); 3] {
    [
        ("authorization", auth),
        ("content-type", content_type),
        ("x-strata-executor-protocol", "v1"),
    ]
}

// ---------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------

#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn health_is_healthy_without_auth() {
    let s = Stack::start();
    let (r, took) = s.request("GET", "/health", &[], Bytes::new());
    assert_eq!(r.status, 200, "{}\n{}", text(&r.body), s.logs());
    assert_eq!(r.headers["content-type"], "application/json");
    let v: Value = serde_json::from_slice(&r.body).expect("health is JSON");
    assert_eq!(v["status"], "healthy", "{v}");
    assert!(
        v["capabilities"]["transform_refs"]
            .as_array()
            .is_some_and(|a| a.iter().any(|r| r == "notebook_cell@v1")),
        "{v}"
    );
    eprintln!(
        "interop: GET /health (no auth) -> 200 healthy in {}",
        ms(took)
    );

    // The same with the worker token.
    let a = auth();
    let (r, took) = s.request("GET", "/health", &[("authorization", &a)], Bytes::new());
    assert_eq!(r.status, 200);
    eprintln!("interop: GET /health (with auth) -> 200 in {}", ms(took));
}

#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn execute_a_real_cell() {
    execute_a_real_cell_on(Stack::start());
}

/// The same, strata-worker dialling the relay over `wss://` (issue 24).
#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn execute_a_real_cell_over_wss() {
    execute_a_real_cell_on(Stack::start_tls());
}

fn execute_a_real_cell_on(s: Stack) {
    let a = auth();
    let meta = metadata(&build_id("x"), "x = 6 * 7", 60, json!([]));
    let (body, ctype) = multipart(&[Part {
        name: "metadata",
        filename: "metadata.json",
        content_type: "application/json",
        data: &meta,
    }]);
    let (r, took) = s.request("POST", "/v1/execute", &execute_headers(&a, &ctype), body);
    assert_eq!(r.status, 200, "{}\n{}", text(&r.body), s.logs());
    let (manifest, members) = bundle(&r);
    assert_eq!(manifest["success"], true, "{manifest:#}");
    assert_eq!(variable(&manifest, &members, "x"), json!(42));
    assert_eq!(
        r.headers
            .get("x-strata-executor-protocol")
            .map(|v| v.as_bytes()),
        Some(&b"v1"[..])
    );
    eprintln!(
        "interop: POST /v1/execute `x = 6 * 7` -> 200 tar ({} bytes, members {:?}) in {}",
        r.body.len(),
        members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        ms(took)
    );
}

/// Deterministic printable ASCII, so it is a JSON string without escapes.
fn letters(n: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (b'a' + (x % 26) as u8) as char
        })
        .collect()
}

#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn execute_with_a_request_body_over_3_mib() {
    let s = Stack::start();
    let a = auth();
    // A 3.5 MiB input part (a JSON string) that the cell hashes, and a 256 KiB
    // comment in the source: the body crosses several 1 MiB chunks, and the
    // cell proves the bytes arrived intact.
    let blob = letters(7 << 19);
    let want = format!("{:x}", Sha256::digest(blob.as_bytes()));
    let input = serde_json::to_vec(&blob).unwrap();
    let source = format!(
        "# {}\nimport hashlib\nn = len(blob)\nh = hashlib.sha256(blob.encode()).hexdigest()\n",
        "p".repeat(256 << 10)
    );
    let meta = metadata(
        &build_id("big"),
        &source,
        60,
        json!([{"name": "blob", "format": "json/object", "file": "blob.json"}]),
    );
    let (body, ctype) = multipart(&[
        Part {
            name: "metadata",
            filename: "metadata.json",
            content_type: "application/json",
            data: &meta,
        },
        Part {
            name: "blob.json",
            filename: "blob.json",
            content_type: "application/octet-stream",
            data: &input,
        },
    ]);
    let size = body.len();
    assert!(size > 3 << 20, "body is {size} bytes");
    let (r, took) = s.request("POST", "/v1/execute", &execute_headers(&a, &ctype), body);
    assert_eq!(r.status, 200, "{}\n{}", text(&r.body), s.logs());
    let (manifest, members) = bundle(&r);
    assert_eq!(manifest["success"], true, "{manifest:#}");
    assert_eq!(variable(&manifest, &members, "n"), json!(blob.len()));
    assert_eq!(variable(&manifest, &members, "h"), json!(want));
    eprintln!(
        "interop: POST /v1/execute with a {size}-byte body ({:.2} MiB) -> 200, input hash matches, in {}",
        size as f64 / (1 << 20) as f64,
        ms(took)
    );
}

#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn cancel_during_a_long_cell() {
    cancel_during_a_long_cell_on(Stack::start());
}

/// The same over `wss://` (issue 24).
#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn cancel_during_a_long_cell_over_wss() {
    cancel_during_a_long_cell_on(Stack::start_tls());
}

fn cancel_during_a_long_cell_on(s: Stack) {
    let a = auth();
    let id = build_id("long");
    // The cell marks when it really runs (so the cancel reaches a running
    // harness, not a pending one), then sleeps 30 s.
    let marker = std::env::temp_dir().join(format!("{id}.started"));
    let _ = std::fs::remove_file(&marker);
    let source = format!(
        "import pathlib\npathlib.Path({:?}).touch()\nimport time; time.sleep(30)\n",
        marker.display().to_string()
    );
    let meta = metadata(&id, &source, 120, json!([]));
    let (body, ctype) = multipart(&[Part {
        name: "metadata",
        filename: "metadata.json",
        content_type: "application/json",
        data: &meta,
    }]);
    let ep = s.endpoint();
    let started = Instant::now();
    let long = {
        let a = a.clone();
        s.rt.spawn(async move {
            let (r, _) = send(
                ep,
                "POST",
                "/v1/execute",
                &execute_headers(&a, &ctype),
                body,
            )
            .await;
            (r, Instant::now())
        })
    };
    let end = Instant::now() + Duration::from_secs(60);
    while !marker.exists() {
        assert!(
            Instant::now() < end,
            "the long cell did not start within 60 s\n{}",
            s.logs()
        );
        assert!(!long.is_finished(), "the long request ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&marker);
    eprintln!(
        "interop: long cell running {} after its request",
        ms(started.elapsed())
    );
    let running: Vec<ProcInfo> = s.worker.descendants();
    eprintln!(
        "interop: worker descendants while the cell runs: {:?}",
        running
            .iter()
            .map(|p| (
                p.pid,
                p.pgrp,
                p.cmdline.chars().take(80).collect::<String>()
            ))
            .collect::<Vec<_>>()
    );
    std::thread::sleep(Duration::from_millis(500));

    let (r, cancel_took) = s.request(
        "POST",
        &format!("/v1/executions/{id}/cancel"),
        &[("authorization", &a)],
        Bytes::new(),
    );
    let cancelled_at = Instant::now();
    assert_eq!(r.status, 200, "{}\n{}", text(&r.body), s.logs());
    let v: Value = serde_json::from_slice(&r.body).expect("cancel answer is JSON");
    assert_eq!(v, json!({"build_id": id, "cancelled": true}));
    eprintln!("interop: cancel answered in {} -> {v}", ms(cancel_took));
    // Generous for a loaded machine: a cancel that waited for the cell
    // would take its 30 s.
    assert!(
        cancel_took < Duration::from_secs(10),
        "cancel took {cancel_took:?}"
    );

    let (r, returned_at) =
        s.rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), long).await })
            .expect("the long request did not return within 10 s of the cancel")
            .unwrap();
    let after = returned_at.saturating_duration_since(cancelled_at);
    let total = returned_at.duration_since(started);
    eprintln!(
        "interop: long request returned {} after the cancel answer ({} after it was sent): {} {}",
        ms(after),
        ms(total),
        r.status,
        text(&r.body)
    );
    assert!(r.complete);
    assert!(
        total < Duration::from_secs(25),
        "the cell was not cut short"
    );
    // Strata 0.11.0: a cancel while the harness runs kills it and the dispatch
    // answers 500 {"success":false,"error":"Harness did not produce ..."};
    // one before the harness starts answers 409.
    assert!(
        matches!(r.status, 500 | 409),
        "unexpected answer to a cancelled execution: {} {}",
        r.status,
        text(&r.body)
    );
    let v: Value = serde_json::from_slice(&r.body).expect("the failure is JSON");
    assert_eq!(v["success"], false, "{v}");

    // The cell's processes are gone.
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<ProcInfo> = s
            .worker
            .descendants()
            .into_iter()
            .filter(|p| running.iter().any(|q| q.pid == p.pid))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < end,
            "cell processes survived the cancel: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // And the worker still serves.
    let (r, took) = s.request("GET", "/health", &[], Bytes::new());
    assert_eq!(r.status, 200);
    eprintln!(
        "interop: GET /health after the cancel -> 200 in {}",
        ms(took)
    );
}

#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn missing_or_wrong_worker_token_is_401() {
    let s = Stack::start();
    let meta = metadata(&build_id("noauth"), "x = 1", 30, json!([]));
    let (body, ctype) = multipart(&[Part {
        name: "metadata",
        filename: "metadata.json",
        content_type: "application/json",
        data: &meta,
    }]);
    let (r, took) = s.request(
        "POST",
        "/v1/execute",
        &[("content-type", &ctype)],
        body.clone(),
    );
    assert_eq!(r.status, 401, "{}\n{}", text(&r.body), s.logs());
    let v: Value = serde_json::from_slice(&r.body).expect("401 body is JSON");
    assert!(v["detail"].is_string(), "{v}");
    eprintln!(
        "interop: POST /v1/execute without a token -> 401 {} in {}",
        text(&r.body),
        ms(took)
    );

    let (r, took) = s.request(
        "POST",
        "/v1/execute",
        &[
            ("content-type", &ctype),
            ("authorization", "Bearer not-the-worker-token"),
        ],
        body,
    );
    assert_eq!(r.status, 401, "{}", text(&r.body));
    eprintln!(
        "interop: POST /v1/execute with a wrong token -> 401 {} in {}",
        text(&r.body),
        ms(took)
    );

    let (r, took) = s.request(
        "POST",
        &format!("/v1/executions/{}/cancel", build_id("noauth")),
        &[],
        Bytes::new(),
    );
    assert_eq!(r.status, 401, "{}", text(&r.body));
    eprintln!(
        "interop: POST /v1/executions/<id>/cancel without a token -> 401 in {}",
        ms(took)
    );
}

#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn wrong_connect_token_makes_strata_worker_exit_1() {
    let (relay, port) = relay_process();
    let t = Instant::now();
    // At info level: at debug, websockets itself logs the handshake's
    // `Authorization: Bearer <connect token>` line.
    let mut worker = StrataWorker::spawn_with(port, "ct-not-the-right-token", "info");
    let code = worker.wait_exit(Duration::from_secs(60));
    let took = t.elapsed();
    assert_eq!(
        code,
        Some(1),
        "--- relay ---\n{}\n--- strata-worker ---\n{}",
        relay.log(),
        worker.log()
    );
    assert!(
        relay.wait_log("refused a worker", Duration::from_secs(5)),
        "{}",
        relay.log()
    );
    assert!(worker.log().contains("401"), "{}", worker.log());
    for log in [relay.log(), worker.log()] {
        assert!(
            !log.contains("ct-not-the-right-token")
                && !log.contains(CONNECT_TOKEN)
                && !log.contains(WORKER_TOKEN),
            "a token was logged: {log}"
        );
    }
    eprintln!(
        "interop: wrong connect token -> strata-worker exited with status 1 in {} (start-up included)",
        ms(took)
    );
}

#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn relay_restarted_strata_worker_reconnects() {
    relay_restarted_strata_worker_reconnects_on(Stack::start());
}

/// The same over `wss://` (issue 24).
#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn relay_restarted_strata_worker_reconnects_over_wss() {
    relay_restarted_strata_worker_reconnects_on(Stack::start_tls());
}

fn relay_restarted_strata_worker_reconnects_on(mut s: Stack) {
    let (r, _) = s.request("GET", "/health", &[], Bytes::new());
    assert_eq!(r.status, 200, "{}", s.logs());

    s.relay.kill();
    let killed = Instant::now();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let log = s.worker.log();
        if log.contains("Lost the relay") || log.contains("closed the connection") {
            break;
        }
        assert!(
            Instant::now() < end,
            "strata-worker did not notice the relay going away\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "interop: strata-worker noticed the relay gone in {}",
        ms(killed.elapsed())
    );
    s.restart_relay();
    let restarted = Instant::now();
    let connected = format!("worker {WORKER} connected");
    assert!(
        s.relay.wait_log(&connected, Duration::from_secs(30)),
        "strata-worker did not reconnect within 30 s\n{}",
        s.logs()
    );
    let reconnect = restarted.elapsed();
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let (r, _) = s.request("GET", "/health", &[], Bytes::new());
        if r.status == 200 || Instant::now() >= end {
            break r.status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status, 200, "{}", s.logs());
    eprintln!(
        "interop: relay restarted -> strata-worker reconnected in {}, next /health 200 at {}",
        ms(reconnect),
        ms(restarted.elapsed())
    );
}

#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn idle_connection_survives_the_workers_keepalive() {
    // The worker (Python websockets) pings every 20 s and gives up 20 s
    // later (close 1011). Debug logs show each ping and pong.
    let s = Stack::start_with("debug");
    let idle = Duration::from_secs(45);
    std::thread::sleep(idle);
    let log = s.worker.log();
    let pongs = log.matches("received keepalive pong").count();
    for bad in [
        "Lost the relay",
        "closed the connection",
        "keepalive ping timeout",
    ] {
        assert!(!log.contains(bad), "{bad:?} while idle\n{}", s.logs());
    }
    assert!(pongs >= 2, "{pongs} pongs in {idle:?}\n{}", s.logs());
    assert_eq!(
        s.relay
            .log()
            .matches(&format!("worker {WORKER} connected"))
            .count(),
        1,
        "{}",
        s.logs()
    );
    let (r, took) = s.request("GET", "/health", &[], Bytes::new());
    assert_eq!(r.status, 200, "{}", s.logs());
    eprintln!(
        "interop: idle {} s: {pongs} keepalive pings answered, same connection, /health 200 in {}",
        idle.as_secs(),
        ms(took)
    );
}

#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn completed_responses_are_not_aborted() {
    // The worker's debug log shows every frame it receives. A stream the
    // worker completed (`end` sent) and whose caller read the whole body must
    // not be aborted by the relay afterwards: `abort` means "the caller has
    // gone" (spec: "when the relay gives up on the stream").
    let s = Stack::start_with("debug");
    let n = 100;
    for _ in 0..n {
        let (r, _) = s.request("GET", "/health", &[], Bytes::new());
        assert_eq!(r.status, 200, "{}", s.logs());
        assert!(r.complete);
    }
    let a = auth();
    let meta = metadata(&build_id("noabort"), "x = 6 * 7", 60, json!([]));
    let (body, ctype) = multipart(&[Part {
        name: "metadata",
        filename: "metadata.json",
        content_type: "application/json",
        data: &meta,
    }]);
    for _ in 0..3 {
        let (r, _) = s.request(
            "POST",
            "/v1/execute",
            &execute_headers(&a, &ctype),
            body.clone(),
        );
        assert_eq!(r.status, 200, "{}", s.logs());
        assert!(r.complete);
    }
    std::thread::sleep(Duration::from_millis(500)); // let the worker log the last frames
    let log = s.worker.log();
    let aborts: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("< TEXT") && l.contains(r#""type":"abort""#))
        .collect();
    eprintln!(
        "interop: {} complete responses; the relay sent {} abort frame(s) after them",
        n + 3,
        aborts.len()
    );
    // Seen with the crate as of this suite's writing: hyper's HTTP/1 server
    // drops a response body as soon as Content-Length bytes are written,
    // without polling it to its end; if the worker's `end` has not been
    // processed by then, rt::relay's Guard::drop sends `abort`.
    assert!(
        aborts.is_empty(),
        "the relay sent `abort` for {} of {} streams whose response was complete \
         (Content-Length bytes delivered, worker sent `end`); first ones: {:#?}",
        aborts.len(),
        n + 3,
        &aborts[..aborts.len().min(5)]
    );
}

/// Issue 14: a caller that stops reading a large response (a cell's 64 MiB
/// result) costs only its own stream. For 60 s `/health` is asked every
/// 200 ms and answered; the worker's connection stays up (its 20 s / 20 s
/// keepalive survives, since the relay never stops reading it: the unread
/// response goes to the relay's overflow); the stalled stream is given up at
/// the stall deadline.
#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn a_stalled_caller_does_not_cost_the_workers_keepalive() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = Stack::start();
    let a = auth();
    let meta = metadata(&build_id("big"), "x = 'a' * (64 << 20)", 120, json!([]));
    let (body, ctype) = multipart(&[Part {
        name: "metadata",
        filename: "metadata.json",
        content_type: "application/json",
        data: &meta,
    }]);
    let addr = s.addr();
    let (health, stalled_got) = s.rt.block_on(async {
        // The stalled caller: sends the request, reads the head, then nothing.
        let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut head = format!("POST /w/{WORKER}/v1/execute HTTP/1.1\r\nhost: x\r\n");
        for (n, v) in execute_headers(&a, &ctype) {
            head.push_str(&format!("{n}: {v}\r\n"));
        }
        head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
        stalled.write_all(head.as_bytes()).await.unwrap();
        stalled.write_all(&body).await.unwrap();
        let mut first = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(60), stalled.read(&mut first))
            .await
            .expect("the cell's answer started")
            .unwrap();
        assert!(
            first[..n].starts_with(b"HTTP/1.1 200"),
            "{}",
            text(&first[..n])
        );
        let mut times = Vec::new();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(60) {
            let (r, took) = send(s.endpoint(), "GET", "/health", &[], Bytes::new()).await;
            assert_eq!(r.status, 200, "health at {:?}", t0.elapsed());
            times.push(took);
            tokio::time::sleep(Duration::from_millis(200).saturating_sub(took)).await;
        }
        // Past the stall deadline the relay has given the stream up. The
        // deadline counts from the caller's last take, when its socket
        // buffers filled, a moment after `t0`: reading at `t0 + 60 s` could
        // come first and start the stream moving again, so wait it out.
        tokio::time::sleep(Duration::from_secs(15)).await;
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), stalled.read_to_end(&mut rest)).await;
        (times, n + rest.len())
    });
    let mut sorted = health.clone();
    sorted.sort();
    eprintln!(
        "interop: 60 s of a stalled 64 MiB download: {} /health answered, p50 {}, p99 {}, max {}; \
         the stalled caller got {} bytes before it was given up",
        sorted.len(),
        ms(sorted[sorted.len() / 2]),
        ms(sorted[sorted.len() * 99 / 100]),
        ms(*sorted.last().unwrap()),
        stalled_got
    );
    // 300 when each check takes under 200 ms; generous for a loaded
    // machine: checks queued behind the stalled download would wait for
    // its 60 s, and only a handful would fit.
    assert!(sorted.len() >= 100, "{} health checks", sorted.len());
    assert!(
        (stalled_got as u64) < 64 << 20,
        "the stalled caller was not given up"
    );
    let logs = s.logs();
    assert!(
        !logs.contains("keepalive") && !logs.contains("disconnected"),
        "the worker's connection must survive: {logs}"
    );
    assert_eq!(
        s.worker.log().matches("Connected to the relay").count(),
        1,
        "{logs}"
    );
}

// ---------------------------------------------------------------------------
// In-place restart (issue 25)
// ---------------------------------------------------------------------------

/// The flags of a relay that can be restarted in place: a second relay can
/// take its port (`--reuse-port`), a request for a worker that is not
/// connected waits up to 10 s for it (`--reconnect-wait`), and a draining
/// relay gives the requests in flight, a running cell among them, up to
/// 60 s (`--grace`).
const RESTART_FLAGS: [&str; 5] = ["--reuse-port", "--reconnect-wait", "10", "--grace", "60"];

/// How long the restart test's cell sleeps once it runs.
const CELL_SLEEP_SECS: u64 = 4;

/// The longest one poll of `/health` may take: the reconnect wait and then
/// some.
const POLL_LIMIT: Duration = Duration::from_secs(20);

/// A relay example with [`RESTART_FLAGS`] on `port` (0: a port of its
/// own); returns it and its port once it listens (its own log says so:
/// another relay may already answer on the port).
fn restartable_relay(port: u16) -> (Proc, u16) {
    let args: Vec<&std::ffi::OsStr> = RESTART_FLAGS.iter().map(|a| a.as_ref()).collect();
    relay_process_on(port, &args)
}

/// One `GET /health` of the poller.
struct Poll {
    /// When it was sent, from the poller's start.
    sent: Duration,
    took: Duration,
    /// `Err` says what went wrong: no answer, a failed connection, a
    /// status other than 200, an unfinished or unhealthy body.
    outcome: Result<(), String>,
}

/// Sends `GET /w/<WORKER>/health` every `every` on a new connection each,
/// without waiting for the previous answer (a poll held up by the restart
/// does not delay the next), until `stop`; returns every poll, answered or
/// failed (each bounded by [`POLL_LIMIT`]).
async fn poll_health(addr: SocketAddr, stop: Arc<AtomicBool>, every: Duration) -> Vec<Poll> {
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut polls = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let sent = t0.elapsed();
        polls.push(tokio::spawn(async move {
            let t = Instant::now();
            let target = format!("/w/{WORKER}/health");
            let r = tokio::time::timeout(
                POLL_LIMIT,
                client::request(addr, "GET", &target, &[], Bytes::new()),
            )
            .await;
            let outcome = match r {
                Err(_) => Err(format!("no answer within {POLL_LIMIT:?}")),
                Ok(Err(e)) => Err(format!("failed: {e}")),
                Ok(Ok(a)) if a.status != 200 => Err(format!("{} {}", a.status, text(&a.body))),
                Ok(Ok(a)) if !a.complete => Err("200, body cut short".into()),
                Ok(Ok(a)) => match serde_json::from_slice::<Value>(&a.body) {
                    Ok(v) if v["status"] == "healthy" => Ok(()),
                    _ => Err(format!("200 but not healthy: {}", text(&a.body))),
                },
            };
            Poll {
                sent,
                took: t.elapsed(),
                outcome,
            }
        }));
    }
    let mut out = Vec::with_capacity(polls.len());
    for p in polls {
        out.push(p.await.expect("a poll panicked"));
    }
    out
}

/// Issue 25, with the real strata-worker: the relay restarted in place
/// while a cell runs and `/health` is polled. Relay A runs with
/// [`RESTART_FLAGS`]; a cell that sleeps 4 s and then sets `x` runs through
/// it; meanwhile `GET /health` goes out every 50 ms, each on a new
/// connection to the relay port. Relay B starts on the same port
/// (`SO_REUSEPORT`) and, once it listens, A gets `SIGTERM`: it stops
/// accepting, finishes the cell's request, closes the worker's connection
/// with 1012 and exits 0. The cell's result arrives with the right value,
/// every poll gets 200 (those that reach B before the worker does wait for
/// it: `--reconnect-wait`), the worker reconnects to B, and no log holds a
/// token.
///
/// strata-worker 0.11.0 on 1012 (`strata/notebook/worker_connect.py`,
/// `run_connect`): nothing specific to the code. websockets 17 raises
/// `ConnectionClosedError` out of the message loop for any close code but
/// 1000, 1001 and none, which is caught as a `WebSocketException`: the
/// worker logs a warning "Lost the relay at URL: received 1012 (service
/// restart) …; then sent 1012 (service restart)", aborts the streams still
/// open on that connection (none here: the relay drained them first), and
/// reconnects after the ordinary backoff, a random 0.5–1 s (the delay went
/// back to 1 s when the last handshake succeeded). So the worker is away
/// from B for the rest of the cell plus that backoff, and B's reconnect
/// wait must be longer than both.
#[test]
#[ignore = "needs strata-worker: run .ci/interop"]
fn in_place_restart_while_a_cell_runs_fails_no_health_poll() {
    let (first, port) = restartable_relay(0);
    // At info level: at debug, websockets logs the connect token, and this
    // test checks that no log holds one.
    let mut s = Stack::start_behind(port, first, "info", None);
    let (r, _) = s.request("GET", "/health", &[], Bytes::new());
    assert_eq!(r.status, 200, "{}", s.logs());

    // The cell: it marks when it runs, sleeps, then sets a known value.
    let a = auth();
    let id = build_id("restart");
    let marker = std::env::temp_dir().join(format!("{id}.started"));
    let _ = std::fs::remove_file(&marker);
    let source = format!(
        "import pathlib\npathlib.Path({:?}).touch()\nimport time\ntime.sleep({CELL_SLEEP_SECS})\nx = 6 * 7 * 1001\n",
        marker.display().to_string()
    );
    let meta = metadata(&id, &source, 120, json!([]));
    let (body, ctype) = multipart(&[Part {
        name: "metadata",
        filename: "metadata.json",
        content_type: "application/json",
        data: &meta,
    }]);
    let ep = s.endpoint();
    let cell_sent = Instant::now();
    let cell = s.rt.spawn(async move {
        let (r, _) = send(
            ep,
            "POST",
            "/v1/execute",
            &execute_headers(&a, &ctype),
            body,
        )
        .await;
        (r, Instant::now())
    });
    let stop = Arc::new(AtomicBool::new(false));
    let poller = s.rt.spawn(poll_health(
        s.addr(),
        stop.clone(),
        Duration::from_millis(50),
    ));
    let end = Instant::now() + Duration::from_secs(60);
    while !marker.exists() {
        assert!(
            Instant::now() < end,
            "the cell did not start within 60 s\n{}",
            s.logs()
        );
        assert!(!cell.is_finished(), "the cell's request ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&marker);
    let cell_running = Instant::now();
    // A few polls through A alone while the cell runs.
    std::thread::sleep(Duration::from_millis(300));

    // The restart: B on the same port; once it listens, SIGTERM to A.
    let (b, _) = restartable_relay(port);
    let b_listening = Instant::now();
    assert!(
        !cell.is_finished(),
        "the cell ended before the restart began: relay B took {} to listen",
        ms(b_listening.duration_since(cell_running))
    );
    let mut old = std::mem::replace(&mut s.relay, b);
    assert_eq!(
        unsafe { libc::kill(old.child.id() as i32, libc::SIGTERM) },
        0
    );
    let term = Instant::now();

    // A exits 0; the worker connects to B. Whichever comes first, each is
    // timed from the SIGTERM.
    let connected = format!("worker {WORKER} connected");
    let (mut a_exit, mut b_connected) = (None, None);
    let end = term + Duration::from_secs(60 + 15);
    while a_exit.is_none() || b_connected.is_none() {
        if a_exit.is_none() {
            if let Some(status) = old.child.try_wait().unwrap() {
                a_exit = Some((status.code(), term.elapsed()));
            }
        }
        if b_connected.is_none() && s.relay.log().contains(&connected) {
            b_connected = Some(term.elapsed());
        }
        assert!(
            Instant::now() < end,
            "after 75 s: relay A exit {a_exit:?}, worker on relay B {b_connected:?}\n\
             --- relay A ---\n{}\n{}",
            old.log(),
            s.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (a_code, a_exited) = a_exit.unwrap();
    let b_connected = b_connected.unwrap();
    assert_eq!(
        a_code,
        Some(0),
        "relay A's exit status\n--- relay A ---\n{}\n{}",
        old.log(),
        s.logs()
    );

    // The cell's result, with its value.
    let (r, cell_answered) =
        s.rt.block_on(async { tokio::time::timeout(Duration::from_secs(60), cell).await })
            .expect("the cell's answer did not arrive within 60 s of relay A's exit")
            .expect("the cell's request panicked");
    assert_eq!(
        r.status,
        200,
        "{}\n--- relay A ---\n{}\n{}",
        text(&r.body),
        old.log(),
        s.logs()
    );
    let (manifest, members) = bundle(&r);
    assert_eq!(manifest["success"], true, "{manifest:#}");
    assert_eq!(variable(&manifest, &members, "x"), json!(42042));

    // A second of polls through B with the worker on it, then stop.
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    let polls =
        s.rt.block_on(async { tokio::time::timeout(POLL_LIMIT * 2, poller).await })
            .expect("the poller did not finish")
            .expect("the poller panicked");
    std::thread::sleep(Duration::from_millis(300)); // the last log lines

    let failed: Vec<(Duration, &String)> = polls
        .iter()
        .filter_map(|p| p.outcome.as_ref().err().map(|e| (p.sent, e)))
        .collect();
    let mut took: Vec<Duration> = polls.iter().map(|p| p.took).collect();
    took.sort();
    let waited = polls
        .iter()
        .filter(|p| p.took > Duration::from_millis(500))
        .count();
    // Polls sent from the moment B listened until the worker was on B: the
    // ones that crossed the restart.
    let poll_t0 = cell_sent; // within a few ms of the poller's start
    let window = (
        b_listening.duration_since(poll_t0),
        (term + b_connected).duration_since(poll_t0),
    );
    let crossed = polls
        .iter()
        .filter(|p| p.sent >= window.0 && p.sent <= window.1)
        .count();
    let worker_log = s.worker.log();
    // The worker logs JSON lines: (timestamp, message).
    let worker_lines: Vec<(f64, String)> = worker_log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| {
            let t = v["timestamp"].as_f64().unwrap_or(f64::NAN);
            (t, v["message"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    let backoff = worker_lines
        .iter()
        .filter_map(|(_, m)| m.strip_prefix("Reconnecting to the relay in "))
        .next_back()
        .unwrap_or("?")
        .to_owned();
    let lost_at = worker_lines
        .iter()
        .find(|(_, m)| m.starts_with("Lost the relay"))
        .map(|(t, _)| *t);
    let back_at = worker_lines
        .iter()
        .filter(|(_, m)| m.starts_with("Connected to the relay"))
        .nth(1)
        .map(|(t, _)| *t);
    let away = match (lost_at, back_at) {
        (Some(a), Some(b)) => format!("{} ms", ((b - a) * 1000.0).round()),
        _ => "?".into(),
    };
    eprintln!(
        "interop: in-place restart during a {CELL_SLEEP_SECS} s cell: {} /health polls, {} failed, \
         {crossed} sent while the restart was under way, {waited} waited > 500 ms for the worker; \
         latency p50 {}, p99 {}, max {}. Relay B listened {} after the cell started; SIGTERM to \
         A -> A exited 0 in {}, the worker on B in {} (its own log: away {away}, backoff \
         {backoff}); the cell's answer (x = 42042) {} after its request, {} after the SIGTERM",
        polls.len(),
        failed.len(),
        ms(took[took.len() / 2]),
        ms(took[took.len() * 99 / 100]),
        ms(*took.last().unwrap()),
        ms(b_listening.duration_since(cell_running)),
        ms(a_exited),
        ms(b_connected),
        ms(cell_answered.duration_since(cell_sent)),
        ms(cell_answered.saturating_duration_since(term)),
    );
    assert!(
        failed.is_empty(),
        "{} of {} polls failed: {:#?}\n--- relay A ---\n{}\n{}",
        failed.len(),
        polls.len(),
        &failed[..failed.len().min(20)],
        old.log(),
        s.logs()
    );
    assert!(polls.len() >= 80, "only {} polls", polls.len());
    assert!(
        crossed >= 10,
        "only {crossed} polls crossed the restart ({window:?})"
    );

    // The worker left A on its 1012 and is on B.
    assert!(
        worker_lines
            .iter()
            .any(|(_, m)| m.starts_with("Lost the relay")
                && m.contains("received 1012 (service restart)")),
        "the worker's log shows no 1012\n{worker_log}"
    );
    assert_eq!(
        worker_log.matches("Connected to the relay").count(),
        2,
        "{worker_log}"
    );
    assert!(
        old.log().contains("closing its connection (1012)"),
        "{}",
        old.log()
    );
    assert_eq!(
        s.relay.log().matches(&connected).count(),
        1,
        "{}",
        s.relay.log()
    );

    if std::env::var_os("INTEROP_VERBOSE").is_some() {
        eprintln!("--- relay A ---\n{}", old.log());
    }

    // No token in any log.
    for (who, log) in [
        ("relay A", old.log()),
        ("relay B", s.relay.log()),
        ("strata-worker", worker_log),
    ] {
        assert!(
            !log.contains(CONNECT_TOKEN) && !log.contains(WORKER_TOKEN),
            "{who} logged a token:\n{log}"
        );
    }
}
