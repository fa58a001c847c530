//! The memory every connection of a tokio service shares ([`Endpoint`]) and the settings of
//! the endpoint and of each route.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Waker;

use freeboard_buf::{Budget, Counters, Frame, Pool, PoolConfig, PushOutcome, SendQueue};
use freeboard_proto::{Instant, Role};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use slab::Slab;

use crate::config::ConfigError;
use crate::metrics::Metrics;
use crate::parking::ParkingLot;
use crate::session::event_copies::EventCopies;
use crate::session::{Context, Cork, FairShare, MaskSource, Reassembly};
use crate::topics::{self, LocalTopics};
use crate::{Limits, SlowConsumerPolicy, Watermarks};

/// The budget and limits every connection of an [`Endpoint`] shares. One
/// `#[non_exhaustive]` struct: start from [`default`](Self::default) and set fields.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EndpointConfig {
    /// Bytes of the chunk pool every connection's send queue and partial messages come from.
    /// Default 64 MiB.
    pub memory: usize,
    /// Pool chunk size. Default 4 KiB.
    pub chunk_size: usize,
    /// Bytes of one read buffer (a connection holds one only while it has unread input), and
    /// of one cork (the replies to one read, written at once). Default 64 KiB: half of
    /// `freeboard serve`'s, whose loop holds one of each for all its connections.
    pub read_buffer: usize,
    /// Free pool bytes an upgrade needs ([`Endpoint::has_room`]; the axum extractor answers
    /// 503 below it), and twice what a message arriving in pieces must leave free (else close
    /// 1013). Default 64 KiB.
    pub connection_reserve: usize,
    /// Every connection's send queue (a route's [`WsConfig`] may give its own), largest
    /// message and frame, and timeouts: `handshake_timeout` bounds
    /// [`WebSocket::accept`](super::WebSocket::accept)'s wait for the request (an axum or
    /// hyper server times its own). [`Limits::DEFAULT`] but for a send queue of 32 KiB /
    /// 64 KiB (the high mark at least `read_buffer`, so the replies to one read leave in one
    /// write) and no keep-alive pings (`idle_timeout` `None`).
    pub limits: Limits,
    /// Topics one connection may subscribe to. Default 64.
    pub max_topics_per_connection: usize,
    /// Topics (with at least one subscriber) the endpoint may have at once. Default 100,000.
    pub max_topics: usize,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            memory: 64 << 20,
            chunk_size: 4096,
            read_buffer: 64 << 10,
            connection_reserve: 64 << 10,
            limits: Limits::DEFAULT.send_low(32 << 10).send_high(64 << 10).idle_timeout(None),
            max_topics_per_connection: 64,
            max_topics: 100_000,
        }
    }
}

impl EndpointConfig {
    /// Sets [`memory`](Self::memory).
    pub fn memory(mut self, bytes: usize) -> Self {
        self.memory = bytes;
        self
    }

    /// Changes [`limits`](Self::limits), starting from the endpoint's:
    /// `.limits(|limits| limits.max_message_size(1 << 20))`.
    pub fn limits(mut self, change: impl FnOnce(Limits) -> Limits) -> Self {
        self.limits = change(self.limits);
        self
    }

    /// Sets [`connection_reserve`](Self::connection_reserve).
    pub fn connection_reserve(mut self, bytes: usize) -> Self {
        self.connection_reserve = bytes;
        self
    }
}

/// What a route's connections get instead of their endpoint's: a send queue of their own
/// (as [`RouteOptions`](crate::RouteOptions) gives a server route), and the subprotocols they
/// may speak.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct WsConfig {
    /// The send queue's watermarks and cap. Default: the endpoint's
    /// ([`Limits::send_low`], `send_high`, `send_cap`).
    pub watermarks: Option<Watermarks>,
    /// What happens at the cap (and, while the pool is contended, past the connection's fair
    /// share). Default: the endpoint's ([`Limits::slow_consumer`]).
    pub slow_consumer: Option<SlowConsumerPolicy>,
    /// Subprotocols the server speaks, in order of preference.
    pub protocols: Vec<String>,
}

impl WsConfig {
    /// Sets [`watermarks`](Self::watermarks).
    pub fn watermarks(mut self, marks: Watermarks) -> Self {
        self.watermarks = Some(marks);
        self
    }

