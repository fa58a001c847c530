//! The chunk pool: fixed-size chunks carved from one region, handed out as `u32` indices.

use core::fmt;
use core::mem::size_of;

use crate::backpressure::SlowConsumerPolicy;
use crate::budget::{Budget, BudgetExceeded};
use crate::storage::Storage;

/// The chunk size used by [`PoolConfig::new`]: 4 KiB, a page, and the buffer size that kept
/// allocation success at 98 % in the ESP32 measurements quoted in the design.
pub const DEFAULT_CHUNK_SIZE: usize = 4096;

/// Segment slots per chunk used by [`PoolConfig::new`]. Each queued message needs at least one
/// segment and each reference to a shared frame needs one per chunk of the frame, so workloads
/// with many small messages or wide broadcasts may want more.
pub const DEFAULT_SEGMENTS_PER_CHUNK: usize = 8;

/// The largest chunk size a pool accepts (offsets are stored in `u32`).
pub const MAX_CHUNK_SIZE: usize = 1 << 30;

/// The most chunks one pool can hold: chunk indices are 30 bits, the top two bits of a segment's
/// chunk field carry message flags.
pub const MAX_CHUNKS: usize = (1 << 30) - 1;

/// The most segment slots one pool can hold (`u32::MAX` marks the end of a list).
const MAX_SEGMENTS: usize = u32::MAX as usize - 1;

/// Bytes of free chunks used by [`PoolConfig::new`] that [`Pool::release_idle`] keeps resident
/// while the pool is in use: 1 MiB, 256 chunks of 4 KiB.
pub const DEFAULT_WARM_RESERVE: usize = 1 << 20;

/// Consecutive quiet calls of [`Pool::release_idle`] after which [`PoolConfig::new`]'s pool gives
/// back everything it touched (with a call each second, 3 s without a chunk in use).
pub const DEFAULT_IDLE_TICKS: u32 = 3;

/// End of a free list or of a chain.
pub(crate) const NIL: u32 = u32::MAX;

const CHUNK_MASK: u32 = (1 << 30) - 1;
/// Set on the first segment of a message that no byte has been consumed from yet.
const MESSAGE_START: u32 = 1 << 31;
/// Set on the first segment of a control message (ping, pong, close): never dropped by a policy.
const CONTROL: u32 = 1 << 30;

/// A pool of fixed-size chunks carved from one region, owned by one event loop.
///
/// The pool draws its whole footprint from its [`Budget`] once, at construction — address space
/// reserved per region ([`Pool::new`]: an anonymous mapping with feature `std`, one allocation
/// with `alloc` alone) or slices lent by the caller ([`Pool::from_slices`], for `no_std` without
/// an allocator) — and never allocates again. Chunks are handed out as [`ChunkId`] indices;
/// [`alloc`](Self::alloc) and [`release`](Self::release) are O(1) pops and pushes of an
/// intrusive free list, and exhaustion is an [`PoolError`] value, never a panic, a wait or a
/// growth.
///
/// # Memory that is touched, and given back
///
/// Building a pool touches nothing: chunks and their metadata slots are handed out in index
/// order the first time (a bump index), so the pages of a chunk, of its slot and of a segment
/// slot become resident only when first used, and a 1 GiB budget costs no resident memory
/// before its first connection. Freed chunks go on a *warm* free list (LIFO, resident); a call
/// of [`release_idle`](Self::release_idle) once a second (the event loop's timer) gives pages
/// back to the operating system (`madvise(MADV_DONTNEED)`, [`Pool::new`] with `std` only):
///
/// - chunks that stayed free during the whole last interval, beyond a warm reserve
///   ([`PoolConfig::warm_reserve`]), move to a *cold* list and their pages are given back; a
///   steady workload keeps what it used in the last interval, so it pays nothing;
/// - after [`PoolConfig::idle_ticks`] consecutive intervals with no chunk and no segment in use,
///   every page the pool touched — chunks, chunk slots, segment slots — is given back and the
///   pool is as it was built.
///
/// Allocation takes a warm chunk, else a cold one, else a never-used one; only the warm pop is
/// on the fast path, so [`alloc`](Self::alloc) and [`release`](Self::release) cost what they
/// did before the pool gave memory back.
///
/// A chunk is reference-counted with a plain `u32` (the pool is used from one thread through
/// `&mut Pool`), and its bytes below its *fill* mark are never written again, which is what lets
/// many [`ChunkChain`](crate::ChunkChain)s reference one chunk at different offsets.
///
/// ```
/// use freeboard_buf::{Budget, Pool, PoolConfig, PoolError};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut pool = Pool::new(Budget::new(64 << 10), PoolConfig::new().with_chunk_count(2))?;
/// let a = pool.alloc()?;
/// pool.append(&a, b"broadcast me");
/// let b = pool.share(&a)?; // a second reference, no copy
/// let c = pool.alloc()?;
/// assert_eq!(pool.alloc().unwrap_err(), PoolError::ChunksExhausted);
/// assert_eq!(pool.bytes(&b), b"broadcast me");
/// pool.release(a);
/// pool.release(b);
/// pool.release(c);
/// assert_eq!(pool.chunks_in_use(), 0);
/// assert_eq!(pool.counters().allocation_failures, 1);
/// # Ok(()) }
/// ```
///
/// Without an allocator the caller lends the regions, sized with [`Pool::footprint`]:
///
/// ```
/// use freeboard_buf::{Budget, ChunkSlot, Pool, SegmentSlot};
///
/// let mut data = [0u8; 8 * 256];
/// let mut chunks = [ChunkSlot::EMPTY; 8];
/// let mut segments = [SegmentSlot::EMPTY; 32];
/// let budget = Budget::new(Pool::footprint(256, 8, 32));
/// let pool = Pool::from_slices(budget, 256, &mut data, &mut chunks, &mut segments).unwrap();
/// assert_eq!(pool.chunks_total(), 8);
/// assert_eq!(pool.budget().available(), 0);
/// ```
pub struct Pool<'a> {
    /// Invariant: `data.len() == chunk_size * chunks.len()`; chunk `i` is
    /// `data[i * chunk_size..(i + 1) * chunk_size]`.
    data: Storage<'a, u8>,
    chunks: Storage<'a, ChunkSlot>,
    segments: Storage<'a, SegmentSlot>,
    /// Free lists, in-use counts and the chunk size: everything an operation needs besides
    /// the three regions.
    state: State,
    /// Invariant: `budget.drawn() >= footprint`; the pool's footprint stays drawn for its life.
    budget: Budget,
    footprint: usize,
    /// What [`release_idle`](Self::release_idle) does, and what it needs between calls.
    release: ReleaseState,
    /// The mappings behind `data`, `chunks` and `segments` when [`Pool::new`] made them (then
    /// those are `Storage::Borrowed` slices of the mappings): they give pages back, and unmap
    /// when the pool is dropped, after the slices (fields drop in declaration order).
    #[cfg(feature = "std")]
    mapped: Option<[crate::mapping::Unmap; 3]>,
    dropped: [DropTally; SlowConsumerPolicy::ALL.len()],
    would_block: u64,
    slow_consumer_closes: u64,
    discarded: DropTally,
}

impl<'a> Pool<'a> {
    /// Bytes a pool of `chunks` chunks of `chunk_size` bytes and `segments` segment slots draws
    /// from its budget: the data plus 8 bytes per chunk and 16 per segment of metadata.
    /// Saturates at `usize::MAX` (which no budget covers).
    pub const fn footprint(chunk_size: usize, chunks: usize, segments: usize) -> usize {
        let per_chunk = chunk_size.saturating_add(size_of::<ChunkSlot>());
        per_chunk
            .saturating_mul(chunks)
            .saturating_add(segments.saturating_mul(size_of::<SegmentSlot>()))
    }

    /// Builds a pool over regions lent by the caller (no allocator needed): `data` holds
    /// `chunks.len()` chunks of `chunk_size` bytes, `segments` bounds how many segments all
    /// chains of this pool can hold together. The footprint of the three slices is drawn from
    /// `budget`. Slot contents are overwritten, so any initial value will do
    /// ([`ChunkSlot::EMPTY`], [`SegmentSlot::EMPTY`]).
    pub fn from_slices(
        mut budget: Budget,
        chunk_size: usize,
        data: &'a mut [u8],
        chunks: &'a mut [ChunkSlot],
        segments: &'a mut [SegmentSlot],
    ) -> Result<Self, PoolConfigError> {
        check_shape(chunk_size, chunks.len(), segments.len())?;
        let expected = chunk_size * chunks.len();
        if data.len() != expected {
            return Err(PoolConfigError::RegionMismatch { expected, actual: data.len() });
        }
        let footprint = Self::footprint(chunk_size, chunks.len(), segments.len());
        budget.try_draw(footprint)?;
        Ok(Self::build(
            budget,
            footprint,
            chunk_size,
            Storage::Borrowed(data),
            Storage::Borrowed(chunks),
            Storage::Borrowed(segments),
        ))
    }

