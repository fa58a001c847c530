//! The client on an event loop: many connections in one thread on mio, one chunk pool and one
//! read buffer for all of them.

use std::io::{self, IoSlice, Read, Write};
use std::mem;
use std::net::ToSocketAddrs;
use std::time::{Duration, Instant as StdInstant};

use freeboard_buf::{Budget, ChunkChain, Pool, PoolConfig, PushOutcome, Pushed, SendQueue};
use freeboard_proto::handshake::{DEFAULT_MAX_HEAD_LEN, Key};
use freeboard_proto::mask::apply_mask;
use freeboard_proto::{
    CloseCode, Config, Connection, Event as ProtoEvent, Instant, MessageKind, OpCode, Role, State,
};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use super::blocking::MaskSource;
use super::handshake::{self, Refusal};
use super::{ClientConfig, ClientError, CloseEvent, Target};

const IOV: usize = 64;

/// Identifies a connection of a [`ClientLoop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientId(pub usize);

/// What a [`ClientLoop`] calls as its connections make progress.
pub trait ClientHandler {
    /// The opening handshake succeeded.
    fn on_open(&mut self, conn: &mut LoopConn<'_>) {
        let _ = conn;
    }
    /// A whole message arrived. `data` is borrowed from the read buffer when the message came
    /// in one piece, else from a reassembly buffer; both are reused after the call.
    fn on_message(&mut self, conn: &mut LoopConn<'_>, kind: MessageKind, data: &[u8]);
    /// The connection closed (after `on_open`).
    fn on_close(&mut self, id: ClientId, close: CloseEvent) {
        let _ = (id, close);
    }
    /// The connection could not be opened.
    fn on_error(&mut self, id: ClientId, error: ClientError) {
        let _ = (id, error);
    }
}

/// Many client connections driven by one thread.
///
/// [`connect`](Self::connect) starts connections (name resolution blocks; TCP connect and the
/// handshake do not); [`turn`](Self::turn) waits for readiness once and runs the callbacks of
/// the [`ClientHandler`]; [`conn`](Self::conn) sends on a connection from outside a callback.
/// Each connection's output leaves in one `writev` per turn. All queued and reassembled bytes
/// come from one pool ([`ClientConfig::memory`]); watermarks and the slow-consumer policy
/// apply per connection.
///
/// Deadlines (connect + handshake timeout, the core's close and keep-alive timers) are found
/// by a scan over the connections once per turn: O(connections) per turn.
pub struct ClientLoop<H> {
    poll: Poll,
    events: Events,
    pool: Pool<'static>,
    rbuf: Box<[u8]>,
    message: Vec<u8>,
    scratch: Vec<u8>,
    masks: MaskSource,
    sessions: Slab<Session>,
    config: ClientConfig,
    start: StdInstant,
    handler: H,
}

/// A connection inside a callback (or from [`ClientLoop::conn`]).
pub struct LoopConn<'a> {
    id: ClientId,
    open: &'a mut Open,
    pool: &'a mut Pool<'static>,
    scratch: &'a mut Vec<u8>,
    masks: &'a mut MaskSource,
    now: Instant,
}

struct Session {
    stream: TcpStream,
    phase: Phase,
    readable: bool,
    writable: bool,
    deadline: Option<StdInstant>,
}

// The open state is the steady state of every connection: boxing it would add an allocation
// and an indirection per event to save 500 bytes during the handshake.
#[allow(clippy::large_enum_variant)]
enum Phase {
    Connecting { key: Key, request: Vec<u8>, sent: usize, response: Vec<u8> },
    Open(Open),
}

struct Open {
    conn: Connection,
    protocol: Option<String>,
    queue: SendQueue,
    assembly: ChunkChain,
    skipping: bool,
    closed: Option<CloseEvent>,
}

impl<H: ClientHandler> ClientLoop<H> {
    /// A loop with the pool, read buffer and limits of `config` (its timeouts, headers and
    /// subprotocols apply to every connection).
    pub fn new(config: ClientConfig, handler: H) -> Result<Self, ClientError> {
        let pool = Pool::new(
            Budget::new(config.memory),
            PoolConfig::new().with_chunk_size(config.chunk_size),
        )
        .map_err(|e| ClientError::Config(e.to_string()))?;
        Ok(Self {
            poll: Poll::new()?,
            events: Events::with_capacity(1024),
            pool,
            rbuf: vec![0u8; config.read_buffer.max(1024)].into_boxed_slice(),
            message: Vec::new(),
            scratch: Vec::new(),
            masks: MaskSource::new(),
            sessions: Slab::new(),
            config,
            start: StdInstant::now(),
            handler,
        })
    }

