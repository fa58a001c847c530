//! One event loop: readiness → session → write. A mio `Poll`, its `SO_REUSEPORT` listener, a
//! slab of connections (each a [`Session`] over a [`Transport`]), one shared read buffer, a
//! timer heap, a chunk pool, and the inbox other loops publish into.
//!
//! The HTTP side of a connection (the request before the upgrade, refusals, plain routes) is
//! in [`http`](super::http); the fan-out of published messages in
//! [`fan_out`](super::fan_out).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use freeboard_buf::{Budget, Frame, Pool, PoolConfig, SendQueue, Watermarks, Writability};
use freeboard_proto::{CloseCode, Instant, State};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use super::shared::Shared;
use crate::config::ServerConfig;
use crate::handler::{ConnId, Router};
use crate::metrics::{LogThrottle, LoopGauges, LoopLabel, LoopStats, close_label};
use crate::parking::ParkingLot;
use crate::session::{Assembly, Context, Phase, Reassembly, Session, Share};
use crate::topics::{LocalTopics, Publication};
use crate::transport::Transport;

const LISTENER: Token = Token(usize::MAX - 1);
pub(crate) const WAKER: Token = Token(usize::MAX - 2);
/// Slices per `writev`: 256 segments cover 1 MiB of 4 KiB chunks.
const IOV: usize = 256;
/// Connection slots (and timer and dirty-list entries) a loop starts with and shrinks back to.
const INITIAL_CONNS: usize = 1024;
/// Reads of one connection per loop turn before the others get their turn.
const READS_PER_TURN: usize = 16;
/// How long a closed connection waits for the peer's EOF after our FIN.
pub(super) const LINGER: Duration = Duration::from_secs(2);
/// How long accepting waits after `accept` failed for want of descriptors or memory
/// (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) before it tries again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Connections accepted per loop turn. A storm of connects then cannot hold up the
/// connections already open, and peers that hung up are seen (and their per-address count
/// released) before the next batch is admitted.
const ACCEPT_BATCH: usize = 64;

/// One connection of a loop: its session, its transport, and the loop's bookkeeping.
pub(super) struct Entry<T> {
    pub(super) serial: u64,
    pub(super) stream: T,
    pub(super) peer: SocketAddr,
    pub(super) session: Session,
    /// The WebSocket route, once upgraded.
    pub(super) route: u32,
    /// The status its upgrade gets because it came faster than the accept rate allows.
    pub(super) limited: Option<u16>,
    /// The peer's FIN has been reported (`EPOLLRDHUP`): read to the end of the stream, since
    /// no further readiness event will come to say it is there.
    read_closed: bool,
    /// The deadline this entry has in the timer heap, if any.
    armed: Option<Instant>,
    pub(super) dirty: bool,
    /// Its queue's length as last counted in the loop's `buffered` total (saturating at
    /// 4 GiB, which keeps the entry small).
    counted: u32,
    /// When its send queue got its first byte, in the loop's milliseconds plus one (0: the
    /// queue is empty), for `freeboard_send_queue_delay_seconds`.
    queued_at: u32,
}

