//! The compressor and decompressor of permessage-deflate on zlib-rs (the `deflate` feature),
//! with their memory drawn from the pool's budget.
//!
//! Inflation is the dangerous half: a few kilobytes of input can expand to gigabytes. A
//! [`Inflater`] therefore writes into pool chunks in steps of at most one chunk and checks
//! the running size against `max_message_size` after every step, so a bomb is refused (1009)
//! as soon as it passes the limit, never after it has been inflated.

use flate2::{Compress, Compression as Level, Decompress, FlushCompress, FlushDecompress, Status};
use freeboard_buf::{ChunkChain, Frame, Pool};
use freeboard_proto::frame::{FrameHeader, MAX_HEADER_LEN};
use freeboard_proto::{CloseCode, Connection, Instant, MessageKind, Payload, utf8::Utf8Validator};

use super::super::{Reassembler, Reassembly, Received};
use super::{Agreement, NoMemory, deflate_state_bytes, inflate_state_bytes};

/// The four octets every compressed message ends with before §7.2.1 removes them.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

impl Agreement {
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
        input: Deflated<'_>,
        max: usize,
        out: &mut ChunkChain,
    ) -> Result<(), InflateError> {
        let inflater = match &mut self.inflater {
            Some(inflater) => inflater,
            None => match codec.shared_inflater(pool) {
                Some(inflater) => inflater,
                None => {
                    if let Deflated::Chain(mut chain) = input {
                        chain.clear(pool);
                    }
                    return Err(InflateError::Pool);
                }
            },
        };
        match input {
            Deflated::Slice(data) => inflater.inflate(pool, [data], max, out),
            Deflated::Chain(chain) => inflater.inflate_chain(pool, chain, max, out),
        }
    }
}

/// A compressed message as received.
pub(crate) enum Deflated<'b> {
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
        Deflated::Slice(piece.data)
    } else {
        match inbound.piece(pool, limits, room, now, ws, piece)? {
            Received::Assembled(_) => Deflated::Chain(inbound.take()),
            Received::Whole(..) => return None,
        }
    };
    let max = usize::try_from(ws.config().max_message_size).unwrap_or(usize::MAX);
    let mut out = ChunkChain::new();
    let Some(codec) = codec else {
        if let Deflated::Chain(mut chain) = input {
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
pub(super) fn valid_utf8(pool: &Pool<'static>, chain: &ChunkChain) -> bool {
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
