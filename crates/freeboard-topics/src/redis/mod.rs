//! Topics across machines: a Redis pub/sub backplane.
//!
//! With [`RedisConfig::redis`](crate::RedisConfig) set, every publication of this node
//! (a handler's, [`ServerHandle::publish`](crate::ServerHandle::publish), `POST`) is delivered
//! to the local subscribers at once, as without a backplane, and also sent to the Redis channel
//! `freeboard:` + topic; every node that has a local subscriber to the topic is subscribed to
//! that channel and delivers what arrives to its own subscribers. What travels is the message
//! and its kind, not a WebSocket frame:
//!
//! ```text
//! b'F' | kind (b't' text, b'b' binary) | node id (16 bytes) | payload
//! ```
//!
//! A node skips what carries its own id (its subscribers already have it), so nothing is
//! delivered twice. A node subscribes in Redis when its first local subscriber to a topic
//! arrives and unsubscribes after the last leaves (the runtime's topic hub tells it).
//!
//! Threads, each with its own blocking connections — the event loops never wait on Redis:
//! - the **publisher** takes publications from a queue bounded in bytes
//!   ([`RedisConfig::redis_queue`](crate::RedisConfig)) and pipelines them, one
//!   connection and one pipeline per Redis server;
//! - the **subscriber** follows the hub's changes and has a **shard thread** per Redis server
//!   that serves a subscribed topic, which holds those subscriptions on its own connection and
//!   hands each message to the loops' inboxes;
//! - with presence configured, the **presence carrier** writes this node's members under keys
//!   that expire unless refreshed and reads the other nodes' ([`presence`]).
//!
//! # Redis Cluster
//!
//! Nothing to configure: the `redis` URLs are seeds, and [`shards`] asks them whether they are
//! a cluster. On a cluster a topic's channel lives on the master that owns its hash slot: a
//! node `SPUBLISH`es there and `SSUBSCRIBE`s there (sharded pub/sub, Redis 7.0+), so a message
//! travels to the shard that owns it and no further (plain `PUBLISH` would be copied to every
//! node of the cluster). A node answering `MOVED` or `ASK` gets its publications sent once
//! more where it says (they were not executed) and the map is asked for again; a shard that
//! drops a subscription (`sunsubscribe`: the slot left it) or cannot be reached has the map
//! asked for again too, and each topic is subscribed on whichever master serves it now. A
//! cluster without sharded pub/sub (before 7.0) gets plain `PUBLISH`/`SUBSCRIBE`, routed the
//! same way.
//!
//! Redis down: local delivery goes on; a publication that cannot reach its server is counted
//! in `backplane_lost_total{reason="redis_down"}` (a full queue: `reason="queue_full"`; written
//! but unconfirmed when the connection failed: `reason="unconfirmed"`; an error reply from
//! Redis, or a second redirection: `reason="refused"`) and never retried, so nothing
//! arrives twice. Every connection reconnects with backoff (100 ms doubling to 2 s), per
//! server, and a shard thread subscribes again to every topic it holds.
//!
//! The client is the `redis` crate's synchronous API (no async runtime: freeboard's loops are
//! its own threads, and these threads block on Redis so that no loop ever does). `fred`
//! was the other candidate; it is built on tokio only, which the server does not otherwise
//! need. The crate's sync API has no cluster pub/sub (only its tokio cluster client has
//! `SSUBSCRIBE`), and its cluster client retries on its own, which could deliver twice: the
//! slot map and the routing are [`shards`]; a subscription's connection is a socket read with
//! the crate's RESP parser.

mod presence;
mod shards;

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use freeboard_proto::MessageKind;
use redis::{Connection, RedisError, RetryMethod, Value};

pub(crate) use self::shards::RedisAddr;

/// A message from a channel, as the runtime takes it.
type Incoming<'m> = Arrival<'m>;
use self::shards::{Shards, TIMEOUT, Topology};
use freeboard::backplane::{self, Acknowledgement, Arrival, AwaitingHistory, Backplane};
use freeboard::history::{History, Offset, Position};
use freeboard::metrics::Metrics;

use crate::{Durability, Error};

/// Publications the queue towards Redis holds at most, whatever their size.
const QUEUE_MESSAGES: usize = 65_536;
/// First reconnect delay; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long a shard thread waits for a message before it looks at its assignment.
const POLL: Duration = Duration::from_millis(20);
/// Channel prefix in Redis; a topic's history stream has its channel's name as its key, so
/// both hash to one slot of a cluster whatever the topic's name.
const PREFIX: &str = "freeboard:";

/// How long a recovery keeps its topic subscribed: time for the upgrade to finish and the
/// connection to subscribe.
const PIN: Duration = Duration::from_secs(10);
/// Reconnecting subscribers whose history waits to be fetched (as many as the default
/// `max_pending_upgrades`, which refuses more upgrades first); more get 503, with a jittered
/// `Retry-After`. The fetcher takes what has queued as one batch, one read per topic.
const RECOVERIES: usize = 1024;

/// How long a publication waits for a replica to have it (`--durability replica`): `WAIT`'s
/// timeout, after which it is answered as not durable.
const REPLICA_WAIT: Duration = Duration::from_secs(1);

/// A publication on its way to Redis.
struct Outgoing {
    /// Said once Redis (or a replica) has it; dropped unsaid if not.
    ack: Option<Acknowledgement>,
    channel: Vec<u8>,
    /// Kept in the topic's stream, then published with its offset.
    kept: bool,
    /// For a topic without history, whether its sequence number is in `message` (given when
    /// it is first sent, kept if a cluster redirects it).
    numbered: bool,
    message: Vec<u8>,
}

/// The Lua script that keeps a publication in its topic's stream and publishes it with its
/// offset, `{epoch}.{entry ID}`, atomically, so every node sees the streams' order. The
/// stream's key is the channel's name; the epoch is a key beside it ([`epoch_key`], one slot
/// on a cluster, where the script runs on its master). A new epoch is drawn whenever the
/// stream or its epoch is missing (a Redis that lost its data, an expired or deleted stream):
/// the stream's continuity then cannot be vouched for. It is the time of Redis (seconds and
/// microseconds, 13 hex digits) and three hex digits of the publishing node, so two
/// histories of one topic never share one.
/// KEYS: stream and channel, epoch; ARGV: kind, payload, most messages, oldest age in ms
/// (0: none), publish command (`PUBLISH`, or `SPUBLISH` on a cluster), the node's 3 digits.
const KEEP_AND_PUBLISH: &str = r#"
local epoch = redis.call('GET', KEYS[2])
if not epoch or redis.call('EXISTS', KEYS[1]) == 0 then
  local t = redis.call('TIME')
  epoch = string.format('%x%05x', tonumber(t[1]), tonumber(t[2])) .. ARGV[6]
  redis.call('SET', KEYS[2], epoch)
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[3], '*', 'k', ARGV[1], 'm', ARGV[2])
local age = tonumber(ARGV[4])
if age > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('XTRIM', KEYS[1], 'MINID', tostring(now - age))
  redis.call('PEXPIRE', KEYS[1], age)
  redis.call('PEXPIRE', KEYS[2], age)
end
local offset = epoch .. '.' .. id
redis.call(ARGV[5], KEYS[1], 'S' .. ARGV[1] .. offset .. ':' .. ARGV[2])
return offset
"#;

/// The Lua script that reads what a topic's stream holds after an offset, atomically with
/// the epoch and the stream's bounds: `{}` if there is no stream or no epoch, `{epoch}` if
/// the epoch is another, else `{epoch, max deleted ID, last ID, entries after ARGV[2]}`.
/// KEYS: stream, epoch; ARGV: the offset's epoch, its position.
const READ_AFTER: &str = r#"
local epoch = redis.call('GET', KEYS[2])
if not epoch or redis.call('EXISTS', KEYS[1]) == 0 then return {} end
if epoch ~= ARGV[1] then return {epoch} end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local deleted, last = '', ''
for i = 1, #info, 2 do
  if info[i] == 'max-deleted-entry-id' then deleted = info[i + 1] end
  if info[i] == 'last-generated-id' then last = info[i + 1] end
