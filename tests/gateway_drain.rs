//! Issue 25: `server::serve_with_shutdown` and `Gateway::drain` in
//! process: the request in flight finishes, new requests are answered 503,
//! the worker is closed with 1012 only once its stream is done, and the
//! grace period bounds a request that would not finish.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tower::Service;
use worker_relay::connect::{Token, TokenTable};
use worker_relay::frame::CloseCode;
use worker_relay_hyper::gateway::{Gateway, Presence};
use worker_relay_hyper::server::{serve_with_shutdown, ServerConfig};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody};

const TOKEN: &str = "ct-abc-000000000000";

/// A relay served until `stop` fires, and a worker whose app sleeps the
/// query's `ms` then answers "done".
async fn stack() -> (
    SocketAddr,
    Gateway,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let gateway = Gateway::new(TokenTable::parse(&format!("abc {TOKEN}")).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_with_shutdown(
        listener,
        gateway.service(),
        ServerConfig::default(),
        async {
            let _ = stopped.await;
        },
    ));
    let app = tower::service_fn(|req: Request<TunnelBody>| async move {
        let ms: u64 = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("ms="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("done"))))
    });
    let tunnel = Tunnel::new(format!("ws://{addr}/connect"), Token::new(TOKEN).ok());
    tokio::spawn(tunnel.run(app));
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected("abc") {
        assert!(Instant::now() < end, "the worker did not connect");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (addr, gateway, stop, server)
}

async fn get(addr: SocketAddr, target: &str) -> Result<(u16, Bytes), String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::get(target)
        .header("host", "relay")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, body.to_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_lets_the_request_in_flight_finish_and_then_closes_the_worker() {
    let (addr, gateway, stop, server) = stack().await;
    let mut news = gateway.subscribe();
    let long = tokio::spawn(async move { get(addr, "/w/abc/?ms=1500").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = stop.send(());
    let started = Instant::now();
    let draining = tokio::spawn({
        let gateway = gateway.clone();
        async move {
            gateway
                .drain(Duration::from_secs(10), CloseCode::SERVICE_RESTART)
                .await
        }
    });
    // New requests are refused meanwhile (straight to the service: the
    // listener is closed).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let req = Request::get("/w/abc/")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let refused = gateway.forward().call(req).await.unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert!(
        gateway.is_connected("abc"),
        "closed before its stream was done"
    );

    let (status, body) = long.await.unwrap().expect("the long request");
    assert_eq!((status, &body[..]), (200, &b"done"[..]));
    tokio::time::timeout(Duration::from_secs(10), draining)
        .await
        .expect("drained within 10 s")
        .unwrap();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1000), "{took:?}");
    assert!(!gateway.is_connected("abc"));
    let reason = loop {
        match news.try_recv() {
            Ok(Presence::Disconnected { reason, .. }) => break reason,
            Ok(_) => continue,
            Err(e) => panic!("no Disconnected news: {e}"),
        }
    };
    assert!(reason.contains("1012"), "{reason}");
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("serve_with_shutdown returned")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_period_bounds_a_request_that_would_not_finish() {
    let (addr, gateway, stop, _server) = stack().await;
    let long = tokio::spawn(async move { get(addr, "/w/abc/?ms=60000").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = stop.send(());
    let started = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(10),
        gateway.drain(Duration::from_millis(500), CloseCode::SERVICE_RESTART),
    )
    .await
    .expect("drained within 10 s");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(450), "{took:?}");
    assert!(!gateway.is_connected("abc"));
    // The cut request fails rather than hangs.
    let r = tokio::time::timeout(Duration::from_secs(10), long)
        .await
        .expect("the long request ended")
        .unwrap();
    assert!(!matches!(r, Ok((200, _))), "{r:?}");
}

/// A slow caller whose response waits in the overflow store when the drain
/// begins still gets all of it (closing a connection drops what its store
/// holds): the worker's connection is closed only once the stream is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_waits_for_a_slow_callers_overflowed_response() {
    const N: usize = 16 << 20;
    let gateway = Gateway::new(TokenTable::parse(&format!("abc {TOKEN}")).unwrap());
    let app = tower::service_fn(|_req: Request<TunnelBody>| async move {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(vec![7u8; N]))))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(worker_relay_hyper::server::serve(
        listener,
        gateway.service(),
        ServerConfig::default(),
    ));
    let tunnel = Tunnel::new(format!("ws://{addr}/connect"), Token::new(TOKEN).ok());
    tokio::spawn(tunnel.run(app));
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected("abc") {
        assert!(Instant::now() < end, "the worker did not connect");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let req = Request::get("/w/abc/")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = gateway.forward().call(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    // Read nothing until the whole response is in the relay, most of it in
    // the overflow store.
    let end = Instant::now() + Duration::from_secs(10);
    while gateway.stats("abc").map_or(0, |s| s.overflow_bytes) < (N as u64) / 2 {
        assert!(Instant::now() < end, "nothing overflowed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let draining = tokio::spawn({
        let gateway = gateway.clone();
        async move {
            gateway
                .drain(Duration::from_secs(20), CloseCode::SERVICE_RESTART)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut n = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the response failed");
        if let Ok(d) = frame.into_data() {
            n += d.len();
        }
    }
    assert_eq!(n, N);
    tokio::time::timeout(Duration::from_secs(10), draining)
        .await
        .expect("drained")
        .unwrap();
    assert!(!gateway.is_connected("abc"));
}

/// `reconnect_wait`: a request for a known worker that is not connected
/// waits for it to connect (and is served), or is answered 503 at the end
/// of the wait; zero answers at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_for_its_worker_to_reconnect() {
    let gateway = Gateway::builder(TokenTable::parse(&format!("abc {TOKEN}")).unwrap())
        .reconnect_wait(Duration::from_secs(2))
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(worker_relay_hyper::server::serve(
        listener,
        gateway.service(),
        ServerConfig::default(),
    ));
    // Nobody connects: 503 after the wait.
    let started = Instant::now();
    let req = Request::get("/w/abc/")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = gateway.forward().call(req).await.unwrap();
    assert_eq!(resp.status(), 503);
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        started.elapsed()
    );

    // The worker connects 300 ms into the wait: served.
    let waiting = tokio::spawn({
        let gateway = gateway.clone();
        async move {
            let req = Request::get("/w/abc/")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let resp = gateway.forward().call(req).await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.into_body().collect().await.unwrap().to_bytes())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let app = tower::service_fn(|_req: Request<TunnelBody>| async move {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("done"))))
    });
    let tunnel = Tunnel::new(format!("ws://{addr}/connect"), Token::new(TOKEN).ok());
    tokio::spawn(tunnel.run(app));
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("served within 5 s")
        .unwrap();
    assert_eq!((status, &body[..]), (200, &b"done"[..]));
}

/// Without a reconnect wait, a request for a worker that is not connected
/// is answered 503 at once: on paused time, where any wait at all (the
/// default 10 s, say) would move the clock.
#[tokio::test(start_paused = true)]
async fn without_a_reconnect_wait_a_request_is_503_at_once() {
    let quick = Gateway::builder(TokenTable::parse(&format!("abc {TOKEN}")).unwrap())
        .reconnect_wait(Duration::ZERO)
        .build();
    let started = tokio::time::Instant::now();
    let req = Request::get("/w/abc/")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(quick.forward().call(req).await.unwrap().status(), 503);
    assert_eq!(started.elapsed(), Duration::ZERO);
}
