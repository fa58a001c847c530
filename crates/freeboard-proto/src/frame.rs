//! The frame header as a typed view over raw bytes (RFC 6455 §5.2).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-------+-+-------------+-------------------------------+
//! |F|R|R|R| opcode|M| Payload len |    Extended payload length    |
//! |I|S|S|S|  (4)  |A|     (7)     |             (16/64)           |
//! |N|V|V|V|       |S|             |   (if payload len==126/127)   |
//! | |1|2|3|       |K|             |                               |
//! +-+-+-+-+-------+-+-------------+ - - - - - - - - - - - - - - - +
//! ```

use crate::{InsufficientSize, ProtocolError};

/// The longest frame header: 2 fixed bytes, 8 bytes of length, 4 bytes of mask.
pub const MAX_HEADER_LEN: usize = 14;
/// The longest control frame payload (§5.5).
pub const MAX_CONTROL_PAYLOAD: usize = 125;

mod field {
    pub(super) const FIN: u8 = 0x80;
    pub(super) const RSV: u8 = 0x70;
    pub(super) const RSV1: u8 = 0x40;
    pub(super) const OPCODE: u8 = 0x0f;
    pub(super) const MASK: u8 = 0x80;
    pub(super) const LEN7: u8 = 0x7f;
    pub(super) const LEN16_MARK: u8 = 126;
    pub(super) const LEN64_MARK: u8 = 127;
}

/// A frame opcode (§5.2, §11.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpCode {
    /// 0x0: continues a fragmented message.
    Continuation,
    /// 0x1: a text frame.
    Text,
    /// 0x2: a binary frame.
    Binary,
    /// 0x8: close.
    Close,
    /// 0x9: ping.
    Ping,
    /// 0xA: pong.
    Pong,
}

impl OpCode {
    /// Whether this is a control opcode (close, ping, pong).
    pub fn is_control(self) -> bool {
        matches!(self, Self::Close | Self::Ping | Self::Pong)
    }

    fn from_bits(bits: u8) -> Result<Self, ProtocolError> {
        Ok(match bits {
            0x0 => Self::Continuation,
            0x1 => Self::Text,
            0x2 => Self::Binary,
            0x8 => Self::Close,
            0x9 => Self::Ping,
            0xA => Self::Pong,
            // §5.2: "If an unknown opcode is received, the receiving endpoint MUST _Fail the
            // WebSocket Connection_."
            other => return Err(ProtocolError::ReservedOpcode(other)),
        })
    }

