//! The live dashboard a [`Router`](crate::Router) opts into with
//! [`dashboard`](crate::Router::dashboard): one page embedded in the binary (HTML, CSS and
//! hand-drawn canvas charts; nothing fetched from elsewhere), and the WebSocket it reads the
//! server's figures from, once a second.

use std::time::{Duration, Instant};

use freeboard_proto::handshake::Request;
use freeboard_proto::{CloseCode, MessageKind};

use crate::SlowConsumerPolicy;
use crate::handler::{Accepted, Conn, Decision, Handler, HttpRoute, Message, RouteOptions, Router};

/// The page served at the dashboard's path.
pub(crate) const PAGE: &str = include_str!("dashboard.html");

/// Messages a dashboard stream may send in one [`WINDOW`] (the page sends one a second); the
/// next is answered with close 1008. A client asking in a loop then costs the server a few
/// reads, not a core.
pub(crate) const MAX_ASKS: u32 = 10;

/// The window [`MAX_ASKS`] counts in.
pub(crate) const WINDOW: Duration = Duration::from_secs(1);

/// The close reason a stream that asks too often gets (with 1008).
pub(crate) const TOO_MANY_ASKS: &str = "dashboard stream: more than 10 messages a second";

/// The dashboard's WebSocket (`{path}/stream`): answers each message with a JSON snapshot of
/// the server's metrics ([`Metrics::shared_snapshot`](crate::Metrics::shared_snapshot), built
/// at most once per [`ADMIN_REFRESH`](crate::metrics::ADMIN_REFRESH) for every dashboard), and
/// when it opens sends the last minutes of samples and the server's version, start and
/// configuration summary
/// ([`Metrics::dashboard_history_json`](crate::Metrics::dashboard_history_json)), then a
/// snapshot. The page asks once a second; it computes the rates itself.
/// More than [`MAX_ASKS`] messages in a [`WINDOW`] close the stream with 1008.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DashboardStream;

/// One stream's count of messages in the current window.
#[derive(Debug)]
struct Pace {
    window_start: Instant,
    asks: u32,
}

impl Handler for DashboardStream {
    fn decide_upgrade(&mut self, _: &Request<'_, '_>, decision: Decision) {
        let pace = Pace { window_start: Instant::now(), asks: 0 };
        decision.accept(Accepted::new().data(pace));
    }

    fn on_open(&mut self, conn: &mut Conn<'_>) {
        // The last minutes first, so that the page's first look has lines, then the now.
        let history = conn.metrics.dashboard_history_json();
        let _ = conn.send(MessageKind::Text, history.as_bytes());
        let snapshot = conn.metrics.shared_snapshot();
        let _ = conn.send(MessageKind::Text, snapshot.as_bytes());
    }

    fn on_message(&mut self, conn: &mut Conn<'_>, _: Message<'_>) {
        let Some(pace) = conn.data_mut::<Pace>() else { return };
        let now = Instant::now();
        if now.duration_since(pace.window_start) >= WINDOW {
            *pace = Pace { window_start: now, asks: 0 };
        }
        pace.asks += 1;
        if pace.asks > MAX_ASKS {
            conn.close(CloseCode::POLICY_VIOLATION, TOO_MANY_ASKS);
            return;
        }
        let snapshot = conn.metrics.shared_snapshot();
        let _ = conn.send(MessageKind::Text, snapshot.as_bytes());
    }
}

impl Router {
    /// Serves the live dashboard: the page at `GET {path}` ([`HttpRoute::Dashboard`]), the
    /// WebSocket it reads the server's figures from at `{path}/stream` (a snapshot of the
    /// metrics for every message, at most ten a second, conflated so a slow page never holds
    /// a backlog), and the JSON it reads topics and subscribers from: `{path}/topics`
    /// ([`HttpRoute::Topics`]), `{path}/slowest` ([`HttpRoute::Slowest`]) and
    /// `{path}/connection?id=` ([`HttpRoute::Connection`]). All are admin routes.
    pub fn dashboard(self, path: &str) -> Self {
        let base = path.trim_end_matches('/');
        let stream = format!("{base}/stream");
        let options = RouteOptions::new().slow_consumer(SlowConsumerPolicy::Conflate).admin();
        self.http(path, HttpRoute::Dashboard)
            .http(&format!("{base}/topics"), HttpRoute::Topics)
            .http(&format!("{base}/slowest"), HttpRoute::Slowest)
            .http(&format!("{base}/connection"), HttpRoute::Connection)
            .route_with(&stream, DashboardStream, options)
    }
}
