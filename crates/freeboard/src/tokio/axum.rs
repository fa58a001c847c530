//! Upgrading an axum route to a bounded freeboard [`WebSocket`]: the extractor mirrors
//! `axum::extract::ws::WebSocketUpgrade`, so a migration is a few lines.
//!
//! ```no_run
//! use axum::{Extension, Router, response::Response, routing::get};
//! use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
//! use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage, WsConfig};
//! use freeboard::SlowConsumerPolicy;
//! use futures_util::StreamExt;
//!
//! async fn echo(ws: WebSocketUpgrade) -> Response {
//!     ws.config(WsConfig::default().slow_consumer(SlowConsumerPolicy::DropOldest))
//!         .on_upgrade(|mut socket: AxumWebSocket| async move {
//!             while let Some(message) = socket.next().await {
//!                 if let OwnedMessage::Close(_) = message {
//!                     break;
//!                 }
//!                 let _ = socket.send(message);
//!             }
//!         })
//! }
//!
//! # async fn run() -> std::io::Result<()> {
//! let endpoint = Endpoint::new(EndpointConfig::default().memory(256 << 20)).expect("a budget");
//! let app = Router::new().route("/ws", get(echo)).layer(Extension(endpoint));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! The [`Endpoint`] (one budget for every connection of the service) reaches the extractor as
//! an `Extension<Arc<Endpoint>>` layer, or per route with
//! [`endpoint`](WebSocketUpgrade::endpoint). An upgrade the budget cannot cover is answered
//! `503` with `Retry-After` before the handler runs.
//!
//! With the `http2` feature the extractor also takes a WebSocket over HTTP/2 (RFC 8441): an
//! extended `CONNECT` with `:protocol = websocket`, answered `200` (no `Sec-WebSocket-Accept`,
//! RFC 8441 §5), whose stream then carries the same bounded session. Route it with `any` (or
//! `on(MethodFilter::GET.or(MethodFilter::CONNECT), …)`): a `get` route answers a `CONNECT`
//! `405` before the extractor runs. `freeboard::tokio::http2` serves such a router over TLS with
//! `SETTINGS_ENABLE_CONNECT_PROTOCOL` on.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::FromRequestParts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;

use super::{Endpoint, WebSocket, WsConfig};

/// A freeboard WebSocket over axum's (hyper's) upgraded connection.
pub type AxumWebSocket = WebSocket<TokioIo<Upgraded>>;

/// The extractor of a WebSocket upgrade request; answer it with
/// [`on_upgrade`](Self::on_upgrade).
pub struct WebSocketUpgrade {
    on_upgrade: OnUpgrade,
    /// `Sec-WebSocket-Key` of an HTTP/1.1 upgrade; `None` for an HTTP/2 extended CONNECT,
    /// which has none (RFC 8441 §5).
    key: Option<HeaderValue>,
    /// The subprotocols the client offered, as sent.
    offered: Option<HeaderValue>,
    endpoint: Option<Arc<Endpoint>>,
    config: WsConfig,
    /// Where the server that carried the request counts the session while it runs.
    gauge: Option<SessionGauge>,
}

/// A gauge of running sessions a server puts in a request's extensions (the HTTPS server:
/// its WebSockets over HTTP/2); the upgrade counts its session in it until the session's
/// task ends.
#[derive(Clone, Debug)]
pub(crate) struct SessionGauge(pub(crate) Arc<AtomicU64>);

