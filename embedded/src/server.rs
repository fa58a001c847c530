//! The echo server: one [`Slot`] per TCP socket, each driving freeboard's sans-IO
//! [`Connection`] over a smoltcp socket, with every outgoing byte queued in a [`SendQueue`] of
//! the shared [`Pool`].
//!
//! # Where the bytes live
//!
//! - **Receive**: frames are parsed and unmasked *in place* in the socket's receive ring
//!   (`tcp::Socket::recv` lends its contiguous part); a payload piece is echoed from there as a
//!   frame of its own, so a message of any length streams through without being reassembled.
//! - **Send**: every outgoing byte (the 101 response, echoed frames, pongs, close frames) is
//!   copied into the connection's [`SendQueue`] in pool chunks, then into the socket's transmit
//!   ring as it has room.
//!
//! # Bounds
//!
//! A connection reads only while its queue is below the high watermark and holds fewer than
//! [`MESSAGE_LIMIT`] messages, and reads at most [`READ_LIMIT`] bytes and [`PIECES_PER_READ`]
//! pieces per turn. An echoed frame's header is never longer than the received one (the server
//! sends unmasked), so a queue never holds more than `high + READ_LIMIT` bytes plus one control
//! frame. Each open connection reserves the chunks and segments that bound needs; an upgrade
//! the pool cannot cover is answered 503. Should a push fail anyway, the connection is closed
//! with 1013 (Try Again Later), or reset when not even the close frame fits: never corrupted.

use core::fmt::Write as _;

use freeboard_buf::{Pool, PushOutcome, SendQueue, SlowConsumerPolicy, Watermarks};
use freeboard_proto::handshake::{EMPTY_HEADER, Request};
use freeboard_proto::http;
use freeboard_proto::{
    CloseCode, Config, Connection, Event, Instant, MessageKind, OpCode, Role, State,
};
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp;

use crate::profile::{
    CHUNK_SIZE, HEAD_LIMIT, PIECES_PER_READ, QUEUE_HIGH, QUEUE_LOW, READ_LIMIT, RESERVE_CHUNKS,
    RESERVE_SEGMENTS, SOCKETS,
};

/// The TCP port the server listens on.
pub const PORT: u16 = 80;
/// A queue holding this many messages stops reading (bounds its segment slots).
pub const MESSAGE_LIMIT: u32 = (RESERVE_SEGMENTS - RESERVE_CHUNKS - PIECES_PER_READ - 2) as u32;
/// How long an opening handshake may take.
const HANDSHAKE_TIMEOUT_US: u64 = 10_000_000;
/// How long a closing socket may linger before it is reset.
const LINGER_US: u64 = 5_000_000;

/// Every echoed message is at most this large (the stream needs no reassembly, so this only
/// follows the RFC's 63-bit length; the Autobahn suite sends 16 MiB).
const CONFIG: Config = Config::builder().max_frame_size(1 << 40).max_message_size(1 << 40).build();

/// Counters printed on the serial console and served at `GET /stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// TCP connections accepted.
    pub accepted: u32,
    /// WebSocket upgrades answered 101.
    pub upgraded: u32,
    /// Upgrades refused with 503 because the pool could not cover the reserve.
    pub refused_busy: u32,
    /// Other refused or malformed handshakes (4xx).
    pub refused_bad: u32,
    /// WebSocket connections ended (any way).
    pub closed: u32,
    /// Connections closed with 1013 because a push failed.
    pub closed_pool: u32,
    /// Most WebSocket connections open at once.
    pub open_high_water: u32,
    /// Whole messages echoed.
    pub messages: u64,
    /// Payload bytes echoed.
    pub bytes: u64,
}

/// What a slot is doing.
#[allow(
    clippy::large_enum_variant,
    reason = "no heap to box into; every slot must be able to hold an open connection anyway"
)]
enum Phase {
    /// The socket listens.
    Listening,
    /// Reading the opening handshake since `since` (µs).
    Handshake { since: u64 },
    /// A WebSocket connection.
    Open(Connection),
    /// Sending the last queued bytes, then FIN; reset after `since + LINGER_US`.
    Closing { since: u64, fin_sent: bool },
}

