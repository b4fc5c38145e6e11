//! Shared by the loopback benches (`e2e`, `latency`): the examples' relay and
//! worker stacks started in this process, a "direct" hyper server that serves
//! the same app routes the same way, and a small hyper client.
//!
//! The bench crate root declares the examples' module `worker_app` with
//! `#[path]`, as the examples do; the relay is the crate's
//! gateway served as the relay example serves it.
#![allow(dead_code)]

use crate::worker_app;
use bytes::Bytes;
use futures_util::stream;
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use worker_relay::connect::{Token, TokenTable, WorkerId};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::ServerConfig;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;

/// The worker id the benches register with the relay.
pub const WORKER: &str = "bench";

/// A random token (from the standard library's per-process hasher keys).
pub fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    (0..4)
        .map(|i| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(i);
            format!("{:016x}", h.finish())
        })
        .collect()
}

/// The two ways to reach the app: through the relay, and directly.
pub struct Stack {
    /// The relay's address; the app is under `/w/bench/`.
    pub relay: SocketAddr,
    /// The direct hyper server's address; the app is at `/`.
    pub direct: SocketAddr,
    /// `Bearer <worker token>`, checked by both.
    pub auth: String,
}

impl Stack {
    /// The target of `path` through the relay, or directly.
    pub fn target(&self, via_relay: bool, path: &str) -> (SocketAddr, String) {
        if via_relay {
            (self.relay, format!("/w/{WORKER}{path}"))
        } else {
            (self.direct, path.to_owned())
        }
    }
}

