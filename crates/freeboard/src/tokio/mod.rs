//! The tokio driver: freeboard's session under tokio, so a service that already runs on tokio
//! (axum, hyper, tonic…) gets bounded WebSockets without moving onto freeboard's own loops.
//!
//! It is one more driver of the same sans-IO session as the server's event loop and the
//! clients: it moves bytes between an `AsyncRead + AsyncWrite` and the session, and time
//! between tokio's clock and the session's timers. Everything else — framing, reassembly
//! under limits, the send queue's watermarks and slow-consumer policy, the close handshake,
//! keep-alive pings — is the session's.
//!
//! - An [`Endpoint`] is one memory budget shared by every connection it serves: one chunk pool
//!   for all their send queues and partial messages, one parking lot for idle protocol state.
//! - A [`WebSocket`] is one connection over any `AsyncRead + AsyncWrite + Unpin` (a
//!   `TcpStream`, a TLS stream, a Unix socket, hyper's upgraded connection). It is a
//!   [`Stream`](futures_core::Stream) of [`Message`]s and a [`Sink`](futures_sink::Sink) of
//!   them, and has the browser's calls: [`send`](WebSocket::send) reports at once what the
//!   queue did ([`SendOutcome`]), [`buffered_amount`](WebSocket::buffered_amount) is O(1),
//!   [`writable`](WebSocket::writable) waits for the low watermark.
//!   [`split`](WebSocket::split) gives a [`WsReader`] and a cloneable [`WsWriter`].
//!
//! Who writes: a send only queues (copying the payload into pool chunks, masked for a
//! client). The queued bytes leave in one vectored write when the connection is next polled —
//! by the reader (a reader waiting for input is woken for it; a reader busy in its loop writes
//! everything the loop queued in one write when it asks for the next message), by
//! [`flush`](WebSocket::flush) or [`writable`](WebSocket::writable), or, when no reader has
//! ever been polled (or its reader half was dropped), at once inside `send`. A task that
//! keeps the reader but stops polling it must `flush` what it sends. Timers (close timeout,
//! keep-alive) run while the reader is polled, as in every tokio WebSocket.
//!
//! Timers use tokio's time driver: build the runtime with it (`#[tokio::main]` and
//! `Builder::enable_all` do).
//!
//! Idle connections hold no read buffer: a connection takes one of the endpoint's read
//! buffers only while the socket has bytes for it, and gives it back as soon as they are
//! parsed (a buffer stays with a connection only while messages it read wait for the
//! application). Their protocol state parks in 24 bytes as on the server.
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use freeboard::tokio::{Endpoint, EndpointConfig, Message, WebSocket, WsConfig};
//! use futures_util::StreamExt;
//!
//! let endpoint = Endpoint::new(EndpointConfig::default()).expect("a valid budget");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let (stream, _) = listener.accept().await?;
//! let mut ws = WebSocket::accept(stream, &endpoint, &WsConfig::default()).await?;
//! while let Some(message) = ws.next().await {
//!     match message {
//!         Message::Close(_) => break,
//!         message => {
//!             let _ = ws.send(message); // a SendOutcome: Queued, QueuedAboveHigh, Dropped…
//!         }
//!     }
//! }
//! # Ok(()) }
//! ```

use std::future::poll_fn;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{self, Poll, Waker};
use std::time::Duration;

use ::tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use ::tokio::time::Sleep;
use freeboard_buf::{Budget, Counters, Pool, PoolConfig, SendQueue, Writability};
use freeboard_proto::{CloseCode, Instant, MessageKind, Role, State, UsageError};

use crate::client::CloseEvent;
use crate::config::ConfigError;
use crate::parking::{ParkingLot, Ws};
use crate::session::{Context, MaskSource, Reassembly, Received, Session, Share};
use crate::{SendOutcome, SlowConsumerPolicy, Watermarks};

#[cfg(feature = "axum")]
pub mod axum;
mod handshake;
#[cfg(test)]
mod tests;

pub use handshake::AcceptError;

/// Slices gathered for one vectored write.
const IOV: usize = 64;
/// Read buffers an endpoint keeps for the next readable connection.
const SPARE_READ_BUFFERS: usize = 64;

