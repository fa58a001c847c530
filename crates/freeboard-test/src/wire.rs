//! Frames and upgrade requests as bytes on a socket, for the clients that drive a real server:
//! the loopback tests, the hostile suite and the load generator.
//!
//! Writing goes through freeboard-proto's [`FrameHeader::encode`]; [`RawHeader`] adds only
//! what a correct sender never writes (any first byte, a length field wider than needed).
//! Everything is written into the caller's buffer, so a load generator can build frames without
//! allocating; [`frame`] is the allocating shorthand for tests. Reading goes through
//! [`FrameHeader::parse`]: a server's frames must be valid, and a test that gets an invalid one
//! hears about it.

use std::io::{self, Read};
use std::ops::Range;

use freeboard_proto::mask::apply_mask;
use freeboard_proto::{CloseCode, FrameHeader, InsufficientSize, OpCode, ProtocolError};

/// A fixed masking key for frames sent to a server.
pub const TEST_MASK: Option<[u8; 4]> = Some([0xa1, 0xb2, 0xc3, 0xd4]);

/// The `Sec-WebSocket-Key` of [`upgrade_request`] (the RFC's sample nonce).
const TEST_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// An upgrade request for `path` with `extra` header lines (each ending in `\r\n`), written
/// as text so that a test can cut it or add whatever lines it likes.
pub fn upgrade_request(path: &str, extra: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {TEST_KEY}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
}

/// How a header writes its payload length (RFC 6455 §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LengthField {
    /// The shortest form, the only one the RFC allows.
    #[default]
    Minimal,
    /// 126 and a 16-bit length, whatever the length.
    Bits16,
    /// 127 and a 64-bit length, whatever the length (the top bit included).
    Bits64,
}

/// A frame header with no checks at all: any first byte, any length, any length field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawHeader {
    /// FIN, RSV1-3 and the opcode as they go on the wire (`0x82`: a final binary frame);
    /// reserved bits and opcodes included.
    pub first_byte: u8,
    /// The payload length the header states, whether or not that many bytes follow.
    pub payload_len: u64,
    /// The masking key, if the frame is masked.
    pub mask: Option<[u8; 4]>,
    /// How the length is written.
    pub length_field: LengthField,
}

impl RawHeader {
    /// A header with the minimal length field.
    pub fn new(first_byte: u8, payload_len: u64, mask: Option<[u8; 4]>) -> Self {
        Self { first_byte, payload_len, mask, length_field: LengthField::Minimal }
    }

    /// The encoded length of this header.
    pub fn len(&self) -> usize {
        self.proto().len()
    }

    /// Always false: a header is never empty. Present because `len` is.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the header into the front of `out` and returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, InsufficientSize> {
        let n = self.proto().encode(out)?;
        out[0] = self.first_byte;
        match self.length_field {
            LengthField::Minimal => {}
            // NOTE(truncation): a 16-bit field holds the low 16 bits, as asked.
            LengthField::Bits16 => {
                out[2..4].copy_from_slice(&(self.payload_len as u16).to_be_bytes())
            }
            LengthField::Bits64 => out[2..10].copy_from_slice(&self.payload_len.to_be_bytes()),
        }
        Ok(n)
    }

    /// A header that freeboard-proto's encoder writes in the same shape: the same mask, and a
    /// length that takes the same length field (the real one is written over it, and so is
    /// the first byte, so the opcode here does not matter).
    fn proto(&self) -> FrameHeader {
        let payload_len = match self.length_field {
            LengthField::Minimal => self.payload_len,
            LengthField::Bits16 => 126,
            LengthField::Bits64 => 1 << 16,
        };
        FrameHeader { fin: false, rsv: 0, opcode: OpCode::Binary, mask: self.mask, payload_len }
    }
}

/// Writes a whole frame into the front of `out`: a minimal header with `first_byte`, then
/// `payload`, masked with `mask` if given. Returns its length; allocates nothing.
pub fn encode_frame(
    first_byte: u8,
    payload: &[u8],
    mask: Option<[u8; 4]>,
    out: &mut [u8],
) -> Result<usize, InsufficientSize> {
    let header = RawHeader::new(first_byte, payload.len() as u64, mask);
    let required = header.len() + payload.len();
    if out.len() < required {
        return Err(InsufficientSize { required });
    }
    let at = header.encode(out)?;
    let body = &mut out[at..required];
    body.copy_from_slice(payload);
    if let Some(key) = mask {
        apply_mask(body, key, 0);
    }
    Ok(required)
}

