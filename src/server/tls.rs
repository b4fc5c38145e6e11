//! TLS for [`serve`](super::serve) (feature `rustls`): a certificate and
//! key from PEM files, re-read on demand without dropping a connection.
//!
//! The certificate is served through a rustls certificate resolver that
//! holds the current one: [`ServerTls::reload`] swaps it, new handshakes
//! see the new certificate at once, and connections already open keep the
//! session they have (as nginx's reload does). Callers are offered HTTP/2
//! and HTTP/1.1 by ALPN (`h2`, `http/1.1`); a worker's dial asks for
//! `http/1.1`, which its WebSocket upgrade needs.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// A certificate or key file that cannot be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{0}: no certificate in it")]
    NoCertificate(PathBuf),
    /// The key file holds no usable PEM private key.
    #[error("{path}: no private key in it ({why})")]
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        why: String,
    },
    /// The key is of a kind rustls cannot sign with, or does not belong to
    /// the certificate.
    #[error("the key does not fit: {0}")]
    Key(rustls::Error),
}

/// The certificate the server presents, from two PEM files (the chain,
/// leaf first, and its private key), and the rustls configuration around
/// it. Cheap to clone: clones share the certificate, so a reload through
/// one is seen by all.
#[derive(Clone, Debug)]
pub struct ServerTls {
    paths: Arc<(PathBuf, PathBuf)>,
    current: Arc<Current>,
    config: Arc<rustls::ServerConfig>,
}

#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

impl ServerTls {
    /// Reads the certificate chain and key from `cert` and `key` (PEM).
    /// The crypto is rustls's `ring` provider (as the worker's dial).
    pub fn from_pem_files(
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Result<ServerTls, CertError> {
        let (cert, key) = (cert.into(), key.into());
        let certified = load(&cert, &key)?;
        let current = Arc::new(Current(RwLock::new(certified)));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(CertError::Key)?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            paths: Arc::new((cert, key)),
            current,
            config: Arc::new(config),
        })
    }

    /// Reads the two files again and serves what they hold from the next
    /// handshake on. On an error the certificate served stays as it was.
    pub fn reload(&self) -> Result<(), CertError> {
        let certified = load(&self.paths.0, &self.paths.1)?;
        *self.current.0.write().unwrap_or_else(|e| e.into_inner()) = certified;
        Ok(())
    }

    /// The certificate chain served now (leaf first).
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.current
            .0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .cert
            .clone()
    }

    /// The rustls configuration (ALPN `h2`, `http/1.1`).
    pub fn rustls_config(&self) -> Arc<rustls::ServerConfig> {
        self.config.clone()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|source| CertError::Read {
        path: path.to_owned(),
        source,
    })
}

fn load(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, CertError> {
    let chain = CertificateDer::pem_slice_iter(&read(cert)?)
        .filter_map(Result::ok)
        .collect::<Vec<_>>();
    if chain.is_empty() {
        return Err(CertError::NoCertificate(cert.to_owned()));
    }
    let der = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| CertError::NoKey {
        path: key.to_owned(),
        why: e.to_string(),
    })?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&der).map_err(CertError::Key)?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(CertError::Key)?;
    Ok(Arc::new(certified))
}
