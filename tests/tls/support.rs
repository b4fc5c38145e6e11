//! A throwaway CA and certificates made at test time, and a relay (the
//! crate's gateway) served over TLS on loopback by tokio-rustls and hyper.
#![allow(dead_code)]

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use worker_relay_hyper::gateway::Gateway;

/// A certificate authority of the test's own.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A server's certificate chain and key.
pub struct Leaf {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// The chain, PEM.
    pub cert_pem: String,
    /// The key, PEM (PKCS#8).
    pub key_pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A certificate for `names` (DNS names or IP addresses) signed by
    /// this CA.
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, |_| {})
    }

    /// A certificate for `names` that expired in 2001.
    pub fn expired_leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, |p| {
            p.not_before = rcgen::date_time_ymd(2000, 1, 1);
            p.not_after = rcgen::date_time_ymd(2001, 1, 1);
        })
    }

    fn leaf_with(&self, names: &[&str], edit: impl FnOnce(&mut CertificateParams)) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        edit(&mut params);
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Leaf {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// A TLS server configuration with `leaf`, ALPN `http/1.1`.
pub fn server_config(leaf: &Leaf) -> Arc<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(leaf.chain.clone(), leaf.key.clone_key())
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A gateway served over TLS on loopback; counts TCP connections accepted
/// (the dials that reached it, whether their TLS handshake succeeded).
pub struct TlsRelay {
    pub addr: SocketAddr,
    pub gateway: Gateway,
    pub accepted: Arc<AtomicUsize>,
}

impl TlsRelay {
    pub async fn start(gateway: Gateway, tls: Arc<rustls::ServerConfig>) -> TlsRelay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let service = gateway.service();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let service = service.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(service))
                        .with_upgrades()
                        .await;
                });
            }
        });
        TlsRelay {
            addr,
            gateway,
            accepted,
        }
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// A CA and its certificate for `localhost` in PEM files of a fresh
/// directory: `ca.pem` (for the workers and callers), `cert.pem` and
/// `key.pem` (for the relay).
pub struct TlsFiles {
    pub dir: tempfile::TempDir,
    pub ca: Ca,
    pub ca_file: std::path::PathBuf,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl TlsFiles {
    pub fn new() -> TlsFiles {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("worker-relay test CA");
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        let files = TlsFiles {
            dir,
            ca,
            ca_file,
            cert,
            key,
        };
        files.write_leaf(&files.ca.leaf(&["localhost"]));
        files
    }

    /// Writes `leaf` over `cert.pem` and `key.pem`.
    pub fn write_leaf(&self, leaf: &Leaf) {
        std::fs::write(&self.cert, &leaf.cert_pem).unwrap();
        std::fs::write(&self.key, &leaf.key_pem).unwrap();
    }
}