/// One TCP socket and the WebSocket connection on it.
struct Slot {
    socket: SocketHandle,
    phase: Phase,
    /// Invariant: empty while `Listening`.
    queue: SendQueue,
    /// Whether this slot holds a reservation of `RESERVE_CHUNKS` chunks.
    reserved: bool,
}

/// Static bytes of one slot: its phase (with the protocol state) and send queue header.
pub const SLOT_BYTES: usize = core::mem::size_of::<Slot>();

/// The server: its slots, the pool and the counters.
pub struct Server {
    slots: [Slot; SOCKETS],
    pool: Pool<'static>,
    /// Chunks reserved by open connections. Invariant: `<= pool.chunks_total()`.
    reserved_chunks: usize,
    /// Segment slots reserved by open connections.
    reserved_segments: usize,
    open: u32,
    /// The counters.
    pub stats: Stats,
}

impl Server {
    /// A server over `sockets` (one per slot, not yet listening) and `pool`.
    pub fn new(sockets: [SocketHandle; SOCKETS], pool: Pool<'static>) -> Self {
        let watermarks = Watermarks::new(QUEUE_LOW, QUEUE_HIGH, QUEUE_HIGH + READ_LIMIT)
            // NOTE(unwrap): the profile's constants satisfy low <= high <= cap.
            .unwrap();
        Self {
            slots: sockets.map(|socket| Slot {
                socket,
                phase: Phase::Listening,
                queue: SendQueue::new(watermarks, SlowConsumerPolicy::Block),
                reserved: false,
            }),
            pool,
            reserved_chunks: 0,
            reserved_segments: 0,
            open: 0,
            stats: Stats::default(),
        }
    }

