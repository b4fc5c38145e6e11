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
use worker_relay::proto::WorkerConfig;
use worker_relay::rt::{self, Closed};
use worker_relay_hyper::gateway::{DuplicatePolicy, Gateway, Presence};
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::ws;
use worker_relay_hyper::TokioTimer;

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
async fn replace_closes_the_old_connection_with_4000_and_keeps_the_new() {
    let (addr, gateway) = relay(DuplicatePolicy::Replace).await;
    let mut news = gateway.subscribe();
    let first = connect(addr).await.unwrap();
    assert_eq!(next(&mut news).await, Presence::Connected { worker: abc() });
    let second = connect(addr).await.unwrap();
    assert_eq!(next(&mut news).await, Presence::Connected { worker: abc() });
    // The first connection is closed by the relay, with 4000.
    let ended = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .unwrap()
        .unwrap();
    match ended {
        Ok(Closed::ByPeer(Some(f))) => assert_eq!(f.code, CloseCode::REPLACED),
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
    let attached = tokio::spawn(async move {
        matches!(
            g.attach(abc(), relay_side).await,
            Err(worker_relay_hyper::gateway::AttachError::Duplicate)
        )
    });
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

/// Dials as worker `abc` and serves each request with `name` as the answer,
/// after `delay` for `/slow`; the task's result says how the connection
/// ended.
async fn serve_as(
    addr: SocketAddr,
    name: &'static str,
    delay: Duration,
) -> tokio::task::JoinHandle<Result<Closed, String>> {
    use http_body_util::Full;
    use worker_relay_hyper::tunnel::TunnelBody;
    let url = format!("ws://{addr}/connect");
    let socket = ws::dial(&url, &handshake(), Duration::from_secs(5))
        .await
        .unwrap();
    let app = tower::service_fn(move |req: http::Request<TunnelBody>| async move {
        if req.uri().path() == "/slow" {
            tokio::time::sleep(delay).await;
        }
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(bytes::Bytes::from(name))))
    });
    tokio::spawn(async move {
        worker_relay_hyper::tunnel::serve(socket, WorkerConfig::default(), app)
            .await
            .map_err(|e| e.to_string())
    })
}

