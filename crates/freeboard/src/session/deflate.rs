//! permessage-deflate (RFC 7692): negotiation in both roles, and the compressor and
//! decompressor a session uses, with their memory drawn from the pool's budget.
//!
//! Inflation is the dangerous half: a few kilobytes of input can expand to gigabytes. A
//! [`Inflater`] therefore writes into pool chunks in steps of at most one chunk and checks
//! the running size against `max_message_size` after every step, so a bomb is refused (1009)
//! as soon as it passes the limit, never after it has been inflated.

use std::fmt::Write as _;

use flate2::{Compress, Compression as Level, Decompress, FlushCompress, FlushDecompress, Status};
use freeboard_buf::{ChunkChain, Frame, Pool};
use freeboard_proto::frame::{FrameHeader, MAX_HEADER_LEN};
use freeboard_proto::handshake::Extension;
use freeboard_proto::{CloseCode, Connection, Instant, MessageKind, Payload, utf8::Utf8Validator};

use super::{Reassembler, Reassembly, Received};

/// The extension's registered name.
pub(crate) const NAME: &str = "permessage-deflate";

/// The four octets every compressed message ends with before §7.2.1 removes them.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// How a server compresses (`freeboard serve --compression`, per route with
/// [`RouteOptions::compression`](crate::RouteOptions::compression)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Compression {
    /// `permessage-deflate` offers are declined (the upgrade succeeds without it).
    #[default]
    Off,
    /// One compressor and one decompressor per event loop; both directions negotiate no
    /// context takeover, so a connection holds no compression state between messages.
    Shared,
    /// A compressor and a decompressor per connection, with a window of
    /// [`ServerConfig::compression_window`](crate::ServerConfig::compression_window) bits
    /// (9–15) in both directions; their memory is drawn from the budget at the upgrade, and
    /// a connection the budget cannot cover goes on without compression.
    Dedicated,
}

impl Compression {
    /// Parses `off`, `shared` or `dedicated`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "off" => Some(Self::Off),
            "shared" => Some(Self::Shared),
            "dedicated" => Some(Self::Dedicated),
            _ => None,
        }
    }
}

/// The parameters both ends agreed on (RFC 7692 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreement {
    /// The server starts every message with an empty window.
    pub server_no_context_takeover: bool,
    /// The client starts every message with an empty window.
    pub client_no_context_takeover: bool,
    /// The server's LZ77 window, 8–15.
    pub server_max_window_bits: u8,
    /// The client's LZ77 window, 8–15.
    pub client_max_window_bits: u8,
}

/// Why an offer or a response was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NegotiationError {
    /// A parameter RFC 7692 does not define.
    UnknownParameter,
    /// A parameter given twice (§7: "MUST NOT include more than one").
    DuplicateParameter,
    /// A value that is not a decimal 8–15 without leading zeros, or a value on a flag.
    InvalidValue,
    /// A response that answers parameters the offer did not allow, or that this end
    /// cannot honour (a window of 8 for our own compressor: zlib cannot produce it).
    Unacceptable,
    /// The memory budget cannot hold the compression state the agreement needs.
    NoMemory,
}

impl std::fmt::Display for NegotiationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::UnknownParameter => "a parameter RFC 7692 does not define",
            Self::DuplicateParameter => "a parameter given twice",
            Self::InvalidValue => "a parameter value that is not allowed",
            Self::Unacceptable => "parameters the offer did not allow or this end cannot honour",
            Self::NoMemory => "the memory budget cannot hold the compression state",
        })
    }
}

impl std::error::Error for NegotiationError {}

/// The parameters of one `permessage-deflate` element, as written.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Params {
    server_no_context_takeover: bool,
    client_no_context_takeover: bool,
    server_max_window_bits: Option<u8>,
    /// `Some(None)`: the parameter without a value (allowed in an offer only).
    client_max_window_bits: Option<Option<u8>>,
}

