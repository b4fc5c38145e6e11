//! Issue 23, tunnel mode: a request whose body is empty by its headers
//! goes upstream without chunking, whatever HTTP client the worker's
//! service uses; and the example's upstream proxy (`worker --upstream`)
//! opens at most its bound of connections, however many callers come.

#[path = "../cli/src/tunnel_upstream.rs"]
mod tunnel_upstream;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use futures_util::stream;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower::ServiceExt;
use worker_relay::connect::{Token, TokenTable};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a request arrived at the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Arrived {
    method: String,
    transfer_encoding: Option<String>,
    content_length: Option<String>,
    body: usize,
}

/// What the upstream saw: each request, the connections it accepted, and
/// the most requests it held at once.
#[derive(Default)]
struct Upstream {
    arrived: Mutex<Vec<Arrived>>,
    accepted: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
}

/// A plain hyper server: records each request; `/slow` streams its answer,
/// the last piece after 50 ms (so that callers overlap, and a connection
/// is free again only once a body has ended).
async fn start_upstream() -> (SocketAddr, Arc<Upstream>) {
    start_upstream_with(true).await
}

/// [`start_upstream`], closing every connection after one answer unless
/// `keep_alive`.
async fn start_upstream_with(keep_alive: bool) -> (SocketAddr, Arc<Upstream>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Upstream::default());
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            s.accepted.fetch_add(1, Ordering::SeqCst);
            let s = s.clone();
            let svc = hyper::service::service_fn(move |req| handle(req, s.clone()));
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .keep_alive(keep_alive)
                    .serve_connection(TokioIo::new(tcp), svc),
            );
        }
    });
    (addr, seen)
}

async fn handle(
    req: Request<Incoming>,
    seen: Arc<Upstream>,
) -> Result<Response<BoxBody>, Infallible> {
    let n = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    seen.most_in_flight.fetch_max(n, Ordering::SeqCst);
    let header = |name: &str| {
        req.headers()
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let mut arrived = Arrived {
        method: req.method().to_string(),
        transfer_encoding: header("transfer-encoding"),
        content_length: header("content-length"),
        body: 0,
    };
    let slow = req.uri().path() == "/slow";
    arrived.body = req
        .into_body()
        .collect()
        .await
        .map_or(0, |b| b.to_bytes().len());
    seen.arrived.lock().unwrap().push(arrived);
    if !slow {
        seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        return Ok(Response::new(Full::from("ok").boxed()));
    }
    let pieces = stream::unfold(0, move |i| {
        let seen = seen.clone();
        async move {
            match i {
                0 => Some((Ok(Frame::data(Bytes::from("o"))), 1)),
                1 => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    seen.in_flight.fetch_sub(1, Ordering::SeqCst);
                    Some((Ok(Frame::data(Bytes::from("k"))), 2))
                }
                _ => None,
            }
        }
    });
    Ok(Response::new(StreamBody::new(pieces).boxed()))
}

/// A relay on loopback with worker `abc` serving `service` through it.
async fn relay_and_worker<S, B>(service: S) -> SocketAddr
where
    S: tower::Service<Request<TunnelBody>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let gateway = Gateway::new(TokenTable::parse("abc ct-abc-0000000000").unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
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

type BoxBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// Sends one request to the relay on a new connection; its status.
async fn call(relay: SocketAddr, method: &str, path: &str, body: BoxBody) -> u16 {
    let tcp = tokio::net::TcpStream::connect(relay).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(format!("/w/abc{path}"))
        .header("host", "relay.test")
        .body(body)
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(20), sender.send_request(req))
        .await
        .expect("an answer within 20 s")
        .unwrap();
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

/// A DELETE without a body, then a POST whose body is streamed (chunked),
/// through the relay and a tunnel whose service is `service`: what the
/// upstream saw of each.
async fn delete_and_chunked_post<S, B>(service: S, upstream: &Upstream) -> Vec<Arrived>
where
    S: tower::Service<Request<TunnelBody>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let relay = relay_and_worker(service).await;
    assert_eq!(
        call(relay, "DELETE", "/thing", Empty::new().boxed()).await,
        200
    );
    let pieces = stream::iter(["two ", "pieces"].map(|p| Ok(Frame::data(Bytes::from(p)))));
    let chunked = StreamBody::new(pieces).boxed();
    assert_eq!(call(relay, "POST", "/thing", chunked).await, 200);
    upstream.arrived.lock().unwrap().clone()
}

