//! Test helpers for freeboard (not published).
//!
//! - [`Pair`]: a client and a server [`Connection`] wired together in memory, with a virtual
//!   clock and a [`Chunker`] that decides how the bytes in flight are cut into reads, stepped
//!   until quiet (the shape of quinn's `tests/util.rs` `Pair`).
//! - [`Endpoint::feed`]: drives one connection with raw bytes and records what it reports.
//! - [`encode_frame`], [`RawHeader`], [`close_frame`] and [`upgrade_request`]: the bytes a
//!   client writes to a real server, into the caller's buffer, including ones a correct sender
//!   never produces; [`parse_frame`] and [`Inbox`]: the server's answer read back.

//! - [`tls::TestCa`]: a certificate authority made at test time, and server certificates it
//!   signs, in PEM files.
//! - [`browser::Browser`]: headless Chromium for the browser tests.
//! - [`proxy::CutProxy`]: a loopback TCP proxy whose connections are cut on command.
//! - [`alloc::LiveBytes`]: a global allocator counting the bytes live on the heap.

pub mod alloc;
pub mod browser;
pub mod proxy;
pub mod tls;

use std::time::Duration;

use freeboard_proto::frame::MAX_HEADER_LEN;
use freeboard_proto::{
    CloseCode, Config, Connection, Event, Instant, MessageKind, OpCode, ProtocolError, Role,
    UsageError,
};

mod wire;

pub use wire::{
    Frame, Inbox, LengthField, RawHeader, TEST_MASK, close_frame, encode_frame, frame, parse_frame,
    upgrade_request,
};

/// What an endpoint observed, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A whole data message.
    Message(MessageKind, Vec<u8>),
    /// A ping's payload.
    Ping(Vec<u8>),
    /// A pong's payload.
    Pong(Vec<u8>),
    /// The connection closed.
    Closed {
        /// Close code.
        code: CloseCode,
        /// Close reason.
        reason: String,
        /// Both close frames were exchanged.
        clean: bool,
    },
    /// The peer broke the protocol.
    Error(ProtocolError),
}

/// How bytes in flight are cut into reads.
#[derive(Debug, Clone)]
pub enum Chunker {
    /// Everything in flight arrives in one read.
    Whole,
    /// Reads of at most this many bytes.
    Max(usize),
    /// Read sizes taken from the list in turn (cycled); zeros are skipped.
    Pattern(Vec<usize>),
}

impl Chunker {
    fn next_len(&self, turn: usize, available: usize) -> usize {
        let len = match self {
            Chunker::Whole => available,
            Chunker::Max(max) => *max,
            // The first non-zero size from position `turn` on; all zeros mean one whole read.
            Chunker::Pattern(sizes) => (0..sizes.len())
                .map(|i| sizes[(turn + i) % sizes.len()])
                .find(|&n| n > 0)
                .unwrap_or(available),
        };
        len.clamp(1, available.max(1))
    }
}

/// Which end of a [`Pair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client.
    Client,
    /// The server.
    Server,
}

impl Side {
    /// The other end.
    pub fn peer(self) -> Side {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}

/// One connection and what it has seen.
#[derive(Debug)]
pub struct Endpoint {
    /// The connection under test.
    pub conn: Connection,
    /// Everything it reported, in order.
    pub records: Vec<Record>,
    /// A message being reassembled from pieces.
    assembling: Option<(MessageKind, Vec<u8>)>,
    /// Bytes sent to this endpoint and not yet read by it.
    inbox: Vec<u8>,
    /// Bytes this endpoint transmitted while reading, not yet collected.
    outbox: Vec<u8>,
    /// Counter behind the deterministic masking keys of a client.
    mask_seed: u32,
    /// Park the connection and resume it after every read that leaves it idle, the way a
    /// server with many idle connections does: it must not change anything observable.
    pub park_when_idle: bool,
}

impl Endpoint {
    /// A fresh endpoint with `role` and `config`, opened at time zero.
    pub fn new(role: Role, config: Config) -> Self {
        Self {
            conn: Connection::new(role, config, Instant::default()),
            records: Vec::new(),
            assembling: None,
            inbox: Vec::new(),
            outbox: Vec::new(),
            mask_seed: 0x9e37_79b9,
            park_when_idle: false,
        }
    }

