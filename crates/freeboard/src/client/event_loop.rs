//! The client on an event loop: many connections in one thread on mio, one chunk pool and one
//! read buffer for all of them; `ws://` and `wss://` over the clients' one [`ClientStream`].

use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant as StdInstant};

use freeboard_buf::{Pool, Writability};
use freeboard_proto::handshake::{DEFAULT_MAX_HEAD_LEN, Key};
use freeboard_proto::{CloseCode, Instant, MessageKind, Role, State};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use super::ClientStream;
use super::handshake::{self, Refusal};
use super::tls::{Connector, is_tls, tls_or_io};
use super::{ClientConfig, ClientError, CloseEvent, Target};
use crate::parking::{ParkingLot, ProtocolState};
use crate::session::deflate::{Codec, Deflate, NegotiationError};
use crate::session::{
    Assembly, Context, FairShare, MaskSource, Reassembly, Received, SendOutcome, Session,
};

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
    /// The connection's send queue drained to its low watermark after a send took it above
    /// its high watermark ([`PushOutcome::QueuedAboveHigh`](crate::PushOutcome)): producers
    /// may resume. Called after the write that drained it.
    fn on_writable(&mut self, conn: &mut LoopConn<'_>) {
        let _ = conn;
    }
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
/// come from one budget ([`ClientConfig::memory`]): a pool of chunks, and beside it the
/// contiguous copy of a message that arrived in pieces (up to `max_message_size` or a quarter
/// of the budget); watermarks and the slow-consumer policy apply per connection.
///
/// `wss://` runs TLS under the same loop: SNI and the server's name verified against
/// [`ClientConfig::tls_roots`] (the OS store, a CA file, or none with `insecure`). The TLS
/// handshake counts in the connect timeout until the upgrade request is handed to TLS, then
/// in the handshake timeout. The loop keeps one rustls configuration (built at the first
/// `wss://` connection), so later connections resume a session with a ticket. A connection's
/// TLS buffers are rustls' own (heap, up to 64 KiB of unsent records), not the pool's.
///
/// Deadlines (connect + handshake timeout, the core's close and keep-alive timers) are found
/// by a scan over the connections once per turn: O(connections) per turn.
pub struct ClientLoop<H> {
    poll: Poll,
    events: Events,
    pool: Pool<'static>,
    rbuf: Box<[u8]>,
    /// Messages that arrived in pieces, contiguous for the handler.
    assembly: Assembly,
    masks: MaskSource,
    /// Where idle connections' protocol state waits.
    lot: ParkingLot,
    /// What one connection may take from the pool while it is contended, as of the last turn.
    share: FairShare,
    /// permessage-deflate: one compressor per window and one decompressor for every
    /// connection (each asks for no context takeover both ways), drawn from the pool's budget.
    codec: Codec,
    sessions: Slab<Connecting>,
    config: ClientConfig,
    /// The TLS configuration of every `wss://` connection, built at the first.
    tls: Option<Connector>,
    start: StdInstant,
    handler: H,
}

/// A connection inside a callback (or from [`ClientLoop::conn`]).
pub struct LoopConn<'a> {
    id: ClientId,
    open: &'a mut Open,
    cx: Context<'a>,
}

/// One connection of the loop: its socket, and where its handshake stands.
struct Connecting {
    stream: ClientStream,
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
    session: Session,
    protocol: Option<String>,
    /// The close, once the session reported it.
    closed: Option<CloseEvent>,
}

impl<H: ClientHandler> ClientLoop<H> {
    /// A loop with the pool, read buffer and limits of `config` (its timeouts, headers and
    /// subprotocols apply to every connection).
    pub fn new(config: ClientConfig, handler: H) -> Result<Self, ClientError> {
        // A message that arrived in pieces is copied into one contiguous buffer for the
        // handler, drawn from the budget: keep room for it outside the chunks (as the server
        // does), else any message larger than a read would fail with 1009.
        config.check()?;
        let assembly_reserve = config.limits.max_message_size.min(config.memory / 4);
        let pool = config.receive_pool(config.memory, assembly_reserve)?;
        Ok(Self {
            share: FairShare::new(&pool, 1),
            poll: Poll::new()?,
            events: Events::with_capacity(1024),
            pool,
            rbuf: vec![0u8; config.read_buffer.max(1024)].into_boxed_slice(),
            assembly: Assembly::default(),
            masks: MaskSource::new(),
            lot: ParkingLot::new(config.limits.protocol()),
            codec: Codec::new(config.compression_threshold),
            sessions: Slab::new(),
            config,
            tls: None,
            start: StdInstant::now(),
            handler,
        })
    }

