//! `tunnel`: a tower service served as a worker. A service error is a 500,
//! a caller who leaves cancels the service's work, a final refusal ends
//! `Tunnel::run`, a request body reaches the service as it streams, a
//! request that waits moves to its own task and others go past it.

#[path = "../examples/common/client.rs"]
mod client;

#[path = "net/closed_port.rs"]
mod closed_port;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use worker_relay::connect::{Refused, Token, TokenTable};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn relay() -> (SocketAddr, Gateway) {
    relay_with(Gateway::new(
        TokenTable::parse("abc ct-abc-0000000000").unwrap(),
    ))
    .await
}

async fn relay_with(gateway: Gateway) -> (SocketAddr, Gateway) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    (addr, gateway)
}

async fn with_worker<S, B>(service: S) -> SocketAddr
where
    S: tower::Service<Request<TunnelBody>, Response = Response<B>, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    worker_on(relay().await, service).await
}

async fn worker_on<S, B>((addr, gateway): (SocketAddr, Gateway), service: S) -> SocketAddr
where
    S: tower::Service<Request<TunnelBody>, Response = Response<B>, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let tunnel = Tunnel::new(
        format!("ws://{addr}/connect"),
        Token::new("ct-abc-0000000000").ok(),
    );
    tokio::spawn(tunnel.run(service));
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected("abc") {
        assert!(Instant::now() < end, "the worker did not connect");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    addr
}

/// Answers `/fail` with a service error, `/wait` after 30 s (noting when
/// its future is dropped), and anything else with the request body's
/// length and byte sum.
#[derive(Clone)]
struct App {
    dropped: Arc<AtomicBool>,
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl tower::Service<Request<TunnelBody>> for App {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<TunnelBody>) -> Self::Future {
        let dropped = self.dropped.clone();
        Box::pin(async move {
            match req.uri().path() {
                "/fail" => Err("the app failed".into()),
                "/wait" => {
                    let _guard = SetOnDrop(dropped);
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    Ok(Response::new(Full::new(Bytes::from_static(b"waited"))))
                }
                _ => {
                    let body = req.into_body().collect().await?.to_bytes();
                    let sum: u64 = body.iter().map(|&b| u64::from(b)).sum();
                    let text = format!("{} {sum}", body.len());
                    Ok(Response::new(Full::new(Bytes::from(text))))
                }
            }
        })
    }
}