impl Params {
    /// Parses `name[=value]` parameters separated by `;` (§7.1); every error refuses the
    /// whole element.
    fn parse(params: &str) -> Result<Self, NegotiationError> {
        let mut p = Self::default();
        for param in params.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) = match param.split_once('=') {
                Some((n, v)) => (n.trim(), Some(unquote(v.trim())?)),
                None => (param, None),
            };
            let flag = |seen: &mut bool| {
                if value.is_some() {
                    return Err(NegotiationError::InvalidValue);
                }
                if std::mem::replace(seen, true) {
                    return Err(NegotiationError::DuplicateParameter);
                }
                Ok(())
            };
            if name.eq_ignore_ascii_case("server_no_context_takeover") {
                flag(&mut p.server_no_context_takeover)?;
            } else if name.eq_ignore_ascii_case("client_no_context_takeover") {
                flag(&mut p.client_no_context_takeover)?;
            } else if name.eq_ignore_ascii_case("server_max_window_bits") {
                if p.server_max_window_bits.is_some() {
                    return Err(NegotiationError::DuplicateParameter);
                }
                p.server_max_window_bits =
                    Some(window_bits(value.ok_or(NegotiationError::InvalidValue)?)?);
            } else if name.eq_ignore_ascii_case("client_max_window_bits") {
                if p.client_max_window_bits.is_some() {
                    return Err(NegotiationError::DuplicateParameter);
                }
                p.client_max_window_bits = Some(value.map(window_bits).transpose()?);
            } else {
                return Err(NegotiationError::UnknownParameter);
            }
        }
        Ok(p)
    }
}

/// A quoted-string value loses its quotes (RFC 6455 §9.1 allows either form).
fn unquote(v: &str) -> Result<&str, NegotiationError> {
    match v.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"').ok_or(NegotiationError::InvalidValue),
        None => Ok(v),
    }
}

/// §7.1.2.1: "a decimal integer value ... without leading zeros, between 8 to 15, inclusive".
fn window_bits(v: &str) -> Result<u8, NegotiationError> {
    match v.as_bytes() {
        [b'8'] => Ok(8),
        [b'9'] => Ok(9),
        [b'1', d @ b'0'..=b'5'] => Ok(10 + (d - b'0')),
        _ => Err(NegotiationError::InvalidValue),
    }
}