    /// Runs every slot once after the interface was polled at `now_us`. Returns whether
    /// anything moved (the caller polls again at once instead of sleeping), and the earliest
    /// protocol deadline.
    pub fn service(&mut self, sockets: &mut SocketSet<'_>, now_us: u64) -> (bool, Option<u64>) {
        let mut busy = false;
        let mut deadline: Option<u64> = None;
        for i in 0..SOCKETS {
            let socket = sockets.get_mut::<tcp::Socket<'_>>(self.slots[i].socket);
            busy |= self.service_slot(i, socket, now_us);
            let slot_deadline = match &self.slots[i].phase {
                Phase::Open(conn) => conn.poll_timeout().map(|at| at.as_millis() * 1000),
                Phase::Handshake { since } => Some(since + HANDSHAKE_TIMEOUT_US),
                Phase::Closing { since, .. } => Some(since + LINGER_US),
                Phase::Listening => None,
            };
            deadline = match (deadline, slot_deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        (busy, deadline)
    }

    fn service_slot(&mut self, i: usize, socket: &mut tcp::Socket<'_>, now_us: u64) -> bool {
        let now = Instant::from_millis(now_us / 1000);
        let mut busy = self.flush(i, socket);
        match &mut self.slots[i].phase {
            Phase::Listening => {
                if socket.is_active() {
                    self.stats.accepted += 1;
                    self.slots[i].phase = Phase::Handshake { since: now_us };
                    busy = true;
                } else if !socket.is_open() {
                    // NOTE(unwrap): a closed socket may always listen on a non-zero port.
                    socket.listen(PORT).unwrap();
                }
            }
            Phase::Handshake { since } => {
                let since = *since;
                // Still SYN-RECEIVED right after the SYN: nothing to read yet.
                let opening = socket.state() == tcp::State::SynReceived;
                if (!opening && !socket.may_recv()) || now_us > since + HANDSHAKE_TIMEOUT_US {
                    self.slots[i].phase = Phase::Closing { since: now_us, fin_sent: false };
                } else if socket.recv_queue() > 0 {
                    busy |= self.handshake(i, socket, now, now_us);
                }
            }
            Phase::Open(conn) => {
                if conn.poll_timeout().is_some_and(|at| at <= now) {
                    conn.handle_timeout(now);
                }
                busy |= self.receive(i, socket, now, now_us);
            }
            Phase::Closing { since, fin_sent } => {
                // Unread input is dropped so the peer's FIN gets through.
                let _ = socket.recv(|data| (data.len(), ()));
                if !*fin_sent && self.slots[i].queue.is_empty() {
                    socket.close();
                    *fin_sent = true;
                    busy = true;
                }
                let done = matches!(socket.state(), tcp::State::Closed | tcp::State::TimeWait);
                if done || now_us > *since + LINGER_US {
                    // TIME-WAIT protects nothing here (the peer is QEMU's NAT, which has closed
                    // too); reset so the slot listens again at once.
                    socket.abort();
                    self.release(i);
                    self.slots[i].phase = Phase::Listening;
                    busy = true;
                }
            }
        }
        busy | self.flush(i, socket)
    }

    /// Reads the opening handshake from the socket's ring without taking it out (`peek`), and
    /// answers it: 101 and an open connection, 503 when the pool cannot cover a reserve, a 4xx
    /// for a bad request, or the counters for `GET /stats`.
    fn handshake(
        &mut self,
        i: usize,
        socket: &mut tcp::Socket<'_>,
        now: Instant,
        now_us: u64,
    ) -> bool {
        let mut head = [0u8; HEAD_LIMIT];
        let Ok(n) = socket.peek_slice(&mut head) else { return false };
        let head = &head[..n];
        let mut out = [0u8; 512];
        if head.starts_with(b"GET /stats ") {
            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = self.write_stats_response(&mut out);
                self.respond_and_close(i, &out[..n], now_us);
                return true;
            }
            return false;
        }
        let mut headers = [EMPTY_HEADER; 24];
        let (response_len, head_len) = match Request::parse(head, &mut headers, HEAD_LIMIT) {
            Ok(None) => return false,
            Err(refusal) => {
                self.stats.refused_bad += 1;
                let n = refusal.write_response(&mut out).unwrap_or(0);
                self.respond_and_close(i, &out[..n], now_us);
                return true;
            }
            Ok(Some(_)) if !self.reserve(i) => {
                self.stats.refused_busy += 1;
                let n = http::write_refusal(503, "Retry-After: 1\r\n", "pool full", &mut out)
                    .unwrap_or(0);
                self.respond_and_close(i, &out[..n], now_us);
                return true;
            }
            // NOTE(unwrap_or): 512 bytes hold any 101 response without a subprotocol.
            Ok(Some((request, head_len))) => {
                (request.accept(None, None, &mut out).unwrap_or(0), head_len)
            }
        };
        // The head leaves the ring; what follows it (early frames) stays for `receive`.
        let mut left = head_len;
        while left > 0 {
            match socket.recv(|data| {
                let k = left.min(data.len());
                (k, k)
            }) {
                Ok(k) if k > 0 => left -= k,
                _ => break,
            }
        }
        let slot = &mut self.slots[i];
        if slot.queue.push_preamble(&mut self.pool, &out[..response_len]).is_err() {
            socket.abort(); // cannot happen with the reservation held: reset, never corrupt
            self.release(i);
            self.slots[i].phase = Phase::Listening;
            return true;
        }
        slot.phase = Phase::Open(Connection::new(Role::Server, CONFIG, now));
        self.stats.upgraded += 1;
        self.open += 1;
        self.stats.open_high_water = self.stats.open_high_water.max(self.open);
        true
    }

    /// Queues `response` and moves to closing.
    fn respond_and_close(&mut self, i: usize, response: &[u8], now_us: u64) {
        let slot = &mut self.slots[i];
        // A refusal that does not fit the pool is not sent: the FIN alone refuses.
        let _ = slot.queue.push_preamble(&mut self.pool, response);
        slot.phase = Phase::Closing { since: now_us, fin_sent: false };
    }

    /// Feeds the socket's received bytes to the connection, echoing each data piece, queueing
    /// control frames, and moves to closing when the connection is closed.
    fn receive(
        &mut self,
        i: usize,
        socket: &mut tcp::Socket<'_>,
        now: Instant,
        now_us: u64,
    ) -> bool {
        let slot = &mut self.slots[i];
        let Phase::Open(conn) = &mut slot.phase else { return false };
        let pool = &mut self.pool;
        let stats = &mut self.stats;
        let mut busy = false;
        let mut failed = false;
        let may_read = |queue: &SendQueue| queue.is_writable() && queue.messages() < MESSAGE_LIMIT;
        if may_read(&slot.queue) && conn.state() != State::Closed && socket.recv_queue() > 0 {
            let queue = &mut slot.queue;
            let read = socket.recv(|data| {
                let len = data.len().min(READ_LIMIT);
                let data = &mut data[..len];
                let mut at = 0;
                let mut pieces = 0;
                while at < data.len() && pieces < PIECES_PER_READ && !failed {
                    let Ok(input) = conn.handle_input(now, &mut data[at..]) else {
                        at = data.len(); // the core queued the close frame; the rest is ignored
                        break;
                    };
                    at += input.consumed;
                    if let Some(piece) = input.payload {
                        pieces += 1;
                        if conn.state() == State::Open {
                            failed |= !echo(conn, queue, pool, &piece);
                            if piece.message_fin {
                                stats.messages += 1;
                            }
                            stats.bytes += piece.data.len() as u64;
                        }
                    }
                    // Answer each ping before reading the next frame: the core owes one at a time.
                    failed |= !drain_control(conn, queue, pool);
                    if conn.state() == State::Closed {
                        at = data.len();
                    }
                }
                (at, at)
            });
            busy |= read.is_ok_and(|n| n > 0);
        }
        if failed {
            // The pool could not take a piece: close 1013 with whatever the queue holds dropped
            // (only the message in flight stays, so the stream stays well-formed).
            stats.closed_pool += 1;
            let _ = slot.queue.discard_unsent(pool);
            let _ = conn.close(now, CloseCode::TRY_AGAIN_LATER, "pool exhausted");
            if !drain_control(conn, &mut slot.queue, pool) {
                socket.abort();
            }
        }
        if !socket.may_recv() && socket.recv_queue() == 0 && conn.state() != State::Closed {
            conn.handle_eof(); // the peer's FIN (or reset) before its close frame
        }
        let _ = drain_control(conn, &mut slot.queue, pool);
        while let Some(event) = conn.poll_event() {
            if let Event::Closed { .. } = event {
                busy = true;
            }
        }
        if conn.state() == State::Closed {
            stats.closed += 1;
            self.open -= 1;
            slot.phase = Phase::Closing { since: now_us, fin_sent: false };
            busy = true;
        }
        busy
    }

    /// Moves queued bytes into the socket's transmit ring. Returns whether any moved.
    fn flush(&mut self, i: usize, socket: &mut tcp::Socket<'_>) -> bool {
        let slot = &mut self.slots[i];
        let mut moved = false;
        while !slot.queue.is_empty() && socket.can_send() {
            let pool = &self.pool;
            let queue = &slot.queue;
            let Ok(n) = socket.send(|room| {
                let n = queue.copy_to(pool, room);
                (n, n)
            }) else {
                break;
            };
            if n == 0 {
                break;
            }
            let _ = slot.queue.consume(&mut self.pool, n);
            moved = true;
        }
        if !socket.is_active() && !slot.queue.is_empty() {
            let _ = slot.queue.clear(&mut self.pool); // the peer reset: nobody will read these
        }
        moved
    }

    /// Reserves the pool's worst case for slot `i`'s connection, if it can be covered.
    fn reserve(&mut self, i: usize) -> bool {
        let chunks = self.reserved_chunks + RESERVE_CHUNKS;
        let segments = self.reserved_segments + RESERVE_SEGMENTS;
        if chunks > self.pool.chunks_total() || segments > self.pool.segments_total() {
            return false;
        }
        (self.reserved_chunks, self.reserved_segments) = (chunks, segments);
        self.slots[i].reserved = true;
        true
    }

    /// Gives slot `i`'s queue and reservation back.
    fn release(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        let _ = slot.queue.clear(&mut self.pool);
        if let Phase::Open(_) = slot.phase {
            self.stats.closed += 1;
            self.open -= 1;
        }
        if core::mem::take(&mut slot.reserved) {
            self.reserved_chunks -= RESERVE_CHUNKS;
            self.reserved_segments -= RESERVE_SEGMENTS;
        }
    }

    /// Writes the counters as one line of `key=value` pairs (the serial console's format).
    pub fn write_stats(&self, out: &mut impl core::fmt::Write) -> core::fmt::Result {
        let s = &self.stats;
        let c = self.pool.counters();
        write!(
            out,
            "STATS accepted={} upgraded={} refused_busy={} refused_bad={} closed={} closed_pool={} \
             open={} open_high_water={} messages={} bytes={} pool_chunk={} pool_chunks={} \
             pool_chunks_in_use={} pool_chunks_high_water={} pool_segments={} \
             pool_segments_high_water={} pool_allocation_failures={} pool_footprint={} \
             reserve_chunks={} tx_drops={} stack_high_water={}",
            s.accepted,
            s.upgraded,
            s.refused_busy,
            s.refused_bad,
            s.closed,
            s.closed_pool,
            self.open,
            s.open_high_water,
            s.messages,
            s.bytes,
            CHUNK_SIZE,
            c.chunks_total,
            c.chunks_in_use,
            c.chunks_high_water,
            c.segments_total,
            c.segments_high_water,
            c.allocation_failures,
            self.pool.footprint_bytes(),
            RESERVE_CHUNKS,
            crate::board::tx_drops(),
            crate::board::stack_high_water(),
        )
    }

    fn write_stats_response(&self, out: &mut [u8]) -> usize {
        let mut body = Buffer { buf: &mut [0u8; 400], len: 0 };
        let _ = self.write_stats(&mut body);
        let _ = body.write_str("\n");
        let body_len = body.len;
        let body = core::str::from_utf8(&body.buf[..body_len]).unwrap_or("");
        let mut w = Buffer { buf: out, len: 0 };
        let _ = write!(
            w,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        w.len
    }
}

/// Echoes one piece of a received message as one frame: text as text, binary as binary, the
/// first piece opening the message and the last ending it. Returns false if the pool refused it.
fn echo(
    conn: &mut Connection,
    queue: &mut SendQueue,
    pool: &mut Pool<'_>,
    piece: &freeboard_proto::Payload<'_>,
) -> bool {
    let opcode = match (piece.message_start, piece.kind) {
        (true, MessageKind::Text) => OpCode::Text,
        (true, MessageKind::Binary) => OpCode::Binary,
        (false, _) => OpCode::Continuation,
    };
    let mut header = [0u8; 14];
    let Ok(n) =
        conn.send_header(opcode, piece.message_fin, piece.data.len() as u64, None, &mut header)
    else {
        return true; // closing: data is no longer sent
    };
    let pushed = queue.push_message(pool, &[&header[..n], piece.data]);
    !matches!(pushed.outcome, PushOutcome::WouldBlock { .. } | PushOutcome::MustClose { .. })
}

/// Queues every control frame the connection owes. Returns false if the pool refused one.
fn drain_control(conn: &mut Connection, queue: &mut SendQueue, pool: &mut Pool<'_>) -> bool {
    let mut frame = [0u8; 131];
    // NOTE(unwrap_or): a server passes no mask and 131 bytes hold any control frame.
    while let Some(n) = conn.poll_transmit(None, &mut frame).unwrap_or(None) {
        if queue.push_control(pool, &[&frame[..n]]).is_err() {
            return false;
        }
    }
    true
}

/// A `fmt::Write` into a byte slice that stops at its end.
struct Buffer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl core::fmt::Write for Buffer<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() { Err(core::fmt::Error) } else { Ok(()) }
    }
}
