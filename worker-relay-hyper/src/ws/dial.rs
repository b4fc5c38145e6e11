//! The worker's dial: the relay's URL checked before anything touches the
//! network, then DNS, TCP, TLS (`wss://`, feature `rustls`) and the
//! upgrade, each with its own cause when it fails.

use super::stream::DialStream;
use super::{config, WsSocket, DIAL_READ_BUFFER, DIAL_TIMEOUT};
use crate::send_lowat::PacedTcp;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;
use worker_relay::connect::{Refused, RetryReason, Verdict, WorkerHandshake};

/// The largest read buffer [`Dialer::read_buffer`] takes: a larger setting
/// is clamped to it (`usize::MAX` failed the buffer's allocation, a panic
/// in the dial).
const MAX_READ_BUFFER: usize = super::MAX_BUFFERED_MESSAGE;

/// `now + after`, or a deadline some 30 years away when that overflows
/// (`Duration::MAX` is "no limit").
pub(crate) fn deadline_after(now: Instant, after: Duration) -> Instant {
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 86_400))
}
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError, SubProtocolError};
use tokio_tungstenite::tungstenite::handshake::client::Request;

/// A dialled connection to a relay.
pub type Dialled = WsSocket<DialStream>;

/// Whether this build can dial `wss://` (feature `rustls`).
pub const TLS_COMPILED: bool = cfg!(feature = "rustls");

/// Where a relay URL points: its scheme, host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `wss://`.
    pub tls: bool,
    /// The host as written, without the brackets of an IPv6 literal.
    pub host: String,
    /// The port, or the scheme's (80, 443).
    pub port: u16,
}

impl Target {
    /// The relay URL's target: a `ws://` or `wss://` URL with a host.
    /// Nothing is looked up.
    pub fn parse(url: &str) -> Result<Target, Refused> {
        target_of(url, true).map(|(_, t)| t)
    }

    /// Whether the host is this machine by its name alone (`localhost`,
    /// a name under `.localhost`, or a loopback address), decided without
    /// any DNS lookup: the only hosts a connect token may go to over plain
    /// `ws://` (the spec: "use wss:// anywhere but a test").
    pub fn is_loopback(&self) -> bool {
        let host = self.host.trim_end_matches('.').to_ascii_lowercase();
        if host == "localhost" || host.ends_with(".localhost") {
            return true;
        }
        host.parse::<IpAddr>().is_ok_and(|ip| match ip {
            IpAddr::V4(v4) => v4.is_loopback(),
            IpAddr::V6(v6) => {
                v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        })
    }
}

/// The upgrade request for `url` and its target; a `wss://` URL is refused
/// when `tls` is false (a build without TLS), before any dial.
fn target_of(url: &str, tls: bool) -> Result<(Request, Target), Refused> {
    let request = url
        .into_client_request()
        .map_err(|e| Refused::InvalidUrl(e.to_string()))?;
    let uri = request.uri();
    let secure = match uri.scheme_str() {
        Some("ws") => false,
        Some("wss") if tls => true,
        Some("wss") => {
            return Err(Refused::InvalidUrl(
                "wss:// needs TLS, and this build has none (the crate's `rustls` feature)".into(),
            ))
        }
        _ => {
            return Err(Refused::InvalidUrl(format!(
                "{url:?} is not a ws:// or wss:// URL"
            )))
        }
    };
    let host = match uri.host() {
        Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']'),
        _ => return Err(Refused::InvalidUrl(format!("{url:?} has no host"))),
    };
    let target = Target {
        tls: secure,
        host: host.to_owned(),
        port: uri.port_u16().unwrap_or(if secure { 443 } else { 80 }),
    };
    Ok((request, target))
}

/// Why a dial failed: the [`Verdict`] (retry or give up) and what failed,
/// in words (the DNS lookup, the TCP connection, the TLS handshake with
/// rustls's reason, the relay's HTTP answer, the time limit).
#[derive(Debug, Clone)]
pub struct DialError {
    verdict: Verdict,
    cause: String,
}

