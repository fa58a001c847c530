//! WebSockets over HTTP/2 (RFC 8441, extended CONNECT) for the tokio driver: an HTTPS server
//! that offers `h2` and `http/1.1` by ALPN and serves an axum router on both, and a client
//! that opens several WebSockets as streams of one HTTP/2 connection.
//!
//! A WebSocket over HTTP/2 is a stream opened by an extended `CONNECT` with
//! `:protocol = websocket`, answered `200`; the stream's DATA frames then carry the RFC 6455
//! frames (still masked by the client). hyper hands the stream over as an upgraded
//! connection, so each one runs the same bounded session as a WebSocket over its own TCP
//! connection: the endpoint's budget, watermarks, cap and slow-consumer policy. Routes use
//! [`WebSocketUpgrade`](super::axum::WebSocketUpgrade), which takes both forms; route them
//! with `any`, since a `get` route refuses a `CONNECT`.
//!
//! The HTTP/2 state of a connection is bounded by [`Http2Config`]'s limits, set explicitly
//! rather than left to library defaults: streams open at once, the size of a header list,
//! the flow-control windows (what a peer may send before the server reads) and the bytes
//! queued per stream for sending. hyper's HTTP/2 is the `h2` crate, which also bounds what
//! the known attacks would grow: streams reset before they are accepted (rapid reset,
//! CVE-2023-44487), CONTINUATION frames beyond the header list size (the CONTINUATION flood),
//! HPACK tables beyond the advertised size, resets the peer provokes, PING and SETTINGS
//! floods (one answer pending at a time, no frame read until it is written); `tests/http2.rs`
//! drives each with the outcome and its count.
//! This state lives in the h2 crate, on the heap; [`Http2Server::charge_to`] charges each
//! connection its bound ([`Http2Config::connection_charge`]) to the endpoint's budget and
//! refuses a connection the budget cannot cover. [`Http2Server::collector`] exports the counts
//! as Prometheus metrics.
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use axum::{Extension, Router, response::Response, routing::any};
//! use freeboard::tls::TlsIdentity;
//! use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
//! use freeboard::tokio::http2::{Http2Config, Http2Server};
//! use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage};
//! use futures_util::StreamExt;
//!
//! async fn echo(ws: WebSocketUpgrade) -> Response {
//!     ws.on_upgrade(|mut socket: AxumWebSocket| async move {
//!         while let Some(message) = socket.next().await {
//!             if let OwnedMessage::Close(_) = message {
//!                 break;
//!             }
//!             let _ = socket.send(message);
//!         }
//!     })
//! }
//!
//! let endpoint = Endpoint::new(EndpointConfig::default()).expect("a valid budget");
//! let app = Router::new().route("/echo", any(echo)).layer(Extension(endpoint));
//! let identity = TlsIdentity::load("cert.pem".as_ref(), "key.pem".as_ref()).expect("PEM files");
//! let server = Http2Server::new(Arc::new(identity), Http2Config::default()).expect("TLS");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8443").await?;
//! server.serve(listener, app).await
//! # }
//! ```

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper::server::conn::{http1, http2};
use hyper::upgrade::Upgraded;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use super::axum::SessionGauge;
use super::{Endpoint, WebSocket, WsConfig};
use crate::tls::{TlsError, TlsIdentity};

/// How long a client waits for the server's SETTINGS.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A WebSocket over a stream of an HTTP/2 connection (client side).
pub type Http2WebSocket = WebSocket<TokioIo<Upgraded>>;

