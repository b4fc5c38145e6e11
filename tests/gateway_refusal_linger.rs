//! Issue 39: the relay's own refusals (404 for an unknown worker, 503 for
//! one not connected or a draining relay) read and discard the caller's
//! body, as the answers a worker gives already do. A caller that writes
//! its whole body before it reads (Python's `http.client`, many SDKs) got
//! a reset (`EPIPE`) instead of its answer on c0bae95: the gateway dropped
//! the body unread and hyper closed the connection under the caller's
//! writes.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use worker_relay::connect::TokenTable;
use worker_relay::frame::CloseCode;
use worker_relay_hyper::gateway::{Gateway, GatewayBuilder};
use worker_relay_hyper::server::{serve, ServerConfig};

/// 64 MiB: far more than the sockets' buffers hold, so the caller's writes
/// block until the relay reads.
const BODY: usize = 64 << 20;
const TRIES: usize = 5;

fn builder() -> GatewayBuilder {
    // `abc` is known, never connected: its callers wait 100 ms, then 503.
    Gateway::builder(TokenTable::parse("abc ct-abc-0000000000").unwrap())
        .reconnect_wait(Duration::from_millis(100))
}

async fn relay(gateway: &Gateway) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    addr
}

/// A caller that writes its whole request, 64 MiB of body, before it
/// reads anything, as `http.client` does: the answer's head, or how the
/// exchange failed.
async fn write_all_then_read(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: relay.test\r\nContent-Length: {BODY}\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    );
    tcp.write_all(head.as_bytes())
        .await
        .map_err(|e| format!("writing the head: {e}"))?;
    let chunk = vec![b'x'; 256 << 10];
    for i in 0..BODY / chunk.len() {
        tcp.write_all(&chunk)
            .await
            .map_err(|e| format!("writing the body, chunk {i}: {e}"))?;
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tcp
            .read(&mut buf)
            .await
            .map_err(|e| format!("reading the answer: {e}"))?;
        if n == 0 {
            return Err(format!(
                "the connection ended before the answer's head: {:?}",
                String::from_utf8_lossy(&got)
            ));
        }
        got.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// Each of `TRIES` callers writing 64 MiB, then reading, gets an answer
/// whose status line starts with `status`, with `Retry-After` if `retry`.
async fn every_time(addr: SocketAddr, path: &str, status: &str, retry: bool) {
    let mut failures = Vec::new();
    for i in 0..TRIES {
        // Generous: 64 MiB over loopback takes well under a second, even
        // in a debug build on a loaded machine.
        let got = tokio::time::timeout(Duration::from_secs(60), write_all_then_read(addr, path))
            .await
            .unwrap_or_else(|_| Err("no answer within 60 s".into()));
        match got {
            Ok(head) => {
                assert!(
                    head.starts_with(&format!("HTTP/1.1 {status}")),
                    "try {i}: {head}"
                );
                let has_retry = head.to_ascii_lowercase().contains("\r\nretry-after: 1\r\n");
                assert_eq!(has_retry, retry, "try {i}: {head}");
            }
            Err(e) => failures.push(format!("try {i}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{path}: {} of {TRIES} callers got no {status}: {failures:?}",
        failures.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_worker_is_a_404_to_a_caller_that_writes_before_it_reads() {
    let gateway = builder().build();
    let addr = relay(&gateway).await;
    every_time(addr, "/w/nobody/upload", "404", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_not_connected_is_a_503_to_a_caller_that_writes_before_it_reads() {
    let gateway = builder().build();
    let addr = relay(&gateway).await;
    every_time(addr, "/w/abc/upload", "503", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_relay_is_a_503_to_a_caller_that_writes_before_it_reads() {
    let gateway = builder().build();
    let addr = relay(&gateway).await;
    // No worker: the drain is over at once, and the relay still serves.
    tokio::time::timeout(
        Duration::from_secs(10),
        gateway.drain(Duration::from_secs(1), CloseCode::SERVICE_RESTART),
    )
    .await
    .expect("a drain without workers ends at once");
    every_time(addr, "/w/abc/upload", "503", true).await;
}

/// The discarding is bounded in bytes: a body that says it is longer than
/// `lingering_bytes` is not read (the relay lets the connection go), and
/// one within it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_longer_than_the_lingering_bytes_is_not_read() {
    let gateway = builder().lingering_bytes(1 << 20).build();
    let addr = relay(&gateway).await;
    let got = tokio::time::timeout(
        Duration::from_secs(60),
        write_all_then_read(addr, "/w/nobody/upload"),
    )
    .await
    .expect("an answer or a failure within 60 s");
    assert!(got.is_err(), "64 MiB past a 1 MiB bound was read: {got:?}");
}
