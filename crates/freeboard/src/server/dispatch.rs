//! Where the loop calls the application: each message a session completes goes to its
//! route's handler with a [`Conn`] on the connection, and so do watermark crossings and the
//! close, once.

use freeboard_buf::Writability;
use freeboard_proto::{CloseCode, Instant, MessageKind, State};

use super::event_loop::{EventLoop, loop_context};
use crate::handler::{Conn, ConnId, ConnKey, Handler, Message};
use crate::metrics::close_label;
use crate::session::{Phase, Received};
use crate::transport::Transport;

/// Queued messages after which a connection's replies are written before its read is parsed
/// further (pipelined small messages would otherwise hold a pool slot each for the turn).
const WRITE_THROUGH: u32 = 256;

/// Publishes held in the outbox while a read's messages are handled, at most (each holds
/// its frame's chunks until the fan-out).
pub(super) const OUTBOX_RUN: usize = 64;

impl<T: Transport> EventLoop<T> {
    /// Feeds one read to the session: whole messages go to the handler in place, assembled
    /// ones from the loop's assembly buffer. Returns the bytes used: all of them, unless
    /// `keeps_unread` (the transport can give the rest back) and the session stopped
    /// wanting input on the way.
    pub(super) fn receive(
        &mut self,
        token: usize,
        now: Instant,
        buf: &mut [u8],
        keeps_unread: bool,
    ) -> usize {
        let mut at = 0;
        while at < buf.len() && self.conns.contains(token) {
            let (used, assembled) = self.deliver_run(token, now, &mut buf[at..]);
            at += used;
            if let Some(kind) = assembled {
                let chain = self.conns[token].session.take_message();
                let mut assembly = std::mem::take(&mut self.assembly);
                match assembly.fill(&mut self.pool, chain) {
                    Some(data) => self.deliver(token, now, kind, data),
                    None => {
                        let (entry, mut cx) = self.split(token, now);
                        let reason = "server memory budget exhausted";
                        let _ = entry.session.close(&mut cx, CloseCode::TRY_AGAIN_LATER, reason);
                    }
                }
                self.assembly = assembly;
            }
            self.after_call(token, now);
            // A pause (send queue above its high watermark) stops reading from the socket, not
            // the parsing of bytes already read: dropping them would tear the stream. A
            // transport that keeps what was not parsed (io_uring's buffers) stops here too,
            // as a socket does: the replies of one read then cannot pass the cap.
            let Some(entry) = self.conns.get(token) else { return at };
            if entry.session.state() == State::Closed {
                self.report_close(token);
                return at;
            }
            if keeps_unread && !entry.session.wants_input() {
                return at;
            }
            if entry.session.cork_must_write(&self.cork, &buf[at..]) {
                // The next frame's reply might not fit: write what the cork holds now.
                self.write_cork(token, now);
            } else if entry.session.queue().messages() >= WRITE_THROUGH {
                // Many small replies from one read: write them now rather than hold a slot
                // each until the end of the turn.
                self.flush(token, now);
            }
        }
        at
    }

    /// Parses `buf` and hands its whole messages to the handler with one handle on the
    /// connection, until the read is used up or something only the loop can do is due (the
    /// checks at the end of [`receive`](Self::receive)'s round): the per-message path builds
    /// nothing but the message. Returns the bytes used, and the kind of a message that
    /// arrived in pieces (it waits in the session for the assembly buffer).
    fn deliver_run(
        &mut self,
        token: usize,
        now: Instant,
        buf: &mut [u8],
    ) -> (usize, Option<MessageKind>) {
        let (handler, mut conn) = self.handle(token, now, "");
        let mut at = 0;
        loop {
            let (used, received) = conn.session.receive(&mut conn.cx, &mut buf[at..]);
            at += used;
            match received {
                // (A session hands out messages only while open.)
                Some(Received::Whole(kind, data)) => {
                    conn.stats.received(data.len());
                    handler.on_message(&mut conn, Message { kind, data });
                }
                Some(Received::Assembled(kind)) => return (at, Some(kind)),
                None => {}
            }
            let session = &*conn.session;
            let unread = &buf[at..];
            if unread.is_empty()
                || session.state() == State::Closed
                || session.has_writability_change()
                || conn.outbox.len() >= OUTBOX_RUN
                || conn.cx.cork.as_deref().is_some_and(|c| session.cork_must_write(c, unread))
                || session.queue().messages() >= WRITE_THROUGH
            {
                return (at, None);
            }
        }
    }

    /// Hands an assembled message to the handler; [`receive`](Self::receive) then does what
    /// the call leaves for the loop, as after a run.
    fn deliver(&mut self, token: usize, now: Instant, kind: MessageKind, data: &[u8]) {
        self.stats.received(data.len());
        if matches!(self.conns[token].session.phase, Phase::Open(_)) {
            let (handler, mut conn) = self.handle(token, now, "");
            handler.on_message(&mut conn, Message { kind, data });
        }
    }

