//! A single-threaded epoll TCP fan-out: the first byte of each connection is echoed (the raw
//! handshake of `freeboard bench`), and every byte read after it is written verbatim to every
//! other connection. No WebSocket work at all, one write per subscriber per read: the physical
//! limit of a broadcast on this kernel and loopback. What a socket does not take is kept (the
//! load generator reads everything) and written when it drains.

use std::io::{self, Read, Write};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

const LISTENER: Token = Token(usize::MAX);

struct Conn {
    stream: TcpStream,
    /// Whether its first byte has been echoed.
    greeted: bool,
    pending: Vec<u8>,
}

fn main() -> io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9003".into());
    let mut listener = TcpListener::bind(addr.parse().map_err(io::Error::other)?)?;
    let mut poll = Poll::new()?;
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut conns: Slab<Conn> = Slab::new();
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        poll.poll(&mut events, None)?;
        for event in events.iter() {
            if event.token() == LISTENER {
                while let Ok((mut stream, _)) = listener.accept() {
                    stream.set_nodelay(true)?;
                    let entry = conns.vacant_entry();
                    poll.registry().register(
                        &mut stream,
                        Token(entry.key()),
                        Interest::READABLE | Interest::WRITABLE,
                    )?;
                    entry.insert(Conn { stream, greeted: false, pending: Vec::new() });
                }
                continue;
            }
            let key = event.token().0;
            if let Err(dead) = serve(&mut conns, key, &mut buf) {
                for key in dead {
                    if conns.contains(key) {
                        let mut conn = conns.remove(key);
                        let _ = poll.registry().deregister(&mut conn.stream);
                    }
                }
            }
        }
    }
}

/// Flushes what `key` has pending, then reads it dry and fans out what it sent. Returns the
/// connections that failed.
fn serve(conns: &mut Slab<Conn>, key: usize, buf: &mut [u8]) -> Result<(), Vec<usize>> {
    let mut dead = Vec::new();
    let Some(conn) = conns.get_mut(key) else { return Ok(()) };
    if flush(conn).is_err() {
        return Err(vec![key]);
    }
    loop {
        let Some(conn) = conns.get_mut(key) else { break };
        let n = match conn.stream.read(buf) {
            Ok(0) => {
                dead.push(key);
                break;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                dead.push(key);
                break;
            }
        };
        let mut data = &buf[..n];
        if !conn.greeted {
            conn.greeted = true;
            conn.pending.push(data[0]);
            data = &data[1..];
            if flush(conn).is_err() {
                dead.push(key);
                break;
            }
        }
        for (other, conn) in conns.iter_mut() {
            if other == key || !conn.greeted || data.is_empty() {
                continue;
            }
            conn.pending.extend_from_slice(data);
            if flush(conn).is_err() {
                dead.push(other);
            }
        }
    }
    if dead.is_empty() { Ok(()) } else { Err(dead) }
}

/// Writes what `conn` has pending until the socket takes no more.
fn flush(conn: &mut Conn) -> io::Result<()> {
    let mut at = 0;
    while at < conn.pending.len() {
        match conn.stream.write(&conn.pending[at..]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    conn.pending.drain(..at);
    Ok(())
}
