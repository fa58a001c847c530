//! Regions whose pages the pool can give back to the operating system.
//!
//! A [`Mapping`] reserves address space for a fixed number of elements and touches nothing: on
//! Unix it is an anonymous private mapping (`mmap` with `MAP_NORESERVE`), so a page becomes
//! resident only when it is first written. [`Mapping::leak`] turns it into a plain
//! `&'static mut [T]` (so the pool's `Storage` stays a two-variant enum and its hot paths index
//! a slice exactly as before) and an [`Unmap`] guard that unmaps on drop. [`Unmap::release`]
//! returns the whole pages inside a range of that slice with `madvise(MADV_DONTNEED)`; they read
//! back as zeros and cost nothing until they are written again.
//!
//! Miri cannot run `mmap` or `madvise`, and other systems have neither, so there the same type
//! is backed by one zeroed heap allocation and `release` writes zeros over the same pages: the
//! pool's logic (which pages, when, what reads back) runs unchanged under Miri; only the
//! system calls are left out.
//!
//! This is the one module of the crate with `unsafe` code; the pool's slot types implement
//! [`Zeroable`] beside their fields, where a change to the fields meets the promise.
#![allow(unsafe_code)]

use core::fmt;
use core::marker::PhantomData;
use core::ops::Range;
use core::ptr::NonNull;

/// Types for which all-zero bytes are a valid value, so a fresh or released page of them is
/// usable as it is.
///
/// # Safety
///
/// The all-zero bit pattern must be a valid value of the type, and the type must have no
/// destructor that matters (released elements are overwritten without being dropped).
pub(crate) unsafe trait Zeroable: Copy {}

// SAFETY: every bit pattern is a valid `u8`.
unsafe impl Zeroable for u8 {}

/// A fixed number of `T`s in address space reserved at construction, zero until written; a
/// slice and an [`Unmap`] guard once [`leak`](Self::leak)ed.
///
/// Invariant: `ptr` is valid for reads and writes of `len` elements for the mapping's life,
/// aligned to `page_size()` (and so to `T`), and owned by this value alone; `T` is
/// [`Zeroable`] (the only constructor, [`Mapping::zeroed`], asks for it).
pub(crate) struct Mapping<T> {
    ptr: NonNull<T>,
    len: usize,
    /// Bytes reserved: `len * size_of::<T>()` rounded up to a page (0 for an empty mapping).
    reserved: usize,
    _owns: PhantomData<T>,
}

// SAFETY: a `Mapping` owns its memory exclusively (as a `Box<[T]>` would); sending it to
// another thread moves that ownership.
unsafe impl<T: Send> Send for Mapping<T> {}
// SAFETY: shared access only hands out `&[T]`, as `&Box<[T]>` would.
unsafe impl<T: Sync> Sync for Mapping<T> {}

impl<T: Zeroable> Mapping<T> {
    /// Reserves room for `len` zeroed elements, or `None` if the system refuses (address space
    /// exhausted, an `RLIMIT_AS`, or a size that overflows).
    pub(crate) fn zeroed(len: usize) -> Option<Self> {
        let page = page_size();
        let bytes = len.checked_mul(size_of::<T>())?;
        if bytes == 0 {
            return Some(Self { ptr: NonNull::dangling(), len, reserved: 0, _owns: PhantomData });
        }
        let reserved = bytes.checked_next_multiple_of(page)?;
        if reserved > isize::MAX as usize {
            return None;
        }
        let ptr = backend::reserve(reserved, page)?;
        Some(Self { ptr: ptr.cast(), len, reserved, _owns: PhantomData })
    }
}

