//! `Io::poll_io` against a scripted machine: a message read after the
//! machine stopped wanting to read (a handle acted while the driver was on
//! the socket, without the lock) is held, then fed first, in order, once the
//! machine wants to read again.

use super::*;
use crate::frame::Message;
use crate::proto::{BodyRead, FinishError, HandleError, StreamKey, WriteError};
use crate::rt::side::{Side, Wakers};
use crate::rt::{BodyError, Sleep};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::task::Waker;

/// A machine that records what it is fed and wants to read while `wants`.
#[derive(Default)]
struct Script {
    wants: bool,
    fed: Vec<Message>,
}

impl Machine for Script {
    fn handle_message(&mut self, msg: Message, _: Instant) -> Result<(), HandleError> {
        if !self.wants {
            return Err(HandleError::ReadPaused(msg));
        }
        self.fed.push(msg);
        Ok(())
    }
    fn handle_lost(&mut self) {}
    fn handle_timeout(&mut self, _: Instant) {}
    fn advance_time(&mut self, _: Instant) {}
    fn close_timed_out(&self) -> bool {
        false
    }
    fn poll_transmit(&mut self) -> Option<Message> {
        None
    }
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    fn wants_read(&self) -> bool {
        self.wants
    }
    fn is_closed(&self) -> bool {
        false
    }
    fn close_cause(&self) -> Option<&CloseCause> {
        None
    }
    fn send_body(&mut self, _: StreamKey, _: Bytes) -> Result<usize, WriteError> {
        Ok(0)
    }
    fn finish(&mut self, _: StreamKey) -> Result<(), FinishError> {
        Ok(())
    }
    fn read_body(&mut self, _: StreamKey) -> BodyRead {
        BodyRead::Pending
    }
}

struct NoSleep;

impl Timer for NoSleep {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn sleep_until(&self, _: Instant) -> Sleep {
        Box::pin(std::future::pending())
    }
}

struct Shared {
    conn: Script,
    driver: Option<Waker>,
}

impl Side for Shared {
    type Conn = Script;
    fn conn(&mut self) -> &mut Script {
        &mut self.conn
    }
    fn dispatch(&mut self) {}
    fn driver_waker(&mut self) -> &mut Option<Waker> {
        &mut self.driver
    }
    fn clock(&self) -> &dyn Timer {
        &NoSleep
    }
    fn write_error(&self, _: StreamKey) -> Option<BodyError> {
        None
    }
    fn wakers(&mut self, _: StreamKey) -> Option<&mut Wakers> {
        None
    }
    fn read_gone(&mut self, _: StreamKey) -> BodyError {
        BodyError::ConnectionLost
    }
    fn release(&mut self, _: StreamKey) {}
}

/// A socket with messages to read; before it hands out message number
/// `pause_at`, it takes the side's lock and pauses the machine, as a handle
/// on another thread could while the driver reads.
struct Scripted {
    to_read: VecDeque<Message>,
    handed: usize,
    pause_at: usize,
    shared: Arc<Mutex<Shared>>,
}

impl Stream for Scripted {
    type Item = Result<Message, Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(msg) = self.to_read.pop_front() else {
            return Poll::Pending;
        };
        if self.handed == self.pause_at {
            // Would deadlock if the driver held the lock here.
            self.shared.lock().unwrap().conn.wants = false;
        }
        self.handed += 1;
        Poll::Ready(Some(Ok(msg)))
    }
}

impl Sink<Message> for Scripted {
    type Error = Infallible;
    fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn start_send(self: Pin<&mut Self>, _: Message) -> Result<(), Infallible> {
        Ok(())
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
}

fn text(n: usize) -> Message {
    Message::Text(format!("m{n}"))
}

fn noop_cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

#[test]
fn a_message_read_after_a_pause_is_held_then_fed_first_in_order() {
    let shared = Arc::new(Mutex::new(Shared {
        conn: Script {
            wants: true,
            fed: Vec::new(),
        },
        driver: None,
    }));
    let socket = Scripted {
        to_read: (0..5).map(text).collect(),
        handed: 0,
        pause_at: 2,
        shared: shared.clone(),
    };
    let mut io = Io::new(socket, Arc::new(NoSleep));
    let mut cx = noop_cx();

    // m0 and m1 are fed; the machine pauses while m2 is being read: m2 is
    // held, and nothing more is read.
    assert!(matches!(io.poll_io(&*shared, &mut cx), Pass::Progress));
    assert_eq!(shared.lock().unwrap().conn.fed, vec![text(0), text(1)]);
    assert_eq!(io.held, Some(text(2)));
    assert_eq!(io.socket.to_read.len(), 2, "read on past the pause");
    // Still paused: nothing moves, and m2 stays held.
    assert!(matches!(io.poll_io(&*shared, &mut cx), Pass::Idle));
    assert_eq!(io.held, Some(text(2)));
    assert_eq!(io.socket.to_read.len(), 2);

    // The machine wants to read again: m2 first, then the rest, in order.
    shared.lock().unwrap().conn.wants = true;
    assert!(matches!(io.poll_io(&*shared, &mut cx), Pass::Progress));
    assert_eq!(io.held, None);
    assert_eq!(
        shared.lock().unwrap().conn.fed,
        (0..5).map(text).collect::<Vec<_>>()
    );
}
