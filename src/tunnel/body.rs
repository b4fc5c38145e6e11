//! The body of a request a worker's service receives.

use crate::frame::RequestHead;
use crate::rt::{BodyError, RequestBody};
use bytes::Bytes;
use futures_core::Stream;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// A request body as it arrives from the relay: an `http_body::Body` of
/// [`Bytes`]. It fails with [`BodyError`] if the caller goes away or the
/// relay breaks the request's Content-Length. Dropping it discards the
/// rest (the relay is not kept waiting).
pub struct TunnelBody {
    body: RequestBody,
    /// The declared Content-Length, less what has arrived.
    remaining: Option<u64>,
    done: bool,
}

impl TunnelBody {
    pub(super) fn new(body: RequestBody, head: &RequestHead) -> TunnelBody {
        let remaining = head.headers().content_length().ok().flatten();
        TunnelBody {
            body,
            done: remaining == Some(0),
            remaining,
        }
    }
}

impl std::fmt::Debug for TunnelBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelBody")
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
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.body).poll_next(cx) {
            Poll::Ready(Some(Ok(data))) => {
                if let Some(r) = &mut this.remaining {
                    *r = r.saturating_sub(data.len() as u64);
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(Some(Err(e))) => {
                this.done = true;
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
