//! Byte queues made of chunk segments, and frames shared between them by reference.

use crate::pool::{NIL, Pool, PoolError, Slab, View};

/// A FIFO byte queue made of pool chunks: the unsent bytes of a connection, a message being
/// assembled, a frame being built.
///
/// The chain is a singly linked list of *segments* — `(chunk, start, end)` — whose slots come
/// from the pool's fixed segment slab, so the chain itself is 16 bytes and an empty chain holds
/// no chunk and no segment. Appending bytes copies them into the tail chunk while it has room
/// (any chunk may be appended to past its fill mark: bytes below it are never written again),
/// then into fresh chunks. Appending a [`Frame`] or a chunk *by reference* adds segments
/// without copying. [`consume`](Self::consume) drops bytes from the front and returns chunks
/// whose last reference goes. [`len`](Self::len) is O(1): it is WebSocket's `bufferedAmount`.
///
/// A chain does not release its chunks on drop (that needs `&mut Pool`): call
/// [`clear`](Self::clear) first, or the chunks stay counted in
/// [`Pool::chunks_in_use`].
///
/// ```
/// use freeboard_buf::{Budget, ChunkChain, Pool, PoolConfig};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new().with_chunk_size(8))?;
/// let mut chain = ChunkChain::new();
/// chain.append(&mut pool, b"hello, ")?;
/// chain.append(&mut pool, b"chunked world")?;
/// assert_eq!(chain.len(), 20);
///
/// let mut iov = [&[][..]; 4];
/// let n = chain.slices(&pool, &mut iov); // what writev would send
/// assert_eq!(iov[..n].concat(), b"hello, chunked world");
///
/// assert_eq!(chain.consume(&mut pool, 7), 7); // the socket took seven bytes
/// assert_eq!(chain.segments(&pool).flatten().copied().collect::<Vec<u8>>(), b"chunked world");
/// chain.clear(&mut pool);
/// assert_eq!(pool.chunks_in_use(), 0);
/// # Ok(()) }
/// ```
#[derive(Debug, PartialEq, Eq)]
pub struct ChunkChain {
    /// Invariant: `head == NIL` iff `tail == NIL` iff `len == 0`.
    head: u32,
    /// Invariant: the last segment reachable from `head`; its `next` is `NIL`.
    tail: u32,
    /// Invariant: the sum of the segments' lengths; every linked segment holds at least one
    /// byte.
    len: usize,
}

impl ChunkChain {
    /// An empty chain (no chunk, no segment).
    pub const fn new() -> Self {
        Self { head: NIL, tail: NIL, len: 0 }
    }

    /// Bytes in the chain. O(1).
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether the chain holds no byte (and so no chunk).
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `bytes` to the back of the chain. All or nothing: on error the chain and the pool
    /// are as before.
    #[inline]
    pub fn append(&mut self, pool: &mut Pool<'_>, bytes: &[u8]) -> Result<(), PoolError> {
        let mut slab = pool.slab();
        let mark = self.mark(slab.view());
        self.copy_in(&mut slab, bytes, false).inspect_err(|_| self.rollback(&mut slab, mark))
    }

    /// Appends the written bytes of `chunk` by reference (no copy; the chain takes its own
    /// reference, the caller keeps `chunk`).
    pub fn append_chunk(
        &mut self,
        pool: &mut Pool<'_>,
        chunk: &crate::ChunkId,
    ) -> Result<(), PoolError> {
        let mut slab = pool.slab();
        let end = slab.fill(chunk.index());
        if end == 0 {
            return Ok(());
        }
        let seg = slab.alloc_segment(chunk.index(), 0, end)?;
        self.link_back(&mut slab, seg);
        Ok(())
    }

    /// Appends `frame` by reference: one segment per chunk of the frame, no copy. All or
    /// nothing.
    pub fn append_frame(&mut self, pool: &mut Pool<'_>, frame: &Frame) -> Result<(), PoolError> {
        let mut slab = pool.slab();
        let mark = self.mark(slab.view());
        self.link_frame(&mut slab, frame).inspect_err(|_| self.rollback(&mut slab, mark))
    }

