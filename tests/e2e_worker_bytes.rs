//! Issue 39: the worker's byte counter (`worker_relay_worker_bytes_total`,
//! `down`) counts what the worker sends, the 500 it writes itself when its
//! app fails among it: for the same requests it equals the relay's
//! (`worker_relay_bytes_total`, `down`).

#[path = "../examples/common/client.rs"]
mod client;
#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{auth, example_bin, relay_process_with, Proc, CONNECT_TOKEN, WORKER_TOKEN};

/// `/metrics` of the admin endpoint at `port`, as `series -> value`.
async fn scrape(port: u16) -> BTreeMap<String, f64> {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let a = client::request(addr, "GET", "/metrics", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!(a.status, 200);
    let text = String::from_utf8(a.body.to_vec()).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn value(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    m.get(series).copied().unwrap_or(0.0)
}

async fn wait_admin(p: &Proc) -> u16 {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_counts_the_500_it_writes_itself() {
    let (relay, port) = relay_process_with(&["--admin".as_ref(), "127.0.0.1:0".as_ref()]);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let relay_admin = wait_admin(&relay).await;
    let mut cmd = Command::new(example_bin("worker"));
    cmd.arg("--connect")
        .arg(format!("ws://127.0.0.1:{port}/connect"))
        .args(["--admin", "127.0.0.1:0"])
        .env("STRATA_WORKER_CONNECT_TOKEN", CONNECT_TOKEN)
        .env("STRATA_WORKER_TOKEN", WORKER_TOKEN);
    let worker = Proc::spawn(cmd);
    let worker_admin = wait_admin(&worker).await;
    assert!(
        relay.wait_log("worker abc connected", Duration::from_secs(20)),
        "{}",
        relay.log()
    );
    let a = auth();
    let h = [("authorization", a.as_str())];
    const OK: usize = 3;
    const FAILED: usize = 2;
    let mut body_bytes = 0;
    for _ in 0..OK {
        let r = client::request(addr, "GET", "/w/abc/health", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!((r.status, r.complete), (200, true));
        body_bytes += r.body.len();
    }
    for _ in 0..FAILED {
        let r = client::request(addr, "GET", "/w/abc/fail-before", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!((r.status, r.complete), (500, true));
        assert!(!r.body.is_empty(), "the worker's 500 has a body");
        body_bytes += r.body.len();
    }

    // Both sides record a request when its response is over: wait for the
    // counts to settle (bounded), then compare.
    let (total, end) = (
        (OK + FAILED) as f64,
        Instant::now() + Duration::from_secs(20),
    );
    let (mut r, mut w) = (scrape(relay_admin).await, scrape(worker_admin).await);
    while value(
        &r,
        r#"worker_relay_request_duration_seconds_count{worker="abc"}"#,
    ) < total
        || value(&w, r#"worker_relay_worker_requests_total{status="200"}"#)
            + value(&w, r#"worker_relay_worker_requests_total{status="500"}"#)
            < total
    {
        assert!(Instant::now() < end, "{r:#?}\n{w:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        (r, w) = (scrape(relay_admin).await, scrape(worker_admin).await);
    }
    let relay_down = value(
        &r,
        r#"worker_relay_bytes_total{worker="abc",direction="down"}"#,
    );
    let worker_down = value(&w, r#"worker_relay_worker_bytes_total{direction="down"}"#);
    eprintln!(
        "e2e_worker_bytes: callers got {body_bytes} body bytes; relay down {relay_down}, \
         worker down {worker_down}"
    );
    assert_eq!(relay_down, body_bytes as f64, "{r:#?}");
    assert_eq!(worker_down, relay_down, "{w:#?}");
}
