//! Topics across machines: a Redis pub/sub backplane.
//!
//! With [`TopicsConfig::redis`](crate::config::TopicsConfig) set, every publication of this node
//! (a handler's, [`ServerHandle::publish`](crate::ServerHandle::publish), `POST`) is delivered
//! to the local subscribers at once, as without a backplane, and also sent to the Redis channel
//! `freeboard:{topic}`; every node that has a local subscriber to the topic is subscribed to
//! that channel and delivers what arrives to its own subscribers. What travels is the message
//! and its kind, not a WebSocket frame:
//!
//! ```text
//! b'F' | kind (b't' text, b'b' binary) | node id (16 bytes) | payload
//! ```
//!
//! A node skips what carries its own id (its subscribers already have it), so nothing is
//! delivered twice. A node subscribes in Redis when its first local subscriber to a topic
//! arrives and unsubscribes after the last leaves (the [`Hub`](crate::topics) tells it).
//!
//! Two threads per server, each with its own blocking connection — the event loops never wait
//! on Redis:
//! - the **publisher** takes publications from a queue bounded in bytes
//!   ([`TopicsConfig::redis_queue`](crate::config::TopicsConfig)) and pipelines `PUBLISH`es;
//! - the **subscriber** holds the `SUBSCRIBE`d connection and hands each message to the loops'
//!   inboxes.
//!
//! Redis down: local delivery goes on; a publication that cannot reach Redis is counted in
//! `backplane_lost_total{reason="redis_down"}` (a full queue: `reason="queue_full"`; written but
//! unconfirmed when the connection failed: `reason="unconfirmed"`; an error reply from Redis:
//! `reason="refused"`) and never retried, so nothing
//! arrives twice. Both threads reconnect with backoff (100 ms doubling to 2 s) and the
//! subscriber subscribes again to every topic with local subscribers.
//!
//! The client is the `redis` crate's synchronous API (no async runtime: freeboard's loops are
//! its own threads, and these two threads block on Redis so that no loop ever does). `fred`
//! was the other candidate; it is built on tokio only, which the server does not otherwise
//! need.
//!
//! Sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`, Redis Cluster) is not used: the `redis` crate
//! offers it only on its tokio cluster client, and a node speaks plain `PUBLISH`/`SUBSCRIBE`
//! to one Redis (which a cluster also accepts, broadcasting every message to all its shards).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use freeboard_proto::MessageKind;
use redis::{Client, Connection, RedisError};

use crate::handler::{Accepted, Decision};
use crate::history::{History, Offset};
use crate::metrics::Metrics;

/// Publications the queue towards Redis holds at most, whatever their size.
const QUEUE_MESSAGES: usize = 65_536;
/// First reconnect delay; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long the subscriber waits for a message before it looks at subscription changes.
const POLL: Duration = Duration::from_millis(20);
/// How long a connect, a command's reply or a `SUBSCRIBE`'s confirmation may take.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Channel prefix in Redis.
const PREFIX: &str = "freeboard:";
/// Key prefix of the topics' history streams.
const HISTORY_PREFIX: &str = "freeboard:history:";

/// Where Redis is: a `redis://[[user]:password@]host[:port][/db]` URL, checked.
#[derive(Debug, Clone)]
pub(crate) struct RedisAddr {
    client: Client,
    /// `host:port`, for the log (never the password).
    pub(crate) host_port: String,
}

impl RedisAddr {
    /// Parses a `redis://` URL (the database number does not matter: pub/sub spans databases).
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        if !url.starts_with("redis://") {
            return Err(format!("{url:?}: not a redis:// URL"));
        }
        let parsed = url::Url::parse(url).map_err(|e| format!("{url:?}: {e}"))?;
        let host =
            parsed.host_str().filter(|h| !h.is_empty()).ok_or("a Redis URL without a host")?;
        let host_port = format!("{host}:{}", parsed.port().unwrap_or(6379));
        let client = Client::open(url).map_err(|e| format!("{url:?}: {e}"))?;
        Ok(Self { client, host_port })
    }

    /// A connected, authenticated connection whose replies time out after [`TIMEOUT`].
    fn connect(&self) -> Result<Connection, RedisError> {
        let conn = self.client.get_connection_with_timeout(TIMEOUT)?;
        conn.set_read_timeout(Some(TIMEOUT))?;
        conn.set_write_timeout(Some(TIMEOUT))?;
        Ok(conn)
    }
}

