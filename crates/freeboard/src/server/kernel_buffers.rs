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
//!   lets its peer fill the socket's receive buffer, up to its limit (which the kernel tunes
//!   only while the connection is read, up to `tcp_rmem`'s maximum). While it pauses it is
//!   charged what its socket has received and queued, read when the pause begins and again at
//!   each arrival the loop does not read. The limit stays as it is: a client that writes all
//!   before it reads finishes as it would without the charge.
//!
//! The charge is withheld from the loop's pool with the connections' own
//! ([`charge_connections`](super::event_loop::EventLoop::charge_connections)), up to a
//! [share](BUFFER_SHARE) of it, so a host whose sockets fill answers new upgrades 503 before
//! its memory passes `--memory`, and the connections that keep up keep the rest of the pool
//! for their data. While the pool is contended, a paused connection under the `close` policy
//! that takes the buffers past that share is shed, as the policy sheds a queue past its share
//! (1008, its unsent messages counted), since only its close gives the kernel's memory back.
//! Under the other policies it stays; what the buffers hold past the share is exported
//! (`freeboard_kernel_buffer_charge_bytes`) but not withheld.

use std::sync::atomic::Ordering;

use super::event_loop::EventLoop;
use crate::kernel_memory::{BUFFER_SHARE, SocketBuffers};
use crate::transport::Transport;
use freeboard_buf::SlowConsumerPolicy;
use freeboard_proto::State;

impl<T: Transport> EventLoop<T> {
    /// After a write to `token`'s socket: `refused` when it did not take all it was offered.
    /// A connection no socket refuses, with none charged, costs one test.
    pub(super) fn wrote_to_socket(&mut self, token: usize, refused: bool) {
        if !refused && self.kernel.is_empty() {
            return;
        }
        match self.kernel.paused(token) {
            None if !refused => {}
            Some(false) if !refused => self.charge_kernel(token, 0, false),
            paused => self.measure_kernel(token, paused == Some(true)),
        }
    }

    /// `token`'s reads pause: what its socket has received counts from now on.
    pub(super) fn input_paused(&mut self, token: usize) {
        self.measure_kernel(token, true);
    }

    /// Input arrived that `token` does not read now: a paused connection's charge follows it.
    pub(super) fn input_waits(&mut self, token: usize) {
        if self.kernel.paused(token) == Some(true) {
            self.measure_kernel(token, true);
        }
    }

    /// `token`'s reads resume: its charge goes until a write is refused again.
    pub(super) fn input_resumed(&mut self, token: usize) {
        if self.kernel.paused(token).is_some() {
            self.charge_kernel(token, 0, false);
        }
    }

    /// `token` goes: its charge with it.
    pub(super) fn forget_kernel_buffers(&mut self, token: usize) {
        let released = self.kernel.forget(token);
        self.shared.kernel_buffers.fetch_sub(released, Ordering::Relaxed);
    }

    /// Charges `token` what the kernel reports its socket holds: queued to send, and (while
    /// its reads pause) received. What a connection that is being read has received is read
    /// this turn or the next. Sheds it if it pauses past the buffers' share of a contended pool
    /// under the `close` policy.
    fn measure_kernel(&mut self, token: usize, paused: bool) {
        let entry = &mut self.conns[token];
        let Some(held) = SocketBuffers::of(entry.stream.socket()) else { return };
        let bytes = held.queued + if paused { held.received } else { 0 };
        self.charge_kernel(token, bytes, paused);
        let share = self.pool.chunks_total() * self.pool.chunk_size() / BUFFER_SHARE;
        let session = &self.conns[token].session;
        if paused
            && self.kernel.bytes() > share
            && !self.share.uncontended(&self.pool, 0)
            && session.state() == State::Open
            && session.queue().policy() == SlowConsumerPolicy::Close
        {
            let now = self.now();
            let (entry, mut cx) = self.split(token, now);
            let messages = entry.session.shed(&mut cx);
            self.stats.policy_drops[SlowConsumerPolicy::Close] += u64::from(messages);
            self.shared.metrics.slow_consumer_closes.inc();
            self.mark(token);
        }
    }

    /// Charges `token` `bytes` of kernel buffers (none if 0 and not paused), and withholds
    /// the change.
    fn charge_kernel(&mut self, token: usize, bytes: usize, paused: bool) {
        let before = self.kernel.charge(token, bytes, paused);
        self.shared.kernel_buffers.fetch_sub(before, Ordering::Relaxed);
        self.shared.kernel_buffers.fetch_add(bytes, Ordering::Relaxed);
        self.charge_connections();
    }
}
