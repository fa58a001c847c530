//! The opening handshake (RFC 6455 §4), parsed with `httparse` into a caller's header array.
//!
//! Server side: [`Request::parse`] checks the upgrade request and [`Request::accept`] writes
//! the `101 Switching Protocols` answer; every refusal is a [`HandshakeError`] that knows its
//! HTTP status and writes its own response with [`HandshakeError::write_response`].
//! Client side: [`ClientRequest::encode`] writes the request and [`Response::parse`] checks the
//! answer. Bytes after the end of a request or response are not consumed: they are the first
//! frames and stay in the caller's buffer. The HTTP/1.1 pieces the handshake shares with
//! plain requests (header lists, the origin form of a target, response heads) are
//! [`http`](crate::http)'s.
//!
//! ```
//! use freeboard_proto::handshake::{Request, EMPTY_HEADER};
//!
//! let bytes = b"GET /chat HTTP/1.1\r\nHost: example.com\r\nUpgrade: websocket\r\n\
//!     Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
//!     Sec-WebSocket-Version: 13\r\n\r\n\x81\x80";
//! let mut headers = [EMPTY_HEADER; 16];
//! let (request, len) = Request::parse(bytes, &mut headers, 8192).unwrap().unwrap();
//! assert_eq!(request.path(), "/chat");
//! assert_eq!(&bytes[len..], b"\x81\x80"); // the first frame, handed back
//! let mut out = [0u8; 256];
//! let n = request.accept(None, None, &mut out).unwrap();
//! assert!(out[..n].ends_with(b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"));
//! ```

use core::fmt::{self, Write as _};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha1::{Digest as _, Sha1};

use crate::InsufficientSize;
use crate::http::{HeadWriter, elements, header, list, origin_form, single_header, write_refusal};

pub use httparse::{EMPTY_HEADER, Header};

/// The GUID of §1.3, appended to the key before hashing.
const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// A `Sec-WebSocket-Key`: 16 random bytes in base64.
pub type Key = [u8; 24];
/// A `Sec-WebSocket-Accept`: a SHA-1 digest in base64.
pub type AcceptKey = [u8; 28];

/// The default limit on the size of a request or response head, in bytes.
pub const DEFAULT_MAX_HEAD_LEN: usize = 8192;

/// Why an opening handshake failed. Server-side errors carry the status to answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandshakeError {
    /// Not parseable as HTTP/1.1 (400).
    Malformed,
    /// The head is longer than the limit or has more headers than the array holds (431).
    HeadTooLarge,
    /// The method is not GET (405).
    MethodNotAllowed,
    /// The HTTP version is not 1.1 (400; the RFC requires "at least" 1.1).
    HttpVersion,
    /// No `Host` header, or more than one (400).
    Host,
    /// No `Upgrade: websocket` (426: the resource speaks WebSocket only).
    UpgradeRequired,
    /// `Connection` does not list `upgrade` (400).
    ConnectionNotUpgrade,
    /// `Sec-WebSocket-Key` missing, repeated, or not 16 bytes of base64 (400).
    Key,
    /// `Sec-WebSocket-Version` missing or repeated (400).
    VersionMissing,
    /// `Sec-WebSocket-Version` is not 13 (426, answered with `Sec-WebSocket-Version: 13`).
    UnsupportedVersion,
    /// The `Origin` is not allowed (403).
    OriginRefused,
    /// Client side: the server answered with this status instead of 101. The head was
    /// `head_len` bytes long; a body, if any, follows it in the buffer.
    Refused {
        /// The HTTP status.
        status: u16,
        /// The length of the response head.
        head_len: usize,
    },
    /// Client side: `Sec-WebSocket-Accept` is missing or wrong.
    AcceptMismatch,
    /// Client side: the server chose a subprotocol that was not offered.
    UnexpectedProtocol,
    /// Client side: the server chose an extension that was not offered.
    UnexpectedExtension,
}

