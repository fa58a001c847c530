//! A single-threaded io_uring TCP echo: returns what arrives, verbatim, with no WebSocket work —
//! the physical limit of an echo on this kernel and loopback, beside `raw-tcp-echo`'s epoll.
//!
//! One ring drives everything: a multishot accept, one multishot receive per connection into a
//! provided buffer ring (the kernel picks a buffer for each completion), and at the end of each
//! loop turn one `sendmsg` per connection touched, gathering every buffer it has received and
//! not yet sent. All of them go to the kernel in the one `submit_and_wait` that also waits for
//! the next completions. A buffer goes back to the ring once its bytes are sent.

use std::alloc::{Layout, alloc_zeroed};
use std::collections::VecDeque;
use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::squeue::Entry;
use io_uring::types::{BufRingEntry, Fd, Fixed};
use io_uring::{IoUring, SubmissionQueue, Submitter, cqueue, opcode};
use slab::Slab;

/// Submission queue entries; the completion queue has four times as many.
const ENTRIES: u32 = 4096;
/// Buffers in all (a power of two, at most 32768): what a burst over many connections may hold
/// at once. Only those the ring cycles through are ever touched.
const BUFFERS: u16 = 2048;
/// Buffers kept in the ring to begin with; doubled each time a receive finds it empty.
const RING_FILL: usize = 32;
/// Bytes per buffer: the most one receive completion carries.
const BUFFER_SIZE: usize = 16 * 1024;
/// The ring's buffer group id.
const GROUP: u16 = 0;
/// Buffers gathered into one `sendmsg`.
const MAX_IOV: usize = 64;
/// Received bytes not yet sent above which a connection stops receiving (its multishot receive
/// is cancelled), so a client that does not read cannot hold every buffer; receiving resumes
/// at half of it.
const QUEUE_HIGH: usize = 256 * 1024;

// What a completion belongs to: its kind in the high half of user_data, a connection's key in
// the low half.
const ACCEPT: u64 = 1 << 32;
const RECV: u64 = 2 << 32;
const SEND: u64 = 3 << 32;
const CANCEL: u64 = 4 << 32;
const KIND: u64 = 0xffff_ffff << 32;

fn main() -> io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9002".into());
    let listener = TcpListener::bind(addr)?;
    let mut ring: IoUring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_cqsize(ENTRIES * 4)
        .build(ENTRIES)
        // DEFER_TASKRUN needs 6.1; the echo works without it.
        .or_else(|_| IoUring::builder().setup_cqsize(ENTRIES * 4).build(ENTRIES))?;
    let (mut submitter, mut sq, mut cq) = ring.split();
    // Entering the ring by a registered index spares the fd lookup of each io_uring_enter.
    let _ = submitter.register_ring_fd();
    // Sockets live in the ring's file table, at their connection's key: no file lookup or
    // reference count per operation. The kernel allows as many slots as the open-file limit;
    // a connection past them is closed as accepted.
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid rlimit to fill.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    submitter.register_files_sparse(limit.rlim_cur.min(1 << 20) as u32)?;
    let mut echo = Echo {
        buffers: BufferRing::register(&submitter)?,
        conns: Slab::new(),
        touched: Vec::new(),
        starved: Vec::new(),
    };
    let accept = opcode::AcceptMulti::new(Fd(listener.as_raw_fd())).build().user_data(ACCEPT);
    echo.push(&mut sq, &submitter, &accept)?;
    loop {
        echo.buffers.publish();
        sq.sync();
        match submitter.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EINTR)) => {}
            Err(e) => return Err(e),
        }
        cq.sync();
        for cqe in &mut cq {
            let key = (cqe.user_data() & !KIND) as usize;
            let (res, flags) = (cqe.result(), cqe.flags());
            match cqe.user_data() & KIND {
                ACCEPT => {
                    if res >= 0 {
                        echo.accepted(&submitter, res);
                    }
                    if !cqueue::more(flags) {
                        echo.push(&mut sq, &submitter, &accept)?;
                    }
                }
                RECV => echo.received(key, res, flags),
                SEND => echo.sent(key, res),
                _ => {}
            }
        }
        for i in 0..echo.touched.len() {
            echo.settle(&mut sq, &submitter, echo.touched[i])?;
        }
        echo.touched.clear();
        if echo.buffers.available() && !echo.starved.is_empty() {
            for key in std::mem::take(&mut echo.starved) {
                if echo.conns.get_mut(key).is_some_and(|c| std::mem::take(&mut c.starved)) {
                    echo.settle(&mut sq, &submitter, key)?;
                }
            }
        }
    }
}