/// GET `path` of worker `abc` through the relay: status and body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let resp = client
        .get(format!("http://{addr}/w/abc{path}").parse().unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

// On tokio's paused clock (see the note on
// `a_tunnel_replaced_by_another_process_does_not_take_the_worker_back`).
#[tokio::test(start_paused = true)]
async fn a_replaced_connection_finishes_its_streams_before_it_is_closed() {
    let (addr, gateway) = relay(DuplicatePolicy::Replace).await;
    let mut news = gateway.subscribe();
    let first = serve_as(addr, "first", Duration::from_millis(1500)).await;
    assert_eq!(next(&mut news).await, Presence::Connected { worker: abc() });
    // A long request in flight on the first connection.
    let slow = tokio::spawn(get(addr, "/slow"));
    let end = Instant::now() + Duration::from_secs(5);
    while gateway.stats("abc").unwrap().streams_open == 0 {
        assert!(
            Instant::now() < end,
            "the slow request did not reach the worker"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = serve_as(addr, "second", Duration::ZERO).await;
    assert_eq!(next(&mut news).await, Presence::Connected { worker: abc() });
    // New requests go to the new connection at once; the old one is open.
    assert_eq!(get(addr, "/x").await, (200, "second".into()));
    assert!(!first.is_finished(), "the replaced connection was cut");
    // The long request completes on the old one, which is then closed
    // with 4000 (`CloseCode::REPLACED`) and the reason that says it was
    // replaced.
    let slow = tokio::time::timeout(Duration::from_secs(10), slow)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(slow, (200, "first".into()));
    let ended = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the replaced connection was not closed once idle")
        .unwrap();
    match ended {
        Ok(Closed::ByPeer(Some(f))) => {
            assert_eq!(f.code, CloseCode::REPLACED);
            assert_eq!(f.code.0, 4000);
            assert_eq!(f.reason, worker_relay::connect::REPLACED);
        }
        other => panic!("{other:?}"),
    }
    assert!(!second.is_finished());
    assert_eq!(gateway.connected(), vec![abc()]);
    assert_eq!(get(addr, "/x").await, (200, "second".into()));
}

// On tokio's paused clock (see the note on
// `a_tunnel_replaced_by_another_process_does_not_take_the_worker_back`).
#[tokio::test(start_paused = true)]
async fn a_replaced_connection_that_does_not_finish_is_closed_after_the_grace() {
    let gateway = Gateway::builder(TokenTable::parse("abc ct-abc-0000000000").unwrap())
        .replace_grace(Duration::from_millis(500))
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    let first = serve_as(addr, "first", Duration::from_secs(3600)).await;
    let end = Instant::now() + Duration::from_secs(5);
    while !gateway.is_connected("abc") {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stuck = tokio::spawn(get(addr, "/slow"));
    while gateway.stats("abc").unwrap().streams_open == 0 {
        assert!(Instant::now() < end, "the request did not reach the worker");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = tokio::time::Instant::now();
    let _second = serve_as(addr, "second", Duration::ZERO).await;
    let ended = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the replaced connection outlived its grace")
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(ended, Ok(Closed::ByPeer(Some(ref f))) if f.reason == worker_relay::connect::REPLACED),
        "{ended:?}"
    );
    // The request that did not finish fails (502), as a lost connection's.
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), stuck)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_head_never_left_goes_to_the_next_connection() {
    use http_body_util::Full;
    let gateway = Gateway::builder(TokenTable::parse("abc ct-abc-0000000000").unwrap())
        .replace_grace(Duration::from_millis(500))
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    // A worker that connects and then reads nothing at all (frozen).
    let url = format!("ws://{addr}/connect");
    let frozen = ws::dial(&url, &handshake(), Duration::from_secs(5))
        .await
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected("abc") {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A large upload fills the socket, so what comes next stays queued.
    let upload = tokio::spawn(async move {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<Full<bytes::Bytes>>();
        let req = http::Request::post(format!("http://{addr}/w/abc/sink"))
            .body(Full::new(bytes::Bytes::from(vec![7u8; 48 << 20])))
            .unwrap();
        client.request(req).await.map(|r| r.status().as_u16())
    });
    let mut last = (0, Instant::now());
    loop {
        assert!(Instant::now() < end, "the socket never filled");
        let stats = gateway.stats("abc").unwrap();
        if stats.bytes_out != last.0 {
            last = (stats.bytes_out, Instant::now());
        } else if stats.body_queued_out > 0 && last.1.elapsed() > Duration::from_millis(300) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sent_before = gateway.stats("abc").unwrap().bytes_out;
    let queued = tokio::spawn(get(addr, "/x"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(gateway.stats("abc").unwrap().streams_open, 2);
    assert_eq!(
        gateway.stats("abc").unwrap().bytes_out,
        sent_before,
        "the head went out"
    );
    // The worker's new connection takes over; the frozen one is closed
    // after the grace, and the request it never sent goes to the new one.
    let _second = serve_as(addr, "second", Duration::ZERO).await;
    let got = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("the queued request was not answered")
        .unwrap();
    assert_eq!(got, (200, "second".into()));
    // The upload, whose pieces went to the frozen connection, fails.
    let status = tokio::time::timeout(Duration::from_secs(10), upload)
        .await
        .unwrap()
        .unwrap();
    assert!(!matches!(status, Ok(200)), "{status:?}");
    drop(frozen);
}

// On tokio's paused clock: the relay, the tunnel and the second worker are
// all tasks of the test's one runtime, on loopback sockets, so the clock
// moves on only when they all wait, straight to the next deadline: the 4 s
// below take no time, and a tunnel that came back after its first backoff
// (0.5-1 s) would still be seen.
#[tokio::test(start_paused = true)]
async fn a_tunnel_replaced_by_another_process_does_not_take_the_worker_back() {
    use http_body_util::Full;
    use worker_relay_hyper::tunnel::{Tunnel, TunnelBody};
    let (addr, gateway) = relay(DuplicatePolicy::Replace).await;
    let mut news = gateway.subscribe();
    let app = tower::service_fn(|_req: http::Request<TunnelBody>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(bytes::Bytes::from(
            "tunnel",
        ))))
    });
    let tunnel = Tunnel::new(
        format!("ws://{addr}/connect"),
        Token::new("ct-abc-0000000000").ok(),
    );
    let task = tokio::spawn(tunnel.run(app));
    assert_eq!(next(&mut news).await, Presence::Connected { worker: abc() });
    assert_eq!(get(addr, "/x").await, (200, "tunnel".into()));
    // A new process takes over (a redeploy): the tunnel's connection,
    // idle, is closed at once with REPLACED, and the tunnel waits its
    // longest backoff (30-60 s) instead of its first (0.5-1 s), so it does
    // not take the worker back before it is stopped.
    let second = serve_as(addr, "second", Duration::ZERO).await;
    assert_eq!(next(&mut news).await, Presence::Connected { worker: abc() });
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!second.is_finished(), "the tunnel took the worker back");
    assert!(
        matches!(
            news.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ),
        "the worker's connection changed again"
    );
    assert_eq!(get(addr, "/x").await, (200, "second".into()));
    assert!(!task.is_finished());
    task.abort();
}
