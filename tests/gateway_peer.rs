//! The caller's address in the access record, whichever way the gateway is
//! served: `Gateway::service` under `server::serve` is told the peer once
//! per connection (no extension map per request), `Gateway::forward` reads
//! the `PeerAddr` extension the server puts on each request. Both name the
//! caller's own socket address, request after request on one connection.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use worker_relay::connect::TokenTable;
use worker_relay_hyper::gateway::{AccessLog, AccessRecord, Gateway};
use worker_relay_hyper::server::{serve, ServerConfig};

/// A record's peer, status and path.
type Entry = (Option<SocketAddr>, String, String);

/// Sends each record's entry to the test as it is made.
struct Seen(Mutex<tokio::sync::mpsc::UnboundedSender<Entry>>);

impl AccessLog for Seen {
    fn record(&self, r: &AccessRecord<'_>) {
        let entry = (r.peer, r.status.to_owned(), r.path.to_owned());
        let _ = self.0.lock().unwrap().send(entry);
    }
}

fn gateway(seen: &Arc<Seen>) -> Gateway {
    Gateway::builder(TokenTable::parse("abc ct-peer-0123456789abcdef").unwrap())
        .access_log(seen.clone())
        .build()
}

/// Three requests on one kept-alive connection; the caller's address.
async fn three_requests(addr: SocketAddr) -> SocketAddr {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let me = conn.local_addr().unwrap();
    for i in 0..3 {
        let req = format!("GET /w/nobody/{i} HTTP/1.1\r\nhost: x\r\n\r\n");
        conn.write_all(req.as_bytes()).await.unwrap();
        let got = answer(&mut conn).await;
        assert!(
            got.starts_with(b"HTTP/1.1 404"),
            "{}",
            String::from_utf8_lossy(&got)
        );
    }
    me
}

/// One whole answer (head, and a body of its `content-length`).
async fn answer(conn: &mut tokio::net::TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("a refusal with a content-length");
            if got.len() >= end + 4 + len {
                return got;
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(n > 0, "the connection closed");
        got.extend_from_slice(&buf[..n]);
    }
}

/// The next `n` records, each as soon as it is made.
async fn records_of(
    seen: &mut tokio::sync::mpsc::UnboundedReceiver<Entry>,
    n: usize,
) -> Vec<Entry> {
    let mut records = Vec::new();
    for _ in 0..n {
        let entry = tokio::time::timeout(Duration::from_secs(5), seen.recv())
            .await
            .expect("a record in time")
            .expect("the gateway keeps its log");
        records.push(entry);
    }
    records
}

#[tokio::test]
async fn each_record_names_the_callers_address_served_either_way() {
    for whole in [true, false] {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let gateway = gateway(&Arc::new(Seen(Mutex::new(tx))));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = if whole {
            tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()))
        } else {
            tokio::spawn(serve(listener, gateway.forward(), ServerConfig::default()))
        };
        let me = three_requests(addr).await;
        let records = records_of(&mut rx, 3).await;
        assert_eq!(records.len(), 3, "{records:?}");
        for (i, (peer, status, path)) in records.iter().enumerate() {
            assert_eq!(*peer, Some(me), "served whole: {whole}");
            assert_eq!(status, "404");
            assert_eq!(path, &format!("/w/nobody/{i}"));
        }
        server.abort();
    }
}