    fn build(
        budget: Budget,
        footprint: usize,
        chunk_size: usize,
        data: Storage<'a, u8>,
        chunks: Storage<'a, ChunkSlot>,
        segments: Storage<'a, SegmentSlot>,
    ) -> Self {
        // Nothing is linked or written here: chunks and segment slots are handed out by index
        // the first time (`fresh_chunk`, `fresh_segment`), so untouched pages stay untouched.
        let page_size = page_size();
        Pool {
            state: State {
                chunk_size: chunk_size as u32,
                free_chunk: NIL,
                cold_chunk: NIL,
                fresh_chunk: 0,
                resident_chunks: 0,
                free_segment: NIL,
                fresh_segment: 0,
                frame_hint: NIL,
                chunks_in_use: 0,
                interval_chunks_high: 0,
                segments_in_use: 0,
                interval_segments_high: 0,
                allocation_failures: 0,
                withheld: 0,
            },
            release: ReleaseState {
                warm_reserve: DEFAULT_WARM_RESERVE.div_ceil(chunk_size),
                idle_ticks: DEFAULT_IDLE_TICKS,
                page_size,
                chunks_high_water: 0,
                segments_high_water: 0,
                resident_at_tick: 0,
                quiet_ticks: 0,
                released_bytes: 0,
            },
            data,
            chunks,
            segments,
            budget,
            footprint,
            #[cfg(feature = "std")]
            mapped: None,
            dropped: [DropTally::ZERO; SlowConsumerPolicy::ALL.len()],
            would_block: 0,
            slow_consumer_closes: 0,
            discarded: DropTally::ZERO,
        }
    }

    /// Bytes per chunk.
    #[inline]
    pub fn chunk_size(&self) -> usize {
        self.state.chunk_size as usize
    }

    /// Number of chunks in the pool.
    pub fn chunks_total(&self) -> usize {
        self.chunks.len()
    }

    /// Chunks referenced by at least one handle or segment.
    #[inline]
    pub fn chunks_in_use(&self) -> usize {
        self.state.chunks_in_use
    }

    /// Chunks ready to be allocated: neither in use nor [withheld](Self::withhold).
    #[inline]
    pub fn chunks_free(&self) -> usize {
        self.chunks.len().saturating_sub(self.state.chunks_in_use + self.state.withheld)
    }

    /// Withholds `chunks` of the pool's chunks for memory spent outside it, so that what
    /// the pool hands out plus that memory stay within the budget: a server charges each
    /// connection's kernel memory (its socket, its epoll entry) this way. The count replaces
    /// the previous one. Chunks already in use stay in use; [`alloc`](Self::alloc) fails
    /// while `chunks_in_use + withheld` is at [`chunks_total`](Self::chunks_total). Nothing
    /// is touched: a withheld chunk costs no resident memory.
    pub fn withhold(&mut self, chunks: usize) {
        self.state.withheld = chunks;
    }

    /// Chunks currently withheld (see [`withhold`](Self::withhold)).
    pub fn chunks_withheld(&self) -> usize {
        self.state.withheld
    }

    /// Number of segment slots in the pool.
    pub fn segments_total(&self) -> usize {
        self.segments.len()
    }

    /// Segment slots linked into chains.
    pub fn segments_in_use(&self) -> usize {
        self.state.segments_in_use
    }

    /// Bytes this pool drew from its budget (data and metadata).
    pub fn footprint_bytes(&self) -> usize {
        self.footprint
    }

    /// Chunks whose pages the pool has not given back: in use, or free on the warm list.
    pub fn chunks_resident(&self) -> usize {
        self.state.resident_chunks
    }

    /// Bytes of this pool that may be resident: the resident chunks' data plus every metadata
    /// slot touched since the pool was built or last gave everything back. An upper bound on
    /// what the pool adds to the process's RSS (pages are counted whole by the system, so a
    /// chunk smaller than a page may share a resident page with a cold neighbour).
    pub fn resident_bytes(&self) -> usize {
        self.state.resident_chunks * self.chunk_size()
            + self.state.fresh_chunk as usize * size_of::<ChunkSlot>()
            + self.state.fresh_segment as usize * size_of::<SegmentSlot>()
    }

    /// Whether [`release_idle`](Self::release_idle) may have anything to give back, now or after
    /// more quiet calls: false for a pool that has touched nothing since it was built or last
    /// gave everything back. An event loop may leave its release timer off while this is false
    /// and arm it when it turns true (checked once per loop turn; it is one comparison).
    ///
    /// ```
    /// use freeboard_buf::{Budget, Pool, PoolConfig};
    ///
    /// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new().with_idle_ticks(1)).unwrap();
    /// assert!(!pool.has_memory_to_release());
    /// let id = pool.alloc().unwrap();
    /// pool.release(id);
    /// assert!(pool.has_memory_to_release());
    /// pool.release_idle(); // the interval with the chunk in use
    /// pool.release_idle(); // a quiet one: everything goes
    /// assert!(!pool.has_memory_to_release());
    /// ```
    #[inline]
    pub fn has_memory_to_release(&self) -> bool {
        self.state.fresh_chunk > 0 || self.state.fresh_segment > 0
    }

    /// Sets the release policy of a pool built with [`from_slices`](Self::from_slices) (a pool
    /// from [`Pool::new`] takes it from its [`PoolConfig`]): keep `warm_reserve` bytes of free
    /// chunks resident while in use, and give everything back after `idle_ticks` quiet calls of
    /// [`release_idle`](Self::release_idle) (0 never gives everything back).
    pub fn set_release_policy(&mut self, warm_reserve: usize, idle_ticks: u32) {
        self.release.warm_reserve = warm_reserve.div_ceil(self.chunk_size());
        self.release.idle_ticks = idle_ticks;
    }

    /// Gives memory that stayed free back to the operating system; call it at a fixed interval
    /// (the event loop's timer, once a second). It reads no clock: an *interval* is the time
    /// between two calls. Returns what it gave back.
    ///
    /// - Chunks that were free during the whole last interval, beyond the warm reserve, have
    ///   their pages given back (only when a chunk spans whole pages, and no chunk was taken from
    ///   the cold or never-used ones during the interval). The free ones are taken from the warm
    ///   list in batches, sorted, and each run of adjacent chunks is one `madvise` call.
    /// - After `idle_ticks` consecutive intervals in which no chunk and no segment was in use,
    ///   every page the pool touched is given back (three `madvise` calls) and the pool hands
    ///   out chunk 0, 1, 2... again.
    ///
    /// The bookkeeping runs the same for every storage; only a pool from [`Pool::new`] with
    /// feature `std` actually returns pages (elsewhere `Released::bytes` counts what would have
    /// been returned, and borrowed or heap memory stays as it is).
    ///
    /// ```
    /// use freeboard_buf::{Budget, Pool, PoolConfig};
    ///
    /// let config = PoolConfig::new().with_chunk_count(1024).with_warm_reserve(0).with_idle_ticks(2);
    /// let mut pool = Pool::new(Budget::new(8 << 20), config).unwrap();
    /// let held: Vec<_> = (0..100).map(|_| pool.alloc().unwrap()).collect();
    /// held.into_iter().for_each(|id| pool.release(id));
    /// assert_eq!(pool.chunks_resident(), 100);
    /// pool.release_idle(); // the interval in which the chunks were used
    /// assert_eq!(pool.release_idle().chunks, 100); // a quiet interval: the chunks go
    /// assert_eq!(pool.chunks_resident(), 0);
    /// assert_eq!(pool.resident_bytes(), 100 * 8); // their slots stay until...
    /// pool.release_idle(); // ...a second quiet interval: everything goes
    /// assert_eq!(pool.resident_bytes(), 0);
    /// ```
    pub fn release_idle(&mut self) -> Released {
        let mut released = Released { chunks: 0, bytes: 0 };
        let chunk_size = self.chunk_size();
        let state = &self.state;
        let release = &mut self.release;
        release.chunks_high_water = release.chunks_high_water.max(state.interval_chunks_high);
        release.segments_high_water = release.segments_high_water.max(state.interval_segments_high);

        // Chunks free all interval: the resident ones minus the most in use at once, provided
        // no cold or fresh chunk was taken (which only happens with the warm list empty).
        if chunk_size >= release.page_size && state.resident_chunks == release.resident_at_tick {
            let idle = state.resident_chunks - state.interval_chunks_high;
            let surplus = idle.saturating_sub(release.warm_reserve);
            if surplus > 0 {
                released = self.cool(surplus);
            }
        }

        let state = &self.state;
        let quiet = state.chunks_in_use == 0
            && state.interval_chunks_high == 0
            && state.segments_in_use == 0
            && state.interval_segments_high == 0;
        let release = &mut self.release;
        release.quiet_ticks = if quiet { release.quiet_ticks.saturating_add(1) } else { 0 };
        if quiet
            && release.idle_ticks > 0
            && release.quiet_ticks >= release.idle_ticks
            && (state.fresh_chunk > 0 || state.fresh_segment > 0)
        {
            let all = self.reset();
            released.chunks += all.chunks;
            released.bytes += all.bytes;
        }

        let state = &mut self.state;
        state.interval_chunks_high = state.chunks_in_use;
        state.interval_segments_high = state.segments_in_use;
        self.release.resident_at_tick = state.resident_chunks;
        self.release.released_bytes += released.bytes as u64;
        released
    }

    /// The budget the pool was drawn from; what is left is available to other consumers.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The budget, for other consumers of the same event loop to draw from and give back to.
    pub fn budget_mut(&mut self) -> &mut Budget {
        &mut self.budget
    }

