//! Issue 42: the requests a worker has read together are answered in
//! writes of a few answers each: the first answers leave before the last
//! is made (the relay works on them meanwhile), and yet not one write per
//! answer. On one thread, over an in-memory socket that counts the answers
//! each flush carries.

use bytes::Bytes;
use futures::channel::mpsc;
use futures::{Sink, Stream, StreamExt};
use http::Response;
use http_body_util::Full;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use worker_relay::frame::Message;
use worker_relay::proto::WorkerConfig;
use worker_relay_hyper::tunnel::{self, TunnelBody};

/// The answers started since the last flush, and what each flush carried.
#[derive(Default)]
struct Log {
    unflushed: usize,
    flushes: Vec<usize>,
}

/// The worker's end of a WebSocket: the relay's messages from a channel;
/// what the worker sends, counted.
struct Counting {
    from_relay: mpsc::UnboundedReceiver<Message>,
    log: Arc<Mutex<Log>>,
}

impl Stream for Counting {
    type Item = Result<Message, Infallible>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.from_relay.poll_next_unpin(cx).map(|m| m.map(Ok))
    }
}

impl Sink<Message> for Counting {
    type Error = Infallible;
    fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn start_send(self: Pin<&mut Self>, m: Message) -> Result<(), Infallible> {
        if let Message::Text(t) = &m {
            if t.contains(r#""type":"response""#) {
                self.log.lock().unwrap().unflushed += 1;
            }
        }
        Ok(())
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        let mut log = self.log.lock().unwrap();
        if log.unflushed > 0 {
            let n = std::mem::take(&mut log.unflushed);
            log.flushes.push(n);
        }
        Poll::Ready(Ok(()))
    }
    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
}

const REQUESTS: usize = 20;

#[tokio::test(flavor = "current_thread")]
async fn answers_ready_at_once_leave_a_few_per_write() {
    let (to_worker, from_relay) = mpsc::unbounded();
    // Twenty body-less requests, all there before the worker reads.
    for id in 1..=REQUESTS {
        let request = format!(
            r#"{{"type":"request","id":{id},"method":"GET","path":"/now","query":"","headers":[]}}"#
        );
        to_worker.unbounded_send(Message::Text(request)).unwrap();
        let end = format!(r#"{{"type":"end","id":{id}}}"#);
        to_worker.unbounded_send(Message::Text(end)).unwrap();
    }
    let log = Arc::new(Mutex::new(Log::default()));
    let socket = Counting {
        from_relay,
        log: log.clone(),
    };
    let service = tower::service_fn(|_req: http::Request<TunnelBody>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"at once"))))
    });
    let served = tokio::spawn(tunnel::serve(socket, WorkerConfig::default(), service));
    // No clock: each yield lets the worker's task run (on this one thread);
    // it needs a handful, the bound only ends a hang.
    let mut done = false;
    for _ in 0..100_000 {
        if log.lock().unwrap().flushes.iter().sum::<usize>() == REQUESTS {
            done = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    let flushes = log.lock().unwrap().flushes.clone();
    assert!(done, "not all answered: {flushes:?}");
    // A few per write: the first ones did not wait for the last one.
    assert!(
        flushes.iter().all(|&n| n <= 4),
        "answers per write: {flushes:?}"
    );
    // And not one write each.
    assert!(
        flushes.len() <= REQUESTS / 4 + 1,
        "answers per write: {flushes:?}"
    );
    served.abort();
    drop(to_worker);
}
