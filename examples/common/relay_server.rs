//! The relay: accepts workers on `/connect`, presents each at `/w/<id>/…`.
#![allow(dead_code)] // shared by several examples and tests, each using a part

use crate::overflow::TempFiles;
use crate::ws::{ws_config, TokioTimer, WsSocket};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::WebSocketStream;
use worker_relay::connect::http::{decide_upgrade_http, request_head_from_parts, response_builder};
use worker_relay::connect::{TokenTable, UrlError, UrlMap};
use worker_relay::frame::{CloseCode, SUBPROTOCOL};
use worker_relay::proto::{OpenError, OverflowConfig, RelayConfig};
use worker_relay::rt::{self, DriverError, Overflow, RelayError, RelayHandle};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;

/// The path workers dial.
pub const CONNECT_PATH: &str = "/connect";

/// Parses a tokens file: lines `<worker-id> <connect-token>`; blank lines and
/// lines starting with `#` are ignored. Errors never quote a token.
pub fn load_tokens(text: &str) -> Result<TokenTable, String> {
    let mut table = TokenTable::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(id), Some(token), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!(
                "line {}: expected `<worker-id> <connect-token>`",
                n + 1
            ));
        };
        let id = worker_relay::connect::WorkerId::new(id)
            .map_err(|e| format!("line {}: worker id: {e}", n + 1))?;
        let token = worker_relay::connect::Token::new(token)
            .map_err(|e| format!("line {}: token: {e}", n + 1))?;
        table
            .insert(id, token)
            .map_err(|e| format!("line {}: {e}", n + 1))?;
    }
    Ok(table)
}

struct Conn {
    generation: u64,
    handle: RelayHandle,
}

/// The relay's state: who may connect, and who is connected.
pub struct Relay {
    tokens: TokenTable,
    urls: UrlMap,
    workers: Mutex<HashMap<String, Conn>>,
    generation: AtomicU64,
    config: RelayConfig,
    overflow: Arc<dyn Overflow>,
}

/// The example's connection settings: the crate's defaults, with slow
/// callers' responses overflowing to temporary files (1 MiB in memory per
/// stream, at most 1 GiB on disk per response and 4 GiB per worker).
pub fn default_config() -> RelayConfig {
    RelayConfig::builder()
        .overflow(Some(OverflowConfig::default()))
        .build()
        .unwrap()
}

impl Relay {
    pub fn new(tokens: TokenTable) -> Arc<Relay> {
        Relay::with_config(tokens, default_config())
    }

    /// A relay whose connections use `config` (bounds, reserve, refused
    /// methods, overflow), overflowing to temporary files in the system's
    /// temporary directory.
    pub fn with_config(tokens: TokenTable, config: RelayConfig) -> Arc<Relay> {
        Relay::with_overflow(
            tokens,
            config,
            Arc::new(TempFiles::new(std::env::temp_dir())),
        )
    }

    /// A relay whose slow callers' responses overflow to `overflow`.
    pub fn with_overflow(
        tokens: TokenTable,
        config: RelayConfig,
        overflow: Arc<dyn Overflow>,
    ) -> Arc<Relay> {
        Arc::new(Relay {
            tokens,
            urls: UrlMap::default(),
            workers: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(1),
            config,
            overflow,
        })
    }

    /// The connection of worker `id`, if it is connected.
    pub fn handle(&self, id: &str) -> Option<RelayHandle> {
        Some(self.workers.lock().unwrap().get(id)?.handle.clone())
    }

    /// Whether worker `id` is connected now.
    pub fn is_connected(&self, id: &str) -> bool {
        self.workers.lock().unwrap().contains_key(id)
    }

    /// The counters of worker `id`'s connection, if it is connected.
    pub fn stats(&self, id: &str) -> Option<worker_relay::proto::Stats> {
        let handle = self.workers.lock().unwrap().get(id)?.handle.clone();
        Some(handle.stats())
    }
}

/// Serves HTTP and worker connections on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, relay: Arc<Relay>) -> std::io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let relay = relay.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(relay.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            let _ = conn.await;
        });
    }
}

fn plain(status: StatusCode, text: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(
            Full::new(Bytes::from(format!("{text}\n")))
                .map_err(|e| match e {})
                .boxed(),
        )
        .expect("static response")
}

async fn handle(relay: Arc<Relay>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    if req.uri().path() == CONNECT_PATH {
        return Ok(accept_worker(relay, req));
    }
    Ok(forward(relay, req).await)
}

