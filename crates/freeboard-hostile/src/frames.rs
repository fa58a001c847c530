//! Frames a correct client never sends: a 2^63 length, no mask, millions of 1-byte
//! continuation frames, invalid UTF-8 split at every point.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::Duration;

use freeboard_test::{LengthField, RawHeader, TEST_MASK, encode_frame};

use crate::ws::{Frame, WsClient};

/// Sends the header of a binary frame whose 64-bit length field is `len` (and a few payload
/// bytes); returns the server's close code.
pub fn length_field(addr: SocketAddr, len: u64) -> Option<u16> {
    let mut client = WsClient::open(addr);
    let header =
        RawHeader { length_field: LengthField::Bits64, ..RawHeader::new(0x82, len, TEST_MASK) };
    let mut frame = [0u8; 14 + 16];
    header.encode(&mut frame).expect("14 bytes of header");
    client.send_raw(&frame).expect("send");
    client.recv_close().expect("read the close")
}

/// Sends a binary frame without a mask; returns the server's close code.
pub fn unmasked(addr: SocketAddr) -> Option<u16> {
    let mut client = WsClient::open(addr);
    client.send_raw(&freeboard_test::frame(0x82, b"not masked", None)).expect("send");
    client.recv_close().expect("read the close")
}

/// What a fragment bomb got back.
#[derive(Debug)]
pub struct BombOutcome {
    /// The frames the server sent: the echo, or a close.
    pub reply: Option<Frame>,
    /// The message that was sent.
    pub message: Vec<u8>,
}

/// Sends one binary message of `fragments` bytes as `fragments` frames of one byte each (a
/// binary frame without FIN, then continuation frames), written in batches; returns the
/// server's first reply (the echo, or its close frame).
pub fn fragment_bomb(addr: SocketAddr, fragments: usize) -> BombOutcome {
    let mut client = WsClient::open(addr);
    client.stream.set_write_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let message: Vec<u8> = (0..fragments).map(|i| (i % 251) as u8).collect();
    const BATCH: usize = 64 << 10;
    let mut out = Vec::with_capacity(BATCH * 7);
    for (i, byte) in message.iter().enumerate() {
        let opcode = if i == 0 { 0x2 } else { 0x0 };
        let fin = if i + 1 == fragments { 0x80 } else { 0 };
        let mut frame = [0u8; 7];
        encode_frame(fin | opcode, &[*byte], TEST_MASK, &mut frame).expect("7 bytes");
        out.extend_from_slice(&frame);
        if out.len() >= BATCH * 7 || i + 1 == fragments {
            if client.send_raw(&out).is_err() || replied(&client) {
                break; // the server closed: its close frame says why
            }
            out.clear();
        }
    }
    let reply = client.recv().expect("read the reply");
    BombOutcome { reply, message }
}

/// Sends the first `len` bytes of a binary message in fragments of 32 KiB and never its last
/// fragment; returns the server's close code (an error if none comes within the read
/// timeout), answered as a correct client answers it.
pub fn unfinished(addr: SocketAddr, len: usize) -> io::Result<Option<u16>> {
    const FRAGMENT: usize = 32 << 10;
    let mut client = WsClient::open(addr);
    let payload = [0x5au8; FRAGMENT];
    let mut sent = 0;
    while sent < len && !replied(&client) {
        let n = FRAGMENT.min(len - sent);
        client.send(if sent == 0 { 0x02 } else { 0x00 }, &payload[..n])?;
        sent += n;
    }
    let code = client.recv_close()?;
    if let Some(code) = code {
        client.send(0x88, &code.to_be_bytes())?;
        client.sees_eof();
    }
    Ok(code)
}

/// Whether the server has sent something (so a bomb it refused stops before the server,
/// done waiting, resets the connection and takes its close frame with it).
fn replied(client: &WsClient) -> bool {
    let mut byte = [0u8; 1];
    client.stream.set_nonblocking(true).expect("nonblocking");
    let peeked = client.stream.peek(&mut byte);
    client.stream.set_nonblocking(false).expect("blocking");
    !matches!(peeked, Err(ref e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// How an invalid message is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Into two frames: a text frame without FIN and a continuation frame.
    Fragments,
    /// One frame written in two `write`s 5 ms apart, so the server reads it in two pieces.
    Reads,
}

/// Sends `payload` as one text message cut at `at` in the manner of `split`; returns the
/// server's reply: its echo, or its close frame.
pub fn split_text(addr: SocketAddr, payload: &[u8], at: usize, split: Split) -> io::Result<Frame> {
    let mut client = WsClient::open(addr);
    match split {
        Split::Fragments => {
            client.send(0x01, &payload[..at])?;
            client.send(0x80, &payload[at..])?;
        }
        Split::Reads => {
            let frame = freeboard_test::frame(0x81, payload, TEST_MASK);
            let cut = frame.len() - payload.len() + at;
            client.stream.write_all(&frame[..cut])?;
            client.stream.flush()?;
            std::thread::sleep(Duration::from_millis(5));
            client.stream.write_all(&frame[cut..])?;
        }
    }
    client.recv()?.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "no reply"))
}

/// Text payloads that are invalid UTF-8, each in the middle of valid multi-byte text: a bad
/// continuation byte, an overlong encoding, a surrogate, a code point above U+10FFFF, a
/// stray continuation byte and a message that ends inside a character.
pub const INVALID_UTF8: [&[u8]; 6] = [
    b"h\xc3\xa9llo \xe2\x82( w\xc3\xb6rld",
    b"h\xc3\xa9llo \xc0\xaf w\xc3\xb6rld",
    b"h\xc3\xa9llo \xed\xa0\x80 w\xc3\xb6rld",
    b"h\xc3\xa9llo \xf4\x90\x80\x80 w\xc3\xb6rld",
    b"h\xc3\xa9llo \x80 w\xc3\xb6rld",
    b"h\xc3\xa9llo w\xc3\xb6rld \xf0\x9f\x98",
];

/// A valid text payload with characters of every UTF-8 length, the control case.
pub const VALID_UTF8: &[u8] = "héllo wörld € 𝄞".as_bytes();
