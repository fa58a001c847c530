//! The WebSocket client: the semantics browsers taught everyone, with the costs visible.
//!
//! [`Client::connect`] opens `ws://` and `wss://` URLs (IPv6 literals, default ports, path and
//! query, custom headers, subprotocols, connect and handshake timeouts; TLS on rustls with the
//! operating system's roots, a private CA file ([`ClientConfig::ca_file`]) or, for tests, no
//! verification ([`ClientConfig::insecure`]); SNI and the host name checked), and so does
//! [`ClientLoop::connect`] for many connections in one thread (both over one
//! [`ClientStream`]). A handshake refusal says what the server answered:
//! [`ClientError::Refused`] carries the status and an excerpt of the body.
//!
//! Once open, the client behaves like a browser's `WebSocket`:
//! - [`ready_state`](Client::ready_state): connecting, open, closing, closed;
//! - [`send`](Client::send) queues and returns at once with what happened to the message (a
//!   [`SendOutcome`]: the send queue's answer — queued, above the high watermark, dropped or
//!   refused by the [`SlowConsumerPolicy`] — or closed);
//!   [`buffered_amount`](Client::buffered_amount) is O(1);
//! - [`recv`](Client::recv) gives whole messages, reassembled into pool chunks up to
//!   [`Limits::max_message_size`] (beyond it the connection closes with 1009), or the close
//!   event with
//!   `code`, `reason` and `was_clean`;
//! - [`close`](Client::close) starts the close handshake; `recv` then reports its end.
//!
//! # Who writes, and what a send costs
//!
//! By default a client has a writer thread ([`ClientConfig::writer_thread`]): `send` masks and
//! copies the message into the send queue and returns; the thread writes at once, and what
//! queued while it was in the kernel goes out in its next write (up to 64 KiB at a time), so a
//! burst of sends costs a few system calls, not one each, and nothing waits for another call
//! to leave. Without the thread, each `send` writes on the caller's thread: one system call
//! per message, no thread at all; what the socket does not take then waits for the next
//! `send`, [`flush`](Client::flush) or `recv`.
//!
//! Every frame gets a fresh random masking key (§5.3; drawn from the OS 64 keys at a time).
//! [`send`](Client::send) masks a borrowed slice as it copies it into pool chunks, once; when
//! the caller writes and nothing is queued, it copies it into a reused masking buffer instead
//! and writes from there. [`send_owned`](Client::send_owned) masks the caller's `Vec<u8>` in
//! place and, when nothing is queued ahead of it, hands it to the socket (or the writer
//! thread) without a copy. A message larger than the queue's cap waits in
//! `send` until the queue is empty, then goes out from its own buffer. Received messages are
//! copied once, from the read buffer into pool chunks.
//!
//! # Memory
//!
//! Queued bytes come from a send pool sized for the watermarks' cap, reassembled messages from
//! a receive pool; both are drawn from [`ClientConfig::memory`]. Besides them a client holds
//! its read buffer ([`ClientConfig::read_buffer`]), the masking buffer (at most 64 KiB kept
//! between sends) and, with the writer thread, the thread's 64 KiB write buffer.
//!
//! # Compression
//!
//! permessage-deflate (RFC 7692) is offered by default ([`ClientConfig::compression`]): the
//! client compresses each message of at least [`ClientConfig::compression_threshold`] bytes
//! afresh (`client_no_context_takeover`) and inflates the server's into the receive pool under
//! `max_message_size`. Its compressor and decompressor (about 300 KiB) are drawn from
//! [`ClientConfig::memory`]; [`Client::compression`] says what the server agreed to.
//!
//! ```no_run
//! use freeboard::client::{Client, ClientConfig, CloseCode, Event};
//!
//! let mut client = Client::connect("ws://127.0.0.1:9001/echo", ClientConfig::default())?;
//! let outcome = client.send_text("hello")?;
//! println!("{outcome:?}, {} bytes buffered", client.buffered_amount());
//! if let Event::Message(message) = client.recv()? {
//!     println!("{}", message.to_text().unwrap_or_default());
//! }
//! client.close(CloseCode::NORMAL, "bye")?;
//! while let Event::Message(_) = client.recv()? {}
//! # Ok::<(), freeboard::client::ClientError>(())
//! ```

