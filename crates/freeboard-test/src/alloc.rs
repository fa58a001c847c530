//! [`LiveBytes`]: a global allocator that keeps the count of bytes live on the heap, for the
//! tests that measure what a connection holds (install it with `#[global_allocator]`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// The system allocator, counting the bytes it has handed out and not taken back.
pub struct LiveBytes;

static LIVE: AtomicIsize = AtomicIsize::new(0);

impl LiveBytes {
    /// Bytes live on the heap now (of the process whose global allocator this is).
    pub fn live() -> isize {
        LIVE.load(Ordering::Relaxed)
    }
}

// SAFETY: forwards to the system allocator, only counting bytes.
unsafe impl GlobalAlloc for LiveBytes {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