pub(crate) struct EventLoop<T> {
    pub(super) index: u32,
    poll: Poll,
    listener: Option<TcpListener>,
    pub(super) shared: Arc<Shared>,
    /// The configuration in force, as of `generation` (see [`Shared::reload`]).
    pub(super) config: Arc<ServerConfig>,
    generation: u64,
    pub(super) router: Router,
    pub(super) conns: Slab<Entry<T>>,
    pub(super) pool: Pool<'static>,
    /// The shared read buffer: every socket of this loop is read into it.
    pub(super) read_buf: Box<[u8]>,
    /// Messages (and request bodies) that arrived in pieces, contiguous for the handler.
    pub(super) assembly: Assembly,
    pub(super) limits: Reassembly,
    /// What one connection may take from the pool while it is contended, as of the last
    /// turn's connection count.
    pub(super) share: Share,
    timers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    pub(super) dirty: Vec<usize>,
    pub(super) resume: Vec<usize>,
    serial: u64,
    /// Where idle connections' protocol state waits.
    pub(super) lot: ParkingLot,
    pub(super) drain_deadline: Option<Instant>,
    gauges: LoopGauges,
    /// Keeps the `info` lines about refusals and abnormal closes to a few a second.
    pub(super) log_throttle: LogThrottle,
    /// When to try accepting again after `accept` failed. The connections waiting in the
    /// backlog raise no new readiness event (epoll is edge-triggered), so without this retry
    /// they would wait for the next connection to arrive.
    accept_retry: Option<Instant>,
    /// The last `accept` failed (its warning is logged once per episode).
    accept_failing: bool,
    /// The backlog may hold more connections than the last batch took: accept again after
    /// the next (non-blocking) poll.
    accept_more: bool,
    /// Bytes in the send queues, as of each connection's last flush (the `send_queue_bytes`
    /// gauge).
    ///
    /// Invariant: the sum of every entry's `counted`.
    buffered: usize,
    /// Chunks held by partial request heads (see [`http`](super::http)).
    pub(super) head_chunks: usize,
    /// Chunks counted against request bodies in flight (see [`http`](super::http)).
    pub(super) body_chunks: usize,
    pub(super) stats: LoopStats,
    pub(super) topics: LocalTopics,
    /// Publications from other threads.
    pub(super) inbox: Receiver<Publication>,
    /// Publishes from this loop's handlers, fanned out once the handler returns.
    pub(super) outbox: Vec<(Arc<str>, Frame)>,
    /// The outbox's spare allocation, and whether it is being fanned out (so a publish made
    /// during a fan-out waits its turn and one publisher's messages stay in order).
    pub(super) outbox_spare: Vec<(Arc<str>, Frame)>,
    pub(super) fanning_out: bool,
    /// Writability changes a fan-out caused, reported once it is done.
    pub(super) changes: Vec<(usize, Writability)>,
}

impl<T: Transport> EventLoop<T> {
    pub(crate) fn new(
        index: u32,
        poll: Poll,
        mut listener: TcpListener,
        shared: Arc<Shared>,
    ) -> io::Result<Self> {
        let config = shared.config();
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let per_loop = config.memory / config.threads;
        let assembly_reserve =
            usize::try_from(config.max_message_size).unwrap_or(usize::MAX).min(per_loop / 4);
        let pool_bytes = per_loop - config.read_buffer - assembly_reserve;
        let chunks = pool_bytes
            / Pool::footprint(config.chunk_size, 1, freeboard_buf::DEFAULT_SEGMENTS_PER_CHUNK);
        let pool_config =
            PoolConfig::new().with_chunk_size(config.chunk_size).with_chunk_count(chunks);
        let mut pool = Pool::new(Budget::new(per_loop), pool_config).map_err(io::Error::other)?;
        pool.budget_mut().try_draw(config.read_buffer).map_err(io::Error::other)?;
        let router = (shared.factory)();
        let inbox = shared
            .hub
            .take_receiver(index)
            .ok_or_else(|| io::Error::other("event loop started twice"))?;
        let topics = LocalTopics::new(index, config.topics.max_topics_per_connection);
        Ok(Self {
            index,
            poll,
            listener: Some(listener),
            lot: ParkingLot::new(config.protocol()),
            read_buf: vec![0u8; config.read_buffer].into_boxed_slice(),
            limits: Reassembly::server(config.connection_reserve),
            share: Share::new(&pool, 0),
            gauges: LoopGauges::new(&shared.metrics, index),
            log_throttle: LogThrottle::default(),
            generation: shared.generation.load(Ordering::Acquire),
            config,
            shared,
            router,
            conns: Slab::with_capacity(INITIAL_CONNS),
            pool,
            assembly: Assembly::default(),
            timers: BinaryHeap::with_capacity(INITIAL_CONNS),
            dirty: Vec::with_capacity(INITIAL_CONNS),
            resume: Vec::with_capacity(64),
            serial: 0,
            drain_deadline: None,
            accept_retry: None,
            accept_failing: false,
            accept_more: false,
            buffered: 0,
            head_chunks: 0,
            body_chunks: 0,
            stats: LoopStats::default(),
            topics,
            inbox,
            outbox: Vec::new(),
            outbox_spare: Vec::new(),
            fanning_out: false,
            changes: Vec::new(),
        })
    }

    pub(super) fn now(&self) -> Instant {
        Instant::from_millis(self.shared.start.elapsed().as_millis() as u64)
    }

