//! One event loop: readiness → session → write. A mio `Poll`, its `SO_REUSEPORT` listener, a
//! slab of connections (each a [`Session`] over a [`Transport`]), one shared read buffer, a
//! timer heap, a chunk pool, and the inbox other loops publish into.
//!
//! The HTTP side of a connection (the request before the upgrade, refusals, plain routes) is
//! in [`http`](super::http); the fan-out of published messages in
//! [`fan_out`](super::fan_out).

use std::any::Any;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use freeboard_buf::{Budget, PageBuffer, Pool, PoolConfig, Writability};
use freeboard_proto::{CloseCode, Instant};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use super::compressed_copies::CompressedCopies;
use super::delta_copies::{DeltaCopies, TopicDeltas};
use super::requests::{AwaitingPublish, PlainRequest};
use super::shared::Shared;
use crate::config::ServerConfig;
use crate::handler::{Completion, Decisions, RouteOptions, Router};
use crate::metrics::{LogThrottle, LoopGauges, LoopLabel, LoopStats};
use crate::parking::ParkingLot;
use crate::session::deflate::Codec;
use crate::session::event_copies::EventCopies;
use crate::session::{
    Assembly, Context, Cork, EVENT_STREAM_STATE, FairShare, Phase, Reassembly, Session,
};
use crate::tls::TlsScratch;
use crate::topics::{LocalTopics, Outbox, Publication};
use crate::transport::{Io, Transport};

const LISTENER: Token = Token(usize::MAX - 1);
pub(crate) const WAKER: Token = Token(usize::MAX - 2);
const TLS_LISTENER: Token = Token(usize::MAX - 3);
const ADMIN_LISTENER: Token = Token(usize::MAX - 4);
/// Connection slots (and timer and dirty-list entries) a loop starts with (address space only:
/// an allocation this size is mapped, untouched). Tables grown past it are given back whole
/// when the loop has no connection left, the timer heap halves when three quarters are unused.
pub(super) const INITIAL_CONNS: usize = 1024;
/// Reads of one connection per loop turn before the others get their turn.
const READS_PER_TURN: usize = 16;
/// Bytes read from one connection per loop turn before the others get their turn (the read
/// that passes it is the last): what one turn spends on each client that sends without
/// pause (many small messages, a large body) is bounded by what it sent, whatever its reads
/// return. A connection that keeps up waits behind one such share of each busy peer: 64 KiB
/// of one-byte frames is about 9,000 messages.
pub(super) const READ_BYTES_PER_TURN: usize = 64 << 10;
/// How often the pool gives back the pages of chunks that stayed free for a whole interval
/// (beyond its warm reserve; everything after a few quiet intervals).
pub(super) const RELEASE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a closed connection waits for the peer's EOF after our FIN.
pub(super) const LINGER: Duration = Duration::from_secs(2);
/// How long accepting waits after `accept` failed for want of descriptors or memory
/// (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) before it tries again.
pub(super) const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Connections accepted per loop turn. A storm of connects then cannot hold up the
/// connections already open, and peers that hung up are seen (and their per-address count
/// released) before the next batch is admitted.
pub(super) const ACCEPT_BATCH: usize = 64;

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
    /// Counted against its client's address: at accept for a direct connection; for one
    /// through a trusted proxy or a PROXY protocol listener, once the client is known.
    pub(super) attributed: bool,
    /// The peer's FIN has been reported (`EPOLLRDHUP`): read to the end of the stream, since
    /// no further readiness event will come to say it is there.
    pub(super) read_closed: bool,
    /// Accepted on the admin listener: it is served the admin routes and `/healthz` only.
    pub(super) admin_listener: bool,
    /// A Server-Sent Events stream (`Some`), carrying several topics (`Some(true)`): what a
    /// fan-out needs of it, kept here (in padding) so that it reads nothing else per delivery.
    pub(super) event_stream: Option<bool>,
    /// The deadline this entry has in the timer heap, if any.
    pub(super) armed: Option<Instant>,
    pub(super) dirty: bool,
    /// It has upgraded (it may be closing since): it no longer counts among the connections
    /// whose share of the pool is bounded (see [`http`](super::http)).
    pub(super) upgraded: bool,
    /// Its queue's length as last counted in the loop's `buffered` total (saturating at
    /// 4 GiB, which keeps the entry small).
    pub(super) counted: u32,
    /// When its send queue got its first byte, in the loop's milliseconds plus one (0: the
    /// queue is empty), for `freeboard_send_queue_delay_seconds`.
    pub(super) queued_at: u32,
}