    /// Takes a free chunk (empty, reference count 1). O(1); never touches the global allocator.
    #[inline]
    pub fn alloc(&mut self) -> Result<ChunkId, PoolError> {
        self.slab().alloc_chunk().map(ChunkId)
    }

    /// Takes one more reference to `chunk`, e.g. one per queue that will send it.
    #[inline]
    pub fn share(&mut self, chunk: &ChunkId) -> Result<ChunkId, PoolError> {
        self.slab().add_ref(chunk.0)?;
        Ok(ChunkId(chunk.0))
    }

    /// Gives back one reference; the chunk returns to the pool with its last reference. O(1).
    #[inline]
    pub fn release(&mut self, chunk: ChunkId) {
        self.slab().release_ref(chunk.0);
    }

    /// References to `chunk` (handles plus chain segments).
    #[inline]
    pub fn refs(&self, chunk: &ChunkId) -> u32 {
        self.chunks[chunk.0 as usize].refs
    }

    /// The bytes written to `chunk` so far. They are never written again while it is in use.
    #[inline]
    pub fn bytes(&self, chunk: &ChunkId) -> &[u8] {
        let view = self.view();
        view.chunk_bytes(chunk.0, 0, view.fill(chunk.0))
    }

    /// The unwritten rest of `chunk`, e.g. to `read` a socket into; follow with
    /// [`commit`](Self::commit) before anything else writes to the pool.
    pub fn spare_mut(&mut self, chunk: &ChunkId) -> &mut [u8] {
        let slab = self.slab();
        let fill = slab.fill(chunk.0);
        let size = slab.state.chunk_size;
        slab.into_chunk_bytes_mut(chunk.0, fill, size)
    }

    /// Marks `n` bytes of [`spare_mut`](Self::spare_mut) as written; returns the bytes
    /// committed (at most the spare room).
    pub fn commit(&mut self, chunk: &ChunkId, n: usize) -> usize {
        let slab = self.slab();
        let fill = slab.fill(chunk.0);
        let n = n.min((slab.state.chunk_size - fill) as usize);
        slab.chunks[chunk.0 as usize].link = fill + n as u32;
        n
    }

    /// Copies as much of `bytes` as fits after the written part of `chunk`; returns the count.
    pub fn append(&mut self, chunk: &ChunkId, bytes: &[u8]) -> usize {
        self.slab().write_at_fill(chunk.0, bytes).1
    }

    /// A snapshot of the pool's counters.
    pub fn counters(&self) -> Counters {
        Counters {
            budget_limit: self.budget.limit(),
            budget_drawn: self.budget.drawn(),
            budget_high_water: self.budget.high_water(),
            chunk_size: self.chunk_size(),
            chunks_total: self.chunks_total(),
            chunks_in_use: self.state.chunks_in_use,
            chunks_high_water: self.chunks_high_water(),
            chunks_resident: self.state.resident_chunks,
            resident_bytes: self.resident_bytes(),
            released_bytes: self.release.released_bytes,
            segments_total: self.segments_total(),
            segments_in_use: self.state.segments_in_use,
            segments_high_water: self
                .release
                .segments_high_water
                .max(self.state.interval_segments_high),
            allocation_failures: self.state.allocation_failures,
            would_block: self.would_block,
            slow_consumer_closes: self.slow_consumer_closes,
            discarded: self.discarded,
            dropped: self.dropped,
        }
    }

    /// `1 − largest_free_block / total_free`, always 0 for a pool (see
    /// [`Counters::fragmentation_index`]).
    pub fn fragmentation_index(&self) -> f64 {
        self.counters().fragmentation_index()
    }

    fn chunks_high_water(&self) -> usize {
        self.release.chunks_high_water.max(self.state.interval_chunks_high)
    }

    /// Moves up to `n` chunks from the warm list to the cold list and gives their pages back.
    fn cool(&mut self, n: usize) -> Released {
        const BATCH: usize = 64;
        let chunk_size = self.chunk_size();
        let mut released = Released { chunks: 0, bytes: 0 };
        let mut batch = [0u32; BATCH];
        while released.chunks < n {
            let mut k = 0;
            while k < BATCH && released.chunks + k < n && self.state.free_chunk != NIL {
                let idx = self.state.free_chunk;
                self.state.free_chunk = self.chunks[idx as usize].link;
                batch[k] = idx;
                k += 1;
            }
            if k == 0 {
                break;
            }
            let batch = &mut batch[..k];
            batch.sort_unstable();
            let mut i = 0;
            while i < k {
                let start = batch[i] as usize;
                let mut end = start + 1;
                i += 1;
                while i < k && batch[i] as usize == end {
                    end += 1;
                    i += 1;
                }
                self.give_back_data(start * chunk_size..end * chunk_size);
            }
            // Highest index first, so the lowest comes back first and the touched range stays
            // compact.
            for &idx in batch.iter().rev() {
                self.chunks[idx as usize].link = self.state.cold_chunk;
                self.state.cold_chunk = idx;
            }
            self.state.resident_chunks -= k;
            released.chunks += k;
        }
        released.bytes = released.chunks * chunk_size;
        released
    }

    /// Gives back every page the pool touched and returns it to its state at construction.
    /// Only with no chunk and no segment in use.
    fn reset(&mut self) -> Released {
        debug_assert!(self.state.chunks_in_use == 0 && self.state.segments_in_use == 0);
        let chunk_size = self.chunk_size();
        let fresh_chunks = self.state.fresh_chunk as usize;
        let fresh_segments = self.state.fresh_segment as usize;
        let chunks = self.state.resident_chunks;
        self.give_back_data(0..fresh_chunks * chunk_size);
        let metadata =
            fresh_chunks * size_of::<ChunkSlot>() + fresh_segments * size_of::<SegmentSlot>();
        #[cfg(feature = "std")]
        if let Some([_, chunk_map, segment_map]) = &self.mapped {
            chunk_map.release(&mut self.chunks, 0..fresh_chunks);
            segment_map.release(&mut self.segments, 0..fresh_segments);
        }
        let state = &mut self.state;
        state.free_chunk = NIL;
        state.cold_chunk = NIL;
        state.fresh_chunk = 0;
        state.resident_chunks = 0;
        state.free_segment = NIL;
        state.fresh_segment = 0;
        state.frame_hint = NIL;
        Released { chunks, bytes: chunks * chunk_size + metadata }
    }

    /// Gives the whole pages of `bytes` of the data region back, if the pool mapped it.
    fn give_back_data(&mut self, bytes: core::ops::Range<usize>) {
        #[cfg(feature = "std")]
        if let Some([data_map, _, _]) = &self.mapped {
            data_map.release(&mut self.data, bytes);
        }
        #[cfg(not(feature = "std"))]
        let _ = bytes;
    }

    // ---- crate-internal ----

    /// The regions as plain slices plus the bookkeeping, borrowed once per operation.
    #[inline]
    pub(crate) fn slab(&mut self) -> Slab<'_> {
        Slab {
            data: &mut self.data,
            chunks: &mut self.chunks,
            segments: &mut self.segments,
            state: &mut self.state,
        }
    }

    /// A read-only [`slab`](Self::slab).
    #[inline]
    pub(crate) fn view(&self) -> View<'_> {
        View {
            data: &self.data,
            chunks: &self.chunks,
            segments: &self.segments,
            chunk_size: self.state.chunk_size,
        }
    }

    /// `a` then `b` as one slice, when both are this pool's bytes and `b` begins where `a`
    /// ends (frames framed one after another are packed so): a write of a run of them then
    /// takes one slice, not one per frame.
    ///
    /// ```
    /// use freeboard_buf::{Budget, Frame, Pool, PoolConfig};
    ///
    /// let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new()).unwrap();
    /// let (a, b) = (Frame::from_parts(&mut pool, &[b"ab"]).unwrap(), Frame::from_parts(&mut pool, &[b"cd"]).unwrap());
    /// let (x, y) = (a.segments(&pool).next().unwrap(), b.segments(&pool).next().unwrap());
    /// assert_eq!(pool.join(x, y), Some(&b"abcd"[..]));
    /// assert_eq!(pool.join(y, x), None);
    /// assert_eq!(pool.join(x, b"cd"), None); // not the pool's
    /// a.release(&mut pool);
    /// b.release(&mut pool);
    /// ```
    pub fn join<'p>(&'p self, a: &'p [u8], b: &'p [u8]) -> Option<&'p [u8]> {
        let data: &'p [u8] = &self.data;
        let base = data.as_ptr() as usize;
        let at = (a.as_ptr() as usize).checked_sub(base)?;
        let next = (b.as_ptr() as usize).checked_sub(base)?;
        let end = next + b.len();
        (at + a.len() == next && end <= data.len()).then(|| &data[at..end])
    }

    pub(crate) fn record_drop(&mut self, policy: SlowConsumerPolicy, messages: u32, bytes: usize) {
        self.dropped[policy as usize].add(messages, bytes);
    }

    pub(crate) fn record_would_block(&mut self) {
        self.would_block += 1;
    }

    pub(crate) fn record_close(&mut self) {
        self.slow_consumer_closes += 1;
    }

    pub(crate) fn record_discard(&mut self, messages: u32, bytes: usize) {
        self.discarded.add(messages, bytes);
    }
}

