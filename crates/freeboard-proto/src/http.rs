//! HTTP/1.1 beside the WebSocket: the pieces of a request or response head that the upgrade,
//! plain routes (health, metrics, publish), clients and webhooks all read and write, parsed in
//! this one place (RFC 9110 semantics, RFC 9112 message syntax). Heads are parsed by
//! `httparse` into the caller's [`Header`] array; these helpers read that array. Nothing here
//! allocates: values are borrowed from the caller's bytes, and replies are written into the
//! caller's buffer (or any [`fmt::Write`]).
//!
//! - Header fields: [`header`], [`single_header`], [`list`], [`has_token`].
//! - Message body framing: [`chunked_body`], [`content_length`], and [`Chunked`], the decoder
//!   of a chunked body; what is wrong is a [`FramingError`] or a [`ChunkError`], each of which
//!   knows the status that answers it.
//! - Request targets and credentials: [`origin_form`], [`target_path`], [`query_value`],
//!   [`query_values`], [`bearer_token`], [`constant_time_eq`]; [`is_text`] for a
//!   `Content-Type`.
//! - Responses: [`reason_phrase`], [`ResponseHead`], [`write_refusal`].
//!
//! ```
//! use freeboard_proto::http::{self, EMPTY_HEADER};
//!
//! let head = b"POST /publish/news?token=abc HTTP/1.1\r\nHost: x\r\n\
//!     Content-Length: 5\r\nConnection: keep-alive, Upgrade\r\n\r\nhello";
//! let mut headers = [EMPTY_HEADER; 16];
//! let mut request = httparse::Request::new(&mut headers);
//! let httparse::Status::Complete(len) = request.parse(head).unwrap() else { panic!() };
//! let target = request.path.unwrap();
//! assert_eq!(http::target_path(target), "/publish/news");
//! assert_eq!(http::query_value(target, "token"), Some("abc"));
//! assert_eq!(http::chunked_body(request.headers), Ok(false));
//! assert_eq!(http::content_length(request.headers), Ok(Some(5)));
//! assert!(http::has_token(http::header(request.headers, "connection").unwrap(), b"upgrade"));
//! assert_eq!(&head[len..], b"hello");
//! ```

use core::fmt::{self, Write as _};

use crate::InsufficientSize;

pub use httparse::{EMPTY_HEADER, Header};

/// The `WWW-Authenticate` line of a 401 for a missing bearer token (RFC 6750 §3: the
/// resource server "MUST include the HTTP WWW-Authenticate response header field").
pub const BEARER_CHALLENGE: &str = "WWW-Authenticate: Bearer\r\n";

// ---------------------------------------------------------------------------------------------
// Header fields

/// The value of the first field called `name` (field names are case-insensitive, RFC 9110
/// §5.1).
pub fn header<'b>(headers: &[Header<'b>], name: &str) -> Option<&'b [u8]> {
    headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value)
}

/// The value of the only field called `name`: `None` when it is absent or repeated (a field
/// that must appear once, such as `Host`, RFC 9112 §3.2: a server "MUST respond with a 400
/// (Bad Request) status code to any HTTP/1.1 request message that lacks a Host header field
/// and to any request message that contains more than one Host header field").
pub fn single_header<'b>(headers: &[Header<'b>], name: &str) -> Option<&'b [u8]> {
    let mut found = headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name));
    match (found.next(), found.next()) {
        (Some(h), None) => Some(h.value),
        _ => None,
    }
}

/// The elements of every field called `name`, read as one comma-separated list: several
/// fields are one list in order (RFC 9110 §5.3), each element is trimmed of whitespace and
/// empty elements are skipped (§5.6.1: a recipient "MUST parse and ignore a reasonable number
/// of empty list elements"). Quoted strings are not unquoted: the lists read here (`Upgrade`,
/// `Connection`, `Sec-WebSocket-Protocol`, `Sec-WebSocket-Extensions`) hold tokens.
pub fn list<'h, 'b>(
    headers: &'h [Header<'b>],
    name: &'h str,
) -> impl Iterator<Item = &'b [u8]> + 'h {
    headers
        .iter()
        .filter(move |h| h.name.eq_ignore_ascii_case(name))
        .flat_map(|h| elements(h.value))
}

