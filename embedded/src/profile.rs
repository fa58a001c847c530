//! The memory profile: the pool's static region and what it is carved into.
//!
//! The default build gives the pool the seed device's 400 KiB (an ESP32-C3 has 400 KiB of
//! SRAM); `--features pool-64k` gives it 64 KiB, with smaller chunks and fewer sockets. Each
//! socket also has its own static TCP rings (outside the pool) of `SOCKET_RX` + `SOCKET_TX`.
//! In the 400 KiB build the sockets are the limit (the pool would admit 31 connections); in the
//! 64 KiB build the pool is (it admits 5 connections on 6 sockets).

use freeboard_buf::Pool;

#[cfg(not(feature = "pool-64k"))]
mod sizes {
    pub const POOL_REGION: usize = 400 * 1024;
    pub const CHUNK_SIZE: usize = 1024;
    pub const SOCKETS: usize = 16;
    pub const SOCKET_RX: usize = 4096;
    pub const SOCKET_TX: usize = 4096;
    pub const QUEUE_HIGH: usize = 8192;
    pub const QUEUE_LOW: usize = 2048;
    pub const READ_LIMIT: usize = 2048;
}

#[cfg(feature = "pool-64k")]
mod sizes {
    pub const POOL_REGION: usize = 64 * 1024;
    pub const CHUNK_SIZE: usize = 512;
    /// One more socket than the pool admits connections: the seventh upgrade is answered 503.
    pub const SOCKETS: usize = 6;
    pub const SOCKET_RX: usize = 2048;
    pub const SOCKET_TX: usize = 2048;
    pub const QUEUE_HIGH: usize = 8192;
    pub const QUEUE_LOW: usize = 2048;
    pub const READ_LIMIT: usize = 1024;
}

pub use sizes::*;

/// Segment slots per chunk: one per queued message or chunk a message spans.
pub const SEGMENTS_PER_CHUNK: usize = 4;
/// Chunks the region holds with their metadata.
pub const CHUNKS: usize = POOL_REGION / Pool::footprint(CHUNK_SIZE, 1, SEGMENTS_PER_CHUNK);
/// Segment slots in the pool.
pub const SEGMENTS: usize = CHUNKS * SEGMENTS_PER_CHUNK;
/// Data pieces a connection echoes per turn at most.
pub const PIECES_PER_READ: usize = 16;
/// The largest opening handshake head accepted. The head is read in place from the socket's
/// receive ring, so it must fit there, and with room to spare: once the free window is smaller
/// than half the ring, the peer's silly-window avoidance holds its remaining bytes back, so a
/// ring only reliably fills to half before a too-long head is recognised (and answered 431).
pub const HEAD_LIMIT: usize = if SOCKET_RX / 2 < 2048 { SOCKET_RX / 2 } else { 2048 };
/// The most bytes a connection's send queue can hold: a read's echo on top of the high
/// watermark, one control frame, and the 101 response (queued before any read).
const QUEUE_WORST: usize = QUEUE_HIGH + READ_LIMIT + 131 + 256;
/// Chunks reserved per open connection: its worst case, plus one for a partly filled head chunk.
pub const RESERVE_CHUNKS: usize = QUEUE_WORST.div_ceil(CHUNK_SIZE) + 1;
/// Segment slots reserved per open connection.
pub const RESERVE_SEGMENTS: usize = RESERVE_CHUNKS * SEGMENTS_PER_CHUNK;
/// Open connections the pool's reserves cover.
pub const ADMITTED: usize = CHUNKS / RESERVE_CHUNKS;

const _: () = assert!(SOCKET_RX >= HEAD_LIMIT && CHUNKS >= RESERVE_CHUNKS);
