//! Presence: who is subscribed to a topic right now, on this node and on the others, and
//! join/leave events for the subscribers that ask for them.
//!
//! With [`TopicsConfig::presence_prefix`](crate::config::TopicsConfig) set, a subscriber of a
//! topic named with that prefix is a **member** of the topic's presence while it is subscribed
//! (the `/topic/` route of `freeboard-topics` joins it with
//! [`Conn::join_presence`](crate::Conn::join_presence) right after subscribing; it leaves when
//! it unsubscribes or its connection closes). A member is listed as
//!
//! ```json
//! {"id":"0.17","node":"n3f9a1c2e","sub":"alice","claims":{"name":"Alice"}}
//! ```
//!
//! `id` is its connection's id on its node (`LOOP.SERIAL`, never reused while the node runs),
//! `node` the node it is connected to, `sub` its token's subject (absent without a token),
//! `claims` the claims of its token an operator allows (`presence_claims`; absent if none).
//!
//! # Reading it
//!
//! [`Presence::page`] lists a topic's members in pages, ordered by node and id, resuming
//! after the `cursor` of the previous page, at most [`MAX_PAGE`] at a time: a listing never
//! builds more than one page, whatever the topic's size. [`Presence::count`] counts them
//! without listing. A server reaches its presence through
//! [`ServerHandle::presence`](crate::ServerHandle::presence); over HTTP the `/topic/` route
//! answers `GET /topic/NAME/presence?cursor=&limit=` and `GET /topic/NAME/presence/count`.
//!
//! # Events
//!
//! A subscriber that asks for them ([`Conn::watch_presence`](crate::Conn::watch_presence);
//! `?presence=1` on the `/topic/` route) gets a text message per join and leave, in this
//! envelope:
//!
//! ```text
//! freeboard-presence:{"event":"join","topic":"room1","id":"0.17","node":"n3f9a1c2e","sub":"alice"}
//! freeboard-presence:{"event":"leave","topic":"room1","id":"0.17","node":"n3f9a1c2e","sub":"alice"}
//! ```
//!
//! No publication can be read as one: on a topic that keeps history every publication starts
//! with its offset (hex digits and `.`), and on the others the `/topic/` route refuses a
//! publication that starts with [`EVENT_PREFIX`] (HTTP 400, close 1008 for a client's), as
//! an application publishing with the library must. The events of one connection arrive in
//! the order they happened (a join before its leave).
//!
//! # Across nodes
//!
//! With a backplane that carries presence (the Redis backplane of `freeboard-topics`), each
//! node keeps its own members in Redis under a key that expires after
//! [`ttl`](Presence::ttl) unless the node refreshes it, and reads the other nodes' parts of
//! the topics it has members of; a node that dies leaves every listing within the TTL, and
//! the subscribers that watch get a leave for each of its members then.
//!
//! # Memory
//!
//! Every member, local or of another node, is charged to the presence budget
//! ([`TopicsConfig::presence_memory`](crate::config::TopicsConfig), default 8 MiB: the entry
//! in the topic's ordered table and its `sub` and claims); a topic holds at most
//! [`presence_max_per_topic`](crate::config::TopicsConfig) members. A join either would pass
//! is refused ([`PresenceError`]), counted in `freeboard_topic_refusals_total{reason=
//! "presence_topic_full"|"presence_memory"}`; the `/topic/` route closes that subscriber with
//! 1013 (try again later). Measured with `freeboard bench presence`: 142 bytes per member of a
//! topic of 10,000 (docs/operating/presence.md).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use freeboard_buf::Budget;

use crate::config::TopicsConfig;
use crate::metrics::Metrics;

/// What every presence event starts with.
pub const EVENT_PREFIX: &str = "freeboard-presence:";

/// Why a publication was refused (400, close 1008): on a topic with presence it starts with
/// [`EVENT_PREFIX`], and would read as an event.
pub const RESERVED: &str = "a publication to a topic with presence cannot start with \
                            \"freeboard-presence:\", the envelope of its join and leave events";

/// The most members one page lists.
pub const MAX_PAGE: usize = 1000;

