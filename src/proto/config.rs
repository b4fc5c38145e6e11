//! What the configurations share: [`Config`] and its builder, the error a
//! builder returns, and the checks.

use super::side::Side;
use super::KeepaliveConfig;
use crate::frame::{HeadLimits, MAX_CHUNK_BODY};
use std::fmt;
use std::time::Duration;

/// Why a configuration was refused by its builder's `build()`: which
/// setting, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: `{field}` {reason}")]
#[non_exhaustive]
pub struct ConfigError {
    /// The setting, as its setter is named.
    pub field: &'static str,
    /// What is wrong with its value.
    pub reason: &'static str,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, reason: &'static str) -> ConfigError {
        ConfigError { field, reason }
    }
}

/// `value` must be at least 1.
pub(crate) fn at_least_one(field: &'static str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(ConfigError::new(field, "must be at least 1"));
    }
    Ok(())
}

/// `value` must be longer than zero.
pub(crate) fn positive(field: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::new(field, "must be longer than zero"));
    }
    Ok(())
}

/// How long a closing connection may take to hand its last messages (the
/// close message last) to a peer before the transport is dropped: 5 s, as
/// nginx's `lingering_timeout`.
pub(crate) const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The settings both machines have, with the same defaults and checks
/// (each config embeds one; [`Config`]'s getters read it).
#[derive(Debug, Clone)]
pub(crate) struct Common {
    pub max_streams: usize,
    pub reserved_streams: usize,
    pub max_unread_chunks: usize,
    pub max_unread_bytes: usize,
    pub max_queued_per_stream: usize,
    pub max_queued: usize,
    pub chunk_size: usize,
    pub keepalive: Option<KeepaliveConfig>,
    pub head_limits: HeadLimits,
    pub close_timeout: Duration,
    pub answer_pings: bool,
}

impl Default for Common {
    fn default() -> Common {
        Common {
            max_streams: 1024,
            reserved_streams: 16,
            max_unread_chunks: 16,
            max_unread_bytes: 64 << 20,
            max_queued_per_stream: 2 << 20,
            max_queued: 8 << 20,
            chunk_size: MAX_CHUNK_BODY,
            keepalive: Some(KeepaliveConfig::default()),
            head_limits: HeadLimits::default(),
            close_timeout: DEFAULT_CLOSE_TIMEOUT,
            answer_pings: false,
        }
    }
}

impl Common {
    /// How many streams may be open when `head` arrives: all of them for a
    /// control route, all but the reserve for the rest.
    pub fn stream_limit(&self, head: &crate::frame::RequestHead) -> usize {
        if super::is_control_route(head) {
            self.max_streams
        } else {
            self.max_streams - self.reserved_streams
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        at_least_one("max_streams", self.max_streams as u64)?;
        if self.reserved_streams >= self.max_streams {
            return Err(ConfigError::new(
                "reserved_streams",
                "(16 by default) must be below max_streams: set both",
            ));
        }
        at_least_one("max_unread_chunks", self.max_unread_chunks as u64)?;
        at_least_one("max_unread_bytes", self.max_unread_bytes as u64)?;
        at_least_one("max_queued_per_stream", self.max_queued_per_stream as u64)?;
        if self.max_queued_per_stream > self.max_queued {
            return Err(ConfigError::new(
                "max_queued_per_stream",
                "must not exceed max_queued",
            ));
        }
        if !(1..=MAX_CHUNK_BODY).contains(&self.chunk_size) {
            return Err(ConfigError::new("chunk_size", "must be in 1..=1 MiB"));
        }
        let l = &self.head_limits;
        at_least_one("head_limits.max_headers", l.max_headers as u64)?;
        at_least_one("head_limits.max_head_bytes", l.max_head_bytes as u64)?;
        at_least_one("head_limits.max_target_len", l.max_target_len as u64)?;
        at_least_one("head_limits.max_method_len", l.max_method_len as u64)?;
        positive("close_timeout", self.close_timeout)
    }
}

/// The bounds of a [`Connection`](super::Connection) of either side:
/// [`RelayConfig`](super::RelayConfig) (`Config<Relay>`) or
/// [`WorkerConfig`](super::WorkerConfig) (`Config<Worker>`). Every queue is
/// finite. Built with [`Config::builder`], which refuses nonsense with a
/// [`ConfigError`]; read back with the getters.
///
/// The settings both sides have are read the same way on either; the
/// relay's own follow in `impl Config<Relay>`.
pub struct Config<P: Side> {
    pub(crate) common: Common,
    /// The settings only this side has.
    pub(crate) extra: P::Extra,
}

impl<P: Side> fmt::Debug for Config<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(P::CONFIG_NAME)
            .field("common", &self.common)
            .field("extra", &self.extra)
            .finish()
    }
}