/// A subscription change for the subscriber thread.
enum Change {
    Subscribe(Arc<str>),
    Unsubscribe(Arc<str>),
    /// Stay subscribed for [`PIN`] even without local subscribers, and say so on the sender
    /// once the subscription is confirmed (a reconnecting subscriber's history is fetched).
    Pin(Arc<str>, SyncSender<()>),
}

/// How long a recovery keeps its topic subscribed: time for the upgrade to finish and the
/// connection to subscribe.
const PIN: Duration = Duration::from_secs(10);
/// Reconnecting subscribers whose history is being fetched at once; more get 503.
const RECOVERIES: usize = 256;

/// A publication on its way to Redis.
struct Outgoing {
    channel: Vec<u8>,
    /// Kept in the topic's stream, then published with its offset.
    kept: bool,
    message: Vec<u8>,
}

/// A message from another node (or, for a topic kept in Redis, from any node).
pub(crate) struct Incoming<'m> {
    pub(crate) topic: &'m str,
    pub(crate) kind: MessageKind,
    /// The payload; for a topic kept in Redis, with its envelope (`{offset}:` first).
    pub(crate) data: &'m [u8],
    pub(crate) offset: Option<Offset>,
}

/// The Lua script that keeps a publication in its topic's stream and publishes it with the
/// entry's ID as its offset, atomically, so every node sees the streams' order.
/// KEYS: stream, channel; ARGV: kind, payload, most messages, oldest age in ms (0: none).
const KEEP_AND_PUBLISH: &str = r#"
local id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[3], '*', 'k', ARGV[1], 'm', ARGV[2])
local age = tonumber(ARGV[4])
if age > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('XTRIM', KEYS[1], 'MINID', tostring(now - age))
  redis.call('PEXPIRE', KEYS[1], age)
end
redis.call('PUBLISH', KEYS[2], 'S' .. ARGV[1] .. id .. ':' .. ARGV[2])
return id
"#;

/// A reconnecting subscriber whose history is to be fetched before its upgrade is accepted.
struct Recovery {
    topic: Arc<str>,
    since: Offset,
    decision: Decision,
    accepted: Accepted,
}

/// Where upgrades with `?since=` on topics kept in Redis go to have their history fetched.
#[derive(Clone)]
pub(crate) struct Recoverer {
    requests: SyncSender<Recovery>,
    history: Arc<History>,
}

impl Recoverer {
    /// Accepts `decision` once `topic`'s history after `since` is in this node's ring (at
    /// once if the topic keeps none); 503 if too many are being fetched.
    pub(crate) fn recover(&self, topic: &str, since: &str, decision: Decision, accepted: Accepted) {
        let Some(since) = Offset::parse(since).filter(|_| self.history.applies(topic)) else {
            return decision.accept(accepted); // on_open tells a bad offset
        };
        let request = Recovery { topic: Arc::from(topic), since, decision, accepted };
        if let Err(TrySendError::Full(r) | TrySendError::Disconnected(r)) =
            self.requests.try_send(request)
        {
            r.decision.reject_because(503, "history_busy");
        }
    }
}

/// This node's end of the backplane, held by the [`Hub`](crate::topics).
pub(crate) struct Backplane {
    node: [u8; 16],
    changes: Arc<Mutex<Sender<Change>>>,
    outgoing: SyncSender<Outgoing>,
    /// Invariant: the bytes of the publications in `outgoing`.
    queued: Arc<AtomicUsize>,
    queue_bytes: usize,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    /// With history kept in Redis streams.
    pub(crate) recoverer: Option<Recoverer>,
}

