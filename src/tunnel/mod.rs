//! Any `tower` HTTP service served as a worker (feature `tower`): an axum
//! or hyper application, or a proxy to a local server, reachable through a
//! relay without opening a port.
//!
//! - [`serve`] serves one connection: each request becomes an
//!   `http::Request<`[`TunnelBody`]`>` for the service, on its own task; the
//!   service's response streams back. A service error, or a response head
//!   the protocol cannot carry, is answered 500; a response body that fails
//!   after the head aborts the stream, so the caller sees it fail. When the
//!   caller goes away, the service's future is dropped.
//! - [`Tunnel`] is the whole worker: dial with [`ws::dial`](crate::ws::dial),
//!   serve, reconnect with the spec's [`Backoff`](crate::connect::Backoff)
//!   and jitter, until the relay refuses the worker for good.
//!
//! ```no_run
//! # async fn run() {
//! use axum::{routing::get, Router};
//! use worker_relay::connect::Token;
//! use worker_relay::tunnel::Tunnel;
//!
//! let app = Router::new().route("/health", get(|| async { "ok" }));
//! let token = Token::new("s3cret").ok();
//! let refused = Tunnel::new("ws://127.0.0.1:8080/connect", token).run(app).await;
//! eprintln!("the relay refused this worker: {refused}");
//! # }
//! ```

mod body;
mod run;

pub use body::{TunnelBody, PEEK_WAIT};
pub use run::{Jitter, Tunnel};

use crate::connect::http::{request_builder, response_head_from_parts};
use crate::frame::Message;
use crate::gateway::BoxError;
use crate::proto::WorkerConfig;
use crate::rt::pump::{self, Pump, PumpEnd};
use crate::rt::{self, DriverError, ResponseSink, TokioTimer};
use futures_core::Stream;
use futures_sink::Sink;
use http::{Request, Response};
use http_body::Body;
use std::future::poll_fn;
use std::pin::pin;
use tokio::task::JoinSet;

/// Serves one connection with `service` until it ends, each request on its
/// own task (tasks still running when the connection ends are cancelled).
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
    let (mut incoming, driver) = rt::worker(socket, TokioTimer, config);
    let mut driver = pin!(driver);
    let mut tasks = JoinSet::new();
    let mut accepting = true;
    loop {
        tokio::select! {
            result = &mut driver => return result,
            req = poll_fn(|cx| std::pin::Pin::new(&mut incoming).poll_next(cx)), if accepting => match req {
                Some(req) => {
                    tasks.spawn(handle(req, service.clone()));
                }
                None => accepting = false,
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

/// Answers one request with `service`.
async fn handle<Svc, B>(req: rt::Request, mut service: Svc)
where
    Svc: tower::Service<Request<TunnelBody>, Response = Response<B>>,
    Svc::Error: Into<BoxError>,
    B: Body,
    B::Error: Into<BoxError>,
{
    let rt::Request {
        head,
        body,
        responder,
        ..
    } = req;
    let body = TunnelBody::new(body, &head).await;
    let request = match request_builder(&head).map(|b| b.body(body)) {
        Ok(Ok(r)) => r,
        _ => {
            tracing::debug!("a request the http crate cannot carry: {}", head.target());
            return responder.fail();
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
        () = &mut gone => return, // the caller left: drop the app's work
    };
    let response = match response {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("the service failed: {e}; answering 500");
            return responder.fail();
        }
    };
    let (parts, body) = response.into_parts();
    let head = match response_head_from_parts(&parts) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!("the service's response cannot be sent: {e}; answering 500");
            return responder.fail();
        }
    };
    let Ok(sink) = responder.respond(head) else {
        return;
    };
    // A body that produces nothing more (a long poll, an event stream)
    // would otherwise live until the connection ends after its caller left.
    tokio::select! {
        () = stream_body(body, sink) => {}
        () = gone => {} // the caller left mid-body: drop the app's body
    }
}

/// Streams `body` into `sink`, each piece going out as soon as the body
/// pauses; a body error fails the response (`abort`) after what the body
/// produced before it.
async fn stream_body<B>(body: B, sink: ResponseSink)
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut pump = Pump::new(body, sink);
    match poll_fn(|cx| pump.poll(cx)).await {
        PumpEnd::Done => {}
        PumpEnd::Refused(e) => tracing::debug!("the response body was refused: {e}"),
        PumpEnd::SourceFailed(e) => {
            tracing::debug!("the response body failed: {e}; aborting");
            let mut sink = pump.into_sink();
            if pump::flush(&mut sink).await.is_ok() {
                sink.fail();
            }
        }
    }
}