impl HandshakeError {
    /// The HTTP status a server answers this error with.
    pub fn status(&self) -> u16 {
        match self {
            Self::HeadTooLarge => 431,
            Self::MethodNotAllowed => 405,
            Self::UpgradeRequired | Self::UnsupportedVersion => 426,
            Self::OriginRefused => 403,
            Self::Refused { status, .. } => *status,
            _ => 400,
        }
    }

    /// Writes the complete HTTP response refusing the upgrade for this error into `out`
    /// (status line, the headers the RFC asks for, a one-line plain-text body) and returns its
    /// length. The connection should be closed after it.
    pub fn write_response(&self, out: &mut [u8]) -> Result<usize, InsufficientSize> {
        let extra = match self {
            Self::UnsupportedVersion => "Sec-WebSocket-Version: 13\r\n",
            Self::UpgradeRequired => "Upgrade: websocket\r\n",
            Self::MethodNotAllowed => "Allow: GET\r\n",
            _ => "",
        };
        write_refusal(self.status(), extra, self.description(), out)
    }

    fn description(&self) -> &'static str {
        match self {
            Self::Malformed => "malformed HTTP request",
            Self::HeadTooLarge => "request head too large",
            Self::MethodNotAllowed => "WebSocket upgrade needs GET",
            Self::HttpVersion => "WebSocket upgrade needs HTTP/1.1",
            Self::Host => "exactly one Host header is required",
            Self::UpgradeRequired => "this endpoint speaks WebSocket: send Upgrade: websocket",
            Self::ConnectionNotUpgrade => "Connection header must include upgrade",
            Self::Key => "Sec-WebSocket-Key must be 16 bytes in base64",
            Self::VersionMissing => "exactly one Sec-WebSocket-Version header is required",
            Self::UnsupportedVersion => "only Sec-WebSocket-Version 13 is supported",
            Self::OriginRefused => "origin not allowed",
            Self::Refused { .. } => "server refused the upgrade",
            Self::AcceptMismatch => "Sec-WebSocket-Accept does not match the key",
            Self::UnexpectedProtocol => "server chose a subprotocol that was not offered",
            Self::UnexpectedExtension => "server chose an extension that was not offered",
        }
    }
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused { status, .. } => write!(f, "server answered {status} instead of 101"),
            other => write!(f, "{} ({})", other.description(), other.status()),
        }
    }
}

impl core::error::Error for HandshakeError {}

/// Whether `Accept` lists `text/event-stream`, as an `EventSource` request's does (WHATWG
/// HTML §9.2.3: "Let request's header list contain `Accept`/`text/event-stream`").
pub fn accepts_event_stream(headers: &[Header<'_>]) -> bool {
    list(headers, "accept").any(|media| {
        let media = media.split(|b| *b == b';').next().unwrap_or_default().trim_ascii();
        media.eq_ignore_ascii_case(b"text/event-stream")
    })
}

/// A parsed, checked upgrade request. Borrows the request bytes and the header array.
#[derive(Debug)]
pub struct Request<'h, 'b> {
    path: &'b str,
    headers: &'h [Header<'b>],
    key: &'b [u8],
}