/// The HTTPS server's limits: HTTP/2 settings that bound a connection's state, and the TLS
/// handshake's time.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Http2Config {
    /// Offer `h2` by ALPN (else `http/1.1` only). Default `true`.
    pub http2: bool,
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`: streams a peer may have open at once; one more is
    /// refused (`RST_STREAM` `REFUSED_STREAM`). Each WebSocket is one. Default 100 (the
    /// RFC 9113 §6.5.2 recommended minimum).
    pub max_concurrent_streams: u32,
    /// `SETTINGS_MAX_HEADER_LIST_SIZE`: the largest request head (decoded) accepted; the
    /// bound on HEADERS + CONTINUATION a request may send. Default 16 KiB.
    pub max_header_list_size: u32,
    /// The initial flow-control window of a stream: what a peer may send on one WebSocket
    /// before the server reads it. Default 64 KiB.
    pub initial_stream_window: u32,
    /// The connection's flow-control window: what a peer may send on all streams together
    /// before the server reads — the bound on the connection's received-but-unread bytes.
    /// Default 256 KiB.
    pub initial_connection_window: u32,
    /// The bytes h2 holds for sending per stream beyond what the peer's window admits; the
    /// session's send queue waits for the rest. Default 16 KiB.
    pub max_send_buffer: usize,
    /// Streams the peer reset before the server accepted them, kept at once; more ends the
    /// connection with `GOAWAY` `ENHANCE_YOUR_CALM` (rapid reset, CVE-2023-44487). Default
    /// 20 (h2's).
    pub max_pending_reset_streams: usize,
    /// Streams the server reset because of the peer's errors before the connection ends with
    /// `GOAWAY` `ENHANCE_YOUR_CALM`. Default 1024 (h2's).
    pub max_local_error_resets: usize,
    /// A PING after this long without frames; the connection ends when its answer does not
    /// come within the same time. Default 30 s.
    pub keep_alive: Duration,
    /// The time a TLS handshake (and an HTTP/1.1 request head) may take. Default 10 s.
    pub handshake_timeout: Duration,
    /// TCP connections served at once; one more is closed as it is accepted (counted).
    /// Default 10,000.
    pub max_connections: usize,
}

impl Default for Http2Config {
    fn default() -> Self {
        Self {
            http2: true,
            max_concurrent_streams: 100,
            max_header_list_size: 16 << 10,
            initial_stream_window: 64 << 10,
            initial_connection_window: 256 << 10,
            max_send_buffer: 16 << 10,
            max_pending_reset_streams: 20,
            max_local_error_resets: 1024,
            keep_alive: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            max_connections: 10_000,
        }
    }
}

impl Http2Config {
    /// Offer `h2` by ALPN (`true`) or `http/1.1` only.
    pub fn http2(mut self, on: bool) -> Self {
        self.http2 = on;
        self
    }

    /// See [`max_concurrent_streams`](Self::max_concurrent_streams).
    pub fn max_concurrent_streams(mut self, streams: u32) -> Self {
        self.max_concurrent_streams = streams;
        self
    }

    /// See [`max_header_list_size`](Self::max_header_list_size).
    pub fn max_header_list_size(mut self, bytes: u32) -> Self {
        self.max_header_list_size = bytes;
        self
    }

    /// The stream and connection flow-control windows.
    pub fn windows(mut self, stream: u32, connection: u32) -> Self {
        self.initial_stream_window = stream;
        self.initial_connection_window = connection;
        self
    }

    /// See [`max_send_buffer`](Self::max_send_buffer).
    pub fn max_send_buffer(mut self, bytes: usize) -> Self {
        self.max_send_buffer = bytes;
        self
    }

    /// See [`max_connections`](Self::max_connections).
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.max_connections = connections;
        self
    }

    /// The most an HTTP/2 connection's buffers inside h2 and hyper can hold under these
    /// limits, in bytes — what [`Http2Server::charge_to`] withholds from the budget for it:
    ///
    /// `initial_connection_window` (received, not yet read by any stream)
    /// `+ max_concurrent_streams × (max_send_buffer + max_header_list_size + 2 KiB)` (each
    /// stream's queued output, its decoded request head, h2's and hyper's state for it)
    /// `+ max_header_list_size` (a header block being received)
    /// `+ 40 KiB` (the HPACK tables, 4 KiB each way, and the frame read and write buffers,
    /// 16 KiB each).
    pub fn connection_charge(&self) -> usize {
        let streams = self.max_concurrent_streams as usize;
        let header_list = self.max_header_list_size as usize;
        self.initial_connection_window as usize
            + streams * (self.max_send_buffer + header_list + STREAM_STATE)
            + header_list
            + CONNECTION_STATE
    }
}

/// h2's state for a stream and hyper's for its upgraded connection, rounded up from what
/// `tests/http2_memory.rs` measures beside a freeboard session (1.3-2 KiB).
const STREAM_STATE: usize = 2 << 10;

/// An HTTP/2 connection's fixed buffers in h2: the HPACK decoder's table (the 4 KiB the
/// server advertises) and encoder's (h2 caps it at 4 KiB whatever the peer allows), and the
/// frame read and write buffers (16 KiB each: the largest frame, h2's write buffer).
const CONNECTION_STATE: usize = 40 << 10;

/// What the HTTPS server saw, counted since it started.
#[derive(Debug, Default)]
pub struct Http2Stats {
    tcp_connections: AtomicU64,
    /// Connections open now (a gauge, unlike the others).
    open_connections: AtomicU64,
    refused_connections: AtomicU64,
    /// HTTP/2 connections ended at once: the budget could not cover their charge.
    unaffordable_connections: AtomicU64,
    tls_failures: AtomicU64,
    http2_connections: AtomicU64,
    http1_connections: AtomicU64,
    http2_websockets: AtomicU64,
    http1_websockets: AtomicU64,
    refused_connects: AtomicU64,
    most_websockets_on_a_connection: AtomicU64,
    refused_streams: AtomicU64,
    reset_streams: AtomicU64,
    goaways: AtomicU64,
    goaway_errors: AtomicU64,
    /// WebSocket streams of HTTP/2 connections whose session runs now (a gauge).
    open_http2_websockets: Arc<AtomicU64>,
    /// `RST_STREAM`s sent, by error code ([`ERROR_CODES`], the last slot any other).
    resets_by_code: [AtomicU64; ERROR_CODES.len() + 1],
    /// `GOAWAY`s sent, by error code (as `resets_by_code`).
    goaways_by_code: [AtomicU64; ERROR_CODES.len() + 1],
    /// `PING` frames answered (`PING` with `ACK`).
    ping_acks: AtomicU64,
    /// `SETTINGS` frames acknowledged.
    settings_acks: AtomicU64,
}

/// The HTTP/2 error codes (RFC 9113 §7), indexed by their value.
pub const ERROR_CODES: [&str; 14] = freeboard_h2::ERROR_CODE_NAMES;

/// The slot of `code` in a table sized `ERROR_CODES.len() + 1`: unknown codes share the last.
fn code_slot(code: u32) -> usize {
    (code as usize).min(ERROR_CODES.len())
}

impl Http2Stats {
    /// TCP connections accepted.
    pub fn tcp_connections(&self) -> u64 {
        self.tcp_connections.load(Ordering::Relaxed)
    }

    /// TCP connections being served now.
    pub fn open_connections(&self) -> u64 {
        self.open_connections.load(Ordering::Relaxed)
    }

    /// TCP connections closed as they were accepted: `max_connections` were open.
    pub fn refused_connections(&self) -> u64 {
        self.refused_connections.load(Ordering::Relaxed)
    }

    /// HTTP/2 connections ended as they began (`GOAWAY` `REFUSED_STREAM`): the endpoint's
    /// budget could not cover [`Http2Config::connection_charge`].
    pub fn unaffordable_connections(&self) -> u64 {
        self.unaffordable_connections.load(Ordering::Relaxed)
    }

    /// TLS handshakes that failed or timed out.
    pub fn tls_failures(&self) -> u64 {
        self.tls_failures.load(Ordering::Relaxed)
    }

    /// Connections that agreed on `h2`.
    pub fn http2_connections(&self) -> u64 {
        self.http2_connections.load(Ordering::Relaxed)
    }

    /// Connections that spoke HTTP/1.1.
    pub fn http1_connections(&self) -> u64 {
        self.http1_connections.load(Ordering::Relaxed)
    }

    /// WebSockets opened as HTTP/2 streams (extended CONNECT answered 200).
    pub fn http2_websockets(&self) -> u64 {
        self.http2_websockets.load(Ordering::Relaxed)
    }

    /// WebSockets opened by an HTTP/1.1 upgrade (answered 101).
    pub fn http1_websockets(&self) -> u64 {
        self.http1_websockets.load(Ordering::Relaxed)
    }

    /// The most WebSocket streams one HTTP/2 connection has opened: how many a client
    /// carried on one TCP (and TLS) connection.
    pub fn most_websockets_on_a_connection(&self) -> u64 {
        self.most_websockets_on_a_connection.load(Ordering::Relaxed)
    }

    /// `CONNECT` requests refused (any status but 200).
    pub fn refused_connects(&self) -> u64 {
        self.refused_connects.load(Ordering::Relaxed)
    }

    /// Streams the server refused (`RST_STREAM` `REFUSED_STREAM`): opened past
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`.
    pub fn refused_streams(&self) -> u64 {
        self.refused_streams.load(Ordering::Relaxed)
    }

    /// Streams the server reset with any other code (a malformed request, a peer's error).
    pub fn reset_streams(&self) -> u64 {
        self.reset_streams.load(Ordering::Relaxed)
    }

    /// `GOAWAY` frames the server sent.
    pub fn goaways(&self) -> u64 {
        self.goaways.load(Ordering::Relaxed)
    }

    /// `GOAWAY` frames the server sent with an error code (anything but `NO_ERROR`: the
    /// connection ended for the peer's misbehaviour, `ENHANCE_YOUR_CALM` for a flood).
    pub fn goaway_errors(&self) -> u64 {
        self.goaway_errors.load(Ordering::Relaxed)
    }

    /// WebSocket streams of HTTP/2 connections open now.
    pub fn open_http2_websockets(&self) -> u64 {
        self.open_http2_websockets.load(Ordering::Relaxed)
    }

    /// `RST_STREAM` frames the server sent with error `code` (RFC 9113 §7).
    pub fn resets_with(&self, code: u32) -> u64 {
        self.resets_by_code[code_slot(code)].load(Ordering::Relaxed)
    }

    /// `GOAWAY` frames the server sent with error `code` (RFC 9113 §7).
    pub fn goaways_with(&self, code: u32) -> u64 {
        self.goaways_by_code[code_slot(code)].load(Ordering::Relaxed)
    }

    /// `PING` frames the server answered (RFC 9113 §6.7: a `PING` with `ACK` set).
    pub fn ping_acks(&self) -> u64 {
        self.ping_acks.load(Ordering::Relaxed)
    }

    /// `SETTINGS` frames the server acknowledged (RFC 9113 §6.5.3).
    pub fn settings_acks(&self) -> u64 {
        self.settings_acks.load(Ordering::Relaxed)
    }

    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The HTTPS server's counts as Prometheus metrics (`freeboard_https_*` for both versions,
