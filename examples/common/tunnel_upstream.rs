//! Tunnel mode: every request forwarded to a local HTTP server, the bodies
//! streaming both ways (what ngrok or cloudflared do, through a relay).
//!
//! At most `connections` requests are in flight upstream at once (each
//! holds a permit until its response body has ended), over a pool of
//! kept-alive connections, so a burst of callers does not become a burst of
//! connects to a server with a small backlog; the others wait their turn.
#![allow(dead_code)] // shared by the worker example and tests, each using a part

use crate::worker_app::plain;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::uri::{Authority, Scheme, Uri};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use http_body_util::BodyExt;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::error::Error;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tower::Service;
use worker_relay::frame::is_hop_by_hop_name;

/// The default bound on requests in flight upstream (and on the idle
/// connections kept for them): `worker --upstream-connections N`.
pub const DEFAULT_CONNECTIONS: usize = 32;

/// Where requests go: an `http://host:port` server.
#[derive(Clone)]
pub struct Upstream {
    authority: Authority,
    client: Client<HttpConnector, Body>,
    /// One per request in flight upstream, held until its response body ends.
    permits: Arc<Semaphore>,
}

impl Upstream {
    /// `url` is `http://HOST:PORT` (a path in it is ignored); at most
    /// `connections` (at least 1) requests go upstream at once.
    pub fn new(url: &str, connections: usize) -> Option<Upstream> {
        let uri: Uri = url.parse().ok()?;
        (uri.scheme() == Some(&Scheme::HTTP)).then_some(())?;
        let connections = connections.max(1);
        Some(Upstream {
            authority: uri.authority()?.clone(),
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(connections)
                .build_http(),
            permits: Arc::new(Semaphore::new(connections)),
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

/// Forwards one request: the upstream's scheme and authority with the
/// request's path and query, `Host` set to the upstream's, hop-by-hop
/// headers dropped both ways, the rest as it is. 502 if the upstream
/// cannot be reached.
async fn forward(State(up): State<Upstream>, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let uri = Uri::builder()
        .scheme(Scheme::HTTP)
        .authority(up.authority.clone())
        .path_and_query(target)
        .build();
    let (Ok(uri), Ok(host)) = (uri, HeaderValue::from_str(up.authority.as_str())) else {
        return plain(StatusCode::BAD_REQUEST, "bad request target\n");
    };
    parts.uri = uri;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.insert(header::HOST, host);
    // Waits while `connections` requests are in flight (never closed).
    let Ok(permit) = up.permits.clone().acquire_owned().await else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    };
    match up.client.request(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            // The permit goes with the body: released when it has ended
            // (the tunnel drops a body as soon as it has streamed it).
            let body = body.map_frame(move |frame| {
                let _in_flight = &permit;
                frame
            });
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => {
            let why = std::iter::successors(Some(&e as &dyn Error), |&e| e.source());
            let why: Vec<String> = why.map(ToString::to_string).collect();
            tracing::warn!("upstream {}: {}", up.authority, why.join(": "));
            plain(
                StatusCode::BAD_GATEWAY,
                "the upstream server cannot be reached\n",
            )
        }
    }
}

/// Drops the hop-by-hop headers, and those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let hop: Vec<header::HeaderName> = headers
        .keys()
        .filter(|n| is_hop_by_hop_name(n.as_str()) || named.iter().any(|h| h == n.as_str()))
        .cloned()
        .collect();
    for name in hop {
        headers.remove(name);
    }
}
