//! Streaming UTF-8 validation across frames and reads.
//!
//! §8.1: "When an endpoint is to interpret a byte stream as UTF-8 but finds that the byte stream
//! is not, in fact, a valid UTF-8 stream, that endpoint MUST _Fail the WebSocket Connection_."
//! Failing fast matters: a text message is rejected at the first byte after which no
//! continuation could make it valid, not when its last fragment arrives. The bulk is checked
//! with `simdutf8`; between calls at most 3 bytes of an unfinished code point are carried.

use simdutf8::{basic, compat};

use crate::ProtocolError;

/// Validates a complete string (a close reason).
pub fn validate(bytes: &[u8]) -> Result<&str, ProtocolError> {
    basic::from_utf8(bytes).map_err(|_| ProtocolError::InvalidUtf8)
}

/// Validation state carried between the chunks of one text message.
#[derive(Debug, Clone, Default)]
pub struct Utf8Validator {
    /// The start of a code point cut off by the end of the previous chunk.
    /// Invariant: `partial[..partial_len]` is a proper prefix of some valid UTF-8 sequence.
    partial: [u8; 3],
    /// Invariant: `partial_len <= 3`.
    partial_len: u8,
}

impl Utf8Validator {
    /// A validator at the start of a message.
    pub const fn new() -> Self {
        Self { partial: [0; 3], partial_len: 0 }
    }

    /// Feeds the next chunk of the message; `last` marks the message's final chunk.
    ///
    /// Fails as soon as the bytes seen so far cannot be the prefix of valid UTF-8.
    pub fn feed(&mut self, chunk: &[u8], last: bool) -> Result<(), ProtocolError> {
        let mut rest = chunk;
        if self.partial_len > 0 {
            // Finish the carried code point: it needs at most 3 more bytes.
            let carried = usize::from(self.partial_len);
            let take = rest.len().min(4 - carried);
            let mut joined = [0u8; 4];
            joined[..carried].copy_from_slice(&self.partial[..carried]);
            joined[carried..carried + take].copy_from_slice(&rest[..take]);
            let joined = &joined[..carried + take];
            match compat::from_utf8(joined) {
                Ok(_) => rest = &rest[take..],
                Err(e) if e.error_len().is_some() => return Err(ProtocolError::InvalidUtf8),
                // Still unfinished: the chunk was too short to complete it.
                Err(e) if e.valid_up_to() == 0 => {
                    self.carry(joined);
                    return self.finish(last);
                }
                // The carried code point completed at `valid_up_to`; go on from there.
                Err(e) => rest = &rest[e.valid_up_to() - carried..],
            }
            self.partial_len = 0;
        }
        if basic::from_utf8(rest).is_err() {
            let e = compat::from_utf8(rest).expect_err("basic and compat validation agree");
            if e.error_len().is_some() {
                return Err(ProtocolError::InvalidUtf8);
            }
            self.carry(&rest[e.valid_up_to()..]);
        }
        self.finish(last)
    }

    /// Whether the validator is between code points (nothing carried).
    pub fn is_complete(&self) -> bool {
        self.partial_len == 0
    }

    fn carry(&mut self, tail: &[u8]) {
        // NOTE(truncation): an unfinished code point is at most 3 bytes.
        self.partial[..tail.len()].copy_from_slice(tail);
        self.partial_len = tail.len() as u8;
    }

    fn finish(&mut self, last: bool) -> Result<(), ProtocolError> {
        if last && self.partial_len > 0 {
            self.partial_len = 0;
            return Err(ProtocolError::InvalidUtf8);
        }
        if last {
            *self = Self::new();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(parts: &[&[u8]]) -> Result<(), ProtocolError> {
        let mut v = Utf8Validator::new();
        for (i, part) in parts.iter().enumerate() {
            v.feed(part, i + 1 == parts.len())?;
        }
        Ok(())
    }

    #[test]
    fn agrees_with_core_at_every_split() {
        let samples: &[&[u8]] = &[
            "κόσμε".as_bytes(),
            "Hello-µ@ßöäüàá-UTF-8!!".as_bytes(),
            "\u{10FFFF}\u{FFFF}a\u{7FF}".as_bytes(),
            b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited",
            b"\xf4\x90\x80\x80",
            b"\xc0\xaf",
            b"ab\xe2\x82",
            b"\xe2\x82\xac\xff",
        ];
        for sample in samples {
            let expected = core::str::from_utf8(sample).is_ok();
            for a in 0..=sample.len() {
                for b in a..=sample.len() {
                    let parts = [&sample[..a], &sample[a..b], &sample[b..]];
                    assert_eq!(streamed(&parts).is_ok(), expected, "{sample:x?} split {a}/{b}");
                }
            }
        }
    }

    /// Fails at the first impossible byte, before the message ends (Autobahn 6.4.x).
    #[test]
    fn fails_fast() {
        let mut v = Utf8Validator::new();
        v.feed(b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5", false).unwrap();
        assert_eq!(v.feed(b"\xf4\x90", false), Err(ProtocolError::InvalidUtf8));
        let mut v = Utf8Validator::new();
        v.feed(b"\xed", false).unwrap();
        assert_eq!(v.feed(b"\xa0", false), Err(ProtocolError::InvalidUtf8));
    }

    #[test]
    fn unfinished_code_point_at_message_end_is_invalid() {
        assert_eq!(streamed(&[b"ok\xe2\x82"]), Err(ProtocolError::InvalidUtf8));
        assert_eq!(streamed(&[b"ok\xe2", b"\x82", b""]), Err(ProtocolError::InvalidUtf8));
        assert_eq!(streamed(&[b"ok\xe2", b"\x82", b"\xac"]), Ok(()));
    }
}
