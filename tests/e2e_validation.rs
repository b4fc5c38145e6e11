//! What a caller sees when what crosses the relay is invalid (issue 13), over
//! real loopback sockets with the examples' relay: a scripted, hostile worker
//! (a real WebSocket client speaking raw frames), the example worker, and
//! callers that are a real HTTP client or raw TCP.

#[path = "../examples/common/client.rs"]
mod client;
#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use client::request;
use futures_util::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use worker_relay::frame::{
    self, ControlFrame, Decoded, Message, RequestHead, StreamId, SUBPROTOCOL,
};
use worker_relay::proto::RelayConfig;
use worker_relay_hyper::ws::{self, WsSocket};

const LIMIT: Duration = Duration::from_secs(60);

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f)
        .await
        .expect("test took too long")
}

/// What the scripted worker sends for one request.
type Script = fn(StreamId, &RequestHead) -> Vec<Message>;

/// A worker that answers every request with `script`'s messages, and
/// reports every frame the relay sends it.
async fn scripted_worker(
    addr: SocketAddr,
    relay: &worker_relay_hyper::gateway::Gateway,
    script: Script,
) -> mpsc::UnboundedReceiver<Decoded> {
    let mut req = format!("ws://{addr}/connect")
        .into_client_request()
        .unwrap();
    let h = req.headers_mut();
    h.insert(
        "authorization",
        format!("Bearer {CONNECT_TOKEN}").parse().unwrap(),
    );
    h.insert("sec-websocket-protocol", SUBPROTOCOL.parse().unwrap());
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(ws::config()), true)
        .await
        .expect("the relay accepts the worker");
    let mut socket = WsSocket(ws);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = socket.next().await {
            let Some(Ok(d)) = frame::decode(&m) else {
                continue;
            };
            if let Decoded::Control(ControlFrame::Request { id, head }) = &d {
                for out in script(*id, head) {
                    if socket.send(out).await.is_err() {
                        return;
                    }
                }
            }
            let _ = tx.send(d);
        }
    });
    wait_connected(relay, "abc").await;
    rx
}

