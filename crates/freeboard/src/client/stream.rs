//! A client's socket: plain TCP, or TLS over it (the `tls` feature).

use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;

use mio::net::TcpStream;
#[cfg(feature = "tls")]
use rustls::ClientConnection;

use super::tls::Connection;

/// A client's socket: plain TCP, or TLS over it (a `tls_connection`, with the `tls` feature),
/// blocking or not as the socket is, and a mio event source.
///
/// `Read` returns decrypted bytes (`Ok(0)` at the server's close_notify); a TLS error is an
/// `InvalidData` error carrying the `rustls::Error`. `Write` encrypts what rustls' send
/// buffer (64 KiB) takes and writes records until the socket is full; what stays is written
/// first by the next write, or by [`flush_tls`](Self::flush_tls) when the socket is
/// writable again ([`wants_write`](Self::wants_write) says whether anything stays).
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientStream {
    /// Plain TCP (`ws://`).
    Plain(TcpStream),
    /// TLS over TCP (`wss://`).
    #[cfg(feature = "tls")]
    Tls(Box<(TcpStream, ClientConnection)>),
}

impl ClientStream {
    /// The socket, through TLS if `tls` is given.
    pub(super) fn new(tcp: TcpStream, tls: Option<Connection>) -> Self {
        match tls {
            None => Self::Plain(tcp),
            #[cfg(feature = "tls")]
            Some(conn) => Self::Tls(Box::new((tcp, conn))),
            #[cfg(not(feature = "tls"))]
            Some(conn) => conn.absurd(),
        }
    }

    /// The socket.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(tcp) => tcp,
            #[cfg(feature = "tls")]
            Self::Tls(tls) => &tls.0,
        }
    }

    /// Whether TLS records wait to be written.
    pub fn wants_write(&self) -> bool {
        match self {
            Self::Plain(_) => false,
            #[cfg(feature = "tls")]
            Self::Tls(tls) => tls.1.wants_write(),
        }
    }

    /// Writes the TLS records that wait; `WouldBlock` if the socket is full.
    pub fn flush_tls(&mut self) -> io::Result<()> {
        match self {
            Self::Plain(_) => Ok(()),
            #[cfg(feature = "tls")]
            Self::Tls(tls) => super::tls::flush(tls),
        }
    }

    /// Shuts the socket down (after a close_notify over TLS).
    pub fn shutdown(&mut self, how: Shutdown) -> io::Result<()> {
        match self {
            Self::Plain(tcp) => tcp.shutdown(how),
            #[cfg(feature = "tls")]
            Self::Tls(tls) => {
                tls.1.send_close_notify();
                let _ = super::tls::flush(tls);
                tls.0.shutdown(how)
            }
        }
    }

    fn tcp_mut(&mut self) -> &mut TcpStream {
        match self {
            Self::Plain(tcp) => tcp,
            #[cfg(feature = "tls")]
            Self::Tls(tls) => &mut tls.0,
        }
    }
}

impl Read for ClientStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Plain(tcp) => tcp.read(buf),
            #[cfg(feature = "tls")]
            Self::Tls(tls) => super::tls::read(tls, buf),
        }
    }
}

impl Write for ClientStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// TLS: encrypts what rustls' send buffer (64 KiB) takes, then writes records until the
    /// socket is full; what stays is written first next time.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Self::Plain(tcp) => tcp.write_vectored(bufs),
            #[cfg(feature = "tls")]
            Self::Tls(tls) => super::tls::write_vectored(tls, bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_tls()
    }
}

crate::transport::registered_by_socket!(ClientStream, tcp_mut);
