//! A fan-out's compressed copies of one publication: made once per window size, however
//! many subscribers take them. A leaf: the loop keeps them (for their allocation), the
//! fan-out fills and empties them.

use freeboard_buf::{Frame, Pool};

use crate::metrics::LoopStats;
use crate::session::deflate::{Codec, NoMemory};

/// One publication's compressed frames in one fan-out, by window bits − 9 (nearly always
/// one: 15 bits, unless a client asked for a smaller window).
#[derive(Default)]
pub(super) struct CompressedCopies([Option<Option<Frame>>; 7]);

impl CompressedCopies {
    /// Compresses the frame for a `bits` window, unless done already. It goes uncompressed
    /// when under the threshold, or when the budget could not cover it (counted; the
    /// uncompressed frame is always valid).
    pub(super) fn make(
        &mut self,
        bits: u8,
        frame: &Frame,
        codec: &mut Codec,
        pool: &mut Pool<'static>,
        stats: &mut LoopStats,
    ) {
        let slot = &mut self.0[Self::slot(bits)];
        slot.get_or_insert_with(|| match codec.compress_frame(pool, frame, bits) {
            Ok(compressed) => {
                stats.compressions += u64::from(compressed.is_some());
                compressed
            }
            Err(NoMemory) => {
                stats.compression_fallbacks += 1;
                None
            }
        });
    }

    /// The frame [`make`](Self::make) compressed for a `bits` window, if it did.
    pub(super) fn get(&self, bits: u8) -> Option<&Frame> {
        self.0[Self::slot(bits)].as_ref()?.as_ref()
    }

    fn slot(bits: u8) -> usize {
        usize::from(bits.clamp(9, 15) - 9)
    }

    pub(super) fn release(self, pool: &mut Pool<'static>) {
        for frame in self.0.into_iter().flatten().flatten() {
            frame.release(pool);
        }
    }
}
