//! Issue 42, third part: the access line names the worker (moved into it,
//! not copied) however the request ends: answered, and when the caller
//! leaves before the worker's head (499, `caller_gone`).
//!
//! Alone in its test binary: `tracing`'s interest in a call site is cached
//! for the whole process, so a test of another thread that reaches the
//! access line's call site first, while this test's scoped subscriber is
//! being registered, can leave it switched off (the lines went missing in
//! CI when this was a unit test beside 39 others).

#[path = "common/mem.rs"]
#[allow(dead_code)]
mod mem;

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, StatusCode};
use http_body_util::Empty;
use std::sync::{Arc, Mutex};
use tower::Service;
use worker_relay::connect::{TokenTable, WorkerId};
use worker_relay::frame::Message;
use worker_relay_hyper::gateway::{Gateway, ACCESS_TARGET};

/// What the subscriber wrote.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn get(worker: &str) -> Request<Empty<Bytes>> {
    Request::get(format!("/w/{worker}/"))
        .body(Empty::new())
        .unwrap()
}

#[tokio::test]
async fn the_access_line_names_the_worker_when_the_caller_leaves() {
    let lines = Lines::default();
    let writer = lines.clone();
    let _log = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || writer.clone())
            .finish(),
    );
    let gateway = Gateway::builder(TokenTable::parse("a ct-a-000000000000000").unwrap()).build();
    let (relay_side, mut worker) = mem::socket_pair();
    let attached = tokio::spawn({
        let gateway = gateway.clone();
        async move {
            gateway
                .attach(WorkerId::new("a").unwrap(), relay_side)
                .await
        }
    });
    for _ in 0..10_000 {
        if gateway.is_connected("a") {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(gateway.is_connected("a"), "the worker never connected");
    // The caller's request reaches the worker, which never answers; then
    // the caller leaves.
    let mut call = Box::pin(gateway.forward().call(get("a")));
    let request = tokio::select! {
        biased;
        m = worker.next() => m.expect("the request frame").expect("a message"),
        _ = &mut call => panic!("answered without the worker"),
    };
    assert!(
        matches!(&request, Message::Text(t) if t.contains("\"request\"")),
        "{request:?}"
    );
    drop(call);
    // An unknown worker's line says so.
    let resp = gateway.forward().call(get("zz")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    drop(resp);
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let access: Vec<&str> = text.lines().filter(|l| l.contains(ACCESS_TARGET)).collect();
    assert_eq!(access.len(), 2, "{text}");
    for want in [
        "worker=a ",
        "status=499 ",
        "end=caller_gone ",
        "path=/w/a/ ",
    ] {
        assert!(access[0].contains(want), "{want} in {}", access[0]);
    }
    for want in ["worker=unknown ", "status=404 ", "end=answered "] {
        assert!(access[1].contains(want), "{want} in {}", access[1]);
    }
    attached.abort();
}
