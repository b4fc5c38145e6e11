//! Issue 23: the caller's upload through the gateway. Each piece goes to
//! the worker when the caller pauses (an interactive upload); the upload
//! belongs to the request (dropping the forward future or the response body
//! aborts the stream, and what the caller still sends is discarded for a
//! bounded time); a worker that takes none of the body is given up
//! after the send timeout (504), and one that sends no head after the
//! response-head timeout (504).

use bytes::Bytes;
use futures_util::stream;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::Service;
use worker_relay::connect::{Token, TokenTable};
use worker_relay_hyper::gateway::{Gateway, GatewayBuilder};
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Piece = Result<Frame<Bytes>, Infallible>;
type AppBody = BoxBody<Bytes, BoxError>;
type ChannelBody = StreamBody<stream::BoxStream<'static, Piece>>;

fn builder() -> GatewayBuilder {
    Gateway::builder(TokenTable::parse("abc ct-abc-0000000000").unwrap())
}

/// What the worker's app saw.
#[derive(Default)]
struct Seen {
    /// `/hold` was entered.
    entered: AtomicBool,
    /// `/hold`'s future was dropped (the tunnel drops it when the caller
    /// has gone).
    dropped: AtomicBool,
}

struct SetOnDrop(Arc<Seen>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.dropped.store(true, Ordering::SeqCst);
    }
}

/// `/echo` streams the body back as it arrives; `/hold` takes the body,
/// reads none of it and answers after 60 s; `/head-then-hold` answers at
/// once with a body that never ends, reading none of the request body;
/// `/refuse` answers 401 at once, reading none of the request body.
async fn app(req: Request<TunnelBody>, seen: Arc<Seen>) -> Result<Response<AppBody>, BoxError> {
    match req.uri().path() {
        "/echo" => Ok(Response::new(req.into_body().map_err(Into::into).boxed())),
        "/refuse" => {
            drop(req);
            let text = Full::new(Bytes::from_static(b"refused unread"));
            let mut resp = Response::new(text.map_err(|e| match e {}).boxed());
            *resp.status_mut() = http::StatusCode::UNAUTHORIZED;
            Ok(resp)
        }
        "/hold" => {
            let _guard = SetOnDrop(seen.clone());
            seen.entered.store(true, Ordering::SeqCst);
            let _unread = req.into_body();
            tokio::time::sleep(Duration::from_secs(60)).await;
            Err("held".into())
        }
        _ => Err("no such route".into()),
    }
}

/// A relay (`builder`'s gateway, served on loopback) and a worker serving
/// [`app`] through it.
async fn stack(builder: GatewayBuilder) -> (SocketAddr, Gateway, Arc<Seen>) {
    let gateway = builder.build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let svc = tower::service_fn(move |req| app(req, s.clone()));
    let tunnel = Tunnel::new(
        format!("ws://{addr}/connect"),
        Token::new("ct-abc-0000000000").ok(),
    );
    tokio::spawn(tunnel.run(svc));
    wait_for("the worker to connect", || gateway.is_connected("abc")).await;
    (addr, gateway, seen)
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < end, "waited 10 s for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A request body fed piece by piece through the returned sender; it ends
/// when the sender is dropped.
fn channel_body() -> (tokio::sync::mpsc::Sender<Piece>, ChannelBody) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Piece>(1);
    let pieces = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|p| (p, rx)) });
    (
        tx,
        StreamBody::new(Box::pin(pieces) as stream::BoxStream<'static, Piece>),
    )
}

fn piece(data: impl Into<Bytes>) -> Piece {
    Ok(Frame::data(data.into()))
}

fn streams_open(gateway: &Gateway) -> u64 {
    gateway.stats("abc").map_or(0, |s| s.streams_open)
}