impl<P: Side> Clone for Config<P> {
    fn clone(&self) -> Self {
        Config {
            common: self.common.clone(),
            extra: self.extra.clone(),
        }
    }
}

impl<P: Side> Default for Config<P> {
    fn default() -> Self {
        Config {
            common: Common::default(),
            extra: P::Extra::default(),
        }
    }
}

impl<P: Side> Config<P> {
    /// Streams in flight at once on this connection (held by the
    /// application, counting those whose body is not read yet).
    /// Default 1024. A relay refuses more (503); a worker answers 503
    /// with `Retry-After: 1` itself.
    pub fn max_streams(&self) -> usize {
        self.common.max_streams
    }

    /// Of `max_streams`, how many only the protocol's control routes
    /// may use (`GET /health` and `POST /v1/executions/{id}/cancel`,
    /// see [`is_control_route`](crate::proto::is_control_route)), so a
    /// burst of long dispatches cannot lock out a cancel or a health
    /// check. Default 16; must be below `max_streams`.
    pub fn reserved_streams(&self) -> usize {
        self.common.reserved_streams
    }

    /// Unread body chunks held in memory per stream (spec: 16).
    /// Past it a worker pauses reading; a relay sends further chunks
    /// to its overflow, or pauses reading if it has none.
    pub fn max_unread_chunks(&self) -> usize {
        self.common.max_unread_chunks
    }

    /// Unread body bytes held in memory over all streams before
    /// reading pauses. Default 64 MiB.
    pub fn max_unread_bytes(&self) -> usize {
        self.common.max_unread_bytes
    }

    /// Body bytes queued to send per stream before its sink is not
    /// ready. Default 2 MiB; at most `max_queued`.
    pub fn max_queued_per_stream(&self) -> usize {
        self.common.max_queued_per_stream
    }

    /// Body bytes queued to send over all streams. Default 8 MiB.
    pub fn max_queued(&self) -> usize {
        self.common.max_queued
    }

    /// Largest body chunk emitted. Default and maximum 1 MiB.
    pub fn chunk_size(&self) -> usize {
        self.common.chunk_size
    }

    /// Pings and the pong deadline (spec: every 20 s, dead after 20 s
    /// without a pong, here also without any progress of our output).
    /// Armed by the first `handle_timeout(now)`. Default: on, with
    /// the spec's values.
    pub fn keepalive(&self) -> Option<KeepaliveConfig> {
        self.common.keepalive
    }

    /// Bounds on every head: a relay refuses a request over them
    /// (431, 414 or 400) and fails a response over them (502); a
    /// worker answers a request over them itself. Every bound must be
    /// at least 1.
    pub fn head_limits(&self) -> HeadLimits {
        self.common.head_limits
    }

    /// How long a closing connection may wait for the peer to take
    /// what is left to send (the close message last) and for the
    /// socket to close: past it, the machine's `close_timed_out()`
    /// turns true and a driver drops the transport, whatever is still unsent. It runs
    /// from the moment the connection starts closing, whoever closed
    /// it, so a peer that stops reading cannot keep a closing
    /// connection (its task, socket and buffers) alive. Default 5 s
    /// (nginx's `lingering_timeout`); longer than zero.
    pub fn close_timeout(&self) -> Duration {
        self.common.close_timeout
    }

    /// Whether the machine answers the peer's WebSocket pings itself: a
    /// `Message::Pong` with the ping's data, ahead of body chunks, for the
    /// latest ping not answered yet (RFC 6455 §5.5.3; a ping over 125
    /// bytes, which no WebSocket may send, is not answered). Default off:
    /// most WebSocket libraries answer pings before the application sees
    /// them (tungstenite, and so this crate's `worker-relay-hyper`; a pong
    /// more is harmless, but needless). Turn it on over a library that
    /// hands pings to the application and leaves the answer to it (such as
    /// actix-ws): a peer whose pings go unanswered takes the connection for
    /// dead (the spec's keepalive: after 20 s).
    pub fn answer_pings(&self) -> bool {
        self.common.answer_pings
    }

    /// A builder starting from the defaults.
    pub fn builder() -> ConfigBuilder<P> {
        ConfigBuilder(Config::default())
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> ConfigBuilder<P> {
        ConfigBuilder(self.clone())
    }
}

/// Builds a [`Config`]: each setter is documented on the getter of the
/// same name.
#[must_use]
pub struct ConfigBuilder<P: Side>(pub(crate) Config<P>);

impl<P: Side> fmt::Debug for ConfigBuilder<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple(P::CONFIG_BUILDER_NAME)
            .field(&self.0)
            .finish()
    }
}