/// Whether a comma-separated field value lists `token`, compared case-insensitively (as
/// `Connection` options, RFC 9110 §7.6.1, and `Expect`, §10.1.1, are).
pub fn has_token(value: &[u8], token: &[u8]) -> bool {
    elements(value).any(|t| t.eq_ignore_ascii_case(token))
}

/// The non-empty, trimmed elements of one comma-separated field value (RFC 9110 §5.6.1).
pub(crate) fn elements(value: &[u8]) -> impl Iterator<Item = &[u8]> + Clone {
    value.split(|&b| b == b',').map(<[u8]>::trim_ascii).filter(|t| !t.is_empty())
}

// ---------------------------------------------------------------------------------------------
// Message body framing

/// Why a message's framing was refused. A server answers with [`status`](Self::status) and
/// then closes the connection: whatever follows the head cannot be told from a next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FramingError {
    /// The `Transfer-Encoding` list does not end in exactly one `chunked` (400).
    NotFinalChunked,
    /// `chunked` after a coding that is not implemented (501).
    UnsupportedCoding,
    /// `Transfer-Encoding` and `Content-Length` together (400).
    BothLengths,
    /// A `Content-Length` that is not one run of digits, or fields that disagree (400).
    InvalidContentLength,
}

impl FramingError {
    /// The status a server answers with.
    pub fn status(self) -> u16 {
        match self {
            Self::UnsupportedCoding => 501,
            Self::NotFinalChunked | Self::BothLengths | Self::InvalidContentLength => 400,
        }
    }

    /// What the answer's plain-text body says.
    pub fn message(self) -> &'static str {
        match self {
            Self::NotFinalChunked => "Transfer-Encoding must end in one chunked",
            Self::UnsupportedCoding => "only the chunked transfer coding is supported",
            Self::BothLengths => "Transfer-Encoding with Content-Length",
            Self::InvalidContentLength => "Content-Length must be one run of digits",
        }
    }
}

impl fmt::Display for FramingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message(), self.status())
    }
}

impl core::error::Error for FramingError {}