    /// Removes up to `n` bytes from the front (the socket wrote them); chunks whose last
    /// reference goes return to the pool. Returns the bytes removed.
    #[inline]
    pub fn consume(&mut self, pool: &mut Pool<'_>, n: usize) -> usize {
        self.consume_messages(&mut pool.slab(), n).0
    }

    /// Fills `out` with the chain's bytes in order ([`Segments`]), for a vectored write;
    /// returns how many slices were filled. Fewer than all the bytes are described if `out` is
    /// shorter than the slices they take.
    #[inline]
    pub fn slices<'p>(&self, pool: &'p Pool<'_>, out: &mut [&'p [u8]]) -> usize {
        let mut n = 0;
        for (slot, bytes) in out.iter_mut().zip(self.segments(pool)) {
            *slot = bytes;
            n += 1;
        }
        n
    }

    /// [`slices`](Self::slices) as `std::io::IoSlice`s, ready for `write_vectored`.
    #[cfg(feature = "std")]
    pub fn io_slices<'p>(&self, pool: &'p Pool<'_>, out: &mut [std::io::IoSlice<'p>]) -> usize {
        let mut n = 0;
        for (slot, bytes) in out.iter_mut().zip(self.segments(pool)) {
            *slot = std::io::IoSlice::new(bytes);
            n += 1;
        }
        n
    }

    /// The chain's bytes in order ([`Segments`]).
    #[inline]
    pub fn segments<'p>(&self, pool: &'p Pool<'_>) -> Segments<'p> {
        Segments { view: pool.view(), next: self.head }
    }

    /// Copies the first bytes of the chain into `out` without consuming them; returns the count.
    pub fn copy_to(&self, pool: &Pool<'_>, out: &mut [u8]) -> usize {
        let mut copied = 0;
        for bytes in self.segments(pool) {
            let n = bytes.len().min(out.len() - copied);
            out[copied..copied + n].copy_from_slice(&bytes[..n]);
            copied += n;
            if copied == out.len() {
                break;
            }
        }
        copied
    }

    /// Releases every segment and chunk reference; the chain is empty afterwards.
    pub fn clear(&mut self, pool: &mut Pool<'_>) {
        self.release_all(&mut pool.slab());
    }

    // ---- crate-internal: rollback marks, message boundaries ----

    pub(crate) fn release_all(&mut self, slab: &mut Slab<'_>) {
        let mut cur = self.head;
        while cur != NIL {
            cur = slab.free_segment(cur);
        }
        *self = Self::new();
    }

    #[inline]
    pub(crate) fn mark(&self, view: View<'_>) -> Mark {
        if self.tail == NIL {
            return Mark { tail: NIL, tail_end: 0, tail_fill: 0, len: self.len };
        }
        let seg = view.segment(self.tail);
        Mark {
            tail: self.tail,
            tail_end: seg.end,
            tail_fill: view.fill(seg.chunk()),
            len: self.len,
        }
    }

    /// Undoes everything appended since `mark`: segments after it go back to the slab, the old
    /// tail segment and its chunk's fill mark return to their old ends (the bytes written past
    /// them were referenced only by what is being undone).
    pub(crate) fn rollback(&mut self, slab: &mut Slab<'_>, mark: Mark) {
        let mut cur = if mark.tail == NIL { self.head } else { slab.segment(mark.tail).next };
        while cur != NIL {
            cur = slab.free_segment(cur);
        }
        if mark.tail == NIL {
            *self = Self::new();
        } else {
            let seg = slab.segment_mut(mark.tail);
            seg.end = mark.tail_end;
            seg.next = NIL;
            let chunk = seg.chunk();
            slab.rewind_fill(chunk, mark.tail_fill);
            self.tail = mark.tail;
            self.len = mark.len;
        }
    }

    /// The first segment added after `mark`.
    #[inline]
    pub(crate) fn first_after(&self, view: View<'_>, mark: &Mark) -> u32 {
        if mark.tail == NIL { self.head } else { view.segment(mark.tail).next }
    }

    /// Copies `bytes` in, starting a new segment for the first byte if `new_segment` (a message
    /// boundary must be a segment boundary). Not atomic: callers roll back on error.
    pub(crate) fn copy_in(
        &mut self,
        slab: &mut Slab<'_>,
        bytes: &[u8],
        new_segment: bool,
    ) -> Result<(), PoolError> {
        self.copy_in_with(slab, bytes, new_segment, &|dst, src, _| dst.copy_from_slice(src))
    }

    /// [`copy_in`](Self::copy_in), each piece written by `fill(dst, src, offset)`, where
    /// `offset` is the position of `src` in `all` (to mask while copying, say).
    pub(crate) fn copy_in_with(
        &mut self,
        slab: &mut Slab<'_>,
        all: &[u8],
        mut new_segment: bool,
        fill: &impl Fn(&mut [u8], &[u8], usize),
    ) -> Result<(), PoolError> {
        let mut bytes = all;
        while !bytes.is_empty() {
            let offset = all.len() - bytes.len();
            let write = |dst: &mut [u8], src: &[u8]| fill(dst, src, offset);
            if self.tail != NIL {
                let seg = slab.segment(self.tail);
                let chunk = seg.chunk();
                let fill = slab.fill(chunk);
                if (fill as usize) < slab.chunk_size() {
                    if !new_segment && seg.end == fill {
                        // Grow the tail segment in place: the common case for a stream.
                        let (_, n) = slab.write_at_fill_with(chunk, bytes, write);
                        slab.segment_mut(self.tail).end += n as u32;
                        self.len += n;
                        bytes = &bytes[n..];
                    } else {
                        // Room left in the tail chunk, but after someone else's bytes (or at a
                        // message boundary): a new segment in the same chunk.
                        let n = bytes.len().min(slab.chunk_size() - fill as usize);
                        let seg = slab.alloc_segment(chunk, fill, fill)?;
                        let (start, n) = slab.write_at_fill_with(chunk, &bytes[..n], write);
                        slab.segment_mut(seg).end = start + n as u32;
                        self.link_back(slab, seg);
                        bytes = &bytes[n..];
                        new_segment = false;
                    }
                    continue;
                }
            }
            let chunk = slab.alloc_chunk()?;
            let seg = match slab.alloc_segment_owning(chunk, 0, 0) {
                Ok(seg) => seg,
                Err(e) => {
                    slab.release_ref(chunk);
                    return Err(e);
                }
            };
            let (_, n) = slab.write_at_fill_with(chunk, bytes, write);
            slab.segment_mut(seg).end = n as u32;
            self.link_back(slab, seg);
            bytes = &bytes[n..];
            new_segment = false;
        }
        Ok(())
    }

    /// Links one new segment per segment of `frame`. Not atomic: callers roll back on error.
    #[inline]
    pub(crate) fn link_frame(
        &mut self,
        slab: &mut Slab<'_>,
        frame: &Frame,
    ) -> Result<(), PoolError> {
        let mut cur = frame.chain.head;
        while cur != NIL {
            let src = slab.segment(cur);
            let seg = slab.alloc_segment(src.chunk(), src.start, src.end)?;
            self.link_back(slab, seg);
            cur = src.next;
        }
        Ok(())
    }

    /// Links `frame` as a new message in one new segment, flagged as its start, if the frame
    /// is one segment and a slot is free; `false` (nothing changed, nothing counted) otherwise.
    #[inline]
    pub(crate) fn link_single_segment(&mut self, slab: &mut Slab<'_>, frame: &Frame) -> bool {
        let head = frame.chain.head;
        if head == NIL || head != frame.chain.tail || !slab.segment_available() {
            return false;
        }
        let src = slab.segment(head);
        let Ok(seg) = slab.alloc_segment(src.chunk(), src.start, src.end) else { return false };
        slab.segment_mut(seg).mark_message_start(false);
        self.link_back(slab, seg);
        true
    }

    #[inline]
    fn link_back(&mut self, slab: &mut Slab<'_>, seg: u32) {
        let len = slab.segment(seg).len();
        if self.tail == NIL {
            self.head = seg;
        } else {
            slab.segment_mut(self.tail).next = seg;
        }
        self.tail = seg;
        self.len += len;
    }

    /// Consumes up to `n` bytes; returns `(bytes, messages completed)`. A message is complete
    /// when its last segment is consumed, i.e. the next head starts a message or nothing is
    /// left. The first segment of a message loses its start flag once any of its bytes goes:
    /// the message is then in flight and no policy may drop it.
    #[inline]
    pub(crate) fn consume_messages(&mut self, slab: &mut Slab<'_>, n: usize) -> (usize, u32) {
        let total = n.min(self.len);
        let mut left = total;
        let mut completed = 0;
        while left > 0 {
            let seg = slab.segment_mut(self.head);
            let seg_len = seg.len();
            if left < seg_len {
                seg.start += left as u32;
                seg.clear_message_start();
                break;
            }
            left -= seg_len;
            let control = seg.is_control();
            self.head = slab.free_segment(self.head);
            if self.head == NIL || slab.segment(self.head).starts_message() {
                completed += 1;
            } else if control {
                // The rest of a control message in flight stays one.
                slab.segment_mut(self.head).mark_control();
            }
        }
        if self.head == NIL {
            self.tail = NIL;
        }
        self.len -= total;
        (total, completed)
    }

    /// Finds the oldest message after segment `kept` (the last of those no policy drops; NIL:
    /// none) that a policy may drop — not in flight, not a control message — and returns
    /// `(segment before it or NIL, its first segment)`.
    pub(crate) fn find_droppable(&self, view: View<'_>, kept: u32) -> Option<(u32, u32)> {
        let (mut prev, mut cur) = self.after(view, kept);
        while cur != NIL {
            let seg = view.segment(cur);
            if seg.starts_message() && !seg.is_control() {
                return Some((prev, cur));
            }
            prev = cur;
            cur = seg.next;
        }
        None
    }

    /// Unlinks the whole message whose first segment is `first` (`prev` links to it); returns
    /// its bytes.
    pub(crate) fn unlink_message(&mut self, slab: &mut Slab<'_>, prev: u32, first: u32) -> usize {
        let mut bytes = 0;
        let mut cur = first;
        loop {
            bytes += slab.segment(cur).len();
            cur = slab.free_segment(cur);
            if cur == NIL || slab.segment(cur).starts_message() {
                break;
            }
        }
        if prev == NIL {
            self.head = cur;
        } else {
            slab.segment_mut(prev).next = cur;
        }
        if cur == NIL {
            self.tail = prev;
        }
        self.len -= bytes;
        bytes
    }

    /// Bytes a policy may not drop: the rest of a message in flight, control messages, and
    /// everything up to segment `kept` (see [`find_droppable`](Self::find_droppable)), which
    /// is not walked.
    pub(crate) fn undroppable_bytes(&self, view: View<'_>, kept: u32) -> usize {
        let mut droppable = 0;
        let mut keep = true; // the head message is kept unless it has not started
        let (_, mut cur) = self.after(view, kept);
        while cur != NIL {
            let seg = view.segment(cur);
            if seg.starts_message() {
                keep = seg.is_control();
            }
            if !keep {
                droppable += seg.len();
            }
            cur = seg.next;
        }
        self.len - droppable
    }

    /// Where a walk past the kept messages starts: `(kept, the segment after it)`, or
    /// `(NIL, the head)` when `kept` is NIL.
    pub(crate) fn after(&self, view: View<'_>, kept: u32) -> (u32, u32) {
        match kept {
            NIL => (NIL, self.head),
            kept => (kept, view.segment(kept).next),
        }
    }

    pub(crate) fn head_index(&self) -> u32 {
        self.head
    }

    /// Copies the first bytes of the message whose first segment is `first` into `out`; the
    /// count.
    pub(crate) fn message_prefix(&self, view: View<'_>, first: u32, out: &mut [u8]) -> usize {
        let mut n = 0;
        let mut cur = first;
        while cur != NIL && n < out.len() {
            let seg = view.segment(cur);
            if cur != first && seg.starts_message() {
                break;
            }
            let bytes = view.segment_bytes(&seg);
            let take = bytes.len().min(out.len() - n);
            out[n..n + take].copy_from_slice(&bytes[..take]);
            n += take;
            cur = seg.next;
        }
        n
    }

    pub(crate) fn tail_index(&self) -> u32 {
        self.tail
    }

    /// The data messages (not control ones) the chain holds, the one in flight included.
    pub(crate) fn data_messages(&self, view: View<'_>) -> u32 {
        let mut messages = 0;
        let mut cur = self.head;
        while cur != NIL {
            let seg = view.segment(cur);
            // The head is a message's first segment or, in flight, the rest of one.
            if (cur == self.head || seg.starts_message()) && !seg.is_control() {
                messages += 1;
            }
            cur = seg.next;
        }
        messages
    }

    /// Whether the head message has started to go out.
    pub(crate) fn head_in_flight(&self, view: View<'_>) -> bool {
        self.head != NIL && !view.segment(self.head).starts_message()
    }
}