/// Bookkeeping of a [`Pool`] apart from its regions.
#[derive(Debug)]
pub(crate) struct State {
    /// Invariant: `1 <= chunk_size <= MAX_CHUNK_SIZE`.
    chunk_size: u32,
    /// Head of the warm free-chunk list (free, pages resident), linked through
    /// `ChunkSlot::link`; `NIL` when empty.
    free_chunk: u32,
    /// Head of the cold free-chunk list (free, pages given back), linked the same way.
    cold_chunk: u32,
    /// Invariant: chunks `[0, fresh_chunk)` have been handed out since the pool was built or
    /// last reset, and only their slots are ever read; the slots and pages above are untouched.
    fresh_chunk: u32,
    /// Invariant: chunks in use plus chunks on the warm list.
    resident_chunks: usize,
    /// Head of the free-segment list, linked through `SegmentSlot::next`; `NIL` when empty.
    free_segment: u32,
    /// Invariant: segment slots `[0, fresh_segment)` have been handed out since the pool was
    /// built or last reset; those above are untouched.
    fresh_segment: u32,
    /// The chunk the last frame ended in, so small frames pack into one chunk. A hint, not a
    /// reference: used only while that chunk is still in use by someone.
    frame_hint: u32,
    /// Invariant: equals the number of chunks with `refs > 0`.
    chunks_in_use: usize,
    /// The most chunks in use at once since the last `release_idle`.
    interval_chunks_high: usize,
    /// Invariant: equals the number of segment slots off the free list.
    segments_in_use: usize,
    /// The most segment slots in use at once since the last `release_idle`.
    interval_segments_high: usize,
    allocation_failures: u64,
    /// Chunks the pool may not hand out (`Pool::withhold`); may exceed the free chunks.
    withheld: usize,
}

/// What [`Pool::release_idle`] keeps between calls, and its policy.
#[derive(Debug)]
struct ReleaseState {
    /// Free chunks kept resident while the pool is in use.
    warm_reserve: usize,
    /// Quiet calls after which everything is given back; 0: never.
    idle_ticks: u32,
    page_size: usize,
    /// Most chunks in use at once before the current interval.
    chunks_high_water: usize,
    segments_high_water: usize,
    /// `State::resident_chunks` at the end of the last call: if it grew since, a cold or
    /// never-used chunk was taken, so the warm list ran empty during the interval.
    resident_at_tick: usize,
    /// Consecutive calls whose interval had no chunk and no segment in use.
    quiet_ticks: u32,
    /// Bytes given back since the pool was built.
    released_bytes: u64,
}

/// What one call of [`Pool::release_idle`] gave back.
///
/// ```
/// use freeboard_buf::Released;
///
/// assert_eq!(Released::NOTHING.bytes, 0);
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    /// Free chunks whose pages were given back.
    pub chunks: usize,
    /// Their bytes, plus the metadata slots given back when the whole pool went.
    pub bytes: usize,
}

impl Released {
    /// Nothing given back.
    pub const NOTHING: Self = Self { chunks: 0, bytes: 0 };
}

/// The page size pages are given back in.
fn page_size() -> usize {
    #[cfg(feature = "std")]
    {
        crate::mapping::page_size()
    }
    #[cfg(not(feature = "std"))]
    {
        4096
    }
}

/// The warm list is empty: a chunk whose pages were given back, else one never used. It takes
/// the chunk slots and the bookkeeping only (not the whole [`Slab`]), so the fast path of
/// `alloc_chunk` needs nothing else of the pool.
#[cold]
fn alloc_cold_chunk(chunks: &mut [ChunkSlot], state: &mut State) -> Result<u32, PoolError> {
    let idx = if state.cold_chunk != NIL {
        let idx = state.cold_chunk;
        state.cold_chunk = chunks[idx as usize].link;
        idx
    } else if (state.fresh_chunk as usize) < chunks.len() {
        state.fresh_chunk += 1;
        state.fresh_chunk - 1
    } else {
        state.allocation_failures += 1;
        return Err(PoolError::ChunksExhausted);
    };
    chunks[idx as usize] = ChunkSlot { refs: 1, link: 0 };
    state.resident_chunks += 1;
    state.chunks_in_use += 1;
    state.interval_chunks_high = state.interval_chunks_high.max(state.chunks_in_use);
    Ok(idx)
}

/// The free segment list is empty: a slot never used since the pool was built or reset (of
/// `slots` in all).
#[cold]
fn fresh_segment(slots: usize, state: &mut State) -> Result<u32, PoolError> {
    if (state.fresh_segment as usize) < slots {
        state.fresh_segment += 1;
        Ok(state.fresh_segment - 1)
    } else {
        state.allocation_failures += 1;
        Err(PoolError::SegmentsExhausted)
    }
}

/// A pool borrowed for one operation: the regions as plain slices (the `Storage` enum is
/// matched once, not at every access) and the bookkeeping.
pub(crate) struct Slab<'p> {
    data: &'p mut [u8],
    chunks: &'p mut [ChunkSlot],
    segments: &'p mut [SegmentSlot],
    state: &'p mut State,
}

impl<'p> Slab<'p> {
    #[inline]
    pub(crate) fn view(&self) -> View<'_> {
        View {
            data: self.data,
            chunks: self.chunks,
            segments: self.segments,
            chunk_size: self.state.chunk_size,
        }
    }

    #[inline]
    pub(crate) fn chunk_size(&self) -> usize {
        self.state.chunk_size as usize
    }

    fn into_chunk_bytes_mut(self, chunk: u32, start: u32, end: u32) -> &'p mut [u8] {
        let base = chunk as usize * self.state.chunk_size as usize;
        &mut self.data[base + start as usize..base + end as usize]
    }

    #[inline]
    pub(crate) fn alloc_chunk(&mut self) -> Result<u32, PoolError> {
        if self.state.chunks_in_use + self.state.withheld >= self.chunks.len() {
            self.state.allocation_failures += 1;
            return Err(PoolError::ChunksExhausted);
        }
        let idx = self.state.free_chunk;
        if idx == NIL {
            return alloc_cold_chunk(self.chunks, self.state);
        }
        let slot = &mut self.chunks[idx as usize];
        self.state.free_chunk = slot.link;
        *slot = ChunkSlot { refs: 1, link: 0 };
        self.state.chunks_in_use += 1;
        self.state.interval_chunks_high =
            self.state.interval_chunks_high.max(self.state.chunks_in_use);
        Ok(idx)
    }

    #[inline]
    pub(crate) fn add_ref(&mut self, chunk: u32) -> Result<(), PoolError> {
        let slot = &mut self.chunks[chunk as usize];
        debug_assert!(slot.refs > 0, "reference to free chunk {chunk}");
        slot.refs = slot.refs.checked_add(1).ok_or(PoolError::TooManyReferences)?;
        Ok(())
    }

    #[inline]
    pub(crate) fn release_ref(&mut self, chunk: u32) {
        let slot = &mut self.chunks[chunk as usize];
        debug_assert!(slot.refs > 0, "double release of chunk {chunk}");
        if slot.refs == 0 {
            return; // a caller bug; refusing keeps the free list intact
        }
        slot.refs -= 1;
        if slot.refs == 0 {
            slot.link = self.state.free_chunk;
            self.state.free_chunk = chunk;
            self.state.chunks_in_use -= 1;
        }
    }

    /// The chunk the last frame ended in and its fill mark, if that chunk is still in use and
    /// has `len` bytes of room. Writing past the fill mark of any in-use chunk is safe: nothing
    /// references those bytes.
    pub(crate) fn frame_room(&self, len: usize) -> Option<(u32, u32)> {
        let slot = self.chunks.get(self.state.frame_hint as usize).filter(|slot| slot.refs > 0)?;
        // `link` is the fill mark only while the chunk is in use (the free-list link otherwise).
        let room = (self.state.chunk_size - slot.link) as usize;
        (len <= room).then_some((self.state.frame_hint, slot.link))
    }

    pub(crate) fn set_frame_hint(&mut self, chunk: u32) {
        self.state.frame_hint = chunk;
    }

    /// End of the written bytes of an in-use chunk.
    #[inline]
    pub(crate) fn fill(&self, chunk: u32) -> u32 {
        self.chunks[chunk as usize].link
    }

    /// Lowers the fill mark again; only for undoing a write nobody references yet.
    pub(crate) fn rewind_fill(&mut self, chunk: u32, fill: u32) {
        let slot = &mut self.chunks[chunk as usize];
        debug_assert!(fill <= slot.link);
        slot.link = fill;
    }

    /// Copies as much of `bytes` as fits at the fill mark; returns `(start, copied)`.
    #[inline]
    pub(crate) fn write_at_fill(&mut self, chunk: u32, bytes: &[u8]) -> (u32, usize) {
        self.write_at_fill_with(chunk, bytes, |dst, src| dst.copy_from_slice(src))
    }

    /// [`write_at_fill`](Self::write_at_fill), the bytes written by `fill(dst, src)` (same
    /// lengths).
    #[inline]
    pub(crate) fn write_at_fill_with(
        &mut self,
        chunk: u32,
        bytes: &[u8],
        fill_with: impl FnOnce(&mut [u8], &[u8]),
    ) -> (u32, usize) {
        let fill = self.fill(chunk);
        let n = bytes.len().min((self.state.chunk_size - fill) as usize);
        fill_with(self.chunk_bytes_mut(chunk, fill, fill + n as u32), &bytes[..n]);
        self.chunks[chunk as usize].link = fill + n as u32;
        (fill, n)
    }

    #[inline]
    fn chunk_bytes_mut(&mut self, chunk: u32, start: u32, end: u32) -> &mut [u8] {
        let base = chunk as usize * self.state.chunk_size as usize;
        &mut self.data[base + start as usize..base + end as usize]
    }

    /// Takes a segment slot for `chunk[start..end]` and a reference to the chunk.
    #[inline]
    pub(crate) fn alloc_segment(
        &mut self,
        chunk: u32,
        start: u32,
        end: u32,
    ) -> Result<u32, PoolError> {
        if !self.segment_available() {
            self.state.allocation_failures += 1;
            return Err(PoolError::SegmentsExhausted);
        }
        self.add_ref(chunk)?;
        self.alloc_segment_owning(chunk, start, end)
    }

    /// Whether a segment slot is free.
    #[inline]
    pub(crate) fn segment_available(&self) -> bool {
        self.state.free_segment != NIL || (self.state.fresh_segment as usize) < self.segments.len()
    }

    /// Takes a segment slot for a chunk just allocated, inheriting its first reference.
    #[inline]
    pub(crate) fn alloc_segment_owning(
        &mut self,
        chunk: u32,
        start: u32,
        end: u32,
    ) -> Result<u32, PoolError> {
        let idx = self.state.free_segment;
        let idx = if idx != NIL {
            self.state.free_segment = self.segments[idx as usize].next;
            idx
        } else {
            fresh_segment(self.segments.len(), self.state)?
        };
        self.segments[idx as usize] = SegmentSlot { chunk, start, end, next: NIL };
        self.state.segments_in_use += 1;
        self.state.interval_segments_high =
            self.state.interval_segments_high.max(self.state.segments_in_use);
        Ok(idx)
    }

    /// Returns a segment slot and its chunk reference; returns the slot's `next`.
    #[inline]
    pub(crate) fn free_segment(&mut self, idx: u32) -> u32 {
        let slot = &mut self.segments[idx as usize];
        let next = slot.next;
        let chunk = slot.chunk & CHUNK_MASK;
        slot.next = self.state.free_segment;
        self.state.free_segment = idx;
        self.state.segments_in_use -= 1;
        self.release_ref(chunk);
        next
    }

    #[inline]
    pub(crate) fn segment(&self, idx: u32) -> SegmentSlot {
        self.segments[idx as usize]
    }

    #[inline]
    pub(crate) fn segment_mut(&mut self, idx: u32) -> &mut SegmentSlot {
        &mut self.segments[idx as usize]
    }
}

