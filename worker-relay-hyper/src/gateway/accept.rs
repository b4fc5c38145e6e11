//! A worker's upgrade request: the handshake decision, the 101, and the
//! connection's life after it.

use super::Presented;
use super::{answer, GatewayBody, Inner};
use crate::TokioTimer;
use futures_core::Stream;
use futures_sink::Sink;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use worker_relay::connect::{
    decide_upgrade_at, ConnectRejected, ConnectTarget, Rejected, TokenTable, WorkerId,
};
use worker_relay::frame::{CloseCode, Message, SUBPROTOCOL};
use worker_relay::rt::{self, DriverError};

/// The handshake metric's `outcome` for the relay's answer.
pub(super) fn outcome(status: StatusCode) -> &'static str {
    match status.as_u16() {
        101 => "accepted",
        401 | 403 => "unauthorized",
        429 => "rate_limited",
        400..=499 => "bad_request",
        _ => "refused",
    }
}

/// The 101 answering a worker's upgrade request with `key`, with `body`
/// (empty for hyper, whose upgrade takes the connection; the connection's
/// bytes for a host that streams them as the 101's body).
pub(super) fn switching(key: &HeaderValue, body: GatewayBody) -> Response<GatewayBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(SUBPROTOCOL),
    );
    if let Ok(v) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    resp
}

/// The gateway's decision on a worker's handshake, whatever accepts the
/// WebSocket: 503 while draining, the token (table, then the hook), flap
/// damping (429), the `Refuse` policy (503); or the admission.
pub(super) async fn admission(
    inner: &Arc<Inner>,
    path: &str,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
) -> Result<Admission, Refusal> {
    if inner.draining.load(std::sync::atomic::Ordering::SeqCst) {
        let mut resp = answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "the relay is shutting down",
        );
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return Err(Box::new(resp));
    }
    let table = inner.tokens();
    let (worker, by_hook) = match decide(inner, &table, path, headers, peer) {
        Ok(worker) => (worker, false),
        Err(Undecided::Refused(refusal)) => return Err(refusal),
        Err(Undecided::AskHook(presented)) => (ask_hook(inner, presented).await?, true),
    };
    if let Some(wait) = inner.registry.damped(&worker, peer) {
        let mut resp = answer(
            StatusCode::TOO_MANY_REQUESTS,
            "this worker's connection keeps being replaced; try later",
        );
        if let Ok(v) = HeaderValue::from_str(&wait.as_secs().to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return Err(Box::new(resp));
    }
    if inner.registry.policy() == super::DuplicatePolicy::Refuse
        && inner.registry.handle(worker.as_str()).is_some()
    {
        tracing::info!("worker {worker}: refused a second connection while connected (503)");
        let mut resp = answer(StatusCode::SERVICE_UNAVAILABLE, "worker already connected");
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return Err(Box::new(resp));
    }
    // A worker the hook let in is the hook's to revoke: no table decided
    // it, so no table change closes it.
    let decided = Decided {
        table: (!by_hook).then_some(table),
        peer,
        by_hook,
    };
    let mut admission = Admission::decided(inner, worker, decided);
    for name in [
        header::UPGRADE,
        header::SEC_WEBSOCKET_KEY,
        header::SEC_WEBSOCKET_VERSION,
    ] {
        for value in headers.get_all(&name) {
            admission.handshake.append(name.clone(), value.clone());
        }
    }
    Ok(admission)
}

/// A worker's handshake the gateway accepted ([`Gateway::admit`](super::Gateway::admit)):
/// answer the upgrade with 101 your own way, then hand the accepted
/// WebSocket to [`serve`](Self::serve). Dropping it instead lets nothing in.
#[must_use = "an admission does nothing until its socket is served"]
pub struct Admission {
    pub(super) inner: Arc<Inner>,
    pub(super) worker: WorkerId,
    pub(super) decided: Decided,
    /// The request's WebSocket handshake headers (`Upgrade`,
    /// `Sec-WebSocket-Key`, `Sec-WebSocket-Version`), for
    /// [`upgrade_local`](Self::upgrade_local).
    pub(super) handshake: HeaderMap,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("worker", &self.worker)
            .field("by_hook", &self.decided.by_hook)
            .finish_non_exhaustive()
    }
}

impl Admission {
    /// `worker`'s connection, let in as `decided` says.
    pub(super) fn decided(inner: &Arc<Inner>, worker: WorkerId, decided: Decided) -> Admission {
        Admission {
            inner: inner.clone(),
            worker,
            decided,
            handshake: HeaderMap::new(),
        }
    }

    /// The worker its token (or the authorisation hook) names.
    pub fn worker(&self) -> &WorkerId {
        &self.worker
    }