/// The loop's state between completions.
struct Echo {
    buffers: BufferRing,
    conns: Slab<Box<Conn>>,
    /// Connections with a completion this turn, each once, to settle before submitting.
    touched: Vec<usize>,
    /// Connections whose receive ended for want of buffers, to re-arm once some are back.
    starved: Vec<usize>,
}

/// One connection, its socket at the slot of its key in the ring's file table. Boxed, so the
/// `msghdr` and `iovec`s of its send in flight keep their address while the slab grows.
struct Conn {
    /// Received spans in arrival order; a send in flight covers a prefix of them.
    queue: VecDeque<Span>,
    /// Bytes in `queue`.
    queued: usize,
    sending: bool,
    recv_armed: bool,
    /// A cancellation of the receive was submitted and its end not yet seen.
    cancelling: bool,
    /// The peer closed or an operation failed: end once nothing is in flight.
    closing: bool,
    touched: bool,
    starved: bool,
    iov: [libc::iovec; MAX_IOV],
    msg: libc::msghdr,
}

/// The part of a provided buffer still to be sent.
struct Span {
    bid: u16,
    start: u32,
    end: u32,
}

/// The provided buffer ring (`IORING_REGISTER_PBUF_RING`) and the buffers it hands out.
///
/// The kernel takes buffers from the ring in the order they were put there, so a ring holding
/// every buffer would write each receive into the coldest memory of all (with 2,048 buffers of
/// 16 KiB, the copy into user memory took 4× as long as the epoll echo's into its one buffer).
/// Instead the ring holds only `fill` buffers, topped up at each `publish` from a stack of
/// idle ones, most recently sent first, so receives land in memory that is still cached.
struct BufferRing {
    /// `BUFFERS` entries, page-aligned as the kernel requires; never freed.
    entries: *mut BufRingEntry,
    /// `BUFFERS` × `BUFFER_SIZE` bytes; never freed.
    memory: *mut u8,
    /// The tail as written so far; the kernel sees it at `publish`.
    tail: u16,
    /// Buffers in the ring not yet seen in a completion.
    in_ring: usize,
    /// How many buffers `publish` keeps in the ring.
    fill: usize,
    /// Idle buffers, the most recently returned on top.
    idle: Vec<u16>,
}