fn response(id: StreamId, status: u16, headers: &[(&str, &str)]) -> Message {
    let pairs: Vec<String> = headers
        .iter()
        .map(|(n, v)| format!(r#"["{n}","{v}"]"#))
        .collect();
    Message::Text(format!(
        r#"{{"type":"response","id":{id},"status":{status},"headers":[{}]}}"#,
        pairs.join(",")
    ))
}

fn body(id: StreamId, data: &[u8]) -> Message {
    Message::Binary(frame::encode_chunk(id, data))
}

fn end(id: StreamId) -> Message {
    ControlFrame::End { id }.to_message()
}

async fn get_through(script: Script) -> client::Answer {
    let (addr, relay) = relay_only(RelayConfig::default()).await;
    let _frames = scripted_worker(addr, &relay, script).await;
    request(addr, "GET", "/w/abc/x", &[], Bytes::new())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_response_heads_become_502() {
    bounded(async {
        let scripts: [(&str, Script); 6] = [
            ("101", |id, _| {
                vec![
                    response(id, 101, &[("upgrade", "evil")]),
                    body(id, b"raw bytes"),
                    end(id),
                ]
            }),
            ("100", |id, _| vec![response(id, 100, &[]), end(id)]),
            ("999", |id, _| vec![response(id, 999, &[]), end(id)]),
            ("conflicting content-length", |id, _| {
                vec![
                    response(
                        id,
                        200,
                        &[("content-length", "5"), ("content-length", "50")],
                    ),
                    body(id, b"hello"),
                    end(id),
                ]
            }),
            ("invalid content-length", |id, _| {
                vec![
                    response(id, 200, &[("content-length", "5x")]),
                    body(id, b"hello"),
                    end(id),
                ]
            }),
            ("10,000 headers", |id, _| {
                let pairs: Vec<String> =
                    (0..10_000).map(|i| format!(r#"["x-h{i}","v"]"#)).collect();
                vec![
                    Message::Text(format!(
                        r#"{{"type":"response","id":{id},"status":200,"headers":[{}]}}"#,
                        pairs.join(",")
                    )),
                    end(id),
                ]
            }),
        ];
        for (what, script) in scripts {
            let a = get_through(script).await;
            assert_eq!(a.status, 502, "{what}: {a:?}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_breaks_its_content_length_never_completes() {
    bounded(async {
        // Longer than announced: the caller must not get a clean 5-byte reply.
        let a = get_through(|id, _| {
            vec![
                response(id, 200, &[("content-length", "5")]),
                body(id, b"abc"),
                body(id, b"def"),
                end(id),
            ]
        })
        .await;
        assert_eq!(a.status, 200);
        assert!(!a.complete, "longer body: {a:?}");
        assert_eq!(&a.body[..], b"abc", "only what fit arrives");
        // Shorter than announced.
        let a = get_through(|id, _| {
            vec![
                response(id, 200, &[("content-length", "5")]),
                body(id, b"abc"),
                end(id),
            ]
        })
        .await;
        assert!(!a.complete, "shorter body: {a:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_answers_complete_with_the_length_of_the_get() {
    bounded(async {
        let (addr, _relay) = in_process_stack().await;
        let a = auth();
        let h = [("authorization", a.as_str())];
        for target in ["/w/abc/health", "/w/abc/bytes?n=1000"] {
            let get = request(addr, "GET", target, &h, Bytes::new())
                .await
                .unwrap();
            let head = request(addr, "HEAD", target, &h, Bytes::new())
                .await
                .unwrap();
            assert_eq!(head.status, 200, "{target}");
            assert!(head.complete, "HEAD {target} must complete: {head:?}");
            assert!(head.body.is_empty());
            assert_eq!(
                head.headers["content-length"], get.headers["content-length"],
                "{target}"
            );
        }
        // 204 and 304 from a worker carrying a Content-Length: no body expected.
        for status in [204u16, 304] {
            let (addr, relay) = relay_only(RelayConfig::default()).await;
            let script: Script = if status == 204 {
                |id, _| vec![response(id, 204, &[("content-length", "7")]), end(id)]
            } else {
                |id, _| vec![response(id, 304, &[("content-length", "7")]), end(id)]
            };
            let _frames = scripted_worker(addr, &relay, script).await;
            let r = request(addr, "GET", "/w/abc/x", &[], Bytes::new())
                .await
                .unwrap();
            assert_eq!(r.status, status);
            assert!(r.complete, "{status}: {r:?}");
        }
    })
    .await;
}

/// Reads whatever comes back within `wait` (or until the peer closes).
async fn raw(addr: SocketAddr, bytes: &[u8], wait: Duration) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    out.extend_from_slice(&buf[..n]);
                    if out.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

fn status_line(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunked_body_gets_400() {
    bounded(async {
        let (addr, _relay) = in_process_stack().await;
        let req = format!(
            "POST /w/abc/sha256 HTTP/1.1\r\nhost: x\r\nauthorization: {}\r\n\
             transfer-encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
            auth()
        );
        let answer = raw(addr, req.as_bytes(), Duration::from_secs(10)).await;
        assert!(
            status_line(&answer).starts_with("HTTP/1.1 400"),
            "got {answer:?}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_requests_are_refused_by_the_relay() {
    bounded(async {
        let (addr, _relay) = in_process_stack().await;
        let a = auth();
        let cases: Vec<(String, &str)> = vec![
            (
                "CONNECT 127.0.0.1:1 HTTP/1.1\r\nhost: 127.0.0.1:1\r\n\r\n".into(),
                "405",
            ),
            (
                format!("TRACE /w/abc/health HTTP/1.1\r\nhost: x\r\nauthorization: {a}\r\n\r\n"),
                "405",
            ),
            (
                format!(
                    "{} /w/abc/health HTTP/1.1\r\nhost: x\r\n\r\n",
                    "M".repeat(100 << 10)
                ),
                "400",
            ),
            (
                format!(
                    "GET /w/abc/{} HTTP/1.1\r\nhost: x\r\n\r\n",
                    "p".repeat(9 << 10)
                ),
                "414",
            ),
            (
                format!(
                    "GET /w/abc/health HTTP/1.1\r\nhost: x\r\ncookie: {}\r\n\r\n",
                    "c".repeat(64 << 10)
                ),
                "431",
            ),
        ];
        for (req, want) in cases {
            let answer = raw(addr, req.as_bytes(), Duration::from_secs(10)).await;
            let line = status_line(&answer);
            assert!(
                line.starts_with(&format!("HTTP/1.1 {want}")),
                "{}…: got {line:?}",
                &req[..20]
            );
        }
        // The relay still serves the worker.
        let h = [("authorization", a.as_str())];
        let r = request(addr, "GET", "/w/abc/health", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_routes_are_answered_while_the_worker_is_full() {
    bounded(async {
        let config = RelayConfig::builder()
            .max_streams(8)
            .reserved_streams(2)
            .build()
            .unwrap();
        let (addr, relay) = in_process_stack_with(config).await;
        let a = auth();
        let mut sleepers = Vec::new();
        for _ in 0..6 {
            let a = a.clone();
            sleepers.push(tokio::spawn(async move {
                let h = [("authorization", a.as_str())];
                request(addr, "GET", "/w/abc/sleep?ms=4000", &h, Bytes::new()).await
            }));
        }
        // Wait until all six are in flight.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while relay.stats("abc").unwrap().streams_open < 6 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "sleepers not in flight"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let h = [("authorization", a.as_str())];
        let busy = request(addr, "GET", "/w/abc/sleep?ms=1", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(busy.status, 503);
        assert_eq!(busy.headers["retry-after"], "1");
        let health = request(addr, "GET", "/w/abc/health", &h, Bytes::new())
            .await
            .unwrap();
        assert_eq!(health.status, 200, "health answered during the burst");
        let cancel = request(
            addr,
            "POST",
            "/w/abc/v1/executions/b1/cancel",
            &h,
            Bytes::new(),
        )
        .await
        .unwrap();
        assert_eq!(
            cancel.status, 404,
            "the cancel reached the worker (its app has no such route)"
        );
        for s in sleepers {
            assert_eq!(s.await.unwrap().unwrap().status, 200);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_leaving_mid_upload_after_an_early_answer_releases_the_worker_stream() {
    bounded(async {
        let (addr, relay) = relay_only(RelayConfig::default()).await;
        // The worker answers 401 in full at once, and would send its `end`
        // only once the request body is complete (as an app that reads on).
        let mut frames = scripted_worker(addr, &relay, |id, _| {
            vec![
                response(id, 401, &[("content-length", "4")]),
                body(id, b"nope"),
            ]
        })
        .await;
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /w/abc/upload HTTP/1.1\r\nhost: x\r\ncontent-length: 10000000\r\n\r\n")
            .await
            .unwrap();
        s.write_all(&[7u8; 1 << 16]).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("nope") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before the answer: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 401"));
        // The caller goes away with its upload unfinished.
        drop(s);
        // The worker must be told: `abort` for the stream.
        loop {
            let d = tokio::time::timeout(Duration::from_secs(10), frames.recv())
                .await
                .expect("no abort reached the worker")
                .expect("the worker's socket closed");
            if matches!(d, Decoded::Control(ControlFrame::Abort { .. })) {
                break;
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while relay.stats("abc").unwrap().streams_open != 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the relay still holds the stream"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}
