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
//!
//! A certificate that does not verify is explained in a sentence with its fix
//! (`Untrusted`): self-signed, signed by an unknown CA, a CA certificate used as the
//! server's own, issued for another name, expired or not valid yet. A CA file that holds the
//! very certificate the server presents trusts it as it is, as curl and Python do, even when
//! it is marked as a CA (the certificate the usual `openssl req -x509` line makes): its name
//! and dates are still checked, and the handshake's signature proves the server holds its key.

use std::io::{self, IoSlice, Read, Write};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use mio::net::TcpStream;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConnection, DigitallySignedStruct, OtherError, RootCertStore,
    SignatureScheme,
};

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
                build(store, Vec::new()).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(ClientError::Tls),
        TlsRoots::CaFile(path) => {
            let mut store = RootCertStore::empty();
            let certs = read_certs(path)?;
            for cert in &certs {
                store.add(cert.clone()).map_err(|e| tls_error(path, e))?;
            }
            build(store, certs).map_err(|e| ClientError::Tls(e.to_string()))
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

/// The configuration for the roots in `store`; `pinned`: the CA file's certificates, each
/// trusted as the server's own certificate too.
fn build(
    store: RootCertStore,
    pinned: Vec<CertificateDer<'static>>,
) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let provider = crate::tls::provider();
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider.clone())
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
    let verifier = Arc::new(Explaining { webpki, ca_file: !pinned.is_empty(), pinned });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::ALL_VERSIONS)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
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

/// A socket error as the client reports it: [`ClientError::Tls`] when TLS failed, in the
/// words of `Untrusted` when the certificate did not verify.
pub(super) fn tls_or_io(e: io::Error) -> ClientError {
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
        return e.into();
    };
    let explained = match tls {
        rustls::Error::InvalidCertificate(error) => Untrusted::take(error),
        rustls::Error::AlertReceived(alert) => Some(format!(
            "the server ended the TLS handshake ({alert:?}): it may want a client certificate, \
             or another TLS version or cipher suite"
        )),
        _ => None,
    };
    ClientError::Tls(explained.unwrap_or_else(|| tls.to_string()))
}

/// Why the server's certificate is not trusted, in a sentence that says what to do. The
/// verifier keeps it beside the error it returns (which keeps its own kind, so the alert the
/// server gets names the reason: `unknown_ca`, `bad_certificate`, `certificate_expired`):
/// rustls runs the verifier on the thread that drives the handshake, which reports the error
/// right after.
struct Untrusted;

thread_local! {
    /// The last verification failure on this thread: the error (as `Debug`) and its sentence.
    static UNTRUSTED: std::cell::RefCell<Option<(String, String)>> =
        const { std::cell::RefCell::new(None) };
}

impl Untrusted {
    fn keep(error: &CertificateError, sentence: String) {
        UNTRUSTED.with(|u| *u.borrow_mut() = Some((format!("{error:?}"), sentence)));
    }

    /// The sentence kept for `error`, if it is the last failure on this thread.
    fn take(error: &CertificateError) -> Option<String> {
        let kept = UNTRUSTED.with(|u| u.borrow_mut().take())?;
        (kept.0 == format!("{error:?}")).then_some(kept.1)
    }
}

/// The WebPKI verifier, with its failures explained (`Untrusted`) and the CA file's own
/// certificates trusted as the server's.
#[derive(Debug)]
struct Explaining {
    webpki: Arc<WebPkiServerVerifier>,
    /// The CA file's certificates.
    pinned: Vec<CertificateDer<'static>>,
    /// The roots are a CA file's (else the operating system's).
    ca_file: bool,
}