impl Echo {
    /// Moves the socket just accepted into the file table and starts serving it; one the
    /// table cannot take is closed.
    fn accepted(&mut self, submitter: &Submitter<'_>, fd: RawFd) {
        let one: libc::c_int = 1;
        // SAFETY: `fd` is the socket just accepted; the option value is a live c_int.
        unsafe {
            let size = size_of::<libc::c_int>() as libc::socklen_t;
            let value = (&raw const one).cast();
            libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, value, size);
        }
        let slot = self.conns.vacant_key() as u32;
        let registered = submitter.register_files_update(slot, &[fd]);
        // The table holds its own reference to the socket.
        // SAFETY: `fd` is ours and not used after this.
        unsafe { libc::close(fd) };
        if registered.is_err() {
            return;
        }
        // SAFETY: an all-zero msghdr is a valid empty one.
        let msg = unsafe { std::mem::zeroed() };
        let key = self.conns.insert(Box::new(Conn {
            queue: VecDeque::with_capacity(MAX_IOV),
            queued: 0,
            sending: false,
            recv_armed: false,
            cancelling: false,
            closing: false,
            touched: true,
            starved: false,
            iov: [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX_IOV],
            msg,
        }));
        self.touched.push(key);
    }

    /// A receive completion: bytes in a buffer, the end of the multishot, or both.
    fn received(&mut self, key: usize, res: i32, flags: u32) {
        let Some(conn) = self.conns.get_mut(key) else { return };
        if !cqueue::more(flags) {
            conn.recv_armed = false;
            conn.cancelling = false;
        }
        if let Some(bid) = cqueue::buffer_select(flags) {
            self.buffers.taken();
            match res {
                1.. => {
                    conn.queue.push_back(Span { bid, start: 0, end: res as u32 });
                    conn.queued += res as usize;
                }
                _ => self.buffers.give(bid),
            }
        }
        match -res {
            // The ring was empty: re-armed at once if idle buffers can top it up (`settle`).
            libc::ENOBUFS => self.buffers.ran_out(),
            libc::ECANCELED => {}
            // EOF (0) or an error.
            e if e >= 0 => conn.closing = true,
            _ => {}
        }
        if !std::mem::replace(&mut conn.touched, true) {
            self.touched.push(key);
        }
    }

    /// A send completion: `res` bytes went out from the front of the queue (maybe fewer than
    /// submitted), and the buffers wholly sent go back to the ring.
    fn sent(&mut self, key: usize, res: i32) {
        let Some(conn) = self.conns.get_mut(key) else { return };
        conn.sending = false;
        if res <= 0 {
            conn.closing = true;
        } else {
            let mut left = res as u32;
            conn.queued -= left as usize;
            while left > 0 {
                // NOTE(unwrap): the kernel sent no more than the queue held.
                let span = conn.queue.front_mut().unwrap();
                let taken = left.min(span.end - span.start);
                span.start += taken;
                left -= taken;
                if span.start == span.end {
                    self.buffers.give(span.bid);
                    conn.queue.pop_front();
                }
            }
        }
        if !std::mem::replace(&mut conn.touched, true) {
            self.touched.push(key);
        }
    }

    /// Submits what a connection needs after its completions: the send of everything queued,
    /// a receive re-armed or cancelled, or its end once nothing is in flight.
    fn settle(
        &mut self,
        sq: &mut SubmissionQueue<'_>,
        submitter: &Submitter<'_>,
        key: usize,
    ) -> io::Result<()> {
        let Some(conn) = self.conns.get_mut(key) else { return Ok(()) };
        conn.touched = false;
        let cancel =
            opcode::AsyncCancel::new(RECV | key as u64).build().user_data(CANCEL | key as u64);
        if conn.closing {
            if conn.recv_armed && !conn.cancelling {
                conn.cancelling = true;
                return self.push(sq, submitter, &cancel);
            }
            if conn.recv_armed || conn.sending {
                return Ok(());
            }
            let conn = self.conns.remove(key);
            for span in &conn.queue {
                self.buffers.give(span.bid);
            }
            // Emptying its slot drops the table's reference: the socket closes.
            return submitter.register_files_update(key as u32, &[-1]).map(drop);
        }
        let mut entries: [Option<Entry>; 2] = [None, None];
        if !conn.sending && !conn.queue.is_empty() {
            let n = conn.queue.len().min(MAX_IOV);
            for (iov, span) in conn.iov.iter_mut().zip(conn.queue.iter().take(n)) {
                iov.iov_base =
                    self.buffers.buffer(span.bid).wrapping_add(span.start as usize).cast();
                iov.iov_len = (span.end - span.start) as usize;
            }
            let fd = Fixed(key as u32);
            // One span is a plain send: no msghdr and iovec for the kernel to copy in.
            let send = match n {
                1 => opcode::Send::new(fd, conn.iov[0].iov_base.cast(), conn.iov[0].iov_len as u32)
                    .flags(libc::MSG_NOSIGNAL)
                    .build(),
                _ => {
                    conn.msg.msg_iov = conn.iov.as_mut_ptr();
                    conn.msg.msg_iovlen = n as _;
                    opcode::SendMsg::new(fd, &raw const conn.msg)
                        .flags(libc::MSG_NOSIGNAL as u32)
                        .build()
                }
            };
            conn.sending = true;
            entries[0] = Some(send.user_data(SEND | key as u64));
        }
        if conn.recv_armed {
            if conn.queued > QUEUE_HIGH && !conn.cancelling {
                conn.cancelling = true;
                entries[1] = Some(cancel);
            }
        } else if conn.queued <= QUEUE_HIGH / 2 {
            if self.buffers.available() {
                conn.recv_armed = true;
                let recv = opcode::RecvMulti::new(Fixed(key as u32), GROUP).build();
                entries[1] = Some(recv.user_data(RECV | key as u64));
            } else if !std::mem::replace(&mut conn.starved, true) {
                self.starved.push(key);
            }
        }
        for entry in entries.iter().flatten() {
            self.push(sq, submitter, entry)?;
        }
        Ok(())
    }

    /// Queues `entry`, submitting what is queued first when the submission queue is full.
    fn push(
        &mut self,
        sq: &mut SubmissionQueue<'_>,
        submitter: &Submitter<'_>,
        entry: &Entry,
    ) -> io::Result<()> {
        // SAFETY: what an entry points at (a boxed connection's msghdr and iovecs, the buffer
        // ring) outlives its completion: a connection is freed only with nothing in flight.
        while unsafe { sq.push(entry) }.is_err() {
            self.buffers.publish();
            sq.sync();
            match submitter.submit() {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EINTR)) => {}
                Err(e) => return Err(e),
            }
            sq.sync();
        }
        Ok(())
    }
}

