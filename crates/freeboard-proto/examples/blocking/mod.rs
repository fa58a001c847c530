//! A blocking driver over the sans-IO core: one thread, one `std::net::TcpStream`, no runtime.
//! This is how a user with blocking sockets (an RTOS, a script) runs `freeboard-proto`.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant as StdInstant};

use freeboard_proto::{Connection, Event, Instant, MessageKind, OpCode, Role, State};

/// Drives one connection after its opening handshake.
pub(crate) struct Driver {
    stream: TcpStream,
    conn: Connection,
    start: StdInstant,
}

impl Driver {
    pub(crate) fn new(stream: TcpStream, conn: Connection) -> Self {
        Self { stream, conn, start: StdInstant::now() }
    }

    fn now(&self) -> Instant {
        Instant::from_millis(self.start.elapsed().as_millis() as u64)
    }

    /// Echoes every message back — text as text, binary as binary — until the connection
    /// closes. `first` holds bytes that arrived with the handshake.
    pub(crate) fn echo(mut self, first: &mut [u8]) -> io::Result<()> {
        let mut message = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        self.receive(first, &mut message)?;
        while self.conn.state() != State::Closed {
            self.flush_control()?;
            let timeout = self.conn.poll_timeout().map(|at| {
                Duration::from_millis(at.as_millis().saturating_sub(self.now().as_millis()).max(1))
            });
            self.stream.set_read_timeout(timeout)?;
            match self.stream.read(&mut buf) {
                Ok(0) => self.conn.handle_eof(),
                Ok(n) => self.receive(&mut buf[..n], &mut message)?,
                Err(e)
                    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
                {
                    self.conn.handle_timeout(self.now());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.conn.handle_eof(),
            }
        }
        self.flush_control()?;
        self.linger()
    }

    /// Feeds one read to the core, echoing each message as it completes.
    fn receive(&mut self, data: &mut [u8], message: &mut Vec<u8>) -> io::Result<()> {
        let mut at = 0;
        while at < data.len() {
            let now = self.now();
            let Ok(input) = self.conn.handle_input(now, &mut data[at..]) else {
                return Ok(()); // the core queued the close frame for the error
            };
            at += input.consumed;
            if let Some(piece) = input.payload {
                message.extend_from_slice(piece.data);
                if piece.message_fin {
                    self.send(piece.kind, message)?;
                    message.clear();
                }
            }
            // Answer each ping before reading the next frame: the core owes one pong at a time.
            self.flush_control()?;
            while let Some(event) = self.conn.poll_event() {
                if let Event::Closed { .. } = event {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    fn send(&mut self, kind: MessageKind, payload: &mut [u8]) -> io::Result<()> {
        let opcode = if kind == MessageKind::Text { OpCode::Text } else { OpCode::Binary };
        let mask = self.mask();
        let mut header = [0u8; 14];
        let n = self
            .conn
            .send_header(opcode, true, payload.len() as u64, mask, &mut header)
            .map_err(io::Error::other)?;
        if let Some(key) = mask {
            freeboard_proto::mask::apply_mask(payload, key, 0);
        }
        self.stream.write_all(&header[..n])?;
        self.stream.write_all(payload)
    }

    fn flush_control(&mut self) -> io::Result<()> {
        let mut out = [0u8; 131];
        while let Some(n) =
            self.conn.poll_transmit(self.mask(), &mut out).map_err(io::Error::other)?
        {
            self.stream.write_all(&out[..n])?;
        }
        Ok(())
    }

    /// After the close handshake: the server closes the TCP connection first (§7.1.1); the
    /// client waits briefly for it. Reading until EOF keeps unread bytes from turning the
    /// close into a reset that could destroy our close frame.
    fn linger(mut self) -> io::Result<()> {
        if self.conn.role() == Role::Server {
            let _ = self.stream.shutdown(Shutdown::Write);
        }
        self.stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut sink = [0u8; 4096];
        while matches!(self.stream.read(&mut sink), Ok(n) if n > 0) {}
        Ok(())
    }

    /// A fresh random masking key for a client, none for a server.
    fn mask(&self) -> Option<[u8; 4]> {
        (self.conn.role() == Role::Client).then(random_key)
    }
}

/// Four unpredictable bytes from the operating system (§5.3, §10.3).
pub(crate) fn random_key() -> [u8; 4] {
    let mut key = [0u8; 4];
    getrandom::fill(&mut key).expect("the OS random source is available");
    key
}