fn app() -> (App, Arc<AtomicBool>) {
    let dropped = Arc::new(AtomicBool::new(false));
    (
        App {
            dropped: dropped.clone(),
        },
        dropped,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_error_is_a_500_and_bodies_reach_the_service() {
    let (app, _) = app();
    let addr = with_worker(app).await;
    let a = client::request(addr, "GET", "/w/abc/fail", &[], Bytes::new())
        .await
        .unwrap();
    assert_eq!(a.status, 500);
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 7) as u8).collect();
    let sum: u64 = body.iter().map(|&b| u64::from(b)).sum();
    let a = client::request(addr, "POST", "/w/abc/sum", &[], Bytes::from(body))
        .await
        .unwrap();
    assert_eq!(
        (a.status, a.body),
        (200, Bytes::from(format!("3000000 {sum}")))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_who_leaves_cancels_the_services_work() {
    let (app, dropped) = app();
    let addr = with_worker(app).await;
    let caller = tokio::spawn(client::request(
        addr,
        "GET",
        "/w/abc/wait",
        &[],
        Bytes::new(),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!dropped.load(Ordering::SeqCst));
    caller.abort(); // the caller's connection closes
    let end = Instant::now() + Duration::from_secs(5);
    while !dropped.load(Ordering::SeqCst) {
        assert!(Instant::now() < end, "the service's future was not dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A response that started and then produces nothing more (an event
/// stream): when its caller leaves, the app's body is dropped at once, not
/// when the worker's connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_who_leaves_mid_body_drops_the_services_body() {
    use futures_util::StreamExt;
    use http_body::Frame;
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    let svc = tower::service_fn(move |_: Request<TunnelBody>| {
        let guard = SetOnDrop(flag.clone());
        async move {
            let first = futures_util::stream::once(async {
                Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"hello")))
            });
            // Never ends; holds the guard for as long as the body lives.
            let body = first.chain(futures_util::stream::pending()).map(move |f| {
                let _ = &guard;
                f
            });
            Ok::<_, BoxError>(Response::new(http_body_util::StreamBody::new(body)))
        }
    });
    let addr = with_worker(svc).await;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(b"GET /w/abc/events HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // The head and the first piece arrive: the response has started.
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(5).any(|w| w == b"hello") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("the response started")
            .unwrap();
        assert!(n > 0, "closed before the first piece");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(!dropped.load(Ordering::SeqCst));
    drop(s); // the caller leaves
    let end = Instant::now() + Duration::from_secs(5);
    while !dropped.load(Ordering::SeqCst) {
        assert!(Instant::now() < end, "the service's body was not dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A caller whose upload goes silent past the gateway's upload timeout is
/// answered 408 (nginx's client_body_timeout), and the worker's app sees
/// its body fail; a caller whose body breaks its own framing gets 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_is_a_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gateway = Gateway::builder(TokenTable::parse("abc ct-abc-0000000000").unwrap())
        .upload_timeout(Duration::from_millis(300))
        .build();
    let (app, _) = app();
    let addr = worker_on(relay_with(gateway).await, app).await;
    let answer = |request: &'static [u8]| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got));
        let _ = read.await.expect("an answer and a close within 10 s");
        String::from_utf8_lossy(&got).into_owned()
    };
    // 100 bytes announced, 10 sent, then silence (the socket stays open).
    let t = Instant::now();
    let a = answer(b"POST /w/abc/sum HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\nconnection: close\r\n\r\n0123456789").await;
    assert!(a.starts_with("HTTP/1.1 408"), "{a}");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    // A chunked body with a size line that is not hex: 400.
    let a = answer(b"POST /w/abc/sum HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\nzz\r\n").await;
    assert!(a.starts_with("HTTP/1.1 400"), "{a}");
}

#[tokio::test]
async fn a_final_refusal_ends_run_and_a_retry_does_not() {
    let (addr, _) = relay().await;
    // A wrong token: 401, final.
    let svc = tower::service_fn(|_: Request<TunnelBody>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let tunnel = Tunnel::new(format!("ws://{addr}/connect"), Token::new("wrong").ok());
    // `run` returns only on a final refusal: one that retried the 401
    // would never return (cut here at 60 s; how fast is not asserted).
    let refused = tokio::time::timeout(Duration::from_secs(60), tunnel.run(svc)).await;
    assert_eq!(refused, Ok(Refused::Status(401)));
    // Nothing listening: a network error, retried (with the jitter given)
    // until we stop waiting.
    let port = closed_port::closed_port();
    let draws = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let d = draws.clone();
    let tunnel = Tunnel::new(format!("ws://127.0.0.1:{port}/connect"), None).jitter(move || {
        d.fetch_add(1, Ordering::SeqCst);
        0.0
    });
    let run = tokio::time::timeout(Duration::from_millis(1800), tunnel.run(svc));
    assert!(
        run.await.is_err(),
        "a network error must not end the worker"
    );
    assert!(
        draws.load(Ordering::SeqCst) >= 2,
        "the jitter source was not used"
    );
    let tunnel = Tunnel::new("http://not-a-websocket", None);
    assert!(matches!(tunnel.run(svc).await, Refused::InvalidUrl(_)));
}

/// Opens `/gate` only once told to; answers anything else at once.
#[derive(Clone)]
struct Gated {
    entered: Arc<tokio::sync::Notify>,
    open: Arc<tokio::sync::Notify>,
}

impl tower::Service<Request<TunnelBody>> for Gated {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<TunnelBody>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            if req.uri().path() == "/gate" {
                this.entered.notify_one();
                this.open.notified().await;
                return Ok(Response::new(Full::new(Bytes::from_static(b"opened"))));
            }
            Ok(Response::new(Full::new(Bytes::from_static(b"at once"))))
        })
    }
}

/// A request's first poll runs in the connection's task (issue 42): one
/// that waits then goes on its own task, where it is woken and answers,
/// and the answers ready at once do not wait for it. On one thread, so
/// that nothing but the move lets the second request through.
#[tokio::test(flavor = "current_thread")]
async fn a_request_that_waits_moves_to_its_own_task_and_others_go_past_it() {
    let gated = Gated {
        entered: Arc::new(tokio::sync::Notify::new()),
        open: Arc::new(tokio::sync::Notify::new()),
    };
    let addr = with_worker(gated.clone()).await;
    let waiting = tokio::spawn(client::request(
        addr,
        "GET",
        "/w/abc/gate",
        &[],
        Bytes::new(),
    ));
    tokio::time::timeout(Duration::from_secs(5), gated.entered.notified())
        .await
        .expect("the service saw /gate");
    for _ in 0..3 {
        let a = tokio::time::timeout(
            Duration::from_secs(5),
            client::request(addr, "GET", "/w/abc/now", &[], Bytes::new()),
        )
        .await
        .expect("an answer ready at once went past the waiting one")
        .unwrap();
        assert_eq!((a.status, a.body), (200, Bytes::from_static(b"at once")));
    }
    assert!(!waiting.is_finished());
    gated.open.notify_one();
    let a = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting request was woken on its own task")
        .unwrap()
        .unwrap();
    assert_eq!((a.status, a.body), (200, Bytes::from_static(b"opened")));
}
