//! Tunnel mode: every request forwarded to a local HTTP server, the bodies
//! streaming both ways (what ngrok or cloudflared do, through a relay).
//!
//! At most `connections` connections to the upstream, each carrying one
//! request at a time and kept alive between requests: a request takes one
//! (an idle one, or a new one while fewer exist) and gives it back when its
//! response body has ended, and while all are in use the next request
//! waits its turn. So a burst of callers does not become a burst of connects
//! to a server with a small backlog. (hyper-util's pooled client with a
//! semaphore in front was tried first: its checkout races a new connect
//! against a connection coming back to the pool, so it sometimes opened one
//! more connection than the bound.)
#![allow(dead_code)] // shared by the worker example and tests, each using a part

use crate::worker_app::plain;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::uri::{Authority, Scheme, Uri};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::error::Error;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::Service;
use worker_relay::frame::is_hop_by_hop_name;

type BoxError = Box<dyn Error + Send + Sync>;

/// The default bound on connections to the upstream:
/// `worker --upstream-connections N`.
pub const DEFAULT_CONNECTIONS: usize = 32;

/// Where requests go: an `http://host:port` server.
#[derive(Clone)]
pub struct Upstream {
    authority: Authority,
    /// `Host` for every request: the upstream's authority.
    host: HeaderValue,
    pool: Arc<Pool>,
}

impl Upstream {
    /// `url` is `http://HOST:PORT` (a path in it is ignored); at most
    /// `connections` (at least 1) connections to it.
    pub fn new(url: &str, connections: usize) -> Option<Upstream> {
        let uri: Uri = url.parse().ok()?;
        (uri.scheme() == Some(&Scheme::HTTP)).then_some(())?;
        let authority = uri.authority()?.clone();
        let host = HeaderValue::from_str(authority.as_str()).ok()?;
        Some(Upstream {
            host,
            pool: Arc::new(Pool {
                authority: authority.clone(),
                permits: Arc::new(Semaphore::new(connections.max(1))),
                idle: Mutex::new(Vec::new()),
            }),
            authority,
        })
    }

    /// The proxy as a tower service.
    pub fn service(
        self,
    ) -> impl Service<Request, Response = Response, Error = Infallible, Future: Send>
           + Clone
           + Send
           + Sync
           + 'static {
        forward.with_state(self)
    }
}

/// Forwards one request: the request's path and query to the upstream,
/// `Host` set to the upstream's, hop-by-hop headers dropped both ways, the
/// rest as it is. 502 if the upstream cannot be reached.
async fn forward(State(up): State<Upstream>, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let Ok(uri) = target.parse::<Uri>() else {
        return plain(StatusCode::BAD_REQUEST, "bad request target\n");
    };
    parts.uri = uri;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.insert(header::HOST, up.host.clone());
    match up.pool.send(Request::from_parts(parts, body)).await {
        Ok((resp, lease)) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            let body = Leased {
                body,
                lease: Some(lease),
            };
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => {
            let why = std::iter::successors(Some(&*e as &dyn Error), |&e| e.source());
            let why: Vec<String> = why.map(ToString::to_string).collect();
            tracing::warn!("upstream {}: {}", up.authority, why.join(": "));
            plain(
                StatusCode::BAD_GATEWAY,
                "the upstream server cannot be reached\n",
            )
        }
    }
}

/// At most as many connections as `permits` had at the start.
struct Pool {
    authority: Authority,
    /// One per connection in use.
    permits: Arc<Semaphore>,
    /// Connections between two requests.
    idle: Mutex<Vec<SendRequest<Body>>>,
}

/// A connection in use, with its permit; back in the pool when dropped.
struct Lease {
    conn: Option<SendRequest<Body>>,
    pool: Arc<Pool>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Back before the permit goes (fields drop after this), so the
        // next request finds it rather than opening another one.
        if let Some(conn) = self.conn.take().filter(|c| !c.is_closed()) {
            self.pool.idle.lock().unwrap().push(conn);
        }
    }
}

impl Pool {
    /// Sends `req` on an idle connection or a new one, once one is free.
    async fn send(
        self: &Arc<Self>,
        mut req: Request,
    ) -> Result<(hyper::Response<Incoming>, Lease), BoxError> {
        let permit = self.permits.clone().acquire_owned().await?;
        loop {
            let (mut conn, reused) = match self.take_idle().await {
                Some(conn) => (conn, true),
                None => (self.connect().await?, false),
            };
            match conn.try_send_request(req).await {
                Ok(resp) => {
                    let lease = Lease {
                        conn: Some(conn),
                        pool: self.clone(),
                        _permit: permit,
                    };
                    return Ok((resp, lease));
                }
                // A kept-alive connection the server closed meanwhile: the
                // request never went, so it goes on another one.
                Err(mut e) if reused && e.message().is_some() => {
                    req = e.take_message().expect("checked");
                }
                Err(e) => return Err(e.into_error().into()),
            }
        }
    }

    /// An idle connection still open and ready for a request, if any.
    async fn take_idle(&self) -> Option<SendRequest<Body>> {
        loop {
            let mut conn = self.idle.lock().unwrap().pop()?;
            // Ready once its last response has been read to the end; an
            // error once it has closed.
            if conn.ready().await.is_ok() {
                return Some(conn);
            }
        }
    }