    /// Starts a connection to `url`.
    pub fn connect(&mut self, url: &str) -> Result<ClientId, ClientError> {
        self.connect_with(url, &[])
    }

    /// Starts a connection to `url` whose request carries `headers` besides the
    /// configuration's (a bearer token of its own, say).
    pub fn connect_with(
        &mut self,
        url: &str,
        headers: &[(String, String)],
    ) -> Result<ClientId, ClientError> {
        let target = Target::parse(url)?;
        let addr = (target.host(), target.port())
            .to_socket_addrs()
            .map_err(|source| ClientError::Resolve { host: target.host().to_owned(), source })?
            .next()
            .ok_or_else(|| ClientError::Resolve {
                host: target.host().to_owned(),
                source: io::Error::other("no address"),
            })?;
        self.open(&target, addr, headers)
    }

    /// Starts a connection to `url` at `addr`, an address its host was resolved to elsewhere
    /// (by a host event loop's asynchronous resolver, say): nothing here waits for name
    /// resolution. The request's `Host` and TLS's server name are the URL's host still.
    pub fn connect_to(
        &mut self,
        url: &str,
        addr: SocketAddr,
        headers: &[(String, String)],
    ) -> Result<ClientId, ClientError> {
        self.open(&Target::parse(url)?, addr, headers)
    }