impl Backplane {
    /// Starts the publisher and subscriber threads (and, with `history`, the thread that
    /// fetches it for reconnecting subscribers). `deliver` hands a message from Redis to this
    /// node's loops; it returns `false` once the server is gone, which ends the subscriber
    /// thread.
    pub(crate) fn start(
        addr: RedisAddr,
        queue_bytes: usize,
        metrics: Arc<Metrics>,
        history: Option<Arc<History>>,
        deliver: impl Fn(Incoming<'_>) -> bool + Send + 'static,
    ) -> io::Result<Self> {
        let node = node_id();
        let (changes, changes_rx) = std::sync::mpsc::channel();
        let changes = Arc::new(Mutex::new(changes));
        let (outgoing, outgoing_rx) = std::sync::mpsc::sync_channel(QUEUE_MESSAGES);
        let queued = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (addr, queued, metrics, stop) =
                (addr.clone(), queued.clone(), metrics.clone(), stop.clone());
            let history = history.clone();
            std::thread::Builder::new()
                .name("freeboard-redis-pub".into())
                .spawn(move || publisher(addr, outgoing_rx, queued, metrics, history, stop))?;
        }
        let recoverer = match &history {
            Some(history) => {
                let (requests, requests_rx) = std::sync::mpsc::sync_channel(RECOVERIES);
                let (addr, changes, stop) = (addr.clone(), changes.clone(), stop.clone());
                let h = history.clone();
                std::thread::Builder::new()
                    .name("freeboard-redis-history".into())
                    .spawn(move || fetcher(addr, requests_rx, changes, h, stop))?;
                Some(Recoverer { requests, history: history.clone() })
            }
            None => None,
        };
        {
            let (metrics, stop) = (metrics.clone(), stop.clone());
            std::thread::Builder::new().name("freeboard-redis-sub".into()).spawn(move || {
                subscriber(addr, node, changes_rx, metrics, history, stop, deliver);
            })?;
        }
        Ok(Self { node, changes, outgoing, queued, queue_bytes, metrics, stop, recoverer })
    }

    /// The node's first local subscriber to `topic` arrived.
    pub(crate) fn subscribe(&self, topic: &Arc<str>) {
        let changes = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        let _ = changes.send(Change::Subscribe(topic.clone()));
    }

    /// The node's last local subscriber to `topic` left.
    pub(crate) fn unsubscribe(&self, topic: &Arc<str>) {
        let changes = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        let _ = changes.send(Change::Unsubscribe(topic.clone()));
    }

    /// Queues a publication of this node for the other nodes (`kept`: for every node, this
    /// one too, once Redis has kept it and given it its offset); counted as lost if the queue
    /// is full.
    pub(crate) fn publish(&self, topic: &str, kind: MessageKind, payload: &[u8], kept: bool) {
        let len = payload.len() + if kept { 1 } else { 18 };
        let before = self.queued.fetch_add(len, Ordering::AcqRel);
        if before + len > self.queue_bytes && before > 0 {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            self.metrics.backplane_lost("queue_full", 1);
            return;
        }
        let kind = match kind {
            MessageKind::Text => b't',
            MessageKind::Binary => b'b',
        };
        let message = if kept {
            [&[kind][..], payload].concat()
        } else {
            [&[b'F', kind][..], &self.node, payload].concat()
        };
        let channel = [PREFIX.as_bytes(), topic.as_bytes()].concat();
        if self.outgoing.try_send(Outgoing { channel, kept, message }).is_err() {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            self.metrics.backplane_lost("queue_full", 1);
        }
    }
}