/// The budget and limits every connection of an [`Endpoint`] shares. One
/// `#[non_exhaustive]` struct: start from [`default`](Self::default) and set fields.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EndpointConfig {
    /// Bytes of the chunk pool every connection's send queue and partial messages come from.
    /// Default 64 MiB.
    pub memory: usize,
    /// Pool chunk size. Default 4 KiB.
    pub chunk_size: usize,
    /// Bytes of one read buffer (a connection holds one only while it has unread input).
    /// Default 16 KiB.
    pub read_buffer: usize,
    /// Free pool bytes an upgrade needs ([`Endpoint::has_room`]; the axum extractor answers
    /// 503 below it), and twice what a message arriving in pieces must leave free (else close
    /// 1013). Default 64 KiB.
    pub connection_reserve: usize,
    /// The protocol limits and timers of every connection: `max_message_size`,
    /// `close_timeout`, keep-alive `ping_interval` and `pong_timeout`.
    pub protocol: freeboard_proto::Config,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            memory: 64 << 20,
            chunk_size: 4096,
            read_buffer: 16 << 10,
            connection_reserve: 64 << 10,
            protocol: freeboard_proto::Config::DEFAULT,
        }
    }
}

impl EndpointConfig {
    /// Sets [`memory`](Self::memory).
    pub fn memory(mut self, bytes: usize) -> Self {
        self.memory = bytes;
        self
    }

    /// Sets [`protocol`](Self::protocol).
    pub fn protocol(mut self, protocol: freeboard_proto::Config) -> Self {
        self.protocol = protocol;
        self
    }

    /// Sets [`connection_reserve`](Self::connection_reserve).
    pub fn connection_reserve(mut self, bytes: usize) -> Self {
        self.connection_reserve = bytes;
        self
    }
}

/// One connection's send queue settings and the subprotocols it may speak: per route.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WsConfig {
    /// Send queue watermarks and hard cap. Default as `freeboard serve`: 32 KiB low, 64 KiB
    /// high, a cap of 16 MiB + 64 KiB (a largest message and then some).
    pub watermarks: Watermarks,
    /// What happens at the cap (and, while the pool is contended, past the connection's fair
    /// share). Default as `freeboard serve`: [`SlowConsumerPolicy::Close`] (1008).
    pub policy: SlowConsumerPolicy,
    /// Subprotocols the server speaks, in order of preference.
    pub protocols: Vec<String>,
}

impl Default for WsConfig {
    fn default() -> Self {
        // NOTE(unwrap): 32 KiB <= 64 KiB <= 16 MiB + 64 KiB.
        let watermarks = Watermarks::new(32 << 10, 64 << 10, (16 << 20) + (64 << 10))
            .expect("ordered watermarks");
        Self { watermarks, policy: SlowConsumerPolicy::Close, protocols: Vec::new() }
    }
}

impl WsConfig {
    /// Sets [`watermarks`](Self::watermarks).
    pub fn watermarks(mut self, watermarks: Watermarks) -> Self {
        self.watermarks = watermarks;
        self
    }

    /// Sets [`policy`](Self::policy).
    pub fn policy(mut self, policy: SlowConsumerPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets [`protocols`](Self::protocols).
    pub fn protocols<I: IntoIterator<Item = S>, S: Into<String>>(mut self, protocols: I) -> Self {
        self.protocols = protocols.into_iter().map(Into::into).collect();
        self
    }
}

/// The memory every connection of a tokio service shares: one chunk pool carved from one
/// budget, the parked protocol states, spare read buffers. Cheap to share (`Arc`); any task
/// of any runtime thread may use it.
pub struct Endpoint {
    hub: Mutex<Hub>,
    protocol: freeboard_proto::Config,
    read_buffer: usize,
    reserve: usize,
    /// The session's clock starts here.
    start: ::tokio::time::Instant,
}

/// What an endpoint lends its connections, behind one lock.
struct Hub {
    pool: Pool<'static>,
    lot: ParkingLot,
    masks: MaskSource,
    /// Connections alive: each one's fair share of a contended pool divides by it.
    open: usize,
    /// Read buffers no connection holds.
    spare: Vec<Box<[u8]>>,
    /// Read buffers held by connections now.
    reading: usize,
}

impl Endpoint {
    /// An endpoint with `config`'s budget; `Err` if the chunk size is out of range or the
    /// budget cannot hold 16 chunks.
    pub fn new(config: EndpointConfig) -> Result<Arc<Self>, ConfigError> {
        let max = freeboard_buf::MAX_CHUNK_SIZE;
        if config.chunk_size == 0 || config.chunk_size > max {
            return Err(ConfigError::ChunkSize { given: config.chunk_size, max });
        }
        let needed = 16 * config.chunk_size;
        let pool_config = PoolConfig::new().with_chunk_size(config.chunk_size);
        let pool = match Pool::new(Budget::new(config.memory), pool_config) {
            Ok(pool) if pool.chunks_total() >= 16 => pool,
            _ => return Err(ConfigError::Memory { memory: config.memory, threads: 1, needed }),
        };
        Ok(Arc::new(Self {
            hub: Mutex::new(Hub {
                pool,
                lot: ParkingLot::new(config.protocol),
                masks: MaskSource::new(),
                open: 0,
                spare: Vec::new(),
                reading: 0,
            }),
            protocol: config.protocol,
            read_buffer: config.read_buffer.max(1024),
            reserve: config.connection_reserve,
            start: ::tokio::time::Instant::now(),
        }))
    }

