//! Where a topic lives in Redis: the one server, or the master of a Redis Cluster that owns
//! its channel's hash slot.
//!
//! Nothing to configure: every `--redis` URL is a seed, asked `INFO cluster`. A server that is
//! not a cluster is a map of one node. A cluster is mapped with `CLUSTER SLOTS` (masters only),
//! and speaks sharded pub/sub (`SPUBLISH`/`SSUBSCRIBE`) if it has the command (Redis 7.0+),
//! plain `PUBLISH`/`SUBSCRIBE` otherwise (which a cluster broadcasts to every node, so routing
//! by slot is still right, only wasteful). The map is refreshed when a node answers `MOVED` or
//! `ASK`, drops a shard subscription (`sunsubscribe`: its slot left), or cannot be reached.

use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{Client, Cmd, Connection, ConnectionAddr, RedisError, Value};

/// How long a connect, a command's reply or a subscription's confirmation may take.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(2);
/// Redis Cluster's number of hash slots.
const SLOTS: u16 = 16_384;
/// The least time between two discoveries of the map (whoever asks), and after one that
/// nobody answered.
const REFRESH_MIN: Duration = Duration::from_millis(100);
const REFRESH_FAILED: Duration = Duration::from_secs(1);

/// Where Redis is: one or more `redis://[[user]:password@]host[:port][/db]` URLs (seeds of
/// one cluster when more than one), checked.
#[derive(Debug, Clone)]
pub(crate) struct RedisAddr {
    seeds: Vec<(Client, Arc<str>)>,
    /// The seeds' `host:port`s, for the log (never the password).
    pub(crate) host_port: String,
}

impl RedisAddr {
    /// Parses comma-separated `redis://` URLs (the database number does not matter: pub/sub
    /// spans databases, and a cluster has only one).
    pub(crate) fn parse(urls: &str) -> Result<Self, String> {
        let mut seeds = Vec::new();
        for url in urls.split(',').map(str::trim) {
            if !url.starts_with("redis://") {
                return Err(format!("{url:?}: not a redis:// URL"));
            }
            let parsed = url::Url::parse(url).map_err(|e| format!("{url:?}: {e}"))?;
            let host =
                parsed.host_str().filter(|h| !h.is_empty()).ok_or("a Redis URL without a host")?;
            let host_port = format!("{host}:{}", parsed.port().unwrap_or(6379));
            let client = Client::open(url).map_err(|e| format!("{url:?}: {e}"))?;
            seeds.push((client, Arc::from(host_port)));
        }
        let host_port = seeds.iter().map(|(_, h)| &**h).collect::<Vec<_>>().join(",");
        Ok(Self { seeds, host_port })
    }

    /// A client for the server at `node` (`host:port`), with the first seed's credentials.
    fn client(&self, node: &str) -> Result<Client, RedisError> {
        let (host, port) = split(node)?;
        let info = self.seeds[0].0.get_connection_info().clone();
        Client::open(info.set_addr(ConnectionAddr::Tcp(host.to_owned(), port)))
    }

    /// A connected, authenticated connection to `node` whose replies time out after
    /// [`TIMEOUT`].
    pub(crate) fn connect(&self, node: &str) -> Result<Connection, RedisError> {
        let conn = self.client(node)?.get_connection_with_timeout(TIMEOUT)?;
        conn.set_read_timeout(Some(TIMEOUT))?;
        conn.set_write_timeout(Some(TIMEOUT))?;
        Ok(conn)
    }

    /// A bare socket to `node` for a subscription, authenticated like the seeds.
    pub(crate) fn subscribe_to(&self, node: &str) -> Result<SubConn, RedisError> {
        let addr = node
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
        let stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        let mut conn = SubConn { stream, parser: redis::Parser::new() };
        let settings = self.seeds[0].0.get_connection_info().redis_settings();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            conn.send(auth.arg(password))?;
            if let Value::ServerError(e) = conn.read()? {
                return Err(e.into());
            }
        }
        Ok(conn)
    }
}

/// `host:port` split (the host may be an IPv6 address).
fn split(node: &str) -> Result<(&str, u16), RedisError> {
    node.rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse().ok()?)))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not host:port").into())
}

/// A subscribed connection: a socket read with the `redis` crate's RESP parser, whose state
/// survives a read timeout. Its sync `PubSub` would drop what we need: sharded messages,
/// `sunsubscribe` pushes and error replies.
pub(crate) struct SubConn {
    stream: TcpStream,
    parser: redis::Parser,
}

impl SubConn {
    pub(crate) fn send(&mut self, cmd: &Cmd) -> io::Result<()> {
        self.stream.write_all(&cmd.get_packed_command())
    }

