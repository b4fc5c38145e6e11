//! Forwarding a caller's request to its worker, and the answer back.

use super::access::Access;
use super::upload::{after, discard, Upload, UploadEnd};
use super::{answer, BoxError, GatewayBody, Inner};
use crate::observe::Counted;
use futures_sink::Sink;
use http::{Request, Response, StatusCode};
use http_body::Body;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use worker_relay::connect::UrlError;
use worker_relay::connect::WorkerId;
use worker_relay::forward::{request_head_from_parts, response_builder, HttpError};
use worker_relay::frame::RequestHead;
use worker_relay::proto::OpenError;
use worker_relay::rt::{RelayError, RequestSink, ResponseFuture};

/// Forwards one request: maps it to its worker, streams the body up while
/// the answer is awaited, and streams the answer back. Every refusal is an
/// HTTP answer: 404 (no such worker or path), 400, 405, 431, 414, 503
/// (not connected; or busy, with `Retry-After: 1`), 502 (the worker
/// failed), 408 (the caller's body went silent), 504 (the worker took none
/// of the body, or sent no head, in time). Dropping the future before the
/// head aborts the stream; after it, the response body owns the upload.
///
/// A body the relay's own answer leaves unread (404, 503, 405, 400: no
/// worker saw the request) is read and discarded for a while, as what is
/// left of an upload is ([`discard`]): a caller that writes its whole body
/// before it reads reads the answer rather than a reset (nginx's
/// `lingering_close`).
///
/// The future holds each part of the request once (an `async fn`'s
/// arguments are kept twice, as arguments and as locals), so that it stays
/// within the allocator's per-thread cache (`tests.rs`: under 1 KiB).
pub(super) fn forward<B>(
    inner: Arc<Inner>,
    req: Request<B>,
    peer: Option<std::net::SocketAddr>,
) -> impl std::future::Future<Output = Response<GatewayBody>> + Send + 'static
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = req.into_parts();
    async move {
        // Recorded when the response is over, or when this future is
        // dropped before it (the caller left). Boxed: the response body
        // keeps it.
        let mut access = Box::new(Access::new(&parts, &inner, peer));
        let mut body = Some(Counted::new(Box::pin(body), access.up.clone()));
        let resp = forward_parts(&inner, &mut parts, &mut body, &mut access).await;
        if let Some(unread) = body.filter(|b| !b.is_end_stream()) {
            tokio::spawn(discard(unread, inner.deadlines()));
        }
        access.head(resp.status().as_u16(), resp.headers());
        resp.map(|b| b.observed(access))
    }
}

/// Answers the request, taking `body` out of its option once a stream
/// carries it (left there, it is the relay's own answer's to discard).
async fn forward_parts<B>(
    inner: &Arc<Inner>,
    parts: &mut http::request::Parts,
    body: &mut Option<B>,
    access: &mut Access,
) -> Response<GatewayBody>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    if inner.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return retry_soon(answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "the relay is shutting down",
        ));
    }
    if inner.relay.refuses_method(parts.method.as_str()) {
        return answer(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    }
    host_from_authority(parts);
    let (worker, head) = match request_head_from_parts(parts, &inner.urls) {
        Ok(x) => x,
        Err(HttpError::Url(UrlError::NotUnderPrefix)) => {
            return answer(StatusCode::NOT_FOUND, "not found")
        }
        Err(e) => return answer(StatusCode::BAD_REQUEST, &format!("bad request: {e}")),
    };
    if !inner.knows(worker.as_str()) {
        return answer(StatusCode::NOT_FOUND, "unknown worker");
    }
    access.worker(&worker);
    let mut named = Named {
        access,
        worker: Some(worker),
    };
    let Named { access, worker } = &mut named;
    let worker = worker.as_ref().expect("named above");
    let mut head = Some(head);
    to_worker(inner, worker, &mut head, parts, body, access).await
}

/// The worker's id, given to the request's access line when this goes:
/// when the forward ends, or when it is dropped (the caller left). Moved,
/// not copied, once per request.
struct Named<'a> {
    access: &'a mut Access,
    worker: Option<WorkerId>,
}

impl Drop for Named<'_> {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.take() {
            self.access.set_worker(worker);
        }
    }
}