impl Default for ChunkChain {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a chain ended before an operation, to undo it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    tail: u32,
    tail_end: u32,
    tail_fill: u32,
    len: usize,
}

/// The bytes of a chain or frame in order, one slice per segment, or per run of segments
/// that lie side by side in one chunk (from [`ChunkChain::segments`] or [`Frame::segments`]).
///
/// ```
/// use freeboard_buf::{Budget, ChunkChain, Pool, PoolConfig};
///
/// let mut pool = Pool::new(Budget::new(1 << 16), PoolConfig::new().with_chunk_size(4)).unwrap();
/// let mut chain = ChunkChain::new();
/// chain.append(&mut pool, b"abcdef").unwrap();
/// let parts: Vec<&[u8]> = chain.segments(&pool).collect();
/// assert_eq!(parts, [&b"abcd"[..], &b"ef"[..]]);
/// chain.clear(&mut pool);
/// ```
#[derive(Debug, Clone)]
pub struct Segments<'p> {
    view: View<'p>,
    next: u32,
}

impl<'p> Iterator for Segments<'p> {
    type Item = &'p [u8];

    #[inline]
    fn next(&mut self) -> Option<&'p [u8]> {
        if self.next == NIL {
            return None;
        }
        let seg = self.view.segment(self.next);
        let (chunk, mut end) = (seg.chunk(), seg.end);
        self.next = seg.next;
        // Segments that continue one another in a chunk (frames framed one after another
        // are packed so) leave as one slice: a vectored write of them costs less per byte.
        while self.next != NIL {
            let after = self.view.segment(self.next);
            if after.chunk() != chunk || after.start != end {
                break;
            }
            end = after.end;
            self.next = after.next;
        }
        Some(self.view.chunk_bytes(chunk, seg.start, end))
    }
}

