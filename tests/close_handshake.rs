//! Issue 39: the close is a handshake (RFC 6455 §7.1.1). A relay that
//! closes a worker's connection while the worker streams a large response
//! keeps reading (and discarding) until the worker's close, then shuts the
//! socket; it no longer drops a socket with unread bytes, whose TCP reset
//! could erase its close message at the worker. The worker gets the close
//! code and reason every time, over `ws://` and `wss://`: a revoked token
//! (1008 `token revoked`) and a replaced connection ([`CloseCode::REPLACED`],
//! which the tunnel's backoff reads).

#[path = "tls/support.rs"]
mod tls;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::Request;
use http_body_util::{BodyExt, Empty};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tower::Service;
use worker_relay::connect::REPLACED;
use worker_relay::connect::{Token, TokenTable, WorkerHandshake};
use worker_relay::frame::{CloseCode, CloseFrame, Headers, ResponseHead};
use worker_relay::proto::WorkerConfig;
use worker_relay::rt::{self, Closed, DriverError};
use worker_relay_hyper::gateway::{Gateway, REVOKED};
use worker_relay_hyper::server::{serve, ServerConfig, ServerTls};
use worker_relay_hyper::ws::{self, Dialer};
use worker_relay_hyper::TokioTimer;

const TOKEN: &str = "ct-close-0123456789abcdef";

/// Connections tried per case: the reset this guards against lost the
/// close in every try before the fix, but a race is a race.
const TRIES: usize = 10;

/// Bytes of the endless response the caller reads before the relay closes.
const STREAMED: u64 = 4 << 20;

fn table() -> TokenTable {
    TokenTable::parse(&format!("abc {TOKEN}")).unwrap()
}

/// A relay on loopback, plain or TLS (a certificate for `localhost` from a
/// CA made now), and the dialer and URL its worker uses.
struct Relay {
    gateway: Gateway,
    url: String,
    dialer: Dialer,
    _files: Option<tls::TlsFiles>,
}

async fn relay(gateway: Gateway, tls: bool) -> Relay {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (config, url, dialer, files) = if tls {
        let files = tls::TlsFiles::new();
        let server = ServerTls::from_pem_files(&files.cert, &files.key).unwrap();
        let dialer = Dialer::new().ca_pem(files.ca.pem().as_bytes()).unwrap();
        let url = format!("wss://localhost:{}/connect", addr.port());
        (
            ServerConfig::default().tls(server),
            url,
            dialer,
            Some(files),
        )
    } else {
        let url = format!("ws://{addr}/connect");
        (ServerConfig::default(), url, Dialer::new(), None)
    };
    tokio::spawn(serve(listener, gateway.service(), config));
    Relay {
        gateway,
        url,
        dialer,
        _files: files,
    }
}

async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < end, "waited {within:?} for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

type Ended = tokio::task::JoinHandle<Result<Closed, DriverError<ws::Error>>>;

/// A worker connected to `relay`, its app answering every request with
/// an endless body of 64 KiB pieces; the task ends with its driver.
async fn streaming_worker(relay: &Relay) -> Ended {
    let handshake = WorkerHandshake::new(Token::new(TOKEN).ok());
    let socket = relay.dialer.dial(&relay.url, &handshake).await.unwrap();
    let (mut incoming, driver) = rt::worker(socket, TokioTimer, WorkerConfig::default());
    tokio::spawn(async move {
        while let Some(req) = incoming.next().await {
            tokio::spawn(async move {
                let head = ResponseHead::new(200, Headers::new()).unwrap();
                let Ok(mut sink) = req.responder.respond(head) else {
                    return;
                };
                let piece = Bytes::from(vec![7u8; 64 << 10]);
                while sink.send(piece.clone()).await.is_ok() {}
            });
        }
    });
    tokio::spawn(driver)
}

/// Starts a caller on the worker's endless response and returns once it
/// has read [`STREAMED`] bytes: the worker is sending flat out. The caller
/// keeps reading until the body ends.
async fn stream_from(gateway: &Gateway) {
    let req = Request::get("/w/abc/stream")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), gateway.forward().call(req))
        .await
        .expect("a response head within 10 s")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut body = resp.into_body();
        let (mut n, mut tx) = (0u64, Some(tx));
        while let Some(Ok(frame)) = body.frame().await {
            n += frame.data_ref().map_or(0, |d| d.len() as u64);
            if n >= STREAMED {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(());
                }
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(20), rx)
        .await
        .expect("4 MiB streamed within 20 s")
        .expect("the body ended before 4 MiB");
}

async fn ended(worker: Ended) -> Result<Closed, DriverError<ws::Error>> {
    tokio::time::timeout(Duration::from_secs(15), worker)
        .await
        .expect("the worker's driver ended within 15 s")
        .unwrap()
}