/// The members a page lists when the request names no limit.
pub const DEFAULT_PAGE: usize = 100;

/// What the name of a topic's presence events ends with: subscribers that watch a topic are
/// subscribed to `{topic}/presence`, a name no client can subscribe to (`/` is in no topic
/// name).
pub(crate) const WATCH_SUFFIX: &str = "/presence";

/// Local changes kept for the backplane before it must read the whole table afresh.
const CHANGES: usize = 65_536;

/// Bytes one member costs beyond its `sub` and claims: its key and entry in the topic's
/// B-tree (48 bytes) at the fill of a tree grown by ascending keys (about 55 %), and its share
/// of the tree's inner nodes. Checked against glibc's count in `freeboard bench presence`.
const ENTRY_BYTES: usize = 96;

/// The name subscribers that watch `topic`'s presence are subscribed to.
pub fn watch_topic(topic: &str) -> String {
    format!("{topic}{WATCH_SUFFIX}")
}

/// Delivers a presence event (`payload`) to every subscriber of a watch topic on this node.
pub(crate) type EventSender = dyn Fn(&str, &[u8]) + Send + Sync;

/// Why a join was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PresenceError {
    /// The topic has as many members as `presence_max_per_topic` allows.
    TopicFull,
    /// The presence budget (`presence_memory`) cannot hold one more member.
    NoMemory,
}

impl std::fmt::Display for PresenceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::TopicFull => "the topic's presence is full",
            Self::NoMemory => "the server's memory for presence is spent",
        })
    }
}

impl std::error::Error for PresenceError {}

/// One member of a topic, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its connection on its node, `LOOP.SERIAL`.
    pub id: String,
    /// The node it is connected to.
    pub node: Arc<str>,
    /// Its token's `sub`.
    pub sub: Option<Arc<str>>,
    /// The claims of its token an operator allows, as a JSON object.
    pub claims: Option<Arc<str>>,
}

/// One page of a topic's members.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// The members, ordered by node and id.
    pub members: Vec<Member>,
    /// Where the next page starts (give it as `cursor`), if there may be more.
    pub next: Option<String>,
}

impl Page {
    /// The page as the HTTP answer's JSON: `{"members":[…],"next":"…"}` (`next` is `null`
    /// on the last page).
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(32 + self.members.len() * 64);
        out.push_str("{\"members\":[");
        for (i, m) in self.members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            member_json(&mut out, &m.id, &m.node, m.sub.as_deref(), m.claims.as_deref());
        }
        out.push_str("],\"next\":");
        match &self.next {
            Some(next) => out.push_str(&json_string(next)),
            None => out.push_str("null"),
        }
        out.push('}');
        out
    }
}

/// A change of this node's members, for the backplane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalChange {
    /// Member `id` joined `topic`; `member` is what the other nodes store for it (a JSON
    /// object with `sub` and `claims`).
    Join {
        /// The topic.
        topic: Arc<str>,
        /// `LOOP.SERIAL`.
        id: String,
        /// `{"sub":…,"claims":…}`.
        member: String,
    },
    /// Member `id` left `topic`.
    Leave {
        /// The topic.
        topic: Arc<str>,
        /// `LOOP.SERIAL`.
        id: String,
    },
}

/// What the backplane has to send since it last asked.
#[derive(Debug)]
pub enum LocalChanges {
    /// These changes, in the order they happened.
    Changes(Vec<LocalChange>),
    /// Too many changes to keep: write every topic's members afresh
    /// ([`Presence::local_members`]).
    Resync,
}

/// Who is subscribed to the topics named with the presence prefix, on this node and (with a
/// backplane that carries presence) on the others. See the [module](self) documentation.
pub struct Presence {
    node: Arc<str>,
    prefix: String,
    max_per_topic: usize,
    ttl: Duration,
    tables: Mutex<Tables>,
    /// Whether a backplane takes this node's changes (they are kept for it only then).
    carried: AtomicBool,
    changes: Mutex<Option<Vec<LocalChange>>>,
    /// Sends an event to the subscribers of a watch topic on every loop of this node.
    events: OnceLock<Box<EventSender>>,
    metrics: Arc<Metrics>,
}