/// A message framed once into pool chunks and shared *by reference* with any number of chains
/// of the same pool: zero-copy broadcast.
///
/// Appending a frame to a chain ([`ChunkChain::append_frame`],
/// [`SendQueue::push_frame`](crate::SendQueue::push_frame)) costs one segment slot and one
/// reference-count increment per chunk of the frame, whatever its size; the chunks return to
/// the pool when the frame and the last chain referencing them have let go. The counts are
/// plain integers: a frame never leaves its event loop. To reach another loop, copy it into a
/// [`SharedFrame`](crate::SharedFrame) (`Arc<[u8]>`, feature `alloc`), which that loop frames
/// once into its own pool.
///
/// Like a chain, a frame must be given back with [`release`](Self::release).
///
/// ```
/// use freeboard_buf::{Budget, Frame, Pool, PoolConfig, SendQueue};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new())?;
/// let frame = Frame::from_parts(&mut pool, &[b"\x81\x04", b"goal"])?;
/// let mut subscribers: Vec<SendQueue> = (0..100).map(|_| SendQueue::default()).collect();
/// for queue in &mut subscribers {
///     let _ = queue.push_frame(&mut pool, &frame);
/// }
/// frame.release(&mut pool);
/// assert_eq!(pool.chunks_in_use(), 1); // one copy for a hundred subscribers
/// for queue in &mut subscribers {
///     let _ = queue.clear(&mut pool);
/// }
/// assert_eq!(pool.chunks_in_use(), 0);
/// # Ok(()) }
/// ```
#[must_use = "a Frame holds chunk references; give them back with Frame::release"]
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    /// Invariant: never appended to after construction, so its segments describe fixed bytes.
    chain: ChunkChain,
}

