//! Workers that stop reading, and callers that keep them busy: what the
//! close-deadline tests of the gateway need.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::WebSocketStream;
use worker_relay::frame::SUBPROTOCOL;
use worker_relay_hyper::gateway::Gateway;

/// Dials `/connect` as the worker whose token is `token`, with a small
/// receive buffer, and hands back the socket unread: a worker that stops
/// reading (the relay's writes to it back up at once).
pub async fn frozen_worker(addr: SocketAddr, token: &str) -> WebSocketStream<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let mut req = format!("ws://{addr}/connect")
        .into_client_request()
        .unwrap();
    let h = req.headers_mut();
    h.insert("authorization", format!("Bearer {token}").parse().unwrap());
    h.insert("sec-websocket-protocol", SUBPROTOCOL.parse().unwrap());
    let (ws, resp) = tokio_tungstenite::client_async(req, stream).await.unwrap();
    assert_eq!(resp.status(), 101);
    ws
}

/// A caller uploading `mib` MiB to `/w/<worker>/sink`, as fast as the relay
/// takes it (on its own task; abort it to hang up).
pub fn upload(addr: SocketAddr, worker: &str, mib: usize) -> tokio::task::JoinHandle<()> {
    let head = format!(
        "POST /w/{worker}/sink HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\n\r\n",
        mib << 20
    );
    tokio::spawn(async move {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            return;
        };
        if s.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let piece = vec![b'u'; 64 << 10];
        for _ in 0..(mib << 4) {
            if s.write_all(&piece).await.is_err() {
                return;
            }
        }
        // Hold the connection until aborted.
        futures_util::future::pending::<()>().await;
    })
}

/// Waits (at most 10 s) until the relay holds at least `bytes` of request
/// body it cannot hand to `worker`'s connection: its writes are stuck.
pub async fn backed_up(gateway: &Gateway, worker: &str, bytes: u64) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let queued = gateway.stats(worker).map_or(0, |s| s.body_queued_out);
        if queued >= bytes {
            return;
        }
        assert!(
            Instant::now() < end,
            "the relay's output to {worker} never backed up ({queued} bytes queued)"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (at most 10 s) until `worker` is registered.
pub async fn connected(gateway: &Gateway, worker: &str) {
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected(worker) {
        assert!(Instant::now() < end, "{worker} did not connect");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The sockets this process has open.
pub fn open_sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.to_string_lossy().starts_with("socket:"))
        .count()
}
