//! The chunk pool over memory the caller lends: `fb_pool_*`.
//!
//! A pool hands out fixed-size chunks by index (`uint32_t`). Each index `fb_pool_alloc` or
//! `fb_pool_share` returns is one counted reference, given back with `fb_pool_release`.

use core::mem::{MaybeUninit, align_of, size_of};

use freeboard_buf::{Budget, ChunkId, ChunkSlot, Pool, SegmentSlot};

use crate::{
    FB_ERR_NULL, FB_ERR_POOL_BAD_CHUNK, FB_OK, assert_handle, bytes, pool_code, pool_config_code,
    put, slot_clear, slot_init, slot_mut, status,
};

/// Bytes of an [`FbPool`] handle.
pub const FB_POOL_SIZE: usize = 440;
/// The largest chunk size.
pub const FB_POOL_MAX_CHUNK_SIZE: usize = 1 << 30;
const _: () = assert!(FB_POOL_MAX_CHUNK_SIZE == freeboard_buf::MAX_CHUNK_SIZE);

/// Storage for one pool (its bookkeeping; the chunks live in the regions lent to
/// `fb_pool_init`). Opaque.
#[repr(C)]
pub struct FbPool {
    // `MaybeUninit`: the value inside has padding bytes, so the words are not all initialised
    // integers and a Rust move of the handle must not claim they are (C copies bytes).
    _opaque: [MaybeUninit<u64>; 55],
}
// 128 bytes of slack: with freeboard-buf's `std` feature (unified in when a host build links
// freeboard too) the pool's regions are mappings it can give pages back through, each with its
// own handle; without it they are borrowed slices.
assert_handle!(FbPool, FB_POOL_SIZE, Pool<'static>, slack 128);

/// Metadata of one chunk (8 bytes); lend an array of these to `fb_pool_init`.
#[repr(C)]
pub struct FbChunkSlot {
    _opaque: [u32; 2],
}
const _: () = assert!(size_of::<FbChunkSlot>() == size_of::<ChunkSlot>());
const _: () = assert!(align_of::<FbChunkSlot>() >= align_of::<ChunkSlot>());

/// Metadata of one segment (16 bytes); lend an array of these to `fb_pool_init`.
#[repr(C)]
pub struct FbSegmentSlot {
    _opaque: [u32; 4],
}
const _: () = assert!(size_of::<FbSegmentSlot>() == size_of::<SegmentSlot>());
const _: () = assert!(align_of::<FbSegmentSlot>() >= align_of::<SegmentSlot>());

const TAG: u32 = 0x4642_504c; // "FBPL"

/// A snapshot of a pool's counters.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FbPoolStats {
    /// Bytes per chunk.
    pub chunk_size: usize,
    /// Chunks in the pool.
    pub chunks_total: usize,
    /// Chunks referenced now.
    pub chunks_in_use: usize,
    /// The most chunks ever in use at once.
    pub chunks_high_water: usize,
    /// Allocations refused because the pool was exhausted.
    pub allocation_failures: u64,
}

/// Bytes a pool of `chunks` chunks of `chunk_size` bytes with `segments` segment slots uses:
/// the data plus 8 bytes per chunk and 16 per segment slot. Pass at least this as `budget`.
#[unsafe(no_mangle)]
pub extern "C" fn fb_pool_footprint(chunk_size: usize, chunks: usize, segments: usize) -> usize {
    Pool::footprint(chunk_size, chunks, segments)
}

/// Builds a pool in `pool` over regions the caller lends for as long as the pool is used:
/// `data` holds `chunk_count` chunks of `chunk_size` bytes (`data_len` must be their product),
/// `chunks` has `chunk_count` slots, `segments` has `segment_count` slots (chains of chunks
/// are not exposed here: 1 is enough). The footprint is drawn from a budget of `budget` bytes.
///
/// # Safety
/// `pool` is null or a writable `FbPool`. The three regions are valid for reads and writes of
/// their lengths until the pool is no longer used, and the caller does not touch them
/// meanwhile except through the pointers `fb_pool_bytes` and `fb_pool_spare` give.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_pool_init(
    pool: *mut FbPool,
    budget: usize,
    chunk_size: usize,
    data: *mut u8,
    data_len: usize,
    chunks: *mut FbChunkSlot,
    chunk_count: usize,
    segments: *mut FbSegmentSlot,
    segment_count: usize,
) -> i32 {
    let run = || {
        if pool.is_null() || data.is_null() || chunks.is_null() || segments.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: valid for the pool's life (this function's contract): the 'static lifetime
        // stands for "until the caller stops using the pool", which it promises to honour.
        let data: &'static mut [u8] = unsafe { crate::bytes_mut(data, data_len) }?;
        // SAFETY: as above; every slot is written before the slice is formed, since the
        // caller's memory may be uninitialised.
        let chunks = unsafe { slots(chunks.cast::<ChunkSlot>(), chunk_count, ChunkSlot::EMPTY) }?;
        // SAFETY: as above.
        let segments =
            unsafe { slots(segments.cast::<SegmentSlot>(), segment_count, SegmentSlot::EMPTY) }?;
        let built = Pool::from_slices(Budget::new(budget), chunk_size, data, chunks, segments)
            .map_err(pool_config_code)?;
        // SAFETY: null-checked; a writable FbPool, large and aligned enough (assert_handle!).
        unsafe { slot_init(pool.cast(), TAG, built) }.map(|()| FB_OK)
    };
    status(run())
}

