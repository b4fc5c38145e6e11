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
    /// Whether its first request has reached the service.
    fn has_arrived(&self) -> bool {
        self.arrived.load(Ordering::SeqCst)
    }

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
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Arrival<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        // Once the connection has arrived, its later requests carry nothing
        // (no share to clone, no box: a request's cost on a kept-alive
        // connection).
        let connection = (!self.connection.has_arrived()).then(|| self.connection.clone());
        Arrival {
            answer: self.inner.call(req),
            connection,
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Counted`]'s future: the service's, marking the connection's
    /// arrival once it has been polled.
    pub(super) struct Arrival<F> {
        #[pin]
        answer: F,
        connection: Option<Arc<Pending>>,
    }
}

impl<F: Future> Future for Arrival<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let poll = this.answer.poll(cx);
        if let Some(c) = this.connection.take() {
            c.arrived();
        }
        poll
    }
}