/// Whether a message's body is chunked, from its `Transfer-Encoding` fields read as one
/// [`list`] (a coding's parameters are ignored). `Ok(false)`: no such field; the body, if
/// any, has a [`content_length`].
///
/// RFC 9112 §6.3: "If a Transfer-Encoding header field is present in a request and the
/// chunked transfer coding is not the final encoding, the message body length cannot be
/// determined reliably; the server MUST respond with the 400 (Bad Request) status code and
/// then close the connection." §6.1: "A sender MUST NOT apply the chunked transfer coding
/// more than once", and a server that receives "a transfer coding it does not understand
/// SHOULD respond with 501": every coding but `chunked` here, since none is implemented.
/// With `Content-Length` beside it the framing is ambiguous (request smuggling, §6.3 and
/// §11.2): 400.
pub fn chunked_body(headers: &[Header<'_>]) -> Result<bool, FramingError> {
    if header(headers, "transfer-encoding").is_none() {
        return Ok(false);
    }
    let codings = list(headers, "transfer-encoding")
        .map(|element| element.split(|&b| b == b';').next().unwrap_or_default().trim_ascii())
        .filter(|name| !name.is_empty());
    let (mut chunked, mut last_is_chunked, mut others) = (0usize, false, false);
    for name in codings {
        last_is_chunked = name.eq_ignore_ascii_case(b"chunked");
        chunked += usize::from(last_is_chunked);
        others |= !last_is_chunked;
    }
    if !last_is_chunked || chunked != 1 {
        return Err(FramingError::NotFinalChunked);
    }
    if others {
        return Err(FramingError::UnsupportedCoding);
    }
    if header(headers, "content-length").is_some() {
        return Err(FramingError::BothLengths);
    }
    Ok(true)
}

/// The body length a message declares, `None` without a `Content-Length`. RFC 9110 §8.6:
/// `Content-Length = 1*DIGIT`; several fields, or a list in one, are accepted only when every
/// value is the same (a recipient "MAY either reject the message as invalid or replace that
/// invalid field value with a single instance of the decimal value", only "if all of the
/// field-line values are identical"). RFC 9112 §6.3: a length that is not valid makes the
/// framing invalid, and `Transfer-Encoding` beside it is refused
/// ([`FramingError::BothLengths`]: "a sender MUST NOT send a Content-Length header field in
/// any message that contains a Transfer-Encoding header field").
pub fn content_length(headers: &[Header<'_>]) -> Result<Option<u64>, FramingError> {
    let mut length = None;
    let fields = headers.iter().filter(|h| h.name.eq_ignore_ascii_case("content-length"));
    for value in fields.flat_map(|h| h.value.split(|&b| b == b',')) {
        let n = decimal(value.trim_ascii()).ok_or(FramingError::InvalidContentLength)?;
        if length.is_some_and(|l| l != n) {
            return Err(FramingError::InvalidContentLength);
        }
        length = Some(n);
    }
    if length.is_some() && header(headers, "transfer-encoding").is_some() {
        return Err(FramingError::BothLengths);
    }
    Ok(length)
}

/// One run of ASCII digits as a `u64`; `None` when empty, anything else, or too large.
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        let digit = char::from(b).to_digit(10)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// An incremental decoder of a `Transfer-Encoding: chunked` body (RFC 9112 §7.1): sizes in
/// hex, extensions skipped, CRLF after each chunk, a trailer section read and ignored (§7.1.2
/// lets a recipient discard trailer fields it does not understand). It keeps no bytes: each
/// call to [`feed`](Self::feed) hands the caller the data in its input, as slices of it.
///
/// Every byte is bounded: the decoded body by the limit given to [`new`](Self::new), a size
/// line's extensions and the trailer section by [`Chunked::MAX_LINE`].
#[derive(Debug)]
pub struct Chunked {
    state: ChunkState,
    /// The current chunk's size (while reading its size line) or what is left of it; in the
    /// trailer section, the length of the current line.
    size: u64,
    digits: u32,
    /// Decoded bytes so far.
    decoded: u64,
    limit: u64,
    /// Bytes of the current extension, or of the trailer section.
    line: usize,
}

/// Where a [`Chunked`] decoder is in the body's grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    Size,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    Trailer,
    Done,
}

/// Why a chunked body was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChunkError {
    /// Not chunked framing (400).
    Malformed,
    /// Larger than the limit (413).
    TooLarge,
}

impl ChunkError {
    /// The status a server answers with.
    pub fn status(self) -> u16 {
        match self {
            Self::Malformed => 400,
            Self::TooLarge => 413,
        }
    }
}

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed => write!(f, "malformed chunked body ({})", self.status()),
            Self::TooLarge => write!(f, "chunked body larger than the limit ({})", self.status()),
        }
    }
}

impl core::error::Error for ChunkError {}

impl Chunked {
    /// The longest chunk extension, and trailer section, accepted.
    pub const MAX_LINE: usize = 4096;

    /// A decoder of a body of at most `limit` decoded bytes.
    pub fn new(limit: u64) -> Self {
        Self { state: ChunkState::Size, size: 0, digits: 0, decoded: 0, limit, line: 0 }
    }