/// `freeboard_http2_*` for HTTP/2's own), read at each scrape. Register it in the service's
/// `prometheus_client` registry, which the service's `/metrics` route encodes:
///
/// ```no_run
/// # fn run(server: &freeboard::tokio::http2::Http2Server) {
/// let mut registry = prometheus_client::registry::Registry::default();
/// registry.register_collector(Box::new(server.collector()));
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Http2Collector(Arc<Http2Stats>);

/// The label of a series counted per HTTP version.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabel {
    protocol: &'static str,
}

/// The label of a series counted per HTTP/2 error code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: &'static str,
}

/// The label of a refusal's reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

impl Collector for Http2Collector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = &*self.0;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        for (name, help, value) in [
            ("freeboard_https_accepted", "TCP connections accepted", load(&s.tcp_connections)),
            (
                "freeboard_https_tls_failures",
                "TLS handshakes failed or timed out",
                load(&s.tls_failures),
            ),
            (
                "freeboard_http2_refused_connects",
                "Extended CONNECTs answered with another status than 200",
                load(&s.refused_connects),
            ),
            ("freeboard_http2_ping_acks", "PING frames answered", load(&s.ping_acks)),
            (
                "freeboard_http2_settings_acks",
                "SETTINGS frames acknowledged",
                load(&s.settings_acks),
            ),
        ] {
            let e = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(value).encode(e)?;
        }
        for (name, help, value) in [
            (
                "freeboard_https_open_connections",
                "TCP connections served now",
                load(&s.open_connections),
            ),
            (
                "freeboard_http2_open_websockets",
                "WebSocket streams of HTTP/2 connections open now",
                load(&s.open_http2_websockets),
            ),
            (
                "freeboard_http2_most_websockets_per_connection",
                "The most WebSocket streams one HTTP/2 connection has opened",
                load(&s.most_websockets_on_a_connection),
            ),
        ] {
            let e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value as i64).encode(e)?;
        }
        let mut e = encoder.encode_descriptor(
            "freeboard_https_refused_connections",
            "TCP connections closed as they were accepted, by reason",
            None,
            MetricType::Counter,
        )?;
        let refused = [
            ("connection_limit", load(&s.refused_connections)),
            ("memory", load(&s.unaffordable_connections)),
        ];
        for (reason, value) in refused {
            ConstCounter::new(value).encode(e.encode_family(&ReasonLabel { reason })?)?;
        }
        for (name, help, h2, h1) in [
            (
                "freeboard_https_connections",
                "Connections that agreed on a protocol, by protocol",
                &s.http2_connections,
                &s.http1_connections,
            ),
            (
                "freeboard_https_websockets",
                "WebSockets opened, by the protocol that carries them",
                &s.http2_websockets,
                &s.http1_websockets,
            ),
        ] {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (protocol, value) in [("h2", load(h2)), ("http/1.1", load(h1))] {
                ConstCounter::new(value).encode(e.encode_family(&ProtocolLabel { protocol })?)?;
            }
        }
        for (name, help, table) in [
            (
                "freeboard_http2_stream_resets",
                "RST_STREAM frames sent, by error code (REFUSED_STREAM: past the stream limit)",
                &s.resets_by_code,
            ),
            ("freeboard_http2_goaways", "GOAWAY frames sent, by error code", &s.goaways_by_code),
        ] {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            let names = ERROR_CODES.iter().copied().chain(["OTHER"]);
            for (code, value) in names.zip(table) {
                ConstCounter::new(load(value)).encode(e.encode_family(&CodeLabel { code })?)?;
            }
        }
        Ok(())
    }
}