end
return {epoch, deleted, last, redis.call('XRANGE', KEYS[1], '(' .. ARGV[2], '+')}
"#;

/// A reconnecting subscriber whose history is to be fetched before its upgrade is accepted.
struct HistoryFetch {
    topic: Arc<str>,
    since: Offset,
    awaiting: AwaitingHistory,
}

/// A Redis / Redis Cluster backplane ([`Backplane`]): built from the `topics.redis` URLs,
/// started by the server it is bound with
/// ([`Server::bind_with_backplane`](freeboard::Server::bind_with_backplane)).
#[derive(Debug)]
pub struct RedisBackplane {
    /// Until started.
    addr: Option<RedisAddr>,
    queue_bytes: usize,
    keeps_history: bool,
    /// Fail the start (and so the bind) when Redis cannot be reached then.
    required: bool,
    /// What a kept publication's acknowledgement waits for.
    durability: Durability,
    /// Once started.
    running: Option<Running>,
}

impl RedisBackplane {
    /// A backplane on the Redis servers `urls` names (comma-separated seeds of one cluster, or
    /// one server), holding at most `queue_bytes` of publications while Redis is slow or down;
    /// `keeps_history`: topics that keep history keep it in Redis streams.
    pub fn new(urls: &str, queue_bytes: usize, keeps_history: bool) -> Result<Self, Error> {
        let addr = RedisAddr::parse(urls).map_err(Error::Redis)?;
        Ok(Self {
            addr: Some(addr),
            queue_bytes,
            keeps_history,
            required: false,
            durability: Durability::default(),
            running: None,
        })
    }

    /// What a publish answer on a history topic waits for before it says the publication was
    /// accepted (`--durability`): nothing, Redis' reply, or a replica's too (`WAIT 1`).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// With `required`, [`start`](Backplane::start) fails (and with it the server's bind)
    /// when Redis cannot be reached then, instead of starting and reconnecting until it can
    /// (`--redis-required`).
    pub fn required(mut self, required: bool) -> Self {
        self.required = required;
        self
    }
}

/// This node's end of the backplane, once started.
#[derive(Debug)]
struct Running {
    node: [u8; 16],
    changes: Arc<Mutex<Sender<SubscriberEvent>>>,
    outgoing: SyncSender<Outgoing>,
    /// Invariant: the bytes of the publications in `outgoing`.
    queued: Arc<AtomicUsize>,
    /// The servers the publisher holds a connection to.
    connected: Connected,
    shards: Arc<Shards>,
    queue_bytes: usize,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    /// With history kept in Redis streams: where reconnecting subscribers' fetches queue.
    recoveries: Option<SyncSender<HistoryFetch>>,
}

impl Backplane for RedisBackplane {
    fn keeps_history(&self) -> bool {
        self.keeps_history
    }

    /// Starts the publisher and subscriber threads (and, with history, the thread that
    /// fetches it for reconnecting subscribers). The link's `deliver` hands a message from
    /// Redis to this node's loops; it returns `false` once the server is gone, which ends the
    /// subscriber thread.
    fn start(&mut self, link: backplane::Link) -> io::Result<()> {
        let addr = self.addr.take().ok_or_else(|| io::Error::other("started twice"))?;
        let host_port = addr.host_port.clone();
        let shards = Arc::new(Shards::new(addr));
        if self.required && shards.get().is_none() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!(
                    "cannot reach Redis at {host_port} (--redis-required: refusing to start \
                     without it)"
                ),
            ));
        }
        let node = node_id();
        let metrics = link.metrics().clone();
        let history = link.history().filter(|_| self.keeps_history).cloned();
        let (changes, changes_rx) = std::sync::mpsc::channel();
        let changes = Arc::new(Mutex::new(changes));
        let stop = Arc::new(AtomicBool::new(false));
        if let Some(presence) = link.presence().cloned() {
            let (shards, stop) = (shards.clone(), stop.clone());
            std::thread::Builder::new()
                .name("freeboard-redis-presence".into())
                .spawn(move || presence::carrier(presence, shards, stop))?;
        }
        let (outgoing, outgoing_rx) = std::sync::mpsc::sync_channel(QUEUE_MESSAGES);
        let queued = Arc::new(AtomicUsize::new(0));
        let connected = Connected::default();
        {
            let (shards, queued, metrics, stop) =
                (shards.clone(), queued.clone(), metrics.clone(), stop.clone());
            let history = history.clone();
            let connected = connected.clone();
            let nonce = nonce(node);
            let durability = self.durability;
            let publishing =
                Publishing { shards, queued, metrics, history, stop, connected, nonce, durability };
            std::thread::Builder::new()
                .name("freeboard-redis-pub".into())
                .spawn(move || publisher(publishing, outgoing_rx))?;
        }
        let recoveries = match &history {
            Some(history) => {
                let (requests, requests_rx) = std::sync::mpsc::sync_channel(RECOVERIES);
                let (shards, changes, stop) = (shards.clone(), changes.clone(), stop.clone());
                let (h, m) = (history.clone(), metrics.clone());
                std::thread::Builder::new()
                    .name("freeboard-redis-history".into())
                    .spawn(move || fetcher(shards, requests_rx, changes, h, m, stop))?;
                Some(requests)
            }
            None => None,
        };
        {
            let (metrics, stop) = (metrics.clone(), stop.clone());
            let events = changes.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let ender = link.clone();
            let end_history = Box::new(move |topic: &str| ender.end_history(topic));
            let continuity = Arc::new(Continuity::new(end_history, metrics.clone()));
            let deliver: Arc<Deliver> = Arc::new(move |arrival| link.deliver(arrival));
            let shards = shards.clone();
            std::thread::Builder::new().name("freeboard-redis-map".into()).spawn(move || {
                let receiving = Receiving { deliver, continuity };
                subscriber(shards, node, changes_rx, events, metrics, history, stop, receiving);
            })?;
        }
        let queue_bytes = self.queue_bytes;
        self.running = Some(Running {
            node,
            changes,
            outgoing,
            queued,
            connected,
            shards,
            queue_bytes,
            metrics,
            stop,
            recoveries,
        });
        Ok(())
    }

    /// The node's first local subscriber to `topic` arrived.
    fn subscribe(&self, topic: &Arc<str>) {
        if let Some(running) = &self.running {
            running.change(SubscriberEvent::Subscribe(topic.clone()));
        }
    }

    /// The node's last local subscriber to `topic` left.
    fn unsubscribe(&self, topic: &Arc<str>) {
        if let Some(running) = &self.running {
            running.change(SubscriberEvent::Unsubscribe(topic.clone()));
        }
    }

    /// Queues a publication of this node for the other nodes (`kept`: for every node, this
    /// one too, once Redis has kept it and given it its offset); `false`, counted as lost, if
    /// the queue is full.
    fn publish(&self, topic: &str, kind: MessageKind, payload: &[u8], kept: bool) -> bool {
        self.running
            .as_ref()
            .is_some_and(|running| running.publish(topic, kind, payload, kept, None))
    }

    /// With history kept in Redis and a durability other than `none`.
    fn acknowledges(&self) -> bool {
        self.keeps_history && self.durability != Durability::None
    }

    /// Queues a publication to a topic kept in Redis whose answer waits for `ack`: said once
    /// Redis has run the script that keeps and publishes it (and, with
    /// [`Durability::Replica`], once `WAIT 1` says a replica has it too).
    fn publish_acknowledged(
        &self,
        topic: &str,
        kind: MessageKind,
        payload: &[u8],
        ack: Acknowledgement,
    ) -> bool {
        self.running
            .as_ref()
            .is_some_and(|running| running.publish(topic, kind, payload, true, Some(ack)))
    }

    /// Whether the publisher holds a connection to the Redis server that serves `topic` (on a
    /// cluster, the master of its channel's slot): what it queues now for that topic is on
    /// its way, not waiting for a Redis that may not come back in time.
    fn is_connected(&self, topic: &str) -> bool {
        self.running.as_ref().is_some_and(|running| running.connected_for(topic))
    }

    /// Queues the fetch of `topic`'s history after `since`; 503 if too many are being
    /// fetched.
    fn recover(&self, topic: &str, since: Offset, awaiting: AwaitingHistory) {
        let Some(requests) = self.running.as_ref().and_then(|r| r.recoveries.as_ref()) else {
            return awaiting.ready();
        };
        let request = HistoryFetch { topic: Arc::from(topic), since, awaiting };
        if let Err(TrySendError::Full(r) | TrySendError::Disconnected(r)) =
            requests.try_send(request)
        {
            r.awaiting.unavailable("history_busy");
        }
    }
}