    /// Serves `socket`, the WebSocket accepted for this handshake (mapped
    /// to [`Message`]s; the host's library must answer pings itself, or the
    /// gateway's `RelayConfig` must have `answer_pings` on), as the
    /// worker's connection until it ends: registered under the gateway's
    /// duplicate policy, revoked with its token, drained with the gateway,
    /// its close bounded by the connection's `close_timeout` whether or not
    /// the host closes the socket when it is dropped. Returns as
    /// [`Gateway::attach`](super::Gateway::attach) does.
    pub async fn serve<S, E>(self, socket: S) -> Result<rt::Closed, super::AttachError<E>>
    where
        S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin + 'static,
        E: std::fmt::Display,
    {
        match attach(&self.inner, self.worker, socket, self.decided).await {
            None => Err(super::AttachError::Duplicate),
            Some(ended) => ended.map_err(super::AttachError::Driver),
        }
    }
}

/// An answer refusing a worker's upgrade request.
pub(super) type Refusal = Box<Response<GatewayBody>>;

/// The `Sec-WebSocket-Key` of a WebSocket upgrade request (version 13)
/// with these headers (`get`: whether its method is `GET`), or the answer
/// refusing the request: 400 if it is not an upgrade, 426 for another
/// WebSocket version.
pub(super) fn websocket_key_of(
    get: bool,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
) -> Result<HeaderValue, Refusal> {
    let is_upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let key = headers.get(header::SEC_WEBSOCKET_KEY).cloned();
    let (true, Some(key)) = (is_upgrade && get, key) else {
        tracing::info!(
            "refused a connection{}: not a WebSocket upgrade (400)",
            from(peer)
        );
        return Err(Box::new(answer(
            StatusCode::BAD_REQUEST,
            "expected a WebSocket upgrade",
        )));
    };
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v.as_bytes() != b"13")
    {
        let mut resp = answer(StatusCode::UPGRADE_REQUIRED, "WebSocket version 13 only");
        resp.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        return Err(Box::new(resp));
    }
    Ok(key)
}

/// A handshake the table did not decide.
enum Undecided {
    /// Refused: the answer.
    Refused(Refusal),
    /// A well-formed token the table does not hold, for the hook.
    AskHook(Presented),
}

/// The worker this upgrade request is for, by its token and (at
/// `<connect path>/<id>`) the id its path names; or the refusal (400, 401)
/// to answer, or what to ask the authorisation hook. Neither the log line
/// nor the answer holds the token.
fn decide(
    inner: &Inner,
    table: &TokenTable,
    path: &str,
    headers: &HeaderMap,
    peer: Option<std::net::SocketAddr>,
) -> Result<WorkerId, Undecided> {
    let target = ConnectTarget::parse(&inner.connect_path, path).unwrap_or(ConnectTarget::Any);
    let pairs = headers
        .iter()
        .map(|(n, v)| (n.as_str(), worker_relay::connect::http::header_text(v)));
    match decide_upgrade_at(table, target, pairs) {
        Ok(accepted) => Ok(accepted.into_worker()),
        Err(ConnectRejected::Handshake(Rejected::UnknownToken)) if inner.authorize.is_some() => {
            // Well-formed (one `Authorization: Bearer`, not too long), or
            // the decision would have said otherwise.
            let token = headers
                .get(header::AUTHORIZATION)
                .map(worker_relay::connect::http::header_text)
                .and_then(|v| {
                    worker_relay::connect::bearer_token(&v)
                        .ok()
                        .map(str::to_owned)
                });
            let Some(token) = token else {
                return Err(Undecided::Refused(refuse(
                    ConnectRejected::Handshake(Rejected::MalformedAuthorization),
                    peer,
                )));
            };
            let target = match target {
                ConnectTarget::Claimed(id) => WorkerId::new(id).ok(),
                ConnectTarget::Any => None,
            };
            Err(Undecided::AskHook(Presented {
                token,
                target,
                peer,
            }))
        }
        Err(rejected) => Err(Undecided::Refused(refuse(rejected, peer))),
    }
}

/// The authorisation hook's decision, or the answer refusing the worker
/// (`WWW-Authenticate: Bearer` on a 401, `Retry-After: 1` on a 503).
async fn ask_hook(inner: &Inner, presented: Presented) -> Result<WorkerId, Refusal> {
    let hook = inner.authorize.as_ref().expect("asked only with a hook");
    let peer = presented.peer;
    let decided = hook.decide(presented).await;
    if let Ok(worker) = &decided {
        inner.forgetting.admit(worker);
        inner.sweep();
    }
    decided.map_err(|status| {
        tracing::info!(
            "refused a worker{}: the authorisation hook answered {status}",
            from(peer)
        );
        let mut resp = answer(status, "refused by the relay's authorisation");
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        } else if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        Box::new(resp)
    })
}

/// The answer to a refused handshake, logged without the token.
fn refuse(rejected: ConnectRejected, peer: Option<SocketAddr>) -> Refusal {
    tracing::info!(
        "refused a worker{}: {rejected} ({})",
        from(peer),
        rejected.status()
    );
    let status = StatusCode::from_u16(rejected.status()).unwrap_or(StatusCode::BAD_REQUEST);
    let mut resp = answer(status, &rejected.to_string());
    for (n, v) in rejected.response_headers() {
        resp.headers_mut().insert(*n, HeaderValue::from_static(v));
    }
    Box::new(resp)
}

