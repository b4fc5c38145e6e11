//! hyper's timer for one HTTP/1 connection: one tokio sleep, moved from
//! deadline to deadline.
//!
//! hyper arms a header-read timeout each time it starts to read a request
//! head on a kept-alive connection, and drops it once the head is in. With
//! hyper-util's `TokioTimer` each is a new tokio `Sleep`, entered in the
//! runtime's timer on its first poll; an entry earlier than the deadline
//! the runtime parked for wakes its driver, which costs an `eventfd` write:
//! on the one-thread relay under load, one system call per request
//! (BENCHMARKS.md, issue 42). This timer keeps the sleep hyper drops and
//! gives it the next deadline: tokio moves a registered entry to a later
//! deadline without touching the driver. A sleep that has fired is entered
//! again (once per timeout period of an idle connection).
//!
//! Its sleeps follow tokio's clock, so a paused test clock moves them.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

type TokioSleep = Pin<Box<tokio::time::Sleep>>;

/// A `hyper::rt::Timer` for one connection (make one per connection: its
/// spare sleep belongs to that connection's task).
#[derive(Clone, Default)]
pub(super) struct ConnectionTimer {
    /// The sleep of the last timeout hyper dropped, kept for the next.
    spare: Arc<Mutex<Option<TokioSleep>>>,
}

impl ConnectionTimer {
    fn take_spare(&self) -> Option<TokioSleep> {
        self.spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl hyper::rt::Timer for ConnectionTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let deadline = self.now().checked_add(duration);
        // Past the clock's end: a deadline that never comes, as far as any
        // connection lives (`Instant + Duration::MAX` would panic).
        let deadline = deadline.unwrap_or_else(|| self.now() + Duration::from_secs(1 << 40));
        self.sleep_until(deadline)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let sleep = match self.take_spare() {
            Some(mut sleep) => {
                sleep.as_mut().reset(deadline.into());
                sleep
            }
            None => Box::pin(tokio::time::sleep_until(deadline.into())),
        };
        Box::pin(Reused {
            sleep: Some(sleep),
            spare: self.spare.clone(),
        })
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        match sleep.as_mut().downcast_mut_pin::<Reused>() {
            Some(mut reused) => {
                if let Some(inner) = reused.sleep.as_mut() {
                    inner.as_mut().reset(new_deadline.into());
                }
            }
            None => *sleep = self.sleep_until(new_deadline),
        }
    }

    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }
}

/// A timeout hyper holds; its tokio sleep goes back to the connection's
/// timer when hyper drops it.
struct Reused {
    /// `Some` until dropped.
    sleep: Option<TokioSleep>,
    spare: Arc<Mutex<Option<TokioSleep>>>,
}

impl Future for Reused {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.sleep.as_mut() {
            Some(sleep) => sleep.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl hyper::rt::Sleep for Reused {}

impl Drop for Reused {
    fn drop(&mut self) {
        if let Some(sleep) = self.sleep.take() {
            let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
            if spare.is_none() {
                *spare = Some(sleep);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer;

    #[tokio::test(start_paused = true)]
    async fn a_dropped_timeout_s_sleep_serves_the_next_deadline() {
        let timer = ConnectionTimer::default();
        let start = timer.now();
        let first = timer.sleep_until(start + Duration::from_secs(2));
        drop(first);
        assert!(
            timer.spare.lock().unwrap().is_some(),
            "the sleep was not kept"
        );
        // The next timeout, later: it must wait for its own deadline, not
        // the first one's.
        let second = timer.sleep_until(start + Duration::from_secs(5));
        assert!(timer.spare.lock().unwrap().is_none());
        second.await;
        assert_eq!(timer.now() - start, Duration::from_secs(5));
        // And an earlier one than a kept sleep's.
        let third = timer.sleep_until(timer.now() + Duration::from_secs(1));
        drop(third);
        let fourth = timer.sleep_until(timer.now() + Duration::from_millis(10));
        fourth.await;
        assert_eq!(timer.now() - start, Duration::from_millis(5010));
    }

    #[tokio::test(start_paused = true)]
    async fn reset_moves_the_deadline_and_the_clock_s_end_does_not_panic() {
        let timer = ConnectionTimer::default();
        let start = timer.now();
        let mut sleep = timer.sleep(Duration::from_secs(1));
        timer.reset(&mut sleep, start + Duration::from_secs(3));
        sleep.await;
        assert_eq!(timer.now() - start, Duration::from_secs(3));
        let endless = timer.sleep(Duration::MAX);
        let woke = tokio::time::timeout(Duration::from_secs(3600), endless).await;
        assert!(woke.is_err(), "an endless sleep ended");
    }
}
