//! The worker's whole life: dial, serve, reconnect.

use super::events::{self, Observer, TunnelEvent};
use super::TunnelBody;
use crate::ws;
use crate::BoxError;
use http::{Request, Response};
use http_body::Body;
use std::time::Duration;
use worker_relay::connect::{Backoff, BackoffConfig, Refused, Token, Verdict, WorkerHandshake};
use worker_relay::proto::WorkerConfig;
use worker_relay::rt::{Closed, DriverError};

/// A source of numbers uniform in `[0, 1)` for the backoff's jitter.
pub type Jitter = Box<dyn FnMut() -> f64 + Send>;

/// A worker: dials its relay, serves a service over the connection, and
/// reconnects after the spec's backoff (1 s doubling to 60 s, a random wait
/// in `[delay/2, delay]`, back to 1 s after a handshake succeeds) until the
/// relay refuses it for good.
///
/// A dial that fails (an untrusted CA, a closed port, a name that does not
/// resolve, a 5xx) is retried after the backoff, without end: the tunnel
/// logs why through `tracing` (at `warn`), which a program that installed
/// no subscriber never sees. Such a program watches the tunnel with
/// [`Tunnel::on_event`]: each dial failure, connection, disconnection and
/// wait reaches its callback as a [`TunnelEvent`].
///
/// A connect token goes over plain `ws://` only to a loopback host: to
/// any other, the first dial is a final refusal
/// ([`Refused::InvalidUrl`]) unless the dialer allows it
/// ([`ws::Dialer::allow_cleartext_token`], or
/// [`Tunnel::allow_cleartext_token`]).
pub struct Tunnel {
    url: String,
    handshake: WorkerHandshake,
    config: WorkerConfig,
    backoff: BackoffConfig,
    dialer: ws::Dialer,
    jitter: Jitter,
    observer: Option<Observer>,
}

impl Tunnel {
    /// A worker for the relay at `url` (`ws://host:port/connect`), with the
    /// connect token to present (none: no `Authorization` header).
    pub fn new(url: impl Into<String>, token: Option<Token>) -> Tunnel {
        Tunnel {
            url: url.into(),
            handshake: WorkerHandshake::new(token),
            config: WorkerConfig::default(),
            backoff: BackoffConfig::default(),
            dialer: ws::Dialer::new(),
            jitter: Box::new(random_unit),
            observer: None,
        }
    }

    /// The connection's settings.
    pub fn config(mut self, config: WorkerConfig) -> Tunnel {
        self.config = config;
        self
    }

    /// The reconnect backoff's settings.
    pub fn backoff(mut self, backoff: BackoffConfig) -> Tunnel {
        self.backoff = backoff;
        self
    }

    /// How long one dial may take (default [`ws::DIAL_TIMEOUT`];
    /// `Duration::MAX` is no limit).
    pub fn dial_timeout(mut self, timeout: Duration) -> Tunnel {
        self.dialer = self.dialer.timeout(timeout);
        self
    }

    /// How the relay is dialled: its time limit and, for `wss://`, whom it
    /// trusts (default [`ws::Dialer::new`]: the platform's roots).
    pub fn dialer(mut self, dialer: ws::Dialer) -> Tunnel {
        self.dialer = dialer;
        self
    }

    /// Whether the connect token may go over plain `ws://` to a host that
    /// is not loopback (default `false`: such a tunnel's first dial is a
    /// final refusal, before any lookup). See
    /// [`ws::Dialer::allow_cleartext_token`].
    pub fn allow_cleartext_token(mut self, allow: bool) -> Tunnel {
        self.dialer = self.dialer.allow_cleartext_token(allow);
        self
    }

    /// Calls `observer` with each [`TunnelEvent`]: a dial that failed (and
    /// why), a connection made or ended, the wait before the next dial. It
    /// runs on the tunnel's task, between dials: keep it short (send the
    /// event to a channel, set a status).
    pub fn on_event(mut self, observer: impl FnMut(TunnelEvent) + Send + 'static) -> Tunnel {
        self.observer = Some(Box::new(observer));
        self
    }

    fn tell(&mut self, event: TunnelEvent) {
        if let Some(observer) = self.observer.as_mut() {
            observer(event);
        }
    }

    /// The randomness of the backoff's jitter (default: drawn from the
    /// standard library's per-process hash keys and the clock). Give a
    /// seeded source to make the waits reproducible.
    pub fn jitter(mut self, jitter: impl FnMut() -> f64 + Send + 'static) -> Tunnel {
        self.jitter = Box::new(jitter);
        self
    }