/// ` from <peer>` for a log line, if the peer is known.
fn from(peer: Option<SocketAddr>) -> String {
    peer.map_or(String::new(), |p| format!(" from {p}"))
}

/// How a connection was let in: the token table its handshake was decided
/// with (none for the hook's or [`Gateway::attach`](super::Gateway::attach)'s), its
/// peer's address, and whether the authorisation hook let it in.
#[derive(Default)]
pub(super) struct Decided {
    pub table: Option<Arc<TokenTable>>,
    pub peer: Option<std::net::SocketAddr>,
    pub by_hook: bool,
}

/// Drives `socket` as `worker`'s connection until it ends, registered in
/// the gateway meanwhile. `None` if the duplicate policy refused it.
pub(super) async fn attach<S, E>(
    inner: &Inner,
    worker: WorkerId,
    socket: S,
    decided: Decided,
) -> Option<Result<rt::Closed, DriverError<E>>>
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Unpin + 'static,
    E: std::fmt::Display,
{
    let _alive = inner.alive.clone();
    let (handle, driver) = rt::relay_with_overflow(
        socket,
        TokioTimer,
        inner.relay.clone(),
        inner.overflow.clone(),
    );
    let registered = inner.registry.register(
        worker.clone(),
        handle.clone(),
        decided.peer,
        decided.by_hook,
    );
    inner.sweep();
    let Some(registration) = registered else {
        // Refused after the 101 (a race with another connection, or a
        // socket given to `attach`): say so with a close, not a bare drop.
        // The connection's close deadline bounds the wait.
        tracing::info!("worker {worker}: refused a second connection while connected");
        handle.close(
            CloseCode::TRY_AGAIN_LATER,
            "another connection of this worker is registered",
        );
        let _ = driver.await;
        return None;
    };
    tracing::info!("worker {worker} connected");
    // A table replaced between the handshake's decision and now: the
    // replacement's scan may have missed this connection.
    if let Some(table) = decided.table {
        let now = inner.tokens();
        if !Arc::ptr_eq(&table, &now) && !table.same_token(&now, worker.as_str()) {
            tracing::info!("worker {worker}: its token was revoked; closing its connection");
            handle.close(CloseCode::POLICY_VIOLATION, super::REVOKED);
        }
    }
    let mut registration = Some(registration);
    let mut driver = driver;
    let result = poll_fn(|cx| {
        let polled = Pin::new(&mut driver).poll(cx);
        // The registry forgets the connection as soon as it starts closing
        // (callers get 503, a `Refuse` policy lets the worker back in),
        // not when its close is done, which a peer that does not read can
        // draw out to the close deadline.
        let closing = polled.is_ready() || handle.is_closed();
        if let Some(mut r) = registration.take_if(|_| closing) {
            r.reason = match (&polled, handle.close_cause()) {
                (Poll::Ready(result), _) => describe(result),
                (Poll::Pending, Some(cause)) => cause.to_string(),
                (Poll::Pending, None) => "closed".into(),
            };
            if r.is_current() {
                tracing::info!("worker {worker} disconnected: {}", r.reason);
            } else {
                tracing::info!(
                    "worker {worker}: its replaced connection ended: {}",
                    r.reason
                );
            }
            drop(r);
            inner.forgetting.left(&worker);
            inner.sweep();
        }
        polled
    })
    .await;
    if let Err(DriverError::KeepaliveTimeout) = &result {
        crate::observe::relay::keepalive_timeout();
    }
    if let Err(e @ DriverError::CloseTimeout(_)) = &result {
        tracing::info!("worker {worker}: {e}");
    }
    Some(result)
}

/// What ended a connection, for logs and [`Presence`](super::Presence).
fn describe<E: std::fmt::Display>(result: &Result<rt::Closed, DriverError<E>>) -> String {
    match result {
        Ok(closed) => closed.to_string(),
        Err(DriverError::KeepaliveTimeout) => {
            "keepalive timeout: no pong and nothing read (frozen or gone)".into()
        }
        Err(e) => e.to_string(),
    }
}

/// Why [`Gateway::attach`](super::Gateway::attach) ended other than in
/// good order.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError<E> {
    /// The worker is connected already and the gateway's
    /// [`DuplicatePolicy::Refuse`](super::DuplicatePolicy::Refuse) refused
    /// this connection: it was closed with 1013 (try again later).
    #[error("refused: another connection of this worker is registered (closed with 1013)")]
    Duplicate,
    /// The connection was served and ended abnormally (shown as the
    /// [`DriverError`] is, its `source()` the same).
    #[error(transparent)]
    Driver(DriverError<E>),
}