/// Starts the relay, the worker (dialling it) and the direct server on
/// 127.0.0.1 inside the current tokio runtime; returns once the worker is connected.
pub async fn start() -> Stack {
    let connect_token = Token::new(random_token()).unwrap();
    let worker_token = Token::new(random_token()).unwrap();
    let mut tokens = TokenTable::new();
    tokens
        .insert(WorkerId::new(WORKER).unwrap(), connect_token.clone())
        .unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = listener.local_addr().unwrap();
    let relay = Gateway::new(tokens);
    let service = relay.service();
    tokio::spawn(worker_relay_hyper::server::serve(
        listener,
        service,
        ServerConfig::default(),
    ));
    tokio::spawn(worker_app::run(worker_app::WorkerOptions {
        connect_url: format!("ws://{relay_addr}/connect"),
        connect_token: Some(connect_token),
        worker_token: Some(worker_token.clone()),
        name: "bench-worker".into(),
        dialer: Default::default(),
    }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !relay.is_connected(WORKER) {
        assert!(
            Instant::now() < deadline,
            "the worker did not connect within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let direct = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let direct_addr = direct.local_addr().unwrap();
    tokio::spawn(serve_direct(direct, worker_token.clone()));

    Stack {
        relay: relay_addr,
        direct: direct_addr,
        auth: format!("Bearer {}", worker_token.expose_secret()),
    }
}

// ----- the direct server: the examples' app routes on plain hyper -----

async fn serve_direct(listener: tokio::net::TcpListener, token: Token) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let _ = stream.set_nodelay(true);
        let token = token.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| direct(req, token.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The direct server over TLS: plain hyper behind tokio-rustls, HTTP/1.1.
pub async fn serve_direct_tls(
    listener: tokio::net::TcpListener,
    token: Token,
    tls: std::sync::Arc<rustls::ServerConfig>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let _ = stream.set_nodelay(true);
        let token = token.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(stream).await else {
                return;
            };
            let service = hyper::service::service_fn(move |req| direct(req, token.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn full(status: u16, ctype: &str, body: Bytes) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", ctype)
        .header("content-length", body.len())
        .body(Full::new(body).map_err(|e| match e {}).boxed())
        .unwrap()
}

fn query_param(query: &str, name: &str) -> Option<u64> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

/// The same routes as `cli/src/worker_app.rs`, the same way: the same
/// auth check, SHA-256 over each body piece, `/bytes` made in 256 KiB pieces
/// by the same expression, `/echo` streaming the request body back.
async fn direct(req: Request<Incoming>, token: Token) -> Result<Response<Body>, Infallible> {
    let authorized = {
        let mut values = req.headers().get_all("authorization").iter();
        match (values.next(), values.next()) {
            (Some(v), None) => v
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|t| token.matches(t.as_bytes())),
            _ => false,
        }
    };
    if !authorized {
        return Ok(full(
            401,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"unauthorized\n"),
        ));
    }
    let query = req.uri().query().unwrap_or("").to_owned();
    let path = req.uri().path().to_owned();
    Ok(match (req.method().as_str(), path.as_str()) {
        ("GET", "/health") => full(
            200,
            "application/json",
            Bytes::from_static(br#"{"status":"ok"}"#),
        ),
        ("POST", "/sha256") => {
            let mut body = req.into_body();
            let mut hasher = Sha256::new();
            let mut n: u64 = 0;
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else {
                    return Ok(full(400, "text/plain", Bytes::new()));
                };
                if let Ok(piece) = frame.into_data() {
                    n += piece.len() as u64;
                    hasher.update(&piece);
                }
            }
            let hex: String = hasher
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            full(200, "text/plain", Bytes::from(format!("{hex} {n}")))
        }
        ("GET", "/bytes") => {
            let n = query_param(&query, "n").unwrap_or(0);
            let pieces = stream::unfold(0u64, move |sent| async move {
                if sent >= n {
                    return None;
                }
                let size = (n - sent).min(256 * 1024) as usize;
                let piece: Vec<u8> = (0..size as u64).map(|i| ((sent + i) % 251) as u8).collect();
                Some((
                    Ok::<_, BoxError>(Frame::data(Bytes::from(piece))),
                    sent + size as u64,
                ))
            });
            Response::builder()
                .status(200)
                .header("content-type", "application/octet-stream")
                .header("content-length", n)
                .body(BodyExt::boxed(StreamBody::new(pieces)))
                .unwrap()
        }
        ("POST", "/echo") => {
            let mut resp = Response::builder().status(200).header(
                "content-type",
                req.headers()
                    .get("content-type")
                    .cloned()
                    .unwrap_or_else(|| "application/octet-stream".parse().unwrap()),
            );
            if let Some(l) = req.headers().get("content-length") {
                resp = resp.header("content-length", l.clone());
            }
            resp.body(req.into_body().map_err(|e| Box::new(e) as BoxError).boxed())
                .unwrap()
        }
        _ => full(
            404,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"not found\n"),
        ),
    })
}

// ----- the client -----

/// One HTTP/1.1 connection (keep-alive) to `addr`.
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Body>,
    addr: SocketAddr,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Result<Conn, BoxError> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Conn::over(stream, addr).await
    }

    /// One HTTP/1.1 connection over TLS to `addr` as `localhost`.
    pub async fn open_tls(
        addr: SocketAddr,
        tls: std::sync::Arc<rustls::ClientConfig>,
    ) -> Result<Conn, BoxError> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::try_from("localhost")?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, stream)
            .await?;
        Conn::over(stream, addr).await
    }

    async fn over<I>(io: I, addr: SocketAddr) -> Result<Conn, BoxError>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { sender, addr })
    }

    /// Sends one request; reads the response body to the end, counting its
    /// bytes (they are not kept). Returns (status, body length).
    pub async fn send(
        &mut self,
        method: &str,
        target: &str,
        auth: &str,
        body: Option<Bytes>,
    ) -> Result<(u16, u64), BoxError> {
        let req = Request::builder()
            .method(method)
            .uri(target)
            .header("host", self.addr.to_string())
            .header("authorization", auth);
        let req = match body {
            Some(b) => req
                .header("content-type", "application/octet-stream")
                .header("content-length", b.len())
                .body(Full::new(b).map_err(|e| match e {}).boxed())?,
            None => req.body(Empty::new().map_err(|e| match e {}).boxed())?,
        };
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let mut body = resp.into_body();
        let mut n = 0u64;
        while let Some(frame) = body.frame().await {
            if let Ok(d) = frame?.into_data() {
                n += d.len() as u64;
            }
        }
        Ok((status, n))
    }
}

/// One request on a new connection (as the examples' client does).
pub async fn once(
    addr: SocketAddr,
    method: &str,
    target: &str,
    auth: &str,
    body: Option<Bytes>,
) -> Result<(u16, u64), BoxError> {
    Conn::open(addr)
        .await?
        .send(method, target, auth, body)
        .await
}

/// A tokio runtime with as many workers as the machine has cores (2 here),
/// or with `BENCH_THREADS=1` everything on one thread: relay, worker, direct
/// server and client all share it.
pub fn runtime() -> tokio::runtime::Runtime {
    let mut b = match std::env::var("BENCH_THREADS").as_deref() {
        Ok("1") => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    b.enable_all().build().unwrap()
}
