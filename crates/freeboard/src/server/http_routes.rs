//! Plain HTTP beside the WebSocket, spoken as HTTP/1.1: methods (`GET`/`HEAD` on health and
//! metrics, `POST` and `OPTIONS` on publish, 405 with `Allow` otherwise), keep-alive (a
//! connection returns to the request phase after a response, with a fresh request timeout),
//! `Expect: 100-continue`, chunked request bodies, CORS for publish, publish answers that say
//! how many subscribers a message reached and for how many it was dropped, and batch publish.

use std::sync::Arc;

use freeboard_proto::handshake::HandshakeError;
use freeboard_proto::http::{self, ChunkError, ResponseHead, chunked_body, content_length, header};
use freeboard_proto::{Instant, MessageKind};
use serde::Deserialize;

use super::event_loop::{EventLoop, READ_BYTES_PER_TURN};
use super::requests::{AwaitingPublish, BUDGET_EXHAUSTED, Grant, PublishAnswer, RETRY_SOON, Reply};
use crate::handler::{Completion, DecisionOutcome, HttpRoute};
use crate::receipt::Receipt;
use crate::session::Phase;
use crate::transport::{Io, Transport};

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
        let target = http::target_path(path);
        let header = |name: &str| header(req.headers, name);
        // `request` refused every invalid transfer coding before routing.
        let has_body = chunked_body(req.headers) == Ok(true)
            || !matches!(content_length(req.headers), Ok(None | Some(0)));
        let keep_alive = req.version == Some(1)
            && !eof
            && self.drain_deadline.is_none()
            && !header("connection").is_some_and(|v| http::has_token(v, b"close"))
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
                    let json: String;
                    let mut extra = "";
                    const JSON: &str = "application/json";
                    let (kind, body) = match route {
                        HttpRoute::Topics => {
                            json = self.shared.metrics.topics_json();
                            (JSON, json.as_bytes())
                        }
                        HttpRoute::Slowest => {
                            let n = http::query_value(path, "n").and_then(|n| n.parse().ok());
                            json = self.shared.metrics.slowest_json(n.unwrap_or(10).min(100));
                            (JSON, json.as_bytes())
                        }
                        HttpRoute::Connection => {
                            let id = http::query_value(path, "id").unwrap_or("");
                            let Some(found) = self.shared.metrics.connection_json(id) else {
                                let why = "no such connection among the slowest of the last sweep";
                                self.refuse(token, now, 404, "", why);
                                return None;
                            };
                            json = found;
                            (JSON, json.as_bytes())
                        }
                        HttpRoute::Metrics => {
                            metrics = self.shared.metrics.shared_exposition();
                            (crate::metrics::CONTENT_TYPE, metrics.as_bytes())
                        }
                        HttpRoute::Dashboard => {
                            ("text/html; charset=utf-8", crate::dashboard::PAGE.as_bytes())
                        }
                        HttpRoute::File { content_type, body } => {
                            extra = "Access-Control-Allow-Origin: *\r\n";
                            (content_type, body)
                        }
                        _ => ("text/plain", &b"ok\n"[..]),
                    };
                    self.reply(token, now, 200, extra, kind, body, reply).then_some(0)
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
        let head = ResponseHead {
            status,
            headers: extra,
            content_type: (!content_type.is_empty()).then_some(content_type),
            // RFC 9110 §8.6: "A server MUST NOT send a Content-Length header field in any
            // response with a status code of [...] 204 (No Content)".
            content_length: (status != 204).then_some(body.len()),
            close: !keep_alive,
        }
        .to_string();
        let body = if reply.head_only || status == 204 { &[][..] } else { body };
        self.queue_final(token, now, &[head.as_bytes(), body]);
        let entry = &mut self.conns[token];
        // Queued (not written straight to the socket for want of pool): keep it alive.
        if keep_alive && entry.session.buffered() > 0 {
            let deadline = now + self.config.limits.handshake_timeout;
            entry.session.phase = Phase::Request { deadline };
            return true;
        }
        false
    }

    /// Queues `HTTP/1.1 100 Continue`: the client may send the body it holds back.
    pub(super) fn continue_100(&mut self, token: usize, now: Instant) {
        let entry = &mut self.conns[token];
        let phase = std::mem::replace(
            &mut entry.session.phase,
            Phase::Draining { deadline: now, discarded: 0 },
        );
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
        grant: &Option<Grant>,
    ) -> bool {
        // A receipt when other loops report, or the backplane acknowledges.
        let acknowledged = self.shared.hub.backplane_acknowledges();
        let receipt = (self.config.threads > 1 || acknowledged).then(|| {
            let (decisions, serial) = (self.decisions.clone(), self.conns[token].serial);
            Arc::new(Receipt::new(move || {
                decisions.push(Completion { token, serial, outcome: DecisionOutcome::Published });
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
                let (queued, lost, unconnected) = answer.backplane.get_or_insert((0, 0, 0));
                *queued += published.backplane;
                *lost += published.backplane_lost;
                *unconnected += published.backplane_unconnected;
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
            if let Some(Grant(grant)) = grant
                && let Some(bad) = items.iter().find(|i| !grant.may_publish(&i.topic))
            {
                self.shared.metrics.access_refusal("topic_not_granted");
                let why = format!("the token does not grant publishing to {:?}", bad.topic);
                self.refuse(token, now, 403, "", &why);
                return false;
            }
            let texts: Vec<(&str, String)> = items
                .iter()
                .map(|item| match &item.data {
                    serde_json::Value::String(s) => (&*item.topic, s.clone()),
                    other => (&*item.topic, other.to_string()),
                })
                .collect();
            if texts.iter().any(|(topic, text)| self.presence_reserves(topic, text.as_bytes())) {
                self.refuse(token, now, 400, "", crate::presence::RESERVED);
                return false;
            }
            for (topic, text) in &texts {
                publish(self, topic, MessageKind::Text, text.as_bytes());
            }
        } else {
            if kind == MessageKind::Text && std::str::from_utf8(body).is_err() {
                self.refuse(token, now, 400, "", "a text body must be UTF-8");
                return false;
            }
            if self.presence_reserves(topic, body) {
                self.refuse(token, now, 400, "", crate::presence::RESERVED);
                return false;
            }
            publish(self, topic, kind, body);
        }
        match receipt {
            Some(receipt) if !receipt.release() => {
                let entry = &mut self.conns[token];
                let deadline = now + self.config.limits.handshake_timeout;
                entry.session.phase = Phase::Request { deadline };
                let cors = cors.to_owned();
                let waiting =
                    AwaitingPublish { serial: entry.serial, answer, receipt, reply, cors };
                self.awaiting.insert(token, waiting);
                false
            }
            receipt => {
                let remote = receipt.as_ref().map_or((0, 0), |r| r.counts());
                let mut answer = answer;
                answer.unacknowledged(receipt.map_or(0, |r| r.unacknowledged()));
                self.answer_with(token, now, &answer, remote, true, cors, reply)
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
        let (mut answer, remote) = (waiting.answer, waiting.receipt.counts());
        answer.unacknowledged(waiting.receipt.unacknowledged());
        let (cors, reply) = (&waiting.cors, waiting.reply);
        if self.answer_with(token, now, &answer, remote, complete, cors, reply) {
            // A pipelined request may be waiting in the session already.
            self.resume.push(token);
        }
        self.mark(token);
    }

    /// Sends a publish's answer: its JSON, with the status it earns
    /// ([`PublishAnswer::status`]; a 503 says when to try again).
    #[allow(clippy::too_many_arguments)]
    fn answer_with(
        &mut self,
        token: usize,
        now: Instant,
        answer: &PublishAnswer,
        remote: (u64, u64),
        complete: bool,
        cors: &str,
        reply: Reply,
    ) -> bool {
        let json = answer.json(remote, complete);
        let status = answer.status(complete);
        let extra = match status {
            503 => format!("{cors}{RETRY_SOON}"),
            _ => cors.to_owned(),
        };
        self.reply(token, now, status, &extra, "application/json", json.as_bytes(), reply)
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
                let Phase::Body(post) = std::mem::replace(
                    &mut entry.session.phase,
                    Phase::Draining { deadline: now, discarded: 0 },
                ) else {
                    return Some(input.len());
                };
                let body = entry.session.take_message();
                let mut assembly = std::mem::take(&mut self.assembly);
                match assembly.fill(&mut self.pool, body) {
                    Some(body) => {
                        let (cors, grant) = (state.cors, state.grant);
                        let (topic, kind) = (&post.topic, post.kind);
                        let reply = state.reply;
                        if self.finish_publish(token, now, topic, kind, body, reply, &cors, &grant)
                        {
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
