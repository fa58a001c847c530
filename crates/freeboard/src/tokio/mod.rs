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
//!   [`Stream`](futures_core::Stream) of [`OwnedMessage`]s with the calls of its writer: the
//!   browser's calls — [`send`](WsWriter::send) reports at once what the queue did
//!   ([`SendOutcome`]), [`buffered_amount`](WsWriter::buffered_amount) is O(1),
//!   [`writable`](WsWriter::writable) waits for the low watermark — and pub/sub
//!   ([`subscribe`](WsWriter::subscribe), [`Endpoint::publish`]).
//!   [`split`](WebSocket::split) gives a [`WsReader`] and a cloneable [`WsWriter`], a
//!   [`Sink`](futures_sink::Sink) of messages.
//!
//! Who writes: a send only queues, copying the payload (masked for a client) into the
//! connection's cork while it holds one — from a read until the replies to it are written, as
//! the event loop corks — or else into pool chunks. The bytes leave in one write when the
//! connection is next polled —
//! by the reader (a reader waiting for input is woken for it; a reader busy in its loop writes
//! everything the loop queued in one write when it asks for the next message), by
//! [`flush`](WsWriter::flush) or [`writable`](WsWriter::writable), or, when no reader has
//! ever been polled (or its reader half was dropped), at once inside `send`. A task that
//! keeps the reader but stops polling it must `flush` what it sends. Timers (close timeout,
//! keep-alive) run while the reader is polled, as in every tokio WebSocket.
//!
//! Timers use tokio's time driver: build the runtime with it (`#[tokio::main]` and
//! `Builder::enable_all` do).
//!
//! Idle connections hold no read buffer and no cork: a connection takes a read buffer only
//! while the socket has bytes for it, and gives it back as soon as they are parsed (a buffer
//! stays with a connection only while messages it read wait for the application); its cork
//! goes back once the replies are written. Their protocol state parks in 24 bytes as on the
//! server. A received message's payload comes from spare buffers, and
//! [`send`](WsWriter::send) of an `OwnedMessage` gives its buffer back: an echo or a forward
//! allocates nothing per message. The spares are each worker thread's, so taking them needs
//! no lock: the common message and its reply take the connection's lock alone, and the
//! endpoint's only when the pool is needed (a queue past the cork, a message in pieces, a
//! publication, a close).
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage, WebSocket, WsConfig};
//! use futures_util::StreamExt;
//!
//! let endpoint = Endpoint::new(EndpointConfig::default()).expect("a valid budget");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let (stream, _) = listener.accept().await?;
//! let mut ws = WebSocket::accept(stream, &endpoint, &WsConfig::default()).await?;
//! while let Some(message) = ws.next().await {
//!     match message {
//!         OwnedMessage::Close(_) => break,
//!         message => {
//!             let _ = ws.send(message); // a SendOutcome: the queue's answer, or Closed
//!         }
//!     }
//! }
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{self, Poll, Waker, ready};

use ::tokio::io::{AsyncRead, AsyncWrite};
use ::tokio::time::Sleep;
use freeboard_proto::{CloseCode, Instant, MessageKind, Role, State, UsageError};

use crate::SendOutcome;
use crate::client::CloseEvent;
use crate::parking::ProtocolState;
use crate::session::{Cork, Session};

#[cfg(feature = "axum")]
pub mod axum;
mod driver;
mod endpoint;
mod fan_out;
mod handshake;
#[cfg(feature = "http2")]
pub mod http2;
mod spares;
#[cfg(feature = "axum")]
pub mod sse;

pub use crate::topics::{Reach, SubscribeError};
pub use endpoint::{Charge, Endpoint, EndpointCollector, EndpointConfig, WsConfig};
pub use handshake::AcceptError;

/// Slices gathered for one vectored write.
const IOV: usize = 64;

/// A payload to send: borrowed, or a received message's own buffer, kept for the next
/// message received once copied into the queue.
enum Payload<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

/// A whole received message, or the close that ends the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedMessage {
    /// A text message (validated UTF-8).
    Text(String),
    /// A binary message.
    Binary(Vec<u8>),
    /// The connection closed: the last item of the stream. Code 1006 if the transport ended
    /// before the close handshake.
    Close(CloseEvent),
}

