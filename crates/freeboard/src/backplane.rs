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
//! `backplane_lost{reason="redis_down"}` (a full queue: `reason="queue_full"`; written but
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

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use freeboard_proto::MessageKind;
use redis::{Client, Connection, RedisError};

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
        let host = parsed.host_str().filter(|h| !h.is_empty()).ok_or("a Redis URL without a host")?;
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
}

/// A publication on its way to Redis.
struct Outgoing {
    channel: Vec<u8>,
    message: Vec<u8>,
}

/// This node's end of the backplane, held by the [`Hub`](crate::topics).
pub(crate) struct Backplane {
    node: [u8; 16],
    changes: Mutex<Sender<Change>>,
    outgoing: SyncSender<Outgoing>,
    /// Invariant: the bytes of the publications in `outgoing`.
    queued: Arc<AtomicUsize>,
    queue_bytes: usize,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
}

impl Backplane {
    /// Starts the publisher and subscriber threads. `deliver(topic, kind, payload)` hands a
    /// message from another node to this node's loops; it returns `false` once the server is
    /// gone, which ends the subscriber thread.
    pub(crate) fn start(
        addr: RedisAddr,
        queue_bytes: usize,
        metrics: Arc<Metrics>,
        deliver: impl Fn(&str, MessageKind, &[u8]) -> bool + Send + 'static,
    ) -> io::Result<Self> {
        let node = node_id();
        let (changes, changes_rx) = std::sync::mpsc::channel();
        let (outgoing, outgoing_rx) = std::sync::mpsc::sync_channel(QUEUE_MESSAGES);
        let queued = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (addr, queued, metrics, stop) =
                (addr.clone(), queued.clone(), metrics.clone(), stop.clone());
            std::thread::Builder::new()
                .name("freeboard-redis-pub".into())
                .spawn(move || publisher(addr, outgoing_rx, queued, metrics, stop))?;
        }
        {
            let (metrics, stop) = (metrics.clone(), stop.clone());
            std::thread::Builder::new().name("freeboard-redis-sub".into()).spawn(move || {
                subscriber(addr, node, changes_rx, metrics, stop, deliver);
            })?;
        }
        Ok(Self {
            node,
            changes: Mutex::new(changes),
            outgoing,
            queued,
            queue_bytes,
            metrics,
            stop,
        })
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