    fn bits(self) -> u8 {
        match self {
            Self::Continuation => 0x0,
            Self::Text => 0x1,
            Self::Binary => 0x2,
            Self::Close => 0x8,
            Self::Ping => 0x9,
            Self::Pong => 0xA,
        }
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// FIN: this is the last frame of its message.
    pub fin: bool,
    /// The RSV1..RSV3 bits, shifted down (RSV1 = 0b100).
    pub rsv: u8,
    /// The opcode.
    pub opcode: OpCode,
    /// The masking key, if the frame is masked.
    pub mask: Option<[u8; 4]>,
    /// The payload length.
    pub payload_len: u64,
}

impl FrameHeader {
    /// Parses a header from the front of `buf`.
    ///
    /// Returns `Ok(None)` when `buf` does not yet hold the whole header, and otherwise the
    /// header and its length in bytes. Checks everything that can be checked from the header
    /// alone and does not depend on the role or on the previous frame: reserved opcodes,
    /// minimal length encoding, the 64-bit top bit, and the control frame rules. RSV bits,
    /// masking direction and continuation rules are the [`Connection`](crate::Connection)'s.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<Option<(Self, usize)>, ProtocolError> {
        let [b0, b1, rest @ ..] = buf else { return Ok(None) };
        let opcode = OpCode::from_bits(b0 & field::OPCODE)?;
        let fin = b0 & field::FIN != 0;
        let masked = b1 & field::MASK != 0;
        let (payload_len, len_bytes) = match b1 & field::LEN7 {
            field::LEN16_MARK => {
                let Some(bytes) = rest.first_chunk::<2>() else { return Ok(None) };
                let len = u16::from_be_bytes(*bytes);
                // §5.2: "the minimal number of bytes MUST be used to encode the length".
                if len < 126 {
                    return Err(ProtocolError::NonMinimalLength);
                }
                (u64::from(len), 2)
            }
            field::LEN64_MARK => {
                let Some(bytes) = rest.first_chunk::<8>() else { return Ok(None) };
                let len = u64::from_be_bytes(*bytes);
                // §5.2: "the most significant bit MUST be 0".
                if len >> 63 != 0 {
                    return Err(ProtocolError::LengthTopBit);
                }
                if len <= u64::from(u16::MAX) {
                    return Err(ProtocolError::NonMinimalLength);
                }
                (len, 8)
            }
            len => (u64::from(len), 0),
        };
        if opcode.is_control() {
            // §5.5: "All control frames MUST have a payload length of 125 bytes or less and
            // MUST NOT be fragmented."
            if payload_len > MAX_CONTROL_PAYLOAD as u64 {
                return Err(ProtocolError::ControlFrameTooLong);
            }
            if !fin {
                return Err(ProtocolError::FragmentedControlFrame);
            }
        }
        let mask = if masked {
            let Some(key) = rest[len_bytes..].first_chunk::<4>() else { return Ok(None) };
            Some(*key)
        } else {
            None
        };
        let header_len = 2 + len_bytes + if masked { 4 } else { 0 };
        let rsv = (b0 & field::RSV) >> 4;
        Ok(Some((Self { fin, rsv, opcode, mask, payload_len }, header_len)))
    }

    /// Whether RSV1 is set (permessage-deflate marks compressed messages with it).
    pub fn rsv1(&self) -> bool {
        self.rsv & (field::RSV1 >> 4) != 0
    }

    /// The encoded length of this header.
    pub fn len(&self) -> usize {
        let len_bytes = match self.payload_len {
            0..=125 => 0,
            126..=0xffff => 2,
            _ => 8,
        };
        2 + len_bytes + if self.mask.is_some() { 4 } else { 0 }
    }

    /// Always false: a header is never empty. Present because `len` is.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the header into the front of `out`, using the minimal length encoding, and
    /// returns its length.
    #[inline]
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, InsufficientSize> {
        let (bytes, required) = self.to_bytes();
        let Some(out) = out.get_mut(..required) else {
            return Err(InsufficientSize { required });
        };
        out.copy_from_slice(&bytes[..required]);
        Ok(required)
    }

    /// The header in the minimal length encoding: the first `n` bytes of the array, and `n`.
    #[inline]
    pub fn to_bytes(&self) -> ([u8; MAX_HEADER_LEN], usize) {
        let mut out = [0; MAX_HEADER_LEN];
        let n = self.write(&mut out);
        (out, n)
    }

