//! Opening a connection: resolve, connect with a timeout, send the upgrade request, check the
//! answer. Blocking, with deadlines; the socket turns non-blocking afterwards.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use freeboard_proto::handshake::{
    ClientRequest, DEFAULT_MAX_HEAD_LEN, EMPTY_HEADER, HandshakeError, Key, Response, generate_key,
};
use freeboard_proto::http;

use super::tls::{Connection, Connector, Handshaking};
use super::{ClientConfig, ClientError, Target};
use crate::session::deflate::{self, Agreement};

/// The longest body excerpt kept from a refusal.
const BODY_EXCERPT: usize = 512;

/// A connection whose opening handshake succeeded.
pub(super) struct Opened {
    pub(super) stream: TcpStream,
    /// The TLS connection over `stream` (`wss://`).
    pub(super) tls: Option<Connection>,
    /// What the server's `101` agreed to.
    pub(super) answer: Answer,
    /// Bytes that followed the `101` head (the server's first frames).
    pub(super) leftover: Vec<u8>,
}

/// What a `101` response agreed to.
pub(super) struct Answer {
    /// The subprotocol the server chose.
    pub(super) protocol: Option<String>,
    /// The permessage-deflate parameters, if the server accepted the offer.
    pub(super) compression: Option<Agreement>,
    /// The request's head and the `101` response's, as sent and received (the blocking
    /// client shows them: [`Client::handshake`](super::Client::handshake)).
    pub(super) heads: Heads,
}

/// The heads of an opening handshake, as text (lossily decoded).
#[derive(Debug, Default, Clone)]
pub struct Heads {
    /// The upgrade request's head, as sent.
    pub request: String,
    /// The `101` response's head, as received.
    pub response: String,
}

/// The permessage-deflate offer a client makes under `config`: `None` when compression is
/// off, else whether it asks for `server_no_context_takeover` ([`Agreement::offer`]).
pub(super) fn deflate_offer(
    config: &ClientConfig,
    server_no_context_takeover: bool,
) -> Option<bool> {
    config.compression.then_some(server_no_context_takeover)
}

/// Resolves `target`, connects to each address in turn until one accepts within the connect
/// timeout, and completes the opening handshake within the handshake timeout.
pub(super) fn open(target: &Target, config: &ClientConfig) -> Result<Opened, ClientError> {
    // wss://: the TLS state first (a bad CA file, or a build without TLS, fails before any
    // connection is made).
    let tls = match target.is_secure() {
        true => Some(Connector::new(&config.tls_roots)?.connect(target.host())?),
        false => None,
    };
    let mut stream = connect_tcp(target, config.connect_timeout)?;
    stream.set_nodelay(true)?;
    let deadline = Instant::now() + config.limits.handshake_timeout;
    let offer = deflate_offer(config, false);
    let opened = match tls {
        None => handshake(&mut stream, target, config, offer, deadline)
            .map(|(answer, leftover)| Opened { stream, tls: None, answer, leftover }),
        Some(conn) => {
            let mut tls = Handshaking::new(conn, stream);
            handshake(&mut tls, target, config, offer, deadline).map(|(answer, leftover)| {
                let (conn, stream) = tls.into_parts();
                Opened { stream, tls: Some(conn), answer, leftover }
            })
        }
    };
    opened.map_err(|e| match e {
        ClientError::Io(io) if is_timeout(&io) => {
            ClientError::HandshakeTimeout(config.limits.handshake_timeout)
        }
        ClientError::Io(io) => super::tls::tls_or_io(io),
        other => other,
    })
}

/// A blocking byte stream the opening handshake runs over: TCP, or TLS over TCP.
trait HandshakeStream: Read + Write {
    fn tcp(&self) -> &TcpStream;
}

impl HandshakeStream for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl HandshakeStream for Handshaking {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
}