impl<P: Side> Clone for ConfigBuilder<P> {
    fn clone(&self) -> Self {
        ConfigBuilder(self.0.clone())
    }
}

impl<P: Side> ConfigBuilder<P> {
    /// Streams in flight at once on this connection (held by the
    /// application, counting those whose body is not read yet).
    /// Default 1024. A relay refuses more (503); a worker answers 503
    /// with `Retry-After: 1` itself.
    pub fn max_streams(mut self, value: usize) -> Self {
        self.0.common.max_streams = value;
        self
    }

    /// Of `max_streams`, how many only the protocol's control routes
    /// may use (`GET /health` and `POST /v1/executions/{id}/cancel`,
    /// see [`is_control_route`](crate::proto::is_control_route)), so a
    /// burst of long dispatches cannot lock out a cancel or a health
    /// check. Default 16; must be below `max_streams`.
    pub fn reserved_streams(mut self, value: usize) -> Self {
        self.0.common.reserved_streams = value;
        self
    }

    /// Unread body chunks held in memory per stream (spec: 16).
    /// Past it a worker pauses reading; a relay sends further chunks
    /// to its overflow, or pauses reading if it has none.
    pub fn max_unread_chunks(mut self, value: usize) -> Self {
        self.0.common.max_unread_chunks = value;
        self
    }

    /// Unread body bytes held in memory over all streams before
    /// reading pauses. Default 64 MiB.
    pub fn max_unread_bytes(mut self, value: usize) -> Self {
        self.0.common.max_unread_bytes = value;
        self
    }

    /// Body bytes queued to send per stream before its sink is not
    /// ready. Default 2 MiB; at most `max_queued`.
    pub fn max_queued_per_stream(mut self, value: usize) -> Self {
        self.0.common.max_queued_per_stream = value;
        self
    }

    /// Body bytes queued to send over all streams. Default 8 MiB.
    pub fn max_queued(mut self, value: usize) -> Self {
        self.0.common.max_queued = value;
        self
    }

    /// Largest body chunk emitted. Default and maximum 1 MiB.
    pub fn chunk_size(mut self, value: usize) -> Self {
        self.0.common.chunk_size = value;
        self
    }

    /// Pings and the pong deadline (spec: every 20 s, dead after 20 s
    /// without a pong, here also without any progress of our output).
    /// Armed by the first `handle_timeout(now)`. Default: on, with
    /// the spec's values.
    pub fn keepalive(mut self, value: Option<KeepaliveConfig>) -> Self {
        self.0.common.keepalive = value;
        self
    }

    /// Bounds on every head: a relay refuses a request over them
    /// (431, 414 or 400) and fails a response over them (502); a
    /// worker answers a request over them itself. Every bound must be
    /// at least 1.
    pub fn head_limits(mut self, value: HeadLimits) -> Self {
        self.0.common.head_limits = value;
        self
    }

    /// How long a closing connection may wait for the peer to take
    /// what is left to send (the close message last) and for the
    /// socket to close: past it, the machine's `close_timed_out()`
    /// turns true and a driver drops the transport, whatever is still unsent. It runs
    /// from the moment the connection starts closing, whoever closed
    /// it, so a peer that stops reading cannot keep a closing
    /// connection (its task, socket and buffers) alive. Default 5 s
    /// (nginx's `lingering_timeout`); longer than zero.
    pub fn close_timeout(mut self, value: Duration) -> Self {
        self.0.common.close_timeout = value;
        self
    }

    /// Whether the machine answers the peer's WebSocket pings itself: a
    /// `Message::Pong` with the ping's data, ahead of body chunks, for the
    /// latest ping not answered yet (RFC 6455 §5.5.3; a ping over 125
    /// bytes, which no WebSocket may send, is not answered). Default off:
    /// most WebSocket libraries answer pings before the application sees
    /// them (tungstenite, and so this crate's `worker-relay-hyper`; a pong
    /// more is harmless, but needless). Turn it on over a library that
    /// hands pings to the application and leaves the answer to it (such as
    /// actix-ws): a peer whose pings go unanswered takes the connection for
    /// dead (the spec's keepalive: after 20 s).
    pub fn answer_pings(mut self, value: bool) -> Self {
        self.0.common.answer_pings = value;
        self
    }

    /// The configuration, or why it is refused.
    pub fn build(self) -> Result<Config<P>, ConfigError> {
        P::validate(&self.0)?;
        Ok(self.0)
    }
}