    /// The masking key for the next frame: a client needs one, a server none. Deterministic,
    /// which a test wants and a real client must not do.
    pub fn next_mask(&mut self) -> Option<[u8; 4]> {
        (self.conn.role() == Role::Client).then(|| {
            self.mask_seed = self.mask_seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            self.mask_seed.to_le_bytes()
        })
    }

    /// Feeds `bytes` to the connection in reads cut by `chunker`, recording what it reports.
    pub fn feed(&mut self, now: Instant, bytes: &[u8], chunker: &Chunker) {
        let mut buf = bytes.to_vec();
        let mut at = 0;
        let mut turn = 0;
        while at < buf.len() {
            let end = at + chunker.next_len(turn, buf.len() - at);
            self.read(now, &mut buf[at..end]);
            at = end;
            turn += 1;
        }
    }

    /// One read: runs `handle_input` until the buffer is used up.
    fn read(&mut self, now: Instant, buf: &mut [u8]) {
        let mut at = 0;
        while at < buf.len() {
            let available = buf.len() - at;
            let input = match self.conn.handle_input(now, &mut buf[at..]) {
                Ok(input) => input,
                Err(e) => {
                    self.records.push(Record::Error(e));
                    self.drain_events();
                    return;
                }
            };
            let consumed = input.consumed;
            assert!(consumed <= available, "consumed more than given");
            let progressed = input.consumed > 0 || input.payload.is_some();
            if let Some(piece) = input.payload {
                assert_eq!(
                    piece.message_start,
                    self.assembling.is_none(),
                    "message_start marks the first piece"
                );
                let (_, message) = self.assembling.get_or_insert_with(|| (piece.kind, Vec::new()));
                message.extend_from_slice(piece.data);
                if piece.message_fin {
                    let (kind, message) = self.assembling.take().expect("a message is assembling");
                    self.records.push(Record::Message(kind, message));
                }
            }
            self.drain_events();
            self.drain_transmit();
            assert!(progressed, "handle_input made no progress");
            at += consumed;
        }
        if self.park_when_idle
            && let Some(parked) = self.conn.park()
        {
            self.conn = parked.resume(*self.conn.config());
        }
    }

    fn drain_events(&mut self) {
        while let Some(event) = self.conn.poll_event() {
            self.records.push(match event {
                Event::Ping(p) => Record::Ping(p.to_vec()),
                Event::Pong(p) => Record::Pong(p.to_vec()),
                Event::Closed { code, reason, clean } => {
                    Record::Closed { code, reason: reason.to_owned(), clean }
                }
            });
        }
    }

    /// Everything the connection wants to transmit right now (including what it transmitted
    /// while reading).
    pub fn transmit(&mut self) -> Vec<u8> {
        self.drain_transmit();
        std::mem::take(&mut self.outbox)
    }

    fn drain_transmit(&mut self) {
        let mut buf = [0u8; MAX_HEADER_LEN + 125];
        loop {
            let mask = self.next_mask();
            match self.conn.poll_transmit(mask, &mut buf) {
                Ok(Some(n)) => self.outbox.extend_from_slice(&buf[..n]),
                Ok(None) => return,
                Err(e) => panic!("poll_transmit: {e}"),
            }
        }
    }

    /// The messages received so far, in order.
    pub fn messages(&self) -> Vec<(MessageKind, Vec<u8>)> {
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::Message(kind, data) => Some((*kind, data.clone())),
                _ => None,
            })
            .collect()
    }

    /// The close record, if the connection closed.
    pub fn closed(&self) -> Option<&Record> {
        self.records.iter().find(|r| matches!(r, Record::Closed { .. }))
    }
}

/// A client and a server connected in memory.
#[derive(Debug)]
pub struct Pair {
    /// The client end.
    pub client: Endpoint,
    /// The server end.
    pub server: Endpoint,
    /// The virtual clock.
    pub now: Instant,
    /// How bytes in flight are cut into reads.
    pub chunker: Chunker,
}

impl Pair {
    /// A pair with the same `config` on both ends, delivering whole reads.
    pub fn new(config: Config) -> Self {
        Self {
            client: Endpoint::new(Role::Client, config),
            server: Endpoint::new(Role::Server, config),
            now: Instant::default(),
            chunker: Chunker::Whole,
        }
    }

