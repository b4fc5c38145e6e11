//! The gateway's registry: who is connected, what a second connection of
//! the same worker does under each `DuplicatePolicy`, the presence news,
//! and that a connection's end always leaves the registry clean.

#[path = "common/mem.rs"]
#[allow(dead_code)]
mod mem;

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::sync::broadcast::error::RecvError;
use worker_relay::connect::{RetryReason, Token, TokenTable, Verdict, WorkerHandshake, WorkerId};
use worker_relay::frame::CloseCode;
use worker_relay::gateway::{DuplicatePolicy, Gateway, Presence};
use worker_relay::proto::WorkerConfig;
use worker_relay::rt::{self, Closed, TokioTimer};
use worker_relay::server::{serve, ServerConfig};
use worker_relay::ws;

async fn relay(policy: DuplicatePolicy) -> (SocketAddr, Gateway) {
    let gateway = Gateway::builder(TokenTable::parse("abc ct-abc-0000000000").unwrap())
        .duplicates(policy)
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    (addr, gateway)
}

fn handshake() -> WorkerHandshake {
    WorkerHandshake::new(Token::new("ct-abc-0000000000").ok())
}

/// Dials as worker `abc` and drives the connection on its own task; the
/// task's result says how the connection ended.
async fn connect(
    addr: SocketAddr,
) -> Result<tokio::task::JoinHandle<Result<Closed, String>>, Verdict> {
    let url = format!("ws://{addr}/connect");
    let socket = ws::dial(&url, &handshake(), Duration::from_secs(5)).await?;
    let (incoming, driver) = rt::worker(socket, TokioTimer, WorkerConfig::default());
    Ok(tokio::spawn(async move {
        let r = driver.await.map_err(|e| e.to_string());
        drop(incoming);
        r
    }))
}

async fn next(rx: &mut tokio::sync::broadcast::Receiver<Presence>) -> Presence {
    match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
        Ok(Ok(p)) => p,
        Ok(Err(RecvError::Lagged(n))) => panic!("lagged by {n}"),
        Ok(Err(RecvError::Closed)) => panic!("closed"),
        Err(_) => panic!("no presence news within 10 s"),
    }
}

fn abc() -> WorkerId {
    WorkerId::new("abc").unwrap()
}

#[tokio::test]
async fn replace_closes_the_old_connection_with_1008_and_keeps_the_new() {
    let (addr, gateway) = relay(DuplicatePolicy::Replace).await;
    let mut news = gateway.subscribe();
    let first = connect(addr).await.unwrap();
    assert_eq!(next(&mut news).await, Presence::Connected { worker: abc() });
    let second = connect(addr).await.unwrap();
    assert_eq!(next(&mut news).await, Presence::Connected { worker: abc() });
    // The first connection is closed by the relay, with 1008.
    let ended = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .unwrap()
        .unwrap();
    match ended {
        Ok(Closed::ByPeer(Some(f))) => assert_eq!(f.code, CloseCode::POLICY_VIOLATION),
        other => panic!("{other:?}"),
    }
    // The new one is the registered one, and stays; the old one's end is
    // no news (the worker is still connected).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        matches!(
            news.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ),
        "a replaced connection's end must not say the worker left"
    );
    assert_eq!(gateway.connected(), vec![abc()]);
    assert!(!second.is_finished());
    // Its end empties the registry.
    gateway
        .handle("abc")
        .unwrap()
        .close(CloseCode::GOING_AWAY, "bye");
    let Presence::Disconnected { worker, reason } = next(&mut news).await else {
        panic!("expected the end");
    };
    assert_eq!(worker, abc());
    assert!(
        reason.contains("1001") || reason.contains("closed"),
        "{reason}"
    );
    assert!(gateway.connected().is_empty());
    assert!(!gateway.is_connected("abc"));
}

#[tokio::test]
async fn refuse_answers_503_so_the_worker_retries_until_the_old_one_is_gone() {
    let (addr, gateway) = relay(DuplicatePolicy::Refuse).await;
    let first = connect(addr).await.unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected("abc") {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match connect(addr).await {
        Err(Verdict::Retry(RetryReason::Status(503))) => {}
        other => panic!("{:?}", other.map(|_| "connected")),
    }
    assert!(!first.is_finished(), "the first connection was disturbed");
    // Once the first is gone, the next attempt gets in.
    gateway
        .handle("abc")
        .unwrap()
        .close(CloseCode::GOING_AWAY, "bye");
    let _ = first.await;
    let end = Instant::now() + Duration::from_secs(10);
    while gateway.is_connected("abc") {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _third = connect(addr).await.unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected("abc") {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A connection refused after its upgrade (here: a socket handed to
/// `attach` while the worker is connected, under `Refuse`) is closed with
/// 1013 "try again later", not dropped without a word.
#[tokio::test]
async fn a_connection_refused_after_the_upgrade_is_closed_with_1013() {
    use futures_util::{SinkExt, StreamExt};
    use worker_relay::frame::{CloseFrame, Message};
    let (addr, gateway) = relay(DuplicatePolicy::Refuse).await;
    let first = connect(addr).await.unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected("abc") {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (relay_side, mut worker_side) = mem::socket_pair();
    let g = gateway.clone();
    let attached = tokio::spawn(async move { g.attach(abc(), relay_side).await.is_none() });
    let got = tokio::time::timeout(Duration::from_secs(5), worker_side.rx.next())
        .await
        .expect("a message within 5 s");
    let Some(Message::Close(Some(frame))) = got else {
        panic!("expected a close, got {got:?}");
    };
    assert_eq!(frame.code, CloseCode::TRY_AGAIN_LATER);
    // The close handshake completes at once when answered.
    let _ = worker_side
        .tx
        .send(Message::Close(Some(CloseFrame {
            code: frame.code,
            reason: String::new(),
        })))
        .await;
    let refused = tokio::time::timeout(Duration::from_secs(2), attached)
        .await
        .expect("attach returns once the close is answered")
        .unwrap();
    assert!(refused, "attach says the policy refused it");
    assert!(
        !first.is_finished(),
        "the registered connection was disturbed"
    );
    assert!(gateway.is_connected("abc"));
}

#[tokio::test]
async fn a_dropped_connection_task_leaves_nothing_behind() {
    let (addr, gateway) = relay(DuplicatePolicy::Replace).await;
    let mut news = gateway.subscribe();
    // A worker that vanishes without a close (its task is aborted, the
    // socket dropped).
    let task = connect(addr).await.unwrap();
    assert_eq!(next(&mut news).await, Presence::Connected { worker: abc() });
    task.abort();
    let Presence::Disconnected { worker, .. } = next(&mut news).await else {
        panic!("expected the end");
    };
    assert_eq!(worker, abc());
    assert!(gateway.connected().is_empty());
}