    /// Sets [`slow_consumer`](Self::slow_consumer).
    pub fn slow_consumer(mut self, policy: SlowConsumerPolicy) -> Self {
        self.slow_consumer = Some(policy);
        self
    }

    /// Sets [`protocols`](Self::protocols).
    pub fn protocols<I: IntoIterator<Item = S>, S: Into<String>>(mut self, protocols: I) -> Self {
        self.protocols = protocols.into_iter().map(Into::into).collect();
        self
    }
}

/// A connection a publication can be queued to, whatever its transport (`fan_out.rs`
/// implements it for a connection): the endpoint's table of subscribers holds them.
pub(super) trait Subscriber: Send + Sync {
    /// Queues a publication by reference — its WebSocket frame, or for an event stream its
    /// event, made once per kind of event stream: `Some(true)` if the queue took it,
    /// `Some(false)` if it was dropped for this subscriber, `None` if the connection no longer
    /// sends.
    fn deliver(&self, copies: &mut Copies<'_>) -> Option<bool>;

    /// Ends the connection if its queue still holds bytes: they go back to the pool unsent.
    fn give_up(&self);
}

/// One publication on its way to an endpoint's subscribers: the WebSocket frame, and the
/// Server-Sent Events copies made from it as the first event stream of each kind takes one.
pub(super) struct Copies<'p> {
    pub(super) topic: &'p str,
    pub(super) frame: Frame,
    pub(super) events: EventCopies,
    /// The bytes of an event on their way into its copy.
    pub(super) scratch: (Vec<u8>, Vec<u8>),
    /// The last delivery ended an event stream by its `close` policy.
    pub(super) ended_stream: bool,
}

/// The memory every connection of a tokio service shares: one chunk pool carved from one
/// budget, and the topics its connections subscribe to ([`publish`](Self::publish)). Cheap to
/// share (`Arc`); any task of any runtime thread may use it.
///
/// A connection takes the endpoint's lock only to use the pool (a queue past the cork, a
/// message in pieces, a publication, a close): the common message is read, and its reply
/// corked and written, under the connection's own lock alone, with the read buffers, corks,
/// payload buffers and protocol-state boxes each worker thread keeps (`spares.rs`).
pub struct Endpoint {
    hub: Mutex<Hub>,
    /// Read buffers held by connections now.
    pub(super) reading: AtomicUsize,
    /// Corks held by connections now.
    pub(super) corking: AtomicUsize,
    /// Server-Sent Events streams open now (counted among the connections too).
    pub(super) event_streams: AtomicUsize,
    /// WebSocket upgrades and event streams answered `503` for want of budget.
    pub(super) budget_refusals: AtomicU64,
    /// Messages the connections' slow-consumer policies dropped, by policy (its discriminant).
    drops: [AtomicU64; SlowConsumerPolicy::ALL.len()],
    /// Connections the `close` policy closed.
    slow_consumer_closes: AtomicU64,
    /// What a reply may add to a cork without a look at the pool
    /// ([`FairShare::uncontended_room`]), as of the last time the lock was released.
    pub(super) cork_room: AtomicUsize,
    /// Which topics have subscribers (the server's registry with one loop and no inboxes).
    pub(super) topics: topics::Hub,
    /// Invariant: validated ([`Limits::validate`]).
    pub(super) limits: Limits,
    pub(super) protocol: freeboard_proto::Config,
    pub(super) read_buffer: usize,
    pub(super) reserve: usize,
    /// The session's clock starts here.
    pub(super) start: ::tokio::time::Instant,
}

/// What an endpoint lends its connections, behind one lock.
pub(super) struct Hub {
    pub(super) pool: Pool<'static>,
    pub(super) masks: MaskSource,
    /// Connections alive: each one's fair share of a contended pool divides by it.
    open: usize,
    /// The pool share of each of `open` connections.
    share: FairShare,
    /// Subscribers by topic, topics by connection token.
    pub(super) subscriptions: LocalTopics,
    /// The connections that subscribed to something, by token.
    pub(super) subscribers: Slab<Weak<dyn Subscriber>>,
    /// Kept between publications: the subscribers one is fanned out to.
    pub(super) fan_out: Vec<Arc<dyn Subscriber>>,
    /// What a server connection's partial message may take from the pool (a client's is
    /// [`Reassembly::CLIENT`]).
    server_limits: Reassembly,
    /// Pool chunks withheld for the [`Charge`]s alive.
    charged: usize,
    /// Sends waiting for the pool to have room again.
    room_waiters: RoomWaiters,
}