    /// Serves `service` through the relay, reconnecting as needed. Returns
    /// only when the relay refuses the worker for good (the spec's "exit
    /// with status 1"). Needs a tokio runtime.
    pub async fn run<Svc, B>(self, service: Svc) -> Refused
    where
        Svc: tower::Service<Request<TunnelBody>, Response = Response<B>> + Clone + Send + 'static,
        Svc::Future: Send + 'static,
        Svc::Error: Into<BoxError>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        match self
            .run_until(service, std::future::pending(), Duration::ZERO)
            .await
        {
            TunnelEnd::Refused(why) => why,
            TunnelEnd::Stopped => unreachable!("a pending shutdown never comes"),
        }
    }

    /// [`Tunnel::run`] until `shutdown` resolves, then a drain (see
    /// [`serve_until`](super::serve_until)): new requests answered 503 with
    /// `Retry-After: 1`, those in flight finish within `grace`, the
    /// connection closed with 1001; no reconnect after it.
    pub async fn run_until<Svc, B, F>(
        mut self,
        service: Svc,
        shutdown: F,
        grace: Duration,
    ) -> TunnelEnd
    where
        Svc: tower::Service<Request<TunnelBody>, Response = Response<B>> + Clone + Send + 'static,
        Svc::Future: Send + 'static,
        Svc::Error: Into<BoxError>,
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
        F: std::future::Future<Output = ()>,
    {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut backoff = Backoff::new(self.backoff);
        #[cfg(feature = "metrics")]
        crate::observe::describe(false);
        crate::observe::worker::connected(false);
        loop {
            let dialled = tokio::select! {
                d = self.dialer.dial(&self.url, &self.handshake) => d,
                () = shutdown.as_mut() => return TunnelEnd::Stopped,
            };
            let verdict = match dialled {
                Ok(socket) => {
                    tracing::info!("connected to {}", self.url);
                    self.tell(TunnelEvent::Connected);
                    crate::observe::worker::connect("connected");
                    crate::observe::worker::connected(true);
                    backoff.reset();
                    let (result, stopped) = super::serve_until(
                        socket,
                        self.config.clone(),
                        service.clone(),
                        shutdown.as_mut(),
                        grace,
                    )
                    .await;
                    crate::observe::worker::connected(false);
                    log_end(&result);
                    self.tell(TunnelEvent::Disconnected(events::ended(&result)));
                    if stopped {
                        return TunnelEnd::Stopped;
                    }
                    if replaced(&result) {
                        tracing::warn!(
                            "another connection with this worker's token took over (a new \
                             process, or two given one token); waiting the longest backoff"
                        );
                        backoff.to_max();
                    }
                    Verdict::closed()
                }
                Err(e) => {
                    crate::observe::worker::connect(if e.verdict().is_final() {
                        "refused"
                    } else {
                        "failed"
                    });
                    if !e.verdict().is_final() {
                        tracing::warn!("dialling {}: {e}", self.url);
                    }
                    self.tell(TunnelEvent::DialFailed(e.clone()));
                    e.into_verdict()
                }
            };
            let wait = match verdict {
                Verdict::Refused(why) => {
                    tracing::error!("the relay refused the worker: {why}; giving up");
                    return TunnelEnd::Refused(why);
                }
                Verdict::Retry(reason) => {
                    let wait = backoff.next_wait((self.jitter)());
                    tracing::info!("{reason}; reconnecting in {:.1} s", wait.as_secs_f64());
                    wait
                }
                other => {
                    // A verdict this version does not know: retry.
                    let wait = backoff.next_wait((self.jitter)());
                    tracing::info!("{other:?}; reconnecting in {:.1} s", wait.as_secs_f64());
                    wait
                }
            };
            self.tell(TunnelEvent::Reconnecting(wait));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.as_mut() => return TunnelEnd::Stopped,
            }
        }
    }
}

/// How [`Tunnel::run_until`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TunnelEnd {
    /// The relay refused the worker for good.
    Refused(Refused),
    /// The shutdown came, and the connection was drained.
    Stopped,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel")
            .field("url", &self.url)
            .field("handshake", &self.handshake)
            .finish_non_exhaustive()
    }
}

/// Whether the relay closed the connection because a newer one of this
/// worker replaced it: [`CloseCode::REPLACED`](worker_relay::frame::CloseCode::REPLACED),
/// or (relays before it, for one release) 1008 with the reason
/// [`REPLACED`](worker_relay::connect::REPLACED).
fn replaced(result: &Result<Closed, DriverError<ws::Error>>) -> bool {
    use worker_relay::frame::CloseCode;
    matches!(result, Ok(Closed::ByPeer(Some(f)))
        if f.code == CloseCode::REPLACED
            || (f.code == CloseCode::POLICY_VIOLATION && f.reason == worker_relay::connect::REPLACED))
}

fn log_end(result: &Result<Closed, DriverError<ws::Error>>) {
    match result {
        Ok(Closed::ByPeer(Some(f))) => tracing::info!(
            "the relay closed the connection (code {}{}{})",
            f.code.0,
            if f.reason.is_empty() { "" } else { ": " },
            f.reason
        ),
        Ok(Closed::ByPeer(None)) => tracing::info!("the relay closed the connection"),
        Ok(other) => tracing::info!("connection ended: {other}"),
        Err(DriverError::KeepaliveTimeout) => tracing::warn!(
            "keepalive timeout: the relay answered no ping and read nothing \
             (frozen or unreachable); dropped the connection"
        ),
        Err(e) => tracing::warn!("lost the relay: {e}"),
    }
}

/// A number in `[0, 1)` from the standard library's per-process random
/// hash keys and the clock: enough to spread reconnects, not a CSPRNG.
fn random_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use worker_relay::frame::{CloseCode, CloseFrame};

    fn by_peer(code: u16, reason: &str) -> Result<Closed, DriverError<ws::Error>> {
        Ok(Closed::ByPeer(Some(CloseFrame {
            code: CloseCode(code),
            reason: reason.into(),
        })))
    }

    /// 4000 says "replaced" whatever the reason; 1008 only with the
    /// reason (relays of earlier versions), not "token revoked".
    #[test]
    fn a_replaced_close_is_4000_or_the_old_1008_with_its_reason() {
        assert!(replaced(&by_peer(4000, worker_relay::connect::REPLACED)));
        assert!(replaced(&by_peer(4000, "")));
        assert!(replaced(&by_peer(1008, worker_relay::connect::REPLACED)));
        assert!(!replaced(&by_peer(1008, "token revoked")));
        assert!(!replaced(&by_peer(1001, worker_relay::connect::REPLACED)));
        assert!(!replaced(&Ok(Closed::ByPeer(None))));
    }
}
