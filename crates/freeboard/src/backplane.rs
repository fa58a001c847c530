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
//! unconfirmed when the connection failed: `reason="unconfirmed"`) and never retried, so nothing
//! arrives twice. Both threads reconnect with backoff (100 ms doubling to 2 s) and the
//! subscriber subscribes again to every topic with local subscribers.
//!
//! The client is a small RESP2 implementation over `std::net::TcpStream` (the four commands
//! the backplane needs: `AUTH`, `PUBLISH`, `SUBSCRIBE`, `UNSUBSCRIBE`).

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use freeboard_proto::MessageKind;

use crate::metrics::Metrics;

/// Publications the queue towards Redis holds at most, whatever their size.
const QUEUE_MESSAGES: usize = 65_536;
/// First reconnect delay; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long the subscriber waits for a message before it looks at subscription changes.
const POLL: Duration = Duration::from_millis(20);
/// Channel prefix in Redis.
const PREFIX: &str = "freeboard:";

/// Where Redis is: from `redis://[[user]:password@]host:port[/db]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedisAddr {
    /// `host:port`.
    pub(crate) host_port: String,
    /// `(user, password)` for `AUTH`, if the URL has a password.
    pub(crate) auth: Option<(Option<String>, String)>,
}

impl RedisAddr {
    /// Parses a `redis://` URL (the database number is ignored: pub/sub spans databases).
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let rest =
            url.strip_prefix("redis://").ok_or_else(|| format!("{url:?}: not a redis:// URL"))?;
        let authority = rest.split('/').next().unwrap_or_default();
        let (auth, host) = match authority.rsplit_once('@') {
            Some((creds, host)) => {
                let (user, pass) = creds.split_once(':').unwrap_or(("", creds));
                let user = (!user.is_empty()).then(|| user.to_owned());
                (Some((user, pass.to_owned())), host)
            }
            None => (None, authority),
        };
        if host.is_empty() {
            return Err(format!("{url:?}: no host"));
        }
        let host_port =
            if host.rsplit_once(':').is_some() { host.to_owned() } else { format!("{host}:6379") };
        Ok(Self { host_port, auth })
    }

    /// A connected, authenticated stream.
    fn connect(&self) -> io::Result<TcpStream> {
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&self.host_port)?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        stream.set_nodelay(true)?;
        if let Some((user, pass)) = &self.auth {
            let mut out = Vec::new();
            match user {
                Some(user) => command(&mut out, &[b"AUTH", user.as_bytes(), pass.as_bytes()]),
                None => command(&mut out, &[b"AUTH", pass.as_bytes()]),
            }
            stream.write_all(&out)?;
            stream.set_read_timeout(Some(Duration::from_secs(2)))?;
            let mut reader = BufReader::new(stream.try_clone()?);
            if let Reply::Error(e) = read_reply(&mut reader)? {
                return Err(io::Error::new(io::ErrorKind::PermissionDenied, e));
            }
        }
        Ok(stream)
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
    let mut conn: Option<(TcpStream, BufReader<TcpStream>)> = None;
    let mut backoff = BACKOFF_MIN;
    let mut next_attempt = Instant::now();
    let mut out = Vec::new();
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
            match addr.connect().and_then(|s| {
                s.set_read_timeout(Some(Duration::from_secs(2)))?;
                Ok((s.try_clone()?, BufReader::new(s)))
            }) {
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
        let Some((stream, reader)) = conn.as_mut() else {
            metrics.backplane_lost("redis_down", batch.len() as u64);
            continue;
        };
        out.clear();
        for o in &batch {
            command(&mut out, &[b"PUBLISH", &o.channel, &o.message]);
        }
        let mut confirmed = 0;
        let result = stream.write_all(&out).and_then(|()| {
            for _ in &batch {
                if let Reply::Error(e) = read_reply(reader)? {
                    tracing::warn!(error = %e, "redis refused a PUBLISH");
                }
                confirmed += 1;
            }
            Ok(())
        });
        match result {
            Ok(()) => metrics.backplane_published(batch.len() as u64),
            Err(e) => {
                tracing::warn!(error = %e, "backplane publisher lost its connection");
                metrics.backplane_published(confirmed);
                metrics.backplane_lost("unconfirmed", (batch.len() - confirmed as usize) as u64);
                conn = None;
                next_attempt = Instant::now() + backoff;
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
    let mut out = Vec::new();
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
        let mut stream = match addr.connect() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(redis = %addr.host_port, error = %e, "backplane subscriber cannot connect");
                metrics.set_backplane_up(false);
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let _ = stream.set_read_timeout(Some(POLL));
        let Ok(read_half) = stream.try_clone() else { continue };
        let mut reader = BufReader::new(read_half);
        if !wanted.is_empty() {
            out.clear();
            let channels: Vec<Vec<u8>> =
                wanted.iter().map(|t| [PREFIX.as_bytes(), t.as_bytes()].concat()).collect();
            let mut args: Vec<&[u8]> = vec![b"SUBSCRIBE"];
            args.extend(channels.iter().map(Vec::as_slice));
            command(&mut out, &args);
            if stream.write_all(&out).is_err() {
                continue;
            }
        }
        tracing::info!(redis = %addr.host_port, topics = wanted.len(), "backplane subscriber connected");
        metrics.set_backplane_up(true);
        backoff = BACKOFF_MIN;
        while !stop.load(Ordering::Acquire) {
            match read_reply(&mut reader) {
                Ok(Reply::Array(items)) => {
                    if let [
                        Reply::Bulk(Some(what)),
                        Reply::Bulk(Some(channel)),
                        Reply::Bulk(Some(message)),
                    ] = items.as_slice()
                        && what == b"message"
                        && let Some(topic) = channel.strip_prefix(PREFIX.as_bytes())
                        && let Ok(topic) = std::str::from_utf8(topic)
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
                Ok(_) => {}
                Err(e)
                    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "backplane subscriber lost its connection");
                    metrics.set_backplane_up(false);
                    std::thread::sleep(backoff);
                    continue 'connect;
                }
            }
            // The hub's changes, after every reply (a busy channel never lets a read time
            // out) and every quiet `POLL`.
            out.clear();
            loop {
                let (verb, topic): (&[u8], _) = match changes.try_recv() {
                    Ok(Change::Subscribe(t)) if wanted.insert(t.clone()) => (b"SUBSCRIBE", t),
                    Ok(Change::Unsubscribe(t)) if wanted.remove(&t) => (b"UNSUBSCRIBE", t),
                    Ok(_) => continue,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                };
                let channel = [PREFIX.as_bytes(), topic.as_bytes()].concat();
                command(&mut out, &[verb, &channel]);
            }
            if !out.is_empty() && stream.write_all(&out).is_err() {
                metrics.set_backplane_up(false);
                continue 'connect;
            }
        }
    }
}

