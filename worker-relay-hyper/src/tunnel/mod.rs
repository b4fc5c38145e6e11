//! Any `tower` HTTP service served as a worker (feature `tunnel`): an axum
//! or hyper application, or a proxy to a local server, reachable through a
//! relay without opening a port.
//!
//! - [`serve`] serves one connection: each request becomes an
//!   `http::Request<`[`TunnelBody`]`>` for the service, first polled in
//!   the connection's task (an answer ready at once goes out from there,
//!   with no task of its own) and, once it waits, on its own task; the
//!   service's response streams back. A service error, or a response head
//!   the protocol cannot carry, is answered 500; a response body that fails
//!   after the head aborts the stream, so the caller sees it fail. When the
//!   caller goes away, the service's future is dropped.
//! - [`Tunnel`] is the whole worker: dial with [`ws::dial`](crate::ws::dial),
//!   serve, reconnect with the spec's [`Backoff`](worker_relay::connect::Backoff)
//!   and jitter, until the relay refuses the worker for good. Its dial
//!   failures are retried and logged through `tracing`; a program without a
//!   subscriber sees them with [`Tunnel::on_event`] ([`TunnelEvent`]).
//!
//! ```no_run
//! # async fn run() {
//! use axum::{routing::get, Router};
//! use worker_relay::connect::Token;
//! use worker_relay_hyper::tunnel::Tunnel;
//!
//! let app = Router::new().route("/health", get(|| async { "ok" }));
//! let token = Token::new("s3cret").ok();
//! let refused = Tunnel::new("ws://127.0.0.1:8080/connect", token).run(app).await;
//! eprintln!("the relay refused this worker: {refused}");
//! # }
//! ```

mod body;
mod events;
mod run;

pub use body::{TunnelBody, PEEK_WAIT};
pub use events::TunnelEvent;
pub use run::{Jitter, Tunnel, TunnelEnd};

use crate::observe::worker::Meters;
use crate::observe::{ByteCount, Counted};
use crate::pump::{self, Pump, PumpEnd};
use crate::BoxError;
use crate::TokioTimer;
use bytes::Bytes;
use futures_core::Stream;
use futures_sink::Sink;
use http::{Request, Response};
use http_body::Body;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;
use tokio::task::JoinSet;
use worker_relay::forward::{request_builder, response_head_from_parts};
use worker_relay::frame::{CloseCode, Message};
use worker_relay::proto::WorkerConfig;
use worker_relay::rt::{self, DriverError, ResponseSink};

/// How many answers ready at once go out in one write, at most, when the
/// driver has read many requests at a time. One write for all of them
/// (say the 14 a relay sends together under load) holds the first answer
/// until the last is made, and the relay sits idle meanwhile; one write
/// each costs a system call each. In between, the relay turns the first
/// answers into HTTP responses while this side makes the next: about a
/// fifth more small requests per second through relay + worker on two
/// cores than one write for all (BENCHMARKS.md, issue 42).
const ANSWERS_PER_WRITE: usize = 4;

/// Serves one connection with `service` until it ends, each request on its
/// own task once it waits (tasks still running when the connection ends
/// are cancelled). A request's first poll runs in the connection's task,
/// as hyper's HTTP/1 server runs its service: a service that computes for
/// long before its first `.await` holds the connection's other streams
/// meanwhile (give such work to `spawn_blocking`).
/// Needs a tokio runtime.
pub async fn serve<S, E, Svc, B>(
    socket: S,
    config: WorkerConfig,
    service: Svc,
) -> Result<rt::Closed, DriverError<E>>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin + Send + 'static,
    Svc: tower::Service<Request<TunnelBody>, Response = Response<B>> + Clone + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let never = pin!(std::future::pending());
    serve_until(socket, config, service, never, Duration::ZERO)
        .await
        .0
}