struct Tables {
    topics: HashMap<Arc<str>, BTreeMap<Key, Entry>>,
    /// Node names by index; 0 is this node. Invariant: a node with members has its name here.
    nodes: Vec<Arc<str>>,
    /// Invariant: `budget.drawn()` is the sum of [`entry_bytes`] over every member and of
    /// [`topic_bytes`] over every topic.
    budget: Budget,
    /// Members of every topic.
    members: usize,
}

/// A member's place in its topic's table: ordered by node, then connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    node: u32,
    event_loop: u32,
    serial: u64,
}

struct Entry {
    sub: Option<Arc<str>>,
    claims: Option<Arc<str>>,
}

impl Presence {
    /// The presence `config` asks for (`None` without a `presence_prefix`), of node `node`.
    pub(crate) fn new(
        config: &TopicsConfig,
        node: Arc<str>,
        metrics: Arc<Metrics>,
    ) -> Option<Self> {
        let prefix = config.presence_prefix.clone()?;
        Some(Self {
            node: node.clone(),
            prefix,
            max_per_topic: config.presence_max_per_topic,
            ttl: config.presence_ttl,
            tables: Mutex::new(Tables {
                topics: HashMap::new(),
                nodes: vec![node],
                budget: Budget::new(config.presence_memory),
                members: 0,
            }),
            carried: AtomicBool::new(false),
            changes: Mutex::new(None),
            events: OnceLock::new(),
            metrics,
        })
    }

    /// Whether `topic` has presence (its name starts with the prefix).
    pub fn applies(&self, topic: &str) -> bool {
        topic.starts_with(&self.prefix)
    }

    /// Whether a publication of `payload` to `topic` would read as one of its presence
    /// events: the topic has presence and `payload` starts with [`EVENT_PREFIX`]. Refuse it
    /// ([`RESERVED`]), as the `/topic/` route does.
    pub fn reserves(&self, topic: &str, payload: &[u8]) -> bool {
        self.applies(topic) && payload.starts_with(EVENT_PREFIX.as_bytes())
    }

    /// The prefix of the topics with presence (`""`: every topic).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// This node's name, as members connected here are listed.
    pub fn node(&self) -> &Arc<str> {
        &self.node
    }

    /// How long a node's part stays in the backplane without being refreshed.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Bytes the members hold now, and the most they may.
    pub fn memory(&self) -> (usize, usize) {
        let tables = self.lock();
        (tables.budget.drawn(), tables.budget.limit())
    }

    /// How many members `topic` has, on every node this one knows of.
    pub fn count(&self, topic: &str) -> usize {
        self.lock().topics.get(topic).map_or(0, BTreeMap::len)
    }

    /// At most `limit` (at most [`MAX_PAGE`]) members of `topic`, after `cursor` (the `next`
    /// of the previous page; `None` from the start). A cursor that is not one starts from the
    /// start. A listing that spans changes lists each member that stayed exactly once.
    pub fn page(&self, topic: &str, cursor: Option<&str>, limit: usize) -> Page {
        let limit = limit.clamp(1, MAX_PAGE);
        let tables = self.lock();
        let Some(members) = tables.topics.get(topic) else { return Page::default() };
        let after = cursor.and_then(parse_cursor);
        let range = match after {
            Some(after) => {
                members.range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            }
            None => members.range(..),
        };
        let mut page = Page::default();
        let mut last = None;
        for (key, entry) in range.take(limit) {
            page.members.push(Member {
                id: format!("{}.{}", key.event_loop, key.serial),
                node: tables.nodes[key.node as usize].clone(),
                sub: entry.sub.clone(),
                claims: entry.claims.clone(),
            });
            last = Some(*key);
        }
        if page.members.len() == limit
            && let Some(last) = last
            && members
                .range((std::ops::Bound::Excluded(last), std::ops::Bound::Unbounded))
                .next()
                .is_some()
        {
            page.next = Some(format!("{}.{}.{}", last.node, last.event_loop, last.serial));
        }
        page
    }