impl<T> Mapping<T> {
    /// The elements as a plain slice that lives as long as the returned [`Unmap`] is kept: the
    /// caller must drop the guard only once the slice is no longer used (the pool keeps both
    /// and never hands the slice out beyond its own life).
    pub(crate) fn leak(self) -> (&'static mut [T], Unmap) {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: by the type's invariant `ptr` is valid, aligned and initialised (zero is a
        // valid `T`, by `Zeroable`) for `len` elements and owned by this value alone; ownership
        // moves to the returned slice (the `ManuallyDrop` never unmaps), and the memory stays
        // mapped until the `Unmap` guard is dropped.
        let slice = unsafe { core::slice::from_raw_parts_mut(this.ptr.as_ptr(), this.len) };
        let unmap = Unmap {
            base: this.ptr.cast::<u8>().as_ptr().addr(),
            ptr: this.ptr.cast(),
            reserved: this.reserved,
        };
        (slice, unmap)
    }
}

impl<T> Drop for Mapping<T> {
    fn drop(&mut self) {
        if self.reserved > 0 {
            // SAFETY: `ptr` and `reserved` are what `backend::reserve` returned, not yet freed.
            unsafe { backend::free(self.ptr.cast(), self.reserved, page_size()) };
        }
    }
}

/// Owns a mapping whose elements were [`leak`](Mapping::leak)ed as a slice: gives pages of
/// that slice back, and unmaps it when dropped.
///
/// Invariant: `ptr` and `reserved` are what `backend::reserve` returned (or `reserved == 0`);
/// `base` is `ptr`'s address.
pub(crate) struct Unmap {
    base: usize,
    ptr: NonNull<u8>,
    reserved: usize,
}

// SAFETY: the guard only unmaps its own memory when dropped, which any thread may do.
unsafe impl Send for Unmap {}
// SAFETY: `&Unmap` allows nothing but address arithmetic.
unsafe impl Sync for Unmap {}

impl Unmap {
    /// Gives back the whole pages that lie inside `region[elements]` (indices, clamped to the
    /// slice): they read as zeros afterwards and are no longer resident. Pages only partly
    /// inside the range are kept. Returns the bytes given back, 0 if `region` is not inside this
    /// guard's mapping (checked, so this cannot touch anyone else's memory).
    pub(crate) fn release<T: Zeroable>(&self, region: &mut [T], elements: Range<usize>) -> usize {
        let page = page_size();
        let end = elements.end.min(region.len());
        if elements.start >= end {
            return 0;
        }
        let size = size_of::<T>();
        let bytes = size_of_val(region);
        let base = region.as_mut_ptr().cast::<u8>();
        let addr = base.addr();
        if addr < self.base || addr + bytes > self.base + self.reserved {
            debug_assert!(false, "release of a region outside the mapping");
            return 0;
        }
        let start_addr = (addr + elements.start * size).next_multiple_of(page);
        let end_addr = (addr + end * size) / page * page;
        if start_addr >= end_addr {
            return 0;
        }
        let (first, last) = (start_addr - addr, end_addr - addr);
        // SAFETY: `first < last <= region.len() * size_of::<T>()`, so the range lies inside
        // `region`, which lies inside our mapping (checked above); the pointer is derived from
        // the `&mut` borrow of `region`, so no other reference to those elements is alive, and
        // zeros are valid `T`s (`Zeroable`), so what reads back is valid.
        unsafe { backend::release(NonNull::new_unchecked(base.add(first)), last - first) };
        last - first
    }
}

impl Drop for Unmap {
    fn drop(&mut self) {
        if self.reserved > 0 {
            // SAFETY: by the invariant these are what `backend::reserve` returned, not yet
            // freed; the slice leaked from the mapping is no longer used (`Mapping::leak`).
            unsafe { backend::free(self.ptr, self.reserved, page_size()) };
        }
    }
}

impl fmt::Debug for Unmap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Unmap({} bytes)", self.reserved)
    }
}

impl<T> fmt::Debug for Mapping<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mapping({} elements, {} bytes reserved)", self.len, self.reserved)
    }
}

/// A byte buffer in address space of its own: zero and not resident until written, and its
/// pages given back whole by [`give_back`](Self::give_back) — for a buffer a driver needs only
/// while it is busy (the server loop's read buffer: an idle loop holds none of it resident).
/// Where the system refuses the mapping it is a plain heap allocation and `give_back` does
/// nothing.
///
/// ```
/// let mut buffer = freeboard_buf::PageBuffer::new(64 << 10);
/// buffer[..5].copy_from_slice(b"hello");
/// buffer.give_back();
/// assert!(buffer.iter().all(|&b| b == 0), "reads as zeros again");
/// assert_eq!(buffer.len(), 64 << 10);
/// ```
pub struct PageBuffer {
    bytes: &'static mut [u8],
    /// Owns the mapping behind `bytes` (`None`: `bytes` is a leaked heap allocation, taken
    /// back in `drop`). Dropped after `bytes` (declaration order).
    unmap: Option<Unmap>,
}

