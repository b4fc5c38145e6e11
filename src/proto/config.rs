//! What the configurations share: the error a builder returns, the checks,
//! and the macro that writes each config's getters and its builder.

use super::KeepaliveConfig;
use crate::frame::{HeadLimits, MAX_CHUNK_BODY};
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

/// Writes, for a config struct whose fields are `pub(crate)`, a getter per
/// listed field, `builder()` / `to_builder()`, and a builder with one setter
/// per field whose `build()` runs the config's `validate()`.
macro_rules! config_builder {
    (
        $(#[$bdoc:meta])*
        $builder:ident for $cfg:ident {
            $( $(#[$doc:meta])* $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        impl $cfg {
            $( $(#[$doc])* pub fn $field(&self) -> $ty { self.$field } )*

            /// A builder starting from the defaults.
            pub fn builder() -> $builder {
                $builder(<$cfg>::default())
            }

            /// A builder starting from this configuration.
            pub fn to_builder(&self) -> $builder {
                $builder(self.clone())
            }
        }

        $(#[$bdoc])*
        #[derive(Debug, Clone)]
        #[must_use]
        pub struct $builder($cfg);

        impl $builder {
            $( $(#[$doc])* pub fn $field(mut self, value: $ty) -> Self {
                self.0.$field = value;
                self
            } )*

            /// The configuration, or why it is refused.
            pub fn build(self) -> Result<$cfg, $crate::proto::ConfigError> {
                self.0.validate()?;
                Ok(self.0)
            }
        }
    };
}
pub(crate) use config_builder;

/// How long a closing connection may take to hand its last messages (the
/// close message last) to a peer before the transport is dropped: 5 s, as
/// nginx's `lingering_timeout`.
pub(crate) const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The settings both machines have, with the same defaults and checks
/// (each config embeds one and exposes it through `common_accessors!`).
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

/// Getters on `$cfg` and setters on `$builder` for the [`Common`] settings.
macro_rules! common_accessors {
    ($builder:ident for $cfg:ident) => {
        $crate::proto::config::common_accessors!(@each $builder $cfg
            /// Streams in flight at once on this connection (held by the
            /// application, counting those whose body is not read yet).
            /// Default 1024. A relay refuses more (503); a worker answers 503
            /// with `Retry-After: 1` itself.
            max_streams: usize,
            /// Of `max_streams`, how many only the protocol's control routes
            /// may use (`GET /health` and `POST /v1/executions/{id}/cancel`,
            /// see [`is_control_route`](crate::proto::is_control_route)), so a
            /// burst of long dispatches cannot lock out a cancel or a health
            /// check. Default 16; must be below `max_streams`.
            reserved_streams: usize,
            /// Unread body chunks held in memory per stream (spec: 16).
            /// Past it a worker pauses reading; a relay sends further chunks
            /// to its overflow, or pauses reading if it has none.
            max_unread_chunks: usize,
            /// Unread body bytes held in memory over all streams before
            /// reading pauses. Default 64 MiB.
            max_unread_bytes: usize,
            /// Body bytes queued to send per stream before its sink is not
            /// ready. Default 2 MiB; at most `max_queued`.
            max_queued_per_stream: usize,
            /// Body bytes queued to send over all streams. Default 8 MiB.
            max_queued: usize,
            /// Largest body chunk emitted. Default and maximum 1 MiB.
            chunk_size: usize,
            /// Pings and the pong deadline (spec: every 20 s, dead after 20 s
            /// without a pong, here also without any progress of our output).
            /// Armed by the first `handle_timeout(now)`. Default: on, with
            /// the spec's values.
            keepalive: Option<$crate::proto::KeepaliveConfig>,
            /// Bounds on every head: a relay refuses a request over them
            /// (431, 414 or 400) and fails a response over them (502); a
            /// worker answers a request over them itself. Every bound must be
            /// at least 1.
            head_limits: $crate::frame::HeadLimits,
            /// How long a closing connection may wait for the peer to take
            /// what is left to send (the close message last) and for the
            /// socket to close: past it, the machine's `close_timed_out()`
            /// turns true and a driver drops the transport, whatever is still unsent. It runs
            /// from the moment the connection starts closing, whoever closed
            /// it, so a peer that stops reading cannot keep a closing
            /// connection (its task, socket and buffers) alive. Default 5 s
            /// (nginx's `lingering_timeout`); longer than zero.
            close_timeout: std::time::Duration,
        );
    };
    (@each $builder:ident $cfg:ident $( $(#[$doc:meta])* $field:ident : $ty:ty ),* $(,)?) => {
        impl $cfg {
            $( $(#[$doc])* pub fn $field(&self) -> $ty { self.common.$field } )*
        }
        impl $builder {
            $( $(#[$doc])* pub fn $field(mut self, value: $ty) -> Self {
                self.0.common.$field = value;
                self
            } )*
        }
    };
}
pub(crate) use common_accessors;