    /// Connection `id` of this node joins `topic` (which has presence), as `sub` with the
    /// allowed `claims` (a JSON object); the subscribers that watch the topic are told.
    pub(crate) fn join(
        &self,
        topic: &str,
        (event_loop, serial): (u32, u64),
        sub: Option<&str>,
        claims: Option<&str>,
    ) -> Result<(), PresenceError> {
        let key = Key { node: 0, event_loop, serial };
        let entry = Entry { sub: sub.map(Arc::from), claims: claims.map(Arc::from) };
        {
            let mut tables = self.lock();
            if let Err(e) = tables.insert(topic, key, entry, self.max_per_topic) {
                self.metrics.topic_refusal(match e {
                    PresenceError::TopicFull => "presence_topic_full",
                    PresenceError::NoMemory => "presence_memory",
                });
                return Err(e);
            }
            self.count_in_metrics(&tables);
        }
        let id = format!("{event_loop}.{serial}");
        self.record(|| LocalChange::Join {
            topic: Arc::from(topic),
            id: id.clone(),
            member: stored_member(sub, claims),
        });
        self.announce(topic, "join", &id, &self.node, sub, claims);
        Ok(())
    }

    /// Connection `id` of this node leaves `topic`, if it was a member; the subscribers that
    /// watch the topic are told.
    pub(crate) fn leave(&self, topic: &str, (event_loop, serial): (u32, u64)) {
        let key = Key { node: 0, event_loop, serial };
        let entry = {
            let mut tables = self.lock();
            let Some(entry) = tables.remove(topic, key) else { return };
            self.count_in_metrics(&tables);
            entry
        };
        let id = format!("{event_loop}.{serial}");
        self.record(|| LocalChange::Leave { topic: Arc::from(topic), id: id.clone() });
        self.announce(topic, "leave", &id, &self.node, entry.sub.as_deref(), None);
    }

    /// Says where events go: `send(watch_topic, payload)` delivers a text message to every
    /// subscriber of `watch_topic` on this node (set once, when the server is bound).
    pub(crate) fn set_events(&self, send: Box<EventSender>) {
        let _ = self.events.set(send);
    }

    /// A backplane carries this node's members to the others: from now on the changes are
    /// kept for [`take_changes`](Self::take_changes).
    pub fn carry(&self) {
        self.carried.store(true, Ordering::Release);
        *self.changes.lock().unwrap_or_else(|e| e.into_inner()) = Some(Vec::new());
    }

    /// This node's changes since the last call, in order (for the backplane).
    pub fn take_changes(&self) -> LocalChanges {
        let mut changes = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        match changes.replace(Vec::new()) {
            Some(taken) => LocalChanges::Changes(taken),
            None => LocalChanges::Resync,
        }
    }

    /// Every topic's members of this node, as [`LocalChange::Join`]s (after
    /// [`LocalChanges::Resync`]).
    pub fn local_members(&self) -> Vec<LocalChange> {
        let tables = self.lock();
        let mut all = Vec::new();
        for (topic, members) in &tables.topics {
            let local = Key { node: 0, event_loop: 0, serial: 0 }..Key {
                node: 1,
                event_loop: 0,
                serial: 0,
            };
            for (key, entry) in members.range(local) {
                all.push(LocalChange::Join {
                    topic: topic.clone(),
                    id: format!("{}.{}", key.event_loop, key.serial),
                    member: stored_member(entry.sub.as_deref(), entry.claims.as_deref()),
                });
            }
        }
        all
    }

    /// The topics with members on this node.
    pub fn local_topics(&self) -> Vec<Arc<str>> {
        let tables = self.lock();
        let local = |m: &BTreeMap<Key, Entry>| m.keys().next().is_some_and(|k| k.node == 0);
        tables.topics.iter().filter(|(_, m)| local(m)).map(|(t, _)| t.clone()).collect()
    }

