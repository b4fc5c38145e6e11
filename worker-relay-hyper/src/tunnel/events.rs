//! What a [`Tunnel`](super::Tunnel) does, told to the program: dial
//! failures reach it without a `tracing` subscriber.

use crate::ws;
use std::time::Duration;
use worker_relay::rt::{Closed, DriverError};

/// One thing a [`Tunnel`](super::Tunnel) did, given to the callback of
/// [`Tunnel::on_event`](super::Tunnel::on_event). The tunnel also logs
/// each through `tracing`, which a program without a subscriber never
/// sees: this is how such a program learns that its worker cannot dial
/// (an untrusted CA, a closed port, a name that does not resolve) while
/// the tunnel retries.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TunnelEvent {
    /// The dial succeeded: the worker is connected and serving.
    Connected,
    /// A dial failed. [`DialError::cause`](ws::DialError::cause) says what
    /// (the DNS lookup, the TCP connection, the TLS handshake with rustls's
    /// reason, the relay's HTTP answer, the time limit);
    /// [`DialError::verdict`](ws::DialError::verdict) whether the tunnel
    /// retries (a [`Reconnecting`](TunnelEvent::Reconnecting) follows) or
    /// gives up (`run` returns the refusal).
    DialFailed(ws::DialError),
    /// The connection ended (the relay closed it, the keepalive timed out,
    /// the socket failed); in words.
    Disconnected(String),
    /// The tunnel waits this long (the backoff) before dialling again.
    Reconnecting(Duration),
}

/// The callback of [`Tunnel::on_event`](super::Tunnel::on_event).
pub(super) type Observer = Box<dyn FnMut(TunnelEvent) + Send>;

/// How a connection ended, in words.
pub(super) fn ended(result: &Result<Closed, DriverError<ws::Error>>) -> String {
    match result {
        Ok(closed) => closed.to_string(),
        Err(DriverError::KeepaliveTimeout) => {
            "keepalive timeout: the relay answered no ping and read nothing".to_owned()
        }
        Err(e) => format!("lost the relay: {e}"),
    }
}
