//! A fixed-capacity ring buffer for staging (after smoltcp's `storage::RingBuffer`).

use core::fmt;

use crate::storage::Storage;

/// A FIFO ring of `T` over fixed storage: a caller's slice (no allocator) or one allocation at
/// construction ([`with_capacity`](RingBuffer::with_capacity), feature `alloc`). It never
/// grows; a full ring refuses with [`Full`], an empty one with [`Empty`].
///
/// Three ways in and out, each in its own `impl` block:
/// - **discrete**: one element at a time (`enqueue_one`, `dequeue_one`);
/// - **contiguous**: the longest run that is contiguous in storage, handed to a closure or
///   returned as a slice (`enqueue_many_with`, `dequeue_many_with`), e.g. to `read` a socket
///   straight into the ring;
/// - **random access**: at an offset, without moving the ends (`write_unallocated` then
///   `enqueue_unallocated`; `read_allocated` then `dequeue_allocated`), e.g. to peek at a frame
///   header before deciding to consume it.
///
/// ```
/// use freeboard_buf::RingBuffer;
///
/// let mut storage = [0u8; 8];
/// let mut ring = RingBuffer::new(&mut storage[..]);
/// assert_eq!(ring.enqueue_slice(b"hello"), 5);
/// let mut out = [0u8; 3];
/// assert_eq!(ring.dequeue_slice(&mut out), 3);
/// assert_eq!(&out, b"hel");
/// assert_eq!(ring.enqueue_slice(b"world!"), 6); // wraps around
/// let mut out = [0u8; 8];
/// assert_eq!(ring.dequeue_slice(&mut out), 8);
/// assert_eq!(&out, b"loworld!");
/// ```
pub struct RingBuffer<'a, T> {
    storage: Storage<'a, T>,
    /// Invariant: `read_at < capacity`, or 0 when the capacity is 0.
    read_at: usize,
    /// Invariant: `length <= capacity`.
    length: usize,
}

/// State and construction.
impl<'a, T> RingBuffer<'a, T> {
    /// A ring over `storage`; its capacity is `storage.len()`.
    pub fn new(storage: &'a mut [T]) -> Self {
        Self { storage: Storage::Borrowed(storage), read_at: 0, length: 0 }
    }

    /// Elements the ring can hold.
    pub fn capacity(&self) -> usize {
        self.storage.len()
    }

    /// Elements queued.
    pub fn len(&self) -> usize {
        self.length
    }

    /// Whether no element is queued.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Whether no element can be queued.
    pub fn is_full(&self) -> bool {
        self.length == self.capacity()
    }

    /// Free elements.
    pub fn window(&self) -> usize {
        self.capacity() - self.length
    }

    /// Free elements that are contiguous in storage after the write position.
    pub fn contiguous_window(&self) -> usize {
        if self.length == 0 {
            // enqueue_many_with rewinds an empty ring to the start first.
            return self.capacity();
        }
        let write_at = self.index(self.length);
        if write_at > self.read_at {
            self.capacity() - write_at
        } else {
            self.read_at - write_at // 0 when full
        }
    }

    /// Empties the ring (elements are left in storage, not dropped).
    pub fn clear(&mut self) {
        self.read_at = 0;
        self.length = 0;
    }

    /// Storage index of the element `offset` places after the read position.
    fn index(&self, offset: usize) -> usize {
        let capacity = self.capacity();
        if capacity == 0 { 0 } else { (self.read_at + offset) % capacity }
    }
}

#[cfg(feature = "alloc")]
impl<T: Default> RingBuffer<'static, T> {
    /// A ring over one allocation of `capacity` default elements, made now and never again.
    /// Draw `capacity * size_of::<T>()` from the [`Budget`](crate::Budget) first.
    pub fn with_capacity(capacity: usize) -> Self {
        let storage: alloc::boxed::Box<[T]> = (0..capacity).map(|_| T::default()).collect();
        Self { storage: Storage::Owned(storage), read_at: 0, length: 0 }
    }
}

/// Discrete access: one element at a time.
impl<T> RingBuffer<'_, T> {
    /// Lets `f` fill the next free element and queues it.
    pub fn enqueue_one_with<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> Result<R, Full> {
        Ok(f(self.enqueue_one()?))
    }

    /// Queues the next free element and returns it for writing.
    pub fn enqueue_one(&mut self) -> Result<&mut T, Full> {
        if self.is_full() {
            return Err(Full);
        }
        let at = self.index(self.length);
        self.length += 1;
        Ok(&mut self.storage[at])
    }

    /// Dequeues the oldest element and hands it to `f`.
    pub fn dequeue_one_with<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> Result<R, Empty> {
        Ok(f(self.dequeue_one()?))
    }

    /// Dequeues the oldest element and returns it (valid until the ring is written again).
    pub fn dequeue_one(&mut self) -> Result<&mut T, Empty> {
        if self.is_empty() {
            return Err(Empty);
        }
        let at = self.read_at;
        self.read_at = self.index(1);
        self.length -= 1;
        Ok(&mut self.storage[at])
    }
}