    /// The other nodes with members of `topic`, as this node knows them.
    pub fn remote_nodes(&self, topic: &str) -> Vec<Arc<str>> {
        let tables = self.lock();
        let Some(members) = tables.topics.get(topic) else { return Vec::new() };
        let mut nodes: Vec<u32> = members.keys().map(|k| k.node).filter(|&n| n != 0).collect();
        nodes.dedup();
        nodes.into_iter().map(|n| tables.nodes[n as usize].clone()).collect()
    }

    /// `node`'s part of `topic` is now `members` (`(id, stored member)`, as another node
    /// wrote them; empty: it has none, or it is gone): the members it no longer has leave,
    /// the new ones join, and the subscribers that watch the topic are told of each, leaves
    /// first. A member the budget or the topic's cap cannot hold is left out (counted).
    pub fn sync_node(&self, topic: &str, node: &str, members: &[(String, String)]) {
        if node == &*self.node {
            return;
        }
        let mut joined = Vec::new();
        let mut left = Vec::new();
        {
            let mut tables = self.lock();
            let index = tables.node_index(node);
            let mut wanted: BTreeMap<Key, (&str, Entry)> = BTreeMap::new();
            for (id, stored) in members {
                let Some((event_loop, serial)) = parse_id(id) else { continue };
                let (sub, claims) = parse_stored(stored);
                wanted.insert(
                    Key { node: index, event_loop, serial },
                    (id.as_str(), Entry { sub, claims }),
                );
            }
            let range = Key { node: index, event_loop: 0, serial: 0 }..Key {
                node: index + 1,
                event_loop: 0,
                serial: 0,
            };
            let had: Vec<Key> = tables
                .topics
                .get(topic)
                .map(|m| m.range(range).map(|(k, _)| *k).collect())
                .unwrap_or_default();
            for key in had {
                if !wanted.contains_key(&key)
                    && let Some(entry) = tables.remove(topic, key)
                {
                    left.push((format!("{}.{}", key.event_loop, key.serial), entry));
                }
            }
            for (key, (id, entry)) in wanted {
                let known = tables.topics.get(topic).is_some_and(|m| m.contains_key(&key));
                if known {
                    continue;
                }
                let (sub, claims) = (entry.sub.clone(), entry.claims.clone());
                match tables.insert(topic, key, entry, self.max_per_topic) {
                    Ok(()) => joined.push((id.to_owned(), sub, claims)),
                    Err(PresenceError::TopicFull) => {
                        self.metrics.topic_refusal("presence_topic_full")
                    }
                    Err(PresenceError::NoMemory) => self.metrics.topic_refusal("presence_memory"),
                }
            }
            tables.forget_unused_nodes();
            self.count_in_metrics(&tables);
        }
        let node: Arc<str> = Arc::from(node);
        for (id, entry) in &left {
            self.announce(topic, "leave", id, &node, entry.sub.as_deref(), None);
        }
        for (id, sub, claims) in &joined {
            self.announce(topic, "join", id, &node, sub.as_deref(), claims.as_deref());
        }
    }

    /// Keeps a change for the backplane, if one carries them; past [`CHANGES`] the backplane
    /// is told to read the whole table instead.
    fn record(&self, change: impl FnOnce() -> LocalChange) {
        if !self.carried.load(Ordering::Acquire) {
            return;
        }
        let mut changes = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        match changes.as_mut() {
            Some(list) if list.len() < CHANGES => list.push(change()),
            Some(_) => *changes = None,
            None => {}
        }
    }

