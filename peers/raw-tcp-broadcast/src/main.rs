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
            for key in serve(&mut conns, event.token().0, &mut buf) {
                if conns.contains(key) {
                    let mut conn = conns.remove(key);
                    let _ = poll.registry().deregister(&mut conn.stream);
                }
            }
        }
    }
}

/// Flushes what `key` has pending, then reads it dry and fans out what it sent. Returns the
/// connections that failed.
fn serve(conns: &mut Slab<Conn>, key: usize, buf: &mut [u8]) -> Vec<usize> {
    let mut dead = Vec::new();
    while let Some(conn) = conns.get_mut(key) {
        if send(conn, &[]).is_err() {
            dead.push(key);
            break;
        }
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
            if send(conn, &data[..1]).is_err() {
                dead.push(key);
                break;
            }
            data = &data[1..];
        }
        if data.is_empty() {
            continue;
        }
        for (other, conn) in conns.iter_mut() {
            if other != key && conn.greeted && send(conn, data).is_err() {
                dead.push(other);
            }
        }
    }
    dead
}

/// Writes what `conn` has pending, then `data` straight from the caller's buffer; what the
/// socket does not take is kept for when it drains.
fn send(conn: &mut Conn, data: &[u8]) -> io::Result<()> {
    let taken = write_some(&mut conn.stream, &conn.pending)?;
    conn.pending.drain(..taken);
    if !conn.pending.is_empty() {
        conn.pending.extend_from_slice(data);
        return Ok(());
    }
    let taken = write_some(&mut conn.stream, data)?;
    conn.pending.extend_from_slice(&data[taken..]);
    Ok(())
}

/// Writes until the socket takes no more; returns how much it took.
fn write_some(stream: &mut TcpStream, data: &[u8]) -> io::Result<usize> {
    let mut at = 0;
    while at < data.len() {
        match stream.write(&data[at..]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(at)
}
