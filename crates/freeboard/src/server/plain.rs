//! Plain HTTP beside the WebSocket, spoken as HTTP/1.1: methods (`GET`/`HEAD` on health and
//! metrics, `POST` and `OPTIONS` on publish, 405 with `Allow` otherwise), keep-alive (a
//! connection returns to the request phase after a response, with a fresh request timeout),
//! `Expect: 100-continue`, chunked request bodies, CORS for publish, publish answers that say
//! how many subscribers a message reached and for how many it was dropped, and batch publish.

use std::sync::Arc;

use freeboard_proto::handshake::{HandshakeError, reason_phrase};
use freeboard_proto::{Instant, MessageKind};
use serde::Deserialize;

use super::event_loop::{EventLoop, READ_BYTES_PER_TURN};
use super::http::{BUDGET_EXHAUSTED, RETRY_SOON};
use crate::handler::{Completion, HttpRoute, Verdict};
use crate::session::Phase;
use crate::topics::{Reach, Receipt};
use crate::transport::{Io, Transport};

/// Pipelined requests handled from one read before the rest waits for the next loop turn.
pub(super) const PIPELINE_PER_READ: usize = 8;

/// How a response is sent: kept alive or not, with or without its body (`HEAD`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Reply {
    pub(super) keep_alive: bool,
    pub(super) head_only: bool,
}

/// A plain request whose body is still arriving: what its response needs, kept beside the
/// session (in the loop's side table) so that the connection's slot stays small.
#[derive(Debug, Default)]
pub(super) struct PlainRequest {
    pub(super) reply: Reply,
    /// `Access-Control-Allow-Origin` and `Vary` lines for a browser's cross-origin publish.
    pub(super) cors: String,
    /// A `Transfer-Encoding: chunked` body's decoder.
    pub(super) chunked: Option<Chunked>,
}

/// What a publish reached so far: its messages, this loop's subscribers, the other loops.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct PublishAnswer {
    messages: u32,
    local: Reach,
    other_loops: u32,
    other_loops_dropped: u32,
    /// With a Redis backplane: messages queued towards Redis, and lost to its full queue.
    redis: Option<(u32, u32)>,
}

impl PublishAnswer {
    /// The JSON answer, with the other loops' `remote` (delivered, dropped) counts added.
    fn json(&self, remote: (u64, u64), complete: bool) -> String {
        let redis = self.redis.map_or(String::new(), |(queued, lost)| {
            format!(",\"redis\":{queued},\"redis_lost\":{lost}")
        });
        format!(
            "{{\"messages\":{},\"delivered\":{},\"dropped\":{},\"other_loops\":{},\"other_loops_dropped\":{}{redis},\"complete\":{complete}}}\n",
            self.messages,
            self.local.delivered + remote.0,
            self.local.dropped + remote.1,
            self.other_loops,
            self.other_loops_dropped,
        )
    }
}

/// A publish whose answer waits for other loops' reports.
pub(super) struct AwaitingPublish {
    serial: u64,
    answer: PublishAnswer,
    receipt: Arc<Receipt>,
    reply: Reply,
    cors: String,
}

/// One item of a batch publish (`POST {publish path}` with a JSON array of these): `data` is
/// published as text, a string as itself and any other JSON value as its JSON text.
#[derive(Deserialize)]
struct BatchItem {
    topic: String,
    data: serde_json::Value,
}