/// A pool borrowed read-only: the regions as plain slices.
#[derive(Clone, Copy)]
pub(crate) struct View<'p> {
    data: &'p [u8],
    chunks: &'p [ChunkSlot],
    segments: &'p [SegmentSlot],
    chunk_size: u32,
}

impl fmt::Debug for View<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("View").field("chunks", &self.chunks.len()).finish_non_exhaustive()
    }
}

impl<'p> View<'p> {
    /// End of the written bytes of an in-use chunk.
    #[inline]
    pub(crate) fn fill(&self, chunk: u32) -> u32 {
        self.chunks[chunk as usize].link
    }

    #[inline]
    pub(crate) fn chunk_bytes(&self, chunk: u32, start: u32, end: u32) -> &'p [u8] {
        let base = chunk as usize * self.chunk_size as usize;
        &self.data[base + start as usize..base + end as usize]
    }

    #[inline]
    pub(crate) fn segment(&self, idx: u32) -> SegmentSlot {
        self.segments[idx as usize]
    }

    #[inline]
    pub(crate) fn segment_bytes(&self, seg: &SegmentSlot) -> &'p [u8] {
        self.chunk_bytes(seg.chunk(), seg.start, seg.end)
    }
}

#[cfg(test)]
impl Pool<'_> {
    /// Checks the pool's bookkeeping against the chains and handles that reference it: every
    /// reference count, both free lists and the in-use counters. Panics on a mismatch.
    pub(crate) fn audit<'c>(
        &self,
        chains: impl IntoIterator<Item = &'c crate::ChunkChain>,
        handles: &[&ChunkId],
    ) {
        extern crate std;
        use std::vec;

        let mut refs = vec![0u32; self.chunks.len()];
        let mut linked = 0;
        for chain in chains {
            let mut len = 0;
            let mut last = NIL;
            let mut cur = chain.head_index();
            while cur != NIL {
                let seg = self.view().segment(cur);
                assert!(seg.start < seg.end, "empty segment {cur}");
                assert!(
                    seg.end <= self.view().fill(seg.chunk()),
                    "segment {cur} past its chunk's fill"
                );
                refs[seg.chunk() as usize] += 1;
                len += seg.len();
                linked += 1;
                last = cur;
                cur = seg.next;
            }
            assert_eq!(chain.len(), len, "chain length");
            assert_eq!(chain.tail_index(), last, "chain tail");
        }
        for handle in handles {
            refs[handle.0 as usize] += 1;
        }
        let fresh = self.state.fresh_chunk as usize;
        assert!(fresh <= self.chunks.len());
        for (i, slot) in self.chunks[..fresh].iter().enumerate() {
            assert_eq!(slot.refs, refs[i], "reference count of chunk {i}");
            if slot.refs > 0 {
                assert!(slot.link <= self.state.chunk_size, "fill of chunk {i}");
            }
        }
        assert!(refs[fresh..].iter().all(|&r| r == 0), "a reference above the fresh index");
        assert_eq!(self.state.chunks_in_use, refs.iter().filter(|&&r| r > 0).count());
        let mut on_list = vec![false; fresh];
        let mut walk = |head: u32, what: &str| {
            let (mut n, mut cur) = (0, head);
            while cur != NIL {
                let i = cur as usize;
                assert!(i < fresh, "{what} chunk {i} above the fresh index");
                assert!(!on_list[i], "chunk {i} twice on the free lists");
                on_list[i] = true;
                assert_eq!(self.chunks[i].refs, 0, "chunk {i} on the {what} list is in use");
                n += 1;
                cur = self.chunks[i].link;
            }
            n
        };
        let warm = walk(self.state.free_chunk, "warm");
        let cold = walk(self.state.cold_chunk, "cold");
        assert_eq!(warm + cold, fresh - self.state.chunks_in_use, "free chunk lists' length");
        assert_eq!(self.state.resident_chunks, self.state.chunks_in_use + warm, "resident");
        assert_eq!(self.state.segments_in_use, linked, "segments in use");
        let fresh = self.state.fresh_segment as usize;
        let (mut free, mut cur) = (0, self.state.free_segment);
        while cur != NIL {
            assert!((cur as usize) < fresh, "free segment {cur} above the fresh index");
            free += 1;
            cur = self.segments[cur as usize].next;
        }
        assert_eq!(free, fresh - linked, "free segment list length");
        assert!(self.budget.drawn() <= self.budget.limit(), "budget exceeded");
        assert!(self.chunks_high_water() >= self.state.chunks_in_use);
        assert!(self.state.interval_chunks_high >= self.state.chunks_in_use);
        assert!(self.state.interval_segments_high >= self.state.segments_in_use);
        assert!(self.resident_bytes() <= self.footprint, "resident beyond the footprint");
    }
}

#[cfg(feature = "alloc")]
impl Pool<'static> {
    /// Builds a pool sized by `config` and drawn from `budget`, with address space reserved per
    /// region (data, chunk slots, segment slots): with feature `std` an anonymous mapping each,
    /// whose pages become resident when first written and which
    /// [`release_idle`](Self::release_idle) gives back (falling back to the heap should the
    /// system refuse the mapping); with `alloc` alone one zeroed allocation each. Nothing is
    /// written here and nothing is allocated after this returns.
    pub fn new(mut budget: Budget, config: PoolConfig) -> Result<Self, PoolConfigError> {
        use alloc::vec;

        let chunk_size = config.chunk_size;
        if chunk_size == 0 || chunk_size > MAX_CHUNK_SIZE {
            return Err(PoolConfigError::ChunkSize { chunk_size });
        }
        let chunks = match config.chunk_count {
            Some(n) => n,
            None => {
                let per_chunk = Self::footprint(chunk_size, 1, config.segments_per_chunk);
                (budget.available() / per_chunk).min(MAX_CHUNKS)
            }
        };
        let segments = chunks.saturating_mul(config.segments_per_chunk);
        check_shape(chunk_size, chunks, segments)?;
        let footprint = Self::footprint(chunk_size, chunks, segments);
        budget.try_draw(footprint)?;
        let heap = || {
            (
                Storage::Owned(vec![0u8; chunk_size * chunks].into_boxed_slice()),
                Storage::Owned(vec![ChunkSlot::EMPTY; chunks].into_boxed_slice()),
                Storage::Owned(vec![SegmentSlot::EMPTY; segments].into_boxed_slice()),
            )
        };
        #[cfg(feature = "std")]
        {
            use crate::mapping::Mapping;
            if let (Some(d), Some(c), Some(s)) = (
                Mapping::zeroed(chunk_size * chunks),
                Mapping::zeroed(chunks),
                Mapping::zeroed(segments),
            ) {
                let ((d, unmap_d), (c, unmap_c), (s, unmap_s)) = (d.leak(), c.leak(), s.leak());
                let (d, c, s) = (Storage::Borrowed(d), Storage::Borrowed(c), Storage::Borrowed(s));
                let mut pool = Self::build(budget, footprint, chunk_size, d, c, s);
                pool.mapped = Some([unmap_d, unmap_c, unmap_s]);
                pool.set_release_policy(config.warm_reserve, config.idle_ticks);
                return Ok(pool);
            }
        }
        let (data, chunk_slots, segment_slots) = heap();
        let mut pool = Self::build(budget, footprint, chunk_size, data, chunk_slots, segment_slots);
        pool.set_release_policy(config.warm_reserve, config.idle_ticks);
        Ok(pool)
    }
}