mod blocking;
mod delta;
mod event_loop;
mod handshake;
mod message;
mod outbox;
pub mod resume;
mod stream;
mod subscription;
mod subscription_loop;
mod target;
#[cfg(feature = "tls")]
mod tls;
#[cfg(not(feature = "tls"))]
#[path = "tls/disabled.rs"]
mod tls;

use std::fmt;
use std::io;
use std::time::Duration;

pub use crate::session::SendOutcome;
pub use crate::{Limits, LimitsError};
pub use blocking::Client;
pub use delta::{Decoded, DeltaDecoder, DeltaRefusal};
pub use event_loop::{ClientHandler, ClientId, ClientLoop, LoopConn};
use freeboard_buf::{Budget, DEFAULT_SEGMENTS_PER_CHUNK, Pool, PoolConfig};
pub use freeboard_buf::{Limit, PushOutcome, SlowConsumerPolicy, Watermarks, Writability};
pub use freeboard_proto::CloseCode;
pub use freeboard_proto::MessageKind;
use freeboard_proto::UsageError;
use freeboard_proto::handshake::HandshakeError;
pub use handshake::Heads;
pub use message::{CloseEvent, Event, ReceivedMessage};
pub use stream::ClientStream;
pub use subscription::{Subscription, SubscriptionEvent, SubscriptionStats, TokenSource};
pub use subscription_loop::{SubscriptionHandler, SubscriptionId, SubscriptionLoop};
pub use target::Target;
#[cfg(feature = "tls")]
pub use tls::{tls_client_config, tls_connection};

/// Which certificates a `wss://` server may present.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsRoots {
    /// The operating system's trusted roots (the default).
    #[default]
    Native,
    /// Only the CA certificates in this PEM file.
    CaFile(std::path::PathBuf),
    /// Any certificate, for any name: no authentication at all. For tests only.
    Insecure,
}

/// Everything a client can be told, with defaults for a script talking to one server.
///
/// ```
/// use std::time::Duration;
/// use freeboard::client::{ClientConfig, SlowConsumerPolicy};
///
/// let config = ClientConfig::default()
///     .header("Authorization", "Bearer t0k3n")
///     .subprotocol("jsonrpc")
///     .connect_timeout(Duration::from_secs(2))
///     .limits(|limits| limits.slow_consumer(SlowConsumerPolicy::DropOldest));
/// assert_eq!(config.protocols, ["jsonrpc"]);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Time allowed to open the TCP connection (each resolved address in turn). Default 10 s.
    pub connect_timeout: Duration,
    /// Extra request headers (`Origin`, `Authorization`, …).
    pub headers: Vec<(String, String)>,
    /// Subprotocols to offer, most preferred first.
    pub protocols: Vec<String>,
    /// Byte budget for the chunk pools: the send queue's, sized for the watermarks' cap
    /// (about 340 KiB for the default 256 KiB), and the one that holds received messages
    /// while they are reassembled, which gets the rest. Default 32 MiB (zero-allocated: pages
    /// never used are never touched).
    pub memory: usize,
    /// Bytes per pool chunk. Default 4 KiB.
    pub chunk_size: usize,
    /// The send queue, the largest message received (a larger one closes the connection with
    /// 1009) and the timeouts: [`Limits::DEFAULT`] but for a client's send queue of 32 KiB /
    /// 64 KiB / 256 KiB whose policy is [`SlowConsumerPolicy::Block`] (a send past the cap
    /// answers `WouldBlock`: call [`Client::flush`] and retry), and no keep-alive pings
    /// (`idle_timeout` `None`). `handshake_timeout` counts from connected to a checked `101`.
    pub limits: Limits,
    /// Write from a thread of the client's own (`true`, the default): [`Client::send`] only
    /// queues, the thread writes at once, and what queues while it is in the kernel leaves in
    /// its next write (up to 64 KiB, copied into the thread's buffer). When `false`, each
    /// send writes on the caller's thread — one system call per message, no extra thread —
    /// and what the socket does not take leaves at the next send, `flush` or `recv`.
    pub writer_thread: bool,
    /// The read buffer, allocated once. Default 64 KiB.
    pub read_buffer: usize,
    /// Which certificates a `wss://` server may present. Default: the operating system's
    /// roots. Over TLS the caller writes (no writer thread: reading and writing share the
    /// TLS state).
    pub tls_roots: TlsRoots,
    /// Offer permessage-deflate (RFC 7692). Default `true`, as browsers do, when freeboard is
    /// built with its `deflate` feature (`false` without; `true` is then refused with
    /// [`ClientError::MissingFeature`]). The offer names `client_no_context_takeover` (this
    /// client compresses each message afresh, so the server keeps no inflate state for it);
    /// [`ClientLoop`] also asks for `server_no_context_takeover`, so none of its connections
    /// holds compression state between messages. A server may decline; a response this client
    /// cannot honour fails the connection ([`ClientError::Compression`]). Compressed messages
    /// are inflated into the receive pool under `limits.max_message_size` (1009 as soon as it
    /// is passed).
    pub compression: bool,
    /// Messages shorter than this are sent uncompressed. Default 64 bytes; 0 compresses
    /// every message.
    pub compression_threshold: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            headers: Vec::new(),
            protocols: Vec::new(),
            memory: 32 << 20,
            chunk_size: freeboard_buf::DEFAULT_CHUNK_SIZE,
            limits: Limits::DEFAULT
                .watermarks(Watermarks::DEFAULT)
                .slow_consumer(SlowConsumerPolicy::Block)
                .idle_timeout(None),
            writer_thread: true,
            read_buffer: 64 << 10,
            tls_roots: TlsRoots::Native,
            compression: crate::features::DEFLATE,
            compression_threshold: 64,
        }
    }
}

