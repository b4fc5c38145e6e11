//! Issue 39: a worker the authorisation hook let in is known (its callers
//! wait for its reconnect, then 503) until it has been gone for the
//! gateway's forget time, one hour by default; then it is forgotten (404),
//! with what the gateway kept about it. On c0bae95 the hook's workers were
//! remembered for ever: a hook letting in ever new ids grew the gateway
//! without bound.

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use std::time::Duration;
use tower::Service;
use worker_relay::connect::{TokenTable, WorkerId};
use worker_relay::frame::SUBPROTOCOL;
use worker_relay_hyper::gateway::{Gateway, Presented};

/// The upgrade request of a worker presenting `token`.
fn upgrade(token: &str) -> Request<Empty<Bytes>> {
    Request::get("/connect")
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-protocol", SUBPROTOCOL)
        .header("authorization", format!("Bearer {token}"))
        .body(Empty::new())
        .unwrap()
}

async fn status(gateway: &Gateway, worker: &str) -> StatusCode {
    let req = Request::get(format!("/w/{worker}/"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    gateway.forward().call(req).await.unwrap().status()
}

#[tokio::test(start_paused = true)]
async fn the_hooks_workers_are_forgotten_an_hour_after_they_left() {
    let gateway = Gateway::builder(TokenTable::parse("abc ct-abc-000000000000000").unwrap())
        .authorize(|p: Presented| async move {
            let id = p
                .token
                .strip_prefix("db-")
                .and_then(|t| t.strip_suffix("-0123456789"))
                .ok_or(StatusCode::UNAUTHORIZED)?;
            WorkerId::new(id).map_err(|_| StatusCode::UNAUTHORIZED)
        })
        .reconnect_wait(Duration::ZERO)
        .build();
    // The hook lets db1 in; the upgrade itself then fails (this request
    // did not come through a server that upgrades), so db1 is known and
    // not connected.
    let resp = gateway
        .connect()
        .call(upgrade("db-db1-0123456789"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        status(&gateway, "db1").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    tokio::time::advance(Duration::from_secs(3599)).await;
    assert_eq!(
        status(&gateway, "db1").await,
        StatusCode::SERVICE_UNAVAILABLE,
        "still known within the hour"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        status(&gateway, "db1").await,
        StatusCode::NOT_FOUND,
        "forgotten after the hour"
    );
    // The table's workers are the table's: known for as long as it holds
    // them.
    assert_eq!(
        status(&gateway, "abc").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // Let in again: known again.
    gateway
        .connect()
        .call(upgrade("db-db1-0123456789"))
        .await
        .unwrap();
    assert_eq!(
        status(&gateway, "db1").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
}
