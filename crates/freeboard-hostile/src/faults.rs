//! Transport faults: a peer that resets mid-frame, half-closes, stops reading, reads one
//! byte at a time through a tiny receive buffer, or writes one byte at a time.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use socket2::{Domain, SockRef, Socket, Type};

use freeboard_test::Inbox;

use crate::ws::{Frame, WsClient, upgrade_request};

/// Sends the first half of a 64 KiB binary frame, waits for the server to hold it, then
/// resets the connection (`SO_LINGER` 0, close).
pub fn reset_mid_frame(addr: SocketAddr) {
    let mut client = WsClient::open(addr);
    let frame = freeboard_test::frame(0x82, &[7u8; 64 << 10], freeboard_test::TEST_MASK);
    client.send_raw(&frame[..frame.len() / 2]).expect("send half a frame");
    std::thread::sleep(Duration::from_millis(20));
    SockRef::from(&client.stream).set_linger(Some(Duration::ZERO)).expect("SO_LINGER 0");
    drop(client);
}

/// Sends `messages`, then shuts down its write side; returns what came back before the
/// server's EOF (it owes every echo) and whether the EOF came. It reads while it writes: a
/// client that writes megabytes before it reads waits once the server stops reading it (its
/// queue above the high watermark) and the kernel's buffers between them are full.
pub fn half_close(addr: SocketAddr, messages: &[Vec<u8>]) -> (Vec<Frame>, bool) {
    let mut writer = WsClient::open(addr);
    let mut reader = writer.reader().expect("a reading handle");
    let messages = messages.to_vec();
    let writing = std::thread::spawn(move || {
        for m in &messages {
            writer.send(0x82, m).expect("send");
        }
        writer.stream.shutdown(Shutdown::Write).expect("shutdown(Write)");
    });
    let mut frames = Vec::new();
    let eof = loop {
        match reader.recv() {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => break true,
            Err(_) => break false,
        }
    };
    writing.join().expect("the writer");
    (frames, eof)
}

/// Numbered binary messages of `size` bytes: message `i` is `i` (8 bytes) then a pattern.
pub fn numbered(count: usize, size: usize) -> Vec<Vec<u8>> {
    (0..count).map(|i| message(i, size)).collect()
}

/// Message `i` of [`numbered`].
fn message(i: usize, size: usize) -> Vec<u8> {
    let mut m = (i as u64).to_le_bytes().to_vec();
    m.extend((8..size.max(8)).map(|j| (j * 7 + i * 13) as u8));
    m
}

/// What a peer that stopped reading saw.
#[derive(Debug)]
pub struct StallOutcome {
    /// Messages written before a write blocked for a second (the server stopped reading).
    pub written: usize,
    /// Echoes read afterwards, in order.
    pub echoes: Vec<Frame>,
}

/// Writes numbered `size`-byte messages (up to `max`) without reading until a write blocks
/// for a second; calls `stalled` then (to look at the server while it holds back), and reads
/// every echo owed (skipping the server's keep-alive pings).
pub fn stop_reading(
    addr: SocketAddr,
    size: usize,
    max: usize,
    stalled: impl FnOnce(usize),
) -> StallOutcome {
    let mut client = WsClient::open(addr);
    client.stream.set_write_timeout(Some(Duration::from_secs(1))).expect("timeout");
    let mut written = 0;
    let mut pending: Option<Vec<u8>> = None;
    for i in 0..max {
        let frame = freeboard_test::frame(0x82, &message(i, size), freeboard_test::TEST_MASK);
        let mut at = 0;
        while at < frame.len() {
            match client.stream.write(&frame[at..]) {
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
                {
                    pending = Some(frame[at..].to_vec());
                    break;
                }
                Err(e) => panic!("write: {e}"),
            }
        }
        written += 1;
        if pending.is_some() {
            break;
        }
    }
    stalled(written);
    client.stream.set_write_timeout(None).expect("timeout");
    let mut writer = client.stream.try_clone().expect("clone");
    let rest = std::thread::spawn(move || pending.map_or(Ok(()), |p| writer.write_all(&p)));
    let mut echoes = Vec::with_capacity(written);
    while echoes.len() < written {
        match client.recv() {
            Ok(Some(frame)) if frame.opcode == 0x9 => {}
            Ok(Some(frame)) => echoes.push(frame),
            _ => break,
        }
    }
    rest.join().expect("writer").expect("finish the last frame");
    let _ = client.close(1000);
    StallOutcome { written, echoes }
}

/// A client whose receive buffer is as small as the kernel allows, reading one byte per
/// `read`: `messages` are sent (from another thread) and the echoes collected.
pub fn tiny_reader(addr: SocketAddr, messages: Vec<Vec<u8>>) -> Vec<Frame> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF"); // the kernel doubles it
    socket.connect(&addr.into()).expect("connect");
    let mut stream: std::net::TcpStream = socket.into();
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    stream.write_all(upgrade_request("/echo", "").as_bytes()).expect("request");
    let mut inbox = Inbox::default();
    let mut one_byte = OneByte(stream);
    let head = inbox.head(&mut one_byte).expect("head").expect("a response head");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let count = messages.len();
    let mut writer = one_byte.0.try_clone().expect("clone");
    let sender = std::thread::spawn(move || {
        for m in &messages {
            writer.write_all(&freeboard_test::frame(0x82, m, freeboard_test::TEST_MASK))?;
        }
        io::Result::Ok(())
    });
    let mut frames = Vec::with_capacity(count);
    while frames.len() < count {
        frames.push(inbox.frame(&mut one_byte).expect("a frame").expect("a frame before EOF"));
    }
    sender.join().expect("sender").expect("send");
    frames
}

/// A reader that asks the socket for one byte per `read`.
struct OneByte(std::net::TcpStream);

impl Read for OneByte {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(1);
        self.0.read(&mut buf[..n])
    }
}

/// Sends one message (`first_byte`: FIN and opcode) with one `write` per byte
/// (`TCP_NODELAY`, so the server reads it in small pieces); returns the echo.
pub fn dribble(addr: SocketAddr, first_byte: u8, message: &[u8]) -> Option<Frame> {
    let mut client = WsClient::open(addr);
    let frame = freeboard_test::frame(first_byte, message, freeboard_test::TEST_MASK);
    for (i, byte) in frame.iter().enumerate() {
        client.stream.write_all(std::slice::from_ref(byte)).expect("write one byte");
        if i % 1024 == 0 {
            std::thread::sleep(Duration::from_millis(1)); // let the server read what is there
        }
    }
    client.recv().expect("read the echo")
}