    /// The endpoint on `side`.
    pub fn end(&mut self, side: Side) -> &mut Endpoint {
        match side {
            Side::Client => &mut self.client,
            Side::Server => &mut self.server,
        }
    }

    /// What the endpoint on `side` has recorded.
    pub fn records(&self, side: Side) -> &[Record] {
        match side {
            Side::Client => &self.client.records,
            Side::Server => &self.server.records,
        }
    }

    /// Sends a data frame from `side` (it arrives on the next [`step`](Self::step)).
    pub fn send(
        &mut self,
        side: Side,
        opcode: OpCode,
        fin: bool,
        payload: &[u8],
    ) -> Result<(), UsageError> {
        let end = self.end(side);
        let mask = end.next_mask();
        let mut out = vec![0u8; MAX_HEADER_LEN + payload.len()];
        let n = end.conn.send_frame(opcode, fin, payload, mask, &mut out)?;
        self.end(side.peer()).inbox.extend_from_slice(&out[..n]);
        Ok(())
    }

    /// Sends a whole message from `side` in one frame.
    pub fn send_message(&mut self, side: Side, kind: MessageKind, payload: &[u8]) {
        let opcode = if kind == MessageKind::Text { OpCode::Text } else { OpCode::Binary };
        self.send(side, opcode, true, payload).expect("send_message on an open connection");
    }

    /// Sends a ping from `side`.
    pub fn ping(&mut self, side: Side, payload: &[u8]) -> Result<(), UsageError> {
        let end = self.end(side);
        let mask = end.next_mask();
        let mut out = [0u8; MAX_HEADER_LEN + 125];
        let n = end.conn.send_ping(payload, mask, &mut out)?;
        self.end(side.peer()).inbox.extend_from_slice(&out[..n]);
        Ok(())
    }

    /// Starts the close handshake from `side`.
    pub fn close(&mut self, side: Side, code: CloseCode, reason: &str) -> Result<(), UsageError> {
        let now = self.now;
        self.end(side).conn.close(now, code, reason)
    }

    /// Puts raw bytes in flight towards `side`, as if its peer had written them.
    pub fn inject(&mut self, side: Side, bytes: &[u8]) {
        self.end(side).inbox.extend_from_slice(bytes);
    }

    /// Delivers what is in flight and collects what each end transmits in answer.
    /// Returns whether any byte moved.
    pub fn step(&mut self) -> bool {
        let mut moved = false;
        for side in [Side::Client, Side::Server] {
            let (now, chunker) = (self.now, self.chunker.clone());
            let end = self.end(side);
            let inbox = std::mem::take(&mut end.inbox);
            moved |= !inbox.is_empty();
            end.feed(now, &inbox, &chunker);
            let out = end.transmit();
            moved |= !out.is_empty();
            self.end(side.peer()).inbox.extend_from_slice(&out);
        }
        moved
    }

    /// Steps until nothing moves.
    pub fn drive(&mut self) {
        for _ in 0..1000 {
            if !self.step() {
                return;
            }
        }
        panic!("pair did not settle in 1000 steps");
    }

    /// Moves the clock forward, runs both ends' timers, then drives.
    pub fn advance(&mut self, by: Duration) {
        self.now = self.now + by;
        for side in [Side::Client, Side::Server] {
            let now = self.now;
            let end = self.end(side);
            if end.conn.poll_timeout().is_some_and(|t| t <= now) {
                end.conn.handle_timeout(now);
                end.drain_events();
            }
        }
        self.drive();
    }

    /// The transport ends under `side`: it reads end of stream.
    pub fn eof(&mut self, side: Side) {
        let end = self.end(side);
        end.conn.handle_eof();
        end.drain_events();
    }
}

/// An HS256 JWT (RFC 7519) of `claims` (a JSON object) signed with `secret`: what a token
/// server gives a client, for tests of the access rules.
pub fn hs256_jwt(secret: &str, claims: &str) -> String {
    let header = b64url(br#"{"alg":"HS256","typ":"JWT"}"#);
    let signed = format!("{header}.{}", b64url(claims.as_bytes()));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, signed.as_bytes());
    format!("{signed}.{}", b64url(tag.as_ref()))
}

/// base64url without padding (RFC 4648 §5), as JWTs are written.
pub fn b64url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}
