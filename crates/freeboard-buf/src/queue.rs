//! The per-connection send queue: a chunk chain that knows where messages begin.

use crate::backpressure::{SlowConsumerPolicy, Watermarks, Writability};
use crate::chain::{ChunkChain, Frame, Part, Segments};
use crate::pool::{NIL, Pool, PoolError, Slab};

/// The largest control frame on the wire: 2 header bytes, a 4-byte mask and 125 payload bytes
/// (RFC 6455 §5.5: "All control frames MUST have a payload length of 125 bytes or less").
/// [`SendQueue::push_control`] may exceed the cap by at most this much.
pub const MAX_CONTROL_FRAME: usize = 2 + 4 + 125;

/// A connection's outgoing bytes, queued as whole messages, with watermarks and a
/// slow-consumer policy.
///
/// Each push is one message (typically a frame header and its payload, copied or referenced)
/// and is stored all or nothing. The queue remembers where each message starts — a flag on the
/// message's first segment, so boundaries cost no extra memory — which lets policies drop
/// *whole* messages, and never one whose first byte has already been handed to the socket: a
/// torn frame would corrupt the stream.
///
/// Call order per loop turn: `push_*` as messages are produced; [`slices`](Self::slices) or
/// [`io_slices`](Self::io_slices) for one `writev`; [`consume`](Self::consume) with the bytes
/// the socket took. Pushes and `consume` return the [`Writability`] transition they caused.
///
/// 56 bytes on 64-bit targets; an empty queue holds no chunk and no segment.
///
/// ```
/// use freeboard_buf::{Budget, Pool, PoolConfig, PushOutcome, SendQueue, SlowConsumerPolicy,
///     Watermarks, Writability};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new())?;
/// let marks = Watermarks::new(4, 8, 14)?;
/// let mut queue = SendQueue::new(marks, SlowConsumerPolicy::DropOldest);
///
/// assert_eq!(queue.push_message(&mut pool, &[b"aaaa"]).outcome, PushOutcome::Queued);
/// let _ = queue.consume(&mut pool, 1); // "a" is on the wire: message 1 is in flight
/// let pushed = queue.push_message(&mut pool, &[b"bbbbb"]);
/// assert_eq!(pushed.outcome, PushOutcome::Queued);
/// let pushed = queue.push_message(&mut pool, &[b"ccccc"]);
/// assert_eq!(pushed.outcome, PushOutcome::QueuedAboveHigh);
/// assert_eq!(pushed.writability, Some(Writability::NotWritable));
///
/// // 15 bytes would pass the cap of 14: the oldest *unsent* message goes, the one in flight stays.
/// let pushed = queue.push_message(&mut pool, &[b"dd"]);
/// assert_eq!(pushed.outcome, PushOutcome::Dropped { newest: false, messages: 1, bytes: 5 });
///
/// let mut out = [0u8; 32];
/// let n = queue.copy_to(&pool, &mut out);
/// assert_eq!(&out[..n], b"aaacccccdd");
/// let _ = queue.clear(&mut pool);
/// # Ok(()) }
/// ```
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SendQueue {
    /// Invariant: every message starts at a segment boundary; the first segment of a message
    /// carries the start flag until its first byte is consumed.
    chain: ChunkChain,
    /// Invariant: `watermarks.is_writable()` reflects `chain.len()` as of the last operation.
    watermarks: Watermarks,
    policy: SlowConsumerPolicy,
    /// Invariant: the number of messages with at least one byte in `chain`.
    messages: u32,
    /// Under [`SlowConsumerPolicy::Conflate`]: conflate per key rather than all at once.
    conflate_key: Option<ConflateKey>,
    /// Invariant: `kept <= messages`; the first `kept` messages (the one in flight counted)
    /// are dropped by no policy ([`keep_queued`](Self::keep_queued)).
    kept: u32,
    /// Invariant: the last segment of the last kept message while `kept > 0`, else `NIL`: the
    /// policies look for what to drop after it, so a long replay is not walked per push.
    kept_tail: u32,
}

/// How a keyed `conflate` queue tells a message's key: the bytes of the message's payload (an
/// unmasked server WebSocket frame: its header is skipped; a Server-Sent Event if `events`:
/// its first `data:` line) before the first `delimiter`, looked for in the first
/// [`MAX_KEY`](ConflateKey::MAX_KEY) bytes; after a topic history envelope
/// (`{digits}-{digits}:`) if `after_envelope`. A message without the delimiter there has the
/// empty key.
///
/// A queue behind its high watermark then drops only the unsent messages with the new one's
/// key, so a feed of several instruments keeps the latest of each; at its cap it drops every
/// unsent message, as plain `conflate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConflateKey {
    /// The byte that ends the key (e.g. `b'|'` for `EURUSD|{...}`).
    pub delimiter: u8,
    /// Whether payloads start with a history envelope to skip.
    pub after_envelope: bool,
    /// Whether the messages are Server-Sent Events (`id:` and `event:` lines, then `data:`)
    /// rather than WebSocket frames. An event's offset is its `id:`, never in its data.
    pub events: bool,
}

