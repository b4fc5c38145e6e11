//! Issue 25: the asynchronous authorisation hook, for workers that live in
//! a database rather than in the token table.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower::Service;
use worker_relay::connect::{
    Refused, RetryReason, Token, TokenTable, Verdict, WorkerHandshake, WorkerId,
};
use worker_relay_hyper::gateway::{Gateway, Presented};
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody};
use worker_relay_hyper::ws;

const TABLE_TOKEN: &str = "ct-abc-000000000000";
/// The "database": `db-token-<id>-...` is worker `<id>`'s token; `slow`
/// takes a second to look up.
const DB1: &str = "db-token-db1-0123456789";
const SLOW: &str = "db-token-slow-0123456789";

struct Hook {
    calls: AtomicUsize,
    seen: Mutex<Vec<Presented>>,
}

async fn relay() -> (SocketAddr, Gateway, Arc<Hook>) {
    let hook = Arc::new(Hook {
        calls: AtomicUsize::new(0),
        seen: Mutex::new(Vec::new()),
    });
    let h = hook.clone();
    let gateway = Gateway::builder(TokenTable::parse(&format!("abc {TABLE_TOKEN}")).unwrap())
        .authorize(move |p: Presented| {
            let h = h.clone();
            async move {
                h.calls.fetch_add(1, Ordering::SeqCst);
                h.seen.lock().unwrap().push(p.clone());
                // A database round trip.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let id = p
                    .token
                    .strip_prefix("db-token-")
                    .and_then(|rest| rest.split_once('-'))
                    .map(|(id, _)| id.to_owned())
                    .ok_or(StatusCode::UNAUTHORIZED)?;
                if id == "slow" {
                    // Far past the 300 ms time limit (and the test's dial).
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                if id == "banned" {
                    return Err(StatusCode::FORBIDDEN);
                }
                WorkerId::new(id).map_err(|_| StatusCode::UNAUTHORIZED)
            }
        })
        .authorize_timeout(Duration::from_millis(300))
        .reconnect_wait(Duration::from_millis(300))
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    (addr, gateway, hook)
}

async fn dial(addr: SocketAddr, path: &str, token: &str) -> Result<(), Verdict> {
    let handshake = WorkerHandshake::new(Some(Token::new(token).unwrap()));
    let url = format!("ws://{addr}{path}");
    ws::dial(&url, &handshake, Duration::from_secs(5))
        .await
        .map(drop)
        .map_err(|e| e.into_verdict())
}

async fn status(gateway: &Gateway, worker: &str) -> (u16, Bytes) {
    use http_body_util::BodyExt;
    let req = Request::get(format!("/w/{worker}/"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), gateway.forward().call(req))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_lets_in_workers_the_table_does_not_hold() {
    let (addr, gateway, hook) = relay().await;
    let app = tower::service_fn(|_req: Request<TunnelBody>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("db1 here"))))
    });
    let tunnel = Tunnel::new(format!("ws://{addr}/connect"), Token::new(DB1).ok());
    let task = tokio::spawn(tunnel.run(app));
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected("db1") {
        assert!(Instant::now() < end, "db1 never connected");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        status(&gateway, "db1").await,
        (200, Bytes::from("db1 here"))
    );
    {
        let seen = hook.seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].token, DB1);
        assert_eq!(seen[0].target, None);
        assert_eq!(seen[0].peer.map(|p| p.ip()), Some(addr.ip()));
        // Its Debug never shows the token.
        assert!(!format!("{:?}", seen[0]).contains(DB1));
    }
    // The table decides its own tokens without asking the hook.
    assert_eq!(dial(addr, "/connect", TABLE_TOKEN).await, Ok(()));
    assert_eq!(hook.calls.load(Ordering::SeqCst), 1);

    // Once gone, db1 is a known worker: its callers wait for its reconnect
    // (here 300 ms), then 503; a worker never let in is unknown: 404.
    task.abort();
    // The aborted tunnel's socket may already have closed the connection.
    if let Some(h) = gateway.handle("db1") {
        h.close(worker_relay::frame::CloseCode::GOING_AWAY, "bye");
    }
    let end = Instant::now() + Duration::from_secs(10);
    while gateway.is_connected("db1") {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = Instant::now();
    assert_eq!(status(&gateway, "db1").await.0, 503);
    assert!(asked.elapsed() >= Duration::from_millis(250));
    assert_eq!(status(&gateway, "nobody").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hooks_refusals_reach_the_worker_with_their_meaning() {
    let (addr, gateway, hook) = relay().await;
    // Unknown to the hook too: 401, final.
    assert_eq!(
        dial(addr, "/connect", "not-in-any-database-0123").await,
        Err(Verdict::Refused(Refused::Status(401)))
    );
    // The hook's own status.
    assert_eq!(
        dial(addr, "/connect", "db-token-banned-0123456789").await,
        Err(Verdict::Refused(Refused::Status(403)))
    );
    // The URL names another worker than the hook's answer: 401.
    assert_eq!(
        dial(addr, "/connect/other", DB1).await,
        Err(Verdict::Refused(Refused::Status(401)))
    );
    let seen = hook.seen.lock().unwrap().last().unwrap().target.clone();
    assert_eq!(seen, Some(WorkerId::new("other").unwrap()));
    // And the one it names: in.
    assert_eq!(dial(addr, "/connect/db1", DB1).await, Ok(()));
    // A hook slower than its time limit: 503, so the worker retries.
    let asked = Instant::now();
    assert_eq!(
        dial(addr, "/connect", SLOW).await,
        Err(Verdict::Retry(RetryReason::Status(503)))
    );
    // At the 300 ms limit; generous for a loaded machine: a gateway that
    // waited for the hook would take its 60 s (the dial gives up at 5 s,
    // with another verdict).
    assert!(
        asked.elapsed() < Duration::from_secs(4),
        "{:?}",
        asked.elapsed()
    );
    assert!(!gateway.is_connected("slow"));
    // A malformed or too long token never reaches the hook.
    let calls = hook.calls.load(Ordering::SeqCst);
    let long = "x".repeat(2000);
    assert_eq!(
        dial(addr, "/connect", &long).await,
        Err(Verdict::Refused(Refused::Status(401)))
    );
    assert_eq!(hook.calls.load(Ordering::SeqCst), calls);
}
