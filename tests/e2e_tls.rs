//! Issue 24, the worker example as a process: `wss://` with `--ca-file`,
//! and plain `ws://` to a host that is not loopback refused before any
//! lookup unless `--allow-insecure`.

#[path = "e2e/support.rs"]
mod support;
#[path = "tls/support.rs"]
mod tls;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use http::Request;
use http_body_util::{BodyExt, Full};
use std::process::Command;
use std::time::{Duration, Instant};
use support::{example_bin, Proc, CONNECT_TOKEN, WORKER_TOKEN};
use tls::{server_config, Ca, TlsRelay};
use tower::Service;
use worker_relay::connect::TokenTable;
use worker_relay_hyper::gateway::Gateway;

fn worker(args: &[&str]) -> Proc {
    let mut cmd = Command::new(example_bin("worker"));
    cmd.args(args)
        .env("STRATA_WORKER_CONNECT_TOKEN", CONNECT_TOKEN)
        .env("STRATA_WORKER_TOKEN", WORKER_TOKEN)
        .env("RUST_LOG", "info");
    Proc::spawn(cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_example_dials_wss_with_its_ca_file_and_serves() {
    let ca = Ca::new("worker-relay e2e CA");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let gateway = Gateway::new(TokenTable::parse(&format!("abc {CONNECT_TOKEN}")).unwrap());
    let relay = TlsRelay::start(gateway, server_config(&ca.leaf(&["localhost"]))).await;
    let url = format!("wss://localhost:{}/connect", relay.addr.port());
    let p = worker(&["--connect", &url, "--ca-file", ca_file.to_str().unwrap()]);
    let end = Instant::now() + Duration::from_secs(20);
    while !relay.gateway.is_connected("abc") {
        assert!(Instant::now() < end, "not connected: {}", p.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let req = Request::get("/w/abc/health")
        .header("authorization", format!("Bearer {WORKER_TOKEN}"))
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), relay.gateway.forward().call(req))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_ca_the_worker_example_retries_and_logs_why() {
    let ca = Ca::new("worker-relay e2e CA");
    let gateway = Gateway::new(TokenTable::parse(&format!("abc {CONNECT_TOKEN}")).unwrap());
    let relay = TlsRelay::start(gateway, server_config(&ca.leaf(&["localhost"]))).await;
    let url = format!("wss://localhost:{}/connect", relay.addr.port());
    let mut p = worker(&["--connect", &url]);
    assert!(
        p.wait_log("UnknownIssuer", Duration::from_secs(20)),
        "no cause logged: {}",
        p.log()
    );
    // It retries (the backoff starts at 1 s) rather than exit.
    let end = Instant::now() + Duration::from_secs(20);
    while relay.accepted() < 2 {
        assert!(Instant::now() < end, "no second dial: {}", p.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(p.wait_exit(Duration::ZERO), None);
    assert!(!relay.gateway.is_connected("abc"));
    assert!(!p.log().contains(CONNECT_TOKEN));
}

#[test]
fn plain_ws_to_a_host_that_is_not_loopback_is_refused_before_any_lookup() {
    let mut p = worker(&["--connect", "ws://relay.invalid/connect"]);
    assert_eq!(p.wait_exit(Duration::from_secs(10)), Some(2), "{}", p.log());
    // The exit can come before the reader thread has the last line.
    assert!(
        p.wait_log("in the clear to relay.invalid", Duration::from_secs(5)),
        "{}",
        p.log()
    );
    assert!(!p.log().contains("DNS"), "{}", p.log());

    // With --allow-insecure it dials (and retries a name that does not resolve).
    let mut p = worker(&[
        "--connect",
        "ws://relay.invalid/connect",
        "--allow-insecure",
    ]);
    assert!(
        p.wait_log(
            "DNS lookup of relay.invalid failed",
            Duration::from_secs(20)
        ),
        "{}",
        p.log()
    );
    assert_eq!(p.wait_exit(Duration::ZERO), None);

    // A CA file that cannot be read or holds no certificate: exit 2 at start.
    let mut p = worker(&[
        "--connect",
        "wss://localhost:1/connect",
        "--ca-file",
        "/nonexistent/ca.pem",
    ]);
    assert_eq!(p.wait_exit(Duration::from_secs(10)), Some(2), "{}", p.log());
    assert!(
        p.wait_log("--ca-file /nonexistent/ca.pem", Duration::from_secs(5)),
        "{}",
        p.log()
    );
}