impl fmt::Debug for Pool<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("chunk_size", &self.state.chunk_size)
            .field("chunks_total", &self.chunks.len())
            .field("chunks_in_use", &self.state.chunks_in_use)
            .field("segments_total", &self.segments.len())
            .field("segments_in_use", &self.state.segments_in_use)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

fn check_shape(chunk_size: usize, chunks: usize, segments: usize) -> Result<(), PoolConfigError> {
    if chunk_size == 0 || chunk_size > MAX_CHUNK_SIZE {
        return Err(PoolConfigError::ChunkSize { chunk_size });
    }
    if chunks == 0 {
        return Err(PoolConfigError::NoChunks);
    }
    if chunks > MAX_CHUNKS || chunk_size.checked_mul(chunks).is_none() {
        return Err(PoolConfigError::TooManyChunks { chunks });
    }
    if segments == 0 || segments > MAX_SEGMENTS {
        return Err(PoolConfigError::Segments { segments });
    }
    Ok(())
}

/// How to size a [`Pool`] built with [`Pool::new`].
///
/// ```
/// use freeboard_buf::{Budget, Pool, PoolConfig};
///
/// // 16 chunks of 1 KiB, 4 segment slots per chunk.
/// let config = PoolConfig::new().with_chunk_size(1024).with_chunk_count(16).with_segments_per_chunk(4);
/// let pool = Pool::new(Budget::new(1 << 20), config).unwrap();
/// assert_eq!(pool.footprint_bytes(), Pool::footprint(1024, 16, 64));
///
/// // Without a chunk count the pool takes as many chunks as its budget covers.
/// let pool = Pool::new(Budget::new(1 << 20), PoolConfig::new()).unwrap();
/// assert_eq!(pool.chunks_total(), (1 << 20) / (4096 + 8 + 8 * 16));
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Bytes per chunk, 1..=[`MAX_CHUNK_SIZE`]; default [`DEFAULT_CHUNK_SIZE`].
    pub chunk_size: usize,
    /// Chunks in the pool; `None` (the default) takes as many as the budget covers.
    pub chunk_count: Option<usize>,
    /// Segment slots per chunk; default [`DEFAULT_SEGMENTS_PER_CHUNK`].
    pub segments_per_chunk: usize,
    /// Bytes of free chunks [`Pool::release_idle`] keeps resident while the pool is in use
    /// (rounded up to whole chunks); default [`DEFAULT_WARM_RESERVE`].
    pub warm_reserve: usize,
    /// Consecutive quiet calls of [`Pool::release_idle`] (no chunk or segment in use) after which
    /// every page the pool touched is given back; 0 never; default [`DEFAULT_IDLE_TICKS`].
    pub idle_ticks: u32,
}

impl PoolConfig {
    /// 4 KiB chunks, as many as the budget covers, 8 segment slots per chunk, a 1 MiB warm
    /// reserve, everything given back after 3 quiet intervals.
    pub const fn new() -> Self {
        Self {
            chunk_size: DEFAULT_CHUNK_SIZE,
            chunk_count: None,
            segments_per_chunk: DEFAULT_SEGMENTS_PER_CHUNK,
            warm_reserve: DEFAULT_WARM_RESERVE,
            idle_ticks: DEFAULT_IDLE_TICKS,
        }
    }

    /// Sets the chunk size in bytes.
    pub const fn with_chunk_size(mut self, chunk_size: usize) -> Self {
        self.chunk_size = chunk_size;
        self
    }

    /// Sets the number of chunks (instead of filling the budget).
    pub const fn with_chunk_count(mut self, chunks: usize) -> Self {
        self.chunk_count = Some(chunks);
        self
    }

    /// Sets the number of segment slots per chunk.
    pub const fn with_segments_per_chunk(mut self, segments: usize) -> Self {
        self.segments_per_chunk = segments;
        self
    }

    /// Sets the bytes of free chunks kept resident while the pool is in use.
    pub const fn with_warm_reserve(mut self, bytes: usize) -> Self {
        self.warm_reserve = bytes;
        self
    }

    /// Sets the quiet calls of [`Pool::release_idle`] after which everything is given back
    /// (0: never).
    pub const fn with_idle_ticks(mut self, ticks: u32) -> Self {
        self.idle_ticks = ticks;
        self
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// One reference to a pool chunk: a `u32` index, deliberately neither `Copy` nor `Clone`.
///
/// Each `ChunkId` value *is* one counted reference, so it can only be duplicated through
/// [`Pool::share`] and is consumed by [`Pool::release`]; a released handle cannot be used again.
/// Dropping one without releasing it leaks the chunk (visible in
/// [`Pool::chunks_in_use`]), because releasing needs `&mut Pool`.
///
/// ```
/// use freeboard_buf::{Budget, Pool, PoolConfig};
///
/// let mut pool = Pool::new(Budget::new(1 << 16), PoolConfig::new().with_chunk_count(1)).unwrap();
/// let id = pool.alloc().unwrap();
/// assert_eq!(id.index(), 0);
/// pool.release(id);
/// ```
#[must_use = "a ChunkId holds a reference; give it back with Pool::release"]
#[derive(Debug, PartialEq, Eq)]
pub struct ChunkId(u32);

impl ChunkId {
    /// The chunk's index in its pool.
    pub fn index(&self) -> u32 {
        self.0
    }

    /// Takes the handle apart into its index, for a boundary Rust's ownership cannot follow
    /// (a C API hands the index out); [`from_raw`](Self::from_raw) puts it back together.
    pub fn into_raw(self) -> u32 {
        self.0
    }

    /// The handle that [`into_raw`](Self::into_raw) took apart. Restore each raw index once:
    /// a forged or duplicated handle miscounts the chunk's references (a logic error, never
    /// memory unsafety), and an index past [`Pool::chunks_total`] makes the pool panic.
    pub fn from_raw(index: u32) -> Self {
        Self(index)
    }
}

/// Metadata of one chunk (8 bytes), lent to [`Pool::from_slices`].
///
/// ```
/// use freeboard_buf::ChunkSlot;
///
/// let slots = [ChunkSlot::EMPTY; 16];
/// assert_eq!(core::mem::size_of_val(&slots), 16 * 8);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSlot {
    /// Invariant: 0 iff the chunk is on the free list; otherwise the number of `ChunkId` handles
    /// plus chain segments that reference it.
    refs: u32,
    /// In use: the fill mark — bytes `[0, link)` are written and never written again.
    /// Free: the next free chunk, or `NIL`.
    link: u32,
}

impl ChunkSlot {
    /// An unused slot, for initialising arrays.
    pub const EMPTY: Self = Self { refs: 0, link: NIL };
}

// A mapped region of slots starts as zeros and reads back as zeros after its pages are released.
#[cfg(feature = "std")]
#[allow(unsafe_code)]
// SAFETY: `ChunkSlot` is two `u32`s (`refs`, `link`); any bit pattern is a valid value, and it
// has no destructor.
unsafe impl crate::mapping::Zeroable for ChunkSlot {}

/// Metadata of one segment (16 bytes), lent to [`Pool::from_slices`]. A segment is a byte range
/// of one chunk linked into a chain.
///
/// ```
/// use freeboard_buf::SegmentSlot;
///
/// let slots = [SegmentSlot::EMPTY; 64];
/// assert_eq!(core::mem::size_of_val(&slots), 64 * 16);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSlot {
    /// Bits 0..30: chunk index; bit 31: `MESSAGE_START`; bit 30: `CONTROL`.
    chunk: u32,
    /// Invariant: `start < end <= fill(chunk)` while linked in a chain.
    pub(crate) start: u32,
    pub(crate) end: u32,
    /// Next segment of the chain or of the free list; `NIL` ends either.
    pub(crate) next: u32,
}

impl SegmentSlot {
    /// An unused slot, for initialising arrays.
    pub const EMPTY: Self = Self { chunk: 0, start: 0, end: 0, next: NIL };

