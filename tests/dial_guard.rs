//! Issue 39, the worker's dial: a connect token never goes over plain
//! `ws://` to a host that is not loopback unless the program allows it
//! (the check was the worker example's alone; `ws::Dialer` and `Tunnel`
//! sent it anywhere), and settings at their extremes (`Duration::MAX`, a
//! read buffer of `usize::MAX`) neither panic nor break the dial.

#[path = "net/closed_port.rs"]
mod closed_port;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tower::Service;
use worker_relay::connect::{Refused, Token, TokenTable, Verdict, WorkerHandshake};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody, TunnelEnd};
use worker_relay_hyper::ws::{self, Dialer};

use closed_port::closed_port;

const TOKEN: &str = "ct-abc-000000000000";

fn with_token() -> WorkerHandshake {
    WorkerHandshake::new(Token::new(TOKEN).ok())
}

async fn relay() -> (SocketAddr, Gateway) {
    let gateway = Gateway::new(TokenTable::parse(&format!("abc {TOKEN}")).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    (addr, gateway)
}

fn assert_cleartext_refusal(e: &ws::DialError) {
    match e.verdict() {
        Verdict::Refused(Refused::InvalidUrl(why)) => {
            assert!(why.contains("in the clear to relay.invalid"), "{why}")
        }
        other => panic!("not a final refusal: {other:?} ({e})"),
    }
    assert!(!e.cause().contains("DNS"), "{e}");
    assert!(!e.to_string().contains(TOKEN), "{e}");
}

#[tokio::test]
async fn a_token_over_plain_ws_to_a_host_that_is_not_loopback_is_refused_before_any_lookup() {
    let url = "ws://relay.invalid/connect";
    // Refused before any lookup (a lookup of `.invalid` fails, and would
    // say "DNS"), so before any connection.
    let e = Dialer::new().dial(url, &with_token()).await.unwrap_err();
    assert_cleartext_refusal(&e);
    let e = ws::dial(url, &with_token(), ws::DIAL_TIMEOUT)
        .await
        .unwrap_err();
    assert_cleartext_refusal(&e);
    assert_cleartext_refusal(&Dialer::new().check(url, true).unwrap_err());
    assert!(!Dialer::new().allows_cleartext_token());

    // Allowed explicitly, the dial goes on (and fails at the lookup).
    let open = Dialer::new().allow_cleartext_token(true);
    assert!(open.allows_cleartext_token());
    let target = open.check(url, true).unwrap();
    assert_eq!(target.host, "relay.invalid");
    let e = tokio::time::timeout(Duration::from_secs(30), open.dial(url, &with_token()))
        .await
        .expect("the lookup of a .invalid name did not end")
        .unwrap_err();
    assert!(!e.verdict().is_final(), "{e}");
    assert!(e.cause().contains("DNS lookup of relay.invalid"), "{e}");

    // No token, nothing secret to send: allowed; and wss:// always is.
    assert!(Dialer::new().check(url, false).is_ok());
    assert!(Dialer::new()
        .check("wss://relay.invalid/connect", true)
        .is_ok());
}

#[tokio::test]
async fn a_token_over_plain_ws_to_loopback_is_allowed() {
    let (addr, gateway) = relay().await;
    for host in ["127.0.0.1", "localhost"] {
        let url = format!("ws://{host}:{}/connect", addr.port());
        assert!(Dialer::new().check(&url, true).unwrap().is_loopback());
        let socket = Dialer::new().dial(&url, &with_token()).await;
        assert!(socket.is_ok(), "{url}: {:?}", socket.err());
        drop(socket);
    }
    // A closed loopback port is a network error to retry, not a refusal.
    let url = format!("ws://127.0.0.1:{}/connect", closed_port());
    let e = Dialer::new().dial(&url, &with_token()).await.unwrap_err();
    assert!(!e.verdict().is_final(), "{e}");
    drop(gateway);
}

#[tokio::test]
async fn a_tunnel_refuses_to_send_its_token_in_the_clear() {
    let app = tower::service_fn(|_: Request<TunnelBody>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
    });
    let tunnel = Tunnel::new("ws://relay.invalid/connect", Token::new(TOKEN).ok());
    let end = tokio::time::timeout(Duration::from_secs(10), tunnel.run(app))
        .await
        .expect("the tunnel dialled on");
    match end {
        Refused::InvalidUrl(why) => assert!(why.contains("in the clear"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_dial_time_limit_of_duration_max_is_no_limit_not_a_panic() {
    let url = format!("ws://127.0.0.1:{}/connect", closed_port());
    let (dialer, handshake) = (Dialer::new().timeout(Duration::MAX), with_token());
    let dial = dialer.dial(&url, &handshake);
    let e = tokio::time::timeout(Duration::from_secs(10), dial)
        .await
        .expect("a closed port answers at once")
        .unwrap_err();
    assert!(e.cause().contains("connecting to 127.0.0.1"), "{e}");
}

/// A tunnel with these settings connects, serves a request through the
/// relay, and drains when told to.
async fn serves_with(dialer: Dialer, dial_timeout: Duration, grace: Duration) {
    let (addr, gateway) = relay().await;
    let app = tower::service_fn(|_: Request<TunnelBody>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ok"))))
    });
    let tunnel = Tunnel::new(format!("ws://{addr}/connect"), Token::new(TOKEN).ok())
        .dialer(dialer)
        .dial_timeout(dial_timeout);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(tunnel.run_until(
        app,
        async {
            let _ = stopped.await;
        },
        grace,
    ));
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected("abc") {
        assert!(!task.is_finished(), "the tunnel ended: {:?}", task.await);
        assert!(
            tokio::time::Instant::now() < end,
            "the worker did not connect"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let req = Request::get("/w/abc/")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), gateway.forward().call(req))
        .await
        .expect("no answer")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "ok");
    // The drain (whatever the grace) waits for nothing in flight.
    stop.send(()).unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the drain did not end");
    assert_eq!(end.expect("the tunnel panicked"), TunnelEnd::Stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_buffer_of_usize_max_is_clamped_not_a_panic() {
    serves_with(
        Dialer::new().read_buffer(usize::MAX),
        ws::DIAL_TIMEOUT,
        Duration::ZERO,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnels_dial_timeout_of_duration_max_is_no_limit() {
    serves_with(Dialer::new(), Duration::MAX, Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_grace_of_duration_max_is_no_limit() {
    serves_with(Dialer::new(), ws::DIAL_TIMEOUT, Duration::MAX).await;
}
