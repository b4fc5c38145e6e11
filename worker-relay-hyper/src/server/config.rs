//! The limits of [`serve`](super::serve), and the signal a graceful stop
//! gives when no new request can come on a connection the server took.

use std::sync::Arc;
use std::time::Duration;

/// How often an HTTP/2 connection is pinged, and how long its answer may
/// take before the connection is closed.
pub const H2_KEEPALIVE: Duration = Duration::from_secs(20);

/// The longest any timeout of [`ServerConfig`] is taken to be: a year
/// (longer ones, up to `Duration::MAX`, mean "never" and are cut to this,
/// so no deadline overflows).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The most connections [`ServerConfig::max_connections`] can allow
/// (`u32::MAX`; more is taken as this).
pub const MAX_CONNECTIONS: usize = u32::MAX as usize;

/// The limits of [`serve`](super::serve).
///
/// No value panics: a cap of 0 is taken as 1, and one above
/// [`MAX_CONNECTIONS`] as that; a timeout longer than [`MAX_TIMEOUT`] as
/// that.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Connections open at once (HTTP connections; an upgraded worker
    /// connection leaves the count). Default 10,000: keep it below the
    /// process's file limit (`ulimit -n`).
    pub max_connections: usize,
    /// How long a client has to send a complete request head, from the
    /// moment the server waits for one (a new connection, or a keep-alive
    /// connection between requests). Default 10 s.
    pub header_read_timeout: Duration,
    /// How long a write may make no progress before the connection is
    /// closed. Default 60 s.
    pub send_timeout: Duration,
    /// How long an HTTP/2 connection may have no stream open before it is
    /// closed (GOAWAY), as nginx's `keepalive_timeout` (formerly
    /// `http2_idle_timeout`) does; its pings do not count. Default 75 s.
    pub h2_idle_timeout: Duration,
    /// During a graceful stop, how long the server goes on accepting while
    /// a connection it accepted has not brought its first request, and how
    /// long it then waits for the requests of the connections still queued
    /// (see [`serve_with_shutdown`](super::serve_with_shutdown)). Default
    /// 2 s; `Duration::ZERO` stops accepting at once (a connection
    /// accepted just before the stop is then dropped).
    pub arrival_wait: Duration,
    /// Told when a graceful stop has closed its intake ([`Intake`]).
    /// Default none.
    pub intake: Option<Intake>,
    /// TLS on every connection (feature `rustls`). Default none: plain
    /// TCP.
    #[cfg(feature = "rustls")]
    pub tls: Option<super::ServerTls>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            max_connections: 10_000,
            header_read_timeout: Duration::from_secs(10),
            send_timeout: Duration::from_secs(60),
            h2_idle_timeout: Duration::from_secs(75),
            arrival_wait: Duration::from_secs(2),
            intake: None,
            #[cfg(feature = "rustls")]
            tls: None,
        }
    }
}

impl ServerConfig {
    /// These settings with a different connection cap (at least 1, at
    /// most [`MAX_CONNECTIONS`]).
    pub fn max_connections(mut self, n: usize) -> ServerConfig {
        self.max_connections = n.clamp(1, MAX_CONNECTIONS);
        self
    }

    /// These settings with a different header-read timeout.
    pub fn header_read_timeout(mut self, t: Duration) -> ServerConfig {
        self.header_read_timeout = t;
        self
    }

    /// These settings with a different send timeout.
    pub fn send_timeout(mut self, t: Duration) -> ServerConfig {
        self.send_timeout = t;
        self
    }

    /// These settings with a different HTTP/2 idle timeout.
    pub fn h2_idle_timeout(mut self, t: Duration) -> ServerConfig {
        self.h2_idle_timeout = t;
        self
    }

    /// These settings with a different arrival wait.
    pub fn arrival_wait(mut self, t: Duration) -> ServerConfig {
        self.arrival_wait = t;
        self
    }

    /// These settings, telling `intake` when a graceful stop has closed
    /// its intake.
    pub fn intake(mut self, intake: Intake) -> ServerConfig {
        self.intake = Some(intake);
        self
    }

    /// These settings with TLS on every connection.
    #[cfg(feature = "rustls")]
    pub fn tls(mut self, tls: super::ServerTls) -> ServerConfig {
        self.tls = Some(tls);
        self
    }

    /// The connection cap as used: within 1..=[`MAX_CONNECTIONS`].
    pub(super) fn cap(&self) -> usize {
        self.max_connections
            .clamp(1, MAX_CONNECTIONS.min(tokio::sync::Semaphore::MAX_PERMITS))
    }
}

/// `t`, at most [`MAX_TIMEOUT`].
pub(super) fn saturate(t: Duration) -> Duration {
    t.min(MAX_TIMEOUT)
}

/// The moment a graceful stop of
/// [`serve_with_shutdown`](super::serve_with_shutdown) has closed its
/// intake: it accepts no connection any more, and every connection it took
/// has brought its first request to the service (or ended, or used up the
/// [arrival wait](ServerConfig::arrival_wait)). From then on a new request
/// can only come on a connection that had already sent one (and HTTP/1.1
/// ones are closed after the request they are serving): the moment to
/// start [`Gateway::drain`](crate::gateway::Gateway::drain), which answers
/// later requests 503.
///
/// Cheap to clone; give a clone to [`ServerConfig::intake`].
#[derive(Clone, Debug, Default)]
pub struct Intake(Arc<tokio::sync::watch::Sender<bool>>);

impl Intake {
    /// A signal not yet given.
    pub fn new() -> Intake {
        Intake::default()
    }

    /// Resolves once the intake is closed (at once if it is already);
    /// never if the server's future is dropped before its stop ends
    /// ([`serve`](super::serve) has none).
    pub async fn closed(&self) {
        let mut closed = self.0.subscribe();
        // The sender lives in `self`: this cannot fail.
        let _ = closed.wait_for(|c| *c).await;
    }

    /// Whether the intake is closed.
    pub fn is_closed(&self) -> bool {
        *self.0.borrow()
    }

    pub(super) fn close(&self) {
        self.0.send_replace(true);
    }
}
