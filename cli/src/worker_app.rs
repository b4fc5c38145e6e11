//! The worker's app (the worker program's, the demo's, the tests'): an axum
//! app served through a relay by [`Tunnel`], which dials, reconnects with
//! backoff, and returns only when the relay refuses the worker for good.
#![allow(dead_code)] // shared by several examples and tests, each using a part

use axum::body::Body;
use axum::extract::Request;
use axum::http::{self, header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::{Extension, Router};
use bytes::Bytes;
use futures_util::future::Either;
use futures_util::{stream, StreamExt};
use sha2::{Digest, Sha256};
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower::{Service, ServiceExt};
use tracing::Instrument;
use worker_relay::connect::Token;
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody, TunnelEnd};
use worker_relay_hyper::ws::Dialer;
use worker_relay_hyper::BoxError;

/// What the worker needs to run.
pub struct WorkerOptions {
    pub connect_url: String,
    pub connect_token: Option<Token>,
    pub worker_token: Option<Token>,
    /// The name of the span the worker's connection logs are in.
    pub name: String,
    /// How the relay is dialled (its time limit; for `wss://`, whom it
    /// trusts).
    pub dialer: Dialer,
}

/// Serves the app until the relay refuses the worker for good; returns the
/// process exit status (1).
pub async fn run(opts: WorkerOptions) -> i32 {
    run_with(opts, app()).await
}

/// Serves `service` behind the worker token's check until the relay
/// refuses the worker for good; returns the process exit status (1).
pub async fn run_with<S>(opts: WorkerOptions, service: S) -> i32
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
{
    run_until(opts, service, std::future::pending(), Duration::ZERO).await
}

/// [`run_with`] until `shutdown` resolves, then a drain of at most `grace`
/// (new requests 503, those in flight finish, then close 1001); returns the
/// process exit status: 0 after a drain, 1 when the relay refused the
/// worker for good.
pub async fn run_until<S>(
    opts: WorkerOptions,
    service: S,
    shutdown: impl std::future::Future<Output = ()>,
    grace: Duration,
) -> i32
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
{
    let end = Tunnel::new(opts.connect_url, opts.connect_token)
        .dialer(opts.dialer)
        .run_until(
            guarded::<TunnelBody, _>(opts.worker_token, service),
            shutdown,
            grace,
        )
        .instrument(tracing::info_span!("worker", name = %opts.name))
        .await;
    match end {
        TunnelEnd::Stopped => {
            tracing::info!("drained; exiting");
            0
        }
        // The tunnel logged the refusal.
        _ => {
            tracing::error!("exiting with status 1");
            1
        }
    }
}

/// Serves the app on `listener` directly, without a relay (the baseline
/// the benchmarks compare the relay path with): the same routes, the same
/// token check, the crate's hardened server.
pub async fn serve_directly(listener: tokio::net::TcpListener, worker_token: Option<Token>) {
    let service = guarded::<hyper::body::Incoming, _>(worker_token, app());
    match worker_relay_hyper::server::serve(listener, service, Default::default()).await {}
}

/// `service` behind the worker token's check, for requests whose body is
/// `B`.
fn guarded<B, S>(
    worker_token: Option<Token>,
    service: S,
) -> impl Service<http::Request<B>, Response = Response, Error = BoxError, Future: Send + 'static>
       + Clone
       + Send
       + Sync
       + 'static
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
{
    // Shared, not copied per request: one copy of the secret in memory
    // rather than one freed per request (and no allocation per request).
    Authorized {
        token: Arc::new(worker_token),
        inner: service,
    }
    .map_request(|req: http::Request<B>| req.map(Body::new))
    // A route that answers `Failed` makes the service fail: the worker
    // answers 500, as Strata's worker does when its app raises.
    .map_result(|r| match r {
        Ok(resp) if resp.extensions().get::<Failed>().is_some() => {
            Err(BoxError::from("the app failed"))
        }
        Ok(resp) => Ok(resp),
        Err(never) => match never {},
    })
}

/// The routes of the examples' contract. HEAD is served as GET without a
/// body; another method on a known path is 404, as an unknown path is.
pub fn app() -> Router {
    Router::new()
        .route("/health", any(not_found).get(health))
        .route("/echo", any(not_found).post(echo))
        .route("/sha256", any(not_found).post(sha256))
        .route("/slow-sink", any(not_found).post(slow_sink))
        .route("/bytes", any(not_found).get(bytes))
        .route("/sleep", any(not_found).get(sleep))
        .route("/fail-before", any(not_found).get(|| async { Failed }))
        .route("/fail-after", any(not_found).get(fail_after))
        .fallback(not_found)
}

/// Every route needs `Authorization: Bearer <worker token>` if the worker
/// has one (401 otherwise, the body left unread); the header goes no further.
/// (A service of its own rather than axum's `from_fn`, which boxes the
/// request's future and a clone of the app for each request.)
#[derive(Clone)]
struct Authorized<S> {
    token: Arc<Option<Token>>,
    inner: S,
}

