//! The loop's side of permessage-deflate at the upgrade: which mode a route runs, what the
//! offer gets, and the budget a dedicated context draws.

use freeboard_proto::handshake::Request;

use super::event_loop::EventLoop;
use crate::Compression;
use crate::handler::RouteOptions;
use crate::session::deflate::{Agreement, Deflate};
use crate::transport::Transport;

impl<T: Transport> EventLoop<T> {
    /// The route's answer to a `permessage-deflate` offer: the session's compression and
    /// the `Sec-WebSocket-Extensions` response, or `None` (no offer the mode accepts, or a
    /// dedicated context the budget cannot cover: the connection goes on uncompressed rather
    /// than being refused).
    pub(super) fn negotiate_compression(
        &mut self,
        options: &RouteOptions,
        request: &Request<'_, '_>,
    ) -> Option<(Box<Deflate>, String)> {
        let config = &self.shared.config;
        let mode = options.compression.unwrap_or(config.compression);
        let agreement = Agreement::accept(mode, config.compression_window, request.extensions())?;
        let Some(deflate) =
            Deflate::new(&mut self.pool, agreement, true, mode == Compression::Dedicated)
        else {
            tracing::debug!("permessage-deflate declined: the budget cannot cover its context");
            return None;
        };
        Some((deflate, agreement.response()))
    }
}
