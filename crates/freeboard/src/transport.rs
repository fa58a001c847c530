//! The transport seam: the layer a session's bytes cross between the session and the socket.
//!
//! The event loop reads into its buffer from a [`Transport`] and has it write the session's
//! queue; it touches a `TcpStream` itself only to write shared frames to an idle plain-TCP
//! subscriber ([`Transport::plain`], [`write_frames`]). Plain TCP is the identity layer and
//! costs nothing (the queue's chunks leave in one `writev` straight from the pool, or one
//! `write` when they are one slice or a few small ones, [`write_tcp`]); TLS ([`TlsStream`])
//! encrypts the queue into the loop's scratch buffer and keeps what the socket does not take
//! in pool chunks. Every call gets the loop's [`Io`] (pool, TLS scratch,
//! metrics), so a layer holds no buffer of its own while its connection is idle.
//!
//! One loop may serve both kinds at once (`--listen` beside `--listen-tls`), so the server's
//! loop holds a [`Stream`], an enum of the two: one predictable branch per system call, one
//! slab, one timer heap, and the `Entry` stays small (a TLS connection's state is boxed).

use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, Shutdown};
use std::os::fd::{AsRawFd, RawFd};

use freeboard_buf::{Frame, Pool};
use mio::net::TcpStream;

use crate::session::Session;
pub(crate) use crate::tls::Io;
use crate::tls::{ServerTls, TlsStream};

/// Slices per `writev`: 256 segments cover 1 MiB of 4 KiB chunks.
const IOV: usize = 256;
/// Slices of the first try at a `writev`, enough for a queue of a few messages (the 256-slice
/// array is built only when these do not describe the whole queue).
const SHORT_IOV: usize = 16;
/// Bytes of several segments written from one gathered buffer instead ([`write_tcp`]).
const GATHER: usize = 2048;

/// A byte stream under a session, registered with the loop's `Poll`.
pub(crate) trait Transport: mio::event::Source + Sized {
    /// Wraps a freshly accepted socket; through `tls` when it came to the TLS listener, its
    /// handshake counted against `client`'s address (`None`: a trusted proxy's connection,
    /// whose client is named later). `None` (counted) refuses it.
    fn accepted(
        stream: TcpStream,
        tls: Option<&ServerTls>,
        io: &mut Io<'_>,
        client: Option<IpAddr>,
    ) -> Option<Self>;

