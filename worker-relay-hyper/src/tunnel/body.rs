//! The body of a request a worker's service receives.

use bytes::Bytes;
use futures_core::Stream;
use http_body::{Frame, SizeHint};
use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use worker_relay::frame::RequestHead;
use worker_relay::rt::{BodyError, RequestBody};

use crate::observe::worker::Meters;

/// A request body as it arrives from the relay: an `http_body::Body` of
/// [`Bytes`]. It fails with [`BodyError`] if the caller goes away or the
/// relay breaks the request's Content-Length. Dropping it discards the
/// rest (the relay is not kept waiting).
///
/// Its [`size_hint`](http_body::Body::size_hint) and
/// [`is_end_stream`](http_body::Body::is_end_stream) are exact for a body
/// that is empty: the relay forwards no `Transfer-Encoding`, so a request
/// without Content-Length may be empty (a `DELETE`) or of unknown length (a
/// chunked upload), and the service gets the request only once its first
/// piece or its end has arrived (the relay sends a bodiless request's
/// `end` right after it), at most [`PEEK_WAIT`] later. An HTTP client given
/// the body (a proxy to a local server) then sends an empty body as empty,
/// not as `Transfer-Encoding: chunked`.
pub struct TunnelBody {
    body: RequestBody,
    /// The first piece, read ahead to learn whether the body is empty.
    first: Option<Result<Bytes, BodyError>>,
    /// The declared Content-Length, less what has arrived.
    remaining: Option<u64>,
    done: bool,
    meters: Meters,
}

/// The longest a request without Content-Length waits for its first piece
/// or its end before the service gets it (its body then of unknown length):
/// a caller that sends its body only after the response has started is
/// served all the same.
pub const PEEK_WAIT: Duration = Duration::from_secs(1);

impl TunnelBody {
    /// The body of `head`'s request, its first piece or end read ahead if
    /// it has no Content-Length (see [`PEEK_WAIT`]).
    pub(super) async fn new(body: RequestBody, head: &RequestHead, meters: Meters) -> TunnelBody {
        let remaining = head.headers().content_length().ok().flatten();
        let mut body = TunnelBody {
            body,
            first: None,
            done: remaining == Some(0),
            remaining,
            meters,
        };
        if body.remaining.is_none() {
            // Most often here already (a bodiless request's end comes
            // with its head): then no timer and no clock reading.
            let first =
                match poll_fn(|cx| Poll::Ready(Pin::new(&mut body.body).poll_next(cx))).await {
                    Poll::Ready(item) => Some(item),
                    Poll::Pending => {
                        let next = poll_fn(|cx| Pin::new(&mut body.body).poll_next(cx));
                        tokio::time::timeout(PEEK_WAIT, next).await.ok()
                    }
                };
            match first {
                Some(None) => (body.done, body.remaining) = (true, Some(0)),
                Some(Some(first)) => body.first = Some(first),
                None => {} // nothing yet: the length stays unknown
            }
        }
        body
    }

    /// Accounts for one item of the relay's body stream.
    fn item(
        &mut self,
        item: Option<Result<Bytes, BodyError>>,
    ) -> Option<Result<Frame<Bytes>, BodyError>> {
        match item {
            Some(Ok(data)) => {
                self.meters.bytes_up(data.len() as u64);
                if let Some(r) = &mut self.remaining {
                    *r = r.saturating_sub(data.len() as u64);
                }
                Some(Ok(Frame::data(data)))
            }
            Some(Err(e)) => {
                self.done = true;
                Some(Err(e))
            }
            None => {
                self.done = true;
                None
            }
        }
    }
}

impl std::fmt::Debug for TunnelBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelBody")
            .field(
                "first",
                &self.first.as_ref().map(|f| f.as_ref().map(Bytes::len)),
            )
            .field("remaining", &self.remaining)
            .field("done", &self.done)
            .finish()
    }
}

impl http_body::Body for TunnelBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(this.item(Some(first)));
        }
        if this.done {
            return Poll::Ready(None);
        }
        let item = std::task::ready!(Pin::new(&mut this.body).poll_next(cx));
        Poll::Ready(this.item(item))
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.first.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (self.remaining, &self.first) {
            (Some(n), _) => SizeHint::with_exact(n),
            (None, Some(Ok(first))) => {
                let mut hint = SizeHint::new();
                hint.set_lower(first.len() as u64);
                hint
            }
            (None, _) => SizeHint::default(),
        }
    }
}