    /// Tells the subscribers that watch `topic` of a join or leave.
    fn announce(
        &self,
        topic: &str,
        event: &str,
        id: &str,
        node: &str,
        sub: Option<&str>,
        claims: Option<&str>,
    ) {
        let Some(send) = self.events.get() else { return };
        let mut out = String::with_capacity(96);
        out.push_str(EVENT_PREFIX);
        let _ = write!(out, "{{\"event\":\"{event}\",\"topic\":{},", json_string(topic));
        // The rest is a member's JSON without its opening brace.
        let mut member = String::new();
        member_json(&mut member, id, node, sub, claims);
        out.push_str(&member[1..]);
        send(&watch_topic(topic), out.as_bytes());
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets `freeboard_presence_members` and `freeboard_presence_bytes` from `tables`.
    fn count_in_metrics(&self, tables: &Tables) {
        self.metrics.presence_members.set(tables.members as i64);
        self.metrics.presence_bytes.set(tables.budget.drawn() as i64);
    }
}

impl std::fmt::Debug for Presence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presence")
            .field("node", &self.node)
            .field("prefix", &self.prefix)
            .field("max_per_topic", &self.max_per_topic)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Tables {
    fn insert(
        &mut self,
        topic: &str,
        key: Key,
        entry: Entry,
        max_per_topic: usize,
    ) -> Result<(), PresenceError> {
        let members = self.topics.get(topic);
        if members.is_some_and(|m| m.len() >= max_per_topic) {
            return Err(PresenceError::TopicFull);
        }
        let mut bytes = entry_bytes(&entry);
        if members.is_none() {
            bytes += topic_bytes(topic);
        }
        self.budget.try_draw(bytes).map_err(|_| PresenceError::NoMemory)?;
        let members = match self.topics.get_mut(topic) {
            Some(members) => members,
            None => self.topics.entry(Arc::from(topic)).or_default(),
        };
        match members.insert(key, entry) {
            Some(replaced) => self.budget.give_back(entry_bytes(&replaced)),
            None => self.members += 1,
        }
        Ok(())
    }

    fn remove(&mut self, topic: &str, key: Key) -> Option<Entry> {
        let members = self.topics.get_mut(topic)?;
        let entry = members.remove(&key)?;
        self.budget.give_back(entry_bytes(&entry));
        self.members -= 1;
        if members.is_empty() {
            self.topics.remove(topic);
            self.budget.give_back(topic_bytes(topic));
            if self.topics.capacity() > 64 && self.topics.len() < self.topics.capacity() / 4 {
                self.topics.shrink_to(self.topics.len() * 2);
            }
        }
        Some(entry)
    }

    /// The index of `node`, interned if it is new (a freed slot is reused).
    fn node_index(&mut self, node: &str) -> u32 {
        if let Some(i) = self.nodes.iter().position(|n| &**n == node) {
            return i as u32;
        }
        self.nodes.push(Arc::from(node));
        (self.nodes.len() - 1) as u32
    }

    /// Drops the names of other nodes at the end of the list that have no member left.
    fn forget_unused_nodes(&mut self) {
        while self.nodes.len() > 1 {
            let last = (self.nodes.len() - 1) as u32;
            let used = self.topics.values().any(|m| {
                let range = Key { node: last, event_loop: 0, serial: 0 }..;
                m.range(range).next().is_some()
            });
            if used {
                break;
            }
            self.nodes.pop();
        }
    }
}

/// What presence costs per member of one topic, for `freeboard bench presence`.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// Members joined.
    pub members: usize,
    /// Heap bytes the table took for them, as glibc counts them (`mallinfo2`), per member;
    /// `None` off glibc.
    pub heap_per_member: Option<f64>,
    /// Bytes charged to the presence budget, per member.
    pub charged_per_member: f64,
}

/// Joins `members` connections (two loops, each with a `sub` of `user-N`, no claims) to one
/// topic of a fresh presence and measures what they cost: the heap they took (glibc's count of
/// allocated bytes before and after, this thread the only one allocating meanwhile), and what
/// the budget was charged. Every member then leaves, and the heap must return to where it was.
#[doc(hidden)]
pub fn measure(members: usize) -> Measured {
    let config = TopicsConfig {
        presence_prefix: Some(String::new()),
        presence_max_per_topic: members,
        presence_memory: members * 1024 + (1 << 20),
        ..TopicsConfig::default()
    };
    let presence = Presence::new(&config, Arc::from("n0"), Arc::new(Metrics::new()))
        .expect("presence configured");
    let subs: Vec<String> = (0..members).map(|i| format!("user-{i}")).collect();
    let before = heap_in_use();
    for (serial, sub) in subs.iter().enumerate() {
        let id = ((serial % 2) as u32, serial as u64);
        // NOTE(unwrap): the cap and the budget were sized for them.
        presence.join("room", id, Some(sub), None).unwrap();
    }
    let after = heap_in_use();
    let charged = presence.memory().0;
    for serial in 0..members {
        presence.leave("room", ((serial % 2) as u32, serial as u64));
    }
    Measured {
        members,
        heap_per_member: before
            .zip(after)
            .map(|(b, a)| a.saturating_sub(b) as f64 / members as f64),
        charged_per_member: charged as f64 / members as f64,
    }
}