    /// Decodes `input`, handing each run of data in it to `out`, which returns `false` to stop
    /// (the decoder is then left in the middle of a chunk; a caller stops to give up on the
    /// body). Returns the bytes of `input` used and whether the body is complete: bytes after
    /// a complete body are not used (they are the next message).
    pub fn feed(
        &mut self,
        input: &[u8],
        mut out: impl FnMut(&[u8]) -> bool,
    ) -> Result<(usize, bool), ChunkError> {
        use ChunkState::*;
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                Size => match char::from(b).to_digit(16) {
                    Some(d) => {
                        self.digits += 1;
                        self.size = self
                            .size
                            .checked_mul(16)
                            .map(|s| s + u64::from(d))
                            .filter(|s| {
                                self.decoded.saturating_add(*s) <= self.limit && self.digits <= 16
                            })
                            .ok_or(ChunkError::TooLarge)?;
                    }
                    None if self.digits == 0 => return Err(ChunkError::Malformed),
                    None if b == b';' => {
                        self.state = Extension;
                        self.line = 0;
                    }
                    None if b == b'\r' => self.state = SizeLf,
                    None => return Err(ChunkError::Malformed),
                },
                Extension => {
                    if b == b'\r' {
                        self.state = SizeLf;
                    } else {
                        self.line += 1;
                        if self.line > Self::MAX_LINE || b == b'\n' {
                            return Err(ChunkError::Malformed);
                        }
                    }
                }
                SizeLf if b == b'\n' => {
                    self.digits = 0;
                    self.line = 0;
                    self.state = if self.size == 0 { Trailer } else { Data };
                }
                Data => {
                    // NOTE: `size` is at most `limit - decoded` here; the cast is bounded by
                    // the input's length.
                    let n = usize::try_from(self.size).unwrap_or(usize::MAX).min(input.len() - i);
                    let go_on = out(&input[i..i + n]);
                    self.size -= n as u64;
                    self.decoded += n as u64;
                    i += n;
                    if self.size == 0 {
                        self.state = DataCr;
                    }
                    if !go_on {
                        return Ok((i, false));
                    }
                    continue;
                }
                DataCr if b == b'\r' => self.state = DataLf,
                DataLf if b == b'\n' => self.state = Size,
                Trailer => {
                    // Lines until an empty one: `size` is the current line's length, `line`
                    // the section's.
                    if b == b'\n' {
                        if self.size == 0 {
                            self.state = Done;
                            return Ok((i + 1, true));
                        }
                        self.size = 0;
                    } else if b != b'\r' {
                        self.size += 1;
                        self.line += 1;
                        if self.line > Self::MAX_LINE {
                            return Err(ChunkError::Malformed);
                        }
                    }
                }
                Done => return Ok((i, true)),
                SizeLf | DataCr | DataLf => return Err(ChunkError::Malformed),
            }
            i += 1;
        }
        Ok((i, self.state == Done))
    }

    /// Whether the last chunk and the trailer section have been read.
    pub fn is_done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// The data bytes decoded so far.
    pub fn decoded(&self) -> u64 {
        self.decoded
    }
}

// ---------------------------------------------------------------------------------------------
// Request targets and credentials

/// The origin form of a request target (path and query). RFC 9112 §3.2.2: "A server MUST
/// accept the absolute-form in requests", which proxies send (`http://host/path`); it is
/// routed by its path and query. Any other target is returned as it is.
pub fn origin_form(target: &str) -> &str {
    let Some(scheme_end) = target.find("://") else { return target };
    let scheme = &target[..scheme_end];
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return target;
    }
    let rest = &target[scheme_end + 3..];
    match rest.find(['/', '?']) {
        Some(at) => &rest[at..],
        None => "/",
    }
}

/// The path of an origin-form target, without its query (RFC 9112 §3.2.1:
/// `origin-form = absolute-path [ "?" query ]`).
pub fn target_path(target: &str) -> &str {
    target.split_once('?').map_or(target, |(path, _)| path)
}

/// The value of the first `key=value` pair called `key` in the query of `target`, if any.
///
/// The query is split on `&` and each pair at its first `=` (the
/// `application/x-www-form-urlencoded` layout, WHATWG URL §5.1); a pair without `=` has no
/// value and is skipped. Values are returned as they are on the wire, not percent-decoded:
/// what the server reads from queries (tokens, offsets, topic names) is made of characters
/// that need no escaping, and a value a client escaped anyway does not match.
pub fn query_value<'t>(target: &'t str, key: &str) -> Option<&'t str> {
    query_values(target, key).next()
}

/// The values of every `key=value` pair called `key` in the query of `target`, in order
/// (`?also=a&also=b`); see [`query_value`].
pub fn query_values<'t, 'k>(target: &'t str, key: &'k str) -> impl Iterator<Item = &'t str> + 'k
where
    't: 'k,
{
    let query = target.split_once('?').map_or("", |(_, query)| query);
    query.split('&').filter_map(move |pair| pair.strip_prefix(key)?.strip_prefix('='))
}