impl OwnedMessage {
    /// The kind and bytes of a data message; `None` for `Close`.
    pub fn as_data(&self) -> Option<(MessageKind, &[u8])> {
        match self {
            OwnedMessage::Text(text) => Some((MessageKind::Text, text.as_bytes())),
            OwnedMessage::Binary(bytes) => Some((MessageKind::Binary, bytes)),
            OwnedMessage::Close(_) => None,
        }
    }

    /// The kind and bytes of a data message, taken; `None` for `Close`.
    fn into_data(self) -> Option<(MessageKind, Vec<u8>)> {
        match self {
            OwnedMessage::Text(text) => Some((MessageKind::Text, text.into_bytes())),
            OwnedMessage::Binary(bytes) => Some((MessageKind::Binary, bytes)),
            OwnedMessage::Close(_) => None,
        }
    }

    /// A message the session received: its text was validated once, by the core.
    fn received(kind: MessageKind, data: Vec<u8>) -> Self {
        match kind {
            MessageKind::Text => {
                debug_assert!(std::str::from_utf8(&data).is_ok(), "the core validates text");
                // SAFETY: the core validated this text as it streamed, whole frame or pieces
                // (§8.1: "When an endpoint is to interpret a byte stream as UTF-8 but finds
                // that the byte stream is not, in fact, a valid UTF-8 stream, that endpoint
                // MUST _Fail the WebSocket Connection_"), and delivers a text message only
                // once its last piece passed; this driver declines permessage-deflate, so no
                // text arrives compressed (validated after inflation, a layer up).
                OwnedMessage::Text(unsafe { String::from_utf8_unchecked(data) })
            }
            MessageKind::Binary => OwnedMessage::Binary(data),
        }
    }
}

impl From<String> for OwnedMessage {
    fn from(text: String) -> Self {
        OwnedMessage::Text(text)
    }
}

impl From<&str> for OwnedMessage {
    fn from(text: &str) -> Self {
        OwnedMessage::Text(text.to_owned())
    }
}

impl From<Vec<u8>> for OwnedMessage {
    fn from(bytes: Vec<u8>) -> Self {
        OwnedMessage::Binary(bytes)
    }
}

