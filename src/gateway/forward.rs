//! Forwarding a caller's request to its worker, and the answer back.

use super::{answer, BoxError, GatewayBody, Inner};
use crate::connect::http::{request_head_from_parts, response_builder, HttpError};
use crate::connect::UrlError;
use crate::rt::{sink_ext, RelayError, RequestSink};
use bytes::Buf;
use http::{Request, Response, StatusCode};
use http_body::Body;
use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

/// Forwards one request: maps it to its worker, streams the body up while
/// the answer is awaited, and streams the answer back. Every refusal is an
/// HTTP answer: 404 (no such worker or path), 400, 405, 431, 414, 503
/// (not connected; or busy, with `Retry-After: 1`), 502 (the worker failed).
pub(super) async fn forward<B>(inner: Arc<Inner>, req: Request<B>) -> Response<GatewayBody>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    if inner.relay.refuses_method(req.method().as_str()) {
        return answer(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    }
    let (parts, body) = req.into_parts();
    let (worker, head) = match request_head_from_parts(&parts, &inner.urls) {
        Ok(x) => x,
        Err(HttpError::Url(UrlError::NotUnderPrefix)) => {
            return answer(StatusCode::NOT_FOUND, "not found")
        }
        Err(e) => return answer(StatusCode::BAD_REQUEST, &format!("bad request: {e}")),
    };
    if !inner.tokens.contains(worker.as_str()) {
        return answer(StatusCode::NOT_FOUND, "unknown worker");
    }
    let Some(handle) = inner.registry.handle(worker.as_str()) else {
        return answer(StatusCode::SERVICE_UNAVAILABLE, "worker not connected");
    };
    let (sink, response) = match handle.send_request(head) {
        Ok(x) => x,
        Err(e) => return refusal(&e),
    };
    // The body goes up on its own task while the answer is awaited: a
    // worker may answer before it has read the whole body.
    let upload = tokio::spawn(upload(body, sink, inner.upload_timeout));
    let resp = match response.await {
        Ok(r) => r,
        Err(e) => {
            upload.abort();
            tracing::debug!("worker {worker}: request failed before its response: {e}");
            return refusal(&e);
        }
    };
    match response_builder(&resp.head) {
        Ok(b) => b
            .body(GatewayBody::worker(resp.body))
            .unwrap_or_else(|_| answer(StatusCode::BAD_GATEWAY, "bad response from worker")),
        Err(e) => answer(
            StatusCode::BAD_GATEWAY,
            &format!("bad response from worker: {e}"),
        ),
    }
}

/// The answer to a request the relay refuses or the worker failed:
/// [`RelayError::status`], with `Retry-After: 1` on a 503.
fn refusal(e: &RelayError) -> Response<GatewayBody> {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut resp = answer(status, &e.to_string());
    if status == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
    }
    resp
}

/// Streams the caller's body to the worker. A body that fails (a reset, a
/// malformed chunked encoding) or sends nothing for `timeout` drops the
/// sink unclosed: the stream is aborted and the caller answered 400.
async fn upload<B>(body: B, mut sink: RequestSink, timeout: Duration)
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    loop {
        let frame = poll_fn(|cx| body.as_mut().poll_frame(cx));
        let data = match tokio::time::timeout(timeout, frame).await {
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(mut data) => data.copy_to_bytes(data.remaining()),
                Err(_) => continue, // trailers: not forwarded
            },
            Ok(None) => break,
            Ok(Some(Err(_))) | Err(_) => return,
        };
        if !data.is_empty() && sink_ext::send(&mut sink, data).await.is_err() {
            return;
        }
    }
    let _ = sink_ext::close(&mut sink).await;
}