/// The token of an `Authorization: Bearer <token>` field (RFC 6750 §2.1:
/// `credentials = "Bearer" 1*SP b64token`; the scheme is case-insensitive, RFC 9110 §11.1),
/// from the first `Authorization` field. `None` without one, or with another scheme.
pub fn bearer_token<'b>(headers: &[Header<'b>]) -> Option<&'b str> {
    let value = core::str::from_utf8(header(headers, "authorization")?).ok()?.trim();
    let scheme = value.get(..7)?;
    scheme.eq_ignore_ascii_case("bearer ").then(|| value[7..].trim())
}

/// Compares secrets (tokens) in time that depends on their lengths only, not on where they
/// first differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a `Content-Type` names text: `text/*`, `application/json` and
/// `application/*+json` (the `+json` structured syntax suffix, RFC 6839 §3.1). The type and
/// subtype are compared case-insensitively and parameters are ignored (RFC 9110 §8.3.1).
pub fn is_text(content_type: &[u8]) -> bool {
    let essence = content_type.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
    let starts =
        |prefix: &[u8]| essence.get(..prefix.len()).is_some_and(|p| p.eq_ignore_ascii_case(prefix));
    let ends = |suffix: &[u8]| {
        let at = essence.len().checked_sub(suffix.len());
        at.is_some_and(|at| essence[at..].eq_ignore_ascii_case(suffix))
    };
    starts(b"text/")
        || essence.eq_ignore_ascii_case(b"application/json")
        || (starts(b"application/") && ends(b"+json"))
}

// ---------------------------------------------------------------------------------------------
// Responses

/// The reason phrase RFC 9110 §15 gives `status` ("Unknown" for a code it does not name).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// The head of an HTTP/1.1 response: the status line (RFC 9112 §4), the caller's header
/// lines, then `Content-Type`, `Content-Length` and `Connection: close` when asked for, and
/// the empty line. Written by [`encode`](Self::encode) into a buffer, or by `Display` into
/// any [`fmt::Write`].
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead<'a> {
    /// The status code; its reason phrase is [`reason_phrase`]'s.
    pub status: u16,
    /// Further header lines, each ending in CRLF (may be empty).
    pub headers: &'a str,
    /// The `Content-Type`, if any.
    pub content_type: Option<&'a str>,
    /// The `Content-Length`, if any. RFC 9110 §8.6: "A server MUST NOT send a Content-Length
    /// header field in any response with a status code of 1xx (Informational) or 204 (No
    /// Content)": leave it `None` for those.
    pub content_length: Option<usize>,
    /// Whether `Connection: close` says the connection closes after this response (RFC 9112
    /// §9.6).
    pub close: bool,
}

impl ResponseHead<'_> {
    /// Writes the head into `out` and returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, InsufficientSize> {
        let mut w = HeadWriter::new(out);
        let _ = write!(w, "{self}");
        w.finish()
    }
}

impl fmt::Display for ResponseHead<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP/1.1 {} {}\r\n{}", self.status, reason_phrase(self.status), self.headers)?;
        if let Some(kind) = self.content_type {
            write!(f, "Content-Type: {kind}\r\n")?;
        }
        if let Some(length) = self.content_length {
            write!(f, "Content-Length: {length}\r\n")?;
        }
        if self.close {
            f.write_str("Connection: close\r\n")?;
        }
        f.write_str("\r\n")
    }
}

/// Writes a complete refusal into `out`: `HTTP/1.1 {status}`, `extra_headers` (each ending
/// in CRLF), `Connection: close`, and `body` and a newline as `text/plain`. The connection is
/// to be closed after it.
pub fn write_refusal(
    status: u16,
    extra_headers: &str,
    body: &str,
    out: &mut [u8],
) -> Result<usize, InsufficientSize> {
    let head = ResponseHead {
        status,
        headers: extra_headers,
        content_type: Some("text/plain; charset=utf-8"),
        content_length: Some(body.len() + 1),
        close: true,
    };
    let mut w = HeadWriter::new(out);
    let _ = writeln!(w, "{head}{body}");
    w.finish()
}