    pub(crate) fn read(&mut self) -> Result<Value, RedisError> {
        self.parser.parse_value(&mut self.stream)
    }

    pub(crate) fn set_read_timeout(&self, timeout: Duration) {
        let _ = self.stream.set_read_timeout(Some(timeout));
    }
}

/// The map from channels to the servers that serve them.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Topology {
    /// The masters, `host:port`.
    pub(crate) nodes: Vec<Arc<str>>,
    /// Slot ranges (first, last) and their master's index in `nodes`, sorted; none without
    /// a cluster.
    ranges: Vec<(u16, u16, usize)>,
    /// `SPUBLISH`/`SSUBSCRIBE` rather than `PUBLISH`/`SUBSCRIBE`.
    pub(crate) sharded: bool,
}

impl Topology {
    /// The server that serves `channel` (a channel whose slot no master owns: none).
    pub(crate) fn node(&self, channel: &[u8]) -> Option<&Arc<str>> {
        if self.ranges.is_empty() {
            return self.nodes.first();
        }
        let slot = slot(channel);
        let at = self.ranges.partition_point(|r| r.1 < slot);
        self.ranges.get(at).filter(|r| r.0 <= slot).map(|r| &self.nodes[r.2])
    }

    /// The publish command.
    pub(crate) fn publish(&self) -> &'static str {
        if self.sharded { "SPUBLISH" } else { "PUBLISH" }
    }

    /// Whether the map comes from a cluster.
    pub(crate) fn cluster(&self) -> bool {
        !self.ranges.is_empty()
    }

    /// Asks `node` where channels live; `Ok(None)` if it is not a cluster.
    fn ask(conn: &mut Connection, node: &str) -> Result<Option<Self>, RedisError> {
        let info: String = redis::cmd("INFO").arg("cluster").query(conn)?;
        if !info.lines().any(|l| l.trim() == "cluster_enabled:1") {
            return Ok(None);
        }
        let (asked_host, _) = split(node)?;
        let slots: Value = redis::cmd("CLUSTER").arg("SLOTS").query(conn)?;
        let mut topology = Topology { nodes: Vec::new(), ranges: Vec::new(), sharded: false };
        for range in array(slots) {
            let mut fields = array(range).into_iter();
            let (Some(Value::Int(first)), Some(Value::Int(last)), Some(master)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let mut master = array(master).into_iter();
            // The preferred endpoint: empty or NULL means the host we asked; "?" a node not
            // reachable yet (its slots stay unmapped until a later refresh).
            let host = match master.next() {
                Some(Value::BulkString(h)) if h == b"?" => continue,
                Some(Value::BulkString(h)) if !h.is_empty() => {
                    String::from_utf8_lossy(&h).into_owned()
                }
                _ => asked_host.to_owned(),
            };
            let Some(Value::Int(port)) = master.next() else { continue };
            let name: Arc<str> = Arc::from(if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            });
            let index = match topology.nodes.iter().position(|n| *n == name) {
                Some(i) => i,
                None => {
                    topology.nodes.push(name);
                    topology.nodes.len() - 1
                }
            };
            let (Ok(first), Ok(last)) = (u16::try_from(first), u16::try_from(last)) else {
                continue;
            };
            topology.ranges.push((first, last.min(SLOTS - 1), index));
        }
        topology.ranges.sort_unstable();
        if topology.ranges.is_empty() {
            return Err(io::Error::other("a cluster without assigned slots").into());
        }
        let spublish: Value = redis::cmd("COMMAND").arg("INFO").arg("SPUBLISH").query(conn)?;
        topology.sharded = array(spublish).first().is_some_and(|v| *v != Value::Nil);
        Ok(Some(topology))
    }
}

fn array(value: Value) -> Vec<Value> {
    match value {
        Value::Array(items) | Value::Set(items) => items,
        _ => Vec::new(),
    }
}

/// Redis Cluster's hash slot of a key or shard channel: CRC16 (XMODEM) of its hash tag (what
/// the first `{…}` holds, if not empty) or of the whole of it, modulo 16384. Written here
/// rather than taken from a crate: the `redis` crate keeps its own private, and the algorithm
/// is the ten lines of Redis' specification (checked against `CLUSTER KEYSLOT` in the tests).
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc = 0u16;
    for &byte in tag.unwrap_or(key) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % SLOTS
}