fn connect_tcp(target: &Target, timeout: Duration) -> Result<TcpStream, ClientError> {
    let addrs: Vec<SocketAddr> = (target.host(), target.port())
        .to_socket_addrs()
        .map_err(|source| ClientError::Resolve { host: target.host().to_owned(), source })?
        .collect();
    let deadline = Instant::now() + timeout;
    let mut last = None;
    for addr in &addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            last = Some((addr, io::Error::new(io::ErrorKind::TimedOut, "connect timed out")));
            break;
        }
        match TcpStream::connect_timeout(addr, left) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some((addr, e)),
        }
    }
    let (addr, source) = match last {
        Some((addr, e)) => (addr.to_string(), e),
        None => (target.host().to_owned(), io::Error::other("no address")),
    };
    Err(ClientError::Connect { addr, source })
}

/// Sends the upgrade request and checks the answer; returns what it agreed to and the
/// bytes after the head.
fn handshake(
    stream: &mut impl HandshakeStream,
    target: &Target,
    config: &ClientConfig,
    offer: Option<bool>,
    deadline: Instant,
) -> Result<(Answer, Vec<u8>), ClientError> {
    let key = new_key()?;
    let request = encode_request(target, config, &key, offer)?;
    stream.tcp().set_write_timeout(Some(remaining(deadline)?))?;
    stream.tcp().set_read_timeout(Some(remaining(deadline)?))?;
    stream.write_all(&request)?;
    stream.flush()?;

    let mut buf = vec![0u8; DEFAULT_MAX_HEAD_LEN];
    let mut len = 0;
    loop {
        stream.tcp().set_read_timeout(Some(remaining(deadline)?))?;
        let n = match stream.read(&mut buf[len..]) {
            Ok(0) => return Err(eof_during_handshake()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        len += n;
        match check_response(&buf[..len], config, &key, offer) {
            Ok(None) => continue,
            Ok(Some((mut answer, head_len))) => {
                answer.heads.request = String::from_utf8_lossy(&request).into_owned();
                let leftover = buf[head_len..len].to_vec();
                stream.tcp().set_read_timeout(None)?;
                stream.tcp().set_write_timeout(None)?;
                return Ok((answer, leftover));
            }
            Err(Refusal::Status { status, head_len, reason, body_len }) => {
                buf.truncate(len);
                let body = body_excerpt(stream, buf, head_len, body_len, deadline);
                return Err(ClientError::Refused { status, reason, body });
            }
            Err(Refusal::Invalid(e)) => return Err(ClientError::Handshake(e)),
            Err(Refusal::Compression(e)) => return Err(ClientError::Compression(e)),
        }
    }
}

/// A fresh `Sec-WebSocket-Key` (§4.1: a "randomly selected" nonce).
pub(super) fn new_key() -> Result<Key, ClientError> {
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).map_err(|e| ClientError::Io(io::Error::other(e)))?;
    Ok(generate_key(nonce))
}

/// The upgrade request for `target`, with the permessage-deflate offer `offer` describes.
pub(super) fn encode_request(
    target: &Target,
    config: &ClientConfig,
    key: &Key,
    offer: Option<bool>,
) -> Result<Vec<u8>, ClientError> {
    let protocols: Vec<&str> = config.protocols.iter().map(String::as_str).collect();
    let headers: Vec<(&str, &str)> =
        config.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let request = ClientRequest {
        host: target.host_header(),
        path: target.resource(),
        key,
        protocols: &protocols,
        extensions: offer.map(Agreement::offer),
        headers: &headers,
    };
    let mut buf = vec![0u8; 1024];
    let n = match request.encode(&mut buf) {
        Ok(n) => n,
        Err(e) => {
            buf.resize(e.required, 0);
            request.encode(&mut buf).map_err(|e| ClientError::Config(e.to_string()))?
        }
    };
    buf.truncate(n);
    Ok(buf)
}

/// Why a response is not a usable `101`.
pub(super) enum Refusal {
    /// Another status; the head is `head_len` bytes, with this reason phrase and, if it says
    /// so, a body of `body_len` bytes.
    Status { status: u16, head_len: usize, reason: String, body_len: Option<u64> },
    /// A `101` that fails RFC 6455 §4.1, or not HTTP.
    Invalid(HandshakeError),
    /// A `101` whose permessage-deflate parameters this client cannot honour.
    Compression(deflate::NegotiationError),
}

/// Checks the response read so far: `Ok(None)` while the head is unfinished, else what it
/// agreed to and the head's length. `offer` is the one [`encode_request`] was given.
pub(super) fn check_response(
    buf: &[u8],
    config: &ClientConfig,
    key: &Key,
    offer: Option<bool>,
) -> Result<Option<(Answer, usize)>, Refusal> {
    let protocols: Vec<&str> = config.protocols.iter().map(String::as_str).collect();
    // Only the key and the offers matter for checking the response.
    let request = ClientRequest {
        host: "",
        path: "/",
        key,
        protocols: &protocols,
        extensions: offer.map(Agreement::offer),
        headers: &[],
    };
    let mut header_space = [EMPTY_HEADER; 64];
    match Response::parse(buf, &mut header_space, &request, DEFAULT_MAX_HEAD_LEN) {
        Ok(None) => Ok(None),
        Ok(Some((response, head_len))) => {
            // The parser checked that only offered extensions came back: here, at most one
            // permessage-deflate element, with parameters this client can honour.
            let mut accepted = response.extensions();
            let compression = match (accepted.next(), accepted.next(), offer) {
                (None, _, _) => None,
                (Some(element), None, Some(server_no_context_takeover)) => Some(
                    Agreement::from_response(element, server_no_context_takeover)
                        .map_err(Refusal::Compression)?,
                ),
                _ => return Err(Refusal::Compression(deflate::NegotiationError::Unacceptable)),
            };
            let protocol = response.protocol().map(str::to_owned);
            let response = String::from_utf8_lossy(&buf[..head_len]).into_owned();
            let heads = Heads { request: String::new(), response };
            Ok(Some((Answer { protocol, compression, heads }, head_len)))
        }
        Err(HandshakeError::Refused { status, head_len }) => {
            let (reason, body_len) = refusal_head(&buf[..head_len]);
            Err(Refusal::Status { status, head_len, reason, body_len })
        }
        Err(e) => Err(Refusal::Invalid(e)),
    }
}

pub(super) fn eof_during_handshake() -> ClientError {
    ClientError::Io(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection during the handshake",
    ))
}