impl PageBuffer {
    /// A zeroed buffer of `len` bytes.
    pub fn new(len: usize) -> Self {
        match Mapping::zeroed(len) {
            Some(mapping) => {
                let (bytes, unmap) = mapping.leak();
                Self { bytes, unmap: Some(unmap) }
            }
            None => Self {
                bytes: std::boxed::Box::leak(std::vec![0u8; len].into_boxed_slice()),
                unmap: None,
            },
        }
    }

    /// Gives the buffer's pages back to the operating system; it reads as zeros afterwards.
    pub fn give_back(&mut self) {
        if let Some(unmap) = &self.unmap {
            unmap.release(self.bytes, 0..self.bytes.len());
        }
    }
}

impl Default for PageBuffer {
    /// An empty buffer (no mapping, no allocation), e.g. for `mem::take`.
    fn default() -> Self {
        Self::new(0)
    }
}

impl core::ops::Deref for PageBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl core::ops::DerefMut for PageBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.bytes
    }
}

impl Drop for PageBuffer {
    fn drop(&mut self) {
        if self.unmap.is_none() {
            let bytes = core::mem::take(&mut self.bytes);
            // SAFETY: with no mapping, `bytes` came from `Box::leak` in `new` and is not used
            // after this (the field now holds an empty slice).
            drop(unsafe { std::boxed::Box::from_raw(bytes as *mut [u8]) });
        }
    }
}

impl fmt::Debug for PageBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageBuffer({} bytes)", self.bytes.len())
    }
}

/// The operating system's page size (4096 under Miri and where it cannot be asked).
pub(crate) fn page_size() -> usize {
    backend::page_size()
}

/// The resident set size of this process in bytes (`/proc/self/statm`), for a gauge beside the
/// pool's own figures; `None` where it cannot be read (not Linux, or no `/proc`). Reads one small
/// file into a stack buffer: no allocation.
///
/// ```
/// if cfg!(target_os = "linux") {
///     assert!(freeboard_buf::resident_set_bytes().unwrap() > 0);
/// }
/// ```
pub fn resident_set_bytes() -> Option<u64> {
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        use std::io::Read;
        let mut buf = [0u8; 128];
        let mut file = std::fs::File::open("/proc/self/statm").ok()?;
        let n = file.read(&mut buf).ok()?;
        // "size resident shared text lib data dt", in pages.
        let text = core::str::from_utf8(&buf[..n]).ok()?;
        let pages: u64 = text.split_ascii_whitespace().nth(1)?.parse().ok()?;
        Some(pages * page_size() as u64)
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    {
        None
    }
}

#[cfg(all(unix, not(miri)))]
mod backend {
    use core::ptr::NonNull;

    pub(super) fn page_size() -> usize {
        // SAFETY: `sysconf` only reads a configuration value.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 { page as usize } else { 4096 }
    }

    /// An anonymous private mapping of `bytes` (a multiple of the page size, above 0).
    pub(super) fn reserve(bytes: usize, _page: usize) -> Option<NonNull<u8>> {
        // SAFETY: an anonymous mapping at an address the kernel chooses touches no existing
        // memory; the result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        // Transparent huge pages would make the first write to a chunk resident 2 MiB at a time
        // and keep a released 4 KiB page inside a huge one: ask for small pages. Advice only, so
        // a refusal changes nothing that matters.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        // SAFETY: the range is the mapping just made.
        unsafe {
            libc::madvise(ptr, bytes, libc::MADV_NOHUGEPAGE);
        }
        NonNull::new(ptr.cast())
    }

    /// Gives back `bytes` (page-aligned) at `ptr`: zeros on the next read, not resident.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + bytes` lies inside one mapping from `reserve` and nothing references it.
    pub(super) unsafe fn release(ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: by the caller's contract the range is inside our own private anonymous mapping;
        // MADV_DONTNEED on such a range makes it read as zeros, nothing else.
        let rc = unsafe { libc::madvise(ptr.as_ptr().cast(), bytes, libc::MADV_DONTNEED) };
        if rc != 0 {
            // Cannot fail for a valid private anonymous range; should it, zero the bytes so what
            // reads back is the same.
            // SAFETY: as above, the range is ours and unreferenced.
            unsafe { ptr.as_ptr().write_bytes(0, bytes) };
        }
    }

