//! TLS for [`serve`](super::serve) (feature `rustls`): a certificate and
//! key from PEM files, re-read on demand without dropping a connection.
//!
//! The certificate is served through a rustls certificate resolver that
//! holds the current one: [`ServerTls::reload`] swaps it, new handshakes
//! see the new certificate at once, and connections already open keep the
//! session they have (as nginx's reload does). Callers are offered HTTP/2
//! and HTTP/1.1 by ALPN (`h2`, `http/1.1`); a worker's dial asks for
//! `http/1.1`, which its WebSocket upgrade needs.

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ParsedCertificate, ResolvesServerCert};
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
    /// The certificate file holds a PEM block that cannot be read (one cut
    /// short, as a file caught half written is, or with bad base64): the
    /// whole file is refused, not served without that block.
    #[error("{path}: a PEM block cannot be read ({why}); is the file complete?")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        why: String,
    },
    /// The leaf certificate cannot be served: not X.509 v3 (made without
    /// extensions), or otherwise not a certificate rustls accepts.
    #[error(
        "{path}: the certificate cannot be served: {why}; a server certificate must be \
         X.509 v3 with a subjectAltName naming the host (openssl: sign it with \
         `-extfile` holding `subjectAltName=DNS:<host>`)"
    )]
    Certificate {
        /// The certificate file.
        path: PathBuf,
        /// What rustls said.
        why: String,
    },
    /// The key is of a kind rustls cannot sign with, or does not belong to
    /// the certificate.
    #[error("the key does not fit: {0}")]
    Key(rustls::Error),
    /// The TLS configuration cannot be built with the crypto provider
    /// (one installed by the program that lacks TLS 1.2 and 1.3).
    #[error("TLS cannot be configured: {0}")]
    Config(rustls::Error),
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
    provider: Arc<CryptoProvider>,
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
    ///
    /// The crypto is the process's default rustls provider if the program
    /// installed one (`CryptoProvider::install_default`, e.g. aws-lc-rs
    /// for post-quantum key exchange), and rustls's *ring* provider
    /// otherwise.
    ///
    /// Every PEM block of the certificate file must be complete, and the
    /// leaf must be X.509 v3 ([`CertError::Pem`], [`CertError::Certificate`]).
    pub fn from_pem_files(
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Result<ServerTls, CertError> {
        let (cert, key) = (cert.into(), key.into());
        let provider = provider();
        let certified = load(&provider, &cert, &key)?;
        let current = Arc::new(Current(RwLock::new(certified)));
        let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(CertError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            paths: Arc::new((cert, key)),
            current,
            config: Arc::new(config),
            provider,
        })
    }

    /// Reads the two files again and serves what they hold from the next
    /// handshake on. On an error (a file unreadable, a PEM block cut short,
    /// a key that does not fit) the certificate served stays as it was.
    pub fn reload(&self) -> Result<(), CertError> {
        let certified = load(&self.provider, &self.paths.0, &self.paths.1)?;
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

/// The process's default provider if the program installed one, else
/// rustls's *ring* provider (the crate's `rustls` feature turns on rustls's
/// `ring`).
fn provider() -> Arc<CryptoProvider> {
    if let Some(installed) = CryptoProvider::get_default() {
        return installed.clone();
    }
    // rustls 0.23.48 deprecates naming its *ring* provider (no post-quantum
    // key exchange) but has no other name for it; rustls itself builds its
    // crate-features default this way. rustls 0.24 moves it to the
    // `rustls-ring` crate.
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load(
    provider: &CryptoProvider,
    cert: &Path,
    key: &Path,
) -> Result<Arc<CertifiedKey>, CertError> {
    // Every block, or none: a chain caught half written would otherwise be
    // served without its intermediates.
    let chain = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertError::Pem {
            path: cert.to_owned(),
            why: pem_error(&e),
        })?;
    let Some(leaf) = chain.first() else {
        return Err(CertError::NoCertificate(cert.to_owned()));
    };
    if let Err(e) = ParsedCertificate::try_from(leaf) {
        return Err(CertError::Certificate {
            path: cert.to_owned(),
            why: certificate_error(e),
        });
    }
    let der = PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| CertError::NoKey {
        path: key.to_owned(),
        why: e.to_string(),
    })?;
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(CertError::Key)?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(CertError::Key)?;
    Ok(Arc::new(certified))
}

fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::MissingSectionEnd { end_marker } => format!(
            "no END {} line",
            String::from_utf8_lossy(end_marker)
                .trim_matches('-')
                .trim()
                .trim_start_matches("END ")
        ),
        e => e.to_string(),
    }
}

/// What rustls says of a certificate it cannot parse, without its "invalid
/// peer certificate" (it is ours).
fn certificate_error(e: rustls::Error) -> String {
    use rustls::{CertificateError, Error, OtherError};
    match e {
        Error::InvalidCertificate(CertificateError::Other(OtherError(e))) => {
            let e = e.to_string();
            match e.as_str() {
                "UnsupportedCertVersion" => "it is not X.509 v3 (made without extensions)".into(),
                _ => e,
            }
        }
        Error::InvalidCertificate(e) => format!("{e:?}"),
        e => e.to_string(),
    }
}
