//! Tests of the gateway's inner bookkeeping (issue 39): requests waiting
//! for a worker's reconnect are woken by that worker's news only, and what
//! the gateway keeps per worker is forgotten some time after the worker
//! left.

use super::{Gateway, GatewayBuilder, Presented};
use bytes::Bytes;
use futures::channel::mpsc;
use futures::{Sink, SinkExt, Stream, StreamExt};
use http::{Request, StatusCode};
use http_body_util::Empty;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::Service;
use worker_relay::connect::{TokenTable, WorkerId};
use worker_relay::frame::{CloseCode, Message, SUBPROTOCOL};

/// One end of an in-memory WebSocket.
struct Mem {
    tx: mpsc::Sender<Message>,
    rx: mpsc::Receiver<Message>,
}

fn socket_pair() -> (Mem, Mem) {
    let (a_tx, b_rx) = mpsc::channel(64);
    let (b_tx, a_rx) = mpsc::channel(64);
    (Mem { tx: a_tx, rx: a_rx }, Mem { tx: b_tx, rx: b_rx })
}

impl Stream for Mem {
    type Item = Result<Message, mpsc::SendError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_next_unpin(cx).map(|m| m.map(Ok))
    }
}

impl Sink<Message> for Mem {
    type Error = mpsc::SendError;
    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.tx.poll_ready_unpin(cx)
    }
    fn start_send(mut self: Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
        self.tx.start_send_unpin(item)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.tx.poll_flush_unpin(cx)
    }
    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.tx.poll_close_unpin(cx)
    }
}

fn id(s: &str) -> WorkerId {
    WorkerId::new(s).unwrap()
}

/// Yields until `done`, at most 10 000 times (each yield lets every other
/// ready task run).
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never: {what}");
}

/// `worker` connects over an in-memory socket: the socket's other end, and
/// the connection's task.
async fn connect(gateway: &Gateway, worker: &str) -> (Mem, tokio::task::JoinHandle<()>) {
    let (relay_side, worker_side) = socket_pair();
    let g = gateway.clone();
    let w = id(worker);
    let task = tokio::spawn(async move {
        let _ = g.attach(w, relay_side).await;
    });
    until("the worker to connect", || gateway.is_connected(worker)).await;
    (worker_side, task)
}

fn get(worker: &str) -> Request<Empty<Bytes>> {
    Request::get(format!("/w/{worker}/"))
        .body(Empty::new())
        .unwrap()
}