impl Agreement {
    /// Server side: the first `permessage-deflate` offer among `offers` this server can
    /// accept in `mode`, or `None` (offers are tried in order; a malformed one is skipped,
    /// and the upgrade goes on without the extension if none is left).
    /// `window_bits` bounds both windows in dedicated mode.
    pub fn accept<'b>(
        mode: Compression,
        window_bits: u8,
        offers: impl IntoIterator<Item = Extension<'b>>,
    ) -> Option<Self> {
        let own_window = match mode {
            Compression::Off => return None,
            Compression::Shared => 15,
            Compression::Dedicated => window_bits.clamp(9, 15),
        };
        let shared = mode == Compression::Shared;
        offers.into_iter().filter(|o| o.name.eq_ignore_ascii_case(NAME)).find_map(|offer| {
            let p = Params::parse(offer.params).ok()?;
            let server_max_window_bits = p.server_max_window_bits.unwrap_or(15).min(own_window);
            // zlib cannot compress raw deflate with a 256-byte window: decline, and let the
            // client's next offer (if any) be tried.
            if server_max_window_bits < 9 {
                return None;
            }
            let client_max_window_bits = match p.client_max_window_bits {
                // We may only limit the client's window if it said it can be limited.
                Some(limit) => limit.unwrap_or(15).min(own_window),
                None => 15,
            };
            Some(Self {
                server_no_context_takeover: shared || p.server_no_context_takeover,
                // Shared: the decompressor is the loop's too, so no client context either
                // (§7.1.1.2: a server may add it although the offer did not ask).
                client_no_context_takeover: shared || p.client_no_context_takeover,
                server_max_window_bits,
                client_max_window_bits,
            })
        })
    }

    /// The `Sec-WebSocket-Extensions` value of the server's response.
    pub fn response(&self) -> String {
        let mut s = String::from(NAME);
        if self.server_no_context_takeover {
            s.push_str("; server_no_context_takeover");
        }
        if self.client_no_context_takeover {
            s.push_str("; client_no_context_takeover");
        }
        if self.server_max_window_bits < 15 {
            let _ = write!(s, "; server_max_window_bits={}", self.server_max_window_bits);
        }
        if self.client_max_window_bits < 15 {
            let _ = write!(s, "; client_max_window_bits={}", self.client_max_window_bits);
        }
        s
    }

    /// The client's offer. It always names `client_no_context_takeover`: this client keeps
    /// no compression context between messages (§7.1.1.2: a hint the client honours even if
    /// the server does not repeat it), so a server needs no inflate state for it, and every
    /// server can accept it. Both windows are left to the server's choice. With
    /// `server_no_context_takeover` the server is asked to keep none either, so that neither
    /// side holds per-connection state (the client loop, which has many connections).
    pub fn offer(server_no_context_takeover: bool) -> &'static str {
        if server_no_context_takeover {
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; client_max_window_bits"
        } else {
            "permessage-deflate; client_no_context_takeover; client_max_window_bits"
        }
    }

    /// Client side: the agreement a server's response (one accepted element) makes to
    /// [`offer`](Self::offer)`(offered_server_no_context_takeover)`. A response this client
    /// cannot honour is an error: the client fails the connection (§5: "the client MUST
    /// _Fail the WebSocket Connection_").
    pub fn from_response(
        response: Extension<'_>,
        offered_server_no_context_takeover: bool,
    ) -> Result<Self, NegotiationError> {
        if !response.name.eq_ignore_ascii_case(NAME) {
            return Err(NegotiationError::Unacceptable);
        }
        let p = Params::parse(response.params)?;
        let client_max_window_bits = match p.client_max_window_bits {
            Some(Some(bits)) => bits,
            // §7.1.2.2: the response must carry a value.
            Some(None) => return Err(NegotiationError::InvalidValue),
            None => 15,
        };
        // Our compressor cannot honour a 256-byte window; §7.1.1.1: a server accepting
        // server_no_context_takeover MUST include it in the response.
        if client_max_window_bits < 9
            || offered_server_no_context_takeover && !p.server_no_context_takeover
        {
            return Err(NegotiationError::Unacceptable);
        }
        Ok(Self {
            server_no_context_takeover: p.server_no_context_takeover,
            // The offer promised it, whatever the response says.
            client_no_context_takeover: true,
            server_max_window_bits: p.server_max_window_bits.unwrap_or(15),
            client_max_window_bits,
        })
    }

    /// (window bits, no context takeover) for the side that sends as `server` or not.
    pub(crate) fn side(&self, server: bool) -> (u8, bool) {
        if server {
            (self.server_max_window_bits, self.server_no_context_takeover)
        } else {
            (self.client_max_window_bits, self.client_no_context_takeover)
        }
    }

    /// The compressor of the side that sends (the server's if `server`).
    pub(crate) fn deflater(&self, server: bool) -> Deflater {
        let (bits, reset) = self.side(server);
        Deflater::new(bits, reset)
    }

    /// The decompressor for what the other side sends.
    pub(crate) fn inflater(&self, server: bool) -> Inflater {
        let (bits, reset) = self.side(!server);
        Inflater::new(bits, reset)
    }

    /// What a connection's own compression state costs (both directions), to reserve from
    /// the budget: 0 when both sides take no context.
    pub fn dedicated_cost(&self, server: bool) -> usize {
        let (tx_bits, tx_reset) = self.side(server);
        let (rx_bits, rx_reset) = self.side(!server);
        let tx = if tx_reset { 0 } else { deflate_state_bytes(tx_bits) };
        let rx = if rx_reset { 0 } else { inflate_state_bytes(rx_bits) };
        tx + rx
    }
}

/// One compressor and one decompressor of the largest window: what a client keeps in its
/// budget for compression.
pub(crate) const STATE_BYTES: usize = deflate_state_bytes(15) + inflate_state_bytes(15);

/// What zlib-rs allocates for one raw-deflate compressor at memLevel 8 (its
/// `DeflateAllocOffsets`), all of which may become resident: a double window and its `prev`
/// chain (2 bytes per position), a hash head of 2^16 entries (2 bytes each, whatever the
/// window; zlib's own formula assumes 2^15), pending and symbol buffers of 7 × 16 KiB, and
/// the stream state. ≈ 374 KiB at 15 bits, 250 KiB at 10.
pub(crate) const fn deflate_state_bytes(window_bits: u8) -> usize {
    let window = 1 << window_bits as usize;
    2 * window + 2 * window + (2 << 16) + 7 * (16 << 10) + 6 * 1024
}

/// zlib's documented inflate memory: `1 << windowBits` plus about 7 KiB of state.
pub(crate) const fn inflate_state_bytes(window_bits: u8) -> usize {
    (1 << window_bits as usize) + 7 * 1024
}