impl BufferRing {
    /// Allocates the ring and its buffers, gives every buffer to it and registers it.
    fn register(submitter: &Submitter<'_>) -> io::Result<Self> {
        let count = usize::from(BUFFERS);
        let layout = Layout::from_size_align(count * size_of::<BufRingEntry>(), 4096)
            .map_err(io::Error::other)?;
        // SAFETY: the layout is non-zero in size.
        let entries = unsafe { alloc_zeroed(layout) }.cast::<BufRingEntry>();
        if entries.is_null() {
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        // Leaked on purpose: the kernel writes into these bytes for the life of the process.
        let memory = vec![0u8; count * BUFFER_SIZE].leak().as_mut_ptr();
        let idle = (0..BUFFERS).rev().collect();
        let mut ring = Self { entries, memory, tail: 0, in_ring: 0, fill: RING_FILL, idle };
        ring.publish();
        // SAFETY: `entries` holds BUFFERS entries, page-aligned, and is never freed.
        unsafe { submitter.register_buf_ring_with_flags(entries as u64, BUFFERS, GROUP, 0) }?;
        Ok(ring)
    }

    fn buffer(&self, bid: u16) -> *mut u8 {
        self.memory.wrapping_add(usize::from(bid) * BUFFER_SIZE)
    }

    /// Whether a receive armed now would find a buffer (after the next `publish`).
    fn available(&self) -> bool {
        self.in_ring > 0 || !self.idle.is_empty()
    }

    /// A receive completion took a buffer out of the ring.
    fn taken(&mut self) {
        self.in_ring -= 1;
    }

    /// A receive found the ring empty: keep more in it from now on.
    fn ran_out(&mut self) {
        self.fill = (self.fill * 2).min(usize::from(BUFFERS));
    }

    /// Buffer `bid` is idle again.
    fn give(&mut self, bid: u16) {
        self.idle.push(bid);
    }

    /// Tops the ring up to `fill` buffers, most recently returned first, and makes them
    /// visible to the kernel.
    fn publish(&mut self) {
        while self.in_ring < self.fill {
            let Some(bid) = self.idle.pop() else { break };
            let slot = usize::from(self.tail & (BUFFERS - 1));
            // SAFETY: `slot` < BUFFERS; the kernel reads only the entries between its head and
            // the published tail, at most BUFFERS - 1 of them while a buffer is idle, so this
            // slot is not among them.
            let entry = unsafe { &mut *self.entries.add(slot) };
            entry.set_addr(self.buffer(bid) as u64);
            entry.set_len(BUFFER_SIZE as u32);
            entry.set_bid(bid);
            self.tail = self.tail.wrapping_add(1);
            self.in_ring += 1;
        }
        // SAFETY: the tail is the u16 the kernel reads in the first entry; it is written only
        // here, atomically, so the entries written before it are seen with it (Release).
        unsafe {
            let tail = BufRingEntry::tail(self.entries).cast_mut();
            AtomicU16::from_ptr(tail).store(self.tail, Ordering::Release);
        }
    }
}
