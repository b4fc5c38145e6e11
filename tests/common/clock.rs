//! A clock the test moves by hand: `now()` stands still until `advance`,
//! and sleeps wake when it passes their deadline. Deterministic time for
//! the async drivers on any executor.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use worker_relay::rt::{Sleep, Timer};

#[derive(Clone)]
pub struct ManualClock(Arc<Inner>);

struct Inner {
    base: Instant,
    state: Mutex<(Duration, Vec<Waker>)>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock(Arc::new(Inner {
            base: Instant::now(),
            state: Mutex::new((Duration::ZERO, Vec::new())),
        }))
    }
}

impl ManualClock {
    /// The time elapsed on this clock since it was made.
    pub fn elapsed(&self) -> Duration {
        self.0.state.lock().unwrap().0
    }

    /// Moves the clock forward by `d` and wakes every sleep.
    pub fn advance(&self, d: Duration) {
        let wakers = {
            let mut st = self.0.state.lock().unwrap();
            st.0 += d;
            std::mem::take(&mut st.1)
        };
        for w in wakers {
            w.wake();
        }
    }
}

impl Timer for ManualClock {
    fn now(&self) -> Instant {
        self.0.base + self.elapsed()
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(ManualSleep {
            clock: self.clone(),
            deadline,
        })
    }
}

struct ManualSleep {
    clock: ManualClock,
    deadline: Instant,
}

impl Future for ManualSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.clock.0.state.lock().unwrap();
        if self.clock.0.base + st.0 >= self.deadline {
            return Poll::Ready(());
        }
        st.1.push(cx.waker().clone());
        Poll::Pending
    }
}
