//! Header bombs (a huge head, too many headers), `Transfer-Encoding` lists that smuggle a
//! body past a proxy that reads them differently, and a `permessage-deflate` offer.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::ws::{WsClient, upgrade_request};

/// Sends an upgrade request whose one extra header holds `size` bytes; returns the status
/// of the answer (0 if there was none).
pub fn huge_header(addr: SocketAddr, size: usize) -> u16 {
    let mut request = upgrade_request("/echo", "").into_bytes();
    request.truncate(request.len() - 2); // before the blank line
    request.extend_from_slice(b"X-Bomb: ");
    request.resize(request.len() + size, b'a');
    request.extend_from_slice(b"\r\n\r\n");
    status_of(addr, &request)
}

/// Sends an upgrade request with `count` extra headers; returns the answer's status.
pub fn many_headers(addr: SocketAddr, count: usize) -> u16 {
    let extra: String = (0..count).map(|i| format!("X-H{i}: v\r\n")).collect();
    status_of(addr, upgrade_request("/echo", &extra).as_bytes())
}

/// What a request with `Transfer-Encoding` fields got: the status of the first answer, how
/// many answers came (2 when the request pipelined after it was read too), and whether the
/// server then ended the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// The first answer's status (0: none).
    pub status: u16,
    /// Status lines received.
    pub answers: usize,
    /// The connection ended (EOF or reset) within the read timeout.
    pub closed: bool,
}

/// `POST /topic/{topic}` with one `Transfer-Encoding` field per entry of `fields` (the
/// values as given), a chunked body, and `GET /healthz` pipelined after it: what a proxy that
/// reads the codings differently could take for a second request (it asks for
/// `Connection: close`, so a server that reads it answers and then closes too).
pub fn transfer_encoding(addr: SocketAddr, topic: &str, fields: &[&str]) -> Framing {
    let te: String = fields.iter().map(|v| format!("Transfer-Encoding: {v}\r\n")).collect();
    let request = format!(
        "POST /topic/{topic} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n{te}\r\n\
         5\r\nhello\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let _ = stream.write_all(request.as_bytes());
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break false;
            }
            Err(_) => break true, // reset
        }
    };
    let text = String::from_utf8_lossy(&answer);
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    Framing { status, answers: text.matches("HTTP/1.1 ").count(), closed }
}

/// Sends `request` (ignoring a write the server cut short) and reads the status line of the
/// answer.
fn status_of(addr: SocketAddr, request: &[u8]) -> u16 {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.set_write_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let _ = stream.write_all(request);
    let mut answer = [0u8; 12];
    match stream.read_exact(&mut answer) {
        Ok(()) => std::str::from_utf8(&answer[9..]).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
        Err(_) => 0,
    }
}

/// Offers `permessage-deflate` (with the parameters browsers send); returns the client, the
/// status and the response head.
pub fn deflate_offer(addr: SocketAddr) -> (WsClient, u16, String) {
    let offer = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n";
    WsClient::handshake(addr, &upgrade_request("/echo", offer)).expect("handshake")
}

/// After a `permessage-deflate` offer, sends a text frame with RSV1 set (as a compressed
/// message would be); returns the close code the server answered with.
pub fn compressed_frame(addr: SocketAddr) -> (String, Option<u16>) {
    let (mut client, status, head) = deflate_offer(addr);
    assert_eq!(status, 101, "{head}");
    // "Hello" compressed with DEFLATE (RFC 7692 §7.2.3.1).
    client.send(0xc1, &[0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00]).expect("send");
    let code = client.recv_close().expect("read the close");
    (head, code)
}

/// Raw deflate of `data` with a sync flush, the tail removed (RFC 7692 §7.2.1), at the
/// best level: 64 MiB of zeros become about 64 KB.
pub fn deflate(data: &[u8]) -> Vec<u8> {
    use flate2::{Compress, Compression, FlushCompress};
    let mut z = Compress::new(Compression::best(), false);
    let mut out = Vec::with_capacity(data.len() / 500 + 1024);
    loop {
        let at = usize::try_from(z.total_in()).unwrap_or(usize::MAX);
        z.compress_vec(&data[at..], &mut out, FlushCompress::Sync).expect("deflate");
        if usize::try_from(z.total_in()).ok() == Some(data.len()) && out.len() < out.capacity() {
            break;
        }
        out.reserve(out.capacity());
    }
    out.truncate(out.len().saturating_sub(4));
    out
}

/// After a `permessage-deflate` offer the server accepted, sends `bomb` (a compressed
/// message) in `fragments` frames; returns the close code the server answered with.
pub fn deflate_bomb(addr: SocketAddr, bomb: &[u8], fragments: usize) -> Option<u16> {
    let (mut client, status, head) = deflate_offer(addr);
    assert_eq!(status, 101, "{head}");
    assert!(head.contains("permessage-deflate"), "{head}");
    let pieces: Vec<&[u8]> = bomb.chunks(bomb.len().div_ceil(fragments.max(1))).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let first = match (i == 0, i + 1 == pieces.len()) {
            (true, true) => 0xc2,
            (true, false) => 0x42,
            (false, true) => 0x80,
            (false, false) => 0x00,
        };
        // The server may close before the last piece: stop writing then.
        if client.send(first, piece).is_err() {
            break;
        }
    }
    client.recv_close().ok().flatten()
}