/// [`encode_frame`] into a new vector — for sending what a correct peer never would as
/// readily as what it would.
pub fn frame(first_byte: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let header = RawHeader::new(first_byte, payload.len() as u64, mask);
    let mut out = vec![0u8; header.len() + payload.len()];
    encode_frame(first_byte, payload, mask, &mut out).expect("sized by the header's len");
    out
}

/// Writes a close frame with `code` and no reason into the front of `out` (8 bytes are
/// enough); returns its length. The code is written as given, sendable or not.
pub fn close_frame(
    code: CloseCode,
    mask: Option<[u8; 4]>,
    out: &mut [u8],
) -> Result<usize, InsufficientSize> {
    encode_frame(0x88, &code.0.to_be_bytes(), mask, out)
}

/// The frame at the front of `buf`: its header and where its payload lies in `buf`, or
/// `Ok(None)` until all of it has arrived. A frame the RFC forbids is an error.
pub fn parse_frame(buf: &[u8]) -> Result<Option<(FrameHeader, Range<usize>)>, ProtocolError> {
    let Some((header, at)) = FrameHeader::parse(buf)? else { return Ok(None) };
    let end = usize::try_from(header.payload_len)
        .ok()
        .and_then(|len| at.checked_add(len))
        .filter(|&end| end <= buf.len());
    Ok(end.map(|end| (header, at..end)))
}

/// One frame as received, its payload unmasked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The FIN bit.
    pub fin: bool,
    /// The opcode (`0x1` text, `0x2` binary, `0x8` close, `0x9` ping, `0xA` pong).
    pub opcode: u8,
    /// The payload.
    pub payload: Vec<u8>,
}

impl Frame {
    /// The status code of a close frame (1005 if it has none).
    pub fn close_code(&self) -> u16 {
        match self.payload.as_slice() {
            [a, b, ..] => u16::from_be_bytes([*a, *b]),
            _ => 1005,
        }
    }
}

/// What a blocking test client has read from its server and not yet taken: a response head,
/// then frames. The reader is passed to each call, so the client keeps its socket.
#[derive(Debug, Default)]
pub struct Inbox {
    /// `buf[..len]`: bytes read and not yet taken; the rest: room for the next read, zeroed
    /// once rather than on every read (a reader may hand out one byte at a time).
    /// Invariant: `len <= buf.len()`.
    buf: Vec<u8>,
    len: usize,
}

