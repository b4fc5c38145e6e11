//! Issue 25, the worker side: `Tunnel::run_until` drains on shutdown. New
//! requests are answered 503 without reaching the app, the one in flight
//! finishes, the connection is closed with 1001 and not dialled again; the
//! grace period bounds a request that would not finish. And the worker
//! example does the same on `SIGTERM`.

#[path = "e2e/support.rs"]
mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::Service;
use worker_relay::connect::{Token, TokenTable};
use worker_relay_hyper::gateway::{Gateway, Presence};
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody, TunnelEnd};

const TOKEN: &str = "ct-abc-000000000000";

async fn relay() -> (SocketAddr, Gateway) {
    let gateway = Gateway::new(TokenTable::parse(&format!("abc {TOKEN}")).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    (addr, gateway)
}

/// A worker whose app sleeps `?ms=` then answers "done", counting the
/// requests it saw; drained when `stop` fires.
fn worker(
    addr: SocketAddr,
    grace: Duration,
    seen: Arc<AtomicUsize>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<TunnelEnd>,
) {
    let app = tower::service_fn(move |req: Request<TunnelBody>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async move {
            let ms: u64 = req
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("ms="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("done"))))
        }
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let tunnel = Tunnel::new(format!("ws://{addr}/connect"), Token::new(TOKEN).ok());
    let task = tokio::spawn(tunnel.run_until(
        app,
        async {
            let _ = stopped.await;
        },
        grace,
    ));
    (stop, task)
}

async fn connected(gateway: &Gateway) {
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected("abc") {
        assert!(Instant::now() < end, "the worker did not connect");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn call(gateway: &Gateway, target: &str) -> (u16, Option<String>, Bytes) {
    let req = Request::get(target).body(Full::new(Bytes::new())).unwrap();
    let resp = gateway.forward().call(req).await.unwrap();
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp.into_body().collect().await.map(|b| b.to_bytes());
    (status, retry, body.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_finishes_its_request_refuses_new_ones_and_leaves_with_1001() {
    let (_addr, gateway) = relay().await;
    let seen = Arc::new(AtomicUsize::new(0));
    let (stop, task) = worker(_addr, Duration::from_secs(10), seen.clone());
    connected(&gateway).await;
    let mut news = gateway.subscribe();
    let long = tokio::spawn({
        let gateway = gateway.clone();
        async move { call(&gateway, "/w/abc/?ms=1500").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;

    let (status, retry, body) = call(&gateway, "/w/abc/").await;
    assert_eq!(status, 503);
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(body, "the worker is shutting down\n");
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the app saw the refused request"
    );

    let (status, _, body) = long.await.unwrap();
    assert_eq!((status, &body[..]), (200, &b"done"[..]));
    let end = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the tunnel ended within 10 s")
        .unwrap();
    assert_eq!(end, TunnelEnd::Stopped);
    let reason = loop {
        match tokio::time::timeout(Duration::from_secs(5), news.recv()).await {
            Ok(Ok(Presence::Disconnected { reason, .. })) => break reason,
            Ok(Ok(_)) => continue,
            other => panic!("no Disconnected news: {other:?}"),
        }
    };
    assert!(reason.contains("1001"), "{reason}");
    // It does not come back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!gateway.is_connected("abc"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_period_bounds_a_worker_drain() {
    let (addr, gateway) = relay().await;
    let (stop, task) = worker(addr, Duration::from_millis(300), Arc::default());
    connected(&gateway).await;
    let long = tokio::spawn({
        let gateway = gateway.clone();
        async move { call(&gateway, "/w/abc/?ms=60000").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    stop.send(()).unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the tunnel ended within 10 s")
        .unwrap();
    assert_eq!(end, TunnelEnd::Stopped);
    assert!(started.elapsed() >= Duration::from_millis(250));
    let (status, _, _) = tokio::time::timeout(Duration::from_secs(10), long)
        .await
        .expect("the cut request ended")
        .unwrap();
    assert_ne!(status, 200);
}

/// The worker example on `SIGTERM`: the request in flight finishes, the
/// process exits 0, the relay sees 1001.
#[test]
fn the_worker_example_drains_on_sigterm() {
    use support::{auth, relay_process, worker_process, CONNECT_TOKEN};
    let (relay, port) = relay_process();
    let mut worker = worker_process(port, CONNECT_TOKEN);
    assert!(
        relay.wait_log("worker abc connected", Duration::from_secs(20)),
        "{}",
        relay.log()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let a = auth();
    let long = rt.spawn(async move {
        let h = [("authorization", a.as_str())];
        worker_app_client(addr, "/w/abc/sleep?ms=1500", &h).await
    });
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        unsafe { libc::kill(worker.child.id() as i32, libc::SIGTERM) },
        0
    );
    let status = rt.block_on(long).unwrap();
    assert_eq!(status, 200, "{}", worker.log());
    assert_eq!(
        worker.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        worker.log()
    );
    assert!(
        relay.wait_log("worker abc disconnected", Duration::from_secs(5)),
        "{}",
        relay.log()
    );
    assert!(relay.log().contains("1001"), "{}", relay.log());
}

async fn worker_app_client(addr: SocketAddr, target: &str, h: &[(&str, &str)]) -> u16 {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = Request::get(target).header("host", "relay");
    for (n, v) in h {
        req = req.header(*n, *v);
    }
    let resp = sender
        .send_request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}