impl<S> Service<Request> for Authorized<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<std::future::Ready<Result<Response, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        if let Some(token) = self.token.as_ref() {
            let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
            let ok = match (values.next(), values.next()) {
                (Some(v), None) => v
                    .as_bytes()
                    .strip_prefix(b"Bearer ")
                    .is_some_and(|t| token.matches(t)),
                _ => false,
            };
            if !ok {
                let refused = plain(StatusCode::UNAUTHORIZED, "unauthorized\n");
                return Either::Left(std::future::ready(Ok(refused)));
            }
            req.headers_mut().remove(header::AUTHORIZATION);
        }
        Either::Right(self.inner.call(req))
    }
}

/// Makes the service fail (see [`run`]).
#[derive(Clone)]
struct Failed;

impl IntoResponse for Failed {
    fn into_response(self) -> Response {
        Extension(self).into_response()
    }
}

fn query_param(uri: &Uri, name: &str) -> Option<u64> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.parse().ok()).flatten()
    })
}

/// A `text/plain` answer (axum adds its Content-Length).
fn text(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain")], body).into_response()
}

async fn health() -> Response {
    let body = r#"{"status":"ok"}"#;
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Streams the body back as it arrives, with its type and length.
async fn echo(req: Request) -> Response {
    let octets = HeaderValue::from_static("application/octet-stream");
    let mut headers = HeaderMap::new();
    let ctype = req.headers().get(header::CONTENT_TYPE).cloned();
    headers.insert(header::CONTENT_TYPE, ctype.unwrap_or(octets));
    if let Some(len) = req.headers().get(header::CONTENT_LENGTH) {
        headers.insert(header::CONTENT_LENGTH, len.clone());
    }
    (headers, req.into_body()).into_response()
}

/// Reads the body to its end, at most `rate` bytes/s (0: as it comes),
/// handing each piece to `each`; returns its length.
async fn read_all(body: Body, rate: f64, mut each: impl FnMut(&[u8])) -> Result<u64, Failed> {
    let mut pieces = body.into_data_stream();
    let mut n = 0;
    while let Some(piece) = pieces.next().await {
        let piece = piece.map_err(|_| Failed)?;
        n += piece.len() as u64;
        each(&piece);
        if rate > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(piece.len() as f64 / rate)).await;
        }
    }
    Ok(n)
}

async fn sha256(body: Body) -> Result<Response, Failed> {
    let mut hasher = Sha256::new();
    let n = read_all(body, 0.0, |piece| hasher.update(piece)).await?;
    Ok(text(format!("{} {n}", hex::encode(hasher.finalize()))))
}

/// Reads the body at `mibps` MiB/s (a slow disk), answers its length.
async fn slow_sink(uri: Uri, body: Body) -> Result<Response, Failed> {
    let mibps = query_param(&uri, "mibps").unwrap_or(1).max(1);
    let n = read_all(body, mibps as f64 * 1024.0 * 1024.0, |_| {}).await?;
    Ok(text(n.to_string()))
}

/// `n` bytes of a pattern, made in 256 KiB pieces as they are sent.
async fn bytes(uri: Uri) -> Response {
    let n = query_param(&uri, "n").unwrap_or(0);
    let pieces = stream::unfold(0u64, move |sent| async move {
        let size = (n - sent).min(256 * 1024);
        let piece: Vec<u8> = (0..size).map(|i| ((sent + i) % 251) as u8).collect();
        (size > 0).then(|| (Ok::<_, BoxError>(Bytes::from(piece)), sent + size))
    });
    let headers = [
        (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
        (header::CONTENT_LENGTH, n.to_string()),
    ];
    (headers, Body::from_stream(pieces)).into_response()
}

/// Answers after `ms` milliseconds; says so if the caller goes first (the
/// tunnel then drops this future).
async fn sleep(uri: Uri) -> Response {
    struct Gone(bool);
    impl Drop for Gone {
        fn drop(&mut self) {
            if self.0 {
                tracing::info!("/sleep: the client has gone");
            }
        }
    }
    let ms = query_param(&uri, "ms").unwrap_or(0);
    let mut gone = Gone(true);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    gone.0 = false;
    text(format!("slept {ms} ms"))
}

/// A 200 whose body fails after `n` bytes: the caller's response fails.
async fn fail_after(uri: Uri) -> Response {
    let n = query_param(&uri, "n").unwrap_or(0) as usize;
    let pieces: [Result<Bytes, BoxError>; 2] = [
        Ok(Bytes::from(vec![b'x'; n])),
        Err("failing after the head, as asked".into()),
    ];
    let ctype = [(header::CONTENT_TYPE, "application/octet-stream")];
    (ctype, Body::from_stream(stream::iter(pieces))).into_response()
}

async fn not_found() -> Response {
    plain(StatusCode::NOT_FOUND, "not found\n")
}

/// A short `text/plain; charset=utf-8` answer with its Content-Length.
pub fn plain(status: StatusCode, body: &'static str) -> Response {
    (status, [(header::CONTENT_LENGTH, body.len())], body).into_response()
}