/// Why a [`Sink`](futures_sink::Sink) send or a close failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The connection is closing or closed.
    Closed,
    /// The message was a `Close`: close with [`WsWriter::close`], which takes a code.
    NotData,
    /// The protocol forbids the call (a close code that may not be sent, a reason over 123
    /// bytes).
    Usage(UsageError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Closed => f.write_str("the WebSocket is closing or closed"),
            Error::NotData => f.write_str("a Close is sent with WsWriter::close"),
            Error::Usage(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

/// A WebSocket connection over `S`, driven by freeboard's session; see the
/// [module docs](self). It is its [`WsReader`] (a [`Stream`](futures_core::Stream) of
/// messages) and its [`WsWriter`], whose calls it has through `Deref` (`send`, `writable`,
/// `subscribe`…); [`split`](Self::split) it for the writer's
/// [`Sink`](futures_sink::Sink).
pub struct WebSocket<S> {
    reader: WsReader<S>,
}

/// The reading half of a [`WebSocket`] ([`WebSocket::split`]): a stream of messages; it also
/// runs the connection's timers and writes what is queued when polled.
pub struct WsReader<S> {
    /// The connection, through the writer a `WebSocket` derefs to: one pointer, so the task
    /// of a handler that holds only its socket fits tokio's smallest task cell (128 bytes).
    writer: WsWriter<S>,
}

/// The sending half of a [`WebSocket`] ([`WebSocket::split`]); clone it for more producers.
/// A `WebSocket` has every call of its writer.
pub struct WsWriter<S> {
    shared: Arc<Shared<S>>,
}

/// One connection: its state behind a lock both halves take for the length of one call
/// (never across an `.await`), and the endpoint it draws from. A call takes the endpoint's
/// lock too only when it needs the pool (`driver::Turn`); lock order: `conn`, then the
/// endpoint's hub.
struct Shared<S> {
    endpoint: Arc<Endpoint>,
    conn: Mutex<Conn<S>>,
}

struct Conn<S> {
    io: S,
    session: Session,
    role: Role,
    /// Read bytes not yet parsed, in a buffer lent by the endpoint. `None` when idle.
    input: Option<Input>,
    /// The replies to what was read, framed back to back while the send queue is empty and
    /// written in one write when the reader next waits (the event loop's cork), lent by the
    /// endpoint from a read until that write. `None` when idle.
    cork: Option<Box<Cork>>,
    /// The close the session reported, until the reader takes it (boxed: rare, and the
    /// connection's state is what an idle connection costs).
    close: Option<Box<CloseEvent>>,
    /// The close was delivered: the stream has ended.
    ended: bool,
    /// Our writing side is shut down (after the close handshake).
    shut_down: bool,
    /// When the bytes being parsed were read: the session's time for them, and for sends
    /// (which do not read it). One clock read per read, not two per message.
    read_at: Instant,
    /// The task reading, if a reader was ever polled: woken to write what sends queued.
    reader: Option<Waker>,
    /// The reader's last poll ended `Pending`: it waits for input (or for room) and must be
    /// woken to write what a send queued.
    reader_waits: bool,
    /// The reader was woken to write and has not yet.
    write_requested: bool,
    /// What few connections use, boxed once one does: a connection's state is most of what
    /// an idle one costs.
    rare: Option<Box<Rare>>,
}

/// The parts of a connection's state that most connections never use.
#[derive(Default)]
struct Rare {
    /// The subprotocol agreed in the handshake.
    protocol: Option<Box<str>>,
    /// The session's next deadline, armed while it has one.
    timer: Option<Pin<Box<Sleep>>>,
    /// Tasks waiting in `writable` or `flush`.
    writers: Vec<Waker>,
    /// The connection's key among the endpoint's subscribers, once it subscribed.
    token: Option<usize>,
    /// Messages the [`Sink`](futures_sink::Sink) accepted and the `block` policy refused
    /// (`WouldBlock`), oldest first: sent before anything else the Sink or
    /// [`send_async`](WsWriter::send_async) sends. Invariant: at most one per writer that
    /// passed `poll_ready` since it was last emptied (one for a single producer).
    held: VecDeque<(MessageKind, Vec<u8>)>,
    /// The connection's key among the endpoint's tasks waiting for pool room, while it may
    /// have one there.
    room_slot: Option<usize>,
}

/// Read bytes `bytes[at..end]` waiting to be parsed.
struct Input {
    bytes: Box<[u8]>,
    /// Invariant: `at <= end <= bytes.len()` (a read buffer is far below 4 GiB).
    at: u32,
    end: u32,
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
        Self::open(io, endpoint, config, Role::Server, protocol)
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
        Self::open(io, endpoint, config, Role::Client, protocol)
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
            let mut bytes = if leftover.len() <= endpoint.read_buffer {
                spares::read_buffer(endpoint.read_buffer)
            } else {
                vec![0u8; leftover.len()].into_boxed_slice()
            };
            bytes[..leftover.len()].copy_from_slice(&leftover);
            endpoint.reading.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            conn.input = Some(Input { bytes, at: 0, end: leftover.len() as u32 });
        }
        Ok(ws)
    }

    fn open(
        io: S,
        endpoint: &Arc<Endpoint>,
        config: &WsConfig,
        role: Role,
        protocol: Option<String>,
    ) -> Self {
        let now = endpoint.now();
        let ws = ProtocolState::new(role, &endpoint.protocol, now);
        let queue = endpoint.send_queue(config);
        endpoint.lock().count_open(1);
        let conn = Conn {
            io,
            session: Session::open(ws, queue),
            role,
            input: None,
            cork: None,
            close: None,
            read_at: now,
            ended: false,
            shut_down: false,
            reader: None,
            reader_waits: false,
            write_requested: false,
            rare: protocol.map(|protocol| {
                Box::new(Rare { protocol: Some(protocol.into_boxed_str()), ..Rare::default() })
            }),
        };
        let shared = Arc::new(Shared { endpoint: Arc::clone(endpoint), conn: Mutex::new(conn) });
        Self { reader: WsReader { writer: WsWriter { shared } } }
    }

    /// Splits the connection into a reader (a stream of messages) and a writer (cloneable);
    /// the connection lives until both are dropped.
    pub fn split(self) -> (WsReader<S>, WsWriter<S>) {
        let writer = self.reader.writer.clone();
        (self.reader, writer)
    }

    /// The next message; `OwnedMessage::Close` is the last one, then `None`.
    pub async fn recv(&mut self) -> Option<OwnedMessage> {
        self.reader.recv().await
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsReader<S> {
    /// The next message; `OwnedMessage::Close` is the last one, then `None`.
    pub async fn recv(&mut self) -> Option<OwnedMessage> {
        poll_fn(|task| self.writer.shared.poll_recv(task)).await
    }

    /// Puts the halves back together; `Err` gives them back if they are not of one
    /// connection.
    pub fn reunite(self, writer: WsWriter<S>) -> Result<WebSocket<S>, (Self, WsWriter<S>)> {
        if writer.same_connection(&self.writer) {
            Ok(WebSocket { reader: self })
        } else {
            Err((self, writer))
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsWriter<S> {
    /// Queues a message (copied into the cork or pool chunks; its buffer is kept for a
    /// message received later) and says what the queue did with it, as a
    /// [`SendOutcome::Queue`] of `Queued`, `QueuedAboveHigh` (slow down: await
    /// [`writable`](Self::writable)), `Dropped` (the policy dropped it or older ones; counted)
    /// or `WouldBlock` (the `block` policy: not queued, retry after `writable`); or
    /// `Closed`. A `Close` message is `Closed`.
    pub fn send(&self, message: OwnedMessage) -> SendOutcome {
        match message.into_data() {
            Some((kind, payload)) => self.shared.send(kind, Payload::Owned(payload)),
            None => SendOutcome::Closed,
        }
    }

    /// Sends a message, waiting (without spinning) while the `block` slow-consumer policy
    /// refuses it: for the queue to drain below its cap
    /// ([`Limit::Cap`](crate::Limit::Cap)), or for the endpoint's pool to have room
    /// again ([`Limit::Pool`](crate::Limit::Pool): woken when another connection's
    /// chunks come back). Meanwhile it writes the connection's queue itself, as
    /// [`writable`](Self::writable) does. It returns the final outcome, never `WouldBlock`:
    /// `Queued`; `QueuedAboveHigh` (queued; the peer is behind: await
    /// [`writable`](Self::writable) before producing more); `Dropped` under a drop policy
    /// (counted); or `Closed` if the connection closed before the message could be queued
    /// (a `Close` message is `Closed` too). A message the [`Sink`](futures_sink::Sink)
    /// holds goes first. Dropping the future gives up the send; it leaves nothing
    /// registered.
    pub async fn send_async(&self, message: OwnedMessage) -> SendOutcome {
        let Some((kind, payload)) = message.into_data() else { return SendOutcome::Closed };
        let mut wait = driver::SendWait::new(&self.shared, kind, payload);
        poll_fn(|task| wait.poll(task)).await
    }

    /// Queues a text message; see [`send`](Self::send).
    pub fn send_text(&self, text: &str) -> SendOutcome {
        self.shared.send(MessageKind::Text, Payload::Borrowed(text.as_bytes()))
    }

    /// Queues a binary message; see [`send`](Self::send).
    pub fn send_binary(&self, data: &[u8]) -> SendOutcome {
        self.shared.send(MessageKind::Binary, Payload::Borrowed(data))
    }

    /// Bytes queued and not yet written (`bufferedAmount`). O(1).
    pub fn buffered_amount(&self) -> usize {
        self.shared.lock().buffered()
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
        self.shared.lock().rare.as_ref()?.protocol.as_deref().map(str::to_owned)
    }

    /// The endpoint this connection draws from.
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.shared.endpoint
    }

    /// Whether `other` sends on the same connection.
    pub fn same_connection(&self, other: &WsWriter<S>) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl<S> std::ops::Deref for WebSocket<S> {
    type Target = WsWriter<S>;

    fn deref(&self) -> &WsWriter<S> {
        &self.reader.writer
    }
}

impl<S> Clone for WsWriter<S> {
    fn clone(&self) -> Self {
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl<S> Drop for WsReader<S> {
    fn drop(&mut self) {
        // Nobody reads any more: the next send writes for itself, with what waits (the cork's
        // replies too, moved into the queue).
        let shared = &self.writer.shared;
        let mut conn = shared.lock();
        conn.reader = None;
        conn.write_requested = false;
        conn.uncork(&mut driver::Turn::new(&shared.endpoint), Ok(0), false);
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> futures_core::Stream for WebSocket<S> {
    type Item = OwnedMessage;

    fn poll_next(self: Pin<&mut Self>, task: &mut task::Context<'_>) -> Poll<Option<OwnedMessage>> {
        self.reader.writer.shared.poll_recv(task)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> futures_core::Stream for WsReader<S> {
    type Item = OwnedMessage;

    fn poll_next(self: Pin<&mut Self>, task: &mut task::Context<'_>) -> Poll<Option<OwnedMessage>> {
        self.writer.shared.poll_recv(task)
    }
}

/// The `Sink` of the futures ecosystem, on the writer half ([`WebSocket::split`]). No message
/// it accepts is lost silently:
/// - `start_send` queues the message. If the `block` policy refuses it (`WouldBlock`, at the
///   cap or for want of pool room), the connection holds it instead and `start_send` still
///   returns `Ok`; messages held go out first, in order, before anything sent after them
///   through the Sink or [`send_async`](WsWriter::send_async) (not before a plain
///   [`send`](WsWriter::send), which answers at once). A message a drop policy drops is not
///   an error: it is counted, as [`send`](WsWriter::send) reports it.
/// - `poll_ready` sends the held messages, waiting (without spinning) for the queue to
///   drain or the pool to have room, then waits for the queue to be writable (at or under its
///   low watermark).
/// - `poll_flush` sends the held messages the same way, then writes everything queued.
/// - `poll_close` sends the held messages, closes with 1000 and writes everything.
///
/// Each returns `Err(Error::Closed)` if the connection closed while messages were held: they
/// could not be sent, and that error is how the producer hears of it. A writer dropped
/// without a flush leaves its held messages to the next `poll_ready`, `poll_flush`,
/// `poll_close` or `send_async` on the connection.
impl<S: AsyncRead + AsyncWrite + Unpin> futures_sink::Sink<OwnedMessage> for WsWriter<S> {
    type Error = Error;

    fn poll_ready(self: Pin<&mut Self>, task: &mut task::Context<'_>) -> Poll<Result<(), Error>> {
        ready!(self.shared.poll_held(task))?;
        self.shared.poll_writable(task, false).map(|()| self.shared.open_or_closed())
    }

    fn start_send(self: Pin<&mut Self>, message: OwnedMessage) -> Result<(), Error> {
        let (kind, payload) = message.into_data().ok_or(Error::NotData)?;
        self.shared.send_or_hold(kind, payload)
    }

    fn poll_flush(self: Pin<&mut Self>, task: &mut task::Context<'_>) -> Poll<Result<(), Error>> {
        ready!(self.shared.poll_held(task))?;
        self.shared.poll_writable(task, true).map(Ok)
    }

    fn poll_close(self: Pin<&mut Self>, task: &mut task::Context<'_>) -> Poll<Result<(), Error>> {
        ready!(self.shared.poll_held(task))?;
        if self.shared.lock().session.state() == State::Open {
            self.shared.close(CloseCode::NORMAL, "")?;
        }
        self.shared.poll_writable(task, true).map(Ok)
    }
}

impl<S> std::fmt::Debug for WebSocket<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt("WebSocket", f)
    }
}

impl<S> std::fmt::Debug for WsReader<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.writer.shared.fmt("WsReader", f)
    }
}

impl<S> std::fmt::Debug for WsWriter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt("WsWriter", f)
    }
}

#[cfg(test)]
mod tests {
    use ::tokio::net::TcpStream;

    use super::*;

    /// What an idle connection costs the driver: its `Shared` (one allocation, 280 bytes
    /// with the `Arc`'s counts), and the socket its handler's task holds. The socket is one
    /// pointer, so a handler that holds only it across its `await` fits tokio's smallest task
    /// cell, 128 bytes (two pointers made it 256).
    #[test]
    fn idle_connection_state_stays_small() {
        assert_eq!(size_of::<WebSocket<TcpStream>>(), size_of::<usize>());
        assert_eq!(size_of::<WsReader<TcpStream>>(), size_of::<usize>());
        let conn = size_of::<Conn<TcpStream>>() - size_of::<TcpStream>();
        assert!(conn <= 200, "Conn is {conn} bytes beside its stream");
    }
}