    /// Runs until shutdown has drained every connection (or the drain deadline passed).
    pub(crate) fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let label = LoopLabel { event_loop: self.index };
        let m = &self.shared.metrics;
        m.chunks_capacity.get_or_create(&label).set(self.pool.chunks_total() as i64);
        m.chunk_size.set(self.pool.chunk_size() as i64);
        m.budget_bytes.get_or_create(&label).set(self.pool.budget().limit() as i64);
        m.slots_total.get_or_create(&label).set(self.pool.segments_total() as i64);
        loop {
            let now = self.now();
            let generation = self.shared.generation.load(Ordering::Acquire);
            if generation != self.generation {
                // A reload: connections accepted from now on get the new settings.
                self.generation = generation;
                self.config = self.shared.config();
                self.limits = Reassembly::server(self.config.connection_reserve);
            }
            if self.shared.shutdown.load(Ordering::Acquire) && self.drain_deadline.is_none() {
                self.begin_shutdown(now);
                self.end_turn(now); // the close frames leave now, not after the next poll
            }
            if let Some(deadline) = self.drain_deadline
                && (self.conns.is_empty() || now >= deadline)
            {
                break;
            }
            let timeout = if self.resume.is_empty() && !self.accept_more {
                self.poll_timeout(now)
            } else {
                Some(Duration::ZERO)
            };
            match self.poll.poll(&mut events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let now = self.now();
            self.expire_timers(now);
            if self.accept_more || self.accept_retry.is_some_and(|at| at <= now) {
                self.accept_retry = None;
                self.accept(now);
            }
            for token in std::mem::take(&mut self.resume) {
                self.read(token, now);
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept(now),
                    WAKER => {}
                    Token(token) => {
                        if event.is_read_closed()
                            && let Some(entry) = self.conns.get_mut(token)
                        {
                            entry.read_closed = true;
                        }
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            self.read(token, now);
                        }
                        if event.is_writable() {
                            self.mark(token);
                        }
                    }
                }
            }
            self.drain_inbox(now);
            self.end_turn(now);
        }
        for (token, mut entry) in std::mem::take(&mut self.conns) {
            self.topics.drop_conn(&self.shared.hub, token);
            entry.session.release(&mut self.pool);
            self.shared.release(&self.config, entry.peer);
            if let Phase::Open(_) = entry.session.phase {
                self.shared.metrics.connections.dec();
            }
        }
        self.publish_gauges();
        Ok(())
    }

    fn poll_timeout(&mut self, now: Instant) -> Option<Duration> {
        let next = [self.timers.peek().map(|Reverse((at, _, _))| *at), self.drain_deadline]
            .into_iter()
            .chain([self.accept_retry])
            .flatten()
            .min();
        // Round up so a deadline is never polled for just before it is due.
        next.map(|at| at.saturating_duration_since(now) + Duration::from_millis(1))
    }

    fn begin_shutdown(&mut self, now: Instant) {
        if let Some(mut listener) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut listener);
        }
        self.drain_deadline = Some(now + self.config.drain_timeout);
        let tokens: Vec<usize> = self.conns.iter().map(|(t, _)| t).collect();
        for token in tokens {
            match self.conns[token].session.phase {
                Phase::Request { .. } | Phase::Body(_) => {
                    self.remove(token);
                    continue;
                }
                Phase::Open(_) => {
                    let (entry, mut cx) = self.split(token, now);
                    let _ =
                        entry.session.close(&mut cx, CloseCode::GOING_AWAY, "server shutting down");
                }
                Phase::Draining { .. } | Phase::Linger { .. } => {}
            }
            self.mark(token);
        }
    }

    fn accept(&mut self, now: Instant) {
        self.accept_more = false;
        for _ in 0..ACCEPT_BATCH {
            let Some(listener) = &self.listener else { return };
            let accepted = listener.accept();
            if self.accept_failing
                && !matches!(&accepted, Err(e) if e.kind() != io::ErrorKind::WouldBlock)
            {
                self.accept_failing = false;
                tracing::info!("accepting again");
            }
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) => {
                    // EMFILE and friends: the connections stay in the backlog, and the
                    // connections we have keep being served. Try again shortly (a descriptor
                    // may be freed by another thread or process, not only by us).
                    if !std::mem::replace(&mut self.accept_failing, true) {
                        tracing::warn!(error = %e, "accept failed; retrying every 50 ms");
                    }
                    self.shared.metrics.accept_errors.inc();
                    self.accept_retry = Some(now + ACCEPT_BACKOFF);
                    return;
                }
            };
            let mut stream = T::accepted(stream);
            let entry = self.conns.vacant_entry();
            let token = entry.key();
            if self
                .poll
                .registry()
                .register(&mut stream, Token(token), Interest::READABLE | Interest::WRITABLE)
                .is_err()
            {
                continue;
            }
            self.shared.metrics.accepted.inc();
            let limited = self.shared.admit(&self.config, peer, now.as_millis() as f64 / 1000.0);
            self.serial += 1;
            let config = &self.config;
            // NOTE(unwrap): validated in `ServerConfig::validate`.
            let marks =
                Watermarks::new(config.send_low, config.send_high, config.send_cap).unwrap();
            let queue = SendQueue::new(marks, config.slow_consumer);
            entry.insert(Entry {
                serial: self.serial,
                stream,
                peer,
                session: Session::request(queue, now + config.handshake_timeout),
                route: 0,
                limited,
                read_closed: false,
                armed: None,
                dirty: false,
                counted: 0,
                queued_at: 0,
            });
            self.mark(token);
        }
        self.accept_more = true;
    }

    /// Puts `token` on the list of connections to flush at the end of the turn.
    pub(super) fn mark(&mut self, token: usize) {
        if let Some(entry) = self.conns.get_mut(token)
            && !entry.dirty
        {
            entry.dirty = true;
            self.dirty.push(token);
        }
    }

    /// One connection's entry, and the session context borrowed from the loop beside it.
    pub(super) fn split(&mut self, token: usize, now: Instant) -> (&mut Entry<T>, Context<'_>) {
        let cx = Context {
            pool: &mut self.pool,
            lot: &mut self.lot,
            masks: None,
            limits: &self.limits,
            share: &self.share,
            now,
        };
        (&mut self.conns[token], cx)
    }

    fn read(&mut self, token: usize, now: Instant) {
        let Some(entry) = self.conns.get(token) else { return };
        match entry.session.phase {
            Phase::Request { .. } => self.read_request(token, now),
            Phase::Open(_) => self.read_open(token, now),
            Phase::Draining { .. } | Phase::Linger { .. } => self.read_discard(token),
            Phase::Body(_) => self.read_body(token, now),
        }
        self.mark(token);
    }

    /// Reads and discards what the peer sends after our final response or close frame. At
    /// EOF a lingering connection goes; a draining one goes once its output is out.
    pub(super) fn read_discard(&mut self, token: usize) {
        let entry = &mut self.conns[token];
        let mut reads = 0;
        let eof = loop {
            if reads == READS_PER_TURN {
                // A peer that keeps writing after the close waits its turn like any other.
                self.resume.push(token);
                break false;
            }
            reads += 1;
            match entry.stream.read(&mut self.read_buf) {
                Ok(0) => break true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break true,
            }
        };
        if eof && matches!(entry.session.phase, Phase::Linger { .. }) {
            self.remove(token);
        }
    }

    pub(super) fn read_open(&mut self, token: usize, now: Instant) {
        let mut buf = std::mem::take(&mut self.read_buf);
        let mut reads = 0;
        while let Some(entry) = self.conns.get_mut(token) {
            if !entry.session.wants_input() {
                break;
            }
            if reads == READS_PER_TURN {
                // Fairness: a busy peer waits for the next turn, after everyone else.
                self.resume.push(token);
                break;
            }
            reads += 1;
            let read_closed = entry.read_closed;
            match entry.stream.read(&mut buf) {
                Ok(0) => {
                    self.end_of_input(token, now);
                    break;
                }
                Ok(n) => {
                    self.stats.bytes_in += n as u64;
                    self.receive(token, now, &mut buf[..n]);
                    if n < buf.len() && !read_closed {
                        // A short read emptied the socket; epoll (edge-triggered) reports the
                        // next arrival, so the read that would say WouldBlock is saved. Not
                        // after the peer's FIN: nothing more arrives to report it again.
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.end_of_input(token, now);
                    break;
                }
            }
        }
        self.read_buf = buf;
        // The end of the turn parks the connection again once nothing is in flight.
        self.mark(token);
    }

    /// The peer's stream ended (or failed): the session hears of it, the handler of the close.
    pub(super) fn end_of_input(&mut self, token: usize, now: Instant) {
        let (entry, mut cx) = self.split(token, now);
        entry.session.handle_eof(&mut cx);
        self.report_close(token);
    }

    fn expire_timers(&mut self, now: Instant) {
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
            let (entry, mut cx) = self.split(token, now);
            if entry.session.handle_timeout(&mut cx) {
                if request {
                    self.shared.metrics.handshake_timeouts.inc();
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
        let mut i = 0;
        while i < self.dirty.len() {
            let token = self.dirty[i];
            i += 1;
            if let Some(entry) = self.conns.get_mut(token) {
                entry.dirty = false;
                self.flush(token, now);
            }
        }
        self.dirty.clear();
        self.share = Share::new(&self.pool, self.conns.len());
        if self.conns.is_empty() && self.conns.capacity() > INITIAL_CONNS {
            // A burst of connections is over: give its memory back rather than keep the peak.
            self.conns = Slab::with_capacity(INITIAL_CONNS);
            self.timers.clear();
            self.timers.shrink_to(INITIAL_CONNS);
            self.dirty.shrink_to(INITIAL_CONNS);
            self.lot.shrink();
            // glibc keeps freed heap pages (and raises its mmap threshold after the slab's
            // big block is freed), so without a trim RSS creeps up over connect/close cycles.
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only returns free memory to the OS; it is thread-safe.
            unsafe {
                libc::malloc_trim(0);
            }
        }
        self.publish_gauges();
    }

    pub(super) fn flush(&mut self, token: usize, now: Instant) {
        let entry = &mut self.conns[token];
        if entry.queued_at == 0 && entry.session.buffered() > 0 {
            entry.queued_at = (now.as_millis() as u32).wrapping_add(1).max(1);
        }
        while entry.session.buffered() > 0 {
            let mut iov = [IoSlice::new(&[]); IOV];
            let n = entry.session.io_slices(&self.pool, &mut iov);
            let offered: usize = iov[..n].iter().map(|s| s.len()).sum();
            match entry.stream.write_vectored(&iov[..n]) {
                Ok(written) => {
                    self.stats.bytes_out += written as u64;
                    entry.session.consume(&mut self.pool, written);
                    if written < offered {
                        break; // the socket is full: WRITABLE will bring us back
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    entry.session.clear_queue(&mut self.pool);
                    self.end_of_input(token, now);
                    self.remove(token);
                    return;
                }
            }
        }
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
            entry.session.after_flush(&mut self.pool, now, config.close_timeout, LINGER);
        if transition.closed {
            self.shared.metrics.connections.dec();
            self.topics.drop_conn(&self.shared.hub, token);
        }
        if transition.shutdown_write {
            // The server closes the TCP connection first (§7.1.1).
            let _ = self.conns[token].stream.shutdown_write();
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
        self.topics.drop_conn(&self.shared.hub, token);
        self.forget_request(token);
        let mut entry = self.conns.remove(token);
        self.buffered -= entry.counted as usize;
        entry.session.release(&mut self.pool);
        self.shared.release(&self.config, entry.peer);
        if let Phase::Open(_) = entry.session.phase {
            self.shared.metrics.connections.dec();
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

    fn publish_gauges(&mut self) {
        self.stats.publish(&self.shared.metrics);
        let c = self.pool.counters();
        let g = &mut self.gauges;
        g.chunks_in_use.set(c.chunks_in_use as i64);
        g.chunks_high_water.set(c.chunks_high_water as i64);
        g.slots_in_use.set(c.segments_in_use as i64);
        g.slots_high_water.set(c.segments_high_water as i64);
        g.send_queue_bytes.set(self.buffered as i64);
        self.gauges.allocation_failures(c.allocation_failures);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle connection costs its slab entry and nothing else (its protocol state is parked
    /// inside it): keep it small, 10,000 idle connections should need about 2 MB. (208: the
    /// 200 it was, and the time its send queue got its first byte, for the queue-delay
    /// histogram.)
    #[test]
    fn idle_connection_state_stays_small() {
        let entry = size_of::<Entry<mio::net::TcpStream>>();
        println!("Entry {entry} B");
        assert!(entry <= 208, "Entry is {entry} bytes");
    }
}
