//! Reads the socket only when it may have something.
//!
//! A driver is woken for many reasons: a handle queued a request or a body
//! piece, a reader took bytes, the timer fired. Polling the socket's
//! reading side on each of those wake-ups costs the WebSocket library a
//! read attempt that finds nothing (tungstenite zeroes its free read buffer
//! before every attempt: 128 KiB on a worker's connection, about a
//! microsecond). So the reading side is polled with a waker of its own,
//! and once it has answered `Pending` it is polled again only after that
//! waker fired: the socket (or the library's coop budget) said there may be
//! more. Any wake-up of that waker also wakes the driver's task.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};

/// Whether to poll the reading side, and the waker to poll it with.
pub(crate) struct ReadGate {
    flag: Arc<Flag>,
    waker: Waker,
    /// The last read answered `Pending`: wait for the waker.
    parked: bool,
}

#[derive(Default)]
struct Flag {
    /// The reading side's waker fired since the last [`ReadGate::open`].
    woken: AtomicBool,
    /// The driver's task, woken with the flag.
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(task) = task.as_ref() {
            task.wake_by_ref();
        }
    }
}

impl ReadGate {
    pub(crate) fn new() -> ReadGate {
        let flag = Arc::new(Flag::default());
        ReadGate {
            waker: Waker::from(flag.clone()),
            flag,
            parked: false,
        }
    }

    /// Whether the reading side may have something now; `task` is the
    /// driver's waker, which the reading side's wakes reach. Call before a
    /// read, then [`ReadGate::context`] to poll it with.
    pub(crate) fn open(&mut self, task: &Waker) -> bool {
        {
            let mut current = self.flag.task.lock().unwrap_or_else(|e| e.into_inner());
            if !current.as_ref().is_some_and(|w| w.will_wake(task)) {
                *current = Some(task.clone());
            }
        }
        // Cleared before the read, so a wake during or after it counts.
        let woken = self.flag.woken.swap(false, Ordering::AcqRel);
        !self.parked || woken
    }

    /// The context to poll the reading side with.
    pub(crate) fn context(&self) -> Context<'_> {
        Context::from_waker(&self.waker)
    }

    /// What the read answered: `Pending` parks the gate until the waker
    /// fires.
    pub(crate) fn set_parked(&mut self, pending: bool) {
        self.parked = pending;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn after_pending_the_gate_opens_only_when_its_waker_fires_and_wakes_the_task() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = Waker::from(count.clone());
        let mut gate = ReadGate::new();
        assert!(gate.open(&task), "a fresh gate reads");
        gate.set_parked(false);
        assert!(gate.open(&task), "after a message, read on");
        gate.set_parked(true);
        assert!(!gate.open(&task), "pending and not woken: no read");
        assert!(!gate.open(&task));

        gate.context().waker().wake_by_ref();
        assert_eq!(count.0.load(Ordering::Relaxed), 1, "the task was woken");
        assert!(gate.open(&task), "woken: read");
        gate.set_parked(true);
        assert!(!gate.open(&task), "the wake was used up");

        // A clone of the waker, kept by the socket and woken by value.
        let kept = gate.context().waker().clone();
        assert!(!gate.open(&task));
        kept.wake();
        assert!(gate.open(&task));
    }

    #[test]
    fn the_task_waker_follows_the_driver() {
        let (a, b) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        let mut gate = ReadGate::new();
        gate.open(&Waker::from(a.clone()));
        gate.set_parked(true);
        gate.open(&Waker::from(b.clone()));
        gate.context().waker().wake_by_ref();
        assert_eq!(a.0.load(Ordering::Relaxed), 0);
        assert_eq!(b.0.load(Ordering::Relaxed), 1);
    }
}