impl Drop for Backplane {
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

/// The publisher thread: `PUBLISH`es (and, for topics kept in Redis, the script that keeps
/// and publishes), pipelined, on its own connection.
fn publisher(
    addr: RedisAddr,
    outgoing: Receiver<Outgoing>,
    queued: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    history: Option<Arc<History>>,
    stop: Arc<AtomicBool>,
) {
    // The connection, and the SHA1 of the script if history is kept in Redis.
    let mut conn: Option<(Connection, Option<String>)> = None;
    let mut backoff = BACKOFF_MIN;
    let mut next_attempt = Instant::now();
    let (most, age_ms) = history
        .as_ref()
        .map_or((0, 0), |h| (h.messages, h.max_age.map_or(0, |a| a.as_millis().max(1) as u64)));
    while !stop.load(Ordering::Acquire) {
        let first = match outgoing.recv_timeout(Duration::from_millis(200)) {
            Ok(first) => first,
            Err(RecvTimeoutError::Timeout) => continue,
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
        if conn.is_none() && Instant::now() >= next_attempt {
            let connected = addr.connect().and_then(|mut c| {
                // The script's SHA1, from Redis itself (loaded again on every connection: a
                // restarted Redis has forgotten it).
                let sha = match history {
                    Some(_) => {
                        Some(redis::cmd("SCRIPT").arg("LOAD").arg(KEEP_AND_PUBLISH).query(&mut c)?)
                    }
                    None => None,
                };
                Ok((c, sha))
            });
            match connected {
                Ok(c) => {
                    tracing::info!(redis = %addr.host_port, "backplane publisher connected");
                    conn = Some(c);
                    backoff = BACKOFF_MIN;
                }
                Err(e) => {
                    tracing::warn!(redis = %addr.host_port, error = %e, "backplane publisher cannot connect");
                    next_attempt = Instant::now() + backoff;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
        let Some((c, sha)) = conn.as_mut() else {
            metrics.backplane_lost("redis_down", batch.len() as u64);
            continue;
        };
        let mut pipe = redis::pipe();
        for o in &batch {
            if let (true, Some(sha)) = (o.kept, sha.as_deref()) {
                let topic = &o.channel[PREFIX.len()..];
                let stream = [HISTORY_PREFIX.as_bytes(), topic].concat();
                let (kind, payload) = o.message.split_at(1);
                pipe.cmd("EVALSHA").arg(sha).arg(2).arg(stream).arg(&o.channel);
                pipe.arg(kind).arg(payload).arg(most).arg(age_ms).ignore();
            } else {
                pipe.cmd("PUBLISH").arg(&o.channel).arg(&o.message).ignore();
            }
        }
        match pipe.exec(c) {
            Ok(()) => metrics.backplane_published(batch.len() as u64),
            Err(e) if e.is_io_error() || e.is_unrecoverable_error() => {
                // Written or not, unconfirmed: never sent again, so never delivered twice.
                tracing::warn!(error = %e, "backplane publisher lost its connection");
                metrics.backplane_lost("unconfirmed", batch.len() as u64);
                conn = None;
                next_attempt = Instant::now() + backoff;
            }
            Err(e) => {
                tracing::warn!(error = %e, "redis refused a publication");
                metrics.backplane_lost("refused", batch.len() as u64);
            }
        }
    }
}

/// The subscriber thread: holds the subscribed connection, follows the hub's changes and the
/// recoveries' pins, and delivers what arrives.
fn subscriber(
    addr: RedisAddr,
    node: [u8; 16],
    changes: Receiver<Change>,
    metrics: Arc<Metrics>,
    history: Option<Arc<History>>,
    stop: Arc<AtomicBool>,
    deliver: impl Fn(Incoming<'_>) -> bool,
) {
    // Topics with local subscribers, and topics pinned by a recovery (until when).
    let mut wanted: HashSet<Arc<str>> = HashSet::new();
    let mut pins: HashMap<Arc<str>, Instant> = HashMap::new();
    let mut waiting: Vec<(Arc<str>, SyncSender<()>)> = Vec::new();
    let mut backoff = BACKOFF_MIN;
    let forget = |topic: Option<&str>| {
        if let Some(history) = &history {
            history.forget(topic);
        }
    };
    // Follows the changes; whether the subscriber thread should end.
    // Follows the changes (noting in `dirty` that there were some); whether the thread should
    // end.
    let follow = |wanted: &mut HashSet<Arc<str>>,
                  pins: &mut HashMap<Arc<str>, Instant>,
                  waiting: &mut Vec<(Arc<str>, SyncSender<()>)>,
                  dirty: &mut bool| loop {
        let change = changes.try_recv();
        *dirty |= change.is_ok();
        match change {
            Ok(Change::Subscribe(t)) => {
                wanted.insert(t);
            }
            Ok(Change::Unsubscribe(t)) => {
                wanted.remove(&t);
            }
            Ok(Change::Pin(t, done)) => {
                pins.insert(t.clone(), Instant::now() + PIN);
                waiting.push((t, done));
            }
            Err(TryRecvError::Empty) => return false,
            Err(TryRecvError::Disconnected) => return true,
        }
    };
    'connect: while !stop.load(Ordering::Acquire) {
        // Follow the changes while disconnected too, so the resubscription is exact.
        if follow(&mut wanted, &mut pins, &mut waiting, &mut false) {
            return;
        }
        let mut conn = match addr.connect() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(redis = %addr.host_port, error = %e, "backplane subscriber cannot connect");
                metrics.set_backplane_up(false);
                waiting.clear(); // their recoveries fail (503)
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let mut pubsub = conn.as_pubsub();
        // What Redis has subscribed; history rings hold only what arrived while subscribed.
        let mut subscribed: HashSet<Arc<str>> = HashSet::new();
        forget(None);
        tracing::info!(redis = %addr.host_port, topics = wanted.len(), "backplane subscriber connected");
        metrics.set_backplane_up(true);
        backoff = BACKOFF_MIN;
        let mut dirty = true;
        while !stop.load(Ordering::Acquire) {
            if !pins.is_empty() {
                let (now, before) = (Instant::now(), pins.len());
                pins.retain(|_, until| *until > now);
                dirty |= pins.len() != before;
            }
            if dirty {
                dirty = false;
                // Subscribe to what is wanted or pinned, unsubscribe from the rest.
                let _ = pubsub.set_read_timeout(Some(TIMEOUT));
                let add: Vec<Arc<str>> = wanted
                    .iter()
                    .chain(pins.keys())
                    .filter(|t| !subscribed.contains(*t))
                    .cloned()
                    .collect();
                let remove: Vec<Arc<str>> = subscribed
                    .iter()
                    .filter(|t| !wanted.contains(*t) && !pins.contains_key(*t))
                    .cloned()
                    .collect();
                let channels = |topics: &[Arc<str>]| -> Vec<String> {
                    topics.iter().map(|t| format!("{PREFIX}{t}")).collect()
                };
                let mut result = Ok(());
                if !add.is_empty() {
                    result = pubsub.subscribe(channels(&add));
                }
                if !remove.is_empty() && result.is_ok() {
                    result = pubsub.unsubscribe(channels(&remove));
                }
                if let Err(e) = result {
                    tracing::warn!(error = %e, "backplane subscriber lost its connection");
                    metrics.set_backplane_up(false);
                    waiting.clear();
                    std::thread::sleep(backoff);
                    continue 'connect;
                }
                subscribed.extend(add);
                for topic in remove {
                    subscribed.remove(&topic);
                    forget(Some(&topic));
                }
                // Recoveries whose topic is now subscribed (confirmed) may fetch.
                waiting.retain(|(topic, done)| {
                    if subscribed.contains(topic) {
                        let _ = done.try_send(());
                        false
                    } else {
                        true
                    }
                });
                // Short reads, so subscription changes wait at most `POLL` (a timeout in the
                // middle of a reply loses nothing: the crate's decoder keeps what it has read).
                let _ = pubsub.set_read_timeout(Some(POLL));
            }
            match pubsub.get_message() {
                Ok(msg) => {
                    // A message that arrived while its topic was being unsubscribed is left.
                    let topic = msg
                        .get_channel_name()
                        .strip_prefix(PREFIX)
                        .filter(|t| subscribed.contains(*t))
                        .unwrap_or_default();
                    let message = if topic.is_empty() { &[][..] } else { msg.get_payload_bytes() };
                    let kind =
                        |k: u8| if k == b't' { MessageKind::Text } else { MessageKind::Binary };
                    let incoming = match message {
                        // Our own publication: its subscribers have it already.
                        [b'F', _, id @ ..] if id.len() >= 16 && id[..16] == node => None,
                        [b'F', k, rest @ ..] if rest.len() >= 16 => Some(Incoming {
                            topic,
                            kind: kind(*k),
                            data: &rest[16..],
                            offset: None,
                        }),
                        // Kept in Redis: from every node, this one too, with its offset.
                        [b'S', k, rest @ ..] => rest
                            .iter()
                            .position(|b| *b == b':')
                            .and_then(|colon| std::str::from_utf8(&rest[..colon]).ok())
                            .and_then(Offset::parse)
                            .map(|offset| Incoming {
                                topic,
                                kind: kind(*k),
                                data: rest,
                                offset: Some(offset),
                            }),
                        _ => None,
                    };
                    if let Some(incoming) = incoming {
                        metrics.backplane_received();
                        if !deliver(incoming) {
                            return;
                        }
                    }
                }
                Err(e) if e.is_timeout() => {}
                Err(e) => {
                    tracing::warn!(error = %e, "backplane subscriber lost its connection");
                    metrics.set_backplane_up(false);
                    waiting.clear();
                    std::thread::sleep(backoff);
                    continue 'connect;
                }
            }
            // The hub's changes, after every message (a busy channel never lets a read time
            // out) and every quiet `POLL`.
            if follow(&mut wanted, &mut pins, &mut waiting, &mut dirty) {
                return;
            }
        }
    }
}

/// The thread that fetches history from Redis for reconnecting subscribers: it has the topic
/// subscribed (pinned) first, so the node's ring gets every message from then on, then
/// fetches what the stream holds after the subscriber's offset into the ring, then accepts
/// the upgrade. The connection's `on_open` replays from the ring.
fn fetcher(
    addr: RedisAddr,
    requests: Receiver<Recovery>,
    changes: Arc<Mutex<Sender<Change>>>,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
) {
    let mut conn: Option<Connection> = None;
    while !stop.load(Ordering::Acquire) {
        let request = match requests.recv_timeout(Duration::from_millis(200)) {
            Ok(request) => request,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let Recovery { topic, since, decision, accepted } = request;
        let (done, subscribed) = std::sync::mpsc::sync_channel(1);
        {
            let changes = changes.lock().unwrap_or_else(|e| e.into_inner());
            let _ = changes.send(Change::Pin(topic.clone(), done));
        }
        if subscribed.recv_timeout(TIMEOUT).is_err() {
            decision.reject_because(503, "history_unavailable");
            continue;
        }
        if conn.is_none() {
            conn = addr.connect().ok();
        }
        let Some(c) = conn.as_mut() else {
            decision.reject_because(503, "history_unavailable");
            continue;
        };
        match fetch(c, &topic, since) {
            Ok(Some((newest, fetched))) => history.fill(&topic, since, newest, fetched),
            Ok(None) => {} // gone: on_open says so
            Err(e) => {
                tracing::warn!(error = %e, "history fetch failed");
                conn = None;
                decision.reject_because(503, "history_unavailable");
                continue;
            }
        }
        decision.accept(accepted);
    }
}

/// What `topic`'s stream holds after `since`, envelopes made, and the stream's last offset;
/// `None` if it no longer holds all of it (trimmed past `since`, expired, or `since` was
/// never issued).
#[allow(clippy::type_complexity)]
fn fetch(
    conn: &mut Connection,
    topic: &str,
    since: Offset,
) -> Result<Option<(Offset, Vec<(Offset, MessageKind, Box<[u8]>)>)>, RedisError> {
    let stream = format!("{HISTORY_PREFIX}{topic}");
    let info: Option<HashMap<String, redis::Value>> =
        match redis::cmd("XINFO").arg("STREAM").arg(&stream).query(conn) {
            Ok(info) => Some(info),
            Err(e) if e.code() == Some("ERR") => None, // no such key
            Err(e) => return Err(e),
        };
    let Some(info) = info else { return Ok(None) };
    let id = |name: &str| -> Option<Offset> {
        match info.get(name)? {
            redis::Value::BulkString(b) => Offset::parse(std::str::from_utf8(b).ok()?),
            redis::Value::SimpleString(s) => Offset::parse(s),
            _ => None,
        }
    };
    let (Some(deleted), Some(last)) = (id("max-deleted-entry-id"), id("last-generated-id")) else {
        return Ok(None);
    };
    if since < deleted || since > last {
        return Ok(None);
    }
    let entries: Vec<(String, Vec<Vec<u8>>)> =
        redis::cmd("XRANGE").arg(&stream).arg(format!("({since}")).arg("+").query(conn)?;
    let fetched = entries
        .into_iter()
        .filter_map(|(id, fields)| {
            let offset = Offset::parse(&id)?;
            let [k, kind, m, payload] = fields.as_slice() else { return None };
            (k == b"k" && m == b"m").then_some(())?;
            let kind = if kind == b"t" { MessageKind::Text } else { MessageKind::Binary };
            let data = [format!("{offset}:").as_bytes(), payload].concat().into_boxed_slice();
            Some((offset, kind, data))
        })
        .collect();
    Ok(Some((last, fetched)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_host_and_port() {
        assert_eq!(
            RedisAddr::parse("redis://127.0.0.1:6380/").unwrap().host_port,
            "127.0.0.1:6380"
        );
        assert_eq!(RedisAddr::parse("redis://:pw@example:1/0").unwrap().host_port, "example:1");
        assert_eq!(RedisAddr::parse("redis://h").unwrap().host_port, "h:6379");
        assert!(RedisAddr::parse("http://h").is_err());
        assert!(RedisAddr::parse("redis://").is_err());
    }
}