impl ClientConfig {
    /// Refuses limits that cannot work, and compression in a build without it: called first
    /// where every client starts.
    pub(crate) fn check(&self) -> Result<(), ClientError> {
        self.limits.validate().map_err(ClientError::Limits)?;
        if self.compression && !crate::features::DEFLATE {
            let missing = crate::MissingFeature { setting: "compression", feature: "deflate" };
            return Err(ClientError::MissingFeature(missing));
        }
        Ok(())
    }

    /// The pool that holds received messages (the client loop's holds everything), with
    /// `bytes` of budget of which `reserve` stays outside its chunks; with compression on,
    /// so do one compressor and one decompressor of the largest window (about 300 KiB), so
    /// that they are drawn from the same budget.
    pub(crate) fn receive_pool(
        &self,
        bytes: usize,
        reserve: usize,
    ) -> Result<Pool<'static>, ClientError> {
        let reserve = match self.compression {
            true => reserve + crate::session::deflate::STATE_BYTES,
            false => reserve,
        };
        let per_chunk = Pool::footprint(self.chunk_size.max(1), 1, DEFAULT_SEGMENTS_PER_CHUNK);
        let chunks = (bytes.saturating_sub(reserve) / per_chunk).min(freeboard_buf::MAX_CHUNKS);
        let config = PoolConfig::new().with_chunk_size(self.chunk_size).with_chunk_count(chunks);
        Pool::new(Budget::new(bytes), config).map_err(|e| ClientError::Config(e.to_string()))
    }

    /// Adds a request header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Offers a subprotocol (call again for more, most preferred first).
    pub fn subprotocol(mut self, protocol: impl Into<String>) -> Self {
        self.protocols.push(protocol.into());
        self
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`memory`](Self::memory).
    pub fn memory(mut self, bytes: usize) -> Self {
        self.memory = bytes;
        self
    }

    /// Changes [`limits`](Self::limits), starting from the client's:
    /// `.limits(|limits| limits.max_message_size(1 << 20).idle_timeout(Some(ping)))`.
    pub fn limits(mut self, change: impl FnOnce(Limits) -> Limits) -> Self {
        self.limits = change(self.limits);
        self
    }

    /// Sets [`writer_thread`](Self::writer_thread).
    pub fn writer_thread(mut self, on: bool) -> Self {
        self.writer_thread = on;
        self
    }

    /// Trusts only the CA certificates in the PEM file at `path` for `wss://`.
    pub fn ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls_roots = TlsRoots::CaFile(path.into());
        self
    }

    /// Accepts any certificate for `wss://` (`true`): no authentication of the server at
    /// all. For tests against self-signed servers only.
    pub fn insecure(mut self, on: bool) -> Self {
        if on {
            self.tls_roots = TlsRoots::Insecure;
        } else if self.tls_roots == TlsRoots::Insecure {
            self.tls_roots = TlsRoots::Native;
        }
        self
    }

    /// Sets [`compression`](Self::compression): `false` sends no permessage-deflate offer.
    pub fn compression(mut self, on: bool) -> Self {
        self.compression = on;
        self
    }

    /// Sets [`compression_threshold`](Self::compression_threshold).
    pub fn compression_threshold(mut self, bytes: usize) -> Self {
        self.compression_threshold = bytes;
        self
    }
}

