//! What the configurations share: the error a builder returns, the checks,
//! and the macro that writes each config's getters and its builder.

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
