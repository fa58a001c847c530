//! The transport seam: the layer a session's bytes cross between the session and the socket.
//!
//! The event loop reads into its buffer from a [`Transport`] and writes the session's queued
//! slices to it; it never touches a `TcpStream` directly. Plain TCP is the identity layer and
//! costs nothing (the queue's chunks still leave in one `writev`); a TLS record layer or a
//! compressor implements the same trait in its own module, without touching the loop.

use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;

use mio::net::TcpStream;

/// A byte stream under a session, registered with the loop's `Poll`.
pub(crate) trait Transport: mio::event::Source {
    /// Wraps a freshly accepted socket.
    fn accepted(stream: TcpStream) -> Self;

    /// Reads decoded bytes into `buf`; `Ok(0)` is the end of the stream.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;

    /// Writes `bufs` in order, as far as the layer takes them now.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize>;

    /// Ends our sending side (our FIN, after any bytes the layer still holds).
    fn shutdown_write(&mut self) -> io::Result<()>;
}

impl Transport for TcpStream {
    fn accepted(stream: TcpStream) -> Self {
        let _ = stream.set_nodelay(true);
        stream
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Read::read(self, buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Write::write_vectored(self, bufs)
    }

    fn shutdown_write(&mut self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}