pub(crate) struct EventLoop<T> {
    pub(super) index: u32,
    poll: Poll,
    /// The io_uring that carries the plain listener's connections (`--io uring`), its
    /// completions of one turn, and the connections to read after them.
    #[cfg(target_os = "linux")]
    pub(super) ring: Option<super::ring_side::RingSide>,
    /// Its listeners; taken at shutdown.
    pub(super) listeners: Option<Listeners>,
    /// The TLS configuration of the connections accepted on `tls_listener`, or on `listener`
    /// when there is no `tls_listener`.
    tls_config: Option<crate::tls::ServerTls>,
    /// The TLS scratch buffers every TLS connection of the loop uses in turn, and the budget
    /// their rustls state is charged to.
    pub(super) tls: TlsScratch,
    pub(super) shared: Arc<Shared>,
    /// The configuration in force, as of `generation` (see [`Shared::reload`]).
    pub(super) config: Arc<ServerConfig>,
    generation: u64,
    pub(super) router: Router,
    pub(super) conns: Slab<Entry<T>>,
    pub(super) pool: Pool<'static>,
    /// The shared read buffer: every socket of this loop is read into it. Its pages are
    /// resident from the first read until the pool next gives everything back.
    pub(super) read_buf: PageBuffer,
    /// The replies of the connection being read, written once its read is done (as large
    /// as the read buffer: an echo of one read fits; resident like it).
    pub(super) cork: Cork,
    /// The connection being read, if it corks its replies (plain TCP: TLS encrypts straight
    /// from its queue). The cork is lent to it alone: a handler called for another
    /// connection meanwhile (a subscriber's `on_writable` during a fan-out) must not write
    /// into it.
    pub(super) corking: Option<usize>,
    /// Messages (and request bodies) that arrived in pieces, contiguous for the handler.
    pub(super) assembly: Assembly,
    pub(super) limits: Reassembly,
    /// What one connection may take from the pool while it is contended, as of the last
    /// turn's connection count.
    pub(super) share: FairShare,
    /// The pool's free chunks and slots after the last sweep of a contended pool (see
    /// [`reclaim`](Self::reclaim)); `None` while it is not contended.
    pub(super) swept: Option<(usize, usize)>,
    /// permessage-deflate: the shared mode's state and every compressed message's scratch.
    pub(super) codec: Codec,
    pub(super) timers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    pub(super) dirty: Vec<usize>,
    pub(super) resume: Vec<usize>,
    /// What the kernel's buffers of the loop's sockets are charged now.
    pub(super) kernel: crate::kernel_memory::BufferCharges,
    pub(super) serial: u64,
    /// Where idle connections' protocol state waits.
    pub(super) lot: ParkingLot,
    pub(super) drain_deadline: Option<Instant>,
    pub(super) gauges: LoopGauges,
    /// Keeps the `info` lines about refusals and abnormal closes to a few a second.
    pub(super) log_throttle: LogThrottle,
    /// When to try accepting again after `accept` failed. The connections waiting in the
    /// backlog raise no new readiness event (epoll is edge-triggered), so without this retry
    /// they would wait for the next connection to arrive.
    pub(super) accept_retry: Option<Instant>,
    /// When the pool next gives back the pages of chunks that stayed free (armed only while
    /// it holds touched memory, so a quiet loop never wakes for it).
    pub(super) release_at: Option<Instant>,
    /// The last `accept` failed (its warning is logged once per episode).
    pub(super) accept_failing: bool,
    /// The backlog may hold more connections than the last batch took: accept again after
    /// the next (non-blocking) poll.
    pub(super) accept_more: bool,
    /// Budget bytes each connection of the loop is charged while it is open, handshaking or
    /// not: the kernel's memory for its socket ([`Shared::socket_cost`]) and its entry in
    /// `conns`. The pool withholds that many chunks (`charge_connections`).
    pub(super) connection_charge: usize,
    /// Connections in `conns` that have upgraded. The others — not upgraded yet, refused, or
    /// between plain HTTP requests — hold a bounded share of the pool (see
    /// [`http`](super::http)).
    pub(super) upgraded: usize,
    /// The connections that have not upgraded, oldest first, by `(slot, serial)`: whom to
    /// close when they hold their share and another arrives. Entries of connections that
    /// upgraded or went since are skipped (and pruned once they outnumber the live ones).
    pub(super) untrusted: VecDeque<(usize, u64)>,
    /// Connections in `conns` that are event streams: each holds state on the heap
    /// ([`EVENT_STREAM_STATE`]), charged with the connections (`charge_connections`).
    pub(super) event_streams: usize,
    /// Bytes in the send queues, as of each connection's last flush (the `send_queue_bytes`
    /// gauge).
    ///
    /// Invariant: the sum of every entry's `counted`.
    pub(super) buffered: usize,
    /// Chunks held by partial request heads (see [`http`](super::http)).
    pub(super) head_chunks: usize,
    /// Chunks counted against request bodies in flight (see [`http`](super::http)).
    pub(super) body_chunks: usize,
    pub(super) stats: LoopStats,
    pub(super) topics: LocalTopics,
    /// Publications from other threads.
    pub(super) inbox: Receiver<Publication>,
    /// Publishes from this loop's handlers, fanned out once the handler returns (once the
    /// read is handled, for a read's messages).
    pub(super) outbox: Outbox,
    /// The outbox's spare allocation, and whether it is being fanned out (so a publish made
    /// during a fan-out waits its turn and one publisher's messages stay in order).
    pub(super) outbox_spare: Outbox,
    pub(super) fanning_out: bool,
    /// A fan-out may write an idle subscriber's frames straight to its socket (else it only
    /// queues them, for the end of the turn).
    pub(super) write_straight: bool,
    /// The connection whose read's messages are being handled: their publishes wait in the
    /// outbox until the read is done (or the outbox holds
    /// [`OUTBOX_RUN`](super::handlers::OUTBOX_RUN) of them), so one subscriber takes them all
    /// at once.
    pub(super) reading: Option<usize>,
    /// One fan-out's compressed frames, by publication (kept for its allocation).
    pub(super) compressed: Vec<CompressedCopies>,
    /// One fan-out's Server-Sent Events frames, by publication (kept for its allocation),
    /// and the bytes they are framed through.
    pub(super) event_copies: Vec<EventCopies>,
    pub(super) event_scratch: (Vec<u8>, Vec<u8>),
    /// The last publication of each topic with delta subscribers here, and one fan-out's
    /// delta-subscriber copies, by publication (kept for its allocation).
    pub(super) topic_deltas: TopicDeltas,
    pub(super) delta_copies: Vec<DeltaCopies>,
    /// One delta subscriber's choices for a fan-out's run: delta or whole, by publication.
    pub(super) delta_plan: Vec<bool>,
    /// Writability changes a fan-out caused, reported once it is done.
    pub(super) changes: Vec<(usize, Writability)>,
    /// Upgrade decisions completed (on any thread) and not yet acted on.
    pub(super) decisions: Arc<Decisions>,
    pub(super) completed: Vec<Completion>,
    /// Connections whose upgrade decision is pending, by slot.
    pub(super) pending: HashMap<usize, PendingUpgrade>,
    /// The data open connections' upgrade decisions attached, by slot: a side table, so
    /// that connections without any pay nothing in their `Entry`.
    pub(super) data: HashMap<usize, Box<dyn Any + Send>>,
    /// Who each connection is, for those whose access said ([`Accepted::subject`](crate::Accepted::subject)).
    pub(super) subjects: HashMap<usize, Arc<str>>,
    /// The sweep of the subscribers' lag in progress.
    pub(super) sweep: crate::lag::LagSweep,
    /// Plain requests whose body is still arriving: how to answer them (keep-alive, CORS)
    /// and a chunked body's decoder, by slot.
    pub(super) plain: HashMap<usize, PlainRequest>,
    /// HTTP publishes whose answer waits for other loops' reports, by slot.
    pub(super) awaiting: HashMap<usize, AwaitingPublish>,
    /// Set by a plain request answered with keep-alive when bytes of a pipelined request
    /// follow it: where they start in the buffer it was given.
    pub(super) next_request: Option<usize>,
    /// When connections' authorizations lapse: `(at, slot, serial)`.
    pub(super) expiries: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    /// The HTTP/2 connections, by the slot of the entry that holds their socket (see
    /// [`http2`](super::http2)); each of their streams has an entry of its own.
    pub(super) http2: HashMap<usize, Box<super::http2_connection::Http2Connection>>,
    /// Entries in `conns` that are HTTP/2 streams (charged their state, not a socket's).
    pub(super) http2_streams: usize,
}