/// The tasks whose sends the `block` policy refused for want of pool room
/// ([`Limit::Pool`](crate::Limit::Pool)), one entry per connection: the pool is
/// shared, so no event of their own queue tells them when to retry. An entry is woken (and
/// removed) when a lock holder leaves the pool with more room than when its send was refused.
#[derive(Default)]
struct RoomWaiters {
    /// Invariant: at most one entry per connection (its key is kept in the connection's
    /// state and reused while the entry lives), so the slab is bounded by the connections.
    waiting: Slab<RoomWait>,
}

/// One connection's tasks waiting for pool room.
struct RoomWait {
    /// The connection's identity (the address of its state, unique while it lives): a key
    /// a connection kept after its entry was woken and removed may name another's entry.
    conn: usize,
    /// The pool's room when the send was last refused.
    seen: PoolRoom,
    /// The smallest message refused (framed), which cannot fit while the pool is
    /// [short](FairShare::short) for it.
    bytes: usize,
    /// The waiting tasks (more than one only when several tasks send on one connection).
    wakers: Vec<Waker>,
}

/// What decides whether a send the pool refused may now fit: free chunks and segment slots,
/// and the connections open (each one's fair share grows as they close).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PoolRoom {
    chunks: usize,
    slots: usize,
    open: usize,
}

impl PoolRoom {
    fn of(hub: &Hub) -> Self {
        let pool = &hub.pool;
        let slots = pool.segments_total() - pool.segments_in_use();
        Self { chunks: pool.chunks_free(), slots, open: hub.open }
    }

    /// Whether a push refused at `seen` may succeed now.
    fn grew_since(&self, seen: &PoolRoom) -> bool {
        self.chunks > seen.chunks || self.slots > seen.slots || self.open < seen.open
    }
}

/// Pool chunks an [`Endpoint`] withholds for memory spent outside its pool (an HTTP/2
/// connection's buffers inside h2), until this is dropped.
#[must_use = "the chunks come back when the charge drops"]
pub struct Charge {
    endpoint: Arc<Endpoint>,
    chunks: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut hub = self.endpoint.lock();
        hub.charged -= self.chunks;
        hub.withhold_charged();
    }
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charge").field("chunks", &self.chunks).finish_non_exhaustive()
    }
}

impl Endpoint {
    /// An endpoint with `config`'s budget; `Err` if a limit cannot work, the chunk size is
    /// out of range or the budget cannot hold 16 chunks.
    pub fn new(config: EndpointConfig) -> Result<Arc<Self>, ConfigError> {
        config.limits.validate()?;
        let protocol = config.limits.protocol();
        let (min, max) = (crate::config::MIN_CHUNK_SIZE, freeboard_buf::MAX_CHUNK_SIZE);
        if !(min..=max).contains(&config.chunk_size) {
            return Err(ConfigError::ChunkSize { given: config.chunk_size, min, max });
        }
        let needed = 16 * config.chunk_size;
        let pool_config = PoolConfig::new().with_chunk_size(config.chunk_size);
        // The topic tables (who subscribes to what) are held in their own part of the budget.
        let tables = Budget::new(config.memory / topics::TABLE_SHARE);
        let pool = match Pool::new(Budget::new(config.memory - tables.limit()), pool_config) {
            Ok(pool) if pool.chunks_total() >= 16 => pool,
            _ => return Err(ConfigError::Memory { memory: config.memory, threads: 1, needed }),
        };
        let metrics = Arc::new(Metrics::new());
        let share = FairShare::new(&pool, 1);
        let cork_room = share.uncontended_room(&pool);
        Ok(Arc::new(Self {
            hub: Mutex::new(Hub {
                share,
                pool,
                masks: MaskSource::new(),
                open: 0,
                subscriptions: LocalTopics::new(0, config.max_topics_per_connection, tables),
                subscribers: Slab::new(),
                fan_out: Vec::new(),
                server_limits: Reassembly::server(config.connection_reserve),
                charged: 0,
                room_waiters: RoomWaiters::default(),
            }),
            reading: AtomicUsize::new(0),
            corking: AtomicUsize::new(0),
            event_streams: AtomicUsize::new(0),
            budget_refusals: AtomicU64::new(0),
            drops: Default::default(),
            slow_consumer_closes: AtomicU64::new(0),
            cork_room: AtomicUsize::new(cork_room),
            topics: topics::Hub::new(&[], 1, config.max_topics, None, metrics),
            limits: config.limits,
            protocol,
            read_buffer: config.read_buffer.max(1024),
            reserve: config.connection_reserve,
            start: ::tokio::time::Instant::now(),
        }))
    }

