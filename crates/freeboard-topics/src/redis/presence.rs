//! Presence across nodes through Redis (see [`freeboard::presence`]).
//!
//! Each node keeps its own members in two keys of one hash slot, which expire after the
//! presence TTL unless the node refreshes them (every third of it):
//!
//! ```text
//! {freeboard:presence:NODE}:members   hash   "TOPIC\nLOOP.SERIAL" -> {"sub":…,"claims":…}
//! {freeboard:presence:NODE}:version   string incremented with every change of the hash
//! freeboard:presence:nodes            zset   NODE -> when its part expires (Redis' clock, ms)
//! ```
//!
//! A node writes each change of its members (`HSET`/`HDEL` and `INCR` of its version, in one
//! `MULTI`), and reads the other nodes' parts every [`POLL`]: the live nodes from the set, the
//! version of each, and the members of a node whose version moved. What a node no longer has
//! leaves, what it has anew joins, each told to the subscribers that watch
//! ([`Presence::sync_node`]). A node that stopped refreshing (it died, or lost Redis) is out of
//! the set once its expiry passes: every other node takes its members out of its listings and
//! tells their watchers they left, within the TTL (and one poll) of its last refresh. A node
//! whose keys are gone while it runs (Redis restarted without its data) writes them afresh.
//!
//! A node cut off from Redis for longer than the TTL drops the other nodes' members (it can no
//! longer tell whether they are there) and reads them afresh once Redis is back; its own stay.
//!
//! One thread, with its own blocking connections; the event loops never wait on Redis. On a
//! cluster each key goes to the master of its slot.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use freeboard::presence::{LocalChange, LocalChanges, Presence};
use redis::{Connection, RedisError};

use super::shards::Shards;

/// How often a node reads the other nodes' parts (and writes its changes).
pub(super) const POLL: Duration = Duration::from_millis(250);

/// The set of live nodes.
const NODES: &str = "freeboard:presence:nodes";

/// The carrier's state: what it wrote, what it read, its connections.
struct Carrier {
    presence: Arc<Presence>,
    shards: Arc<Shards>,
    /// Connections by server (`host:port`).
    conns: HashMap<Arc<str>, Connection>,
    /// This node's keys need writing afresh (at the start, after a lost connection, after
    /// too many changes to keep, after Redis lost them).
    resync: bool,
    last_refresh: Option<Instant>,
    /// When the other nodes' parts were last read.
    last_read: Instant,
    /// Other nodes: the version last read, and the topics they have members of.
    known: HashMap<String, (Option<i64>, HashSet<String>)>,
}

/// Runs the carrier until `stop` is set.
pub(super) fn carrier(presence: Arc<Presence>, shards: Arc<Shards>, stop: Arc<AtomicBool>) {
    presence.carry();
    let mut carrier = Carrier {
        presence,
        shards,
        conns: HashMap::new(),
        resync: true,
        last_refresh: None,
        last_read: Instant::now(),
        known: HashMap::new(),
    };
    while !stop.load(Ordering::Acquire) {
        if let Err(e) = carrier.turn() {
            tracing::debug!(error = %e, "presence: Redis unreachable (retrying)");
            carrier.conns.clear();
            carrier.resync = true;
            carrier.last_refresh = None;
            let _ = carrier.shards.refresh();
            if carrier.last_read.elapsed() > carrier.presence.ttl() {
                // Cut off from Redis for longer than a node's part lives there: what this
                // node knows of the others can no longer be vouched for, and goes (they may
                // be gone); it is read afresh once Redis is back. Its own members stay.
                let nodes: Vec<String> = carrier.known.keys().cloned().collect();
                for node in nodes {
                    carrier.forget(&node);
                }
            }
        }
        std::thread::sleep(POLL);
    }
}

impl Carrier {
    fn turn(&mut self) -> Result<(), RedisError> {
        self.write()?;
        self.read()
    }

    /// Writes this node's changes, and refreshes its keys' expiry every third of the TTL.
    fn write(&mut self) -> Result<(), RedisError> {
        let node = self.presence.node().clone();
        let (members, version) = keys(&node);
        let ttl = self.presence.ttl().as_millis() as u64;
        let changes = match self.presence.take_changes() {
            _ if self.resync => None,
            LocalChanges::Changes(changes) => Some(changes),
            LocalChanges::Resync => None,
        };
        let mut pipe = redis::pipe();
        pipe.atomic();
        let changed = match changes {
            Some(changes) => {
                for change in &changes {
                    match change {
                        LocalChange::Join { topic, id, member } => {
                            pipe.cmd("HSET").arg(&members).arg(field(topic, id)).arg(member);
                        }
                        LocalChange::Leave { topic, id } => {
                            pipe.cmd("HDEL").arg(&members).arg(field(topic, id));
                        }
                    }
                    pipe.ignore();
                }
                !changes.is_empty()
            }
            None => {
                // Changes made from now on are kept; the table read next holds those before.
                pipe.cmd("DEL").arg(&members).ignore();
                for change in self.presence.local_members() {
                    if let LocalChange::Join { topic, id, member } = change {
                        pipe.cmd("HSET").arg(&members).arg(field(&topic, &id)).arg(member).ignore();
                    }
                }
                true
            }
        };
        let refresh = self.last_refresh.is_none_or(|at| at.elapsed() >= self.presence.ttl() / 3);
        if changed {
            pipe.cmd("INCR").arg(&version).ignore();
        }
        if changed || refresh {
            pipe.cmd("PEXPIRE").arg(&members).arg(ttl).ignore();
            pipe.cmd("PEXPIRE").arg(&version).arg(ttl);
            let alive: (i64,) = pipe.query(self.conn(&members)?)?;
            if alive.0 == 0 {
                // The version is gone (Redis lost it, or it was never written): afresh next.
                self.resync = true;
                return Ok(());
            }
            self.resync = false;
        }
        if refresh {
            let until = self.now_ms()? + ttl;
            redis::cmd("ZADD").arg(NODES).arg(until).arg(&*node).exec(self.conn(NODES)?)?;
            self.last_refresh = Some(Instant::now());
        }
        Ok(())
    }