/// [`forward_parts`] for a request to a known worker, as `head` (taken
/// when it is sent).
async fn to_worker<B>(
    inner: &Arc<Inner>,
    worker: &WorkerId,
    head: &mut Option<RequestHead>,
    parts: &http::request::Parts,
    body: &mut Option<B>,
    access: &mut Access,
) -> Response<GatewayBody>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    // A request without a body can be sent again, on the worker's next
    // connection, if its connection goes before its head went out (the
    // worker never saw it); one with a body cannot: its pieces are gone.
    let body_less = body.as_ref().is_none_or(|b| b.is_end_stream());
    let mut tries = 0;
    let (upload, resp) = loop {
        tries += 1;
        let again = body_less && tries < MAX_TRIES;
        let Some(handle) = connected(inner, worker).await else {
            return retry_soon(answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "worker not connected",
            ));
        };
        // Sent again: made again from the request (as it was the first
        // time), rather than a copy kept for every request.
        let this = match head.take() {
            Some(h) => h,
            None => match request_head_from_parts(parts, &inner.urls) {
                Ok((_, h)) => h,
                Err(e) => return answer(StatusCode::BAD_REQUEST, &format!("bad request: {e}")),
            },
        };
        let (sink, response) = match handle.send_request(this) {
            Ok(x) => {
                access.stream_opened();
                x
            }
            // Closed between the look-up and now: its next connection.
            Err(RelayError::Open(OpenError::ConnectionClosed)) if again => continue,
            Err(e) => return refusal(&e),
        };
        let exchanged = exchange(inner, worker, body.take(), sink, response, access).await;
        let (upload, resp) = match exchanged {
            Ok(x) => x,
            Err(now) => return now,
        };
        if let (Err(RelayError::Unsent), true) = (&resp, again) {
            tracing::debug!("worker {worker}: the connection went before the request was sent; sending it again");
            continue;
        }
        break (upload, resp);
    };
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            access.end = match e {
                RelayError::WorkerAborted => "worker_abort",
                RelayError::ProtocolError => "protocol_error",
                RelayError::RequestAborted => "caller_failed",
                _ => "lost",
            };
            return refusal(&e);
        }
    };
    match response_builder(&resp.head) {
        Ok(b) => b
            .body(GatewayBody::worker(resp.body).owning(upload))
            .unwrap_or_else(|_| answer(StatusCode::BAD_GATEWAY, "bad response from worker")),
        Err(e) => answer(
            StatusCode::BAD_GATEWAY,
            &format!("bad response from worker: {e}"),
        ),
    }
}

/// How many times a body-less request is sent, at most (its connection
/// may go before its head went out, or as it is looked up).
const MAX_TRIES: u32 = 3;

/// Streams `body` (if any) up on its own task while the answer is awaited:
/// the response, with the upload that the response body then owns; or the
/// answer to give at once (the upload failed, no head in time).
async fn exchange<B>(
    inner: &Inner,
    worker: &WorkerId,
    body: Option<B>,
    mut sink: RequestSink,
    mut response: ResponseFuture,
    access: &mut Access,
) -> Result<
    (
        Option<Upload>,
        Result<worker_relay::rt::WorkerResponse, RelayError>,
    ),
    Response<GatewayBody>,
>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    // A worker may answer before it has read the whole body, or echo it
    // as it reads.
    let deadlines = inner.deadlines();
    let mut upload = match body.filter(|b| !b.is_end_stream()) {
        // Nothing to send: `end` at once (a failure aborts the stream, and
        // the response future says so).
        None => {
            let _ = poll_fn(|cx| Pin::new(&mut sink).poll_close(cx)).await;
            drop(sink);
            None
        }
        Some(body) => Some(Upload::spawn(body, sink, deadlines)),
    };
    // The head timeout counts from when the worker has the whole request.
    let head_timer = |d: Duration| Box::pin(tokio::time::sleep(d));
    let mut head_clock = match &upload {
        None => inner.response_head_timeout.map(head_timer),
        Some(_) => None,
    };
    let resp = loop {
        tokio::select! {
            biased;
            end = upload_end(&mut upload) => match end {
                UploadEnd::Done => head_clock = inner.response_head_timeout.map(head_timer),
                UploadEnd::Refused => {} // the response says how the stream ended
                end => {
                    access.end = upload_end_reason(end);
                    return Err(upload_answer(end).expect("a failed upload has an answer"));
                }
            },
            r = &mut response => break r,
            () = async { head_clock.as_mut().expect("guarded").await }, if head_clock.is_some() => {
                tracing::debug!("worker {worker}: no response head in time; aborting the stream");
                access.end = "timeout";
                return Err(answer(StatusCode::GATEWAY_TIMEOUT, "the worker did not answer in time"));
            }
        }
    };
    if let Err(e) = &resp {
        tracing::debug!("worker {worker}: request failed before its response: {e}");
        // The upload dropped its sink (the caller's body failed or
        // stalled, or the worker took none of it): its end, moments
        // away, says what to answer.
        if let (RelayError::RequestAborted, Some(up)) = (e, upload.as_mut()) {
            // Boxed: rare, and its timer would widen every request's future.
            let end = Box::pin(tokio::time::timeout(Duration::from_secs(1), up.end())).await;
            if let Some((end, resp)) = end.ok().and_then(|e| Some((e, upload_answer(e)?))) {
                access.end = upload_end_reason(end);
                return Err(resp);
            }
        }
    }
    Ok((upload, resp))
}

