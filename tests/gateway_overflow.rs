//! Issue 23, memory defaults: the README's embed, unchanged (a default
//! `Gateway` under `axum::serve`), keeps a slow caller's response in
//! unlinked temporary files, not in RAM, and the caller still gets every
//! byte; the files are gone once the response is.
//!
//! The only test of this binary: it points `TMPDIR` at a fresh directory
//! before anything else runs, so the gateway's files can be told apart.

#[path = "support/slow_caller.rs"]
mod slow_caller;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use std::path::Path;
use std::time::{Duration, Instant};
use worker_relay::connect::{Token, TokenTable};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::tunnel::Tunnel;

const N: u64 = 64 << 20;

/// The pattern's bytes repeat every 251.
const PERIOD: usize = 251;
/// The pieces the worker sends.
const PIECE: usize = 256 << 10;

/// The pattern from offset `at % PERIOD` on, for `PIECE` bytes and a
/// period more: any `len <= PIECE` bytes of it from offset `at` are
/// `&periodic()[at % PERIOD..][..len]`.
fn periodic() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| (0..PIECE + PERIOD).map(|i| (i % PERIOD) as u8).collect())
}

/// The pattern's `len <= PIECE` bytes from offset `at`.
fn pattern_at(at: u64, len: usize) -> &'static [u8] {
    &periodic()[(at % PERIOD as u64) as usize..][..len]
}

/// `n` bytes of a pattern, in 256 KiB pieces.
fn pattern(n: u64) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::iter((0..n).step_by(PIECE).map(move |at| {
        let len = (n - at).min(PIECE as u64) as usize;
        Ok(Bytes::from_static(pattern_at(at, len)))
    }))
}

/// The files this process holds open in `dir`, unlinked, and their bytes.
fn open_in(dir: &Path) -> (usize, u64) {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|t| t.starts_with(dir) && t.to_string_lossy().ends_with(" (deleted)"))
        })
        .map(|e| std::fs::metadata(e.path()).map_or(0, |m| m.len()))
        .fold((0, 0), |(n, b), len| (n + 1, b + len))
}

#[test]
fn a_default_gateway_keeps_a_slow_callers_response_in_temporary_files() {
    let tmp = tempfile::tempdir().unwrap();
    std::env::set_var("TMPDIR", tmp.path());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(slow_caller(tmp.path()));
}

async fn slow_caller(tmp: &Path) {
    // The README's snippet, on a free port.
    let gateway = Gateway::new(TokenTable::parse("abc ct-abc-0123456789").unwrap());
    let app = Router::new()
        .route("/status", get(|| async { "the app's own route" }))
        .route_service("/connect", gateway.connect())
        .route_service("/connect/{id}", gateway.connect())
        .route_service("/w/{*rest}", gateway.forward());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let worker = Router::new().route("/bytes", get(|| async { Body::from_stream(pattern(N)) }));
    let tunnel = Tunnel::new(
        format!("ws://{addr}/connect"),
        Token::new("ct-abc-0123456789").ok(),
    );
    tokio::spawn(tunnel.run(worker));
    slow_caller::connected(&gateway, "abc").await;

    // A caller that takes the head, then reads nothing for a while.
    let resp = slow_caller::head_only(addr, "/w/abc/bytes").await;
    // What the socket buffers do not hold goes to the overflow: on disk.
    let end = Instant::now() + Duration::from_secs(30);
    let mut seen = open_in(tmp);
    while seen.1 < N / 2 {
        assert!(
            Instant::now() < end,
            "no overflow file under {tmp:?} (seen {seen:?}): the response is held elsewhere"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = open_in(tmp);
    }
    assert_eq!(std::fs::read_dir(tmp).unwrap().count(), 0, "unnamed files");

    // Read at last: every byte, in order.
    let mut body = resp.into_body();
    let mut len = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(mut data) = frame.expect("the download completes").into_data() {
            while !data.is_empty() {
                let piece = data.split_to(data.len().min(PIECE));
                assert!(
                    piece[..] == *pattern_at(len, piece.len()),
                    "bytes differ in the {} bytes from {len}",
                    piece.len()
                );
                len += piece.len() as u64;
            }
        }
    }
    assert_eq!(len, N);

    // The files go with the stream.
    let end = Instant::now() + Duration::from_secs(10);
    while open_in(tmp).0 > 0 {
        assert!(Instant::now() < end, "overflow files left open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(std::fs::read_dir(tmp).unwrap().count(), 0);
}