/// An HTTPS server for an axum router: TLS on rustls, ALPN `h2` and `http/1.1`, HTTP/2 with
/// `SETTINGS_ENABLE_CONNECT_PROTOCOL` (RFC 8441 §3) and [`Http2Config`]'s limits, HTTP/1.1
/// with upgrades. Cheap to clone: every connection's task holds a clone.
#[derive(Clone)]
pub struct Http2Server {
    acceptor: TlsAcceptor,
    h2: http2::Builder<TokioExecutor>,
    h1: http1::Builder,
    handshake_timeout: Duration,
    max_connections: u64,
    stats: Arc<Http2Stats>,
    /// The endpoint each HTTP/2 connection's buffers are charged to, and the charge.
    charge: Option<(Arc<Endpoint>, usize)>,
    /// [`Http2Config::connection_charge`].
    connection_charge: usize,
}

impl Http2Server {
    /// A server presenting `identity`, with `config`'s limits.
    pub fn new(identity: Arc<TlsIdentity>, config: Http2Config) -> Result<Self, TlsError> {
        let mut tls = rustls::ServerConfig::clone(&*crate::tls::server_config(identity, false)?);
        tls.alpn_protocols = if config.http2 {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        } else {
            vec![b"http/1.1".to_vec()]
        };
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .enable_connect_protocol()
            .max_concurrent_streams(config.max_concurrent_streams)
            .max_header_list_size(config.max_header_list_size)
            .initial_stream_window_size(config.initial_stream_window)
            .initial_connection_window_size(config.initial_connection_window)
            .max_send_buf_size(config.max_send_buffer)
            .max_pending_accept_reset_streams(config.max_pending_reset_streams)
            .max_local_error_reset_streams(config.max_local_error_resets)
            .keep_alive_interval(config.keep_alive)
            .keep_alive_timeout(config.keep_alive);
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new()).header_read_timeout(config.handshake_timeout);
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(tls)),
            h2,
            h1,
            handshake_timeout: config.handshake_timeout,
            max_connections: config.max_connections as u64,
            stats: Arc::default(),
            charge: None,
            connection_charge: config.connection_charge(),
        })
    }

    /// Charges each HTTP/2 connection's buffers ([`Http2Config::connection_charge`]) to
    /// `endpoint`'s budget from the moment it agrees on `h2` until it ends: a connection the
    /// budget cannot cover is ended at once with `GOAWAY` `REFUSED_STREAM` (last stream 0, so
    /// a client may retry) and counted ([`Http2Stats::unaffordable_connections`]).
    pub fn charge_to(mut self, endpoint: &Arc<Endpoint>) -> Self {
        self.charge = Some((Arc::clone(endpoint), self.connection_charge));
        self
    }

    /// What the server saw so far.
    pub fn stats(&self) -> &Arc<Http2Stats> {
        &self.stats
    }

    /// The server's counts as Prometheus metrics, for the service's registry.
    pub fn collector(&self) -> Http2Collector {
        Http2Collector(Arc::clone(&self.stats))
    }

    /// Accepts connections from `listener` and serves `router` on each, in a task of its
    /// own, until accepting fails.
    pub async fn serve(self, listener: TcpListener, router: Router) -> std::io::Result<()> {
        loop {
            let (tcp, _) = listener.accept().await?;
            ::tokio::spawn(self.clone().serve_connection(tcp, router.clone()));
        }
    }

    /// Serves `router` on one accepted TCP connection until it ends; closes it at once when
    /// `max_connections` are open.
    pub async fn serve_connection(self, tcp: TcpStream, router: Router) {
        Http2Stats::add(&self.stats.tcp_connections);
        let open = &self.stats.open_connections;
        if open.fetch_add(1, Ordering::Relaxed) >= self.max_connections {
            open.fetch_sub(1, Ordering::Relaxed);
            Http2Stats::add(&self.stats.refused_connections);
            return;
        }
        /// Counts the connection closed however its task ends.
        struct Open<'a>(&'a AtomicU64);
        impl Drop for Open<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let _open = Open(open);
        let _ = tcp.set_nodelay(true);
        let tls =
            match ::tokio::time::timeout(self.handshake_timeout, self.acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                _ => {
                    Http2Stats::add(&self.stats.tls_failures);
                    return;
                }
            };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let _charge = match &self.charge {
            Some((endpoint, bytes)) if h2 => match endpoint.charge(*bytes) {
                Some(charge) => Some(charge),
                None => {
                    Http2Stats::add(&self.stats.unaffordable_connections);
                    refuse(SentFrames::new(tls, Arc::clone(&self.stats))).await;
                    return;
                }
            },
            _ => None,
        };
        let io = TokioIo::new(tls);
        let inner = TowerToHyperService::new(router);
        let stats = Arc::clone(&self.stats);
        // WebSocket streams opened on this connection.
        let streams = Arc::new(AtomicU64::new(0));
        let gauge = SessionGauge(Arc::clone(&self.stats.open_http2_websockets));
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            let connect = request.method() == Method::CONNECT;
            let upgrade = request.headers().contains_key(header::UPGRADE);
            if connect {
                request.extensions_mut().insert(gauge.clone());
            }
            let response = hyper::service::Service::call(&inner, request);
            let (stats, streams) = (Arc::clone(&stats), Arc::clone(&streams));
            async move {
                let response: Response<Body> = response.await?;
                match response.status() {
                    StatusCode::OK if connect => {
                        Http2Stats::add(&stats.http2_websockets);
                        let on_this = streams.fetch_add(1, Ordering::Relaxed) + 1;
                        stats.most_websockets_on_a_connection.fetch_max(on_this, Ordering::Relaxed);
                    }
                    StatusCode::SWITCHING_PROTOCOLS if upgrade => {
                        Http2Stats::add(&stats.http1_websockets)
                    }
                    _ if connect => Http2Stats::add(&stats.refused_connects),
                    _ => {}
                }
                Ok::<_, Infallible>(response)
            }
        });
        let served = if h2 {
            Http2Stats::add(&self.stats.http2_connections);
            let io = TokioIo::new(SentFrames::new(io.into_inner(), Arc::clone(&self.stats)));
            self.h2.serve_connection(io, service).await
        } else {
            Http2Stats::add(&self.stats.http1_connections);
            self.h1.serve_connection(io, service).with_upgrades().await
        };
        if let Err(e) = served {
            tracing::debug!(error = %e, "HTTPS connection ended");
        }
    }
}