/// An upgrade request waiting for its decision: what the `101` and `on_open` need later.
pub(super) struct PendingUpgrade {
    pub(super) serial: u64,
    pub(super) upgrade: Upgrading,
    /// The request target, for `on_open`.
    pub(super) target: Box<str>,
    pub(super) accept_key: freeboard_proto::handshake::AcceptKey,
}

/// What an accepted upgrade opens with: its route and what the request negotiated.
#[derive(Clone)]
pub(super) struct Upgrading {
    pub(super) route: usize,
    pub(super) options: RouteOptions,
    /// The permessage-deflate parameters agreed with the request's offer, if any.
    pub(super) compression: Option<crate::Agreement>,
    /// A Server-Sent Events request: it opens with a `200` and an event stream.
    pub(super) event_stream: bool,
    /// The origin an event stream's answer names, credentials allowed (`EventSource`'s
    /// `withCredentials`): the request's, when `allowed_origins` restricts origins and
    /// allowed it. Otherwise the answer allows any origin, without credentials.
    pub(super) credentialed_origin: Option<Box<str>>,
    /// A presence listing: answered with the topic's members once accepted, never opened.
    pub(super) listing: Option<super::requests::Listing>,
}

/// The session [`Context`] of an event loop at `now`, with `cork`, or — `for token` — with
/// the loop's cork if it is lent to `token` (the plain TCP connection being read). A macro
/// rather than a method: it borrows the loop's fields one by one, so the slab of connections
/// stays free to borrow beside it.
macro_rules! loop_context {
    ($loop:expr, $now:expr, for $token:expr) => {
        loop_context!($loop, $now, ($loop.corking == Some($token)).then_some(&mut $loop.cork))
    };
    ($loop:expr, $now:expr, $cork:expr) => {
        crate::session::Context {
            pool: &mut $loop.pool,
            lot: &mut $loop.lot,
            masks: None,
            limits: &$loop.limits,
            share: &$loop.share,
            codec: Some(&mut $loop.codec),
            cork: $cork,
            now: $now,
        }
    };
}
pub(super) use loop_context;

/// A loop's listeners: its `SO_REUSEPORT` share of each address the server listens on.
pub(super) struct Listeners {
    /// `ServerConfig::listen` (TLS when TLS has no listener of its own).
    pub(super) plain: TcpListener,
    /// The TLS listener beside the plain one (`--listen-tls`).
    pub(super) tls: Option<TcpListener>,
    /// The admin listener (`--admin-listen`): plain HTTP, admin routes and `/healthz` only.
    pub(super) admin: Option<TcpListener>,
}

/// How a loop's share of `--memory` is split: the fixed parts, and the pool of chunks that
/// buffers and the connections' charge draw on.
#[derive(Debug, Clone, Copy)]
pub(super) struct LoopBudget {
    /// `memory / threads`.
    pub(super) per_loop: usize,
    /// TLS scratch buffers and the rustls state share (0 without TLS).
    pub(super) tls_bytes: usize,
    /// The topic tables' part.
    pub(super) topics_reserve: usize,
    /// Chunks of the pool.
    pub(super) chunks: usize,
}

impl LoopBudget {
    pub(super) fn of(config: &ServerConfig) -> Self {
        let per_loop = config.memory / config.threads;
        let assembly_reserve = config.limits.max_message_size.min(per_loop / 4);
        // TLS: the scratch buffers and a share of the budget for rustls state come off the
        // pool's part.
        let tls_bytes = match &config.tls {
            Some(tls) => TlsScratch::BYTES + per_loop / tls.state_share,
            None => 0,
        };
        // Compression state (zlib windows) is drawn from the budget beside the pool: an
        // eighth of the loop's share is kept for it when the server compresses.
        let compression_reserve = match config.compression {
            crate::Compression::Off => 0,
            _ => per_loop / 8,
        };
        // The topic tables (who subscribes to what) are drawn from their own part of it.
        let topics_reserve = per_loop / crate::topics::TABLE_SHARE;
        let pool_bytes = per_loop
            - 2 * config.read_buffer
            - assembly_reserve
            - tls_bytes
            - compression_reserve
            - topics_reserve;
        let chunks = pool_bytes
            / Pool::footprint(config.chunk_size, 1, freeboard_buf::DEFAULT_SEGMENTS_PER_CHUNK);
        LoopBudget { per_loop, tls_bytes, topics_reserve, chunks }
    }