impl<'h, 'b> Request<'h, 'b> {
    /// Parses the request head at the front of `buf` and checks what an upgrade and an event
    /// stream both need — §4.2.1: "An HTTP/1.1 or higher GET request". The request without a
    /// key, and its length; `Ok(None)` while the head is unfinished and shorter than
    /// `max_head_len`. A server uses it alone for a plain `GET` it decides as it would an
    /// upgrade of the same target (freeboard's presence listings).
    pub fn parse_get(
        buf: &'b [u8],
        headers: &'h mut [Header<'b>],
        max_head_len: usize,
    ) -> Result<Option<(Self, usize)>, HandshakeError> {
        let mut req = httparse::Request::new(headers);
        let len = match req.parse(buf) {
            Ok(httparse::Status::Complete(len)) if len <= max_head_len => len,
            Ok(httparse::Status::Partial) if buf.len() < max_head_len => return Ok(None),
            Ok(_) | Err(httparse::Error::TooManyHeaders) => {
                return Err(HandshakeError::HeadTooLarge);
            }
            Err(_) => return Err(HandshakeError::Malformed),
        };
        let httparse::Request { method, path, version, headers } = req;
        // NOTE(unwrap): a complete request has a method, path and version.
        if method.unwrap() != "GET" {
            return Err(HandshakeError::MethodNotAllowed);
        }
        if version.unwrap() != 1 {
            return Err(HandshakeError::HttpVersion);
        }
        Ok(Some((Self { path: origin_form(path.unwrap()), headers, key: &[] }, len)))
    }

    /// Parses and checks an upgrade request at the front of `buf`.
    ///
    /// Returns `Ok(None)` while the head is unfinished and shorter than `max_head_len`, and the
    /// request with its length once complete. `headers` bounds the number of headers.
    pub fn parse(
        buf: &'b [u8],
        headers: &'h mut [Header<'b>],
        max_head_len: usize,
    ) -> Result<Option<(Self, usize)>, HandshakeError> {
        let Some((mut request, len)) = Self::parse_get(buf, headers, max_head_len)? else {
            return Ok(None);
        };
        let headers = request.headers;
        // §4.2.1, items 2–6, in the order a browser developer would want them reported.
        if !list(headers, "upgrade").any(|t| t.eq_ignore_ascii_case(b"websocket")) {
            return Err(HandshakeError::UpgradeRequired);
        }
        if single_header(headers, "host").is_none() {
            return Err(HandshakeError::Host);
        }
        if !list(headers, "connection").any(|t| t.eq_ignore_ascii_case(b"upgrade")) {
            return Err(HandshakeError::ConnectionNotUpgrade);
        }
        let key = single_header(headers, "sec-websocket-key").ok_or(HandshakeError::Key)?;
        let mut decoded = [0u8; 18];
        if key.len() != 24 || BASE64.decode_slice(key, &mut decoded) != Ok(16) {
            return Err(HandshakeError::Key);
        }
        // Like `Host` and the key, the version must be given once: two values cannot both be
        // the one the client speaks.
        match single_header(headers, "sec-websocket-version") {
            None => return Err(HandshakeError::VersionMissing),
            Some(version) if version.trim_ascii() != b"13" => {
                return Err(HandshakeError::UnsupportedVersion);
            }
            Some(_) => {}
        }
        request.key = key;
        Ok(Some((request, len)))
    }

    /// Parses and checks a Server-Sent Events request at the front of `buf`: a `GET` over
    /// HTTP/1.1 with one `Host` whose `Accept` lists `text/event-stream` (what `EventSource`
    /// sends). It subscribes as an upgrade does, so it is the same type, without a key
    /// ([`is_event_stream`](Self::is_event_stream) tells them apart). `Ok(None)` while the
    /// head is unfinished, as [`parse`](Self::parse).
    pub fn parse_event_stream(
        buf: &'b [u8],
        headers: &'h mut [Header<'b>],
        max_head_len: usize,
    ) -> Result<Option<(Self, usize)>, HandshakeError> {
        let Some((request, len)) = Self::parse_get(buf, headers, max_head_len)? else {
            return Ok(None);
        };
        let headers = request.headers;
        if single_header(headers, "host").is_none() {
            return Err(HandshakeError::Host);
        }
        if !accepts_event_stream(headers) {
            return Err(HandshakeError::UpgradeRequired);
        }
        Ok(Some((request, len)))
    }

    /// Whether this is a Server-Sent Events request
    /// ([`parse_event_stream`](Self::parse_event_stream)) rather than a WebSocket upgrade.
    pub fn is_event_stream(&self) -> bool {
        self.key.is_empty()
    }

    /// This request with `path` as its target (a server that rewrites the target, as it
    /// does a Server-Sent Events request's `Last-Event-ID` into `since=`, before the
    /// application sees it).
    pub fn with_path<'p>(&self, path: &'p str) -> Request<'h, 'p>
    where
        'b: 'p,
    {
        Request { path, headers: self.headers, key: self.key }
    }

    /// The request target: path and query (of an absolute-form target too).
    pub fn path(&self) -> &'b str {
        self.path
    }

    /// The `Host` header.
    pub fn host(&self) -> &'b [u8] {
        // NOTE(unwrap): parse checked that there is exactly one.
        single_header(self.headers, "host").unwrap_or_default()
    }

    /// The `Origin` header, sent by browsers.
    pub fn origin(&self) -> Option<&'b [u8]> {
        self.header("origin")
    }

    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&'b [u8]> {
        header(self.headers, name)
    }

    /// All headers, in order.
    pub fn headers(&self) -> &'h [Header<'b>] {
        self.headers
    }

    /// The subprotocols the client offers, in its order of preference.
    pub fn protocols(&self) -> impl Iterator<Item = &'b str> + '_ {
        list(self.headers, "sec-websocket-protocol").filter_map(|t| core::str::from_utf8(t).ok())
    }

    /// The first of `supported` that the client offers (server preference order).
    pub fn select_protocol<'s>(&self, supported: &[&'s str]) -> Option<&'s str> {
        supported.iter().copied().find(|s| self.protocols().any(|p| p == *s))
    }

    /// The extensions the client offers, each with its parameters, e.g.
    /// `permessage-deflate; client_max_window_bits`. The hook for extension negotiation.
    pub fn extensions(&self) -> impl Iterator<Item = Extension<'b>> + '_ {
        list(self.headers, "sec-websocket-extensions").filter_map(Extension::parse)
    }

    /// Refuses the request unless its `Origin` is one of `allowed` (compared
    /// case-insensitively, e.g. `https://example.com`). Requests without `Origin` come from
    /// non-browser clients and pass.
    pub fn check_origin(&self, allowed: &[&str]) -> Result<(), HandshakeError> {
        match self.origin() {
            Some(origin) if !allowed.iter().any(|a| a.as_bytes().eq_ignore_ascii_case(origin)) => {
                Err(HandshakeError::OriginRefused)
            }
            _ => Ok(()),
        }
    }

    /// The `Sec-WebSocket-Accept` value answering this request's key.
    pub fn accept_key(&self) -> AcceptKey {
        accept_key(self.key)
    }

    /// Writes the `101 Switching Protocols` response into `out` and returns its length.
    ///
    /// `protocol` should come from [`select_protocol`](Self::select_protocol); `extensions` is
    /// the negotiated `Sec-WebSocket-Extensions` value, if any.
    pub fn accept(
        &self,
        protocol: Option<&str>,
        extensions: Option<&str>,
        out: &mut [u8],
    ) -> Result<usize, InsufficientSize> {
        let key = self.accept_key();
        let mut w = HeadWriter::new(out);
        w.push(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",
        );
        w.push(b"Sec-WebSocket-Accept: ");
        w.push(&key);
        w.push(b"\r\n");
        if let Some(protocol) = protocol {
            let _ = write!(w, "Sec-WebSocket-Protocol: {protocol}\r\n");
        }
        if let Some(extensions) = extensions {
            let _ = write!(w, "Sec-WebSocket-Extensions: {extensions}\r\n");
        }
        w.push(b"\r\n");
        w.finish()
    }
}

