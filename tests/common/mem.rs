//! An in-memory WebSocket made of two bounded channels, and timers from
//! futures-timer: the async layer with no runtime at all.

use futures::channel::mpsc;
use futures::{Sink, SinkExt, Stream, StreamExt};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;
use worker_relay::frame::Message;
use worker_relay::rt::{Sleep, Timer};

/// One end of an in-memory WebSocket. Like a WebSocket library, it answers
/// a close message it reads, unless it sent one already (the drivers
/// leave that answer to the socket); the answer goes out before anything
/// else sent after it. The raw channels (`tx`, `rx`) do not.
pub struct MemSocket {
    pub tx: mpsc::Sender<Message>,
    pub rx: mpsc::Receiver<Message>,
    /// A close message has been sent (or its answer queued).
    closed: bool,
    /// The answer to the peer's close, not handed to `tx` yet.
    answer: Option<Message>,
}

impl MemSocket {
    fn new(tx: mpsc::Sender<Message>, rx: mpsc::Receiver<Message>) -> MemSocket {
        MemSocket {
            tx,
            rx,
            closed: false,
            answer: None,
        }
    }

    /// Hands the answer to a close to the channel.
    fn push_answer(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), mpsc::SendError>> {
        if self.answer.is_some() {
            std::task::ready!(self.tx.poll_ready_unpin(cx))?;
            if let Some(m) = self.answer.take() {
                self.tx.start_send_unpin(m)?;
            }
        }
        Poll::Ready(Ok(()))
    }
}

pub fn socket_pair() -> (MemSocket, MemSocket) {
    let (a_tx, b_rx) = mpsc::channel(4);
    let (b_tx, a_rx) = mpsc::channel(4);
    (MemSocket::new(a_tx, a_rx), MemSocket::new(b_tx, b_rx))
}

impl Stream for MemSocket {
    type Item = Result<Message, mpsc::SendError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.rx.poll_next_unpin(cx);
        if let Poll::Ready(Some(Message::Close(frame))) = &polled {
            if !self.closed {
                self.closed = true;
                self.answer = Some(Message::Close(frame.clone()));
                let _ = self.push_answer(cx);
            }
        }
        polled.map(|m| m.map(Ok))
    }
}

impl Sink<Message> for MemSocket {
    type Error = mpsc::SendError;
    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        std::task::ready!(self.push_answer(cx))?;
        self.tx.poll_ready_unpin(cx)
    }
    fn start_send(mut self: Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
        if matches!(item, Message::Close(_)) {
            self.closed = true;
        }
        self.tx.start_send_unpin(item)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        std::task::ready!(self.push_answer(cx))?;
        self.tx.poll_flush_unpin(cx)
    }
    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        std::task::ready!(self.push_answer(cx))?;
        self.tx.poll_close_unpin(cx)
    }
}

/// Timers from futures-timer: no runtime needed.
pub struct FuturesTimer;

impl Timer for FuturesTimer {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(futures_timer::Delay::new(
            deadline.saturating_duration_since(Instant::now()),
        ))
    }
}

/// A relay and a worker driver over one in-memory socket, spawned on `pool`.
pub fn spawn_pair(
    pool: &futures::executor::LocalPool,
    relay: worker_relay::proto::RelayConfig,
    worker: worker_relay::proto::WorkerConfig,
) -> (worker_relay::rt::RelayHandle, worker_relay::rt::Incoming) {
    use futures::task::LocalSpawnExt;
    let (relay_sock, worker_sock) = socket_pair();
    let (handle, relay_driver) = worker_relay::rt::relay(relay_sock, FuturesTimer, relay);
    let (incoming, worker_driver) = worker_relay::rt::worker(worker_sock, FuturesTimer, worker);
    let sp = pool.spawner();
    sp.spawn_local(async move {
        let _ = relay_driver.await;
    })
    .unwrap();
    sp.spawn_local(async move {
        let _ = worker_driver.await;
    })
    .unwrap();
    (handle, incoming)
}
