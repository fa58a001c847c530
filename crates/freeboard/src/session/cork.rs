//! The loop's cork: the replies of the connection being read, framed back to back into one
//! buffer while its send queue is empty, and written with one `write` when the read is done.
//! Only what the socket does not take goes into the queue's pool chunks (spilled), one message
//! at a time, so the drop policies still see whole messages there.

use freeboard_buf::{Limit, PageBuffer, Pool, SendQueue, Writability};
use freeboard_proto::frame::{FrameHeader, MAX_HEADER_LEN};

/// Messages a cork holds at most: each may need a pool slot if it is spilled.
pub(crate) const CORK_MESSAGES: usize = 256;

/// One loop's cork (see the [module docs](self)). Its buffer is drawn from the loop's budget;
/// its pages are resident once used, until [`give_back`](Self::give_back).
pub(crate) struct Cork {
    bytes: PageBuffer,
    /// Invariant: `len <= bytes.len()`.
    len: usize,
    /// Where each message starts in `bytes`, in order.
    ///
    /// Invariant: `starts[..messages]` is increasing, its first element is 0 when
    /// `messages > 0`, and `messages == 0` iff `len == 0`.
    starts: [u32; CORK_MESSAGES],
    messages: usize,
}

impl Cork {
    /// A cork of `capacity` bytes (at most 4 GiB).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.min(u32::MAX as usize);
        Self { bytes: PageBuffer::new(capacity), len: 0, starts: [0; CORK_MESSAGES], messages: 0 }
    }

    /// Returns the buffer's pages to the system (a quiet loop); it reads as zeros after.
    pub(crate) fn give_back(&mut self) {
        debug_assert!(self.is_empty(), "written before the loop waits");
        self.bytes.give_back();
    }

    /// Bytes it can hold.
    #[cfg(feature = "tokio")]
    pub(crate) fn capacity(&self) -> usize {
        self.bytes.len()
    }

    /// Bytes held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the replies held should be written before the session parses `unread`, the
    /// rest of its read: at [`CORK_MESSAGES`], or when the reply to the next frame, whole in
    /// `unread`, might not fit in what is left under the cork's size and the connection's
    /// `high` watermark (taken as the frame's payload plus one header array). A frame the
    /// read cuts is answered after a later read, once the cork has been written at the end
    /// of this one. Judging the next frame alone, not the whole rest of the read, writes
    /// the cork full: a read larger than the cork leaves in as few writes as it can (1 KiB
    /// echo, 4 clients, 128 KiB read buffer: 0.26–0.27 µs per message, against 0.28–0.29
    /// when the cork was written at half full whenever the rest of the read might not fit).
    #[inline]
    pub(crate) fn must_write(&self, high: usize, unread: &[u8]) -> bool {
        if self.messages >= CORK_MESSAGES {
            return true;
        }
        let room = self.bytes.len().min(high).saturating_sub(self.len);
        // Nothing to write, or no frame in `unread` has a larger payload than fits: the
        // common case, decided without a parse.
        if self.messages == 0 || unread.len() + MAX_HEADER_LEN <= room {
            return false;
        }
        next_reply_overflows(unread, room)
    }

    /// The header array of the next message, after what is held, when it and `payload` more
    /// bytes fit: frame into it, then [`commit`](Self::commit).
    #[inline(always)]
    pub(crate) fn slot(&mut self, payload: usize) -> Option<&mut [u8; MAX_HEADER_LEN]> {
        if self.messages >= CORK_MESSAGES || MAX_HEADER_LEN + payload > self.bytes.len() - self.len
        {
            return None;
        }
        self.bytes[self.len..].first_chunk_mut()
    }

    /// Appends the message framed in the [`slot`](Self::slot): its first `n` bytes, then
    /// `payload` (which overwrites what is past the header in the array).
    #[inline(always)]
    pub(crate) fn commit(&mut self, n: usize, payload: &[u8]) {
        let at = self.len;
        let mid = at + n;
        let end = mid + payload.len();
        self.bytes[mid..end].copy_from_slice(payload);
        self.starts[self.messages] = at as u32;
        self.messages += 1;
        self.len = end;
    }

    /// Forgets what is held (the connection's write failed).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
        self.messages = 0;
    }

    /// The bytes to write.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// After a write that took `written` bytes (or none, before the queue takes more): moves
    /// every message not wholly written into `queue`, the one the socket took a part of in
    /// flight (its rest leaves next; no policy may drop it), and empties the cork. Returns the
    /// last watermark crossing; `Err` when the pool cannot hold them: the stream would be
    /// torn, so the connection must end.
    pub(crate) fn spill(
        &mut self,
        queue: &mut SendQueue,
        pool: &mut Pool<'static>,
        written: usize,
    ) -> Result<Option<Writability>, Limit> {
        debug_assert!(written <= self.len && queue.is_empty());
        let (bytes, starts) = (&self.bytes[..self.len], &self.starts[..self.messages]);
        self.len = 0;
        self.messages = 0;
        if written >= bytes.len() {
            return Ok(None);
        }
        // The first message not wholly written: the last start at or before `written`.
        let first = starts.partition_point(|&s| s as usize <= written) - 1;
        let from = starts[first] as usize;
        let mut change = None;
        for (i, &start) in starts.iter().enumerate().skip(first) {
            let end = starts.get(i + 1).map_or(bytes.len(), |&e| e as usize);
            change = queue.push_accepted(pool, &bytes[start as usize..end])?.or(change);
        }
        Ok(queue.consume(pool, written - from).or(change))
    }
}

/// Whether the reply to the frame at the start of `unread`, if it is whole there, might not
/// fit in `room` bytes (taken as its payload plus one header array).
#[inline(never)]
fn next_reply_overflows(unread: &[u8], room: usize) -> bool {
    let Ok(Some((next, header_len))) = FrameHeader::parse(unread) else { return false };
    let whole = header_len as u64 + next.payload_len <= unread.len() as u64;
    whole && next.payload_len + MAX_HEADER_LEN as u64 > room as u64
}