/// Writes into a fixed buffer, counting what would not fit so the error can say how much
/// space was required.
pub(crate) struct HeadWriter<'o> {
    out: &'o mut [u8],
    len: usize,
}

impl<'o> HeadWriter<'o> {
    pub(crate) fn new(out: &'o mut [u8]) -> Self {
        Self { out, len: 0 }
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        if let Some(dst) = self.out.get_mut(self.len..self.len + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        self.len += bytes.len();
    }

    pub(crate) fn finish(self) -> Result<usize, InsufficientSize> {
        if self.len > self.out.len() {
            Err(InsufficientSize { required: self.len })
        } else {
            Ok(self.len)
        }
    }
}

impl fmt::Write for HeadWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    fn decode(input: &[u8], limit: u64) -> Result<(Vec<u8>, usize), ChunkError> {
        let mut chunked = Chunked::new(limit);
        let mut out = Vec::new();
        let (used, done) = chunked.feed(input, |d| {
            out.extend_from_slice(d);
            true
        })?;
        assert!(done, "incomplete");
        Ok((out, used))
    }

    #[test]
    fn chunked_bodies_decode_at_every_split() {
        let body = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\nGET / HTTP/1.1";
        let end = body.len() - b"GET / HTTP/1.1".len();
        assert_eq!(decode(body, 100), Ok((b"hello, world".to_vec(), end)));
        for split in 0..end {
            let mut chunked = Chunked::new(100);
            let mut out = Vec::new();
            let (used, done) = chunked
                .feed(&body[..split], |d| {
                    out.extend_from_slice(d);
                    true
                })
                .unwrap();
            assert_eq!((used, done), (split, false), "split at {split}");
            let (used, done) = chunked
                .feed(&body[split..], |d| {
                    out.extend_from_slice(d);
                    true
                })
                .unwrap();
            assert!(done);
            assert_eq!(split + used, end);
            assert_eq!(out, b"hello, world");
        }
        assert_eq!(decode(b"0\r\n\r\n", 0), Ok((Vec::new(), 5)));
    }

    #[test]
    fn bad_chunked_bodies_are_refused() {
        assert_eq!(decode(b"5\r\nhello\r\n0\r\n\r\n", 4), Err(ChunkError::TooLarge));
        assert_eq!(decode(b"fffffffffffffffff\r\n", u64::MAX), Err(ChunkError::TooLarge));
        assert_eq!(decode(b"x\r\n", 100), Err(ChunkError::Malformed));
        assert_eq!(decode(b"5\r\nhelloX\r\n", 100), Err(ChunkError::Malformed));
        assert_eq!(decode(b"5\nhello\r\n", 100), Err(ChunkError::Malformed));
        let long = [b"1;".as_slice(), &[b'a'; 5000]].concat();
        assert_eq!(decode(&long, 100), Err(ChunkError::Malformed));
        assert_eq!((ChunkError::Malformed.status(), ChunkError::TooLarge.status()), (400, 413));
    }

    #[test]
    fn a_stopped_decoder_reports_the_data_it_handed_over() {
        let mut chunked = Chunked::new(100);
        let (used, done) = chunked.feed(b"5\r\nhello\r\n0\r\n\r\n", |_| false).unwrap();
        assert_eq!((used, done, chunked.decoded()), (8, false, 5));
        assert!(!chunked.is_done());
    }