impl ConflateKey {
    /// The longest key, in bytes.
    pub const MAX_KEY: usize = 64;
    /// The bytes a key is read from: a frame's header (10), envelope (42) and key; or an
    /// event's `id:` line (4 + 42 + 1), its `event:` line (7 + a topic of 128 + `+base64` +
    /// 1), `data: ` and the key.
    const PREFIX: usize = 47 + 143 + 6 + Self::MAX_KEY + 1;

    /// The key of the message that starts with `bytes` (its first [`Self::PREFIX`] bytes or
    /// fewer).
    fn of<'b>(&self, bytes: &'b [u8]) -> &'b [u8] {
        if self.events {
            return self.key_in(event_data(bytes));
        }
        let header = match bytes.get(1).map(|b| b & 0x7f) {
            Some(126) => 4,
            Some(127) => 10,
            Some(_) => 2,
            None => return &[],
        };
        let mut payload = bytes.get(header..).unwrap_or_default();
        if self.after_envelope
            && let Some(colon) = payload.iter().take(42).position(|b| *b == b':')
            && is_offset(&payload[..colon])
        {
            payload = &payload[colon + 1..];
        }
        self.key_in(payload)
    }

    /// The bytes of `payload` before the delimiter, if it is within the key's reach.
    fn key_in<'b>(&self, payload: &'b [u8]) -> &'b [u8] {
        let payload = &payload[..payload.len().min(Self::MAX_KEY + 1)];
        match payload.iter().position(|b| *b == self.delimiter) {
            Some(end) => &payload[..end],
            None => &[],
        }
    }
}

/// What follows `data:` (and the one space the event-stream format allows after it) in the
/// event that starts with `bytes`, once its `id:` and `event:` lines are passed; empty
/// when no `data:` line starts within `bytes`.
fn event_data(mut bytes: &[u8]) -> &[u8] {
    while bytes.starts_with(b"id:") || bytes.starts_with(b"event:") {
        let Some(end) = bytes.iter().position(|b| *b == b'\n') else { return &[] };
        bytes = &bytes[end + 1..];
    }
    match bytes.strip_prefix(b"data:") {
        Some(data) => data.strip_prefix(b" ").unwrap_or(data),
        None => &[],
    }
}

/// Whether `bytes` is an offset, `{digits}-{digits}`.
fn is_offset(bytes: &[u8]) -> bool {
    let Some(dash) = bytes.iter().position(|b| *b == b'-') else { return false };
    let (a, b) = (&bytes[..dash], &bytes[dash + 1..]);
    !a.is_empty() && !b.is_empty() && a.iter().chain(b).all(u8::is_ascii_digit)
}

impl SendQueue {
    /// An empty queue.
    pub const fn new(watermarks: Watermarks, policy: SlowConsumerPolicy) -> Self {
        let chain = ChunkChain::new();
        Self { chain, watermarks, policy, messages: 0, conflate_key: None, kept: 0, kept_tail: NIL }
    }

    /// Makes a `conflate` queue conflate per key (see [`ConflateKey`]).
    pub const fn with_conflate_key(mut self, key: ConflateKey) -> Self {
        self.conflate_key = Some(key);
        self
    }

    /// Unsent bytes (WebSocket's `bufferedAmount`). O(1).
    pub const fn len(&self) -> usize {
        self.chain.len()
    }

    /// Whether nothing is queued.
    pub const fn is_empty(&self) -> bool {
        self.chain.is_empty()
    }

    /// Messages with at least one unsent byte, including one in flight.
    pub const fn messages(&self) -> u32 {
        self.messages
    }

    /// Keeps every message queued now from the policy: no policy drops them later, and a
    /// policy that needs room drops newer messages (or the new one) instead. For what a
    /// peer asked for and must get whole or not at all — a resumed subscriber's replay — so
    /// that a publication arriving behind it cannot conflate it away. They still count
    /// against the cap. [`discard_unsent`](Self::discard_unsent) and [`clear`](Self::clear)
    /// drop them (the connection is closing).
    ///
    /// ```
    /// use freeboard_buf::{Budget, Pool, PoolConfig, PushOutcome, SendQueue, SlowConsumerPolicy, Watermarks};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new())?;
    /// let mut queue = SendQueue::new(Watermarks::new(2, 4, 64)?, SlowConsumerPolicy::Conflate);
    /// for message in [b"replay1", b"replay2"] {
    ///     let _ = queue.push_message(&mut pool, &[message]);
    ///     queue.keep_queued(); // after each: replay2 finds the queue behind
    /// }
    /// let _ = queue.push_message(&mut pool, &[b"live1"]);
    /// let pushed = queue.push_message(&mut pool, &[b"live2"]);
    /// assert_eq!(pushed.outcome, PushOutcome::Dropped { newest: false, messages: 1, bytes: 5 });
    /// let mut out = [0u8; 64];
    /// let n = queue.copy_to(&pool, &mut out);
    /// assert_eq!(&out[..n], b"replay1replay2live2");
    /// let _ = queue.clear(&mut pool);
    /// # Ok(()) }
    /// ```
    pub fn keep_queued(&mut self) {
        self.kept = self.messages;
        self.kept_tail = if self.kept == 0 { NIL } else { self.chain.tail_index() };
    }