/// Contiguous access: the longest run that does not wrap.
impl<T> RingBuffer<'_, T> {
    /// Hands `f` the free elements that are contiguous after the write position; `f` returns how
    /// many it filled (clamped to the slice) and a result. An empty ring first rewinds to the
    /// start of storage so the whole capacity is contiguous.
    pub fn enqueue_many_with<'b, R>(
        &'b mut self,
        f: impl FnOnce(&'b mut [T]) -> (usize, R),
    ) -> (usize, R) {
        if self.length == 0 {
            self.read_at = 0;
        }
        let capacity = self.capacity();
        let write_at = self.index(self.length);
        let max = (capacity - write_at).min(capacity - self.length);
        let (n, result) = f(&mut self.storage[write_at..write_at + max]);
        debug_assert!(n <= max, "enqueued {n} of {max} elements offered");
        self.length += n.min(max);
        (n.min(max), result)
    }

    /// Queues up to `size` contiguous free elements and returns them for writing (possibly
    /// fewer, or none when full).
    pub fn enqueue_many(&mut self, size: usize) -> &mut [T] {
        self.enqueue_many_with(|buf| {
            let n = size.min(buf.len());
            (n, &mut buf[..n])
        })
        .1
    }

    /// Hands `f` the queued elements that are contiguous from the read position; `f` returns how
    /// many it consumed (clamped to the slice) and a result.
    pub fn dequeue_many_with<'b, R>(
        &'b mut self,
        f: impl FnOnce(&'b mut [T]) -> (usize, R),
    ) -> (usize, R) {
        let capacity = self.capacity();
        let max = (capacity - self.read_at).min(self.length);
        let (n, result) = f(&mut self.storage[self.read_at..self.read_at + max]);
        debug_assert!(n <= max, "dequeued {n} of {max} elements offered");
        let n = n.min(max);
        self.read_at = if capacity == 0 { 0 } else { (self.read_at + n) % capacity };
        self.length -= n;
        (n, result)
    }

    /// Dequeues up to `size` contiguous elements and returns them (possibly fewer).
    pub fn dequeue_many(&mut self, size: usize) -> &mut [T] {
        self.dequeue_many_with(|buf| {
            let n = size.min(buf.len());
            (n, &mut buf[..n])
        })
        .1
    }
}

impl<T: Copy> RingBuffer<'_, T> {
    /// Queues as much of `data` as fits (in up to two contiguous copies); returns the count.
    pub fn enqueue_slice(&mut self, data: &[T]) -> usize {
        let mut done = 0;
        for _ in 0..2 {
            let (n, ()) = self.enqueue_many_with(|buf| {
                let n = buf.len().min(data.len() - done);
                buf[..n].copy_from_slice(&data[done..done + n]);
                (n, ())
            });
            done += n;
        }
        done
    }

    /// Dequeues into `data` as much as it holds (in up to two contiguous copies); returns the
    /// count.
    pub fn dequeue_slice(&mut self, data: &mut [T]) -> usize {
        let mut done = 0;
        for _ in 0..2 {
            let (n, ()) = self.dequeue_many_with(|buf| {
                let n = buf.len().min(data.len() - done);
                data[done..done + n].copy_from_slice(&buf[..n]);
                (n, ())
            });
            done += n;
        }
        done
    }
}

/// Random access: read and write at an offset without moving the ends.
impl<T> RingBuffer<'_, T> {
    /// Up to `size` free elements, contiguous in storage, starting `offset` elements after the
    /// write position; empty if `offset` is past the window. They are not queued until
    /// [`enqueue_unallocated`](Self::enqueue_unallocated).
    pub fn get_unallocated(&mut self, offset: usize, size: usize) -> &mut [T] {
        if offset >= self.window() {
            return &mut [];
        }
        let start = self.index(self.length + offset);
        let size = size.min(self.window() - offset).min(self.capacity() - start);
        &mut self.storage[start..start + size]
    }

    /// Queues `count` elements written with [`get_unallocated`](Self::get_unallocated) or
    /// [`write_unallocated`](Self::write_unallocated); clamped to the window. Returns the count.
    pub fn enqueue_unallocated(&mut self, count: usize) -> usize {
        debug_assert!(count <= self.window(), "enqueue_unallocated({count}) past the window");
        let count = count.min(self.window());
        self.length += count;
        count
    }

    /// Up to `size` queued elements, contiguous in storage, starting `offset` elements after the
    /// read position; empty if `offset` is past the queued elements.
    pub fn get_allocated(&self, offset: usize, size: usize) -> &[T] {
        if offset >= self.length {
            return &[];
        }
        let start = self.index(offset);
        let size = size.min(self.length - offset).min(self.capacity() - start);
        &self.storage[start..start + size]
    }

    /// Dequeues `count` elements without reading them; clamped to the length. Returns the count.
    pub fn dequeue_allocated(&mut self, count: usize) -> usize {
        debug_assert!(count <= self.length, "dequeue_allocated({count}) past the length");
        let count = count.min(self.length);
        self.read_at = self.index(count);
        self.length -= count;
        count
    }
}