    #[inline]
    pub(crate) fn chunk(&self) -> u32 {
        self.chunk & CHUNK_MASK
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// The first segment of a message none of whose bytes has been consumed.
    #[inline]
    pub(crate) fn starts_message(&self) -> bool {
        self.chunk & MESSAGE_START != 0
    }

    /// The first segment of a control message.
    #[inline]
    pub(crate) fn is_control(&self) -> bool {
        self.chunk & CONTROL != 0
    }

    pub(crate) fn mark_message_start(&mut self, control: bool) {
        self.chunk |= MESSAGE_START | if control { CONTROL } else { 0 };
    }

    pub(crate) fn clear_message_start(&mut self) {
        self.chunk &= !MESSAGE_START;
    }

    /// Flags a segment of a control message that continues one whose first bytes went out,
    /// so that a message in flight still says what it is.
    pub(crate) fn mark_control(&mut self) {
        self.chunk |= CONTROL;
    }
}

#[cfg(feature = "std")]
#[allow(unsafe_code)]
// SAFETY: `SegmentSlot` is four `u32`s; any bit pattern is a valid value, and it has no
// destructor.
unsafe impl crate::mapping::Zeroable for SegmentSlot {}

/// Why the pool could not serve a request. Every failure is also counted in
/// [`Counters::allocation_failures`].
///
/// ```
/// use freeboard_buf::PoolError;
///
/// assert_eq!(PoolError::ChunksExhausted.to_string(), "chunk pool exhausted");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolError {
    /// Every chunk is in use.
    ChunksExhausted,
    /// Every segment slot is in use.
    SegmentsExhausted,
    /// A chunk's reference count would overflow `u32`.
    TooManyReferences,
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolError::ChunksExhausted => "chunk pool exhausted",
            PoolError::SegmentsExhausted => "segment slots exhausted",
            PoolError::TooManyReferences => "chunk reference count overflow",
        })
    }
}

impl core::error::Error for PoolError {}

/// A pool that cannot be built as asked.
///
/// ```
/// use freeboard_buf::{Budget, PoolConfigError, Pool, PoolConfig};
///
/// let err = Pool::new(Budget::new(100), PoolConfig::new().with_chunk_count(1)).unwrap_err();
/// assert!(matches!(err, PoolConfigError::Budget(_)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolConfigError {
    /// The chunk size is 0 or above [`MAX_CHUNK_SIZE`].
    ChunkSize {
        /// The size asked for.
        chunk_size: usize,
    },
    /// The pool would hold no chunk (the budget does not cover one).
    NoChunks,
    /// More than [`MAX_CHUNKS`] chunks, or a data region larger than the address space.
    TooManyChunks {
        /// The count asked for.
        chunks: usize,
    },
    /// No segment slot, or more than `u32::MAX - 1`.
    Segments {
        /// The count asked for.
        segments: usize,
    },
    /// The data slice is not `chunk_size × chunks` bytes long.
    RegionMismatch {
        /// `chunk_size × chunks`.
        expected: usize,
        /// The slice's length.
        actual: usize,
    },
    /// The budget does not cover the pool's footprint.
    Budget(BudgetExceeded),
}

impl From<BudgetExceeded> for PoolConfigError {
    fn from(e: BudgetExceeded) -> Self {
        PoolConfigError::Budget(e)
    }
}

impl fmt::Display for PoolConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolConfigError::ChunkSize { chunk_size } => {
                write!(f, "chunk size {chunk_size} outside 1..={MAX_CHUNK_SIZE}")
            }
            PoolConfigError::NoChunks => f.write_str("the pool would hold no chunk"),
            PoolConfigError::TooManyChunks { chunks } => write!(f, "too many chunks: {chunks}"),
            PoolConfigError::Segments { segments } => {
                write!(f, "invalid segment count: {segments}")
            }
            PoolConfigError::RegionMismatch { expected, actual } => {
                write!(f, "data region is {actual} bytes, expected {expected}")
            }
            PoolConfigError::Budget(e) => write!(f, "pool footprint: {e}"),
        }
    }
}

impl core::error::Error for PoolConfigError {}