/// [`serve`] until `shutdown` resolves, then a drain: each new request is
/// answered 503 with `Retry-After: 1` without reaching the service, the
/// requests in flight finish (at most `grace`), and the connection is then
/// closed with 1001 (going away). Returns how the connection ended and
/// whether `shutdown` had fired. A `grace` too long for the clock
/// (`Duration::MAX`) waits for the requests in flight without a limit.
pub async fn serve_until<S, E, Svc, B, F>(
    socket: S,
    config: WorkerConfig,
    service: Svc,
    mut shutdown: std::pin::Pin<&mut F>,
    grace: Duration,
) -> (Result<rt::Closed, DriverError<E>>, bool)
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin + Send + 'static,
    Svc: tower::Service<Request<TunnelBody>, Response = Response<B>> + Clone + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    F: std::future::Future<Output = ()>,
{
    let (mut incoming, driver) = rt::worker(socket, TokioTimer, config);
    let mut driver = pin!(driver);
    let meters = Meters::new();
    let mut tasks = JoinSet::new();
    let mut refusals = JoinSet::new();
    let mut accepting = true;
    let mut draining: Option<tokio::time::Instant> = None;
    let mut closed = false;
    // Closing drops what the connection has not sent yet: once the app's
    // tasks are done, wait until their streams' ends have gone out too (at
    // most a second: answers to new requests keep coming meanwhile).
    let mut flushing: Option<tokio::time::Instant> = None;
    loop {
        if draining.is_some() && !closed && tasks.is_empty() {
            let since = *flushing.get_or_insert_with(tokio::time::Instant::now);
            if incoming.stats().streams_open == 0 || since.elapsed() >= Duration::from_secs(1) {
                tracing::info!("drained: closing the connection (1001)");
                incoming.close(CloseCode::GOING_AWAY, "the worker is shutting down");
                closed = true;
            }
        }
        let grace_end = draining.filter(|_| !closed);
        let flush_tick = flushing.filter(|_| !closed);
        tokio::select! {
            result = &mut driver => return (result, draining.is_some()),
            req = poll_fn(|cx| std::pin::Pin::new(&mut incoming).poll_next(cx)), if accepting => {
                let mut next = req;
                let mut served = 0usize;
                loop {
                    match next {
                        Some(req) if draining.is_some() => {
                            refusals.spawn(refuse(req, meters.clone()));
                        }
                        Some(req) => {
                            // Its first poll here, in the connection's
                            // task: an answer ready at once (most small
                            // requests) then costs no task of its own and
                            // no hand-off to another runtime thread and
                            // back. One that waits (for its body, an
                            // upstream, a timer) goes on its own task.
                            let mut answer = Box::pin(handle(req, service.clone(), meters.clone()));
                            if poll_fn(|cx| Poll::Ready(answer.as_mut().poll(cx).is_pending())).await {
                                tasks.spawn(answer);
                            }
                        }
                        None => {
                            accepting = false;
                            break;
                        }
                    }
                    // The requests the driver has already read are served
                    // before it reads again, their answers written
                    // [`ANSWERS_PER_WRITE`] at a time.
                    served += 1;
                    if served % ANSWERS_PER_WRITE == 0 {
                        if let Poll::Ready(result) = poll_fn(|cx| Poll::Ready(driver.as_mut().poll(cx))).await {
                            return (result, draining.is_some());
                        }
                    }
                    match poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut incoming).poll_next(cx))).await {
                        Poll::Ready(r) => next = r,
                        Poll::Pending => break,
                    }
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            Some(_) = refusals.join_next(), if !refusals.is_empty() => {}
            () = shutdown.as_mut(), if draining.is_none() => {
                tracing::info!(
                    "shutting down: new requests answered 503; {} in flight may take {} s",
                    tasks.len(),
                    grace.as_secs()
                );
                draining = Some(crate::ws::deadline_after(tokio::time::Instant::now(), grace));
            }
            () = tokio::time::sleep(Duration::from_millis(10)), if flush_tick.is_some() => {}
            () = tokio::time::sleep_until(grace_end.unwrap_or_else(tokio::time::Instant::now)), if grace_end.is_some() => {
                let cut = tasks.len();
                let noun = if cut == 1 { "request" } else { "requests" };
                tracing::warn!("grace period over: {cut} {noun} cut; closing (1001)");
                incoming.close(CloseCode::GOING_AWAY, "the worker is shutting down");
                closed = true;
            }
        }
    }
}

/// Answers a request that arrives while the worker drains: 503, `Retry-After: 1`.
async fn refuse(req: rt::IncomingRequest, meters: Meters) {
    let resp = Response::builder()
        .status(http::StatusCode::SERVICE_UNAVAILABLE)
        .header(http::header::RETRY_AFTER, "1")
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Text(Some(Bytes::from_static(
            b"the worker is shutting down\n",
        ))));
    let Ok(resp) = resp else {
        return req.responder.fail();
    };
    let (parts, body) = resp.into_parts();
    let Ok(head) = response_head_from_parts(&parts) else {
        return req.responder.fail();
    };
    let _open = meters.stream_open();
    if let Ok(sink) = req.responder.respond(head) {
        let ok = stream_body(body, sink, &meters).await;
        meters.request(if ok { "503" } else { "aborted" });
    }
}

