//! Issue 44: a host that accepts WebSockets its own way (not through
//! hyper's upgrades) asks the gateway to decide a worker's handshake
//! (`Gateway::admit`: every rule of `Gateway::connect` but the WebSocket
//! handshake itself) and hands it the accepted socket
//! (`Admission::serve`). Here the "host" is an in-memory socket pair: no
//! hyper server, no TCP; callers still reach the worker through
//! `gateway.forward()`.

mod common;

use bytes::Bytes;
use common::mem::{socket_pair, MemSocket};
use futures::{SinkExt, StreamExt};
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use std::time::Duration;
use tower::ServiceExt;
use worker_relay::connect::{Token, TokenTable, WorkerHandshake};
use worker_relay::frame::{CloseCode, Headers, ResponseHead};
use worker_relay::proto::WorkerConfig;
use worker_relay::rt;
use worker_relay_hyper::gateway::{DuplicatePolicy, Gateway, Presence};
use worker_relay_hyper::TokioTimer;

const TOKENS: &str = "abc ct-abc-0000000000\nxyz ct-xyz-0000000000";

fn headers(token: &str) -> http::HeaderMap {
    WorkerHandshake::new(Token::new(token).ok())
        .request_headers()
        .to_header_map()
}

/// A worker on `socket` that answers every request 200 with its path.
fn serve_worker(socket: MemSocket) {
    let (mut incoming, driver) = rt::worker(socket, TokioTimer, WorkerConfig::default());
    tokio::spawn(driver);
    tokio::spawn(async move {
        while let Some(req) = incoming.next().await {
            let path = req.head.path().to_owned();
            let head = ResponseHead::new(200, Headers::new()).unwrap();
            let mut body = req.responder.respond(head).unwrap();
            let _ = body.send(Bytes::from(format!("hello from {path}"))).await;
            let _ = body.close().await;
        }
    });
}

async fn connected(news: &mut tokio::sync::broadcast::Receiver<Presence>, id: &str) {
    let wait = async {
        loop {
            if let Ok(Presence::Connected { worker }) = news.recv().await {
                if worker.as_str() == id {
                    return;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the worker was registered");
}

async fn get(gateway: &Gateway, uri: &str) -> (StatusCode, String) {
    let req = Request::get(uri).body(Full::new(Bytes::new())).unwrap();
    let resp = gateway.forward().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn an_admitted_socket_serves_callers_without_hyper_upgrades() {
    let gateway = Gateway::new(TokenTable::parse(TOKENS).unwrap());
    let mut news = gateway.subscribe();
    let admission = gateway
        .admit("/connect", &headers("ct-abc-0000000000"), None)
        .await
        .expect("abc's token is in the table");
    assert_eq!(admission.worker().as_str(), "abc");
    let (relay_end, worker_end) = socket_pair();
    let served = tokio::spawn(admission.serve(relay_end));
    serve_worker(worker_end);
    connected(&mut news, "abc").await;
    assert_eq!(
        get(&gateway, "/w/abc/health").await,
        (StatusCode::OK, "hello from /health".into())
    );
    // Drained as any connection: closed with 1012, and `serve` returns.
    gateway
        .drain(Duration::from_secs(1), CloseCode::SERVICE_RESTART)
        .await;
    let ended = tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("serve returned after the drain")
        .unwrap();
    assert!(ended.is_ok(), "{ended:?}");
}

#[tokio::test]
async fn refusals_are_the_answers_connect_gives() {
    let gateway = Gateway::builder(TokenTable::parse(TOKENS).unwrap())
        .duplicates(DuplicatePolicy::Refuse)
        .build();

    // An unknown token: 401 with `WWW-Authenticate: Bearer`.
    let refused = gateway
        .admit("/connect", &headers("ct-nobody-000000000"), None)
        .await
        .unwrap_err();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(refused.headers()[header::WWW_AUTHENTICATE], "Bearer");

    // Another worker's token at `/connect/<id>`: 401.
    let refused = gateway
        .admit("/connect/xyz", &headers("ct-abc-0000000000"), None)
        .await
        .unwrap_err();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    // The worker's own: admitted.
    let admission = gateway
        .admit("/connect/abc", &headers("ct-abc-0000000000"), None)
        .await
        .unwrap();

    // No subprotocol offered: 400.
    let mut bare = headers("ct-abc-0000000000");
    bare.remove(header::SEC_WEBSOCKET_PROTOCOL);
    let refused = gateway.admit("/connect", &bare, None).await.unwrap_err();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);

    // Connected, under `Refuse`: a second handshake is refused 503.
    let mut news = gateway.subscribe();
    let (relay_end, worker_end) = socket_pair();
    tokio::spawn(admission.serve(relay_end));
    serve_worker(worker_end);
    connected(&mut news, "abc").await;
    let refused = gateway
        .admit("/connect", &headers("ct-abc-0000000000"), None)
        .await
        .unwrap_err();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()[header::RETRY_AFTER], "1");

    // Draining: 503 for everyone.
    gateway
        .drain(Duration::from_secs(1), CloseCode::SERVICE_RESTART)
        .await;
    let refused = gateway
        .admit("/connect", &headers("ct-xyz-0000000000"), None)
        .await
        .unwrap_err();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
}