impl Inbox {
    /// Takes an HTTP response head, reading from `from` until one has arrived; `None` if the
    /// stream ends (or is reset) first.
    pub fn head(&mut self, from: &mut impl Read) -> io::Result<Option<String>> {
        loop {
            let read = &self.buf[..self.len];
            if let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&read[..end + 4]).into_owned();
                self.take(end + 4);
                return Ok(Some(head));
            }
            if !self.read(from)? {
                return Ok(None);
            }
        }
    }

    /// Takes one frame, reading from `from` until all of it has arrived; `None` if the stream
    /// ends (or is reset) first. An invalid frame is an `InvalidData` error.
    pub fn frame(&mut self, from: &mut impl Read) -> io::Result<Option<Frame>> {
        loop {
            let parsed = parse_frame(&self.buf[..self.len])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if let Some((header, payload)) = parsed {
                let end = payload.end;
                let mut frame = Frame {
                    fin: header.fin,
                    opcode: self.buf[0] & 0x0f,
                    payload: self.buf[payload].to_vec(),
                };
                if let Some(key) = header.mask {
                    apply_mask(&mut frame.payload, key, 0);
                }
                self.take(end);
                return Ok(Some(frame));
            }
            if !self.read(from)? {
                return Ok(None);
            }
        }
    }

    /// Reads and discards until the stream ends; `true` if it ended (EOF or reset), `false` if
    /// a read failed first (the read timeout, say).
    pub fn sees_eof(&mut self, from: &mut impl Read) -> bool {
        loop {
            self.len = 0;
            match self.read(from) {
                Ok(true) => {}
                Ok(false) => return true,
                Err(_) => return false,
            }
        }
    }

    /// One read into the buffer; `false` at the end of the stream or a reset.
    fn read(&mut self, from: &mut impl Read) -> io::Result<bool> {
        const READ_SIZE: usize = 64 << 10;
        if self.buf.len() - self.len < READ_SIZE {
            self.buf.resize(self.len + READ_SIZE, 0);
        }
        loop {
            match from.read(&mut self.buf[self.len..]) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.len += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }

    /// Drops the first `n` bytes read.
    fn take(&mut self, n: usize) {
        self.buf.copy_within(n..self.len, 0);
        self.len -= n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The examples of RFC 6455 §5.7, written and read back.
    #[test]
    fn rfc_examples() {
        let hello = [0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f];
        assert_eq!(frame(0x81, b"Hello", None), hello);
        let masked = [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58];
        assert_eq!(frame(0x81, b"Hello", Some([0x37, 0xfa, 0x21, 0x3d])), masked);
        let (header, payload) = parse_frame(&masked).unwrap().unwrap();
        assert_eq!((header.fin, header.opcode, payload), (true, OpCode::Text, 6..11));
        assert_eq!(&frame(0x82, &[0; 256], None)[..4], [0x82, 0x7e, 0x01, 0x00]);
        assert_eq!(&frame(0x82, &[0; 65536], None)[..10], [0x82, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0]);
    }

    #[test]
    fn raw_headers_write_what_the_proto_encoder_refuses() {
        let reserved = frame(0xf3, b"x", TEST_MASK);
        assert_eq!(reserved[0], 0xf3);
        assert_eq!(FrameHeader::parse(&reserved), Err(ProtocolError::ReservedOpcode(3)));
        for (length_field, header_len) in [(LengthField::Bits16, 8), (LengthField::Bits64, 14)] {
            let header = RawHeader { length_field, ..RawHeader::new(0x82, 5, TEST_MASK) };
            let mut out = [0u8; 14];
            assert_eq!(header.encode(&mut out), Ok(header_len));
            assert_eq!(
                header.encode(&mut out[..header_len - 1]),
                Err(InsufficientSize { required: header_len })
            );
            assert_eq!(
                FrameHeader::parse(&out[..header_len]),
                Err(ProtocolError::NonMinimalLength)
            );
        }
        let top_bit =
            RawHeader { length_field: LengthField::Bits64, ..RawHeader::new(0x82, 1 << 63, None) };
        let mut out = [0u8; 10];
        top_bit.encode(&mut out).unwrap();
        assert_eq!(FrameHeader::parse(&out), Err(ProtocolError::LengthTopBit));
    }

    #[test]
    fn encode_frame_needs_room_for_all_of_it() {
        let mut out = [0u8; 10];
        assert_eq!(
            encode_frame(0x82, &[1; 5], TEST_MASK, &mut out[..10]),
            Err(InsufficientSize { required: 11 })
        );
        assert_eq!(close_frame(CloseCode::NORMAL, TEST_MASK, &mut out), Ok(8));
        let (header, payload) = parse_frame(&out[..8]).unwrap().unwrap();
        let mut code = out[payload].to_vec();
        apply_mask(&mut code, header.mask.unwrap(), 0);
        assert_eq!((header.opcode, code), (OpCode::Close, vec![0x03, 0xe8]));
    }

    /// Fed one byte at a time or all at once, the inbox takes the same head and frames.
    #[test]
    fn inbox_is_split_invariant() {
        let mut bytes = b"HTTP/1.1 101 Switching Protocols\r\n\r\n".to_vec();
        bytes.extend(frame(0x01, b"hel", None));
        bytes.extend(frame(0x80, &[7; 300], None));
        bytes.extend(frame(0x88, &[0x03, 0xe8], TEST_MASK));
        for chunk in [1, 2, 7, bytes.len()] {
            let mut from = Chunked { bytes: &bytes, chunk };
            let mut inbox = Inbox::default();
            let head = inbox.head(&mut from).unwrap().unwrap();
            assert!(head.starts_with("HTTP/1.1 101") && head.ends_with("\r\n\r\n"));
            let first = inbox.frame(&mut from).unwrap().unwrap();
            assert_eq!((first.fin, first.opcode, first.payload), (false, 0x1, b"hel".to_vec()));
            let second = inbox.frame(&mut from).unwrap().unwrap();
            assert_eq!((second.fin, second.opcode, second.payload), (true, 0x0, vec![7; 300]));
            assert_eq!(inbox.frame(&mut from).unwrap().unwrap().close_code(), 1000);
            assert_eq!(inbox.frame(&mut from).unwrap(), None);
            assert!(inbox.sees_eof(&mut from));
        }
        let mut invalid: &[u8] = &[0x82, 126, 0, 5];
        let error = Inbox::default().frame(&mut invalid).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    /// A reader that hands out at most `chunk` bytes per read.
    struct Chunked<'a> {
        bytes: &'a [u8],
        chunk: usize,
    }

    impl Read for Chunked<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.chunk.min(buf.len()).min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }
}
