//! The blocking client: one connection, one thread, no runtime.

use std::io::{self, Read};
use std::mem;
use std::net::Shutdown;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use freeboard_buf::{
    Budget, ChunkChain, Counters, Limit, MAX_CONTROL_FRAME, Pool, PoolConfig, PushOutcome, Pushed,
};
use freeboard_proto::frame::MAX_HEADER_LEN;
use freeboard_proto::mask::apply_mask;
use freeboard_proto::{CloseCode, Connection, Instant, MessageKind, Role, State};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use super::ClientStream;
use super::handshake::{self, Heads, Opened};
use super::message::{CloseEvent, Event, ReceivedMessage};
use super::outbox::{Direct, Outbox, Shared, Writer};
use super::{ClientConfig, ClientError, ReadyState, Target};
use crate::session::deflate::{self, Agreement, Codec, Deflate, NegotiationError};
use crate::session::{
    Closed, MaskSource, Reassembler, Reassembly, Received, SendOutcome, queue_control,
};

/// The smallest message the send pool has a segment slot for at every byte of the cap:
/// smaller ones may be refused by the pool (`Limit::Pool`) before the cap is reached.
const SMALL_MESSAGE: usize = 64;
/// How long the client waits for the server to close TCP after the close handshake (§7.1.1:
/// the server closes first).
const LINGER: Duration = Duration::from_secs(1);
const SOCKET: Token = Token(0);

/// A blocking WebSocket client over one TCP connection.
///
/// Call order: [`send`](Self::send) (and friends) whenever; [`recv`](Self::recv) to get the
/// next message or the close event — it also answers pings and runs the timers.
/// [`close`](Self::close), then `recv` until [`Event::Closed`].
///
/// Who writes: by default a writer thread ([`ClientConfig::writer_thread`]), so a send only
/// queues and the bytes leave at once without further calls; what queues while the thread is
/// in the kernel leaves in its next write. Without the thread, each send writes on the
/// caller's thread (one system call per message) and what the socket does not take leaves at
/// the next send, [`flush`](Self::flush) or `recv`.
pub struct Client {
    stream: ClientStream,
    poll: Poll,
    events: Events,
    conn: Connection,
    start: StdInstant,
    protocol: Option<String>,
    /// The opening handshake's request and response heads.
    heads: Box<Heads>,
    masks: MaskSource,
    /// The send queue and its pool, shared with the writer thread.
    out: Arc<Shared>,
    /// `None`: the caller writes.
    writer: Option<Writer>,
    /// Edge-triggered write readiness not yet used up (when the caller writes).
    writable: bool,
    /// Holds the messages being reassembled and delivered.
    pool: Pool<'static>,
    close_timeout: Duration,
    /// Invariant: `rbuf[rpos..rlen]` are read bytes the core has not consumed yet.
    rbuf: Box<[u8]>,
    rpos: usize,
    rlen: usize,
    /// The message being reassembled.
    inbound: Reassembler,
    /// The last message handed out by `recv`, released at the next call.
    delivered: ChunkChain,
    /// Edge-triggered read readiness not yet used up.
    readable: bool,
    /// The close event, once the core reported it.
    closed: Option<CloseEvent>,
    close_reported: bool,
    /// permessage-deflate, when the server accepted the offer: the inflate window of a
    /// server that keeps its context (drawn from the receive pool's budget).
    deflate: Option<Box<Deflate>>,
    /// The compressor (this client keeps no context between messages) and the scratch a
    /// compressed message is written into; drawn from the receive pool's budget when first
    /// used.
    codec: Codec,
}

impl Client {
    /// Connects to `url` and completes the opening handshake.
    pub fn connect(url: &str, config: ClientConfig) -> Result<Self, ClientError> {
        let target = Target::parse(url)?;
        Self::connect_to(&target, config)
    }