/// A raw-deflate compressor that ends each message with a sync flush and strips the tail
/// (§7.2.1).
pub(crate) struct Deflater {
    z: Compress,
    /// Reset after each message (no context takeover).
    reset: bool,
}

impl Deflater {
    pub(crate) fn new(window_bits: u8, reset: bool) -> Self {
        // NOTE: zlib rejects a raw window of 8; negotiation never agrees to it for us.
        let bits = window_bits.clamp(9, 15);
        Self { z: Compress::new_with_window_bits(Level::fast(), false, bits), reset }
    }

    /// Compresses one whole message into `out` (cleared first). `out` grows by at most the
    /// message's length plus a few bytes per 16 KiB (deflate's stored-block bound).
    pub(crate) fn compress(&mut self, data: &[u8], out: &mut Vec<u8>) {
        self.compress_parts([data], out);
    }

    /// [`compress`](Self::compress) for a message given as consecutive `parts` (a frame's
    /// chunks): one deflate stream, flushed once at the end.
    pub(crate) fn compress_parts<'a>(
        &mut self,
        parts: impl IntoIterator<Item = &'a [u8]>,
        out: &mut Vec<u8>,
    ) {
        out.clear();
        let mut parts = parts.into_iter().peekable();
        while let Some(data) = parts.next() {
            let flush =
                if parts.peek().is_none() { FlushCompress::Sync } else { FlushCompress::None };
            out.reserve(data.len() + data.len() / 1024 * 5 + 64);
            let start = self.z.total_in();
            loop {
                let consumed = (self.z.total_in() - start) as usize;
                // NOTE: compress_vec only fails on a stream error, impossible for a
                // well-formed Compress.
                let _ = self.z.compress_vec(&data[consumed..], out, flush);
                let consumed = (self.z.total_in() - start) as usize;
                if consumed == data.len() && out.len() < out.capacity() {
                    break;
                }
                out.reserve(out.capacity().max(64));
            }
        }
        if out.ends_with(&TAIL) {
            out.truncate(out.len() - TAIL.len());
        }
        if out.is_empty() {
            // An empty message compresses to one empty stored block's remains.
            out.push(0x00);
        }
        if self.reset {
            self.z.reset();
        }
    }
}

/// The budget cannot cover a compressor or the chunks of a compressed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoMemory;

/// Why inflation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InflateError {
    /// The inflated message passed `max_message_size`: 1009.
    TooBig,
    /// The pool has no chunk for the next step: 1013 (server) / 1009 (client).
    Pool,
    /// Not valid deflate data: 1007.
    Corrupt,
}

impl InflateError {
    /// What goes on the wire.
    pub(crate) fn close(self, pool_code: CloseCode) -> (CloseCode, &'static str) {
        match self {
            Self::TooBig => (CloseCode::MESSAGE_TOO_BIG, "inflated message too big"),
            Self::Pool => (pool_code, "no memory to inflate the message"),
            Self::Corrupt => (CloseCode::INVALID_PAYLOAD, "invalid compressed data"),
        }
    }
}

/// A raw-deflate decompressor writing into pool chunks in bounded steps.
pub(crate) struct Inflater {
    z: Decompress,
    reset: bool,
    /// The message's stream ended with a final block; the rest of it is ignored.
    ended: bool,
}

impl Inflater {
    pub(crate) fn new(window_bits: u8, reset: bool) -> Self {
        // zlib's quirk: a raw window of 8 is not accepted; a 9-bit window inflates what an
        // 8-bit one produced.
        let bits = window_bits.clamp(9, 15);
        Self { z: Decompress::new_with_window_bits(false, bits), reset, ended: false }
    }