impl DialError {
    fn new(verdict: Verdict, cause: impl Into<String>) -> DialError {
        DialError {
            verdict,
            cause: cause.into(),
        }
    }

    pub(super) fn network(cause: impl Into<String>) -> DialError {
        DialError::new(Verdict::network_error(), cause)
    }

    pub(super) fn refused(why: Refused) -> DialError {
        let cause = why.to_string();
        DialError::new(Verdict::Refused(why), cause)
    }

    /// What the worker does: retry after the backoff, or give up.
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// The verdict alone.
    pub fn into_verdict(self) -> Verdict {
        self.verdict
    }

    /// What failed, in words.
    pub fn cause(&self) -> &str {
        &self.cause
    }
}

impl fmt::Display for DialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.verdict {
            Verdict::Retry(RetryReason::NetworkError) => write!(f, "network error: {}", self.cause),
            _ => f.write_str(&self.cause),
        }
    }
}

impl std::error::Error for DialError {}

impl From<DialError> for Verdict {
    fn from(e: DialError) -> Verdict {
        e.verdict
    }
}

/// The worker's dial, with its settings: the time limit, whether a connect
/// token may go over plain `ws://` to a host that is not loopback (no, by
/// default), and (feature `rustls`) whom it trusts for `wss://`. Cheap to
/// clone.
///
/// The TCP connection is Happy Eyeballs style (RFC 8305): the host's
/// addresses are tried with their families alternating, a new attempt
/// starting every [`ATTEMPT_DELAY`](super::ATTEMPT_DELAY) (250 ms) beside
/// the pending ones, or at once when one fails; the first to connect is
/// kept. An address that never answers (a blackholed AAAA record) delays
/// the dial by 250 ms instead of taking its whole time limit.
#[derive(Clone, Debug)]
pub struct Dialer {
    timeout: Duration,
    read_buffer: usize,
    cleartext_token: bool,
    #[cfg(feature = "rustls")]
    tls: super::tls::ClientTls,
}

impl Default for Dialer {
    fn default() -> Self {
        Dialer::new()
    }
}

impl Dialer {
    /// A dialer with the defaults: [`DIAL_TIMEOUT`] for the whole dial,
    /// reads of up to [`DIAL_READ_BUFFER`] and, for `wss://`, the
    /// platform's trusted roots.
    pub fn new() -> Dialer {
        Dialer {
            timeout: DIAL_TIMEOUT,
            read_buffer: DIAL_READ_BUFFER,
            cleartext_token: false,
            #[cfg(feature = "rustls")]
            tls: super::tls::ClientTls::default(),
        }
    }

    /// How long one dial may take, all steps together. `Duration::MAX`
    /// (or anything too long for the clock) is no limit.
    pub fn timeout(mut self, timeout: Duration) -> Dialer {
        self.timeout = timeout;
        self
    }

    /// The dial's time limit.
    pub fn time_limit(&self) -> Duration {
        self.timeout
    }

    /// The connection's read buffer: allocated when the connection opens
    /// (and written over whole on its first read), and the most one read
    /// takes from the socket. [`DIAL_READ_BUFFER`] by default; a process
    /// that holds many idle connections may want [`READ_BUFFER`](super::READ_BUFFER),
    /// the relay's, at the price of a system call per 4 KiB of body.
    /// At most [`MAX_BUFFERED_MESSAGE`](super::MAX_BUFFERED_MESSAGE) (16 MiB):
    /// a larger setting is clamped to it.
    pub fn read_buffer(mut self, bytes: usize) -> Dialer {
        self.read_buffer = bytes.min(MAX_READ_BUFFER);
        self
    }

    /// Whether the dial may send a connect token over plain `ws://` to a
    /// host that is not loopback (default `false`). The spec says "use
    /// `wss://` anywhere but a test": anyone on the path could read the
    /// token and connect as this worker. By default such a dial is
    /// [`Refused::InvalidUrl`] before any lookup; `true` allows it, for a
    /// network you trust. Loopback hosts ([`Target::is_loopback`]) and dials
    /// without a token are always allowed.
    pub fn allow_cleartext_token(mut self, allow: bool) -> Dialer {
        self.cleartext_token = allow;
        self
    }

