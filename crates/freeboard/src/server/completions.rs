//! A loop's io_uring completions (`--io uring`): accepted connections are opened, received
//! bytes are read by the session exactly as after a readiness event, completed sends consume
//! the queue as a `writev` would; the turn's sends leave in one submission at its end.

use std::os::fd::{AsRawFd, FromRawFd};

use freeboard_proto::Instant;
use io_uring::cqueue;

use super::event_loop::{ACCEPT_BACKOFF, EventLoop, Listening};
use super::ring_side::{ACCEPTING, EPOLL};
use crate::transport::Transport;
use crate::uring::{Op, Tag};

// A bundled receive takes at most a connection's share of a turn.
const _: () =
    assert!(crate::uring::BUNDLE_BYTES as usize == super::event_loop::READ_BYTES_PER_TURN);

impl<T: Transport> EventLoop<T> {
    /// Handles the completions waiting, then reads the connections that received; a read
    /// that emptied what its connection held armed its next receive, submitted at once so
    /// that what the socket holds comes with the submission and is read in the next round
    /// (as epoll reads a socket until it is empty, at most a receive a round, as many rounds
    /// as the loop's share of a turn takes, [`READ_BYTES_PER_TURN`]).
    ///
    /// [`READ_BYTES_PER_TURN`]: super::event_loop::READ_BYTES_PER_TURN
    pub(super) fn complete(&mut self, now: Instant) {
        let Some(side) = &self.ring else { return };
        // One receive a round per connection that reads, so a busy one is read its share of
        // the turn.
        let rounds = (super::event_loop::READ_BYTES_PER_TURN / side.ring.receive_len()).max(1);
        for round in 1..=rounds {
            self.reap(now);
            let Some(side) = &mut self.ring else { return };
            let ready = std::mem::take(&mut side.ready);
            if ready.is_empty() {
                side.ready = ready;
                return;
            }
            // Those that found no buffer first: the others' next receives must not take
            // the buffers they wait for.
            self.rearm_starved();
            for &(token, serial) in &ready {
                // (A connection that went since, its slot perhaps taken by a new one, is not.)
                if self.conns.get(token).is_some_and(|entry| entry.serial == serial) {
                    self.read(token, now);
                }
            }
            let Some(side) = &mut self.ring else { return };
            side.ready = ready;
            side.ready.clear();
            if round < rounds
                && side.ring.shared().has_queued()
                && let Err(error) = side.ring.submit()
            {
                tracing::error!(%error, "io_uring submission failed");
            }
        }
    }

    /// Whether connections received what the loop has not read yet (the turn's sends
    /// handled their completions): the next turn reads them without waiting.
    pub(super) fn ring_has_ready(&self) -> bool {
        self.ring.as_ref().is_some_and(|side| !side.ready.is_empty())
    }

    /// Handles the completions waiting; the connections that received are left in `ready`.
    fn reap(&mut self, now: Instant) {
        let Some(side) = &mut self.ring else { return };
        let mut completed = std::mem::take(&mut side.completed);
        loop {
            let Some(side) = &mut self.ring else { return };
            side.ring.completions(&mut completed);
            if completed.is_empty() {
                break;
            }
            for cqe in completed.drain(..) {
                self.completion(&cqe, now);
            }
        }
        if let Some(side) = &mut self.ring {
            side.completed = completed;
        }
    }

    /// Sends what the turn's flushes put on the ring ([`RingConn::write_queue`]), all in one
    /// submission, and consumes each queue by what its socket took; a flush of each then
    /// does what follows a write (writability, the close's next step), and may queue more
    /// for the next round. Whether anything was sent (the caller flushes what that marked,
    /// then calls again).
    ///
    /// [`RingConn::write_queue`]: crate::uring::RingConn::write_queue
    pub(super) fn send_ring(&mut self, now: Instant) -> bool {
        let Some(side) = &mut self.ring else { return false };
        let mut tags = std::mem::take(&mut side.sending);
        side.ring.shared().take_sends(&mut tags);
        let mut in_flight = 0;
        for tag in &tags {
            if let Some(entry) = self.conns.get_mut(tag.token())
                && tag.is_of(entry.serial)
                && let Some(conn) = entry.stream.ring_conn()
            {
                conn.send_queued(&entry.session, &self.pool);
                in_flight += usize::from(conn.sending());
            }
        }
        if in_flight > 0 {
            // The sends name the queues' chunks: they complete before anything else runs.
            if let Err(error) = side.ring.submit() {
                tracing::error!(%error, "io_uring submission failed");
            }
            loop {
                self.reap(now);
                let Some(side) = &mut self.ring else { break };
                let conns = &mut self.conns;
                let left = tags.iter().any(|tag| match conns.get_mut(tag.token()) {
                    Some(entry) if tag.is_of(entry.serial) => {
                        entry.stream.ring_conn().is_some_and(|conn| conn.sending())
                    }
                    _ => false,
                });
                // MSG_DONTWAIT sends complete with their submission; a kernel that posts one
                // later is waited for.
                if !left || side.ring.wait_one().is_err() {
                    break;
                }
            }
        }
        if let Some(side) = &mut self.ring {
            side.sending = tags;
        }
        in_flight > 0
    }