    /// Inflates one whole compressed message (its pieces in order) into `out`, a step of at
    /// most 4 KiB at a time, failing as soon as the output would pass `max`. On error `out`
    /// is cleared (its chunks go back to the pool).
    pub(crate) fn inflate<'a>(
        &mut self,
        pool: &mut Pool<'static>,
        pieces: impl IntoIterator<Item = &'a [u8]>,
        max: usize,
        out: &mut ChunkChain,
    ) -> Result<(), InflateError> {
        let mut result = Ok(());
        for piece in pieces.into_iter().chain([&TAIL[..]]) {
            result = self.step(pool, piece, max, out);
            if result.is_err() {
                break;
            }
        }
        self.finish(pool, result, out)
    }

    /// [`inflate`](Self::inflate) from a chain of pool chunks, which are released as they
    /// are read.
    pub(crate) fn inflate_chain(
        &mut self,
        pool: &mut Pool<'static>,
        mut input: ChunkChain,
        max: usize,
        out: &mut ChunkChain,
    ) -> Result<(), InflateError> {
        let mut buf = [0u8; 4096];
        let mut result = Ok(());
        while !input.is_empty() && result.is_ok() {
            let n = input.copy_to(pool, &mut buf);
            input.consume(pool, n);
            result = self.step(pool, &buf[..n], max, out);
        }
        input.clear(pool);
        if result.is_ok() {
            result = self.step(pool, &TAIL, max, out);
        }
        self.finish(pool, result, out)
    }

    fn finish(
        &mut self,
        pool: &mut Pool<'static>,
        result: Result<(), InflateError>,
        out: &mut ChunkChain,
    ) -> Result<(), InflateError> {
        if result.is_err() {
            out.clear(pool);
        }
        if result.is_err() || self.reset || self.ended {
            self.z.reset(false);
            self.ended = false;
        }
        result
    }

    /// Inflates one piece of input, 4 KiB of output at a time.
    fn step(
        &mut self,
        pool: &mut Pool<'static>,
        input: &[u8],
        max: usize,
        out: &mut ChunkChain,
    ) -> Result<(), InflateError> {
        if self.ended {
            return Ok(());
        }
        let mut step = [0u8; 4096];
        let mut at = 0;
        loop {
            let (in0, out0) = (self.z.total_in(), self.z.total_out());
            let status = self
                .z
                .decompress(&input[at..], &mut step, FlushDecompress::Sync)
                .map_err(|_| InflateError::Corrupt)?;
            let used = (self.z.total_in() - in0) as usize;
            at += used;
            let produced = (self.z.total_out() - out0) as usize;
            if out.len() + produced > max {
                return Err(InflateError::TooBig);
            }
            if produced > 0 {
                out.append(pool, &step[..produced]).map_err(|_| InflateError::Pool)?;
            }
            if status == Status::StreamEnd {
                // A final block (BFINAL) ends the stream: the rest of this message
                // (our tail) is ignored, and the next message starts a new stream.
                self.ended = true;
                return Ok(());
            }
            // Input used up and the output buffer not filled: this piece is done.
            if at == input.len() && produced < step.len() {
                return Ok(());
            }
            if produced == 0 && used == 0 {
                return Err(InflateError::Corrupt);
            }
        }
    }
}

/// A session's compression: what was agreed, and the state of each direction that keeps
/// its context between messages (drawn from the budget when the connection opens, given back
/// by [`release`](Self::release)). A direction that starts every message afresh uses the
/// loop's [`Codec`] instead, so it holds nothing between messages.
pub(crate) struct Deflate {
    pub(crate) agreement: Agreement,
    server: bool,
    /// This side's compressor, when it takes its context over (boxed, as zlib's stream
    /// records are large: a connection without one stays at a few words).
    deflater: Option<Box<Deflater>>,
    /// The decompressor for the peer's messages, when the peer takes its context over.
    inflater: Option<Box<Inflater>>,
    /// Invariant: these bytes are drawn from the pool's budget for the two above.
    drawn: usize,
}

impl Deflate {
    /// The compression of a connection (`server` or client side) that agreed on
    /// `agreement`: the state of a direction with context takeover is drawn from `pool`'s
    /// budget; `None` when the budget cannot cover it.
    pub(crate) fn new(
        pool: &mut Pool<'static>,
        agreement: Agreement,
        server: bool,
    ) -> Option<Box<Self>> {
        let drawn = agreement.dedicated_cost(server);
        pool.budget_mut().try_draw(drawn).ok()?;
        let (_, tx_reset) = agreement.side(server);
        let (_, rx_reset) = agreement.side(!server);
        Some(Box::new(Self {
            agreement,
            server,
            deflater: (!tx_reset).then(|| Box::new(agreement.deflater(server))),
            inflater: (!rx_reset).then(|| Box::new(agreement.inflater(server))),
            drawn,
        }))
    }

