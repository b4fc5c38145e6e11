//! `Io::poll_io` against a scripted machine: a message read after the
//! machine stopped wanting to read (a handle acted while the driver was on
//! the socket, without the lock) is held, then fed first, in order, once the
//! machine wants to read again.

use super::*;
use crate::frame::Message;
use crate::proto::{BodyRead, FinishError, HandleError, StreamKey, WriteError};
use crate::rt::side::{SharedState, Wakers};
use crate::rt::{BodyError, Sleep};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::task::Waker;
use std::time::Duration;

/// A machine that records what it is fed and wants to read while `wants`.
#[derive(Default)]
struct Script {
    wants: bool,
    fed: Vec<Message>,
    /// The time each message was fed at.
    fed_at: Vec<Instant>,
    /// Messages to transmit, in order.
    out: VecDeque<Message>,
    /// Every chunk size the driver set.
    chunk_sizes: Vec<usize>,
}

impl Machine for Script {
    const SERVER: bool = true;
    fn handle_message(&mut self, msg: Message, now: Instant) -> Result<(), HandleError> {
        if !self.wants {
            return Err(HandleError::ReadPaused(msg));
        }
        self.fed.push(msg);
        self.fed_at.push(now);
        Ok(())
    }
    fn handle_lost(&mut self) {}
    fn handle_timeout(&mut self, _: Instant) {}
    fn advance_time(&mut self, _: Instant) {}
    fn close_timed_out(&self) -> bool {
        false
    }
    fn poll_transmit(&mut self) -> Option<Message> {
        self.out.pop_front()
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
    fn chunk_size(&self) -> usize {
        crate::frame::MAX_CHUNK_BODY
    }
    fn set_chunk_size(&mut self, n: usize) {
        self.chunk_sizes.push(n);
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

impl SharedState for Shared {
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

/// A machine that wants to read, and a socket with `n` messages for it
/// that pauses the machine before message `pause_at`.
fn reading(n: usize, pause_at: usize) -> (Arc<Mutex<Shared>>, Scripted) {
    let shared = Arc::new(Mutex::new(Shared {
        conn: Script {
            wants: true,
            ..Script::default()
        },
        driver: None,
    }));
    let socket = Scripted {
        to_read: (0..n).map(text).collect(),
        handed: 0,
        pause_at,
        shared: shared.clone(),
    };
    (shared, socket)
}

fn noop_cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

#[test]
fn a_message_read_after_a_pause_is_held_then_fed_first_in_order() {
    let (shared, socket) = reading(5, 2);
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

/// A clock that moves a millisecond at every reading, and counts them.
#[derive(Default)]
struct Ticking(Mutex<(Option<Instant>, usize)>);

impl Timer for Ticking {
    fn now(&self) -> Instant {
        let mut t = self.0.lock().unwrap();
        let now =
            t.0.map_or_else(Instant::now, |t| t + Duration::from_millis(1));
        *t = (Some(now), t.1 + 1);
        now
    }
    fn sleep_until(&self, _: Instant) -> Sleep {
        Box::pin(std::future::pending())
    }
}

#[test]
fn what_a_pass_reads_is_taken_at_the_passs_time() {
    let (shared, socket) = reading(6, usize::MAX);
    let clock = Arc::new(Ticking::default());
    let mut io = Io::new(socket, clock.clone());
    let mut cx = noop_cx();

    assert!(matches!(io.poll_io(&*shared, &mut cx), Pass::Progress));
    let fed_at = shared.lock().unwrap().conn.fed_at.clone();
    assert_eq!(fed_at.len(), 6);
    // Six messages, one reading of the clock (a small request's answer is
    // three messages: three readings each were a per-cent of the relay).
    assert!(fed_at.iter().all(|&t| t == fed_at[0]), "{fed_at:?}");
    assert_eq!(clock.0.lock().unwrap().1, 1, "clock readings in the pass");
}

/// A socket that takes every message at once and whose flush completes
/// only when the test opens it (a slow link below a small send buffer).
struct Gated {
    taken: Vec<usize>,
    flushes: usize,
    open: bool,
}

impl Stream for Gated {
    type Item = Result<Message, Infallible>;
    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Pending
    }
}

impl Sink<Message> for Gated {
    type Error = Infallible;
    fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn start_send(mut self: Pin<&mut Self>, m: Message) -> Result<(), Infallible> {
        self.taken.push(m.len());
        Ok(())
    }
    fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if std::mem::take(&mut self.open) {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }
    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
}

#[test]
fn a_socket_that_drains_slowly_is_handed_one_chunk_between_flushes() {
    use crate::proto::pacer::MIN_CHUNK;
    let half = MIN_CHUNK / 2;
    let bulk = || Message::Binary(Bytes::from(vec![0u8; half]));
    let shared = Arc::new(Mutex::new(Shared {
        conn: Script {
            out: (0..16).map(|_| bulk()).collect(),
            ..Script::default()
        },
        driver: None,
    }));
    let socket = Gated {
        taken: Vec::new(),
        flushes: 0,
        open: false,
    };
    let mut io = Io::new(socket, Arc::new(NoSleep));
    let mut cx = noop_cx();
    io.poll_io(&*shared, &mut cx);
    // The pacer starts at its smallest chunk, which the machine is given,
    // and the socket gets that much until a flush completes.
    assert_eq!(shared.lock().unwrap().conn.chunk_sizes, vec![MIN_CHUNK]);
    assert_eq!(io.socket.taken.iter().sum::<usize>(), MIN_CHUNK);
    assert!(matches!(io.poll_io(&*shared, &mut cx), Pass::Idle));
    assert_eq!(io.socket.taken.len(), 2, "handed more before a flush");

    // A control frame queued now goes out right after the batch in the
    // socket: ahead of the bulk the machine still holds.
    shared
        .lock()
        .unwrap()
        .conn
        .out
        .push_front(Message::Text("cancel".into()));
    io.socket.open = true;
    io.poll_io(&*shared, &mut cx);
    assert_eq!(io.socket.flushes, 1);
    assert_eq!(io.socket.taken[2], "cancel".len());
    assert_eq!(io.socket.taken.iter().sum::<usize>(), 2 * MIN_CHUNK + 6);

    // Every flush lets one more batch through, until all is sent.
    for _ in 0..64 {
        if shared.lock().unwrap().conn.out.is_empty() && io.socket.open {
            break;
        }
        io.socket.open = true;
        io.poll_io(&*shared, &mut cx);
    }
    assert_eq!(io.socket.taken.iter().sum::<usize>(), 16 * half + 6);
}

/// A socket whose reads the test counts, with a message to read only when
/// the test puts one there (and wakes the waker the last read left).
struct Counted {
    reads: usize,
    next: Option<Message>,
    waker: Option<Waker>,
}

impl Stream for Counted {
    type Item = Result<Message, Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.reads += 1;
        match self.next.take() {
            Some(m) => Poll::Ready(Some(Ok(m))),
            None => {
                self.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Sink<Message> for Counted {
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

#[test]
fn a_socket_that_answered_pending_is_read_again_only_once_its_waker_fires() {
    let shared = Arc::new(Mutex::new(Shared {
        conn: Script {
            wants: true,
            ..Script::default()
        },
        driver: None,
    }));
    let socket = Counted {
        reads: 0,
        next: None,
        waker: None,
    };
    let mut io = Io::new(socket, Arc::new(NoSleep));
    let mut cx = noop_cx();
    assert!(matches!(io.poll_io(&*shared, &mut cx), Pass::Idle));
    assert_eq!(io.socket.reads, 1);

    // Woken for something else (a request to send): the socket is not read.
    shared.lock().unwrap().conn.out.push_back(text(9));
    assert!(matches!(io.poll_io(&*shared, &mut cx), Pass::Progress));
    assert!(matches!(io.poll_io(&*shared, &mut cx), Pass::Idle));
    assert_eq!(io.socket.reads, 1, "read without its waker firing");

    // A message arrives and the socket wakes its waker: read, fed, and
    // read on until `Pending` again.
    io.socket.next = Some(text(1));
    io.socket
        .waker
        .take()
        .expect("the read left a waker")
        .wake();
    assert!(matches!(io.poll_io(&*shared, &mut cx), Pass::Progress));
    assert_eq!(shared.lock().unwrap().conn.fed, vec![text(1)]);
    assert_eq!(io.socket.reads, 3);
    assert!(matches!(io.poll_io(&*shared, &mut cx), Pass::Idle));
    assert_eq!(io.socket.reads, 3);
}
