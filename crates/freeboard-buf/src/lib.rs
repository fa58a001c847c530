//! Bounded memory for freeboard: a byte [`Budget`], a [`Pool`] of fixed-size chunks, byte queues
//! made of chunks ([`ChunkChain`]), zero-copy shared [`Frame`]s, a message-aware [`SendQueue`]
//! with [`Watermarks`] and a [`SlowConsumerPolicy`], and a fixed-capacity [`RingBuffer`].
//!
//! # The memory model
//!
//! Every byte of buffer memory comes from one [`Budget`]. A [`Pool`] draws its whole footprint
//! (chunk data plus metadata) from the budget when it is built and never allocates again: chunk
//! handles are `u32` indices, allocation and release pop and push an intrusive free list (O(1)),
//! and exhaustion is an ordinary [`PoolError`] value.
//!
//! The budget is a bound, not a cost: a pool reserves its regions as address space and touches
//! a page only when a chunk or slot on it is first used, so a 1 GiB budget costs nothing resident
//! at rest; and [`Pool::release_idle`], called once a second by the event loop, gives the pages
//! of chunks that stayed free back to the operating system beyond a warm reserve, and everything
//! after a few quiet seconds (see [`Pool`]). [`resident_set_bytes`] reads the process's RSS for a
//! gauge beside the pool's own [`Pool::resident_bytes`].
//!
//! A [`ChunkChain`] is a FIFO of *segments* — `(chunk, start, end)` — linked through a second
//! fixed slab owned by the pool. A segment references bytes that are never written again, so one
//! chunk can sit in many chains at different offsets: a broadcast is framed once into a
//! [`Frame`] and every subscriber's chain holds a reference (plain `u32` reference counts in the
//! pool's metadata; the pool belongs to one event loop, so no atomics). A frame that crosses to
//! another event loop travels as a [`SharedFrame`] (`Arc<[u8]>`) and is framed once more into
//! that loop's pool.
//!
//! Idle chains hold no chunks and no segments. Metadata costs (64-bit targets; 32-bit in
//! brackets where it differs):
//!
//! | metadata | bytes | lives in |
//! |---|---|---|
//! | per chunk ([`ChunkSlot`]: reference count, fill mark / free link) | 8 | pool |
//! | per segment ([`SegmentSlot`]: chunk + flags, start, end, next) | 16 | pool |
//! | per chain ([`ChunkChain`]: head, tail, length) | 16 (12) | owner |
//! | per send queue ([`SendQueue`]: chain, watermarks, policy, message count) | 56 (36) | owner |
//!
//! A chain uses one segment per chunk it spans; a send queue at least one per queued message
//! (message boundaries are flags on segments, so they cost nothing more); a shared frame one per
//! chunk per queue that references it. With the default 4 KiB chunk and 8 segment slots per
//! chunk, the pool's metadata is (8 + 8 × 16) / 4096 = 3.3 % of its data.
//!
//! # Example
//!
//! ```
//! use freeboard_buf::{Budget, Pool, PoolConfig, PushOutcome, SendQueue, SlowConsumerPolicy,
//!     Watermarks};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new())?;
//! let mut queue = SendQueue::new(Watermarks::new(1024, 4096, 16384)?, SlowConsumerPolicy::DropOldest);
//!
//! let pushed = queue.push_message(&mut pool, &[b"\x81\x05", b"hello"]);
//! assert_eq!(pushed.outcome, PushOutcome::Queued);
//! assert_eq!(queue.len(), 7); // bufferedAmount
//!
//! let mut iov = [&[][..]; 8];
//! let n = queue.slices(&pool, &mut iov);
//! assert_eq!(iov[..n].concat(), b"\x81\x05hello");
//! let _ = queue.consume(&mut pool, 7); // the socket took all seven bytes
//! assert_eq!(pool.chunks_in_use(), 0);
//! # Ok(()) }
//! ```
#![no_std]
// One module, `mapping`, reserves address space and gives pages back to the operating system;
// it is the crate's only `unsafe` code and allows it for itself. The one other `unsafe` is a
// promise, not code: the pool's slot types are `Zeroable`, said beside their fields in `pool`.
#![deny(unsafe_code)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(any(feature = "std", test))]
extern crate std;

mod backpressure;
mod budget;
mod chain;
#[cfg(feature = "std")]
mod mapping;
mod pool;
#[cfg(all(test, feature = "std"))]
mod proptests;
mod queue;
mod ring;
#[cfg(all(feature = "alloc", target_has_atomic = "ptr"))]
mod shared;
mod storage;

pub use backpressure::{SlowConsumerPolicy, WatermarkError, Watermarks, Writability};
pub use budget::{Budget, BudgetExceeded};
pub use chain::{ChunkChain, Frame, Part, Segments};
#[cfg(feature = "std")]
pub use mapping::{PageBuffer, resident_set_bytes};
pub use pool::{
    ChunkId, ChunkSlot, Counters, DEFAULT_CHUNK_SIZE, DEFAULT_IDLE_TICKS,
    DEFAULT_SEGMENTS_PER_CHUNK, DEFAULT_WARM_RESERVE, DropTally, MAX_CHUNK_SIZE, MAX_CHUNKS, Pool,
    PoolConfig, PoolConfigError, PoolError, Released, SegmentSlot, fragmentation_index,
};
pub use queue::{ConflateKey, Discarded, Limit, MAX_CONTROL_FRAME, PushOutcome, Pushed, SendQueue};
pub use ring::{Empty, Full, RingBuffer};
#[cfg(all(feature = "alloc", target_has_atomic = "ptr"))]
pub use shared::SharedFrame;

/// The README's example, compiled and run with the doctests so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
