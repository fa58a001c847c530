//! The receive half of the message layer: pieces of messages kept in pool chunks under
//! limits, and the contiguous copy handlers that take a slice get.

use freeboard_buf::{ChunkChain, Pool};
use freeboard_proto::{CloseCode, Connection, Instant, MessageKind, Payload};

/// How much a message that arrives in pieces may take from the pool, and what the peer hears
/// when it cannot have it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reassembly {
    /// Bytes the pool must keep free after each piece is stored.
    pub(crate) keep_free: usize,
    /// The close code for a message that does not fit.
    pub(crate) code: CloseCode,
    /// Its reason.
    pub(crate) reason: &'static str,
}

impl Reassembly {
    /// A server keeps half a connection's reserve free, so one sender cannot take what the
    /// open connections need to go on echoing; a message that does not fit is a passing
    /// shortage (1013).
    pub(crate) fn server(connection_reserve: usize) -> Self {
        Self {
            keep_free: connection_reserve / 2,
            code: CloseCode::TRY_AGAIN_LATER,
            reason: "server memory budget exhausted",
        }
    }

    /// A client's receive pool is its own: a message that does not fit is too big (1009).
    pub(crate) const CLIENT: Self = Self {
        keep_free: 0,
        code: CloseCode::MESSAGE_TOO_BIG,
        reason: "message exceeds the client's memory budget",
    };
}

/// A message [`Session::receive`](super::Session::receive) completed.
#[derive(Debug)]
pub(crate) enum Received<'b> {
    /// It arrived whole in this read: borrowed from the read buffer, unmasked in place.
    Whole(MessageKind, &'b [u8]),
    /// It arrived in pieces, now in pool chunks: take it with
    /// [`Session::take_message`](super::Session::take_message).
    Assembled(MessageKind),
}

/// The receive half of the message layer: pieces of a message that arrived over several
/// reads or frames, kept in pool chunks under the driver's [`Reassembly`] limits.
#[derive(Default)]
pub(crate) struct Reassembler {
    /// A partial request head, a request body, or the message being reassembled. Empty (no
    /// chunk) when idle.
    partial: ChunkChain,
    /// The message being read did not fit: its remaining pieces are dropped.
    discarding: bool,
}

impl Reassembler {
    /// Takes one piece of a data message from the core. A message that does not fit (the
    /// pool, or `room`: what the connection may hold of it, see
    /// [`FairShare::reassembly_room`](super::FairShare::reassembly_room)) closes the connection with
    /// the limits' code rather than reach the application truncated.
    #[inline]
    pub(crate) fn piece<'b>(
        &mut self,
        pool: &mut Pool<'static>,
        limits: &Reassembly,
        room: impl FnOnce(&Pool<'static>) -> usize,
        now: Instant,
        ws: &mut Connection,
        piece: Payload<'b>,
    ) -> Option<Received<'b>> {
        if piece.message_start && piece.message_fin {
            return Some(Received::Whole(piece.kind, piece.data));
        }
        let room = room(pool);
        self.fragment(pool, limits, room, now, ws, piece)
    }

    /// [`piece`](Self::piece) for a message in several pieces.
    #[inline(never)]
    fn fragment<'b>(
        &mut self,
        pool: &mut Pool<'static>,
        limits: &Reassembly,
        room: usize,
        now: Instant,
        ws: &mut Connection,
        piece: Payload<'b>,
    ) -> Option<Received<'b>> {
        if self.discarding {
            self.discarding = !piece.message_fin;
            return None;
        }
        if pool.chunks_free() * pool.chunk_size() < piece.data.len() + limits.keep_free
            || self.partial.len() + piece.data.len() > room
            || self.partial.append(pool, piece.data).is_err()
        {
            self.partial.clear(pool);
            self.discarding = !piece.message_fin;
            let _ = ws.close(now, limits.code, limits.reason);
            return None;
        }
        piece.message_fin.then_some(Received::Assembled(piece.kind))
    }

    /// Whether the message being reassembled holds more than `room` bytes.
    pub(crate) fn holds_more_than(&self, room: usize) -> bool {
        !self.discarding && self.partial.len() > room
    }

    /// Gives the message's chunks back and drops its remaining pieces, as when a piece does
    /// not fit.
    pub(crate) fn abandon(&mut self, pool: &mut Pool<'static>) {
        self.partial.clear(pool);
        self.discarding = true;
    }

    /// The message [`piece`](Self::piece) reported as assembled; the caller releases it.
    pub(crate) fn take(&mut self) -> ChunkChain {
        std::mem::take(&mut self.partial)
    }

    /// Puts a whole message (an inflated one) where [`take`](Self::take) finds it.
    #[cfg(feature = "deflate")]
    pub(crate) fn put(&mut self, message: ChunkChain) {
        debug_assert!(self.partial.is_empty());
        self.partial = message;
    }

    /// The chain itself: a server keeps a partial request head or body in it.
    pub(crate) fn partial_mut(&mut self) -> &mut ChunkChain {
        &mut self.partial
    }

    /// Gives the chunks back.
    pub(crate) fn clear(&mut self, pool: &mut Pool<'static>) {
        self.partial.clear(pool);
    }
}

/// A contiguous copy of messages that arrived in pieces, for handlers that take a slice. One
/// per driver; its growth is drawn from the pool's budget.
#[derive(Default)]
pub(crate) struct Assembly {
    bytes: Vec<u8>,
    /// Invariant: `bytes.capacity()` bytes are drawn from the pool's budget.
    drawn: usize,
}

impl Assembly {
    /// Copies `chain` out of the pool (and releases it); `None` when the budget cannot cover
    /// the copy.
    pub(crate) fn fill(
        &mut self,
        pool: &mut Pool<'static>,
        mut chain: ChunkChain,
    ) -> Option<&[u8]> {
        let len = chain.len();
        if len > self.bytes.capacity() {
            if pool.budget_mut().try_draw(len - self.drawn).is_err() {
                chain.clear(pool);
                return None;
            }
            self.drawn = len;
            self.bytes.clear();
            self.bytes.reserve_exact(len);
        }
        self.bytes.clear();
        for segment in chain.segments(pool) {
            self.bytes.extend_from_slice(segment);
        }
        chain.clear(pool);
        Some(&self.bytes)
    }
}