    /// Starts a connection to `url`.
    pub fn connect(&mut self, url: &str) -> Result<ClientId, ClientError> {
        let target = Target::parse(url)?;
        let addr = (target.host(), target.port())
            .to_socket_addrs()
            .map_err(|source| ClientError::Resolve { host: target.host().to_owned(), source })?
            .next()
            .ok_or_else(|| ClientError::Resolve {
                host: target.host().to_owned(),
                source: io::Error::other("no address"),
            })?;
        let mut stream = TcpStream::connect(addr)
            .map_err(|source| ClientError::Connect { addr: addr.to_string(), source })?;
        let key = handshake::new_key()?;
        let request = handshake::encode_request(&target, &self.config, &key)?;
        let entry = self.sessions.vacant_entry();
        let id = entry.key();
        self.poll.registry().register(
            &mut stream,
            Token(id),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        let deadline = self.config.connect_timeout;
        entry.insert(Session {
            stream,
            phase: Phase::Connecting { key, request, sent: 0, response: Vec::new() },
            readable: false,
            writable: false,
            deadline: Some(StdInstant::now() + deadline),
        });
        Ok(ClientId(id))
    }

    /// Connections opening or open.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no connection is left.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.handler
    }

    /// The handler, mutably.
    pub fn handler_mut(&mut self) -> &mut H {
        &mut self.handler
    }

