//! Issue 24, the relay side: the relay example serving TLS (HTTPS callers
//! over HTTP/1.1 and HTTP/2, workers over `wss://`), its certificate
//! replaced on `SIGHUP`, and the accept loop's HTTP/2 with prior
//! knowledge, peer address and TLS handshake deadline.

#[path = "tls/client.rs"]
mod client;
#[path = "e2e/support.rs"]
mod support;
#[path = "tls/support.rs"]
mod tls;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use client::{client_config, empty, h2c, https, tls_connect, Body};
use futures_util::stream;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{example_bin, relay_process_tls, Proc, CONNECT_TOKEN, WORKER_TOKEN};
use tls::TlsFiles;
use worker_relay::connect::{Token, TokenTable};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::{serve, ServerConfig, ServerTls};
use worker_relay_hyper::tunnel::{Tunnel, TunnelBody};
use worker_relay_hyper::PeerAddr;

/// The worker example dialling `wss://localhost:port`, trusting `ca`.
fn wss_worker(port: u16, ca: &Path) -> Proc {
    let mut cmd = Command::new(example_bin("worker"));
    cmd.arg("--connect")
        .arg(format!("wss://localhost:{port}/connect"))
        .arg("--ca-file")
        .arg(ca)
        .env("STRATA_WORKER_CONNECT_TOKEN", CONNECT_TOKEN)
        .env("STRATA_WORKER_TOKEN", WORKER_TOKEN)
        .env("RUST_LOG", "info");
    Proc::spawn(cmd)
}

/// A CA and its certificate for `localhost` in files, the relay example
/// serving TLS with it, and the worker example connected over `wss://`.
struct TlsStack {
    files: TlsFiles,
    port: u16,
    relay: Proc,
    worker: Proc,
}

impl TlsStack {
    fn start() -> TlsStack {
        let files = TlsFiles::new();
        let (relay, port) = relay_process_tls(&files.cert, &files.key);
        let worker = wss_worker(port, &files.ca_file);
        assert!(
            relay.wait_log("worker abc connected", Duration::from_secs(20)),
            "the worker did not connect over wss://\n--- relay ---\n{}\n--- worker ---\n{}",
            relay.log(),
            worker.log()
        );
        TlsStack {
            files,
            port,
            relay,
            worker,
        }
    }

    fn addr(&self) -> std::net::SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    fn ca_pem(&self) -> String {
        self.files.ca.pem()
    }
}

/// `n` bytes of the tests' pattern (byte `i` is `i % 251`), in 1 MiB
/// pieces made as they are sent.
fn pattern_body(n: u64) -> Body {
    let pieces = stream::unfold(0u64, move |sent| async move {
        let size = (n - sent).min(1 << 20);
        let piece: Vec<u8> = (0..size).map(|i| ((sent + i) % 251) as u8).collect();
        (size > 0).then(|| {
            let frame: Result<_, Box<dyn std::error::Error + Send + Sync>> =
                Ok(Frame::data(Bytes::from(piece)));
            (frame, sent + size)
        })
    });
    StreamBody::new(pieces).boxed()
}

/// Reads `resp`'s body, checking each byte against the pattern; its length.
async fn check_pattern(resp: Response<hyper::body::Incoming>) -> u64 {
    let mut body = resp.into_body();
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("the body failed").into_data() {
            for (i, b) in data.iter().enumerate() {
                assert_eq!(*b, ((n + i as u64) % 251) as u8, "byte {}", n + i as u64);
            }
            n += data.len() as u64;
        }
    }
    n
}

fn uri(port: u16, h2: bool, path: &str) -> String {
    if h2 {
        format!("https://localhost:{port}{path}")
    } else {
        path.to_owned()
    }
}

/// `SIGHUP` makes the relay re-read its certificate: the next handshake
/// gets the new one, the worker's connection goes on, and a file that
/// cannot be served leaves the certificate as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_replaces_the_certificate_while_the_worker_stays_connected() {
    let s = TlsStack::start();
    let config = client_config(&s.ca_pem(), &[b"http/1.1"]);
    let (_, _, first) = tls_connect(s.addr(), config.clone()).await;

    let second = s.files.ca.leaf(&["localhost"]);
    s.files.write_leaf(&second);
    hup(&s.relay);
    assert!(
        s.relay
            .wait_log("reloaded the TLS certificate", Duration::from_secs(10)),
        "{}",
        s.relay.log()
    );
    let (_, _, now) = tls_connect(s.addr(), config.clone()).await;
    assert_ne!(now, first);
    assert_eq!(now, second.chain[0]);

    // A broken key file: logged, and the certificate stays.
    std::fs::write(&s.files.key, "not a key").unwrap();
    hup(&s.relay);
    assert!(
        s.relay
            .wait_log("kept the old certificate", Duration::from_secs(10)),
        "{}",
        s.relay.log()
    );
    let (_, _, still) = tls_connect(s.addr(), config).await;
    assert_eq!(still, second.chain[0]);

    // The worker never lost its connection, and serves.
    let mut sender = https(s.addr(), &s.ca_pem(), false).await;
    let req = Request::get("/w/abc/health")
        .header("host", "localhost")
        .header("authorization", format!("Bearer {WORKER_TOKEN}"))
        .body(empty())
        .unwrap();
    let resp = sender.send(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(s.relay.log().matches("worker abc connected").count(), 1);
    assert!(!s.relay.log().contains("disconnected"), "{}", s.relay.log());
}

