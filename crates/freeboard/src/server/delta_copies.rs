//! A fan-out's delta-subscriber copies of each publication: the whole message and the
//! Fossil delta against the publication before it, each in its [envelope](crate::delta),
//! made once however many delta subscribers take them (and compressed once per window, as
//! [`CompressedCopies`] are). A leaf: the loop keeps the last publication of each topic with
//! delta subscribers and the copies' allocation, the fan-out fills and empties them.

use std::collections::HashMap;
use std::sync::Arc;

use freeboard_buf::{Frame, Pool};
use freeboard_proto::MessageKind;

use super::compressed_copies::CompressedCopies;
use crate::delta::{BINARY_DELTA, TEXT_DELTA, WHOLE, write_envelope};
use crate::fossil;
use crate::metrics::LoopStats;
use crate::session::deflate::Codec;
use crate::session::event_copies::published_payload;
use crate::topics::header;

/// The last publication of each topic that has delta subscribers on this loop, and the
/// encoder's scratch.
#[derive(Default)]
pub(super) struct TopicDeltas {
    /// Invariant: only topics with delta subscribers on this loop, give or take one fan-out
    /// ([`retire`](Self::retire) lets go of the others).
    last: HashMap<Arc<str>, LastPublication>,
    encoder: fossil::Encoder,
    /// The previous and current payloads, contiguous, and the delta between them: bounded by
    /// twice the largest message and its delta, kept for their allocation.
    scratch: (Vec<u8>, Vec<u8>, Vec<u8>),
}

/// A topic's last publication on this loop.
struct LastPublication {
    /// Its sequence number (see [`crate::delta`]).
    seq: u64,
    /// Its frame, shared with the queues that hold it (pool chunks, no copy); `None` before
    /// the first, or when the pool could not hold the reference.
    frame: Option<Frame>,
}

/// One publication's copies for delta subscribers.
#[derive(Default)]
pub(super) struct DeltaCopies {
    pub(super) seq: u64,
    /// `F{seq}:{message}`; `None` if the pool could not hold it.
    whole: Option<Frame>,
    /// `T{seq}:` or `B{seq}:` and the delta; `None` for the first publication, one whose delta
    /// is no smaller than the message, or one the pool could not hold.
    delta: Option<Frame>,
    compressed: [CompressedCopies; 2],
}

impl TopicDeltas {
    /// Makes the copies of `frames` (publications to `topic`, in order) into `copies`, and
    /// keeps the last of them as the base of the next; deltas made are counted in `stats`.
    pub(super) fn make<'f>(
        &mut self,
        topic: &str,
        frames: impl Iterator<Item = &'f Frame>,
        pool: &mut Pool<'static>,
        copies: &mut Vec<DeltaCopies>,
        stats: &mut LoopStats,
    ) {
        if !self.last.contains_key(topic) {
            self.last.insert(Arc::from(topic), LastPublication { seq: 0, frame: None });
        }
        // NOTE(unwrap): inserted just above.
        let last = self.last.get_mut(topic).unwrap();
        let (previous, current, delta) = &mut self.scratch;
        previous.clear();
        if let Some(frame) = &last.frame {
            for segment in frame.segments(pool) {
                previous.extend_from_slice(segment);
            }
        }
        for frame in frames {
            current.clear();
            for segment in frame.segments(pool) {
                current.extend_from_slice(segment);
            }
            let (kind, payload) = published_payload(current);
            last.seq += 1;
            let seq = last.seq;
            let mut envelope = [0u8; 22];
            let n = write_envelope(&mut envelope, WHOLE, seq);
            let (head, h) = header(kind, n + payload.len());
            let whole = Frame::from_parts(pool, &[&head[..h], &envelope[..n], payload]).ok();
            let delta_frame = match last.frame.is_some() {
                true => {
                    let (_, base) = published_payload(previous);
                    fossil::encode(base, payload, &mut self.encoder, delta);
                    let letter = match kind {
                        MessageKind::Text => TEXT_DELTA,
                        MessageKind::Binary => BINARY_DELTA,
                    };
                    let n = write_envelope(&mut envelope, letter, seq);
                    let (head, h) = header(MessageKind::Binary, n + delta.len());
                    let smaller = delta.len() < payload.len();
                    smaller
                        .then(|| Frame::from_parts(pool, &[&head[..h], &envelope[..n], delta]).ok())
                        .flatten()
                }
                false => None,
            };
            stats.deltas += u64::from(delta_frame.is_some());
            if let Some(old) = last.frame.take() {
                old.release(pool);
            }
            last.frame = frame.share(pool).ok();
            std::mem::swap(previous, current);
            copies.push(DeltaCopies {
                seq,
                whole,
                delta: delta_frame,
                compressed: Default::default(),
            });
        }
    }

    /// Lets go of `topic`'s last publication: it has no delta subscriber left here.
    pub(super) fn retire(&mut self, topic: &str, pool: &mut Pool<'static>) {
        if let Some(frame) = self.last.remove(topic).and_then(|last| last.frame) {
            frame.release(pool);
        }
        if self.last.capacity() > 16 && self.last.len() < self.last.capacity() / 4 {
            self.last.shrink_to(self.last.len() * 2);
        }
    }

    /// Whether a last publication of `topic` is kept.
    pub(super) fn keeps(&self, topic: &str) -> bool {
        self.last.contains_key(topic)
    }

    /// Lets go of the last publication of every topic that `subscribed` says has no delta
    /// subscriber left here, once there are more kept than topics with delta subscribers
    /// (`topics`): a topic whose last delta subscriber left, and which published nothing
    /// since, holds no chunk for long.
    pub(super) fn retire_unsubscribed(
        &mut self,
        topics: usize,
        subscribed: impl Fn(&str) -> bool,
        pool: &mut Pool<'static>,
    ) {
        if self.last.len() <= topics {
            return;
        }
        let gone: Vec<Arc<str>> = self.last.keys().filter(|t| !subscribed(t)).cloned().collect();
        for topic in gone {
            self.retire(&topic, pool);
        }
    }
}

impl DeltaCopies {
    /// Whether a subscriber whose base is `base` can be sent the delta.
    pub(super) fn applies_to(&self, base: Option<u64>) -> bool {
        self.delta.is_some() && base == Some(self.seq - 1)
    }

    /// Compresses the copy a subscriber is sent (`delta` or whole) for a `bits` window, unless
    /// done already (see [`CompressedCopies::make`]).
    pub(super) fn compress(
        &mut self,
        delta: bool,
        bits: u8,
        codec: &mut Codec,
        pool: &mut Pool<'static>,
        stats: &mut LoopStats,
    ) {
        let frame = match delta {
            true => &self.delta,
            false => &self.whole,
        };
        if let Some(frame) = frame {
            self.compressed[usize::from(delta)].make(bits, frame, codec, pool, stats);
        }
    }

    /// The copy for a subscriber: the delta or the whole message, compressed for `bits` if
    /// it was; `None` if the pool could not hold it.
    pub(super) fn get(&self, delta: bool, bits: Option<u8>) -> Option<&Frame> {
        let frame = match delta {
            true => self.delta.as_ref()?,
            false => self.whole.as_ref()?,
        };
        let compressed = bits.and_then(|b| self.compressed[usize::from(delta)].get(b));
        Some(compressed.unwrap_or(frame))
    }

    pub(super) fn release(self, pool: &mut Pool<'static>) {
        for frame in [self.whole, self.delta].into_iter().flatten() {
            frame.release(pool);
        }
        for c in self.compressed {
            c.release(pool);
        }
    }
}