/// A body of one piece, for the worker's own answers.
struct Text(Option<Bytes>);

impl Body for Text {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.take().map(|b| Ok(http_body::Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.as_ref().map_or(0, |b| b.len() as u64))
    }
}

/// Answers one request with `service`.
async fn handle<Svc, B>(req: rt::IncomingRequest, mut service: Svc, meters: Meters)
where
    Svc: tower::Service<Request<TunnelBody>, Response = Response<B>>,
    Svc::Error: Into<BoxError>,
    B: Body,
    B::Error: Into<BoxError>,
{
    let _open = meters.stream_open();
    let rt::IncomingRequest {
        head,
        body,
        responder,
        ..
    } = req;
    let body = TunnelBody::new(body, &head, meters.clone()).await;
    let request = match request_builder(&head).map(|b| b.body(body)) {
        Ok(Ok(r)) => r,
        _ => {
            tracing::debug!("a request the http crate cannot carry: {}", head.target());
            return answer_500(responder, &meters);
        }
    };
    let mut gone = pin!(responder.client_gone());
    let answer = async {
        poll_fn(|cx| service.poll_ready(cx))
            .await
            .map_err(Into::into)?;
        service.call(request).await.map_err(Into::<BoxError>::into)
    };
    let response = tokio::select! {
        r = answer => r,
        () = &mut gone => {
            // The caller left: drop the app's work (nginx's 499).
            meters.request("499");
            return;
        }
    };
    let response = match response {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("the service failed: {e}; answering 500");
            return answer_500(responder, &meters);
        }
    };
    let (parts, body) = response.into_parts();
    let head = match response_head_from_parts(&parts) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!("the service's response cannot be sent: {e}; answering 500");
            return answer_500(responder, &meters);
        }
    };
    // Its text when the body is over (no allocation: a status the head
    // holds is a valid one).
    let status = http::StatusCode::from_u16(head.status()).unwrap_or(parts.status);
    let Ok(sink) = responder.respond(head) else {
        meters.request("499");
        return;
    };
    // A body that produces nothing more (a long poll, an event stream)
    // would otherwise live until the connection ends after its caller left.
    let ok = tokio::select! {
        ok = stream_body(body, sink, &meters) => ok,
        () = gone => false, // the caller left mid-body: drop the app's body
    };
    meters.request(if ok { status.as_str() } else { "aborted" });
}

/// Answers 500 (`Responder::fail`), its body counted as sent.
fn answer_500(responder: rt::Responder, meters: &Meters) {
    meters.request("500");
    meters.bytes_down(worker_relay::proto::FAILED_BODY.len() as u64);
    responder.fail();
}

/// Streams `body` into `sink`, each piece going out as soon as the body
/// pauses; a body error fails the response (`abort`) after what the body
/// produced before it.
/// Whether the body went whole.
async fn stream_body<B>(body: B, sink: ResponseSink, meters: &Meters) -> bool
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let count = ByteCount::default();
    // Counted when this future ends or is dropped (the caller left).
    let _down = CountOnDrop(count.clone(), meters);
    // The app may compute its body: yield, so the driver writes beside it.
    let body = pin!(body);
    let mut pump = Pump::new(Counted::new(body, count), sink).yielding(pump::YIELD_AFTER);
    match poll_fn(|cx| pump.poll(cx)).await {
        PumpEnd::Done => true,
        PumpEnd::Refused(e) => {
            tracing::debug!("the response body was refused: {e}");
            false
        }
        PumpEnd::SourceFailed(e) => {
            tracing::debug!("the response body failed: {e}; aborting");
            let mut sink = pump.into_sink();
            if pump::flush(&mut sink).await.is_ok() {
                sink.fail();
            }
            false
        }
    }
}

/// Records the response body's bytes when dropped.
struct CountOnDrop<'a>(ByteCount, &'a Meters);

impl Drop for CountOnDrop<'_> {
    fn drop(&mut self) {
        self.1.bytes_down(self.0.get());
    }
}