    /// Writes the header in the minimal length encoding into the front of `out` and returns
    /// its length; the bytes after it are left as they were. The fixed-size array needs no
    /// length check, and a caller can frame straight into its buffer.
    #[inline]
    pub fn write(&self, out: &mut [u8; MAX_HEADER_LEN]) -> usize {
        out[0] = (u8::from(self.fin) << 7) | ((self.rsv & 0b111) << 4) | self.opcode.bits();
        let mask_bit = if self.mask.is_some() { field::MASK } else { 0 };
        let mut at = match self.payload_len {
            // NOTE(truncation): each arm's range fits the width it casts to.
            len @ 0..=125 => {
                out[1] = mask_bit | len as u8;
                2
            }
            len @ 126..=0xffff => {
                out[1] = mask_bit | field::LEN16_MARK;
                out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
                4
            }
            len => {
                out[1] = mask_bit | field::LEN64_MARK;
                out[2..10].copy_from_slice(&len.to_be_bytes());
                10
            }
        };
        if let Some(key) = self.mask {
            out[at..at + 4].copy_from_slice(&key);
            at += 4;
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Option<(FrameHeader, usize)>, ProtocolError> {
        FrameHeader::parse(bytes)
    }

    /// The examples of RFC 6455 §5.7.
    #[test]
    fn rfc_examples() {
        // A single-frame unmasked text message, "Hello".
        let (h, n) = parse(&[0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]).unwrap().unwrap();
        assert_eq!((h.fin, h.opcode, h.mask, h.payload_len, n), (true, OpCode::Text, None, 5, 2));
        // A single-frame masked text message, "Hello".
        let (h, n) = parse(&[0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d]).unwrap().unwrap();
        assert_eq!((h.mask, h.payload_len, n), (Some([0x37, 0xfa, 0x21, 0x3d]), 5, 6));
        // A fragmented unmasked text message: "Hel" then "lo".
        let (h, _) = parse(&[0x01, 0x03]).unwrap().unwrap();
        assert_eq!((h.fin, h.opcode), (false, OpCode::Text));
        let (h, _) = parse(&[0x80, 0x02]).unwrap().unwrap();
        assert_eq!((h.fin, h.opcode), (true, OpCode::Continuation));
        // Unmasked ping and masked pong, "Hello".
        assert_eq!(parse(&[0x89, 0x05]).unwrap().unwrap().0.opcode, OpCode::Ping);
        let (h, _) = parse(&[0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d]).unwrap().unwrap();
        assert_eq!(h.opcode, OpCode::Pong);
        // 256 bytes binary message in a single unmasked frame.
        let (h, n) = parse(&[0x82, 0x7E, 0x01, 0x00]).unwrap().unwrap();
        assert_eq!((h.payload_len, n), (256, 4));
        // 64 KiB binary message in a single unmasked frame.
        let (h, n) = parse(&[0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0]).unwrap().unwrap();
        assert_eq!((h.payload_len, n), (65536, 10));
    }

    #[test]
    fn incomplete_headers_need_more() {
        let full = [0x82, 0xFF, 0, 0, 0, 0, 0, 1, 0, 0, 1, 2, 3, 4];
        for cut in 0..full.len() {
            assert_eq!(parse(&full[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(parse(&full).unwrap().unwrap().1, 14);
    }

    #[test]
    fn rejects_what_the_rfc_forbids() {
        assert_eq!(parse(&[0x83, 0x00]), Err(ProtocolError::ReservedOpcode(3)));
        assert_eq!(parse(&[0x8B, 0x00]), Err(ProtocolError::ReservedOpcode(0xB)));
        assert_eq!(parse(&[0x82, 126, 0, 125]), Err(ProtocolError::NonMinimalLength));
        assert_eq!(
            parse(&[0x82, 127, 0, 0, 0, 0, 0, 0, 0xff, 0xff]),
            Err(ProtocolError::NonMinimalLength)
        );
        assert_eq!(
            parse(&[0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 0]),
            Err(ProtocolError::LengthTopBit)
        );
        assert_eq!(parse(&[0x89, 126, 0, 126]), Err(ProtocolError::ControlFrameTooLong));
        assert_eq!(parse(&[0x09, 0]), Err(ProtocolError::FragmentedControlFrame));
    }

    #[test]
    fn encode_round_trips_every_length_class() {
        for (len, header_len) in
            [(0, 2), (125, 2), (126, 4), (65535, 4), (65536, 10), (1 << 62, 10)]
        {
            for mask in [None, Some([1, 2, 3, 4])] {
                let h = FrameHeader {
                    fin: true,
                    rsv: 0b100,
                    opcode: OpCode::Binary,
                    mask,
                    payload_len: len,
                };
                let mut out = [0; MAX_HEADER_LEN];
                let n = h.encode(&mut out).unwrap();
                assert_eq!(n, header_len + if mask.is_some() { 4 } else { 0 });
                assert_eq!(parse(&out[..n]), Ok(Some((h, n))));
                assert_eq!(h.encode(&mut out[..n - 1]), Err(InsufficientSize { required: n }));
            }
        }
    }
}
