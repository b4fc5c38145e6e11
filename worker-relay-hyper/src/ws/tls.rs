//! `wss://` for the worker's dial (feature `rustls`): whom it trusts.
//!
//! The crypto is rustls's `ring` provider, chosen for the build rather than
//! taken from the process default: it builds with a C compiler alone
//! (aws-lc-rs, rustls's default, also wants cmake, which a fresh machine of
//! ours lacks), and a dialer built here does not change behaviour when some
//! other crate in the program installs another default.

use super::dial::DialError;
use crate::send_lowat::PacedTcp;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use std::sync::{Arc, OnceLock};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use worker_relay::connect::Refused;

/// A PEM bundle of certificates to trust that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The bundle holds no certificate.
    #[error("no certificate in the PEM bundle")]
    NoCertificates,
    /// The bundle is not PEM, or a certificate in it is malformed.
    #[error("the PEM bundle could not be read: {0}")]
    Pem(String),
    /// rustls refused a certificate of the bundle as a trust anchor.
    #[error("a certificate of the PEM bundle cannot be trusted: {0}")]
    Rejected(rustls::Error),
}

/// The trusted roots of a dialer: the platform's (which honour
/// `SSL_CERT_FILE` and `SSL_CERT_DIR`) and any extra ones, or a whole
/// configuration given in code. The configuration is built at the first
/// `wss://` dial and kept.
#[derive(Clone, Default)]
pub(super) struct ClientTls {
    extra: Vec<CertificateDer<'static>>,
    built: Arc<OnceLock<Result<Arc<ClientConfig>, String>>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("extra_roots", &self.extra.len())
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// These settings, trusting the certificates of `pem` too.
    pub fn with_extra_roots(mut self, pem: &[u8]) -> Result<ClientTls, TlsError> {
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Pem(e.to_string()))?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificates);
        }
        let mut check = RootCertStore::empty();
        for cert in &certs {
            check.add(cert.clone()).map_err(TlsError::Rejected)?;
        }
        self.extra.extend(certs);
        self.built = Arc::default();
        Ok(self)
    }

    /// Settings that use `config` as it is (its ALPN set to `http/1.1`).
    pub fn from_config(config: Arc<ClientConfig>) -> ClientTls {
        let mut config = Arc::unwrap_or_clone(config);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        ClientTls {
            extra: Vec::new(),
            built: Arc::new(OnceLock::from(Ok(Arc::new(config)))),
        }
    }

    fn config(&self) -> Result<Arc<ClientConfig>, String> {
        self.built.get_or_init(|| build(&self.extra)).clone()
    }

    /// The TLS handshake with `host` over `tcp` (SNI `host`, unless it is
    /// an address; ALPN `http/1.1`).
    pub async fn connect(
        &self,
        host: &str,
        tcp: PacedTcp,
    ) -> Result<TlsStream<PacedTcp>, DialError> {
        let config = self.config().map_err(DialError::network)?;
        let name = ServerName::try_from(host.to_owned()).map_err(|e| {
            DialError::refused(Refused::InvalidUrl(format!(
                "{host:?} is not a name TLS can check: {e}"
            )))
        })?;
        TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| {
                let why = match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                    Some(tls) => tls.to_string(),
                    None => e.to_string(),
                };
                DialError::network(format!("TLS handshake with {host}: {why}"))
            })
    }
}

/// A client configuration trusting the platform's roots and `extra`.
fn build(extra: &[CertificateDer<'static>]) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    for cert in extra {
        roots.add(cert.clone()).map_err(|e| e.to_string())?;
    }
    if roots.is_empty() {
        let why = native
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), |e| e.to_string());
        return Err(format!(
            "no trusted roots: the platform's could not be read ({why}) and no CA was given"
        ));
    }
    // rustls 0.23.48 deprecates `ring::default_provider` ("no support for
    // post-quantum algorithms") and offers no other way to name ring: ring
    // is still the provider this crate chooses (see the module's doc), so
    // the warning is allowed here. A program that wants post-quantum key
    // exchange gives its own configuration (`Dialer::tls_config`).
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
