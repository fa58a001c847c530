//! The io_uring side of a server loop (`--io uring`, Linux): the ring, the buffers the kernel
//! receives into, and a connection's transport over them ([`RingConn`]).
//!
//! A loop that runs its own turns waits on the ring (deferred task work: the kernel's
//! receives run when the loop asks for completions), and the ring polls the loop's epoll, so
//! timers, the waker, the admin and TLS listeners stay on epoll; a loop driven by a host's
//! event loop registers the ring's descriptor with its `Poll` instead. A plain-TCP
//! connection accepted through the ring is never registered with epoll. Its bytes arrive by
//! one bounded receive at a time (a bundle of buffers, up to a turn's share) from a provided
//! buffer ring whose buffers are chunks taken from the loop's pool at start (read memory
//! stays inside the budget, and a connection holds buffers only from a completion until the
//! session has read them). The replies to a read are written after it as on epoll; what its
//! queue holds leaves when the turn ends, all in one submission, straight from the queue and
//! without waiting for room: each send completes with the submission and the queue is
//! consumed by what the socket took, as after a `writev` on epoll, so what the socket does
//! not take stays in the queue, where the watermarks and the policies see it.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::rc::Rc;

use freeboard_buf::{ChunkId, Pool};
use io_uring::{IoUring, Probe, cqueue, opcode, squeue, types};
use mio::net::TcpStream;

use crate::session::Session;

/// The buffer group of the receive buffers.
const GROUP: u16 = 0;
/// `IORING_RECVSEND_BUNDLE` (Linux 6.10), in a receive's `ioprio`.
const IORING_RECVSEND_BUNDLE: u16 = 16;
/// Segments of the queue one send offers at most (a `sendmsg`'s iovec); the rest leaves with
/// the next send.
const SEND_IOV: usize = 64;
/// Submission queue entries; the completion queue has eight times as many (a multishot
/// receive posts one completion per buffer).
const ENTRIES: u32 = 1024;
/// Bytes one arming of a connection's receive takes at most, where the kernel bundles
/// (Linux 6.17): a bundle fills as many buffers as that takes, so a busy connection is
/// read its share of a turn (`READ_BYTES_PER_TURN`, what epoll reads of it) in one receive
/// rather than a buffer at a time. (16 and 32 KiB measured 1.4× and 1.15× the server CPU
/// per 1 KiB echo of 64 KiB.)
pub(crate) const BUNDLE_BYTES: u32 = 64 << 10;

/// What an operation's completion is about, in the low four bits of its `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Accept = 1,
    Recv = 2,
    Send = 3,
    Cancel = 4,
    /// A poll for room in a socket that did not take all it was offered.
    Writable = 5,
    /// The loop's epoll has events (a ring the loop waits on directly watches it).
    Epoll = 6,
}

/// An operation's `user_data`: the connection's slot (or the listener) in the high 32 bits,
/// the low 28 bits of its serial, then the [`Op`]. A completion that arrives for a slot
/// taken since by another connection has another serial and is not given to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag(u64);

impl Tag {
    /// The tag of `op` for connection `token` of serial `serial`.
    pub(crate) fn new(token: usize, serial: u64, op: Op) -> Self {
        Self(((token as u64) << 32) | ((serial & 0x0fff_ffff) << 4) | op as u64)
    }

    /// The tag a completion carries back.
    pub(crate) fn from_user_data(user_data: u64) -> Self {
        Self(user_data)
    }

    /// The connection's slot.
    pub(crate) fn token(self) -> usize {
        (self.0 >> 32) as usize
    }

    /// Whether the tag was made for a connection of serial `serial`.
    pub(crate) fn is_of(self, serial: u64) -> bool {
        (self.0 >> 4) & 0x0fff_ffff == serial & 0x0fff_ffff
    }

    pub(crate) fn op(self) -> Option<Op> {
        match self.0 & 0xf {
            1 => Some(Op::Accept),
            2 => Some(Op::Recv),
            3 => Some(Op::Send),
            4 => Some(Op::Cancel),
            5 => Some(Op::Writable),
            6 => Some(Op::Epoll),
            _ => None,
        }
    }

    fn with(self, op: Op) -> Self {
        Self((self.0 & !0xf) | op as u64)
    }
}

/// A loop's ring: the io_uring instance and what its connections share.
pub(crate) struct Ring {
    uring: IoUring,
    shared: Rc<RingShared>,
    /// Its loop waits on it directly ([`submit_and_wait`](Self::submit_and_wait)), and its
    /// completions are posted only then (`DEFER_TASKRUN`): the kernel's receives run in a
    /// batch when the loop asks for completions, not at each system call the loop makes.
    direct: bool,
}