impl<T: Transport> EventLoop<T> {
    /// Answers a plain (not upgrading) request; `body` is what followed its head in this
    /// read. Returns how many of those bytes the request used when the connection is kept
    /// alive and ready for the next request (else `None`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plain_request(
        &mut self,
        token: usize,
        now: Instant,
        req: &httparse::Request<'_, '_>,
        path: &str,
        websocket_route: bool,
        body: &[u8],
        eof: bool,
    ) -> Option<usize> {
        let method = req.method.unwrap_or("");
        let target = path.split('?').next().unwrap_or(path);
        let header = |name: &str| header(req.headers, name);
        let has_body = header("transfer-encoding").is_some()
            || header("content-length").is_some_and(|v| v.iter().any(|b| *b != b'0'));
        let keep_alive = req.version == Some(1)
            && !eof
            && self.drain_deadline.is_none()
            && !header("connection").is_some_and(|v| has_token(v, b"close"))
            && (method == "POST" || !has_body);
        let reply = Reply { keep_alive, head_only: method == "HEAD" };
        let found = self.router.find_http(target);
        match found.map(|(route, _)| route) {
            Some(route) if route.is_admin() && !self.admit_admin(token, now, req.headers, path) => {
                return None;
            }
            Some(route) if route.is_admin() => {}
            Some(HttpRoute::Health) => {}
            // The admin listener serves the admin routes (and `/healthz`) only.
            _ if self.conns[token].admin_listener => {
                self.refuse(token, now, 404, "", "no such route");
                return None;
            }
            _ => {}
        }
        match found {
            Some((HttpRoute::Publish, topic)) => match method {
                "POST" => {
                    let topic = topic.to_owned();
                    self.http_publish(token, now, &topic, req.headers, body, reply)
                }
                "OPTIONS" => {
                    let preflight = self.cors_headers(req.headers, true);
                    let allow = "Allow: POST, OPTIONS\r\n";
                    let extra = format!("{allow}{preflight}");
                    self.reply(token, now, 204, &extra, "", b"", reply).then_some(0)
                }
                "GET" | "HEAD" if websocket_route => {
                    self.refuse_error(token, now, HandshakeError::UpgradeRequired);
                    None
                }
                _ => self.method_not_allowed(token, now, "POST, OPTIONS"),
            },
            Some((route, _)) => match method {
                "GET" | "HEAD" => {
                    let metrics;
                    let (kind, body) = match route {
                        HttpRoute::Metrics => {
                            metrics = self.shared.metrics.shared_exposition();
                            (crate::metrics::CONTENT_TYPE, metrics.as_bytes())
                        }
                        HttpRoute::Dashboard => {
                            ("text/html; charset=utf-8", crate::dashboard::PAGE.as_bytes())
                        }
                        _ => ("text/plain", &b"ok\n"[..]),
                    };
                    self.reply(token, now, 200, "", kind, body, reply).then_some(0)
                }
                "OPTIONS" => {
                    let allow = "Allow: GET, HEAD, OPTIONS\r\n";
                    self.reply(token, now, 204, allow, "", b"", reply).then_some(0)
                }
                _ => self.method_not_allowed(token, now, "GET, HEAD, OPTIONS"),
            },
            None if websocket_route => {
                self.refuse_error(token, now, HandshakeError::UpgradeRequired);
                None
            }
            None => {
                self.refuse(token, now, 404, "", "no such route");
                None
            }
        }
    }

    fn method_not_allowed(&mut self, token: usize, now: Instant, allow: &str) -> Option<usize> {
        let allow = format!("Allow: {allow}\r\n");
        self.refuse(token, now, 405, &allow, "method not allowed");
        None
    }

    /// Queues a response. With keep-alive (and room for it in the queue) the connection goes
    /// back to the request phase, with a fresh request timeout; returns whether it did.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reply(
        &mut self,
        token: usize,
        now: Instant,
        status: u16,
        extra: &str,
        content_type: &str,
        body: &[u8],
        reply: Reply,
    ) -> bool {
        let keep_alive = reply.keep_alive && self.conns[token].session.queue().is_writable();
        let content_type = match content_type {
            "" => String::new(),
            kind => format!("Content-Type: {kind}\r\n"),
        };
        let length = match status {
            204 => String::new(),
            _ => format!("Content-Length: {}\r\n", body.len()),
        };
        let connection = if keep_alive { "" } else { "Connection: close\r\n" };
        let head = format!(
            "HTTP/1.1 {status} {}\r\n{extra}{content_type}{length}{connection}\r\n",
            reason_phrase(status)
        );
        let body = if reply.head_only || status == 204 { &[][..] } else { body };
        self.queue_final(token, now, &[head.as_bytes(), body]);
        let entry = &mut self.conns[token];
        // Queued (not written straight to the socket for want of pool): keep it alive.
        if keep_alive && entry.session.buffered() > 0 {
            let deadline = now + self.config.handshake_timeout;
            entry.session.phase = Phase::Request { deadline };
            return true;
        }
        false
    }

    /// Queues `HTTP/1.1 100 Continue`: the client may send the body it holds back.
    pub(super) fn continue_100(&mut self, token: usize, now: Instant) {
        let entry = &mut self.conns[token];
        let phase = std::mem::replace(&mut entry.session.phase, Phase::Draining { deadline: now });
        let _ =
            entry.session.respond_final(&mut self.pool, &[b"HTTP/1.1 100 Continue\r\n\r\n"], now);
        entry.session.phase = phase;
    }

    /// The CORS lines for a request from an origin `topics.cors_origins` allows (nothing
    /// otherwise: the browser then refuses the response to the page).
    pub(super) fn cors_headers(&self, headers: &[httparse::Header<'_>], preflight: bool) -> String {
        let Some(origin) = header(headers, "origin") else { return String::new() };
        let origin = String::from_utf8_lossy(origin);
        if !self.shared.cors_allows(&self.config, &origin) {
            return String::new();
        }
        let mut lines = format!("Access-Control-Allow-Origin: {origin}\r\nVary: Origin\r\n");
        if preflight {
            lines.push_str(
                "Access-Control-Allow-Methods: POST, OPTIONS\r\n\
                 Access-Control-Allow-Headers: Authorization, Content-Type\r\n\
                 Access-Control-Max-Age: 600\r\n",
            );
        }
        lines
    }

    /// Publishes a whole body (one message, or a batch when `topic` is empty) and answers
    /// with its reach. With several loops the answer waits (the connection reading nothing)
    /// until every loop handed a copy has reported, or the request timeout passes. Returns
    /// whether the connection was kept alive with the answer sent.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_publish(
        &mut self,
        token: usize,
        now: Instant,
        topic: &str,
        kind: MessageKind,
        body: &[u8],
        reply: Reply,
        cors: &str,
    ) -> bool {
        let receipt = (self.config.threads > 1).then(|| {
            let (decisions, serial) = (self.decisions.clone(), self.conns[token].serial);
            Arc::new(Receipt::new(move || {
                decisions.push(Completion { token, serial, verdict: Verdict::Published });
            }))
        });
        let mut answer = PublishAnswer::default();
        let mut publish = |this: &mut Self, topic: &str, kind, payload: &[u8]| {
            let published = this.topics.publish(
                &this.shared.hub,
                &mut this.pool,
                &mut this.outbox,
                topic,
                kind,
                payload,
                receipt.as_ref(),
            );
            // The outbox holds the frame for this loop's subscribers, if it has any.
            let local = u32::from(!this.outbox.is_empty());
            answer.local += this.fan_out_outbox(now);
            answer.other_loops += published.loops - local;
            answer.other_loops_dropped += published.dropped;
            if this.shared.hub.has_backplane() {
                let (queued, lost) = answer.redis.get_or_insert((0, 0));
                *queued += published.redis;
                *lost += published.redis_lost;
            }
            answer.messages += 1;
        };
        if topic.is_empty() {
            let Ok(items) = serde_json::from_slice::<Vec<BatchItem>>(body) else {
                self.refuse(token, now, 400, "", "a batch is a JSON array of {topic, data}");
                return false;
            };
            if let Some(bad) = items.iter().find(|i| !crate::topics::valid_topic(&i.topic)) {
                let why = format!("invalid topic name {:?}", bad.topic);
                self.refuse(token, now, 400, "", &why);
                return false;
            }
            for item in &items {
                let text = match &item.data {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                publish(self, &item.topic, MessageKind::Text, text.as_bytes());
            }
        } else {
            if kind == MessageKind::Text && std::str::from_utf8(body).is_err() {
                self.refuse(token, now, 400, "", "a text body must be UTF-8");
                return false;
            }
            publish(self, topic, kind, body);
        }
        match receipt {
            Some(receipt) if !receipt.release() => {
                let entry = &mut self.conns[token];
                let deadline = now + self.config.handshake_timeout;
                entry.session.phase = Phase::Request { deadline };
                let cors = cors.to_owned();
                let waiting =
                    AwaitingPublish { serial: entry.serial, answer, receipt, reply, cors };
                self.awaiting.insert(token, waiting);
                false
            }
            receipt => {
                let remote = receipt.map_or((0, 0), |r| r.counts());
                let json = answer.json(remote, true);
                self.reply(token, now, 200, cors, "application/json", json.as_bytes(), reply)
            }
        }
    }

    /// Answers a publish that waited for other loops' reports: all of them (`complete`), or
    /// those that came before the request timeout.
    pub(super) fn answer_publish(
        &mut self,
        token: usize,
        serial: u64,
        now: Instant,
        complete: bool,
    ) {
        if self.awaiting.get(&token).is_none_or(|w| w.serial != serial) {
            return;
        }
        // NOTE(unwrap): looked up just above.
        let waiting = self.awaiting.remove(&token).unwrap();
        let json = waiting.answer.json(waiting.receipt.counts(), complete);
        let (cors, reply) = (&waiting.cors, waiting.reply);
        if self.reply(token, now, 200, cors, "application/json", json.as_bytes(), reply) {
            // A pipelined request may be waiting in the session already.
            self.resume.push(token);
        }
        self.mark(token);
    }

    /// Reads more of a chunked `POST` body, decoding it into the session; publishes it once
    /// the last chunk has come. Bytes after the body (a pipelined request) wait as the next
    /// request's head.
    pub(super) fn read_chunked(&mut self, token: usize, now: Instant) {
        let mut buf = std::mem::take(&mut self.read_buf);
        let mut bytes = 0;
        loop {
            let entry = &mut self.conns[token];
            if !matches!(entry.session.phase, Phase::Body(_)) {
                break;
            }
            if bytes >= READ_BYTES_PER_TURN {
                // A large body is read a share per turn, like a WebSocket's messages.
                self.resume.push(token);
                break;
            }
            let mut io =
                Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
            let n = match entry.stream.read(&mut io, &mut buf) {
                Ok(0) => {
                    self.remove(token);
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.remove(token);
                    break;
                }
            };
            self.stats.bytes_in += n as u64;
            bytes += n;
            if let Some(rest) = self.feed_chunked(token, now, &buf[..n]) {
                let kept_alive = matches!(
                    self.conns.get(token).map(|e| &e.session.phase),
                    Some(Phase::Request { .. })
                );
                // The next request's first bytes; a connection closing after its answer
                // (or gone) has no next request.
                if rest < n && kept_alive {
                    self.keep_partial(token, now, &buf[rest..n]);
                }
                break;
            }
        }
        self.read_buf = buf;
    }

    /// Feeds body bytes to the connection's chunked decoder. Returns `Some(used)` when the
    /// request is over (published, or refused), `None` when more body is expected.
    pub(super) fn feed_chunked(
        &mut self,
        token: usize,
        now: Instant,
        input: &[u8],
    ) -> Option<usize> {
        let Some(mut state) = self.plain.remove(&token) else { return Some(input.len()) };
        let Some(mut chunked) = state.chunked.take() else { return Some(input.len()) };
        let partial = self.conns[token].session.partial_mut();
        let pool = &mut self.pool;
        let mut full = false;
        let fed = chunked.feed(input, |data| {
            full |= partial.append(pool, data).is_err();
            !full
        });
        // A chunked body declares no length: it is counted against the bodies' share as it
        // grows, and refused once it would pass it.
        if !full && !self.count_body(token) {
            full = true;
        }
        if !matches!(fed, Ok((_, false))) || full {
            self.forget_request(token);
        }
        let status = match fed {
            Ok((_, false)) if !full => {
                state.chunked = Some(chunked);
                self.plain.insert(token, state);
                return None;
            }
            Ok((used, true)) if !full => {
                let entry = &mut self.conns[token];
                let Phase::Body(post) =
                    std::mem::replace(&mut entry.session.phase, Phase::Draining { deadline: now })
                else {
                    return Some(input.len());
                };
                let body = entry.session.take_message();
                let mut assembly = std::mem::take(&mut self.assembly);
                match assembly.fill(&mut self.pool, body) {
                    Some(body) => {
                        let cors = state.cors;
                        let (topic, kind) = (&post.topic, post.kind);
                        if self.finish_publish(token, now, topic, kind, body, state.reply, &cors) {
                            self.resume.push(token);
                        }
                    }
                    None => {
                        self.refuse(token, now, 503, RETRY_SOON, BUDGET_EXHAUSTED);
                    }
                }
                self.assembly = assembly;
                return Some(used);
            }
            _ if full => (503, BUDGET_EXHAUSTED),
            Err(ChunkError::TooLarge) => (413, "body larger than max_message_size"),
            _ => (400, "malformed chunked body"),
        };
        self.conns[token].session.partial_mut().clear(&mut self.pool);
        let extra = if status.0 == 503 { RETRY_SOON } else { "" };
        self.refuse(token, now, status.0, extra, status.1);
        Some(input.len())
    }
}

