//! Issue 39, the server: an idle HTTP/2 connection is closed; a graceful
//! stop serves the connection accepted just before it; no configuration
//! panics; TLS files cut short or with a v1 certificate are refused with
//! the right error.

#[path = "tls/support.rs"]
mod tls;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use worker_relay_hyper::server::{serve_with_shutdown, CertError, Intake, ServerConfig, ServerTls};

/// Far longer than anything here takes on a loaded machine: only a hang
/// (the bug) reaches it.
const HANG: Duration = Duration::from_secs(30);

// The tests that wait for time to pass run on tokio's paused clock: the
// server, the app and the clients are all tasks of the test's one runtime
// (on loopback sockets), so the clock moves on only when all of them wait,
// straight to the next deadline.

type Body = Full<Bytes>;

/// Answers "ok"; `/slow` after 1 s; `/held` once `release` says so (and
/// tells `arrived` first).
#[derive(Clone)]
struct App {
    arrived: mpsc::UnboundedSender<()>,
    release: std::sync::Arc<tokio::sync::Semaphore>,
}

impl App {
    fn new() -> (App, mpsc::UnboundedReceiver<()>) {
        let (arrived, rx) = mpsc::unbounded_channel();
        let release = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        (App { arrived, release }, rx)
    }
}

impl<B: Send + 'static> tower::Service<Request<B>> for App {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Body>, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let app = self.clone();
        Box::pin(async move {
            let _ = app.arrived.send(());
            match req.uri().path() {
                "/slow" => tokio::time::sleep(Duration::from_secs(1)).await,
                "/held" => drop(app.release.acquire().await),
                _ => {}
            }
            Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
        })
    }
}

async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// An HTTP/1.1 request on `stream` (`Connection: close`): what came back.
async fn http1(mut stream: TcpStream, path: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(HANG, stream.read_to_end(&mut answer)).await;
    read.expect("no answer").ok();
    String::from_utf8_lossy(&answer).into_owned()
}

async fn get(addr: SocketAddr, path: &str) -> String {
    http1(TcpStream::connect(addr).await.unwrap(), path).await
}

// Item 1: HTTP/2 connections closed for idleness.

#[tokio::test(start_paused = true)]
async fn an_idle_http2_connection_is_closed_and_a_busy_one_is_not() {
    let (listener, addr) = listener().await;
    let (app, _arrived) = App::new();
    let config = ServerConfig::default().h2_idle_timeout(Duration::from_millis(200));
    tokio::spawn(worker_relay_hyper::server::serve(listener, app, config));

    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let mut conn = tokio::spawn(conn);
    // A stream open for longer than the idle timeout keeps the connection.
    let req = Request::get("http://localhost/slow")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    assert!(!conn.is_finished());
    // Then idle: closed by the server (GOAWAY), which ends the client's
    // connection cleanly. Before the fix it stayed open for ever (pings).
    let ended = tokio::time::timeout(HANG, &mut conn).await;
    let ended = ended.expect("the idle HTTP/2 connection was never closed");
    assert!(ended.unwrap().is_ok(), "not a graceful close");
}

// Item 4: the drain's arrivals in the library.

