//! The live dashboard a [`Router`](crate::Router) opts into with
//! [`dashboard`](crate::Router::dashboard): one page embedded in the binary (HTML, CSS and
//! hand-drawn canvas charts; nothing fetched from elsewhere), and the WebSocket it reads the
//! server's figures from, once a second.

use freeboard_proto::MessageKind;

use crate::handler::{Conn, Handler, Message};

/// The page served at the dashboard's path.
pub(crate) const PAGE: &str = include_str!("dashboard.html");

/// The dashboard's WebSocket (`{path}/stream`): answers every message with a JSON snapshot of
/// the server's metrics ([`Metrics::snapshot_json`](crate::Metrics::snapshot_json)), and sends
/// one at once when it opens. The page asks once a second; it computes the rates itself.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DashboardStream;

impl Handler for DashboardStream {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let snapshot = conn.metrics.snapshot_json();
        let _ = conn.send(MessageKind::Text, snapshot.as_bytes());
    }

    fn on_message(&mut self, conn: &mut Conn<'_>, _: Message<'_>) {
        let snapshot = conn.metrics.snapshot_json();
        let _ = conn.send(MessageKind::Text, snapshot.as_bytes());
    }
}