/// Where the connection stands (the browser's `readyState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyState {
    /// The TCP connection or the opening handshake is under way.
    Connecting,
    /// Messages flow both ways.
    Open,
    /// Our close frame is queued or sent; the server's has not arrived.
    Closing,
    /// The close handshake is over, failed or timed out.
    Closed,
}

/// Why a client could not connect, or could not go on.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientError {
    /// The URL is not a usable `ws://` URL.
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// TLS could not be set up or failed (no trusted roots, an unreadable CA file, a
    /// certificate that does not verify, an alert from the server).
    Tls(String),
    /// The host name did not resolve.
    Resolve {
        /// The host.
        host: String,
        /// The resolver's error.
        source: io::Error,
    },
    /// No address accepted the TCP connection.
    Connect {
        /// The last address tried.
        addr: String,
        /// Its error (`TimedOut` when the connect timeout passed).
        source: io::Error,
    },
    /// The server did not complete the opening handshake in time.
    HandshakeTimeout(Duration),
    /// The server answered the upgrade with another status than 101.
    Refused {
        /// The HTTP status.
        status: u16,
        /// The status line's reason phrase.
        reason: String,
        /// The start of the response body (at most 512 bytes, lossily decoded).
        body: String,
    },
    /// The server's `101` response failed a check of RFC 6455 §4.1 (accept key, subprotocol,
    /// extension, upgrade headers), or was not HTTP.
    Handshake(HandshakeError),
    /// The server accepted permessage-deflate with parameters this client cannot honour
    /// (RFC 7692 §5: the client fails the connection), or the client's memory cannot hold
    /// the inflate window the server's context needs.
    Compression(crate::NegotiationError),
    /// The socket failed.
    Io(io::Error),
    /// A send or close on a connection that is not open; the message was not queued.
    NotOpen(ReadyState),
    /// `recv` after the close event was reported.
    AlreadyClosed,
    /// A call the protocol does not allow (a close code that may not be sent, a reason over
    /// 123 bytes, a message after our close).
    Usage(UsageError),
    /// The configuration cannot work (e.g. the memory budget is too small for one chunk).
    Config(String),
    /// A limit cannot work ([`ClientConfig::limits`]); the error names it.
    Limits(LimitsError),
    /// A setting (a `wss://` URL, `compression`) needs an optional part of freeboard this
    /// build leaves out.
    MissingFeature(crate::MissingFeature),
}

impl ClientError {
    /// Whether the error happened before the connection opened (URL, resolve, connect,
    /// handshake).
    pub fn is_connect_failure(&self) -> bool {
        !matches!(self, Self::Io(_) | Self::NotOpen(_) | Self::AlreadyClosed | Self::Usage(_))
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidUrl { url, why } => write!(f, "invalid WebSocket URL {url:?}: {why}"),
            Self::Tls(why) => write!(f, "TLS: {why}"),
            Self::Resolve { host, source } => write!(f, "cannot resolve {host}: {source}"),
            Self::Connect { addr, source } => write!(f, "cannot connect to {addr}: {source}"),
            Self::HandshakeTimeout(after) => {
                write!(f, "no WebSocket handshake response within {after:?}")
            }
            Self::Refused { status, reason, body } => {
                write!(f, "server refused the WebSocket upgrade: {status} {reason}")?;
                let body = body.trim();
                if !body.is_empty() {
                    write!(f, ": {body}")?;
                }
                Ok(())
            }
            Self::Handshake(e) => write!(f, "bad WebSocket handshake response: {e}"),
            Self::Compression(e) => write!(f, "permessage-deflate response refused: {e}"),
            Self::Io(e) => write!(f, "socket error: {e}"),
            Self::NotOpen(state) => write!(f, "the connection is not open ({state:?})"),
            Self::AlreadyClosed => f.write_str("the connection is closed"),
            Self::Usage(e) => write!(f, "not allowed by the protocol: {e}"),
            Self::Config(why) => write!(f, "invalid client configuration: {why}"),
            Self::Limits(e) => write!(f, "invalid client configuration: {e}"),
            Self::MissingFeature(missing) => missing.fmt(f),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Resolve { source, .. } | Self::Connect { source, .. } | Self::Io(source) => {
                Some(source)
            }
            Self::Handshake(e) => Some(e),
            Self::Compression(e) => Some(e),
            Self::Usage(e) => Some(e),
            Self::Limits(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}
