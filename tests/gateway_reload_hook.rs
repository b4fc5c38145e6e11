//! Issue 39: a token reload with an authorisation hook. A worker the hook
//! let in was decided by no table, so no table change closes it; on
//! c0bae95 every reload closed every such worker (`same_token` is false
//! when neither table holds the worker), and so did a reload during the
//! hook's await. A worker whose table token was revoked is still closed.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::Semaphore;
use tower::Service;
use worker_relay::connect::{BackoffConfig, Token, TokenTable, WorkerId};
use worker_relay_hyper::gateway::{Gateway, Presence, Presented};
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody};

const ABC: &str = "ct-abc-000000000000";
const DEF: &str = "ct-def-000000000000";

/// The hook's "database": `db-token-<id>-0123456789` is worker `<id>`'s;
/// `gated` waits for a permit of the gate.
struct Hook {
    gate: Semaphore,
    gated_asked: AtomicUsize,
}

async fn relay() -> (SocketAddr, Gateway, Arc<Hook>) {
    let hook = Arc::new(Hook {
        gate: Semaphore::new(0),
        gated_asked: AtomicUsize::new(0),
    });
    let h = hook.clone();
    let gateway = Gateway::builder(TokenTable::parse(&format!("abc {ABC}\ndef {DEF}")).unwrap())
        .authorize(move |p: Presented| {
            let h = h.clone();
            async move {
                let id = p
                    .token
                    .strip_prefix("db-token-")
                    .and_then(|rest| rest.strip_suffix("-0123456789"))
                    .ok_or(StatusCode::UNAUTHORIZED)?;
                if id == "gated" {
                    h.gated_asked.fetch_add(1, Ordering::SeqCst);
                    h.gate.acquire().await.unwrap().forget();
                }
                WorkerId::new(id).map_err(|_| StatusCode::UNAUTHORIZED)
            }
        })
        .authorize_timeout(Duration::from_secs(30))
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    (addr, gateway, hook)
}

fn worker(addr: SocketAddr, token: &str, name: &'static str) -> tokio::task::JoinHandle<()> {
    let app = tower::service_fn(move |_req: Request<TunnelBody>| async move {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(name))))
    });
    let backoff = BackoffConfig::builder()
        .initial(Duration::from_millis(50))
        .max(Duration::from_millis(100))
        .build()
        .unwrap();
    let tunnel =
        Tunnel::new(format!("ws://{addr}/connect"), Token::new(token).ok()).backoff(backoff);
    tokio::spawn(async move {
        let _ = tunnel.run(app).await;
    })
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < end, "waited 10 s for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn status(gateway: &Gateway, worker: &str) -> u16 {
    let req = Request::get(format!("/w/{worker}/"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(15), gateway.forward().call(req))
        .await
        .expect("an answer within 15 s")
        .unwrap();
    resp.status().as_u16()
}

fn id(s: &str) -> WorkerId {
    WorkerId::new(s).unwrap()
}

/// Every `Disconnected` news received so far, by worker.
fn disconnections(news: &mut tokio::sync::broadcast::Receiver<Presence>) -> Vec<WorkerId> {
    let mut gone = Vec::new();
    loop {
        match news.try_recv() {
            Ok(Presence::Disconnected { worker, .. }) => gone.push(worker),
            Ok(_) => {}
            Err(TryRecvError::Empty) => return gone,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_leaves_the_hooks_workers_connected() {
    let (addr, gateway, hook) = relay().await;
    let _abc = worker(addr, ABC, "abc");
    let _def = worker(addr, DEF, "def");
    let _db1 = worker(addr, "db-token-db1-0123456789", "db1");
    wait_for("three workers", || gateway.connected().len() == 3).await;
    let mut news = gateway.subscribe();

    // abc's token is revoked; def's is kept; db1 is the hook's.
    let revoked = gateway.replace_tokens(TokenTable::parse(&format!("def {DEF}")).unwrap());
    assert_eq!(revoked, [id("abc")], "only the revoked table worker");
    assert!(gateway.is_connected("db1"), "the hook's worker was closed");
    assert!(gateway.is_connected("def"));
    assert_eq!(status(&gateway, "db1").await, 200);
    assert_eq!(status(&gateway, "abc").await, 404, "abc is unknown now");

    // A reload while the hook decides: the worker it lets in stays.
    let _gated = worker(addr, "db-token-gated-0123456789", "gated");
    wait_for("the hook to be asked", || {
        hook.gated_asked.load(Ordering::SeqCst) == 1
    })
    .await;
    let revoked = gateway.replace_tokens(TokenTable::parse(&format!("def {DEF}\n")).unwrap());
    assert!(revoked.is_empty(), "{revoked:?}");
    hook.gate.add_permits(1);
    wait_for("gated to connect", || gateway.is_connected("gated")).await;
    // A round trip to it: the relay has long since checked the connection
    // against the table.
    assert_eq!(status(&gateway, "gated").await, 200);
    assert_eq!(status(&gateway, "db1").await, 200);
    let gone = disconnections(&mut news);
    assert_eq!(gone, [id("abc")], "only abc left");
    assert_eq!(
        hook.gated_asked.load(Ordering::SeqCst),
        1,
        "gated was closed and dialled again"
    );
}
