//! TLS for `tally serve --tls-cert FILE --tls-key FILE`: loading a PEM certificate chain
//! and private key into a [`Tls`] the listener hands each connection to. rustls with the
//! `ring` provider (aws-lc-rs would compile a large C library), TLS 1.2 and 1.3, HTTP/1.1
//! by ALPN. Every failure names the file at fault.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A loaded certificate and key, ready to accept connections.
#[derive(Clone)]
pub struct Tls(pub(crate) tokio_rustls::TlsAcceptor);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

/// Why a certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a PEM certificate chain", path.display())]
    Certificate {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("{}: no PEM certificate in it", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: not a PEM private key (PKCS#8, PKCS#1 or SEC1)", path.display())]
    Key {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("{} with {}: not a usable certificate and key", cert.display(), key.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
}

impl Tls {
    /// Loads `cert` (PEM, the server's certificate first, then its chain) and `key` (PEM).
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        let read = |path: &Path| {
            crate::read_settings_file(path).map_err(|source| TlsError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let (cert_pem, key_pem) = (read(cert)?, read(key)?);
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| TlsError::Certificate {
                path: cert.to_owned(),
                source,
            })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate {
                path: cert.to_owned(),
            });
        }
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| TlsError::Key {
            path: key.to_owned(),
            source,
        })?;
        let pair = |source| TlsError::Pair {
            cert: cert.to_owned(),
            key: key.to_owned(),
            source,
        };
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(pair)?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(pair)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
    }
}
