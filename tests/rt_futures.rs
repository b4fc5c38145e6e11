//! The async layer driven by `futures::executor` (no tokio anywhere), over an
//! in-memory socket made of two channels.

mod common;

use bytes::Bytes;
use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use futures::{SinkExt, StreamExt};
use std::time::Duration;
use worker_relay::frame::{Headers, RequestHead, ResponseHead};
use worker_relay::proto::{RelayConfig, WorkerConfig};
use worker_relay::rt::{self, BodyError, RelayError};

fn head(method: &str, path: &str) -> RequestHead {
    RequestHead::new(method, path, "", Headers::new()).unwrap()
}

/// A tiny app: /echo streams the body back, /fail-after sends a little then
/// fails, /health answers at once, anything else fails before a response.
async fn serve(mut incoming: rt::Incoming) {
    let mut pool = Vec::new();
    while let Some(req) = incoming.next().await {
        pool.push(async move {
            let rt::IncomingRequest {
                head,
                mut body,
                responder,
                ..
            } = req;
            match head.path() {
                "/echo" => {
                    let mut sink = responder
                        .respond(ResponseHead::new(200, Headers::new()).unwrap())
                        .unwrap();
                    while let Some(piece) = body.next().await {
                        sink.send(piece.unwrap()).await.unwrap();
                    }
                    sink.close().await.unwrap();
                }
                "/health" => {
                    let mut sink = responder
                        .respond(ResponseHead::new(200, Headers::new()).unwrap())
                        .unwrap();
                    sink.send(Bytes::from_static(b"ok")).await.unwrap();
                    sink.close().await.unwrap();
                }
                "/fail-after" => {
                    let mut sink = responder
                        .respond(ResponseHead::new(200, Headers::new()).unwrap())
                        .unwrap();
                    sink.send(Bytes::from_static(b"partial")).await.unwrap();
                    sink.flush().await.unwrap();
                    sink.fail();
                }
                _ => responder.fail(),
            }
        });
        // Serve them one after another; fine for this test.
        if let Some(f) = pool.pop() {
            f.await;
        }
    }
}

#[test]
fn echo_and_failures_on_futures_executor() {
    let mut pool = LocalPool::new();
    let (handle, incoming) = spawn_pair(&pool);
    let sp = pool.spawner();
    sp.spawn_local(serve(incoming)).unwrap();

    let h = handle.clone();
    pool.run_until(async move {
        // 5 MiB echo: the body goes up and comes back byte-exact.
        let body: Vec<u8> = (0..5 << 20).map(|i: u32| (i % 251) as u8).collect();
        let (mut sink, resp) = h.send_request(head("POST", "/echo")).unwrap();
        let upload = async {
            for piece in body.chunks(300_000) {
                sink.send(Bytes::copy_from_slice(piece)).await.unwrap();
            }
            sink.close().await.unwrap();
        };
        let download = async {
            let resp = resp.await.unwrap();
            assert_eq!(resp.head.status(), 200);
            let mut got = Vec::new();
            let mut b = resp.body;
            while let Some(p) = b.next().await {
                got.extend_from_slice(&p.unwrap());
            }
            got
        };
        let ((), got) = futures::join!(upload, download);
        assert!(got == body, "echo differs");

        let resp = h.send_empty(head("GET", "/health")).unwrap().await.unwrap();
        let got: Vec<Bytes> = resp.body.map(|r| r.unwrap()).collect().await;
        assert_eq!(got.concat(), b"ok");

        // Fails before the response: 500 with a short text body.
        let resp = h
            .send_empty(head("GET", "/fail-before"))
            .unwrap()
            .await
            .unwrap();
        assert_eq!(resp.head.status(), 500);

        // Fails after: the body stream ends with an error, not a clean end.
        let resp = h
            .send_empty(head("GET", "/fail-after"))
            .unwrap()
            .await
            .unwrap();
        let items: Vec<Result<Bytes, BodyError>> = resp.body.collect().await;
        assert_eq!(items.last(), Some(&Err(BodyError::Aborted)));
    });

    // Closing the connection: a new request fails as the worker being gone.
    handle.close(worker_relay::frame::CloseCode::NORMAL, "bye");
    pool.run_until_stalled();
    assert!(matches!(
        handle.send_request(head("GET", "/health")),
        Err(RelayError::Open(_))
    ));
    let _ = Duration::ZERO;
}

