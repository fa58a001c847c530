//! The kernel's socket buffers of a loop's connections, inside the budget.
//!
//! An idle connection's socket holds no buffer (its socket itself is charged at accept, see
//! [`kernel_memory`](crate::kernel_memory)). What a busy one holds is bounded and, while it
//! lasts, charged:
//! - **Sending.** Each socket may keep at most `kernel_send_queue` bytes unsent
//!   (`TCP_NOTSENT_LOWAT`, set at accept). A socket that refuses part of a write holds that
//!   much: its connection is charged what the kernel reports it has queued (`SO_MEMINFO`),
//!   read again at each write it does not take whole, and released at the first it takes
//!   whole.
//! - **Receiving.** A connection whose reads pause (its send queue above the high watermark)
//!   would let its peer fill the socket's receive buffer, which the kernel tunes up to
//!   `tcp_rmem`'s maximum (32 MiB on some hosts). Its limit is frozen at what it holds (at
//!   least [`PAUSED_RECEIVE`]) and charged, and the limit it had is given back when reading
//!   resumes. What the peer sends past it the kernel drops, and the peer sends again later.
//!
//! The charge is withheld from the loop's pool with the connections' own
//! ([`charge_connections`](super::event_loop::EventLoop::charge_connections)), so a host
//! whose sockets fill answers new upgrades 503 before its memory passes `--memory`. The
//! buffers may take a [share](KERNEL_SHARE) of the pool, not the data path of the connections
//! that keep up: a connection that pauses past it is shed (1008, its unsent messages counted
//! as its policy's drops), since only its close gives the kernel's memory back.

/// The part of a loop's pool its sockets' buffers may be charged: 1/`KERNEL_SHARE`.
pub(super) const KERNEL_SHARE: usize = 4;

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::event_loop::EventLoop;
use crate::kernel_memory::{SocketBuffers, limit_received};
use crate::transport::Transport;

/// The least receive buffer a paused connection keeps (the kernel doubles it): room for the
/// segments already on their way within the window it advertised.
pub(super) const PAUSED_RECEIVE: usize = 8 << 10;

/// The connections whose sockets hold buffers now, and what they are charged.
#[derive(Default)]
pub(super) struct KernelBuffers {
    charged: HashMap<usize, Charged>,
    /// The sum of the charges.
    pub(super) bytes: usize,
}

#[derive(Clone, Copy)]
struct Charged {
    bytes: usize,
    /// While its reads pause: the receive limit to give back (`SO_RCVBUF`'s argument).
    restore: Option<usize>,
}

impl<T: Transport> EventLoop<T> {
    /// After a write to `token`'s socket: `refused` when it did not take all it was offered.
    /// A connection no socket refuses, with none charged, costs one test.
    pub(super) fn wrote_to_socket(&mut self, token: usize, refused: bool) {
        if !refused && self.kernel.charged.is_empty() {
            return;
        }
        let paused = match self.kernel.charged.get(&token) {
            None if !refused => return,
            Some(c) if c.restore.is_none() && !refused => {
                return self.charge_kernel(token, 0, None);
            }
            charged => charged.and_then(|c| c.restore),
        };
        let Some(held) = SocketBuffers::of(self.conns[token].stream.socket()) else { return };
        // What a connection that is being read has received is read this turn or the next.
        let bytes = if paused.is_some() { held.bound() } else { held.queued };
        self.charge_kernel(token, bytes, paused);
    }

    /// `token`'s reads pause: its receive limit is frozen at what it holds, and charged.
    pub(super) fn input_paused(&mut self, token: usize) {
        if self.kernel.charged.get(&token).is_some_and(|c| c.restore.is_some()) {
            return;
        }
        let fd = self.conns[token].stream.socket();
        let Some(before) = SocketBuffers::of(fd) else { return };
        // The kernel doubles what it is given, and gives back its doubled value.
        let frozen = before.received.max(PAUSED_RECEIVE);
        if limit_received(fd, frozen / 2).is_err() {
            return;
        }
        let held = SocketBuffers::of(fd).unwrap_or(before);
        self.charge_kernel(token, held.bound(), Some(before.receive_limit / 2));
        let share = self.pool.chunks_total() * self.pool.chunk_size() / KERNEL_SHARE;
        if self.kernel.bytes > share {
            self.shed(token);
        }
    }

    /// Ends `token`, which is behind and not read, for what its socket holds
    /// ([`Session::shed`](crate::session::Session::shed)).
    fn shed(&mut self, token: usize) {
        let now = self.now();
        let policy = self.conns[token].session.queue().policy();
        let (entry, mut cx) = self.split(token, now);
        let messages = entry.session.shed(&mut cx);
        self.stats.policy_drops[policy] += u64::from(messages);
        self.shared.metrics.slow_consumer_closes.inc();
        self.mark(token);
    }

    /// `token`'s reads resume: it gets its receive limit back, and its charge goes until a
    /// write is refused again.
    pub(super) fn input_resumed(&mut self, token: usize) {
        let Some(restore) = self.kernel.charged.get(&token).and_then(|c| c.restore) else {
            return;
        };
        let _ = limit_received(self.conns[token].stream.socket(), restore);
        self.charge_kernel(token, 0, None);
    }

    /// `token` goes: its charge with it.
    pub(super) fn forget_kernel_buffers(&mut self, token: usize) {
        if let Some(charged) = self.kernel.charged.remove(&token) {
            self.kernel.bytes -= charged.bytes;
            self.shared.kernel_buffers.fetch_sub(charged.bytes, Ordering::Relaxed);
        }
    }

    /// Charges `token` `bytes` of kernel buffers (0: none), and withholds the change.
    fn charge_kernel(&mut self, token: usize, bytes: usize, restore: Option<usize>) {
        self.forget_kernel_buffers(token);
        if bytes > 0 || restore.is_some() {
            self.kernel.charged.insert(token, Charged { bytes, restore });
            self.kernel.bytes += bytes;
            self.shared.kernel_buffers.fetch_add(bytes, Ordering::Relaxed);
        }
        self.charge_connections();
    }
}
