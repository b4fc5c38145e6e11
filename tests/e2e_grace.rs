//! Issue 39, the relay example's drain cut by `--grace`: with a request
//! still in flight when the grace expires, the relay says so (how many
//! requests it cut) instead of `drained; exiting`, and exits 3; a drain
//! that finishes in time still exits 0 (`e2e_drain.rs`, and below).

#[path = "../examples/common/client.rs"]
mod client;
#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use std::process::Command;
use std::time::{Duration, Instant};
use support::{auth, example_bin, tokens_file, worker_process, Proc, CONNECT_TOKEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The relay example with `--grace grace` on a port of its own; returns
/// it and its port once it listens.
fn relay(grace: &str) -> (Proc, u16) {
    let tokens = tokens_file(&format!("abc {CONNECT_TOKEN}\n"));
    let mut cmd = Command::new(example_bin("relay"));
    cmd.arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--tokens")
        .arg(tokens)
        .args(["--grace", grace, "--admin", "127.0.0.1:0"])
        .env("RUST_LOG", "info");
    let p = Proc::spawn(cmd);
    let port = p.listen_addr().port();
    (p, port)
}

fn sigterm(p: &Proc) {
    assert_eq!(unsafe { libc::kill(p.child.id() as i32, libc::SIGTERM) }, 0);
}

/// Sends `GET target` on a new connection and returns it, the request
/// written (its answer not read).
async fn send(port: u16, target: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let req = format!(
        "GET {target} HTTP/1.1\r\nhost: relay\r\nauthorization: {}\r\n\r\n",
        auth()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

/// The port of the relay's admin endpoint, from its log.
async fn admin_port(p: &Proc) -> u16 {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let log = p.log();
        if let Some(rest) = log.split("admin listening on 127.0.0.1:").nth(1) {
            let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
            return port.parse().unwrap();
        }
        assert!(Instant::now() < end, "no admin endpoint: {log}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The streams open on the relay's connected workers (`GET /workers`).
async fn streams_open(admin: u16) -> u64 {
    let addr = ([127, 0, 0, 1], admin).into();
    let a = client::request(addr, "GET", "/workers", &[], bytes::Bytes::new())
        .await
        .unwrap();
    let workers: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    workers
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["streams_open"].as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_cut_by_the_grace_says_so_and_exits_3() {
    let (mut relay, port) = relay("1");
    let _worker = worker_process(port, CONNECT_TOKEN);
    assert!(
        relay.wait_log("worker abc connected", Duration::from_secs(20)),
        "{}",
        relay.log()
    );
    // A request the worker answers after 60 s: in flight when the 1 s
    // grace expires.
    let mut slow = send(port, "/w/abc/sleep?ms=60000").await;
    // It has reached the worker before the signal (the drain answers a
    // request that comes after it 503): the relay's /workers shows its
    // stream open.
    let admin = admin_port(&relay).await;
    let end = Instant::now() + Duration::from_secs(20);
    while streams_open(admin).await != 1 {
        assert!(Instant::now() < end, "the request never reached the worker");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sigterm(&relay);
    // The process must end well within the 60 s the request would take:
    // the grace (1 s) and the close of the workers (at most 10 s more).
    let code = relay.wait_exit(Duration::from_secs(30));
    // The exit can come before the reader thread has the last line.
    relay.wait_log("grace", Duration::from_secs(5));
    let log = relay.log();
    assert_eq!(code, Some(3), "{log}");
    let line = log.lines().find(|l| l.contains("grace expired"));
    eprintln!("e2e_grace: {line:?}");
    assert!(line.is_some(), "{log}");
    assert!(log.contains("1 request"), "how many were cut: {log}");
    assert!(!log.contains("drained; exiting"), "{log}");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut rest)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_within_the_grace_exits_0() {
    let (mut relay, port) = relay("30");
    let _worker = worker_process(port, CONNECT_TOKEN);
    assert!(
        relay.wait_log("worker abc connected", Duration::from_secs(20)),
        "{}",
        relay.log()
    );
    sigterm(&relay);
    let code = relay.wait_exit(Duration::from_secs(30));
    relay.wait_log("drained; exiting", Duration::from_secs(5));
    let log = relay.log();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("drained; exiting"), "{log}");
    assert!(!log.contains("grace expired"), "{log}");
}
