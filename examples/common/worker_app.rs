//! The worker: dials the relay, reconnects with backoff, serves a small app.
#![allow(dead_code)] // shared by several examples and tests, each using a part

use crate::ws::{ws_config, TokioTimer, WsSocket};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use sha2::{Digest, Sha256};
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError, SubProtocolError};
use worker_relay::connect::{Backoff, Refused, Token, Verdict, WorkerHandshake};
use worker_relay::frame::{Headers, ResponseHead};
use worker_relay::proto::WorkerConfig;
use worker_relay::rt::{self, Request};

/// What the worker needs to run.
pub struct WorkerOptions {
    pub connect_url: String,
    pub connect_token: Option<Token>,
    pub worker_token: Option<Token>,
    /// Log lines are prefixed with this.
    pub name: String,
}

/// Connects, serves, and reconnects with the backoff until a final refusal.
/// Returns the process exit status (1 on a final refusal).
pub async fn run(opts: WorkerOptions) -> i32 {
    let handshake = WorkerHandshake::new(opts.connect_token.clone());
    let mut backoff = Backoff::default();
    let worker_token = opts.worker_token.clone();
    loop {
        let verdict = match connect(&opts.connect_url, &handshake).await {
            Ok(ws) => {
                eprintln!("{}: connected to {}", opts.name, opts.connect_url);
                backoff.reset();
                let (incoming, driver) =
                    rt::worker(WsSocket(ws), TokioTimer, WorkerConfig::default());
                let app = tokio::spawn(serve(incoming, worker_token.clone()));
                let result = driver.await;
                app.abort();
                match result {
                    Ok(rt::Closed::ByPeer(frame)) => eprintln!(
                        "{}: the relay closed the connection{}",
                        opts.name,
                        frame.map_or(String::new(), |f| format!(
                            " (code {}{}{})",
                            f.code.0,
                            if f.reason.is_empty() { "" } else { ": " },
                            f.reason
                        ))
                    ),
                    Ok(other) => eprintln!("{}: {other}", opts.name),
                    Err(rt::DriverError::KeepaliveTimeout) => eprintln!(
                        "{}: keepalive timeout: the relay answered no ping and read \
                         nothing for 20 s (frozen or unreachable); dropped the connection",
                        opts.name
                    ),
                    Err(e) => eprintln!("{}: lost the relay: {e}", opts.name),
                }
                Verdict::closed()
            }
            Err(v) => v,
        };
        match verdict {
            Verdict::Refused(r) => {
                eprintln!(
                    "{}: the relay refused the worker: {r}; giving up",
                    opts.name
                );
                return 1;
            }
            Verdict::Retry(reason) => {
                let wait = backoff.next_wait(random_unit());
                eprintln!(
                    "{}: {reason}; reconnecting in {:.1} s",
                    opts.name,
                    wait.as_secs_f64()
                );
                tokio::time::sleep(wait).await;
            }
            _ => unreachable!("connect() returns the socket when connected"),
        }
    }
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(url: &str, handshake: &WorkerHandshake) -> Result<Ws, Verdict> {
    let mut request = url
        .into_client_request()
        .map_err(|_| Verdict::Refused(Refused::Status(400)))?;
    for (name, value) in handshake.request_headers().iter() {
        let Ok(v) = value.parse() else { continue };
        request.headers_mut().insert(name, v);
    }
    let connecting = tokio_tungstenite::connect_async_with_config(request, Some(ws_config()), true);
    match tokio::time::timeout(Duration::from_secs(10), connecting).await {
        Err(_) => Err(Verdict::network_error()),
        Ok(Ok((ws, response))) => match Verdict::from_http_response(&response) {
            Verdict::Connected => Ok(ws),
            other => Err(other),
        },
        Ok(Err(WsError::Http(response))) => Err(Verdict::from_http_response(&response)),
        Ok(Err(WsError::Protocol(ProtocolError::SecWebSocketSubProtocolError(e)))) => {
            Err(Verdict::Refused(match e {
                SubProtocolError::NoSubProtocol => Refused::NoSubprotocol,
                other => Refused::WrongSubprotocol(other.to_string()),
            }))
        }
        Ok(Err(_)) => Err(Verdict::network_error()),
    }
}

/// A number in [0, 1) from the standard library's per-process random hasher keys.
fn random_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Serves every request of one connection, each on its own task.
pub async fn serve(mut incoming: rt::Incoming, worker_token: Option<Token>) {
    while let Some(req) = incoming.next().await {
        tokio::spawn(handle(req, worker_token.clone()));
    }
}

fn head(status: u16, pairs: &[(&str, &str)]) -> ResponseHead {
    ResponseHead::new(
        status,
        Headers::try_from_pairs(pairs.iter().copied()).expect("valid headers"),
    )
    .expect("valid status")
}

fn query_param(query: &str, name: &str) -> Option<u64> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

/// Answers with `body` and its Content-Length; to HEAD (`head_only`) with
/// the same head and no body, as an HTTP server does.
async fn reply(responder: rt::Responder, status: u16, ctype: &str, body: Bytes, head_only: bool) {
    let len = body.len().to_string();
    let Ok(mut sink) = responder.respond(head(
        status,
        &[("content-type", ctype), ("content-length", &len)],
    )) else {
        return;
    };
    if !head_only && !body.is_empty() && sink.send(body).await.is_err() {
        return;
    }
    let _ = sink.close().await;
}

fn authorized(req: &Request, token: &Option<Token>) -> bool {
    let Some(token) = token else { return true };
    let mut values = req.head.headers().get_all("authorization");
    let (Some(v), None) = (values.next(), values.next()) else {
        return false;
    };
    v.strip_prefix("Bearer ")
        .is_some_and(|t| token.matches(t.as_bytes()))
}

/// The app: the routes of the examples' contract.
pub async fn handle(req: Request, worker_token: Option<Token>) {
    if !authorized(&req, &worker_token) {
        // 401 without reading the body: dropping it discards the rest.
        let Request {
            responder, body, ..
        } = req;
        drop(body);
        return reply(
            responder,
            401,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"unauthorized\n"),
            false,
        )
        .await;
    }
    let Request {
        head: rh,
        mut body,
        responder,
        ..
    } = req;
    let head_only = rh.method() == "HEAD";
    // HEAD is served as GET; the state machine sends the head without a body.
    let method = match rh.method() {
        "HEAD" => "GET",
        m => m,
    };
    match (method, rh.path()) {
        ("GET", "/health") => {
            reply(
                responder,
                200,
                "application/json",
                Bytes::from_static(br#"{"status":"ok"}"#),
                head_only,
            )
            .await
        }
        ("POST", "/echo") => {
            let ctype = rh
                .headers()
                .get("content-type")
                .unwrap_or("application/octet-stream")
                .to_owned();
            let mut pairs = vec![("content-type", ctype.as_str())];
            let len = rh.headers().get("content-length").map(str::to_owned);
            if let Some(l) = &len {
                pairs.push(("content-length", l));
            }
            let Ok(mut sink) = responder.respond(head(200, &pairs)) else {
                return;
            };
            while let Some(piece) = body.next().await {
                let Ok(piece) = piece else { return };
                if sink.send(piece).await.is_err() {
                    return;
                }
            }
            let _ = sink.close().await;
        }
        ("POST", "/sha256") => {
            let mut hasher = Sha256::new();
            let mut n: u64 = 0;
            while let Some(piece) = body.next().await {
                let Ok(piece) = piece else { return };
                n += piece.len() as u64;
                hasher.update(&piece);
            }
            let hex: String = hasher
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            reply(
                responder,
                200,
                "text/plain",
                Bytes::from(format!("{hex} {n}")),
                false,
            )
            .await
        }
        ("POST", "/slow-sink") => {
            // Reads the body at `mibps` MiB/s (a slow disk), answers its length.
            let mibps = query_param(rh.query(), "mibps").unwrap_or(1).max(1);
            let mut n: u64 = 0;
            while let Some(piece) = body.next().await {
                let Ok(piece) = piece else { return };
                n += piece.len() as u64;
                let secs = piece.len() as f64 / (mibps as f64 * 1024.0 * 1024.0);
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
            }
            reply(
                responder,
                200,
                "text/plain",
                Bytes::from(n.to_string()),
                false,
            )
            .await
        }
        ("GET", "/bytes") => {
            let n = query_param(rh.query(), "n").unwrap_or(0);
            let len = n.to_string();
            let Ok(mut sink) = responder.respond(head(
                200,
                &[
                    ("content-type", "application/octet-stream"),
                    ("content-length", &len),
                ],
            )) else {
                return;
            };
            let mut sent = 0u64;
            while sent < n && !head_only {
                let size = (n - sent).min(256 * 1024) as usize;
                let piece: Vec<u8> = (0..size as u64).map(|i| ((sent + i) % 251) as u8).collect();
                if sink.send(Bytes::from(piece)).await.is_err() {
                    return;
                }
                sent += size as u64;
            }
            let _ = sink.close().await;
        }
        ("GET", "/sleep") => {
            let ms = query_param(rh.query(), "ms").unwrap_or(0);
            let gone = responder.client_gone();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {
                    reply(responder, 200, "text/plain", Bytes::from(format!("slept {ms} ms")), head_only).await
                }
                _ = gone => eprintln!("worker: /sleep: the client has gone"),
            }
        }
        ("GET", "/fail-before") => responder.fail(),
        ("GET", "/fail-after") => {
            let n = query_param(rh.query(), "n").unwrap_or(0) as usize;
            let Ok(mut sink) =
                responder.respond(head(200, &[("content-type", "application/octet-stream")]))
            else {
                return;
            };
            let _ = sink.send(Bytes::from(vec![b'x'; n])).await;
            let _ = sink.flush().await;
            sink.fail();
        }
        _ => {
            reply(
                responder,
                404,
                "text/plain; charset=utf-8",
                Bytes::from_static(b"not found\n"),
                head_only,
            )
            .await
        }
    }
}
