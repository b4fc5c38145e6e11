//! Issue 23: the gateway forgets a worker's connection the moment it starts
//! closing, not when its close is done (which a worker that stopped reading
//! draws out to the close deadline): callers get 503 (not 502), presence
//! news says the worker left, and under `DuplicatePolicy::Refuse` the
//! worker gets back in at once.

#[path = "gateway_close/support.rs"]
mod support;

use futures_util::SinkExt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::{backed_up, connected, frozen_worker, upload};
use tokio_tungstenite::tungstenite;
use worker_relay::connect::{Token, TokenTable, WorkerHandshake, WorkerId};
use worker_relay::proto::{RelayConfig, WorkerConfig};
use worker_relay::rt;
use worker_relay_hyper::gateway::{DuplicatePolicy, Gateway, Presence};
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::ws;
use worker_relay_hyper::TokioTimer;

#[path = "../examples/common/client.rs"]
mod client;

const TOKEN: &str = "ct-abc-0123456789abcdef";

/// A gateway whose connections take 30 s to give up a close: long enough
/// that anything waiting for the close to finish shows.
async fn relay(policy: DuplicatePolicy) -> (SocketAddr, Gateway) {
    let config = RelayConfig::builder()
        .close_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let gateway = Gateway::builder(TokenTable::parse(&format!("abc {TOKEN}\n")).unwrap())
        .relay_config(config)
        .duplicates(policy)
        // A caller for a worker that is not connected is answered 503 at
        // once, without waiting (10 s by default) for it to come back.
        .reconnect_wait(Duration::ZERO)
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    (addr, gateway)
}

async fn next(rx: &mut tokio::sync::broadcast::Receiver<Presence>) -> Presence {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("presence news within 10 s")
        .expect("no lag")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_connection_leaves_the_registry_at_once() {
    let (addr, gateway) = relay(DuplicatePolicy::Refuse).await;
    let mut news = gateway.subscribe();
    let mut frozen = frozen_worker(addr, TOKEN).await;
    connected(&gateway, "abc").await;
    let abc = WorkerId::new("abc").unwrap();
    assert_eq!(
        next(&mut news).await,
        Presence::Connected {
            worker: abc.clone()
        }
    );

    // The relay's writes to the worker are stuck; then the worker sends a
    // message over 1 MiB + 4 bytes: the relay closes with 1009, a close it
    // cannot flush.
    let caller = upload(addr, "abc", 8);
    backed_up(&gateway, "abc", 1 << 20).await;
    let big = tungstenite::Message::Binary(vec![0u8; 2 << 20].into());
    frozen.send(big).await.unwrap();

    match next(&mut news).await {
        Presence::Disconnected { worker, reason } => {
            assert_eq!(worker, abc);
            assert!(reason.contains("over 1 MiB"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!gateway.is_connected("abc"));
    // A caller is told the worker is not connected (503, come back soon),
    // not that it failed (502).
    let a = client::request(addr, "GET", "/w/abc/health", &[], Default::default())
        .await
        .unwrap();
    assert_eq!(a.status, 503, "{:?}", a.body);

    // The worker reconnects and is let in, the old close still pending.
    let url = format!("ws://{addr}/connect");
    let hs = WorkerHandshake::new(Token::new(TOKEN).ok());
    let socket = ws::dial(&url, &hs, Duration::from_secs(5))
        .await
        .expect("a closing connection must not refuse its worker");
    let (_incoming, driver) = rt::worker(socket, TokioTimer, WorkerConfig::default());
    tokio::spawn(driver);
    assert_eq!(next(&mut news).await, Presence::Connected { worker: abc });
    let end = Instant::now() + Duration::from_secs(5);
    while !gateway.is_connected("abc") {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    caller.abort();
    drop(frozen);
}
