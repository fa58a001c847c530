//! One event loop: a mio `Poll`, its `SO_REUSEPORT` listener, a slab of connections, one
//! shared read buffer, a timer table and a chunk pool.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use freeboard_buf::{
    Budget, ChunkChain, Frame, Pool, PoolConfig, PushOutcome, SendQueue, SlowConsumerPolicy,
    Watermarks, Writability,
};
use freeboard_proto::handshake::{self, EMPTY_HEADER, HandshakeError, Request};
use freeboard_proto::{CloseCode, Event, Instant, MessageKind, State};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::handler::{Conn, ConnId, Message, Router, Upgrade, queue_control};
use crate::metrics::{LoopGauges, LoopLabel, LoopStats};
use crate::parking::{ParkingLot, Ws};
use crate::server::Shared;
use crate::topics::{LocalTopics, Publication};

const LISTENER: Token = Token(usize::MAX - 1);
pub(crate) const WAKER: Token = Token(usize::MAX - 2);
/// Slices per `writev`: 256 segments cover 1 MiB of 4 KiB chunks.
const IOV: usize = 256;
/// Connection slots (and timer and dirty-list entries) a loop starts with and shrinks back to.
const INITIAL_CONNS: usize = 1024;
/// Reads of one connection per loop turn before the others get their turn.
const READS_PER_TURN: usize = 16;
/// How long a closed connection waits for the peer's EOF after our FIN.
const LINGER: Duration = Duration::from_secs(2);
/// How long accepting waits after `accept` failed for want of descriptors or memory
/// (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) before it tries again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Connections accepted per loop turn. A storm of connects then cannot hold up the
/// connections already open, and peers that hung up are seen (and their per-address count
/// released) before the next batch is admitted.
const ACCEPT_BATCH: usize = 64;
/// The share of the pool's chunks (1 / this) that partial request heads may hold together.
const HEAD_SHARE: usize = 4;

/// Where a connection stands.
enum Phase {
    /// Waiting for a complete upgrade request until `deadline`.
    Handshake { deadline: Instant },
    /// A WebSocket connection on route `route`.
    Open {
        ws: Ws,
        route: usize,
        /// Reading stopped because the send queue is above its high watermark.
        paused: bool,
        /// `on_close` has run.
        close_reported: bool,
        /// The message being read did not fit: its remaining pieces are dropped.
        discarding: bool,
        /// The peer's FIN has been reported (`EPOLLRDHUP`): read to the end of the stream,
        /// since no further readiness event will come to say it is there.
        read_closed: bool,
    },
    /// A final HTTP response or close frame is leaving; then our FIN.
    Draining { deadline: Instant },
    /// Our FIN is sent; reading until the peer's EOF so unread bytes cannot turn our close
    /// into a reset.
    Linger { deadline: Instant },
    /// Reading the body of `POST {topics.path}{name}` into `partial`.
    Body(Box<PostBody>),
}

/// A `POST` publish whose body is still arriving.
struct PostBody {
    deadline: Instant,
    topic: Box<str>,
    kind: MessageKind,
    /// Body bytes still to read.
    remaining: usize,
}

struct Entry {
    serial: u64,
    stream: TcpStream,
    peer: SocketAddr,
    phase: Phase,
    queue: SendQueue,
    /// The status its upgrade gets because it came faster than the accept rate allows.
    limited: Option<u16>,
    /// Partial request head or partial message; empty (no chunk) when idle.
    partial: ChunkChain,
    /// The deadline this entry has in the timer heap, if any.
    armed: Option<Instant>,
    dirty: bool,
    /// Its queue's length as last counted in the loop's `buffered` total (saturating at
    /// 4 GiB, which keeps the entry small).
    counted: u32,
}

pub(crate) struct EventLoop {
    index: u32,
    poll: Poll,
    listener: Option<TcpListener>,
    shared: Arc<Shared>,
    router: Router,
    conns: Slab<Entry>,
    pool: Pool<'static>,
    /// The shared read buffer: every socket of this loop is read into it.
    read_buf: Box<[u8]>,
    /// Messages that arrived in pieces are copied here, contiguous, for the handler.
    assembly: Vec<u8>,
    /// Invariant: `assembly.capacity()` bytes are drawn from the pool's budget.
    assembly_drawn: usize,
    timers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    dirty: Vec<usize>,
    resume: Vec<usize>,
    serial: u64,
    /// Where idle connections' protocol state waits.
    lot: ParkingLot,
    drain_deadline: Option<Instant>,
    gauges: LoopGauges,
    /// When to try accepting again after `accept` failed. The connections waiting in the
    /// backlog raise no new readiness event (epoll is edge-triggered), so without this retry
    /// they would wait for the next connection to arrive.
    accept_retry: Option<Instant>,
    /// The last `accept` failed (its warning is logged once per episode).
    accept_failing: bool,
    /// The backlog may hold more connections than the last batch took: accept again after
    /// the next (non-blocking) poll.
    accept_more: bool,
    /// Bytes in the send queues, as of each connection's last flush (the `bytes_buffered`
    /// gauge).
    ///
    /// Invariant: the sum of every entry's `counted`.
    buffered: usize,
    /// Chunks held by partial request heads (as counted by [`head_chunks`]).
    ///
    /// Invariant: at most `pool.chunks_total() / HEAD_SHARE`, so connections that have not
    /// finished their request (slowloris) cannot take the memory open connections need.
    head_chunks: usize,
    stats: LoopStats,
    topics: LocalTopics,
    /// Publications from other threads.
    inbox: Receiver<Publication>,
    /// Publishes from this loop's handlers, fanned out once the handler returns.
    outbox: Vec<(Arc<str>, Frame)>,
    /// The outbox's spare allocation, and whether it is being fanned out (so a publish made
    /// during a fan-out waits its turn and one publisher's messages stay in order).
    outbox_spare: Vec<(Arc<str>, Frame)>,
    fanning_out: bool,
    /// Writability changes a fan-out caused, reported once it is done.
    changes: Vec<(usize, Writability)>,
}