#[tokio::test(start_paused = true)]
async fn a_connection_accepted_just_before_the_stop_gets_its_answer() {
    let (listener, addr) = listener().await;
    let (app, _arrived) = App::new();
    let intake = Intake::new();
    let config = ServerConfig::default()
        .arrival_wait(HANG)
        .intake(intake.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(serve_with_shutdown(listener, app, config, async {
        let _ = stopped.await;
    }));
    let early = TcpStream::connect(addr).await.unwrap();
    // A later connection answered: the accept loop has taken the early
    // one (the listen queue is first in, first out).
    assert!(get(addr, "/").await.starts_with("HTTP/1.1 200"));
    stop.send(()).unwrap();
    // Its request comes a moment after the stop (for the order only:
    // sooner would pass too, also before the fix).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let closed_before_it_came = intake.is_closed();
    let answer = http1(early, "/").await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the connection accepted before the stop was dropped: {answer:?}"
    );
    assert!(!closed_before_it_came);
    tokio::time::timeout(HANG, &mut server)
        .await
        .expect("the stop never ended")
        .unwrap();
    assert!(intake.is_closed());
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_holds_the_stop_no_longer_than_the_arrival_wait() {
    let (listener, addr) = listener().await;
    let (app, _arrived) = App::new();
    let intake = Intake::new();
    let config = ServerConfig::default()
        .arrival_wait(Duration::from_millis(200))
        .intake(intake.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_with_shutdown(listener, app, config, async {
        let _ = stopped.await;
    }));
    let _silent = TcpStream::connect(addr).await.unwrap();
    assert!(get(addr, "/").await.starts_with("HTTP/1.1 200"));
    stop.send(()).unwrap();
    // The header-read timeout (10 s) would end it too; the arrival wait
    // comes first. Bounded generously: a hang is the failure.
    tokio::time::timeout(HANG, intake.closed())
        .await
        .expect("the intake never closed");
    tokio::time::timeout(HANG, server)
        .await
        .expect("the stop never ended")
        .unwrap();
}

// Item 5: no panics from configuration.

#[tokio::test]
async fn the_largest_limits_serve_without_a_panic() {
    let (listener, addr) = listener().await;
    let (app, _arrived) = App::new();
    let mut config = ServerConfig::default();
    config.max_connections = usize::MAX;
    config.header_read_timeout = Duration::MAX;
    config.send_timeout = Duration::MAX;
    config.h2_idle_timeout = Duration::MAX;
    config.arrival_wait = Duration::MAX;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_with_shutdown(listener, app, config, async {
        let _ = stopped.await;
    }));
    assert!(get(addr, "/").await.starts_with("HTTP/1.1 200"));
    let answer = get(addr, "/").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    stop.send(()).unwrap();
    let ended = tokio::time::timeout(HANG, server).await;
    assert!(ended.expect("the stop never ended").is_ok(), "it panicked");
    assert!(
        ServerConfig::default()
            .max_connections(usize::MAX)
            .max_connections
            <= u32::MAX as usize
    );
}

/// Reads one answer of "ok" (the app's body) from a kept-alive connection.
async fn answer(stream: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"\r\n\r\nok") {
        let n = tokio::time::timeout(HANG, stream.read(&mut buf))
            .await
            .expect("no answer")
            .unwrap();
        assert!(n > 0, "closed before the answer: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(start_paused = true)]
async fn each_head_on_a_kept_alive_connection_has_a_header_timeout_of_its_own() {
    let (listener, addr) = listener().await;
    let (app, _arrived) = App::new();
    let config = ServerConfig::default().header_read_timeout(Duration::from_secs(2));
    tokio::spawn(worker_relay_hyper::server::serve(listener, app, config));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // Three requests 1.5 s apart: each within its own 2 s, the last well
    // past the first one's deadline (the server keeps one timer per
    // connection and moves it: it must move).
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let answer = answer(&mut stream).await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "request {i}: {answer:?}"
        );
    }
    // Then half a head, and silence: closed at the timeout, 2 s after the
    // last answer (the paused clock moves only to deadlines).
    let silent = tokio::time::Instant::now();
    stream.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(HANG, stream.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "still open after {HANG:?}");
    assert_eq!(silent.elapsed(), Duration::from_secs(2), "{rest:?}");
}

#[tokio::test]
async fn an_endless_header_read_timeout_serves_without_a_panic() {
    let (listener, addr) = listener().await;
    let (app, _arrived) = App::new();
    // hyper adds it to the clock: `Instant + Duration::MAX` panicked in
    // every connection's task.
    let config = ServerConfig::default().header_read_timeout(Duration::MAX);
    tokio::spawn(worker_relay_hyper::server::serve(listener, app, config));
    let answer = get(addr, "/").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
}

#[tokio::test(start_paused = true)]
async fn a_cap_above_u32_still_waits_for_the_open_connections() {
    let (listener, addr) = listener().await;
    let (app, mut arrived) = App::new();
    let release = app.release.clone();
    let mut config = ServerConfig::default();
    // `as u32` made this 0: the stop waited for no connection.
    config.max_connections = 1 << 32;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(serve_with_shutdown(listener, app, config, async {
        let _ = stopped.await;
    }));
    let held = tokio::spawn(get(addr, "/held"));
    arrived.recv().await.unwrap();
    stop.send(()).unwrap();
    // The request is held: the server cannot have ended (the bound only
    // gives the bug time to show).
    let early = tokio::time::timeout(Duration::from_millis(500), &mut server).await;
    assert!(early.is_err(), "the stop ended with a request in flight");
    release.add_permits(1);
    assert!(held.await.unwrap().starts_with("HTTP/1.1 200"));
    tokio::time::timeout(HANG, server)
        .await
        .expect("the stop never ended")
        .unwrap();
}