/// Messages and bytes removed by a policy or a discard.
///
/// ```
/// use freeboard_buf::DropTally;
///
/// assert_eq!(DropTally::ZERO, DropTally { messages: 0, bytes: 0 });
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropTally {
    /// Whole messages removed.
    pub messages: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl DropTally {
    /// Nothing dropped.
    pub const ZERO: Self = Self { messages: 0, bytes: 0 };

    fn add(&mut self, messages: u32, bytes: usize) {
        self.messages += u64::from(messages);
        self.bytes += bytes as u64;
    }
}

/// A snapshot of a pool's counters, for `/metrics` and bench reports.
///
/// ```
/// use freeboard_buf::{Budget, Pool, PoolConfig, SlowConsumerPolicy};
///
/// let pool = Pool::new(Budget::new(1 << 20), PoolConfig::new()).unwrap();
/// let c = pool.counters();
/// assert_eq!(c.chunks_in_use, 0);
/// assert!(c.budget_drawn <= c.budget_limit);
/// assert_eq!(c.dropped(SlowConsumerPolicy::DropOldest).messages, 0);
/// assert_eq!(c.fragmentation_index(), 0.0);
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Counters {
    /// The budget's limit in bytes.
    pub budget_limit: usize,
    /// Bytes drawn from the budget (the pool's footprint plus other consumers).
    pub budget_drawn: usize,
    /// Most bytes ever drawn from the budget at once.
    pub budget_high_water: usize,
    /// Bytes per chunk.
    pub chunk_size: usize,
    /// Chunks in the pool.
    pub chunks_total: usize,
    /// Chunks referenced now.
    pub chunks_in_use: usize,
    /// Most chunks ever referenced at once.
    pub chunks_high_water: usize,
    /// Chunks whose pages the pool keeps resident: in use, or free and warm.
    pub chunks_resident: usize,
    /// Bytes of the pool that may be resident ([`Pool::resident_bytes`]): resident chunks plus
    /// the metadata touched since the pool was built or last gave everything back.
    pub resident_bytes: usize,
    /// Bytes given back to the operating system by [`Pool::release_idle`] since the pool was
    /// built.
    pub released_bytes: u64,
    /// Segment slots in the pool.
    pub segments_total: usize,
    /// Segment slots in chains now.
    pub segments_in_use: usize,
    /// Most segment slots ever in use at once.
    pub segments_high_water: usize,
    /// Allocation attempts refused because chunks or segments ran out (each refusal counts,
    /// including retries a policy makes after dropping a message).
    pub allocation_failures: u64,
    /// Pushes refused with [`PushOutcome::WouldBlock`](crate::PushOutcome::WouldBlock).
    pub would_block: u64,
    /// Pushes answered with [`PushOutcome::MustClose`](crate::PushOutcome::MustClose).
    pub slow_consumer_closes: u64,
    /// Messages removed by [`SendQueue::discard_unsent`](crate::SendQueue::discard_unsent) and
    /// [`SendQueue::clear`](crate::SendQueue::clear).
    pub discarded: DropTally,
    dropped: [DropTally; SlowConsumerPolicy::ALL.len()],
}

impl Counters {
    /// Messages dropped by queues running `policy`.
    pub fn dropped(&self, policy: SlowConsumerPolicy) -> DropTally {
        self.dropped[policy as usize]
    }

    /// Messages dropped by all policies together.
    pub fn dropped_total(&self) -> DropTally {
        self.dropped.iter().fold(DropTally::ZERO, |acc, t| DropTally {
            messages: acc.messages + t.messages,
            bytes: acc.bytes + t.bytes,
        })
    }

    /// `1 − largest_free_block / total_free`, for reports that put the pool beside heap-based
    /// designs. Always 0 for a pool: no request needs more than one chunk to be contiguous (a
    /// larger message is a chain of chunks), and every free chunk can serve any request, so the
    /// largest usable free block is all the free memory. 0 also when nothing is free.
    pub fn fragmentation_index(&self) -> f64 {
        let free = (self.chunks_total - self.chunks_in_use) * self.chunk_size;
        fragmentation_index(free, free)
    }
}

/// `1 − largest_free_block / total_free`: 0 when all free memory is one usable block (or when
/// nothing is free), approaching 1 as free memory shatters into pieces too small to use.
///
/// ```
/// use freeboard_buf::fragmentation_index;
///
/// assert_eq!(fragmentation_index(4096, 4096), 0.0);
/// assert_eq!(fragmentation_index(1024, 4096), 0.75);
/// assert_eq!(fragmentation_index(0, 0), 0.0);
/// ```
pub fn fragmentation_index(largest_free_block: usize, total_free: usize) -> f64 {
    if total_free == 0 {
        return 0.0;
    }
    1.0 - largest_free_block as f64 / total_free as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_pool<'a>(
        data: &'a mut [u8],
        chunks: &'a mut [ChunkSlot],
        segments: &'a mut [SegmentSlot],
    ) -> Pool<'a> {
        let size = data.len() / chunks.len();
        let budget = Budget::new(Pool::footprint(size, chunks.len(), segments.len()));
        Pool::from_slices(budget, size, data, chunks, segments).unwrap()
    }

    #[test]
    fn withheld_chunks_are_not_handed_out() {
        let (mut data, mut chunks, mut segments) =
            ([0u8; 4 * 64], [ChunkSlot::EMPTY; 4], [SegmentSlot::EMPTY; 8]);
        let mut pool = small_pool(&mut data, &mut chunks, &mut segments);
        let a = pool.alloc().unwrap();
        pool.withhold(2);
        assert_eq!(pool.chunks_free(), 1);
        let b = pool.alloc().unwrap();
        assert_eq!(pool.alloc().unwrap_err(), PoolError::ChunksExhausted);
        // More withheld than is free: what is in use stays, nothing more is handed out.
        pool.withhold(4);
        assert_eq!(pool.chunks_free(), 0);
        pool.release(a);
        assert_eq!(pool.alloc().unwrap_err(), PoolError::ChunksExhausted);
        pool.withhold(0);
        let c = pool.alloc().unwrap();
        assert_eq!(
            (pool.chunks_in_use(), pool.chunks_free(), pool.counters().allocation_failures),
            (2, 2, 2)
        );
        pool.release(b);
        pool.release(c);
    }

    #[test]
    fn metadata_sizes() {
        assert_eq!(size_of::<ChunkSlot>(), 8);
        assert_eq!(size_of::<SegmentSlot>(), 16);
        if cfg!(target_pointer_width = "64") {
            assert_eq!(size_of::<crate::ChunkChain>(), 16);
            assert_eq!(size_of::<crate::SendQueue>(), 48);
            assert_eq!(size_of::<crate::Frame>(), 16);
        }
    }

    #[test]
    fn alloc_until_exhausted_then_reuse_lifo() {
        let (mut d, mut c, mut s) = ([0u8; 64], [ChunkSlot::EMPTY; 4], [SegmentSlot::EMPTY; 4]);
        let mut pool = small_pool(&mut d, &mut c, &mut s);
        let ids: [ChunkId; 4] = core::array::from_fn(|_| pool.alloc().unwrap());
        assert_eq!(pool.alloc(), Err(PoolError::ChunksExhausted));
        assert_eq!(pool.chunks_in_use(), 4);
        let [a, b, c2, d2] = ids;
        let b_index = b.index();
        pool.release(b);
        let again = pool.alloc().unwrap();
        assert_eq!(again.index(), b_index, "the most recently freed chunk comes back first");
        for id in [a, c2, d2, again] {
            pool.release(id);
        }
        let counters = pool.counters();
        assert_eq!((counters.chunks_in_use, counters.chunks_high_water), (0, 4));
        assert_eq!(counters.allocation_failures, 1);
    }

    #[test]
    fn shared_chunk_returns_with_last_reference() {
        let (mut d, mut c, mut s) = ([0u8; 32], [ChunkSlot::EMPTY; 2], [SegmentSlot::EMPTY; 2]);
        let mut pool = small_pool(&mut d, &mut c, &mut s);
        let a = pool.alloc().unwrap();
        assert_eq!(pool.append(&a, b"0123456789abcdefXYZ"), 16);
        let b = pool.share(&a).unwrap();
        assert_eq!(pool.refs(&a), 2);
        pool.release(a);
        assert_eq!(pool.chunks_in_use(), 1);
        assert_eq!(pool.bytes(&b), b"0123456789abcdef");
        pool.release(b);
        assert_eq!(pool.chunks_in_use(), 0);
    }

    #[test]
    fn spare_and_commit() {
        let (mut d, mut c, mut s) = ([0u8; 16], [ChunkSlot::EMPTY; 1], [SegmentSlot::EMPTY; 1]);
        let mut pool = small_pool(&mut d, &mut c, &mut s);
        let a = pool.alloc().unwrap();
        pool.spare_mut(&a)[..3].copy_from_slice(b"abc");
        assert_eq!(pool.commit(&a, 3), 3);
        assert_eq!(pool.spare_mut(&a).len(), 13);
        assert_eq!(pool.commit(&a, 100), 13);
        assert_eq!(&pool.bytes(&a)[..3], b"abc");
        pool.release(a);
    }

    #[test]
    fn config_errors() {
        let (mut d, mut c, mut s) = ([0u8; 10], [ChunkSlot::EMPTY; 2], [SegmentSlot::EMPTY; 2]);
        let err = Pool::from_slices(Budget::new(1000), 4, &mut d, &mut c, &mut s).unwrap_err();
        assert_eq!(err, PoolConfigError::RegionMismatch { expected: 8, actual: 10 });
        let (mut d, mut c, mut s) = ([0u8; 8], [ChunkSlot::EMPTY; 2], [SegmentSlot::EMPTY; 2]);
        let err = Pool::from_slices(Budget::new(10), 4, &mut d, &mut c, &mut s).unwrap_err();
        assert!(matches!(err, PoolConfigError::Budget(_)));
        let (mut d, mut c, mut s) = ([0u8; 0], [ChunkSlot::EMPTY; 0], [SegmentSlot::EMPTY; 2]);
        let err = Pool::from_slices(Budget::new(1000), 4, &mut d, &mut c, &mut s).unwrap_err();
        assert_eq!(err, PoolConfigError::NoChunks);
    }

    #[cfg(feature = "std")]
    fn page_pool(chunks: usize, reserve_chunks: usize, idle_ticks: u32) -> Pool<'static> {
        let config = PoolConfig::new()
            .with_chunk_count(chunks)
            .with_warm_reserve(reserve_chunks * DEFAULT_CHUNK_SIZE)
            .with_idle_ticks(idle_ticks);
        Pool::new(Budget::new(usize::MAX), config).unwrap()
    }

    /// Allocates `n` chunks, writes each, releases them all: one interval's work.
    #[cfg(feature = "std")]
    fn cycle(pool: &mut Pool<'_>, n: usize) {
        extern crate std;
        let ids: std::vec::Vec<ChunkId> = (0..n).map(|_| pool.alloc().unwrap()).collect();
        for id in ids {
            pool.append(&id, b"frame");
            pool.release(id);
        }
    }

    #[cfg(feature = "std")]
    #[test]
    fn a_new_pool_touches_nothing() {
        let config =
            if cfg!(miri) { PoolConfig::new().with_chunk_count(64) } else { PoolConfig::new() };
        let before = crate::resident_set_bytes();
        let pool = Pool::new(Budget::new(1 << 30), config).unwrap();
        assert_eq!((pool.resident_bytes(), pool.chunks_resident()), (0, 0));
        if let (Some(before), Some(after)) = (before, crate::resident_set_bytes()) {
            // The old pool wrote 34 MiB of slots here; other tests run beside this one.
            assert!(after.saturating_sub(before) < 8 << 20, "RSS grew {} bytes", after - before);
        }
        assert!(pool.chunks_total() > 200_000 || cfg!(miri));
    }

    #[cfg(feature = "std")]
    #[test]
    fn a_steady_workload_pays_nothing() {
        let mut pool = page_pool(64, 0, 0);
        cycle(&mut pool, 10);
        assert_eq!(pool.release_idle(), Released::NOTHING, "the chunks were taken fresh");
        for _ in 0..5 {
            cycle(&mut pool, 10);
            assert_eq!(pool.release_idle(), Released::NOTHING);
            assert_eq!(pool.chunks_resident(), 10);
        }
    }

    #[cfg(feature = "std")]
    #[test]
    fn chunks_free_all_interval_go_beyond_the_reserve() {
        let mut pool = page_pool(256, 20, 0);
        cycle(&mut pool, 100); // a burst
        assert_eq!(pool.release_idle(), Released::NOTHING);
        cycle(&mut pool, 10); // back to steady: 90 chunks stayed free, 20 of them are kept
        let released = pool.release_idle();
        assert_eq!(released, Released { chunks: 70, bytes: 70 * DEFAULT_CHUNK_SIZE });
        assert_eq!(pool.chunks_resident(), 30);
        cycle(&mut pool, 10);
        assert_eq!(pool.release_idle(), Released::NOTHING, "the reserve stays");
        // The next burst takes the warm ones first, then the cold ones, then fresh ones.
        cycle(&mut pool, 120);
        assert_eq!(pool.chunks_resident(), 120);
        assert_eq!(pool.counters().chunks_high_water, 120);
        assert_eq!(pool.counters().released_bytes, 70 * DEFAULT_CHUNK_SIZE as u64);
        pool.audit([], &[]);
    }

    #[cfg(feature = "std")]
    #[test]
    fn a_quiet_pool_gives_everything_back_and_starts_over() {
        let mut pool = page_pool(64, 8, 2);
        let mut chain = crate::ChunkChain::new();
        chain.append(&mut pool, &[7u8; 3 * DEFAULT_CHUNK_SIZE]).unwrap();
        let held = pool.alloc().unwrap();
        assert!(pool.resident_bytes() >= 4 * DEFAULT_CHUNK_SIZE);
        pool.release_idle();
        pool.release_idle();
        pool.release_idle();
        assert!(pool.resident_bytes() >= 4 * DEFAULT_CHUNK_SIZE, "in use: nothing goes");
        assert_eq!(chain.consume(&mut pool, usize::MAX), 3 * DEFAULT_CHUNK_SIZE);
        pool.release(held);
        assert_eq!(pool.release_idle().chunks, 0, "used during this interval; the reserve covers");
        assert_eq!(pool.release_idle().chunks, 0, "one quiet interval");
        let all = pool.release_idle();
        assert_eq!(all.chunks, 4, "two quiet intervals: everything");
        assert_eq!(pool.resident_bytes(), 0);
        pool.audit([&chain], &[]);
        chain.append(&mut pool, b"again").unwrap();
        assert_eq!(
            chain.segments(&pool).flatten().copied().collect::<std::vec::Vec<u8>>(),
            b"again"
        );
        assert_eq!(chain.consume(&mut pool, 5), 5);
    }

    #[test]
    fn fragmentation_is_zero() {
        assert_eq!(fragmentation_index(0, 0), 0.0);
        let (mut d, mut c, mut s) = ([0u8; 16], [ChunkSlot::EMPTY; 1], [SegmentSlot::EMPTY; 1]);
        let mut pool = small_pool(&mut d, &mut c, &mut s);
        assert_eq!(pool.fragmentation_index(), 0.0);
        let a = pool.alloc().unwrap();
        assert_eq!(pool.fragmentation_index(), 0.0, "nothing free");
        pool.release(a);
    }
}
