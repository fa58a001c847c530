//! The loop's side of permessage-deflate at the upgrade: which mode a route runs, what the
//! offer gets, and the budget a dedicated context draws.

use freeboard_proto::handshake::Request;

use super::event_loop::EventLoop;
use crate::handler::RouteOptions;
use crate::session::deflate::{Agreement, Deflate};
use crate::transport::Transport;
use crate::{Compression, ServerConfig};

impl<T: Transport> EventLoop<T> {
    /// The route's answer to the request's `permessage-deflate` offers: the parameters
    /// agreed, or `None` (compression off, or no offer the mode accepts). Nothing is drawn
    /// yet: the upgrade decision may still refuse the connection, or come later.
    pub(super) fn compression_agreement(
        &self,
        options: &RouteOptions,
        request: &Request<'_, '_>,
    ) -> Option<Agreement> {
        let config = &self.shared.config;
        Agreement::accept(mode(config, options), config.compression_window, request.extensions())
    }

    /// The session's compression for an accepted upgrade that agreed on `agreement`: a
    /// dedicated context draws its budget here; `None` when the budget cannot cover it (the
    /// connection goes on uncompressed rather than being refused, and the `101` names no
    /// extension).
    pub(super) fn compression_state(
        &mut self,
        options: &RouteOptions,
        agreement: Agreement,
    ) -> Option<Box<Deflate>> {
        let dedicated = mode(&self.shared.config, options) == Compression::Dedicated;
        let deflate = Deflate::new(&mut self.pool, agreement, true, dedicated);
        if deflate.is_none() {
            tracing::debug!("permessage-deflate declined: the budget cannot cover its context");
        }
        deflate
    }
}

/// The route's mode, else the server's.
fn mode(config: &ServerConfig, options: &RouteOptions) -> Compression {
    options.compression.unwrap_or(config.compression)
}