    /// Queues a publication of this node for the other nodes; counted as lost if the queue
    /// is full.
    pub(crate) fn publish(&self, topic: &str, kind: MessageKind, payload: &[u8]) {
        let len = payload.len() + 18;
        let before = self.queued.fetch_add(len, Ordering::AcqRel);
        if before + len > self.queue_bytes && before > 0 {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            self.metrics.backplane_lost("queue_full", 1);
            return;
        }
        let mut message = Vec::with_capacity(len);
        message.push(b'F');
        message.push(match kind {
            MessageKind::Text => b't',
            MessageKind::Binary => b'b',
        });
        message.extend_from_slice(&self.node);
        message.extend_from_slice(payload);
        let channel = [PREFIX.as_bytes(), topic.as_bytes()].concat();
        if self.outgoing.try_send(Outgoing { channel, message }).is_err() {
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

/// The publisher thread: `PUBLISH`es, pipelined, on its own connection.
fn publisher(
    addr: RedisAddr,
    outgoing: Receiver<Outgoing>,
    queued: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
) {
    let mut conn: Option<Connection> = None;
    let mut backoff = BACKOFF_MIN;
    let mut next_attempt = Instant::now();
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
            match addr.connect() {
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
        let Some(c) = conn.as_mut() else {
            metrics.backplane_lost("redis_down", batch.len() as u64);
            continue;
        };
        let mut pipe = redis::pipe();
        for o in &batch {
            pipe.cmd("PUBLISH").arg(&o.channel).arg(&o.message).ignore();
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
                tracing::warn!(error = %e, "redis refused a PUBLISH");
                metrics.backplane_lost("refused", batch.len() as u64);
            }
        }
    }
}

/// The subscriber thread: holds the subscribed connection, follows the hub's changes and
/// delivers other nodes' publications.
fn subscriber(
    addr: RedisAddr,
    node: [u8; 16],
    changes: Receiver<Change>,
    metrics: Arc<Metrics>,
    stop: Arc<AtomicBool>,
    deliver: impl Fn(&str, MessageKind, &[u8]) -> bool,
) {
    let mut wanted: HashSet<Arc<str>> = HashSet::new();
    let mut backoff = BACKOFF_MIN;
    'connect: while !stop.load(Ordering::Acquire) {
        // Follow the changes while disconnected too, so the resubscription is exact.
        loop {
            match changes.try_recv() {
                Ok(Change::Subscribe(t)) => {
                    wanted.insert(t);
                }
                Ok(Change::Unsubscribe(t)) => {
                    wanted.remove(&t);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        let mut conn = match addr.connect() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(redis = %addr.host_port, error = %e, "backplane subscriber cannot connect");
                metrics.set_backplane_up(false);
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let mut pubsub = conn.as_pubsub();
        if !wanted.is_empty() {
            let channels: Vec<String> = wanted.iter().map(|t| format!("{PREFIX}{t}")).collect();
            if let Err(e) = pubsub.subscribe(&channels) {
                tracing::warn!(error = %e, "backplane subscriber cannot subscribe");
                std::thread::sleep(backoff);
                continue;
            }
        }
        tracing::info!(redis = %addr.host_port, topics = wanted.len(), "backplane subscriber connected");
        metrics.set_backplane_up(true);
        backoff = BACKOFF_MIN;
        while !stop.load(Ordering::Acquire) {
            // Short reads, so subscription changes wait at most `POLL` (a timeout in the
            // middle of a reply loses nothing: the crate's decoder keeps what it has read).
            let _ = pubsub.set_read_timeout(Some(POLL));
            match pubsub.get_message() {
                Ok(msg) => {
                    if let Some(topic) = msg.get_channel_name().strip_prefix(PREFIX)
                        && let message = msg.get_payload_bytes()
                        && let [b'F', kind, id @ ..] = &message[..message.len().min(18)]
                        && id.len() == 16
                        // Our own publication: its subscribers have it already.
                        && id != node
                    {
                        let kind =
                            if *kind == b't' { MessageKind::Text } else { MessageKind::Binary };
                        metrics.backplane_received();
                        if !deliver(topic, kind, &message[18..]) {
                            return;
                        }
                    }
                }
                Err(e) if e.is_timeout() => {}
                Err(e) => {
                    tracing::warn!(error = %e, "backplane subscriber lost its connection");
                    metrics.set_backplane_up(false);
                    std::thread::sleep(backoff);
                    continue 'connect;
                }
            }
            // The hub's changes, after every message (a busy channel never lets a read time
            // out) and every quiet `POLL`.
            let _ = pubsub.set_read_timeout(Some(TIMEOUT));
            loop {
                let result = match changes.try_recv() {
                    Ok(Change::Subscribe(t)) if wanted.insert(t.clone()) => {
                        pubsub.subscribe(format!("{PREFIX}{t}"))
                    }
                    Ok(Change::Unsubscribe(t)) if wanted.remove(&t) => {
                        pubsub.unsubscribe(format!("{PREFIX}{t}"))
                    }
                    Ok(_) => continue,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                };
                if let Err(e) = result {
                    tracing::warn!(error = %e, "backplane subscriber lost its connection");
                    metrics.set_backplane_up(false);
                    continue 'connect;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_host_and_port() {
        assert_eq!(RedisAddr::parse("redis://127.0.0.1:6380/").unwrap().host_port, "127.0.0.1:6380");
        assert_eq!(RedisAddr::parse("redis://:pw@example:1/0").unwrap().host_port, "example:1");
        assert_eq!(RedisAddr::parse("redis://h").unwrap().host_port, "h:6379");
        assert!(RedisAddr::parse("http://h").is_err());
        assert!(RedisAddr::parse("redis://").is_err());
    }
}
