//! Issue 42: what the gateway's layers cost over the crate's core. A plain
//! harness, run by `bash benches/relay_layers.sh`: it is one of the relays
//! that script measures, beside the relay example.
//!
//! `relay_layers <mode> <workers' address> <callers' address>`, the connect
//! token of worker `abc` in `RELAY_LAYERS_TOKEN`. Workers dial the first
//! address (the crate's `Gateway` on its own server, as in the relay
//! example); callers' `GET /w/abc/<path>` on the second go to `abc` through
//! its [`RelayHandle`] with no more than the mode's HTTP/1:
//!
//! - `hyper`: hyper's HTTP/1 server with a `service_fn` that copies the
//!   request's head into a `RequestHead` and the response's into an
//!   `http::Response` (its body collected);
//! - `lean`: `httparse` and one write per response, as a proxy written for
//!   speed would do it;
//! - `server`: the `hyper` mode's service on the crate's server
//!   (`worker_relay_hyper::server::serve`: its sniffing, timers, peer
//!   address, counters);
//! - `gateway`: the gateway's own service on that server, as the relay
//!   example serves callers, but with no log subscriber in this process (no
//!   access line is formatted).
//!
//! `hyper` and `lean` have none of what the gateway adds per request (its
//! server's sniffing, timers, peer address and counters; the service's
//! routing checks, upload and send deadlines, access line and metrics),
//! nor request bodies, nor chunked responses: measuring devices for small
//! `GET`s, not relays.
//! A request it cannot carry closes its connection (answered 400 or 502
//! first where it can). Talks only to the addresses given (127.0.0.1 in the
//! script).

use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;
use std::io::Write as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use worker_relay::connect::{Token, TokenTable, WorkerId};
use worker_relay::frame::{Headers, RequestHead};
use worker_relay::rt::WorkerResponse;
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::{serve, ServerConfig};

const PREFIX: &str = "/w/abc";

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let [mode, workers, callers] = &args[..] else {
        // `cargo bench` alone: this is a relay for the script to start.
        eprintln!(
            "relay_layers: skipped (run `bash benches/relay_layers.sh`: it starts this as \
             `relay_layers lean|hyper|server|gateway WORKERS_ADDR CALLERS_ADDR`)"
        );
        return;
    };
    if !["lean", "hyper", "server", "gateway"].contains(&mode.as_str()) {
        eprintln!("relay_layers: mode is lean, hyper, server or gateway");
        std::process::exit(2);
    }
    let token = std::env::var("RELAY_LAYERS_TOKEN").expect("RELAY_LAYERS_TOKEN");
    let mut table = TokenTable::new();
    table
        .insert(
            WorkerId::new("abc").unwrap(),
            Token::new(token).expect("a valid token"),
        )
        .unwrap();
    // One event loop, as the relay example's default.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let gateway = Gateway::builder(table).build();
        let listener = tokio::net::TcpListener::bind(workers).await.unwrap();
        tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
        let listener = tokio::net::TcpListener::bind(callers).await.unwrap();
        eprintln!("relay_layers: {mode} on {callers}, workers on {workers}");
        match mode.as_str() {
            "gateway" => match serve(listener, gateway.service(), ServerConfig::default()).await {},
            "server" => {
                let service = tower::service_fn(move |req| {
                    let gateway = gateway.clone();
                    async move { Ok::<_, std::convert::Infallible>(via_hyper(req, gateway).await) }
                });
                match serve(listener, service, ServerConfig::default()).await {}
            }
            _ => {}
        }
        let lean = mode == "lean";
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let _ = socket.set_nodelay(true);
            let gateway = gateway.clone();
            if lean {
                tokio::spawn(serve_lean(socket, gateway));
            } else {
                tokio::spawn(serve_hyper(socket, gateway));
            }
        }
    });
}

/// The request's path after the worker's prefix, if it has it.
fn worker_path(target: &str) -> Option<&str> {
    target
        .strip_prefix(PREFIX)
        .filter(|rest| rest.starts_with('/'))
}