/// Ends an HTTP/2 connection the budget cannot cover: the server's preface (an empty
/// SETTINGS, RFC 9113 §3.4) and `GOAWAY` with last stream 0 and `REFUSED_STREAM` ("refused
/// the stream prior to performing any application processing", §7: the client may retry),
/// then TLS `close_notify`. What the client sent meanwhile is read and dropped for up to a
/// second, so that closing with unread bytes does not reset the connection before the client
/// reads the GOAWAY.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(mut io: S) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut frames = [0u8; 9 + 9 + 8];
    frames[3] = SETTINGS;
    frames[9..18].copy_from_slice(&[0, 0, 8, GOAWAY, 0, 0, 0, 0, 0]);
    frames[22..26].copy_from_slice(&REFUSED_STREAM.to_be_bytes());
    let drain = async {
        io.write_all(&frames).await?;
        io.shutdown().await?;
        let mut sink = [0u8; 4096];
        while io.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    };
    let _ = ::tokio::time::timeout(Duration::from_secs(1), drain).await;
}

impl std::fmt::Debug for Http2Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http2Server").field("stats", &self.stats).finish_non_exhaustive()
    }
}

/// The server's side of an HTTP/2 connection, counting the resets and GOAWAYs it writes:
/// h2 refuses streams and ends connections by itself, and tells nobody but the peer.
struct SentFrames<S> {
    io: S,
    stats: Arc<Http2Stats>,
    /// The frame header being written (RFC 9113 §4.1: 9 bytes), then the first 8 bytes of
    /// its payload (a RST_STREAM's code; a GOAWAY's last stream and code).
    head: [u8; 17],
    /// Bytes of `head` written so far.
    have: usize,
    /// Payload bytes of the current frame still to pass.
    left: usize,
}