/// The reason phrase of a refusal's status line (`HTTP/1.1 404 Not Found` → `Not Found`) and
/// the length of its body, if its `Content-Length` is valid.
fn refusal_head(head: &[u8]) -> (String, Option<u64>) {
    let mut headers = [EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    if response.parse(head).is_err() {
        return (String::new(), None);
    }
    let reason = response.reason.unwrap_or_default().trim().to_owned();
    (reason, http::content_length(response.headers).ok().flatten())
}

/// Up to [`BODY_EXCERPT`] bytes of a refusal's body: what came with the head, plus what
/// arrives within a short wait (the server usually closes right after it).
fn body_excerpt(
    stream: &mut impl HandshakeStream,
    mut buf: Vec<u8>,
    head_len: usize,
    body_len: Option<u64>,
    deadline: Instant,
) -> String {
    let length = body_len.map_or(BODY_EXCERPT, |n| n.min(BODY_EXCERPT as u64) as usize);
    let want = head_len + length;
    let wait_until = deadline.min(Instant::now() + Duration::from_millis(500));
    while buf.len() < want {
        let Ok(left) = remaining(wait_until) else { break };
        if stream.tcp().set_read_timeout(Some(left)).is_err() {
            break;
        }
        let mut more = [0u8; BODY_EXCERPT];
        match stream.read(&mut more[..want - buf.len()]) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&more[..n]),
        }
    }
    let body = &buf[head_len..buf.len().min(want)];
    String::from_utf8_lossy(body).into_owned()
}

fn remaining(deadline: Instant) -> Result<Duration, ClientError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ClientError::Io(io::ErrorKind::TimedOut.into()));
    }
    Ok(left)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock)
}
