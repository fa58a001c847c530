//! The HTTP side of a server connection: the request before the upgrade, admission, refusals
//! with their status, and the plain routes a [`Router`](crate::Router) opted into
//! ([`HttpRoute`]: health, metrics, publish).

use std::sync::atomic::Ordering;

use freeboard_proto::handshake::{self, EMPTY_HEADER, HandshakeError, Request};
use freeboard_proto::{Instant, MessageKind, Role};

use super::event_loop::{EventLoop, LINGER};
use crate::handler::{HttpRoute, Upgrade};
use crate::parking::Ws;
use crate::session::{Body, Phase};
use crate::transport::Transport;
use freeboard_buf::SendQueue;

/// The share of the pool's chunks (1 / this) that partial request heads may hold together,
/// and that request bodies may hold together: neither can starve the open connections.
const HEAD_SHARE: usize = 4;
const BODY_SHARE: usize = 4;
const RETRY_SOON: &str = "Retry-After: 1\r\n";
const BUDGET_EXHAUSTED: &str = "server memory budget exhausted";

impl<T: Transport> EventLoop<T> {
    /// Reads (more of) the request head; handles it once complete.
    pub(super) fn read_request(&mut self, token: usize, now: Instant) {
        let mut buf = std::mem::take(&mut self.read_buf);
        let entry = &mut self.conns[token];
        let partial = entry.session.partial_mut();
        let mut have = partial.copy_to(&self.pool, &mut buf);
        self.head_chunks -= head_chunks(have, self.pool.chunk_size());
        partial.clear(&mut self.pool);
        let mut eof = false;
        while have < buf.len() {
            match entry.stream.read(&mut buf[have..]) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => have += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
        self.stats.bytes_in += have as u64;
        let open = self.request(token, now, &mut buf[..have], eof);
        self.read_buf = buf;
        match self.conns.get(token).map(|e| &e.session.phase) {
            Some(Phase::Body(_)) => self.read_body(token, now),
            // The request and the end of the stream came together: nothing more will arrive.
            _ if open && eof => self.end_of_input(token, now),
            _ if open => self.read_open(token, now),
            _ => {}
        }
    }

    /// Stops counting the partial request head or the request body of a session that goes
    /// or moves on.
    pub(super) fn forget_request(&mut self, token: usize) {
        let session = &mut self.conns[token].session;
        match &session.phase {
            Phase::Request { .. } => {
                let held = head_chunks(session.partial_mut().len(), self.pool.chunk_size());
                self.head_chunks -= held;
            }
            Phase::Body(body) => self.body_chunks -= body.reserved,
            _ => {}
        }
    }

    /// Handles the request bytes in `buf`. Returns whether the connection is now open.
    fn request(&mut self, token: usize, now: Instant, buf: &mut [u8], eof: bool) -> bool {
        const MAX_HEAD: usize = handshake::DEFAULT_MAX_HEAD_LEN;
        let mut headers = [EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        let parsed = req.parse(buf);
        let (path, upgrade, head_len) = match parsed {
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD && !eof => {
                // Partial heads are untrusted: together they may hold a share of the pool
                // only, so slow clients cannot starve the connections already open.
                let chunks = head_chunks(buf.len(), self.pool.chunk_size());
                if self.head_chunks + chunks > self.pool.chunks_total() / HEAD_SHARE {
                    return self.refuse(token, now, 503, RETRY_SOON, "too many partial requests");
                }
                let partial = self.conns[token].session.partial_mut();
                if partial.append(&mut self.pool, buf).is_err() {
                    partial.clear(&mut self.pool);
                    return self.refuse(token, now, 503, RETRY_SOON, BUDGET_EXHAUSTED);
                }
                self.head_chunks += chunks;
                return false;
            }
            Ok(httparse::Status::Partial) if eof => {
                self.remove(token);
                return false;
            }
            Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => (
                handshake::origin_form(req.path.unwrap_or("/")),
                req.headers.iter().any(|h| h.name.eq_ignore_ascii_case("upgrade")),
                len,
            ),
            Ok(_) | Err(httparse::Error::TooManyHeaders) => {
                return self.refuse_error(token, now, HandshakeError::HeadTooLarge);
            }
            Err(_) => return self.refuse_error(token, now, HandshakeError::Malformed),
        };
        let route = self.router.find(path);
        if !upgrade {
            let target = path.split('?').next().unwrap_or(path);
            match (self.router.find_http(target), route) {
                (Some((HttpRoute::Publish, topic)), _) if req.method == Some("POST") => {
                    let topic = topic.to_owned();
                    self.http_publish(token, now, &topic, req.headers, &buf[head_len..]);
                }
                (Some((HttpRoute::Health, _)), _) => {
                    self.respond(token, now, 200, "text/plain", b"ok\n");
                }
                (Some((HttpRoute::Metrics, _)), _) => {
                    let text = self.shared.metrics.encode();
                    self.respond(token, now, 200, crate::metrics::CONTENT_TYPE, text.as_bytes());
                }
                (Some((HttpRoute::Dashboard, _)), _) => {
                    let page = crate::dashboard::PAGE.as_bytes();
                    self.respond(token, now, 200, "text/html; charset=utf-8", page);
                }
                (_, Some(_)) => {
                    self.refuse_error(token, now, HandshakeError::UpgradeRequired);
                }
                (_, None) => {
                    self.refuse(token, now, 404, "", "no such route");
                }
            }
            return false;
        }
        let Some(route) = route else {
            return self.refuse(token, now, 404, "", "no such route");
        };
        let options = *self.router.options(route);
        let mut headers = [EMPTY_HEADER; 64];
        let (request, len) = match Request::parse(buf, &mut headers, MAX_HEAD) {
            Ok(Some(parsed)) => parsed,
            Ok(None) => unreachable!("httparse found the head complete"),
            Err(e) => return self.refuse_error(token, now, e),
        };
        let config = &self.config;
        let peer = self.conns[token].peer;
        let retry_after = format!("Retry-After: {}\r\n", config.retry_after.as_secs().max(1));
        if let Some(status) = self.conns[token].limited {
            let why = "connecting too fast: accept rate limit";
            return self.refuse(token, now, status, &retry_after, why);
        }
        if self.shared.per_ip(peer) > config.max_connections_per_ip {
            let why = "too many connections from this address";
            return self.refuse(token, now, 429, &retry_after, why);
        }
        if self.shared.open.load(Ordering::Relaxed) > config.max_connections
            || self.drain_deadline.is_some()
        {
            return self.refuse(token, now, 503, RETRY_SOON, "server at its connection limit");
        }
        if self.pool.chunks_free() * self.pool.chunk_size() < config.connection_reserve {
            return self.refuse(token, now, 503, RETRY_SOON, BUDGET_EXHAUSTED);
        }
        let mut response = [0u8; 1024];
        let n = match self.router.handler(route).on_upgrade(&request) {
            Upgrade::Accept { protocol } => match request.accept(protocol, None, &mut response) {
                Ok(n) => n,
                Err(_) => return self.refuse(token, now, 500, "", "response too large"),
            },
            Upgrade::Reject(status) => return self.refuse(token, now, status, "", "refused"),
        };
        let entry = &mut self.conns[token];
        let queue = (options.slow_consumer.is_some() || options.watermarks.is_some()).then(|| {
            let queue = entry.session.queue();
            let marks = options.watermarks.unwrap_or(*queue.watermarks());
            SendQueue::new(marks, options.slow_consumer.unwrap_or(queue.policy()))
        });
        let deadline = match entry.session.phase {
            Phase::Request { deadline } => Some(deadline),
            _ => None,
        };
        let ws = Ws::new(Role::Server, self.lot.config(), now);
        if entry.session.upgrade(&mut self.pool, ws, queue, &response[..n]).is_err() {
            self.remove(token);
            return false;
        }
        entry.route = route as u32;
        self.shared.metrics.connections.inc();
        if let Some(deadline) = deadline {
            // Accepted at the deadline less the handshake timeout (one clock, milliseconds).
            let timeout = self.config.handshake_timeout.as_millis() as u64;
            let taken = (now.as_millis() + timeout).saturating_sub(deadline.as_millis());
            self.shared.metrics.handshake_duration.observe(taken);
        }
        self.call_with(token, now, path, |handler, conn| handler.on_open(conn));
        if len < buf.len() {
            self.receive(token, now, &mut buf[len..]);
        }
        true
    }

    fn refuse_error(&mut self, token: usize, now: Instant, error: HandshakeError) -> bool {
        let mut out = [0u8; 512];
        // NOTE(unwrap): every refusal fits in 512 bytes.
        let n = error.write_response(&mut out).unwrap();
        self.send_final(token, now, error.status(), &out[..n], &error);
        false
    }

    /// Answers `status` with `extra` headers and a plain-text `body` saying why, then closes.
    /// Always `false` (the connection is not open), for the callers' convenience.
    fn refuse(&mut self, token: usize, now: Instant, status: u16, extra: &str, body: &str) -> bool {
        let mut out = [0u8; 512];
        let n = handshake::write_refusal(status, extra, body, &mut out).unwrap_or(0);
        self.send_final(token, now, status, &out[..n], &body);
        false
    }

    fn respond(&mut self, token: usize, now: Instant, status: u16, kind: &str, body: &[u8]) {
        let head = format!(
            "HTTP/1.1 {status} OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        self.queue_final(token, now, &[head.as_bytes(), body]);
    }

    fn send_final(
        &mut self,
        token: usize,
        now: Instant,
        status: u16,
        response: &[u8],
        why: &dyn std::fmt::Display,
    ) {
        self.shared.metrics.refuse(status);
        if let Some(suppressed) = self.log_throttle.allow(now.as_millis()) {
            let peer = self.conns[token].peer;
            tracing::info!(status, %peer, why = %why, suppressed, "refused");
        }
        self.queue_final(token, now, &[response]);
    }

    /// Queues the HTTP response after which the connection closes. When the pool cannot hold
    /// it (the budget is exhausted, which is when a 503 matters most), it is written straight
    /// to the transport, whose buffer nothing else has used: the client gets its status rather
    /// than a bare EOF.
    fn queue_final(&mut self, token: usize, now: Instant, parts: &[&[u8]]) {
        let entry = &mut self.conns[token];
        if let Err(parts) = entry.session.respond_final(&mut self.pool, parts, now + LINGER)
            && entry.session.buffered() == 0
        {
            let slices: Vec<std::io::IoSlice<'_>> =
                parts.iter().map(|p| std::io::IoSlice::new(p)).collect();
            let _ = entry.stream.write_vectored(&slices);
        }
    }

    /// `POST {path}{topic}`: checks the bearer token, the name and the length, then
    /// publishes the body, now (`body` holds it all) or once it has arrived.
    fn http_publish(
        &mut self,
        token: usize,
        now: Instant,
        topic: &str,
        headers: &[httparse::Header<'_>],
        body: &[u8],
    ) {
        let header = |name: &str| {
            headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value)
        };
        let config = &self.config;
        if let Some(expected) = &config.topics.publish_token {
            let given = header("authorization").and_then(|v| {
                let v = std::str::from_utf8(v).ok()?.trim();
                v.get(..7).filter(|s| s.eq_ignore_ascii_case("bearer ")).map(|_| v[7..].trim())
            });
            match given {
                None => {
                    let challenge = "WWW-Authenticate: Bearer\r\n";
                    self.refuse(token, now, 401, challenge, "a bearer token is required");
                    return;
                }
                Some(given) if !constant_time_eq(given.as_bytes(), expected.as_bytes()) => {
                    self.refuse(token, now, 403, "", "wrong publish token");
                    return;
                }
                Some(_) => {}
            }
        }
        if !crate::topics::valid_topic(topic) {
            self.refuse(token, now, 400, "", "invalid topic name");
            return;
        }
        if header("transfer-encoding").is_some() {
            self.refuse(token, now, 411, "", "a Content-Length is required");
            return;
        }
        let len = match content_length(headers) {
            Ok(Some(len)) => len,
            Ok(None) => {
                self.refuse(token, now, 411, "", "a Content-Length is required");
                return;
            }
            Err(()) => {
                self.refuse(token, now, 400, "", "Content-Length must be one run of digits");
                return;
            }
        };
        if len > config.max_message_size {
            self.refuse(token, now, 413, "", "body larger than max_message_size");
            return;
        }
        let len = len as usize; // NOTE: at most max_message_size, which fits memory
        let text = header("content-type")
            .is_some_and(|v| v.len() >= 5 && v[..5].eq_ignore_ascii_case(b"text/"));
        let kind = if text { MessageKind::Text } else { MessageKind::Binary };
        if body.len() >= len {
            self.finish_publish(token, now, topic, kind, &body[..len]);
            return;
        }
        // The whole body is counted against the bodies' share before a byte of it is kept,
        // so bodies that never finish cannot take the pool piece by piece.
        let reserved = len.div_ceil(self.pool.chunk_size()) + 1;
        let share = self.pool.chunks_total() / BODY_SHARE;
        if reserved > share {
            let why =
                format!("a body over {} bytes cannot be held now", share * self.pool.chunk_size());
            self.refuse(token, now, 413, "", &why);
            return;
        }
        if self.body_chunks + reserved > share {
            self.refuse(token, now, 503, RETRY_SOON, "too many request bodies in flight");
            return;
        }
        let entry = &mut self.conns[token];
        let deadline = match entry.session.phase {
            Phase::Request { deadline } => deadline,
            _ => now + self.config.handshake_timeout,
        };
        let partial = entry.session.partial_mut();
        if partial.append(&mut self.pool, body).is_err() {
            partial.clear(&mut self.pool);
            self.refuse(token, now, 503, RETRY_SOON, BUDGET_EXHAUSTED);
            return;
        }
        self.body_chunks += reserved;
        entry.session.phase = Phase::Body(Box::new(Body {
            deadline,
            topic: topic.into(),
            kind,
            remaining: len - body.len(),
            reserved,
        }));
    }

    /// Reads more of a `POST` body into the session; publishes it once complete.
    pub(super) fn read_body(&mut self, token: usize, now: Instant) {
        let mut buf = std::mem::take(&mut self.read_buf);
        loop {
            let entry = &mut self.conns[token];
            let Phase::Body(post) = &mut entry.session.phase else { break };
            let want = post.remaining.min(buf.len());
            match entry.stream.read(&mut buf[..want]) {
                Ok(0) => {
                    self.remove(token);
                    break;
                }
                Ok(n) => {
                    self.stats.bytes_in += n as u64;
                    post.remaining -= n;
                    let done = post.remaining == 0;
                    let failed =
                        entry.session.partial_mut().append(&mut self.pool, &buf[..n]).is_err();
                    if failed || done {
                        self.forget_request(token);
                    }
                    let entry = &mut self.conns[token];
                    if failed {
                        entry.session.partial_mut().clear(&mut self.pool);
                        self.refuse(token, now, 503, RETRY_SOON, BUDGET_EXHAUSTED);
                        break;
                    }
                    if done {
                        let Phase::Body(post) = std::mem::replace(
                            &mut entry.session.phase,
                            Phase::Draining { deadline: now },
                        ) else {
                            unreachable!("matched above")
                        };
                        let body = entry.session.take_message();
                        let mut assembly = std::mem::take(&mut self.assembly);
                        match assembly.fill(&mut self.pool, body) {
                            Some(body) => {
                                self.finish_publish(token, now, &post.topic, post.kind, body)
                            }
                            None => {
                                self.refuse(token, now, 503, RETRY_SOON, BUDGET_EXHAUSTED);
                            }
                        }
                        self.assembly = assembly;
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.remove(token);
                    break;
                }
            }
        }
        self.read_buf = buf;
    }

    /// Publishes a whole `POST` body and answers `200` with what it reached.
    fn finish_publish(
        &mut self,
        token: usize,
        now: Instant,
        topic: &str,
        kind: MessageKind,
        body: &[u8],
    ) {
        if kind == MessageKind::Text && std::str::from_utf8(body).is_err() {
            self.refuse(token, now, 400, "", "a text/* body must be UTF-8");
            return;
        }
        let published = self.topics.publish(
            &self.shared.hub,
            &mut self.pool,
            &mut self.outbox,
            topic,
            kind,
            body,
        );
        self.fan_out_outbox(now);
        let answer =
            format!("{{\"loops\":{},\"dropped\":{}}}\n", published.loops, published.dropped);
        self.respond(token, now, 200, "application/json", answer.as_bytes());
    }
}

/// The chunks a partial request head of `len` bytes is counted as holding.
fn head_chunks(len: usize, chunk_size: usize) -> usize {
    len.div_ceil(chunk_size)
}

/// The body length a request declares. RFC 9112 §6.3: `Content-Length = 1*DIGIT`, and
/// several fields (or a list) must all agree, else the message's framing is invalid.
fn content_length(headers: &[httparse::Header<'_>]) -> Result<Option<u64>, ()> {
    let mut length = None;
    let fields = headers.iter().filter(|h| h.name.eq_ignore_ascii_case("content-length"));
    for value in fields.flat_map(|h| h.value.split(|&b| b == b',')) {
        let digits = value.trim_ascii();
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(());
        }
        let n = std::str::from_utf8(digits).ok().and_then(|d| d.parse().ok()).ok_or(())?;
        if length.is_some_and(|l| l != n) {
            return Err(());
        }
        length = Some(n);
    }
    Ok(length)
}

/// Compares secrets in time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
