//! A loop's io_uring side (`--io uring`): the ring, set up beside the loop's `Poll` (or
//! refused, and the loop runs on epoll), and what a turn keeps beside it. Its completions are
//! handled in `completions.rs`.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use io_uring::cqueue;
use mio::{Interest, Poll, Token};

use crate::config::ServerConfig;
use crate::uring::{Op, Ring, Tag};

/// The loop's token for the ring's descriptor (readable while completions wait), where the
/// loop waits on its epoll (a host's event loop drives it).
pub(super) const RING: Token = Token(usize::MAX - 5);

/// The slot in the accept's tag (no connection has it).
pub(super) const ACCEPTING: usize = u32::MAX as usize;

/// The slot in the tag of the poll of the loop's epoll (no connection has it).
pub(super) const EPOLL: usize = u32::MAX as usize - 1;

/// The loop's ring and what a turn keeps beside it.
pub(super) struct RingSide {
    pub(super) ring: Ring,
    /// The ring accepts the plain listener's connections (it does not speak TLS).
    pub(super) accepts: bool,
    /// A multishot accept is on the ring.
    pub(super) accept_armed: bool,
    /// The loop waits on the ring directly ([`Ring::direct`]); its epoll is polled through
    /// the ring: that poll is armed (`epoll_armed`), and reported events (`epoll_ready`).
    pub(super) epoll_armed: bool,
    pub(super) epoll_ready: bool,
    /// One batch of completions (kept for its allocation).
    pub(super) completed: Vec<cqueue::Entry>,
    /// Connections that received something, to read once the batch is handled: `(slot,
    /// serial)` (the turn's sends may leave some for the next turn).
    pub(super) ready: Vec<(usize, u64)>,
    /// The tags of the connections the turn's sends are for (kept for its allocation).
    pub(super) sending: Vec<crate::uring::Tag>,
    /// Connections the multishot accept took and the loop has not opened yet: a batch a
    /// turn, as on epoll, so a storm of connects cannot hold up the connections open.
    pub(super) backlog: VecDeque<mio::net::TcpStream>,
}

impl RingSide {
    /// The loop's ring, or `None` (logged once per process) if the kernel refuses io_uring:
    /// the loop then runs on epoll. `direct`: the loop waits on the ring rather than on its
    /// epoll (which the ring then polls), where the kernel allows it ([`Ring::new`]).
    pub(super) fn new(
        index: u32,
        direct: bool,
        poll: &Poll,
        pool: &mut freeboard_buf::Pool<'static>,
        config: &ServerConfig,
        plain: &mio::net::TcpListener,
        plain_speaks_tls: bool,
    ) -> Option<Self> {
        let mut ring = match Ring::new(pool, crate::uring::receive_buffers(config), direct) {
            Ok(ring) => ring,
            Err(error) => {
                refused(index, &error);
                return None;
            }
        };
        let fd = ring.fd();
        if ring.direct() {
            ring.watch(poll.as_raw_fd(), Tag::new(EPOLL, 0, Op::Epoll));
        } else {
            let registered =
                poll.registry().register(&mut mio::unix::SourceFd(&fd), RING, Interest::READABLE);
            if let Err(error) = registered {
                ring.close(pool);
                refused(index, &error);
                return None;
            }
        }
        let accepts = !plain_speaks_tls;
        if accepts {
            ring.accept(plain, Tag::new(ACCEPTING, 0, Op::Accept));
        }
        let direct = ring.direct();
        Some(Self {
            ring,
            accepts,
            accept_armed: accepts,
            epoll_armed: direct,
            epoll_ready: false,
            completed: Vec::with_capacity(1024),
            ready: Vec::with_capacity(64),
            sending: Vec::with_capacity(256),
            backlog: VecDeque::new(),
        })
    }
}

/// Says once per process that io_uring was refused, and why.
fn refused(index: u32, error: &std::io::Error) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::warn!(event_loop = index, %error, "io_uring refused; the loops run on epoll");
    }
}