    /// Whether the pool has a connection's reserve free: admit a new connection only then.
    pub fn has_room(&self) -> bool {
        let hub = self.lock();
        hub.pool.chunks_free() * hub.pool.chunk_size() >= self.reserve
    }

    /// The pool's counters: budget, chunks in use and their high water, allocation failures.
    pub fn counters(&self) -> Counters {
        self.lock().pool.counters()
    }

    /// Connections alive on this endpoint.
    pub fn connections(&self) -> usize {
        self.lock().open
    }

    /// Read buffers held by connections now (each [`EndpointConfig::read_buffer`] bytes; an
    /// idle connection holds none).
    pub fn read_buffers_in_use(&self) -> usize {
        self.lock().reading
    }

    fn lock(&self) -> MutexGuard<'_, Hub> {
        // A panic in another connection's call leaves the pool consistent (every change to it
        // is one call of freeboard-buf): go on.
        self.hub.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now(&self) -> Instant {
        Instant::from_millis(self.start.elapsed().as_millis() as u64)
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hub = self.lock();
        f.debug_struct("Endpoint")
            .field("connections", &hub.open)
            .field("chunks_in_use", &hub.pool.chunks_in_use())
            .field("read_buffers_in_use", &hub.reading)
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// What a session borrows for one call.
    fn cx(&mut self, role: Role, limits: Reassembly, now: Instant) -> Context<'_> {
        let share = Share::new(&self.pool, self.open);
        Context {
            pool: &mut self.pool,
            lot: &mut self.lot,
            masks: if role == Role::Client { Some(&mut self.masks) } else { None },
            limits,
            share,
            now,
        }
    }
}

/// A whole received message, or the close that ends the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A text message (validated UTF-8).
    Text(String),
    /// A binary message.
    Binary(Vec<u8>),
    /// The connection closed: the last item of the stream. Code 1006 if the transport ended
    /// before the close handshake.
    Close(CloseEvent),
}

impl Message {
    /// The kind and bytes of a data message; `None` for `Close`.
    pub fn as_data(&self) -> Option<(MessageKind, &[u8])> {
        match self {
            Message::Text(text) => Some((MessageKind::Text, text.as_bytes())),
            Message::Binary(bytes) => Some((MessageKind::Binary, bytes)),
            Message::Close(_) => None,
        }
    }

    fn received(kind: MessageKind, data: Vec<u8>) -> Self {
        match kind {
            // NOTE: the core validated the text as it streamed (§8.1, 1007 otherwise).
            MessageKind::Text => Message::Text(
                String::from_utf8(data)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            ),
            MessageKind::Binary => Message::Binary(data),
        }
    }
}

impl From<String> for Message {
    fn from(text: String) -> Self {
        Message::Text(text)
    }
}

impl From<&str> for Message {
    fn from(text: &str) -> Self {
        Message::Text(text.to_owned())
    }
}

impl From<Vec<u8>> for Message {
    fn from(bytes: Vec<u8>) -> Self {
        Message::Binary(bytes)
    }
}