    /// What [`Dialer::allow_cleartext_token`] set.
    pub fn allows_cleartext_token(&self) -> bool {
        self.cleartext_token
    }

    /// The checks [`Dialer::dial`] makes before it touches the network, for
    /// a program that wants to refuse a bad setting at start: `url` must be
    /// a `ws://` or `wss://` URL this build can dial, and, when the dial
    /// would carry a connect token (`with_token`), not plain `ws://` to a
    /// host that is not loopback unless
    /// [`allow_cleartext_token`](Dialer::allow_cleartext_token). The error's
    /// verdict is [`Verdict::Refused`].
    pub fn check(&self, url: &str, with_token: bool) -> Result<Target, DialError> {
        let (_, target) = target_of(url, TLS_COMPILED).map_err(DialError::refused)?;
        self.guard(&target, with_token)?;
        Ok(target)
    }

    fn guard(&self, target: &Target, with_token: bool) -> Result<(), DialError> {
        if with_token && !target.tls && !target.is_loopback() && !self.cleartext_token {
            return Err(DialError::refused(Refused::InvalidUrl(format!(
                "refusing to send the connect token in the clear to {}: use wss:// \
                 (the spec: wss:// anywhere but a test), or allow plain ws:// \
                 explicitly for a network you trust",
                target.host
            ))));
        }
        Ok(())
    }

    /// Dials `url` (`ws://host:port/path`, or `wss://` with feature
    /// `rustls`) as a worker: the upgrade request carries `handshake`'s
    /// headers (the bearer token marked sensitive), and the answer is
    /// judged as the spec says. `Ok` is a connection that selected the
    /// protocol's subprotocol. An error's [`DialError::verdict`] is
    /// [`Verdict::Refused`] for a final refusal (a 4xx other than 408/429,
    /// a 101 without the subprotocol, a URL that cannot be dialled or a
    /// token that would go in the clear, both checked before any lookup:
    /// see [`Dialer::check`]), [`Verdict::Retry`] for anything to retry after
    /// the backoff (DNS, TCP, TLS, a 5xx, the time limit).
    pub async fn dial(&self, url: &str, handshake: &WorkerHandshake) -> Result<Dialled, DialError> {
        let (mut request, target) = target_of(url, TLS_COMPILED).map_err(DialError::refused)?;
        self.guard(&target, handshake.token().is_some())?;
        request
            .headers_mut()
            .extend(handshake.request_headers().to_header_map());
        let deadline = deadline_after(Instant::now(), self.timeout);
        let tcp = within(
            deadline,
            self.timeout,
            "resolving the host and connecting",
            super::happy::connect(&target),
        )
        .await?;
        let stream = if target.tls {
            self.secure(&target, tcp, deadline).await?
        } else {
            DialStream::Plain(PacedTcp::new(tcp))
        };
        let upgrade = tokio_tungstenite::client_async_with_config(
            request,
            stream,
            Some(config().read_buffer_size(self.read_buffer)),
        );
        let answer = within(
            deadline,
            self.timeout,
            "waiting for the upgrade answer",
            async { Ok(upgrade.await) },
        )
        .await?;
        match answer {
            Ok((ws, response)) => match Verdict::from_http_response(&response) {
                Verdict::Connected => Ok(WsSocket(ws)),
                other => Err(judged(other, response.status())),
            },
            Err(WsError::Http(response)) => Err(judged(
                Verdict::from_http_response(&response),
                response.status(),
            )),
            Err(WsError::Protocol(ProtocolError::SecWebSocketSubProtocolError(e))) => {
                Err(DialError::refused(match e {
                    SubProtocolError::NoSubProtocol => Refused::NoSubprotocol,
                    other => Refused::WrongSubprotocol(other.to_string()),
                }))
            }
            Err(WsError::Url(e)) => Err(DialError::refused(Refused::InvalidUrl(e.to_string()))),
            Err(e) => Err(DialError::network(format!("the upgrade failed: {e}"))),
        }
    }