    /// Messages [`keep_queued`](Self::keep_queued) keeps from the policy that are still
    /// queued (the one in flight counted).
    pub const fn kept(&self) -> u32 {
        self.kept
    }

    /// Whether producers may keep writing (see [`Watermarks`]).
    pub const fn is_writable(&self) -> bool {
        self.watermarks.is_writable()
    }

    /// The queue's watermarks.
    pub const fn watermarks(&self) -> &Watermarks {
        &self.watermarks
    }

    /// The queue's slow-consumer policy.
    pub const fn policy(&self) -> SlowConsumerPolicy {
        self.policy
    }

    /// The key a `conflate` queue conflates by, if any.
    pub const fn conflate_key(&self) -> Option<ConflateKey> {
        self.conflate_key
    }

    /// Whether the first message has started to go out (so no policy may drop it).
    pub fn has_message_in_flight(&self, pool: &Pool<'_>) -> bool {
        self.chain.head_in_flight(pool.view())
    }

    /// Queues one message made of `parts`, copied (e.g. `&[header, payload]`).
    #[inline]
    pub fn push_message(&mut self, pool: &mut Pool<'_>, parts: &[&[u8]]) -> Pushed {
        let len = parts.iter().map(|p| p.len()).sum();
        self.push_with(pool, len, |chain, pool| {
            let mut first = true;
            for part in parts.iter().filter(|p| !p.is_empty()) {
                chain.copy_in(pool, part, first)?;
                first = false;
            }
            Ok(())
        })
    }

    /// Queues one message of `header` and `payload`, the payload written into the chunks by
    /// `fill(dst, src, offset)` (`offset`: where `src` starts in `payload`) — to mask it while
    /// copying, say, instead of copying twice.
    ///
    /// ```
    /// use freeboard_buf::{Budget, Pool, PoolConfig, SendQueue};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new().with_chunk_size(4))?;
    /// let mut queue = SendQueue::default();
    /// let key = [1, 2, 3, 4];
    /// let _ = queue.push_message_with(&mut pool, b"\x82\x86", b"abcdef", |dst, src, offset| {
    ///     for (i, (d, s)) in dst.iter_mut().zip(src).enumerate() {
    ///         *d = s ^ key[(offset + i) % 4];
    ///     }
    /// });
    /// let mut out = [0u8; 8];
    /// assert_eq!(queue.copy_to(&pool, &mut out), 8);
    /// assert_eq!(&out[2..], [b'a' ^ 1, b'b' ^ 2, b'c' ^ 3, b'd' ^ 4, b'e' ^ 1, b'f' ^ 2]);
    /// let _ = queue.clear(&mut pool);
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn push_message_with(
        &mut self,
        pool: &mut Pool<'_>,
        header: &[u8],
        payload: &[u8],
        fill: impl Fn(&mut [u8], &[u8], usize),
    ) -> Pushed {
        self.push_with(pool, header.len() + payload.len(), |chain, pool| {
            if !header.is_empty() {
                chain.copy_in(pool, header, true)?;
            }
            if !payload.is_empty() {
                chain.copy_in_with(pool, payload, header.is_empty(), &fill)?;
            }
            Ok(())
        })
    }

    /// Queues a shared frame by reference (zero-copy broadcast).
    #[inline]
    pub fn push_frame(&mut self, pool: &mut Pool<'_>, frame: &Frame) -> Pushed {
        let len = frame.len();
        if self.keeps_every_message(len) {
            // A fan-out's usual delivery: a frame in one segment, taken whole or not at all by
            // one slot, so there is nothing to roll back.
            let mut slab = pool.slab();
            if self.chain.link_single_segment(&mut slab, frame) {
                self.messages += 1;
                let outcome = self.queued();
                return Pushed { outcome, writability: self.watermarks.observe(self.len()) };
            }
        }
        self.push_with(pool, len, |chain, pool| chain.link_frame(pool, frame))
    }

