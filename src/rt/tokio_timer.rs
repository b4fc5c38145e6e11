//! The drivers' clock on tokio (feature `tokio`).

use super::{Sleep, Timer};
use std::time::Instant;

/// tokio's clock and sleeps (one clock: `now` is tokio's, so a paused or
/// advanced test clock moves both), for [`relay`](super::relay) and
/// [`worker`](super::worker) on a tokio runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::{Duration, Instant};
/// use worker_relay::rt::{Timer, TokioTimer};
///
/// let start = Instant::now();
/// TokioTimer.sleep_until(start + Duration::from_millis(5)).await;
/// assert!(TokioTimer.now() >= start + Duration::from_millis(5));
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub struct TokioTimer;

impl Timer for TokioTimer {
    /// tokio's clock, the one its sleeps follow: under
    /// `tokio::time::pause()` both stand still together.
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(tokio::time::sleep_until(deadline.into()))
    }
}
