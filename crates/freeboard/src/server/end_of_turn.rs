//! The end of a loop turn: timers that expired, one flush (one `writev`) per connection
//! touched, the moves from open to draining to linger, removals, and the gauges.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;

use freeboard_buf::{PushOutcome, Writability};
use freeboard_proto::{CloseCode, Instant, State};

use slab::Slab;

use super::event_loop::{EventLoop, INITIAL_CONNS, LINGER, RELEASE_INTERVAL, loop_context};
use crate::handler::ConnId;
use crate::metrics::close_label;
use crate::session::{FairShare, Phase};
use crate::transport::{Io, Transport};

/// Rounds of the io_uring sends one turn's end makes (each after the flushes of the last
/// round's completions); the flushes after the last write straight to the sockets.
#[cfg(target_os = "linux")]
const SEND_ROUNDS: usize = 4;

impl<T: Transport> EventLoop<T> {
    pub(super) fn expire_timers(&mut self, now: Instant) {
        while let Some(&Reverse((at, token, serial))) = self.expiries.peek() {
            if at > now {
                break;
            }
            self.expiries.pop();
            self.expire_authorization(token, serial, now);
        }
        while let Some(&Reverse((at, token, serial))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(entry) = self.conns.get_mut(token) else { continue };
            if entry.serial != serial || entry.armed != Some(at) {
                continue; // stale: the entry re-armed or the slot was reused
            }
            entry.armed = None;
            let request = matches!(entry.session.phase, Phase::Request { .. } | Phase::Body(_));
            if request && self.pending.contains_key(&token) {
                self.decision_timed_out(token, now);
                continue;
            }
            if request && self.awaiting.contains_key(&token) {
                self.answer_publish(token, serial, now, false);
                continue;
            }
            let tls = self.conns[token].stream.tls_established();
            let (entry, mut cx) = self.split(token, now);
            if entry.session.handle_timeout(&mut cx) {
                if request {
                    self.shared.metrics.handshake_timeouts.inc();
                    match tls {
                        Some(false) => self.shared.metrics.tls_refusal("handshake_timeout"),
                        Some(true) => self.shared.metrics.tls_refusal("upgrade_timeout"),
                        None => {}
                    }
                    tracing::debug!(peer = %self.conns[token].peer, "request timeout");
                }
                self.remove(token);
                continue;
            }
            self.report_close(token);
            self.mark(token);
        }
    }

    /// Flushes every connection touched this turn (one `writev` each), moves finished ones
    /// along, re-arms timers.
    pub(super) fn end_turn(&mut self, now: Instant) {
        if self.release_at.is_none() && self.pool.has_memory_to_release() {
            self.release_at = Some(now + RELEASE_INTERVAL);
        }
        self.reclaim(now);
        #[cfg(target_os = "linux")]
        self.ring_batches(true);
        let mut i = 0;
        #[cfg(target_os = "linux")]
        let mut rounds = 0;
        loop {
            while i < self.dirty.len() {
                let token = self.dirty[i];
                i += 1;
                if let Some(entry) = self.conns.get_mut(token) {
                    entry.dirty = false;
                    self.flush(token, now);
                }
            }
            // The ring's sends leave together; what their completions marked is flushed in
            // turn, a few rounds, after which those flushes write straight to the sockets.
            #[cfg(target_os = "linux")]
            if self.ring.is_some() && self.send_ring(now) {
                rounds += 1;
                self.ring_batches(rounds < SEND_ROUNDS);
                continue;
            }
            break;
        }
        #[cfg(target_os = "linux")]
        self.ring_batches(false);
        self.dirty.clear();
        self.share = FairShare::beside(&self.pool, self.conns.len(), self.ring_chunks());
        if self.conns.is_empty() && self.conns.capacity() > INITIAL_CONNS {
            // A burst of connections is over: give its memory back rather than keep the peak.
            // The old tables go first and the new ones start empty (they grow again on
            // demand): a table allocated before the trim would sit on heap pages the burst had
            // touched and keep them resident.
            self.conns = Slab::new();
            self.timers = BinaryHeap::new();
            self.dirty = Vec::new();
            self.lot.shrink();
            // The pool gives its own pages back (`release_idle`); the heap is glibc's: it keeps
            // freed pages (and raises its mmap threshold after the slab's big block is freed),
            // so without a trim the tables' pages stay resident after every burst.
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only returns free memory to the OS; it is thread-safe.
            unsafe {
                libc::malloc_trim(0);
            }
        } else if self.timers.capacity() > INITIAL_CONNS
            && self.timers.len() < self.timers.capacity() / 4
        {
            // Fewer connections with deadlines than a quarter of the heap's room: halve it.
            self.timers.shrink_to(self.timers.capacity() / 2);
        }
        self.publish_gauges();
    }

