//! The two sides of the protocol, as the type parameter of [`Connection`],
//! [`Config`] and [`ConfigBuilder`](super::ConfigBuilder).

use super::config::{Config, ConfigError};
use super::connection::Connection;
use super::{BodyRead, CloseCause, FinishError, HandleError, StreamKey, WriteError};
use crate::frame::{CloseCode, Message};
use bytes::Bytes;
use std::time::Instant;

/// Which side of a connection a [`Connection`], a [`Config`] or a
/// [`ConfigBuilder`](super::ConfigBuilder) is: [`Relay`] or [`Worker`].
///
/// What both sides do the same way is written once, for every `P: Side`;
/// what only one side does is in that side's `impl` block. The trait is
/// sealed: these two are the protocol's only sides.
pub trait Side: sealed::Sealed {
    /// What a [`Connection`] of this side tells the application
    /// ([`poll_event`](Connection::poll_event)): a
    /// [`RelayEvent`](super::RelayEvent) or a [`WorkerEvent`](super::WorkerEvent).
    type Event: std::fmt::Debug;
}

/// The relay side: the WebSocket server that turns HTTP requests into frames
/// for the worker. An uninhabited marker: [`RelayConnection`](super::RelayConnection)
/// is `Connection<Relay>`, [`RelayConfig`](super::RelayConfig) is `Config<Relay>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relay {}

/// The worker side: the WebSocket client that dialled out and answers the
/// relay's requests. An uninhabited marker:
/// [`WorkerConnection`](super::WorkerConnection) is `Connection<Worker>`,
/// [`WorkerConfig`](super::WorkerConfig) is `Config<Worker>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Worker {}

impl Side for Relay {
    type Event = super::RelayEvent;
}

impl Side for Worker {
    type Event = super::WorkerEvent;
}

pub(crate) mod sealed {
    use super::*;

    /// What a side brings to the shared code: its own types, and the hooks
    /// the shared code (and the runtime's driver) calls.
    pub trait Sealed: Sized + 'static {
        /// `RelayConnection` or `WorkerConnection`, for `Debug`.
        const CONNECTION_NAME: &'static str;
        /// `RelayConfig` or `WorkerConfig`, for `Debug`.
        const CONFIG_NAME: &'static str;
        /// `RelayConfigBuilder` or `WorkerConfigBuilder`, for `Debug`.
        const CONFIG_BUILDER_NAME: &'static str;
        /// Whether this side is the WebSocket server (the relay), which
        /// closes the TCP connection first once the close messages are
        /// exchanged (RFC 6455 §7.1.1); the client (the worker) waits for it.
        const SERVER: bool;

        /// The machine's record of one stream.
        type Stream: std::fmt::Debug;
        /// The machine's own state besides what both sides hold.
        type State: std::fmt::Debug + Default;
        /// The settings only this side has.
        type Extra: std::fmt::Debug + Clone + Default;

        /// The event that says a stream's sink may take bytes again.
        fn writable(key: StreamKey) -> <Self as Side>::Event
        where
            Self: Side;

        /// Checks a configuration before its builder hands it out.
        fn validate(config: &Config<Self>) -> Result<(), ConfigError>
        where
            Self: Side;

        /// Closes the connection for `cause`, ending every stream.
        fn end_all(c: &mut Connection<Self>, close: Option<(CloseCode, &str)>, cause: CloseCause)
        where
            Self: Side;

        // The side's own inputs and drains, for code written over any side
        // (the runtime's driver).

        fn wants_read(c: &Connection<Self>) -> bool
        where
            Self: Side;

        fn handle_message(
            c: &mut Connection<Self>,
            msg: Message,
            now: Instant,
        ) -> Result<(), HandleError>
        where
            Self: Side;

        fn handle_timeout(c: &mut Connection<Self>, now: Instant)
        where
            Self: Side;

        fn poll_transmit(c: &mut Connection<Self>) -> Option<Message>
        where
            Self: Side;

        fn poll_timeout(c: &Connection<Self>) -> Option<Instant>
        where
            Self: Side;

        fn send_body(
            c: &mut Connection<Self>,
            key: StreamKey,
            data: Bytes,
        ) -> Result<usize, WriteError>
        where
            Self: Side;

        fn finish(c: &mut Connection<Self>, key: StreamKey) -> Result<(), FinishError>
        where
            Self: Side;

        fn read_body(c: &mut Connection<Self>, key: StreamKey) -> BodyRead
        where
            Self: Side;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The machines and their configurations move between threads, and
    /// are shared, as the structs they replace were.
    #[test]
    fn the_generic_types_keep_their_auto_traits() {
        fn check<T: Send + Sync + Unpin + std::panic::UnwindSafe>() {}
        check::<Connection<Relay>>();
        check::<Connection<Worker>>();
        check::<Config<Relay>>();
        check::<Config<Worker>>();
        check::<super::super::ConfigBuilder<Relay>>();
        check::<super::super::ConfigBuilder<Worker>>();
    }
}