/// What a loop's ring connections share with the loop: the operations queued for the end of
/// the turn, the receive buffers, and the connections whose queues wait for the turn's sends.
pub(crate) struct RingShared {
    /// Operations to submit when the turn ends (one `io_uring_enter` for them all).
    queued: RefCell<Vec<squeue::Entry>>,
    buffers: ProvidedBuffers,
    /// Connections whose queues leave with the turn's sends (their receive tags).
    sends: RefCell<Vec<Tag>>,
    /// Connections waiting for receive buffers, in the order they began to wait (their
    /// receive tags): one whose receive found the ring empty, and, while any waits, one
    /// that would arm its next receive after a read. The loop arms them in this order once
    /// buffers come back ([`take_waiting`](Self::take_waiting)), so a few connections that
    /// always have bytes ready cannot take every buffer as it comes back and starve the
    /// rest.
    waiting: RefCell<VecDeque<Tag>>,
    /// The end of the turn flushes: a connection's queue waits for the turn's sends. Else
    /// (a write-through in the middle of a read) it is written straight to the socket.
    pub(crate) batching: Cell<bool>,
    /// Sockets of connections that went this turn: an operation queued for them names their
    /// descriptor, which must not be closed (and its number taken by a new connection) before
    /// the submission; the kernel holds its own reference from then on.
    closing: RefCell<Vec<TcpStream>>,
}

/// The provided buffer ring: `count` pool chunks the kernel picks from for each receive.
struct ProvidedBuffers {
    /// The ring of buffer descriptors (an anonymous mapping, registered as [`GROUP`]).
    ///
    /// Invariant: `count * 16` bytes, page-aligned, mapped until `Ring` drops.
    entries: *mut types::BufRingEntry,
    mapped: usize,
    mask: u16,
    /// Our copy of the ring's tail, published after each recycle.
    tail: Cell<u16>,
    /// Each buffer's address (the chunk's memory) by buffer id.
    addrs: Vec<*mut u8>,
    len: u32,
    /// The chunks, given back to the pool when the ring closes.
    chunks: RefCell<Vec<ChunkId>>,
    /// Buffers not held by a completion that was not read yet.
    available: Cell<usize>,
    /// The buffer id at each ring position (by position `& mask`), and each buffer's last
    /// position: a bundle's completion names its first buffer, the others follow it in the
    /// ring.
    order: Vec<Cell<u16>>,
    position: Vec<Cell<u16>>,
    /// What one receive takes at most: [`BUNDLE_BYTES`] where the kernel bounds a bundled
    /// multishot receive's total (Linux 6.17), else one buffer.
    receive_len: u32,
}

