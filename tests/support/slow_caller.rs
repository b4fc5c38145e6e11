//! A slow caller for the gateway's overflow tests: a GET whose head it
//! takes and whose body it leaves unread until the test reads it.
#![allow(dead_code)]

use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::Duration;
use worker_relay_hyper::gateway::Gateway;

/// Waits (bounded: 20 s) until worker `id` is connected to `gateway`: on
/// the gateway's presence news, not a polling clock.
pub async fn connected(gateway: &Gateway, id: &str) {
    // Subscribed before the check, so a connection in between is not missed.
    let mut news = gateway.subscribe();
    let wait = async {
        while !gateway.is_connected(id) {
            let _ = news.recv().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .unwrap_or_else(|_| panic!("worker {id} did not connect"));
}

/// `GET path` from `addr` over HTTP/1.1: the response once its head is in
/// (asserted 200); its body is read by no one until the caller does.
pub async fn head_only(addr: SocketAddr, path: &str) -> hyper::Response<Incoming> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", "x")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    resp
}