    /// Whether the pool has a connection's reserve free: admit a new connection only then.
    pub fn has_room(&self) -> bool {
        let hub = self.lock();
        hub.pool.chunks_free() * hub.pool.chunk_size() >= self.reserve
    }

    /// Withholds `bytes` of the pool (rounded up to chunks) for memory spent outside it, if
    /// the pool's free chunks cover them and a connection's reserve beside (what is charged
    /// for can then open a connection); `None` if they do not. The chunks come back when the
    /// [`Charge`] drops. The HTTPS server charges each HTTP/2 connection's buffers so.
    pub fn charge(self: &Arc<Self>, bytes: usize) -> Option<Charge> {
        let mut hub = self.lock();
        let chunk = hub.pool.chunk_size();
        let chunks = bytes.div_ceil(chunk);
        if hub.pool.chunks_free() < chunks + self.reserve.div_ceil(chunk) {
            return None;
        }
        hub.charged += chunks;
        hub.withhold_charged();
        Some(Charge { endpoint: Arc::clone(self), chunks })
    }

    /// Pool chunks withheld now for the [`Charge`]s alive.
    pub fn chunks_charged(&self) -> usize {
        self.lock().charged
    }

    /// The pool's counters: budget, chunks in use and their high water, allocation failures.
    pub fn counters(&self) -> Counters {
        self.lock().pool.counters()
    }

    /// Connections alive on this endpoint.
    pub fn connections(&self) -> usize {
        self.lock().open
    }

    /// Connections with a send waiting for pool room now
    /// ([`WsWriter::send_async`](super::WsWriter::send_async) or the
    /// [`Sink`](futures_sink::Sink) under the `block` policy, refused with
    /// [`Limit::Pool`](crate::Limit::Pool)).
    pub fn connections_waiting_for_room(&self) -> usize {
        self.lock().room_waiters.waiting.len()
    }

    /// Server-Sent Events streams open now; [`connections`](Self::connections) counts them
    /// beside the WebSockets (as `freeboard_sse_connections` among `freeboard_connections`).
    pub fn event_streams(&self) -> usize {
        self.event_streams.load(Ordering::Relaxed)
    }

    /// WebSocket upgrades and event streams answered `503` because the pool could not cover
    /// a connection's reserve (`freeboard_access_refusals_total{reason="budget"}`).
    pub fn budget_refusals(&self) -> u64 {
        self.budget_refusals.load(Ordering::Relaxed)
    }

    /// Messages `policy` dropped from the send queues of this endpoint's connections (a
    /// publication a `block` queue could not take included; a message a `close` queue
    /// refused as it closed too), as `freeboard_drops_total{reason}` counts them.
    pub fn drops(&self, policy: SlowConsumerPolicy) -> u64 {
        self.drops[policy as usize].load(Ordering::Relaxed)
    }

    /// Connections the `close` policy closed with 1008 (an event stream: its last event
    /// `freeboard-close` `1008 slow consumer`).
    pub fn slow_consumer_closes(&self) -> u64 {
        self.slow_consumer_closes.load(Ordering::Relaxed)
    }

    /// The endpoint's counts as Prometheus metrics under `freeboard serve`'s names
    /// (`freeboard_connections`, `freeboard_sse_connections`, `freeboard_drops_total{reason}`,
    /// `freeboard_slow_consumer_closes_total`,
    /// `freeboard_access_refusals_total{reason="budget"}`), read at each scrape: register it
    /// in the service's `prometheus_client` registry.
    pub fn collector(self: &Arc<Self>) -> EndpointCollector {
        EndpointCollector(Arc::clone(self))
    }