/// Appends a RESP2 command (an array of bulk strings).
fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// A RESP2 reply.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

/// Reads one reply. A read timeout in the middle of a reply is not recoverable (the stream
/// position is lost), so the caller treats only a timeout before its first byte as "nothing".
fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let mut line = Vec::new();
    // The first byte may time out (nothing arrived); once it is in, wait for the rest.
    if reader.fill_buf()?.is_empty() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    read_line(reader, &mut line)?;
    let invalid = || io::Error::new(io::ErrorKind::InvalidData, "invalid RESP");
    let text = std::str::from_utf8(&line[1..]).map_err(|_| invalid())?.to_owned();
    let number = || text.parse::<i64>().map_err(|_| invalid());
    Ok(match line[0] {
        b'+' => Reply::Simple(text),
        b'-' => Reply::Error(text),
        b':' => Reply::Integer(number()?),
        b'$' => match number()? {
            n if n < 0 => Reply::Bulk(None),
            n => {
                let mut data = vec![0u8; n as usize + 2];
                read_all(reader, &mut data)?;
                data.truncate(n as usize);
                Reply::Bulk(Some(data))
            }
        },
        b'*' => match number()? {
            n if n < 0 => Reply::Array(Vec::new()),
            n => {
                let mut items = Vec::with_capacity(n.min(64) as usize);
                for _ in 0..n {
                    items.push(read_reply_rest(reader)?);
                }
                Reply::Array(items)
            }
        },
        _ => return Err(invalid()),
    })
}

/// The rest of a reply once its first byte is in: timeouts are retried.
fn read_reply_rest(reader: &mut impl BufRead) -> io::Result<Reply> {
    loop {
        match reader.fill_buf() {
            Ok([]) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => return read_reply(reader),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
    }
}

/// A line up to `\r\n` (excluded), retrying timeouts.
fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<()> {
    loop {
        match reader.read_until(b'\n', line) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(_) if line.ends_with(b"\r\n") => {
                line.truncate(line.len() - 2);
                return if line.is_empty() {
                    Err(io::Error::new(io::ErrorKind::InvalidData, "empty RESP line"))
                } else {
                    Ok(())
                };
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Fills `buf`, retrying timeouts.
fn read_all(reader: &mut impl Read, mut buf: &mut [u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match reader.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_host_port_and_credentials() {
        let a = RedisAddr::parse("redis://127.0.0.1:6380/").unwrap();
        assert_eq!((a.host_port.as_str(), a.auth), ("127.0.0.1:6380", None));
        let a = RedisAddr::parse("redis://:pw@example:1/0").unwrap();
        assert_eq!(a.auth, Some((None, "pw".to_owned())));
        assert_eq!(RedisAddr::parse("redis://h").unwrap().host_port, "h:6379");
        assert!(RedisAddr::parse("http://h").is_err());
    }

    #[test]
    fn replies_parse_whatever_the_split() {
        let mut out = Vec::new();
        command(&mut out, &[b"PUBLISH", b"c", b"x\r\ny"]);
        assert_eq!(out, b"*3\r\n$7\r\nPUBLISH\r\n$1\r\nc\r\n$4\r\nx\r\ny\r\n");
        let wire = b"*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$4\r\nx\r\ny\r\n:1\r\n-ERR no\r\n";
        let mut reader = io::BufReader::with_capacity(1, &wire[..]);
        let message = Reply::Array(vec![
            Reply::Bulk(Some(b"message".to_vec())),
            Reply::Bulk(Some(b"c".to_vec())),
            Reply::Bulk(Some(b"x\r\ny".to_vec())),
        ]);
        assert_eq!(read_reply(&mut reader).unwrap(), message);
        assert_eq!(read_reply(&mut reader).unwrap(), Reply::Integer(1));
        assert_eq!(read_reply(&mut reader).unwrap(), Reply::Error("ERR no".into()));
    }
}
