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
}

impl<S> WithPeer<S> {
    pub fn new(inner: S, peer: SocketAddr) -> WithPeer<S> {
        WithPeer { inner, peer }
    }
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
        req.extensions_mut().insert(PeerAddr(self.peer));
        self.inner.call(req)
    }
}
