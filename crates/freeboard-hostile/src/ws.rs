//! A blocking WebSocket client that sends raw frames (correct or not) and reads what comes
//! back, frame by frame.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub use freeboard_test::{Frame, upgrade_request};
use freeboard_test::{Inbox, TEST_MASK};

/// A client connection: the stream and the bytes read past the last frame.
pub struct WsClient {
    /// The socket.
    pub stream: TcpStream,
    inbox: Inbox,
}

impl WsClient {
    /// Connects and sends `request`; returns the client, the response status and head.
    pub fn handshake(addr: SocketAddr, request: &str) -> io::Result<(Self, u16, String)> {
        Self::handshake_over(TcpStream::connect(addr)?, request)
    }

    /// [`handshake`](Self::handshake) over a stream already connected.
    pub fn handshake_over(stream: TcpStream, request: &str) -> io::Result<(Self, u16, String)> {
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
        Self { stream, inbox: Inbox::default() }
    }

    /// A second handle on the connection, to read on another thread while this one writes.
    /// It takes the bytes already read past the last frame, so only it may read from now on.
    pub fn reader(&mut self) -> io::Result<Self> {
        Ok(Self { stream: self.stream.try_clone()?, inbox: std::mem::take(&mut self.inbox) })
    }

    /// Reads an HTTP response head.
    pub fn read_head(&mut self) -> io::Result<String> {
        self.inbox
            .head(&mut self.stream)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "no response head"))
    }

    /// Sends one frame with `first_byte` (FIN, RSV, opcode), masked with the test mask.
    pub fn send(&mut self, first_byte: u8, payload: &[u8]) -> io::Result<()> {
        let frame = freeboard_test::frame(first_byte, payload, TEST_MASK);
        self.stream.write_all(&frame)
    }

    /// Sends bytes as they are.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Reads one frame; `None` at EOF. A read timeout is an error.
    pub fn recv(&mut self) -> io::Result<Option<Frame>> {
        self.inbox.frame(&mut self.stream)
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
        self.inbox.sees_eof(&mut self.stream)
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
