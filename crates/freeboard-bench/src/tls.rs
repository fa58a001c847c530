//! `wss://` for the load generator: rustls' buffered `ClientConnection` over each socket, with
//! no certificate verification (benchmarks run against a server's self-signed test
//! certificate on loopback) and, unless asked otherwise, session resumption with tickets.

use std::io::{self, IoSlice, Read, Write};
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConnection, DigitallySignedStruct, SignatureScheme};

/// The client configuration: `resume` keeps a session cache shared by every connection (each
/// handshake after the first resumes with a ticket); without it every handshake is full.
pub fn client_config(resume: bool) -> Arc<rustls::ClientConfig> {
    static CONFIGS: [OnceLock<Arc<rustls::ClientConfig>>; 2] = [OnceLock::new(), OnceLock::new()];
    CONFIGS[usize::from(resume)]
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(rustls::DEFAULT_VERSIONS)
                .expect("TLS 1.3 and 1.2 are supported")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            if !resume {
                config.resumption = rustls::client::Resumption::disabled();
            }
            Arc::new(config)
        })
        .clone()
}

/// A new TLS client connection to `host` (a name or an IP address, without the port).
pub fn connect(host: &str, resume: bool) -> io::Result<ClientConnection> {
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned()).map_err(io::Error::other)?;
    ClientConnection::new(client_config(resume), name).map_err(io::Error::other)
}

/// A load-generator socket: plain TCP, or TLS over it.
pub enum Stream {
    /// Plain TCP.
    Plain(mio::net::TcpStream),
    /// TLS over TCP.
    Tls(Box<(mio::net::TcpStream, ClientConnection)>),
}

impl Stream {
    /// The socket, to register with a poll.
    pub fn tcp(&mut self) -> &mut mio::net::TcpStream {
        match self {
            Self::Plain(tcp) => tcp,
            Self::Tls(tls) => &mut tls.0,
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (tcp, conn) = match self {
            Self::Plain(tcp) => return tcp.read(buf),
            Self::Tls(tls) => &mut **tls,
        };
        loop {
            match conn.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            conn.read_tls(tcp)?;
            let processed = conn.process_new_packets();
            while conn.wants_write() && conn.write_tls(tcp).is_ok() {}
            processed.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let (tcp, conn) = match self {
            Self::Plain(tcp) => return tcp.write_vectored(bufs),
            Self::Tls(tls) => &mut **tls,
        };
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

    fn flush(&mut self) -> io::Result<()> {
        if let Self::Tls(tls) = self {
            let (tcp, conn) = &mut **tls;
            while conn.wants_write() {
                conn.write_tls(tcp)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
