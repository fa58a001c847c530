//! Fixed-size storage that is either borrowed from the caller (`no_std`, no allocator),
//! allocated once at construction (`alloc`), or address space reserved at construction whose
//! pages become resident when first written and can be given back (`std`). It never grows:
//! there is no push, only indexing.

use core::ops::{Deref, DerefMut};

#[cfg(feature = "alloc")]
use alloc::boxed::Box;

#[cfg(feature = "std")]
use crate::mapping::Mapping;

/// A slice of `T` whose length is fixed for its whole life.
pub(crate) enum Storage<'a, T> {
    /// Memory the caller lent us, e.g. a `static` array on a microcontroller.
    Borrowed(&'a mut [T]),
    /// One allocation made at construction.
    #[cfg(feature = "alloc")]
    Owned(Box<[T]>),
    /// Address space reserved at construction; see [`Mapping`].
    #[cfg(feature = "std")]
    Mapped(Mapping<T>),
}

impl<T> Storage<'_, T> {
    /// Gives the whole pages inside `elements` back to the operating system, if this storage
    /// can (only [`Storage::Mapped`]; they read as zeros afterwards). Returns the bytes given
    /// back.
    pub(crate) fn release(&mut self, elements: core::ops::Range<usize>) -> usize {
        match self {
            #[cfg(feature = "std")]
            Storage::Mapped(mapping) => mapping.release(elements),
            _ => {
                let _ = elements;
                0
            }
        }
    }
}

impl<T> Deref for Storage<'_, T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        match self {
            Storage::Borrowed(slice) => slice,
            #[cfg(feature = "alloc")]
            Storage::Owned(boxed) => boxed,
            #[cfg(feature = "std")]
            Storage::Mapped(mapping) => mapping.as_slice(),
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
            #[cfg(feature = "std")]
            Storage::Mapped(mapping) => mapping.as_mut_slice(),
        }
    }
}

impl<T> core::fmt::Debug for Storage<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let kind = match self {
            Storage::Borrowed(_) => "borrowed",
            #[cfg(feature = "alloc")]
            Storage::Owned(_) => "owned",
            #[cfg(feature = "std")]
            Storage::Mapped(_) => "mapped",
        };
        write!(f, "Storage({kind}, {} elements)", self.len())
    }
}
