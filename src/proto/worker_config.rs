//! The worker machine's configuration.

use super::config::{at_least_one, config_builder, ConfigError};
use super::relay_config::{validate_head_limits, validate_queues};
use super::KeepaliveConfig;
use crate::frame::{HeadLimits, MAX_CHUNK_BODY};

/// Bounds of a [`WorkerConnection`](super::WorkerConnection). Every queue is
/// finite. Built with [`WorkerConfig::builder`], which refuses nonsense with a
/// [`ConfigError`] (`max_unread_chunks(0)` would refuse even the `end` of a
/// GET); read back with the getters.
///
/// ```
/// use worker_relay::proto::WorkerConfig;
///
/// let config = WorkerConfig::builder().max_streams(32).build()?;
/// assert_eq!(config.max_unread_chunks(), 16);
/// assert!(WorkerConfig::builder().max_unread_chunks(0).build().is_err());
/// # Ok::<(), worker_relay::proto::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub(crate) max_streams: usize,
    pub(crate) reserved_streams: usize,
    pub(crate) max_unread_chunks: usize,
    pub(crate) max_unread_bytes: usize,
    pub(crate) max_queued_per_stream: usize,
    pub(crate) max_queued: usize,
    pub(crate) chunk_size: usize,
    pub(crate) keepalive: Option<KeepaliveConfig>,
    pub(crate) head_limits: HeadLimits,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            max_streams: 1024,
            reserved_streams: 16,
            max_unread_chunks: 16,
            max_unread_bytes: 64 << 20,
            max_queued_per_stream: 2 << 20,
            max_queued: 8 << 20,
            chunk_size: MAX_CHUNK_BODY,
            keepalive: Some(KeepaliveConfig::default()),
            head_limits: HeadLimits::default(),
        }
    }
}

config_builder! {
    /// Builds a [`WorkerConfig`]: each setter is documented on the getter of
    /// the same name.
    WorkerConfigBuilder for WorkerConfig {
        /// Requests open at once; a request beyond it is answered 503 (with
        /// `Retry-After: 1`) at once. Default 1024.
        max_streams: usize,
        /// Of `max_streams`, how many only the control routes (`GET /health`,
        /// `POST /v1/executions/{id}/cancel`) may use; other requests get 503
        /// past `max_streams - reserved_streams`. Default 16; must be below
        /// `max_streams`.
        reserved_streams: usize,
        /// Unread chunks held per request body before reading pauses (spec: 16).
        max_unread_chunks: usize,
        /// Unread body bytes held over all requests before reading pauses.
        /// Default 64 MiB.
        max_unread_bytes: usize,
        /// Response bytes queued per stream before its sink is not ready.
        /// Default 2 MiB; at most `max_queued`.
        max_queued_per_stream: usize,
        /// Response bytes queued over all streams. Default 8 MiB.
        max_queued: usize,
        /// Largest body chunk emitted. Default and maximum 1 MiB.
        chunk_size: usize,
        /// Pings and the pong deadline (spec: every 20 s, dead after 20 s
        /// without a pong or any progress of our output). Armed by the first
        /// `handle_timeout(now)`. Default: on, with the spec's values.
        keepalive: Option<KeepaliveConfig>,
        /// Bounds on every request head read: a request over them is answered
        /// by the machine itself with
        /// [`HeadLimitError::status`](crate::frame::HeadLimitError::status)
        /// (431, 414 or 400) and never reaches the application.
        head_limits: HeadLimits,
    }
}

impl WorkerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let c = self;
        at_least_one("max_streams", c.max_streams as u64)?;
        if c.reserved_streams >= c.max_streams {
            return Err(ConfigError::new(
                "reserved_streams",
                "(16 by default) must be below max_streams: set both",
            ));
        }
        at_least_one("max_unread_chunks", c.max_unread_chunks as u64)?;
        at_least_one("max_unread_bytes", c.max_unread_bytes as u64)?;
        validate_queues(c.max_queued_per_stream, c.max_queued, c.chunk_size)?;
        validate_head_limits(&c.head_limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_refuses_nonsense_by_name() {
        let refused = |b: WorkerConfigBuilder| b.build().unwrap_err().field;
        let b = WorkerConfig::builder;
        assert_eq!(refused(b().max_unread_chunks(0)), "max_unread_chunks");
        assert_eq!(refused(b().max_streams(4)), "reserved_streams");
        assert_eq!(refused(b().max_queued(1)), "max_queued_per_stream");
        assert_eq!(refused(b().chunk_size(0)), "chunk_size");
        let c = b().max_streams(4).reserved_streams(1).build().unwrap();
        assert_eq!(c.max_streams(), 4);
    }
}