/// `worker`'s connection; if it has none, the first one it makes within
/// the reconnect wait (none while the gateway drains). The wait is woken
/// by `worker`'s own news only.
async fn connected(inner: &Inner, worker: &WorkerId) -> Option<worker_relay::rt::RelayHandle> {
    if let Some(handle) = inner.registry.handle(worker.as_str()) {
        return Some(handle);
    }
    let wait = inner.reconnect_wait;
    if wait.is_zero() {
        return None;
    }
    let deadline = after(tokio::time::Instant::now(), wait);
    // Boxed: a request's future would otherwise carry the wait's room
    // (a timer, a subscription) though nearly every request finds its
    // worker connected.
    Box::pin(inner.registry.wait_for(worker, deadline, &inner.draining)).await
}

/// How a failed upload ended the stream, for the metrics and the log.
fn upload_end_reason(end: UploadEnd) -> &'static str {
    match end {
        UploadEnd::Stalled => "caller_stalled",
        UploadEnd::SendTimedOut => "timeout",
        _ => "caller_failed",
    }
}

/// An HTTP/2 request carries its host as the `:authority` of its URI, not
/// as a `Host` header: the worker gets it as `Host`, as over HTTP/1.1.
fn host_from_authority(parts: &mut http::request::Parts) {
    if parts.headers.contains_key(http::header::HOST) {
        return;
    }
    let host = parts
        .uri
        .authority()
        .and_then(|a| http::HeaderValue::from_str(a.as_str()).ok());
    if let Some(host) = host {
        parts.headers.insert(http::header::HOST, host);
    }
}

/// The upload's end, once; pending for ever if there is none (any more).
async fn upload_end(upload: &mut Option<Upload>) -> UploadEnd {
    match upload {
        Some(up) if !up.has_ended() => up.end().await,
        _ => std::future::pending().await,
    }
}

/// The answer to an upload that failed before the response: 400 (the
/// caller's body failed), 408 (the caller went silent, as nginx's
/// `client_body_timeout`), 504 (the worker took none of the body for the
/// send timeout, as nginx's `proxy_send_timeout`).
fn upload_answer(end: UploadEnd) -> Option<Response<GatewayBody>> {
    let (status, text) = match end {
        UploadEnd::Failed => (
            StatusCode::BAD_REQUEST,
            "bad request: the request body failed",
        ),
        UploadEnd::Stalled => (StatusCode::REQUEST_TIMEOUT, "the request body stalled"),
        UploadEnd::SendTimedOut => (
            StatusCode::GATEWAY_TIMEOUT,
            "the worker stopped taking the request body",
        ),
        UploadEnd::Done | UploadEnd::Refused => return None,
    };
    Some(answer(status, text))
}

/// The answer to a request the relay refuses or the worker failed:
/// [`RelayError::status`], with `Retry-After: 1` on a 503.
fn refusal(e: &RelayError) -> Response<GatewayBody> {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    let resp = answer(status, &e.to_string());
    if status == StatusCode::SERVICE_UNAVAILABLE {
        return retry_soon(resp);
    }
    resp
}

/// Every 503 says when to come back (`Retry-After: 1`): a worker not
/// connected is usually reconnecting, a busy one frees streams soon.
fn retry_soon(mut resp: Response<GatewayBody>) -> Response<GatewayBody> {
    resp.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from_static("1"),
    );
    resp
}