impl Running {
    /// Whether the publisher holds a connection to the server of `topic`'s channel.
    fn connected_for(&self, topic: &str) -> bool {
        let Some(topology) = self.shards.get() else { return false };
        let Some(node) = topology.node(channel(topic).as_bytes()) else { return false };
        self.connected.lock().unwrap_or_else(|e| e.into_inner()).contains(node)
    }

    fn change(&self, change: SubscriberEvent) {
        let changes = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        let _ = changes.send(change);
    }

    fn publish(
        &self,
        topic: &str,
        kind: MessageKind,
        payload: &[u8],
        kept: bool,
        ack: Option<Acknowledgement>,
    ) -> bool {
        if kept && !self.connected_for(topic) {
            // A history topic's publication is delivered from Redis only, with the offset
            // Redis gives it: while its server is unreachable it is refused (503 to a POST,
            // 1013 to a client), never accepted to be lost.
            self.metrics.backplane_lost("redis_down", 1);
            return false;
        }
        let len = payload.len() + if kept { 1 } else { 26 };
        let before = self.queued.fetch_add(len, Ordering::AcqRel);
        if before + len > self.queue_bytes && before > 0 {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            self.metrics.backplane_lost("queue_full", 1);
            return false;
        }
        let kind = match kind {
            MessageKind::Text => b't',
            MessageKind::Binary => b'b',
        };
        let message = if kept {
            [&[kind][..], payload].concat()
        } else {
            // The sequence number is written by the publisher thread when it sends it.
            [&[b'F', kind][..], &self.node, &[0; 8], payload].concat()
        };
        let channel = channel(topic).into_bytes();
        let outgoing = Outgoing { ack, channel, kept, numbered: false, message };
        if self.outgoing.try_send(outgoing).is_err() {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            self.metrics.backplane_lost("queue_full", 1);
            return false;
        }
        true
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// A node id: 128 bits from the standard library's per-process random hasher keys, the time
/// and the process id.
fn node_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    for (i, half) in id.chunks_exact_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(nanos);
        h.write_u32(std::process::id());
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    id
}

/// The publisher's connection to one server, and the SHA1 of the script if history is kept.
#[derive(Default)]
struct Link {
    conn: Option<(Connection, Option<String>)>,
    backoff: Duration,
    next_attempt: Option<Instant>,
}

/// What became of a pipeline of publications sent to one server.
#[derive(Default)]
struct Sent {
    published: u64,
    /// Counted lost, by reason.
    lost: Vec<(&'static str, u64)>,
    /// Publications a cluster node redirected (`MOVED`, or `ASK`: true), to its `host:port`.
    redirected: Vec<(usize, String, bool)>,
}

/// What the publisher thread works with.
struct Publishing {
    shards: Arc<Shards>,
    queued: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    history: Option<Arc<History>>,
    stop: Arc<AtomicBool>,
    /// The servers it holds a connection to.
    connected: Connected,
    /// Three hex digits of this node's id, the end of the epochs it draws.
    nonce: String,
    durability: Durability,
}

/// The sequence numbers a node gives its publications to topics without history, per
/// channel, so that a receiving node counts every gap; at most [`SEQUENCED`] channels (then
/// every topic's numbering starts again at 1, which a receiver takes as a new start).
#[derive(Default)]
struct Sequences(HashMap<Vec<u8>, u64>);

/// The most channels [`Sequences`] numbers at once.
const SEQUENCED: usize = 65_536;

impl Sequences {
    /// Writes the next number of `o`'s channel into it, once.
    fn stamp(&mut self, o: &mut Outgoing) {
        if o.kept || o.numbered || o.message.len() < 26 {
            return;
        }
        if self.0.len() >= SEQUENCED && !self.0.contains_key(&o.channel) {
            self.0.clear();
        }
        let next = self.0.entry(o.channel.clone()).or_insert(0);
        *next += 1;
        o.message[18..26].copy_from_slice(&next.to_be_bytes());
        o.numbered = true;
    }
}

/// The Redis servers (by address) the publisher holds a connection to, shared with the event
/// loops: a publication to a topic whose server is among them is on its way.
type Connected = Arc<Mutex<HashSet<Arc<str>>>>;

/// The publisher thread: `(S)PUBLISH`es (and, for topics kept in Redis, the script that keeps
/// and publishes), pipelined, on one connection per server. It connects at once and keeps
/// trying while idle, so that `connected` says where a publication would go now.
fn publisher(publishing: Publishing, outgoing: Receiver<Outgoing>) {
    let Publishing { shards, queued, metrics, history, stop, connected, nonce, durability } =
        publishing;
    let mut links: HashMap<Arc<str>, Link> = HashMap::new();
    let mut sequences = Sequences::default();
    let mut quiet = Repeated::default();
    let limits = history
        .as_ref()
        .map(|h| (h.messages(), h.max_age().map_or(0, |a| a.as_millis().max(1) as u64)));
    let set_connected = |now: HashSet<Arc<str>>| {
        *connected.lock().unwrap_or_else(|e| e.into_inner()) = now;
    };
    let connect_all = |links: &mut HashMap<Arc<str>, Link>, quiet: &mut Repeated| {
        let Some(topology) = shards.get() else { return HashSet::new() };
        let mut up = HashSet::new();
        for node in &topology.nodes {
            let link = links.entry(node.clone()).or_default();
            if connect(&shards, node, link, limits, quiet) {
                up.insert(node.clone());
            }
        }
        up
    };
    let all_connected = || {
        let up = connected.lock().unwrap_or_else(|e| e.into_inner());
        shards.get().is_some_and(|t| t.nodes.iter().all(|n| up.contains(n)))
    };
    set_connected(connect_all(&mut links, &mut quiet));
    while !stop.load(Ordering::Acquire) {
        let first = match outgoing.recv_timeout(Duration::from_millis(200)) {
            Ok(first) => first,
            Err(RecvTimeoutError::Timeout) => {
                // Idle: a connection that no longer answers is found now, not by the next
                // publication (a history topic's is then refused rather than lost).
                let mut dropped = false;
                for (node, link) in &mut links {
                    let alive = link.conn.as_mut().is_none_or(|(c, _)| {
                        redis::cmd("PING")
                            .query::<Value>(c)
                            .is_ok_and(|v| !matches!(v, Value::ServerError(_)))
                    });
                    if !alive {
                        tracing::warn!(redis = %node, "backplane publisher lost its connection");
                        link.conn = None;
                        dropped = true;
                    }
                }
                if dropped || !all_connected() {
                    set_connected(connect_all(&mut links, &mut quiet));
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        // A batch: what is queued now, at most 256 publications.
        let mut batch = vec![first];
        while batch.len() < 256 {
            match outgoing.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let bytes: usize = batch.iter().map(|o| o.message.len()).sum();
        queued.fetch_sub(bytes, Ordering::AcqRel);
        let Some(topology) = shards.get() else {
            set_connected(HashSet::new());
            metrics.backplane_lost("redis_down", batch.len() as u64);
            continue;
        };
        // Each server's share of the batch, in order (a topic's publications go to one).
        let mut by_node = Shares::default();
        for (i, o) in batch.iter().enumerate() {
            match topology.node(&o.channel) {
                Some(node) => by_node.add(node, i, false),
                None => metrics.backplane_lost("refused", 1), // a slot no master serves
            }
        }
        let mut stale = false;
        for round in 0..2 {
            let mut redirected = Shares::default();
            for (node, items) in by_node.0.drain(..) {
                let link = links.entry(node.clone()).or_default();
                connect(&shards, &node, link, limits, &mut quiet);
                let (sequences, nonce) = (&mut sequences, nonce.as_str());
                let how = Sending { topology: &topology, limits, nonce, durability };
                let sent = send(&node, link, &mut batch, &items, &how, sequences);
                metrics.backplane_published(sent.published);
                for (reason, n) in sent.lost {
                    metrics.backplane_lost(reason, n);
                    stale |= reason == "redis_down" && topology.cluster();
                }
                for (i, to, ask) in sent.redirected {
                    stale |= !ask;
                    if round == 1 {
                        metrics.backplane_lost("refused", 1); // redirected twice
                        continue;
                    }
                    redirected.add(&Arc::from(to), i, ask);
                }
            }
            // Never executed where they were sent: sent once more, where the cluster says.
            by_node = redirected;
        }
        if stale {
            shards.refresh();
        }
        let linked = |node: &&Arc<str>| links.get(*node).is_some_and(|l| l.conn.is_some());
        set_connected(topology.nodes.iter().filter(linked).cloned().collect());
    }
}

/// A warning repeated while a condition lasts (Redis unreachable): the first is logged, then
/// one a minute with how many were left out, so a server waiting for Redis does not fill its
/// log.
#[derive(Default)]
pub(crate) struct Repeated {
    last: Option<Instant>,
    left_out: u64,
}

impl Repeated {
    /// How often a repeated warning is logged.
    const EVERY: Duration = Duration::from_secs(60);

    /// `Some(left out since the last one)` if this one is to be logged.
    pub(crate) fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self.last.is_some_and(|at| now.duration_since(at) < Self::EVERY) {
            self.left_out += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.left_out))
    }

    /// The condition is over: the next occurrence is logged at once.
    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }
}

/// Connects `link` to `node` unless it is connected or waiting out its backoff; whether it
/// is connected.
fn connect(
    shards: &Shards,
    node: &str,
    link: &mut Link,
    limits: Option<(usize, u64)>,
    quiet: &mut Repeated,
) -> bool {
    if link.conn.is_none() && link.next_attempt.is_none_or(|at| Instant::now() >= at) {
        let connected = shards.addr.connect(node).and_then(|mut c| {
            // The script's SHA1, from Redis itself (loaded again on every connection: a
            // restarted Redis has forgotten it).
            let sha = match limits {
                Some(_) => {
                    Some(redis::cmd("SCRIPT").arg("LOAD").arg(KEEP_AND_PUBLISH).query(&mut c)?)
                }
                None => None,
            };
            Ok((c, sha))
        });
        match connected {
            Ok(c) => {
                tracing::info!(redis = %node, "backplane publisher connected");
                link.conn = Some(c);
                link.backoff = BACKOFF_MIN;
                quiet.reset();
            }
            Err(e) => {
                if let Some(left_out) = quiet.allow() {
                    tracing::warn!(redis = %node, error = %e, left_out, "backplane publisher cannot connect (retrying; repeated once a minute)");
                }
                link.backoff = (link.backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX);
                link.next_attempt = Some(Instant::now() + link.backoff);
            }
        }
    }
    link.conn.is_some()
}

/// A server's publications of a batch: their index in it, and whether an `ASK` sent them there.
type Items = Vec<(usize, bool)>;

/// A batch's publications by server.
#[derive(Default)]
struct Shares(Vec<(Arc<str>, Items)>);

impl Shares {
    fn add(&mut self, node: &Arc<str>, i: usize, ask: bool) {
        match self.0.iter_mut().find(|(n, _)| n == node) {
            Some((_, items)) => items.push((i, ask)),
            None => self.0.push((node.clone(), vec![(i, ask)])),
        }
    }
}

/// How the publisher sends: where, with which limits and epoch digits, how durably.
#[derive(Clone, Copy)]
struct Sending<'s> {
    topology: &'s Topology,
    limits: Option<(usize, u64)>,
    nonce: &'s str,
    durability: Durability,
}

/// Sends `items` of `batch` (with `ASKING` before those a node redirected with `ASK`) to
/// `node` in one pipeline, if `link` is connected, numbering those of topics without history
/// as they are first sent; with [`Durability::Replica`], `WAIT 1` after them if one is to be
/// acknowledged. Acknowledges those that were.
fn send(
    node: &str,
    link: &mut Link,
    batch: &mut [Outgoing],
    items: &[(usize, bool)],
    how: &Sending<'_>,
    sequences: &mut Sequences,
) -> Sent {
    let Sending { topology, limits, nonce, durability } = *how;
    let mut sent = Sent::default();
    let n = items.len() as u64;
    let Some((c, sha)) = link.conn.as_mut() else {
        sent.lost.push(("redis_down", n));
        return sent;
    };
    let mut pipe = redis::pipe();
    for &(i, ask) in items {
        sequences.stamp(&mut batch[i]);
        let o = &batch[i];
        if ask {
            pipe.cmd("ASKING").ignore();
        }
        match (o.kept, sha.as_deref(), limits) {
            (true, Some(sha), Some((most, age_ms))) => {
                // The stream's key is the channel's name: one slot for both.
                let (kind, payload) = o.message.split_at(1);
                let epoch = epoch_key_of(&o.channel);
                pipe.cmd("EVALSHA").arg(sha).arg(2).arg(&o.channel).arg(epoch).arg(kind);
                pipe.arg(payload).arg(most).arg(age_ms).arg(topology.publish()).arg(nonce);
            }
            _ => {
                pipe.cmd(topology.publish()).arg(&o.channel).arg(&o.message);
            }
        }
    }
    // A replica has every write before `WAIT` once it counts one (Redis' `WAIT`: "all the
    // previous write commands sent in the context of the current connection").
    let wait =
        durability == Durability::Replica && items.iter().any(|&(i, _)| batch[i].ack.is_some());
    if wait {
        pipe.cmd("WAIT").arg(1).arg(REPLICA_WAIT.as_millis() as u64);
    }
    let replies: Result<Vec<redis::RedisResult<Value>>, _> = pipe.ignore_errors().query(c);
    match replies {
        Ok(mut replies) => {
            let replicated = !wait || matches!(replies.pop(), Some(Ok(Value::Int(n))) if n >= 1);
            for (reply, &(i, _)) in replies.iter().zip(items) {
                match reply {
                    Ok(_) => {
                        sent.published += 1;
                        if let Some(ack) = batch[i].ack.take()
                            && replicated
                        {
                            ack.durable();
                        }
                    }
                    Err(e) => match (e.retry_method(), e.redirect_node()) {
                        (RetryMethod::MovedRedirect, Some((to, _))) => {
                            sent.redirected.push((i, to.to_owned(), false));
                        }
                        (RetryMethod::AskRedirect, Some((to, _))) => {
                            sent.redirected.push((i, to.to_owned(), true));
                        }
                        _ => {
                            tracing::warn!(redis = %node, error = %e, "redis refused a publication");
                            sent.lost.push(("refused", 1));
                        }
                    },
                }
            }
        }
        Err(e) => {
            // Written or not, unconfirmed: never sent again, so never delivered twice.
            tracing::warn!(redis = %node, error = %e, "backplane publisher lost its connection");
            sent.lost.push(("unconfirmed", n));
            link.conn = None;
            link.next_attempt = Some(Instant::now() + link.backoff.max(BACKOFF_MIN));
        }
    }
    sent
}

/// A subscription change for the subscriber thread, or news from one of its shards.
enum SubscriberEvent {
    Subscribe(Arc<str>),
    Unsubscribe(Arc<str>),
    /// Stay subscribed for [`PIN`] even without local subscribers, and say so on the sender
    /// once the subscription is confirmed (a reconnecting subscriber's history is fetched).
    Pin(Arc<str>, SyncSender<()>),
    /// A shard's subscription to the topic is confirmed.
    Confirmed(Arc<str>),
    /// A shard's connection is up (or down).
    Up(Arc<str>, bool),
    /// A shard refused a subscription or dropped one (its slot moved): map again.
    Stale,
}

/// The subscriber thread: follows the hub's changes and the recoveries' pins, and has one
/// shard thread per server that serves a subscribed topic, each holding the (sharded)
/// subscriptions of its topics on its own connection.
#[allow(clippy::too_many_arguments)]
fn subscriber(
    shards: Arc<Shards>,
    node: [u8; 16],
    changes: Receiver<SubscriberEvent>,
    events: Sender<SubscriberEvent>,
    metrics: Arc<Metrics>,
    history: Option<Arc<History>>,
    stop: Arc<AtomicBool>,
    receiving: Receiving,
) {
    // Topics with local subscribers, and topics pinned by a recovery (until when).
    let mut wanted: HashSet<Arc<str>> = HashSet::new();
    let mut pins: HashMap<Arc<str>, Instant> = HashMap::new();
    let mut waiting: Vec<(Arc<str>, SyncSender<()>)> = Vec::new();
    // The shard threads, by server; servers that are down.
    let mut threads: HashMap<Arc<str>, Arc<Mutex<Assignment>>> = HashMap::new();
    // Pinned topics whose shard thread is to tell when they are subscribed.
    let mut to_confirm: Vec<Arc<str>> = Vec::new();
    let mut down: HashSet<Arc<str>> = HashSet::new();
    // Mapped at once, so the first subscription need not wait for it.
    let mut topology: Option<Arc<Topology>> = shards.refresh();
    let (mut stale, mut dirty) = (topology.is_none(), false);
    let (mut backoff, mut next_map) = (BACKOFF_MIN, Instant::now());
    while !stop.load(Ordering::Acquire) {
        let mut next = changes.recv_timeout(Duration::from_millis(100));
        loop {
            match next {
                Ok(SubscriberEvent::Subscribe(t)) => dirty |= wanted.insert(t),
                Ok(SubscriberEvent::Unsubscribe(t)) => dirty |= wanted.remove(&t),
                Ok(SubscriberEvent::Pin(t, done)) => {
                    pins.insert(t.clone(), Instant::now() + PIN);
                    to_confirm.push(t.clone());
                    waiting.push((t, done));
                    dirty = true;
                }
                Ok(SubscriberEvent::Confirmed(t)) => waiting.retain(|(topic, done)| {
                    let confirmed = *topic == t;
                    if confirmed {
                        let _ = done.try_send(());
                    }
                    !confirmed
                }),
                Ok(SubscriberEvent::Up(server, true)) => {
                    down.remove(&server);
                }
                Ok(SubscriberEvent::Up(server, false)) => {
                    // Recoveries waiting on that server fail (503).
                    waiting.retain(|(t, _)| {
                        topology.as_ref().and_then(|m| m.node(channel(t).as_bytes()))
                            != Some(&server)
                    });
                    stale |= topology.as_ref().is_some_and(|t| t.cluster());
                    if threads.contains_key(&server) {
                        down.insert(server); // else a thread that is ending
                    }
                }
                Ok(SubscriberEvent::Stale) => stale = true,
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return,
            }
            next = changes.try_recv().map_err(|e| match e {
                TryRecvError::Empty => RecvTimeoutError::Timeout,
                TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            });
        }
        if !pins.is_empty() {
            let (now, before) = (Instant::now(), pins.len());
            pins.retain(|_, until| *until > now);
            dirty |= pins.len() != before;
        }
        if stale && Instant::now() >= next_map {
            match shards.refresh() {
                Some(map) => {
                    // Every shard thread goes over its subscriptions again, even if the map
                    // is unchanged: a refused one is asked for again (at most every
                    // `BACKOFF_MIN` while it is refused).
                    topology = Some(map);
                    stale = false;
                    dirty = true;
                    backoff = BACKOFF_MIN;
                    next_map = Instant::now() + BACKOFF_MIN;
                }
                None => {
                    waiting.clear(); // their recoveries fail (503)
                    next_map = Instant::now() + backoff;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
        let Some(map) = topology.as_ref() else {
            metrics.set_backplane_up(false);
            continue;
        };
        if dirty {
            dirty = false;
            // What was delivered of topics no longer subscribed is of no more use.
            receiving.continuity.retain(|t| wanted.contains(t) || pins.contains_key(t));
            // Each server's topics; a server that serves none has no thread.
            let mut assigned: HashMap<Arc<str>, HashSet<Arc<str>>> = HashMap::new();
            for topic in wanted.iter().chain(pins.keys()) {
                match map.node(channel(topic).as_bytes()) {
                    Some(server) => {
                        assigned.entry(server.clone()).or_default().insert(topic.clone());
                    }
                    None => stale = true, // a slot no master serves (yet)
                }
            }
            threads.retain(|server, assignment| {
                let keep = assigned.contains_key(server);
                assignment.lock().unwrap_or_else(|e| e.into_inner()).ended = !keep;
                keep
            });
            down.retain(|server| assigned.contains_key(server));
            for (server, topics) in assigned {
                if let Some(assignment) = threads.get(&server) {
                    assignment.lock().unwrap_or_else(|e| e.into_inner()).topics = Some(topics);
                    continue;
                }
                let assignment = Arc::new(Mutex::new(Assignment {
                    topics: Some(topics),
                    ..Assignment::default()
                }));
                let shard = Shard {
                    shards: shards.clone(),
                    server: server.clone(),
                    sharded: map.sharded,
                    node,
                    assigned: assignment.clone(),
                    events: events.clone(),
                    metrics: metrics.clone(),
                    history: history.clone(),
                    stop: stop.clone(),
                    receiving: receiving.clone(),
                    reader: Mutex::new(None),
                };
                let spawned = std::thread::Builder::new()
                    .name("freeboard-redis-sub".into())
                    .spawn(move || shard.run());
                if spawned.is_ok() {
                    threads.insert(server, assignment);
                }
            }
        }
        for topic in to_confirm.drain(..) {
            if let Some(a) = map.node(channel(&topic).as_bytes()).and_then(|s| threads.get(s)) {
                a.lock().unwrap_or_else(|e| e.into_inner()).confirm.push(topic);
            }
        }
        metrics.set_backplane_up(down.is_empty());
    }
}

/// What the subscriber thread tells a shard thread, latest first: a thread that is slow to
/// look finds one set of topics, not a queue of them.
#[derive(Default)]
struct Assignment {
    /// The topics to hold, if they were given again since the thread last looked.
    topics: Option<HashSet<Arc<str>>>,
    /// Topics whose subscription to tell when confirmed (at once if it is).
    confirm: Vec<Arc<str>>,
    /// The server serves no subscribed topic now: the thread ends.
    ended: bool,
}

/// The channel of a topic.
fn channel(topic: &str) -> String {
    format!("{PREFIX}{topic}")
}

/// The key of a history topic's epoch, beside its stream: `{freeboard:TOPIC}:epoch`. Its hash
/// tag is the stream's whole key (a topic's name holds no brace), so on a cluster both lie in
/// one slot, on one master, are replicated together and fail over together.
fn epoch_key(topic: &str) -> String {
    format!("{{{PREFIX}{topic}}}:epoch")
}

/// [`epoch_key`] of a channel's name.
fn epoch_key_of(channel: &[u8]) -> Vec<u8> {
    [b"{", channel, b"}:epoch"].concat()
}

/// What hands a message from Redis to this node's loops; `false` once the server is gone.
type Deliver = dyn Fn(Incoming<'_>) -> bool + Send + Sync;

/// How the shard threads hand what they receive to this node.
#[derive(Clone)]
struct Receiving {
    deliver: Arc<Deliver>,
    continuity: Arc<Continuity>,
}

/// What this node delivered of each topic it is subscribed to, shared by the shard threads (a
/// topic moves from one to another with its slot) and kept across resubscriptions, so that
/// what a node missed while its subscription was away is fetched (history topics) or counted
/// (other topics), and nothing is delivered twice.
struct Continuity {
    delivered: Mutex<Delivered>,
    /// Closes a history topic's local subscribers with 4410 ([`backplane::Link::end_history`]).
    end_history: Box<dyn Fn(&str) + Send + Sync>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct Delivered {
    /// History topics: the offset of the last message delivered.
    offsets: HashMap<Arc<str>, Offset>,
    /// Topics without history: per publishing node, the last sequence number received.
    sequences: HashMap<Arc<str>, HashMap<[u8; 16], u64>>,
}

/// The most publishing nodes a topic's sequence numbers are followed for (then it starts
/// over: a node that is gone leaves its entry until the topic is unsubscribed).
const PUBLISHERS: usize = 1024;

impl Continuity {
    fn new(end_history: Box<dyn Fn(&str) + Send + Sync>, metrics: Arc<Metrics>) -> Self {
        Self { delivered: Mutex::default(), end_history, metrics }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Delivered> {
        self.delivered.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a history topic's message at `offset` is to be delivered: not if it was
    /// already (a catch-up and the live stream overlap). A message of a new epoch ends the
    /// old history first: the topic's local subscribers are closed with 4410.
    fn admit(&self, topic: &str, offset: Offset) -> bool {
        let mut delivered = self.lock();
        match delivered.offsets.get_mut(topic) {
            Some(last) if last.epoch == offset.epoch => {
                if offset.position <= last.position {
                    return false;
                }
                last.position = offset.position;
            }
            Some(last) => {
                tracing::warn!(%topic, from = %last, to = %offset, "a history topic's epoch changed: its subscribers are told (4410)");
                (self.end_history)(topic);
                *last = offset;
            }
            None => {
                delivered.offsets.insert(Arc::from(topic), offset);
            }
        }
        true
    }

    /// The offset of the last message of `topic` delivered, if it was subscribed before.
    fn last(&self, topic: &str) -> Option<Offset> {
        self.lock().offsets.get(topic).copied()
    }

    /// What `topic`'s subscribers missed cannot be fetched: they are closed with 4410, and
    /// the next message starts afresh.
    fn interrupt(&self, topic: &str) {
        self.lock().offsets.remove(topic);
        (self.end_history)(topic);
    }

    /// Counts in `backplane_lost_total{reason="gap"}` the publications of `node` to `topic`
    /// missing before the one numbered `seq`.
    fn count(&self, topic: &str, node: [u8; 16], seq: u64) {
        let mut delivered = self.lock();
        if !delivered.sequences.contains_key(topic) {
            delivered.sequences.insert(Arc::from(topic), HashMap::new());
        }
        // NOTE(unwrap): inserted above if it was missing.
        let publishers = delivered.sequences.get_mut(topic).unwrap();
        if publishers.len() >= PUBLISHERS && !publishers.contains_key(&node) {
            publishers.clear();
        }
        let missing = match publishers.insert(node, seq) {
            Some(last) if seq > last => seq - last - 1,
            // A new numbering (the publisher forgot the topic): what came before it.
            Some(_) => seq.saturating_sub(1),
            None => 0,
        };
        if missing > 0 {
            self.metrics.backplane_lost("gap", missing);
        }
    }

    /// Forgets the topics `wanted` no longer names.
    fn retain(&self, wanted: impl Fn(&str) -> bool) {
        let mut delivered = self.lock();
        delivered.offsets.retain(|t, _| wanted(t));
        delivered.sequences.retain(|t, _| wanted(t));
    }
}

/// A shard thread: the subscriptions of the topics one server serves, on one connection.
struct Shard {
    shards: Arc<Shards>,
    server: Arc<str>,
    sharded: bool,
    node: [u8; 16],
    /// What the subscriber thread tells it.
    assigned: Arc<Mutex<Assignment>>,
    events: Sender<SubscriberEvent>,
    metrics: Arc<Metrics>,
    history: Option<Arc<History>>,
    stop: Arc<AtomicBool>,
    receiving: Receiving,
    /// A connection to the server for reading streams (a catch-up after a resubscription).
    reader: Mutex<Option<Connection>>,
}

impl Shard {
    fn run(self) {
        let mut topics: HashSet<Arc<str>> = HashSet::new();
        let mut backoff = BACKOFF_MIN;
        let (sub, unsub) = if self.sharded {
            ("SSUBSCRIBE", "SUNSUBSCRIBE")
        } else {
            ("SUBSCRIBE", "UNSUBSCRIBE")
        };
        let mut quiet = Repeated::default();
        'connect: while !self.stop.load(Ordering::Acquire) {
            // The latest assignment, while disconnected too, so the resubscription is exact.
            if self.follow(&mut topics, &mut Vec::new()).is_none() {
                return;
            }
            let mut conn = match self.shards.addr.subscribe_to(&self.server) {
                Ok(c) => c,
                Err(e) => {
                    if let Some(left_out) = quiet.allow() {
                        tracing::warn!(redis = %self.server, error = %e, left_out, "backplane subscriber cannot connect (retrying; repeated once a minute)");
                    }
                    let _ = self.events.send(SubscriberEvent::Up(self.server.clone(), false));
                    self.pause(&mut backoff);
                    continue;
                }
            };
            quiet.reset();
            tracing::info!(redis = %self.server, topics = topics.len(), "backplane subscriber connected");
            let _ = self.events.send(SubscriberEvent::Up(self.server.clone(), true));
            backoff = BACKOFF_MIN;
            // What was asked of Redis (subscribed or being subscribed), and the requests
            // whose replies are awaited, in order: (subscribe?, topic).
            let mut asked: HashSet<Arc<str>> = HashSet::new();
            let mut requests: VecDeque<(bool, Arc<str>)> = VecDeque::new();
            let (mut dirty, mut confirms) = (true, Vec::new());
            loop {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                if dirty {
                    let add: Vec<Arc<str>> =
                        topics.iter().filter(|t| !asked.contains(*t)).cloned().collect();
                    let remove: Vec<Arc<str>> =
                        asked.iter().filter(|t| !topics.contains(*t)).cloned().collect();
                    // One channel a command: a shard's channels may lie in several slots.
                    let mut written = Ok(());
                    for (subscribe, topic) in
                        add.iter().map(|t| (true, t)).chain(remove.iter().map(|t| (false, t)))
                    {
                        let command = if subscribe { sub } else { unsub };
                        written = written
                            .and_then(|()| conn.send(redis::cmd(command).arg(channel(topic))));
                        requests.push_back((subscribe, topic.clone()));
                        if subscribe {
                            asked.insert(topic.clone());
                        } else {
                            asked.remove(topic);
                            self.forget(topic);
                        }
                    }
                    if let Err(e) = written {
                        self.lost(&e.into(), &asked, &mut backoff);
                        continue 'connect;
                    }
                    conn.set_read_timeout(if requests.is_empty() { POLL } else { TIMEOUT });
                }
                match conn.read() {
                    Ok(value) => {
                        if !self.receive(value, &mut asked, &mut requests) {
                            return;
                        }
                        if requests.is_empty() {
                            conn.set_read_timeout(POLL);
                        }
                    }
                    Err(e) if e.is_timeout() && requests.is_empty() => {}
                    Err(e) => {
                        self.lost(&e, &asked, &mut backoff);
                        continue 'connect;
                    }
                }
                // The assignment, after every message (a busy channel never lets a read time
                // out) and every quiet `POLL`.
                match self.follow(&mut topics, &mut confirms) {
                    Some(changed) => dirty = changed,
                    None => return,
                }
                for topic in confirms.drain(..) {
                    // Else its subscription's reply tells.
                    if asked.contains(&topic) && !requests.iter().any(|(_, t)| *t == topic) {
                        let _ = self.events.send(SubscriberEvent::Confirmed(topic));
                    }
                }
            }
        }
    }

    /// Takes the latest assignment: whether there was one, changed or not (after a new map,
    /// subscriptions refused are asked for again), and the topics to confirm; `None` once
    /// there is none (the thread ends).
    fn follow(&self, topics: &mut HashSet<Arc<str>>, confirms: &mut Vec<Arc<str>>) -> Option<bool> {
        let mut assignment = self.assigned.lock().unwrap_or_else(|e| e.into_inner());
        if assignment.ended || self.stop.load(Ordering::Acquire) {
            topics.iter().for_each(|t| self.forget(t));
            return None;
        }
        confirms.append(&mut assignment.confirm);
        let latest = assignment.topics.take();
        let given = latest.is_some();
        if let Some(latest) = latest {
            *topics = latest;
        }
        Some(given)
    }

    /// One value from Redis: a message to deliver, a request's reply, or a subscription the
    /// server dropped; `false` once the server is gone.
    fn receive(
        &self,
        value: Value,
        asked: &mut HashSet<Arc<str>>,
        requests: &mut VecDeque<(bool, Arc<str>)>,
    ) -> bool {
        let items = match value {
            Value::Array(items) | Value::Push { data: items, .. } => items,
            Value::ServerError(e) => {
                // A subscription refused (`MOVED`: the map is stale; `CLUSTERDOWN` …).
                if let Some((_, topic)) = requests.pop_front() {
                    tracing::warn!(redis = %self.server, %topic, error = %RedisError::from(e), "redis refused a subscription");
                    asked.remove(&topic);
                    let _ = self.events.send(SubscriberEvent::Stale);
                }
                return true;
            }
            _ => return true,
        };
        let [Value::BulkString(kind), Value::BulkString(name), rest @ ..] = &items[..] else {
            return true;
        };
        let Some(topic) = std::str::from_utf8(name).ok().and_then(|n| n.strip_prefix(PREFIX))
        else {
            return true;
        };
        match (kind.as_slice(), rest) {
            (b"message" | b"smessage", [Value::BulkString(payload)]) => {
                // A message that arrived while its topic was being unsubscribed is left.
                if !asked.contains(topic) {
                    return true;
                }
                let Some((incoming, numbered)) = decode(topic, payload, self.node) else {
                    return true;
                };
                let continuity = &self.receiving.continuity;
                if let Some(offset) = incoming.offset
                    && !continuity.admit(topic, offset)
                {
                    return true;
                }
                if let Some((node, seq)) = numbered {
                    continuity.count(topic, node, seq);
                }
                self.metrics.backplane_received();
                (self.receiving.deliver)(incoming)
            }
            (b"subscribe" | b"ssubscribe", _) => {
                if requests.front().is_some_and(|(s, t)| *s && **t == *topic)
                    && let Some((_, topic)) = requests.pop_front()
                {
                    // Subscribed again (a reconnect, a slot that moved): what the topic got
                    // meanwhile first, then the live stream.
                    if !self.catch_up(&topic) {
                        return false;
                    }
                    let _ = self.events.send(SubscriberEvent::Confirmed(topic));
                }
                true
            }
            (b"unsubscribe" | b"sunsubscribe", _) => {
                if requests.front().is_some_and(|(s, t)| !*s && **t == *topic) {
                    requests.pop_front();
                } else if let Some(topic) = asked.take(topic) {
                    // Not asked for: the topic's slot left this server.
                    tracing::info!(redis = %self.server, %topic, "redis dropped a shard subscription");
                    self.forget(&topic);
                    let _ = self.events.send(SubscriberEvent::Stale);
                }
                true
            }
            _ => true,
        }
    }

    /// A history topic subscribed again after this node delivered some of it: delivers what
    /// its stream got after that (from the reader connection, while the live messages wait in
    /// the subscription's socket; those already delivered are then skipped), or, if the stream
    /// cannot vouch for it (another epoch, trimmed, lost), closes the topic's local
    /// subscribers with 4410. `false` once the server is gone.
    fn catch_up(&self, topic: &Arc<str>) -> bool {
        let continuity = &self.receiving.continuity;
        let Some(since) = continuity.last(topic) else { return true };
        let mut reader = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        if reader.is_none() {
            *reader = self.shards.addr.connect(&self.server).ok();
        }
        let read = match reader.as_mut() {
            Some(conn) => read_after(conn, topic, since),
            None => Err(io::Error::other("cannot connect to read the stream").into()),
        };
        let at = since.position;
        match read {
            Ok(Some(StreamRead { newest, deleted, entries }))
                if at >= deleted && at <= newest.position =>
            {
                if !entries.is_empty() {
                    tracing::info!(redis = %self.server, %topic, %since, missed = entries.len(), "backplane caught up with a history topic after resubscribing");
                }
                for (offset, kind, data) in &entries {
                    if !continuity.admit(topic, *offset) {
                        continue;
                    }
                    self.metrics.backplane_received();
                    let incoming = Incoming { topic, kind: *kind, data, offset: Some(*offset) };
                    if !(self.receiving.deliver)(incoming) {
                        return false;
                    }
                }
            }
            Ok(Some(StreamRead { newest, .. })) if at > newest.position => {
                // The stream ends before what this node delivered: it lost entries (a replica
                // promoted without them, a restart from an older snapshot). A new epoch, so
                // that no offset of the lost ones, or before them, resumes into what follows.
                tracing::warn!(redis = %self.server, %topic, %since, %newest, "a history topic's stream lost entries this node delivered: a new epoch, and its subscribers are told (4410)");
                if let Some(conn) = reader.as_mut()
                    && let Err(e) = renew_epoch(conn, topic, since.epoch, &nonce(self.node))
                {
                    tracing::warn!(redis = %self.server, %topic, error = %e, "cannot renew the epoch");
                }
                continuity.interrupt(topic);
            }
            Ok(_) => {
                tracing::warn!(redis = %self.server, %topic, %since, "a history topic's stream no longer holds what followed the last message delivered: its subscribers are told (4410)");
                continuity.interrupt(topic);
            }
            Err(e) => {
                tracing::warn!(redis = %self.server, %topic, error = %e, "cannot catch up with a history topic after resubscribing: its subscribers are told (4410)");
                *reader = None;
                continuity.interrupt(topic);
            }
        }
        true
    }

    /// The connection was lost: what arrives from now on may have a gap.
    fn lost(&self, e: &RedisError, asked: &HashSet<Arc<str>>, backoff: &mut Duration) {
        tracing::warn!(redis = %self.server, error = %e, "backplane subscriber lost its connection");
        asked.iter().for_each(|t| self.forget(t));
        let _ = self.events.send(SubscriberEvent::Up(self.server.clone(), false));
        self.pause(backoff);
    }

    /// Waits `backoff` (doubling it), or less if the server is no longer wanted.
    fn pause(&self, backoff: &mut Duration) {
        std::thread::sleep(*backoff);
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
    }

    /// History rings hold only what arrived while subscribed.
    fn forget(&self, topic: &str) {
        if let Some(history) = &self.history {
            history.forget(Some(topic));
        }
    }
}

/// A publication's publishing node and its sequence number there (topics without history).
type Numbered = ([u8; 16], u64);

/// A message from a channel, as this node delivers it, with its publisher's id and sequence
/// number for a topic without history; `None` for its own publications (its subscribers
/// have them already) and what it cannot read.
fn decode<'m>(
    topic: &'m str,
    message: &'m [u8],
    node: [u8; 16],
) -> Option<(Incoming<'m>, Option<Numbered>)> {
    let kind = |k: u8| if k == b't' { MessageKind::Text } else { MessageKind::Binary };
    match message {
        [b'F', _, id @ ..] if id.len() >= 24 && id[..16] == node => None,
        [b'F', k, rest @ ..] if rest.len() >= 24 => {
            let (from, rest) = rest.split_at(16);
            let (seq, data) = rest.split_at(8);
            // NOTE(unwrap): split at 16 and 8 bytes.
            let numbered = (from.try_into().unwrap(), u64::from_be_bytes(seq.try_into().unwrap()));
            Some((Incoming { topic, kind: kind(*k), data, offset: None }, Some(numbered)))
        }
        // Kept in Redis: from every node, this one too, with its offset.
        [b'S', k, rest @ ..] => rest
            .iter()
            .position(|b| *b == b':')
            .and_then(|colon| std::str::from_utf8(&rest[..colon]).ok())
            .and_then(Offset::parse)
            .map(|offset| {
                (Incoming { topic, kind: kind(*k), data: rest, offset: Some(offset) }, None)
            }),
        _ => None,
    }
}

/// The thread that fetches history from Redis for reconnecting subscribers. It takes what
/// has queued at once as one batch and, per topic, has the topic subscribed (pinned) first,
/// so the node's ring gets every message from then on; then, for the subscribers whose offset
/// the ring does not cover yet, reads the stream once from the earliest of their offsets
/// into the ring (single flight: a reconnect storm on a topic costs one read), then accepts
/// their upgrades. Each connection's `on_open` replays from the ring.
fn fetcher(
    shards: Arc<Shards>,
    requests: Receiver<HistoryFetch>,
    changes: Arc<Mutex<Sender<SubscriberEvent>>>,
    history: Arc<History>,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
) {
    let mut conns: HashMap<Arc<str>, Connection> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        let first = match requests.recv_timeout(Duration::from_millis(200)) {
            Ok(request) => request,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let mut by_topic: HashMap<Arc<str>, Vec<HistoryFetch>> = HashMap::new();
        for request in std::iter::once(first).chain(std::iter::from_fn(|| requests.try_recv().ok()))
        {
            by_topic.entry(request.topic.clone()).or_default().push(request);
        }
        // Every topic pinned at once; then each confirmation waited for.
        let mut pinned = Vec::with_capacity(by_topic.len());
        {
            let changes = changes.lock().unwrap_or_else(|e| e.into_inner());
            for (topic, waiting) in by_topic {
                let (done, subscribed) = std::sync::mpsc::sync_channel(1);
                let _ = changes.send(SubscriberEvent::Pin(topic.clone(), done));
                pinned.push((topic, waiting, subscribed));
            }
        }
        let deadline = Instant::now() + TIMEOUT;
        for (topic, waiting, subscribed) in pinned {
            let left = deadline.saturating_duration_since(Instant::now());
            if subscribed.recv_timeout(left).is_err() {
                waiting.into_iter().for_each(|r| r.awaiting.unavailable("history_unavailable"));
                continue;
            }
            // What the ring covers already needs no read.
            let (covered, uncovered): (Vec<_>, Vec<_>) =
                waiting.into_iter().partition(|r| history.vouches(&topic, r.since));
            covered.into_iter().for_each(|r| r.awaiting.ready());
            if uncovered.is_empty() {
                continue;
            }
            // The stream is where the channel is (a cluster's master of its slot).
            let key = channel(&topic);
            let server = shards.get().and_then(|t| t.node(key.as_bytes()).cloned());
            if let Some(server) = &server
                && !conns.contains_key(server)
                && let Ok(c) = shards.addr.connect(server)
            {
                conns.insert(server.clone(), c);
            }
            let Some((server, c)) = server.and_then(|s| conns.get_mut(&s).map(|c| (s.clone(), c)))
            else {
                uncovered.into_iter().for_each(|r| r.awaiting.unavailable("history_unavailable"));
                continue;
            };
            // From the earliest offset of the stream's epoch (an offset of another epoch is
            // told 4410 when its connection opens, and needs nothing read).
            let epoch = read_epoch(c, &topic);
            let from = uncovered
                .iter()
                .filter(|r| epoch.as_ref().is_ok_and(|e| *e == Some(r.since.epoch)))
                .map(|r| r.since)
                .min_by_key(|o| o.position);
            let read = match (epoch, from) {
                (Err(e), _) => Err(e),
                (Ok(_), None) => Ok(None),
                (Ok(_), Some(from)) => {
                    metrics.backplane_history_read();
                    read_after(c, &topic, from).map(|read| read.map(|r| (from, r)))
                }
            };
            match read {
                Ok(Some((from, read))) if from.position <= read.newest.position => {
                    let since = Offset { position: from.position.max(read.deleted), ..from };
                    history.fill(&topic, since, read.newest, read.entries);
                }
                Ok(_) => {} // nothing to keep: on_open says 4410 where it must
                Err(e) => {
                    tracing::warn!(redis = %server, error = %e, "history fetch failed");
                    if e.redirect_node().is_some() {
                        shards.refresh();
                    }
                    conns.remove(&server);
                    uncovered
                        .into_iter()
                        .for_each(|r| r.awaiting.unavailable("history_unavailable"));
                    continue;
                }
            }
            uncovered.into_iter().for_each(|r| r.awaiting.ready());
        }
    }
}

/// Three hex digits of a node's id: the end of the epochs it draws.
fn nonce(node: [u8; 16]) -> String {
    format!("{:03x}", u16::from_be_bytes([node[0], node[1]]) & 0xfff)
}

/// The Lua script that gives a topic's stream a new epoch if its epoch is still ARGV[1] (the
/// stream lost entries a node delivered), keeping the key's expiry. KEYS: epoch; ARGV: the
/// old epoch, the node's 3 digits.
const RENEW_EPOCH: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
local t = redis.call('TIME')
local epoch = string.format('%x%05x', tonumber(t[1]), tonumber(t[2])) .. ARGV[2]
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  redis.call('SET', KEYS[1], epoch, 'PX', ttl)
else
  redis.call('SET', KEYS[1], epoch)
end
return epoch
"#;

/// Gives `topic`'s stream a new epoch, unless another node did already.
fn renew_epoch(
    conn: &mut Connection,
    topic: &str,
    old: u64,
    nonce: &str,
) -> Result<(), RedisError> {
    let old = format!("{old:x}");
    redis::cmd("EVAL").arg(RENEW_EPOCH).arg(1).arg(epoch_key(topic)).arg(old).arg(nonce).exec(conn)
}

/// The epoch of `topic`'s stream, if it has one.
fn read_epoch(conn: &mut Connection, topic: &str) -> Result<Option<u64>, RedisError> {
    let epoch: Option<String> = redis::cmd("GET").arg(epoch_key(topic)).query(conn)?;
    Ok(epoch.and_then(|e| u64::from_str_radix(&e, 16).ok()))
}

/// What a history topic's stream holds after an offset, with envelopes made.
type Entries = Vec<(Offset, MessageKind, Box<[u8]>)>;

/// What a topic's stream held when read: its last offset, the highest position trimmed or
/// deleted from it, and its entries after the offset asked for (envelopes made).
struct StreamRead {
    newest: Offset,
    deleted: Position,
    entries: Entries,
}

/// One read of `topic`'s stream after `since`, atomic with its epoch and bounds
/// ([`READ_AFTER`]); `None` if there is no stream or its epoch is not `since`'s. It vouches for
/// every message after `since` only if `since` lies between the stream's `deleted` and its
/// `newest` (else what followed `since` was trimmed, or `since` was never issued or was lost).
fn read_after(
    conn: &mut Connection,
    topic: &str,
    since: Offset,
) -> Result<Option<StreamRead>, RedisError> {
    // EVAL (the script is short, and read only when a subscriber resumes or a subscription
    // comes back), so a restarted Redis needs nothing loaded again.
    let reply: Value = redis::cmd("EVAL")
        .arg(READ_AFTER)
        .arg(2)
        .arg(channel(topic))
        .arg(epoch_key(topic))
        .arg(format!("{:x}", since.epoch))
        .arg(since.position.to_string())
        .query(conn)?;
    let Value::Array(items) = reply else { return Ok(None) };
    let [epoch, deleted, last, Value::Array(entries)] = &items[..] else { return Ok(None) };
    let text = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let epoch = text(epoch).and_then(|e| u64::from_str_radix(&e, 16).ok());
    let deleted = text(deleted).and_then(|d| Position::parse(&d));
    let last = text(last).and_then(|l| Position::parse(&l));
    let (Some(epoch), Some(deleted), Some(last)) = (epoch, deleted, last) else {
        return Ok(None);
    };
    if epoch != since.epoch {
        return Ok(None);
    }
    let entries = entries
        .iter()
        .filter_map(|entry| {
            let Value::Array(entry) = entry else { return None };
            let [id, Value::Array(fields)] = &entry[..] else { return None };
            let offset = Offset { epoch, position: Position::parse(&text(id)?)? };
            let [
                Value::BulkString(k),
                Value::BulkString(kind),
                Value::BulkString(m),
                Value::BulkString(payload),
            ] = &fields[..]
            else {
                return None;
            };
            (k == b"k" && m == b"m").then_some(())?;
            let kind = if kind == b"t" { MessageKind::Text } else { MessageKind::Binary };
            let data = [format!("{offset}:").as_bytes(), payload].concat().into_boxed_slice();
            Some((offset, kind, data))
        })
        .collect();
    Ok(Some(StreamRead { newest: Offset { epoch, position: last }, deleted, entries }))
}