    /// Queues one message made of copied bytes and referenced frames, in order.
    pub fn push_parts(&mut self, pool: &mut Pool<'_>, parts: &[Part<'_>]) -> Pushed {
        let len = parts.iter().map(Part::len).sum();
        self.push_with(pool, len, |chain, pool| {
            let mut first = true;
            for part in parts.iter().filter(|p| !p.is_empty()) {
                match part {
                    Part::Bytes(bytes) => chain.copy_in(pool, bytes, first)?,
                    Part::Frame(frame) => chain.link_frame(pool, frame)?,
                }
                first = false;
            }
            Ok(())
        })
    }

    /// Queues a control frame (ping, pong, close) of `parts`, bypassing the policy: it may take
    /// the queue past its cap by at most [`MAX_CONTROL_FRAME`] bytes, and no policy drops it
    /// later. This is how the close frame after [`PushOutcome::MustClose`] gets out. Fails
    /// with the [`Limit`] that stopped it; nothing is queued then.
    pub fn push_control(
        &mut self,
        pool: &mut Pool<'_>,
        parts: &[&[u8]],
    ) -> Result<Option<Writability>, Limit> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > MAX_CONTROL_FRAME || self.len() + len > self.watermarks.cap() + MAX_CONTROL_FRAME {
            return Err(Limit::Cap);
        }
        if len > 0 {
            self.store(pool, true, |chain, pool| {
                let mut first = true;
                for part in parts.iter().filter(|p| !p.is_empty()) {
                    chain.copy_in(pool, part, first)?;
                    first = false;
                }
                Ok(())
            })
            .map_err(|_| Limit::Pool)?;
        }
        Ok(self.watermarks.observe(self.len()))
    }

    /// Queues the rest of `frame`, of which the socket already took the first `written` bytes
    /// (written straight while this queue was empty): the message is in flight, so it goes
    /// past the cap and the policy as a control frame does, and no policy drops it later
    /// (a frame cut short would tear the stream). It takes segment slots only, the frame's
    /// chunks being shared; fails with [`Limit::Pool`] when the pool has none left (nothing
    /// is queued then). Returns the watermark crossing it caused.
    ///
    /// ```
    /// use freeboard_buf::{Budget, Frame, Pool, PoolConfig, SendQueue, SlowConsumerPolicy, Watermarks};
    ///
    /// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new()).unwrap();
    /// let marks = Watermarks::new(2, 4, 8).unwrap();
    /// let mut queue = SendQueue::new(marks, SlowConsumerPolicy::DropNewest);
    /// let frame = Frame::from_parts(&mut pool, &[b"\x82\x0a", b"0123456789"]).unwrap();
    /// queue.push_frame_rest(&mut pool, &frame, 3).unwrap(); // 9 bytes left, over the cap
    /// assert_eq!((queue.len(), queue.messages()), (9, 1));
    /// assert!(queue.has_message_in_flight(&pool));
    /// frame.release(&mut pool);
    /// let _ = queue.clear(&mut pool);
    /// ```
    pub fn push_frame_rest(
        &mut self,
        pool: &mut Pool<'_>,
        frame: &Frame,
        written: usize,
    ) -> Result<Option<Writability>, Limit> {
        debug_assert!(self.is_empty() && written < frame.len());
        self.store(pool, false, |chain, slab| chain.link_frame(slab, frame))
            .map_err(|_| Limit::Pool)?;
        Ok(self.consume(pool, written))
    }

    /// Queues one message that was accepted earlier under the watermarks and the policy and
    /// waited outside the queue (a driver's cork: replies framed into one buffer while the
    /// queue was empty, of which the socket did not take all). No policy is applied again; the
    /// message is droppable like any other until its first byte is consumed. Returns the
    /// watermark crossing it caused; fails with [`Limit::Pool`] when the pool cannot store it
    /// (nothing is queued then).
    ///
    /// ```
    /// use freeboard_buf::{Budget, Pool, PoolConfig, SendQueue};
    ///
    /// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new()).unwrap();
    /// let mut queue = SendQueue::default();
    /// queue.push_accepted(&mut pool, b"\x82\x02hi").unwrap();
    /// assert_eq!((queue.len(), queue.messages()), (4, 1));
    /// let _ = queue.clear(&mut pool);
    /// ```
    pub fn push_accepted(
        &mut self,
        pool: &mut Pool<'_>,
        bytes: &[u8],
    ) -> Result<Option<Writability>, Limit> {
        if !bytes.is_empty() {
            self.store(pool, false, |chain, pool| chain.copy_in(pool, bytes, true))
                .map_err(|_| Limit::Pool)?;
        }
        Ok(self.watermarks.observe(self.len()))
    }

    /// Queues the bytes that open the stream (an HTTP `101 Switching Protocols` response)
    /// into an empty queue, bypassing the policy: like a control frame no policy drops them
    /// later, so the messages queued after them can never overtake them. Fails with
    /// [`Limit::Cap`] if they are larger than the cap, [`Limit::Pool`] if the pool cannot
    /// store them; nothing is queued then.
    ///
    /// ```
    /// use freeboard_buf::{Budget, Pool, PoolConfig, SendQueue, SlowConsumerPolicy, Watermarks};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new())?;
    /// let mut queue = SendQueue::new(Watermarks::new(4, 8, 64)?, SlowConsumerPolicy::Conflate);
    /// queue.push_preamble(&mut pool, b"HTTP/1.1 101 ...\r\n\r\n").unwrap();
    /// assert!(!queue.is_writable()); // the 101 alone is above the high watermark: behind
    /// let _ = queue.push_message(&mut pool, &[b"old"]);
    /// let _ = queue.push_message(&mut pool, &[b"new"]); // conflates "old", not the head
    ///
    /// let mut out = [0u8; 64];
    /// let n = queue.copy_to(&pool, &mut out);
    /// assert_eq!(&out[..n], b"HTTP/1.1 101 ...\r\n\r\nnew");
    /// let _ = queue.clear(&mut pool);
    /// # Ok(()) }
    /// ```
    pub fn push_preamble(
        &mut self,
        pool: &mut Pool<'_>,
        bytes: &[u8],
    ) -> Result<Option<Writability>, Limit> {
        debug_assert!(self.is_empty(), "a preamble goes before everything else");
        if bytes.len() > self.watermarks.cap() {
            return Err(Limit::Cap);
        }
        if !bytes.is_empty() {
            self.store(pool, true, |chain, pool| chain.copy_in(pool, bytes, true))
                .map_err(|_| Limit::Pool)?;
        }
        Ok(self.watermarks.observe(self.len()))
    }

    /// Fills `out` with the unsent bytes ([`Segments`]), for a vectored write; returns
    /// the number of slices filled.
    #[inline]
    pub fn slices<'p>(&self, pool: &'p Pool<'_>, out: &mut [&'p [u8]]) -> usize {
        self.chain.slices(pool, out)
    }

    /// [`slices`](Self::slices) as `std::io::IoSlice`s for `write_vectored`.
    #[cfg(feature = "std")]
    pub fn io_slices<'p>(&self, pool: &'p Pool<'_>, out: &mut [std::io::IoSlice<'p>]) -> usize {
        self.chain.io_slices(pool, out)
    }

    /// The unsent bytes in order ([`Segments`]).
    #[inline]
    pub fn segments<'p>(&self, pool: &'p Pool<'_>) -> Segments<'p> {
        self.chain.segments(pool)
    }

    /// Copies the first unsent bytes into `out` (e.g. a cork buffer); returns the count. Call
    /// [`consume`](Self::consume) for what was handed to the socket.
    pub fn copy_to(&self, pool: &Pool<'_>, out: &mut [u8]) -> usize {
        self.chain.copy_to(pool, out)
    }

    /// Removes the `n` bytes the socket took (at most [`len`](Self::len)). A message whose
    /// first byte goes is in flight from then on and is never dropped.
    #[inline]
    pub fn consume(&mut self, pool: &mut Pool<'_>, n: usize) -> Option<Writability> {
        let (_, completed) = self.chain.consume_messages(&mut pool.slab(), n);
        self.messages -= completed;
        self.kept = self.kept.saturating_sub(completed);
        if self.kept == 0 {
            self.kept_tail = NIL;
        }
        self.watermarks.observe(self.len())
    }

    /// Drops every message that has not started to go out, except control messages (before
    /// queueing a close frame, say), kept ones too. Counted in
    /// [`Counters::discarded`](crate::Counters).
    pub fn discard_unsent(&mut self, pool: &mut Pool<'_>) -> Discarded {
        (self.kept, self.kept_tail) = (0, NIL);
        let (messages, bytes) = self.drop_unsent(pool, usize::MAX);
        pool.record_discard(messages, bytes);
        Discarded { messages, bytes, writability: self.watermarks.observe(self.len()) }
    }

    /// Releases everything, a message in flight included (the connection is gone). The data
    /// messages lost — unsent or in flight, not control frames — are counted in the answer
    /// and in [`Counters::discarded`](crate::Counters).
    ///
    /// ```
    /// use freeboard_buf::{Budget, Pool, PoolConfig, SendQueue};
    ///
    /// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new()).unwrap();
    /// let mut queue = SendQueue::default();
    /// let _ = queue.push_message(&mut pool, &[b"\x82\x03one"]);
    /// let _ = queue.push_message(&mut pool, &[b"\x82\x03two"]);
    /// queue.push_control(&mut pool, &[b"\x88\x02\x03\xe8"]).unwrap();
    /// let _ = queue.consume(&mut pool, 2); // "one" is in flight
    /// assert_eq!(queue.clear(&mut pool).messages, 2);
    /// ```
    pub fn clear(&mut self, pool: &mut Pool<'_>) -> Discarded {
        let (messages, bytes) = (self.chain.data_messages(pool.view()), self.len());
        self.chain.clear(pool);
        self.messages = 0;
        (self.kept, self.kept_tail) = (0, NIL);
        pool.record_discard(messages, bytes);
        Discarded { messages, bytes, writability: self.watermarks.observe(0) }
    }

    #[cfg(test)]
    pub(crate) fn chain(&self) -> &ChunkChain {
        &self.chain
    }

    /// Applies the policy to a message of `len` bytes that `append` would add.
    #[inline]
    fn push_with(
        &mut self,
        pool: &mut Pool<'_>,
        len: usize,
        append: impl Fn(&mut ChunkChain, &mut Slab<'_>) -> Result<(), PoolError>,
    ) -> Pushed {
        let outcome = if len == 0 {
            self.queued() // nothing to store; an empty message would have no segment to mark
        } else if self.keeps_every_message(len) {
            match self.store(pool, false, &append) {
                Ok(_) => self.queued(),
                Err(_) => self.pool_exhausted(pool, len, 0, 0, append),
            }
        } else if let Some(key) = self.conflate_key
            && self.policy == SlowConsumerPolicy::Conflate
            && self.len().saturating_add(len) <= self.watermarks.cap()
        {
            // Keyed and behind, under the cap: the new message replaces its key's unsent ones.
            match self.store(pool, false, &append) {
                Ok(first) => {
                    let (messages, bytes) = self.drop_same_key(pool, key, first);
                    if messages == 0 {
                        self.queued()
                    } else {
                        pool.record_drop(self.policy, messages, bytes);
                        PushOutcome::Dropped { newest: false, messages, bytes }
                    }
                }
                Err(_) => self.pool_exhausted(pool, len, 0, 0, append),
            }
        } else {
            self.apply_policy(pool, len, append)
        };
        Pushed { outcome, writability: self.watermarks.observe(self.len()) }
    }

    /// Whether a message of `len` bytes (not empty) is simply stored: the common case, where
    /// under the cap there is nothing to decide. A conflating queue that keeps up (writable:
    /// not above its high watermark since it last fell to its low one) keeps every message
    /// too; only one that is behind is conflated.
    #[inline]
    fn keeps_every_message(&self, len: usize) -> bool {
        len > 0
            && self.len().saturating_add(len) <= self.watermarks.cap()
            && (self.policy != SlowConsumerPolicy::Conflate || self.is_writable())
    }

    /// A message that would take the queue past its cap, or any message to a `Conflate` queue
    /// that is behind (not writable).
    fn apply_policy(
        &mut self,
        pool: &mut Pool<'_>,
        len: usize,
        append: impl Fn(&mut ChunkChain, &mut Slab<'_>) -> Result<(), PoolError>,
    ) -> PushOutcome {
        let cap = self.watermarks.cap();
        let policy = self.policy;
        let newest = PushOutcome::Dropped { newest: true, messages: 1, bytes: len };
        match policy {
            SlowConsumerPolicy::Block | SlowConsumerPolicy::DropNewest if len > cap => {
                // Waiting cannot help a message larger than the cap.
                pool.record_drop(policy, 1, len);
                newest
            }
            SlowConsumerPolicy::Block => {
                pool.record_would_block();
                PushOutcome::WouldBlock { limit: Limit::Cap }
            }
            SlowConsumerPolicy::DropNewest => {
                pool.record_drop(policy, 1, len);
                newest
            }
            SlowConsumerPolicy::Close => {
                pool.record_close();
                PushOutcome::MustClose { limit: Limit::Cap, messages: 1 }
            }
            SlowConsumerPolicy::DropOldest | SlowConsumerPolicy::Conflate => {
                if self.chain.undroppable_bytes(pool.view(), self.kept_tail).saturating_add(len)
                    > cap
                {
                    // Even dropping every unsent message would not make room: drop the new one
                    // and keep the older ones.
                    pool.record_drop(policy, 1, len);
                    return newest;
                }
                let wanted = if policy == SlowConsumerPolicy::Conflate {
                    usize::MAX
                } else {
                    (self.len() + len).saturating_sub(cap)
                };
                let (messages, bytes) = self.drop_unsent(pool, wanted);
                if self.store(pool, false, &append).is_err() {
                    return self.pool_exhausted(pool, len, messages, bytes, append);
                }
                if messages == 0 {
                    return self.queued();
                }
                pool.record_drop(policy, messages, bytes);
                PushOutcome::Dropped { newest: false, messages, bytes }
            }
        }
    }

    /// The pool could not store a message that fits under the cap (`messages` older ones of
    /// `bytes` were already dropped to make room under it).
    #[cold]
    fn pool_exhausted(
        &mut self,
        pool: &mut Pool<'_>,
        len: usize,
        mut messages: u32,
        mut bytes: usize,
        append: impl Fn(&mut ChunkChain, &mut Slab<'_>) -> Result<(), PoolError>,
    ) -> PushOutcome {
        let policy = self.policy;
        match policy {
            SlowConsumerPolicy::Block => {
                pool.record_would_block();
                PushOutcome::WouldBlock { limit: Limit::Pool }
            }
            SlowConsumerPolicy::Close => {
                pool.record_close();
                PushOutcome::MustClose { limit: Limit::Pool, messages: 1 }
            }
            SlowConsumerPolicy::DropNewest => {
                pool.record_drop(policy, 1, len);
                PushOutcome::Dropped { newest: true, messages: 1, bytes: len }
            }
            SlowConsumerPolicy::DropOldest | SlowConsumerPolicy::Conflate => {
                // An older message of this queue may hold what the new one needs.
                let newest = loop {
                    let (m, b) = self.drop_unsent(pool, 1);
                    if m == 0 {
                        messages += 1;
                        bytes += len;
                        break true;
                    }
                    messages += m;
                    bytes += b;
                    if self.store(pool, false, &append).is_ok() {
                        break false;
                    }
                };
                pool.record_drop(policy, messages, bytes);
                PushOutcome::Dropped { newest, messages, bytes }
            }
        }
    }

    /// Stores one message all or nothing and flags its first segment; that segment.
    #[inline]
    fn store(
        &mut self,
        pool: &mut Pool<'_>,
        control: bool,
        append: impl Fn(&mut ChunkChain, &mut Slab<'_>) -> Result<(), PoolError>,
    ) -> Result<u32, PoolError> {
        let mut slab = pool.slab();
        let mark = self.chain.mark(slab.view());
        if let Err(e) = append(&mut self.chain, &mut slab) {
            self.chain.rollback(&mut slab, mark);
            return Err(e);
        }
        let first = self.chain.first_after(slab.view(), &mark);
        slab.segment_mut(first).mark_message_start(control);
        self.messages += 1;
        Ok(first)
    }

    /// Drops the unsent messages before the one starting at segment `newest` that have its
    /// key; `(messages, bytes)` dropped.
    fn drop_same_key(
        &mut self,
        pool: &mut Pool<'_>,
        key: ConflateKey,
        newest: u32,
    ) -> (u32, usize) {
        let mut slab = pool.slab();
        let mut wanted = [0u8; ConflateKey::PREFIX];
        let n = self.chain.message_prefix(slab.view(), newest, &mut wanted);
        let wanted = key.of(&wanted[..n]);
        let (mut messages, mut bytes) = (0, 0);
        let mut prefix = [0u8; ConflateKey::PREFIX];
        let (mut prev, mut cur) = self.chain.after(slab.view(), self.kept_tail);
        while cur != newest && cur != NIL {
            let seg = slab.view().segment(cur);
            if seg.starts_message() && !seg.is_control() {
                let n = self.chain.message_prefix(slab.view(), cur, &mut prefix);
                if key.of(&prefix[..n]) == wanted {
                    bytes += self.chain.unlink_message(&mut slab, prev, cur);
                    messages += 1;
                    cur = if prev == NIL {
                        self.chain.head_index()
                    } else {
                        slab.view().segment(prev).next
                    };
                    continue;
                }
            }
            prev = cur;
            cur = seg.next;
        }
        self.messages -= messages;
        (messages, bytes)
    }

    /// Drops the oldest droppable messages until at least `bytes_wanted` bytes are freed (one
    /// message for `1`, all of them for `usize::MAX`); returns `(messages, bytes)` dropped.
    fn drop_unsent(&mut self, pool: &mut Pool<'_>, bytes_wanted: usize) -> (u32, usize) {
        let (mut messages, mut bytes) = (0, 0);
        let mut slab = pool.slab();
        while bytes < bytes_wanted {
            let Some((prev, first)) = self.chain.find_droppable(slab.view(), self.kept_tail) else {
                break;
            };
            bytes += self.chain.unlink_message(&mut slab, prev, first);
            messages += 1;
        }
        self.messages -= messages;
        (messages, bytes)
    }

    #[inline]
    fn queued(&self) -> PushOutcome {
        if self.len() > self.watermarks.high() {
            PushOutcome::QueuedAboveHigh
        } else {
            PushOutcome::Queued
        }
    }
}

/// What a push did, and the writability transition it caused.
///
/// ```
/// use freeboard_buf::{Budget, Pool, PoolConfig, PushOutcome, Pushed, SendQueue};
///
/// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new()).unwrap();
/// let mut queue = SendQueue::default();
/// let pushed: Pushed = queue.push_message(&mut pool, &[b"hi"]);
/// assert_eq!(pushed, Pushed { outcome: PushOutcome::Queued, writability: None });
/// let _ = queue.clear(&mut pool);
/// ```
#[must_use = "a push may have been refused or may require closing the connection"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    /// What happened to the message.
    pub outcome: PushOutcome,
    /// `Some` if the queue's writability changed.
    pub writability: Option<Writability>,
}

/// What happened to a pushed message.
///
/// ```
/// use freeboard_buf::{Limit, PushOutcome};
///
/// fn must_stop_reading(outcome: PushOutcome) -> bool {
///     matches!(outcome, PushOutcome::QueuedAboveHigh | PushOutcome::WouldBlock { .. })
/// }
/// assert!(must_stop_reading(PushOutcome::WouldBlock { limit: Limit::Cap }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// Stored; the queue is at or below its high watermark.
    Queued,
    /// Stored; the queue is above its high watermark, producers should pause.
    QueuedAboveHigh,
    /// Whole messages were dropped to apply the policy. `newest` says whether the new message
    /// is among them (it was not stored); otherwise it was stored and older unsent messages
    /// made room or were conflated. `messages` and `bytes` count everything dropped, the new
    /// message included.
    Dropped {
        /// Whether the new message was dropped.
        newest: bool,
        /// Messages dropped.
        messages: u32,
        /// Their bytes.
        bytes: usize,
    },
    /// [`SlowConsumerPolicy::Block`]: not stored. Keep the message, stop reading its producer,
    /// and retry after [`Writability::Writable`] (limit `Cap`) or on a later loop turn (limit
    /// `Pool`: the pool is shared, so there is no per-queue event for it).
    WouldBlock {
        /// What stopped the message.
        limit: Limit,
    },
    /// [`SlowConsumerPolicy::Close`]: not stored. Close the connection with 1008 (policy
    /// violation), e.g. with [`SendQueue::discard_unsent`] then [`SendQueue::push_control`].
    MustClose {
        /// What stopped the message.
        limit: Limit,
        /// Messages lost to the close: the new one (the queue's answer counts only it), and
        /// the unsent ones discarded to close, once a driver has added them.
        messages: u32,
    },
}

/// The limit a message ran into.
///
/// ```
/// use freeboard_buf::Limit;
///
/// assert_ne!(Limit::Cap, Limit::Pool);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The queue's hard cap.
    Cap,
    /// The pool ran out of chunks or segment slots.
    Pool,
}

