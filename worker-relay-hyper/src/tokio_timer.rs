//! The core's drivers' clock on tokio.

use std::time::Instant;
use worker_relay::rt::{Sleep, Timer};

/// tokio's clock and sleeps (one clock: `now` is tokio's, so a paused or
/// advanced test clock moves both), for [`relay`](worker_relay::rt::relay) and
/// [`worker`](worker_relay::rt::worker) on a tokio runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::{Duration, Instant};
/// use worker_relay::rt::Timer;
/// use worker_relay_hyper::TokioTimer;
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
