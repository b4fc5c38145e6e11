//! Issue 44: the gateway on a host that is not hyper. A host whose
//! WebSocket library gives two halves (`HostSocket`), one that hands over
//! the upgraded connection as bytes (`Admission::upgrade_local`, the way
//! actix-web does: the request's payload in, a streaming 101's body out),
//! and callers' bodies that are not `Send` (`Gateway::forward_local`), all
//! in memory: no hyper server, no TCP. `examples/actix.rs` runs the same
//! API under actix-web, and `.ci/conformance actix` runs the kit against it.

mod common;

use bytes::Bytes;
use common::mem::{socket_pair, MemSocket};
use futures::{SinkExt, StreamExt};
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::BodyExt;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;
use worker_relay::connect::{Token, TokenTable, WorkerHandshake};
use worker_relay::frame::{CloseCode, Headers, ResponseHead};
use worker_relay::proto::WorkerConfig;
use worker_relay::rt::{self, BodyError};
use worker_relay_hyper::gateway::{Gateway, GatewayBody, HostSocket, Presence};
use worker_relay_hyper::ws::WsSocket;
use worker_relay_hyper::TokioTimer;

const TOKENS: &str = "abc ct-abc-0000000000";

fn headers() -> http::HeaderMap {
    WorkerHandshake::new(Token::new("ct-abc-0000000000").ok())
        .request_headers()
        .to_header_map()
}

/// A worker on `socket` that answers every request 200 with its path and
/// the request's body.
fn serve_worker<S, E>(socket: S)
where
    S: futures::Stream<Item = Result<worker_relay::frame::Message, E>>
        + futures::Sink<worker_relay::frame::Message, Error = E>
        + Unpin
        + Send
        + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let (incoming, driver) = rt::worker(socket, TokioTimer, WorkerConfig::default());
    tokio::spawn(driver);
    answer_each(incoming);
}

/// Answers every request 200 with its path and the request's body.
fn answer_each(mut incoming: rt::Incoming) {
    tokio::spawn(async move {
        while let Some(mut req) = incoming.next().await {
            let mut text = format!("{} ", req.head.path());
            while let Some(Ok(piece)) = req.body.next().await {
                text.push_str(&String::from_utf8_lossy(&piece));
            }
            let head = ResponseHead::new(200, Headers::new()).unwrap();
            let mut body = req.responder.respond(head).unwrap();
            let _ = body.send(Bytes::from(text)).await;
            let _ = body.close().await;
        }
    });
}

async fn connected(news: &mut tokio::sync::broadcast::Receiver<Presence>) {
    let wait = async { while !matches!(news.recv().await, Ok(Presence::Connected { .. })) {} };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the worker was registered");
}