const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const REFUSED_STREAM: u32 = 0x7;

impl<S> SentFrames<S> {
    fn new(io: S, stats: Arc<Http2Stats>) -> Self {
        Self { io, stats, head: [0; 17], have: 0, left: 0 }
    }

    /// Follows `bytes`, the next ones written, through the frames.
    fn follow(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.have < 9 {
                let n = (9 - self.have).min(bytes.len());
                self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                (self.have, bytes) = (self.have + n, &bytes[n..]);
                if self.have == 9 {
                    self.left =
                        u32::from_be_bytes([0, self.head[0], self.head[1], self.head[2]]) as usize;
                    self.frame_done();
                }
                continue;
            }
            let n = self.left.min(bytes.len());
            let keep = (17 - self.have).min(n);
            self.head[self.have..self.have + keep].copy_from_slice(&bytes[..keep]);
            (self.have, self.left, bytes) = (self.have + keep, self.left - n, &bytes[n..]);
            self.frame_done();
        }
    }

    /// Counts the frame once its payload has passed, and starts the next.
    fn frame_done(&mut self) {
        if self.left > 0 {
            return;
        }
        let code = |at: usize| {
            let b = self.head.get(at..at + 4).filter(|_| self.have >= at + 4);
            b.map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        };
        let stats = &self.stats;
        match (self.head[3], self.head[4] & ACK != 0) {
            (RST_STREAM, _) => {
                let code = code(9);
                Http2Stats::add(&stats.resets_by_code[code_slot(code)]);
                if code == REFUSED_STREAM {
                    Http2Stats::add(&stats.refused_streams);
                } else {
                    Http2Stats::add(&stats.reset_streams);
                }
            }
            (GOAWAY, _) => {
                let code = code(13);
                Http2Stats::add(&stats.goaways);
                Http2Stats::add(&stats.goaways_by_code[code_slot(code)]);
                if code != 0 {
                    Http2Stats::add(&stats.goaway_errors);
                }
            }
            (PING, true) => Http2Stats::add(&stats.ping_acks),
            (SETTINGS, true) => Http2Stats::add(&stats.settings_acks),
            _ => {}
        }
        self.have = 0;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SentFrames<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SentFrames<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            self.follow(&buf[..n]);
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = written {
            for buf in bufs {
                let part = n.min(buf.len());
                self.follow(&buf[..part]);
                n -= part;
            }
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// One HTTP/2 connection to a server that speaks RFC 8441, on which each
/// [`websocket`](Self::websocket) opens a WebSocket as a new stream. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Http2Client {
    send: SendRequest<Body>,
    /// `scheme://authority` of the requests' URIs.
    origin: String,
}

/// Why an HTTP/2 connection or one of its WebSockets did not open.
#[derive(Debug)]
#[non_exhaustive]
pub enum Http2Error {
    /// The HTTP/2 connection failed or ended.
    Http(hyper::Error),
    /// The server did not send `SETTINGS_ENABLE_CONNECT_PROTOCOL = 1` (RFC 8441 §3) within
    /// 10 s.
    NoExtendedConnect,
    /// The server answered the extended CONNECT with this status instead of 200.
    Status(u16),
    /// The server chose a subprotocol the client did not offer (RFC 6455 §4.1).
    Protocol(String),
    /// The request could not be built (a path or origin that is not a URI).
    Request(axum::http::Error),
}

impl std::fmt::Display for Http2Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Http2Error::Http(e) => write!(f, "HTTP/2: {e}"),
            Http2Error::NoExtendedConnect => {
                f.write_str("the server does not enable extended CONNECT (RFC 8441)")
            }
            Http2Error::Status(status) => write!(f, "the server answered {status}"),
            Http2Error::Protocol(p) => write!(f, "the server chose an unoffered protocol {p:?}"),
            Http2Error::Request(e) => write!(f, "bad request: {e}"),
        }
    }
}

