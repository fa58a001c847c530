//! A single-threaded epoll TCP echo: reads what arrives, writes it back. What the socket does
//! not take is kept and reading from that connection stops until it drains.

use std::io::{self, Read, Write};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

const LISTENER: Token = Token(usize::MAX);

struct Conn {
    stream: TcpStream,
    pending: Vec<u8>,
}

fn main() -> io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9002".into());
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
                    entry.insert(Conn { stream, pending: Vec::new() });
                }
                continue;
            }
            let key = event.token().0;
            let Some(conn) = conns.get_mut(key) else { continue };
            if serve(conn, &mut buf).is_err() {
                let mut conn = conns.remove(key);
                let _ = poll.registry().deregister(&mut conn.stream);
            }
        }
    }
}

/// Flushes what is pending, then echoes until the socket has nothing more or takes no more.
/// An error ends the connection.
fn serve(conn: &mut Conn, buf: &mut [u8]) -> io::Result<()> {
    if !conn.pending.is_empty() {
        let n = write_some(&mut conn.stream, &conn.pending)?;
        conn.pending.drain(..n);
        if !conn.pending.is_empty() {
            return Ok(());
        }
    }
    loop {
        let n = match conn.stream.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let written = write_some(&mut conn.stream, &buf[..n])?;
        if written < n {
            conn.pending.extend_from_slice(&buf[written..n]);
            return Ok(());
        }
    }
}

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