    /// Counts what a slow-consumer `policy` did to a message (`outcome`); `publication`: a
    /// fan-out's, which a `block` queue that refuses it loses.
    pub(super) fn count_push(
        &self,
        policy: SlowConsumerPolicy,
        outcome: &PushOutcome,
        publication: bool,
    ) {
        let messages = match *outcome {
            PushOutcome::Dropped { messages, .. } => messages,
            PushOutcome::MustClose { messages, .. } => {
                self.slow_consumer_closes.fetch_add(1, Ordering::Relaxed);
                messages
            }
            PushOutcome::WouldBlock { .. } if publication => 1,
            _ => return,
        };
        self.drops[policy as usize].fetch_add(u64::from(messages), Ordering::Relaxed);
    }

    /// Read buffers held by connections now (each [`EndpointConfig::read_buffer`] bytes; an
    /// idle connection holds none).
    pub fn read_buffers_in_use(&self) -> usize {
        self.reading.load(Ordering::Relaxed)
    }

    /// Corks held by connections now (each [`EndpointConfig::read_buffer`] bytes: the
    /// replies to one read, framed back to back until they are written; an idle connection
    /// holds none).
    pub fn corks_in_use(&self) -> usize {
        self.corking.load(Ordering::Relaxed)
    }

    pub(super) fn lock(&self) -> HubGuard<'_> {
        // A panic in another connection's call leaves the pool consistent (every change to it
        // is one call of freeboard-buf): go on.
        let guard = self.hub.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        HubGuard { guard, cork_room: &self.cork_room }
    }

    pub(super) fn now(&self) -> Instant {
        Instant::from_millis(self.start.elapsed().as_millis() as u64)
    }

    /// An empty send queue for a connection of a route with `config`.
    pub(super) fn send_queue(&self, config: &WsConfig) -> SendQueue {
        // NOTE(unwrap): `new` validated the limits.
        let marks = config
            .watermarks
            .unwrap_or_else(|| self.limits.send_watermarks().expect("validated limits"));
        SendQueue::new(marks, config.slow_consumer.unwrap_or(self.limits.slow_consumer))
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hub = self.lock();
        f.debug_struct("Endpoint")
            .field("connections", &hub.open)
            .field("chunks_in_use", &hub.pool.chunks_in_use())
            .field("read_buffers_in_use", &self.read_buffers_in_use())
            .field("corks_in_use", &self.corks_in_use())
            .finish_non_exhaustive()
    }
}

/// An [`Endpoint`]'s counts as Prometheus metrics ([`Endpoint::collector`]).
#[derive(Debug, Clone)]
pub struct EndpointCollector(Arc<Endpoint>);

/// The label of a series counted per reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

impl Collector for EndpointCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let endpoint = &*self.0;
        for (name, help, value) in [
            (
                "freeboard_connections",
                "Open connections: WebSockets and Server-Sent Events streams",
                endpoint.connections(),
            ),
            (
                "freeboard_sse_connections",
                "Open Server-Sent Events streams (counted in connections too)",
                endpoint.event_streams(),
            ),
        ] {
            let e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value as i64).encode(e)?;
        }
        let e = encoder.encode_descriptor(
            "freeboard_slow_consumer_closes",
            "Connections closed with 1008 because their send queue reached its cap",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(endpoint.slow_consumer_closes()).encode(e)?;
        let mut e = encoder.encode_descriptor(
            "freeboard_drops",
            "Messages dropped, by the slow-consumer policy that dropped them",
            None,
            MetricType::Counter,
        )?;
        for policy in SlowConsumerPolicy::ALL {
            let label = ReasonLabel { reason: policy.name() };
            ConstCounter::new(endpoint.drops(policy)).encode(e.encode_family(&label)?)?;
        }
        let mut e = encoder.encode_descriptor(
            "freeboard_access_refusals",
            "Upgrades and event streams refused, by reason",
            None,
            MetricType::Counter,
        )?;
        let label = ReasonLabel { reason: "budget" };
        ConstCounter::new(endpoint.budget_refusals()).encode(e.encode_family(&label)?)
    }
}

/// The endpoint's lock, held. Releasing it publishes what a reply may add to a cork
/// ([`Endpoint::cork_room`]) for the connections that cork without taking it.
pub(super) struct HubGuard<'e> {
    guard: MutexGuard<'e, Hub>,
    cork_room: &'e AtomicUsize,
}

impl std::ops::Deref for HubGuard<'_> {
    type Target = Hub;

    fn deref(&self) -> &Hub {
        &self.guard
    }
}