impl Explaining {
    /// The sentence for `error`, about `end_entity` presented as `name`.
    fn explain(
        &self,
        error: &CertificateError,
        end_entity: &[u8],
        name: &ServerName<'_>,
    ) -> String {
        let name = name.to_str();
        let facts = der::facts(end_entity);
        let self_signed = facts.as_ref().is_some_and(|f| f.self_signed);
        let trust = match self.ca_file {
            true => "put it in the --ca file (ClientConfig::ca_file)",
            false => "pass it with --ca FILE (ClientConfig::ca_file)",
        };
        match error {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                let when =
                    facts.map_or(String::new(), |f| format!(" on {}", der::date(f.not_after)));
                format!(
                    "the server's certificate expired{when}: renew it on the server (or, if it \
                     is recent, check this machine's clock)"
                )
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                let when =
                    facts.map_or(String::new(), |f| format!(" until {}", der::date(f.not_before)));
                format!(
                    "the server's certificate is not valid yet{when}: check the clocks of this \
                     machine and of the one that made the certificate"
                )
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                let presented = match error {
                    CertificateError::NotValidForNameContext { presented, .. } => {
                        // rustls writes them as `DnsName("a.example")`: the name alone.
                        let bare = |p: &String| match (p.find('"'), p.rfind('"')) {
                            (Some(a), Some(b)) if a < b => p[a + 1..b].to_owned(),
                            _ => p.clone(),
                        };
                        let names: Vec<String> = presented.iter().map(bare).collect();
                        format!(" (it names {})", names.join(", "))
                    }
                    _ => String::new(),
                };
                format!(
                    "the server's certificate is not for {name}{presented}: connect with a name \
                     it lists, or issue it with {name} in its subjectAltName"
                )
            }
            _ if self_signed => format!(
                "the server's certificate is not trusted (self-signed): {trust} if you trust \
                 this server"
            ),
            CertificateError::Other(OtherError(other))
                if other.to_string().contains("CaUsedAsEndEntity") =>
            {
                format!(
                    "the server presents a CA certificate (basicConstraints CA:TRUE) as its own: \
                     {trust} exactly as the server has it to trust it as it is, or give the \
                     server a certificate signed by that CA"
                )
            }
            CertificateError::UnknownIssuer
            | CertificateError::BadSignature
            | CertificateError::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => {
                "the server's certificate is signed by a CA this client does not trust: give \
                 that CA's certificate with --ca FILE (ClientConfig::ca_file), or have the \
                 server send its intermediate certificates too"
                    .to_owned()
            }
            other => format!("the server's certificate does not verify ({other:?})"),
        }
    }

    /// Trusts `end_entity` as it is when the CA file holds it: checks its name and dates.
    fn pinned(
        &self,
        end_entity: &CertificateDer<'_>,
        name: &ServerName<'_>,
        now: UnixTime,
    ) -> Option<Result<ServerCertVerified, rustls::Error>> {
        if !self.pinned.iter().any(|p| p.as_ref() == end_entity.as_ref()) {
            return None;
        }
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity);
        let named = parsed.and_then(|p| rustls::client::verify_server_name(&p, name));
        let facts = der::facts(end_entity)?;
        let now = now.as_secs();
        let error = match named {
            Err(rustls::Error::InvalidCertificate(e)) => e,
            Err(e) => return Some(Err(e)),
            Ok(()) if now > facts.not_after => CertificateError::Expired,
            Ok(()) if now < facts.not_before => CertificateError::NotValidYet,
            Ok(()) => return Some(Ok(ServerCertVerified::assertion())),
        };
        Some(Err(self.untrusted(error, end_entity, name)))
    }

    /// `error`, with its sentence kept for [`tls_or_io`].
    fn untrusted(
        &self,
        error: CertificateError,
        end_entity: &[u8],
        name: &ServerName<'_>,
    ) -> rustls::Error {
        Untrusted::keep(&error, self.explain(&error, end_entity, name));
        rustls::Error::InvalidCertificate(error)
    }
}