fn hup(p: &Proc) {
    let pid = p.child.id() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
}

/// The worker's app behind an in-process relay on plain TCP: `/host`
/// answers with the Host header it got.
async fn plain_stack(config: ServerConfig) -> (std::net::SocketAddr, Gateway) {
    let table = TokenTable::parse(&format!("abc {CONNECT_TOKEN}")).unwrap();
    let gateway = Gateway::new(table);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), config));
    let app = tower::service_fn(|req: Request<TunnelBody>| async move {
        let host = req
            .headers()
            .get("host")
            .map(|h| h.to_str().unwrap_or("?").to_owned())
            .unwrap_or_default();
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(host))))
    });
    let tunnel = Tunnel::new(
        format!("ws://{addr}/connect"),
        Token::new(CONNECT_TOKEN).ok(),
    );
    tokio::spawn(tunnel.run(app));
    let end = Instant::now() + Duration::from_secs(10);
    while !gateway.is_connected("abc") {
        assert!(Instant::now() < end, "the worker did not connect");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (addr, gateway)
}

/// HTTP/2 with prior knowledge on plain TCP, beside HTTP/1.1 on the same
/// port; the worker gets the `:authority` as its `Host`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_with_prior_knowledge_on_plain_tcp() {
    let (addr, _gateway) = plain_stack(ServerConfig::default()).await;
    let mut sender = h2c(addr).await;
    let req = Request::get(format!("http://relay.test:{}/w/abc/host", addr.port()))
        .body(empty())
        .unwrap();
    let resp = sender.send(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let host = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(host, format!("relay.test:{}", addr.port()));

    // HTTP/1.1 on the same port.
    let r = worker_relay_client_get(addr, "/w/abc/host").await;
    assert_eq!(r, "h1.test");
}

async fn worker_relay_client_get(addr: std::net::SocketAddr, path: &str) -> String {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "h1.test")
        .body(empty())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

/// The service sees each request's peer address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_address_reaches_the_service() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let svc = tower::service_fn(|req: Request<hyper::body::Incoming>| async move {
        let peer = req.extensions().get::<PeerAddr>().map(|p| p.0.to_string());
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
            peer.unwrap_or_default(),
        ))))
    });
    tokio::spawn(serve(listener, svc, ServerConfig::default()));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let local = tcp.local_addr().unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get("/").header("host", "x").body(empty()).unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, local.to_string());
}

/// A client that opens a TCP connection to a TLS server and sends nothing
/// is closed after the header-read timeout, and holds no slot meanwhile
/// that others need: a second client completes its handshake at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_tls_client_is_closed_at_the_header_timeout() {
    use tokio::io::AsyncReadExt;
    let files = TlsFiles::new();
    let tls = ServerTls::from_pem_files(&files.cert, &files.key).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = ServerConfig::default()
        .header_read_timeout(Duration::from_millis(300))
        .tls(tls);
    let svc = tower::service_fn(|_req: Request<hyper::body::Incoming>| async move {
        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("ok"))))
    });
    tokio::spawn(serve(listener, svc, config));
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (_, alpn, _) =
        tls_connect(addr, client_config(&files.ca.pem(), &[b"h2", b"http/1.1"])).await;
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("closed within 5 s")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(started.elapsed() >= Duration::from_millis(200));
}

/// The slow tier: `cargo test` skips these (`#[ignore]`, each says why);
/// `.ci/slow` runs them (`cargo test -- --ignored slow::`).
mod slow {
    use super::*;

    /// 200 MiB each way (an echo) through the TLS relay and the `wss://`
    /// worker, for a caller over HTTP/1.1 and one over HTTP/2.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow: 200 MiB each way over TLS, HTTP/1.1 and HTTP/2: bulk, bound by throughput"]
    async fn https_callers_over_http1_and_http2_200_mib_each_way() {
        let s = TlsStack::start();
        const N: u64 = 200 << 20;
        for h2 in [false, true] {
            let mut sender = https(s.addr(), &s.ca_pem(), h2).await;
            let req = Request::post(uri(s.port, h2, "/w/abc/echo"))
                .header("host", format!("localhost:{}", s.port))
                .header("authorization", format!("Bearer {WORKER_TOKEN}"))
                .body(pattern_body(N))
                .unwrap();
            let started = Instant::now();
            let echoed = tokio::time::timeout(Duration::from_secs(240), async {
                let resp = sender.send(req).await.unwrap();
                assert_eq!(resp.status(), StatusCode::OK);
                check_pattern(resp).await
            })
            .await
            .unwrap_or_else(|_| panic!("h2={h2}: no full echo within 240 s"));
            assert_eq!(echoed, N, "h2={h2}");
            eprintln!(
                "e2e_tls: 200 MiB each way over {} in {:.1} s",
                if h2 { "HTTP/2" } else { "HTTP/1.1" },
                started.elapsed().as_secs_f64()
            );
            // And a download alone.
            let req = Request::get(uri(s.port, h2, &format!("/w/abc/bytes?n={}", 8 << 20)))
                .header("host", format!("localhost:{}", s.port))
                .header("authorization", format!("Bearer {WORKER_TOKEN}"))
                .body(empty())
                .unwrap();
            let resp = sender.send(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            assert_eq!(check_pattern(resp).await, 8 << 20);
        }
        assert!(!s.worker.log().contains(CONNECT_TOKEN));
    }
}
