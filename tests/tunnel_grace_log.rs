//! Issue 39: a worker's drain cut by its grace logs how many requests it
//! cut with the noun agreeing (`1 request cut`, not `1 requests cut`).

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use std::convert::Infallible;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower::Service;
use worker_relay::connect::{Token, TokenTable};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody};

const TOKEN: &str = "ct-abc-000000000000";

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

#[test]
fn one_request_cut_is_one_request() {
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // One thread: relay, worker and app all log under this thread's
    // subscriber.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let gateway = Gateway::new(TokenTable::parse(&format!("abc {TOKEN}")).unwrap());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
            let seen = Arc::new(AtomicUsize::new(0));
            let counted = seen.clone();
            // An app that never answers within the test.
            let app = tower::service_fn(move |_req: Request<TunnelBody>| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    tokio::time::sleep(Duration::from_secs(600)).await;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("late"))))
                }
            });
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let tunnel = Tunnel::new(format!("ws://{addr}/connect"), Token::new(TOKEN).ok());
            let worker = tokio::spawn(tunnel.run_until(
                app,
                async {
                    let _ = stopped.await;
                },
                Duration::from_millis(200),
            ));
            let end = Instant::now() + Duration::from_secs(10);
            while !gateway.is_connected("abc") {
                assert!(Instant::now() < end, "the worker did not connect");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let mut service = gateway.service();
            let req = Request::get("/w/abc/slow")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let call = tokio::spawn(async move { service.call(req).await });
            while seen.load(Ordering::SeqCst) == 0 {
                assert!(Instant::now() < end, "the request never reached the app");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let _ = stop.send(());
            let ended = tokio::time::timeout(Duration::from_secs(30), worker).await;
            assert!(ended.is_ok(), "the drain was not bounded by its grace");
            call.abort();
        })
    });
    let text = String::from_utf8_lossy(&sink.0.lock().unwrap()).into_owned();
    let line = text.lines().find(|l| l.contains("grace period over"));
    assert!(
        line.is_some_and(|l| l.contains(": 1 request cut")),
        "{text}"
    );
}