/// `/connect`: the WebSocket handshake, then the connection's life.
fn accept_worker(relay: Arc<Relay>, req: Request<Incoming>) -> Response<Body> {
    let is_upgrade = req
        .headers()
        .get("upgrade")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let Some(key) = req
        .headers()
        .get("sec-websocket-key")
        .cloned()
        .filter(|_| is_upgrade)
    else {
        eprintln!("relay: refused a connection to {CONNECT_PATH}: not a WebSocket upgrade (400)");
        return plain(StatusCode::BAD_REQUEST, "expected a WebSocket upgrade");
    };
    let accepted = match decide_upgrade_http(&relay.tokens, req.headers()) {
        Ok(a) => a,
        Err(rejected) => {
            eprintln!(
                "relay: refused a worker: {rejected} ({})",
                rejected.status()
            );
            let mut resp = plain(
                StatusCode::from_u16(rejected.status()).unwrap(),
                &rejected.to_string(),
            );
            for (n, v) in rejected.response_headers() {
                resp.headers_mut().insert(*n, v.parse().unwrap());
            }
            return resp;
        }
    };
    let worker = accepted.into_worker();
    let accept = derive_accept_key(key.as_bytes());
    let relay2 = relay.clone();
    tokio::spawn(async move {
        let upgraded = match hyper::upgrade::on(req).await {
            Ok(u) => u,
            Err(e) => {
                eprintln!("relay: worker {worker}: upgrade failed: {e}");
                return;
            }
        };
        let ws = WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            Role::Server,
            Some(ws_config()),
        )
        .await;
        let (handle, driver) = rt::relay_with_overflow(
            WsSocket(ws),
            TokioTimer,
            relay2.config.clone(),
            relay2.overflow.clone(),
        );
        let generation = relay2.generation.fetch_add(1, Ordering::Relaxed);
        let old = relay2
            .workers
            .lock()
            .unwrap()
            .insert(worker.as_str().to_owned(), Conn { generation, handle });
        if let Some(old) = old {
            eprintln!("relay: worker {worker} reconnected; closing its previous connection");
            old.handle
                .close(CloseCode::POLICY_VIOLATION, "replaced by a new connection");
        }
        eprintln!("relay: worker {worker} connected");
        let result = driver.await;
        {
            let mut workers = relay2.workers.lock().unwrap();
            if workers
                .get(worker.as_str())
                .is_some_and(|c| c.generation == generation)
            {
                workers.remove(worker.as_str());
            }
        }
        match result {
            Ok(closed) => eprintln!("relay: worker {worker} disconnected: {closed}"),
            Err(DriverError::KeepaliveTimeout) => eprintln!(
                "relay: worker {worker} disconnected: keepalive timeout \
                 (no pong and nothing read for 20 s: frozen or gone)"
            ),
            Err(e) => eprintln!("relay: worker {worker} disconnected: {e}"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", accept)
        .header("sec-websocket-protocol", SUBPROTOCOL)
        .body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed())
        .expect("static response")
}

/// The answer to a request the relay refuses: `status` from
/// `RelayError::status` (a 503 says when to retry).
fn refusal(status: u16, text: &str) -> Response<Body> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut resp = plain(status, text);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut()
            .insert("retry-after", hyper::header::HeaderValue::from_static("1"));
    }
    resp
}

/// `/w/<id>/…`: forward to the worker, stream the answer back.
async fn forward(relay: Arc<Relay>, req: Request<Incoming>) -> Response<Body> {
    if relay.config.refuses_method(req.method().as_str()) {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    }
    let (parts, body) = req.into_parts();
    let (worker, head) = match request_head_from_parts(&parts, &relay.urls) {
        Ok(x) => x,
        Err(worker_relay::connect::http::HttpError::Url(UrlError::NotUnderPrefix)) => {
            return plain(StatusCode::NOT_FOUND, "not found");
        }
        Err(e) => return plain(StatusCode::BAD_REQUEST, &format!("bad request: {e}")),
    };
    if !relay.tokens.contains(worker.as_str()) {
        return plain(StatusCode::NOT_FOUND, "unknown worker");
    }
    let handle = match relay.workers.lock().unwrap().get(worker.as_str()) {
        Some(c) => c.handle.clone(),
        None => return plain(StatusCode::SERVICE_UNAVAILABLE, "worker not connected"),
    };
    let (mut sink, response) = match handle.send_request(head) {
        Ok(x) => x,
        Err(e @ RelayError::Open(OpenError::TooManyStreams { .. })) => {
            return refusal(e.status(), "worker busy");
        }
        Err(e) => return refusal(e.status(), &format!("refused: {e}")),
    };
    // The request body streams to the worker while we wait for the answer.
    // If the caller's body fails (a malformed chunked body, a reset), the
    // sink is dropped unclosed: the stream is aborted and the response
    // future ends with `RequestAborted`, answered 400.
    let upload = async move {
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return };
            if let Ok(data) = frame.into_data() {
                if sink.send(data).await.is_err() {
                    return;
                }
            }
        }
        let _ = sink.close().await;
    };
    let upload = tokio::spawn(upload);
    let resp = match response.await {
        Ok(r) => r,
        Err(e @ RelayError::RequestAborted) => {
            return refusal(e.status(), "bad request body");
        }
        Err(e) => {
            upload.abort();
            return refusal(e.status(), &format!("worker failed: {e}"));
        }
    };
    let builder = match response_builder(&resp.head) {
        Ok(b) => b,
        Err(e) => {
            return plain(
                StatusCode::BAD_GATEWAY,
                &format!("bad response from worker: {e}"),
            )
        }
    };
    // A failed body ends the caller's response as failed (hyper closes the
    // connection mid-body). Before the error, let hyper flush what arrived,
    // so the caller sees the response start and the bytes the worker sent.
    let body = StreamBody::new(resp.body.then(|r| async move {
        match r {
            Ok(data) => Ok(Frame::data(data)),
            Err(e) => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                Err(Box::new(e) as BoxError)
            }
        }
    }));
    builder
        .body(BodyExt::boxed(body))
        .unwrap_or_else(|_| plain(StatusCode::BAD_GATEWAY, "bad response"))
}