/// The current map, shared by the backplane's threads; any of them refreshes it when it
/// finds it stale.
pub(crate) struct Shards {
    pub(crate) addr: RedisAddr,
    current: Mutex<Option<Arc<Topology>>>,
    /// When the map may be asked for again.
    not_before: Mutex<Instant>,
    /// The warning that Redis cannot be reached, repeated once a minute while it lasts.
    quiet: Mutex<super::Repeated>,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Shards {
    pub(crate) fn new(addr: RedisAddr) -> Self {
        Self {
            addr,
            current: Mutex::new(None),
            not_before: Mutex::new(Instant::now()),
            quiet: Mutex::new(super::Repeated::default()),
        }
    }

    /// The map, asked for if there is none yet.
    pub(crate) fn get(&self) -> Option<Arc<Topology>> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner()).clone();
        current.or_else(|| self.refresh())
    }

    /// Asks the seeds (then the masters of the last map) for the map again, unless it was
    /// asked for less than [`REFRESH_MIN`] ago ([`REFRESH_FAILED`] if nobody answered); the
    /// map (the last one if nobody answers).
    pub(crate) fn refresh(&self) -> Option<Arc<Topology>> {
        let mut not_before = self.not_before.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if Instant::now() < *not_before {
            return current;
        }
        let known = current.iter().flat_map(|t| t.nodes.iter().cloned());
        let candidates: Vec<Arc<str>> =
            self.addr.seeds.iter().map(|(_, n)| n.clone()).chain(known).collect();
        for node in &candidates {
            let answer = self.addr.connect(node).and_then(|mut c| Topology::ask(&mut c, node));
            let topology = match answer {
                Ok(Some(cluster)) => cluster,
                Ok(None) if self.addr.seeds.len() == 1 => {
                    Topology { nodes: vec![node.clone()], ranges: Vec::new(), sharded: false }
                }
                Ok(None) => {
                    tracing::error!(redis = %node, "several Redis URLs name seeds of one cluster, and this server is not a cluster");
                    continue;
                }
                Err(e) => {
                    tracing::debug!(redis = %node, error = %e, "cannot map the Redis shards");
                    continue;
                }
            };
            let topology = Arc::new(topology);
            if current.as_deref() != Some(&*topology) {
                tracing::info!(redis = %node, cluster = topology.cluster(), sharded = topology.sharded, masters = topology.nodes.len(), "backplane mapped Redis");
            }
            *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(topology.clone());
            self.quiet.lock().unwrap_or_else(|e| e.into_inner()).reset();
            *not_before = Instant::now() + REFRESH_MIN;
            return Some(topology);
        }
        *not_before = Instant::now() + REFRESH_FAILED;
        if let Some(left_out) = self.quiet.lock().unwrap_or_else(|e| e.into_inner()).allow() {
            tracing::warn!(redis = %self.addr.host_port, left_out, "backplane cannot reach Redis to map it (retrying; repeated once a minute)");
        }
        current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // The specification's check value, and slots `CLUSTER KEYSLOT` gives.
        assert_eq!(slot(b"123456789"), 0x31C3 % SLOTS);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"), "an empty tag hashes it all");
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    #[test]
    fn a_map_routes_by_slot() {
        let t = Topology {
            nodes: vec![Arc::from("a:1"), Arc::from("b:2")],
            ranges: vec![(0, 8000, 0), (8001, 16000, 1)],
            sharded: true,
        };
        assert_eq!(t.node(b"foo").map(|n| &**n), Some("b:2")); // 12182
        assert_eq!(t.node(b"123456789").map(|n| &**n), Some("b:2")); // 12739
        assert_eq!(t.node(b"{a}x").map(|n| &**n), Some("b:2")); // 15495
        let unowned = (0..).map(|i| format!("k{i}")).find(|k| slot(k.as_bytes()) > 16000);
        assert_eq!(t.node(unowned.unwrap().as_bytes()), None);
        let low = (0..).map(|i| format!("k{i}")).find(|k| slot(k.as_bytes()) <= 8000);
        assert_eq!(t.node(low.unwrap().as_bytes()).map(|n| &**n), Some("a:1"));
    }

    #[test]
    fn urls_name_hosts_and_ports() {
        let one = RedisAddr::parse("redis://127.0.0.1:6380/").unwrap();
        assert_eq!(one.host_port, "127.0.0.1:6380");
        assert_eq!(RedisAddr::parse("redis://:pw@example:1/0").unwrap().host_port, "example:1");
        assert_eq!(RedisAddr::parse("redis://h").unwrap().host_port, "h:6379");
        let seeds = RedisAddr::parse("redis://a:7000/, redis://b:7001").unwrap();
        assert_eq!(seeds.host_port, "a:7000,b:7001");
        assert!(RedisAddr::parse("http://h").is_err());
        assert!(RedisAddr::parse("redis://").is_err());
        assert!(RedisAddr::parse("redis://a:1/,http://b").is_err());
        assert_eq!(split("[::1]:7000").unwrap(), ("::1", 7000));
    }
}
