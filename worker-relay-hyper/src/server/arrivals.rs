//! Which accepted connections have not yet brought their first request,
//! so that a graceful stop drops none of them.
//!
//! A stop drops a connection that has not sent its first request (and
//! hyper closes one whose bytes it has not read yet). Behind a proxy that
//! opens a connection per request, that request fails (and nginx marks the
//! relay down, `max_fails`). So the accept loop stops at a moment when
//! every connection it accepted has brought its request, and the intake
//! ([`Intake`](super::Intake)) closes once the requests of the connections
//! still queued then are in the service.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::watch;

/// The count of connections still to bring their first request.
#[derive(Clone, Default)]
pub(super) struct Arrivals {
    pending: Arc<watch::Sender<usize>>,
}

impl Arrivals {
    /// A connection just accepted: pending until its first request reaches
    /// the service, or until it is dropped.
    pub fn connection(&self) -> Arc<Pending> {
        self.pending.send_modify(|n| *n += 1);
        Arc::new(Pending {
            arrived: AtomicBool::new(false),
            arrivals: self.clone(),
        })
    }

    /// Resolves once no connection is pending.
    pub async fn settled(&self) {
        let mut pending = self.pending.subscribe();
        // The sender lives in `self`: this cannot fail.
        let _ = pending.wait_for(|n| *n == 0).await;
    }
}

/// A connection's share of [`Arrivals`].
pub(super) struct Pending {
    arrived: AtomicBool,
    arrivals: Arrivals,
}

impl Pending {
    fn arrived(&self) {
        if !self.arrived.swap(true, Ordering::SeqCst) {
            self.arrivals
                .pending
                .send_modify(|n| *n = n.saturating_sub(1));
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.arrived();
    }
}

/// A connection's service: its first request that the service has polled
/// once (passed a gateway's drain check, opened its stream) is its arrival.
#[derive(Clone)]
pub(super) struct Counted<S> {
    inner: S,
    connection: Arc<Pending>,
}

impl<S> Counted<S> {
    pub fn new(inner: S, connection: Arc<Pending>) -> Counted<S> {
        Counted { inner, connection }
    }
}

impl<S, R> tower::Service<R> for Counted<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let mut answer = Box::pin(self.inner.call(req));
        let mut connection = Some(self.connection.clone());
        Box::pin(std::future::poll_fn(move |cx| {
            let poll = answer.as_mut().poll(cx);
            if let Some(c) = connection.take() {
                c.arrived();
            }
            poll
        }))
    }
}