    fn completion(&mut self, cqe: &cqueue::Entry, now: Instant) {
        let tag = Tag::from_user_data(cqe.user_data());
        let (res, more) = (cqe.result(), cqueue::more(cqe.flags()));
        let Some(side) = &mut self.ring else { return };
        match tag.op() {
            Some(Op::Accept) => self.ring_accepted(res, more, now),
            Some(Op::Recv) => {
                let bid = cqueue::buffer_select(cqe.flags());
                let token = tag.token();
                let conn = match self.conns.get_mut(token) {
                    Some(entry) if tag.is_of(entry.serial) => {
                        let held =
                            self.pending.contains_key(&token) || self.awaiting.contains_key(&token);
                        let wants = !held && reads(&entry.session);
                        let done = entry.session.reads_no_more();
                        entry.stream.ring_conn().map(|conn| {
                            if done {
                                // Past what a closed connection reads: what arrives is
                                // dropped and the receive ends, as epoll leaves it unread.
                                conn.stop_input(&mut self.pool);
                            }
                            (conn, wants)
                        })
                    }
                    _ => None,
                };
                match conn {
                    Some((conn, wants)) => {
                        let read = conn.received(res, bid, more, &mut self.pool, wants);
                        let serial = self.conns[token].serial;
                        if read && side.ready.last() != Some(&(token, serial)) {
                            side.ready.push((token, serial));
                        }
                    }
                    None => {
                        // Its connection went: the buffer goes straight back.
                        if let Some(bid) = bid.filter(|_| res > 0) {
                            side.ring.shared().recycle_received(bid, res as u32);
                        }
                    }
                }
            }
            Some(Op::Send) => {
                let token = tag.token();
                let Some(entry) = self.conns.get_mut(token).filter(|e| tag.is_of(e.serial)) else {
                    return;
                };
                let Some(conn) = entry.stream.ring_conn() else { return };
                match conn.sent(res) {
                    Ok(taken) => {
                        let refused = conn.waits_for_room();
                        entry.session.consume(&mut self.pool, taken);
                        self.stats.bytes_out += taken as u64;
                        self.mark(token); // what follows the write, and the queue's rest
                        self.wrote_to_socket(token, refused);
                    }
                    Err(_) => {
                        self.stats.closed += u64::from(entry.session.clear_queue(&mut self.pool));
                        self.end_of_input(token, now);
                        self.remove(token);
                    }
                }
            }
            Some(Op::Writable) => {
                let token = tag.token();
                if let Some(entry) = self.conns.get_mut(token).filter(|e| tag.is_of(e.serial))
                    && let Some(conn) = entry.stream.ring_conn()
                {
                    conn.writable();
                    self.mark(token);
                }
            }
            Some(Op::Epoll) => {
                side.epoll_ready = true;
                side.epoll_armed &= more;
            }
            Some(Op::Cancel) | None => {}
        }
    }

    /// A multishot accept's completion: a connection (`res` its descriptor) or an error.
    fn ring_accepted(&mut self, res: i32, more: bool, now: Instant) {
        if let Some(side) = &mut self.ring
            && !more
        {
            side.accept_armed = false;
        }
        if res < 0 {
            let error = std::io::Error::from_raw_os_error(-res);
            match -res {
                libc::ECANCELED | libc::EINTR | libc::ECONNABORTED => {}
                _ => {
                    // EMFILE and friends, as on epoll: try again shortly.
                    if !std::mem::replace(&mut self.accept_failing, true) {
                        tracing::warn!(%error, "accept failed; retrying every 50 ms");
                    }
                    self.shared.metrics.accept_errors.inc();
                    self.accept_retry = Some(now + ACCEPT_BACKOFF);
                }
            }
            return;
        }
        // SAFETY: the descriptor the kernel just gave us, owned by nothing else.
        let stream = unsafe { mio::net::TcpStream::from_raw_fd(res) };
        if self.listeners.is_none() {
            return; // shutting down: dropped, closed
        }
        if std::mem::take(&mut self.accept_failing) {
            tracing::info!("accepting again");
        }
        if let Some(side) = &mut self.ring {
            side.backlog.push_back(stream);
            self.accept_more = true;
        }
    }

