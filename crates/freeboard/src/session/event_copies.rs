//! A fan-out's Server-Sent Events copies of one publication: framed once per
//! [`Variant`] (with or without `id:` and `event:`), however many event-stream subscribers
//! take them, as the server's compressed copies are once per window. A leaf both drivers
//! share: the server's loop keeps them (for their allocation) and its fan-out fills and
//! empties them; the tokio driver's publication makes one set.

use freeboard_buf::{Frame, Pool};
use freeboard_proto::MessageKind;

use super::events::{Variant, write_event};
use crate::history::split_envelope;

/// One publication's event frames in one fan-out, by [`Variant::slot`]: `None` not made yet,
/// `Some(None)` when the pool could not hold it.
#[derive(Default)]
pub(crate) struct EventCopies([Option<Option<Frame>>; 4]);

impl EventCopies {
    /// Frames the published WebSocket `frame` (a server's: unmasked, one frame) of `topic`
    /// as an event for `variant`, unless done already. `history`: the topic's payloads carry
    /// an offset envelope, which becomes the `id:` (or is dropped, for a variant without it).
    /// `scratch` holds the bytes on their way.
    pub(crate) fn make(
        &mut self,
        variant: Variant,
        frame: &Frame,
        topic: &str,
        history: bool,
        pool: &mut Pool<'static>,
        scratch: &mut (Vec<u8>, Vec<u8>),
    ) {
        let slot = &mut self.0[variant.slot()];
        if slot.is_some() {
            return;
        }
        let (wire, event) = scratch;
        wire.clear();
        for segment in frame.segments(pool) {
            wire.extend_from_slice(segment);
        }
        let (kind, payload) = published_payload(wire);
        let (offset, payload) = match history {
            true => split_envelope(payload),
            false => (None, payload),
        };
        let id = offset.filter(|_| variant.id);
        write_event(event, id, variant.topic.then_some(topic), kind, payload);
        *slot = Some(Frame::from_parts(pool, &[event]).ok());
    }

    /// The event [`make`](Self::make) framed for `variant`, if the pool could hold it.
    pub(crate) fn get(&self, variant: Variant) -> Option<&Frame> {
        self.0[variant.slot()].as_ref()?.as_ref()
    }

    pub(crate) fn release(self, pool: &mut Pool<'static>) {
        for frame in self.0.into_iter().flatten().flatten() {
            frame.release(pool);
        }
    }
}

/// The kind and payload of a published frame: one unmasked frame, FIN set, text or binary.
pub(crate) fn published_payload(wire: &[u8]) -> (MessageKind, &[u8]) {
    let kind = match wire.first().map(|b| b & 0x0f) {
        Some(0x2) => MessageKind::Binary,
        _ => MessageKind::Text,
    };
    let header = match wire.get(1).map(|b| b & 0x7f) {
        Some(126) => 4,
        Some(127) => 10,
        _ => 2,
    };
    (kind, wire.get(header..).unwrap_or_default())
}
