//! The sans-IO state machines: [`RelayConnection`] and [`WorkerConnection`].
//!
//! Both are one type, [`Connection`], over the [`Side`] it runs
//! ([`Relay`] or [`Worker`]); their configurations are [`Config`]s built by
//! a [`ConfigBuilder`] ([`RelayConfig`], [`WorkerConfig`]). What both sides
//! do the same way is written once; each side's own commands are on its
//! `Connection<Relay>` or `Connection<Worker>`.
//!
//! Each holds one connection's streams. Messages read from the socket go in
//! through `handle_message`; the application's commands go in through
//! methods that take a [`StreamKey`]; messages to write come out of
//! `poll_transmit`, and news for the application out of `poll_event`.
//! Neither does I/O, reads a clock or draws random numbers.
//!
//! Output order: control frames (heads, `end`, `abort`) go before body
//! chunks, and chunks of different streams go round-robin, one chunk each,
//! so a small request is answered while a large body is in flight.
//!
//! The crate docs show the whole run loop; in short, a relay opening a
//! stream and what it hands to the socket:
//!
//! ```
//! use std::time::Instant;
//! use worker_relay::frame::{self, ControlFrame, Decoded, Headers, RequestHead};
//! use worker_relay::proto::{RelayConfig, RelayConnection};
//!
//! let config = RelayConfig::builder().max_streams(64).build()?;
//! let mut relay = RelayConnection::new(config);
//! let key = relay.open_stream(RequestHead::new("GET", "/health", "", Headers::new())?)?;
//! relay.finish(key)?;
//!
//! // The socket gets the request, then its end.
//! let mut out = Vec::new();
//! while let Some(msg) = relay.poll_transmit() {
//!     out.push(frame::decode(&msg).unwrap()?);
//! }
//! assert!(matches!(out[0], Decoded::Control(ControlFrame::Request { .. })));
//! assert!(matches!(out[1], Decoded::Control(ControlFrame::End { .. })));
//! // The clock comes from outside: the first tick arms the keepalive,
//! // whose next ping is then the machine's deadline.
//! let now = Instant::now();
//! relay.handle_timeout(now);
//! assert!(relay.poll_timeout().is_some_and(|t| t > now));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod chunk_pool;
mod close;
pub(crate) mod config;
mod connection;
mod core;
mod error;
mod inbound;
mod keepalive;
mod length;
pub(crate) mod local_map;
mod outbound;
pub mod pacer;
mod relay;
mod side;
mod stats;
mod worker;
mod worker_config;

pub use close::CloseCause;
pub use config::{Config, ConfigBuilder, ConfigError};
pub use connection::Connection;
pub use error::{
    FinishError, HandleError, OpenError, RefillError, RespondError, UnknownStream, WriteError,
};
pub use inbound::BodyRead;
pub use keepalive::{Keepalive, KeepaliveConfig};
pub use relay::{
    OverflowConfig, RelayConfig, RelayConfigBuilder, RelayConnection, RelayEnd, RelayEvent,
};
pub use side::{Relay, Side, Worker};
pub use stats::Stats;
pub use worker::{WorkerConnection, WorkerEnd, WorkerEvent, FAILED_BODY, MAX_PENDING_REFUSALS};
pub use worker_config::{WorkerConfig, WorkerConfigBuilder};

/// Whether a request is one of the protocol's control routes, which the
/// spec says are answered at once while dispatches are in flight:
/// `GET /health` and `POST /v1/executions/{build_id}/cancel` (the path as the
/// worker sees it, after the relay's prefix). Both machines keep
/// `reserved_streams` of their `max_streams` for these, so a burst of long
/// requests cannot lock them out.
pub fn is_control_route(head: &crate::frame::RequestHead) -> bool {
    match (head.method(), head.path()) {
        ("GET", "/health") => true,
        ("POST", path) => path
            .strip_prefix("/v1/executions/")
            .and_then(|rest| rest.strip_suffix("/cancel"))
            .is_some_and(|id| !id.is_empty() && !id.contains('/')),
        _ => false,
    }
}

/// The application's handle on one stream of one connection.
///
/// Keys are never reused on a connection, unlike wire ids (which the relay
/// may reuse once a stream has ended), so a late command for a finished
/// stream can never reach a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamKey(pub(crate) u64);

impl StreamKey {
    /// The key's number (for logs).
    pub fn get(self) -> u64 {
        self.0
    }
}