impl std::error::Error for Http2Error {}

impl From<hyper::Error> for Http2Error {
    fn from(e: hyper::Error) -> Self {
        Http2Error::Http(e)
    }
}

impl Http2Client {
    /// Speaks HTTP/2 on `io` (a TLS stream that agreed on `h2` by ALPN, or a plain stream with
    /// prior knowledge) to `origin` (`https://host:port`), and waits for the server's
    /// SETTINGS to enable extended CONNECT. The connection runs in a task of its own until
    /// every clone of the client is dropped.
    pub async fn handshake<I>(io: I, origin: &str) -> Result<Self, Http2Error>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (send, mut connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(TokioIo::new(io))
            .await?;
        // The server's SETTINGS is its first frame (RFC 9113 §3.4), read by the task hyper
        // spawned for the HTTP/2 connection, which wakes nobody here when it lands: look
        // again every millisecond, for at most the handshake timeout.
        let deadline = ::tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
        while !connection.is_extended_connect_protocol_enabled() {
            match poll_fn(|cx| Poll::Ready(Pin::new(&mut connection).poll(cx))).await {
                Poll::Ready(Ok(())) => return Err(Http2Error::NoExtendedConnect),
                Poll::Ready(Err(e)) => return Err(Http2Error::Http(e)),
                Poll::Pending if ::tokio::time::Instant::now() >= deadline => {
                    return Err(Http2Error::NoExtendedConnect);
                }
                Poll::Pending => ::tokio::time::sleep(Duration::from_millis(1)).await,
            }
        }
        ::tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "HTTP/2 connection ended");
            }
        });
        Ok(Self { send, origin: origin.trim_end_matches('/').to_owned() })
    }

    /// Opens a WebSocket at `path` as a new stream: an extended CONNECT with
    /// `:protocol = websocket` (RFC 8441 §4), offering `config`'s subprotocols, whose `200`
    /// turns the stream into a client session drawing on `endpoint`. Waits while the
    /// connection has as many streams open as the server allows.
    pub async fn websocket(
        &self,
        path: &str,
        endpoint: &Arc<Endpoint>,
        config: &WsConfig,
    ) -> Result<Http2WebSocket, Http2Error> {
        let mut request = Request::builder()
            .method(Method::CONNECT)
            .uri(format!("{}{}", self.origin, path))
            .extension(hyper::ext::Protocol::from_static("websocket"))
            // RFC 8441 §5 keeps RFC 6455's version header: 13.
            .header(header::SEC_WEBSOCKET_VERSION, "13");
        if !config.protocols.is_empty() {
            request = request.header(header::SEC_WEBSOCKET_PROTOCOL, config.protocols.join(", "));
        }
        let request = request.body(Body::empty()).map_err(Http2Error::Request)?;
        let mut send = self.send.clone();
        send.ready().await?;
        let mut response = send.send_request(request).await?;
        if response.status() != StatusCode::OK {
            return Err(Http2Error::Status(response.status().as_u16()));
        }
        let protocol = match response.headers().get(header::SEC_WEBSOCKET_PROTOCOL) {
            None => None,
            Some(chosen) => {
                let chosen = chosen.to_str().unwrap_or_default();
                if !config.protocols.iter().any(|p| p == chosen) {
                    return Err(Http2Error::Protocol(chosen.to_owned()));
                }
                Some(chosen.to_owned())
            }
        };
        let upgraded = hyper::upgrade::on(&mut response).await?;
        Ok(WebSocket::client_from_upgraded(TokioIo::new(upgraded), endpoint, config, protocol))
    }
}
