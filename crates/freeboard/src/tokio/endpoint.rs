//! The memory every connection of a tokio service shares ([`Endpoint`]) and the settings of
//! the endpoint and of each route.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use freeboard_buf::{Budget, Counters, Pool, PoolConfig};
use freeboard_proto::{Instant, Role};
use slab::Slab;

use crate::config::ConfigError;
use crate::metrics::Metrics;
use crate::parking::ParkingLot;
use crate::session::{Context, Cork, MaskSource, Reassembly, Share};
use crate::topics::{self, LocalTopics};

use super::fan_out::Subscriber;
use crate::{SlowConsumerPolicy, Watermarks};

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
    /// The protocol limits and timers of every connection: `max_message_size`,
    /// `close_timeout`, keep-alive `ping_interval` and `pong_timeout`.
    pub protocol: freeboard_proto::Config,
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
            protocol: freeboard_proto::Config::DEFAULT,
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

    /// Sets [`protocol`](Self::protocol).
    pub fn protocol(mut self, protocol: freeboard_proto::Config) -> Self {
        self.protocol = protocol;
        self
    }

    /// Sets [`connection_reserve`](Self::connection_reserve).
    pub fn connection_reserve(mut self, bytes: usize) -> Self {
        self.connection_reserve = bytes;
        self
    }
}

/// One connection's send queue settings and the subprotocols it may speak: per route.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WsConfig {
    /// Send queue watermarks and hard cap. Default 32 KiB low and 64 KiB high (the high one
    /// at least [`EndpointConfig::read_buffer`], so the replies to one read leave in one
    /// write), a cap of 16 MiB + 64 KiB (a largest message and then some), as `freeboard
    /// serve`'s.
    pub watermarks: Watermarks,
    /// What happens at the cap (and, while the pool is contended, past the connection's fair
    /// share). Default as `freeboard serve`: [`SlowConsumerPolicy::Close`] (1008).
    pub policy: SlowConsumerPolicy,
    /// Subprotocols the server speaks, in order of preference.
    pub protocols: Vec<String>,
}

impl Default for WsConfig {
    fn default() -> Self {
        // NOTE(unwrap): 32 KiB <= 64 KiB <= 16 MiB + 64 KiB.
        let watermarks = Watermarks::new(32 << 10, 64 << 10, (16 << 20) + (64 << 10))
            .expect("ordered watermarks");
        Self { watermarks, policy: SlowConsumerPolicy::Close, protocols: Vec::new() }
    }
}

impl WsConfig {
    /// Sets [`watermarks`](Self::watermarks).
    pub fn watermarks(mut self, watermarks: Watermarks) -> Self {
        self.watermarks = watermarks;
        self
    }