    fn open(
        &mut self,
        target: &Target,
        addr: SocketAddr,
        headers: &[(String, String)],
    ) -> Result<ClientId, ClientError> {
        let tls = match (target.is_secure(), &self.tls) {
            (false, _) => None,
            (true, Some(connector)) => Some(connector.connect(target.host())?),
            (true, None) => {
                let connector = Connector::new(&self.config.tls_roots)?;
                let conn = connector.connect(target.host())?;
                self.tls = Some(connector);
                Some(conn)
            }
        };
        let tcp = TcpStream::connect(addr)
            .map_err(|source| ClientError::Connect { addr: addr.to_string(), source })?;
        let _ = tcp.set_nodelay(true);
        let mut stream = ClientStream::new(tcp, tls);
        let key = handshake::new_key()?;
        let offer = handshake::deflate_offer(&self.config, true);
        let request = match headers.is_empty() {
            true => handshake::encode_request(target, &self.config, &key, offer)?,
            false => {
                let mut config = self.config.clone();
                config.headers.extend_from_slice(headers);
                handshake::encode_request(target, &config, &key, offer)?
            }
        };
        let entry = self.sessions.vacant_entry();
        let id = entry.key();
        self.poll.registry().register(
            &mut stream,
            Token(id),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        let deadline = self.config.connect_timeout;
        entry.insert(Connecting {
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
            Some(Connecting { phase: Phase::Open(open), .. }) => Some(LoopConn {
                id,
                open,
                cx: Context {
                    pool: &mut self.pool,
                    lot: &mut self.lot,
                    masks: Some(&mut self.masks),
                    limits: &Reassembly::CLIENT,
                    share: &self.share,
                    codec: Some(&mut self.codec),
                    cork: None,
                    now,
                },
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
        self.share = FairShare::new(&self.pool, self.sessions.len());
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

    /// How long a host event loop that watches [`as_raw_fd`](std::os::fd::AsRawFd::as_raw_fd) may wait
    /// before it must [`turn`](Self::turn) anyway (a connect or handshake timeout, a close
    /// or keep-alive timer); `None` when nothing is due.
    pub fn timeout(&self) -> Option<Duration> {
        self.next_deadline()
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
                    .session
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
                            ClientError::HandshakeTimeout(self.config.limits.handshake_timeout)
                        };
                        self.fail(id, error);
                    }
                }
                Phase::Open(open) => {
                    if open.session.poll_timeout().is_some_and(|at| at <= core_now) {
                        let mut cx = Context {
                            pool: &mut self.pool,
                            lot: &mut self.lot,
                            masks: Some(&mut self.masks),
                            limits: &Reassembly::CLIENT,
                            share: &self.share,
                            codec: Some(&mut self.codec),
                            cork: None,
                            now: core_now,
                        };
                        open.session.handle_timeout(&mut cx);
                        open.note_close();
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
        let Self { sessions, rbuf, pool, assembly, masks, lot, share, codec, handler, .. } = self;
        let session = &mut sessions[id];
        while session.readable {
            let Phase::Open(open) = &mut session.phase else { return };
            if !open.session.wants_input() {
                break;
            }
            let mut parts = Parts {
                pool: &mut *pool,
                lot: &mut *lot,
                masks: &mut *masks,
                share,
                codec: &mut *codec,
                now,
            };
            match session.stream.read(rbuf) {
                Ok(n) if n > 0 => {
                    feed(ClientId(id), open, &mut rbuf[..n], parts, assembly, handler)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => session.readable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => {
                    // The end of the stream, or a failed socket.
                    session.readable = false;
                    open.session.handle_eof(&mut parts.cx());
                    open.note_close();
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
        if let Some(e) = session.stream.tcp().take_error()? {
            return Err(ClientError::Connect { addr: peer(&session.stream), source: e });
        }
        // Over TLS the request is handed to rustls at once (it sends it after its handshake);
        // the records that the handshake still owes go when the socket takes them.
        if session.writable && session.stream.wants_write() {
            match session.stream.flush_tls() {
                Ok(()) => {}
                Err(e) if is_would_block(&e) => session.writable = false,
                Err(e) => return Err(tls_or_io(e)),
            }
        }
        while session.writable && *sent < request.len() {
            match session.stream.write(&request[*sent..]) {
                Ok(n) => {
                    *sent += n;
                    if *sent == request.len() {
                        // Connected and asked: the handshake timeout starts.
                        session.deadline =
                            Some(StdInstant::now() + self.config.limits.handshake_timeout);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => session.writable = false,
                Err(e) if e.kind() == io::ErrorKind::NotConnected => session.writable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_tls(&e) => return Err(tls_or_io(e)),
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
                Err(e) => return Err(tls_or_io(e)),
            };
            response.extend_from_slice(&buf[..n]);
            let offer = handshake::deflate_offer(&self.config, true);
            match handshake::check_response(response, &self.config, key, offer) {
                Ok(None) if response.len() < DEFAULT_MAX_HEAD_LEN => continue,
                Ok(None) => unreachable!("check_response refuses heads over the limit"),
                Ok(Some((answer, head_len))) => {
                    // Both directions start every message afresh: nothing is drawn.
                    let deflate = match answer.compression {
                        Some(agreed) => Some(
                            Deflate::new(&mut self.pool, agreed, false)
                                .ok_or(ClientError::Compression(NegotiationError::NoMemory))?,
                        ),
                        None => None,
                    };
                    let mut leftover = response.split_off(head_len);
                    let now = Instant::from_millis(self.start.elapsed().as_millis() as u64);
                    session.deadline = None;
                    let ws = ProtocolState::new(Role::Client, self.lot.config(), now);
                    let queue = self.config.limits.send_queue();
                    let mut opened = Session::open(ws, queue);
                    if let Some(deflate) = deflate {
                        opened.set_deflate(*deflate);
                    }
                    let protocol = answer.protocol;
                    session.phase = Phase::Open(Open { session: opened, protocol, closed: None });
                    let Phase::Open(open) = &mut session.phase else { unreachable!() };
                    let mut parts = Parts {
                        pool: &mut self.pool,
                        lot: &mut self.lot,
                        masks: &mut self.masks,
                        share: &self.share,
                        codec: &mut self.codec,
                        now,
                    };
                    let id = ClientId(id);
                    self.handler.on_open(&mut LoopConn { id, open, cx: parts.cx() });
                    feed(id, open, &mut leftover, parts, &mut self.assembly, &mut self.handler);
                    return Ok(());
                }
                Err(Refusal::Status { status, head_len, reason, .. }) => {
                    let end = response.len().min(head_len + 512);
                    let body = String::from_utf8_lossy(&response[head_len..end]).into_owned();
                    return Err(ClientError::Refused { status, reason, body });
                }
                Err(Refusal::Invalid(e)) => return Err(ClientError::Handshake(e)),
                Err(Refusal::Compression(e)) => return Err(ClientError::Compression(e)),
            }
        }
        Ok(())
    }

    fn fail(&mut self, id: usize, error: ClientError) {
        let mut session = self.sessions.remove(id);
        let _ = self.poll.registry().deregister(&mut session.stream);
        self.handler.on_error(ClientId(id), error);
    }

    /// Writes every connection's queue that the socket will take: what was sent through
    /// [`conn`](Self::conn) since the last turn leaves now rather than at the next.
    pub fn flush_all(&mut self) {
        let ids: Vec<usize> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.stream.wants_write()
                    || matches!(&s.phase, Phase::Open(o) if o.session.buffered() > 0)
            })
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
        // What `on_writable` sends leaves in the same call, a few rounds at most (a producer
        // that refills the queue at each drain waits for the next turn after them).
        for _ in 0..4 {
            while session.writable && (open.session.buffered() > 0 || session.stream.wants_write())
            {
                let written = match open.session.buffered() {
                    // TLS records of earlier writes (or that reads asked for) wait alone.
                    0 => session.stream.flush_tls().map(|()| 0),
                    _ => {
                        let mut iov = [IoSlice::new(&[]); IOV];
                        let n = open.session.io_slices(&self.pool, &mut iov);
                        session.stream.write_vectored(&iov[..n])
                    }
                };
                match written {
                    Ok(n) => open.session.consume(&mut self.pool, n),
                    Err(e) if is_would_block(&e) => session.writable = false,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        let mut cx = Context {
                            pool: &mut self.pool,
                            lot: &mut self.lot,
                            masks: Some(&mut self.masks),
                            limits: &Reassembly::CLIENT,
                            share: &self.share,
                            codec: Some(&mut self.codec),
                            cork: None,
                            now: Instant::from_millis(self.start.elapsed().as_millis() as u64),
                        };
                        open.session.handle_eof(&mut cx);
                        open.note_close();
                        open.session.clear_queue(&mut self.pool);
                    }
                }
            }
            if open.session.take_writability() == Some(Writability::Writable) {
                let mut parts = Parts {
                    pool: &mut self.pool,
                    lot: &mut self.lot,
                    masks: &mut self.masks,
                    share: &self.share,
                    codec: &mut self.codec,
                    now: Instant::from_millis(self.start.elapsed().as_millis() as u64),
                };
                let id = ClientId(id);
                self.handler.on_writable(&mut LoopConn { id, open, cx: parts.cx() });
                open.note_close();
            } else {
                break;
            }
        }
        open.session.park(&mut self.lot);
    }

    /// Removes a connection whose close is over and whose output has left (or cannot).
    fn finish_if_closed(&mut self, id: usize) {
        let Some(session) = self.sessions.get_mut(id) else { return };
        let Phase::Open(open) = &mut session.phase else { return };
        let unsent = open.session.buffered() > 0 || session.stream.wants_write();
        if open.session.state() != State::Closed || (unsent && session.writable) {
            return;
        }
        let Some(close) = open.closed.take() else { return };
        let mut session = self.sessions.remove(id);
        if let Phase::Open(mut open) = session.phase {
            open.session.release(&mut self.pool);
        }
        let _ = self.poll.registry().deregister(&mut session.stream);
        self.handler.on_close(ClientId(id), close);
    }
}

impl<H> std::os::fd::AsRawFd for ClientLoop<H> {
    /// The loop's epoll descriptor, for a host event loop to watch (Python's asyncio, libuv):
    /// readable when a [`turn`](ClientLoop::turn) has work.
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.poll.as_raw_fd()
    }
}

impl<H> Drop for ClientLoop<H> {
    fn drop(&mut self) {
        for (_, session) in self.sessions.iter_mut() {
            if let Phase::Open(open) = &mut session.phase {
                open.session.release(&mut self.pool);
            }
        }
    }
}

impl Open {
    /// Keeps the session's close, once reported, for `on_close`.
    fn note_close(&mut self) {
        if let Some(closed) = self.session.poll_close() {
            let reason = closed.reason().to_owned();
            self.closed = Some(CloseEvent { code: closed.code, reason, was_clean: closed.clean });
        }
    }
}

impl<H> std::fmt::Debug for ClientLoop<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientLoop")
            .field("connections", &self.sessions.len())
            .field("chunks_in_use", &self.pool.counters().chunks_in_use)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for LoopConn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopConn")
            .field("id", &self.id)
            .field("buffered_amount", &self.buffered_amount())
            .finish_non_exhaustive()
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

    /// The permessage-deflate parameters the server agreed to, if it accepted the offer.
    pub fn compression(&self) -> Option<&crate::Agreement> {
        self.open.session.compression()
    }

    /// Bytes queued and not yet written (`bufferedAmount`). O(1).
    pub fn buffered_amount(&self) -> usize {
        self.open.session.buffered()
    }

    /// Queues a message copied from `payload` (masked on the way into pool chunks); it leaves
    /// with the connection's `writev` at the end of the turn. Returns what happened to it.
    pub fn send(&mut self, kind: MessageKind, payload: &[u8]) -> Result<SendOutcome, ClientError> {
        if self.open.session.state() != State::Open {
            return Err(ClientError::NotOpen(super::ReadyState::Closing));
        }
        let outcome = self.open.session.send(&mut self.cx, kind, payload);
        self.open.note_close();
        Ok(outcome.map_or(SendOutcome::Closed, SendOutcome::from))
    }

    /// Sends a text message.
    pub fn send_text(&mut self, text: &str) -> Result<SendOutcome, ClientError> {
        self.send(MessageKind::Text, text.as_bytes())
    }

    /// Starts the close handshake with `code` (1000, or 3000–4999 for applications) and
    /// `reason` (at most 123 bytes); the handler's `on_close` reports its end.
    pub fn close(&mut self, code: CloseCode, reason: &str) -> Result<(), ClientError> {
        if self.open.session.state() != State::Open {
            return Err(ClientError::NotOpen(super::ReadyState::Closing));
        }
        self.open.session.close(&mut self.cx, code, reason).map_err(ClientError::Usage)
    }
}

/// What a connection borrows from its loop while input is fed; a [`Context`] per call.
struct Parts<'p> {
    pool: &'p mut Pool<'static>,
    lot: &'p mut ParkingLot,
    masks: &'p mut MaskSource,
    share: &'p FairShare,
    codec: &'p mut Codec,
    now: Instant,
}

impl Parts<'_> {
    fn cx(&mut self) -> Context<'_> {
        Context {
            pool: self.pool,
            lot: self.lot,
            masks: Some(self.masks),
            limits: &Reassembly::CLIENT,
            share: self.share,
            codec: Some(self.codec),
            cork: None,
            now: self.now,
        }
    }
}

/// Feeds read bytes to a connection's session, calling the handler for each whole message.
fn feed<H: ClientHandler>(
    id: ClientId,
    open: &mut Open,
    data: &mut [u8],
    mut parts: Parts<'_>,
    assembly: &mut Assembly,
    handler: &mut H,
) {
    let mut at = 0;
    while at < data.len() && open.closed.is_none() {
        let (used, received) = open.session.receive(&mut parts.cx(), &mut data[at..]);
        at += used;
        let message = match received {
            None => None,
            // Whole in this read: delivered from the read buffer, no copy.
            Some(Received::Whole(kind, data)) => Some((kind, data)),
            Some(Received::Assembled(kind)) => {
                let chain = open.session.take_message();
                match assembly.fill(parts.pool, chain) {
                    Some(data) => Some((kind, data)),
                    None => {
                        let reason = "message exceeds the client's memory budget";
                        let code = CloseCode::MESSAGE_TOO_BIG;
                        let _ = open.session.close(&mut parts.cx(), code, reason);
                        None
                    }
                }
            }
        };
        if let Some((kind, data)) = message {
            handler.on_message(&mut LoopConn { id, open, cx: parts.cx() }, kind, data);
        }
        open.note_close();
    }
}

fn peer(stream: &ClientStream) -> String {
    stream.tcp().peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "the server".into())
}

/// `WouldBlock`, or `NotConnected` while a connect is in progress (a TLS write before it).
fn is_would_block(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::NotConnected)
}