/// Eight requests wait for `a`; `b` connects and leaves twenty times.
/// The waiters look at their worker's connection once each when they
/// start waiting, and never for `b`'s news (on c0bae95 each of them took
/// the registry's lock for every presence event: 8 × 40 looks more); a
/// drain releases them at once with 503.
#[tokio::test]
async fn waiters_wake_for_their_own_worker_only() {
    let gateway = Gateway::builder(TokenTable::parse("a ct-a-000000000000000").unwrap())
        .reconnect_wait(Duration::from_secs(3600))
        .build();
    let registry = &gateway.inner.registry;
    let mut waiting = Vec::new();
    for _ in 0..8 {
        let mut forward = gateway.forward();
        waiting.push(tokio::spawn(async move { forward.call(get("a")).await }));
    }
    until("eight waiters", || {
        registry.wakeups.load(Ordering::SeqCst) == 8
    })
    .await;
    for _ in 0..20 {
        let (worker_side, task) = connect(&gateway, "b").await;
        drop(worker_side);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("b's connection ends when its socket does")
            .unwrap();
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        registry.wakeups.load(Ordering::SeqCst),
        8,
        "waiters for `a` looked again for `b`'s news"
    );
    assert_eq!(registry.waited_for(), 1, "one entry, for `a`");
    tokio::time::timeout(
        Duration::from_secs(10),
        gateway.drain(Duration::ZERO, CloseCode::SERVICE_RESTART),
    )
    .await
    .expect("the drain ends");
    for w in waiting {
        let resp = tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("a drain answers the waiters at once")
            .unwrap()
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(registry.waited_for(), 0);
}

/// The waiters' own worker connecting wakes them: their requests go out
/// on its connection, and the waiting entry is gone.
#[tokio::test]
async fn waiters_get_their_workers_connection() {
    let gateway = Gateway::builder(TokenTable::parse("a ct-a-000000000000000").unwrap())
        .reconnect_wait(Duration::from_secs(3600))
        .build();
    let registry = &gateway.inner.registry;
    let mut waiting = Vec::new();
    for _ in 0..4 {
        let mut forward = gateway.forward();
        waiting.push(tokio::spawn(async move { forward.call(get("a")).await }));
    }
    until("four waiters", || {
        registry.wakeups.load(Ordering::SeqCst) == 4
    })
    .await;
    let (_worker_side, _task) = connect(&gateway, "a").await;
    until("the requests on a's connection", || {
        gateway.stats("a").is_some_and(|s| s.streams_open == 4)
    })
    .await;
    assert_eq!(registry.waited_for(), 0);
    for w in waiting {
        w.abort();
    }
}

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

/// A gateway whose hook lets in `db-<id>-0123456789` as `<id>`.
fn hooked() -> GatewayBuilder {
    Gateway::builder(TokenTable::new()).authorize(|p: Presented| async move {
        let id = p
            .token
            .strip_prefix("db-")
            .and_then(|t| t.strip_suffix("-0123456789"))
            .ok_or(StatusCode::UNAUTHORIZED)?;
        WorkerId::new(id).map_err(|_| StatusCode::UNAUTHORIZED)
    })
}

/// A hook letting in a new id every 10 s, each asked for by a caller, and
/// a worker connecting and leaving every 10 s: with a forget time of 60 s,
/// the gateway remembers the last few of each, not all 200 (on c0bae95
/// the admitted set, the last ends and the metric handles only grew).
#[tokio::test(start_paused = true)]
async fn what_is_kept_per_worker_is_forgotten_after_it_left() {
    let gateway = hooked()
        .reconnect_wait(Duration::ZERO)
        .forget_after(Duration::from_secs(60))
        .build();
    let inner = &gateway.inner;
    for i in 0..200 {
        // The hook lets `h<i>` in (then the upgrade itself fails: this
        // request did not come through a server that upgrades).
        let resp = gateway
            .connect()
            .call(upgrade(&format!("db-h{i}-0123456789")))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        // Known, not connected: 503 at once (and its metric handles made).
        let resp = gateway.forward().call(get(&format!("h{i}"))).await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "h{i}");
        // A worker comes and goes.
        let (worker_side, task) = connect(&gateway, &format!("c{i}")).await;
        drop(worker_side);
        task.await.unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
    }
    let (admitted, idle, queued) = inner.forgetting.remembered();
    assert!(admitted <= 7, "{admitted} admitted workers remembered");
    assert!(idle <= 14, "{idle} idle workers remembered");
    assert!(queued <= 14, "{queued} queued");
    let ends = inner.registry.last_ends();
    assert!(ends <= 7, "{ends} last ends remembered");
    #[cfg(feature = "metrics")]
    {
        let meters = inner.meters.len();
        // The last few hook workers, and `unknown`.
        assert!(meters <= 8, "{meters} workers' metric handles kept");
    }
    // The latest is still known; the first is not.
    let resp = gateway.forward().call(get("h199")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let resp = gateway.forward().call(get("h0")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

/// A worker connected for longer than the forget time stays known, and is
/// forgotten only the forget time after it left.
#[tokio::test(start_paused = true)]
async fn a_connected_worker_is_not_forgotten() {
    let gateway = hooked()
        .reconnect_wait(Duration::ZERO)
        .forget_after(Duration::from_secs(60))
        .build();
    let resp = gateway
        .connect()
        .call(upgrade("db-h1-0123456789"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    // Connected (as the hook's upgrade would have done) for 10 minutes.
    let (relay_side, worker_side) = socket_pair();
    let (handle, driver) = worker_relay::rt::relay(
        relay_side,
        crate::TokioTimer,
        worker_relay::proto::RelayConfig::default(),
    );
    let registration = gateway
        .inner
        .registry
        .register(id("h1"), handle, None, true);
    tokio::time::advance(Duration::from_secs(600)).await;
    assert!(gateway.inner.knows("h1"));
    drop(registration);
    drop((driver, worker_side));
    gateway.inner.forgetting.left(&id("h1"));
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(gateway.inner.knows("h1"));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(!gateway.inner.knows("h1"));
}

/// A request's future (issue 42) holds the request once: 1,976 bytes with
/// this body when each `async fn` kept its arguments twice (the relay's
/// box per request in flight was 2,312), 920 now. A body type larger than
/// hyper's is held once too.
#[test]
fn a_requests_future_stays_within_the_allocators_thread_cache() {
    let gateway = Gateway::builder(TokenTable::new()).build();
    let forward = super::forward::forward(gateway.inner.clone(), get("abc"), None);
    let size = std::mem::size_of_val(&forward);
    assert!(size <= 1024, "forward's future: {size} bytes");
    let mut service = gateway.forward();
    // The boxed future hides its size; the box is the forward's plus the
    // `Ok` around it (no second copy of the request).
    let boxed: super::services::ResponseFuture = service.call(get("abc"));
    drop(boxed);
    struct Big(#[allow(dead_code)] [u8; 256]);
    impl http_body::Body for Big {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            Poll::Ready(None)
        }
    }
    let (parts, _) = get("abc").into_parts();
    let big = super::forward::forward(
        gateway.inner.clone(),
        Request::from_parts(parts, Big([0; 256])),
        None,
    );
    let size = std::mem::size_of_val(&big);
    assert!(
        size <= 1024 + 256,
        "forward's future with a 256-byte body: {size} bytes"
    );
}
