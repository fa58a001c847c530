//! The loop's side of permessage-deflate at the upgrade: which mode a route runs, what the
//! offer gets, and the budget a dedicated context draws.

use freeboard_proto::handshake::Request;

use super::event_loop::EventLoop;
use crate::handler::RouteOptions;
use crate::session::deflate::{Agreement, Deflate};
use crate::transport::Transport;
use freeboard_buf::SlowConsumerPolicy;

impl<T: Transport> EventLoop<T> {
    /// The route's answer to the request's `permessage-deflate` offers: the parameters
    /// agreed, or `None` (compression off, or no offer the mode accepts). Nothing is drawn
    /// yet: the upgrade decision may still refuse the connection, or come later.
    pub(super) fn compression_agreement(
        &self,
        options: &RouteOptions,
        request: &Request<'_, '_>,
    ) -> Option<Agreement> {
        let config = &self.config;
        let mode = options.compression.unwrap_or(config.compression);
        let mut agreement =
            Agreement::accept(mode, config.compression_window, request.extensions())?;
        // A message compressed with context takeover must reach the peer, or the peer's
        // window no longer matches ours. Only the `close` policy guarantees it (a message
        // the queue cannot take closes the connection); under the others a dropped or
        // refused message would corrupt every later one, so the server keeps no context
        // (§7.1.1.1 lets a server add server_no_context_takeover on its own).
        if options.slow_consumer.unwrap_or(config.limits.slow_consumer) != SlowConsumerPolicy::Close
        {
            agreement.server_no_context_takeover = true;
        }
        Some(agreement)
    }

    /// The session's compression for an accepted upgrade that agreed on `agreement`: a
    /// direction with context takeover (dedicated mode) draws its budget here; `None` when
    /// the budget cannot cover it (the connection goes on uncompressed rather than being
    /// refused, and the `101` names no extension).
    pub(super) fn compression_state(&mut self, agreement: Agreement) -> Option<Box<Deflate>> {
        let deflate = Deflate::new(&mut self.pool, agreement, true);
        if deflate.is_none() {
            tracing::debug!("permessage-deflate declined: the budget cannot cover its context");
        }
        deflate
    }
}