/// Marks `pool` as no longer initialised; the regions are the caller's again. Chunks still
/// referenced are simply forgotten.
///
/// # Safety
/// `pool` is null or points to an `FbPool`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_pool_deinit(pool: *mut FbPool) -> i32 {
    // SAFETY: as this function's contract.
    status(unsafe { slot_clear::<Pool<'static>>(pool.cast()) }.map(|()| FB_OK))
}

/// Takes a free chunk (empty, one reference) and stores its index in `chunk`; O(1).
/// `FB_ERR_POOL_CHUNKS_EXHAUSTED` when every chunk is in use.
///
/// # Safety
/// `pool` is null or a zeroed or initialised `FbPool`; `chunk` valid for writing a `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_pool_alloc(pool: *mut FbPool, chunk: *mut u32) -> i32 {
    let run = || {
        if chunk.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: as this function's contract.
        let pool = unsafe { pool_mut(pool) }?;
        let id = pool.alloc().map_err(pool_code)?;
        // SAFETY: non-null (checked), valid for writes (this function's contract).
        unsafe { put(chunk, id.into_raw()) }.map(|()| FB_OK)
    };
    status(run())
}

/// Takes one more reference to `chunk` (e.g. one per connection that will send it).
///
/// # Safety
/// As `fb_pool_alloc` (without the output).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_pool_share(pool: *mut FbPool, chunk: u32) -> i32 {
    let run = || {
        // SAFETY: as this function's contract.
        let pool = unsafe { pool_mut(pool) }?;
        let id = checked(pool, chunk)?;
        let shared = pool.share(&id).map_err(pool_code);
        let _ = id.into_raw(); // the caller's reference stays with the caller
        shared.map(|extra| {
            let _ = extra.into_raw(); // and so does the new one
            FB_OK
        })
    };
    status(run())
}

/// Gives back one reference to `chunk`; with its last reference it returns to the pool.
///
/// # Safety
/// As `fb_pool_share`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_pool_release(pool: *mut FbPool, chunk: u32) -> i32 {
    let run = || {
        // SAFETY: as this function's contract.
        let pool = unsafe { pool_mut(pool) }?;
        let id = checked(pool, chunk)?;
        pool.release(id);
        Ok(FB_OK)
    };
    status(run())
}

/// The bytes written to `chunk` so far (`data`, `len`); they stay put until its last release.
///
/// # Safety
/// As `fb_pool_share`; `data` and `len` valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_pool_bytes(
    pool: *mut FbPool,
    chunk: u32,
    data: *mut *const u8,
    len: *mut usize,
) -> i32 {
    let run = || {
        if data.is_null() || len.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: as this function's contract.
        let pool = unsafe { pool_mut(pool) }?;
        let id = checked(pool, chunk)?;
        let written = pool.bytes(&id);
        let (ptr, n) = (written.as_ptr(), written.len());
        let _ = id.into_raw();
        // SAFETY: non-null (checked), valid for writes (this function's contract).
        unsafe { put(data, ptr).and_then(|()| put(len, n)) }.map(|()| FB_OK)
    };
    status(run())
}

/// The unwritten rest of `chunk` (`data`, `len`), e.g. to receive into; follow with
/// `fb_pool_commit` before anything else writes to the pool.
///
/// # Safety
/// As `fb_pool_bytes`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_pool_spare(
    pool: *mut FbPool,
    chunk: u32,
    data: *mut *mut u8,
    len: *mut usize,
) -> i32 {
    let run = || {
        if data.is_null() || len.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: as this function's contract.
        let pool = unsafe { pool_mut(pool) }?;
        let id = checked(pool, chunk)?;
        let spare = pool.spare_mut(&id);
        let (ptr, n) = (spare.as_mut_ptr(), spare.len());
        let _ = id.into_raw();
        // SAFETY: non-null (checked), valid for writes (this function's contract).
        unsafe { put(data, ptr).and_then(|()| put(len, n)) }.map(|()| FB_OK)
    };
    status(run())
}

