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
    #[error("{}: not a PEM certificate chain: {why}", path.display())]
    Certificate { path: PathBuf, why: String },
    #[error("{}: no PEM certificate in it", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: not a PEM private key (PKCS#8, PKCS#1 or SEC1): {why}", path.display())]
    Key { path: PathBuf, why: String },
    #[error(
        "{}: the private key is encrypted; tally serve needs it unencrypted \
         (e.g. `openssl pkey -in KEY -out PLAIN.pem`, kept readable only by tally)",
        path.display()
    )]
    EncryptedKey { path: PathBuf },
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
            .map_err(|e| TlsError::Certificate {
                path: cert.to_owned(),
                why: pem_problem(&e),
            })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate {
                path: cert.to_owned(),
            });
        }
        // OpenSSL's two ways of saying so: PKCS#8 `ENCRYPTED PRIVATE KEY`, or a legacy
        // key's `Proc-Type: 4,ENCRYPTED` header (whose base64 then fails to decode).
        let text = String::from_utf8_lossy(&key_pem);
        if text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----")
            || text.contains("Proc-Type: 4,ENCRYPTED")
        {
            return Err(TlsError::EncryptedKey {
                path: key.to_owned(),
            });
        }
        if marked_as_ca(&chain[0]) {
            // Served all the same (some clients take it), but tally's own, curl and browsers
            // refuse a CA's certificate as a server's with an error that names neither file.
            tracing::warn!(
                cert = %cert.display(),
                "the server's certificate is marked as a CA (basicConstraints CA:TRUE): \
                 most TLS clients, tally's included, refuse it as a server's own; make it \
                 with `-addext basicConstraints=critical,CA:FALSE`"
            );
        }
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Key {
            path: key.to_owned(),
            why: pem_problem(&e),
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

/// Whether a certificate's DER says it is a CA: a basicConstraints extension (OID 2.5.29.19)
/// whose value starts with `cA TRUE`. (DER leaves out a FALSE, so an end entity's is empty.)
fn marked_as_ca(der: &[u8]) -> bool {
    const OID: [u8; 5] = [0x06, 0x03, 0x55, 0x1d, 0x13];
    const TRUE: [u8; 3] = [0x01, 0x01, 0xff];
    der.windows(OID.len())
        .position(|w| w == OID)
        .is_some_and(|at| {
            let mut rest = &der[at + OID.len()..];
            // The extension's own `critical` flag, when set.
            if rest.starts_with(&TRUE) {
                rest = &rest[TRUE.len()..];
            }
            // OCTET STRING (short length), then its SEQUENCE (short length), then cA.
            matches!(rest, [0x04, _, 0x30, len, tail @ ..] if *len >= 3 && tail.starts_with(&TRUE))
        })
}

/// What is wrong with a PEM file, in words: the section markers as text, not as the list of
/// byte values `pem::Error` shows.
fn pem_problem(e: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error as E;
    match e {
        E::MissingSectionEnd { end_marker } => format!(
            "cut short: no \"-----END {}-----\" line",
            String::from_utf8_lossy(end_marker)
        ),
        E::IllegalSectionStart { line } => {
            format!(
                "a malformed BEGIN line: {:?}",
                String::from_utf8_lossy(line)
            )
        }
        E::NoItemsFound => "nothing PEM in it".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each problem is named in words: a cut-short chain, an encrypted key (in either of
    /// OpenSSL's forms), a key that is not PEM.
    #[test]
    fn problems_with_the_files_are_said_plainly() {
        let dir = tempfile::tempdir().unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let cert = write("cert.pem", &ck.cert.pem());
        let key = write("key.pem", &ck.signing_key.serialize_pem());
        assert!(Tls::load(&cert, &key).is_ok());
        let pem = ck.cert.pem();
        let cut = write("cut.pem", &pem[..pem.len() / 2]);
        let e = Tls::load(&cut, &key).unwrap_err().to_string();
        assert!(
            e.contains("cut short: no \"-----END CERTIFICATE-----\" line"),
            "{e}"
        );
        let pkcs8 = write(
            "enc8.pem",
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
        );
        let legacy = write(
            "enc1.pem",
            "-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,00\n\nMIIB\n-----END EC PRIVATE KEY-----\n",
        );
        for k in [pkcs8, legacy] {
            let e = Tls::load(&cert, &k).unwrap_err().to_string();
            assert!(e.contains("the private key is encrypted"), "{e}");
        }
        // A CA's certificate is told apart from an end entity's (a warning at start).
        let der = |c: &rcgen::Certificate| c.der().to_vec();
        assert!(!marked_as_ca(&der(&ck.cert)));
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ck.signing_key).unwrap();
        assert!(marked_as_ca(&der(&ca)));
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        let end = params.self_signed(&ck.signing_key).unwrap();
        assert!(!marked_as_ca(&der(&end)));
        let e = Tls::load(&cert, &write("none.pem", "not PEM"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nothing PEM in it"), "{e}");
    }
}