    /// Reads the other nodes' parts: the live nodes, their versions, the members of those
    /// whose version moved; nodes gone leave.
    fn read(&mut self) -> Result<(), RedisError> {
        let now = self.now_ms()?;
        let conn = self.conn(NODES)?;
        let _: () = redis::cmd("ZREMRANGEBYSCORE").arg(NODES).arg("-inf").arg(now).query(conn)?;
        let live: Vec<String> = redis::cmd("ZRANGE").arg(NODES).arg(0).arg(-1).query(conn)?;
        let me = self.presence.node().clone();
        let live: HashSet<String> = live.into_iter().filter(|n| **n != *me).collect();
        let gone: Vec<String> = self.known.keys().filter(|n| !live.contains(*n)).cloned().collect();
        for node in gone {
            self.forget(&node);
        }
        for node in live {
            let (members, version) = keys(&node);
            let read: Option<i64> = redis::cmd("GET").arg(&version).query(self.conn(&version)?)?;
            let Some(read) = read else {
                // Its keys expired before its entry in the set: it is gone.
                self.forget(&node);
                continue;
            };
            if self.known.get(&node).is_some_and(|(v, _)| *v == Some(read)) {
                continue;
            }
            let all: HashMap<String, String> =
                redis::cmd("HGETALL").arg(&members).query(self.conn(&members)?)?;
            let mut by_topic: HashMap<String, Vec<(String, String)>> = HashMap::new();
            for (field, member) in all {
                if let Some((topic, id)) = field.split_once('\n') {
                    by_topic.entry(topic.to_owned()).or_default().push((id.to_owned(), member));
                }
            }
            let (_, had) = self.known.remove(&node).unwrap_or_default();
            for topic in had.iter().filter(|t| !by_topic.contains_key(*t)) {
                self.presence.sync_node(topic, &node, &[]);
            }
            for (topic, members) in &by_topic {
                self.presence.sync_node(topic, &node, members);
            }
            self.known.insert(node, (Some(read), by_topic.into_keys().collect()));
        }
        self.last_read = Instant::now();
        Ok(())
    }

    /// `node` is gone: its members leave every topic.
    fn forget(&mut self, node: &str) {
        if let Some((_, topics)) = self.known.remove(node) {
            tracing::info!(node, topics = topics.len(), "presence: a node's part expired");
            for topic in topics {
                self.presence.sync_node(&topic, node, &[]);
            }
        }
    }

    /// Redis' clock, in ms since the epoch: every node's expiry is written and compared on
    /// the clock of the server that holds the set, so the nodes' own clocks may disagree.
    fn now_ms(&mut self) -> Result<u64, RedisError> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(self.conn(NODES)?)?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// The connection to the server of `key`'s slot.
    fn conn(&mut self, key: &str) -> Result<&mut Connection, RedisError> {
        let topology = self.shards.get().ok_or_else(|| std::io::Error::other("Redis unmapped"))?;
        let server = topology
            .node(key.as_bytes())
            .cloned()
            .ok_or_else(|| std::io::Error::other("no master serves the slot"))?;
        if !self.conns.contains_key(&server) {
            let conn = self.shards.addr.connect(&server)?;
            self.conns.insert(server.clone(), conn);
        }
        // NOTE(unwrap): inserted just above if it was missing.
        Ok(self.conns.get_mut(&server).unwrap())
    }
}

/// A node's members hash and version key (one slot: the hash tag is the node's).
fn keys(node: &str) -> (String, String) {
    let tag = format!("{{freeboard:presence:{node}}}");
    (format!("{tag}:members"), format!("{tag}:version"))
}

/// A member's field in its node's hash (a topic name holds no line feed).
fn field(topic: &str, id: &str) -> String {
    format!("{topic}\n{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_keys_share_one_slot() {
        let (members, version) = keys("n1a2b3c4d");
        assert_eq!(
            super::super::shards::slot(members.as_bytes()),
            super::super::shards::slot(version.as_bytes())
        );
        assert_eq!(field("room1", "0.7").split_once('\n'), Some(("room1", "0.7")));
    }
}