    /// Charges a contended pool to the connections behind it: a message in pieces past its
    /// share is ended (1013), and each connection behind and past its share — or, while the
    /// pool is tight, past its share at all — meets its policy now
    /// ([`Session::reclaim`](crate::session::Session::reclaim)) rather than at a next push
    /// that may never come (a connection behind is not read). One pass per new
    /// low of the pool's free chunks or slots, so a contention nothing can relieve (every
    /// culprit under `block`) is not swept again and again.
    pub(super) fn reclaim(&mut self, now: Instant) {
        if self.share.uncontended(&self.pool, 0) {
            self.swept = None;
            return;
        }
        let free = |pool: &freeboard_buf::Pool<'_>| {
            (pool.chunks_free(), pool.segments_total() - pool.segments_in_use())
        };
        let (chunks, slots) = free(&self.pool);
        if self.swept.is_some_and(|(c, s)| chunks >= c && slots >= s) {
            return;
        }
        let mut changes = std::mem::take(&mut self.changes);
        for token in 0..self.conns.capacity() {
            self.reclaim_one(token, now, 0, &mut changes);
        }
        self.writability_changes(now, changes);
        self.swept = Some(free(&self.pool));
    }

    /// Makes room for a fan-out that takes `need` slots (one per delivery of a shared frame)
    /// when the pool would be left below its floor: the connections holding the most past
    /// their share pay first ([`FairShare::short_of`]), until there is room. Without it, the
    /// subscribers a publication meets first take the last slots and those after them — who
    /// may read everything — lose it (`pool_exhausted`), while subscribers that never read
    /// hold a slot for each of their many small messages below their high watermark.
    pub(super) fn make_room(&mut self, now: Instant, need: usize) {
        if !self.share.short_of(&self.pool, need) {
            return;
        }
        let mut holders: Vec<(u32, usize)> = self
            .conns
            .iter()
            .map(|(token, entry)| (entry.session.queue().messages(), token))
            .filter(|(messages, _)| *messages > 0)
            .collect();
        holders.sort_unstable_by(|a, b| b.cmp(a));
        let mut changes = std::mem::take(&mut self.changes);
        for (_, token) in holders {
            if !self.share.short_of(&self.pool, need) {
                break;
            }
            self.reclaim_one(token, now, need, &mut changes);
        }
        self.writability_changes(now, changes);
    }

    /// [`Session::reclaim`](crate::session::Session::reclaim) of connection `token`, if it
    /// is one, with `need` slots about to be taken; counts what it did.
    fn reclaim_one(
        &mut self,
        token: usize,
        now: Instant,
        need: usize,
        changes: &mut Vec<(usize, Writability)>,
    ) {
        let Some(entry) = self.conns.get_mut(token) else { return };
        let policy = entry.session.queue().policy();
        let behind = !entry.session.queue().is_writable();
        let mut cx = loop_context!(self, now, None);
        let ended = entry.session.reclaim_reassembly(&mut cx);
        match entry.session.reclaim(&mut cx, need) {
            None if !ended => return,
            None => {}
            Some(PushOutcome::Dropped { messages, .. }) => {
                self.stats.policy_drops[policy] += u64::from(messages);
            }
            Some(outcome) => {
                if let PushOutcome::MustClose { messages, .. } = outcome {
                    self.stats.policy_drops[policy] += u64::from(messages);
                }
                if behind {
                    self.shared.metrics.slow_consumer_closes.inc();
                }
            }
        }
        if let Some(change) = entry.session.take_writability() {
            changes.push((token, change));
        }
        if !entry.dirty {
            entry.dirty = true;
            self.dirty.push(token);
        }
    }

    /// Reports the writability changes a sweep caused, and keeps the list's room.
    fn writability_changes(&mut self, now: Instant, mut changes: Vec<(usize, Writability)>) {
        for (token, change) in changes.drain(..) {
            if self.conns.contains(token) {
                self.writability_changed(token, now, change);
            }
        }
        self.changes = changes;
    }

    pub(super) fn flush(&mut self, token: usize, now: Instant) {
        let entry = &mut self.conns[token];
        if entry.queued_at == 0 && entry.session.buffered() > 0 {
            entry.queued_at = (now.as_millis() as u32).wrapping_add(1).max(1);
        }
        // An HTTP/2 stream leaves as DATA through its connection's socket; the connection's
        // own entry writes what its core owes (`http2.rs`). One test of the transport (and,
        // for a connection not open, of its phase) on the HTTP/1.1 path.
        let carrier = entry.stream.carrier();
        if let Some((connection, id)) = carrier {
            let before = entry.session.buffered();
            if !self.write_http2_stream(token, connection, id) {
                return;
            }
            self.stats.bytes_out += (before - self.conns[token].session.buffered()) as u64;
        } else if matches!(entry.session.phase, Phase::Request { .. })
            && self.http2.contains_key(&token)
        {
            self.flush_http2(token);
            return;
        } else {
            // Whether the socket refused part of what it was offered tells what it holds;
            // through io_uring, the send's completion tells (`completions.rs`).
            let offered = entry.session.buffered() > 0 && !entry.stream.sends_later();
            let mut io =
                Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
            // What the transport itself holds (TLS records the socket did not take) goes first.
            let mut pending = entry.stream.write_pending(&mut io);
            while matches!(pending, Ok(true)) && entry.session.buffered() > 0 {
                match entry.stream.write_queue(&mut entry.session, &mut io) {
                    Ok((written, all)) => {
                        self.stats.bytes_out += written as u64;
                        if !all {
                            break; // the socket is full: WRITABLE will bring us back
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => pending = Err(e),
                }
            }
            if pending.is_err() {
                self.stats.closed += u64::from(entry.session.clear_queue(io.pool));
                self.end_of_input(token, now);
                self.remove(token);
                return;
            }
            if offered {
                self.wrote_to_socket(token, self.conns[token].session.buffered() > 0);
            }
        }
        let entry = &mut self.conns[token];
        if entry.queued_at != 0 && entry.session.buffered() == 0 {
            let since = entry.queued_at - 1;
            self.stats.queue_drained(u64::from((now.as_millis() as u32).wrapping_sub(since)));
            entry.queued_at = 0;
        }
        if let Some(change) = self.conns[token].session.take_writability() {
            self.writability_changed(token, now, change);
        }
        if self.conns[token].session.state() == State::Closed {
            // The close event the core may still hold, before the session leaves the protocol.
            self.report_close(token);
        }
        let config = &self.config;
        let entry = &mut self.conns[token];
        let transition =
            entry.session.after_flush(&mut self.pool, now, config.limits.close_timeout, LINGER);
        if transition.closed {
            let (event_stream, serial) = (entry.session.is_event_stream(), entry.serial);
            self.left_open(event_stream);
            self.drop_subscriptions(token, serial);
        }
        if transition.shutdown_write
            && let Some((connection, id)) = carrier
        {
            // A stream's end is END_STREAM (or a reset), not a FIN.
            self.end_http2_stream(token, connection, id);
        } else if transition.shutdown_write {
            // The server closes the TCP connection first (§7.1.1).
            let mut io =
                Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
            let _ = self.conns[token].stream.shutdown_write(&mut io);
            self.read_discard(token);
        }
        if let Some(entry) = self.conns.get_mut(token) {
            entry.session.park(&mut self.lot);
            let queued = u32::try_from(entry.session.buffered()).unwrap_or(u32::MAX);
            self.buffered = self.buffered - entry.counted as usize + queued as usize;
            entry.counted = queued;
            if let Some(at) = entry.session.poll_timeout()
                && entry.armed.is_none_or(|armed| at < armed)
            {
                entry.armed = Some(at);
                self.timers.push(Reverse((at, token, entry.serial)));
            }
        }
    }

    pub(super) fn remove(&mut self, token: usize) {
        if let Some((connection, id)) = self.conns[token].stream.carrier() {
            self.forget_http2_stream(connection, id);
        } else if !self.http2.is_empty() {
            self.forget_http2_connection(token);
        }
        self.drop_subscriptions(token, self.conns[token].serial);
        self.forget_request(token);
        self.forget_kernel_buffers(token);
        let mut entry = self.conns.remove(token);
        self.upgraded -= usize::from(entry.upgraded);
        self.event_streams -= usize::from(entry.event_stream.is_some());
        self.charge_connections();
        self.buffered -= entry.counted as usize;
        self.stats.closed += u64::from(entry.session.release(&mut self.pool));
        let mut io = Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
        entry.stream.release(&mut io);
        self.shared.release(&self.config, entry.peer, entry.attributed);
        if self.pending.remove(&token).is_some() {
            self.shared.release_pending();
        }
        self.data.remove(&token);
        self.subjects.remove(&token);
        self.plain.remove(&token);
        self.awaiting.remove(&token);
        if let Phase::Open(_) = entry.session.phase {
            self.left_open(entry.session.is_event_stream());
            if !entry.session.close_reported() {
                self.shared.metrics.close(close_label(CloseCode::ABNORMAL));
                if let Some(suppressed) = self.log_throttle.allow(self.now().as_millis()) {
                    let peer = entry.peer;
                    tracing::info!(code = 1006, %peer, suppressed, "closed abnormally: connection dropped");
                }
                let id = ConnId { event_loop: self.index, serial: entry.serial };
                self.router.handler(entry.route as usize).on_close(id, CloseCode::ABNORMAL, "");
            }
        }
        // Dropping the stream closes the socket and removes it from the poll.
    }

    /// A connection leaves the open phase (closed, or dropped while open): the gauges follow.
    pub(super) fn left_open(&mut self, event_stream: bool) {
        self.shared.metrics.connections.dec();
        if event_stream {
            self.shared.metrics.event_streams.dec();
        }
    }

    pub(super) fn publish_gauges(&mut self) {
        let subscribed = &self.topics.deltas;
        let (topics, has) = (subscribed.topic_count(), |t: &str| subscribed.has_topic(t));
        self.topic_deltas.retire_unsubscribed(topics, has, &mut self.pool);
        self.stats.publish(&self.shared.metrics);
        let c = self.pool.counters();
        // An io_uring loop's receive buffers are its read buffer, not anyone's data: counted
        // apart (`pool_receive_buffer_chunks`), as an epoll loop's read buffer is not a chunk.
        #[cfg(target_os = "linux")]
        let taken = self.ring.as_ref().map_or(0, |side| side.ring.buffer_count());
        #[cfg(not(target_os = "linux"))]
        let taken = 0;
        let own = self.ring_chunks();
        let g = &mut self.gauges;
        g.chunks_in_use.set(c.chunks_in_use.saturating_sub(own) as i64);
        g.chunks_high_water.set(c.chunks_high_water.saturating_sub(taken) as i64);
        g.slots_in_use.set(c.segments_in_use as i64);
        g.slots_high_water.set(c.segments_high_water as i64);
        g.send_queue_bytes.set(self.buffered as i64);
        g.pool_resident_bytes.set(self.pool.resident_bytes() as i64);
        g.chunks_withheld.set(self.pool.chunks_withheld() as i64);
        let open = self.shared.open.load(std::sync::atomic::Ordering::Relaxed);
        let buffers = self.shared.kernel_buffers.load(std::sync::atomic::Ordering::Relaxed);
        let kernel = open * self.shared.socket_cost.bytes + buffers;
        self.shared.metrics.kernel_estimate_bytes.set(kernel as i64);
        self.shared.metrics.kernel_buffer_charge_bytes.set(buffers as i64);
        g.allocation_failures(c.allocation_failures);
        if self.router.keeps_dashboard_samples() {
            self.shared.metrics.sample_for_dashboard();
        }
        if self.router.serves_admin_views() {
            self.sweep_lag(self.now());
        }
    }
}
