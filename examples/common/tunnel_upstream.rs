//! Tunnel mode: every request forwarded to a local HTTP server, the bodies
//! streaming both ways (what ngrok or cloudflared do, through a relay).

use crate::worker_app::plain;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::uri::{Authority, Scheme, Uri};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::{stream, StreamExt};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::error::Error;
use tower::Service;
use worker_relay::frame::is_hop_by_hop_name;

/// Where requests go: an `http://host:port` server.
#[derive(Clone)]
pub struct Upstream {
    authority: Authority,
    client: Client<HttpConnector, Body>,
}

impl Upstream {
    /// `url` is `http://HOST:PORT` (a path in it is ignored).
    pub fn new(url: &str) -> Option<Upstream> {
        let uri: Uri = url.parse().ok()?;
        (uri.scheme() == Some(&Scheme::HTTP)).then_some(())?;
        Some(Upstream {
            authority: uri.authority()?.clone(),
            client: Client::builder(TokioExecutor::new()).build_http(),
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
    let body = match parts.headers.contains_key(header::CONTENT_LENGTH) {
        true => body,
        false => without_length(body).await,
    };
    match up.client.request(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
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

/// A request body without Content-Length is empty or chunked; the relay
/// does not say which, so wait for its first piece: a DELETE or a POST
/// without a body then goes upstream without one, not as an empty chunked
/// one.
async fn without_length(body: Body) -> Body {
    let mut pieces = body.into_data_stream();
    match pieces.next().await {
        None => Body::empty(),
        Some(first) => Body::from_stream(stream::iter([first]).chain(pieces)),
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
