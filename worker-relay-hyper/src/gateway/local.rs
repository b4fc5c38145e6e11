//! Request bodies that are not `Send` (actix-web's `Payload`): read on a
//! task of the current thread and handed to the gateway through a small
//! channel, so the gateway's upload (its own task, its deadlines, its
//! discarding) works on them as on any other body.

use super::BoxError;
use bytes::Bytes;
use futures_core::Stream;
use http_body::{Frame, SizeHint};
use std::future::poll_fn;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// How many pieces of a caller's body wait in the channel, at most: the
/// task reads the next one only when the gateway took one (backpressure
/// reaches the caller as it does with a `Send` body).
const QUEUED: usize = 2;

/// A caller's body read by a task on the current thread's
/// [`LocalSet`](tokio::task::LocalSet), for
/// [`Gateway::forward_local`](super::Gateway::forward_local).
pub(super) struct LocalBody {
    rx: Option<mpsc::Receiver<Result<Bytes, BoxError>>>,
}

impl LocalBody {
    /// A body with nothing in it (the request's framing says so).
    pub(super) fn empty() -> LocalBody {
        LocalBody { rx: None }
    }

    /// Starts reading `stream` on a task of the current thread's
    /// `LocalSet`. The task ends with the stream, or as soon as the
    /// gateway drops the body (the stream is dropped then, unread).
    ///
    /// # Panics
    /// Outside a `LocalSet`, as [`tokio::task::spawn_local`] does.
    pub(super) fn spawn<S, E>(stream: S) -> LocalBody
    where
        S: Stream<Item = Result<Bytes, E>> + 'static,
        E: Into<BoxError>,
    {
        let (tx, rx) = mpsc::channel(QUEUED);
        tokio::task::spawn_local(async move {
            let mut stream = pin!(stream);
            loop {
                let next = tokio::select! {
                    next = poll_fn(|cx| stream.as_mut().poll_next(cx)) => next,
                    () = tx.closed() => return,
                };
                let Some(piece) = next else { return };
                let failed = piece.is_err();
                if tx.send(piece.map_err(Into::into)).await.is_err() || failed {
                    return;
                }
            }
        });
        LocalBody { rx: Some(rx) }
    }
}

impl http_body::Body for LocalBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(piece)) => Poll::Ready(Some(piece.map(Frame::data))),
            Poll::Ready(None) => {
                self.rx = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.rx {
            None => SizeHint::with_exact(0),
            Some(_) => SizeHint::default(),
        }
    }
}

/// Whether a request with these parts has no body by its framing: HTTP/1
/// without `Transfer-Encoding` and with no or a zero `Content-Length`
/// (RFC 9112, section 6.3); any version with `Content-Length: 0`.
pub(super) fn framed_empty(version: http::Version, headers: &http::HeaderMap) -> bool {
    let length = headers.get(http::header::CONTENT_LENGTH);
    if length.is_some_and(|l| l.as_bytes() == b"0") {
        return true;
    }
    let http1 = matches!(
        version,
        http::Version::HTTP_09 | http::Version::HTTP_10 | http::Version::HTTP_11
    );
    http1 && length.is_none() && !headers.contains_key(http::header::TRANSFER_ENCODING)
}
