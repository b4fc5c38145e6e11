//! Issue 39: a `Tunnel` that cannot dial retried in silence unless the
//! program had installed a `tracing` subscriber. `Tunnel::on_event` tells
//! the program each dial failure (and why), connection and wait.

#[path = "net/closed_port.rs"]
mod closed_port;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc;
use worker_relay::connect::{BackoffConfig, Token, TokenTable};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody, TunnelEnd, TunnelEvent};

const TOKEN: &str = "ct-abc-000000000000";

fn app() -> impl tower::Service<
    Request<TunnelBody>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(|_: Request<TunnelBody>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
    })
}

async fn next(events: &mut mpsc::UnboundedReceiver<TunnelEvent>) -> TunnelEvent {
    tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("no event within 10 s")
        .expect("the tunnel ended")
}

#[tokio::test]
async fn a_tunnel_that_cannot_dial_reports_each_failure() {
    let port = closed_port::closed_port();
    let (tx, mut events) = mpsc::unbounded_channel();
    let backoff = BackoffConfig::builder()
        .initial(Duration::from_millis(10))
        .max(Duration::from_millis(20))
        .build()
        .unwrap();
    let tunnel = Tunnel::new(
        format!("ws://127.0.0.1:{port}/connect"),
        Token::new(TOKEN).ok(),
    )
    .backoff(backoff)
    .on_event(move |e| {
        let _ = tx.send(e);
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(tunnel.run_until(
        app(),
        async {
            let _ = stopped.await;
        },
        Duration::ZERO,
    ));
    // Two rounds: each failure says why, then how long the tunnel waits.
    for _ in 0..2 {
        match next(&mut events).await {
            TunnelEvent::DialFailed(e) => {
                assert!(!e.verdict().is_final(), "{e}");
                assert!(
                    e.cause()
                        .contains(&format!("connecting to 127.0.0.1:{port}")),
                    "{e}"
                );
                assert!(!e.to_string().contains(TOKEN));
            }
            other => panic!("{other:?}"),
        }
        match next(&mut events).await {
            TunnelEvent::Reconnecting(wait) => assert!(wait <= Duration::from_millis(20)),
            other => panic!("{other:?}"),
        }
    }
    stop.send(()).unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), task).await;
    assert_eq!(end.unwrap().unwrap(), TunnelEnd::Stopped);
}

#[tokio::test]
async fn a_tunnel_reports_its_connection_and_its_end() {
    let gateway = Gateway::new(TokenTable::parse(&format!("abc {TOKEN}")).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    let (tx, mut events) = mpsc::unbounded_channel();
    let tunnel =
        Tunnel::new(format!("ws://{addr}/connect"), Token::new(TOKEN).ok()).on_event(move |e| {
            let _ = tx.send(e);
        });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(tunnel.run_until(
        app(),
        async {
            let _ = stopped.await;
        },
        Duration::from_secs(1),
    ));
    assert!(matches!(next(&mut events).await, TunnelEvent::Connected));
    stop.send(()).unwrap();
    match next(&mut events).await {
        TunnelEvent::Disconnected(why) => assert!(why.contains("1001"), "{why}"),
        other => panic!("{other:?}"),
    }
    let end = tokio::time::timeout(Duration::from_secs(10), task).await;
    assert_eq!(end.unwrap().unwrap(), TunnelEnd::Stopped);
}