// Items 2 and 3: TLS files.

#[test]
fn a_reload_refuses_a_chain_cut_short_and_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let root = tls::Ca::new("root");
    let leaf = root.leaf(&["localhost"]);
    let whole = format!("{}{}", leaf.cert_pem, root.pem());
    std::fs::write(&cert, &whole).unwrap();
    std::fs::write(&key, &leaf.key_pem).unwrap();
    let tls = ServerTls::from_pem_files(&cert, &key).unwrap();
    assert_eq!(tls.chain().len(), 2);

    // The intermediate caught half written.
    let cut = &whole[..leaf.cert_pem.len() + root.pem().len() / 2];
    std::fs::write(&cert, cut).unwrap();
    let err = tls.reload().unwrap_err();
    assert!(matches!(err, CertError::Pem { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("cert.pem") && message.contains("END CERTIFICATE"),
        "{message}"
    );
    assert_eq!(tls.chain().len(), 2, "the old chain must stay");
    let err = ServerTls::from_pem_files(&cert, &key).unwrap_err();
    assert!(matches!(err, CertError::Pem { .. }), "{err:?}");
}

/// `openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes
/// -subj /CN=localhost` then `openssl x509 -req -signkey v1.key -days
/// 36500` with no `-extfile`: an X.509 v1 certificate.
const V1_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBJDCBywIUPLEHeIuWGZkgtX1pWo9lTBa6W+8wCgYIKoZIzj0EAwIwFDESMBAG
A1UEAwwJbG9jYWxob3N0MCAXDTI2MTIwNjAwNDAzOVoYDzIxMjYxMTEyMDA0MDM5
WjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNC
AARjH85TmoRNg+UTK6n4LWmseR436CrzmZ/U8t1cIs+IMTc15ZceBjWK30OBRH9T
COo9sQ7nRIDHiRg5ilIlbfqFMAoGCCqGSM49BAMCA0gAMEUCIEeSTtigVFXzG/OF
gtPu/3lXBiAPG7mWUsXRXTEHMFmxAiEAtCw2JKwtJe23Tctlqx1aTZDcKE4JV0h/
7TKPvHNIcEA=
-----END CERTIFICATE-----
";
/// Its key (a throwaway made for this test).
const V1_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgN0zZiPOQZJzVyjg6
0Z02ewo4uMGnq5qbbL/KyR+3cxahRANCAARjH85TmoRNg+UTK6n4LWmseR436Crz
mZ/U8t1cIs+IMTc15ZceBjWK30OBRH9TCOo9sQ7nRIDHiRg5ilIlbfqF
-----END PRIVATE KEY-----
";

#[test]
fn a_v1_certificate_is_a_certificate_error_that_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, V1_CERT).unwrap();
    std::fs::write(&key, V1_KEY).unwrap();
    let err = ServerTls::from_pem_files(&cert, &key).unwrap_err();
    assert!(matches!(err, CertError::Certificate { .. }), "{err:?}");
    let message = err.to_string();
    assert!(!message.contains("key does not fit"), "{message}");
    for part in ["cert.pem", "not X.509 v3", "subjectAltName", "-extfile"] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
}

#[test]
fn a_key_of_another_certificate_is_still_a_key_error() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let root = tls::Ca::new("root");
    let (a, b) = (root.leaf(&["localhost"]), root.leaf(&["localhost"]));
    std::fs::write(&cert, &a.cert_pem).unwrap();
    std::fs::write(&key, &b.key_pem).unwrap();
    let err = ServerTls::from_pem_files(&cert, &key).unwrap_err();
    assert!(matches!(err, CertError::Key(_)), "{err:?}");
    assert!(err.to_string().contains("the key does not fit"));
}
