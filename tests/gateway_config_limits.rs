//! Issue 39: configuration never panics. On c0bae95 a reconnect wait of
//! `Duration::MAX` panicked in every request for a worker that is not
//! connected (`Instant + Duration` overflowed), a drain with a grace of
//! `Duration::MAX` panicked, a flap window of `Duration::MAX` panicked at
//! the first handshake of a damped worker, and a presence capacity of
//! `usize::MAX` panicked when the gateway was built. Each now saturates:
//! "for ever", or the largest capacity.

#[path = "common/mem.rs"]
#[allow(dead_code)]
mod mem;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use std::time::Duration;
use tower::Service;
use worker_relay::connect::{TokenTable, WorkerId};
use worker_relay::frame::{CloseCode, SUBPROTOCOL};
use worker_relay_hyper::gateway::{Gateway, Presence};

const ABC: &str = "ct-abc-000000000000000";

fn table() -> TokenTable {
    TokenTable::parse(&format!("abc {ABC}")).unwrap()
}

/// A request waits "for ever" for its worker, and a drain with an endless
/// grace releases it at once (no worker to wait for): 503.
#[tokio::test(start_paused = true)]
async fn an_endless_reconnect_wait_and_drain_grace_do_not_panic() {
    let gateway = Gateway::builder(table())
        .reconnect_wait(Duration::MAX)
        .build();
    let mut forward = gateway.forward();
    let req = Request::get("/w/abc/").body(Empty::<Bytes>::new()).unwrap();
    let waiting = tokio::spawn(async move { forward.call(req).await });
    // A day of paused time: still waiting, not panicked.
    tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
    assert!(!waiting.is_finished(), "{:?}", waiting.await);
    tokio::time::timeout(
        Duration::from_secs(10),
        gateway.drain(Duration::MAX, CloseCode::SERVICE_RESTART),
    )
    .await
    .expect("a drain without workers ends at once");
    let resp = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the drain releases the waiting request")
        .expect("no panic")
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn a_huge_presence_capacity_is_the_largest_one() {
    let gateway = Gateway::builder(table())
        .presence_capacity(usize::MAX)
        .build();
    let mut news = gateway.subscribe();
    assert!(news.try_recv().is_err(), "no news yet");
}

/// One replacement within an endless window damps the worker: its next
/// handshake is answered 429 with a `Retry-After`, not a panic.
#[tokio::test]
async fn an_endless_flap_window_damps_without_panicking() {
    let gateway = Gateway::builder(table())
        .flap_damping(Some((1, Duration::MAX)))
        .build();
    let mut news = gateway.subscribe();
    let mut keep = Vec::new();
    for _ in 0..2 {
        let (relay_side, worker_side) = mem::socket_pair();
        let g = gateway.clone();
        tokio::spawn(async move {
            let _ = g.attach(WorkerId::new("abc").unwrap(), relay_side).await;
        });
        keep.push(worker_side);
        let connected = tokio::time::timeout(Duration::from_secs(10), news.recv())
            .await
            .expect("abc connects")
            .unwrap();
        assert!(
            matches!(connected, Presence::Connected { .. }),
            "{connected:?}"
        );
    }
    // The second connection replaced the first.
    let req = Request::get("/connect")
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", SUBPROTOCOL)
        .header("authorization", format!("Bearer {ABC}"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = gateway.connect().call(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 365 * 24 * 3600, "{retry} s");
}
