//! The worker machine's configuration.

use super::config::{Config, ConfigBuilder};
use super::side::Worker;

/// Bounds of a [`WorkerConnection`](super::WorkerConnection). Every queue is
/// finite. Built with [`WorkerConfig::builder`], which refuses nonsense with a
/// [`ConfigError`](super::ConfigError) (`max_unread_chunks(0)` would refuse even the `end` of a
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
pub type WorkerConfig = Config<Worker>;

/// Builds a [`WorkerConfig`]: each setter is documented on the getter of the
/// same name.
pub type WorkerConfigBuilder = ConfigBuilder<Worker>;

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