impl ServerCertVerifier for Explaining {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match verified {
            Err(rustls::Error::InvalidCertificate(error)) => {
                if let Some(pinned) = self.pinned(end_entity, server_name, now) {
                    return pinned;
                }
                Err(self.untrusted(error, end_entity, server_name))
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// The few facts of an X.509 certificate (RFC 5280 §4.1) the explanations need, read from its
/// DER without a parser crate: whether issuer and subject are one name, and its validity.
mod der {
    /// What [`facts`] reads.
    pub(super) struct Facts {
        pub(super) self_signed: bool,
        /// Seconds since 1970.
        pub(super) not_before: u64,
        pub(super) not_after: u64,
    }

    /// One TLV at the start of `input`: its tag, its value, and what follows it.
    fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = input.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = match first {
            0..=0x7f => (usize::from(first), rest),
            0x81..=0x84 => {
                let n = usize::from(first & 0x7f);
                let (bytes, rest) = (rest.get(..n)?, rest.get(n..)?);
                (bytes.iter().fold(0usize, |len, &b| len << 8 | usize::from(b)), rest)
            }
            _ => return None,
        };
        Some((tag, rest.get(..len)?, rest.get(len..)?))
    }

    /// Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL,
    /// serialNumber, signature, issuer, validity SEQUENCE { notBefore, notAfter }, subject,
    /// ... }, ... }
    pub(super) fn facts(cert: &[u8]) -> Option<Facts> {
        let (_, certificate, _) = tlv(cert)?;
        let (_, tbs, _) = tlv(certificate)?;
        let (tag, _, mut rest) = tlv(tbs)?;
        if tag != 0xa0 {
            rest = tbs; // no version: the serial number comes first
        }
        let (_, _, rest) = tlv(rest)?; // serialNumber
        let (_, _, rest) = tlv(rest)?; // signature
        let (_, issuer, rest) = tlv(rest)?;
        let (_, validity, rest) = tlv(rest)?;
        let (_, subject, _) = tlv(rest)?;
        let (before_tag, before, rest) = tlv(validity)?;
        let (after_tag, after, _) = tlv(rest)?;
        Some(Facts {
            self_signed: issuer == subject,
            not_before: time(before_tag, before)?,
            not_after: time(after_tag, after)?,
        })
    }

    /// A UTCTime (`YYMMDDHHMMSSZ`, RFC 5280 §4.1.2.5.1: years 50-99 are 19xx) or a
    /// GeneralizedTime (`YYYYMMDDHHMMSSZ`), in seconds since 1970.
    fn time(tag: u8, text: &[u8]) -> Option<u64> {
        let digits = |s: &[u8]| -> Option<u64> {
            s.iter()
                .try_fold(0u64, |n, &d| d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0')))
        };
        let (year, rest) = match tag {
            0x17 => {
                let yy = digits(text.get(..2)?)?;
                (if yy >= 50 { 1900 + yy } else { 2000 + yy }, text.get(2..)?)
            }
            0x18 => (digits(text.get(..4)?)?, text.get(4..)?),
            _ => return None,
        };
        let field = |i: usize| digits(rest.get(i..i + 2)?);
        let (month, day) = (field(0)?, field(2)?);
        let seconds = field(4)? * 3600 + field(6)? * 60 + field(8)?;
        Some(days_from_civil(year, month, day)? * 86_400 + seconds)
    }

    /// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (Howard Hinnant's
    /// `days_from_civil`).
    fn days_from_civil(year: u64, month: u64, day: u64) -> Option<u64> {
        if !(1..=12).contains(&month) || !(1..=31).contains(&day) || year < 1970 {
            return None;
        }
        let y = if month <= 2 { year - 1 } else { year };
        let era = y / 400;
        let yoe = y - era * 400;
        let mp = (month + 9) % 12;
        let doy = (153 * mp + 2) / 5 + day - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        (era * 146_097 + doe).checked_sub(719_468)
    }

    /// `YYYY-MM-DD` (UTC) of seconds since 1970.
    pub(super) fn date(secs: u64) -> String {
        let z = secs / 86_400 + 719_468;
        let era = z / 146_097;
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + u64::from(month <= 2);
        format!("{year:04}-{month:02}-{day:02}")
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn dates_round_trip_and_times_read_both_forms() {
            assert_eq!(days_from_civil(1970, 1, 1), Some(0));
            assert_eq!(date(0), "1970-01-01");
            assert_eq!(date(days_from_civil(2024, 2, 29).unwrap() * 86_400), "2024-02-29");
            assert_eq!(time(0x17, b"250101000000Z"), Some(1_735_689_600));
            assert_eq!(time(0x18, b"20250101000000Z"), Some(1_735_689_600));
            assert_eq!(time(0x17, b"991231235959Z"), Some(946_684_799));
            assert_eq!(time(0x17, b"garbage"), None);
        }
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