    /// Gives the drawn budget back.
    pub(crate) fn release(&mut self, pool: &mut Pool<'static>) {
        pool.budget_mut().give_back(std::mem::take(&mut self.drawn));
        self.deflater = None;
        self.inflater = None;
    }

    /// Compresses `data` into the codec's scratch, lent out until the caller has framed it
    /// and gives it back with [`Codec::put_scratch`]; `None` if this message goes
    /// uncompressed (below the threshold, or the loop cannot afford a compressor for this
    /// window).
    pub(crate) fn compress(
        &mut self,
        pool: &mut Pool<'static>,
        codec: &mut Codec,
        data: &[u8],
    ) -> Option<Vec<u8>> {
        if data.len() < codec.threshold {
            return None;
        }
        let mut scratch = std::mem::take(&mut codec.scratch);
        let deflater = match &mut self.deflater {
            Some(deflater) => deflater,
            None => match codec.shared_deflater(pool, self.agreement.side(self.server).0) {
                Some(deflater) => deflater,
                None => {
                    codec.scratch = scratch;
                    return None;
                }
            },
        };
        deflater.compress(data, &mut scratch);
        Some(scratch)
    }

    /// Inflates a whole compressed message (given as a slice or as a chain) into `out`.
    pub(crate) fn inflate(
        &mut self,
        pool: &mut Pool<'static>,
        codec: &mut Codec,
        input: Compressed<'_>,
        max: usize,
        out: &mut ChunkChain,
    ) -> Result<(), InflateError> {
        let inflater = match &mut self.inflater {
            Some(inflater) => inflater,
            None => match codec.shared_inflater(pool) {
                Some(inflater) => inflater,
                None => {
                    if let Compressed::Chain(mut chain) = input {
                        chain.clear(pool);
                    }
                    return Err(InflateError::Pool);
                }
            },
        };
        match input {
            Compressed::Slice(data) => inflater.inflate(pool, [data], max, out),
            Compressed::Chain(chain) => inflater.inflate_chain(pool, chain, max, out),
        }
    }
}

/// A compressed message as received.
pub(crate) enum Compressed<'b> {
    /// Whole in one read.
    Slice(&'b [u8]),
    /// Reassembled in pool chunks.
    Chain(ChunkChain),
}

/// An event loop's compression: in shared mode its compressors (one per window size in
/// use, each with no context between messages) and its decompressor; for every mode the
/// scratch a compressed message is written into before it is framed.
pub(crate) struct Codec {
    /// Indexed by window bits − 9.
    deflaters: [Option<Deflater>; 7],
    inflater: Option<Inflater>,
    scratch: Vec<u8>,
    /// Messages shorter than this go uncompressed.
    pub(crate) threshold: usize,
    /// Invariant: these bytes are drawn from the budget for the shared state.
    drawn: usize,
}

impl Codec {
    pub(crate) fn new(threshold: usize) -> Self {
        Self {
            deflaters: Default::default(),
            inflater: None,
            scratch: Vec::new(),
            threshold,
            drawn: 0,
        }
    }

    /// Takes back the scratch [`Deflate::compress`] lent out.
    pub(crate) fn put_scratch(&mut self, scratch: Vec<u8>) {
        self.scratch = scratch;
    }