impl Frame {
    #[cfg(test)]
    pub(crate) fn chain(&self) -> &ChunkChain {
        &self.chain
    }

    /// Copies `parts` (e.g. a frame header and its payload) into pool chunks. A frame that fits
    /// in the room left after the previous frame is packed behind it, in one segment, so small
    /// broadcasts share chunks; otherwise it starts a fresh chunk.
    pub fn from_parts(pool: &mut Pool<'_>, parts: &[&[u8]]) -> Result<Self, PoolError> {
        let len = parts.iter().map(|p| p.len()).sum();
        let mut slab = pool.slab();
        let mut chain = ChunkChain::new();
        if let Some((chunk, fill)) = slab.frame_room(len).filter(|_| len > 0) {
            let seg = slab.alloc_segment(chunk, fill, fill)?;
            for part in parts {
                slab.write_at_fill(chunk, part);
            }
            slab.segment_mut(seg).end = fill + len as u32;
            chain.link_back(&mut slab, seg);
        } else {
            for part in parts {
                if let Err(e) = chain.copy_in(&mut slab, part, false) {
                    chain.release_all(&mut slab);
                    return Err(e);
                }
            }
        }
        if chain.tail != NIL {
            let chunk = slab.segment(chain.tail).chunk();
            slab.set_frame_hint(chunk);
        }
        Ok(Frame { chain })
    }