/// What [`SendQueue::discard_unsent`] or [`SendQueue::clear`] removed.
///
/// ```
/// use freeboard_buf::{Budget, Pool, PoolConfig, SendQueue};
///
/// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new()).unwrap();
/// let mut queue = SendQueue::default();
/// let _ = queue.push_message(&mut pool, &[b"stale"]);
/// let gone = queue.discard_unsent(&mut pool);
/// assert_eq!((gone.messages, gone.bytes), (1, 5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Discarded {
    /// Messages removed.
    pub messages: u32,
    /// Their bytes.
    pub bytes: usize,
    /// `Some` if the queue's writability changed.
    pub writability: Option<Writability>,
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::borrow::ToOwned;
    use std::string::String;
    use std::vec::Vec;
    use std::{format, vec};

    use super::*;
    use crate::{Budget, PoolConfig};

    /// An unmasked text frame of `payload`.
    fn frame(payload: &str) -> Vec<u8> {
        let mut frame = vec![0x81, payload.len() as u8];
        frame.extend_from_slice(payload.as_bytes());
        frame
    }

    fn payloads(queue: &SendQueue, pool: &Pool<'_>) -> Vec<String> {
        let mut out = vec![0u8; queue.len()];
        let n = queue.copy_to(pool, &mut out);
        let mut rest = &out[..n];
        let mut messages = Vec::new();
        while let [_, len, tail @ ..] = rest {
            let (payload, after) = tail.split_at(*len as usize);
            messages.push(String::from_utf8(payload.to_vec()).unwrap());
            rest = after;
        }
        messages
    }

    #[test]
    fn keyed_conflate_keeps_the_latest_message_of_each_key() {
        for (after_envelope, prefix) in [(false, ""), (true, "12-3:"), (true, "99-100:")] {
            let mut pool =
                Pool::new(Budget::new(1 << 20), PoolConfig::new().with_chunk_size(16)).unwrap();
            let key = ConflateKey { delimiter: b'|', after_envelope, events: false };
            let marks = Watermarks::new(4, 8, 1024).unwrap();
            let mut queue =
                SendQueue::new(marks, SlowConsumerPolicy::Conflate).with_conflate_key(key);
            // Behind: above the high watermark, nothing sent.
            let _ = queue.push_message(&mut pool, &[&frame("a backlog without key")[..]]);
            assert!(!queue.is_writable());
            let m = |s: &str| format!("{prefix}{s}");
            for s in ["A|1", "B|1 a longer message spanning chunks", "A|2", "C|1", "B|2"] {
                let _ = queue.push_message(&mut pool, &[&frame(&m(s))[..]]);
            }
            let pushed = queue.push_message(&mut pool, &[&frame(&m("C|2"))[..]]);
            assert_eq!(
                pushed.outcome,
                PushOutcome::Dropped { newest: false, messages: 1, bytes: 2 + m("C|1").len() }
            );
            assert_eq!(
                payloads(&queue, &pool),
                ["a backlog without key".to_owned(), m("A|2"), m("B|2"), m("C|2")]
            );
            assert_eq!(queue.messages(), 4);
            // Without the delimiter the key is empty: such messages conflate among themselves.
            let _ = queue.push_message(&mut pool, &[&frame(&m("no key"))[..]]);
            assert_eq!(payloads(&queue, &pool), [m("A|2"), m("B|2"), m("C|2"), m("no key")]);
            let _ = queue.clear(&mut pool);
        }
        // A payload that merely contains a colon is not an envelope.
        let key = ConflateKey { delimiter: b'|', after_envelope: true, events: false };
        assert_eq!(key.of(b"\x81\x0cEUR:x|{\"p\":1}"), b"EUR:x");
        assert_eq!(key.of(b"\x81\x0912-3:EUR|"), b"EUR");
    }

    #[test]
    fn an_events_key_is_read_from_its_first_data_line() {
        let key = ConflateKey { delimiter: b'|', after_envelope: true, events: true };
        assert_eq!(key.of(b"data: EUR|1.08\n\n"), b"EUR");
        assert_eq!(key.of(b"data:EUR|1.08\n\n"), b"EUR");
        assert_eq!(key.of(b"id: 1764000000000.7-42\nevent: fx\ndata: USD|{\"p\":1}\n\n"), b"USD");
        // The topic's name and offset are not the key; an event without a delimiter in its
        // first data line, or with no data line in reach, has the empty key.
        assert_eq!(key.of(b"id: 12-3\nevent: a|b\ndata: no key\n\n"), b"");
        assert_eq!(key.of(b"id: 12-3\nevent: fx"), b"");
        assert_eq!(key.of(b": keep-alive\n\n"), b"");
    }
}