    /// A published frame (one whole unmasked message, as `topics` frames it) compressed for
    /// subscribers that agreed on no server context takeover and a `bits` window: its payload
    /// deflated afresh by the loop's shared compressor and framed with RSV1 into pool chunks,
    /// to be queued by reference like the frame itself. `Ok(None)` when the message goes
    /// uncompressed (under the threshold); `Err` when the budget cannot cover the compressor
    /// or the chunks (the caller sends the frame uncompressed, which is always valid).
    pub(crate) fn compress_frame(
        &mut self,
        pool: &mut Pool<'static>,
        frame: &Frame,
        bits: u8,
    ) -> Result<Option<Frame>, NoMemory> {
        let mut head = [0u8; MAX_HEADER_LEN];
        let mut n = 0;
        for seg in frame.segments(pool) {
            let k = seg.len().min(head.len() - n);
            head[n..n + k].copy_from_slice(&seg[..k]);
            n += k;
            if n == head.len() {
                break;
            }
        }
        // NOTE: `topics` frames every publication with a valid, whole header.
        let Ok(Some((header, header_len))) = FrameHeader::parse(&head[..n]) else {
            return Ok(None);
        };
        if frame.len() - header_len < self.threshold {
            return Ok(None);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let Some(deflater) = self.shared_deflater(pool, bits) else {
            self.scratch = scratch;
            return Err(NoMemory);
        };
        let mut skip = header_len;
        let payload = frame.segments(pool).map(|seg| {
            let at = skip.min(seg.len());
            skip -= at;
            &seg[at..]
        });
        deflater.compress_parts(payload, &mut scratch);
        // RFC 7692 §6: RSV1 on the (only) frame of a compressed message.
        let compressed = FrameHeader { rsv: 0b100, payload_len: scratch.len() as u64, ..header };
        // NOTE(unwrap): an unmasked header is at most 10 bytes.
        let n = compressed.encode(&mut head).unwrap();
        let framed = Frame::from_parts(pool, &[&head[..n], &scratch]).map_err(|_| NoMemory);
        self.scratch = scratch;
        framed.map(Some)
    }

    fn shared_deflater(&mut self, pool: &mut Pool<'static>, bits: u8) -> Option<&mut Deflater> {
        let slot = &mut self.deflaters[usize::from(bits.clamp(9, 15) - 9)];
        if slot.is_none() {
            pool.budget_mut().try_draw(deflate_state_bytes(bits)).ok()?;
            self.drawn += deflate_state_bytes(bits);
            *slot = Some(Deflater::new(bits, true));
        }
        slot.as_mut()
    }

    fn shared_inflater(&mut self, pool: &mut Pool<'static>) -> Option<&mut Inflater> {
        if self.inflater.is_none() {
            pool.budget_mut().try_draw(inflate_state_bytes(15)).ok()?;
            self.drawn += inflate_state_bytes(15);
            self.inflater = Some(Inflater::new(15, true));
        }
        self.inflater.as_mut()
    }
}

/// Takes one received piece of a compressed message: it is kept (a whole one is inflated
/// at once from the read buffer), and the last piece inflates the message into pool chunks
/// under `max_message_size`, where [`Reassembler::take`] finds it; inflated text is validated
/// here (the core saw only deflate data). Every failure closes the connection with its code:
/// 1009 past the limit, the limits' code (1013 server, 1009 client) when the pool runs
/// short, 1007 for bad data or text.
#[allow(clippy::too_many_arguments)]
pub(crate) fn receive<'b>(
    inbound: &mut Reassembler,
    deflate: &mut Deflate,
    codec: Option<&mut Codec>,
    pool: &mut Pool<'static>,
    limits: &Reassembly,
    room: impl FnOnce(&Pool<'static>) -> usize,
    now: Instant,
    ws: &mut Connection,
    piece: Payload<'b>,
) -> Option<Received<'b>> {
    let kind = piece.kind;
    let input = if piece.message_start && piece.message_fin {
        Compressed::Slice(piece.data)
    } else {
        match inbound.piece(pool, limits, room, now, ws, piece)? {
            Received::Assembled(_) => Compressed::Chain(inbound.take()),
            Received::Whole(..) => return None,
        }
    };
    let max = usize::try_from(ws.config().max_message_size).unwrap_or(usize::MAX);
    let mut out = ChunkChain::new();
    let Some(codec) = codec else {
        if let Compressed::Chain(mut chain) = input {
            chain.clear(pool);
        }
        let _ = ws.close(now, CloseCode::INTERNAL_ERROR, "no decompressor");
        return None;
    };
    let (code, reason) = match deflate.inflate(pool, codec, input, max, &mut out) {
        Ok(()) if kind == MessageKind::Text && !valid_utf8(pool, &out) => {
            out.clear(pool);
            (CloseCode::INVALID_PAYLOAD, "invalid UTF-8 in text")
        }
        Ok(()) => {
            inbound.put(out);
            return Some(Received::Assembled(kind));
        }
        Err(e) => e.close(limits.code),
    };
    let _ = ws.close(now, code, reason);
    None
}

/// Validates inflated text (the core skips compressed messages: it sees only deflate data).
fn valid_utf8(pool: &Pool<'static>, chain: &ChunkChain) -> bool {
    let mut v = Utf8Validator::new();
    let mut segments = chain.segments(pool).peekable();
    if segments.peek().is_none() {
        return true;
    }
    while let Some(seg) = segments.next() {
        if v.feed(seg, segments.peek().is_none()).is_err() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests;
