//! Issue 25: live token changes, presence news in order, and flap damping
//! for two processes given one token.

#[path = "common/mem.rs"]
#[allow(dead_code)]
mod mem;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::broadcast::error::TryRecvError;
use tower::Service;
use worker_relay::connect::{BackoffConfig, Refused, Token, TokenTable, WorkerId};
use worker_relay_hyper::gateway::{Gateway, Presence, FLAP_REPLACEMENTS};
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody};

const ABC: &str = "ct-abc-000000000000";
const DEF: &str = "ct-def-000000000000";
const GHI: &str = "ct-ghi-000000000000";

async fn relay(table: TokenTable) -> (SocketAddr, Gateway) {
    let gateway = Gateway::new(table);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    (addr, gateway)
}

fn fast() -> BackoffConfig {
    BackoffConfig::builder()
        .initial(Duration::from_millis(50))
        .max(Duration::from_millis(100))
        .build()
        .unwrap()
}

/// A worker whose app answers its own name; the task ends when the relay
/// refuses it for good.
fn worker(addr: SocketAddr, token: &str, name: &'static str) -> tokio::task::JoinHandle<Refused> {
    let app = tower::service_fn(move |_req: Request<TunnelBody>| async move {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(name))))
    });
    let tunnel =
        Tunnel::new(format!("ws://{addr}/connect"), Token::new(token).ok()).backoff(fast());
    tokio::spawn(tunnel.run(app))
}

async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < end, "waited {within:?} for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn status(gateway: &Gateway, worker: &str) -> u16 {
    let req = Request::get(format!("/w/{worker}/"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), gateway.forward().call(req))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    resp.status().as_u16()
}

fn id(s: &str) -> WorkerId {
    WorkerId::new(s).unwrap()
}

/// A new table takes effect at once: a worker removed and a worker whose
/// token changed are closed and refused for good (401) when they dial
/// again; an unchanged worker keeps its connection; a new worker gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_token_table_closes_the_revoked_workers_only() {
    let table = TokenTable::parse(&format!("abc {ABC}\ndef {DEF}\nghi {GHI}\n")).unwrap();
    let (addr, gateway) = relay(table).await;
    let _abc = worker(addr, ABC, "abc");
    let def = worker(addr, DEF, "def");
    let ghi = worker(addr, GHI, "ghi");
    wait_for("three workers", Duration::from_secs(10), || {
        gateway.connected().len() == 3
    })
    .await;
    let mut news = gateway.subscribe();

    let next = TokenTable::parse(&format!(
        "abc {ABC}\nghi ct-ghi-new-0000000000\njkl ct-jkl-000000000000\n"
    ))
    .unwrap();
    let mut revoked = gateway.replace_tokens(next);
    revoked.sort();
    assert_eq!(revoked, [id("def"), id("ghi")]);
    assert_eq!(status(&gateway, "def").await, 404, "def is unknown now");

    for (task, name) in [(def, "def"), (ghi, "ghi")] {
        let refused = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap_or_else(|_| panic!("{name} still dialling after 10 s"))
            .unwrap();
        assert_eq!(refused, Refused::Status(401), "{name}");
    }
    // abc never left: no news about it.
    loop {
        match news.try_recv() {
            Ok(Presence::Disconnected { worker, reason }) => {
                assert_ne!(worker, id("abc"));
                assert!(worker == id("def") || worker == id("ghi"));
                assert!(reason.contains("1008"), "{reason}");
            }
            Ok(other) => panic!("unexpected news: {other:?}"),
            Err(TryRecvError::Empty) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(gateway.is_connected("abc"));
    assert_eq!(status(&gateway, "abc").await, 200);

    let _jkl = worker(addr, "ct-jkl-000000000000", "jkl");
    wait_for("the new worker", Duration::from_secs(10), || {
        gateway.is_connected("jkl")
    })
    .await;
}

/// Many connections of one worker replacing one another from several
/// tasks at once: the last news a subscriber got matches the registry, and
/// every `Disconnected` follows a `Connected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_news_comes_in_order() {
    let gateway = Gateway::builder(TokenTable::parse(&format!("abc {ABC}")).unwrap())
        .presence_capacity(1024)
        .build();
    let mut news = gateway.subscribe();
    let rounds = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let gateway = gateway.clone();
        let rounds = rounds.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let (relay_side, worker_side) = mem::socket_pair();
                let attached = tokio::spawn({
                    let gateway = gateway.clone();
                    async move { gateway.attach(id("abc"), relay_side).await }
                });
                tokio::task::yield_now().await;
                drop(worker_side);
                let _ = attached.await;
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(rounds.load(Ordering::Relaxed), 200);
    let mut connected = false;
    let mut seen = 0;
    loop {
        let p = match news.try_recv() {
            Ok(p) => p,
            Err(TryRecvError::Empty) => break,
            Err(e) => panic!("{e}"),
        };
        seen += 1;
        match p {
            Presence::Connected { .. } => connected = true,
            Presence::Disconnected { .. } => {
                assert!(connected, "a Disconnected without a Connected before it");
                connected = false;
            }
            _ => {}
        }
    }
    assert!(seen > 0);
    assert_eq!(connected, gateway.is_connected("abc"));
    assert!(!connected, "every connection ended");
}

/// Two workers given one token: each replaces the other as soon as its
/// backoff allows. After `FLAP_REPLACEMENTS` replacements the relay
/// answers 429 to the newcomers and keeps the serving connection: in 3 s of
/// 50–100 ms backoffs, a handful of replacements, not dozens, and callers
/// are answered all along.
///
/// On tokio's paused clock: the relay, the two tunnels and the callers are
/// all tasks of the test's one runtime, on loopback sockets, so the clock
/// moves on only when they all wait, straight to the next deadline (a
/// backoff, a caller's 20 ms): the 3 s take no time.
#[tokio::test(start_paused = true)]
async fn two_processes_with_one_token_are_damped() {
    let (addr, gateway) = relay(TokenTable::parse(&format!("abc {ABC}")).unwrap()).await;
    let mut news = gateway.subscribe();
    let _one = worker(addr, ABC, "one");
    let _two = worker(addr, ABC, "two");
    let end = tokio::time::Instant::now() + Duration::from_secs(3);
    let (mut ok, mut failed) = (0, 0);
    while tokio::time::Instant::now() < end {
        match status(&gateway, "abc").await {
            200 => ok += 1,
            _ => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut registrations = 0;
    while let Ok(p) = news.try_recv() {
        if matches!(p, Presence::Connected { .. }) {
            registrations += 1;
        }
    }
    eprintln!("3 s: {registrations} registrations; callers {ok} ok, {failed} not");
    // The first connection, then at most FLAP_REPLACEMENTS replacements
    // (and one more that raced the count).
    assert!(
        registrations <= FLAP_REPLACEMENTS + 2,
        "{registrations} registrations in 3 s"
    );
    assert!(gateway.is_connected("abc"));
    assert!(ok > 50, "{ok} answered");
}