    /// Connections the loop can hold while an upgrade still finds `connection_reserve` free
    /// with no buffer in use, at `charge` bytes each.
    pub(super) fn connections(&self, config: &ServerConfig, charge: usize) -> usize {
        // An io_uring loop's receive buffers are pool chunks too.
        #[cfg(target_os = "linux")]
        let chunks = match config.io {
            crate::IoDriver::Uring => {
                self.chunks.saturating_sub(crate::uring::receive_buffers(config))
            }
            crate::IoDriver::Epoll => self.chunks,
        };
        #[cfg(not(target_os = "linux"))]
        let chunks = self.chunks;
        let room = (chunks * config.chunk_size).saturating_sub(config.connection_reserve);
        room / charge.max(1)
    }
}

/// Which listener an accepted connection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Listening {
    Plain,
    Tls,
    Admin,
}

/// Budget bytes one connection is charged while open: the kernel's memory for its socket and
/// its entry in the loop's table.
pub(super) fn connection_charge<T>(shared: &Shared) -> usize {
    shared.socket_cost.bytes + std::mem::size_of::<Entry<T>>()
}

impl<T: Transport> EventLoop<T> {
    /// A loop for `listeners`, watched by `poll`. `waits_on_ring`: the loop runs its own
    /// turns ([`run`](Self::run)), so an io_uring loop may wait on its ring rather than on
    /// `poll` (a host's event loop that watches `poll` needs it readable for every event).
    pub(crate) fn new(
        index: u32,
        waits_on_ring: bool,
        poll: Poll,
        mut listeners: Listeners,
        shared: Arc<Shared>,
        waker: Arc<mio::Waker>,
        router: Router,
    ) -> io::Result<Self> {
        let config = shared.config();
        if let Some(tls) = &mut listeners.tls {
            poll.registry().register(tls, TLS_LISTENER, Interest::READABLE)?;
        }
        if let Some(admin) = &mut listeners.admin {
            poll.registry().register(admin, ADMIN_LISTENER, Interest::READABLE)?;
        }
        let LoopBudget { per_loop, tls_bytes, topics_reserve, chunks, .. } =
            LoopBudget::of(&config);
        let pool_config =
            PoolConfig::new().with_chunk_size(config.chunk_size).with_chunk_count(chunks);
        let mut pool = Pool::new(Budget::new(per_loop), pool_config).map_err(io::Error::other)?;
        // The read buffer and the cork.
        pool.budget_mut().try_draw(2 * config.read_buffer).map_err(io::Error::other)?;
        let tls = match &config.tls {
            Some(_) => {
                let state = pool.budget_mut().split(tls_bytes - TlsScratch::BYTES);
                pool.budget_mut().try_draw(TlsScratch::BYTES).map_err(io::Error::other)?;
                let handshakes = shared.handshakes.clone().expect("built with the TLS config");
                TlsScratch::new(state.map_err(io::Error::other)?, handshakes)
            }
            None => TlsScratch::none(),
        };
        let tls_config = shared.tls.as_ref().map(|(config, _)| config.clone());
        let inbox = shared
            .hub
            .take_receiver(index)
            .ok_or_else(|| io::Error::other("event loop started twice"))?;
        let tables = pool.budget_mut().split(topics_reserve).map_err(io::Error::other)?;
        let topics = LocalTopics::new(index, config.topics.max_topics_per_connection, tables);
        let connection_charge = connection_charge::<T>(&shared);
        // The plain listener's connections go through the ring when there is one and the
        // listener does not speak TLS; else it is watched by epoll.
        #[cfg(target_os = "linux")]
        let ring = match config.io {
            crate::IoDriver::Uring => super::ring_side::RingSide::new(
                index,
                waits_on_ring,
                &poll,
                &mut pool,
                &config,
                &listeners.plain,
                tls_config.is_some() && listeners.tls.is_none(),
            ),
            crate::IoDriver::Epoll => None,
        };
        #[cfg(target_os = "linux")]
        let plain_on_epoll = ring.is_none();
        #[cfg(not(target_os = "linux"))]
        let plain_on_epoll = true;
        if plain_on_epoll {
            poll.registry().register(&mut listeners.plain, LISTENER, Interest::READABLE)?;
        }
        Ok(Self {
            index,
            poll,
            #[cfg(target_os = "linux")]
            ring,
            listeners: Some(listeners),
            tls_config,
            tls,
            lot: ParkingLot::new(config.limits.protocol()),
            read_buf: PageBuffer::new(config.read_buffer),
            cork: Cork::new(config.read_buffer),
            corking: None,
            limits: Reassembly::server(config.connection_reserve),
            share: FairShare::new(&pool, 0),
            swept: None,
            codec: Codec::new(config.compression_threshold),
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
            kernel: Default::default(),
            serial: 0,
            drain_deadline: None,
            accept_retry: None,
            release_at: None,
            connection_charge,
            upgraded: 0,
            untrusted: VecDeque::new(),
            event_streams: 0,
            accept_failing: false,
            accept_more: false,
            buffered: 0,
            head_chunks: 0,
            body_chunks: 0,
            stats: LoopStats::default(),
            topics,
            inbox,
            outbox: Outbox::default(),
            outbox_spare: Outbox::default(),
            fanning_out: false,
            write_straight: true,
            reading: None,
            compressed: Vec::new(),
            event_copies: Vec::new(),
            event_scratch: (Vec::new(), Vec::new()),
            topic_deltas: TopicDeltas::default(),
            delta_copies: Vec::new(),
            delta_plan: Vec::new(),
            changes: Vec::new(),
            decisions: Arc::new(Decisions::new(waker)),
            completed: Vec::new(),
            pending: HashMap::new(),
            data: HashMap::new(),
            subjects: HashMap::new(),
            sweep: Default::default(),
            expiries: BinaryHeap::new(),
            plain: HashMap::new(),
            awaiting: HashMap::new(),
            next_request: None,
            http2: HashMap::new(),
            http2_streams: 0,
        })
    }

    pub(super) fn now(&self) -> Instant {
        Instant::from_millis(self.shared.start.elapsed().as_millis() as u64)
    }