/// One session counted in a [`SessionGauge`] until dropped.
struct Running(Arc<AtomicU64>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a request could not be upgraded; its response is the status and a one-line reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpgradeRejection {
    /// Not a `GET` (405), nor (with the `http2` feature) an extended `CONNECT`.
    Method,
    /// No `Connection: upgrade` / `Upgrade: websocket` (426).
    NotUpgrade,
    /// `Sec-WebSocket-Version` is not 13 (426, with `Sec-WebSocket-Version: 13`).
    Version,
    /// No valid `Sec-WebSocket-Key` (400).
    Key,
    /// The connection cannot be upgraded (HTTP/2 or a server without upgrades; 426).
    NotUpgradable,
    /// A `CONNECT` without `:protocol` that reached the route: a tunnel request, which a
    /// WebSocket route does not serve (400).
    NoProtocol,
    /// An HTTP/2 extended `CONNECT` whose `:protocol` is not `websocket` (501).
    UnknownProtocol,
    /// An HTTP/2 extended `CONNECT` whose `Sec-WebSocket-Version` is not 13 (400, with
    /// `Sec-WebSocket-Version: 13`).
    Http2Version,
}

impl IntoResponse for UpgradeRejection {
    fn into_response(self) -> Response {
        let (status, why) = match self {
            Self::Method => (StatusCode::METHOD_NOT_ALLOWED, "a WebSocket upgrade is a GET"),
            Self::NotUpgrade => (StatusCode::UPGRADE_REQUIRED, "expected a WebSocket upgrade"),
            Self::Version => (StatusCode::UPGRADE_REQUIRED, "Sec-WebSocket-Version must be 13"),
            Self::Key => (StatusCode::BAD_REQUEST, "missing or invalid Sec-WebSocket-Key"),
            Self::NotUpgradable => (StatusCode::UPGRADE_REQUIRED, "connection is not upgradable"),
            Self::NoProtocol => {
                (StatusCode::BAD_REQUEST, "a WebSocket over HTTP/2 needs :protocol websocket")
            }
            Self::UnknownProtocol => (StatusCode::NOT_IMPLEMENTED, "only :protocol websocket"),
            // Not 426 as over HTTP/1.1: a 426 names `Upgrade`, a header HTTP/2 forbids
            // (RFC 9113 §8.2.2).
            Self::Http2Version => (StatusCode::BAD_REQUEST, "Sec-WebSocket-Version must be 13"),
        };
        let mut response = (status, why).into_response();
        if matches!(self, Self::Version | Self::Http2Version) {
            response.headers_mut().insert("sec-websocket-version", HeaderValue::from_static("13"));
        }
        response
    }
}

impl<S: Send + Sync> FromRequestParts<S> for WebSocketUpgrade {
    type Rejection = UpgradeRejection;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let headers = &parts.headers;
        let version_13 =
            headers.get(header::SEC_WEBSOCKET_VERSION).map(|v| v.as_bytes()) == Some(b"13");
        let key = if parts.method == Method::CONNECT {
            extended_connect(parts)?;
            // RFC 8441 §5: "The Sec-WebSocket-Version ... header fields ... are used as
            // defined in RFC 6455"; a client MUST send 13 (RFC 6455 §4.1 item 9).
            if !version_13 {
                return Err(UpgradeRejection::Http2Version);
            }
            None
        } else {
            // §4.2.1: "An HTTP/1.1 or higher GET request".
            if parts.method != Method::GET {
                return Err(UpgradeRejection::Method);
            }
            if !has_token(headers, header::CONNECTION, "upgrade")
                || !has_token(headers, header::UPGRADE, "websocket")
            {
                return Err(UpgradeRejection::NotUpgrade);
            }
            if !version_13 {
                return Err(UpgradeRejection::Version);
            }
            match headers.get(header::SEC_WEBSOCKET_KEY) {
                // §4.2.1 item 5: base64 of 16 bytes.
                Some(key) if key.len() == 24 => Some(key.clone()),
                _ => return Err(UpgradeRejection::Key),
            }
        };
        let offered = headers.get(header::SEC_WEBSOCKET_PROTOCOL).cloned();
        let on_upgrade =
            parts.extensions.remove::<OnUpgrade>().ok_or(UpgradeRejection::NotUpgradable)?;
        let endpoint = parts.extensions.get::<Arc<Endpoint>>().cloned();
        let gauge = parts.extensions.remove::<SessionGauge>();
        Ok(Self { on_upgrade, key, offered, endpoint, config: WsConfig::default(), gauge })
    }
}

impl WebSocketUpgrade {
    /// This route's send queue settings and subprotocols.
    pub fn config(mut self, config: WsConfig) -> Self {
        self.config = config;
        self
    }

    /// The subprotocols this route speaks, in order of preference (as axum's `protocols`).
    pub fn protocols<I: IntoIterator<Item = S>, S: Into<String>>(mut self, protocols: I) -> Self {
        self.config = self.config.protocols(protocols);
        self
    }

    /// The endpoint (budget) this route's connections draw from, instead of the
    /// `Extension<Arc<Endpoint>>` layer's.
    pub fn endpoint(mut self, endpoint: &Arc<Endpoint>) -> Self {
        self.endpoint = Some(Arc::clone(endpoint));
        self
    }

