//! The WebSocket handshake: the worker's request headers and its verdict on
//! the relay's answer; the relay's decision on an upgrade request.

use super::token::{Token, TokenTable, MAX_PRESENTED_TOKEN, REDACTED};
use super::WorkerId;
use crate::frame::SUBPROTOCOL;
use std::fmt;

/// The header that offers (request) and selects (response) the subprotocol.
pub const SEC_WEBSOCKET_PROTOCOL: &str = "Sec-WebSocket-Protocol";
/// The header that carries the worker's bearer token.
pub const AUTHORIZATION: &str = "Authorization";
/// The header a relay's 401 carries: `WWW-Authenticate: Bearer` (RFC 6750).
pub const WWW_AUTHENTICATE: &str = "WWW-Authenticate";

// ---------------------------------------------------------------- worker side

/// The worker's side of the handshake: what it sends, and (with
/// [`Verdict`]) what it makes of the answer.
///
/// `Debug` never shows the token.
#[derive(Debug, Clone, Default)]
pub struct WorkerHandshake {
    token: Option<Token>,
}

impl WorkerHandshake {
    /// A handshake that presents `token` (the worker's
    /// `STRATA_WORKER_CONNECT_TOKEN`), or no `Authorization` header at all if
    /// `None`.
    pub fn new(token: Option<Token>) -> WorkerHandshake {
        WorkerHandshake { token }
    }

    /// The token presented, if any.
    pub fn token(&self) -> Option<&Token> {
        self.token.as_ref()
    }

    /// The headers to add to the WebSocket upgrade request:
    /// `Authorization: Bearer <token>` when a token is set, and
    /// `Sec-WebSocket-Protocol: strata-worker-connect.v1`.
    ///
    /// The WebSocket library adds the rest (`Upgrade`, `Connection`,
    /// `Sec-WebSocket-Key`, `Sec-WebSocket-Version`). If it has its own
    /// subprotocol option, that is the same header: set one or the other.
    pub fn request_headers(&self) -> RequestHeaders {
        RequestHeaders {
            authorization: self
                .token
                .as_ref()
                .map(|t| format!("Bearer {}", t.expose_secret())),
        }
    }
}

/// The headers the worker adds to its upgrade request
/// (see [`WorkerHandshake::request_headers`]).
///
/// `Debug` shows the `Authorization` value as `Bearer <redacted>`.
#[derive(Clone)]
pub struct RequestHeaders {
    authorization: Option<String>,
}

impl RequestHeaders {
    /// The `(name, value)` pairs in order: `Authorization` (if a token is
    /// set), then `Sec-WebSocket-Protocol`.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.authorization
            .as_deref()
            .map(|v| (AUTHORIZATION, v))
            .into_iter()
            .chain(std::iter::once((SEC_WEBSOCKET_PROTOCOL, SUBPROTOCOL)))
    }

    /// Number of headers (1 or 2).
    pub fn len(&self) -> usize {
        1 + usize::from(self.authorization.is_some())
    }

    /// Always `false`: the subprotocol header is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the value of header `name` is a secret that must not be
    /// logged (`Authorization`). HTTP libraries have a flag for that, such
    /// as `http::HeaderValue::set_sensitive`.
    pub fn is_sensitive(name: &str) -> bool {
        name.eq_ignore_ascii_case(AUTHORIZATION)
    }
}

impl fmt::Debug for RequestHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = format!("Bearer {REDACTED}");
        let mut m = f.debug_map();
        if self.authorization.is_some() {
            m.entry(&AUTHORIZATION, &redacted);
        }
        m.entry(&SEC_WEBSOCKET_PROTOCOL, &SUBPROTOCOL).finish()
    }
}

/// What the worker makes of one connection attempt.
///
/// ```text
/// 101 + Sec-WebSocket-Protocol: strata-worker-connect.v1  → Connected
/// 101 with no subprotocol, or another                     → Refused (final)
/// 4xx except 408 and 429                                  → Refused (final: exit 1)
/// 408, 429, 5xx, any other status                         → Retry
/// network error, connection closed after connecting       → Retry
/// ```
///
/// On [`Verdict::Connected`], reset the backoff
/// ([`Backoff::reset`](super::Backoff::reset)); on [`Verdict::Retry`] wait
/// [`Backoff::next_wait`](super::Backoff::next_wait) and dial again; on
/// [`Verdict::Refused`] log it and exit with status 1, since the relay would
/// refuse the same token again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The relay accepted the worker and speaks this protocol version.
    Connected,
    /// Reconnect after a backoff.
    Retry(RetryReason),
    /// Give up: reconnecting would be refused the same way.
    Refused(Refused),
}

/// Why the worker reconnects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryReason {
    /// The relay answered with a status that is not final (408, 429, 5xx,
    /// or anything else that is neither 101 nor a 4xx).
    Status(u16),
    /// The connection could not be made (DNS, TCP, TLS, a timeout, a
    /// malformed handshake response).
    NetworkError,
    /// The connection closed after the handshake had succeeded.
    Closed,
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryReason::Status(s) => write!(f, "the relay answered HTTP {s}"),
            RetryReason::NetworkError => f.write_str("network error"),
            RetryReason::Closed => f.write_str("the relay closed the connection"),
        }
    }
}

