//! The HTTP side of a server connection: the request before the upgrade, admission, refusals
//! with their status, and the plain routes a [`Router`](crate::Router) opted into
//! ([`HttpRoute`](crate::HttpRoute): health, metrics, publish).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use freeboard_proto::handshake::{self, EMPTY_HEADER, HandshakeError, Request};
use freeboard_proto::http::{
    self, BEARER_CHALLENGE, Chunked, bearer_token, chunked_body, constant_time_eq, content_length,
    has_token, header, is_text,
};
use freeboard_proto::{Instant, MessageKind};

use super::event_loop::{EventLoop, LINGER, PendingUpgrade, READ_BYTES_PER_TURN, Upgrading};
use super::requests::{
    BUDGET_EXHAUSTED, Grant, PlainRequest, RETRY_SOON, Reply, retry_soon_jittered,
};
use crate::handler::{Decision, DecisionOutcome};
use crate::session::{Body, Phase};
use crate::transport::{Io, Transport};

/// The share of the pool's chunks (1 / this) that the connections which have not upgraded
/// may hold together — their partial request heads and what their sockets cost the kernel —
/// and that request bodies may hold together: neither can starve the open connections.
const HEAD_SHARE: usize = 4;
const BODY_SHARE: usize = 4;
/// Why a connection was closed or refused for the crowd of connections that have not upgraded.
const HANDSHAKES_FULL: &str = "too many connections awaiting their upgrade";
/// Pipelined requests handled from one read before the rest waits for the next loop turn.
const PIPELINE_PER_READ: usize = 8;

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
        let mut io = Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
        while have < buf.len() {
            match entry.stream.read(&mut io, &mut buf[have..]) {
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
        let mut at = 0;
        let mut handled = 0;
        let open = loop {
            let open = self.request(token, now, &mut buf[at..have], eof);
            match self.next_request.take() {
                // Keep-alive: the next pipelined request, up to a few per read.
                Some(used) if handled < PIPELINE_PER_READ => {
                    at += used;
                    handled += 1;
                }
                Some(used) => {
                    // The rest waits for the next turn (after everyone else's).
                    self.keep_partial(token, now, &buf[at + used..have]);
                    self.resume.push(token);
                    break false;
                }
                None => break open,
            }
        };
        if have == buf.len()
            && matches!(
                self.conns.get(token).map(|e| &e.session.phase),
                Some(Phase::Request { .. })
            )
        {
            // The buffer filled: more may wait in the socket, and no new edge will say so.
            self.resume.push(token);
        }
        self.read_buf = buf;
        match self.conns.get(token).map(|e| &e.session.phase) {
            Some(Phase::Body(_)) => self.read_body(token, now),
            // The request and the end of the stream came together: nothing more will arrive.
            _ if open && eof => self.end_of_input(token, now),
            _ if open => self.read_open(token, now),
            _ => {}
        }
    }

    /// Counts a growing request body's chunks against the bodies' share; `false` when it
    /// would pass it.
    pub(super) fn count_body(&mut self, token: usize) -> bool {
        let chunk = self.pool.chunk_size();
        let share = self.pool.chunks_total() / BODY_SHARE;
        let session = &mut self.conns[token].session;
        let held = session.partial_mut().len().div_ceil(chunk) + 1;
        let Phase::Body(body) = &mut session.phase else { return true };
        if held <= body.reserved {
            return true;
        }
        let more = held - body.reserved;
        if self.body_chunks + more > share {
            return false;
        }
        self.body_chunks += more;
        body.reserved = held;
        true
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
    pub(super) fn request(
        &mut self,
        token: usize,
        now: Instant,
        buf: &mut [u8],
        eof: bool,
    ) -> bool {
        const MAX_HEAD: usize = handshake::DEFAULT_MAX_HEAD_LEN;
        let mut buf = buf;
        // Bytes of a PROXY header before the request.
        let mut skipped = 0;
        if self.config.proxy_protocol && !self.conns[token].attributed {
            match crate::proxy_header::parse(buf) {
                Ok(Some((len, source))) => {
                    let source = source.unwrap_or(self.conns[token].peer);
                    self.attribute(token, now, source);
                    buf = &mut buf[len..];
                    skipped = len;
                }
                Ok(None) if !eof && buf.len() < crate::proxy_header::MAX_LEN => {
                    return self.keep_partial(token, now, buf);
                }
                Ok(None) if eof => {
                    self.remove(token);
                    return false;
                }
                _ => {
                    self.shared.metrics.access_refusal("proxy_header");
                    return self.refuse(token, now, 400, "", "a PROXY protocol header is required");
                }
            }
        }
        // HTTP/2 with prior knowledge, or after ALPN `h2`: the client preface (RFC 9113 §3.4).
        if self.config.http2
            && !buf.is_empty()
            && !self.conns[token].admin_listener
            && self.conns[token].stream.carrier().is_none()
            && !self.conns[token].stream.keeps_unread()
        {
            let n = buf.len().min(super::http2::PREFACE.len());
            if buf[..n] == super::http2::PREFACE[..n] {
                return match n == super::http2::PREFACE.len() {
                    true => self.start_http2(token, now, buf),
                    false if eof => {
                        self.remove(token);
                        false
                    }
                    false => self.keep_partial(token, now, buf),
                };
            }
        }
        let mut headers = [EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        let parsed = req.parse(buf);
        let (path, upgrade, head_len) = match parsed {
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD && !eof => {
                return self.keep_partial(token, now, buf);
            }
            Ok(httparse::Status::Partial) if eof => {
                let entry = &mut self.conns[token];
                if buf.is_empty() && entry.session.buffered() > 0 {
                    // A kept-alive connection's client is done: its last response still
                    // leaves, then our FIN.
                    entry.session.phase = Phase::Draining { deadline: now + LINGER, discarded: 0 };
                    return false;
                }
                self.remove(token);
                return false;
            }
            Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => (
                http::origin_form(req.path.unwrap_or("/")),
                header(req.headers, "upgrade").is_some(),
                len,
            ),
            Ok(_) | Err(httparse::Error::TooManyHeaders) => {
                return self.refuse_error(token, now, HandshakeError::HeadTooLarge);
            }
            Err(_) => return self.refuse_error(token, now, HandshakeError::Malformed),
        };
        if !self.conns[token].attributed {
            // From a trusted proxy: the client is the address it forwarded.
            let peer = self.conns[token].peer;
            let client = self.shared.proxies.client(req.headers);
            self.attribute(token, now, client.map_or(peer, |ip| SocketAddr::new(ip, 0)));
        }
        // How a body after the head is framed, for every request: a refused framing closes
        // the connection, so a request smuggled in a body a proxy framed otherwise is never
        // read (see `chunked_body` for the RFC's words).
        if let Err(refused) = chunked_body(req.headers) {
            return self.refuse(token, now, refused.status(), "", refused.message());
        }
        let route = self.router.find(path);
        // A Server-Sent Events request to a route that subscribes is served as its upgrade
        // is: the same access, admission and session, framed as events.
        let event_stream = !upgrade
            && req.method == Some("GET")
            && route.is_some_and(|r| self.router.options(r).subscribes)
            && handshake::accepts_event_stream(req.headers);
        // A presence listing of a route that subscribes is decided as its topic's upgrade.
        let listing = match route.filter(|&r| self.router.options(r).subscribes) {
            Some(r) if !upgrade && !event_stream && req.method == Some("GET") => {
                super::requests::Listing::of(self.router.path(r), path)
            }
            _ => None,
        };
        if !upgrade && !event_stream && listing.is_none() {
            let ws = route.is_some();
            let used = self.plain_request(token, now, &req, path, ws, &buf[head_len..], eof);
            // Kept alive with bytes left: they are the next request.
            let next = used.map(|used| head_len + used).filter(|&n| n < buf.len());
            self.next_request = next.map(|n| n + skipped);
            return false;
        }
        let Some(route) = route else {
            return self.refuse(token, now, 404, "", "no such route");
        };
        let options = *self.router.options(route);
        if options.admin {
            if !self.admit_admin(token, now, req.headers, path) {
                return false;
            }
        } else if self.conns[token].admin_listener {
            // The admin listener serves the admin routes only.
            return self.refuse(token, now, 404, "", "no such route");
        }
        let mut headers = [EMPTY_HEADER; 64];
        let parsed = match (event_stream, &listing) {
            (_, Some(_)) => Request::parse_get(buf, &mut headers, MAX_HEAD),
            (false, None) => Request::parse(buf, &mut headers, MAX_HEAD),
            (true, None) => Request::parse_event_stream(buf, &mut headers, MAX_HEAD),
        };
        let (request, len) = match parsed {
            Ok(Some(parsed)) => parsed,
            Ok(None) => unreachable!("httparse found the head complete"),
            Err(e) => return self.refuse_error(token, now, e),
        };
        if !self.shared.origins.allows(request.origin()) {
            self.shared.metrics.access_refusal("origin");
            return self.refuse(token, now, 403, "", "origin not allowed");
        }
        let config = &self.config;
        let peer = self.conns[token].peer;
        if let Some(status) = self.conns[token].limited {
            let why = "connecting too fast: accept rate limit";
            // The server's rate (503): spread, so that the refused do not return together.
            let retry = if status == 503 { retry_soon_jittered() } else { self.retry_after() };
            return self.refuse(token, now, status, &retry, why);
        }
        if self.shared.per_ip(peer) > config.max_connections_per_ip {
            let why = "too many connections from this address";
            return self.refuse(token, now, 429, &self.retry_after(), why);
        }
        if self.shared.open.load(Ordering::Relaxed) > config.max_connections
            || self.drain_deadline.is_some()
        {
            let retry = retry_soon_jittered();
            return self.refuse(token, now, 503, &retry, "server at its connection limit");
        }
        if self.pool.chunks_free() * self.pool.chunk_size() < config.connection_reserve {
            // The pool net of what the open connections cost the kernel (withheld chunks).
            self.shared.metrics.access_refusal("budget");
            return self.refuse(token, now, 503, &retry_soon_jittered(), BUDGET_EXHAUSTED);
        }
        if let Some((status, reason, why)) =
            listing.as_ref().and_then(|(l, _)| self.listing_refusal(l))
        {
            self.shared.metrics.access_refusal(reason);
            return self.refuse(token, now, status, "", &why);
        }
        // A listing is decided as its topic's upgrade (`{route}{topic}?query`); an event
        // stream resumes from its `Last-Event-ID` as a WebSocket does from `since=`: the
        // handler sees the offset in the target, where it looks for it.
        let (listing, decided) = listing.unzip();
        let target = match event_stream {
            _ if decided.is_some() => std::borrow::Cow::Owned(decided.unwrap_or_default()),
            false => std::borrow::Cow::Borrowed(path),
            true => match crate::topics::event_stream_target(path, request.header("last-event-id"))
            {
                Ok(target) => target,
                Err(why) => {
                    self.shared.metrics.access_refusal("since_malformed");
                    return self.refuse(token, now, 400, "", why);
                }
            },
        };
        let (path, request) = (&*target, request.with_path(&target));
        // permessage-deflate: what the route answers to the offers (server/compression.rs);
        // its budget is drawn when the connection opens. Not on an event stream.
        let compression = match event_stream {
            false => self.compression_agreement(&options, &request),
            true => None,
        };
        let credentialed_origin = (event_stream && self.shared.origins.is_restricted())
            .then(|| request.origin().map(<[u8]>::trim_ascii))
            .flatten()
            .filter(|origin| origin.iter().all(u8::is_ascii_graphic))
            .map(|origin| String::from_utf8_lossy(origin).into());
        let serial = self.conns[token].serial;
        let recoverer = self.shared.hub.recoverer();
        let decision = Decision::new(token, serial, peer, self.decisions.clone(), recoverer);
        self.decisions.deciding.store(true, Ordering::SeqCst);
        self.router.handler(route).decide_upgrade(&request, decision);
        self.decisions.deciding.store(false, Ordering::SeqCst);
        self.decisions.drain_into(&mut self.completed);
        let mine = self.completed.iter().position(|c| {
            c.token == token
                && c.serial == serial
                && !matches!(c.outcome, DecisionOutcome::Published)
        });
        let upgrade =
            Upgrading { route, options, compression, event_stream, credentialed_origin, listing };
        match mine.map(|i| self.completed.swap_remove(i).outcome) {
            Some(DecisionOutcome::Reject { status, reason, why }) => {
                self.refuse_upgrade(token, now, status, reason, why.as_deref())
            }
            Some(DecisionOutcome::Published) => false, // excluded above
            Some(DecisionOutcome::Accept(accepted)) => {
                let key = request.accept_key();
                if !self.open_upgraded(token, now, upgrade, path, &key, accepted) {
                    return false;
                }
                if len < buf.len() {
                    self.receive(token, now, &mut buf[len..], false);
                }
                true
            }
            None if len < buf.len() => {
                // The decision comes later; the bytes after the head cannot wait for it
                // (they would hold the loop's read buffer). §4.1: "the client MUST wait for a
                // response from the server before sending any further data."
                self.refuse(token, now, 400, "", "data sent before the handshake response")
            }
            None if !self.shared.reserve_pending(&self.config) => {
                self.shared.metrics.access_refusal("pending_full");
                let retry = retry_soon_jittered();
                self.refuse(token, now, 503, &retry, "too many upgrades awaiting a decision")
            }
            None => {
                let accept_key = request.accept_key();
                let target = path.into();
                let pending = PendingUpgrade { serial, upgrade, target, accept_key };
                self.pending.insert(token, pending);
                false
            }
        }
    }

    /// Keeps a partial request head (or PROXY header) for the next read. Partial heads are
    /// untrusted: together they may hold a share of the pool only, so slow clients cannot
    /// starve the connections already open.
    pub(super) fn keep_partial(&mut self, token: usize, now: Instant, buf: &[u8]) -> bool {
        let chunk = self.pool.chunk_size();
        let chunks = head_chunks(buf.len(), chunk);
        if !self.untrusted_room(0, chunks) {
            return self.refuse(token, now, 503, RETRY_SOON, "too many partial requests");
        }
        // What the connections' kernel memory leaves of the pool, less the floor kept for
        // answers (this 503 among them): a head that does not fit is refused, not tried.
        if self.pool.chunks_free() < chunks + self.config.connection_reserve.div_ceil(chunk) / 2 {
            self.shared.metrics.access_refusal("budget");
            return self.refuse(token, now, 503, RETRY_SOON, BUDGET_EXHAUSTED);
        }
        let partial = self.conns[token].session.partial_mut();
        if partial.append(&mut self.pool, buf).is_err() {
            partial.clear(&mut self.pool);
            return self.refuse(token, now, 503, RETRY_SOON, BUDGET_EXHAUSTED);
        }
        self.head_chunks += chunks;
        false
    }

    /// Whether the connections that have not upgraded, with `connections` more of them and
    /// `head` more chunks of partial heads, stay within their [share](HEAD_SHARE) of the
    /// pool. Each is counted its kernel memory and at least a chunk of head: a crowd of them,
    /// however slow, cannot leave the open connections' data path short, and one let in has
    /// room for its request.
    pub(super) fn untrusted_room(&self, connections: usize, head: usize) -> bool {
        let untrusted = self.conns.len() - self.upgraded + connections;
        let charged = (untrusted * self.connection_charge).div_ceil(self.pool.chunk_size());
        let heads = (self.head_chunks + head).max(untrusted);
        heads + charged <= self.pool.chunks_total() / HEAD_SHARE
    }

    /// Puts the connection just accepted at the end of the [untrusted](EventLoop::untrusted)
    /// queue, and prunes the queue when most of it is stale.
    pub(super) fn trail_untrusted(&mut self, token: usize) {
        self.untrusted.push_back((token, self.conns[token].serial));
        if self.untrusted.len() > 2 * (self.conns.len() - self.upgraded) + 64 {
            let conns = &self.conns;
            self.untrusted.retain(|&(token, serial)| {
                conns.get(token).is_some_and(|c| c.serial == serial && !c.upgraded)
            });
        }
    }

    /// Closes the oldest connection that has not upgraded, and gives back its socket and head
    /// now: one still waiting for its request, its body or its upgrade decision gets a 503
    /// straight away, counted in `access_refusals_total{reason="handshakes_full"}`; one
    /// already answered (a refusal on its way out) is written what the socket takes of its
    /// answer and closed. `false` when there is none.
    pub(super) fn close_oldest_untrusted(&mut self, now: Instant) -> bool {
        while let Some((token, serial)) = self.untrusted.pop_front() {
            let Some(entry) = self.conns.get_mut(token) else { continue };
            if entry.serial != serial || entry.upgraded {
                continue;
            }
            if !matches!(entry.session.phase, Phase::Request { .. } | Phase::Body(_)) {
                // A refusal on its way out, perhaps queued this turn and not yet flushed:
                // what the socket takes of it goes before the close, not a bare EOF.
                let mut io =
                    Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
                let _ = entry.stream.write_queue(&mut entry.session, &mut io);
                self.remove(token);
                return true;
            }
            self.shared.metrics.access_refusal("handshakes_full");
            self.shared.metrics.refuse(503);
            let mut out = [0u8; 512];
            let retry = retry_soon_jittered();
            let n = http::write_refusal(503, &retry, HANDSHAKES_FULL, &mut out).unwrap_or(0);
            let mut io =
                Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
            let _ = entry.stream.write_vectored(&mut io, &[std::io::IoSlice::new(&out[..n])]);
            if let Some(suppressed) = self.log_throttle.allow(now.as_millis()) {
                let peer = entry.peer;
                tracing::info!(status = 503, %peer, why = HANDSHAKES_FULL, suppressed, "closed the oldest not open");
            }
            self.remove(token);
            return true;
        }
        false
    }

    /// Refuses a connection as it is accepted, before it holds anything (counted in
    /// `access_refusals_total{reason="handshakes_full"}`), when every connection not open is
    /// already on its way out. A plain one gets its 503: what it sent is read first, so that
    /// closing sends a FIN and the client reads the answer, not a reset. A TLS one is closed:
    /// it has no session to answer through.
    pub(super) fn refuse_accepted(
        &mut self,
        mut stream: mio::net::TcpStream,
        peer: SocketAddr,
        now: Instant,
        tls: bool,
    ) {
        self.shared.metrics.access_refusal("handshakes_full");
        if !tls {
            let mut out = [0u8; 512];
            let retry = retry_soon_jittered();
            let n = http::write_refusal(503, &retry, HANDSHAKES_FULL, &mut out).unwrap_or(0);
            let _ = std::io::Read::read(&mut stream, &mut self.read_buf);
            let _ = std::io::Write::write(&mut stream, &out[..n]);
            self.shared.metrics.refuse(503);
        }
        if let Some(suppressed) = self.log_throttle.allow(now.as_millis()) {
            tracing::info!(status = 503, %peer, why = HANDSHAKES_FULL, tls, suppressed, "refused at accept");
        }
    }

    pub(super) fn refuse_error(
        &mut self,
        token: usize,
        now: Instant,
        error: HandshakeError,
    ) -> bool {
        let mut out = [0u8; 512];
        // NOTE(unwrap): every refusal fits in 512 bytes.
        let n = error.write_response(&mut out).unwrap();
        self.send_final(token, now, error.status(), &out[..n], &error);
        false
    }

    /// Answers `status` with `extra` headers and a plain-text `body` saying why, then closes.
    /// Always `false` (the connection is not open), for the callers' convenience.
    pub(super) fn refuse(
        &mut self,
        token: usize,
        now: Instant,
        status: u16,
        extra: &str,
        body: &str,
    ) -> bool {
        let mut out = [0u8; 512];
        let n = http::write_refusal(status, extra, body, &mut out).unwrap_or(0);
        self.send_final(token, now, status, &out[..n], &body);
        false
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
    pub(super) fn queue_final(&mut self, token: usize, now: Instant, parts: &[&[u8]]) {
        let entry = &mut self.conns[token];
        if let Err(parts) = entry.session.respond_final(&mut self.pool, parts, now + LINGER)
            && entry.session.buffered() == 0
        {
            let slices: Vec<std::io::IoSlice<'_>> =
                parts.iter().map(|p| std::io::IoSlice::new(p)).collect();
            let mut io =
                Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
            let _ = entry.stream.write_vectored(&mut io, &slices);
        }
    }

    /// The `Retry-After` header line a 429 carries (`retry_after`, at least a second).
    pub(super) fn retry_after(&self) -> String {
        format!("Retry-After: {}\r\n", self.config.retry_after.as_secs().max(1))
    }

    /// `POST {path}{topic}` (or `POST {path}` with a batch): checks the bearer token, the
    /// name and the length, then publishes the body, now (`body` holds it all) or once it has
    /// arrived. Returns the bytes of `body` it used when the connection was kept alive.
    pub(super) fn http_publish(
        &mut self,
        token: usize,
        now: Instant,
        topic: &str,
        headers: &[httparse::Header<'_>],
        body: &[u8],
        reply: Reply,
    ) -> Option<usize> {
        let header = |name: &str| header(headers, name);
        // A browser sends `Origin` with every POST; a page from another origin publishes
        // only where `cors_origins` allows it. CORS alone would let the request through and
        // only hide the answer from the page: refused here, before anything is published.
        if let Some(origin) = header("origin").map(String::from_utf8_lossy)
            && !same_origin(&origin, header("host"))
            && !self.shared.cors_allows(&self.config, &origin)
        {
            self.shared.metrics.access_refusal("origin");
            let why = format!(
                "pages from {origin} may not publish here (topics.cors_origins, \
                 --publish-cors-origin)"
            );
            self.refuse(token, now, 403, "", &why);
            return None;
        }
        let bearer = bearer_token(headers);
        let expected = self.config.topics.publish_token.as_deref();
        let by_token = expected.zip(bearer).is_some_and(|(expected, given)| {
            constant_time_eq(given.as_bytes(), expected.as_bytes())
        });
        let mut grant = None;
        match (by_token, self.router.publisher_access(), expected, bearer) {
            (true, ..) => {}
            (false, Some(access), ..) => match access.authorize(bearer) {
                Ok(granted) => grant = Some(Grant(granted)),
                Err(refusal) => {
                    self.shared.metrics.access_refusal(refusal.reason);
                    let challenge = if refusal.status == 401 { BEARER_CHALLENGE } else { "" };
                    self.refuse(token, now, refusal.status, challenge, &refusal.why);
                    return None;
                }
            },
            (false, None, Some(_), None) => {
                self.refuse(token, now, 401, BEARER_CHALLENGE, "a bearer token is required");
                return None;
            }
            (false, None, Some(_), Some(_)) => {
                self.refuse(token, now, 403, "", "wrong publish token");
                return None;
            }
            (false, None, None, _) => {}
        }
        if let Some(Grant(grant)) = &grant
            && !topic.is_empty()
            && !grant.may_publish(topic)
        {
            self.shared.metrics.access_refusal("topic_not_granted");
            let why = format!("the token does not grant publishing to {topic:?}");
            self.refuse(token, now, 403, "", &why);
            return None;
        }
        // An empty topic is a batch (a JSON array of `{topic, data}`).
        if !(topic.is_empty() || crate::topics::valid_topic(topic)) {
            self.refuse(token, now, 400, "", "invalid topic name");
            return None;
        }
        let cors = self.cors_headers(headers, false);
        let max = self.config.limits.max_message_size as u64;
        let text = topic.is_empty() || header("content-type").is_some_and(is_text);
        let kind = if text { MessageKind::Text } else { MessageKind::Binary };
        // `request` refused every other framing before routing.
        let chunked = (chunked_body(headers) == Ok(true)).then(|| Chunked::new(max));
        let len = match (&chunked, content_length(headers)) {
            (Some(_), _) => 0,
            (None, Ok(Some(len))) if len > max => {
                self.refuse(token, now, 413, "", "body larger than max_message_size");
                return None;
            }
            (None, Ok(Some(len))) => len as usize, // NOTE: at most max_message_size
            (None, Ok(None)) => {
                self.refuse(token, now, 411, "", "a Content-Length is required");
                return None;
            }
            (None, Err(refused)) => {
                self.refuse(token, now, refused.status(), "", refused.message());
                return None;
            }
        };
        // Framed (a server frame's header is 2, 4 or 10 bytes; a history topic's offset
        // envelope before the payload), a publication over a topic subscriber's cap could
        // reach none of them: refused before a byte is kept.
        let framed = len + self.shared.hub.envelope_room(topic);
        let header_len = match framed {
            0..=125 => 2,
            126..=0xffff => 4,
            _ => 10,
        };
        if framed + header_len > self.config.topics.send_cap {
            self.refuse(token, now, 413, "", "body larger than a subscriber's send cap");
            return None;
        }
        if chunked.is_none() && body.len() >= len {
            let whole = &body[..len];
            let kept = self.finish_publish(token, now, topic, kind, whole, reply, &cors, &grant);
            if self.awaiting.contains_key(&token) && body.len() > len {
                // A pipelined request waits for this one's answer.
                self.keep_partial(token, now, &body[len..]);
            }
            return kept.then_some(len);
        }
        // The whole body is counted against the bodies' share before a byte of it is kept,
        // so bodies that never finish cannot take the pool piece by piece (a chunked one, of
        // unknown length, is counted as it grows).
        let reserved = len.div_ceil(self.pool.chunk_size()) + 1;
        let share = self.pool.chunks_total() / BODY_SHARE;
        if reserved > share {
            let why =
                format!("a body over {} bytes cannot be held now", share * self.pool.chunk_size());
            self.refuse(token, now, 413, "", &why);
            return None;
        }
        if self.body_chunks + reserved > share {
            self.refuse(token, now, 503, RETRY_SOON, "too many request bodies in flight");
            return None;
        }
        if body.is_empty() && header("expect").is_some_and(|v| has_token(v, b"100-continue")) {
            self.continue_100(token, now);
        }
        let entry = &mut self.conns[token];
        let deadline = match entry.session.phase {
            Phase::Request { deadline } => deadline,
            _ => now + self.config.limits.handshake_timeout,
        };
        let is_chunked = chunked.is_some();
        if !is_chunked {
            let partial = entry.session.partial_mut();
            if partial.append(&mut self.pool, body).is_err() {
                partial.clear(&mut self.pool);
                self.refuse(token, now, 503, RETRY_SOON, BUDGET_EXHAUSTED);
                return None;
            }
        }
        self.body_chunks += reserved;
        entry.session.phase = Phase::Body(Box::new(Body {
            deadline,
            topic: topic.into(),
            kind,
            remaining: len.saturating_sub(body.len()),
            reserved,
        }));
        self.plain.insert(token, PlainRequest { reply, cors, chunked, grant });
        if is_chunked {
            let used = self.feed_chunked(token, now, body)?;
            if self.awaiting.contains_key(&token) {
                // The answer waits for other loops; a pipelined request waits for it.
                if used < body.len() {
                    self.keep_partial(token, now, &body[used..]);
                }
                return None;
            }
            // Done within this read: kept alive if the phase went back to requests.
            let kept = matches!(
                self.conns.get(token).map(|e| &e.session.phase),
                Some(Phase::Request { .. })
            );
            self.resume.retain(|&t| t != token);
            return kept.then_some(used);
        }
        None
    }

    /// Reads more of a `POST` body into the session; publishes it once complete.
    pub(super) fn read_body(&mut self, token: usize, now: Instant) {
        if self.plain.get(&token).is_some_and(|p| p.chunked.is_some()) {
            return self.read_chunked(token, now);
        }
        let mut buf = std::mem::take(&mut self.read_buf);
        let mut bytes = 0;
        loop {
            if bytes >= READ_BYTES_PER_TURN {
                // A large body is read a share per turn, like a WebSocket's messages.
                self.resume.push(token);
                break;
            }
            let entry = &mut self.conns[token];
            let Phase::Body(post) = &mut entry.session.phase else { break };
            let want = post.remaining.min(buf.len());
            let mut io =
                Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
            match entry.stream.read(&mut io, &mut buf[..want]) {
                Ok(0) => {
                    self.remove(token);
                    break;
                }
                Ok(n) => {
                    self.stats.bytes_in += n as u64;
                    bytes += n;
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
                            Phase::Draining { deadline: now, discarded: 0 },
                        ) else {
                            unreachable!("matched above")
                        };
                        let body = entry.session.take_message();
                        let mut assembly = std::mem::take(&mut self.assembly);
                        let state = self.plain.remove(&token).unwrap_or_default();
                        match assembly.fill(&mut self.pool, body) {
                            Some(body) => {
                                let (topic, kind, cors) = (&post.topic, post.kind, &state.cors);
                                if self.finish_publish(
                                    token,
                                    now,
                                    topic,
                                    kind,
                                    body,
                                    state.reply,
                                    cors,
                                    &state.grant,
                                ) {
                                    // Kept alive: a pipelined request may be waiting already.
                                    self.resume.push(token);
                                }
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
}

/// The chunks a partial request head of `len` bytes is counted as holding.
fn head_chunks(len: usize, chunk_size: usize) -> usize {
    len.div_ceil(chunk_size)
}

/// Whether a browser's `Origin` (`scheme://host[:port]`) names the host the request was sent
/// to (its `Host`): a page of this server's own.
fn same_origin(origin: &str, host: Option<&[u8]>) -> bool {
    let Some(host) = host else { return false };
    let Some((_, origin_host)) = origin.split_once("://") else { return false };
    origin_host.as_bytes().eq_ignore_ascii_case(host)
}