    /// Runs until shutdown has drained every connection (or the drain deadline passed).
    pub(crate) fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        self.start();
        while self.turn(&mut events, None)? {}
        self.finish();
        Ok(())
    }

    /// The pool chunks the loop holds for itself: an io_uring loop's receive buffers (an
    /// epoll loop's read buffer is not a chunk).
    pub(super) fn ring_chunks(&self) -> usize {
        #[cfg(target_os = "linux")]
        let own = self.ring.as_ref().map_or(0, |side| side.ring.buffer_chunks());
        #[cfg(not(target_os = "linux"))]
        let own = 0;
        own
    }

    /// Publishes the loop's fixed gauges: call once before the first turn.
    pub(crate) fn start(&mut self) {
        let label = LoopLabel { event_loop: self.index };
        let m = &self.shared.metrics;
        // An io_uring loop's receive buffers are counted apart (see `publish_gauges`).
        let own = self.ring_chunks();
        m.chunks_capacity.get_or_create(&label).set((self.pool.chunks_total() - own) as i64);
        m.chunk_size.set(self.pool.chunk_size() as i64);
        m.budget_bytes.get_or_create(&label).set(self.pool.budget().limit() as i64);
        m.slots_total.get_or_create(&label).set(self.pool.segments_total() as i64);
        #[cfg(target_os = "linux")]
        let io = match &self.ring {
            Some(side) => {
                let chunks = side.ring.buffer_chunks() as i64;
                m.receive_buffer_chunks.get_or_create(&label).set(chunks);
                crate::IoDriver::Uring
            }
            None => crate::IoDriver::Epoll,
        };
        #[cfg(not(target_os = "linux"))]
        let io = crate::IoDriver::Epoll;
        let label = crate::metrics::LoopIoLabel { event_loop: self.index, io: io.name() };
        m.loop_io.get_or_create(&label).set(1);
    }

    /// One turn: waits for readiness (at most until the loop's next deadline, and at most
    /// `max_wait` if given), then accepts, reads, calls the handlers, runs the timers and
    /// decisions, and flushes every connection touched. `Ok(false)` once a shutdown has
    /// drained every connection (or its deadline passed): call [`finish`](Self::finish).
    pub(crate) fn turn(
        &mut self,
        events: &mut Events,
        max_wait: Option<Duration>,
    ) -> io::Result<bool> {
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
            return Ok(false);
        }
        let timeout = match (self.wait(now), max_wait) {
            (Some(wait), Some(max)) => Some(wait.min(max)),
            (wait, max) => wait.or(max),
        };
        // What the last turn queued on the ring (its sends, re-armed receives) leaves in one
        // submission before the wait: the wait's own where the loop waits on its ring, which
        // polls the epoll for it (read then, without waiting, only when it has events).
        #[cfg(target_os = "linux")]
        let on_ring = self.ring.as_ref().is_some_and(|side| side.ring.direct());
        #[cfg(target_os = "linux")]
        let polled = match on_ring {
            true => self.wait_ring(timeout).then_some(Some(Duration::ZERO)),
            false => {
                self.submit_ring();
                Some(timeout)
            }
        };
        #[cfg(not(target_os = "linux"))]
        let polled = Some(timeout);
        match polled.map(|timeout| self.poll.poll(events, timeout)) {
            None => events.clear(),
            #[cfg(target_os = "linux")]
            Some(Ok(())) if on_ring => self.epoll_polled(events),
            Some(Ok(())) => {}
            Some(Err(e)) if e.kind() == io::ErrorKind::Interrupted => return Ok(true),
            Some(Err(e)) => return Err(e),
        }
        let now = self.now();
        self.expire_timers(now);
        if self.release_at.is_some_and(|at| at <= now) {
            self.pool.release_idle();
            self.release_at = None;
            if !self.pool.has_memory_to_release() {
                // Quiet long enough for the pool to give everything back: the read
                // buffer's and the cork's pages go too.
                self.read_buf.give_back();
                self.cork.give_back();
            }
        }
        if self.accept_more || self.accept_retry.is_some_and(|at| at <= now) {
            self.accept_retry = None;
            self.accept(now, Listening::Plain);
            self.accept(now, Listening::Tls);
            self.accept(now, Listening::Admin);
        }
        for token in std::mem::take(&mut self.resume) {
            self.read(token, now);
        }
        for event in events.iter() {
            match event.token() {
                LISTENER => self.accept(now, Listening::Plain),
                TLS_LISTENER => self.accept(now, Listening::Tls),
                ADMIN_LISTENER => self.accept(now, Listening::Admin),
                WAKER => {}
                #[cfg(target_os = "linux")]
                super::ring_side::RING => self.complete(now),
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
        // What the last turn's sends found received (their completions came with them).
        #[cfg(target_os = "linux")]
        if self.ring_has_ready() {
            self.complete(now);
        }
        self.drain_inbox(now);
        self.run_decisions(now);
        self.end_turn(now);
        Ok(true)
    }

    /// Releases what the loop still holds once its turns are over.
    pub(crate) fn finish(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(ring) = &mut self.ring {
            ring.ring.close(&mut self.pool);
        }
        for (token, mut entry) in std::mem::take(&mut self.conns) {
            self.drop_subscriptions(token, entry.serial);
            self.stats.closed += u64::from(entry.session.release(&mut self.pool));
            let mut io =
                Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
            entry.stream.release(&mut io);
            self.shared.release(&self.config, entry.peer, entry.attributed);
            if self.pending.remove(&token).is_some() {
                self.shared.release_pending();
            }
            self.upgraded -= usize::from(entry.upgraded);
            self.event_streams -= usize::from(entry.event_stream.is_some());
            if let Phase::Open(_) = entry.session.phase {
                self.left_open(entry.session.is_event_stream());
            }
        }
        self.publish_gauges();
    }

    /// How long the next turn may wait for readiness: zero while work is left over from the
    /// last (a busy peer's next read, a backlog to accept, a drain that has ended, bytes the
    /// ring's sends found received), else
    /// until the next deadline.
    pub(crate) fn wait(&self, now: Instant) -> Option<Duration> {
        let drained = self.drain_deadline.is_some() && self.conns.is_empty();
        #[cfg(target_os = "linux")]
        let received = self.ring_has_ready();
        #[cfg(not(target_os = "linux"))]
        let received = false;
        if self.resume.is_empty() && !self.accept_more && !drained && !received {
            self.poll_timeout(now)
        } else {
            Some(Duration::ZERO)
        }
    }

    /// The loop's poll, whose descriptor a host event loop watches (see
    /// [`LocalServer`](crate::LocalServer)).
    pub(crate) fn poll(&self) -> &Poll {
        &self.poll
    }

    /// Whether the loop is draining after a shutdown began.
    pub(crate) fn shutting_down(&self) -> bool {
        self.drain_deadline.is_some()
    }

    fn poll_timeout(&self, now: Instant) -> Option<Duration> {
        let next = [
            self.timers.peek().map(|Reverse((at, _, _))| *at),
            self.expiries.peek().map(|Reverse((at, _, _))| *at),
            self.drain_deadline,
        ]
        .into_iter()
        .chain([self.accept_retry, self.release_at])
        .flatten()
        .min();
        // Round up so a deadline is never polled for just before it is due.
        next.map(|at| at.saturating_duration_since(now) + Duration::from_millis(1))
    }

    fn begin_shutdown(&mut self, now: Instant) {
        #[cfg(target_os = "linux")]
        self.stop_ring_accept();
        if let Some(mut listeners) = self.listeners.take() {
            let registry = self.poll.registry();
            let _ = registry.deregister(&mut listeners.plain);
            for listener in [&mut listeners.tls, &mut listeners.admin].into_iter().flatten() {
                let _ = registry.deregister(listener);
            }
        }
        self.drain_deadline = Some(now + self.config.drain_timeout);
        let tokens: Vec<usize> = self.conns.iter().map(|(t, _)| t).collect();
        // Each client is told when to come back, spread over a few seconds, so that a
        // restarted node (or its neighbours) does not meet them all at once.
        let spread = super::requests::RETRY_SPREAD * 1000;
        for token in tokens {
            match self.conns[token].session.phase {
                // An HTTP/2 connection: GOAWAY; it goes once its streams have closed.
                Phase::Request { .. } if self.http2.contains_key(&token) => {
                    self.go_away_http2(token);
                }
                Phase::Request { .. } | Phase::Body(_) => {
                    self.remove(token);
                    continue;
                }
                Phase::Open(_) => {
                    let retry_ms = 250 + super::requests::jitter(spread);
                    let reason = format!("server shutting down; retry after {retry_ms} ms");
                    let (entry, mut cx) = self.split(token, now);
                    let _ = entry.session.close(&mut cx, CloseCode::GOING_AWAY, &reason);
                    // Written now, not at the end of the turn: the close frame's chunk goes
                    // back to the pool before the next connection's is taken, so a million
                    // closes need a chunk, not a million.
                    self.flush(token, now);
                }
                Phase::Draining { .. } | Phase::Linger { .. } => {}
            }
            self.mark(token);
        }
    }

    /// Accepts a batch from one of the listeners.
    fn accept(&mut self, now: Instant, from: Listening) {
        if from == Listening::Plain {
            self.accept_more = false;
            #[cfg(target_os = "linux")]
            if self.ring.as_ref().is_some_and(|ring| ring.accepts) {
                // The ring's multishot accept takes them: a batch of those it took is opened.
                self.open_ring_backlog(now, ACCEPT_BATCH);
                return;
            }
        }
        let Some(listeners) = &self.listeners else { return };
        // The one listener speaks TLS when there is no TLS listener beside it.
        let tls_config = match (from, &listeners.tls) {
            (Listening::Plain, None) | (Listening::Tls, Some(_)) => self.tls_config.clone(),
            _ => None,
        };
        for _ in 0..ACCEPT_BATCH {
            let Some(listeners) = &self.listeners else { return };
            let listener = match from {
                Listening::Plain => Some(&listeners.plain),
                Listening::Tls => listeners.tls.as_ref(),
                Listening::Admin => listeners.admin.as_ref(),
            };
            let Some(listener) = listener else { return };
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
            self.open_accepted(stream, peer, from, tls_config.as_ref(), now);
        }
        self.accept_more = true;
    }

    /// Opens a connection accepted from `from` (through the ring when it carries the plain
    /// listener's connections): refused if a crowd of connections that are not open yet
    /// cannot make room, else given an entry and marked for the end of the turn.
    pub(super) fn open_accepted(
        &mut self,
        stream: mio::net::TcpStream,
        peer: SocketAddr,
        from: Listening,
        tls_config: Option<&crate::tls::ServerTls>,
        now: Instant,
    ) {
        // A crowd of connections that are not open yet makes room for the new one: the
        // oldest is closed, so that slow ones cannot keep a fast one out. The operator's
        // own listener is never turned away for a crowd on the public one.
        if from != Listening::Admin
            && !self.untrusted_room(1, 0)
            && !self.close_oldest_untrusted(now)
        {
            self.refuse_accepted(stream, peer, now, tls_config.is_some());
            return;
        }
        // What the kernel keeps unsent (`TCP_NOTSENT_LOWAT`): a write past it waits in the send
        // queue, inside the budget (`kernel_buffers.rs`).
        #[cfg(target_os = "linux")]
        if self.config.kernel_send_queue > 0 {
            let unsent = u32::try_from(self.config.kernel_send_queue).unwrap_or(u32::MAX);
            let _ = socket2::SockRef::from(&stream).set_tcp_notsent_lowat(unsent);
        }
        let token = self.conns.vacant_key();
        #[cfg(target_os = "linux")]
        let ringed = match &self.ring {
            Some(ring) if from == Listening::Plain && tls_config.is_none() => {
                T::over_ring(stream, ring.ring.shared(), token, self.serial + 1)
            }
            _ => Err(stream),
        };
        #[cfg(not(target_os = "linux"))]
        let ringed: Result<T, _> = Err(stream);
        let stream = match ringed {
            Ok(stream) => stream,
            Err(stream) => {
                // A TLS handshake counts against its address's share, unless a trusted proxy
                // names the client later.
                let client = (!self.shared.forwards(&self.config, peer)).then_some(peer.ip());
                let mut io =
                    Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
                let Some(mut stream) = T::accepted(stream, tls_config, &mut io, client) else {
                    return; // refused and counted (the address's share, the TLS budget)
                };
                if self
                    .poll
                    .registry()
                    .register(&mut stream, Token(token), Interest::READABLE | Interest::WRITABLE)
                    .is_err()
                {
                    let mut io = Io {
                        pool: &mut self.pool,
                        tls: &mut self.tls,
                        metrics: &self.shared.metrics,
                    };
                    stream.release(&mut io);
                    return;
                }
                stream
            }
        };
        let entry = self.conns.vacant_entry();
        self.shared.metrics.accepted.inc();
        let limited = self.shared.admit(&self.config, peer, now.as_millis() as f64 / 1000.0);
        self.serial += 1;
        let limits = &self.config.limits;
        entry.insert(Entry {
            serial: self.serial,
            stream,
            peer,
            session: Session::request(limits.send_queue(), now + limits.handshake_timeout),
            route: 0,
            limited,
            attributed: !self.shared.forwards(&self.config, peer),
            read_closed: false,
            admin_listener: from == Listening::Admin,
            event_stream: None,
            armed: None,
            dirty: false,
            upgraded: false,
            counted: 0,
            queued_at: 0,
        });
        self.charge_connections();
        self.trail_untrusted(token);
        self.mark(token);
    }

    /// Withholds from the pool the budget of the connections open now, so that buffers plus
    /// what the connections cost the kernel and the loop's table stay within `--memory`: an
    /// upgrade finds the pool short sooner (503) instead of the host running out.
    ///
    /// Half the connection reserve is never withheld: the answers the loop owes (a 503, a
    /// close, a pong) still find a chunk when a crowd has charged the rest. The budget is then
    /// exceeded by at most that half reserve per loop.
    pub(super) fn charge_connections(&mut self) {
        let chunk = self.pool.chunk_size();
        let floor = self.config.connection_reserve.div_ceil(chunk) / 2;
        let buffers = self.pool.chunks_total() * chunk / crate::kernel_memory::BUFFER_SHARE;
        // An HTTP/2 stream has no socket: it is charged its entry and its state; its
        // connection, the bound of what the connection may hold.
        let streams = self.http2_streams;
        let bytes = (self.conns.len() - streams) * self.connection_charge
            + streams * (std::mem::size_of::<Entry<T>>() + super::http2_connection::stream_bound())
            + self.http2.len() * super::http2_connection::connection_bound()
            + self.event_streams * EVENT_STREAM_STATE
            + self.kernel.bytes().min(buffers);
        let charged = bytes.div_ceil(chunk);
        self.pool.withhold(charged.min(self.pool.chunks_total().saturating_sub(floor)));
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
        let cx = loop_context!(self, now, for token);
        (&mut self.conns[token], cx)
    }

    pub(super) fn read(&mut self, token: usize, now: Instant) {
        let Some(entry) = self.conns.get(token) else { return };
        match entry.session.phase {
            // An HTTP/2 connection: its entry holds the socket, its streams are entries.
            Phase::Request { .. } if self.http2.contains_key(&token) => self.read_http2(token, now),
            // Waiting for its upgrade decision: nothing is read (§4.1: the client sends
            // nothing before the response); what arrives is read once it is decided.
            Phase::Request { .. }
                if self.pending.contains_key(&token) || self.awaiting.contains_key(&token) => {}
            Phase::Request { .. } => {
                self.read_request(token, now);
                self.reads_done(token);
            }
            Phase::Open(_) => self.read_open(token, now),
            Phase::Draining { .. } | Phase::Linger { .. } => self.read_discard(token),
            Phase::Body(_) => {
                self.read_body(token, now);
                self.reads_done(token);
            }
        }
        self.mark(token);
    }

    /// Lets a transport that keeps what it read until told ([`Transport::keeps_unread`]) give
    /// back the buffers the turn's reads of `token` emptied (`read_open` does it itself).
    fn reads_done(&mut self, token: usize) {
        let open = self.conns.len();
        if let Some(entry) = self.conns.get_mut(token)
            && entry.stream.keeps_unread()
        {
            let room = receive_room(&entry.session, &self.share, &self.pool, open);
            let mut io =
                Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
            entry.stream.unread(&mut io, 0, room);
        }
    }

    /// Reads and discards what the peer sends after our final response or close frame. At
    /// EOF a lingering connection goes; a draining one goes once its output is out.
    ///
    /// At most [`READ_BYTES_PER_TURN`] a turn, resumed after everyone else until the peer has
    /// sent [`READ_AFTER_CLOSE`](crate::session::READ_AFTER_CLOSE) (what it had in flight: a
    /// refused request's body, whose sender reads our answer once it has written it — RFC
    /// 9112 §9.6); a peer that keeps writing past that fills its socket buffer and waits, at
    /// no cost to the loop, until its EOF is read on a next arrival or the deadline removes
    /// it.
    pub(super) fn read_discard(&mut self, token: usize) {
        let entry = &mut self.conns[token];
        let mut io = Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
        let mut bytes = 0;
        let eof = loop {
            if bytes >= READ_BYTES_PER_TURN {
                if entry.session.count_discarded(bytes) {
                    self.resume.push(token);
                } else {
                    entry.stream.stop_input(&mut io);
                }
                break false;
            }
            match entry.stream.read(&mut io, &mut self.read_buf) {
                Ok(0) => break true,
                Ok(n) => bytes += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !entry.session.count_discarded(bytes) {
                        entry.stream.stop_input(&mut io);
                    }
                    break false;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break true,
            }
        };
        if eof && matches!(entry.session.phase, Phase::Linger { .. }) {
            self.remove(token);
        }
        self.reads_done(token);
    }

    pub(super) fn read_open(&mut self, token: usize, now: Instant) {
        // Under contention, whoever is behind pays before this read's replies are judged.
        self.reclaim(now);
        let mut buf = std::mem::take(&mut self.read_buf);
        let (plain, keeps) = match self.conns.get(token) {
            Some(entry) => (entry.stream.corks(), entry.stream.keeps_unread()),
            None => (false, false),
        };
        self.corking = plain.then_some(token);
        let (mut reads, mut bytes) = (0, 0);
        while let Some(entry) = self.conns.get_mut(token) {
            if !entry.session.wants_input() {
                if reads == 0 {
                    self.input_waits(token);
                }
                break;
            }
            if reads == READS_PER_TURN || bytes >= READ_BYTES_PER_TURN {
                // Fairness: a busy peer waits for the next turn, after everyone else.
                self.resume.push(token);
                break;
            }
            reads += 1;
            let read_closed = entry.read_closed;
            let mut io =
                Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
            let read = entry.stream.read(&mut io, &mut buf);
            let more = entry.stream.more_input();
            match read {
                Ok(0) => {
                    self.end_of_input(token, now);
                    break;
                }
                Ok(n) => {
                    self.stats.bytes_in += n as u64;
                    bytes += n;
                    entry.session.count_read(n);
                    self.reading = Some(token);
                    let used = self.receive(token, now, &mut buf[..n], keeps);
                    self.reading = None;
                    let open = self.conns.len();
                    if keeps && let Some(entry) = self.conns.get_mut(token) {
                        // The rest waits in the transport until the session reads again.
                        let room = receive_room(&entry.session, &self.share, &self.pool, open);
                        let mut io = Io {
                            pool: &mut self.pool,
                            tls: &mut self.tls,
                            metrics: &self.shared.metrics,
                        };
                        entry.stream.unread(&mut io, n - used, room);
                        self.stats.bytes_in -= (n - used) as u64;
                    }
                    // One write for the replies to this read, then its publishes.
                    self.write_cork(token, now);
                    self.fan_out_outbox(now);
                    if n < buf.len() && !read_closed && !more {
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
        self.write_cork(token, now);
        self.corking = None;
        self.read_buf = buf;
        let open = self.conns.len();
        if keeps && let Some(entry) = self.conns.get_mut(token) {
            // The buffers this turn's reads emptied go back to the transport's ring.
            let room = receive_room(&entry.session, &self.share, &self.pool, open);
            let mut io =
                Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
            entry.stream.unread(&mut io, 0, room);
        }
        // The end of the turn parks the connection again once nothing is in flight.
        self.mark(token);
    }

    /// Writes the cork to `token`'s socket (one `write`) if it is lent to `token`; what the
    /// socket does not take waits in the session's queue for the end of the turn (or for
    /// `WRITABLE`).
    pub(super) fn write_cork(&mut self, token: usize, now: Instant) {
        if self.cork.is_empty() || self.corking != Some(token) {
            return; // (another connection's replies: they leave with its read)
        }
        let Some(entry) = self.conns.get_mut(token) else {
            self.cork.clear();
            return;
        };
        let mut io = Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
        let written = entry.stream.write_vectored(&mut io, &[io::IoSlice::new(self.cork.bytes())]);
        match entry.session.corked_written(&mut self.cork, &mut self.pool, written) {
            Ok(n) => self.stats.bytes_out += n as u64,
            Err(_) => {
                let lost = self.conns[token].session.clear_queue(&mut self.pool);
                self.stats.closed += u64::from(lost);
                self.end_of_input(token, now);
                self.remove(token);
            }
        }
    }

    /// The peer's stream ended (or failed): the session hears of it, the handler of the close.
    pub(super) fn end_of_input(&mut self, token: usize, now: Instant) {
        let (entry, mut cx) = self.split(token, now);
        entry.session.handle_eof(&mut cx);
        self.report_close(token);
    }
}

/// What a transport that receives unasked (io_uring) may take for `session` before its next
/// read: the room below its high watermark once it is open, so that the replies to what it
/// receives keep it under the watermark; a request's head, or anything while the pool is
/// contended, a buffer at a time (its smallest receive). What such a transport holds for a
/// session that stopped reading is not in the session's share of the pool.
fn receive_room(session: &Session, share: &FairShare, pool: &Pool<'static>, conns: usize) -> usize {
    match session.phase {
        Phase::Open(_) if share.uncontended(pool, 0) => {
            let room = session.queue().watermarks().high().saturating_sub(session.buffered());
            room.min(pool.chunks_free() * pool.chunk_size() / conns.max(1))
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle connection costs its slab entry and nothing else (its protocol state is parked
    /// inside it): keep it small, 10,000 idle connections should need about 2 MB. (Measured
    /// 208 in a release build: the 200 it was, the time its send queue got its first byte,
    /// for the queue-delay histogram, and the session's pointer to its permessage-deflate or
    /// Server-Sent Events state, less the 8 bytes its watermarks gave up in four-byte fields.)
    #[test]
    fn idle_connection_state_stays_small() {
        let entry = size_of::<Entry<crate::transport::Stream>>();
        println!("Entry {entry} B, Stream {} B", size_of::<crate::transport::Stream>());
        // A debug build's mio `TcpStream` also carries its selector's id (16 bytes, not 4):
        // the fd's one niche then no longer names the third `Stream` variant (io_uring), which
        // takes a tag of its own. A release build keeps the tag beside the fd.
        let bound = if cfg!(debug_assertions) { 216 } else { 208 };
        assert!(entry <= bound, "Entry is {entry} bytes");
    }
}