    /// Connects to a parsed target.
    pub fn connect_to(target: &Target, config: ClientConfig) -> Result<Self, ClientError> {
        let (send_pool, mut pool) = pools(&config)?;
        let Opened { stream, tls, answer, leftover } = handshake::open(target, &config)?;
        let deflate = match answer.compression {
            Some(agreed) => Some(
                Deflate::new(&mut pool, agreed, false)
                    .ok_or(ClientError::Compression(NegotiationError::NoMemory))?,
            ),
            None => None,
        };
        stream.set_nonblocking(true)?;
        let out = Shared::new(Outbox::new(send_pool, config.limits.send_queue()));
        // Over TLS the caller writes: reading and writing share the TLS state.
        let writer = match config.writer_thread && tls.is_none() {
            true => Some(Writer::spawn(Arc::clone(&out), stream.try_clone()?)?),
            false => None,
        };
        let stream = TcpStream::from_std(stream);
        let mut stream = ClientStream::new(stream, tls);
        let poll = Poll::new()?;
        let interest = match writer {
            Some(_) => Interest::READABLE,
            None => Interest::READABLE | Interest::WRITABLE,
        };
        poll.registry().register(&mut stream, SOCKET, interest)?;

        let mut conn = Connection::new(Role::Client, config.limits.protocol(), Instant::default());
        if deflate.is_some() {
            // RFC 7692 §6: RSV1 marks a compressed message's first frame.
            conn.set_allowed_rsv(0b100);
        }
        let mut rbuf = vec![0u8; config.read_buffer.max(leftover.len()).max(1024)];
        rbuf[..leftover.len()].copy_from_slice(&leftover);
        Ok(Self {
            stream,
            poll,
            events: Events::with_capacity(4),
            conn,
            start: StdInstant::now(),
            protocol: answer.protocol,
            heads: Box::new(answer.heads),
            masks: MaskSource::new(),
            out,
            writer,
            writable: true,
            pool,
            close_timeout: config.limits.close_timeout,
            rbuf: rbuf.into_boxed_slice(),
            rpos: 0,
            rlen: leftover.len(),
            inbound: Reassembler::default(),
            delivered: ChunkChain::new(),
            readable: true,
            closed: None,
            close_reported: false,
            deflate,
            codec: Codec::new(config.compression_threshold),
        })
    }

    /// The browser's `readyState`.
    pub fn ready_state(&self) -> ReadyState {
        match self.conn.state() {
            State::Open => ReadyState::Open,
            State::CloseSent => ReadyState::Closing,
            State::Closed if self.close_reported => ReadyState::Closed,
            State::Closed => ReadyState::Closing,
        }
    }