/// Backpressure end to end: while the worker's app does not read, the relay's
/// request sink stops taking bytes (bounded memory on both sides); once the
/// app reads, everything flows and arrives intact.
#[test]
fn a_request_sink_is_not_ready_while_the_worker_app_does_not_read() {
    let mut pool = LocalPool::new();
    let (handle, mut incoming) = spawn_pair(&pool);
    let sp = pool.spawner();

    const TOTAL: usize = 64 << 20;
    let (mut sink, _resp) = handle.send_request(head("POST", "/slow")).unwrap();
    let accepted = std::rc::Rc::new(std::cell::Cell::new(0usize));
    let acc = accepted.clone();
    sp.spawn_local(async move {
        let piece = Bytes::from(vec![7u8; 256 << 10]);
        while acc.get() < TOTAL {
            sink.send(piece.clone()).await.unwrap();
            acc.set(acc.get() + piece.len());
        }
        sink.close().await.unwrap();
    })
    .unwrap();
    // The app takes the request but does not read its body yet.
    let req = pool.run_until(incoming.next()).unwrap();
    pool.run_until_stalled();
    let stuck_at = accepted.get();
    assert!(
        stuck_at < TOTAL / 2,
        "the sink kept taking bytes: {stuck_at}"
    );
    let rs = handle.stats();
    let ws = incoming.stats();
    assert!(
        ws.body_buffered_in <= 16 << 20,
        "worker holds {}",
        ws.body_buffered_in
    );
    assert!(rs.body_queued_out <= RelayConfig::default().max_queued() as u64);
    // Now the app reads: everything arrives.
    let mut body = req.body;
    let got = pool.run_until(async {
        let mut n = 0usize;
        while let Some(p) = body.next().await {
            n += p.unwrap().len();
        }
        n
    });
    assert_eq!(got, TOTAL);
    assert_eq!(accepted.get(), TOTAL);
    eprintln!("sink stopped after {stuck_at} bytes while the app did not read");
}

fn spawn_pair(pool: &LocalPool) -> (rt::RelayHandle, rt::Incoming) {
    common::mem::spawn_pair(pool, RelayConfig::default(), WorkerConfig::default())
}

/// Issue 13: an app answering HEAD with the Content-Length of the GET and no
/// body (as any HTTP server does) completes; so do 204 and 304.
#[test]
fn a_bodiless_answer_with_a_content_length_completes() {
    for (method, status) in [("HEAD", 200), ("GET", 204), ("GET", 304)] {
        let mut pool = LocalPool::new();
        let (handle, mut incoming) = spawn_pair(&pool);
        let resp = handle.send_empty(head(method, "/health")).unwrap();
        let req = pool.run_until(incoming.next()).unwrap();
        let headers = Headers::try_from_pairs([("content-length", "15")]).unwrap();
        let mut sink = req
            .responder
            .respond(ResponseHead::new(status, headers).unwrap())
            .unwrap();
        pool.run_until(sink.close())
            .expect("closing a bodiless response is not short of its length");
        let resp = pool.run_until(resp).unwrap();
        assert_eq!(resp.head.status(), status);
        let items: Vec<Result<Bytes, BodyError>> = pool.run_until(resp.body.collect());
        assert!(items.is_empty(), "{method} {status}: {items:?}");
    }
}

/// Issue 13: a request sink dropped before it is closed (the caller's body
/// failed) aborts the stream and resolves the response future, which would
/// otherwise wait forever.
#[test]
fn dropping_the_request_sink_unclosed_resolves_the_response() {
    let mut pool = LocalPool::new();
    let (handle, mut incoming) = spawn_pair(&pool);
    let (mut sink, resp) = handle.send_request(head("POST", "/sha256")).unwrap();
    pool.run_until(sink.send(Bytes::from_static(b"partial")))
        .unwrap();
    let req = pool.run_until(incoming.next()).unwrap();
    drop(sink);
    let got = pool.run_until(resp);
    assert!(
        matches!(got, Err(RelayError::RequestAborted)),
        "{:?}",
        got.err()
    );
    assert_eq!(RelayError::RequestAborted.status(), 400);
    // The worker's app is told its client has gone.
    let mut body = req.body;
    let items: Vec<Result<Bytes, BodyError>> = pool.run_until(async {
        let mut v = Vec::new();
        while let Some(i) = body.next().await {
            v.push(i);
        }
        v
    });
    assert_eq!(items.last(), Some(&Err(BodyError::ClientGone)));
    assert_eq!(handle.stats().streams_open, 0);
}