/// Why the worker gives up for good (it exits with status 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    /// The relay answered a 4xx other than 408 and 429: the same token would
    /// be refused again.
    #[error("the relay refused the worker with HTTP {0}")]
    Status(u16),
    /// The relay accepted the upgrade without selecting a subprotocol.
    #[error("the relay did not select the strata-worker-connect.v1 subprotocol")]
    NoSubprotocol,
    /// The relay selected another subprotocol (or several); the value is what
    /// it sent.
    #[error("the relay selected subprotocol {0:?}, not strata-worker-connect.v1")]
    WrongSubprotocol(String),
    /// The relay's URL cannot be dialled (not a `ws://` or `wss://` URL, no
    /// host, a scheme this build has no TLS for, or plain `ws://` to a host
    /// that is not loopback with a connect token: see
    /// `worker_relay_hyper::ws::Dialer::allow_cleartext_token`); the value says why.
    #[error("cannot dial the relay's URL: {0}")]
    InvalidUrl(String),
}

impl Verdict {
    /// The verdict on the relay's handshake response: its status and headers
    /// (`(name, value)` pairs, names compared case-insensitively).
    ///
    /// On 101, the response must select exactly [`SUBPROTOCOL`]: all its
    /// `Sec-WebSocket-Protocol` values, split at commas and trimmed, must be
    /// that one name and nothing else.
    pub fn from_response<I, N, V>(status: u16, headers: I) -> Verdict
    where
        I: IntoIterator<Item = (N, V)>,
        N: AsRef<str>,
        V: AsRef<str>,
    {
        if status != 101 {
            return Verdict::from_status(status);
        }
        let mut selected = Vec::new();
        for (name, value) in headers {
            if name.as_ref().eq_ignore_ascii_case(SEC_WEBSOCKET_PROTOCOL) {
                selected.extend(list_items(value.as_ref()).map(str::to_owned));
            }
        }
        match selected.as_slice() {
            [] => Verdict::Refused(Refused::NoSubprotocol),
            [one] if one == SUBPROTOCOL => Verdict::Connected,
            _ => Verdict::Refused(Refused::WrongSubprotocol(selected.join(", "))),
        }
    }

    /// The verdict on a status other than 101 (for WebSocket libraries that
    /// report a refused handshake as an error carrying the status). A 101
    /// here is judged as a 101 with no subprotocol selected.
    pub fn from_status(status: u16) -> Verdict {
        match status {
            101 => Verdict::Refused(Refused::NoSubprotocol),
            408 | 429 => Verdict::Retry(RetryReason::Status(status)),
            400..=499 => Verdict::Refused(Refused::Status(status)),
            _ => Verdict::Retry(RetryReason::Status(status)),
        }
    }

    /// The verdict on a connection that could not be made: retry.
    pub fn network_error() -> Verdict {
        Verdict::Retry(RetryReason::NetworkError)
    }

    /// The verdict on a connection that closed after connecting: retry.
    pub fn closed() -> Verdict {
        Verdict::Retry(RetryReason::Closed)
    }

    /// Whether the worker gives up (exits with status 1).
    pub fn is_final(&self) -> bool {
        matches!(self, Verdict::Refused(_))
    }
}

/// Items of a comma-separated header list, trimmed of spaces and tabs, empty
/// items skipped (RFC 9110 §5.6.1).
fn list_items(value: &str) -> impl Iterator<Item = &str> {
    value
        .split(',')
        .map(|s| s.trim_matches([' ', '\t']))
        .filter(|s| !s.is_empty())
}

// ----------------------------------------------------------------- relay side

/// The relay accepts the worker: answer 101 with
/// [`Accepted::response_headers`] and serve the socket as [`Accepted::worker`].
///
/// `Debug` shows the worker, never the token that identified it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    worker: WorkerId,
}

impl Accepted {
    /// Which worker this socket is.
    pub fn worker(&self) -> &WorkerId {
        &self.worker
    }

    /// The worker, consuming the decision.
    pub fn into_worker(self) -> WorkerId {
        self.worker
    }

    /// The status to answer: 101.
    pub fn status(&self) -> u16 {
        101
    }

    /// The subprotocol to select: [`SUBPROTOCOL`].
    pub fn subprotocol(&self) -> &'static str {
        SUBPROTOCOL
    }

    /// The header the 101 must carry on top of the WebSocket library's own:
    /// `Sec-WebSocket-Protocol: strata-worker-connect.v1`.
    pub fn response_headers(&self) -> [(&'static str, &'static str); 1] {
        [(SEC_WEBSOCKET_PROTOCOL, SUBPROTOCOL)]
    }
}

