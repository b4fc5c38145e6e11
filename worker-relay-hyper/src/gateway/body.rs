//! The body of a response the gateway gives its caller.

use super::access::Access;
use super::upload::Upload;
use bytes::Bytes;
use futures_core::Stream;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use worker_relay::rt::{BodyError, ResponseBody};

/// The body of a response from [`Forward`](super::Forward) or
/// [`Connect`](super::Connect): either the gateway's own short answer, or
/// the worker's body as it streams in.
///
/// When the worker fails a response it has started (`abort`, a broken
/// Content-Length, a lost connection), the body **ends with an error**, not
/// with a clean end, so that the server cuts the caller's response short
/// (hyper closes the connection without the last chunk) and the caller
/// sees a failed response rather than a complete one. Before the error, the
/// body yields once, so that the server writes out what it holds (the head
/// and the bytes that arrived) first: the caller sees the response start,
/// then fail.
///
/// A worker's body owns what is left of the caller's upload: the upload
/// goes on while the response is read (a worker may echo as it reads), and
/// dropping the body before the upload is complete aborts it and the
/// stream (the worker gets `abort`); what is left of the caller's body is
/// then read and discarded for at most
/// [`GatewayBuilder::lingering_time`](super::GatewayBuilder::lingering_time).
pub struct GatewayBody {
    kind: Kind,
    /// The request's metrics and access log line, recorded when this body
    /// is over or dropped.
    access: Option<Box<Access>>,
}

enum Kind {
    Full(Option<Bytes>),
    Worker {
        body: ResponseBody,
        /// The worker's failure, held back for one poll.
        failed: Option<BodyError>,
        /// What is left of the caller's upload (stopped when dropped).
        _upload: Option<Upload>,
    },
    /// A worker's WebSocket as the 101's body, for a host that streams it.
    Upgraded(super::upgrade::Upgraded),
}

impl GatewayBody {
    /// A body of exactly these bytes.
    pub fn full(data: impl Into<Bytes>) -> GatewayBody {
        let data = data.into();
        GatewayBody {
            kind: Kind::Full((!data.is_empty()).then_some(data)),
            access: None,
        }
    }

    /// An empty body.
    pub fn empty() -> GatewayBody {
        GatewayBody {
            kind: Kind::Full(None),
            access: None,
        }
    }

    /// A worker's response body.
    pub fn worker(body: ResponseBody) -> GatewayBody {
        GatewayBody {
            kind: Kind::Worker {
                body,
                failed: None,
                _upload: None,
            },
            access: None,
        }
    }

    /// The body, recording the request when it is over.
    /// The body's data as a stream of bytes, for a host whose responses
    /// take one rather than an [`http_body::Body`] (actix-web's
    /// `HttpResponseBuilder::streaming`): the same pieces, the same error,
    /// the same access-log record.
    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes, BodyError>> + Send + 'static {
        DataStream(self)
    }

    pub(super) fn upgraded(connection: super::upgrade::Upgraded) -> GatewayBody {
        GatewayBody {
            kind: Kind::Upgraded(connection),
            access: None,
        }
    }

    pub(super) fn observed(mut self, mut access: Box<Access>) -> GatewayBody {
        if let Kind::Full(None) = self.kind {
            access.ended();
        }
        self.access = Some(access);
        self
    }

    /// The body, owning the request's upload.
    pub(super) fn owning(mut self, upload: Option<Upload>) -> GatewayBody {
        if let Kind::Worker { _upload, .. } = &mut self.kind {
            *_upload = upload;
        }
        self
    }
}

impl Drop for GatewayBody {
    fn drop(&mut self) {
        // Dropped before its end (the caller left, or stopped reading and
        // was cut off): if the stream failed meanwhile (given up as
        // stalled, say), that is how it ended.
        let (Some(access), Kind::Worker { body, failed, .. }) =
            (self.access.as_mut(), &mut self.kind)
        else {
            return;
        };
        if access.is_over() {
            return;
        }
        if let Some(e) = failed.take() {
            return access.failed_with(&e);
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if let Poll::Ready(Some(Err(e))) = Pin::new(body).poll_next(&mut cx) {
            access.failed_with(&e);
        }
    }
}

impl std::fmt::Debug for GatewayBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Full(b) => write!(
                f,
                "GatewayBody::Full({} bytes)",
                b.as_ref().map_or(0, Bytes::len)
            ),
            Kind::Worker { .. } => f.write_str("GatewayBody::Worker"),
            Kind::Upgraded(_) => f.write_str("GatewayBody::Upgraded"),
        }
    }
}

impl http_body::Body for GatewayBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let polled = poll_kind(&mut this.kind, cx);
        if let (Some(access), Poll::Ready(r)) = (this.access.as_mut(), &polled) {
            match r {
                Some(Ok(frame)) => {
                    access.down += frame.data_ref().map_or(0, |d| d.len() as u64);
                    if matches!(this.kind, Kind::Full(None)) {
                        access.ended();
                    }
                }
                Some(Err(e)) => access.failed_with(e),
                None => access.ended(),
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.kind, Kind::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Kind::Worker { .. } | Kind::Upgraded(_) => SizeHint::default(),
        }
    }
}

/// [`GatewayBody::into_stream`]: the body's data pieces.
struct DataStream(GatewayBody);

impl Stream for DataStream {
    type Item = Result<Bytes, BodyError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        use http_body::Body;
        // The gateway's frames are all data.
        Pin::new(&mut self.0)
            .poll_frame(cx)
            .map(|frame| frame.map(|f| f.map(|f| f.into_data().unwrap_or_default())))
    }
}

fn poll_kind(
    kind: &mut Kind,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
    {
        match kind {
            Kind::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Kind::Upgraded(connection) => connection
                .poll_data(cx)
                .map(|d| d.map(|d| d.map(Frame::data))),
            Kind::Worker { body, failed, .. } => {
                if let Some(e) = failed.take() {
                    return Poll::Ready(Some(Err(e)));
                }
                match Pin::new(body).poll_next(cx) {
                    Poll::Ready(Some(Ok(data))) => Poll::Ready(Some(Ok(Frame::data(data)))),
                    Poll::Ready(Some(Err(e))) => {
                        // Yield once: the server flushes what it holds, then
                        // polls again and gets the error.
                        *failed = Some(e);
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                    Poll::Ready(None) => Poll::Ready(None),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}
