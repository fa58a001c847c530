//! Who gets in, and for how long: upgrade decisions completed later (on any thread), their
//! timeout, and the expiry of open connections' authorizations.

use std::net::SocketAddr;

use freeboard_buf::{ConflateKey, SendQueue};
use freeboard_proto::handshake::AcceptKey;
use freeboard_proto::http::{BEARER_CHALLENGE, bearer_token, constant_time_eq, query_value};
use freeboard_proto::{Instant, Role};

use super::event_loop::{EventLoop, PendingUpgrade, Upgrading};
use super::requests::{BUDGET_EXHAUSTED, RETRY_SOON};
use crate::auth::TOKEN_EXPIRED;
use crate::handler::{Accepted, Completion, DecisionOutcome};
use crate::parking::ProtocolState;
use crate::session::Phase;
use crate::topics::topics_in_target;
use crate::transport::Transport;

/// The body of a 503 for an upgrade whose topics the loop's budget cannot hold.
const TOPICS_EXHAUSTED: &str = "server memory budget for topics exhausted";

impl<T: Transport> EventLoop<T> {
    /// Whether `token`'s client may reach an admin route (see
    /// [`AdminConfig`](crate::config::AdminConfig)). If not, it has been answered (404 off the
    /// admin listener, 401 or 403) and the refusal counted.
    pub(super) fn admit_admin(
        &mut self,
        token: usize,
        now: Instant,
        headers: &[httparse::Header<'_>],
        target: &str,
    ) -> bool {
        let admin = &self.config.admin;
        let entry = &self.conns[token];
        let now_secs = now.as_millis() as f64 / 1000.0;
        let refusal = if admin.listen.is_some() && !entry.admin_listener {
            Some((404, "", "", "no such route"))
        } else if !self.shared.admin_request(&self.config, entry.peer.ip(), now_secs) {
            self.shared.metrics.access_refusal("admin_rate");
            let why = "too many admin requests from this address";
            self.refuse(token, now, 429, &self.retry_after(), why);
            return false;
        } else if let Some(expected) = &admin.token {
            match bearer_token(headers).or_else(|| query_value(target, "token")) {
                None => Some((
                    401,
                    BEARER_CHALLENGE,
                    "admin_token_missing",
                    "an admin token is required",
                )),
                Some(given) if !constant_time_eq(given.as_bytes(), expected.as_bytes()) => {
                    Some((403, "", "admin_token_invalid", "wrong admin token"))
                }
                Some(_) => None,
            }
        } else if admin.listen.is_none() && !entry.peer.ip().is_loopback() {
            let why = "admin routes answer loopback clients only: set an admin token or listener";
            Some((403, "", "admin_not_loopback", why))
        } else {
            None
        };
        let Some((status, extra, reason, why)) = refusal else { return true };
        if !reason.is_empty() {
            self.shared.metrics.access_refusal(reason);
        }
        self.refuse(token, now, status, extra, why);
        false
    }

    /// Acts on the upgrade decisions completed since the last turn.
    pub(super) fn run_decisions(&mut self, now: Instant) {
        self.decisions.drain_into(&mut self.completed);
        if self.completed.is_empty() {
            return;
        }
        for completion in std::mem::take(&mut self.completed) {
            match completion.outcome {
                DecisionOutcome::Published => {
                    self.answer_publish(completion.token, completion.serial, now, true);
                }
                _ => self.finish_decision(completion, now),
            }
        }
    }

    /// The handshake timeout passed while the upgrade decision was pending: 503, counted;
    /// the decision, if it ever comes, is ignored.
    pub(super) fn decision_timed_out(&mut self, token: usize, now: Instant) {
        if self.pending.remove(&token).is_some() {
            self.shared.release_pending();
        }
        self.shared.metrics.access_refusal("decision_timeout");
        self.refuse(token, now, 503, RETRY_SOON, "the upgrade decision timed out");
        self.mark(token);
    }

    /// The authorization of the connection `(token, serial)` lapsed: close it with 4001.
    pub(super) fn expire_authorization(&mut self, token: usize, serial: u64, now: Instant) {
        let Some(entry) = self.conns.get(token) else { return };
        if entry.serial != serial || !matches!(entry.session.phase, Phase::Open(_)) {
            return;
        }
        self.shared.metrics.access.token_expiries.inc();
        tracing::debug!(peer = %entry.peer, "authorization expired");
        let (entry, mut cx) = self.split(token, now);
        let _ = entry.session.close(&mut cx, TOKEN_EXPIRED, "token expired");
        self.report_close(token);
        self.mark(token);
    }

    /// Refuses an upgrade its handler decided against (the body says `why`, else `reason`);
    /// an application's own reason is counted as an access refusal.
    pub(super) fn refuse_upgrade(
        &mut self,
        token: usize,
        now: Instant,
        status: u16,
        reason: &str,
        why: Option<&str>,
    ) -> bool {
        if reason != "refused" {
            self.shared.metrics.access_refusal(reason);
        }
        let retry;
        let extra = match status {
            401 => BEARER_CHALLENGE,
            503 => {
                retry = super::requests::retry_soon_jittered();
                &retry
            }
            _ => "",
        };
        self.refuse(token, now, status, extra, why.unwrap_or(reason))
    }

    /// Switches the connection to WebSocket after an accepting decision: the `101`, the
    /// route's queue and compression, the decision's data and expiry, `on_open`. Returns
    /// whether it is open.
    pub(super) fn open_upgraded(
        &mut self,
        token: usize,
        now: Instant,
        upgrade: Upgrading,
        target: &str,
        accept_key: &AcceptKey,
        accepted: Accepted,
    ) -> bool {
        let Upgrading { route, options, compression, event_stream, credentialed_origin, listing } =
            upgrade;
        if let Some(listing) = listing {
            self.answer_listing(token, now, &listing, target);
            return false;
        }
        let names = topics_in_target(self.router.path(route), target);
        let several = names.as_ref().is_some_and(|names| names.len() > 1);
        if options.subscribes
            && let Some(names) = names
            && !self.topics.affords(None, names)
        {
            // Refused before its 101 rather than closed after it (the subscriptions are made
            // in `on_open`, right after).
            self.shared.metrics.topic_refusal("budget");
            return self.refuse(token, now, 503, RETRY_SOON, TOPICS_EXHAUSTED);
        }
        let (protocol, data, expires, subject) = accepted.into_parts();
        let expires = match expires.map(|at| at.duration_since(std::time::SystemTime::now())) {
            None => None,
            Some(Ok(left)) => Some(now + left),
            Some(Err(_)) => {
                self.shared.metrics.access_refusal("token_expired");
                return self.refuse(token, now, 401, BEARER_CHALLENGE, "authorization expired");
            }
        };
        // permessage-deflate (server/compression.rs): a dedicated context draws its budget
        // now, and gives it back if the connection does not open.
        let mut deflate = compression.and_then(|agreed| self.compression_state(agreed));
        let extensions = deflate.as_ref().map(|d| d.agreement.response());
        let mut response = [0u8; 1024];
        let n = match event_stream {
            false => {
                switching_protocols(accept_key, protocol, extensions.as_deref(), &mut response)
            }
            true => {
                let retry = self.config.topics.sse_retry_ms;
                event_stream_ok(retry, credentialed_origin.as_deref(), &mut response)
            }
        };
        let Some(n) = n else {
            if let Some(d) = &mut deflate {
                d.release(&mut self.pool);
            }
            return self.refuse(token, now, 500, "", "response too large");
        };
        let entry = &mut self.conns[token];
        let custom = options.slow_consumer.is_some()
            || options.watermarks.is_some()
            || options.conflate_key.is_some();
        let queue = custom.then(|| {
            let queue = entry.session.queue();
            let marks = options.watermarks.unwrap_or(*queue.watermarks());
            let queue = SendQueue::new(marks, options.slow_consumer.unwrap_or(queue.policy()));
            // An event stream's key is read from its events' `data:` line.
            match options.conflate_key {
                Some(key) => queue.with_conflate_key(ConflateKey { events: event_stream, ..key }),
                None => queue,
            }
        });
        let deadline = match entry.session.phase {
            Phase::Request { deadline } => Some(deadline),
            _ => None,
        };
        let ws = ProtocolState::new(Role::Server, self.lot.config(), now);
        if entry.session.upgrade(&mut self.pool, ws, queue, &response[..n]).is_err() {
            if let Some(d) = &mut deflate {
                d.release(&mut self.pool);
            }
            // The pool cannot hold the response after all: a 503 (written straight to the
            // socket if need be), never a bare EOF.
            self.shared.metrics.access_refusal("budget");
            return self.refuse(token, now, 503, RETRY_SOON, BUDGET_EXHAUSTED);
        }
        if let Some(d) = deflate {
            entry.session.set_deflate(*d);
        }
        if event_stream {
            entry.session.set_event_stream(several);
            entry.event_stream = Some(several);
            self.shared.metrics.event_streams.inc();
        }
        entry.route = route as u32;
        let serial = entry.serial;
        self.shared.metrics.connections.inc();
        entry.upgraded = true;
        self.upgraded += 1;
        if event_stream {
            self.event_streams += 1;
            self.charge_connections();
        }
        if let Some(deadline) = deadline {
            // Accepted at the deadline less the handshake timeout (one clock, milliseconds).
            let timeout = self.config.limits.handshake_timeout.as_millis() as u64;
            let taken = (now.as_millis() + timeout).saturating_sub(deadline.as_millis());
            self.shared.metrics.handshake_duration.observe(taken);
        }
        if let Some(data) = data {
            self.data.insert(token, data);
        }
        if let Some(subject) = subject {
            self.subjects.insert(token, subject);
        }
        if let Some(at) = expires {
            self.expiries.push(std::cmp::Reverse((at, token, serial)));
        }
        self.call_with(token, now, target, |handler, conn| handler.on_open(conn));
        true
    }

    /// Acts on a decision completed after its `decide_upgrade` call returned. A decision for
    /// a connection that is gone, timed out or reused its slot is ignored.
    pub(super) fn finish_decision(&mut self, completion: Completion, now: Instant) {
        let token = completion.token;
        if self.pending.get(&token).is_none_or(|p| p.serial != completion.serial) {
            return;
        }
        // NOTE(unwrap): looked up just above.
        let pending = self.pending.remove(&token).unwrap();
        self.shared.release_pending();
        match completion.outcome {
            DecisionOutcome::Reject { status, reason, why } => {
                self.refuse_upgrade(token, now, status, reason, why.as_deref());
            }
            DecisionOutcome::Published => {} // routed by `run_decisions`, never here
            DecisionOutcome::Accept(accepted) => {
                let reserve = self.config.connection_reserve;
                if self.pool.chunks_free() * self.pool.chunk_size() < reserve {
                    self.shared.metrics.access_refusal("budget");
                    self.refuse(token, now, 503, RETRY_SOON, BUDGET_EXHAUSTED);
                } else {
                    let PendingUpgrade { upgrade, target, accept_key, .. } = pending;
                    if self.open_upgraded(token, now, upgrade, &target, &accept_key, accepted) {
                        // What arrived while the decision was pending (edge-triggered epoll
                        // will not report it again), the peer's EOF included.
                        self.read_open(token, now);
                    }
                }
            }
        }
        self.mark(token);
    }

    /// Counts the connection against its client's address (a forwarded one, or its own).
    pub(super) fn attribute(&mut self, token: usize, now: Instant, client: SocketAddr) {
        let entry = &mut self.conns[token];
        if client.ip() != entry.peer.ip() {
            self.shared.metrics.access.forwarded.inc();
        }
        entry.peer = client;
        entry.attributed = true;
        let limited =
            self.shared.attribute(&self.config, client.ip(), now.as_millis() as f64 / 1000.0);
        let entry = &mut self.conns[token];
        entry.limited = entry.limited.or(limited);
    }
}

/// Writes the `200` that opens a Server-Sent Events stream, and its first line: the
/// reconnection delay (`retry`, ms); `None` if `out` is too small. The body runs until the
/// connection closes (RFC 9112 §6.3: without a length or a transfer coding, "the message
/// body length is determined by the number of octets received prior to the server closing
/// the connection"), so no chunked framing costs bytes per event. Any origin may read it
/// (origins the server does not allow were refused, 403, before this); one an allow-list
/// named, with credentials (`credentialed_origin`).
fn event_stream_ok(retry: u64, credentialed_origin: Option<&str>, out: &mut [u8]) -> Option<usize> {
    use std::io::Write;
    let mut w = std::io::Cursor::new(out);
    write!(
        w,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n\
         Connection: close\r\nX-Accel-Buffering: no\r\n"
    )
    .ok()?;
    // Fetch standard, CORS protocol: a credentialed request is shared only when the answer
    // names its origin (not `*`) and allows credentials.
    match credentialed_origin {
        Some(origin) => write!(
            w,
            "Access-Control-Allow-Origin: {origin}\r\nAccess-Control-Allow-Credentials: true\r\n\
             Vary: Origin\r\n"
        ),
        None => write!(w, "Access-Control-Allow-Origin: *\r\n"),
    }
    .ok()?;
    write!(w, "\r\nretry: {retry}\n\n").ok()?;
    Some(w.position() as usize)
}

/// Writes the `101 Switching Protocols` answering a request whose key gave `accept_key`;
/// `None` if `out` is too small.
fn switching_protocols(
    accept_key: &AcceptKey,
    protocol: Option<&str>,
    extensions: Option<&str>,
    out: &mut [u8],
) -> Option<usize> {
    use std::io::Write;
    let mut w = std::io::Cursor::new(out);
    w.write_all(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",
    )
    .ok()?;
    w.write_all(b"Sec-WebSocket-Accept: ").ok()?;
    w.write_all(accept_key).ok()?;
    w.write_all(b"\r\n").ok()?;
    if let Some(protocol) = protocol {
        write!(w, "Sec-WebSocket-Protocol: {protocol}\r\n").ok()?;
    }
    if let Some(extensions) = extensions {
        write!(w, "Sec-WebSocket-Extensions: {extensions}\r\n").ok()?;
    }
    w.write_all(b"\r\n").ok()?;
    Some(w.position() as usize)
}
