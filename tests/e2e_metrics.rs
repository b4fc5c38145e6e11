//! Issue 26: the relay's and the worker's metrics and the access log, with
//! real processes. A known mix goes through relay and worker (successes,
//! the worker's 404s, responses the worker aborts after they started, a
//! caller that stops reading and is given up, requests for an unknown
//! worker, a refused handshake); the scraped counters equal exactly what
//! was done, and the access log has one line per request with no token.

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
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `/metrics` of the admin endpoint at `port`, as `series -> value`
/// (`name{labels}` exactly as exposed).
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
async fn the_scraped_counters_equal_what_was_done() {
    let (relay, port) = relay_process_with(&[
        "--admin".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--stall-timeout".as_ref(),
        "2".as_ref(),
    ]);
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
    let get = |target: &'static str| async move {
        client::request(addr, "GET", target, &h, Bytes::new())
            .await
            .unwrap()
    };
    const OK: usize = 10;
    const NOT_FOUND: usize = 4;
    const ABORTED: usize = 3;
    const UNKNOWN: usize = 2;
    for _ in 0..OK {
        let r = get("/w/abc/health").await;
        assert_eq!((r.status, r.complete), (200, true));
    }
    for _ in 0..NOT_FOUND {
        assert_eq!(get("/w/abc/nope").await.status, 404);
    }
    for _ in 0..ABORTED {
        let r = get("/w/abc/fail-after?n=1000").await;
        assert_eq!((r.status, r.complete), (200, false), "a cut response");
    }
    for _ in 0..UNKNOWN {
        assert_eq!(get("/w/nobody/x").await.status, 404);
    }
    // A caller that reads the head and then nothing: given up after the
    // relay's 2 s stall timeout, then it hangs up.
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET /w/abc/bytes?n={} HTTP/1.1\r\nhost: relay\r\nauthorization: {a}\r\n\r\n",
        256 << 20
    );
    stalled.write_all(req.as_bytes()).await.unwrap();
    let mut head = [0u8; 64];
    let n = stalled.read(&mut head).await.unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_secs(4)).await;
    drop(stalled);
    // A refused handshake: a token the relay does not know.
    let verdict = worker_relay_hyper::ws::dial(
        &format!("ws://127.0.0.1:{port}/connect"),
        &worker_relay::connect::WorkerHandshake::new(
            worker_relay::connect::Token::new("ct-not-a-token-of-this-relay").ok(),
        ),
        Duration::from_secs(5),
    )
    .await;
    assert!(verdict.is_err());

    // Everything is recorded when its response is over: wait for the
    // counts to settle (bounded), then compare exactly.
    let total = (OK + NOT_FOUND + ABORTED + 1) as f64;
    let end = Instant::now() + Duration::from_secs(20);
    let mut m = scrape(relay_admin).await;
    while value(
        &m,
        r#"worker_relay_request_duration_seconds_count{worker="abc"}"#,
    ) < total
    {
        assert!(Instant::now() < end, "{m:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        m = scrape(relay_admin).await;
    }
    let expect = [
        (
            r#"worker_relay_requests_total{worker="abc",status="200"}"#,
            OK,
        ),
        (
            r#"worker_relay_requests_total{worker="abc",status="404"}"#,
            NOT_FOUND,
        ),
        (
            r#"worker_relay_requests_total{worker="abc",status="aborted"}"#,
            ABORTED + 1,
        ),
        (
            r#"worker_relay_requests_total{worker="unknown",status="404"}"#,
            UNKNOWN,
        ),
        (
            r#"worker_relay_stream_ends_total{worker="abc",reason="completed"}"#,
            OK + NOT_FOUND,
        ),
        (
            r#"worker_relay_stream_ends_total{worker="abc",reason="worker_abort"}"#,
            ABORTED,
        ),
        (
            r#"worker_relay_stream_ends_total{worker="abc",reason="stall"}"#,
            1,
        ),
        (
            r#"worker_relay_request_duration_seconds_count{worker="abc"}"#,
            OK + NOT_FOUND + ABORTED + 1,
        ),
        (
            r#"worker_relay_response_start_seconds_count{worker="abc"}"#,
            OK + NOT_FOUND + ABORTED + 1,
        ),
        (
            r#"worker_relay_request_duration_seconds_count{worker="unknown"}"#,
            UNKNOWN,
        ),
        (r#"worker_relay_handshakes_total{result="accepted"}"#, 1),
        (r#"worker_relay_handshakes_total{result="unauthorized"}"#, 1),
        ("worker_relay_workers_connected", 1),
        (r#"worker_relay_streams_open{worker="abc"}"#, 0),
    ];
    for (series, n) in expect {
        assert_eq!(value(&m, series), n as f64, "{series}\n{m:#?}");
    }
    assert_eq!(
        value(
            &m,
            r#"worker_relay_request_duration_seconds_bucket{worker="abc",le="+Inf"}"#
        ),
        total
    );
    assert!(
        value(
            &m,
            r#"worker_relay_bytes_total{worker="abc",direction="down"}"#
        ) >= 1000.0
    );

    let w = scrape(worker_admin).await;
    let expect = [
        (r#"worker_relay_worker_requests_total{status="200"}"#, OK),
        (
            r#"worker_relay_worker_requests_total{status="404"}"#,
            NOT_FOUND,
        ),
        (
            r#"worker_relay_worker_requests_total{status="aborted"}"#,
            ABORTED + 1,
        ),
        (
            r#"worker_relay_worker_connects_total{result="connected"}"#,
            1,
        ),
        ("worker_relay_worker_connected", 1),
        ("worker_relay_worker_streams_open", 0),
    ];
    for (series, n) in expect {
        assert_eq!(value(&w, series), n as f64, "{series}\n{w:#?}");
    }

    // The access log: one line per request, with its fields, no token.
    // The relay writes its log on a thread of its own and the test reads
    // it on another: wait (bounded) for the lines the metrics already count.
    let lines = OK + NOT_FOUND + ABORTED + UNKNOWN + 1;
    let end = Instant::now() + Duration::from_secs(20);
    while relay.log().matches("access worker=").count() < lines && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = relay.log();
    let access: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("access worker="))
        .collect();
    assert_eq!(access.len(), lines, "{log}");
    let one = access
        .iter()
        .find(|l| l.contains("path=/w/abc/fail-after"))
        .unwrap();
    for field in [
        "worker=abc",
        "method=GET",
        "status=aborted",
        "bytes_up=0",
        "bytes_down=1000",
        "duration_ms=",
        "end=worker_abort",
        "peer=127.0.0.1:",
    ] {
        assert!(one.contains(field), "{field} in {one}");
    }
    assert!(!one.contains("?n="), "the query is not logged: {one}");
    assert!(access.iter().any(|l| l.contains("end=stall")), "{log}");
    for secret in [CONNECT_TOKEN, WORKER_TOKEN, "ct-not-a-token-of-this-relay"] {
        assert!(!log.contains(secret), "a token in the relay's log");
        assert!(
            !worker.log().contains(secret),
            "a token in the worker's log"
        );
    }
    // The refusal line carries the peer's address.
    assert!(log.contains("refused a worker from 127.0.0.1:"), "{log}");
}