impl EventLoop {
    pub(crate) fn new(
        index: u32,
        poll: Poll,
        mut listener: TcpListener,
        shared: Arc<Shared>,
    ) -> io::Result<Self> {
        let config = &shared.config;
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
            gauges: LoopGauges::new(&shared.metrics, index),
            shared,
            router,
            conns: Slab::with_capacity(INITIAL_CONNS),
            pool,
            assembly: Vec::new(),
            assembly_drawn: 0,
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
            stats: LoopStats::default(),
            topics,
            inbox,
            outbox: Vec::new(),
            outbox_spare: Vec::new(),
            fanning_out: false,
            changes: Vec::new(),
        })
    }

    fn now(&self) -> Instant {
        Instant::from_millis(self.shared.start.elapsed().as_millis() as u64)
    }

    /// Runs until shutdown has drained every connection (or the drain deadline passed).
    pub(crate) fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let label = LoopLabel { event_loop: self.index };
        let m = &self.shared.metrics;
        m.chunks_total.get_or_create(&label).set(self.pool.chunks_total() as i64);
        m.budget_bytes.get_or_create(&label).set(self.pool.budget().limit() as i64);
        loop {
            let now = self.now();
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
                            && let Some(Entry { phase: Phase::Open { read_closed, .. }, .. }) =
                                self.conns.get_mut(token)
                        {
                            *read_closed = true;
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
            let _ = entry.queue.clear(&mut self.pool);
            entry.partial.clear(&mut self.pool);
            self.shared.release(entry.peer);
            if let Phase::Open { .. } = entry.phase {
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
        self.drain_deadline = Some(now + self.shared.config.drain_timeout);
        let tokens: Vec<usize> = self.conns.iter().map(|(t, _)| t).collect();
        for token in tokens {
            let entry = &mut self.conns[token];
            match &mut entry.phase {
                Phase::Handshake { .. } | Phase::Body(_) => {
                    self.remove(token);
                    continue;
                }
                Phase::Open { ws, .. } => {
                    let ws = self.lot.wake(ws);
                    let _ = ws.close(now, CloseCode::GOING_AWAY, "server shutting down");
                    queue_control(ws, &mut entry.queue, &mut self.pool);
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
            let (mut stream, peer) = match accepted {
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
            let _ = stream.set_nodelay(true);
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
            let limited = self.shared.admit(peer, now.as_millis() as f64 / 1000.0);
            self.serial += 1;
            let config = &self.shared.config;
            // NOTE(unwrap): validated in `ServerConfig::validate`.
            let marks =
                Watermarks::new(config.send_low, config.send_high, config.send_cap).unwrap();
            entry.insert(Entry {
                serial: self.serial,
                stream,
                peer,
                phase: Phase::Handshake { deadline: now + config.handshake_timeout },
                queue: SendQueue::new(marks, config.slow_consumer),
                limited,
                partial: ChunkChain::new(),
                armed: None,
                dirty: false,
                counted: 0,
            });
            self.mark(token);
        }
        self.accept_more = true;
    }

    fn mark(&mut self, token: usize) {
        if let Some(entry) = self.conns.get_mut(token)
            && !entry.dirty
        {
            entry.dirty = true;
            self.dirty.push(token);
        }
    }

    fn read(&mut self, token: usize, now: Instant) {
        let Some(entry) = self.conns.get(token) else { return };
        match entry.phase {
            Phase::Handshake { .. } => self.read_handshake(token, now),
            Phase::Open { .. } => self.read_open(token, now),
            Phase::Draining { .. } | Phase::Linger { .. } => self.read_discard(token),
            Phase::Body(_) => self.read_body(token, now),
        }
        self.mark(token);
    }

    /// Reads and discards what the peer sends after our final response or close frame. At
    /// EOF a lingering connection goes; a draining one goes once its output is out.
    fn read_discard(&mut self, token: usize) {
        let entry = &mut self.conns[token];
        let eof = loop {
            match entry.stream.read(&mut self.read_buf) {
                Ok(0) => break true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break true,
            }
        };
        if eof && matches!(entry.phase, Phase::Linger { .. }) {
            self.remove(token);
        }
    }

    fn read_handshake(&mut self, token: usize, now: Instant) {
        let mut buf = std::mem::take(&mut self.read_buf);
        let entry = &mut self.conns[token];
        let mut have = entry.partial.copy_to(&self.pool, &mut buf);
        self.head_chunks -= head_chunks(have, self.pool.chunk_size());
        entry.partial.clear(&mut self.pool);
        let mut eof = false;
        while have < buf.len() {
            match entry.stream.read(&mut buf[have..]) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => have += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
        self.stats.bytes_in += have as u64;
        let open = self.handshake(token, now, &mut buf[..have], eof);
        self.read_buf = buf;
        if let Some(Entry { phase: Phase::Body(_), .. }) = self.conns.get(token) {
            self.read_body(token, now);
        } else if open && eof {
            // The request and the end of the stream came together: nothing more will arrive.
            if let Phase::Open { ws, .. } = &mut self.conns[token].phase {
                self.lot.wake(ws).handle_eof();
            }
            self.after_input(token);
        } else if open {
            self.read_open(token, now);
        }
    }

    /// Handles the request bytes in `buf`. Returns whether the connection is now open.
    fn handshake(&mut self, token: usize, now: Instant, buf: &mut [u8], eof: bool) -> bool {
        const MAX_HEAD: usize = handshake::DEFAULT_MAX_HEAD_LEN;
        let mut headers = [EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        let parsed = req.parse(buf);
        let (path, upgrade, head_len) = match parsed {
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD && !eof => {
                // Partial heads are untrusted: together they may hold a share of the pool
                // only, so slow clients cannot starve the connections already open.
                let chunks = head_chunks(buf.len(), self.pool.chunk_size());
                if self.head_chunks + chunks > self.pool.chunks_total() / HEAD_SHARE {
                    let retry = "Retry-After: 1\r\n";
                    return self.refuse(token, now, 503, retry, "too many partial requests");
                }
                let entry = &mut self.conns[token];
                if entry.partial.append(&mut self.pool, buf).is_err() {
                    entry.partial.clear(&mut self.pool);
                    let retry = "Retry-After: 1\r\n";
                    return self.refuse(token, now, 503, retry, "server memory budget exhausted");
                }
                self.head_chunks += chunks;
                return false;
            }
            Ok(httparse::Status::Partial) if eof => {
                self.remove(token);
                return false;
            }
            Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => (
                req.path.unwrap_or("/"),
                req.headers.iter().any(|h| h.name.eq_ignore_ascii_case("upgrade")),
                len,
            ),
            Ok(_) | Err(httparse::Error::TooManyHeaders) => {
                return self.refuse_error(token, now, HandshakeError::HeadTooLarge);
            }
            Err(_) => return self.refuse_error(token, now, HandshakeError::Malformed),
        };
        let route = self.router.find(path);
        if !upgrade {
            let target = path.split('?').next().unwrap_or(path);
            let topics = &self.shared.config.topics;
            if req.method == Some("POST")
                && topics.http_publish
                && !topics.path.is_empty()
                && let Some(topic) = target.strip_prefix(topics.path.as_str())
            {
                let topic = topic.to_owned();
                self.http_publish(token, now, &topic, req.headers, &buf[head_len..]);
                return false;
            }
            match (target, route) {
                ("/healthz", _) => {
                    self.respond(token, now, 200, "text/plain", b"ok\n");
                }
                ("/metrics", _) => {
                    let text = self.shared.metrics.encode();
                    self.respond(
                        token,
                        now,
                        200,
                        "text/plain; version=0.0.4; charset=utf-8",
                        text.as_bytes(),
                    )
                }
                (_, Some(_)) => {
                    self.refuse_error(token, now, HandshakeError::UpgradeRequired);
                }
                (_, None) => {
                    self.refuse(token, now, 404, "", "no such route");
                }
            }
            return false;
        }
        let Some(route) = route else {
            self.refuse(token, now, 404, "", "no such route");
            return false;
        };
        let options = *self.router.options(route);
        let mut headers = [EMPTY_HEADER; 64];
        let (request, len) = match Request::parse(buf, &mut headers, MAX_HEAD) {
            Ok(Some(parsed)) => parsed,
            Ok(None) => unreachable!("httparse found the head complete"),
            Err(e) => return self.refuse_error(token, now, e),
        };
        let config = &self.shared.config;
        let peer = self.conns[token].peer;
        let retry_after = config.retry_after.as_secs().max(1);
        if let Some(status) = self.conns[token].limited {
            let retry = format!("Retry-After: {retry_after}\r\n");
            self.refuse(token, now, status, &retry, "connecting too fast: accept rate limit");
            return false;
        }
        if self.shared.per_ip(peer) > config.max_connections_per_ip {
            let retry = format!("Retry-After: {retry_after}\r\n");
            self.refuse(token, now, 429, &retry, "too many connections from this address");
            return false;
        }
        if self.shared.open.load(Ordering::Relaxed) > config.max_connections
            || self.drain_deadline.is_some()
        {
            self.refuse(token, now, 503, "Retry-After: 1\r\n", "server at its connection limit");
            return false;
        }
        if self.pool.chunks_free() * self.pool.chunk_size() < config.connection_reserve {
            self.refuse(token, now, 503, "Retry-After: 1\r\n", "server memory budget exhausted");
            return false;
        }
        let mut response = [0u8; 1024];
        let n = match self.router.handler(route).on_upgrade(&request) {
            Upgrade::Accept { protocol } => match request.accept(protocol, None, &mut response) {
                Ok(n) => n,
                Err(_) => return self.refuse(token, now, 500, "", "response too large"),
            },
            Upgrade::Reject(status) => return self.refuse(token, now, status, "", "refused"),
        };
        let entry = &mut self.conns[token];
        if options.slow_consumer.is_some() || options.watermarks.is_some() {
            // NOTE: nothing has been queued before the 101 response, so the queue is empty.
            debug_assert!(entry.queue.is_empty());
            let marks = options.watermarks.unwrap_or(*entry.queue.watermarks());
            let policy = options.slow_consumer.unwrap_or(entry.queue.policy());
            entry.queue = SendQueue::new(marks, policy);
        }
        // Not a message: no policy may drop the 101 for a message queued after it (conflate
        // would, for the first publication to a new subscriber).
        if entry.queue.push_preamble(&mut self.pool, &response[..n]).is_err() {
            self.remove(token);
            return false;
        }
        entry.phase = Phase::Open {
            ws: Ws::new(self.lot.config(), now),
            route,
            paused: false,
            close_reported: false,
            discarding: false,
            read_closed: false,
        };
        self.shared.metrics.connections.inc();
        self.call_with(token, now, path, |handler, conn| handler.on_open(conn));
        if len < buf.len() {
            self.receive(token, now, &mut buf[len..]);
        }
        true
    }

    fn refuse_error(&mut self, token: usize, now: Instant, error: HandshakeError) -> bool {
        let mut out = [0u8; 512];
        // NOTE(unwrap): every refusal fits in 512 bytes.
        let n = error.write_response(&mut out).unwrap();
        self.send_final(token, now, error.status(), &out[..n]);
        false
    }

    fn refuse(&mut self, token: usize, now: Instant, status: u16, extra: &str, body: &str) -> bool {
        let mut out = [0u8; 512];
        let n = handshake::write_refusal(status, extra, body, &mut out).unwrap_or(0);
        self.send_final(token, now, status, &out[..n]);
        false
    }

    fn respond(
        &mut self,
        token: usize,
        now: Instant,
        status: u16,
        content_type: &str,
        body: &[u8],
    ) {
        let head = format!(
            "HTTP/1.1 {status} OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        self.queue_final(token, now, &[head.as_bytes(), body]);
    }

    fn send_final(&mut self, token: usize, now: Instant, status: u16, response: &[u8]) {
        self.shared.metrics.refuse(status);
        tracing::debug!(status, peer = %self.conns[token].peer, "upgrade refused");
        self.queue_final(token, now, &[response]);
    }

    /// Queues the HTTP response after which the connection closes. When the pool cannot hold
    /// it (the budget is exhausted, which is when a 503 matters most), it is written straight
    /// to the socket, whose buffer nothing else has used: the client gets its status rather
    /// than a bare EOF.
    fn queue_final(&mut self, token: usize, now: Instant, parts: &[&[u8]]) {
        let entry = &mut self.conns[token];
        let pushed = entry.queue.push_message(&mut self.pool, parts);
        if !matches!(pushed.outcome, PushOutcome::Queued | PushOutcome::QueuedAboveHigh)
            && entry.queue.is_empty()
        {
            for part in parts {
                if !matches!(entry.stream.write(part), Ok(n) if n == part.len()) {
                    break;
                }
            }
        }
        entry.phase = Phase::Draining { deadline: now + LINGER };
    }

    fn read_open(&mut self, token: usize, now: Instant) {
        let mut buf = std::mem::take(&mut self.read_buf);
        let mut reads = 0;
        while let Some(entry) = self.conns.get_mut(token) {
            let Phase::Open { ws, paused, read_closed, .. } = &mut entry.phase else { break };
            let read_closed = *read_closed;
            if *paused || ws.state() == State::Closed {
                break;
            }
            if reads == READS_PER_TURN {
                // Fairness: a busy peer waits for the next turn, after everyone else.
                self.resume.push(token);
                break;
            }
            reads += 1;
            match entry.stream.read(&mut buf) {
                Ok(0) => {
                    self.lot.wake(ws).handle_eof();
                    self.after_input(token);
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
                    self.lot.wake(ws).handle_eof();
                    self.after_input(token);
                    break;
                }
            }
        }
        self.read_buf = buf;
        // The end of the turn parks the connection again once nothing is in flight.
        self.mark(token);
    }

    /// Feeds one read to the core: complete messages go to the handler in place, pieces are
    /// assembled in pool chunks.
    fn receive(&mut self, token: usize, now: Instant, buf: &mut [u8]) {
        let mut at = 0;
        while at < buf.len() {
            let entry = &mut self.conns[token];
            let Phase::Open { ws, discarding, .. } = &mut entry.phase else { return };
            let ws = self.lot.wake(ws);
            let input = match ws.handle_input(now, &mut buf[at..]) {
                Ok(input) => input,
                Err(e) => {
                    tracing::debug!(error = %e, peer = %entry.peer, "protocol error");
                    self.after_input(token);
                    return;
                }
            };
            at += input.consumed;
            if let Some(piece) = input.payload {
                if piece.message_start && piece.message_fin {
                    self.stats.messages_in += 1;
                    let message = Message { kind: piece.kind, data: piece.data };
                    self.call(token, now, |handler, conn| handler.on_message(conn, message));
                } else if *discarding {
                    *discarding = !piece.message_fin;
                } else if self.pool.chunks_free() * self.pool.chunk_size()
                    < piece.data.len() + self.shared.config.connection_reserve / 2
                    || entry.partial.append(&mut self.pool, piece.data).is_err()
                {
                    // Unfinished messages leave half the connection reserve free, so one
                    // sender cannot take what the open connections need to keep echoing.
                    entry.partial.clear(&mut self.pool);
                    *discarding = !piece.message_fin;
                    let _ =
                        ws.close(now, CloseCode::TRY_AGAIN_LATER, "server memory budget exhausted");
                } else if piece.message_fin {
                    self.deliver_assembled(token, now, piece.kind);
                }
            }
            self.after_input(token);
            // A pause (send queue above its high watermark) stops reading from the socket, not
            // the parsing of bytes already read: dropping them would tear the stream.
            match &self.conns[token].phase {
                Phase::Open { ws, .. } if ws.state() != State::Closed => {}
                _ => return,
            }
        }
    }

    fn deliver_assembled(
        &mut self,
        token: usize,
        now: Instant,
        kind: freeboard_proto::MessageKind,
    ) {
        if !self.assemble(token) {
            if let Phase::Open { ws, .. } = &mut self.conns[token].phase {
                let ws = self.lot.wake(ws);
                let _ = ws.close(now, CloseCode::TRY_AGAIN_LATER, "server memory budget exhausted");
            }
            return;
        }
        self.stats.messages_in += 1;
        let assembly = std::mem::take(&mut self.assembly);
        self.call(token, now, |handler, conn| {
            handler.on_message(conn, Message { kind, data: &assembly })
        });
        self.assembly = assembly;
    }

    /// Moves the connection's `partial` chain into the contiguous assembly buffer, drawing
    /// any growth from the budget; `false` (and `partial` dropped) if the budget is short.
    fn assemble(&mut self, token: usize) -> bool {
        let entry = &mut self.conns[token];
        let len = entry.partial.len();
        if len > self.assembly.capacity() {
            let more = len - self.assembly_drawn;
            if self.pool.budget_mut().try_draw(more).is_err() {
                entry.partial.clear(&mut self.pool);
                return false;
            }
            self.assembly_drawn = len;
            self.assembly.clear();
            self.assembly.reserve_exact(len);
        }
        self.assembly.clear();
        for segment in entry.partial.segments(&self.pool) {
            self.assembly.extend_from_slice(segment);
        }
        entry.partial.clear(&mut self.pool);
        true
    }

    /// `POST {topics.path}{topic}`: checks the bearer token, the name and the length, then
    /// publishes the body, now (`body` holds it all) or once it has arrived.
    fn http_publish(
        &mut self,
        token: usize,
        now: Instant,
        topic: &str,
        headers: &[httparse::Header<'_>],
        body: &[u8],
    ) {
        let header = |name: &str| {
            headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value)
        };
        let config = &self.shared.config;
        if let Some(expected) = &config.topics.publish_token {
            let given = header("authorization").and_then(|v| {
                let v = std::str::from_utf8(v).ok()?.trim();
                v.get(..7).filter(|s| s.eq_ignore_ascii_case("bearer ")).map(|_| v[7..].trim())
            });
            match given {
                None => {
                    let challenge = "WWW-Authenticate: Bearer\r\n";
                    self.refuse(token, now, 401, challenge, "a bearer token is required");
                    return;
                }
                Some(given) if !constant_time_eq(given.as_bytes(), expected.as_bytes()) => {
                    self.refuse(token, now, 403, "", "wrong publish token");
                    return;
                }
                Some(_) => {}
            }
        }
        if !crate::topics::valid_topic(topic) {
            self.refuse(token, now, 400, "", "invalid topic name");
            return;
        }
        if header("transfer-encoding").is_some() {
            self.refuse(token, now, 411, "", "a Content-Length is required");
            return;
        }
        let Some(len) = header("content-length")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok())
        else {
            self.refuse(token, now, 411, "", "a Content-Length is required");
            return;
        };
        if len > config.max_message_size {
            self.refuse(token, now, 413, "", "body larger than max_message_size");
            return;
        }
        let len = len as usize; // NOTE: at most max_message_size, which fits memory
        let text = header("content-type")
            .is_some_and(|v| v.len() >= 5 && v[..5].eq_ignore_ascii_case(b"text/"));
        let kind = if text { MessageKind::Text } else { MessageKind::Binary };
        if body.len() >= len {
            self.finish_publish(token, now, topic, kind, &body[..len]);
            return;
        }
        let entry = &mut self.conns[token];
        if entry.partial.append(&mut self.pool, body).is_err() {
            entry.partial.clear(&mut self.pool);
            self.refuse(token, now, 503, "Retry-After: 1\r\n", "server memory budget exhausted");
            return;
        }
        let deadline = match entry.phase {
            Phase::Handshake { deadline } => deadline,
            _ => now + self.shared.config.handshake_timeout,
        };
        entry.phase = Phase::Body(Box::new(PostBody {
            deadline,
            topic: topic.into(),
            kind,
            remaining: len - body.len(),
        }));
    }

    /// Reads more of a `POST` body into `partial`; publishes it once complete.
    fn read_body(&mut self, token: usize, now: Instant) {
        let mut buf = std::mem::take(&mut self.read_buf);
        loop {
            let entry = &mut self.conns[token];
            let Phase::Body(post) = &mut entry.phase else { break };
            let want = post.remaining.min(buf.len());
            match entry.stream.read(&mut buf[..want]) {
                Ok(0) => {
                    self.remove(token);
                    break;
                }
                Ok(n) => {
                    self.stats.bytes_in += n as u64;
                    post.remaining -= n;
                    let done = post.remaining == 0;
                    if entry.partial.append(&mut self.pool, &buf[..n]).is_err() {
                        entry.partial.clear(&mut self.pool);
                        let retry = "Retry-After: 1\r\n";
                        self.refuse(token, now, 503, retry, "server memory budget exhausted");
                        break;
                    }
                    if done {
                        let Phase::Body(post) =
                            std::mem::replace(&mut entry.phase, Phase::Draining { deadline: now })
                        else {
                            unreachable!("matched above")
                        };
                        if !self.assemble(token) {
                            let retry = "Retry-After: 1\r\n";
                            self.refuse(token, now, 503, retry, "server memory budget exhausted");
                            break;
                        }
                        let assembly = std::mem::take(&mut self.assembly);
                        self.finish_publish(token, now, &post.topic, post.kind, &assembly);
                        self.assembly = assembly;
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.remove(token);
                    break;
                }
            }
        }
        self.read_buf = buf;
    }

    /// Publishes a whole `POST` body and answers `200` with what it reached.
    fn finish_publish(
        &mut self,
        token: usize,
        now: Instant,
        topic: &str,
        kind: MessageKind,
        body: &[u8],
    ) {
        if kind == MessageKind::Text && std::str::from_utf8(body).is_err() {
            self.refuse(token, now, 400, "", "a text/* body must be UTF-8");
            return;
        }
        let published = self.topics.publish(
            &self.shared.hub,
            &mut self.pool,
            &mut self.outbox,
            topic,
            kind,
            body,
        );
        self.fan_out_outbox(now);
        let answer =
            format!("{{\"loops\":{},\"dropped\":{}}}\n", published.loops, published.dropped);
        self.respond(token, now, 200, "application/json", answer.as_bytes());
    }

    /// Queues what the core owes and reports its events to the handler.
    fn after_input(&mut self, token: usize) {
        let entry = &mut self.conns[token];
        let Phase::Open { ws, route, close_reported, .. } = &mut entry.phase else { return };
        // A parked connection has no events and owes no frames.
        if let Some(ws) = ws.awake() {
            queue_control(ws, &mut entry.queue, &mut self.pool);
            while let Some(event) = ws.poll_event() {
                if let Event::Closed { code, reason, clean } = event {
                    tracing::debug!(code = code.0, reason, clean, peer = %entry.peer, "closed");
                    self.shared.metrics.close(close_label(code));
                    *close_reported = true;
                    let id = ConnId { event_loop: self.index, serial: entry.serial };
                    self.router.handler(*route).on_close(id, code, reason);
                }
            }
        }
        if !entry.queue.is_writable()
            && let Phase::Open { paused, .. } = &mut entry.phase
        {
            *paused = true;
        }
    }

    /// Runs `f` with the route's handler and a handle on the connection, then reports the
    /// writability change the handler's sends caused.
    fn call(
        &mut self,
        token: usize,
        now: Instant,
        f: impl FnOnce(&mut dyn crate::Handler, &mut Conn<'_>),
    ) {
        self.call_with(token, now, "", f);
    }

    /// [`call`](Self::call), showing the handler the request `target` (for `on_open`); then
    /// fans out what the handler published.
    fn call_with(
        &mut self,
        token: usize,
        now: Instant,
        target: &str,
        f: impl FnOnce(&mut dyn crate::Handler, &mut Conn<'_>),
    ) {
        let entry = &mut self.conns[token];
        let Phase::Open { ws, route, .. } = &mut entry.phase else { return };
        let mut writability = None;
        let route = *route;
        let mut conn = Conn {
            id: ConnId { event_loop: self.index, serial: entry.serial },
            peer: entry.peer,
            ws,
            lot: &mut self.lot,
            queue: &mut entry.queue,
            pool: &mut self.pool,
            metrics: &self.shared.metrics,
            stats: &mut self.stats,
            now,
            writability: &mut writability,
            token,
            target,
            topics: &mut self.topics,
            hub: &self.shared.hub,
            outbox: &mut self.outbox,
        };
        f(self.router.handler(route), &mut conn);
        if let Some(change) = writability {
            self.writability_changed(token, now, change);
        }
        self.mark(token);
        if !self.outbox.is_empty() {
            self.fan_out_outbox(now);
        }
    }

    /// Fans out this loop's own publishes, in publish order.
    fn fan_out_outbox(&mut self, now: Instant) {
        if self.fanning_out {
            return; // the outer call picks them up after the publishes before them
        }
        self.fanning_out = true;
        while !self.outbox.is_empty() {
            let mut batch = std::mem::take(&mut self.outbox_spare);
            std::mem::swap(&mut batch, &mut self.outbox);
            for (topic, frame) in batch.drain(..) {
                self.fan_out(now, &topic, &frame);
                frame.release(&mut self.pool);
            }
            self.outbox_spare = batch;
        }
        self.fanning_out = false;
    }

    /// Takes the publications other threads sent, each copied once into this loop's pool and
    /// fanned out by reference.
    fn drain_inbox(&mut self, now: Instant) {
        self.shared.hub.begin_drain(self.index);
        while let Ok(publication) = self.inbox.try_recv() {
            if self.topics.subscribers(&publication.topic).is_none() {
                continue; // the last subscriber left after the publisher looked
            }
            match publication.frame.to_frame(&mut self.pool) {
                Ok(frame) => {
                    self.fan_out(now, &publication.topic, &frame);
                    frame.release(&mut self.pool);
                }
                Err(_) => self.shared.metrics.topic_drop("pool"),
            }
        }
    }

    /// Queues `frame` by reference to every open subscriber of `topic` on this loop; each
    /// subscriber's policy decides alone what happens when its queue is full.
    fn fan_out(&mut self, now: Instant, topic: &str, frame: &Frame) {
        let Some(subscribers) = self.topics.subscribers(topic) else { return };
        let mut changes = std::mem::take(&mut self.changes);
        for (_, &token) in subscribers {
            // NOTE: a connection's subscriptions go before its slab entry does.
            let entry = &mut self.conns[token];
            let Phase::Open { ws, .. } = &mut entry.phase else { continue };
            if ws.state() != State::Open {
                continue;
            }
            let pushed = entry.queue.push_frame(&mut self.pool, frame);
            let mut change = pushed.writability;
            match pushed.outcome {
                PushOutcome::Queued | PushOutcome::QueuedAboveHigh => {
                    self.stats.deliveries += 1;
                    self.stats.messages_out += 1;
                }
                PushOutcome::Dropped { newest, messages, .. } => {
                    if !newest {
                        self.stats.deliveries += 1;
                        self.stats.messages_out += 1;
                    }
                    let policy = entry.queue.policy() as usize;
                    self.stats.policy_drops[policy] += u64::from(messages);
                }
                PushOutcome::WouldBlock { .. } => {
                    // A publisher cannot be paused for one subscriber: the message is dropped.
                    self.stats.policy_drops[SlowConsumerPolicy::Block as usize] += 1;
                }
                PushOutcome::MustClose { .. } => {
                    let gone = entry.queue.discard_unsent(&mut self.pool);
                    change = gone.writability.or(change);
                    self.shared.metrics.slow_consumer_closes.inc();
                    let ws = self.lot.wake(ws);
                    let _ = ws.close(now, CloseCode::POLICY_VIOLATION, "slow consumer");
                    queue_control(ws, &mut entry.queue, &mut self.pool);
                }
            }
            if let Some(change) = change {
                changes.push((token, change));
            }
            if !entry.dirty {
                entry.dirty = true;
                self.dirty.push(token);
            }
        }
        for (token, change) in changes.drain(..) {
            if self.conns.contains(token) {
                self.writability_changed(token, now, change);
            }
        }
        self.changes = changes;
    }

    fn writability_changed(&mut self, token: usize, now: Instant, change: Writability) {
        match change {
            Writability::NotWritable => {
                if let Phase::Open { paused, .. } = &mut self.conns[token].phase {
                    *paused = true;
                }
                self.call(token, now, |handler, conn| handler.on_not_writable(conn));
            }
            Writability::Writable => {
                if let Phase::Open { paused, .. } = &mut self.conns[token].phase
                    && std::mem::replace(paused, false)
                {
                    self.resume.push(token);
                }
                self.call(token, now, |handler, conn| handler.on_writable(conn));
            }
        }
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
            match &mut entry.phase {
                Phase::Handshake { deadline } if *deadline <= now => {
                    self.shared.metrics.handshake_timeouts.inc();
                    tracing::debug!(peer = %entry.peer, "handshake timeout");
                    self.remove(token);
                    continue;
                }
                Phase::Draining { deadline } | Phase::Linger { deadline } if *deadline <= now => {
                    self.remove(token);
                    continue;
                }
                Phase::Body(post) if post.deadline <= now => {
                    self.shared.metrics.handshake_timeouts.inc();
                    self.remove(token);
                    continue;
                }
                Phase::Open { ws, .. } => {
                    self.lot.wake(ws).handle_timeout(now);
                    self.after_input(token);
                }
                _ => {}
            }
            self.mark(token);
        }
    }

    /// Flushes every connection touched this turn (one `writev` each), moves finished ones
    /// along, re-arms timers.
    fn end_turn(&mut self, now: Instant) {
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

    fn flush(&mut self, token: usize, now: Instant) {
        let entry = &mut self.conns[token];
        let mut change = None;
        while !entry.queue.is_empty() {
            let mut iov = [IoSlice::new(&[]); IOV];
            let n = entry.queue.io_slices(&self.pool, &mut iov);
            let offered: usize = iov[..n].iter().map(|s| s.len()).sum();
            match entry.stream.write_vectored(&iov[..n]) {
                Ok(written) => {
                    self.stats.bytes_out += written as u64;
                    if let Some(c) = entry.queue.consume(&mut self.pool, written) {
                        change = Some(c);
                    }
                    if written < offered {
                        break; // the socket is full: WRITABLE will bring us back
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    let _ = entry.queue.clear(&mut self.pool);
                    if let Phase::Open { ws, .. } = &mut entry.phase {
                        self.lot.wake(ws).handle_eof();
                    }
                    self.after_input(token);
                    self.remove(token);
                    return;
                }
            }
        }
        if let Some(change) = change {
            self.writability_changed(token, now, change);
        }
        let entry = &mut self.conns[token];
        if let Phase::Open { ws, close_reported, .. } = &mut entry.phase
            && ws.state() == State::Closed
        {
            if !*close_reported {
                // Drain the Closed event the core still holds.
                self.after_input(token);
            }
            self.shared.metrics.connections.dec();
            self.topics.drop_conn(&self.shared.hub, token);
            let entry = &mut self.conns[token];
            entry.partial.clear(&mut self.pool);
            // What is still queued (the close frame, and the messages before it) gets the
            // close timeout to leave: a peer that stopped reading cannot hold the connection
            // and its chunks for ever.
            let deadline = now + self.shared.config.close_timeout;
            entry.phase = Phase::Draining { deadline };
        }
        let entry = &mut self.conns[token];
        if matches!(entry.phase, Phase::Draining { .. }) && entry.queue.is_empty() {
            // The server closes the TCP connection first (§7.1.1).
            let _ = entry.stream.shutdown(Shutdown::Write);
            entry.phase = Phase::Linger { deadline: now + LINGER };
            self.read_discard(token);
        }
        if let Some(entry) = self.conns.get_mut(token) {
            if let Phase::Open { ws, .. } = &mut entry.phase {
                self.lot.park(ws);
            }
            let queued = u32::try_from(entry.queue.len()).unwrap_or(u32::MAX);
            self.buffered = self.buffered - entry.counted as usize + queued as usize;
            entry.counted = queued;
            let deadline = match &entry.phase {
                Phase::Handshake { deadline } => Some(*deadline),
                Phase::Open { ws, .. } => ws.poll_timeout(),
                Phase::Draining { deadline } | Phase::Linger { deadline } => Some(*deadline),
                Phase::Body(post) => Some(post.deadline),
            };
            if let Some(at) = deadline
                && entry.armed.is_none_or(|armed| at < armed)
            {
                entry.armed = Some(at);
                self.timers.push(Reverse((at, token, entry.serial)));
            }
        }
    }

    fn remove(&mut self, token: usize) {
        self.topics.drop_conn(&self.shared.hub, token);
        let mut entry = self.conns.remove(token);
        self.buffered -= entry.counted as usize;
        let _ = entry.queue.clear(&mut self.pool);
        if let Phase::Handshake { .. } = entry.phase {
            self.head_chunks -= head_chunks(entry.partial.len(), self.pool.chunk_size());
        }
        entry.partial.clear(&mut self.pool);
        self.shared.release(entry.peer);
        if let Phase::Open { route, close_reported, .. } = entry.phase {
            self.shared.metrics.connections.dec();
            if !close_reported {
                self.shared.metrics.close(close_label(CloseCode::ABNORMAL));
                let id = ConnId { event_loop: self.index, serial: entry.serial };
                self.router.handler(route).on_close(id, CloseCode::ABNORMAL, "");
            }
        }
        // Dropping the stream closes the socket and removes it from the poll.
    }

    fn publish_gauges(&mut self) {
        self.stats.publish(&self.shared.metrics);
        let c = self.pool.counters();
        let g = &self.gauges;
        g.chunks_in_use.set(c.chunks_in_use as i64);
        g.chunks_high_water.set(c.chunks_high_water as i64);
        g.bytes_buffered.set(self.buffered as i64);
        g.allocation_failures.set(c.allocation_failures as i64);
    }
}

/// The chunks a partial request head of `len` bytes is counted as holding.
fn head_chunks(len: usize, chunk_size: usize) -> usize {
    len.div_ceil(chunk_size)
}

/// Compares secrets in time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The `closes` metric label for a close code.
fn close_label(code: CloseCode) -> &'static str {
    match code {
        CloseCode::NORMAL => "normal",
        CloseCode::GOING_AWAY => "going_away",
        CloseCode::PROTOCOL_ERROR => "protocol_error",
        CloseCode::NO_STATUS => "no_status",
        CloseCode::ABNORMAL => "abnormal",
        CloseCode::INVALID_PAYLOAD => "invalid_payload",
        CloseCode::POLICY_VIOLATION => "policy_violation",
        CloseCode::MESSAGE_TOO_BIG => "message_too_big",
        CloseCode::TRY_AGAIN_LATER => "try_again_later",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle connection costs its slab entry and nothing else (its protocol state is parked
    /// inside it): keep it small, 10,000 idle connections should need about 2 MB.
    #[test]
    fn idle_connection_state_stays_small() {
        let entry = size_of::<Entry>();
        println!("Entry {entry} B");
        assert!(entry <= 200, "Entry is {entry} bytes");
    }
}