async fn text(resp: http::Response<GatewayBody>) -> (StatusCode, String) {
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A stream that is not `Send` (as actix-web's `Payload` is not).
fn local_stream(
    pieces: Vec<&'static str>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + 'static {
    let not_send = Rc::new(());
    futures::stream::iter(pieces).map(move |p| {
        let _ = &not_send;
        Ok(Bytes::from(p))
    })
}

#[tokio::test]
async fn a_socket_in_two_halves_is_served_and_callers_reach_it_through_forward_request() {
    let gateway = Gateway::new(TokenTable::parse(TOKENS).unwrap());
    let mut news = gateway.subscribe();
    let admission = gateway.admit("/connect", &headers(), None).await.unwrap();
    let (relay_end, worker_end): (MemSocket, MemSocket) = socket_pair();
    let (sink, stream) = relay_end.split();
    tokio::spawn(admission.serve(HostSocket::new(stream, sink)));
    serve_worker(worker_end);
    connected(&mut news).await;
    let req = Request::post("/w/abc/echo")
        .body(http_body_util::Full::new(Bytes::from("up")))
        .unwrap();
    assert_eq!(
        text(gateway.forward_request(req).await).await,
        (StatusCode::OK, "/echo up".into())
    );
}

/// An upgraded connection in memory, as actix-web hands one over: what
/// the worker writes arrives as pieces of a stream that is not `Send`, and
/// the 101's body goes back to it as is. The worker (the crate's `rt`,
/// answering with each request's path and body) runs until the returned
/// sender is dropped (gone without a close) or its connection ends (its
/// driver's end in the second handle). The first handle is the 101's body's
/// end, as the host sees it.
struct InMemory {
    body_end: tokio::task::JoinHandle<Result<(), BodyError>>,
    dropper: tokio::sync::oneshot::Sender<()>,
    worker_end: tokio::task::JoinHandle<Option<String>>,
}

async fn upgraded_in_memory(gateway: &Gateway) -> InMemory {
    let mut news = gateway.subscribe();
    let mut handshake = headers();
    handshake.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    handshake.insert(
        header::SEC_WEBSOCKET_KEY,
        HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="),
    );
    handshake.insert(
        header::SEC_WEBSOCKET_VERSION,
        HeaderValue::from_static("13"),
    );
    let admission = gateway.admit("/connect", &handshake, None).await.unwrap();
    let (worker_io, host_io) = tokio::io::duplex(64 << 10);
    let (mut from_worker, mut to_worker) = tokio::io::split(host_io);
    let not_send = Rc::new(());
    let incoming = futures::stream::poll_fn(move |cx| {
        let _ = &not_send;
        let mut buf = vec![0; 4096];
        let mut read = std::pin::pin!(from_worker.read(&mut buf));
        read.as_mut().poll(cx).map(|n| match n {
            Ok(0) => None,
            Ok(n) => Some(Ok::<_, std::io::Error>(Bytes::copy_from_slice(&buf[..n]))),
            Err(e) => Some(Err(e)),
        })
    });
    let resp = admission.upgrade_local(incoming, None);
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(
        resp.headers()[header::SEC_WEBSOCKET_ACCEPT],
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
    assert_eq!(
        resp.headers()[header::SEC_WEBSOCKET_PROTOCOL],
        worker_relay::frame::SUBPROTOCOL
    );
    let mut out = resp.into_body().into_stream();
    let body_end = tokio::task::spawn_local(async move {
        while let Some(piece) = out.next().await {
            match piece {
                Ok(piece) => to_worker.write_all(&piece).await.unwrap(),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    // The worker, on its end of the bytes (the handshake is the host's;
    // the frames are the gateway's).
    let ws = WebSocketStream::from_raw_socket(worker_io, Role::Client, None).await;
    let (dropper, drop_worker) = tokio::sync::oneshot::channel::<()>();
    let (incoming, driver) = rt::worker(WsSocket(ws), TokioTimer, WorkerConfig::default());
    let worker_end = tokio::spawn(async move {
        tokio::select! {
            ended = driver => Some(format!("{ended:?}")),
            _ = drop_worker => None, // gone without a close
        }
    });
    answer_each(incoming);
    connected(&mut news).await;
    InMemory {
        body_end,
        dropper,
        worker_end,
    }
}

#[tokio::test]
async fn an_upgraded_connection_given_as_bytes_serves_callers_with_bodies_that_are_not_send() {
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let gateway = Gateway::new(TokenTable::parse(TOKENS).unwrap());
            let InMemory {
                body_end, dropper, ..
            } = upgraded_in_memory(&gateway).await;

            // A body that is not `Send`, read on this thread.
            let req = Request::post("/w/abc/echo")
                .header(header::CONTENT_LENGTH, "11")
                .body(local_stream(vec!["hello", " ", "world"]))
                .unwrap();
            assert_eq!(
                text(gateway.forward_local(req).await).await,
                (StatusCode::OK, "/echo hello world".into())
            );
            // No body by its framing: nothing read, the worker gets `end`.
            let req = Request::get("/w/abc/health")
                .body(local_stream(vec![]))
                .unwrap();
            assert_eq!(
                text(gateway.forward_local(req).await).await,
                (StatusCode::OK, "/health ".into())
            );
            // Chunked: read until the stream ends.
            let req = Request::post("/w/abc/up")
                .header(header::TRANSFER_ENCODING, "chunked")
                .body(local_stream(vec!["a", "b"]))
                .unwrap();
            assert_eq!(
                text(gateway.forward_local(req).await).await,
                (StatusCode::OK, "/up ab".into())
            );

            // The worker goes without a close: the 101's body ends with an
            // error, so a host drops the connection rather than ending it
            // as if all were well.
            drop(dropper);
            let ended = tokio::time::timeout(Duration::from_secs(20), body_end)
                .await
                .expect("the 101's body ended")
                .unwrap();
            assert!(ended.is_err(), "{ended:?}");
        })
        .await;
}

#[tokio::test]
async fn upgrade_local_refuses_what_is_not_a_websocket_upgrade() {
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let gateway = Gateway::new(TokenTable::parse(TOKENS).unwrap());
            // No `Upgrade` or `Sec-WebSocket-Key`: 400, as `connect` answers.
            let admission = gateway.admit("/connect", &headers(), None).await.unwrap();
            let resp = admission.upgrade_local(local_stream(vec![]), None);
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
            // Another WebSocket version: 426 naming 13.
            let mut handshake = headers();
            handshake.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            handshake.insert(header::SEC_WEBSOCKET_KEY, HeaderValue::from_static("a2V5"));
            handshake.insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("8"));
            let admission = gateway.admit("/connect", &handshake, None).await.unwrap();
            let resp = admission.upgrade_local(local_stream(vec![]), None);
            assert_eq!(resp.status(), StatusCode::UPGRADE_REQUIRED);
            assert_eq!(resp.headers()[header::SEC_WEBSOCKET_VERSION], "13");
            assert!(!gateway.is_connected("abc"));
        })
        .await;
}

#[tokio::test]
async fn a_drain_closes_an_upgraded_connection_with_1012_and_its_101_body_ends_cleanly() {
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let gateway = Gateway::new(TokenTable::parse(TOKENS).unwrap());
            let InMemory {
                body_end,
                dropper: _dropper,
                worker_end,
            } = upgraded_in_memory(&gateway).await;
            gateway
                .drain(Duration::from_secs(1), CloseCode::SERVICE_RESTART)
                .await;
            let worker = tokio::time::timeout(Duration::from_secs(10), worker_end)
                .await
                .expect("the worker's connection ended")
                .unwrap()
                .expect("by its close");
            assert!(worker.contains("1012"), "{worker}");
            let ended = tokio::time::timeout(Duration::from_secs(10), body_end)
                .await
                .expect("the 101's body ended")
                .unwrap();
            assert!(
                ended.is_ok(),
                "a good close ends the body cleanly: {ended:?}"
            );
            assert!(!gateway.is_connected("abc"));
        })
        .await;
}

#[tokio::test]
async fn let_go_takes_a_tokio_or_std_tcp_stream_and_nothing_else() {
    use worker_relay_hyper::gateway::LetGo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dialled = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (accepted, _) = listener.accept().await.unwrap();
    assert!(LetGo::of(&accepted).is_some());
    let std_stream = dialled.into_std().unwrap();
    assert!(LetGo::of(&std_stream).is_some());
    assert!(LetGo::of(&"a Unix socket, say").is_none());
}
