//! A blocking WebSocket client that sends raw frames (correct or not) and reads what comes
//! back, frame by frame.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The `Sec-WebSocket-Key` every request carries (the RFC's sample nonce).
const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// An upgrade request for `path` with `extra` header lines (each ending in `\r\n`).
pub fn upgrade_request(path: &str, extra: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
}

/// One frame as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The FIN bit.
    pub fin: bool,
    /// The opcode (`0x1` text, `0x2` binary, `0x8` close, `0x9` ping, `0xA` pong).
    pub opcode: u8,
    /// The (unmasked) payload.
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

/// A client connection: the stream and the bytes read past the last frame.
pub struct WsClient {
    /// The socket.
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl WsClient {
    /// Connects and sends `request`; returns the client, the response status and head.
    pub fn handshake(addr: SocketAddr, request: &str) -> io::Result<(Self, u16, String)> {
        let stream = TcpStream::connect(addr)?;
        let mut client = Self::raw(stream);
        client.stream.write_all(request.as_bytes())?;
        let head = client.read_head()?;
        let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        Ok((client, status, head))
    }

    /// Connects and asks to upgrade `/echo`, waiting up to `wait` for the answer: the client
    /// and the status, or `None` if no answer came in time (the request stays pending; see
    /// [`await_status`](Self::await_status)).
    pub fn open_within(addr: SocketAddr, wait: Duration) -> io::Result<(Self, Option<u16>)> {
        let mut client = Self::raw(TcpStream::connect(addr)?);
        client.stream.write_all(upgrade_request("/echo", "").as_bytes())?;
        let status = client.await_status(wait)?;
        Ok((client, status))
    }

    /// Waits up to `wait` for a response head; its status, or `None` if none came in time.
    pub fn await_status(&mut self, wait: Duration) -> io::Result<Option<u16>> {
        self.stream.set_read_timeout(Some(wait))?;
        let head = self.read_head();
        self.stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        match head {
            Ok(head) => Ok(head.get(9..12).and_then(|s| s.parse().ok())),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Sends one binary message and checks that its echo comes back intact.
    pub fn echo(&mut self, payload: &[u8]) -> bool {
        self.send(0x82, payload).is_ok()
            && matches!(self.recv(), Ok(Some(f)) if f.opcode == 0x2 && f.payload == payload)
    }

    /// Connects to `/echo` and upgrades; panics unless the answer is 101.
    pub fn open(addr: SocketAddr) -> Self {
        let (client, status, head) =
            Self::handshake(addr, &upgrade_request("/echo", "")).expect("upgrade");
        assert_eq!(status, 101, "{head}");
        client
    }

    /// A client over `stream`, before or without a handshake (reads time out after 10 s).
    pub fn raw(stream: TcpStream) -> Self {
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("set timeout");
        let _ = stream.set_nodelay(true);
        Self { stream, buf: Vec::new() }
    }

    /// A second handle on the connection, to read on another thread while this one writes.
    /// It takes the bytes already read past the last frame, so only it may read from now on.
    pub fn reader(&mut self) -> io::Result<Self> {
        Ok(Self { stream: self.stream.try_clone()?, buf: std::mem::take(&mut self.buf) })
    }

    /// Reads an HTTP response head.
    pub fn read_head(&mut self) -> io::Result<String> {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end + 4]).into_owned();
                self.buf.drain(..end + 4);
                return Ok(head);
            }
            if !self.fill(self.buf.len() + 1)? {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no response head"));
            }
        }
    }

    /// Sends one frame with `first_byte` (FIN, RSV, opcode), masked with the test mask.
    pub fn send(&mut self, first_byte: u8, payload: &[u8]) -> io::Result<()> {
        let frame = freeboard_test::frame(first_byte, payload, freeboard_test::TEST_MASK);
        self.stream.write_all(&frame)
    }

    /// Sends bytes as they are.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads until `buf` holds `n` bytes; `false` at EOF (or reset).
    fn fill(&mut self, n: usize) -> io::Result<bool> {
        let mut chunk = [0u8; 65536];
        while self.buf.len() < n {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads one frame; `None` at EOF. A read timeout is an error.
    pub fn recv(&mut self) -> io::Result<Option<Frame>> {
        if !self.fill(2)? {
            return Ok(None);
        }
        let (len, at) = match self.buf[1] & 0x7f {
            126 => {
                if !self.fill(4)? {
                    return Ok(None);
                }
                (u64::from(u16::from_be_bytes([self.buf[2], self.buf[3]])), 4)
            }
            127 => {
                if !self.fill(10)? {
                    return Ok(None);
                }
                let mut len = [0u8; 8];
                len.copy_from_slice(&self.buf[2..10]);
                (u64::from_be_bytes(len), 10)
            }
            n => (u64::from(n), 2),
        };
        let end = at + usize::try_from(len).map_err(io::Error::other)?;
        if !self.fill(end)? {
            return Ok(None);
        }
        let frame = Frame {
            fin: self.buf[0] & 0x80 != 0,
            opcode: self.buf[0] & 0x0f,
            payload: self.buf[at..end].to_vec(),
        };
        self.buf.drain(..end);
        Ok(Some(frame))
    }

    /// Reads frames until a close frame and returns its code; `None` if the stream ended
    /// first.
    pub fn recv_close(&mut self) -> io::Result<Option<u16>> {
        while let Some(frame) = self.recv()? {
            if frame.opcode == 0x8 {
                return Ok(Some(frame.close_code()));
            }
        }
        Ok(None)
    }

    /// Reads and discards until the server ends the TCP connection; `true` if it did (EOF or
    /// reset) before the read timeout.
    pub fn sees_eof(&mut self) -> bool {
        self.buf.clear();
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Sends a close frame with `code`, reads to the server's close and its EOF; returns the
    /// code the server answered with.
    pub fn close(mut self, code: u16) -> io::Result<Option<u16>> {
        self.send(0x88, &code.to_be_bytes())?;
        let answer = self.recv_close()?;
        self.sees_eof();
        Ok(answer)
    }
}