/// Why a [`Sink`](futures_sink::Sink) send or a close failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The connection is closing or closed.
    Closed,
    /// The message was a `Close`: close with [`WebSocket::close`], which takes a code.
    NotData,
    /// The protocol forbids the call (a close code that may not be sent, a reason over 123
    /// bytes).
    Usage(UsageError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Closed => f.write_str("the WebSocket is closing or closed"),
            Error::NotData => f.write_str("a Close is sent with WebSocket::close"),
            Error::Usage(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

/// A WebSocket connection over `S`, driven by freeboard's session; see the
/// [module docs](self).
pub struct WebSocket<S> {
    shared: Arc<Shared<S>>,
}

/// The reading half of a [`WebSocket`] ([`WebSocket::split`]): a stream of messages; it also
/// runs the connection's timers and writes what is queued when polled.
pub struct WsReader<S> {
    shared: Arc<Shared<S>>,
}

/// The sending half of a [`WebSocket`] ([`WebSocket::split`]); clone it for more producers.
pub struct WsWriter<S> {
    shared: Arc<Shared<S>>,
}

/// One connection: its state behind a lock both halves take for the length of one call
/// (never across an `.await`), and the endpoint it draws from. Lock order: `conn`, then the
/// endpoint's hub.
struct Shared<S> {
    endpoint: Arc<Endpoint>,
    conn: Mutex<Conn<S>>,
}

struct Conn<S> {
    io: S,
    session: Session,
    role: Role,
    limits: Reassembly,
    protocol: Option<String>,
    /// Read bytes not yet parsed, in a buffer lent by the endpoint. `None` when idle.
    input: Option<Input>,
    /// The close the session reported, until the reader takes it.
    close: Option<CloseEvent>,
    /// The close was delivered: the stream has ended.
    ended: bool,
    /// Our writing side is shut down (after the close handshake).
    shut_down: bool,
    /// The session's next deadline, armed while it has one.
    timer: Option<Pin<Box<Sleep>>>,
    /// The task reading, if a reader was ever polled: woken to write what sends queued.
    reader: Option<Waker>,
    /// The reader was woken to write and has not yet.
    write_requested: bool,
    /// Tasks waiting in `writable` or `flush`.
    writers: Vec<Waker>,
}

/// Read bytes `bytes[at..end]` waiting to be parsed.
struct Input {
    bytes: Box<[u8]>,
    at: usize,
    end: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> WebSocket<S> {
    /// A server connection over `io` whose opening handshake is done (the `101` was sent, as
    /// by hyper's upgrade), speaking `protocol` if one was chosen.
    pub fn from_upgraded(
        io: S,
        endpoint: &Arc<Endpoint>,
        config: &WsConfig,
        protocol: Option<String>,
    ) -> Self {
        let limits = Reassembly::server(endpoint.reserve);
        Self::open(io, endpoint, config, Role::Server, limits, protocol)
    }

    /// A client connection over `io` whose opening handshake is done: every frame it sends
    /// is masked with a fresh key (§5.3), and a message larger than the pool can hold is
    /// refused with 1009.
    pub fn client_from_upgraded(
        io: S,
        endpoint: &Arc<Endpoint>,
        config: &WsConfig,
        protocol: Option<String>,
    ) -> Self {
        Self::open(io, endpoint, config, Role::Client, Reassembly::CLIENT, protocol)
    }

    /// Reads an upgrade request from `io`, answers `101 Switching Protocols` (or refuses
    /// with its HTTP status and `Err`) and returns the server connection. For a bare tokio
    /// listener; behind axum use [`axum::WebSocketUpgrade`](crate::tokio::axum).
    pub async fn accept(
        mut io: S,
        endpoint: &Arc<Endpoint>,
        config: &WsConfig,
    ) -> Result<Self, AcceptError> {
        let (protocol, leftover) = handshake::accept(&mut io, endpoint, config).await?;
        let ws = Self::from_upgraded(io, endpoint, config, protocol);
        if !leftover.is_empty() {
            // Frames the client sent right behind its request.
            let mut conn = ws.shared.lock();
            let mut bytes = endpoint.lock().spare.pop().unwrap_or_else(|| {
                vec![0u8; endpoint.read_buffer.max(leftover.len())].into_boxed_slice()
            });
            if bytes.len() < leftover.len() {
                bytes = vec![0u8; leftover.len()].into_boxed_slice();
            }
            bytes[..leftover.len()].copy_from_slice(&leftover);
            endpoint.lock().reading += 1;
            conn.input = Some(Input { bytes, at: 0, end: leftover.len() });
        }
        Ok(ws)
    }

    fn open(
        io: S,
        endpoint: &Arc<Endpoint>,
        config: &WsConfig,
        role: Role,
        limits: Reassembly,
        protocol: Option<String>,
    ) -> Self {
        let now = endpoint.now();
        let ws = Ws::new(role, &endpoint.protocol, now);
        let queue = SendQueue::new(config.watermarks, config.policy);
        endpoint.lock().open += 1;
        let conn = Conn {
            io,
            session: Session::open(ws, queue),
            role,
            limits,
            protocol,
            input: None,
            close: None,
            ended: false,
            shut_down: false,
            timer: None,
            reader: None,
            write_requested: false,
            writers: Vec::new(),
        };
        Self { shared: Arc::new(Shared { endpoint: Arc::clone(endpoint), conn: Mutex::new(conn) }) }
    }

    /// Splits the connection into a reader (a stream of messages) and a writer (cloneable);
    /// the connection lives until both are dropped.
    pub fn split(self) -> (WsReader<S>, WsWriter<S>) {
        (WsReader { shared: Arc::clone(&self.shared) }, WsWriter { shared: self.shared })
    }

    /// The next message; `Message::Close` is the last one, then `None`.
    pub async fn recv(&mut self) -> Option<Message> {
        poll_fn(|task| self.shared.poll_recv(task)).await
    }

    /// Queues a message (copied into pool chunks) and says what the queue did with it:
    /// `Queued`, `QueuedAboveHigh` (slow down: await [`writable`](Self::writable)),
    /// `Dropped` (the policy dropped it or older ones; counted), `Blocked` (the `block`
    /// policy: not queued, retry after `writable`), `Closed`. A `Close` message is `Closed`.
    pub fn send(&self, message: Message) -> SendOutcome {
        match message.as_data() {
            Some((kind, data)) => self.shared.send(kind, data),
            None => SendOutcome::Closed,
        }
    }

    /// Queues a text message; see [`send`](Self::send).
    pub fn send_text(&self, text: &str) -> SendOutcome {
        self.shared.send(MessageKind::Text, text.as_bytes())
    }

    /// Queues a binary message; see [`send`](Self::send).
    pub fn send_binary(&self, data: &[u8]) -> SendOutcome {
        self.shared.send(MessageKind::Binary, data)
    }

    /// Bytes queued and not yet written (`bufferedAmount`). O(1).
    pub fn buffered_amount(&self) -> usize {
        self.shared.lock().session.buffered()
    }

    /// Whether the queue is at or under its low watermark since it last rose above the high
    /// one (or never did).
    pub fn is_writable(&self) -> bool {
        self.shared.lock().session.queue().is_writable()
    }

    /// Writes what is queued until the queue is writable again (at or under its low
    /// watermark), or the connection closed.
    pub async fn writable(&self) {
        poll_fn(|task| self.shared.poll_writable(task, false)).await
    }

    /// Writes everything queued (or until the connection can no longer write).
    pub async fn flush(&self) {
        poll_fn(|task| self.shared.poll_writable(task, true)).await
    }

    /// Starts the close handshake with `code` (1000, 1001, 1008, 1011, 3000–4999…) and
    /// `reason` (at most 123 bytes). The reader's stream ends with the peer's answer (or 1006
    /// after the close timeout).
    pub fn close(&self, code: CloseCode, reason: &str) -> Result<(), Error> {
        self.shared.close(code, reason)
    }

    /// The subprotocol agreed in the handshake.
    pub fn protocol(&self) -> Option<String> {
        self.shared.lock().protocol.clone()
    }

    /// The endpoint this connection draws from.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.shared.endpoint
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsReader<S> {
    /// The next message; `Message::Close` is the last one, then `None`.
    pub async fn recv(&mut self) -> Option<Message> {
        poll_fn(|task| self.shared.poll_recv(task)).await
    }

    /// Puts the halves back together; `Err` gives them back if they are not of one
    /// connection.
    pub fn reunite(self, writer: WsWriter<S>) -> Result<WebSocket<S>, (Self, WsWriter<S>)> {
        if Arc::ptr_eq(&self.shared, &writer.shared) {
            Ok(WebSocket { shared: writer.shared })
        } else {
            Err((self, writer))
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsWriter<S> {
    /// See [`WebSocket::send`].
    pub fn send(&self, message: Message) -> SendOutcome {
        match message.as_data() {
            Some((kind, data)) => self.shared.send(kind, data),
            None => SendOutcome::Closed,
        }
    }

    /// See [`WebSocket::send_text`].
    pub fn send_text(&self, text: &str) -> SendOutcome {
        self.shared.send(MessageKind::Text, text.as_bytes())
    }

    /// See [`WebSocket::send_binary`].
    pub fn send_binary(&self, data: &[u8]) -> SendOutcome {
        self.shared.send(MessageKind::Binary, data)
    }

    /// See [`WebSocket::buffered_amount`].
    pub fn buffered_amount(&self) -> usize {
        self.shared.lock().session.buffered()
    }

    /// See [`WebSocket::is_writable`].
    pub fn is_writable(&self) -> bool {
        self.shared.lock().session.queue().is_writable()
    }

    /// See [`WebSocket::writable`].
    pub async fn writable(&self) {
        poll_fn(|task| self.shared.poll_writable(task, false)).await
    }

    /// See [`WebSocket::flush`].
    pub async fn flush(&self) {
        poll_fn(|task| self.shared.poll_writable(task, true)).await
    }

    /// See [`WebSocket::close`].
    pub fn close(&self, code: CloseCode, reason: &str) -> Result<(), Error> {
        self.shared.close(code, reason)
    }

    /// Whether `other` sends on the same connection.
    pub fn same_connection(&self, other: &WsWriter<S>) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl<S> Clone for WsWriter<S> {
    fn clone(&self) -> Self {
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl<S> Drop for WsReader<S> {
    fn drop(&mut self) {
        // Nobody reads any more: the next send writes for itself, with what waits.
        let mut conn = self.shared.lock();
        conn.reader = None;
        conn.write_requested = false;
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> futures_core::Stream for WebSocket<S> {
    type Item = Message;

    fn poll_next(self: Pin<&mut Self>, task: &mut task::Context<'_>) -> Poll<Option<Message>> {
        self.shared.poll_recv(task)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> futures_core::Stream for WsReader<S> {
    type Item = Message;

    fn poll_next(self: Pin<&mut Self>, task: &mut task::Context<'_>) -> Poll<Option<Message>> {
        self.shared.poll_recv(task)
    }
}

/// The `Sink` of the futures ecosystem: `poll_ready` waits for the queue to be writable,
/// `start_send` queues (a message the policy drops is not an error: it is counted, and
/// [`send`](WebSocket::send) reports it), `poll_flush` writes everything, `poll_close` closes
/// with 1000.
macro_rules! sink {
    ($type:ident) => {
        impl<S: AsyncRead + AsyncWrite + Unpin> futures_sink::Sink<Message> for $type<S> {
            type Error = Error;

            fn poll_ready(
                self: Pin<&mut Self>,
                task: &mut task::Context<'_>,
            ) -> Poll<Result<(), Error>> {
                self.shared.poll_writable(task, false).map(|()| self.shared.open_or_closed())
            }

            fn start_send(self: Pin<&mut Self>, message: Message) -> Result<(), Error> {
                let (kind, data) = message.as_data().ok_or(Error::NotData)?;
                match self.shared.send(kind, data) {
                    SendOutcome::Closed => Err(Error::Closed),
                    _ => Ok(()),
                }
            }

            fn poll_flush(
                self: Pin<&mut Self>,
                task: &mut task::Context<'_>,
            ) -> Poll<Result<(), Error>> {
                self.shared.poll_writable(task, true).map(Ok)
            }

            fn poll_close(
                self: Pin<&mut Self>,
                task: &mut task::Context<'_>,
            ) -> Poll<Result<(), Error>> {
                if self.shared.lock().session.state() == State::Open {
                    self.shared.close(CloseCode::NORMAL, "")?;
                }
                self.shared.poll_writable(task, true).map(Ok)
            }
        }
    };
}

sink!(WebSocket);
sink!(WsWriter);

impl<S> std::fmt::Debug for WebSocket<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt("WebSocket", f)
    }
}

impl<S> std::fmt::Debug for WsReader<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt("WsReader", f)
    }
}

impl<S> std::fmt::Debug for WsWriter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt("WsWriter", f)
    }
}

impl<S> Shared<S> {
    fn lock(&self) -> MutexGuard<'_, Conn<S>> {
        self.conn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn fmt(&self, name: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let conn = self.lock();
        f.debug_struct(name)
            .field("state", &conn.session.state())
            .field("buffered_amount", &conn.session.buffered())
            .finish_non_exhaustive()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Shared<S> {
    fn send(&self, kind: MessageKind, data: &[u8]) -> SendOutcome {
        let mut conn = self.lock();
        let mut hub = self.endpoint.lock();
        if conn.session.state() != State::Open {
            return SendOutcome::Closed;
        }
        let (role, limits) = (conn.role, conn.limits);
        let outcome = conn.session.send(&mut hub.cx(role, limits, self.endpoint.now()), kind, data);
        conn.note_close();
        conn.schedule_write(&mut hub);
        outcome.map_or(SendOutcome::Closed, SendOutcome::from)
    }

    fn close(&self, code: CloseCode, reason: &str) -> Result<(), Error> {
        let mut conn = self.lock();
        let mut hub = self.endpoint.lock();
        if conn.session.state() != State::Open {
            return Err(Error::Closed);
        }
        let (role, limits) = (conn.role, conn.limits);
        let cx = &mut hub.cx(role, limits, self.endpoint.now());
        conn.session.close(cx, code, reason).map_err(Error::Usage)?;
        conn.note_close();
        conn.schedule_write(&mut hub);
        Ok(())
    }

    fn open_or_closed(&self) -> Result<(), Error> {
        match self.lock().session.state() {
            State::Open => Ok(()),
            _ => Err(Error::Closed),
        }
    }

    /// Writes until the queue is writable (`all`: empty), the transport cannot take more
    /// now (`Pending`), or the connection can no longer write.
    fn poll_writable(&self, task: &mut task::Context<'_>, all: bool) -> Poll<()> {
        let mut conn = self.lock();
        let mut hub = self.endpoint.lock();
        let written = conn.write(&mut hub, task);
        let done = match conn.session.state() {
            State::Closed => true,
            _ if all => written.is_ready(),
            _ => conn.session.queue().is_writable(),
        };
        if done {
            return Poll::Ready(());
        }
        if !conn.writers.iter().any(|w| w.will_wake(task.waker())) {
            conn.writers.push(task.waker().clone());
        }
        Poll::Pending
    }

    /// The driver's turn for the reader: write what is queued, deliver what was read, run
    /// the timers, read.
    fn poll_recv(&self, task: &mut task::Context<'_>) -> Poll<Option<Message>> {
        let endpoint = &*self.endpoint;
        let mut guard = self.lock();
        let conn = &mut *guard;
        if conn.reader.as_ref().is_none_or(|w| !w.will_wake(task.waker())) {
            conn.reader = Some(task.waker().clone());
        }
        loop {
            let mut hub = endpoint.lock();
            let now = endpoint.now();
            if let Some(message) = conn.parse(&mut hub, now) {
                // What the application queues while it takes the messages of one read leaves
                // in one write once they are taken (or sooner, past the high watermark).
                if !conn.session.queue().is_writable() {
                    let _ = conn.write(&mut hub, task);
                }
                return Poll::Ready(Some(message));
            }
            let _ = conn.write(&mut hub, task);
            if let Some(close) = conn.close.take() {
                // Our answer to the peer's close leaves before the application hears of it.
                let _ = conn.write(&mut hub, task);
                conn.ended = true;
                conn.release_input(&mut hub);
                return Poll::Ready(Some(Message::Close(close)));
            }
            if conn.ended || conn.session.state() == State::Closed {
                conn.ended = true;
                return Poll::Ready(None);
            }
            let (role, limits) = (conn.role, conn.limits);
            if let Some(at) = conn.session.poll_timeout() {
                if at <= now {
                    conn.session.handle_timeout(&mut hub.cx(role, limits, now));
                    conn.note_close();
                    continue;
                }
                let deadline = endpoint.start + Duration::from_millis(at.as_millis());
                let timer = match &mut conn.timer {
                    Some(timer) => {
                        if timer.deadline() != deadline {
                            timer.as_mut().reset(deadline);
                        }
                        timer
                    }
                    None => conn.timer.insert(Box::pin(::tokio::time::sleep_until(deadline))),
                };
                if timer.as_mut().poll(task).is_ready() {
                    continue;
                }
            }
            if !conn.session.wants_input() {
                // Paused above the high watermark: the write that drains the queue wakes us.
                conn.session.park(&mut hub.lot);
                return Poll::Pending;
            }
            let mut bytes = hub
                .spare
                .pop()
                .unwrap_or_else(|| vec![0u8; endpoint.read_buffer].into_boxed_slice());
            hub.reading += 1;
            // The read is a system call: other connections may use the pool meanwhile.
            drop(hub);
            let mut buf = ReadBuf::new(&mut bytes);
            let read = Pin::new(&mut conn.io).poll_read(task, &mut buf);
            let n = buf.filled().len();
            let mut hub = endpoint.lock();
            match read {
                Poll::Ready(Ok(())) if n > 0 => {
                    conn.input = Some(Input { bytes, at: 0, end: n });
                }
                Poll::Ready(result) => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "read failed");
                    }
                    hub.give_back(bytes);
                    conn.session.handle_eof(&mut hub.cx(role, limits, now));
                    conn.note_close();
                }
                Poll::Pending => {
                    hub.give_back(bytes);
                    conn.session.park(&mut hub.lot);
                    return Poll::Pending;
                }
            }
        }
    }
}

impl Hub {
    fn give_back(&mut self, bytes: Box<[u8]>) {
        self.reading -= 1;
        if self.spare.len() < SPARE_READ_BUFFERS {
            self.spare.push(bytes);
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// Parses read bytes until a message completes or they are used up (then the buffer goes
    /// back to the endpoint).
    fn parse(&mut self, hub: &mut Hub, now: Instant) -> Option<Message> {
        let input = self.input.as_mut()?;
        while input.at < input.end && self.close.is_none() {
            let cx = &mut hub.cx(self.role, self.limits, now);
            let (used, received) = self.session.receive(cx, &mut input.bytes[input.at..input.end]);
            input.at += used;
            let message = match received {
                None => None,
                Some(Received::Whole(kind, data)) => Some(Message::received(kind, data.to_vec())),
                Some(Received::Assembled(kind)) => {
                    let mut chain = self.session.take_message();
                    let mut data = Vec::with_capacity(chain.len());
                    chain.segments(&hub.pool).for_each(|s| data.extend_from_slice(s));
                    chain.clear(&mut hub.pool);
                    Some(Message::received(kind, data))
                }
            };
            if let Some(closed) = self.session.poll_close() {
                self.close = Some(close_event(&closed));
            }
            if message.is_some() {
                if input.at == input.end {
                    self.release_input(hub);
                }
                return message;
            }
        }
        self.release_input(hub);
        None
    }

    fn release_input(&mut self, hub: &mut Hub) {
        if let Some(input) = self.input.take() {
            hub.give_back(input.bytes);
        }
    }

    /// Keeps the session's close, once reported, for the reader.
    fn note_close(&mut self) {
        if let Some(closed) = self.session.poll_close() {
            self.close = Some(close_event(&closed));
        }
    }

    /// After a send or a close queued bytes: the reader writes them at its next turn (woken
    /// if it waits); without a reader they are written now, as far as the transport takes
    /// them.
    fn schedule_write(&mut self, hub: &mut Hub) {
        if self.session.buffered() == 0 || self.write_requested {
            return;
        }
        if let Some(reader) = &self.reader {
            self.write_requested = true;
            reader.wake_by_ref();
        } else if let Some(writer) = self.writers.first() {
            // A task waits in `writable` or `flush` with the transport's write interest.
            writer.wake_by_ref();
        } else {
            let _ = self.write(hub, &mut task::Context::from_waker(Waker::noop()));
        }
    }

    /// Writes the queued bytes in vectored writes until the queue is empty (`Ready`) or the
    /// transport would block (`Pending`, its write interest registered for `task`). Wakes
    /// the reader and writers at a watermark crossing. After the close handshake the
    /// server's writing side is shut down once everything is out (§7.1.1).
    fn write(&mut self, hub: &mut Hub, task: &mut task::Context<'_>) -> Poll<()> {
        self.write_requested = false;
        let mut result = Poll::Ready(());
        while self.session.buffered() > 0 {
            let written = {
                let mut iov = [IoSlice::new(&[]); IOV];
                let n = self.session.io_slices(&hub.pool, &mut iov);
                Pin::new(&mut self.io).poll_write_vectored(task, &iov[..n])
            };
            match written {
                Poll::Ready(Ok(n)) if n > 0 => self.session.consume(&mut hub.pool, n),
                Poll::Ready(result) => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "write failed");
                    }
                    let cx = &mut hub.cx(self.role, self.limits, Instant::default());
                    self.session.handle_eof(cx);
                    self.session.clear_queue(&mut hub.pool);
                    self.note_close();
                    self.wake_all();
                    break;
                }
                Poll::Pending => {
                    result = Poll::Pending;
                    break;
                }
            }
        }
        if result.is_ready() && Pin::new(&mut self.io).poll_flush(task).is_pending() {
            result = Poll::Pending;
        }
        if let Some(Writability::Writable) = self.session.take_writability() {
            self.wake_all();
        }
        if result.is_ready() {
            for writer in self.writers.drain(..) {
                writer.wake();
            }
            if self.session.state() == State::Closed && !self.shut_down && self.role == Role::Server
            {
                match Pin::new(&mut self.io).poll_shutdown(task) {
                    Poll::Ready(_) => self.shut_down = true,
                    Poll::Pending => result = Poll::Pending,
                }
            }
        }
        result
    }

    fn wake_all(&mut self) {
        if let Some(reader) = &self.reader {
            reader.wake_by_ref();
        }
        for writer in self.writers.drain(..) {
            writer.wake();
        }
    }
}

impl<S> Drop for Shared<S> {
    fn drop(&mut self) {
        let conn = self.conn.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut hub = self.endpoint.lock();
        conn.session.release(&mut hub.pool);
        if let Some(input) = conn.input.take() {
            hub.give_back(input.bytes);
        }
        hub.open -= 1;
    }
}

fn close_event(closed: &crate::session::Closed) -> CloseEvent {
    CloseEvent { code: closed.code, reason: closed.reason().to_owned(), was_clean: closed.clean }
}