/// Send a piece, read its echo, ten times, over real HTTP through the
/// relay and the worker: each round trip completes (on 98ad246 the first
/// piece waited in the gateway's sink for the second one, and the upload
/// ended only at `upload_timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_upload_gets_each_piece_echoed_before_the_next() {
    let (addr, _gateway, _) = stack(builder()).await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let (tx, body) = channel_body();
    let req = Request::post("/w/abc/echo")
        .header("host", "relay.test")
        .body(body)
        .unwrap();
    let mut response = Some(tokio::spawn(sender.send_request(req)));
    let mut body = None;
    let mut times = Vec::new();
    for i in 0..10 {
        let data = Bytes::from(format!("piece {i} of an interactive upload\n"));
        let t = Instant::now();
        tx.send(piece(data.clone())).await.unwrap();
        if let Some(response) = response.take() {
            // The head comes once the worker's app has the request.
            let resp = tokio::time::timeout(Duration::from_secs(5), response)
                .await
                .expect("the response head within 5 s")
                .unwrap()
                .unwrap();
            assert_eq!(resp.status(), 200);
            body = Some(resp.into_body());
        }
        let body = body.as_mut().unwrap();
        let mut echo = Vec::new();
        read_echo(body, &mut echo, data.len(), i).await;
        assert_eq!(echo, data);
        times.push(t.elapsed());
    }
    drop(tx); // the end of the upload: the echo ends too
    let end = tokio::time::timeout(Duration::from_secs(5), body.unwrap().frame()).await;
    assert!(
        matches!(end, Ok(None)),
        "the echo ends with the upload: {end:?}"
    );
    eprintln!("round trips: {times:?}");
}

/// Reads from `body` until `want` bytes have come, each within 5 s.
async fn read_echo(body: &mut hyper::body::Incoming, into: &mut Vec<u8>, want: usize, i: usize) {
    while into.len() < want {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .unwrap_or_else(|_| panic!("round trip {i}: no echo within 5 s"))
            .expect("the echo goes on")
            .unwrap();
        if let Ok(d) = frame.into_data() {
            into.extend_from_slice(&d);
        }
    }
}

/// Dropping the forward future before the head aborts the stream at once
/// while the caller's body is still open: the worker sees its client go at
/// once and the stream is gone (on 98ad246 the detached upload task kept
/// the stream open for as long as the caller's body stayed open). And the
/// response body dropped after the head, the upload unfinished: the same.
/// Either way what the caller still sends is read and discarded (so that a
/// server in front would not reset a caller that is still writing), and
/// the body is let go after the lingering time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_request_aborts_its_upload() {
    let linger = Duration::from_millis(500);
    let (_, gateway, seen) = stack(builder().lingering_time(linger)).await;
    let mut forward = gateway.forward();

    // Before the head.
    let (tx, body) = channel_body();
    tx.send(piece("the first piece")).await.unwrap();
    let req = Request::post("/w/abc/hold").body(body).unwrap();
    tokio::select! {
        r = forward.call(req) => panic!("/hold answered: {:?}", r.map(|r| r.status())),
        () = wait_for("the app to get the request", || seen.entered.load(Ordering::SeqCst)) => {}
    }
    // The forward future is dropped; the caller's body is still open.
    wait_for("the app to see its client go", || {
        seen.dropped.load(Ordering::SeqCst)
    })
    .await;
    wait_for("the stream to close", || streams_open(&gateway) == 0).await;
    let dropped = Instant::now();
    assert_still_read(&tx).await;
    wait_for("the upload to let go of the caller's body", || {
        tx.is_closed()
    })
    .await;
    assert!(dropped.elapsed() >= linger - Duration::from_millis(100));
    drop(tx);

    // After the head: /echo answers at once; the caller keeps its body open,
    // then drops the response body.
    let (tx, body) = channel_body();
    tx.send(piece("hello")).await.unwrap();
    let req = Request::post("/w/abc/echo").body(body).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), forward.call(req))
        .await
        .expect("the head within 5 s")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut resp_body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), resp_body.frame())
        .await
        .expect("the echo of the first piece within 5 s")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "hello");
    assert_eq!(streams_open(&gateway), 1);
    drop(resp_body);
    wait_for("the stream to close", || streams_open(&gateway) == 0).await;
    assert_still_read(&tx).await;
    wait_for("the upload to let go of the caller's body", || {
        tx.is_closed()
    })
    .await;
}

/// Twenty more pieces of the caller's body are taken (the channel holds
/// one), within 5 s.
async fn assert_still_read(tx: &tokio::sync::mpsc::Sender<Piece>) {
    for i in 0..20 {
        tokio::time::timeout(Duration::from_secs(5), tx.send(piece(vec![b'x'; 4096])))
            .await
            .unwrap_or_else(|_| panic!("piece {i} of the discarded body was not taken in 5 s"))
            .unwrap_or_else(|_| panic!("the body was let go before piece {i}"));
    }
}