/// Marks `n` bytes of `fb_pool_spare`'s room as written; returns the count committed (at most
/// the room left).
///
/// # Safety
/// As `fb_pool_share`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_pool_commit(pool: *mut FbPool, chunk: u32, n: usize) -> i32 {
    let run = || {
        // SAFETY: as this function's contract.
        let pool = unsafe { pool_mut(pool) }?;
        let id = checked(pool, chunk)?;
        let committed = pool.commit(&id, n);
        let _ = id.into_raw();
        // NOTE(truncation): a chunk is at most FB_POOL_MAX_CHUNK_SIZE (< 2^31) bytes.
        Ok(committed as i32)
    };
    status(run())
}

/// Copies as much of `bytes[0..len]` as fits after the written part of `chunk`; returns the
/// count copied.
///
/// # Safety
/// As `fb_pool_share`; `bytes` valid for reads of `len` bytes (or null with 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_pool_append(
    pool: *mut FbPool,
    chunk: u32,
    data: *const u8,
    len: usize,
) -> i32 {
    let run = || {
        // SAFETY: as this function's contract.
        let pool = unsafe { pool_mut(pool) }?;
        // SAFETY: as this function's contract.
        let data = unsafe { bytes(data, len) }?;
        let id = checked(pool, chunk)?;
        let appended = pool.append(&id, data);
        let _ = id.into_raw();
        // NOTE(truncation): at most one chunk, < 2^31 bytes.
        Ok(appended as i32)
    };
    status(run())
}

/// Stores a snapshot of the pool's counters in `stats`.
///
/// # Safety
/// As `fb_pool_alloc`; `stats` valid for writing an `FbPoolStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_pool_stats(pool: *mut FbPool, stats: *mut FbPoolStats) -> i32 {
    let run = || {
        // SAFETY: as this function's contract.
        let pool = unsafe { pool_mut(pool) }?;
        let c = pool.counters();
        let value = FbPoolStats {
            chunk_size: c.chunk_size,
            chunks_total: c.chunks_total,
            chunks_in_use: c.chunks_in_use,
            chunks_high_water: c.chunks_high_water,
            allocation_failures: c.allocation_failures,
        };
        // SAFETY: as this function's contract.
        unsafe { put(stats, value) }.map(|()| FB_OK)
    };
    status(run())
}

/// The pool in handle `pool`.
///
/// # Safety
/// `pool` is null or points to a zeroed or initialised `FbPool` with no other live reference.
unsafe fn pool_mut<'a>(pool: *mut FbPool) -> Result<&'a mut Pool<'static>, i32> {
    // SAFETY: as this function's contract; the handle is large and aligned enough.
    unsafe { slot_mut::<Pool<'static>>(pool.cast(), TAG) }
}

/// The handle for a chunk index the caller holds a reference to: in range and in use, so the
/// pool neither panics nor corrupts its free list. Give it back with `into_raw` unless the
/// reference is consumed.
fn checked(pool: &Pool<'_>, chunk: u32) -> Result<ChunkId, i32> {
    if chunk as usize >= pool.chunks_total() {
        return Err(FB_ERR_POOL_BAD_CHUNK);
    }
    let id = ChunkId::from_raw(chunk);
    if pool.refs(&id) == 0 {
        let _ = id.into_raw();
        return Err(FB_ERR_POOL_BAD_CHUNK);
    }
    Ok(id)
}

/// `count` slots at `ptr`, each set to `empty`, as a slice for the pool's life.
///
/// # Safety
/// `ptr` valid for reads and writes of `count` `T`s, aligned, unaliased for `'static` as far
/// as the caller's use of the pool goes.
unsafe fn slots<T: Copy>(ptr: *mut T, count: usize, empty: T) -> Result<&'static mut [T], i32> {
    if count.checked_mul(size_of::<T>()).is_none_or(|n| n > isize::MAX as usize) {
        return Err(crate::FB_ERR_INVALID_ARGUMENT);
    }
    if !ptr.is_aligned() {
        return Err(crate::FB_ERR_INVALID_ARGUMENT);
    }
    for i in 0..count {
        // SAFETY: in bounds of the caller's region (this function's contract); `write` does
        // not read the possibly uninitialised old value.
        unsafe { ptr.add(i).write(empty) };
    }
    // SAFETY: every element initialised just above; size within isize::MAX; aligned; valid and
    // unaliased (this function's contract).
    Ok(unsafe { core::slice::from_raw_parts_mut(ptr, count) })
}