/// Sends `head` to `abc`; its response with the body whole.
async fn exchange(gateway: &Gateway, head: RequestHead) -> Option<(WorkerResponse, Bytes)> {
    let handle = gateway.handle("abc")?;
    let mut response = handle.send_empty(head).ok()?.await.ok()?;
    let mut body = BytesMut::new();
    while let Some(piece) = response.body.next().await {
        body.extend_from_slice(&piece.ok()?);
    }
    Some((response, body.freeze()))
}

async fn serve_lean(mut socket: TcpStream, gateway: Gateway) {
    let mut input = BytesMut::with_capacity(4096);
    let mut output = Vec::with_capacity(1024);
    loop {
        let head = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&input) {
                Ok(httparse::Status::Complete(used)) => {
                    let head = lean_head(&req);
                    input.advance(used);
                    break head;
                }
                Ok(httparse::Status::Partial) if input.len() < 64 << 10 => {
                    match socket.read_buf(&mut input).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
                _ => break None,
            }
        };
        let Some(head) = head else {
            let _ = socket
                .write_all(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
            return;
        };
        output.clear();
        match exchange(&gateway, head).await {
            Some((response, body)) => {
                let _ = write!(output, "HTTP/1.1 {} \r\n", response.head.status());
                for (name, value) in response.head.headers().iter() {
                    if name.eq_ignore_ascii_case("content-length") {
                        continue;
                    }
                    output.extend_from_slice(name.as_bytes());
                    output.extend_from_slice(b": ");
                    output.extend_from_slice(value.as_bytes());
                    output.extend_from_slice(b"\r\n");
                }
                let _ = write!(output, "content-length: {}\r\n\r\n", body.len());
                output.extend_from_slice(&body);
            }
            None => output.extend_from_slice(
                b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            ),
        }
        if socket.write_all(&output).await.is_err() || output.starts_with(b"HTTP/1.1 502") {
            return;
        }
    }
}

/// A body-less request's head for the worker, or `None`.
fn lean_head(req: &httparse::Request<'_, '_>) -> Option<RequestHead> {
    let target = worker_path(req.path?)?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut headers = Headers::new();
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length")
            || h.name.eq_ignore_ascii_case("transfer-encoding")
        {
            return None; // bodies are not this device's business
        }
        if h.name.eq_ignore_ascii_case("connection") {
            continue;
        }
        headers
            .try_push(h.name, std::str::from_utf8(h.value).ok()?)
            .ok()?;
    }
    RequestHead::new(req.method?, path, query, headers).ok()
}

async fn serve_hyper(socket: TcpStream, gateway: Gateway) {
    let service = hyper::service::service_fn(move |req| {
        let gateway = gateway.clone();
        async move { Ok::<_, std::convert::Infallible>(via_hyper(req, gateway).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(socket), service)
        .await;
}

async fn via_hyper(
    req: http::Request<hyper::body::Incoming>,
    gateway: Gateway,
) -> http::Response<http_body_util::Full<Bytes>> {
    let answer = |status: u16| {
        let mut r = http::Response::new(http_body_util::Full::new(Bytes::new()));
        *r.status_mut() = http::StatusCode::from_u16(status).expect("a valid status");
        r
    };
    let Some(head) = hyper_head(&req) else {
        return answer(400);
    };
    let Some((response, body)) = exchange(&gateway, head).await else {
        return answer(502);
    };
    let mut builder = http::Response::builder().status(response.head.status());
    for (name, value) in response.head.headers().iter() {
        builder = builder.header(name, value);
    }
    builder
        .body(http_body_util::Full::new(body))
        .unwrap_or_else(|_| answer(502))
}

/// A body-less request's head for the worker, or `None`.
fn hyper_head(req: &http::Request<hyper::body::Incoming>) -> Option<RequestHead> {
    let path = worker_path(req.uri().path())?;
    let mut headers = Headers::new();
    for (name, value) in req.headers() {
        if name == http::header::CONTENT_LENGTH || name == http::header::TRANSFER_ENCODING {
            return None;
        }
        if name == http::header::CONNECTION {
            continue;
        }
        headers.try_push(name.as_str(), value.to_str().ok()?).ok()?;
    }
    RequestHead::new(
        req.method().as_str(),
        path,
        req.uri().query().unwrap_or(""),
        headers,
    )
    .ok()
}
