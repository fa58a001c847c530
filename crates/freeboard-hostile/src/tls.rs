//! Attacks on the TLS listener: many sockets from one address that each send the first bytes
//! of a ClientHello and stop, holding a handshake each; and a `wss://` client that connects
//! from an address of its choosing (another loopback address) to see whether it still gets in.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use socket2::{Domain, Socket, Type};

use crate::ws::upgrade_request;

/// The first 10 bytes of a ClientHello: a handshake record header that promises 512 bytes,
/// the handshake header of a ClientHello, and the first byte of its version.
pub const CLIENT_HELLO_START: [u8; 10] =
    [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03];

/// Opens `n` connections to `addr` from `from`, each sending [`CLIENT_HELLO_START`] and
/// nothing more; returns them, open (a socket the server refused is among them, closed by its
/// peer: see [`still_held`]).
pub fn stalled_client_hellos(addr: SocketAddr, from: IpAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(mut stream) = connect_from(addr, from) else { continue };
        if stream.write_all(&CLIENT_HELLO_START).is_ok() {
            held.push(stream);
        }
    }
    held
}

/// How many of `streams` the server still holds open (no EOF, no reset).
pub fn still_held(streams: &[TcpStream]) -> usize {
    streams
        .iter()
        .filter(|stream| {
            let _ = stream.set_nonblocking(true);
            let mut byte = [0u8; 64];
            let open = matches!((&**stream).read(&mut byte),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock);
            let _ = stream.set_nonblocking(false);
            open
        })
        .count()
}

/// A TCP connection to `addr` whose local address is `from` (bound before connecting).
pub fn connect_from(addr: SocketAddr, from: IpAddr) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(from, 0).into())?;
    socket.connect_timeout(&addr.into(), Duration::from_secs(10))?;
    let stream: TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A `wss://` client over rustls that trusts the CA in `ca_pem` and names the server
/// `localhost`.
pub struct WssClient {
    tls: rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
}

impl WssClient {
    /// Connects to `addr` from `from`, completes the TLS handshake and upgrades `/echo`;
    /// the error says which step failed.
    pub fn open(addr: SocketAddr, from: IpAddr, ca_pem: &Path) -> Result<Self, String> {
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(ca_pem).map_err(|e| format!("reading the CA: {e}"))?;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots.add(cert.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("a DNS name");
        let conn = rustls::ClientConnection::new(Arc::new(config), name)
            .map_err(|e| format!("rustls: {e}"))?;
        let tcp = connect_from(addr, from).map_err(|e| format!("connect: {e}"))?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock).map_err(|e| format!("TLS handshake: {e}"))?;
        }
        tls.write_all(upgrade_request("/echo", "").as_bytes())
            .map_err(|e| format!("sending the upgrade: {e}"))?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            tls.read_exact(&mut byte).map_err(|e| format!("reading the 101: {e}"))?;
            head.push(byte[0]);
        }
        if !head.starts_with(b"HTTP/1.1 101") {
            return Err(format!("upgrade answered {}", String::from_utf8_lossy(&head)));
        }
        Ok(Self { tls })
    }

    /// Sends one masked binary message of `payload` (at most 125 bytes) and checks its echo.
    pub fn echo(&mut self, payload: &[u8]) -> Result<(), String> {
        assert!(payload.len() <= 125, "one short frame");
        let frame = freeboard_test::frame(0x82, payload, freeboard_test::TEST_MASK);
        self.tls.write_all(&frame).map_err(|e| format!("sending: {e}"))?;
        let mut reply = vec![0u8; 2 + payload.len()];
        self.tls.read_exact(&mut reply).map_err(|e| format!("reading the echo: {e}"))?;
        match (reply[0], usize::from(reply[1]), &reply[2..]) {
            (0x82, len, echoed) if len == payload.len() && echoed == payload => Ok(()),
            _ => Err(format!("a wrong echo: {reply:?}")),
        }
    }
}
