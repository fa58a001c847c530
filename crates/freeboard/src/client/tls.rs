//! `wss://` for the clients (the `tls` feature): rustls' buffered `ClientConnection` over the
//! socket, inside one [`ClientStream`](super::ClientStream) for the blocking client, the
//! [`ClientLoop`](super::ClientLoop) and the load generator (`freeboard-bench`). A build
//! without the feature has `tls/disabled.rs` in its place, which refuses `wss://` URLs.
//!
//! A client holds few connections, so the per-connection buffers rustls keeps (its received
//! records, at most 64 KiB of records to send) are not the concern they are on a server with
//! ten thousand; the server side uses the unbuffered API (`crate::tls`).
//!
//! Roots: the operating system's store by default (`rustls-native-certs`: the store the
//! administrator updates, and the one a private CA installed system-wide is in), a PEM file
//! with [`ClientConfig::ca_file`](super::ClientConfig::ca_file) for a private CA alone, or no
//! verification at all with [`ClientConfig::insecure`](super::ClientConfig::insecure) (for
//! tests; `freeboard client --insecure` prints a warning).

use std::io::{self, IoSlice, Read, Write};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use mio::net::TcpStream;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConnection, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::{ClientError, TlsRoots};

/// A client connection's TLS state.
pub(super) type Connection = ClientConnection;

/// The blocking stream the opening handshake runs over.
pub(super) type Handshaking = rustls::StreamOwned<ClientConnection, std::net::TcpStream>;

/// Makes the TLS state of connections to servers that present a certificate `roots` trust.
pub(super) struct Connector(Arc<rustls::ClientConfig>);

impl Connector {
    pub(super) fn new(roots: &TlsRoots) -> Result<Self, ClientError> {
        tls_client_config(roots).map(Self)
    }

    /// The TLS state of a new connection to `host`.
    pub(super) fn connect(&self, host: &str) -> Result<Connection, ClientError> {
        tls_connection(self.0.clone(), host)
    }
}

/// The rustls configuration for `roots`: TLS 1.3 and 1.2 on the `ring` provider, ALPN
/// `http/1.1`, session resumption with tickets (an in-memory cache that lives as long as the
/// configuration). The OS store is loaded once per process.
pub fn tls_client_config(roots: &TlsRoots) -> Result<Arc<rustls::ClientConfig>, ClientError> {
    static NATIVE: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    match roots {
        TlsRoots::Native => NATIVE
            .get_or_init(|| {
                let found = rustls_native_certs::load_native_certs();
                let mut store = RootCertStore::empty();
                let (added, _) = store.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err("no trusted root certificates in the operating system's store \
                                (install ca-certificates, or give a CA file)"
                        .to_owned());
                }
                build(store).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(ClientError::Tls),
        TlsRoots::CaFile(path) => {
            let mut store = RootCertStore::empty();
            for cert in read_certs(path)? {
                store.add(cert).map_err(|e| tls_error(path, e))?;
            }
            build(store).map_err(|e| ClientError::Tls(e.to_string()))
        }
        TlsRoots::Insecure => {
            let provider = crate::tls::provider();
            let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(rustls::ALL_VERSIONS)
                .map_err(|e| ClientError::Tls(e.to_string()))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        }
    }
}

fn build(store: RootCertStore) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let mut config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(rustls::ALL_VERSIONS)?
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(path, e))?;
    if certs.is_empty() {
        return Err(ClientError::Tls(format!("{}: no certificate in the file", path.display())));
    }
    Ok(certs)
}

fn tls_error(path: &Path, e: impl std::fmt::Display) -> ClientError {
    ClientError::Tls(format!("{}: {e}", path.display()))
}

/// A new client connection to `host` (SNI and the name verified, unless it is an IP address,
/// which is verified against the certificate's IP addresses and not sent as SNI).
pub fn tls_connection(
    config: Arc<rustls::ClientConfig>,
    host: &str,
) -> Result<ClientConnection, ClientError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned())
        .map_err(|_| ClientError::Tls(format!("{host:?} is not a valid TLS server name")))?;
    ClientConnection::new(config, name).map_err(|e| ClientError::Tls(e.to_string()))
}

/// Whether `e` carries a TLS failure (a certificate that does not verify, an alert).
pub(super) fn is_tls(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>())
}

/// A socket error as the client reports it: [`ClientError::Tls`] when TLS failed.
pub(super) fn tls_or_io(e: io::Error) -> ClientError {
    match is_tls(&e) {
        true => ClientError::Tls(e.to_string()),
        false => e.into(),
    }
}

/// Writes the TLS records that wait; `WouldBlock` if the socket is full.
pub(super) fn flush((tcp, conn): &mut (TcpStream, ClientConnection)) -> io::Result<()> {
    while conn.wants_write() {
        conn.write_tls(tcp)?;
    }
    Ok(())
}

/// Reads decrypted bytes (`Ok(0)` at the server's close_notify).
pub(super) fn read(
    (tcp, conn): &mut (TcpStream, ClientConnection),
    buf: &mut [u8],
) -> io::Result<usize> {
    loop {
        match conn.reader().read(buf) {
            Ok(n) => return Ok(n), // 0: the server's close_notify
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        conn.read_tls(tcp)?; // 0 at EOF: the reader then says UnexpectedEof
        let processed = conn.process_new_packets();
        // What the records asked for (an alert, a key update) goes at once.
        while conn.wants_write() {
            if conn.write_tls(tcp).is_err() {
                break;
            }
        }
        if let Err(e) = processed {
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
    }
}

/// Encrypts what rustls' send buffer (64 KiB) takes, then writes records until the socket is
/// full; what stays is written first next time.
pub(super) fn write_vectored(
    (tcp, conn): &mut (TcpStream, ClientConnection),
    bufs: &[IoSlice<'_>],
) -> io::Result<usize> {
    while conn.wants_write() {
        conn.write_tls(tcp)?;
    }
    let n = conn.writer().write_vectored(bufs)?;
    while conn.wants_write() {
        match conn.write_tls(tcp) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    if n == 0 && bufs.iter().any(|b| !b.is_empty()) {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    Ok(n)
}

/// Accepts any certificate (`TlsRoots::Insecure`), but still checks that the handshake is
/// signed by its key.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
