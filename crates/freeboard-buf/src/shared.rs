//! Frames that cross event loops: `Arc<[u8]>`, atomically counted.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ops::Deref;

use crate::chain::Frame;
use crate::pool::{Pool, PoolError};

/// A framed message that can cross to another event loop (another thread): an `Arc<[u8]>`.
///
/// A pool's [`Frame`] is counted with plain integers and must stay in its loop. To publish to
/// subscribers on several loops, frame the message once into a `SharedFrame` (one allocation
/// from the global allocator, outside any pool's budget), send it over each loop's queue (one
/// atomic increment per loop), and let each loop copy it into its own pool once with
/// [`to_frame`](Self::to_frame) and fan it out locally by reference. The cost per subscriber
/// stays that of a local [`Frame`]; the atomic and the copy are paid once per loop.
///
/// ```
/// use freeboard_buf::{Budget, Pool, PoolConfig, SendQueue, SharedFrame};
///
/// let published = SharedFrame::from_parts(&[b"\x81\x02", b"hi"]);
/// let for_other_loop = published.clone(); // Send + Sync
/// std::thread::spawn(move || {
///     let mut pool = Pool::new(Budget::new(1 << 20), PoolConfig::new()).unwrap();
///     let frame = for_other_loop.to_frame(&mut pool).unwrap();
///     let mut queue = SendQueue::default();
///     let _ = queue.push_frame(&mut pool, &frame);
///     frame.release(&mut pool);
///     assert_eq!(queue.len(), 4);
///     let _ = queue.clear(&mut pool);
/// })
/// .join()
/// .unwrap();
/// assert_eq!(&*published, b"\x81\x02hi");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SharedFrame {
    bytes: Arc<[u8]>,
}

impl SharedFrame {
    /// Concatenates `parts` (e.g. a header and a payload) into one shared allocation.
    pub fn from_parts(parts: &[&[u8]]) -> Self {
        if let [only] = parts {
            return Self { bytes: Arc::from(*only) };
        }
        let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for part in parts {
            bytes.extend_from_slice(part);
        }
        Self { bytes: bytes.into() }
    }

    /// The frame's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Copies the frame into `pool` once, for local zero-copy fan-out.
    pub fn to_frame(&self, pool: &mut Pool<'_>) -> Result<Frame, PoolError> {
        Frame::from_parts(pool, &[&self.bytes])
    }

    /// Copies a local frame out of its pool, to send it to other loops.
    pub fn from_frame(pool: &Pool<'_>, frame: &Frame) -> Self {
        let mut bytes = Vec::with_capacity(frame.len());
        for part in frame.segments(pool) {
            bytes.extend_from_slice(part);
        }
        Self { bytes: bytes.into() }
    }
}

impl Deref for SharedFrame {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl AsRef<[u8]> for SharedFrame {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl From<Arc<[u8]>> for SharedFrame {
    fn from(bytes: Arc<[u8]>) -> Self {
        Self { bytes }
    }
}

impl From<&[u8]> for SharedFrame {
    fn from(bytes: &[u8]) -> Self {
        Self { bytes: Arc::from(bytes) }
    }
}