/// One offered or accepted extension: its name and its raw parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extension<'b> {
    /// The extension's name, e.g. `permessage-deflate`.
    pub name: &'b str,
    /// The parameters after the name, `;`-separated, trimmed (empty if none).
    pub params: &'b str,
}

impl<'b> Extension<'b> {
    fn parse(token: &'b [u8]) -> Option<Self> {
        let token = core::str::from_utf8(token).ok()?;
        let (name, params) = token.split_once(';').unwrap_or((token, ""));
        Some(Self { name: name.trim(), params: params.trim() })
    }
}

/// The client's upgrade request.
#[derive(Debug, Clone, Copy)]
pub struct ClientRequest<'a> {
    /// The `Host` header: host, and port when it is not the scheme's default.
    pub host: &'a str,
    /// The request target: path and query, starting with `/`.
    pub path: &'a str,
    /// The key, from [`generate_key`] over 16 random bytes.
    pub key: &'a Key,
    /// Subprotocols to offer, most preferred first.
    pub protocols: &'a [&'a str],
    /// A `Sec-WebSocket-Extensions` offer, if any.
    pub extensions: Option<&'a str>,
    /// Further headers (`Origin`, `Authorization`, …) as name/value pairs.
    pub headers: &'a [(&'a str, &'a str)],
}