    /// Sets [`policy`](Self::policy).
    pub fn policy(mut self, policy: SlowConsumerPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets [`protocols`](Self::protocols).
    pub fn protocols<I: IntoIterator<Item = S>, S: Into<String>>(mut self, protocols: I) -> Self {
        self.protocols = protocols.into_iter().map(Into::into).collect();
        self
    }
}

/// The memory every connection of a tokio service shares: one chunk pool carved from one
/// budget, the parked protocol states, spare read buffers, and the topics its connections
/// subscribe to ([`publish`](Self::publish)). Cheap to share (`Arc`); any task of any runtime
/// thread may use it.
pub struct Endpoint {
    hub: Mutex<Hub>,
    /// Which topics have subscribers (the server's registry with one loop and no inboxes).
    pub(super) topics: topics::Hub,
    pub(super) protocol: freeboard_proto::Config,
    pub(super) read_buffer: usize,
    pub(super) reserve: usize,
    /// The session's clock starts here.
    pub(super) start: ::tokio::time::Instant,
}

/// What an endpoint lends its connections, behind one lock.
pub(super) struct Hub {
    pub(super) pool: Pool<'static>,
    pub(super) lot: ParkingLot,
    pub(super) masks: MaskSource,
    /// Connections alive: each one's fair share of a contended pool divides by it.
    open: usize,
    /// The pool share of each of `open` connections.
    share: Share,
    /// Subscribers by topic, topics by connection token.
    pub(super) subscriptions: LocalTopics,
    /// The connections that subscribed to something, by token.
    pub(super) subscribers: Slab<Weak<dyn Subscriber>>,
    /// Kept between publications: the subscribers one is fanned out to.
    pub(super) fan_out: Vec<Arc<dyn Subscriber>>,
    /// Read buffers no connection holds.
    pub(super) spare: Vec<Box<[u8]>>,
    /// Read buffers held by connections now.
    pub(super) reading: usize,
    /// Corks no connection holds (a connection holds one from a read until its replies are
    /// written).
    // Boxed as a connection holds them (a cork is over a KiB inline): lending one moves a
    // pointer, never allocates.
    #[allow(clippy::vec_box)]
    pub(super) spare_corks: Vec<Box<Cork>>,
    /// Corks held by connections now.
    pub(super) corking: usize,
    /// Buffers of sent messages, for messages received next.
    pub(super) spare_payloads: Vec<Vec<u8>>,
    /// What a server connection's partial message may take from the pool (a client's is
    /// [`Reassembly::CLIENT`]).
    server_limits: Reassembly,
}

impl Endpoint {
    /// An endpoint with `config`'s budget; `Err` if the chunk size is out of range or the
    /// budget cannot hold 16 chunks.
    pub fn new(config: EndpointConfig) -> Result<Arc<Self>, ConfigError> {
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
        Ok(Arc::new(Self {
            hub: Mutex::new(Hub {
                share: Share::new(&pool, 1),
                pool,
                lot: ParkingLot::new(config.protocol),
                masks: MaskSource::new(),
                open: 0,
                subscriptions: LocalTopics::new(0, config.max_topics_per_connection, tables),
                subscribers: Slab::new(),
                fan_out: Vec::new(),
                spare: Vec::new(),
                reading: 0,
                spare_corks: Vec::new(),
                corking: 0,
                spare_payloads: Vec::new(),
                server_limits: Reassembly::server(config.connection_reserve),
            }),
            topics: topics::Hub::new(&[], 1, config.max_topics, None, metrics),
            protocol: config.protocol,
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

    /// The pool's counters: budget, chunks in use and their high water, allocation failures.
    pub fn counters(&self) -> Counters {
        self.lock().pool.counters()
    }

    /// Connections alive on this endpoint.
    pub fn connections(&self) -> usize {
        self.lock().open
    }

    /// Read buffers held by connections now (each [`EndpointConfig::read_buffer`] bytes; an
    /// idle connection holds none).
    pub fn read_buffers_in_use(&self) -> usize {
        self.lock().reading
    }

    /// Corks held by connections now (each [`EndpointConfig::read_buffer`] bytes: the
    /// replies to one read, framed back to back until they are written; an idle connection
    /// holds none).
    pub fn corks_in_use(&self) -> usize {
        self.lock().corking
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Hub> {
        // A panic in another connection's call leaves the pool consistent (every change to it
        // is one call of freeboard-buf): go on.
        self.hub.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn now(&self) -> Instant {
        Instant::from_millis(self.start.elapsed().as_millis() as u64)
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hub = self.lock();
        f.debug_struct("Endpoint")
            .field("connections", &hub.open)
            .field("chunks_in_use", &hub.pool.chunks_in_use())
            .field("read_buffers_in_use", &hub.reading)
            .field("corks_in_use", &hub.corking)
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// One more connection (`1`) or one less (`-1`): the fair share of each changes.
    pub(super) fn count_open(&mut self, change: isize) {
        self.open = self.open.saturating_add_signed(change);
        self.share = Share::new(&self.pool, self.open);
    }

    /// What a session borrows for one call.
    /// `cork`: the connection's, while it holds one.
    pub(super) fn cx<'a>(
        &'a mut self,
        role: Role,
        now: Instant,
        cork: Option<&'a mut Cork>,
    ) -> Context<'a> {
        Context {
            pool: &mut self.pool,
            lot: &mut self.lot,
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
