//! Who gets in, and for how long: upgrade decisions completed later (on any thread), their
//! timeout, and the expiry of open connections' authorizations.

use freeboard_proto::Instant;

use super::event_loop::EventLoop;
use super::http::RETRY_SOON;
use crate::auth::TOKEN_EXPIRED;
use crate::session::Phase;
use crate::transport::Transport;

impl<T: Transport> EventLoop<T> {
    /// Acts on the upgrade decisions completed since the last turn.
    pub(super) fn run_decisions(&mut self, now: Instant) {
        self.decisions.drain_into(&mut self.completed);
        if self.completed.is_empty() {
            return;
        }
        for completion in std::mem::take(&mut self.completed) {
            self.finish_decision(completion, now);
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
}
