//! An HTTPS client for the tests: hyper over tokio-rustls, HTTP/1.1 or
//! HTTP/2 as ALPN says, trusting one CA.
#![allow(dead_code)]

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::net::SocketAddr;
use std::sync::Arc;

pub type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A connection's request sender, either protocol.
pub enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

impl Sender {
    pub async fn send(&mut self, req: Request<Body>) -> hyper::Result<Response<Incoming>> {
        match self {
            Sender::H1(s) => s.send_request(req).await,
            Sender::H2(s) => s.send_request(req).await,
        }
    }
}

/// A rustls client configuration trusting `ca_pem`, offering `alpn`.
pub fn client_config(ca_pem: &str, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// The TLS session with `localhost` at `addr`: its stream, the protocol
/// ALPN chose, and the certificate the server presented.
pub async fn tls_connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> (
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    Option<Vec<u8>>,
    CertificateDer<'static>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .unwrap();
    let (_, session) = tls.get_ref();
    let alpn = session.alpn_protocol().map(|p| p.to_vec());
    let leaf = session.peer_certificates().unwrap()[0].clone().into_owned();
    (tls, alpn, leaf)
}

/// An HTTPS connection to `addr` (as `localhost`), HTTP/2 if `h2` (ALPN
/// offers only `h2`, and the server must pick it), HTTP/1.1 otherwise.
pub async fn https(addr: SocketAddr, ca_pem: &str, h2: bool) -> Sender {
    let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
    let (tls, chosen, _) = tls_connect(addr, client_config(ca_pem, alpn)).await;
    assert_eq!(chosen.as_deref(), Some(alpn[0]), "ALPN");
    let io = TokioIo::new(tls);
    if h2 {
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        Sender::H2(sender)
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        Sender::H1(sender)
    }
}

/// HTTP/2 with prior knowledge over plain TCP.
pub async fn h2c(addr: SocketAddr) -> Sender {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    Sender::H2(sender)
}

/// An empty request body.
pub fn empty() -> Body {
    use http_body_util::BodyExt;
    http_body_util::Empty::new().map_err(|e| match e {}).boxed()
}