    /// Every way of listing codings, over one field and several: only one final `chunked`
    /// frames a body; the RFC's statuses otherwise.
    #[test]
    fn transfer_codings() {
        use FramingError::{BothLengths, NotFinalChunked, UnsupportedCoding};
        let framing = |fields: &[&str]| {
            let headers: Vec<_> = fields
                .iter()
                .map(|v| match v.split_once(": ") {
                    Some((name, value)) => Header { name, value: value.as_bytes() },
                    None => Header { name: "Transfer-Encoding", value: v.as_bytes() },
                })
                .collect();
            chunked_body(&headers)
        };
        assert_eq!(framing(&[]), Ok(false));
        assert_eq!(framing(&["Content-Length: 5"]), Ok(false));
        for chunked in [&["chunked"][..], &["Chunked"], &[" chunked "], &["CHUNKED;x=1"]] {
            assert_eq!(framing(chunked), Ok(true), "{chunked:?}");
        }
        assert_eq!(framing(&[", chunked,"]), Ok(true), "empty elements are skipped");
        assert_eq!(framing(&["", "chunked"]), Ok(true), "an empty field adds nothing");
        // Not ending in exactly one chunked, in one field or across several: 400.
        for list in [
            &["chunked, identity"][..],
            &["chunked", "identity"],
            &["chunked", "chunked"],
            &["chunked, chunked"],
            &["gzip"],
            &["identity"],
            &["chunked, gzip"],
            &["gzip, chunked, chunked"],
            &["gzip", "chunked, chunked"],
            &[""],
            &[","],
            &["chunked\"\""],
            &["chunked;x=\"a, chunked\""],
        ] {
            assert_eq!(framing(list), Err(NotFinalChunked), "{list:?}");
            assert_eq!(NotFinalChunked.status(), 400);
        }
        // A coding before the final chunked that is not implemented: 501.
        for list in [
            &["gzip, chunked"][..],
            &["gzip", "chunked"],
            &["deflate, chunked"],
            &["compress, chunked"],
            &["x-gzip, chunked"],
            &["identity, chunked"],
            &["br;q=1, chunked"],
            &["gzip, deflate", "chunked"],
        ] {
            assert_eq!(framing(list), Err(UnsupportedCoding), "{list:?}");
            assert_eq!(UnsupportedCoding.status(), 501);
        }
        // With Content-Length beside a valid chunked: 400.
        assert_eq!(framing(&["chunked", "Content-Length: 4"]), Err(BothLengths));
        assert_eq!(BothLengths.status(), 400);
    }

    #[test]
    fn content_lengths() {
        let length = |fields: &[(&'static str, &'static str)]| {
            let headers: Vec<_> =
                fields.iter().map(|&(name, v)| Header { name, value: v.as_bytes() }).collect();
            content_length(&headers)
        };
        let invalid = Err(FramingError::InvalidContentLength);
        assert_eq!(length(&[]), Ok(None));
        assert_eq!(length(&[("Content-Length", "0")]), Ok(Some(0)));
        assert_eq!(length(&[("content-length", " 42 ")]), Ok(Some(42)));
        assert_eq!(length(&[("Content-Length", "007")]), Ok(Some(7)));
        assert_eq!(length(&[("Content-Length", "5, 5")]), Ok(Some(5)));
        assert_eq!(length(&[("Content-Length", "5"), ("Content-Length", "5")]), Ok(Some(5)));
        let max = "18446744073709551615";
        assert_eq!(length(&[("Content-Length", max)]), Ok(Some(u64::MAX)));
        let too_large = "18446744073709551616";
        for bad in ["", " ", "-1", "+1", "1.0", "0x10", "1 2", "5,", ",5", "5, 6", "١", too_large]
        {
            assert_eq!(length(&[("Content-Length", bad)]), invalid, "{bad:?}");
        }
        assert_eq!(length(&[("Content-Length", "5"), ("Content-Length", "6")]), invalid);
        let both = [("Content-Length", "5"), ("Transfer-Encoding", "chunked")];
        assert_eq!(length(&both), Err(FramingError::BothLengths));
        assert_eq!(length(&[("Transfer-Encoding", "chunked")]), Ok(None));
        assert_eq!(FramingError::InvalidContentLength.status(), 400);
    }

    #[test]
    fn header_lookups_and_lists() {
        let headers = [
            Header { name: "Host", value: b"a" },
            Header { name: "connection", value: b"keep-alive, ,Upgrade" },
            Header { name: "Connection", value: b"close" },
            Header { name: "Host", value: b"b" },
        ];
        assert_eq!(header(&headers, "HOST"), Some(&b"a"[..]));
        assert_eq!(single_header(&headers, "host"), None, "repeated");
        assert_eq!(single_header(&headers[1..3], "connection"), None);
        assert_eq!(single_header(&headers[..2], "host"), Some(&b"a"[..]));
        assert_eq!(header(&headers, "origin"), None);
        let elements: Vec<_> = list(&headers, "Connection").collect();
        assert_eq!(elements, [&b"keep-alive"[..], b"Upgrade", b"close"]);
        assert!(has_token(b"keep-alive, Upgrade", b"upgrade"));
        assert!(has_token(b" 100-Continue ", b"100-continue"));
        assert!(!has_token(b"upgrades", b"upgrade"));
        assert!(!has_token(b"", b"close"));
    }

