//! Timers from the caller, so that no runtime is a dependency (as hyper's `rt::Timer`).

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

/// A future that completes at a deadline.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The clock and sleeps of the caller's runtime.
///
/// For tokio: `now` is `Instant::now()` and `sleep_until` is
/// `Box::pin(tokio::time::sleep_until(deadline.into()))`.
pub trait Timer: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Instant;
    /// A future that completes at `deadline`.
    fn sleep_until(&self, deadline: Instant) -> Sleep;
}