impl Ring {
    /// Sets up a ring with `count` receive buffers ([`receive_buffers`]) taken from `pool`,
    /// waited on directly by its loop's thread (`direct`: `SINGLE_ISSUER | DEFER_TASKRUN`,
    /// Linux 6.1; without them where the kernel refuses) or through the loop's epoll. `Err`
    /// says why the kernel or the pool refused: the loop then runs on epoll.
    pub(crate) fn new(pool: &mut Pool<'static>, count: usize, direct: bool) -> io::Result<Self> {
        if !kernel_at_least(6, 0)? {
            // Multishot receive (Linux 6.0): older kernels refuse it per request.
            return Err(io::Error::new(io::ErrorKind::Unsupported, "kernel older than 6.0"));
        }
        // A multishot receive bounded in total (`IORING_RECV_MSHOT_LIM`, Linux 6.17) takes
        // bundles of buffers without taking more than its bound.
        let bundles = kernel_at_least(6, 17)?;
        let deferred = direct
            .then(|| {
                IoUring::builder()
                    .setup_cqsize(8 * ENTRIES)
                    .setup_single_issuer()
                    .setup_defer_taskrun()
                    .setup_taskrun_flag()
                    .build(ENTRIES)
                    .ok()
            })
            .flatten();
        let direct = deferred.is_some();
        let uring = match deferred {
            Some(uring) => uring,
            None => IoUring::builder().setup_cqsize(8 * ENTRIES).build(ENTRIES)?,
        };
        let mut probe = Probe::new();
        uring.submitter().register_probe(&mut probe)?;
        for (code, name) in [
            (opcode::Accept::CODE, "accept"),
            (opcode::Recv::CODE, "recv"),
            (opcode::Send::CODE, "send"),
            (opcode::SendMsg::CODE, "sendmsg"),
            (opcode::PollAdd::CODE, "poll_add"),
            (opcode::AsyncCancel::CODE, "async_cancel"),
        ] {
            if !probe.is_supported(code) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("io_uring has no {name} operation"),
                ));
            }
        }
        let len = pool.chunk_size();
        let mut chunks = Vec::with_capacity(count);
        let mut addrs = Vec::with_capacity(count);
        for _ in 0..count {
            match pool.alloc() {
                Ok(chunk) => {
                    addrs.push(pool.spare_mut(&chunk).as_mut_ptr());
                    chunks.push(chunk);
                }
                Err(_) => {
                    chunks.into_iter().for_each(|c| pool.release(c));
                    return Err(io::Error::other("the pool cannot hold the receive buffers"));
                }
            }
        }
        let mapped = (count * size_of::<types::BufRingEntry>()).next_multiple_of(4096);
        // SAFETY: an anonymous private mapping, checked below; it is zero-filled and page
        // aligned as the buffer ring requires.
        let entries = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if entries == libc::MAP_FAILED {
            chunks.into_iter().for_each(|c| pool.release(c));
            return Err(io::Error::last_os_error());
        }
        let buffers = ProvidedBuffers {
            entries: entries.cast(),
            mapped,
            mask: (count - 1) as u16,
            tail: Cell::new(0),
            addrs,
            len: len as u32,
            chunks: RefCell::new(chunks),
            available: Cell::new(count),
            order: (0..count).map(|_| Cell::new(0)).collect(),
            position: (0..count).map(|_| Cell::new(0)).collect(),
            receive_len: if bundles { BUNDLE_BYTES.max(len as u32) } else { len as u32 },
        };
        // SAFETY: the mapping stays until `Ring` drops, after the ring itself (which
        // unregisters it when it closes).
        let registered = unsafe {
            uring.submitter().register_buf_ring_with_flags(entries as u64, count as u16, GROUP, 0)
        };
        if let Err(e) = registered {
            buffers.close(pool);
            return Err(e);
        }
        for bid in 0..count as u16 {
            buffers.push(bid);
        }
        buffers.publish();
        let shared = Rc::new(RingShared {
            queued: RefCell::new(Vec::with_capacity(256)),
            buffers,
            sends: RefCell::new(Vec::with_capacity(256)),
            waiting: RefCell::new(VecDeque::new()),
            batching: Cell::new(false),
            closing: RefCell::new(Vec::new()),
        });
        Ok(Self { uring, shared, direct })
    }

    /// Whether its loop waits on it directly (see [`submit_and_wait`](Self::submit_and_wait)).
    pub(crate) fn direct(&self) -> bool {
        self.direct
    }

    /// Queues a multishot poll of `fd` (the loop's epoll) for readability.
    pub(crate) fn watch(&self, fd: i32, tag: Tag) {
        let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).multi(true).build();
        self.shared.queue(sqe.user_data(tag.0));
    }

    /// The pool chunks its receive buffers hold (0 once closed).
    pub(crate) fn buffer_chunks(&self) -> usize {
        self.shared.buffers.chunks.borrow().len()
    }

    /// What one receive takes at most (bytes).
    pub(crate) fn receive_len(&self) -> usize {
        self.shared.buffers.receive_len as usize
    }

    /// The pool chunks its receive buffers took at start.
    pub(crate) fn buffer_count(&self) -> usize {
        self.shared.buffers.addrs.len()
    }

    /// The ring's descriptor, for the loop's `Poll`.
    pub(crate) fn fd(&self) -> i32 {
        self.uring.as_raw_fd()
    }

    /// What the ring's connections share.
    pub(crate) fn shared(&self) -> &Rc<RingShared> {
        &self.shared
    }

    /// Queues a multishot accept on `listener`.
    pub(crate) fn accept(&self, listener: &impl AsRawFd, tag: Tag) {
        let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
        let sqe = opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd())).flags(flags).build();
        self.shared.queue(sqe.user_data(tag.0));
    }

    /// Queues the cancellation of the operation tagged `tag`.
    pub(crate) fn cancel(&self, tag: Tag) {
        self.shared.cancel(tag);
    }

    /// Submits what the turn queued: one system call.
    pub(crate) fn submit(&mut self) -> io::Result<()> {
        if self.shared.queued.borrow().is_empty() && !self.uring.submission().cq_overflow() {
            return Ok(());
        }
        self.push_queued()?;
        let submitted = loop {
            match self.uring.submit() {
                Ok(_) => break Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // The completion queue is full: the next turn drains it and submits again
                // (the sockets of gone connections stay open until then).
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.shared.closing.borrow_mut().clear();
        submitted
    }

    /// Submits what the turn queued and waits at most `timeout` (`None`: no limit) for a
    /// completion, in one system call: the wait of a loop that waits on its ring directly
    /// (its epoll is one of the ring's polls, [`watch`](Self::watch)). The deferred
    /// completions are posted on the way out.
    pub(crate) fn submit_and_wait(
        &mut self,
        timeout: Option<std::time::Duration>,
    ) -> io::Result<()> {
        self.push_queued()?;
        let waited = match timeout {
            // Nothing to wait for: the deferred completions are posted if there are any.
            Some(timeout) if timeout.is_zero() => self.uring.submit(),
            Some(timeout) => {
                let timespec = types::Timespec::from(timeout);
                let args = types::SubmitArgs::new().timespec(&timespec);
                self.uring.submitter().submit_with_args(1, &args)
            }
            None => self.uring.submit_and_wait(1),
        };
        if let Err(e) = &waited
            && e.raw_os_error() == Some(libc::EBUSY)
        {
            return Ok(()); // full completion queue: as in `submit`
        }
        self.shared.closing.borrow_mut().clear();
        match waited {
            Err(e) if !matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Moves the queued operations onto the submission queue (submitting when it is full).
    fn push_queued(&mut self) -> io::Result<()> {
        let mut queued = self.shared.queued.borrow_mut();
        let mut at = 0;
        while at < queued.len() {
            let mut sq = self.uring.submission();
            let room = sq.capacity() - sq.len();
            let n = room.min(queued.len() - at);
            // SAFETY: every entry's buffers (a send's iovecs and the queue's chunks they
            // describe, the ring's receive buffers) stay alive until its completion (see
            // `Output`, `RingConn`).
            unsafe { sq.push_multiple(&queued[at..at + n]) }
                .map_err(|_| io::Error::other("submission queue full"))?;
            drop(sq);
            at += n;
            if at < queued.len() {
                self.uring.submit()?;
            }
        }
        queued.clear();
        Ok(())
    }

    /// The completions waiting, in order (at most `out`'s room: call again while it fills).
    pub(crate) fn completions(&mut self, out: &mut Vec<cqueue::Entry>) {
        out.clear();
        if self.direct && self.uring.completion().is_empty() && self.uring.submission().taskrun() {
            // Deferred completions wait to be posted (an enter that asks for events).
            let _ = self.uring.submit();
        }
        out.extend(self.uring.completion().take(out.capacity().max(256)));
    }

    /// Waits for at least one completion (a send of the turn's that has not completed yet).
    pub(crate) fn wait_one(&mut self) -> io::Result<()> {
        match self.uring.submit_and_wait(1) {
            Err(e) if e.raw_os_error() != Some(libc::EINTR) => Err(e),
            _ => Ok(()),
        }
    }

    /// Gives the receive buffers back to the pool; the loop is over.
    pub(crate) fn close(&mut self, pool: &mut Pool<'static>) {
        self.shared.buffers.close(pool);
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let _ = self.uring.submitter().unregister_buf_ring(GROUP);
        // SAFETY: the mapping made in `new`, unregistered above.
        unsafe { libc::munmap(self.shared.buffers.entries.cast(), self.shared.buffers.mapped) };
    }
}

impl RingShared {
    fn queue(&self, sqe: squeue::Entry) {
        self.queued.borrow_mut().push(sqe);
    }

    fn cancel(&self, tag: Tag) {
        let sqe = opcode::AsyncCancel::new(tag.0).build().user_data(tag.with(Op::Cancel).0);
        self.queue(sqe);
    }

    /// Whether operations wait for the submission.
    pub(crate) fn has_queued(&self) -> bool {
        !self.queued.borrow().is_empty()
    }

    /// A receive completion's `res` bytes from buffer `bid` on: the buffers they fill, in
    /// order (a bundle's follow its first in the ring), now held by a connection.
    pub(crate) fn take_buffers(&self, bid: u16, res: u32) -> impl Iterator<Item = (u16, u32)> {
        let buffers = &self.buffers;
        let n = res.div_ceil(buffers.len);
        buffers.available.set(buffers.available.get().saturating_sub(n as usize));
        let first = buffers.position[usize::from(bid)].get();
        (0..n).map(move |i| {
            let at = first.wrapping_add(i as u16) & buffers.mask;
            let bid = buffers.order[usize::from(at)].get();
            (bid, (res - i * buffers.len).min(buffers.len))
        })
    }

    /// Gives the buffers of a completion back to the kernel without reading them (their
    /// connection went, or reads no more).
    pub(crate) fn recycle_received(&self, bid: u16, res: u32) {
        // (Each is pushed at the ring's tail after its position was read: the tail reaches
        // the positions these held no sooner than that.)
        for (bid, _) in self.take_buffers(bid, res) {
            self.buffers.recycle(bid);
        }
    }

    /// Gives buffer `bid` back to the kernel.
    fn recycle(&self, bid: u16) {
        self.buffers.recycle(bid);
    }

    /// The buffers a receive may find (not held by a completion the loop has not read).
    pub(crate) fn free_buffers(&self) -> usize {
        self.buffers.available.get()
    }

    /// Takes the connections waiting for receive buffers, oldest first.
    pub(crate) fn take_waiting(&self) -> VecDeque<Tag> {
        std::mem::take(&mut *self.waiting.borrow_mut())
    }

    /// The connections whose queues wait for the turn's sends (taken: the list is empty
    /// after).
    pub(crate) fn take_sends(&self, into: &mut Vec<Tag>) {
        into.clear();
        into.append(&mut self.sends.borrow_mut());
    }
}

impl ProvidedBuffers {
    /// Puts `bid` at the ring's tail (seen by the kernel once [`publish`](Self::publish)ed).
    fn push(&self, bid: u16) {
        let tail = self.tail.get();
        // SAFETY: `tail & mask` is below the ring's `count` entries (the invariant).
        let entry = unsafe { &mut *self.entries.add(usize::from(tail & self.mask)) };
        entry.set_addr(self.addrs[usize::from(bid)] as u64);
        entry.set_len(self.len);
        entry.set_bid(bid);
        self.order[usize::from(tail & self.mask)].set(bid);
        self.position[usize::from(bid)].set(tail);
        self.tail.set(tail.wrapping_add(1));
    }

    fn publish(&self) {
        // SAFETY: the tail field of the ring's first entry, in the mapping; the kernel reads it
        // with acquire ordering.
        let tail = unsafe {
            &*(types::BufRingEntry::tail(self.entries) as *const std::sync::atomic::AtomicU16)
        };
        tail.store(self.tail.get(), std::sync::atomic::Ordering::Release);
    }

    fn recycle(&self, bid: u16) {
        self.push(bid);
        self.publish();
        self.available.set(self.available.get() + 1);
    }

    fn close(&self, pool: &mut Pool<'static>) {
        for chunk in self.chunks.borrow_mut().drain(..) {
            pool.release(chunk);
        }
    }
}

/// The receive buffers (pool chunks) of a loop's ring: as much of the pool as the read buffer
/// and the cork an epoll loop keeps beside it, a power of two (as the buffer ring needs).
pub(crate) fn receive_buffers(config: &crate::ServerConfig) -> usize {
    (2 * config.read_buffer / config.chunk_size).clamp(8, 1 << 15).next_power_of_two()
}

/// Whether the running kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> io::Result<bool> {
    // SAFETY: `uname` fills the zeroed struct.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a utsname.
    if unsafe { libc::uname(&mut name) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `release` is NUL-terminated by the kernel.
    let release = unsafe { std::ffi::CStr::from_ptr(name.release.as_ptr()) };
    let mut numbers = release
        .to_str()
        .unwrap_or("")
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let found = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    Ok(found >= (major, minor))
}

/// One receive completion's bytes, held until the session has read them.
#[derive(Debug, Clone, Copy)]
struct Received {
    bid: u16,
    len: u32,
    /// Bytes read so far.
    at: u32,
}

/// Where a connection's receive stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Receiving {
    /// A receive is in flight.
    Armed,
    /// None is: the next read that empties what the connection holds arms one.
    Idle,
    /// Ended for want of buffers: the loop re-arms it when buffers come back.
    Starved,
    /// The stream ended or failed.
    Done,
    /// Nothing more is read ([`RingConn::stop_input`]).
    Stopped,
}

/// Bytes moved out of a ring buffer into a pool chunk of their own.
#[derive(Debug)]
struct Spilled {
    chunk: ChunkId,
    len: u32,
    /// Bytes read so far.
    at: u32,
}

/// Where a connection's output stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Sending {
    /// Nothing waits for the ring.
    #[default]
    Idle,
    /// Its queue leaves with the turn's sends.
    Queued,
    /// A send is submitted (it completes with the submission).
    InFlight,
    /// The socket did not take all it was offered: a poll waits for room.
    Full,
}

/// A connection's send: iovecs over the first segments of its session's queue.
#[derive(Default)]
struct Output {
    /// Invariant: not touched while `InFlight` (the kernel reads it, and the queue's chunks
    /// it describes, which nothing changes before the completion: see
    /// [`RingConn::send_queued`]).
    iov: Vec<libc::iovec>,
    /// The `sendmsg` header over `iov` (boxed: it stays where the kernel was told it is).
    msg: Option<Box<libc::msghdr>>,
    offered: usize,
    state: Sending,
}

/// A plain-TCP connection over the loop's ring.
pub(crate) struct RingConn {
    /// Invariant: taken only by `drop`.
    tcp: ManuallyDrop<TcpStream>,
    shared: Rc<RingShared>,
    /// The tag of its operations (with [`Op::Recv`]).
    tag: Tag,
    received: VecDeque<Received>,
    /// Bytes its session did not read, moved out of the ring's buffers into pool chunks
    /// ([`keep_out_of_ring`](Self::keep_out_of_ring)); read before `received`.
    spilled: VecDeque<Spilled>,
    receiving: Receiving,
    /// What the next arming may take, beside the ring's bound: the room its session's queue
    /// had below its high watermark after its last read ([`unread`](Self::unread)).
    room: u32,
    /// The receive ended: at the stream's end (`None`) or with an error.
    ended: Option<Option<i32>>,
    output: Output,
}

impl RingConn {
    /// A connection accepted through the ring, its receive armed.
    pub(crate) fn new(tcp: TcpStream, shared: Rc<RingShared>, token: usize, serial: u64) -> Self {
        let _ = tcp.set_nodelay(true);
        let mut conn = Self {
            tcp: ManuallyDrop::new(tcp),
            shared,
            tag: Tag::new(token, serial, Op::Recv),
            received: VecDeque::new(),
            spilled: VecDeque::new(),
            receiving: Receiving::Done,
            // A request's head and its upgrade fit a buffer.
            room: 0,
            ended: None,
            output: Output::default(),
        };
        conn.arm();
        conn
    }

    /// Queues one receive of at most [`BUNDLE_BYTES`] (one buffer on a kernel that cannot
    /// bound a bundle). Not an unbounded multishot receive: that one takes whatever arrives
    /// until it is cancelled, so a peer that writes while its session does not read (paused
    /// above its high watermark, held, closing) would move its socket's bytes into the
    /// ring's buffers or the pool, where epoll leaves them in the kernel. Armed again only by
    /// a read that emptied what the connection holds, it bounds what a connection takes to
    /// one receive's worth past what its session read.
    ///
    /// The bundled receive is a multishot receive of at most `receive_len` a completion and
    /// in total (`sqe->optlen`, Linux 6.17): the kernel fills as many buffers as that takes
    /// from the socket, and a bundle is never retried past the bound. (A single-shot bundle
    /// is retried once with what the socket holds, whatever its length.)
    fn arm(&mut self) {
        let fd = types::Fd(self.tcp.as_raw_fd());
        let buffers = &self.shared.buffers;
        let len = self.room.clamp(buffers.len, buffers.receive_len.max(buffers.len));
        let sqe = if len > buffers.len {
            let sqe = opcode::RecvMulti::new(fd, GROUP).len(len).build();
            // SAFETY: `Entry` is `repr(C)` over the kernel's 64-byte `io_uring_sqe`; the
            // bytes changed are its `ioprio` (offset 2) and `optlen` (offset 44) fields.
            let mut raw: [u8; 64] = unsafe { std::mem::transmute(sqe) };
            let ioprio = u16::from_ne_bytes([raw[2], raw[3]]) | IORING_RECVSEND_BUNDLE;
            raw[2..4].copy_from_slice(&ioprio.to_ne_bytes());
            raw[44..48].copy_from_slice(&len.to_ne_bytes());
            // SAFETY: as above, back to the entry it was.
            unsafe { std::mem::transmute::<[u8; 64], squeue::Entry>(raw) }
        } else {
            opcode::Recv::new(fd, std::ptr::null_mut(), len)
                .buf_group(GROUP)
                .build()
                .flags(squeue::Flags::BUFFER_SELECT)
        };
        self.shared.queue(sqe.user_data(self.tag.0));
        self.receiving = Receiving::Armed;
    }

    /// Arms the next receive, or, while other connections wait for buffers, waits behind
    /// them (armed in line, after them, in the same submission).
    fn arm_or_wait(&mut self) {
        if self.shared.waiting.borrow().is_empty() {
            self.arm();
        } else {
            self.wait_for_buffers();
        }
    }

    fn wait_for_buffers(&mut self) {
        self.receiving = Receiving::Starved;
        self.shared.waiting.borrow_mut().push_back(self.tag);
    }

    /// Arms the receive of a connection that waited for buffers (the caller saw some
    /// free). One whose session does not read now waits for its next read to arm it.
    pub(crate) fn arm_waiting(&mut self, wants_input: bool) {
        match self.receiving {
            Receiving::Starved if wants_input => self.arm(),
            Receiving::Starved => self.receiving = Receiving::Idle,
            _ => {}
        }
    }

    /// A receive completed: the `res` bytes of buffers from `bid` on (`Some`), else how it
    /// ended (`res`); `more`: the (multishot) receive goes on. Returns whether the loop
    /// should read it now; one that found the ring empty waits for buffers. A session that
    /// does not read now (`!wants_input`) has the bytes moved out of the ring's buffers at
    /// once.
    pub(crate) fn received(
        &mut self,
        res: i32,
        bid: Option<u16>,
        more: bool,
        pool: &mut Pool<'static>,
        wants_input: bool,
    ) -> bool {
        if self.receiving == Receiving::Stopped {
            // What arrived before the cancellation took effect is discarded.
            if let (Some(bid), true) = (bid, res > 0) {
                self.shared.recycle_received(bid, res as u32);
            }
            return false;
        }
        if !more {
            self.receiving = Receiving::Idle;
        }
        if let (Some(bid), true) = (bid, res > 0) {
            self.settle(pool);
            for (bid, len) in self.shared.take_buffers(bid, res as u32) {
                self.received.push_back(Received { bid, len, at: 0 });
            }
            if !wants_input {
                self.keep_out_of_ring(pool);
            }
            return true;
        }
        self.receiving = Receiving::Idle;
        match res {
            0 => self.end(None),
            // Nothing to read: a read now would find nothing (and a request phase take that
            // for a head in pieces).
            e if e == -libc::ENOBUFS => {
                self.wait_for_buffers();
                return false;
            }
            // Cancelled by `stop_input` or `release`, which say what comes next.
            e if e == -libc::ECANCELED => return false,
            e => self.end(Some(-e)),
        }
        true
    }

    fn end(&mut self, error: Option<i32>) {
        self.ended = Some(error);
        self.receiving = Receiving::Done;
    }

    /// Reads what the ring received, into `buf`. The buffers it empties are given back at
    /// the next read or [`settle`](Self::settle), so that [`unread`](Self::unread) can still
    /// return bytes to them.
    pub(crate) fn read(&mut self, pool: &mut Pool<'static>, buf: &mut [u8]) -> io::Result<usize> {
        self.settle(pool);
        let mut n = 0;
        for spilled in &mut self.spilled {
            if n == buf.len() {
                break;
            }
            let bytes = &pool.bytes(&spilled.chunk)[spilled.at as usize..];
            let take = bytes.len().min(buf.len() - n);
            buf[n..n + take].copy_from_slice(&bytes[..take]);
            n += take;
            spilled.at += take as u32;
        }
        for held in &mut self.received {
            if n == buf.len() {
                break;
            }
            let take = (held.len - held.at).min((buf.len() - n) as u32) as usize;
            let from = self.shared.buffers.addrs[usize::from(held.bid)];
            // SAFETY: the kernel wrote `held.len` bytes into buffer `held.bid` and gave it to
            // us with the completion; it is not back in the ring until settled.
            let bytes = unsafe { std::slice::from_raw_parts(from.add(held.at as usize), take) };
            buf[n..n + take].copy_from_slice(bytes);
            n += take;
            held.at += take as u32;
        }

        match (n, self.ended) {
            (0, Some(None)) => Ok(0),
            (0, Some(Some(e))) => Err(io::Error::from_raw_os_error(e)),
            (0, None) => Err(io::ErrorKind::WouldBlock.into()),
            (n, _) => Ok(n),
        }
    }

    /// Gives back the last `n` bytes the last [`read`](Self::read) returned (the session did
    /// not take them: it stopped reading); the next read returns them first, as a socket
    /// keeps what is not read. Then settles, and moves what is left out of the ring's
    /// buffers. A connection that holds nothing then receives again, at most `room` bytes:
    /// the room its session's queue has below its high watermark now that the replies to
    /// what it read are queued (at least a buffer). A peer that writes while it does not read
    /// fills its queue, and its receives shrink to one buffer before its session pauses, so
    /// what it sends then stays in its socket as on epoll.
    pub(crate) fn unread(&mut self, pool: &mut Pool<'static>, mut n: usize, room: usize) {
        // Every byte before the read position has been read, and the read returned the last
        // `n` of them: stepping back from the position, in stream order (the spilled chunks,
        // then the ring's buffers), finds them.
        let ats = self.received.iter_mut().rev().map(|held| &mut held.at);
        for at in ats.chain(self.spilled.iter_mut().rev().map(|spilled| &mut spilled.at)) {
            if n == 0 {
                break;
            }
            let back = (*at as usize).min(n);
            *at -= back as u32;
            n -= back;
        }
        self.keep_out_of_ring(pool);
        if self.receiving == Receiving::Idle && !self.holds_unread() {
            // The reader took all there was: the next bytes may come.
            self.room = room.min(u32::MAX as usize) as u32;
            self.arm_or_wait();
        }
    }

    /// Moves the bytes its session has not read out of the ring's buffers into pool chunks
    /// of its own (at most one receive's bound past the last read; kept in the
    /// ring while the pool is short): a session that does not read, or not all, holds none of
    /// the buffers every connection receives into.
    pub(crate) fn keep_out_of_ring(&mut self, pool: &mut Pool<'static>) {
        self.settle(pool);
        while let Some(&front) = self.received.front() {
            let Ok(chunk) = pool.alloc() else { break };
            let from = self.shared.buffers.addrs[usize::from(front.bid)];
            // SAFETY: as in `read`: the kernel's bytes of a buffer we hold.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    from.add(front.at as usize),
                    (front.len - front.at) as usize,
                )
            };
            pool.append(&chunk, bytes);
            self.spilled.push_back(Spilled { chunk, len: bytes.len() as u32, at: 0 });
            self.shared.recycle(front.bid);
            self.received.pop_front();
        }
    }

    /// Gives the buffers read to the end back to the ring (and the chunks to the pool).
    pub(crate) fn settle(&mut self, pool: &mut Pool<'static>) {
        while self.spilled.front().is_some_and(|spilled| spilled.at == spilled.len) {
            // NOTE(unwrap): the front just seen.
            pool.release(self.spilled.pop_front().unwrap().chunk);
        }
        while let Some(held) = self.received.front()
            && held.at == held.len
        {
            self.shared.recycle(held.bid);
            self.received.pop_front();
        }
    }

    /// Whether bytes received wait to be read.
    fn holds_unread(&self) -> bool {
        self.received.iter().any(|held| held.at < held.len)
            || self.spilled.iter().any(|spilled| spilled.at < spilled.len)
    }

    /// Stops receiving for good (a closed connection read all it discards): the receive is
    /// cancelled and what it holds goes back, as epoll leaves further bytes in the socket.
    pub(crate) fn stop_input(&mut self, pool: &mut Pool<'static>) {
        if self.receiving == Receiving::Armed {
            self.shared.cancel(self.tag);
        }
        self.receiving = Receiving::Stopped;
        for received in self.received.drain(..) {
            self.shared.recycle(received.bid);
        }
        for spilled in self.spilled.drain(..) {
            pool.release(spilled.chunk);
        }
    }

    /// Whether a read would return something now (bytes, the end or an error).
    pub(crate) fn more_input(&self) -> bool {
        self.holds_unread() || self.ended.is_some()
    }

    /// Whether a send is in flight.
    pub(crate) fn sending(&self) -> bool {
        self.output.state == Sending::InFlight
    }

    /// Whether the socket refused part of the last send, and is polled for room.
    pub(crate) fn waits_for_room(&self) -> bool {
        self.output.state == Sending::Full
    }

    /// Puts the session's queue on the turn's sends (`Some((0, false))`: nothing written yet),
    /// or says it waits for room or for a send in flight. `None` when it is to be written
    /// straight to the socket instead ([`tcp`](Self::tcp)): outside the end of the turn (a
    /// write-through in the middle of a read, a shutdown's close frames).
    pub(crate) fn write_queue(&mut self) -> Option<(usize, bool)> {
        match self.output.state {
            Sending::Queued | Sending::InFlight | Sending::Full => Some((0, false)),
            Sending::Idle if self.shared.batching.get() => {
                self.output.state = Sending::Queued;
                self.shared.sends.borrow_mut().push(self.tag);
                Some((0, false))
            }
            Sending::Idle => None,
        }
    }

    /// Queues the send of what `session`'s queue holds (its first [`SEND_IOV`] segments),
    /// straight from the pool, with `MSG_DONTWAIT`: the socket takes what it has room for
    /// at once and the send completes with the submission (without it, a socket send
    /// waits for room). The loop submits it with nothing in between that could change the
    /// queue, and handles its completion before anything does.
    pub(crate) fn send_queued(&mut self, session: &Session, pool: &Pool<'static>) {
        let out = &mut self.output;
        out.state = Sending::Idle;
        let mut slices = [IoSlice::new(&[]); SEND_IOV];
        let n = session.io_slices(pool, &mut slices);
        out.iov.clear();
        out.iov.extend(slices[..n].iter().map(|slice| libc::iovec {
            iov_base: slice.as_ptr().cast_mut().cast(),
            iov_len: slice.len(),
        }));
        out.offered = slices[..n].iter().map(|slice| slice.len()).sum();
        if out.offered == 0 {
            return;
        }
        let fd = types::Fd(self.tcp.as_raw_fd());
        let sqe = match out.iov.as_slice() {
            [one] => opcode::Send::new(fd, one.iov_base.cast(), one.iov_len as u32)
                .flags(libc::MSG_DONTWAIT)
                .build(),
            iov => {
                // SAFETY: an all-zero msghdr is valid (no name, no control data).
                let msg = out.msg.get_or_insert_with(|| Box::new(unsafe { std::mem::zeroed() }));
                msg.msg_iov = iov.as_ptr().cast_mut();
                msg.msg_iovlen = iov.len() as _;
                opcode::SendMsg::new(fd, &**msg as *const libc::msghdr)
                    .flags(libc::MSG_DONTWAIT as u32)
                    .build()
            }
        };
        out.state = Sending::InFlight;
        self.shared.queue(sqe.user_data(self.tag.with(Op::Send).0));
    }

    /// A send completed with `res`: the bytes the socket took, to consume from the queue.
    /// A socket that did not take all it was offered is polled for room (`EAGAIN` is such a
    /// socket: the send did not wait). `Err` if the socket failed.
    pub(crate) fn sent(&mut self, res: i32) -> io::Result<usize> {
        let out = &mut self.output;
        out.state = Sending::Idle;
        if res < 0 && res != -libc::EAGAIN {
            return Err(io::Error::from_raw_os_error(-res));
        }
        let taken = res.max(0) as usize;
        if taken < out.offered {
            let fd = types::Fd(self.tcp.as_raw_fd());
            let sqe = opcode::PollAdd::new(fd, libc::POLLOUT as u32).build();
            self.shared.queue(sqe.user_data(self.tag.with(Op::Writable).0));
            out.state = Sending::Full;
        }
        Ok(taken)
    }

    /// The socket has room again (its poll completed).
    pub(crate) fn writable(&mut self) {
        if self.output.state == Sending::Full {
            self.output.state = Sending::Idle;
        }
    }

    /// The socket, to write straight to (a read's corked replies, a refusal the pool could
    /// not queue), unless queued bytes wait for the ring (they must go first).
    pub(crate) fn writes_straight(&mut self) -> Option<&mut TcpStream> {
        (self.output.state == Sending::Idle).then_some(&mut *self.tcp)
    }

    /// Our FIN (no send is in flight outside the turn's sends).
    pub(crate) fn shutdown_write(&mut self) -> io::Result<()> {
        self.tcp.shutdown(std::net::Shutdown::Write)
    }

    /// The connection goes: its buffers go back to the ring, and the receive or the poll
    /// in flight ends (the ring holds the socket open while an operation is on it, so its
    /// reading side is shut down rather than only closed).
    pub(crate) fn release(&mut self, pool: &mut Pool<'static>) {
        for received in self.received.drain(..) {
            self.shared.recycle(received.bid);
        }
        for spilled in self.spilled.drain(..) {
            pool.release(spilled.chunk);
        }
        if self.receiving == Receiving::Armed {
            let _ = self.tcp.shutdown(std::net::Shutdown::Read);
            self.shared.cancel(self.tag);
        }
        if self.output.state == Sending::Full {
            self.shared.cancel(self.tag.with(Op::Writable));
        }
        self.output.state = Sending::Idle;
        self.receiving = Receiving::Done;
    }

    /// The socket (its registration with epoll is never used).
    pub(crate) fn tcp(&mut self) -> &mut TcpStream {
        &mut self.tcp
    }
}

impl Drop for RingConn {
    fn drop(&mut self) {
        // SAFETY: `tcp` is not used again (the invariant).
        let tcp = unsafe { ManuallyDrop::take(&mut self.tcp) };
        self.shared.closing.borrow_mut().push(tcp);
    }
}