    /// The subprotocol the server chose, if any.
    pub fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }

    /// The opening handshake as it went: the request's head and the `101` response's
    /// (`freeboard client -v` prints them).
    pub fn handshake(&self) -> &Heads {
        &self.heads
    }

    /// The permessage-deflate parameters the server agreed to, if it accepted the offer.
    pub fn compression(&self) -> Option<&Agreement> {
        self.deflate.as_ref().map(|d| &d.agreement)
    }

    /// Bytes sent but not yet handed to the socket (`bufferedAmount`), the writer thread's
    /// buffer included. O(1), and takes no lock.
    pub fn buffered_amount(&self) -> usize {
        self.out.buffered()
    }

    /// Whether the send queue is at or below its low watermark again after passing the high
    /// one (Netty's `isWritable`).
    pub fn is_writable(&self) -> bool {
        self.out.is_writable()
    }

    /// The send pool's counters: chunks in use and their high-water mark, drops by policy,
    /// refusals.
    pub fn send_counters(&self) -> Counters {
        self.out.lock().pool.counters()
    }

    /// The pool that holds received messages while they are reassembled and delivered.
    pub fn receive_pool(&self) -> &Pool<'static> {
        &self.pool
    }

    /// Sends a text message; see [`send`](Self::send).
    pub fn send_text(&mut self, text: &str) -> Result<SendOutcome, ClientError> {
        self.send(MessageKind::Text, text.as_bytes())
    }

    /// Sends a binary message; see [`send`](Self::send).
    pub fn send_binary(&mut self, data: &[u8]) -> Result<SendOutcome, ClientError> {
        self.send(MessageKind::Binary, data)
    }

    /// Queues a message copied from a borrowed slice and returns at once with what happened
    /// to it. The payload is masked as it is copied into pool chunks, under the watermarks
    /// and policy; when the caller writes and nothing is queued ahead of it, it is copied
    /// into a reused buffer instead, masked there and written from it.
    ///
    /// A message larger than the queue's cap cannot wait in the queue: `send` first waits
    /// until everything before it is handed to the socket, then it goes out from its own
    /// buffer.
    ///
    /// A `Text` payload must be UTF-8; it is the caller's promise (use
    /// [`send_text`](Self::send_text) to have the compiler check it).
    pub fn send(&mut self, kind: MessageKind, payload: &[u8]) -> Result<SendOutcome, ClientError> {
        self.send_masked(kind, Payload::Borrowed(payload))
    }

    /// Queues a message that moves `payload` without copying it when nothing is queued ahead
    /// of it: it is masked in place and written from its own buffer. Otherwise it is copied
    /// into pool chunks like [`send`](Self::send). If the policy refuses it, the buffer is
    /// dropped.
    pub fn send_owned(
        &mut self,
        kind: MessageKind,
        payload: Vec<u8>,
    ) -> Result<SendOutcome, ClientError> {
        self.send_masked(kind, Payload::Owned(payload))
    }

    /// Waits until everything sent has been handed to the socket (or `timeout` passes: then
    /// `Ok(false)`). Received messages stay buffered for [`recv`](Self::recv).
    pub fn flush(&mut self, timeout: Option<Duration>) -> Result<bool, ClientError> {
        let deadline = timeout.map(|t| StdInstant::now() + t);
        loop {
            self.kick()?;
            if self.buffered_amount() == 0 && !self.stream.wants_write() {
                return Ok(true);
            }
            let timeout = match deadline {
                Some(at) => match at.checked_duration_since(StdInstant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(false),
                },
                None => None,
            };
            if self.writer.is_none() {
                self.wait(timeout)?;
                continue;
            }
            let mut out = self.out.lock();
            if out.buffered() > 0 && out.failure().is_none() {
                out.flushing = true;
                out = out.wait_drained(timeout);
                out.flushing = false;
            }
        }
    }

    /// Starts the close handshake with `code` (1000, or 3000–4999 for applications) and
    /// `reason` (at most 123 bytes). Unsent messages stay queued ahead of the close frame.
    /// Returns at once; [`recv`](Self::recv) reports the close event.
    pub fn close(&mut self, code: CloseCode, reason: &str) -> Result<(), ClientError> {
        if self.conn.state() != State::Open {
            return Err(ClientError::NotOpen(self.ready_state()));
        }
        let now = self.now();
        self.conn.close(now, code, reason).map_err(ClientError::Usage)?;
        self.drain_core()?;
        self.kick()
    }

    /// Waits for the next message or the close event.
    pub fn recv(&mut self) -> Result<Event<'_>, ClientError> {
        match self.recv_timeout(None)? {
            Some(event) => Ok(event),
            None => unreachable!("recv without a timeout returns an event"),
        }
    }

    /// Waits at most `timeout` (`None`: forever) for the next message or the close event;
    /// `Ok(None)` when the time ran out.
    pub fn recv_timeout(
        &mut self,
        timeout: Option<Duration>,
    ) -> Result<Option<Event<'_>>, ClientError> {
        if self.close_reported {
            return Err(ClientError::AlreadyClosed);
        }
        self.delivered.clear(&mut self.pool);
        let deadline = timeout.map(|t| StdInstant::now() + t);
        let ready = loop {
            if let Some(kind) = self.parse_buffered()? {
                break Some(kind);
            }
            if self.closed.is_some() {
                break None;
            }
            self.kick()?;
            if self.readable {
                self.read()?;
                continue;
            }
            let timeout = match deadline {
                Some(at) => match at.checked_duration_since(StdInstant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(None),
                },
                None => None,
            };
            self.wait(timeout)?;
        };
        Ok(Some(match ready {
            Some(kind) => {
                Event::Message(ReceivedMessage { kind, chain: &self.delivered, pool: &self.pool })
            }
            None => Event::Closed(self.finish()),
        }))
    }

    fn check_open(&self) -> Result<(), ClientError> {
        match self.conn.state() {
            State::Open => Ok(()),
            _ => Err(ClientError::NotOpen(self.ready_state())),
        }
    }

    fn now(&self) -> Instant {
        Instant::from_millis(self.start.elapsed().as_millis() as u64)
    }

    /// Compresses `payload` when permessage-deflate is on and it is not under the
    /// threshold, then sends it.
    fn send_masked(
        &mut self,
        kind: MessageKind,
        payload: Payload<'_>,
    ) -> Result<SendOutcome, ClientError> {
        self.check_open()?;
        let compressed = match &mut self.deflate {
            Some(deflate) => deflate.compress(&mut self.pool, &mut self.codec, payload.bytes()),
            None => None,
        };
        let Some(compressed) = compressed else { return self.send_framed(kind, 0, payload) };
        let outcome = self.send_framed(kind, 0b100, Payload::Borrowed(&compressed));
        self.codec.put_scratch(compressed);
        outcome
    }

    /// Frames (with `rsv` on the frame: RSV1 for a compressed message) and masks
    /// `payload`, then hands it over straight or queues a copy.
    fn send_framed(
        &mut self,
        kind: MessageKind,
        rsv: u8,
        payload: Payload<'_>,
    ) -> Result<SendOutcome, ClientError> {
        let mask = self.masks.next();
        let mut header = [0; MAX_HEADER_LEN];
        let header_len = self
            .conn
            .message_header(kind, rsv, payload.bytes().len() as u64, Some(mask), &mut header)
            .map_err(ClientError::Usage)?;
        let mut out = self.out.lock();
        let oversized = header_len + payload.bytes().len() > out.queue.watermarks().cap();
        if oversized && !out.is_clear() {
            drop(out);
            self.flush(None)?;
            out = self.out.lock();
        }
        if let Some(e) = out.failure() {
            drop(out);
            return Err(self.transport_failed(e));
        }
        // Straight from a buffer of its own when nothing is queued: always when the caller
        // writes; with a writer thread only an owned buffer, or a message too large to queue.
        let owned = matches!(payload, Payload::Owned(_));
        let pushed = if out.is_clear() && (self.writer.is_none() || owned || oversized) {
            let (mut buffer, from_scratch) = match payload {
                Payload::Borrowed(bytes) => {
                    let mut buffer = mem::take(&mut out.scratch);
                    buffer.clear();
                    buffer.extend_from_slice(bytes);
                    (buffer, true)
                }
                Payload::Owned(buffer) => (buffer, false),
            };
            apply_mask(&mut buffer, mask, 0);
            out.direct = Some(Direct {
                header,
                header_len: header_len as u8,
                sent: 0,
                payload: buffer,
                from_scratch,
            });
            Pushed { outcome: PushOutcome::Queued, writability: None }
        } else {
            // Masked while it is copied into the chunks.
            let out = &mut *out;
            out.queue.push_message_with(
                &mut out.pool,
                &header[..header_len],
                payload.bytes(),
                |dst, src, offset| {
                    dst.copy_from_slice(src);
                    apply_mask(dst, mask, offset);
                },
            )
        };
        if let PushOutcome::MustClose { .. } = pushed.outcome {
            // The slow-consumer policy says the connection cannot keep up: 1008.
            let outbox = &mut *out;
            let _ = outbox.queue.discard_unsent(&mut outbox.pool);
            drop(out);
            let now = self.now();
            let _ = self.conn.close(now, CloseCode::POLICY_VIOLATION, "send queue full");
            self.drain_core()?;
            self.kick()?;
        } else if let Some(writer) = &self.writer {
            writer.kick(&mut out);
        } else {
            drop(out);
            self.write_queued()?;
        }
        Ok(pushed.outcome.into())
    }

    /// Gets queued bytes moving: wakes the writer thread, or writes on the caller's thread
    /// what the socket takes now.
    fn kick(&mut self) -> Result<(), ClientError> {
        let Some(writer) = &self.writer else { return self.write_queued() };
        let mut out = self.out.lock();
        match out.failure() {
            None => {
                writer.kick(&mut out);
                Ok(())
            }
            Some(e) => {
                drop(out);
                Err(self.transport_failed(e))
            }
        }
    }

    /// Writes as much as the socket takes now, without waiting (the caller writes).
    fn write_queued(&mut self) -> Result<(), ClientError> {
        if !self.writable && (self.buffered_amount() > 0 || self.stream.wants_write()) {
            // The last write hit a full socket buffer: ask (without waiting) whether it drained.
            self.poll_readiness(Some(Duration::ZERO))?;
        }
        while self.writable {
            if self.stream.wants_write() {
                match self.stream.flush_tls() {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.writable = false;
                        break;
                    }
                    Err(e) => return Err(self.transport_failed(e)),
                }
            }
            let mut out = self.out.lock();
            if out.buffered() == 0 {
                break;
            }
            match out.write_to(&mut self.stream) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.writable = false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    drop(out);
                    return Err(self.transport_failed(e));
                }
            }
        }
        Ok(())
    }

    /// The socket failed: the connection is over (1006).
    fn transport_failed(&mut self, e: io::Error) -> ClientError {
        self.conn.handle_eof();
        let _ = self.drain_core();
        self.rpos = self.rlen;
        ClientError::Io(e)
    }

    /// One non-blocking read into the (empty) read buffer.
    fn read(&mut self) -> Result<(), ClientError> {
        debug_assert_eq!(self.rpos, self.rlen);
        match self.stream.read(&mut self.rbuf) {
            Ok(0) => {
                self.readable = false;
                self.conn.handle_eof();
                self.drain_core()?;
            }
            Ok(n) => (self.rpos, self.rlen) = (0, n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.readable = false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                self.readable = false;
                self.conn.handle_eof();
                self.drain_core()?;
            }
        }
        Ok(())
    }

    /// Waits for readiness or the core's next deadline, then runs the timers.
    fn wait(&mut self, timeout: Option<Duration>) -> Result<(), ClientError> {
        let core = self
            .conn
            .poll_timeout()
            .map(|at| Duration::from_millis(at.as_millis().saturating_sub(self.now().as_millis())));
        let timeout = match (timeout, core) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.poll_readiness(timeout)?;
        let now = self.now();
        self.conn.handle_timeout(now);
        self.drain_core()
    }

    /// Waits up to `timeout` for socket readiness and records it.
    fn poll_readiness(&mut self, timeout: Option<Duration>) -> Result<(), ClientError> {
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
        for event in &self.events {
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                self.readable = true;
            }
            if event.is_writable() || event.is_write_closed() || event.is_error() {
                self.writable = true;
            }
        }
        Ok(())
    }

    /// Feeds buffered input to the core until a message completes, the connection closes or
    /// the input runs out. Returns the kind of a completed message, now in `delivered`.
    fn parse_buffered(&mut self) -> Result<Option<MessageKind>, ClientError> {
        while self.rpos < self.rlen && self.closed.is_none() {
            let now = self.now();
            let mut completed = None;
            match self.conn.handle_input(now, &mut self.rbuf[self.rpos..self.rlen]) {
                Err(_) => self.rpos = self.rlen, // the core failed the connection and queued its close
                Ok(input) => {
                    self.rpos += input.consumed;
                    let (pool, limits) = (&mut self.pool, &Reassembly::CLIENT);
                    // The client's pool is its own: no other connection to leave room for.
                    let room = |_: &Pool<'static>| usize::MAX;
                    let (inbound, conn, codec) =
                        (&mut self.inbound, &mut self.conn, &mut self.codec);
                    completed =
                        match input.payload.and_then(|piece| match self.deflate.as_deref_mut() {
                            Some(d) if piece.compressed => {
                                let codec = Some(&mut *codec);
                                deflate::receive(
                                    inbound, d, codec, pool, limits, room, now, conn, piece,
                                )
                            }
                            _ => inbound.piece(pool, limits, room, now, conn, piece),
                        }) {
                            // `recv` hands out pool chunks either way: a whole message is copied
                            // once, from the read buffer.
                            Some(Received::Whole(kind, data)) => {
                                match self.delivered.append(&mut self.pool, data) {
                                    Ok(()) => Some(kind),
                                    Err(_) => {
                                        self.delivered.clear(&mut self.pool);
                                        let limits = Reassembly::CLIENT;
                                        let _ = self.conn.close(now, limits.code, limits.reason);
                                        None
                                    }
                                }
                            }
                            Some(Received::Assembled(kind)) => {
                                self.delivered = self.inbound.take();
                                Some(kind)
                            }
                            None => None,
                        };
                }
            }
            self.drain_core()?;
            if completed.is_some() {
                return Ok(completed);
            }
        }
        Ok(None)
    }

    /// Takes the core's close event and queues the control frames it owes.
    fn drain_core(&mut self) -> Result<(), ClientError> {
        if let Some(closed) = Closed::poll(&mut self.conn) {
            let reason = closed.reason().to_owned();
            self.closed = Some(CloseEvent { code: closed.code, reason, was_clean: closed.clean });
        }
        if self.push_control().is_err() {
            // Control frames may pass the cap by one frame; make room by writing first.
            self.flush(Some(self.close_timeout))?;
            self.push_control().map_err(|limit| {
                ClientError::Io(io::Error::other(format!(
                    "no room for a control frame ({limit:?})"
                )))
            })?;
        }
        Ok(())
    }

    fn release_queue(&self) {
        let mut out = self.out.lock();
        let out = &mut *out;
        let _ = out.queue.clear(&mut out.pool);
    }

    fn push_control(&mut self) -> Result<(), Limit> {
        let mut out = self.out.lock();
        let out = &mut *out;
        // Writability is published by the outbox itself.
        queue_control(&mut self.conn, &mut out.queue, &mut out.pool, Some(&mut self.masks))
            .map(drop)
    }

    /// After the core closed: send what is owed (our close frame), wait briefly for the server
    /// to close TCP, and report the close event once.
    fn finish(&mut self) -> CloseEvent {
        self.close_reported = true;
        let _ = self.flush(Some(self.close_timeout));
        let deadline = StdInstant::now() + LINGER;
        let mut sink = [0u8; 4096];
        loop {
            match self.stream.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(StdInstant::now());
                    if left.is_zero() || self.poll.poll(&mut self.events, Some(left)).is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        self.writer = None; // stops the writer thread
        let _ = self.stream.shutdown(Shutdown::Both);
        self.release_queue();
        self.inbound.clear(&mut self.pool);
        // NOTE(unwrap): `finish` runs only once `closed` is set.
        self.closed.clone().unwrap()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.writer = None;
        self.release_queue();
        self.inbound.clear(&mut self.pool);
        self.delivered.clear(&mut self.pool);
        if let Some(deflate) = &mut self.deflate {
            deflate.release(&mut self.pool);
        }
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("ready_state", &self.ready_state())
            .field("buffered_amount", &self.buffered_amount())
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

/// A payload to send: borrowed (copied) or owned (moved).
enum Payload<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

impl Payload<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Payload::Borrowed(bytes) => bytes,
            Payload::Owned(buffer) => buffer,
        }
    }
}