    /// The subprotocol the upgrade will agree on: the route's first that the client offered.
    pub fn selected_protocol(&self) -> Option<&str> {
        let offered = self.offered.as_ref()?.to_str().ok()?;
        self.config
            .protocols
            .iter()
            .find(|p| offered.split(',').any(|o| o.trim() == p.as_str()))
            .map(String::as_str)
    }

    /// Answers `101 Switching Protocols` and runs `callback` with the WebSocket once hyper
    /// hands the connection over. Answers `503` (with `Retry-After`) instead when the
    /// endpoint's pool cannot cover a connection's reserve, and `500` when no endpoint was
    /// given.
    pub fn on_upgrade<F, Fut>(self, callback: F) -> Response
    where
        F: FnOnce(AxumWebSocket) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Some(endpoint) = self.endpoint.clone() else {
            let why = "no freeboard Endpoint: add .layer(Extension(endpoint)) to the router";
            return (StatusCode::INTERNAL_SERVER_ERROR, why).into_response();
        };
        if !endpoint.has_room() {
            return budget_refusal(&endpoint);
        }
        let protocol = self.selected_protocol().map(str::to_owned);
        let mut response = match &self.key {
            Some(key) => {
                let accept = freeboard_proto::handshake::accept_key(key.as_bytes());
                let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
                let headers = response.headers_mut();
                headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
                headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
                // NOTE(unwrap): base64 is a valid header value.
                let accept = HeaderValue::from_bytes(&accept).unwrap();
                headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
                response
            }
            // RFC 8441 §5: a 2xx answers the extended CONNECT; "the Sec-WebSocket-Key and
            // Sec-WebSocket-Accept header fields are not used".
            None => StatusCode::OK.into_response(),
        };
        let headers = response.headers_mut();
        if let Some(protocol) = &protocol
            && let Ok(value) = HeaderValue::from_str(protocol)
        {
            headers.insert(header::SEC_WEBSOCKET_PROTOCOL, value);
        }
        let (on_upgrade, config, gauge) = (self.on_upgrade, self.config, self.gauge);
        tokio::spawn(async move {
            let upgraded = match on_upgrade.await {
                Ok(upgraded) => upgraded,
                Err(e) => {
                    tracing::debug!(error = %e, "upgrade failed");
                    return;
                }
            };
            let io = TokioIo::new(upgraded);
            // The connection's life is a task of its own holding only the callback's future:
            // this one (the endpoint, the route's config, the upgrade) ends here, and a task
            // is what an idle connection costs beside its state.
            let socket = WebSocket::from_upgraded(io, &endpoint, &config, protocol);
            match gauge {
                None => {
                    ::tokio::spawn(callback(socket));
                }
                Some(SessionGauge(gauge)) => {
                    gauge.fetch_add(1, Ordering::Relaxed);
                    let running = Running(gauge);
                    ::tokio::spawn(async move {
                        callback(socket).await;
                        drop(running);
                    });
                }
            }
        });
        response
    }
}

impl std::fmt::Debug for WebSocketUpgrade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSocketUpgrade")
            .field("offered", &self.offered)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The answer to a request the budget cannot admit (a connection's reserve is not free):
/// `503` with `Retry-After`, counted ([`Endpoint::budget_refusals`]).
pub(super) fn budget_refusal(endpoint: &Endpoint) -> Response {
    endpoint.budget_refusals.fetch_add(1, Ordering::Relaxed);
    let mut response =
        (StatusCode::SERVICE_UNAVAILABLE, "server memory budget exhausted").into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// Checks an HTTP/2 `CONNECT` for the extended CONNECT of a WebSocket (RFC 8441 §4).
fn extended_connect(parts: &Parts) -> Result<(), UpgradeRejection> {
    #[cfg(feature = "http2")]
    {
        match parts.extensions.get::<hyper::ext::Protocol>() {
            Some(protocol) if protocol.as_str().eq_ignore_ascii_case("websocket") => Ok(()),
            // RFC 9220 §3 (extended CONNECT as RFC 8441 defines it): an unsupported
            // `:protocol` "SHOULD" be answered 501.
            Some(_) => Err(UpgradeRejection::UnknownProtocol),
            None => Err(UpgradeRejection::NoProtocol),
        }
    }
    #[cfg(not(feature = "http2"))]
    {
        // Without HTTP/2 no extended CONNECT can arrive: a CONNECT is not an upgrade.
        let _ = parts;
        Err(UpgradeRejection::Method)
    }
}

/// Whether a comma-separated header has `token` (case-insensitive).
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}