impl<T: Copy> RingBuffer<'_, T> {
    /// Copies `data` into free elements starting `offset` after the write position, without
    /// queueing them; returns the count copied.
    pub fn write_unallocated(&mut self, offset: usize, data: &[T]) -> usize {
        let mut done = 0;
        for _ in 0..2 {
            let buf = self.get_unallocated(offset + done, data.len() - done);
            let n = buf.len();
            buf.copy_from_slice(&data[done..done + n]);
            done += n;
        }
        done
    }

    /// Copies queued elements starting `offset` after the read position into `data`, without
    /// dequeueing them; returns the count copied.
    pub fn read_allocated(&self, offset: usize, data: &mut [T]) -> usize {
        let mut done = 0;
        for _ in 0..2 {
            let buf = self.get_allocated(offset + done, data.len() - done);
            data[done..done + buf.len()].copy_from_slice(buf);
            done += buf.len();
        }
        done
    }
}

impl<T> fmt::Debug for RingBuffer<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingBuffer")
            .field("capacity", &self.capacity())
            .field("read_at", &self.read_at)
            .field("length", &self.length)
            .finish()
    }
}

/// The ring has no free element.
///
/// ```
/// use freeboard_buf::{Full, RingBuffer};
///
/// let mut storage = [0u8; 1];
/// let mut ring = RingBuffer::new(&mut storage[..]);
/// *ring.enqueue_one().unwrap() = 7;
/// assert_eq!(ring.enqueue_one().unwrap_err(), Full);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// The ring has no queued element.
///
/// ```
/// use freeboard_buf::{Empty, RingBuffer};
///
/// let mut storage = [0u8; 1];
/// let mut ring = RingBuffer::new(&mut storage[..]);
/// assert_eq!(ring.dequeue_one().unwrap_err(), Empty);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Empty;

impl fmt::Display for Full {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ring buffer full")
    }
}

impl fmt::Display for Empty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ring buffer empty")
    }
}

impl core::error::Error for Full {}
impl core::error::Error for Empty {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_capacity_is_full_and_empty() {
        let mut storage: [u8; 0] = [];
        let mut ring = RingBuffer::new(&mut storage[..]);
        assert!(ring.is_empty() && ring.is_full());
        assert_eq!(ring.enqueue_one(), Err(Full));
        assert_eq!(ring.dequeue_one(), Err(Empty));
        assert_eq!(ring.enqueue_slice(b"x"), 0);
        assert_eq!(ring.dequeue_slice(&mut [0; 1]), 0);
        assert_eq!(ring.write_unallocated(0, b"x"), 0);
        assert_eq!(ring.read_allocated(0, &mut [0; 1]), 0);
    }

    #[test]
    fn discrete_wraps() {
        let mut storage = [0u32; 3];
        let mut ring = RingBuffer::new(&mut storage[..]);
        for round in 0..10u32 {
            ring.enqueue_one_with(|x| *x = round).unwrap();
            ring.enqueue_one_with(|x| *x = round + 100).unwrap();
            assert_eq!(ring.dequeue_one_with(|x| *x), Ok(round));
            assert_eq!(ring.dequeue_one_with(|x| *x), Ok(round + 100));
        }
    }

    #[test]
    fn contiguous_window_after_wrap() {
        let mut storage = [0u8; 8];
        let mut ring = RingBuffer::new(&mut storage[..]);
        assert_eq!(ring.enqueue_many(6).len(), 6);
        assert_eq!(ring.dequeue_many(4).len(), 4);
        assert_eq!(ring.contiguous_window(), 2); // 6..8
        assert_eq!(ring.enqueue_many(8).len(), 2);
        assert_eq!(ring.contiguous_window(), 4); // 0..4
        assert_eq!(ring.window(), 4);
    }

    #[test]
    fn random_access_round_trip() {
        let mut storage = [0u8; 8];
        let mut ring = RingBuffer::new(&mut storage[..]);
        assert_eq!(ring.enqueue_slice(b"abcdef"), 6);
        assert_eq!(ring.dequeue_slice(&mut [0; 5]), 5);
        // write_at is 6; write "XYZ" two places later, wrapping.
        assert_eq!(ring.write_unallocated(2, b"XYZ"), 3);
        assert_eq!(ring.write_unallocated(0, b"12"), 2);
        assert_eq!(ring.enqueue_unallocated(5), 5);
        let mut peek = [0u8; 6];
        assert_eq!(ring.read_allocated(0, &mut peek), 6);
        assert_eq!(&peek, b"f12XYZ");
        assert_eq!(ring.dequeue_allocated(6), 6);
        assert!(ring.is_empty());
    }

    #[cfg(feature = "alloc")]
    #[test]
    fn owned_storage() {
        let mut ring: RingBuffer<'static, u16> = RingBuffer::with_capacity(4);
        assert_eq!(ring.enqueue_slice(&[1, 2, 3, 4, 5]), 4);
        assert!(ring.is_full());
    }
}