    /// The shared pool (counters, chunks in use).
    pub fn pool(&self) -> &Pool<'static> {
        &self.pool
    }

    /// An open connection, to send on or close from outside a callback. Its output leaves at
    /// the next [`turn`](Self::turn).
    pub fn conn(&mut self, id: ClientId) -> Option<LoopConn<'_>> {
        let now = self.now();
        match self.sessions.get_mut(id.0) {
            Some(Session { phase: Phase::Open(open), .. }) => Some(LoopConn {
                id,
                open,
                pool: &mut self.pool,
                scratch: &mut self.scratch,
                masks: &mut self.masks,
                now,
            }),
            _ => None,
        }
    }

    /// Runs turns until `done` says so or no connection is left.
    pub fn run_until(&mut self, mut done: impl FnMut(&mut H) -> bool) -> Result<(), ClientError> {
        while !self.sessions.is_empty() && !done(&mut self.handler) {
            self.turn(Some(Duration::from_millis(100)))?;
        }
        Ok(())
    }

    /// Writes pending output, waits up to `timeout` for readiness or the next deadline, and
    /// runs what became ready.
    pub fn turn(&mut self, timeout: Option<Duration>) -> Result<(), ClientError> {
        self.flush_all();
        let timeout = match (timeout, self.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
        let ready: Vec<(usize, bool, bool)> = self
            .events
            .iter()
            .map(|e| {
                let r = e.is_readable() || e.is_read_closed() || e.is_error();
                let w = e.is_writable() || e.is_write_closed() || e.is_error();
                (e.token().0, r, w)
            })
            .collect();
        for (id, readable, writable) in ready {
            if let Some(session) = self.sessions.get_mut(id) {
                session.readable |= readable;
                session.writable |= writable;
                self.drive(id);
            }
        }
        self.run_timers();
        self.flush_all();
        Ok(())
    }

    fn now(&self) -> Instant {
        Instant::from_millis(self.start.elapsed().as_millis() as u64)
    }

    fn next_deadline(&self) -> Option<Duration> {
        let now = StdInstant::now();
        let core_now = self.now().as_millis();
        self.sessions
            .iter()
            .filter_map(|(_, s)| match &s.phase {
                Phase::Connecting { .. } => s.deadline.map(|d| d.saturating_duration_since(now)),
                Phase::Open(open) => open
                    .conn
                    .poll_timeout()
                    .map(|at| Duration::from_millis(at.as_millis().saturating_sub(core_now))),
            })
            .min()
    }

    fn run_timers(&mut self) {
        let now = StdInstant::now();
        let core_now = self.now();
        let ids: Vec<usize> = self.sessions.iter().map(|(id, _)| id).collect();
        for id in ids {
            let session = &mut self.sessions[id];
            match &mut session.phase {
                Phase::Connecting { request, sent, .. } => {
                    if session.deadline.is_some_and(|d| d <= now) {
                        let error = if *sent < request.len() {
                            ClientError::Connect {
                                addr: peer(&session.stream),
                                source: io::Error::new(
                                    io::ErrorKind::TimedOut,
                                    "connect timed out",
                                ),
                            }
                        } else {
                            ClientError::HandshakeTimeout(self.config.handshake_timeout)
                        };
                        self.fail(id, error);
                    }
                }
                Phase::Open(open) => {
                    if open.conn.poll_timeout().is_some_and(|at| at <= core_now) {
                        open.conn.handle_timeout(core_now);
                        drain_core(open, &mut self.pool, &mut self.masks);
                        self.finish_if_closed(id);
                    }
                }
            }
        }
    }

    /// Advances one connection after readiness.
    fn drive(&mut self, id: usize) {
        if matches!(self.sessions[id].phase, Phase::Connecting { .. }) {
            if let Err(e) = self.advance_handshake(id) {
                self.fail(id, e);
                return;
            }
            if matches!(self.sessions[id].phase, Phase::Connecting { .. }) {
                return;
            }
        }
        let now = self.now();
        let Self { sessions, rbuf, pool, message, scratch, masks, handler, .. } = self;
        let session = &mut sessions[id];
        while session.readable {
            let Phase::Open(open) = &mut session.phase else { return };
            if open.conn.state() == State::Closed {
                break;
            }
            match session.stream.read(rbuf) {
                Ok(0) => {
                    session.readable = false;
                    open.conn.handle_eof();
                    drain_core(open, pool, masks);
                }
                Ok(n) => {
                    let mut parts = Parts { pool, message, scratch, masks };
                    feed(ClientId(id), open, &mut rbuf[..n], &mut parts, handler, now);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => session.readable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    session.readable = false;
                    open.conn.handle_eof();
                    drain_core(open, pool, masks);
                }
            }
        }
        self.flush(id);
        self.finish_if_closed(id);
    }

    fn advance_handshake(&mut self, id: usize) -> Result<(), ClientError> {
        let session = &mut self.sessions[id];
        let Phase::Connecting { key, request, sent, response } = &mut session.phase else {
            return Ok(());
        };
        if let Some(e) = session.stream.take_error()? {
            return Err(ClientError::Connect { addr: peer(&session.stream), source: e });
        }
        while session.writable && *sent < request.len() {
            match session.stream.write(&request[*sent..]) {
                Ok(n) => {
                    *sent += n;
                    if *sent == request.len() {
                        // Connected and asked: the handshake timeout starts.
                        session.deadline = Some(StdInstant::now() + self.config.handshake_timeout);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => session.writable = false,
                Err(e) if e.kind() == io::ErrorKind::NotConnected => session.writable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(ClientError::Connect { addr: peer(&session.stream), source: e });
                }
            }
        }
        while session.readable && *sent == request.len() {
            let mut buf = [0u8; 4096];
            let n = match session.stream.read(&mut buf) {
                Ok(0) => return Err(handshake::eof_during_handshake()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    session.readable = false;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            response.extend_from_slice(&buf[..n]);
            match handshake::check_response(response, &self.config, key) {
                Ok(None) if response.len() < DEFAULT_MAX_HEAD_LEN => continue,
                Ok(None) => unreachable!("check_response refuses heads over the limit"),
                Ok(Some((protocol, head_len))) => {
                    let mut leftover = response.split_off(head_len);
                    let config = Config::builder()
                        .max_message_size(self.config.max_message_size as u64)
                        .close_timeout(self.config.close_timeout)
                        .pong_timeout(self.config.pong_timeout)
                        .ping_interval(self.config.ping_interval)
                        .build();
                    let now = Instant::from_millis(self.start.elapsed().as_millis() as u64);
                    session.deadline = None;
                    session.phase = Phase::Open(Open {
                        conn: Connection::new(Role::Client, config, now),
                        protocol,
                        queue: SendQueue::new(self.config.watermarks, self.config.policy),
                        assembly: ChunkChain::new(),
                        skipping: false,
                        closed: None,
                    });
                    let Phase::Open(open) = &mut session.phase else { unreachable!() };
                    let mut conn = LoopConn {
                        id: ClientId(id),
                        open,
                        pool: &mut self.pool,
                        scratch: &mut self.scratch,
                        masks: &mut self.masks,
                        now,
                    };
                    self.handler.on_open(&mut conn);
                    let mut parts = Parts {
                        pool: &mut self.pool,
                        message: &mut self.message,
                        scratch: &mut self.scratch,
                        masks: &mut self.masks,
                    };
                    feed(ClientId(id), open, &mut leftover, &mut parts, &mut self.handler, now);
                    return Ok(());
                }
                Err(Refusal::Status { status, head_len }) => {
                    let reason = handshake::reason_phrase(&response[..head_len]);
                    let end = response.len().min(head_len + 512);
                    let body = String::from_utf8_lossy(&response[head_len..end]).into_owned();
                    return Err(ClientError::Refused { status, reason, body });
                }
                Err(Refusal::Invalid(e)) => return Err(ClientError::Handshake(e)),
            }
        }
        Ok(())
    }

    fn fail(&mut self, id: usize, error: ClientError) {
        let mut session = self.sessions.remove(id);
        let _ = self.poll.registry().deregister(&mut session.stream);
        self.handler.on_error(ClientId(id), error);
    }

    /// Writes every connection's queue that the socket will take.
    fn flush_all(&mut self) {
        let ids: Vec<usize> = self
            .sessions
            .iter()
            .filter(|(_, s)| matches!(&s.phase, Phase::Open(o) if !o.queue.is_empty()))
            .map(|(id, _)| id)
            .collect();
        for id in ids {
            self.flush(id);
            self.finish_if_closed(id);
        }
    }

    fn flush(&mut self, id: usize) {
        let Some(session) = self.sessions.get_mut(id) else { return };
        let Phase::Open(open) = &mut session.phase else { return };
        while session.writable && !open.queue.is_empty() {
            let mut iov = [IoSlice::new(&[]); IOV];
            let n = open.queue.io_slices(&self.pool, &mut iov);
            match session.stream.write_vectored(&iov[..n]) {
                Ok(n) => {
                    let _ = open.queue.consume(&mut self.pool, n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => session.writable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    open.conn.handle_eof();
                    drain_core(open, &mut self.pool, &mut self.masks);
                    let _ = open.queue.clear(&mut self.pool);
                }
            }
        }
    }

    /// Removes a connection whose close is over and whose output has left (or cannot).
    fn finish_if_closed(&mut self, id: usize) {
        let Some(session) = self.sessions.get_mut(id) else { return };
        let Phase::Open(open) = &mut session.phase else { return };
        if open.conn.state() != State::Closed || (!open.queue.is_empty() && session.writable) {
            return;
        }
        let Some(close) = open.closed.take() else { return };
        let mut session = self.sessions.remove(id);
        if let Phase::Open(mut open) = session.phase {
            let _ = open.queue.clear(&mut self.pool);
            open.assembly.clear(&mut self.pool);
        }
        let _ = self.poll.registry().deregister(&mut session.stream);
        self.handler.on_close(ClientId(id), close);
    }
}

impl<H> Drop for ClientLoop<H> {
    fn drop(&mut self) {
        for (_, session) in self.sessions.iter_mut() {
            if let Phase::Open(open) = &mut session.phase {
                let _ = open.queue.clear(&mut self.pool);
                open.assembly.clear(&mut self.pool);
            }
        }
    }
}

impl LoopConn<'_> {
    /// This connection.
    pub fn id(&self) -> ClientId {
        self.id
    }

    /// The subprotocol the server chose.
    pub fn protocol(&self) -> Option<&str> {
        self.open.protocol.as_deref()
    }

    /// Bytes queued and not yet written (`bufferedAmount`). O(1).
    pub fn buffered_amount(&self) -> usize {
        self.open.queue.len()
    }

    /// Queues a message copied from `payload` (masked on the way into pool chunks); it leaves
    /// with the connection's `writev` at the end of the turn. Returns what happened to it.
    pub fn send(&mut self, kind: MessageKind, payload: &[u8]) -> Result<Pushed, ClientError> {
        if self.open.conn.state() != State::Open {
            return Err(ClientError::NotOpen(super::ReadyState::Closing));
        }
        let opcode = if kind == MessageKind::Text { OpCode::Text } else { OpCode::Binary };
        let mask = self.masks.next();
        let mut header = [0u8; 14];
        let n = self
            .open
            .conn
            .send_header(opcode, true, payload.len() as u64, Some(mask), &mut header)
            .map_err(|e| ClientError::Io(io::Error::other(e.to_string())))?;
        self.scratch.clear();
        self.scratch.extend_from_slice(payload);
        apply_mask(self.scratch, mask, 0);
        let pushed = self.open.queue.push_message(self.pool, &[&header[..n], self.scratch]);
        if self.scratch.capacity() > 64 << 10 {
            *self.scratch = Vec::new();
        }
        if let PushOutcome::MustClose { .. } = pushed.outcome {
            let _ = self.open.queue.discard_unsent(self.pool);
            let _ = self.open.conn.close(self.now, CloseCode::POLICY_VIOLATION, "send queue full");
            drain_core(self.open, self.pool, self.masks);
        }
        Ok(pushed)
    }

    /// Sends a text message.
    pub fn send_text(&mut self, text: &str) -> Result<Pushed, ClientError> {
        self.send(MessageKind::Text, text.as_bytes())
    }

    /// Starts the close handshake; the handler's `on_close` reports its end.
    pub fn close(&mut self, code: u16, reason: &str) -> Result<(), ClientError> {
        self.open.conn.close(self.now, CloseCode(code), reason).map_err(|e| {
            ClientError::Io(io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
        })?;
        drain_core(self.open, self.pool, self.masks);
        Ok(())
    }
}

/// The loop's shared buffers, borrowed together while input is fed.
struct Parts<'a> {
    pool: &'a mut Pool<'static>,
    message: &'a mut Vec<u8>,
    scratch: &'a mut Vec<u8>,
    masks: &'a mut MaskSource,
}

/// Feeds read bytes to a connection, calling the handler for each whole message.
fn feed<H: ClientHandler>(
    id: ClientId,
    open: &mut Open,
    data: &mut [u8],
    parts: &mut Parts<'_>,
    handler: &mut H,
    now: Instant,
) {
    let mut at = 0;
    while at < data.len() && open.closed.is_none() {
        let Ok(input) = open.conn.handle_input(now, &mut data[at..]) else {
            drain_core(open, parts.pool, parts.masks);
            return; // the core failed the connection and queued its close frame
        };
        at += input.consumed;
        if let Some(piece) = input.payload {
            let kind = piece.kind;
            if piece.message_start && piece.message_fin {
                // Whole in this read: delivered from the read buffer, no copy.
                let mut conn = LoopConn {
                    id,
                    open,
                    pool: parts.pool,
                    scratch: parts.scratch,
                    masks: parts.masks,
                    now,
                };
                handler.on_message(&mut conn, kind, piece.data);
            } else {
                if !open.skipping && open.assembly.append(parts.pool, piece.data).is_err() {
                    open.skipping = true;
                    open.assembly.clear(parts.pool);
                    let _ = open.conn.close(
                        now,
                        CloseCode::MESSAGE_TOO_BIG,
                        "message exceeds the client's memory budget",
                    );
                }
                if piece.message_fin && !mem::take(&mut open.skipping) {
                    parts.message.clear();
                    open.assembly
                        .segments(parts.pool)
                        .for_each(|s| parts.message.extend_from_slice(s));
                    open.assembly.clear(parts.pool);
                    let mut conn = LoopConn {
                        id,
                        open,
                        pool: parts.pool,
                        scratch: parts.scratch,
                        masks: parts.masks,
                        now,
                    };
                    handler.on_message(&mut conn, kind, parts.message);
                    if parts.message.capacity() > 1 << 20 {
                        *parts.message = Vec::new();
                    }
                }
            }
        }
        drain_core(open, parts.pool, parts.masks);
    }
}

/// Takes the core's events and queues the control frames it owes.
fn drain_core(open: &mut Open, pool: &mut Pool<'static>, masks: &mut MaskSource) {
    while let Some(event) = open.conn.poll_event() {
        if let ProtoEvent::Closed { code, reason, clean } = event {
            open.closed =
                Some(CloseEvent { code: code.0, reason: reason.to_owned(), was_clean: clean });
        }
    }
    let mut out = [0u8; 131];
    while let Ok(Some(n)) = open.conn.poll_transmit(Some(masks.next()), &mut out) {
        // Control frames may pass the cap by one frame; beyond that the peer is not reading
        // and the connection is failing anyway.
        let _ = open.queue.push_control(pool, &[&out[..n]]);
    }
}

fn peer(stream: &TcpStream) -> String {
    stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "the server".into())
}
