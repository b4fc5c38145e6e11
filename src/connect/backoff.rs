//! Reconnect backoff: exponential delay with "equal jitter", randomness
//! supplied by the caller.

use crate::proto::config::{at_least_one, positive, ConfigError};
use std::time::Duration;

/// Backoff settings. The defaults are the spec's: start at 1 s, double,
/// at most 60 s. Built with [`BackoffConfig::builder`], which refuses a zero
/// start, a maximum below the start and a multiplier of 0.
///
/// ```
/// use std::time::Duration;
/// use worker_relay::connect::BackoffConfig;
///
/// let config = BackoffConfig::builder().max(Duration::from_secs(10)).build()?;
/// assert_eq!(config.initial(), Duration::from_secs(1));
/// assert!(BackoffConfig::builder().multiplier(0).build().is_err());
/// # Ok::<(), worker_relay::proto::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    pub(crate) initial: Duration,
    pub(crate) max: Duration,
    pub(crate) multiplier: u32,
}

impl Default for BackoffConfig {
    fn default() -> BackoffConfig {
        BackoffConfig {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            multiplier: 2,
        }
    }
}

impl BackoffConfig {
    /// The delay after a successful handshake and before the first
    /// attempt's retry (default 1 s); longer than zero.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The largest delay (default 60 s); at least `initial`.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// What the delay is multiplied by on each consecutive failure
    /// (default 2; 1 is a constant delay).
    pub fn multiplier(&self) -> u32 {
        self.multiplier
    }

    /// A builder starting from the defaults.
    pub fn builder() -> BackoffConfigBuilder {
        BackoffConfigBuilder(BackoffConfig::default())
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> BackoffConfigBuilder {
        BackoffConfigBuilder(*self)
    }
}

/// Builds a [`BackoffConfig`]: each setter is documented on the getter
/// of the same name.
#[derive(Debug, Clone)]
#[must_use]
pub struct BackoffConfigBuilder(BackoffConfig);

impl BackoffConfigBuilder {
    /// The delay after a successful handshake and before the first
    /// attempt's retry (default 1 s); longer than zero.
    pub fn initial(mut self, value: Duration) -> Self {
        self.0.initial = value;
        self
    }

    /// The largest delay (default 60 s); at least `initial`.
    pub fn max(mut self, value: Duration) -> Self {
        self.0.max = value;
        self
    }

    /// What the delay is multiplied by on each consecutive failure
    /// (default 2; 1 is a constant delay).
    pub fn multiplier(mut self, value: u32) -> Self {
        self.0.multiplier = value;
        self
    }

    /// The configuration, or why it is refused.
    pub fn build(self) -> Result<BackoffConfig, ConfigError> {
        self.0.validate()?;
        Ok(self.0)
    }
}

impl BackoffConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        positive("initial", self.initial)?;
        if self.max < self.initial {
            return Err(ConfigError::new("max", "must be at least initial"));
        }
        at_least_one("multiplier", u64::from(self.multiplier))
    }
}

/// How long the worker waits before reconnecting.
///
/// After each failure or close, call [`Backoff::next_wait`] with a random
/// number: it returns a wait drawn uniformly from `[delay/2, delay]` for the
/// current delay, then grows the delay (× 2, at most 60 s by default). After a
/// successful handshake, call [`Backoff::reset`]: the delay goes back to 1 s.
/// With the defaults, consecutive failures wait within halves of
/// 1, 2, 4, 8, 16, 32, 60, 60, … seconds, as Strata's worker does.
///
/// ```
/// use std::time::Duration;
/// use worker_relay::connect::Backoff;
///
/// let mut backoff = Backoff::default();
/// assert_eq!(backoff.next_wait(0.0), Duration::from_millis(500)); // delay 1 s
/// assert_eq!(backoff.next_wait(0.5), Duration::from_millis(1500)); // delay 2 s
/// backoff.reset(); // the handshake succeeded
/// assert_eq!(backoff.current_delay(), Duration::from_secs(1));
/// backoff.to_max(); // replaced by another process
/// assert_eq!(backoff.current_delay(), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    config: BackoffConfig,
    delay: Duration,
}

impl Backoff {
    /// A backoff with these settings, at its initial delay.
    pub fn new(config: BackoffConfig) -> Backoff {
        Backoff {
            config,
            delay: config.initial.min(config.max),
        }
    }

    /// The settings.
    pub fn config(&self) -> &BackoffConfig {
        &self.config
    }

    /// The delay the next wait is drawn from.
    pub fn current_delay(&self) -> Duration {
        self.delay
    }

    /// A failure or a close: the time to wait before reconnecting, then the
    /// delay grows for the next one.
    ///
    /// `random` is a uniform random number in `[0, 1)` from the caller; the
    /// wait is `delay/2 + random × delay/2`. Values outside `[0, 1]` are
    /// clamped into it and NaN is taken as 0, so the wait is always within
    /// `[delay/2, delay]`.
    pub fn next_wait(&mut self, random: f64) -> Duration {
        let r = if random.is_nan() {
            0.0
        } else {
            random.clamp(0.0, 1.0)
        };
        let half = self.delay / 2;
        let span = self.delay - half;
        // `min`: float rounding must not push the wait past the delay.
        let wait = half + span.mul_f64(r).min(span);
        self.delay = self
            .delay
            .saturating_mul(self.config.multiplier)
            .min(self.config.max);
        wait
    }