impl std::ops::DerefMut for HubGuard<'_> {
    fn deref_mut(&mut self) -> &mut Hub {
        &mut self.guard
    }
}

impl Drop for HubGuard<'_> {
    fn drop(&mut self) {
        // Still under the lock: the figure is the pool's as this holder leaves it.
        let room = self.guard.share.uncontended_room(&self.guard.pool);
        self.cork_room.store(room, Ordering::Relaxed);
        // Every change to the pool is made under this lock, so its release is where chunks
        // that came back are noticed; nobody waits in the common case, and the test is one
        // load.
        if !self.guard.room_waiters.waiting.is_empty() {
            self.guard.wake_for_room();
        }
    }
}

impl Hub {
    /// One more connection (`1`) or one less (`-1`): the fair share of each changes.
    pub(super) fn count_open(&mut self, change: isize) {
        self.open = self.open.saturating_add_signed(change);
        self.share = FairShare::new(&self.pool, self.open);
    }

    /// Registers `waker` to be woken once the pool has more room than now: call it under the
    /// lock the refused push was judged under, so no release between the two is missed.
    /// `slot` is the connection's key among the waiters (kept in its state), `conn` its
    /// identity.
    /// `bytes`: the refused message, framed.
    pub(super) fn wait_for_room(
        &mut self,
        slot: &mut Option<usize>,
        conn: usize,
        bytes: usize,
        waker: &Waker,
    ) {
        let seen = PoolRoom::of(self);
        let waiting = &mut self.room_waiters.waiting;
        match slot.and_then(|key| waiting.get_mut(key)).filter(|wait| wait.conn == conn) {
            Some(wait) => {
                wait.seen = seen;
                wait.bytes = wait.bytes.min(bytes);
                if !wait.wakers.iter().any(|w| w.will_wake(waker)) {
                    wait.wakers.push(waker.clone());
                }
            }
            None => {
                let wait = RoomWait { conn, seen, bytes, wakers: vec![waker.clone()] };
                *slot = Some(waiting.insert(wait));
            }
        }
    }

    /// Removes the connection's entry among the waiters, if it has one: its send went
    /// through, or gave up. Other tasks of the connection waiting in it are woken to look
    /// again for themselves.
    pub(super) fn stop_waiting_for_room(&mut self, slot: &mut Option<usize>, conn: usize) {
        let Some(key) = slot.take() else { return };
        let waiting = &mut self.room_waiters.waiting;
        if waiting.get(key).is_some_and(|wait| wait.conn == conn) {
            waiting.remove(key).wakers.into_iter().for_each(Waker::wake);
        }
    }

    /// Wakes (and removes) the entries that the pool has more room for than when their send
    /// was refused, and room enough that their message may fit: a waiter is not polled for
    /// every chunk that comes back.
    #[cold]
    fn wake_for_room(&mut self) {
        let now = PoolRoom::of(self);
        let (pool, share) = (&self.pool, &self.share);
        self.room_waiters.waiting.retain(|_, wait| {
            if !now.grew_since(&wait.seen) || share.short(pool, wait.bytes) {
                return true;
            }
            wait.wakers.drain(..).for_each(Waker::wake);
            false
        });
    }

    /// Withholds the charged chunks from the pool; each connection's fair share shrinks.
    fn withhold_charged(&mut self) {
        self.pool.withhold(self.charged);
        self.share = FairShare::new(&self.pool, self.open);
    }

    /// What a session borrows for one call: the pool under this lock, and `lot`, the calling
    /// thread's boxes for protocol states (`spares.rs`). `cork`: the connection's, while it
    /// holds one.
    pub(super) fn cx<'a>(
        &'a mut self,
        lot: &'a mut ParkingLot,
        role: Role,
        now: Instant,
        cork: Option<&'a mut Cork>,
    ) -> Context<'a> {
        Context {
            pool: &mut self.pool,
            lot,
            masks: if role == Role::Client { Some(&mut self.masks) } else { None },
            limits: match role {
                Role::Server => &self.server_limits,
                Role::Client => &Reassembly::CLIENT,
            },
            share: &self.share,
            // permessage-deflate is declined at this driver's handshakes, so no session
            // here compresses.
            codec: None,
            cork,
            now,
        }
    }
}