fn by_peer(code: CloseCode, reason: &str) -> Closed {
    Closed::ByPeer(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

async fn revoked_while_streaming(tls: bool) {
    for attempt in 0..TRIES {
        let relay = relay(Gateway::new(table()), tls).await;
        let worker = streaming_worker(&relay).await;
        stream_from(&relay.gateway).await;
        let other = TokenTable::parse("def ct-def-0123456789abcdef").unwrap();
        assert_eq!(relay.gateway.replace_tokens(other).len(), 1);
        match ended(worker).await {
            Ok(c) if c == by_peer(CloseCode::POLICY_VIOLATION, REVOKED) => {}
            other => panic!("try {attempt} (tls {tls}): the worker saw {other:?}"),
        }
    }
}

async fn replaced_while_streaming(tls: bool) {
    for attempt in 0..TRIES {
        let gateway = Gateway::builder(table())
            .replace_grace(Duration::ZERO)
            .build();
        let relay = relay(gateway, tls).await;
        let old = streaming_worker(&relay).await;
        stream_from(&relay.gateway).await;
        let handle = relay.gateway.handle("abc").unwrap();
        let new = streaming_worker(&relay).await;
        wait_for(
            "the new connection to take over",
            Duration::from_secs(10),
            || handle.is_closed(),
        )
        .await;
        match ended(old).await {
            Ok(c) if c == by_peer(CloseCode::REPLACED, REPLACED) => {}
            other => panic!("try {attempt} (tls {tls}): the worker saw {other:?}"),
        }
        new.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_revoked_while_streaming_gets_the_close_over_ws() {
    revoked_while_streaming(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_revoked_while_streaming_gets_the_close_over_wss() {
    revoked_while_streaming(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_replaced_while_streaming_gets_the_close_over_ws() {
    replaced_while_streaming(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_replaced_while_streaming_gets_the_close_over_wss() {
    replaced_while_streaming(true).await;
}

/// A worker that takes the relay's close and then neither answers it nor
/// ends the socket holds the relay's driver until the close deadline, not
/// longer (tokio's paused clock: the deadline is exact).
#[tokio::test(start_paused = true)]
async fn a_peer_that_never_answers_the_close_is_dropped_at_the_deadline() {
    use tokio_tungstenite::tungstenite::protocol::Role;
    use worker_relay::proto::{CloseCause, RelayConfig};
    let (relay_io, worker_io) = tokio::io::duplex(64 << 10);
    let socket = ws::WsSocket::server(relay_io).await;
    // The worker's end: a WebSocket client that never reads.
    let silent =
        tokio_tungstenite::WebSocketStream::from_raw_socket(worker_io, Role::Client, None).await;
    let config = RelayConfig::default();
    let deadline = config.close_timeout();
    let (handle, driver) = rt::relay(socket, TokioTimer, config);
    let ended = tokio::spawn(driver);
    tokio::task::yield_now().await;
    let start = tokio::time::Instant::now();
    handle.close(CloseCode::GOING_AWAY, "bye");
    match ended.await.unwrap() {
        Err(DriverError::CloseTimeout(CloseCause::Local(CloseCode::GOING_AWAY))) => {}
        other => panic!("expected a close timeout, got {other:?}"),
    }
    assert_eq!(start.elapsed(), deadline);
    drop(silent);
}

/// `WsSocket`'s close shuts the write side of its byte stream (TLS sends
/// its `close_notify`, TCP its FIN; tungstenite itself only flushes): the
/// peer reads the close message, then the end of the stream, while the
/// socket is still held.
#[tokio::test]
async fn closing_a_ws_socket_shuts_its_write_side() {
    use tokio::io::AsyncReadExt;
    let (ours, mut theirs) = tokio::io::duplex(4096);
    let mut socket = ws::WsSocket::server(ours).await;
    SinkExt::close(&mut socket).await.unwrap();
    let mut bytes = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), theirs.read_to_end(&mut bytes))
        .await
        .expect("the stream ends while the socket is held")
        .unwrap();
    // A close frame from a server: FIN + opcode 8, unmasked, no payload.
    assert_eq!(bytes, [0x88, 0x00]);
    drop(socket);
}

/// A peer that sends its close and drops the socket at once (a relay of an
/// earlier version did, after its close): our answer cannot be written,
/// and that ends the close in good order, with the peer's code and reason
/// (the tunnel's backoff reads them), not in a socket error.
#[tokio::test]
async fn a_close_from_a_peer_that_drops_the_socket_at_once_is_still_read() {
    use tokio_tungstenite::tungstenite::protocol::{frame::coding, CloseFrame as WsClose, Role};
    use tokio_tungstenite::tungstenite::Message as WsMessage;
    for worker_side in [true, false] {
        let (ours, theirs) = tokio::io::duplex(64 << 10);
        let (our_role, their_role) = if worker_side {
            (Role::Client, Role::Server)
        } else {
            (Role::Server, Role::Client)
        };
        let socket = ws::WsSocket(
            tokio_tungstenite::WebSocketStream::from_raw_socket(ours, our_role, None).await,
        );
        let mut peer =
            tokio_tungstenite::WebSocketStream::from_raw_socket(theirs, their_role, None).await;
        let task: Ended = if worker_side {
            let (incoming, driver) = rt::worker(socket, TokioTimer, WorkerConfig::default());
            tokio::spawn(async move {
                let r = driver.await;
                drop(incoming);
                r
            })
        } else {
            let config = worker_relay::proto::RelayConfig::default();
            let (handle, driver) = rt::relay(socket, TokioTimer, config);
            tokio::spawn(async move {
                let r = driver.await;
                drop(handle);
                r
            })
        };
        let close = WsClose {
            code: coding::CloseCode::from(4000),
            reason: REPLACED.into(),
        };
        peer.send(WsMessage::Close(Some(close))).await.unwrap();
        drop(peer);
        match ended(task).await {
            Ok(c) if c == by_peer(CloseCode::REPLACED, REPLACED) => {}
            other => panic!("worker side {worker_side}: {other:?}"),
        }
    }
}