/// The relay refuses the worker: answer [`Rejected::status`] (400 or 401)
/// with [`Rejected::response_headers`] instead of 101.
///
/// The message never includes the presented token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejected {
    /// The request does not offer `strata-worker-connect.v1`: 400.
    #[error("the worker did not offer the strata-worker-connect.v1 subprotocol")]
    SubprotocolNotOffered,
    /// The request has no `Authorization` header: 401.
    #[error("the worker presented no token")]
    MissingToken,
    /// `Authorization` is not `Bearer <token>`, or appears more than once: 401.
    #[error("the Authorization header is not a single bearer token")]
    MalformedAuthorization,
    /// The bearer token belongs to no worker: 401.
    #[error("the worker presented an unknown token")]
    UnknownToken,
    /// The bearer token is longer than
    /// [`MAX_PRESENTED_TOKEN`](super::MAX_PRESENTED_TOKEN) bytes: 401,
    /// refused before any lookup (no table holds such a token).
    #[error("the worker presented a token longer than {MAX_PRESENTED_TOKEN} bytes")]
    TokenTooLong,
}

impl Rejected {
    /// The HTTP status to answer with: 400 when the subprotocol is not
    /// offered, 401 for a missing, malformed, too long or unknown token.
    pub fn status(&self) -> u16 {
        match self {
            Rejected::SubprotocolNotOffered => 400,
            Rejected::MissingToken
            | Rejected::MalformedAuthorization
            | Rejected::UnknownToken
            | Rejected::TokenTooLong => 401,
        }
    }

    /// Headers for the refusal: `WWW-Authenticate: Bearer` on a 401
    /// (RFC 6750), none on a 400.
    pub fn response_headers(&self) -> &'static [(&'static str, &'static str)] {
        match self.status() {
            401 => &[(WWW_AUTHENTICATE, "Bearer")],
            _ => &[],
        }
    }
}

/// The relay's decision on a worker's WebSocket upgrade request, from its
/// headers (`(name, value)` pairs, names compared case-insensitively):
///
/// 1. `strata-worker-connect.v1` must be among the offered subprotocols (all
///    `Sec-WebSocket-Protocol` headers, each a comma-separated list), else
///    [`Rejected::SubprotocolNotOffered`] (400);
/// 2. there must be exactly one `Authorization` header, `Bearer <token>`
///    with the scheme in any case, else [`Rejected::MissingToken`] or
///    [`Rejected::MalformedAuthorization`] (401);
/// 3. the token must be at most
///    [`MAX_PRESENTED_TOKEN`](super::MAX_PRESENTED_TOKEN) bytes long, else
///    [`Rejected::TokenTooLong`] (401), decided from its length alone
///    before it is read any further: a stranger's 60 KiB header costs no
///    more than a short one;
/// 4. the token must be in `table` ([`TokenTable::lookup`]: O(1) in the
///    table's size, its timing telling nothing about any token), else
///    [`Rejected::UnknownToken`] (401).
///
/// Then the worker is [`Accepted`]: answer 101 selecting the subprotocol.
/// The rest of the upgrade (`Upgrade`, `Sec-WebSocket-Key`, the version) is
/// the WebSocket library's to check.
pub fn decide_upgrade<I, N, V>(table: &TokenTable, headers: I) -> Result<Accepted, Rejected>
where
    I: IntoIterator<Item = (N, V)>,
    N: AsRef<str>,
    V: AsRef<str>,
{
    let mut offered = false;
    let mut authorization: Option<V> = None;
    let mut repeated = false;
    for (name, value) in headers {
        let name = name.as_ref();
        if name.eq_ignore_ascii_case(SEC_WEBSOCKET_PROTOCOL) {
            offered |= list_items(value.as_ref()).any(|p| p == SUBPROTOCOL);
        } else if name.eq_ignore_ascii_case(AUTHORIZATION) {
            repeated |= authorization.is_some();
            authorization = Some(value);
        }
    }
    if !offered {
        return Err(Rejected::SubprotocolNotOffered);
    }
    let authorization = authorization.ok_or(Rejected::MissingToken)?;
    if repeated {
        return Err(Rejected::MalformedAuthorization);
    }
    let token = bearer_token(authorization.as_ref())?;
    let worker = table.lookup(token).ok_or(Rejected::UnknownToken)?;
    Ok(Accepted {
        worker: worker.clone(),
    })
}

/// The token of an `Authorization: Bearer <token>` value: the scheme is
/// case-insensitive, followed by one or more spaces and a token without
/// whitespace; surrounding whitespace is ignored. A token longer than
/// [`MAX_PRESENTED_TOKEN`] is refused before it is scanned for whitespace.
/// [`decide_upgrade`] reads the token with it; a relay whose own hook
/// authorizes a worker from the `Authorization` header does too.
pub fn bearer_token(value: &str) -> Result<&str, Rejected> {
    let value = value.trim_matches([' ', '\t']);
    let (scheme, rest) = value
        .split_once(' ')
        .ok_or(Rejected::MalformedAuthorization)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Rejected::MalformedAuthorization);
    }
    let token = rest.trim_start_matches(' ');
    if token.len() > MAX_PRESENTED_TOKEN {
        return Err(Rejected::TokenTooLong);
    }
    if token.is_empty() || token.contains([' ', '\t']) {
        return Err(Rejected::MalformedAuthorization);
    }
    Ok(token)
}

#[cfg(test)]
#[path = "handshake_tests.rs"]
mod tests;