    async fn connect(&self) -> Result<SendRequest<Body>, BoxError> {
        let tcp = tokio::net::TcpStream::connect(self.authority.as_str()).await?;
        tcp.set_nodelay(true)?;
        let (conn, driver) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            if let Err(e) = driver.await {
                tracing::debug!("an upstream connection failed: {e}");
            }
        });
        Ok(conn)
    }
}

/// A response body holding its connection until it ends (or is dropped).
struct Leased {
    body: Incoming,
    lease: Option<Lease>,
}

impl http_body::Body for Leased {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let frame = std::task::ready!(Pin::new(&mut self.body).poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) {
            self.lease = None; // ended or failed: the connection goes back
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Drops the hop-by-hop headers, and those the `Connection` header names.
/// Names in a `HeaderMap` are lowercase, and the standard ones compare as
/// enums: one cheap pass for the common heads (none, or nginx's
/// `Connection: keep-alive`), nothing allocated for them.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    match listed_names(headers) {
        None => {
            while let Some(name) = headers.keys().find(|n| is_hop(n)).cloned() {
                headers.remove(name);
            }
        }
        Some(listed) => {
            let hop: Vec<header::HeaderName> = headers
                .keys()
                .filter(|n| is_hop(n) || listed.iter().any(|l| l == n.as_str()))
                .cloned()
                .collect();
            for name in hop {
                headers.remove(name);
            }
        }
    }
}

/// A hop-by-hop header: `is_hop_by_hop_name`'s set, for a lowercase name.
fn is_hop(name: &header::HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name == header::TE
        || name == header::TRAILER
        || name == header::PROXY_AUTHENTICATE
        || name == header::PROXY_AUTHORIZATION
        || name.as_str() == "keep-alive"
        || name.as_str().starts_with("proxy-")
}

/// The names the `Connection` headers list besides hop-by-hop ones,
/// lowercase (`close` among them: a header so named goes too); `None` when
/// there are none.
fn listed_names(headers: &HeaderMap) -> Option<Vec<String>> {
    let mut listed: Option<Vec<String>> = None;
    let tokens = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim);
    for token in tokens {
        if token.is_empty() || is_hop_by_hop_name(token) {
            continue;
        }
        listed
            .get_or_insert_with(Vec::new)
            .push(token.to_ascii_lowercase());
    }
    listed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    fn names(m: &HeaderMap) -> Vec<String> {
        let mut v: Vec<String> = m.iter().map(|(k, v)| format!("{k}: {v:?}")).collect();
        v.sort();
        v
    }

    #[test]
    fn a_head_without_hop_by_hop_headers_is_left_as_it_is() {
        let before = map(&[
            ("content-type", "text/plain"),
            ("x-a", "1"),
            ("x-a", "2"),
            ("etag", "\"x\""),
        ]);
        let mut after = before.clone();
        strip_hop_by_hop(&mut after);
        assert_eq!(names(&after), names(&before));
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_lists_go_the_rest_stays() {
        let mut m = map(&[
            ("connection", "keep-alive, X-Listed"),
            ("connection", " x-other ,,"),
            ("keep-alive", "timeout=5"),
            ("x-listed", "a"),
            ("x-other", "b"),
            ("x-other", "c"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("trailer", "x"),
            ("proxy-authorization", "Basic x"),
            ("content-type", "text/plain"),
            ("x-kept", "listed-nowhere"),
            ("date", "today"),
        ]);
        strip_hop_by_hop(&mut m);
        assert_eq!(
            names(&m),
            [
                "content-type: \"text/plain\"",
                "date: \"today\"",
                "x-kept: \"listed-nowhere\""
            ]
        );
    }

    #[test]
    fn nginxs_keep_alive_and_a_close_go_alone() {
        for connection in ["keep-alive", "close", "Keep-Alive, close", "upgrade"] {
            // `close` names a header too (RFC 9110 reserves the name).
            let close = connection.contains("close");
            let mut m = map(&[
                ("server", "nginx"),
                ("connection", connection),
                ("keep-alive", "timeout=60"),
                ("proxy-connection", "x"),
                ("content-length", "2"),
                ("etag", "x"),
                ("close", "c"),
            ]);
            strip_hop_by_hop(&mut m);
            let mut kept = vec!["content-length: \"2\"", "etag: \"x\"", "server: \"nginx\""];
            if !close {
                kept.insert(0, "close: \"c\"");
            }
            assert_eq!(names(&m), kept, "Connection: {connection}");
        }
    }

    #[test]
    fn the_hop_by_hop_test_is_the_cores_for_every_name() {
        // The core's list, and names beside it.
        let others = [
            "proxy-authenticate",
            "proxy-authorization",
            "proxy-x",
            "proxy-",
            "host",
            "content-type",
            "x-connection",
            "tee",
            "keep-alive2",
            "prox",
            "trailers",
        ];
        for &name in worker_relay::frame::HOP_BY_HOP.iter().chain(&others) {
            let n = header::HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert_eq!(is_hop(&n), is_hop_by_hop_name(name), "{name}");
        }
    }
}
