//! The gateway as tower services (feature `gateway`): [`Connect`] answers
//! workers' upgrade requests through hyper's upgrades, [`Forward`] callers'
//! requests, [`GatewayService`] both by path.

use super::{forward, hyper_upgrade, BoxError, Gateway, GatewayBody, Inner};
use http::{Request, Response};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use worker_relay::connect::ConnectTarget;

impl Gateway {
    /// The service that accepts workers' upgrade requests.
    pub fn connect(&self) -> Connect {
        Connect(self.inner.clone())
    }

    /// The service that forwards callers' requests to workers.
    pub fn forward(&self) -> Forward {
        Forward(self.inner.clone())
    }

    /// [`Connect`] for the connect path, [`Forward`] for everything else.
    pub fn service(&self) -> GatewayService {
        GatewayService {
            inner: self.inner.clone(),
            peer: None,
        }
    }
}

/// The future of the gateway's services.
pub type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<Response<GatewayBody>, Infallible>> + Send>>;

/// Accepts workers' upgrade requests (see the [module docs](super)): a
/// `tower::Service` for any request body, never failing (a refusal is an
/// HTTP answer, 400, 401, 426, 429 or 503, with the reason in its text).
/// Get it from [`Gateway::connect`]; clones share the gateway.
#[derive(Clone)]
pub struct Connect(Arc<Inner>);

/// Forwards callers' requests to their workers (see the
/// [module docs](super)): a `tower::Service` for any request body, never
/// failing (the relay's own answers are 400, 401, 404, 405, 408, 414, 431,
/// 502, 503 and 504; [`errors`](worker_relay::errors) says which failure is
/// which). Get it from
/// [`Gateway::forward`]; clones share the gateway.
#[derive(Clone)]
pub struct Forward(Arc<Inner>);

/// [`Connect`] on the gateway's connect path and under it
/// (`/connect/<id>`), [`Forward`] elsewhere: the whole relay as one
/// `tower::Service`. Get it from [`Gateway::service`]; clones share the
/// gateway.
#[derive(Clone)]
pub struct GatewayService {
    inner: Arc<Inner>,
    /// The caller's address, when [`server::serve`](crate::server::serve)
    /// told it for the whole connection (rather than as a
    /// [`PeerAddr`](crate::PeerAddr) extension on each request: a map of
    /// three allocations per request).
    peer: Option<std::net::SocketAddr>,
}

impl GatewayService {
    /// This connection's caller is `peer` (the server's accept loop, once
    /// per connection).
    #[cfg(feature = "server")]
    pub(crate) fn set_connection_peer(&mut self, peer: std::net::SocketAddr) {
        self.peer = Some(peer);
    }
}

impl std::fmt::Debug for Connect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connect")
    }
}

impl std::fmt::Debug for Forward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Forward")
    }
}

impl std::fmt::Debug for GatewayService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewayService")
    }
}

impl<B> tower::Service<Request<B>> for Connect
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<GatewayBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    /// Always ready.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> ResponseFuture {
        let inner = self.0.clone();
        Box::pin(async move { Ok(hyper_upgrade::accept(&inner, req).await) })
    }
}

impl<B> tower::Service<Request<B>> for Forward
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<GatewayBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    /// Always ready: a worker's bound on open streams answers 503 per
    /// request instead.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> ResponseFuture {
        Box::pin(Infallibly {
            answer: forward::forward(self.0.clone(), req, None),
        })
    }
}

impl<B> tower::Service<Request<B>> for GatewayService
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<GatewayBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    /// Always ready.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<B>) -> ResponseFuture {
        let inner = self.inner.clone();
        if ConnectTarget::parse(&inner.connect_path, req.uri().path()).is_some() {
            // A worker's handshake (rare) reads the peer where any host's
            // does.
            if let Some(peer) = self.peer {
                if req.extensions().get::<crate::PeerAddr>().is_none() {
                    req.extensions_mut().insert(crate::PeerAddr(peer));
                }
            }
            Box::pin(async move { Ok(hyper_upgrade::accept(&inner, req).await) })
        } else {
            Box::pin(Infallibly {
                answer: forward::forward(inner, req, self.peer),
            })
        }
    }
}

pin_project_lite::pin_project! {
    /// A forward's future as a service's: its answer, `Ok`. (An `async`
    /// block around it would hold the request a second time, and the
    /// box of every request would leave the allocator's per-thread cache.)
    struct Infallibly<F> {
        #[pin]
        answer: F,
    }
}

impl<F: Future<Output = Response<GatewayBody>>> Future for Infallibly<F> {
    type Output = Result<Response<GatewayBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().answer.poll(cx).map(Ok)
    }
}
