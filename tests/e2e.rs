//! End to end, over real loopback sockets, with the examples' stacks: the
//! relay and worker code of `examples/` and a real HTTP client (hyper).

#[path = "../examples/common/client.rs"]
mod client;
#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use client::request;
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};
use support::*;

const LIMIT: Duration = Duration::from_secs(120);

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("test took too long")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_through_relay_and_worker() {
    bounded(async {
        // A short reconnect wait: `/w/idle/…` below (a known worker that
        // is not connected) is answered 503 once it has passed.
        let (addr, _relay) = in_process_stack_waiting(Duration::from_millis(200)).await;
        let a = auth();
        let h = [("authorization", a.as_str())];

        let r = request(addr, "GET", "/w/abc/health", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &br#"{"status":"ok"}"#[..]));
        assert_eq!(r.headers["content-type"], "application/json");

        let r = request(
            addr,
            "POST",
            "/w/abc/echo",
            &[h[0], ("content-type", "text/x-test")],
            Bytes::from_static(b"hello"),
        )
        .await
        .unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"hello"[..]));
        assert_eq!(r.headers["content-type"], "text/x-test");

        let body = pattern(3 << 20);
        let r = request(addr, "POST", "/w/abc/sha256", &h, body.clone())
            .await
            .unwrap();
        let want: String = Sha256::digest(&body)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&r.body),
            format!("{want} {}", body.len())
        );
        assert_eq!(r.headers["content-type"], "text/plain");

        let r = request(addr, "GET", "/w/abc/bytes?n=1000", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.headers["content-length"], "1000");
        assert_eq!(r.body, pattern(1000));

        let t = Instant::now();
        let r = request(addr, "GET", "/w/abc/sleep?ms=300", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert!(t.elapsed() >= Duration::from_millis(300));

        let r = request(addr, "GET", "/w/abc/fail-before", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(
            (r.status, &r.body[..]),
            (500, &b"Internal Server Error"[..])
        );

        let r = request(addr, "GET", "/w/abc/fail-after?n=1234", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert!(
            !r.complete,
            "a response failed after it started must not complete"
        );
        assert_eq!(
            r.body.len(),
            1234,
            "the bytes sent before the failure arrive"
        );

        let t = Instant::now();
        let r = request(
            addr,
            "POST",
            "/w/abc/slow-sink?mibps=8",
            &h,
            pattern(2 << 20),
        )
        .await
        .unwrap();
        assert_eq!((r.status, &r.body[..]), (200, &b"2097152"[..]));
        assert!(t.elapsed() >= Duration::from_millis(200), "read at 8 MiB/s");

        let r = request(addr, "GET", "/w/abc/nope", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 404);

        // Relay-level answers.
        let r = request(addr, "GET", "/w/zzz/health", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 404, "unknown worker id");
        let r = request(addr, "GET", "/w/idle/health", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 503, "known worker, not connected");
        let r = request(addr, "GET", "/w/abc/../idle/health", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 400, "dot segments are refused");
        let r = request(addr, "GET", "/elsewhere", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 404);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_sizes_both_ways() {
    bounded(async {
        let (addr, _relay) = in_process_stack().await;
        let a = auth();
        let h = [("authorization", a.as_str())];
        for n in [0usize, 1 << 20, (1 << 20) + 1, 64 << 20] {
            let body = pattern(n);
            let r = request(addr, "POST", "/w/abc/echo", &h, body.clone())
                .await
                .unwrap();
            assert_eq!(r.status, 200, "echo {n}");
            assert!(r.complete);
            assert_eq!(r.body.len(), n, "echo {n}");
            assert!(r.body == body, "echo {n} differs");
            let r = request(
                addr,
                "GET",
                &format!("/w/abc/bytes?n={n}"),
                &h,
                Bytes::new(),
            )
            .await
            .unwrap();
            assert_eq!(r.body.len(), n, "bytes {n}");
            assert!(r.body == body, "bytes {n} differs");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_requests() {
    bounded(async {
        let (addr, _relay) = in_process_stack().await;
        let mut tasks = Vec::new();
        for i in 0..50usize {
            tasks.push(tokio::spawn(async move {
                let a = auth();
                let body = pattern(1000 + i * 997);
                let r = request(
                    addr,
                    "POST",
                    "/w/abc/echo",
                    &[("authorization", a.as_str())],
                    body.clone(),
                )
                .await
                .unwrap();
                assert_eq!(r.status, 200);
                assert!(r.body == body, "request {i} got another's body");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_worker_token_is_401_without_reading_the_body() {
    bounded(async {
        let (addr, _relay) = in_process_stack().await;
        let r = request(addr, "GET", "/w/abc/health", &[], Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 401);
        // The worker answers before it reads the body; the relay discards
        // the rest, so the caller, still writing, reads its 401 rather
        // than a reset (without the discarding: EPIPE in about one try of
        // three).
        let body = pattern(8 << 20);
        for _ in 0..10 {
            let r = request(
                addr,
                "POST",
                "/w/abc/echo",
                &[("authorization", "Bearer wrong")],
                body.clone(),
            )
            .await
            .unwrap();
            assert_eq!(r.status, 401);
        }
        // The connection still serves.
        let a = auth();
        let r = request(
            addr,
            "GET",
            "/w/abc/health",
            &[("authorization", a.as_str())],
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200);
    })
    .await;
}

/// Real processes from here on: the relay and worker examples themselves.
#[test]
fn caller_disconnect_reaches_the_worker_as_abort() {
    let (_relay, port) = relay_process();
    let worker = worker_process(port, CONNECT_TOKEN);
    assert!(
        worker.wait_log("connected to", Duration::from_secs(20)),
        "{}",
        worker.log()
    );
    // Send a request by hand and hang up before the answer.
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET /w/abc/sleep?ms=20000 HTTP/1.1\r\nhost: x\r\nauthorization: {}\r\n\r\n",
        auth()
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    drop(s);
    assert!(
        worker.wait_log("the client has gone", Duration::from_secs(10)),
        "abort did not reach the worker app: {}",
        worker.log()
    );
}

#[test]
fn worker_killed_mid_request_is_502() {
    let (_relay, port) = relay_process();
    let mut worker = worker_process(port, CONNECT_TOKEN);
    assert!(
        worker.wait_log("connected to", Duration::from_secs(20)),
        "{}",
        worker.log()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let answer = rt.block_on(async {
        let a = auth();
        let req = tokio::spawn(async move {
            request(
                addr,
                "GET",
                "/w/abc/sleep?ms=20000",
                &[("authorization", a.as_str())],
                Bytes::new(),
            )
            .await
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        worker.kill();
        tokio::time::timeout(Duration::from_secs(30), req)
            .await
            .expect("no answer")
            .unwrap()
            .unwrap()
    });
    assert_eq!(answer.status, 502);
}

#[test]
fn relay_restarted_worker_reconnects_and_serves_again() {
    let (mut relay, port) = relay_process();
    let worker = worker_process(port, CONNECT_TOKEN);
    assert!(
        worker.wait_log("connected to", Duration::from_secs(20)),
        "{}",
        worker.log()
    );
    relay.kill();
    assert!(
        worker.wait_log("reconnecting in", Duration::from_secs(10)),
        "{}",
        worker.log()
    );
    let (_relay, _) = relay_process_on(port, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let status = rt.block_on(async {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let a = auth();
            let r = request(
                addr,
                "GET",
                "/w/abc/health",
                &[("authorization", a.as_str())],
                Bytes::new(),
            )
            .await;
            if let Ok(r) = &r {
                if r.status == 200 {
                    return 200;
                }
            }
            assert!(
                Instant::now() < end,
                "worker did not come back: {}",
                worker.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    assert_eq!(status, 200);
}

#[test]
fn wrong_connect_token_makes_the_worker_exit_1() {
    let (relay, port) = relay_process();
    let mut worker = worker_process(port, "ct-not-the-right-token");
    assert_eq!(
        worker.wait_exit(Duration::from_secs(30)),
        Some(1),
        "{}",
        worker.log()
    );
    // The exit can come before the reader thread has the last lines.
    assert!(
        worker.wait_log("401", Duration::from_secs(5)),
        "{}",
        worker.log()
    );
    assert!(relay.wait_log("refused a worker", Duration::from_secs(5)));
    // Neither process ever prints a token.
    for log in [relay.log(), worker.log()] {
        assert!(
            !log.contains("ct-not-the-right-token")
                && !log.contains(CONNECT_TOKEN)
                && !log.contains(WORKER_TOKEN),
            "{log}"
        );
    }
}

#[test]
fn worker_wipes_its_tokens_from_its_environment() {
    let (_relay, port) = relay_process();
    let worker = worker_process(port, CONNECT_TOKEN);
    assert!(
        worker.wait_log("connected to", Duration::from_secs(20)),
        "{}",
        worker.log()
    );
    let environ = std::fs::read(format!("/proc/{}/environ", worker.child.id())).unwrap();
    let has = |needle: &str| {
        environ
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    };
    assert!(
        !has(CONNECT_TOKEN),
        "connect token readable in /proc/<pid>/environ"
    );
    assert!(
        !has(WORKER_TOKEN),
        "worker token readable in /proc/<pid>/environ"
    );
    // And it never went on the command line.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", worker.child.id())).unwrap();
    assert!(!cmdline
        .windows(10)
        .any(|w| w == &CONNECT_TOKEN.as_bytes()[..10]));
}

#[test]
fn a_new_connection_with_the_same_token_replaces_the_old() {
    let (relay, port) = relay_process();
    let first = worker_process(port, CONNECT_TOKEN);
    assert!(
        first.wait_log("connected to", Duration::from_secs(20)),
        "{}",
        first.log()
    );
    let second = worker_process(port, CONNECT_TOKEN);
    assert!(
        second.wait_log("connected to", Duration::from_secs(20)),
        "{}",
        second.log()
    );
    assert!(
        relay.wait_log(
            "worker abc reconnected; its previous connection finishes",
            Duration::from_secs(10)
        ),
        "{}",
        relay.log()
    );
    // The old one, idle, is closed at once, says why, and the worker
    // waits its longest backoff rather than take the worker back.
    assert!(
        first.wait_log("replaced by a new connection", Duration::from_secs(10)),
        "{}",
        first.log()
    );
    assert!(
        first.wait_log("waiting the longest backoff", Duration::from_secs(5)),
        "{}",
        first.log()
    );
    assert!(
        relay.wait_log(
            "worker abc: its replaced connection ended",
            Duration::from_secs(5)
        ),
        "{}",
        relay.log()
    );
    assert!(
        !relay.log().contains("worker abc disconnected"),
        "{}",
        relay.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_handshake_refusals() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    bounded(async {
        let (addr, _relay) = in_process_stack().await;
        let status_of = |extra: String| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let req = format!(
                "GET /connect HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\
                 sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n{extra}\r\n"
            );
            s.write_all(req.as_bytes()).await.unwrap();
            let mut buf = vec![0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            text.split_whitespace().nth(1).unwrap_or("").to_owned()
        };
        let auth = format!("authorization: Bearer {CONNECT_TOKEN}\r\n");
        let proto = "sec-websocket-protocol: strata-worker-connect.v1\r\n";
        assert_eq!(status_of(auth.clone()).await, "400", "subprotocol not offered");
        assert_eq!(status_of(proto.to_string()).await, "401", "no token");
        assert_eq!(
            status_of(format!("{proto}authorization: Bearer nope\r\n")).await,
            "401",
            "unknown token"
        );
        assert_eq!(
            status_of(format!("sec-websocket-protocol: other, strata-worker-connect.v1\r\n{auth}")).await,
            "101",
            "offered among others, with the right token"
        );
    })
    .await;
}
