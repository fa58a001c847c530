//! The decoder of a delta subscription's messages ([`crate::delta`] describes the envelope).

use freeboard_proto::MessageKind;

use crate::delta::{BINARY_DELTA, TEXT_DELTA, WHOLE, split_envelope};
use crate::fossil::{self, DeltaError};

/// Turns the messages of a `?delta=fossil` subscription back into the publications: feed it
/// every message in the order received; it keeps the last publication as the base of the
/// next delta.
///
/// A delta is applied only to the message of the sequence number just before its own, and
/// only if its checksum then matches: one that names another base (its own base was dropped
/// by the server's slow-consumer policy) is refused with [`DeltaRefusal::Gap`], and so is
/// every delta after it until the next whole message, which the server sends next.
///
/// ```
/// use freeboard::client::DeltaDecoder;
/// use freeboard::{MessageKind, fossil};
///
/// let mut decoder = DeltaDecoder::new(1 << 20);
/// let first = decoder.decode(MessageKind::Text, b"F1:{\"score\":[0,0],\"minute\":10}").unwrap();
/// assert_eq!(first.data, b"{\"score\":[0,0],\"minute\":10}");
/// let mut delta = b"T2:".to_vec();
/// let mut body = Vec::new();
/// let (old, new) = (&b"{\"score\":[0,0],\"minute\":10}"[..], &b"{\"score\":[1,0],\"minute\":12}"[..]);
/// fossil::encode(old, new, &mut fossil::Encoder::default(), &mut body);
/// delta.extend_from_slice(&body);
/// let second = decoder.decode(MessageKind::Binary, &delta).unwrap();
/// assert_eq!((second.kind, second.data), (MessageKind::Text, new));
/// ```
#[derive(Debug)]
pub struct DeltaDecoder {
    /// The last publication decoded, the base of the next delta.
    base: Vec<u8>,
    /// Its sequence number; `None` until a whole message comes (at the start, after a gap or
    /// a message without the envelope).
    seq: Option<u64>,
    /// The publication a delta makes, swapped with `base` once checked.
    scratch: Vec<u8>,
    max_len: usize,
    gaps: u64,
}

/// A publication as [`DeltaDecoder::decode`] gives it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded<'d> {
    /// As it was published.
    pub kind: MessageKind,
    /// The publication's bytes (with a history topic's `{offset}:` envelope, if it has one).
    pub data: &'d [u8],
    /// Its sequence number; `None` for a message without the delta envelope (a replay).
    pub seq: Option<u64>,
    /// Whether it came as a delta.
    pub was_delta: bool,
}

/// Why [`DeltaDecoder::decode`] could not give a publication back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeltaRefusal {
    /// A delta whose base is not the last publication decoded: the messages between were
    /// lost (the server counted them). Dropped; the server sends the next one whole.
    Gap {
        /// The sequence number of the last publication decoded, if any.
        last: Option<u64>,
        /// The sequence number of the delta.
        seq: u64,
    },
    /// A delta that does not apply to its base (damaged, or forged), or makes text that is
    /// not UTF-8.
    Corrupt(DeltaError),
}

impl std::fmt::Display for DeltaRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Gap { last: Some(last), seq } => {
                write!(f, "delta {seq} does not follow the last publication decoded ({last})")
            }
            Self::Gap { last: None, seq } => write!(f, "delta {seq} before any whole message"),
            Self::Corrupt(e) => write!(f, "delta does not apply: {e}"),
        }
    }
}

impl std::error::Error for DeltaRefusal {}

impl DeltaDecoder {
    /// A decoder that refuses deltas making publications longer than `max_len` bytes (as
    /// [`Limits::max_message_size`](crate::Limits) refuses messages).
    pub fn new(max_len: usize) -> Self {
        Self { base: Vec::new(), seq: None, scratch: Vec::new(), max_len, gaps: 0 }
    }

