//! freeboard's runtime: a WebSocket server on mio whose memory is bounded and whose
//! backpressure works.
//!
//! One event loop per thread, each with its own `SO_REUSEPORT` listener, a slab of
//! connections, one shared read buffer and a chunk [`Pool`](freeboard_buf::Pool) drawn from
//! the memory budget. Frames are parsed in place by `freeboard-proto`; a message that arrives
//! whole in one read reaches the [`Handler`] as a borrowed slice, pieces of other messages are
//! kept in pool chunks. Everything a connection sends in one loop turn leaves in one `writev`.
//! A connection with nothing in flight parks its protocol state (24 bytes instead of a
//! 424-byte `Connection`), so an idle connection costs about 200 bytes of user-space memory.
//!
//! ```no_run
//! use freeboard::{Conn, Handler, Message, Router, Server, ServerConfig};
//!
//! struct Shout;
//! impl Handler for Shout {
//!     fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
//!         if let Some(text) = message.as_text() {
//!             let _ = conn.send_text(&text.to_uppercase());
//!         }
//!     }
//! }
//!
//! let server = Server::bind(ServerConfig::default(), || Router::new().route("/shout", Shout))?;
//! server.run()?;
//! # Ok::<(), std::io::Error>(())
//! ```

#![warn(missing_debug_implementations)]

pub mod auth;
pub mod backplane;
pub mod capacity;
pub mod client;
pub mod config;
mod dashboard;
pub mod delta;
mod features;
pub mod fossil;
pub mod handler;
pub mod history;
pub mod kernel_memory;
mod lag;
mod limits;
pub mod metrics;
mod parking;
pub mod presence;
mod proxy_header;
mod rate;
mod receipt;
mod server;
mod session;
/// The session's per-message path without a socket, for `benches/session.rs` only.
#[doc(hidden)]
pub mod session_bench;
pub mod tls;
#[cfg(feature = "tokio")]
pub mod tokio;
mod topic_series;
pub mod topics;
mod transport;
#[cfg(target_os = "linux")]
mod uring;

pub use config::{IoDriver, ServerConfig, TlsConfig};
pub use features::MissingFeature;
pub use freeboard_buf::ConflateKey;
/// What stopped a message the `block` policy refused ([`PushOutcome::WouldBlock`]).
pub use freeboard_buf::Limit;
pub use freeboard_buf::PushOutcome;
pub use freeboard_buf::SlowConsumerPolicy;
pub use freeboard_buf::Watermarks;
pub use freeboard_proto::handshake::Request;
pub use freeboard_proto::{CloseCode, MessageKind};
pub use handler::{
    Accepted, Conn, ConnId, ConnKey, Decision, Echo, Handler, HttpRoute, Message, PublishAccess,
    PublishGrant, PublishRefusal, RouteOptions, Router, Upgrade,
};
pub use limits::{Limits, LimitsError};
pub use metrics::Metrics;
pub use server::{LocalServer, RunningServer, Server, ServerHandle};
pub use session::SendOutcome;
pub use session::deflate::{Agreement, Compression, NegotiationError};
pub use topics::{Published, Reach};

/// The README's examples, compiled with the doctests so that they stay true (one of them is
/// the `axum` feature's).
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The repository's README and the book's tokio page: their Rust snippets compiled with the
/// doctests (`scripts/test` runs them with the `axum` feature), so that what a reader copies
/// builds.
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../../../README.md")]
struct RepositoryReadmeDoctests;

/// The book's page on the Rust client, compiled with the doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library/client.md")]
struct ClientGuideDoctests;

/// The book's page on tokio and axum (see [`RepositoryReadmeDoctests`]).
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../../../docs/library/tokio.md")]
struct TokioGuideDoctests;

/// The book's page on Server-Sent Events, whose axum route is compiled with the `axum`
/// feature's doctests.
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../../../docs/operating/sse.md")]
struct SseGuideDoctests;

/// The book's page on WebSockets over HTTP/2, compiled with the `http2` feature's doctests.
#[cfg(all(doctest, feature = "http2"))]
#[doc = include_str!("../../../docs/library/http2.md")]
struct Http2GuideDoctests;