/// A worker that answers before it reads the body (a 401): the rest of the
/// body is discarded, not sent; a caller that sends nothing more is let go
/// after the upload timeout, within the lingering time; one whose body
/// ends is let go when it ends, and its connection serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_answer_discards_the_rest_of_the_body_within_bounds() {
    let upload_timeout = Duration::from_millis(400);
    let (addr, gateway, _) = stack(builder().upload_timeout(upload_timeout)).await;
    let mut forward = gateway.forward();

    // A caller that stops sending: let go after the upload timeout.
    let (tx, body) = channel_body();
    tx.send(piece("a first piece")).await.unwrap();
    let req = Request::post("/w/abc/refuse").body(body).unwrap();
    let resp = forward.call(req).await.unwrap();
    assert_eq!(resp.status(), 401);
    let whole = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(whole, "refused unread");
    wait_for("the stream to close", || streams_open(&gateway) == 0).await;
    assert_still_read(&tx).await;
    let idle = Instant::now();
    wait_for("the upload to let go of a silent caller's body", || {
        tx.is_closed()
    })
    .await;
    assert!(idle.elapsed() >= upload_timeout - Duration::from_millis(100));
    drop(tx);

    // Over real HTTP on one connection: a body streamed slowly after the
    // 401, then a second request on the same connection.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let (tx, body) = channel_body();
    let req = Request::post("/w/abc/refuse")
        .header("host", "relay")
        .body(body)
        .unwrap();
    let feeder = tokio::spawn(async move {
        for _ in 0..10 {
            tx.send(piece(vec![b'y'; 64 << 10])).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(req))
        .await
        .expect("the 401 within 5 s")
        .unwrap();
    assert_eq!(resp.status(), 401);
    resp.into_body().collect().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), feeder)
        .await
        .expect("all of the body taken within 5 s")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), sender.ready())
        .await
        .expect("the connection ready again within 5 s")
        .expect("the connection kept alive");
    let again = Request::get("/w/abc/refuse")
        .header("host", "relay")
        .body(channel_body().1)
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), sender.send_request(again))
        .await
        .expect("a second answer within 5 s")
        .unwrap();
    assert_eq!(resp.status(), 401);
}

/// A worker whose app never reads its request body while the caller keeps
/// uploading: the worker holds 16 chunks and stops reading its socket, the
/// relay's queue for the stream fills, and its sink is not ready. Past the
/// send timeout the stream is aborted and the caller answered 504 (on
/// 98ad246 the upload waited for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_takes_none_of_the_body_is_a_504_after_the_send_timeout() {
    let send_timeout = Duration::from_millis(500);
    let (_, gateway, seen) = stack(builder().send_timeout(send_timeout)).await;
    let pulled = Arc::new(AtomicU64::new(0));
    let p = pulled.clone();
    let piece_64k = Bytes::from(vec![7u8; 64 << 10]);
    // At most 1 GiB: far more than the worker, the sockets and the relay's
    // queue hold, so a body that ends means the sink never stopped it.
    let pieces = stream::iter(0..16_384).map(move |_| {
        p.fetch_add(1, Ordering::SeqCst);
        piece(piece_64k.clone())
    });
    use futures_util::StreamExt;
    let body = StreamBody::new(Box::pin(pieces) as stream::BoxStream<'static, Piece>);
    let req = Request::post("/w/abc/hold").body(body).unwrap();
    let t = Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(30), gateway.forward().call(req))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    let took = t.elapsed();
    let mib = pulled.load(Ordering::SeqCst) as f64 / 16.0;
    assert_eq!(resp.status(), 504, "after {took:?}, {mib} MiB pulled");
    assert!(seen.entered.load(Ordering::SeqCst));
    assert!(took >= send_timeout, "{took:?}");
    assert!(mib < 1024.0, "the whole body went: the sink never stalled");
    wait_for("the stream to close", || streams_open(&gateway) == 0).await;
    eprintln!("504 after {took:?}, {mib} MiB of the body pulled");
}

/// No response head within the response-head timeout: 504, the stream
/// aborted (the app sees its client go).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_head_within_the_response_head_timeout_is_a_504() {
    let timeout = Duration::from_millis(300);
    let (_, gateway, seen) = stack(builder().response_head_timeout(Some(timeout))).await;
    let req = Request::get("/w/abc/hold")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let t = Instant::now();
    let resp = tokio::time::timeout(Duration::from_secs(10), gateway.forward().call(req))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    assert_eq!(resp.status(), 504);
    assert!(t.elapsed() >= timeout, "{:?}", t.elapsed());
    assert!(seen.entered.load(Ordering::SeqCst));
    wait_for("the app to see its client go", || {
        seen.dropped.load(Ordering::SeqCst)
    })
    .await;
    wait_for("the stream to close", || streams_open(&gateway) == 0).await;
}