/// Bytes glibc's malloc has handed out and not taken back.
fn heap_in_use() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let info = unsafe { libc::mallinfo2() };
        Some(info.uordblks)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// Bytes one member costs (see [`ENTRY_BYTES`]); its `sub` and claims on the heap as glibc's
/// malloc lays them out (an `Arc<str>`: two counts and the bytes, with an 8-byte header,
/// rounded up to 16).
fn entry_bytes(entry: &Entry) -> usize {
    let heap =
        |s: &Option<Arc<str>>| s.as_ref().map_or(0, |s| (16 + s.len() + 8).next_multiple_of(16));
    ENTRY_BYTES + heap(&entry.sub) + heap(&entry.claims)
}

/// Bytes a topic costs beyond its members: its name, its entry in the table of topics, its
/// tree's root.
fn topic_bytes(topic: &str) -> usize {
    (16 + topic.len() + 8).next_multiple_of(16) + 64 + 48
}

/// `LOOP.SERIAL`.
fn parse_id(id: &str) -> Option<(u32, u64)> {
    let (event_loop, serial) = id.split_once('.')?;
    Some((event_loop.parse().ok()?, serial.parse().ok()?))
}

/// `NODE.LOOP.SERIAL`, as [`Presence::page`] writes its `next`.
fn parse_cursor(cursor: &str) -> Option<Key> {
    let (node, id) = cursor.split_once('.')?;
    let (event_loop, serial) = parse_id(id)?;
    Some(Key { node: node.parse().ok()?, event_loop, serial })
}

/// What the other nodes store for a member: `{"sub":…,"claims":…}` (each only if present).
fn stored_member(sub: Option<&str>, claims: Option<&str>) -> String {
    let mut out = String::from("{");
    if let Some(sub) = sub {
        let _ = write!(out, "\"sub\":{}", json_string(sub));
    }
    if let Some(claims) = claims {
        if sub.is_some() {
            out.push(',');
        }
        let _ = write!(out, "\"claims\":{claims}");
    }
    out.push('}');
    out
}

/// A stored member read back; claims that are not a JSON object are left out.
fn parse_stored(stored: &str) -> (Option<Arc<str>>, Option<Arc<str>>) {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str(stored) else {
        return (None, None);
    };
    let sub = map.get("sub").and_then(|s| s.as_str()).map(Arc::from);
    let claims = map.get("claims").filter(|c| c.is_object()).map(|c| Arc::from(c.to_string()));
    (sub, claims)
}

/// A member as listed: `{"id":…,"node":…,"sub":…,"claims":…}`.
fn member_json(out: &mut String, id: &str, node: &str, sub: Option<&str>, claims: Option<&str>) {
    let _ = write!(out, "{{\"id\":{},\"node\":{}", json_string(id), json_string(node));
    if let Some(sub) = sub {
        let _ = write!(out, ",\"sub\":{}", json_string(sub));
    }
    if let Some(claims) = claims {
        let _ = write!(out, ",\"claims\":{claims}");
    }
    out.push('}');
}