/// The value of the first header called `name`.
pub(super) fn header<'b>(headers: &[httparse::Header<'b>], name: &str) -> Option<&'b [u8]> {
    headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value)
}

/// Whether a comma-separated header value lists `token` (case-insensitively).
pub(super) fn has_token(value: &[u8], token: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}

/// Why a request's framing was refused: answered with [`status`](Self::status), then the
/// connection is closed (whatever follows the head cannot be told from a next request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FramingError {
    /// The `Transfer-Encoding` list does not end in exactly one `chunked` (400).
    NotFinalChunked,
    /// `chunked` after a coding the server does not implement (501).
    UnsupportedCoding,
    /// `Transfer-Encoding` and `Content-Length` together (400).
    BothLengths,
}

impl FramingError {
    /// The status the request is answered with.
    pub(super) fn status(self) -> u16 {
        match self {
            Self::UnsupportedCoding => 501,
            Self::NotFinalChunked | Self::BothLengths => 400,
        }
    }

    /// What the answer's body says.
    pub(super) fn why(self) -> &'static str {
        match self {
            Self::NotFinalChunked => "Transfer-Encoding must end in one chunked",
            Self::UnsupportedCoding => "only the chunked transfer coding is supported",
            Self::BothLengths => "Transfer-Encoding with Content-Length",
        }
    }
}