    /// Unmaps what `reserve` returned.
    ///
    /// # Safety
    ///
    /// `ptr` and `bytes` are exactly what `reserve` returned and gave; nothing references it.
    pub(super) unsafe fn free(ptr: NonNull<u8>, bytes: usize, _page: usize) {
        // SAFETY: by the caller's contract this is one whole mapping we own.
        unsafe { libc::munmap(ptr.as_ptr().cast(), bytes) };
    }
}

/// Miri and systems without `mmap`: one zeroed, page-aligned heap allocation; a release writes
/// zeros, which is what `MADV_DONTNEED` makes a page read as.
#[cfg(any(miri, not(unix)))]
mod backend {
    use core::ptr::NonNull;
    use std::alloc::{Layout, alloc_zeroed, dealloc};

    pub(super) fn page_size() -> usize {
        4096
    }

    pub(super) fn reserve(bytes: usize, page: usize) -> Option<NonNull<u8>> {
        let layout = Layout::from_size_align(bytes, page).ok()?;
        // SAFETY: `bytes > 0`, so the layout has a non-zero size.
        NonNull::new(unsafe { alloc_zeroed(layout) })
    }

    /// # Safety
    ///
    /// `ptr..ptr + bytes` lies inside one allocation from `reserve` and nothing references it.
    pub(super) unsafe fn release(ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: by the caller's contract the range is inside our allocation and unreferenced.
        unsafe { ptr.as_ptr().write_bytes(0, bytes) };
    }

    /// # Safety
    ///
    /// `ptr` and `bytes` are exactly what `reserve` returned and was given.
    pub(super) unsafe fn free(ptr: NonNull<u8>, bytes: usize, page: usize) {
        // SAFETY: the layout is the one `reserve` allocated with (it succeeded, so it is valid).
        unsafe { dealloc(ptr.as_ptr(), Layout::from_size_align_unchecked(bytes, page)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{ChunkSlot, SegmentSlot};

    #[test]
    fn zeroed_then_released_pages_read_zero() {
        let page = page_size();
        let (s, unmap) = Mapping::<u8>::zeroed(3 * page + 100).unwrap().leak();
        assert!(s.iter().all(|&b| b == 0));
        s.fill(7);
        // Only the whole pages inside the range go: [page, 3 * page).
        assert_eq!(unmap.release(s, page - 1..3 * page + 50), 2 * page);
        assert!(s[..page].iter().all(|&b| b == 7));
        assert!(s[page..3 * page].iter().all(|&b| b == 0));
        assert!(s[3 * page..].iter().all(|&b| b == 7));
        assert_eq!(unmap.release(s, 10..20), 0, "no whole page inside");
        assert_eq!(unmap.release(s, 5..5), 0, "empty range");
        // A sub-slice not starting on a page: pages are whole pages of the mapping.
        s.fill(7);
        assert_eq!(unmap.release(&mut s[100..], 0..2 * page), page);
        assert!(s[..page].iter().all(|&b| b == 7));
        assert!(s[page..2 * page].iter().all(|&b| b == 0));
        assert!(s[2 * page..].iter().all(|&b| b == 7));
        drop(unmap);
    }

    #[test]
    fn slots_map_and_release() {
        let (s, unmap) = Mapping::<SegmentSlot>::zeroed(1000).unwrap().leak();
        assert_eq!(s.len(), 1000);
        let per_page = page_size() / size_of::<SegmentSlot>();
        assert_eq!(unmap.release(s, 0..1000), 1000 / per_page * page_size());
        let (empty, _unmap) = Mapping::<ChunkSlot>::zeroed(0).unwrap().leak();
        assert!(empty.is_empty());
        // Not our memory: refused.
        let mut other = [SegmentSlot::EMPTY; 600];
        if !cfg!(debug_assertions) {
            assert_eq!(unmap.release(&mut other, 0..600), 0);
        }
    }
}
