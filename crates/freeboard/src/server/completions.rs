//! A loop's io_uring completions (`--io uring`): accepted connections are opened, received
//! bytes are read by the session exactly as after a readiness event, completed sends let the
//! queue go on; the turn's operations leave in one submission at its end.

use std::os::fd::FromRawFd;

use freeboard_proto::Instant;
use io_uring::cqueue;

use super::event_loop::{ACCEPT_BACKOFF, EventLoop, Listening};
use super::ring_side::ACCEPTING;
use crate::transport::Transport;
use crate::uring::{Op, Tag};

impl<T: Transport> EventLoop<T> {
    /// Handles the completions waiting, then reads the connections that received.
    pub(super) fn complete(&mut self, now: Instant) {
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
        let Some(side) = &mut self.ring else { return };
        side.completed = completed;
        let ready = std::mem::take(&mut side.ready);
        for &token in &ready {
            if self.conns.contains(token) {
                self.read(token, now);
            }
        }
        if let Some(side) = &mut self.ring {
            side.ready = ready;
            side.ready.clear();
        }
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
                        let (read, starved) = conn.received(res, bid, &mut self.pool, wants);
                        if read && side.ready.last() != Some(&token) {
                            side.ready.push(token);
                        }
                        if starved {
                            side.starved.push((token, self.conns[token].serial));
                        }
                    }
                    None => {
                        // Its connection went: the buffer goes straight back.
                        if let Some(bid) = bid.filter(|_| res > 0) {
                            side.ring.shared().take_buffer();
                            side.ring.shared().recycle(bid);
                        }
                    }
                }
            }
            Some(Op::Send) => {
                let token = tag.token();
                let conn = match self.conns.get_mut(token) {
                    Some(entry) if tag.is_of(entry.serial) => entry.stream.ring_conn(),
                    _ => None,
                };
                let Some(conn) = conn else {
                    if let Some(staged) = side.ring.shared().orphan_completed(tag) {
                        staged.release(&mut self.pool);
                    }
                    return;
                };
                match conn.sent(res, &mut self.pool) {
                    Ok(true) => self.mark(token), // the queue may go on
                    Ok(false) => {}
                    Err(_) => {
                        let entry = &mut self.conns[token];
                        self.stats.closed += u64::from(entry.session.clear_queue(&mut self.pool));
                        self.end_of_input(token, now);
                        self.remove(token);
                    }
                }
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

    /// Submits the turn's operations (one system call), after re-arming what waited: the
    /// receives that found no buffer, the accept after a failure's pause.
    pub(super) fn submit_ring(&mut self) {
        let Some(side) = &mut self.ring else { return };
        let conns = &mut self.conns;
        side.starved.retain(|&(token, serial)| match conns.get_mut(token) {
            Some(entry) if entry.serial == serial => {
                let wants = reads(&entry.session);
                entry.stream.ring_conn().is_some_and(|conn| !conn.rearm_starved(wants))
            }
            _ => false,
        });
        if side.accepts
            && !side.accept_armed
            && self.accept_retry.is_none()
            && let Some(listeners) = &self.listeners
        {
            side.ring.accept(&listeners.plain, Tag::new(ACCEPTING, 0, Op::Accept));
            side.accept_armed = true;
        }
        if let Err(error) = side.ring.submit() {
            tracing::error!(%error, "io_uring submission failed");
        }
    }

    /// Cancels the multishot accept: shutdown has begun.
    pub(super) fn stop_ring_accept(&mut self) {
        if let Some(side) = &mut self.ring {
            side.backlog.clear();
            side.ring.shared().direct.set(true);
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