/// The send pool, sized for the queue's cap (plus control frames past it, and a partly used
/// chunk at either end), and the receive pool, which gets the rest of `config.memory`.
fn pools(config: &ClientConfig) -> Result<(Pool<'static>, Pool<'static>), ClientError> {
    config.check()?;
    let chunk = config.chunk_size.max(1);
    let cap = config.limits.send_cap;
    let chunks = (cap + 2 * MAX_CONTROL_FRAME).div_ceil(chunk) + 2;
    let segments = (cap / SMALL_MESSAGE).max(chunks * 8);
    let per_chunk = segments.div_ceil(chunks);
    let send_config = PoolConfig::new()
        .with_chunk_size(chunk)
        .with_chunk_count(chunks)
        .with_segments_per_chunk(per_chunk);
    let send_bytes = Pool::footprint(chunk, chunks, chunks * per_chunk);
    let receive_bytes = config.memory.checked_sub(send_bytes).ok_or_else(|| {
        ClientError::Config(format!(
            "memory ({} bytes) is less than the send queue's pool ({send_bytes} bytes for a cap \
             of {cap})",
            config.memory
        ))
    })?;
    let invalid = |e: freeboard_buf::PoolConfigError| ClientError::Config(e.to_string());
    let send = Pool::new(Budget::new(send_bytes), send_config).map_err(invalid)?;
    Ok((send, config.receive_pool(receive_bytes, 0)?))
}