fn arrived(method: &str, transfer_encoding: Option<&str>, body: usize) -> Arrived {
    Arrived {
        method: method.into(),
        transfer_encoding: transfer_encoding.map(Into::into),
        content_length: None,
        body,
    }
}

/// A plain hyper-util client given the tunnel's request as it is (no
/// peeking of its own): the bodiless DELETE goes upstream without
/// `Transfer-Encoding` (on 98ad246, `chunked` with an empty body), the
/// streamed POST still chunked and whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bodiless_request_goes_upstream_unchunked_through_a_plain_client() {
    let (up, seen) = start_upstream().await;
    let client: Client<_, TunnelBody> = Client::builder(TokioExecutor::new()).build_http();
    let proxy = tower::service_fn(move |mut req: Request<TunnelBody>| {
        let client = client.clone();
        async move {
            let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
            *req.uri_mut() = format!("http://{up}{target}").parse()?;
            let resp = client.request(req).await?;
            Ok::<_, BoxError>(resp)
        }
    });
    let got = delete_and_chunked_post(proxy, &seen).await;
    assert_eq!(
        got,
        [
            arrived("DELETE", None, 0),
            arrived("POST", Some("chunked"), 10)
        ]
    );
}

/// The same through the example's proxy (`worker --upstream`), which no
/// longer peeks at bodies itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bodiless_request_goes_upstream_unchunked_through_the_example_proxy() {
    let (up, seen) = start_upstream().await;
    let proxy = tunnel_upstream::Upstream::new(&format!("http://{up}"), 4).unwrap();
    let service = proxy
        .service()
        .map_request(|req: Request<TunnelBody>| req.map(axum::body::Body::new));
    let got = delete_and_chunked_post(service, &seen).await;
    assert_eq!(
        got,
        [
            arrived("DELETE", None, 0),
            arrived("POST", Some("chunked"), 10)
        ]
    );
}

/// 100 callers at once through the example's proxy bounded to 4
/// connections: every request succeeds, and the upstream accepts at most 4
/// connections (on 98ad246, one per concurrent request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_a_bounded_pool_of_upstream_connections() {
    const BOUND: usize = 4;
    let (up, seen) = start_upstream().await;
    let proxy = tunnel_upstream::Upstream::new(&format!("http://{up}"), BOUND).unwrap();
    let service = proxy
        .service()
        .map_request(|req: Request<TunnelBody>| req.map(axum::body::Body::new));
    let relay = relay_and_worker(service).await;
    let callers: Vec<_> = (0..100)
        .map(|_| tokio::spawn(call(relay, "GET", "/slow", Empty::new().boxed())))
        .collect();
    for c in callers {
        assert_eq!(c.await.unwrap(), 200);
    }
    let accepted = seen.accepted.load(Ordering::SeqCst);
    let most = seen.most_in_flight.load(Ordering::SeqCst);
    eprintln!("100 requests: {accepted} upstream connections, at most {most} requests at once");
    assert_eq!(seen.arrived.lock().unwrap().len(), 100);
    assert!(accepted <= BOUND, "{accepted} upstream connections");
    assert!(most <= BOUND, "{most} requests upstream at once");
}

/// An upstream that closes each connection after one answer: the pool
/// drops the closed connections and opens new ones; every request succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_upstream_closes_are_replaced() {
    let (up, seen) = start_upstream_with(false).await;
    let proxy = tunnel_upstream::Upstream::new(&format!("http://{up}"), 2).unwrap();
    let service = proxy
        .service()
        .map_request(|req: Request<TunnelBody>| req.map(axum::body::Body::new));
    let relay = relay_and_worker(service).await;
    for _ in 0..10 {
        assert_eq!(call(relay, "GET", "/", Empty::new().boxed()).await, 200);
    }
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 10);
}