impl ClientRequest<'_> {
    /// Writes the request into `out` and returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, InsufficientSize> {
        let mut w = HeadWriter::new(out);
        let _ = write!(
            w,
            "GET {} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ",
            self.path, self.host
        );
        w.push(self.key);
        w.push(b"\r\n");
        for (i, protocol) in self.protocols.iter().enumerate() {
            let _ = match i {
                0 => write!(w, "Sec-WebSocket-Protocol: {protocol}"),
                _ => write!(w, ", {protocol}"),
            };
        }
        if !self.protocols.is_empty() {
            w.push(b"\r\n");
        }
        if let Some(extensions) = self.extensions {
            let _ = write!(w, "Sec-WebSocket-Extensions: {extensions}\r\n");
        }
        for (name, value) in self.headers {
            let _ = write!(w, "{name}: {value}\r\n");
        }
        w.push(b"\r\n");
        w.finish()
    }
}

/// The base64 `Sec-WebSocket-Key` for 16 random bytes (§4.1: "randomly selected").
pub fn generate_key(nonce: [u8; 16]) -> Key {
    let mut key = [0u8; 24];
    // NOTE(unwrap): 16 bytes are exactly 24 base64 characters.
    BASE64.encode_slice(nonce, &mut key).expect("16 bytes encode to 24");
    key
}

/// The `Sec-WebSocket-Accept` value for a key (§4.2.2, item 5.4).
pub fn accept_key(key: &[u8]) -> AcceptKey {
    let digest = Sha1::new().chain_update(key).chain_update(GUID).finalize();
    let mut out = [0u8; 28];
    // NOTE(unwrap): 20 bytes are exactly 28 base64 characters.
    BASE64.encode_slice(digest, &mut out).expect("20 bytes encode to 28");
    out
}

/// A checked `101` response to our upgrade request.
#[derive(Debug)]
pub struct Response<'h, 'b> {
    headers: &'h [Header<'b>],
}

