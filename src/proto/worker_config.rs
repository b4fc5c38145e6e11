//! The worker machine's configuration.

use super::config::{common_accessors, Common, ConfigError};

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
#[derive(Debug, Clone, Default)]
pub struct WorkerConfig {
    pub(crate) common: Common,
}

/// Builds a [`WorkerConfig`]: each setter is documented on the getter of the
/// same name.
#[derive(Debug, Clone)]
#[must_use]
pub struct WorkerConfigBuilder(WorkerConfig);

impl WorkerConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> WorkerConfigBuilder {
        WorkerConfigBuilder(WorkerConfig::default())
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> WorkerConfigBuilder {
        WorkerConfigBuilder(self.clone())
    }
}

impl WorkerConfigBuilder {
    /// The configuration, or why it is refused.
    pub fn build(self) -> Result<WorkerConfig, ConfigError> {
        self.0.common.validate()?;
        Ok(self.0)
    }
}

common_accessors!(WorkerConfigBuilder for WorkerConfig);

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