fn json_string(s: &str) -> String {
    // NOTE(unwrap): a string always serializes.
    serde_json::to_string(s).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn presence(max_per_topic: usize, memory: usize) -> Presence {
        let config = TopicsConfig {
            presence_prefix: Some("room".into()),
            presence_max_per_topic: max_per_topic,
            presence_memory: memory,
            ..TopicsConfig::default()
        };
        Presence::new(&config, Arc::from("here"), Arc::new(Metrics::new())).unwrap()
    }

    fn conn(serial: u64) -> (u32, u64) {
        ((serial % 2) as u32, serial)
    }

    /// Pages list every member once, in order, never more than asked.
    #[test]
    fn pages_list_each_member_once() {
        let p = presence(100_000, 64 << 20);
        for serial in 0..2_500 {
            p.join("room1", conn(serial), Some(&format!("u{serial}")), None).unwrap();
        }
        p.sync_node("room1", "there", &[("0.1".into(), "{\"sub\":\"far\"}".into())]);
        assert_eq!(p.count("room1"), 2_501);
        let (mut seen, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
        loop {
            let page = p.page("room1", cursor.as_deref(), 1000);
            assert!(page.members.len() <= 1000);
            seen.extend(page.members.iter().map(|m| (m.node.to_string(), m.id.clone())));
            pages += 1;
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        assert_eq!(pages, 3);
        assert_eq!(seen.len(), 2_501);
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 2_501);
        assert!(p.page("room2", None, 10).members.is_empty());
    }

    /// The cap and the budget refuse joins; what leaves gives its memory back.
    #[test]
    fn joins_are_held_inside_the_cap_and_the_budget() {
        let p = presence(3, 1 << 20);
        for serial in 0..3 {
            p.join("room1", conn(serial), None, None).unwrap();
        }
        assert_eq!(p.join("room1", conn(9), None, None), Err(PresenceError::TopicFull));
        assert_eq!(p.metrics.presence_members.get(), 3);
        assert_eq!(p.metrics.presence_bytes.get(), p.memory().0 as i64);
        for serial in 0..3 {
            p.leave("room1", conn(serial));
        }
        assert_eq!(p.memory().0, 0);
        assert_eq!((p.metrics.presence_members.get(), p.metrics.presence_bytes.get()), (0, 0));
        let p = presence(1_000_000, 4096);
        let mut joined = 0;
        while p.join("room1", conn(joined), Some("someone"), None).is_ok() {
            joined += 1;
        }
        assert!(joined > 10 && joined < 40, "{joined}");
        let refused = crate::metrics::Reason { reason: "presence_memory".into() };
        assert_eq!(p.metrics.topic_refusals.get_or_create(&refused).get(), 1);
    }

    /// What the budget is charged per member is what the heap holds for it (`freeboard bench
    /// presence` compares the two with glibc's count): at 10,000 members of one topic, within
    /// the 200 bytes each the design allows.
    #[test]
    fn ten_thousand_members_are_charged_under_200_bytes_each() {
        let measured = measure(10_000);
        assert!(measured.charged_per_member <= 200.0, "{measured:?}");
        assert!(measured.charged_per_member >= 128.0, "{measured:?}: an entry and a sub at least");
    }

    /// A node's part replaced: leaves for what it lost, joins for what it gained, in order.
    #[test]
    fn another_nodes_part_is_synced_with_events() {
        let p = presence(100, 1 << 20);
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        p.set_events(Box::new(move |topic, payload| {
            sink.lock()
                .unwrap()
                .push((topic.to_owned(), String::from_utf8(payload.to_vec()).unwrap()));
        }));
        let a = ("0.1".to_owned(), "{\"sub\":\"a\",\"claims\":{\"n\":1}}".to_owned());
        let b = ("0.2".to_owned(), "{}".to_owned());
        p.sync_node("room1", "there", &[a.clone(), b]);
        p.sync_node("room1", "there", std::slice::from_ref(&a));
        p.sync_node("room1", "there", &[]);
        let events = events.lock().unwrap();
        let kinds: Vec<&str> = events
            .iter()
            .map(|(t, e)| {
                assert_eq!(t, "room1/presence");
                assert!(e.starts_with(EVENT_PREFIX), "{e}");
                if e.contains("\"join\"") { "join" } else { "leave" }
            })
            .collect();
        assert_eq!(kinds, ["join", "join", "leave", "leave"]);
        assert!(
            events[0].1.contains(r#""id":"0.1","node":"there","sub":"a","claims":{"n":1}"#),
            "{}",
            events[0].1
        );
        assert_eq!(p.count("room1"), 0);
        assert_eq!(p.memory().0, 0);
    }
}