    /// The publication `message` (as received, `kind` its WebSocket kind) carries. A presence
    /// event (`freeboard-presence:…`, [`crate::presence`]) is given back as it is and leaves
    /// the base alone: it is no publication.
    pub fn decode<'d>(
        &'d mut self,
        kind: MessageKind,
        message: &'d [u8],
    ) -> Result<Decoded<'d>, DeltaRefusal> {
        if message.starts_with(crate::presence::EVENT_PREFIX.as_bytes()) {
            return Ok(Decoded { kind, data: message, seq: None, was_delta: false });
        }
        let Some((letter, seq, body)) = split_envelope(message) else {
            // Whole, without the envelope: a history replay.
            self.base.clear();
            self.base.extend_from_slice(message);
            self.seq = None;
            return Ok(Decoded { kind, data: &self.base, seq: None, was_delta: false });
        };
        if letter == WHOLE {
            self.base.clear();
            self.base.extend_from_slice(body);
            self.seq = Some(seq);
            return Ok(Decoded { kind, data: &self.base, seq: Some(seq), was_delta: false });
        }
        if self.seq.is_none_or(|last| last.checked_add(1) != Some(seq)) {
            let last = self.seq.take();
            self.gaps += 1;
            return Err(DeltaRefusal::Gap { last, seq });
        }
        let made = fossil::apply(&self.base, body, self.max_len, &mut self.scratch);
        let kind = match letter {
            TEXT_DELTA => MessageKind::Text,
            _ => {
                debug_assert_eq!(letter, BINARY_DELTA);
                MessageKind::Binary
            }
        };
        let text_ok = kind == MessageKind::Binary || std::str::from_utf8(&self.scratch).is_ok();
        match made {
            Ok(()) if text_ok => {}
            Ok(()) => {
                self.seq = None;
                return Err(DeltaRefusal::Corrupt(DeltaError::BadChecksum));
            }
            Err(e) => {
                self.seq = None;
                return Err(DeltaRefusal::Corrupt(e));
            }
        }
        std::mem::swap(&mut self.base, &mut self.scratch);
        self.seq = Some(seq);
        Ok(Decoded { kind, data: &self.base, seq: Some(seq), was_delta: true })
    }

    /// Deltas refused for a gap so far.
    pub fn gaps(&self) -> u64 {
        self.gaps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(letter: char, seq: u64, old: &[u8], new: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        fossil::encode(old, new, &mut fossil::Encoder::default(), &mut body);
        let mut message = format!("{letter}{seq}:").into_bytes();
        message.extend_from_slice(&body);
        message
    }

    #[test]
    fn deltas_apply_in_sequence_and_gaps_wait_for_a_whole_message() {
        let v = |n: u32| format!("{{\"n\":{n},\"pad\":\"{}\"}}", "x".repeat(64)).into_bytes();
        let mut d = DeltaDecoder::new(1 << 20);
        let text = MessageKind::Text;
        let bin = MessageKind::Binary;
        assert!(matches!(d.decode(bin, &delta('T', 1, b"", &v(1))), Err(DeltaRefusal::Gap { .. })));
        let whole = [b"F1:".as_slice(), &v(1)].concat();
        assert_eq!(d.decode(text, &whole).unwrap().data, v(1));
        let two = delta('T', 2, &v(1), &v(2));
        let got = d.decode(bin, &two).unwrap();
        assert_eq!((got.kind, got.data, got.seq, got.was_delta), (text, &v(2)[..], Some(2), true));
        // Message 3 lost: 4's delta names it, and is refused; so is 5's after it.
        let four = delta('T', 4, &v(3), &v(4));
        assert_eq!(d.decode(bin, &four), Err(DeltaRefusal::Gap { last: Some(2), seq: 4 }));
        let five = delta('T', 5, &v(4), &v(5));
        assert_eq!(d.decode(bin, &five), Err(DeltaRefusal::Gap { last: None, seq: 5 }));
        let whole = [b"F6:".as_slice(), &v(6)].concat();
        assert_eq!(d.decode(text, &whole).unwrap().data, v(6));
        assert_eq!(d.decode(bin, &delta('T', 7, &v(6), &v(7))).unwrap().data, v(7));
        assert_eq!(d.gaps(), 3);
        // A presence event passes, and leaves the base as it was.
        let event = br#"freeboard-presence:{"event":"join","topic":"t","id":"0.1"}"#;
        assert_eq!(d.decode(text, event).unwrap().data, event);
        assert_eq!(d.decode(bin, &delta('T', 8, &v(7), &v(8))).unwrap().data, v(8));
        // A delta against the right number but other bytes fails its checksum.
        let wrong = delta('T', 9, &v(99), &v(9));
        let refused = d.decode(bin, &wrong);
        assert!(matches!(refused, Err(DeltaRefusal::Corrupt(_))), "{refused:?}");
        // A replay comes without the envelope, and the next delta waits for a whole one.
        assert_eq!(d.decode(text, b"ab.1-2:{}").unwrap().seq, None);
        assert!(d.decode(bin, &delta('T', 10, &v(9), &v(10))).is_err());
    }
}
