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
        return retry_soon(answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "worker not connected",
        ));
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
            tracing::debug!("worker {worker}: request failed before its response: {e}");
            // An upload that went silent: 408, as nginx's client_body_timeout.
            // The task ended as it dropped the sink; its result is moments away.
            if matches!(e, RelayError::RequestAborted) {
                let ended = tokio::time::timeout(Duration::from_secs(1), upload).await;
                if let Ok(Ok(UploadEnd::Stalled)) = ended {
                    return answer(StatusCode::REQUEST_TIMEOUT, "the request body stalled");
                }
            } else {
                upload.abort();
            }
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

/// How an upload ended.
#[derive(Debug, PartialEq, Eq)]
enum UploadEnd {
    /// Sent whole, or the worker stopped taking it.
    Done,
    /// The caller's body failed (a reset, a malformed chunked encoding).
    Failed,
    /// The caller sent nothing for the upload timeout.
    Stalled,
}

/// Streams the caller's body to the worker. A body that fails or stalls
/// drops the sink unclosed: the stream is aborted, and the caller answered
/// 400 (failed) or 408 (stalled) unless the response had begun.
async fn upload<B>(body: B, mut sink: RequestSink, timeout: Duration) -> UploadEnd
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
            Ok(Some(Err(_))) => return UploadEnd::Failed,
            Err(_) => return UploadEnd::Stalled,
        };
        if !data.is_empty() && sink_ext::send(&mut sink, data).await.is_err() {
            return UploadEnd::Done;
        }
    }
    let _ = sink_ext::close(&mut sink).await;
    UploadEnd::Done
}
