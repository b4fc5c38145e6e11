//! Issue 41, item 3 (each layer records only what it owns): the gauge
//! `worker_relay_overflow_bytes` is the gateway's, kept by the gateway for
//! any overflow store it is given (`GatewayBuilder::overflow`), not by
//! `rt`'s budget. Here a store of the test's own, in memory: the gauge
//! rises while a slow caller's response waits in it and is back at 0 once
//! the caller has read everything.
//!
//! The only test of this binary: it installs the process's metrics
//! recorder.

#[path = "support/slow_caller.rs"]
mod slow_caller;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
use worker_relay::connect::{Token, TokenTable};
use worker_relay::rt::{Overflow, OverflowFile};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::tunnel::Tunnel;

const N: usize = 16 << 20;
const TOKEN: &str = "ct-abc-0123456789";

/// Overflow in memory, with no budget: nothing of `rt` counts its bytes.
struct Memory;

impl Overflow for Memory {
    fn create(&self) -> io::Result<Box<dyn OverflowFile>> {
        Ok(Box::new(MemoryFile(VecDeque::new())))
    }
}

struct MemoryFile(VecDeque<Bytes>);

impl OverflowFile for MemoryFile {
    fn append(&mut self, data: Bytes) -> io::Result<()> {
        self.0.push_back(data);
        Ok(())
    }

    fn read(&mut self, max: usize) -> io::Result<Bytes> {
        let Some(front) = self.0.front_mut() else {
            return Ok(Bytes::new());
        };
        let piece = front.split_to(max.min(front.len()));
        if front.is_empty() {
            self.0.pop_front();
        }
        Ok(piece)
    }
}

/// The gauge's value in the recorder's exposition (0 before any record).
fn overflow_bytes(metrics: &PrometheusHandle) -> f64 {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("worker_relay_overflow_bytes "))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Waits (bounded: 30 s, only a broken gauge reaches it) until `ok` holds
/// for the gauge.
async fn gauge_until(metrics: &PrometheusHandle, what: &str, ok: impl Fn(f64) -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let v = overflow_bytes(metrics);
        if ok(v) {
            return;
        }
        assert!(Instant::now() < end, "the gauge is {v}, not {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_counts_the_bytes_any_store_it_is_given_holds() {
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this process");
    let gateway = Gateway::builder(TokenTable::parse(&format!("abc {TOKEN}")).unwrap())
        .overflow(Arc::new(Memory))
        .build();
    let app = Router::new()
        .route_service("/connect", gateway.connect())
        .route_service("/w/{*rest}", gateway.forward());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let worker = Router::new().route(
        "/bytes",
        get(|| async { Body::from(Bytes::from(vec![7u8; N])) }),
    );
    tokio::spawn(Tunnel::new(format!("ws://{addr}/connect"), Token::new(TOKEN).ok()).run(worker));
    slow_caller::connected(&gateway, "abc").await;

    // A caller that takes the head, then reads nothing: what the socket
    // buffers do not hold waits in the store, and the gauge says how much.
    let resp = slow_caller::head_only(addr, "/w/abc/bytes").await;
    gauge_until(&metrics, "above 1 MiB", |v| v > (1 << 20) as f64).await;
    assert!(overflow_bytes(&metrics) <= N as f64);

    // Read at last: every byte, and the store gives back what it held.
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), N);
    assert!(body.iter().all(|&b| b == 7));
    gauge_until(&metrics, "0", |v| v == 0.0).await;
}
