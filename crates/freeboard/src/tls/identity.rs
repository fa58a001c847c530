//! The server's identity: its certificate chain and key from PEM files (reloadable), the
//! rustls configuration built on it, and the crypto provider every TLS connection uses.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The server's certificate and key, from PEM files, replaceable while the server runs.
///
/// A new handshake uses the pair loaded last; open connections keep theirs.
pub struct TlsIdentity {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl TlsIdentity {
    /// Loads the full chain (leaf first) from `cert` and the private key (PKCS#8, PKCS#1 or
    /// SEC1) from `key`, and checks that they belong together.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let current = RwLock::new(Arc::new(certified_key(cert, key)?));
        Ok(Self { cert: cert.to_owned(), key: key.to_owned(), current })
    }

    /// Reads both files again; on success new handshakes use the new pair. On error the old
    /// pair stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = Arc::new(certified_key(&self.cert, &self.key)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    fn get(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsIdentity").field("cert", &self.cert).field("key", &self.key).finish()
    }
}

impl ResolvesServerCert for TlsIdentity {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

/// Why TLS could not be set up.
#[derive(Debug)]
#[non_exhaustive]
pub enum TlsError {
    /// A certificate or key file could not be read or parsed.
    Pem {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        error: String,
    },
    /// The certificate file holds no certificate.
    NoCertificate(PathBuf),
    /// rustls refused the configuration (an unsupported key, a key that does not match the
    /// certificate).
    Rustls(rustls::Error),
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pem { path, error } => write!(f, "{}: {error}", path.display()),
            Self::NoCertificate(path) => {
                write!(f, "{}: no certificate in the file", path.display())
            }
            Self::Rustls(e) => write!(f, "TLS: {e}"),
        }
    }
}

impl std::error::Error for TlsError {}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        Self::Rustls(e)
    }
}

/// The crypto provider every TLS connection of freeboard uses: rustls' `ring` provider.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let pem = |path: &Path, e: rustls::pki_types::pem::Error| TlsError::Pem {
        path: path.to_owned(),
        error: e.to_string(),
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| pem(cert, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(cert, e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert.to_owned()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| pem(key, e))?;
    Ok(CertifiedKey::from_der(chain, key, &provider())?)
}

/// The rustls server configuration: TLS 1.3 and 1.2, ALPN `h2` (if `http2`) and `http/1.1`,
/// session tickets for resumption, the certificate from `identity`.
pub(crate) fn server_config(
    identity: Arc<TlsIdentity>,
    http2: bool,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(rustls::ALL_VERSIONS)?
        .with_no_client_auth()
        .with_cert_resolver(identity);
    // RFC 7301 §3.2: the server picks from the client's list by its own preference, so `h2`
    // first makes a browser that offers both speak HTTP/2.
    config.alpn_protocols = match http2 {
        true => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        false => vec![b"http/1.1".to_vec()],
    };
    config.ticketer = rustls::crypto::ring::Ticketer::new()?;
    // One ticket is enough for a browser's next connection and costs half the bytes.
    config.send_tls13_tickets = 1;
    Ok(Arc::new(config))
}