    #[test]
    fn targets_and_queries() {
        assert_eq!(origin_form("http://example.com/chat?x=1"), "/chat?x=1");
        assert_eq!(origin_form("HTTPS://example.com?x=1"), "?x=1");
        assert_eq!(origin_form("http://example.com"), "/");
        assert_eq!(origin_form("/plain"), "/plain");
        assert_eq!(origin_form("ftp://example.com/x"), "ftp://example.com/x");
        assert_eq!(target_path("/topic/a?since=1-2"), "/topic/a");
        assert_eq!(target_path("/metrics"), "/metrics");
        let target = "/topic/a?tokenx=1&token=abc&token=def&also=b&flag&also=c";
        assert_eq!(query_value(target, "token"), Some("abc"));
        assert_eq!(query_value(target, "flag"), None, "no value");
        assert_eq!(query_value(target, "since"), None);
        assert_eq!(query_value("/topic/a", "token"), None);
        assert_eq!(query_value("/x?token=", "token"), Some(""));
        assert_eq!(query_value("/x?token=a%20b", "token"), Some("a%20b"), "not decoded");
        assert_eq!(query_values(target, "also").collect::<Vec<_>>(), ["b", "c"]);
    }

    #[test]
    fn bearer_tokens() {
        let token = |value: &'static str| {
            bearer_token(&[Header { name: "Authorization", value: value.as_bytes() }])
        };
        assert_eq!(token("Bearer abc.def"), Some("abc.def"));
        assert_eq!(token("bearer   abc "), Some("abc"));
        assert_eq!(token("BEARER x"), Some("x"));
        assert_eq!(token("Basic YWxhZGRpbg=="), None);
        assert_eq!(token("Bearer"), None);
        assert_eq!(token("Bearerabc"), None);
        assert_eq!(bearer_token(&[]), None);
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret!"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn json_is_text() {
        assert!(is_text(b"application/json"));
        assert!(is_text(b"Application/JSON; charset=utf-8"));
        assert!(is_text(b"application/ld+json"));
        assert!(is_text(b"text/plain"));
        assert!(!is_text(b"application/octet-stream"));
        assert!(!is_text(b"application/jsonx"));
        assert!(is_text(b" TEXT/html "));
        assert!(!is_text(b"+json"));
        assert!(!is_text(b"image/svg+json"));
        assert!(!is_text(b""));
    }

    #[test]
    fn response_heads() {
        let head = ResponseHead {
            status: 200,
            headers: "Vary: Origin\r\n",
            content_type: Some("application/json"),
            content_length: Some(12),
            close: false,
        };
        let expected = "HTTP/1.1 200 OK\r\nVary: Origin\r\nContent-Type: application/json\r\n\
                        Content-Length: 12\r\n\r\n";
        let mut out = [0u8; 256];
        let n = head.encode(&mut out).unwrap();
        assert_eq!(&out[..n], expected.as_bytes());
        assert_eq!(head.encode(&mut out[..10]), Err(InsufficientSize { required: n }));
        let bare = ResponseHead {
            status: 204,
            headers: "",
            content_type: None,
            content_length: None,
            close: true,
        };
        let n = bare.encode(&mut out).unwrap();
        assert_eq!(&out[..n], b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
        let n = write_refusal(503, "Retry-After: 1\r\n", "busy", &mut out).unwrap();
        assert_eq!(
            &out[..n],
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n\
              Content-Type: text/plain; charset=utf-8\r\nContent-Length: 5\r\n\
              Connection: close\r\n\r\nbusy\n"
        );
        assert_eq!(reason_phrase(413), "Content Too Large");
        assert_eq!(reason_phrase(299), "Unknown");
    }
}