/// Whether a request's body is chunked, from its `Transfer-Encoding` fields read as one list
/// (several fields are one comma-separated list, RFC 9110 §5.3; empty elements are skipped,
/// §5.6.1; a coding's parameters are ignored). `Ok(false)`: no field, the body (if any) has a
/// `Content-Length`.
///
/// RFC 9112 §6.3: "If a Transfer-Encoding header field is present in a request and the
/// chunked transfer coding is not the final encoding, the message body length cannot be
/// determined reliably; the server MUST respond with the 400 (Bad Request) status code and
/// then close the connection." §6.1: "A sender MUST NOT apply the chunked transfer coding
/// more than once", and a server that receives "a transfer coding it does not understand
/// SHOULD respond with 501": every coding but `chunked` here, since none is implemented.
/// With `Content-Length` beside it the framing is ambiguous (request smuggling, §6.3 and
/// §11.2): 400.
pub(super) fn chunked_body(headers: &[httparse::Header<'_>]) -> Result<bool, FramingError> {
    let mut fields =
        headers.iter().filter(|h| h.name.eq_ignore_ascii_case("transfer-encoding")).peekable();
    if fields.peek().is_none() {
        return Ok(false);
    }
    let codings = fields
        .flat_map(|h| h.value.split(|&b| b == b','))
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

/// Whether a `Content-Type` is published as a text message: `text/*`, `application/json` and
/// `application/*+json` (a browser then gets a string, not a `Blob`).
pub(super) fn is_text(content_type: &[u8]) -> bool {
    let essence = content_type.split(|&b| b == b';').next().unwrap_or(b"").trim_ascii();
    let lower = essence.to_ascii_lowercase();
    lower.starts_with(b"text/")
        || lower == b"application/json"
        || (lower.starts_with(b"application/") && lower.ends_with(b"+json"))
}

/// An incremental decoder of a `Transfer-Encoding: chunked` body (RFC 9112 §7.1): sizes in
/// hex, extensions skipped, CRLF after each chunk, a trailer section ignored. Every byte is
/// bounded: the decoded body by `limit`, a size line's extensions and the trailer section by
/// [`Chunked::MAX_LINE`].
#[derive(Debug)]
pub(super) struct Chunked {
    state: ChunkState,
    /// The current chunk's size (while reading its size line) or what is left of it.
    size: u64,
    digits: u32,
    /// Decoded bytes so far.
    decoded: u64,
    limit: u64,
    /// Bytes of the current extension or trailer text.
    line: usize,
}

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
pub(super) enum ChunkError {
    /// Not chunked framing (400).
    Malformed,
    /// Larger than the limit (413).
    TooLarge,
}

impl Chunked {
    /// The longest chunk extension, and trailer section, accepted.
    const MAX_LINE: usize = 4096;

    pub(super) fn new(limit: u64) -> Self {
        Self { state: ChunkState::Size, size: 0, digits: 0, decoded: 0, limit, line: 0 }
    }

    /// Decodes `input`, giving the data to `out` (which returns `false` to stop). Returns the
    /// bytes used and whether the body is complete.
    pub(super) fn feed(
        &mut self,
        input: &[u8],
        mut out: impl FnMut(&[u8]) -> bool,
    ) -> Result<(usize, bool), ChunkError> {
        use ChunkState::*;
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                Size => match (b as char).to_digit(16) {
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
                    let n = (self.size as usize).min(input.len() - i);
                    if !out(&input[i..i + n]) {
                        return Ok((i + n, false));
                    }
                    self.size -= n as u64;
                    self.decoded += n as u64;
                    i += n;
                    if self.size == 0 {
                        self.state = DataCr;
                    }
                    continue;
                }
                DataCr if b == b'\r' => self.state = DataLf,
                DataLf if b == b'\n' => self.state = Size,
                Trailer => {
                    // Lines until an empty one; `line` counts the section's bytes and the
                    // bit 1 << 63 is never reached (bounded by MAX_LINE).
                    if b == b'\n' {
                        if self.size == 0 {
                            self.state = Done;
                            return Ok((i + 1, true));
                        }
                        self.size = 0;
                    } else if b != b'\r' {
                        self.size += 1; // this line is not empty
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
}

#[cfg(test)]
mod tests {
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
                    Some((name, value)) => httparse::Header { name, value: value.as_bytes() },
                    None => httparse::Header { name: "Transfer-Encoding", value: v.as_bytes() },
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
    fn json_is_text() {
        assert!(is_text(b"application/json"));
        assert!(is_text(b"Application/JSON; charset=utf-8"));
        assert!(is_text(b"application/ld+json"));
        assert!(is_text(b"text/plain"));
        assert!(!is_text(b"application/octet-stream"));
        assert!(!is_text(b"application/jsonx"));
    }
}
