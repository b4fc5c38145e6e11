//! The peer's address as a request extension.

use http::Request;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use crate::PeerAddr;

/// `S` with every request marked with its connection's peer address.
#[derive(Clone)]
pub(super) struct WithPeer<S> {
    inner: S,
    peer: SocketAddr,
    /// Each request gets its [`PeerAddr`]: `S` was not told the peer
    /// otherwise ([`tell`]).
    mark: bool,
}

impl<S> WithPeer<S> {
    /// `told`: what [`tell`] answered for `inner`'s service.
    pub fn new(inner: S, peer: SocketAddr, told: bool) -> WithPeer<S> {
        WithPeer {
            inner,
            peer,
            mark: !told,
        }
    }
}

/// Tells `service` its connection's `peer` if it is the gateway's own
/// service, which then needs no extension map (three allocations) on each
/// request; true if it was told.
pub(super) fn tell<S: 'static>(service: &mut S, peer: SocketAddr) -> bool {
    #[cfg(feature = "gateway")]
    if let Some(g) =
        (service as &mut dyn std::any::Any).downcast_mut::<crate::gateway::GatewayService>()
    {
        g.set_connection_peer(peer);
        return true;
    }
    let _ = (service, peer);
    false
}

impl<S, B> tower::Service<Request<B>> for WithPeer<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        if self.mark {
            req.extensions_mut().insert(PeerAddr(self.peer));
        }
        self.inner.call(req)
    }
}
