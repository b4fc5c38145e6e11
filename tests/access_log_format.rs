//! Issue 39: the access log's `duration_ms` is milliseconds to the
//! microsecond (at most 3 decimals), not a float's noise
//! (`0.29422299999999996`), in text and, as a number, in JSON.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use std::io::Write;
use std::sync::{Arc, Mutex};
use tracing_subscriber::layer::SubscriberExt;
use worker_relay::connect::{Token, TokenTable, WorkerId};
use worker_relay_hyper::gateway::{Gateway, ACCESS_TARGET};
use worker_relay_hyper::server::{serve, ServerConfig};

/// What the subscriber wrote.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The value of `duration_ms=` in a text line.
fn text_duration(line: &str) -> &str {
    let rest = line.split("duration_ms=").nth(1).expect("duration_ms");
    rest.split_whitespace().next().unwrap()
}

/// Milliseconds with at most 3 decimals.
fn is_to_the_microsecond(v: &str) -> bool {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.len() <= 3
        && frac.bytes().all(|b| b.is_ascii_digit())
}

#[test]
fn durations_are_milliseconds_to_the_microsecond() {
    let (text, json) = (Sink::default(), Sink::default());
    let (t, j) = (text.clone(), json.clone());
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || t.clone()),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .json()
                .flatten_event(true)
                .with_writer(move || j.clone()),
        );
    // One thread: the access line is logged on the server's task, under
    // this thread's subscriber.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    const N: usize = 20;
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let mut table = TokenTable::new();
            table
                .insert(
                    WorkerId::new("abc").unwrap(),
                    Token::new("ct-0123456789abcdef0123456789abcdef").unwrap(),
                )
                .unwrap();
            let relay = Gateway::builder(table).build();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(serve(listener, relay.service(), ServerConfig::default()));
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .unwrap();
            tokio::spawn(conn);
            for _ in 0..N {
                // An unknown worker: the gateway answers 404 itself.
                let req = http::Request::get("/w/nobody/x")
                    .header("host", "relay")
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                let resp = sender.send_request(req).await.unwrap();
                assert_eq!(resp.status(), 404);
                resp.into_body().collect().await.unwrap();
            }
            // The last line is written when its response is over: a few
            // turns of this thread's scheduler.
            for _ in 0..100 {
                if text.0.lock().unwrap().split(|&b| b == b'\n').count() > N {
                    break;
                }
                tokio::task::yield_now().await;
            }
        })
    });
    let text = String::from_utf8(text.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("duration_ms="))
        .collect();
    assert_eq!(lines.len(), N, "{text}");
    for line in &lines {
        let d = text_duration(line);
        assert!(is_to_the_microsecond(d), "duration_ms={d} in {line}");
    }
    let json = String::from_utf8(json.0.lock().unwrap().clone()).unwrap();
    let events: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &serde_json::Value| e["target"] == ACCESS_TARGET)
        .collect();
    assert_eq!(events.len(), N, "{json}");
    for e in &events {
        let d = &e["duration_ms"];
        assert!(d.is_number(), "a number: {e}");
        assert!(is_to_the_microsecond(&d.to_string()), "{e}");
    }
}
