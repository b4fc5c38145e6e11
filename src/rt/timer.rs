//! Timers from the caller, so that no runtime is a dependency (as hyper's `rt::Timer`).

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

/// A future that completes at a deadline.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The clock and sleeps of the caller's runtime.
///
/// `now` must be the clock the sleeps follow (a driver that reads one clock
/// and sleeps on another wakes before its deadline, again and again). For
/// tokio (`worker_relay_hyper::TokioTimer`): `now` is
/// `tokio::time::Instant::now().into_std()` and `sleep_until` is
/// `Box::pin(tokio::time::sleep_until(deadline.into()))`.
///
/// The drivers read `now` before each command they pass to the machine, so
/// keep it cheap.
pub trait Timer: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Instant;
    /// A future that completes at `deadline`.
    fn sleep_until(&self, deadline: Instant) -> Sleep;
}
