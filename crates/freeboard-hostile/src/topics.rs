//! Topic abuse: subscriptions by the ten thousand, and subscribers that never read under a
//! flood of large publications.
//!
//! - [`subscribe_many`] opens connections that each subscribe to many distinct topics (the
//!   `also=` list of a `/topic/` upgrade), from several loopback source addresses so that the
//!   ephemeral ports of one do not run out.
//! - [`Publisher`] publishes over one kept-alive HTTP connection and reads each answer.
//! - [`drain`] reads what a subscriber was sent until the server has nothing more for it,
//!   then closes.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::time::Duration;

use crate::ws::{WsClient, upgrade_request};

/// What one upgrade got.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Subscribed {
    /// Connections answered 101 and still open once every topic was subscribed.
    pub open: usize,
    /// Connections refused with 503 at the upgrade.
    pub refused_503: usize,
    /// Connections answered 101 and then closed (the close code of the last one).
    pub closed: usize,
    /// The close code the server closed the last such connection with.
    pub close_code: Option<u16>,
    /// Any other answer (status), or an error.
    pub other: usize,
}

/// Opens `connections` connections to `/topic/`, each subscribing to `per_connection`
/// distinct topics (`{prefix}{n}`, numbered across all of them), from source addresses
/// 127.0.0.1, 127.0.0.2, … (`sources` of them, round robin). Returns the open clients and
/// what the upgrades got. A connection the server closes after its 101 is read to its close
/// frame (the close code is kept) and dropped.
pub fn subscribe_many(
    addr: SocketAddr,
    prefix: &str,
    connections: usize,
    per_connection: usize,
    sources: u8,
) -> (Vec<WsClient>, Subscribed) {
    let mut clients = Vec::with_capacity(connections);
    let mut got = Subscribed::default();
    for c in 0..connections {
        let first = c * per_connection;
        let mut target = format!("/topic/{prefix}{first}");
        for n in first + 1..first + per_connection {
            target.push_str(if n == first + 1 { "?also=" } else { "&also=" });
            target.push_str(&format!("{prefix}{n}"));
        }
        let source = Ipv4Addr::new(127, 0, 0, 1 + (c % usize::from(sources.max(1))) as u8);
        let answer = connect_from(source, addr).and_then(|stream| {
            let mut client = WsClient::raw(stream);
            client.send_raw(upgrade_request(&target, "").as_bytes())?;
            let head = client.read_head()?;
            Ok((client, head.get(9..12).and_then(|s| s.parse::<u16>().ok()).unwrap_or(0)))
        });
        match answer {
            Ok((client, 101)) => clients.push(client),
            Ok((_, 503)) => got.refused_503 += 1,
            _ => got.other += 1,
        }
    }
    // A subscription refused after the 101 closes its connection: find those (the server's
    // close frame is waiting), keep the others.
    let mut open = Vec::with_capacity(clients.len());
    for mut client in clients {
        client.stream.set_nonblocking(true).expect("nonblocking");
        let mut byte = [0u8; 1];
        let pending = matches!(client.stream.peek(&mut byte), Ok(n) if n > 0);
        client.stream.set_nonblocking(false).expect("blocking");
        if pending {
            got.closed += 1;
            got.close_code = client.recv_close().ok().flatten().or(got.close_code);
        } else {
            open.push(client);
        }
    }
    got.open = open.len();
    (open, got)
}

/// A TCP connection to `to` from address `from` (any port).
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> io::Result<TcpStream> {
    let socket = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.bind(&SocketAddr::V4(SocketAddrV4::new(from, 0)).into())?;
    socket.connect(&to.into())?;
    Ok(socket.into())
}

/// A kept-alive HTTP connection that publishes with `POST /topic/{name}`.
pub struct Publisher {
    stream: TcpStream,
    /// Bytes read past the last answer.
    buffered: Vec<u8>,
}

/// The answer to one publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body (the JSON counts of a 200).
    pub body: String,
}

impl Answer {
    /// A number field of the JSON body (`"delivered"`, `"dropped"`), 0 if absent.
    pub fn field(&self, name: &str) -> u64 {
        let key = format!("\"{name}\":");
        self.body
            .split_once(&key)
            .map(|(_, rest)| rest.chars().take_while(char::is_ascii_digit).collect::<String>())
            .and_then(|digits| digits.parse().ok())
            .unwrap_or(0)
    }
}

impl Publisher {
    /// Connects to `addr`.
    pub fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        stream.set_nodelay(true)?;
        Ok(Self { stream, buffered: Vec::new() })
    }

    /// Publishes `body` (binary) to `topic` and reads the answer.
    pub fn publish(&mut self, topic: &str, body: &[u8]) -> io::Result<Answer> {
        let head = format!(
            "POST /topic/{topic} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        );
        self.stream.write_all(head.as_bytes())?;
        self.stream.write_all(body)?;
        let end = loop {
            if let Some(end) = self.buffered.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            self.fill()?;
        };
        let head = String::from_utf8_lossy(&self.buffered[..end]).into_owned();
        let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        let length = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        while self.buffered.len() < end + length {
            self.fill()?;
        }
        let body = String::from_utf8_lossy(&self.buffered[end..end + length]).into_owned();
        self.buffered.drain(..end + length);
        Ok(Answer { status, body })
    }

    fn fill(&mut self) -> io::Result<()> {
        let mut buf = [0u8; 4096];
        match self.stream.read(&mut buf)? {
            0 => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed")),
            n => {
                self.buffered.extend_from_slice(&buf[..n]);
                Ok(())
            }
        }
    }
}

/// What a subscriber got when it finally read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Drained {
    /// The first 8 bytes (little-endian) of each data message received, in order.
    pub sequence: Vec<u64>,
    /// The close code the server sent, if it closed first (a slow consumer closed 1008).
    pub closed_by_server: Option<u16>,
    /// The code the server answered this client's close with.
    pub close_answer: Option<u16>,
}

/// Reads everything `client` was sent until nothing more arrives for `quiet`, then closes
/// with 1000 (unless the server closed first) and reads to EOF.
pub fn drain(mut client: WsClient, quiet: Duration) -> io::Result<Drained> {
    let mut drained = Drained::default();
    client.stream.set_read_timeout(Some(quiet))?;
    loop {
        match client.recv() {
            Ok(Some(frame)) if frame.opcode == 0x8 => {
                drained.closed_by_server = Some(frame.close_code());
                // Answer the close and wait for the end of the connection.
                let _ = client.send(0x88, &frame.payload[..frame.payload.len().min(2)]);
                client.stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                client.sees_eof();
                return Ok(drained);
            }
            Ok(Some(frame)) => {
                let mut seq = [0u8; 8];
                let n = frame.payload.len().min(8);
                seq[..n].copy_from_slice(&frame.payload[..n]);
                drained.sequence.push(u64::from_le_bytes(seq));
            }
            Ok(None) => return Ok(drained),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                break;
            }
            Err(e) => return Err(e),
        }
    }
    client.stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    client.send(0x88, &1000u16.to_be_bytes())?;
    loop {
        match client.recv()? {
            Some(frame) if frame.opcode == 0x8 => {
                drained.close_answer = Some(frame.close_code());
                break;
            }
            // Whatever was still on its way when the close was sent.
            Some(frame) => {
                let mut seq = [0u8; 8];
                let n = frame.payload.len().min(8);
                seq[..n].copy_from_slice(&frame.payload[..n]);
                drained.sequence.push(u64::from_le_bytes(seq));
            }
            None => break,
        }
    }
    client.sees_eof();
    Ok(drained)
}