    /// [`Backoff::next_wait`] with 64 random bits instead of a float (the top
    /// 53 bits make a uniform number in `[0, 1)`).
    pub fn next_wait_u64(&mut self, random: u64) -> Duration {
        self.next_wait(unit_f64(random))
    }

    /// The next wait is drawn from the largest delay: the relay said that
    /// another process holds this worker's token now (a redeploy's new
    /// process took over), and dialling back at once would take the worker
    /// from it.
    pub fn to_max(&mut self) {
        self.delay = self.config.max;
    }

    /// The handshake succeeded: the delay goes back to its initial value.
    pub fn reset(&mut self) {
        self.delay = self.config.initial.min(self.config.max);
    }
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new(BackoffConfig::default())
    }
}

/// A uniform `f64` in `[0, 1)` from 64 random bits.
fn unit_f64(random: u64) -> f64 {
    (random >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic stream of test randomness (SplitMix64).
    struct SplitMix(u64);
    impl SplitMix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
    }

    const SPEC_DELAYS: [u64; 9] = [1, 2, 4, 8, 16, 32, 60, 60, 60];

    #[test]
    fn delays_double_up_to_60s() {
        let mut b = Backoff::default();
        let mut delays = Vec::new();
        for _ in 0..SPEC_DELAYS.len() {
            delays.push(b.current_delay().as_secs());
            b.next_wait(0.3);
        }
        assert_eq!(delays, SPEC_DELAYS);
    }

    #[test]
    fn every_wait_is_within_half_and_all_of_the_delay() {
        let mut rng = SplitMix(7);
        let (mut lowest, mut highest) = (f64::MAX, 0.0f64);
        for round in 0..2_000 {
            let mut b = Backoff::default();
            for &d in &SPEC_DELAYS {
                let delay = Duration::from_secs(d);
                assert_eq!(b.current_delay(), delay);
                let wait = if round % 2 == 0 {
                    b.next_wait_u64(rng.next())
                } else {
                    b.next_wait(unit_f64(rng.next()))
                };
                assert!(wait >= delay / 2 && wait <= delay, "{wait:?} for {delay:?}");
                let ratio = wait.as_secs_f64() / delay.as_secs_f64();
                lowest = lowest.min(ratio);
                highest = highest.max(ratio);
            }
        }
        // The draws cover the whole range, not just one point of it.
        assert!(lowest < 0.51 && highest > 0.99, "{lowest} {highest}");
    }

    #[test]
    fn extreme_randomness_stays_in_range() {
        let mut b = Backoff::default();
        assert_eq!(b.next_wait(0.0), Duration::from_millis(500));
        assert_eq!(b.next_wait(1.0), Duration::from_secs(2));
        assert_eq!(b.next_wait(-5.0), Duration::from_secs(2));
        assert_eq!(b.next_wait(f64::NAN), Duration::from_secs(4));
        assert_eq!(b.next_wait(f64::INFINITY), Duration::from_secs(16));
        assert_eq!(b.next_wait_u64(0), Duration::from_secs(16));
        let w = b.next_wait_u64(u64::MAX);
        assert!(w <= Duration::from_secs(60) && w > Duration::from_millis(59_999));
        assert!(unit_f64(u64::MAX) < 1.0);
    }

    #[test]
    fn reset_after_a_successful_handshake() {
        let mut b = Backoff::default();
        for _ in 0..10 {
            b.next_wait(0.5);
        }
        assert_eq!(b.current_delay(), Duration::from_secs(60));
        b.reset();
        assert_eq!(b.current_delay(), Duration::from_secs(1));
        let w = b.next_wait(0.99);
        assert!(w >= Duration::from_millis(500) && w <= Duration::from_secs(1));
        assert_eq!(b.current_delay(), Duration::from_secs(2));
    }

    #[test]
    fn configurable() {
        let config = BackoffConfig::builder()
            .initial(Duration::from_millis(100))
            .max(Duration::from_millis(1000))
            .multiplier(3)
            .build()
            .unwrap();
        let mut b = Backoff::new(config);
        assert_eq!(b.config(), &config);
        let mut delays = Vec::new();
        for _ in 0..5 {
            delays.push(b.current_delay().as_millis());
            b.next_wait(0.0);
        }
        assert_eq!(delays, [100, 300, 900, 1000, 1000]);

        // Nonsense is refused, not clamped.
        let e = BackoffConfig::builder()
            .initial(Duration::from_secs(10))
            .max(Duration::from_secs(5))
            .build()
            .unwrap_err();
        assert_eq!(e.field, "max");
        assert!(BackoffConfig::builder().multiplier(0).build().is_err());
        assert!(BackoffConfig::builder()
            .initial(Duration::ZERO)
            .build()
            .is_err());
        // Extremes are total, never a panic.
        let mut b = Backoff::new(
            BackoffConfig::builder()
                .initial(Duration::MAX)
                .max(Duration::MAX)
                .multiplier(u32::MAX)
                .build()
                .unwrap(),
        );
        assert!(b.next_wait(0.9) <= Duration::MAX);
        assert_eq!(b.current_delay(), Duration::MAX);
    }
}
