//! What a blocking [`Client`](super::Client) has to send, and who writes it: the caller, in
//! each `send`, or a writer thread that takes whatever queued up while it was in the kernel
//! and writes it in one go.

use std::io::{self, IoSlice, Write};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use freeboard_buf::{Pool, SendQueue, Writability};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};

/// Slices per `writev`.
const IOV: usize = 64;
/// The most a reused masking buffer keeps between sends.
const SCRATCH_KEEP: usize = 64 << 10;
/// The writer thread's copy of the head of the queue: the most one of its writes takes.
pub(super) const CORK: usize = 64 << 10;
const SOCKET: Token = Token(0);
const WAKE: Token = Token(1);

/// The output side of a client: the send queue, its pool and an owned frame going out
/// without a copy.
pub(super) struct Outbox {
    pub(super) pool: Pool<'static>,
    pub(super) queue: SendQueue,
    /// An owned frame going straight from its buffer to the socket.
    /// Invariant: when `Some`, its bytes go out before any in `queue`.
    pub(super) direct: Option<Direct>,
    /// A reused buffer for masked copies of borrowed payloads.
    pub(super) scratch: Vec<u8>,
    /// Bytes the writer thread took from `queue` or `direct` and has not written yet.
    in_flight: usize,
    /// The writer thread waits for work: wake it after queueing.
    writer_idle: bool,
    /// A caller waits in `flush` for everything to be written.
    pub(super) flushing: bool,
    /// The write side failed; nothing more is written.
    failed: Option<(io::ErrorKind, String)>,
    /// The client is done with the writer thread.
    stop: bool,
}

/// An owned frame going straight from its buffer to the socket.
pub(super) struct Direct {
    pub(super) header: [u8; 14],
    pub(super) header_len: u8,
    /// Invariant: `sent <= header_len + payload.len()`.
    pub(super) sent: usize,
    /// The masked payload.
    pub(super) payload: Vec<u8>,
    /// The buffer is the masking scratch and goes back to it.
    pub(super) from_scratch: bool,
}

/// The outbox, shared by the caller and the writer thread.
pub(super) struct Shared {
    outbox: Mutex<Outbox>,
    /// Signalled when everything is written or the write side failed (`flushing` set).
    drained: Condvar,
    /// `bufferedAmount` and writability, published at every change so reading them takes no
    /// lock.
    buffered: AtomicUsize,
    writable: AtomicBool,
}

/// The locked outbox; publishes the counts when dropped.
pub(super) struct Guard<'a> {
    shared: &'a Shared,
    /// Invariant: `Some` until the guard is given up.
    out: Option<MutexGuard<'a, Outbox>>,
}

/// A client's writer thread; stopped and joined when dropped.
pub(super) struct Writer {
    shared: Arc<Shared>,
    waker: Waker,
    thread: Option<JoinHandle<()>>,
}

impl Outbox {
    pub(super) fn new(pool: Pool<'static>, queue: SendQueue) -> Self {
        Self {
            pool,
            queue,
            direct: None,
            scratch: Vec::new(),
            in_flight: 0,
            writer_idle: false,
            flushing: false,
            failed: None,
            stop: false,
        }
    }

    /// Bytes sent but not yet handed to the socket (`bufferedAmount`).
    pub(super) fn buffered(&self) -> usize {
        self.queue.len() + self.direct.as_ref().map_or(0, Direct::unsent) + self.in_flight
    }

    /// Whether nothing is queued behind which a new message would have to wait.
    pub(super) fn is_clear(&self) -> bool {
        self.direct.is_none() && self.queue.is_empty()
    }

    /// The write side's failure, if it failed.
    pub(super) fn failure(&self) -> Option<io::Error> {
        self.failed.as_ref().map(|(kind, why)| io::Error::new(*kind, why.clone()))
    }

    /// One vectored write of the oldest bytes, by the caller; how many the socket took.
    /// Call only with something buffered.
    pub(super) fn write_to(&mut self, stream: &mut impl Write) -> io::Result<usize> {
        let n = if let Some(direct) = &self.direct {
            stream.write_vectored(&direct.slices())?
        } else {
            let mut iov = [IoSlice::new(&[]); IOV];
            let filled = self.queue.io_slices(&self.pool, &mut iov);
            stream.write_vectored(&iov[..filled])?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        if let Some(direct) = &mut self.direct {
            // Only the direct frame's slices were written.
            direct.sent += n;
            if direct.unsent() == 0 {
                // NOTE(unwrap): checked `Some` just above.
                let done = self.direct.take().unwrap();
                self.recycle(done);
            }
        } else {
            let _: Option<Writability> = self.queue.consume(&mut self.pool, n);
        }
        Ok(n)
    }

    /// Keeps a written direct frame's buffer if it was the masking scratch, unless it grew
    /// large.
    fn recycle(&mut self, done: Direct) {
        let buffer = done.payload;
        if done.from_scratch
            && buffer.capacity() <= SCRATCH_KEEP
            && buffer.capacity() > self.scratch.capacity()
        {
            self.scratch = buffer;
        }
    }
}

impl Direct {
    pub(super) fn len(&self) -> usize {
        self.header_len as usize + self.payload.len()
    }

    pub(super) fn unsent(&self) -> usize {
        self.len() - self.sent
    }

    fn slices(&self) -> [IoSlice<'_>; 2] {
        let header = &self.header[..self.header_len as usize];
        if self.sent < header.len() {
            [IoSlice::new(&header[self.sent..]), IoSlice::new(&self.payload)]
        } else {
            [IoSlice::new(&self.payload[self.sent - header.len()..]), IoSlice::new(&[])]
        }
    }
}

impl Shared {
    pub(super) fn new(outbox: Outbox) -> Arc<Self> {
        Arc::new(Self {
            buffered: AtomicUsize::new(0),
            writable: AtomicBool::new(outbox.queue.is_writable()),
            outbox: Mutex::new(outbox),
            drained: Condvar::new(),
        })
    }