    #[cfg(feature = "rustls")]
    async fn secure(
        &self,
        target: &Target,
        tcp: TcpStream,
        deadline: Instant,
    ) -> Result<DialStream, DialError> {
        let handshake = self.tls.connect(&target.host, PacedTcp::new(tcp));
        within(deadline, self.timeout, "the TLS handshake", handshake)
            .await
            .map(|tls| DialStream::Tls(Box::new(tls)))
    }

    #[cfg(not(feature = "rustls"))]
    async fn secure(
        &self,
        _target: &Target,
        _tcp: TcpStream,
        _deadline: Instant,
    ) -> Result<DialStream, DialError> {
        unreachable!("target_of refuses wss:// in a build without TLS")
    }
}

#[cfg(feature = "rustls")]
impl Dialer {
    /// Trusts the certificates of `pem` (a PEM bundle, such as a private
    /// CA's certificate) for `wss://`, besides the platform's roots.
    pub fn ca_pem(mut self, pem: &[u8]) -> Result<Dialer, super::TlsError> {
        self.tls = self.tls.with_extra_roots(pem)?;
        Ok(self)
    }

    /// Uses this rustls configuration for `wss://` as it is (its roots,
    /// its provider; its ALPN is set to `http/1.1`).
    pub fn tls_config(mut self, config: std::sync::Arc<rustls::ClientConfig>) -> Dialer {
        self.tls = super::tls::ClientTls::from_config(config);
        self
    }
}

/// A verdict on the relay's HTTP answer, its cause the status and what it
/// means.
fn judged(verdict: Verdict, status: http::StatusCode) -> DialError {
    let cause = format!(
        "the relay answered HTTP {} {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    DialError::new(verdict, cause.trim_end().to_owned())
}

/// Runs one step of the dial within the dial's deadline.
async fn within<T>(
    deadline: Instant,
    limit: Duration,
    step: &str,
    f: impl Future<Output = Result<T, DialError>>,
) -> Result<T, DialError> {
    match tokio::time::timeout_at(deadline, f).await {
        Ok(r) => r,
        Err(_) => Err(DialError::network(format!(
            "no answer within {:.1} s ({step})",
            limit.as_secs_f64()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wss_without_tls_is_refused_for_good_before_any_dial() {
        match target_of("wss://relay.invalid/connect", false) {
            Err(Refused::InvalidUrl(why)) => assert!(why.contains("rustls"), "{why}"),
            other => panic!("{other:?}"),
        }
        let (_, t) = target_of("wss://relay.invalid/connect", true).unwrap();
        assert_eq!(
            t,
            Target {
                tls: true,
                host: "relay.invalid".into(),
                port: 443
            }
        );
    }

    #[test]
    fn targets_and_loopback() {
        let cases = [
            ("ws://127.0.0.1:8080/connect", true, 8080),
            ("ws://localhost/connect", true, 80),
            ("ws://LOCALHOST./connect", true, 80),
            ("ws://a.localhost:1/connect", true, 1),
            ("ws://[::1]:9/connect", true, 9),
            ("ws://[::ffff:127.0.0.1]:9/connect", true, 9),
            ("ws://127.8.9.10/connect", true, 80),
            ("ws://relay.invalid/connect", false, 80),
            ("ws://localhost.relay.invalid/connect", false, 80),
            ("ws://10.0.0.1/connect", false, 80),
            ("ws://[::2]/connect", false, 80),
        ];
        for (url, loopback, port) in cases {
            let t = Target::parse(url).unwrap();
            assert_eq!(t.is_loopback(), loopback, "{url}");
            assert_eq!(t.port, port, "{url}");
            assert!(!t.tls);
        }
        for bad in [
            "http://localhost/connect",
            "ws:///connect",
            "localhost:80",
            "",
        ] {
            assert!(
                matches!(Target::parse(bad), Err(Refused::InvalidUrl(_))),
                "{bad}"
            );
        }
    }
}