impl<'h, 'b> Response<'h, 'b> {
    /// Parses and checks the server's answer to `request`.
    ///
    /// Returns `Ok(None)` while the head is unfinished, and the response with its length once
    /// complete. A status other than 101 is [`HandshakeError::Refused`].
    pub fn parse(
        buf: &'b [u8],
        headers: &'h mut [Header<'b>],
        request: &ClientRequest<'_>,
        max_head_len: usize,
    ) -> Result<Option<(Self, usize)>, HandshakeError> {
        let mut res = httparse::Response::new(headers);
        let len = match res.parse(buf) {
            Ok(httparse::Status::Complete(len)) if len <= max_head_len => len,
            Ok(httparse::Status::Complete(_)) => return Err(HandshakeError::HeadTooLarge),
            Ok(httparse::Status::Partial) if buf.len() >= max_head_len => {
                return Err(HandshakeError::HeadTooLarge);
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(HandshakeError::HeadTooLarge),
            Err(_) => return Err(HandshakeError::Malformed),
        };
        // NOTE(unwrap): a complete response has a status code.
        let status = res.code.unwrap();
        if status != 101 {
            return Err(HandshakeError::Refused { status, head_len: len });
        }
        let headers = &*res.headers;
        // §4.1: the client MUST _Fail_ unless Upgrade is websocket, Connection is upgrade, the
        // accept key matches, and protocol and extensions were among those offered.
        let upgrade = single_header(headers, "upgrade").unwrap_or_default();
        if !upgrade.trim_ascii().eq_ignore_ascii_case(b"websocket")
            || !list(headers, "connection").any(|t| t.eq_ignore_ascii_case(b"upgrade"))
        {
            return Err(HandshakeError::UpgradeRequired);
        }
        if single_header(headers, "sec-websocket-accept").map(<[u8]>::trim_ascii)
            != Some(&accept_key(request.key)[..])
        {
            return Err(HandshakeError::AcceptMismatch);
        }
        let response = Self { headers };
        if response.protocol().is_some_and(|p| !request.protocols.contains(&p)) {
            return Err(HandshakeError::UnexpectedProtocol);
        }
        let offered = request.extensions.unwrap_or("").as_bytes();
        for accepted in response.extensions() {
            // Extension names are compared as the server compares the offer's: a server
            // that answers `Permessage-Deflate` to `permessage-deflate` chose what was offered.
            let same = |o: Extension<'_>| o.name.eq_ignore_ascii_case(accepted.name);
            if !elements(offered).filter_map(Extension::parse).any(same) {
                return Err(HandshakeError::UnexpectedExtension);
            }
        }
        Ok(Some((response, len)))
    }

    /// The subprotocol the server chose.
    pub fn protocol(&self) -> Option<&'b str> {
        single_header(self.headers, "sec-websocket-protocol")
            .and_then(|v| core::str::from_utf8(v.trim_ascii()).ok())
    }

    /// The extensions the server accepted.
    pub fn extensions(&self) -> impl Iterator<Item = Extension<'b>> + '_ {
        list(self.headers, "sec-websocket-extensions").filter_map(Extension::parse)
    }

    /// All headers, in order.
    pub fn headers(&self) -> &'h [Header<'b>] {
        self.headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RFC_REQUEST: &[u8] =
        b"GET /chat HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\n\
        Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
        Origin: http://example.com\r\nSec-WebSocket-Protocol: chat, superchat\r\n\
        Sec-WebSocket-Version: 13\r\n\r\n";

    fn parse(req: &[u8]) -> Result<Option<usize>, HandshakeError> {
        let mut headers = [EMPTY_HEADER; 16];
        Request::parse(req, &mut headers, 1024).map(|r| r.map(|(_, len)| len))
    }

    #[test]
    fn an_event_stream_request_is_a_get_that_accepts_text_event_stream() {
        fn parse(req: &[u8]) -> Result<Option<(&str, bool, usize)>, HandshakeError> {
            let mut headers = [EMPTY_HEADER; 16];
            Request::parse_event_stream(req, &mut headers, 1024)
                .map(|r| r.map(|(r, len)| (r.path(), r.is_event_stream(), len)))
        }
        let req = b"GET /topic/a?also=b HTTP/1.1\r\nHost: h\r\nAccept: text/html, Text/Event-Stream;q=1\r\n\r\n";
        assert_eq!(parse(req), Ok(Some(("/topic/a?also=b", true, req.len()))));
        assert_eq!(parse(&req[..20]), Ok(None));
        let no_accept = b"GET /t HTTP/1.1\r\nHost: h\r\nAccept: text/html\r\n\r\n";
        assert_eq!(parse(no_accept), Err(HandshakeError::UpgradeRequired));
        let post = b"POST /t HTTP/1.1\r\nHost: h\r\nAccept: text/event-stream\r\n\r\n";
        assert_eq!(parse(post), Err(HandshakeError::MethodNotAllowed));
        let no_host = b"GET /t HTTP/1.1\r\nAccept: text/event-stream\r\n\r\n";
        assert_eq!(parse(no_host), Err(HandshakeError::Host));
        let mut headers = [EMPTY_HEADER; 16];
        let (ws, _) = Request::parse(RFC_REQUEST, &mut headers, 1024).unwrap().unwrap();
        assert!(!ws.is_event_stream());
        assert_eq!(ws.with_path("/other").path(), "/other");
    }

    fn replace(from: &str, to: &str) -> Vec<u8> {
        String::from_utf8(RFC_REQUEST.to_vec()).unwrap().replace(from, to).into_bytes()
    }

    extern crate std;
    use std::format;
    use std::string::String;
    use std::vec::Vec;

    #[test]
    fn rfc_example() {
        let mut headers = [EMPTY_HEADER; 16];
        let (req, len) = Request::parse(RFC_REQUEST, &mut headers, 1024).unwrap().unwrap();
        assert_eq!(len, RFC_REQUEST.len());
        assert_eq!(&req.accept_key(), b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(req.select_protocol(&["superchat", "chat"]), Some("superchat"));
        assert_eq!(req.select_protocol(&["mqtt"]), None);
        assert_eq!(req.check_origin(&["HTTP://example.com"]), Ok(()));
        assert_eq!(req.check_origin(&["https://evil.example"]), Err(HandshakeError::OriginRefused));
        let mut out = [0u8; 200];
        let n = req.accept(Some("chat"), None, &mut out).unwrap();
        let text = core::str::from_utf8(&out[..n]).unwrap();
        assert!(text.starts_with("HTTP/1.1 101 Switching Protocols\r\n"));
        assert!(text.contains("Sec-WebSocket-Protocol: chat\r\n"));
        assert_eq!(req.accept(None, None, &mut out[..10]), Err(InsufficientSize { required: 129 }));
    }

    #[test]
    fn every_prefix_is_incomplete() {
        for cut in 0..RFC_REQUEST.len() {
            assert_eq!(parse(&RFC_REQUEST[..cut]), Ok(None), "cut {cut}");
        }
    }

    #[test]
    fn refusals_carry_their_status() {
        let cases: &[(Vec<u8>, HandshakeError, u16)] = &[
            (replace("GET", "POST"), HandshakeError::MethodNotAllowed, 405),
            (replace("HTTP/1.1", "HTTP/1.0"), HandshakeError::HttpVersion, 400),
            (replace("Upgrade: websocket", "Upgrade: h2c"), HandshakeError::UpgradeRequired, 426),
            (replace("Host", "X-Host"), HandshakeError::Host, 400),
            (
                replace("Connection: Upgrade", "Connection: keep-alive"),
                HandshakeError::ConnectionNotUpgrade,
                400,
            ),
            (replace("dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZQ=="), HandshakeError::Key, 400),
            (replace("Version: 13", "Version: 8"), HandshakeError::UnsupportedVersion, 426),
            (replace("Sec-WebSocket-Version: 13\r\n", ""), HandshakeError::VersionMissing, 400),
            (
                replace(
                    "Sec-WebSocket-Version: 13\r\n",
                    "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Version: 8\r\n",
                ),
                HandshakeError::VersionMissing,
                400,
            ),
            (replace("GET /chat", "GET /chat\x01"), HandshakeError::Malformed, 400),
        ];
        for (request, error, status) in cases {
            assert_eq!(parse(request), Err(*error), "{}", String::from_utf8_lossy(request));
            assert_eq!(error.status(), *status);
        }
    }

    #[test]
    fn tokens_are_case_insensitive_inside_lists() {
        let req = replace("Connection: Upgrade", "Connection: keep-alive,  UPGRADE ");
        assert!(parse(&req).unwrap().is_some());
        let req = replace("Upgrade: websocket", "Upgrade: WebSocket");
        assert!(parse(&req).unwrap().is_some());
    }

    #[test]
    fn oversized_heads_get_431() {
        let mut big = RFC_REQUEST[..RFC_REQUEST.len() - 2].to_vec();
        big.extend_from_slice(b"X-Filler: ");
        big.resize(2000, b'a');
        assert_eq!(parse(&big), Err(HandshakeError::HeadTooLarge));
        let many: Vec<u8> =
            [&RFC_REQUEST[..RFC_REQUEST.len() - 2], &b"A: b\r\n".repeat(20), b"\r\n"].concat();
        assert_eq!(parse(&many), Err(HandshakeError::HeadTooLarge));
    }

    #[test]
    fn refusal_responses() {
        let mut out = [0u8; 300];
        let n = HandshakeError::UnsupportedVersion.write_response(&mut out).unwrap();
        let text = core::str::from_utf8(&out[..n]).unwrap();
        assert!(text.starts_with("HTTP/1.1 426 Upgrade Required\r\nSec-WebSocket-Version: 13\r\n"));
        assert!(text.ends_with("\r\n\r\nonly Sec-WebSocket-Version 13 is supported\n"));
    }

    #[test]
    fn client_round_trip() {
        let key = generate_key([7; 16]);
        let request = ClientRequest {
            host: "localhost:9001",
            path: "/echo?x=1",
            key: &key,
            protocols: &["chat", "json"],
            extensions: None,
            headers: &[("Origin", "http://localhost")],
        };
        let mut buf = [0u8; 512];
        let n = request.encode(&mut buf).unwrap();
        let mut headers = [EMPTY_HEADER; 16];
        let (req, len) = Request::parse(&buf[..n], &mut headers, 1024).unwrap().unwrap();
        assert_eq!((req.path(), len), ("/echo?x=1", n));
        assert_eq!(req.protocols().collect::<Vec<_>>(), ["chat", "json"]);
        let mut answer = [0u8; 256];
        let m = req.accept(Some("json"), None, &mut answer).unwrap();
        let mut headers = [EMPTY_HEADER; 16];
        let (res, len) =
            Response::parse(&answer[..m], &mut headers, &request, 1024).unwrap().unwrap();
        assert_eq!((res.protocol(), len), (Some("json"), m));

        let mut headers = [EMPTY_HEADER; 16];
        let wrong = ClientRequest { protocols: &["chat"], ..request };
        assert_eq!(
            Response::parse(&answer[..m], &mut headers, &wrong, 1024).unwrap_err(),
            HandshakeError::UnexpectedProtocol
        );
        let other_key = generate_key([8; 16]);
        let mut headers = [EMPTY_HEADER; 16];
        let wrong = ClientRequest { key: &other_key, ..request };
        assert_eq!(
            Response::parse(&answer[..m], &mut headers, &wrong, 1024).unwrap_err(),
            HandshakeError::AcceptMismatch
        );
        let mut headers = [EMPTY_HEADER; 16];
        let refused = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno";
        assert_eq!(
            Response::parse(refused, &mut headers, &request, 1024).unwrap_err(),
            HandshakeError::Refused { status: 403, head_len: refused.len() - 2 }
        );
    }

    #[test]
    fn accepted_extensions_match_the_offer_whatever_their_case() {
        let key = generate_key([7; 16]);
        let request = ClientRequest {
            host: "localhost",
            path: "/",
            key: &key,
            protocols: &[],
            extensions: Some("permessage-deflate; client_max_window_bits"),
            headers: &[],
        };
        let accept = accept_key(&key);
        let accept = core::str::from_utf8(&accept).unwrap();
        for (answer, outcome) in [
            ("Permessage-Deflate; server_no_context_takeover", Ok(())),
            ("PERMESSAGE-DEFLATE", Ok(())),
            ("x-webkit-deflate-frame", Err(HandshakeError::UnexpectedExtension)),
        ] {
            let head = format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                 Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Extensions: {answer}\r\n\r\n"
            );
            let mut headers = [EMPTY_HEADER; 16];
            let parsed = Response::parse(head.as_bytes(), &mut headers, &request, 1024);
            assert_eq!(parsed.map(|_| ()), outcome, "{answer}");
        }
    }
}