    pub(super) fn lock(&self) -> Guard<'_> {
        // A panic on the other side leaves the outbox consistent: every change to it is made
        // by non-panicking calls.
        let out = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        Guard { shared: self, out: Some(out) }
    }

    pub(super) fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Relaxed)
    }

    pub(super) fn is_writable(&self) -> bool {
        self.writable.load(Ordering::Relaxed)
    }
}

impl Guard<'_> {
    /// Gives up the lock until `drained` is signalled or `timeout` passes (`flushing` must be
    /// set for the signal to come).
    pub(super) fn wait_drained(mut self, timeout: Option<Duration>) -> Self {
        let shared = self.shared;
        // NOTE(unwrap): the guard holds the lock until now.
        let out = self.out.take().unwrap();
        let out = match timeout {
            None => shared.drained.wait(out).unwrap_or_else(PoisonError::into_inner),
            Some(t) => {
                shared.drained.wait_timeout(out, t).unwrap_or_else(PoisonError::into_inner).0
            }
        };
        Guard { shared, out: Some(out) }
    }
}

impl Deref for Guard<'_> {
    type Target = Outbox;

    fn deref(&self) -> &Outbox {
        // NOTE(unwrap): `Some` by the invariant.
        self.out.as_ref().unwrap()
    }
}

impl DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut Outbox {
        // NOTE(unwrap): `Some` by the invariant.
        self.out.as_mut().unwrap()
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let Some(out) = &self.out else { return };
        let buffered = out.buffered();
        self.shared.buffered.store(buffered, Ordering::Relaxed);
        self.shared.writable.store(out.queue.is_writable(), Ordering::Relaxed);
        if out.flushing && (buffered == 0 || out.failed.is_some()) {
            self.shared.drained.notify_all();
        }
    }
}

impl Writer {
    /// Starts the writer thread on its own handle of the (non-blocking) socket.
    pub(super) fn spawn(shared: Arc<Shared>, stream: std::net::TcpStream) -> io::Result<Self> {
        let mut stream = TcpStream::from_std(stream);
        let poll = Poll::new()?;
        poll.registry().register(&mut stream, SOCKET, Interest::WRITABLE)?;
        let waker = Waker::new(poll.registry(), WAKE)?;
        let thread = thread::Builder::new().name("freeboard-client-writer".into()).spawn({
            let shared = Arc::clone(&shared);
            move || write_loop(&shared, stream, poll)
        })?;
        Ok(Self { shared, waker, thread: Some(thread) })
    }

    /// Wakes the thread if it waits and there is work; call after queueing, with the lock
    /// held.
    pub(super) fn kick(&self, out: &mut Outbox) {
        if out.writer_idle && !out.is_clear() {
            out.writer_idle = false;
            let _ = self.waker.wake();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        let _ = self.waker.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the writer thread is writing: a copy of the head of the queue, or a direct frame.
enum Job {
    Cork { at: usize, len: usize },
    Direct(Direct),
}

impl Job {
    fn unsent(&self) -> usize {
        match self {
            Job::Cork { at, len } => len - at,
            Job::Direct(direct) => direct.unsent(),
        }
    }
}

/// The writer thread: takes the oldest bytes under the lock (a direct frame, or up to
/// [`CORK`] bytes of the queue, which count as handed to the socket from then on, so no policy
/// can drop them), writes them without it, and waits for work or writability in between.
fn write_loop(shared: &Shared, mut stream: TcpStream, mut poll: Poll) {
    let mut cork = vec![0u8; CORK].into_boxed_slice();
    let mut events = Events::with_capacity(4);
    let mut writable = true;
    loop {
        let job = {
            let mut out = shared.lock();
            let out = &mut *out;
            if out.stop {
                return;
            }
            if let Some(direct) = out.direct.take() {
                out.in_flight = direct.unsent();
                Some(Job::Direct(direct))
            } else if !out.queue.is_empty() {
                let len = out.queue.copy_to(&out.pool, &mut cork);
                let _: Option<Writability> = out.queue.consume(&mut out.pool, len);
                out.in_flight = len;
                Some(Job::Cork { at: 0, len })
            } else {
                out.writer_idle = true;
                None
            }
        };
        let Some(mut job) = job else {
            if poll.poll(&mut events, None).is_err_and(|e| e.kind() != io::ErrorKind::Interrupted) {
                return;
            }
            continue;
        };
        while job.unsent() > 0 {
            let result = match (&job, writable) {
                (_, false) => Err(io::ErrorKind::WouldBlock.into()),
                (Job::Cork { at, len }, true) => stream.write(&cork[*at..*len]),
                (Job::Direct(direct), true) => stream.write_vectored(&direct.slices()),
            }
            .and_then(|n| if n == 0 { Err(io::ErrorKind::WriteZero.into()) } else { Ok(n) });
            match result {
                Ok(n) => {
                    match &mut job {
                        Job::Cork { at, .. } => *at += n,
                        Job::Direct(direct) => direct.sent += n,
                    }
                    let mut out = shared.lock();
                    out.in_flight -= n;
                    if out.stop {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    writable = false;
                    match poll.poll(&mut events, None) {
                        Ok(()) => writable = events.iter().any(|e| e.token() == SOCKET),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => return,
                    }
                    if shared.lock().stop {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let mut out = shared.lock();
                    out.failed = Some((e.kind(), e.to_string()));
                    out.in_flight = 0;
                    return;
                }
            }
        }
        if let Job::Direct(done) = job {
            shared.lock().recycle(done);
        }
    }
}
