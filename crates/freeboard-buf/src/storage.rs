//! Fixed-size storage that is either borrowed from the caller (`no_std`, no allocator) or
//! allocated once at construction (`alloc`). It never grows: there is no push, only indexing.

use core::ops::{Deref, DerefMut};

#[cfg(feature = "alloc")]
use alloc::boxed::Box;

/// A slice of `T` whose length is fixed for its whole life.
pub(crate) enum Storage<'a, T> {
    /// Memory the caller lent us, e.g. a `static` array on a microcontroller.
    Borrowed(&'a mut [T]),
    /// One allocation made at construction.
    #[cfg(feature = "alloc")]
    Owned(Box<[T]>),
}

impl<T> Deref for Storage<'_, T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        match self {
            Storage::Borrowed(slice) => slice,
            #[cfg(feature = "alloc")]
            Storage::Owned(boxed) => boxed,
        }
    }
}

impl<T> DerefMut for Storage<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Storage::Borrowed(slice) => slice,
            #[cfg(feature = "alloc")]
            Storage::Owned(boxed) => boxed,
        }
    }
}

impl<T> core::fmt::Debug for Storage<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let kind = match self {
            Storage::Borrowed(_) => "borrowed",
            #[cfg(feature = "alloc")]
            Storage::Owned(_) => "owned",
        };
        write!(f, "Storage({kind}, {} elements)", self.len())
    }
}