    /// Reports the session's close to its handler, once.
    pub(super) fn report_close(&mut self, token: usize) {
        let Some(entry) = self.conns.get_mut(token) else { return };
        let Some(closed) = entry.session.poll_close() else { return };
        let (code, reason, clean) = (closed.code.0, closed.reason(), closed.clean);
        let peer = entry.peer;
        if matches!(closed.code, CloseCode::NORMAL | CloseCode::GOING_AWAY) {
            tracing::debug!(code, reason, clean, %peer, "closed");
        } else if let Some(suppressed) = self.log_throttle.allow(self.now().as_millis()) {
            tracing::info!(code, reason, clean, %peer, suppressed, "closed abnormally");
        }
        let entry = &mut self.conns[token];
        self.shared.metrics.close(close_label(closed.code));
        let id = ConnId { event_loop: self.index, serial: entry.serial };
        let route = entry.route as usize;
        self.router.handler(route).on_close(id, closed.code, closed.reason());
    }

    /// Runs `f` with the route's handler and a handle on the connection, then reports the
    /// writability change the handler's sends caused.
    pub(super) fn call(
        &mut self,
        token: usize,
        now: Instant,
        f: impl FnOnce(&mut dyn Handler, &mut Conn<'_>),
    ) {
        self.call_with(token, now, "", f);
    }

    /// [`call`](Self::call), showing the handler the request `target` (for `on_open`); then
    /// fans out what the handler published.
    pub(super) fn call_with(
        &mut self,
        token: usize,
        now: Instant,
        target: &str,
        f: impl FnOnce(&mut dyn Handler, &mut Conn<'_>),
    ) {
        if !matches!(self.conns[token].session.phase, Phase::Open(_)) {
            return;
        }
        let (handler, mut conn) = self.handle(token, now, target);
        f(handler, &mut conn);
        self.after_call(token, now);
    }

    /// Runs `f` with a handle on the open connection `key` outside any turn (for a
    /// [`LocalServer`](crate::LocalServer)'s caller), then does what the loop does after a
    /// handler's call: the writability change its sends caused, the mark, the fan-out of
    /// what it published. `None` if the connection has gone or is not open.
    pub(super) fn with_conn<R>(
        &mut self,
        key: ConnKey,
        f: impl FnOnce(&mut Conn<'_>) -> R,
    ) -> Option<R> {
        let entry = self.conns.get(key.slot)?;
        if entry.serial != key.serial || !matches!(entry.session.phase, Phase::Open(_)) {
            return None;
        }
        let now = self.now();
        let (_, mut conn) = self.handle(key.slot, now, "");
        let result = f(&mut conn);
        self.after_call(key.slot, now);
        Some(result)
    }

    /// Stops or resumes reading the open connection `key` for its application (see
    /// [`LocalServer::hold_input`](crate::LocalServer::hold_input)); a resumed one is read at
    /// the next turn, since what waits in its socket raises no new readiness event. Whether
    /// it is open.
    pub(super) fn hold_input(&mut self, key: ConnKey, held: bool) -> bool {
        let Some(entry) = self.conns.get_mut(key.slot) else { return false };
        if entry.serial != key.serial || !entry.session.hold_input(held) {
            return false;
        }
        if !held {
            self.resume.push(key.slot);
        }
        true
    }

    /// The route's handler, and a handle on `token`'s connection showing `target` as the
    /// request target.
    fn handle<'s>(
        &'s mut self,
        token: usize,
        now: Instant,
        target: &'s str,
    ) -> (&'s mut dyn Handler, Conn<'s>) {
        let entry = &mut self.conns[token];
        let route = entry.route as usize;
        let conn = Conn {
            id: ConnId { event_loop: self.index, serial: entry.serial },
            peer: entry.peer,
            session: &mut entry.session,
            cx: loop_context!(self, now, for token),
            metrics: &self.shared.metrics,
            stats: &mut self.stats,
            token,
            target,
            topics: &mut self.topics,
            hub: &self.shared.hub,
            outbox: &mut self.outbox,
            data: self.data.get_mut(&token),
        };
        (self.router.handler(route), conn)
    }

    /// What a handler's calls leave for the loop: the writability change its sends caused,
    /// the connection's mark, and the fan-out of what it published.
    fn after_call(&mut self, token: usize, now: Instant) {
        if let Some(change) = self.conns.get_mut(token).and_then(|e| e.session.take_writability()) {
            self.writability_changed(token, now, change);
        }
        // NOTE: a handler cannot finish a close (its own close waits for the peer's); the
        // callers report a close that input or a timeout finished.
        if self.reading != Some(token) {
            self.mark(token); // (the connection being read is marked once its read is done)
        }
        if !self.outbox.is_empty() && (self.reading.is_none() || self.outbox.len() >= OUTBOX_RUN) {
            // The fan-out may queue to this connection too: its corked replies go first.
            self.write_cork(token, now);
            self.fan_out_outbox(now);
        }
    }

    pub(super) fn writability_changed(&mut self, token: usize, now: Instant, change: Writability) {
        match change {
            Writability::NotWritable => {
                self.input_paused(token);
                self.call(token, now, |handler, conn| handler.on_not_writable(conn));
            }
            Writability::Writable => {
                self.input_resumed(token);
                self.resume.push(token);
                self.call(token, now, |handler, conn| handler.on_writable(conn));
            }
        }
    }
}