    /// Reads decoded bytes into `buf`; `Ok(0)` is the end of the stream.
    fn read(&mut self, io: &mut Io<'_>, buf: &mut [u8]) -> io::Result<usize>;

    /// Whether more input may be there although the last read returned less than asked
    /// (a layer that decodes reads more than it returns). The loop reads again if so.
    fn more_input(&self) -> bool {
        false
    }

    /// Whether the bytes of a read that the session did not take can be given back
    /// ([`unread`](Self::unread)): they are still in the layer's own buffers (io_uring's),
    /// not only in the loop's read buffer.
    fn keeps_unread(&self) -> bool {
        false
    }

    /// Whether [`write_queue`](Self::write_queue) only puts the queue on sends that complete
    /// later (io_uring's, at the end of the turn): what it leaves queued says nothing of the
    /// socket's room, which the send's completion tells.
    fn sends_later(&self) -> bool {
        false
    }

    /// Gives back the last `n` bytes the last [`read`](Self::read) returned: the next read
    /// returns them first, as a socket keeps what is not read. Only where
    /// [`keeps_unread`](Self::keeps_unread), after every read; `n == 0` lets the layer give
    /// back the buffers the read emptied. A layer that receives unasked takes at most `room`
    /// bytes (at least its smallest receive) before the next read.
    fn unread(&mut self, _io: &mut Io<'_>, _n: usize, _room: usize) {}

    /// Writes (one `writev`'s worth of) the session's queue and releases what was written.
    /// Returns the queue bytes written and whether the socket took all it was offered.
    fn write_queue(&mut self, session: &mut Session, io: &mut Io<'_>) -> io::Result<(usize, bool)>;

    /// Writes `bufs` in order, as far as the layer takes them now.
    fn write_vectored(&mut self, io: &mut Io<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize>;

    /// Writes what the layer itself still holds; `true` once nothing is left.
    fn write_pending(&mut self, _io: &mut Io<'_>) -> io::Result<bool> {
        Ok(true)
    }

    /// Ends our sending side (our FIN, after any bytes the layer still holds).
    fn shutdown_write(&mut self, io: &mut Io<'_>) -> io::Result<()>;

    /// Returns the layer's pool chunks; the connection goes.
    fn release(&mut self, _io: &mut Io<'_>) {}

    /// `Some(established)` for a TLS connection, `None` for plain TCP.
    fn tls_established(&self) -> Option<bool> {
        None
    }

    /// The socket itself when the layer adds nothing (plain TCP), for [`write_frames`].
    fn plain(&mut self) -> Option<&mut TcpStream>;

    /// The TCP socket under the layer, for the options and figures only the kernel has
    /// ([`kernel_memory`](crate::kernel_memory)).
    fn socket(&mut self) -> RawFd;

    /// Nothing more is read from the peer (it sent what a closed connection reads and
    /// discards): a layer that receives without being asked stops, and drops what it holds.
    fn stop_input(&mut self, _io: &mut Io<'_>) {}

    /// Whether the replies to a read are corked and written at once after it (plain TCP, on
    /// epoll or io_uring; TLS encrypts from its queue).
    fn corks(&self) -> bool {
        self.tls_established().is_none()
    }

    /// A connection accepted through the loop's ring, for slot `token` of serial `serial`
    /// (`Err`: this transport has no ring variant).
    #[cfg(target_os = "linux")]
    fn over_ring(
        stream: TcpStream,
        _ring: &std::rc::Rc<crate::uring::RingShared>,
        _token: usize,
        _serial: u64,
    ) -> Result<Self, TcpStream> {
        Err(stream)
    }

    /// The connection's ring side, if it is carried by the loop's ring.
    #[cfg(target_os = "linux")]
    fn ring_conn(&mut self) -> Option<&mut crate::uring::RingConn> {
        None
    }

    /// A stream of the HTTP/2 connection in slot `connection` (`None`: this transport has no
    /// such variant). It has no socket: the loop reads and writes it through its connection.
    fn http2_stream(_connection: usize, _id: freeboard_h2::StreamId) -> Option<Self> {
        None
    }

    /// The slot of the HTTP/2 connection carrying this stream, and the stream's id.
    fn carrier(&self) -> Option<(usize, freeboard_h2::StreamId)> {
        None
    }
}

impl Transport for TcpStream {
    fn accepted(
        stream: TcpStream,
        _tls: Option<&ServerTls>,
        _io: &mut Io<'_>,
        _client: Option<IpAddr>,
    ) -> Option<Self> {
        let _ = stream.set_nodelay(true);
        Some(stream)
    }

    fn read(&mut self, _io: &mut Io<'_>, buf: &mut [u8]) -> io::Result<usize> {
        Read::read(self, buf)
    }

    fn write_queue(&mut self, session: &mut Session, io: &mut Io<'_>) -> io::Result<(usize, bool)> {
        // Most writes carry a few segments: an array of IOV slices costs more to clear than
        // they take to write, so it is built only when the short one is not enough.
        let mut short = [IoSlice::new(&[]); SHORT_IOV];
        let n = session.io_slices(io.pool, &mut short);
        let described: usize = short[..n].iter().map(|s| s.len()).sum();
        let (written, offered) = if described == session.buffered() {
            (write_tcp(self, &short[..n], described)?, described)
        } else {
            let mut iov = [IoSlice::new(&[]); IOV];
            let n = session.io_slices(io.pool, &mut iov);
            write_slices(self, &iov[..n])?
        };
        session.consume(io.pool, written);
        Ok((written, written == offered))
    }

    fn write_vectored(&mut self, _io: &mut Io<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        write_tcp(self, bufs, bufs.iter().map(|b| b.len()).sum())
    }

    fn shutdown_write(&mut self, _io: &mut Io<'_>) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }

    fn plain(&mut self) -> Option<&mut TcpStream> {
        Some(self)
    }

    fn socket(&mut self) -> RawFd {
        self.as_raw_fd()
    }
}

/// Writes `frames` in order, straight from the pool, in one system call ([`write_tcp`]): as
/// many whole frames as one short slice array describes, frames that lie side by side in the
/// pool in one slice (a run of small publications is then one `write` of one buffer).
/// Returns the bytes the socket took.
pub(crate) fn write_frames<'f>(
    tcp: &mut TcpStream,
    pool: &Pool<'static>,
    frames: impl Iterator<Item = &'f Frame>,
) -> io::Result<usize> {
    let mut slices = [IoSlice::new(&[]); SHORT_IOV];
    let (mut n, mut total, mut last) = (0, 0, &[][..]);
    'frames: for frame in frames {
        let before = (n, last);
        for segment in frame.segments(pool) {
            if let Some(joined) = pool.join(last, segment).filter(|_| n > 0) {
                slices[n - 1] = IoSlice::new(joined);
                last = joined;
                continue;
            }
            if n == SHORT_IOV {
                // Not this frame, nor any after it.
                (n, last) = before;
                if n > 0 {
                    slices[n - 1] = IoSlice::new(last);
                }
                break 'frames;
            }
            slices[n] = IoSlice::new(segment);
            (n, last) = (n + 1, segment);
        }
        total += frame.len();
    }
    match n {
        0 => Ok(0),
        _ => write_tcp(tcp, &slices[..n], total),
    }
}

/// Writes `iov`; returns the bytes the socket took and the bytes offered.
fn write_slices(tcp: &mut TcpStream, iov: &[IoSlice<'_>]) -> io::Result<(usize, usize)> {
    let offered = iov.iter().map(|s| s.len()).sum();
    Ok((write_tcp(tcp, iov, offered)?, offered))
}

/// Writes `bufs` (`total` bytes) as far as the socket takes them now. One buffer goes with
/// `write`: a one-slice `writev` costs more system time per call (broadcast to 10,000
/// subscribers, one message at a time: 3,380–3,465 vs 3,890–3,960 ns per delivery). Several
/// small ones (a subscriber's publications of one turn) are gathered into one buffer first,
/// which the kernel also takes for less than an iovec of them (16 × 64 B publications in
/// flight: 655–680 vs 730–880 ns per delivery). Only larger ones leave as a `writev`.
fn write_tcp(tcp: &mut TcpStream, bufs: &[IoSlice<'_>], total: usize) -> io::Result<usize> {
    match bufs {
        [one] => Write::write(tcp, one),
        _ if total <= GATHER => {
            let mut flat = [0u8; GATHER];
            let mut at = 0;
            for slice in bufs {
                flat[at..at + slice.len()].copy_from_slice(slice);
                at += slice.len();
            }
            Write::write(tcp, &flat[..at])
        }
        _ => Write::write_vectored(tcp, bufs),
    }
}

/// A server connection's transport: plain TCP, TLS over TCP, plain TCP over the loop's
/// io_uring, or a stream of an HTTP/2 connection (RFC 8441) that another entry holds.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
    #[cfg(target_os = "linux")]
    Ring(Box<crate::uring::RingConn>),
    /// No socket of its own: its DATA arrives through its connection's reads, and its queue
    /// leaves as DATA frames through its connection's socket (`server/http2.rs`), so every
    /// call that would touch a socket here is a no-op.
    Http2 {
        connection: u32,
        id: freeboard_h2::StreamId,
    },
}

impl Transport for Stream {
    fn accepted(
        stream: TcpStream,
        tls: Option<&ServerTls>,
        io: &mut Io<'_>,
        client: Option<IpAddr>,
    ) -> Option<Self> {
        let _ = stream.set_nodelay(true);
        match tls {
            None => Some(Self::Plain(stream)),
            Some(config) => {
                TlsStream::accept(stream, config, io, client).map(|s| Self::Tls(Box::new(s)))
            }
        }
    }

    fn read(&mut self, io: &mut Io<'_>, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Plain(tcp) => Read::read(tcp, buf),
            Self::Tls(tls) => tls.read(io, buf),
            #[cfg(target_os = "linux")]
            Self::Ring(ring) => ring.read(io.pool, buf),
            Self::Http2 { .. } => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn more_input(&self) -> bool {
        match self {
            Self::Plain(_) => false,
            Self::Tls(tls) => tls.more_input(),
            #[cfg(target_os = "linux")]
            Self::Ring(ring) => ring.more_input(),
            Self::Http2 { .. } => false,
        }
    }

    fn keeps_unread(&self) -> bool {
        #[cfg(target_os = "linux")]
        return matches!(self, Self::Ring(_));
        #[cfg(not(target_os = "linux"))]
        false
    }

    fn sends_later(&self) -> bool {
        self.keeps_unread()
    }

    fn unread(&mut self, io: &mut Io<'_>, n: usize, room: usize) {
        #[cfg(target_os = "linux")]
        if let Self::Ring(ring) = self {
            ring.unread(io.pool, n, room);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (io, n, room);
    }

    fn write_queue(&mut self, session: &mut Session, io: &mut Io<'_>) -> io::Result<(usize, bool)> {
        match self {
            Self::Plain(tcp) => tcp.write_queue(session, io),
            Self::Tls(tls) => tls.write_queue(session, io),
            #[cfg(target_os = "linux")]
            Self::Ring(ring) => match ring.write_queue() {
                Some(written) => Ok(written),
                None => ring.tcp().write_queue(session, io),
            },
            Self::Http2 { .. } => Ok((0, false)),
        }
    }

    fn write_vectored(&mut self, io: &mut Io<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Self::Plain(tcp) => Transport::write_vectored(tcp, io, bufs),
            Self::Tls(tls) => tls.write_vectored(io, bufs),
            #[cfg(target_os = "linux")]
            // As plain TCP's, unless queued bytes wait for the ring's sends.
            Self::Ring(ring) => match ring.writes_straight() {
                Some(tcp) => Transport::write_vectored(tcp, io, bufs),
                None => Ok(0),
            },
            Self::Http2 { .. } => Ok(0),
        }
    }

    fn write_pending(&mut self, io: &mut Io<'_>) -> io::Result<bool> {
        match self {
            Self::Plain(_) => Ok(true),
            Self::Tls(tls) => tls.write_pending(io),
            #[cfg(target_os = "linux")]
            Self::Ring(ring) => Ok(!ring.sending()),
            Self::Http2 { .. } => Ok(true),
        }
    }

    fn plain(&mut self) -> Option<&mut TcpStream> {
        match self {
            Self::Plain(tcp) => Some(tcp),
            _ => None,
        }
    }

    fn socket(&mut self) -> RawFd {
        self.tcp().map_or(-1, |tcp| tcp.as_raw_fd())
    }

    fn shutdown_write(&mut self, io: &mut Io<'_>) -> io::Result<()> {
        match self {
            Self::Plain(tcp) => tcp.shutdown(Shutdown::Write),
            Self::Tls(tls) => tls.shutdown_write(io),
            #[cfg(target_os = "linux")]
            Self::Ring(ring) => ring.shutdown_write(),
            Self::Http2 { .. } => Ok(()),
        }
    }

    fn release(&mut self, io: &mut Io<'_>) {
        match self {
            Self::Plain(_) => {}
            Self::Tls(tls) => tls.release(io),
            #[cfg(target_os = "linux")]
            Self::Ring(ring) => ring.release(io.pool),
            Self::Http2 { .. } => {}
        }
    }

    fn tls_established(&self) -> Option<bool> {
        match self {
            Self::Tls(tls) => Some(tls.established()),
            _ => None,
        }
    }

    fn corks(&self) -> bool {
        #[cfg(target_os = "linux")]
        return matches!(self, Self::Plain(_) | Self::Ring(_));
        #[cfg(not(target_os = "linux"))]
        matches!(self, Self::Plain(_))
    }

    #[cfg(target_os = "linux")]
    fn stop_input(&mut self, io: &mut Io<'_>) {
        if let Self::Ring(ring) = self {
            ring.stop_input(io.pool);
        }
    }

    #[cfg(target_os = "linux")]
    fn over_ring(
        stream: TcpStream,
        ring: &std::rc::Rc<crate::uring::RingShared>,
        token: usize,
        serial: u64,
    ) -> Result<Self, TcpStream> {
        let conn = crate::uring::RingConn::new(stream, ring.clone(), token, serial);
        Ok(Self::Ring(Box::new(conn)))
    }

    #[cfg(target_os = "linux")]
    fn ring_conn(&mut self) -> Option<&mut crate::uring::RingConn> {
        match self {
            Self::Ring(ring) => Some(ring),
            _ => None,
        }
    }

    fn http2_stream(connection: usize, id: freeboard_h2::StreamId) -> Option<Self> {
        Some(Self::Http2 { connection: u32::try_from(connection).ok()?, id })
    }

    fn carrier(&self) -> Option<(usize, freeboard_h2::StreamId)> {
        match self {
            Self::Http2 { connection, id } => Some((*connection as usize, *id)),
            _ => None,
        }
    }
}

impl Stream {
    /// The socket, `None` for an HTTP/2 stream (its connection's entry holds the socket).
    fn tcp(&mut self) -> Option<&mut TcpStream> {
        match self {
            Self::Plain(tcp) => Some(tcp),
            Self::Tls(tls) => Some(tls.tcp()),
            #[cfg(target_os = "linux")]
            Self::Ring(ring) => Some(ring.tcp()),
            Self::Http2 { .. } => None,
        }
    }
}

impl mio::event::Source for Stream {
    fn register(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.tcp().map_or(Ok(()), |tcp| tcp.register(registry, token, interests))
    }

    fn reregister(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.tcp().map_or(Ok(()), |tcp| tcp.reregister(registry, token, interests))
    }

    fn deregister(&mut self, registry: &mio::Registry) -> io::Result<()> {
        self.tcp().map_or(Ok(()), |tcp| tcp.deregister(registry))
    }
}

/// `mio::event::Source` for a stream over one socket (`$socket`: the method that lends it,
/// TLS or not): its registration is the socket's. The clients' `ClientStream` is such a
/// stream; the server's `Stream` is registered by hand above (its HTTP/2 streams have no
/// socket).
macro_rules! registered_by_socket {
    ($stream:ty, $socket:ident) => {
        impl mio::event::Source for $stream {
            fn register(
                &mut self,
                registry: &mio::Registry,
                token: mio::Token,
                interests: mio::Interest,
            ) -> std::io::Result<()> {
                self.$socket().register(registry, token, interests)
            }

            fn reregister(
                &mut self,
                registry: &mio::Registry,
                token: mio::Token,
                interests: mio::Interest,
            ) -> std::io::Result<()> {
                self.$socket().reregister(registry, token, interests)
            }

            fn deregister(&mut self, registry: &mio::Registry) -> std::io::Result<()> {
                self.$socket().deregister(registry)
            }
        }
    };
}
pub(crate) use registered_by_socket;