    /// The frame's length in bytes.
    pub const fn len(&self) -> usize {
        self.chain.len
    }

    /// Whether the frame is empty.
    pub const fn is_empty(&self) -> bool {
        self.chain.len == 0
    }

    /// Another handle on the same bytes (one segment and one reference per chunk, no copy).
    pub fn share(&self, pool: &mut Pool<'_>) -> Result<Frame, PoolError> {
        let mut chain = ChunkChain::new();
        chain.append_frame(pool, self)?;
        Ok(Frame { chain })
    }

    /// The frame's bytes in order, one slice per chunk.
    #[inline]
    pub fn segments<'p>(&self, pool: &'p Pool<'_>) -> Segments<'p> {
        self.chain.segments(pool)
    }

    /// Gives back this handle's references.
    pub fn release(mut self, pool: &mut Pool<'_>) {
        self.chain.clear(pool);
    }
}

/// One piece of a message pushed to a [`SendQueue`](crate::SendQueue): bytes to copy, or a
/// [`Frame`] to reference.
///
/// ```
/// use freeboard_buf::{Budget, Frame, Part, Pool, PoolConfig, SendQueue};
///
/// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new()).unwrap();
/// let payload = Frame::from_parts(&mut pool, &[b"shared payload"]).unwrap();
/// let mut queue = SendQueue::default();
/// let header = [0x82u8, 14];
/// let _ = queue.push_parts(&mut pool, &[Part::Bytes(&header), Part::Frame(&payload)]);
/// assert_eq!(queue.len(), 16);
/// payload.release(&mut pool);
/// let _ = queue.clear(&mut pool);
/// ```
#[derive(Debug, Clone, Copy)]
pub enum Part<'m> {
    /// Bytes copied into the queue's chunks.
    Bytes(&'m [u8]),
    /// A frame appended by reference.
    Frame(&'m Frame),
}

impl Part<'_> {
    /// The part's length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Part::Bytes(bytes) => bytes.len(),
            Part::Frame(frame) => frame.len(),
        }
    }

    /// Whether the part is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'m> From<&'m [u8]> for Part<'m> {
    fn from(bytes: &'m [u8]) -> Self {
        Part::Bytes(bytes)
    }
}

impl<'m> From<&'m Frame> for Part<'m> {
    fn from(frame: &'m Frame) -> Self {
        Part::Frame(frame)
    }
}
