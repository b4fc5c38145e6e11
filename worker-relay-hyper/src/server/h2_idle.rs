//! The open streams of an HTTP/2 connection, so that one with none for a
//! while can be closed (its pings would otherwise keep it, and its
//! connection slot, for ever).

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;

/// The count of one connection's streams open.
#[derive(Clone, Default)]
pub(super) struct Streams(Arc<watch::Sender<usize>>);

impl Streams {
    fn open(&self) -> Open {
        self.0.send_modify(|n| *n += 1);
        Open(self.clone())
    }

    /// Resolves once no stream has been open for `idle`.
    pub async fn idle_for(&self, idle: Duration) {
        let mut open = self.0.subscribe();
        loop {
            // The sender lives in `self`: these cannot fail.
            let _ = open.wait_for(|n| *n == 0).await;
            tokio::select! {
                () = tokio::time::sleep(idle) => {
                    if *open.borrow_and_update() == 0 {
                        return;
                    }
                }
                _ = open.changed() => {}
            }
        }
    }
}

/// A stream open: from its request's arrival until its response's body is
/// dropped (sent, or the stream reset).
struct Open(Streams);

impl Drop for Open {
    fn drop(&mut self) {
        self.0 .0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A connection's service, its streams counted in [`Streams`].
#[derive(Clone)]
pub(super) struct Tracked<S> {
    inner: S,
    streams: Streams,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, streams: Streams) -> Tracked<S> {
        Tracked { inner, streams }
    }
}

impl<S, R, B> tower::Service<Request<R>> for Tracked<S>
where
    S: tower::Service<Request<R>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<R>) -> Self::Future {
        let open = self.streams.open();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| TrackedBody {
                inner: Box::pin(body),
                _open: open,
            }))
        })
    }
}

/// A response body that keeps its stream counted as open.
pub(super) struct TrackedBody<B> {
    inner: Pin<Box<B>>,
    _open: Open,
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_only_after_the_last_stream_has_been_closed_for_the_timeout() {
        let streams = Streams::default();
        let idle = Duration::from_secs(75);
        let started = tokio::time::Instant::now();
        let open = streams.open();
        let closer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(100)).await;
            drop(open);
        });
        streams.idle_for(idle).await;
        assert_eq!(started.elapsed(), Duration::from_secs(175));
        closer.await.unwrap();
    }
}