    /// Opens up to `batch` of the connections the ring accepted; the rest wait for the next
    /// turn (which does not wait for readiness meanwhile).
    pub(super) fn open_ring_backlog(&mut self, now: Instant, batch: usize) {
        for _ in 0..batch {
            let Some(stream) = self.ring.as_mut().and_then(|side| side.backlog.pop_front()) else {
                return;
            };
            let Ok(peer) = stream.peer_addr() else { continue };
            self.open_accepted(stream, peer, Listening::Plain, None, now);
        }
        self.accept_more = self.ring.as_ref().is_some_and(|side| !side.backlog.is_empty());
    }

    /// Submits the turn's operations (one system call), after re-arming what waited.
    pub(super) fn submit_ring(&mut self) {
        self.rearm();
        let Some(side) = &mut self.ring else { return };
        if let Err(error) = side.ring.submit() {
            tracing::error!(%error, "io_uring submission failed");
        }
    }

    /// The wait of a loop that waits on its ring directly ([`Ring::direct`]): submits the
    /// turn's operations (after re-arming what waited) and waits at most `timeout` for a
    /// completion, in one system call, then handles the completions. Whether the loop's
    /// epoll has events (its poll through the ring completed): the caller polls it then.
    ///
    /// [`Ring::direct`]: crate::uring::Ring::direct
    pub(super) fn wait_ring(&mut self, timeout: Option<std::time::Duration>) -> bool {
        self.rearm();
        let Some(side) = &mut self.ring else { return true };
        // Events the last poll of the epoll had no room for: they raise no new readiness.
        let timeout = if side.epoll_ready { Some(std::time::Duration::ZERO) } else { timeout };
        if let Err(error) = side.ring.submit_and_wait(timeout) {
            tracing::error!(%error, "io_uring submission failed");
        }
        self.reap(self.now());
        self.ring.as_mut().is_some_and(|side| std::mem::take(&mut side.epoll_ready))
    }

    /// After a poll of the epoll that the ring reported ready: if the poll filled `events`,
    /// more may wait, which raise no new readiness (the next turn polls again).
    pub(super) fn epoll_polled(&mut self, events: &mio::Events) {
        if let Some(side) = &mut self.ring
            && events.iter().count() == events.capacity()
        {
            side.epoll_ready = true;
        }
    }

    /// Re-arms what waited: the receives that found no buffer, the accept after a failure's
    /// pause, the poll of the loop's epoll.
    fn rearm(&mut self) {
        self.rearm_starved();
        let epoll = self.poll().as_raw_fd();
        let Some(side) = &mut self.ring else { return };
        if side.accepts
            && !side.accept_armed
            && self.accept_retry.is_none()
            && let Some(listeners) = &self.listeners
        {
            side.ring.accept(&listeners.plain, Tag::new(ACCEPTING, 0, Op::Accept));
            side.accept_armed = true;
        }
        if side.ring.direct() && !side.epoll_armed {
            side.ring.watch(epoll, Tag::new(EPOLL, 0, Op::Epoll));
            side.epoll_armed = true;
        }
    }

    /// Whether the end of the turn flushes (`true`): a ring connection's queue then waits
    /// for the turn's sends rather than being written straight to its socket.
    pub(super) fn ring_batches(&mut self, batching: bool) {
        if let Some(side) = &self.ring {
            side.ring.shared().batching.set(batching);
        }
    }

    /// Arms the receives of the connections waiting for buffers, once some are free, all of
    /// them in the order they began to wait: the submission issues them in that order, so
    /// those first in line take the buffers first, and those that find none wait again.
    fn rearm_starved(&mut self) {
        let Some(side) = &mut self.ring else { return };
        let shared = side.ring.shared();
        if shared.free_buffers() == 0 {
            return;
        }
        for tag in shared.take_waiting() {
            if let Some(entry) = self.conns.get_mut(tag.token()).filter(|e| tag.is_of(e.serial))
                && let Some(conn) = entry.stream.ring_conn()
            {
                conn.arm_waiting(reads(&entry.session));
            }
        }
    }

    /// Cancels the multishot accept: shutdown has begun.
    pub(super) fn stop_ring_accept(&mut self) {
        if let Some(side) = &mut self.ring {
            side.backlog.clear();
            if std::mem::take(&mut side.accept_armed) {
                side.ring.cancel(Tag::new(ACCEPTING, 0, Op::Accept));
            }
        }
    }
}

/// Whether `session` reads its input now: an open one while it wants input (not paused, not
/// held, not past what a closed one reads), one in any other phase (a request, a body, the
/// discarding after a close) whenever its bytes come.
fn reads(session: &crate::session::Session) -> bool {
    !matches!(session.phase, crate::session::Phase::Open(_)) || session.wants_input()
}
