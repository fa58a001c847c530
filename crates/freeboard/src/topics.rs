//! Pub/sub topics with zero-copy fan-out.
//!
//! A connection subscribes with [`Conn::subscribe`](crate::Conn::subscribe); a message is
//! published with [`Conn::publish`](crate::Conn::publish) from a handler or with
//! [`ServerHandle::publish`](crate::ServerHandle::publish) from any thread.
//!
//! # How a publish travels
//!
//! - **On the publisher's loop** the message is framed once into the loop's pool (a
//!   [`Frame`]) and every local subscriber's send queue gets a reference to it (~25 ns each,
//!   no copy), right after the handler returns — after the last message of the same read,
//!   for publishes from `on_message`, so that each subscriber takes a read's publications in
//!   one go.
//! - **To other loops** it is framed once more into one [`SharedFrame`] (`Arc<[u8]>`), sent
//!   over each loop's bounded inbox (a channel plus a mio `Waker`, woken once per batch), and
//!   copied into that loop's pool once, then fanned out by reference. Only loops that have a
//!   subscriber to the topic get it.
//! - **With no subscriber anywhere** a publish costs a hash look-up and no pool memory.
//!
//! Each subscriber sees one publisher's messages on a topic in publish order: a loop fans out
//! its own publishes in order, and each inbox is FIFO. A slow subscriber never delays the
//! others: its queue's [`SlowConsumerPolicy`](crate::SlowConsumerPolicy) decides alone, and every
//! drop is counted (`drops_total{reason=<policy>}`; `topic_drops_total{reason=inbox_full|pool}` for a
//! publish a whole loop could not take). Under `block` a subscriber's publisher cannot be
//! paused, so a refused message counts as a `block` drop.
//!
//! # Costs
//!
//! Subscribe and unsubscribe are O(1) in the number of subscribers (a slab per topic and a
//! list per connection, linear only in that connection's own topics, at most
//! [`TopicsConfig::max_topics_per_connection`](crate::config::TopicsConfig)). A connection's
//! subscriptions go when it closes. A loop's inbox holds at most
//! [`TopicsConfig::inbox`](crate::config::TopicsConfig) publications; its `SharedFrame`s are
//! the one allocation outside the pool's budget, bounded by that count times
//! `max_message_size`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use freeboard_buf::{Frame, Pool, SharedFrame};
use freeboard_proto::frame::FrameHeader;
use freeboard_proto::{MessageKind, OpCode};
use mio::Waker;
use slab::Slab;

use crate::backplane::{Backplane, Incoming, Recoverer};
use crate::history::{Envelope, History, Recovery, Source};
use crate::metrics::Metrics;

/// The longest topic name, in bytes.
pub const MAX_TOPIC_LEN: usize = 128;

/// What a publish reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    /// Event loops that took the message for their subscribers (the publisher's own loop
    /// included when it has subscribers).
    pub loops: u32,
    /// Event loops with subscribers that could not take it (inbox full, or no pool chunk for
    /// the frame); counted in `topic_drops`.
    pub dropped: u32,
    /// With a Redis backplane: publications queued towards Redis for the other nodes (and,
    /// for a topic whose history Redis keeps, for this node too: its loops then count 0
    /// here and get it back from Redis with its offset).
    pub redis: u32,
    /// With a Redis backplane: publications its full queue could not take (counted in
    /// `backplane_lost_total{reason="queue_full"}`).
    pub redis_lost: u32,
}

/// How many subscribers a publication reached, and for how many it was dropped (by their
/// slow-consumer policy, or by closing them 1008).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    /// Subscribers whose send queue took the message.
    pub delivered: u64,
    /// Subscribers for whom it was dropped (counted by their policy).
    pub dropped: u64,
}

impl std::ops::AddAssign for Reach {
    fn add_assign(&mut self, other: Self) {
        self.delivered += other.delivered;
        self.dropped += other.dropped;
    }
}

/// Why [`Conn::subscribe`](crate::Conn::subscribe) refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscribeError {
    /// The name is empty, longer than [`MAX_TOPIC_LEN`], or not made of `A-Z a-z 0-9 - . _ ~ :`.
    InvalidName,
    /// The connection has as many topics as
    /// [`TopicsConfig::max_topics_per_connection`](crate::config::TopicsConfig) allows.
    TooManyTopics,
    /// The server has as many topics (with a subscriber) as
    /// [`TopicsConfig::max_topics`](crate::config::TopicsConfig) allows.
    TooManyTopicsOnServer,
    /// A client connection of the tokio driver: publications are framed once, unmasked, for
    /// the server connections that subscribe.
    ClientConnection,
}

impl std::fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SubscribeError::InvalidName => "invalid topic name",
            SubscribeError::TooManyTopics => "too many topics for one connection",
            SubscribeError::TooManyTopicsOnServer => "too many topics on this server",
            SubscribeError::ClientConnection => "a client connection cannot subscribe",
        })
    }
}

impl std::error::Error for SubscribeError {}

/// Whether `name` can name a topic: 1 to [`MAX_TOPIC_LEN`] bytes of `A-Z a-z 0-9 - . _ ~ :`
/// (characters that need no escaping in a URL path or query).
pub fn valid_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOPIC_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~:".contains(&b))
}

/// The topics named by a request target under `prefix`: `/topic/{name}?also=a&also=b` gives
/// `name`, `a`, `b` (other query keys are ignored). `None` if the path is not under the prefix
/// or a name is invalid.
pub fn topics_in_target<'t>(prefix: &str, target: &'t str) -> Option<Vec<&'t str>> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let first = path.strip_prefix(prefix)?;
    let also = query.split('&').filter_map(|pair| pair.strip_prefix("also="));
    let names: Vec<&str> = std::iter::once(first).chain(also).collect();
    names.iter().all(|n| valid_topic(n)).then_some(names)
}

/// A server-to-client frame header for a whole message of `len` bytes.
pub(crate) fn header(kind: MessageKind, len: usize) -> ([u8; 14], usize) {
    let opcode = match kind {
        MessageKind::Text => OpCode::Text,
        MessageKind::Binary => OpCode::Binary,
    };
    let mut out = [0u8; 14];
    let header = FrameHeader { fin: true, rsv: 0, opcode, mask: None, payload_len: len as u64 };
    // NOTE(unwrap): an unmasked header is at most 10 bytes.
    let n = header.encode(&mut out).unwrap();
    (out, n)
}

/// How a publication to a topic is framed: its WebSocket header, and the envelope with its
/// offset if the topic keeps history.
pub(crate) struct Stamp {
    head: [u8; 14],
    head_len: usize,
    envelope: Option<Envelope>,
}

impl Stamp {
    /// The frame's parts around `payload`.
    pub(crate) fn parts<'p>(&'p self, payload: &'p [u8]) -> [&'p [u8]; 3] {
        let envelope = self.envelope.as_ref().map_or(&[][..], Envelope::as_bytes);
        [&self.head[..self.head_len], envelope, payload]
    }
}

/// A publication on its way to another loop.
pub(crate) struct Publication {
    pub(crate) topic: Arc<str>,
    pub(crate) frame: SharedFrame,
    /// Where the loop reports what its subscribers made of it (an HTTP publish's answer).
    pub(crate) receipt: Option<Arc<Receipt>>,
}

/// What the other loops' subscribers made of a publish: each loop handed a copy adds its
/// counts; the last report tells the publisher (`notify`). The publisher holds one count of
/// `waiting` until it has handed out every copy, so an early report cannot finish it.
pub(crate) struct Receipt {
    delivered: AtomicU64,
    dropped: AtomicU64,
    waiting: AtomicU32,
    notify: Box<dyn Fn() + Send + Sync>,
}

impl Receipt {
    pub(crate) fn new(notify: impl Fn() + Send + Sync + 'static) -> Self {
        Self {
            delivered: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            waiting: AtomicU32::new(1),
            notify: Box::new(notify),
        }
    }

    /// A loop reports: `delivered` subscribers took the message, it was dropped for
    /// `dropped`. The last report notifies the publisher.
    pub(crate) fn report(&self, delivered: u64, dropped: u64) {
        self.delivered.fetch_add(delivered, Ordering::Relaxed);
        self.dropped.fetch_add(dropped, Ordering::Relaxed);
        if self.waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
            (self.notify)();
        }
    }

    /// The publisher has handed out every copy; whether every loop has reported already (then
    /// nobody is notified).
    pub(crate) fn release(&self) -> bool {
        self.waiting.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Subscribers reached and dropped so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.delivered.load(Ordering::Acquire), self.dropped.load(Ordering::Acquire))
    }
}

/// One loop's inbox, as other threads see it: an unbounded channel (its blocks are allocated as
/// publications arrive and freed as the loop takes them, so an idle server holds none) bounded
/// by a count.
struct Inbox {
    tx: Sender<Publication>,
    /// Publications sent and not yet taken by the loop.
    ///
    /// Invariant: at most the hub's `capacity` (a sender that would pass it drops instead).
    queued: AtomicUsize,
    waker: Arc<Waker>,
    /// Set by a publisher after sending, cleared by the loop before draining: one wake per
    /// batch instead of one `eventfd` write per publish.
    pending: AtomicBool,
}

/// The topic state every loop shares: which loops have subscribers to which topic, and each
/// loop's inbox.
pub(crate) struct Hub {
    /// Invariant: a topic is here iff some loop has a subscriber to it; its set names exactly
    /// those loops.
    loops_by_topic: RwLock<HashMap<Arc<str>, LoopSet>>,
    /// Topics with a subscriber the server may have at once.
    max_topics: usize,
    inboxes: Vec<Inbox>,
    /// Publications one inbox holds.
    capacity: usize,
    receivers: Mutex<Vec<Option<Receiver<Publication>>>>,
    metrics: Arc<Metrics>,
    /// The Redis backplane, if one is configured: told when a topic gets its first subscriber
    /// on this node and loses its last, and given every publication of this node.
    backplane: OnceLock<Backplane>,
    /// Offsets and kept messages of the topics that keep history, if configured.
    history: Option<Arc<History>>,
}

impl Hub {
    pub(crate) fn new(
        wakers: &[Arc<Waker>],
        capacity: usize,
        max_topics: usize,
        history: Option<Arc<History>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (inboxes, receivers) = wakers
            .iter()
            .map(|waker| {
                let (tx, rx) = std::sync::mpsc::channel();
                let queued = AtomicUsize::new(0);
                (
                    Inbox { tx, queued, waker: waker.clone(), pending: AtomicBool::new(false) },
                    Some(rx),
                )
            })
            .unzip();
        Self {
            loops_by_topic: RwLock::new(HashMap::new()),
            max_topics,
            inboxes,
            capacity,
            receivers: Mutex::new(receivers),
            metrics,
            backplane: OnceLock::new(),
            history,
        }
    }

    /// Frames a publication of this node to `topic`: records it in the topic's history (which
    /// gives it its offset), if the topic keeps one.
    pub(crate) fn stamp(&self, topic: &str, kind: MessageKind, payload: &[u8]) -> Stamp {
        let envelope = self
            .history
            .as_ref()
            .filter(|h| h.source() == Source::Memory && h.applies(topic))
            .map(|h| h.record(topic, kind, payload));
        let len = envelope.as_ref().map_or(0, |e| e.as_bytes().len()) + payload.len();
        let (head, head_len) = header(kind, len);
        Stamp { head, head_len, envelope }
    }

    /// The bytes `topic`'s messages carry in front of their payload (an offset's envelope
    /// when the topic keeps history; at most this many).
    pub(crate) fn envelope_room(&self, topic: &str) -> usize {
        let kept = self.history.as_ref().is_some_and(|h| h.applies(topic));
        if kept { crate::history::Envelope::MAX } else { 0 }
    }

    /// What a subscriber of `topic` that last saw offset `since` missed (nothing if the topic
    /// keeps no history).
    pub(crate) fn recover(&self, topic: &str, since: &str) -> Recovery {
        match &self.history {
            Some(history) if history.applies(topic) => history.recover(topic, since),
            _ => Recovery::Missed(Vec::new()),
        }
    }

    /// Attaches the Redis backplane (before any loop runs).
    pub(crate) fn attach_backplane(&self, backplane: Backplane) {
        let _ = self.backplane.set(backplane);
    }

    /// The topic history, if configured.
    pub(crate) fn history(&self) -> Option<&Arc<History>> {
        self.history.as_ref()
    }

    /// Where upgrades with `?since=` go to have history fetched from Redis, if it is kept
    /// there.
    pub(crate) fn recoverer(&self) -> Option<Recoverer> {
        self.backplane.get()?.recoverer.clone()
    }

    /// Whether a publication to `topic` goes to Redis first, to be kept in its stream and
    /// delivered to every node, this one too, with the offset Redis gives it.
    pub(crate) fn kept_in_redis(&self, topic: &str) -> bool {
        self.history.as_ref().is_some_and(|h| h.source() == Source::Redis && h.applies(topic))
            && self.backplane.get().is_some()
    }

    /// Sends a publication of this node to the other nodes, if there is a backplane, and
    /// counts it in `published` as queued towards Redis or lost.
    pub(crate) fn send_to_backplane(
        &self,
        topic: &str,
        kind: MessageKind,
        payload: &[u8],
        published: &mut Published,
    ) {
        if let Some(backplane) = self.backplane.get() {
            if backplane.publish(topic, kind, payload, self.kept_in_redis(topic)) {
                published.redis += 1;
            } else {
                published.redis_lost += 1;
            }
        }
    }

    /// Whether publications go through Redis to other nodes.
    pub(crate) fn has_backplane(&self) -> bool {
        self.backplane.get().is_some()
    }

    /// Delivers a publication from Redis to every loop of this node that has a subscriber to
    /// its topic (keeping it in the topic's ring if it carries an offset).
    pub(crate) fn deliver_from_backplane(&self, incoming: Incoming<'_>) {
        let Incoming { topic, kind, data, offset } = incoming;
        if let (Some(offset), Some(history)) = (offset, &self.history) {
            history.record_at(topic, offset, kind, data);
        }
        let (head, n) = header(kind, data.len());
        let mut published = Published::default();
        self.publish_remote(topic, &[&head[..n], data], None, &mut published, None);
    }

    /// Loop `index`'s end of its inbox (once).
    pub(crate) fn take_receiver(&self, index: u32) -> Option<Receiver<Publication>> {
        let mut receivers = self.receivers.lock().unwrap_or_else(|e| e.into_inner());
        receivers.get_mut(index as usize)?.take()
    }

    /// Clears loop `index`'s pending flag; call before draining its inbox.
    pub(crate) fn begin_drain(&self, index: u32) {
        self.inboxes[index as usize].pending.store(false, Ordering::Release);
    }

    /// The next publication in loop `index`'s inbox (`receiver`, its end), if any.
    pub(crate) fn receive(
        &self,
        index: u32,
        receiver: &Receiver<Publication>,
    ) -> Option<Publication> {
        let publication = receiver.try_recv().ok()?;
        self.inboxes[index as usize].queued.fetch_sub(1, Ordering::AcqRel);
        Some(publication)
    }

    /// Sends the message to every loop but `except` that has a subscriber to `topic`, framed
    /// once for all of them.
    pub(crate) fn publish_remote(
        &self,
        topic: &str,
        parts: &[&[u8]],
        except: Option<u32>,
        published: &mut Published,
        receipt: Option<&Arc<Receipt>>,
    ) {
        let map = self.loops_by_topic.read().unwrap_or_else(|e| e.into_inner());
        let Some((name, loops)) = map.get_key_value(topic) else { return };
        let mut frame = None;
        for index in loops.iter().filter(|&i| Some(i) != except) {
            let frame = frame.get_or_insert_with(|| SharedFrame::from_parts(parts));
            let inbox = &self.inboxes[index as usize];
            let receipt = receipt.inspect(|r| {
                // Counted before the loop can see it, so its report cannot come first.
                r.waiting.fetch_add(1, Ordering::AcqRel);
            });
            let publication = Publication {
                topic: name.clone(),
                frame: frame.clone(),
                receipt: receipt.cloned(),
            };
            let room = inbox.queued.fetch_add(1, Ordering::AcqRel) < self.capacity;
            if !room {
                inbox.queued.fetch_sub(1, Ordering::AcqRel);
            }
            match room.then(|| inbox.tx.send(publication)) {
                Some(Ok(())) => {
                    published.loops += 1;
                    if !inbox.pending.swap(true, Ordering::AcqRel) {
                        let _ = inbox.waker.wake();
                    }
                }
                refused => {
                    if refused.is_some() {
                        inbox.queued.fetch_sub(1, Ordering::AcqRel); // the loop is gone
                    }
                    published.dropped += 1;
                    self.metrics.topic_drop("inbox_full");
                    if let Some(r) = receipt {
                        // The publisher's hold keeps this above zero.
                        r.waiting.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
        }
    }

    /// Records that loop `index` has a subscriber to `topic`; `false` (nothing recorded) if
    /// the topic is new and the server already has `max_topics`.
    fn add_loop(&self, topic: &Arc<str>, index: u32) -> bool {
        let mut map = self.loops_by_topic.write().unwrap_or_else(|e| e.into_inner());
        if map.len() >= self.max_topics && !map.contains_key(topic) {
            return false;
        }
        let loops = map.entry(topic.clone()).or_default();
        if loops.is_empty()
            && let Some(backplane) = self.backplane.get()
        {
            // Told under the lock, so the backplane sees changes in the order they happen.
            backplane.subscribe(topic);
        }
        loops.insert(index);
        true
    }

    fn remove_loop(&self, topic: &str, index: u32) {
        let mut map = self.loops_by_topic.write().unwrap_or_else(|e| e.into_inner());
        if let Some(loops) = map.get_mut(topic) {
            loops.remove(index);
            if loops.is_empty()
                && let Some((name, _)) = map.remove_entry(topic)
                && let Some(backplane) = self.backplane.get()
            {
                backplane.unsubscribe(&name);
            }
        }
    }
}

/// A set of loop indices, one bit each.
#[derive(Debug, Default)]
struct LoopSet(Vec<u64>);

impl LoopSet {
    fn insert(&mut self, i: u32) {
        let (word, bit) = (i as usize / 64, i % 64);
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << bit;
    }

    fn remove(&mut self, i: u32) {
        if let Some(word) = self.0.get_mut(i as usize / 64) {
            *word &= !(1 << (i % 64));
        }
    }

    fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().enumerate().flat_map(|(w, bits)| {
            (0..64).filter(move |b| bits & (1 << b) != 0).map(move |b| (w * 64 + b) as u32)
        })
    }
}

/// A loop's own publishes waiting for their fan-out (all of a read's messages are handled
/// first, so that each subscriber takes a run of them at once), with the subscription
/// changes made while they wait: each publication still reaches exactly the connections
/// subscribed to its topic when it was published.
#[derive(Default)]
pub(crate) struct Outbox {
    /// In publish order.
    pub(crate) publications: Vec<(Arc<str>, Frame)>,
    /// In the order they were made; only while `publications` is not empty.
    changes: Vec<Change>,
}

/// Connection `token` subscribed to `topic` (or left it) after the first `at` publications.
struct Change {
    token: usize,
    topic: Arc<str>,
    subscribed: bool,
    at: usize,
}

impl Outbox {
    pub(crate) fn is_empty(&self) -> bool {
        self.publications.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.publications.len()
    }

    /// Notes that `token` subscribed to `topic` (or left it), if publications are waiting.
    pub(crate) fn subscription_changed(&mut self, token: usize, topic: &str, subscribed: bool) {
        let at = self.publications.len();
        if at > 0 {
            self.changes.push(Change { token, topic: Arc::from(topic), subscribed, at });
        }
    }

    /// Whether subscriptions to `topic` changed while its publications waited.
    pub(crate) fn changed(&self, topic: &str) -> bool {
        self.changes.iter().any(|c| &*c.topic == topic)
    }

    /// Connections that left `topic` while its publications waited, and are still out.
    pub(crate) fn leavers<'o>(&'o self, topic: &'o str) -> impl Iterator<Item = usize> + 'o {
        let mine = move |c: &Change| &*c.topic == topic;
        let later = move |i: usize, token| {
            self.changes[i + 1..].iter().any(|e| mine(e) && e.token == token)
        };
        let left = self.changes.iter().enumerate();
        left.filter(move |(i, c)| mine(c) && !c.subscribed && !later(*i, c.token))
            .map(|(_, c)| c.token)
    }

    /// Whether `token` — subscribed to `topic` now, or one of its [`leavers`](Self::leavers) —
    /// was subscribed when publication `k` was made.
    pub(crate) fn subscribed_at(&self, token: usize, topic: &str, k: usize) -> bool {
        let mut mine = self.changes.iter().filter(|c| c.token == token && &*c.topic == topic);
        let Some(first) = mine.next() else { return true };
        let before = if first.at <= k { first.subscribed } else { !first.subscribed };
        mine.take_while(|c| c.at <= k).last().map_or(before, |c| c.subscribed)
    }

    /// Empties the outbox, giving back its frames.
    pub(crate) fn clear(&mut self, pool: &mut Pool<'static>) {
        for (_, frame) in self.publications.drain(..) {
            frame.release(pool);
        }
        self.changes.clear();
    }
}

/// One loop's topics: subscribers by topic, topics by connection.
pub(crate) struct LocalTopics {
    index: u32,
    /// Invariant: names exactly the topics in `topics`, each of which has a subscriber.
    by_name: HashMap<Arc<str>, usize>,
    topics: Slab<Topic>,
    /// Per connection token with subscriptions: `(topic, key in the topic's subscribers)`.
    by_conn: HashMap<usize, Vec<(usize, usize)>>,
    max_per_conn: usize,
}

struct Topic {
    name: Arc<str>,
    /// Connection tokens.
    subscribers: Slab<usize>,
}

impl LocalTopics {
    pub(crate) fn new(index: u32, max_per_conn: usize) -> Self {
        Self {
            index,
            by_name: HashMap::new(),
            topics: Slab::new(),
            by_conn: HashMap::new(),
            max_per_conn,
        }
    }

    /// Subscribes connection `token`; `Ok(false)` if it already was.
    pub(crate) fn subscribe(
        &mut self,
        hub: &Hub,
        token: usize,
        name: &str,
    ) -> Result<bool, SubscribeError> {
        if !valid_topic(name) {
            return Err(SubscribeError::InvalidName);
        }
        let existing = self.by_name.get(name).copied();
        let mine = self.by_conn.get(&token).map_or(&[][..], Vec::as_slice);
        if let Some(topic) = existing
            && mine.iter().any(|(t, _)| *t == topic)
        {
            return Ok(false);
        }
        if mine.len() >= self.max_per_conn {
            hub.metrics.topic_refusal("connection_topics");
            return Err(SubscribeError::TooManyTopics);
        }
        let topic = match existing {
            Some(topic) => topic,
            None => {
                let name: Arc<str> = Arc::from(name);
                if !hub.add_loop(&name, self.index) {
                    hub.metrics.topic_refusal("server_topics");
                    return Err(SubscribeError::TooManyTopicsOnServer);
                }
                let topic =
                    self.topics.insert(Topic { name: name.clone(), subscribers: Slab::new() });
                self.by_name.insert(name, topic);
                topic
            }
        };
        let key = self.topics[topic].subscribers.insert(token);
        self.by_conn.entry(token).or_default().push((topic, key));
        hub.metrics.subscriptions.inc();
        Ok(true)
    }

    /// Unsubscribes connection `token`; whether it was subscribed.
    pub(crate) fn unsubscribe(&mut self, hub: &Hub, token: usize, name: &str) -> bool {
        let Some(&topic) = self.by_name.get(name) else { return false };
        let Some(mine) = self.by_conn.get_mut(&token) else { return false };
        let Some(at) = mine.iter().position(|(t, _)| *t == topic) else { return false };
        let (_, key) = mine.swap_remove(at);
        if mine.is_empty() {
            self.by_conn.remove(&token);
        }
        self.leave(hub, topic, key);
        true
    }

    /// Drops every subscription of connection `token` (it is closing).
    pub(crate) fn drop_conn(&mut self, hub: &Hub, token: usize) {
        let Some(mine) = self.by_conn.remove(&token) else { return };
        for (topic, key) in mine {
            self.leave(hub, topic, key);
        }
    }

    /// The topics connection `token` is subscribed to, in subscription order until an
    /// unsubscribe.
    pub(crate) fn topics_of(&self, token: usize) -> impl Iterator<Item = &str> {
        let mine = self.by_conn.get(&token).map_or(&[][..], Vec::as_slice);
        mine.iter().map(|(t, _)| &*self.topics[*t].name)
    }

    /// The first topic connection `token` subscribed to (shared, not copied).
    pub(crate) fn first_topic_of(&self, token: usize) -> Option<Arc<str>> {
        let (topic, _) = self.by_conn.get(&token)?.first()?;
        Some(self.topics[*topic].name.clone())
    }

    /// The local subscribers of `name`, as connection tokens.
    pub(crate) fn subscribers(&self, name: &str) -> Option<&Slab<usize>> {
        self.by_name.get(name).map(|&t| &self.topics[t].subscribers)
    }

    /// Publishes from this loop: framed once into `pool` for local subscribers (queued in
    /// `outbox` for the loop to fan out), once as a
    /// [`SharedFrame`] for other loops with subscribers (each reporting to `receipt`, if
    /// given, what its subscribers made of it).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn publish(
        &mut self,
        hub: &Hub,
        pool: &mut Pool<'static>,
        outbox: &mut Outbox,
        topic: &str,
        kind: MessageKind,
        payload: &[u8],
        receipt: Option<&Arc<Receipt>>,
    ) -> Published {
        hub.metrics.publishes.inc();
        let mut published = Published::default();
        if hub.kept_in_redis(topic) {
            // Delivered here too once Redis has kept it, with its offset.
            hub.send_to_backplane(topic, kind, payload, &mut published);
            return published;
        }
        let stamp = hub.stamp(topic, kind, payload);
        let parts = stamp.parts(payload);
        if let Some(&t) = self.by_name.get(topic) {
            match Frame::from_parts(pool, &parts) {
                Ok(frame) => {
                    outbox.publications.push((self.topics[t].name.clone(), frame));
                    published.loops += 1;
                }
                Err(_) => {
                    published.dropped += 1;
                    hub.metrics.topic_drop("pool");
                }
            }
        }
        hub.publish_remote(topic, &parts, Some(self.index), &mut published, receipt);
        hub.send_to_backplane(topic, kind, payload, &mut published);
        published
    }

    fn leave(&mut self, hub: &Hub, topic: usize, key: usize) {
        hub.metrics.subscriptions.dec();
        let t = &mut self.topics[topic];
        t.subscribers.remove(key);
        if t.subscribers.is_empty() {
            let t = self.topics.remove(topic);
            self.by_name.remove(&t.name);
            hub.remove_loop(&t.name, self.index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_name_their_topics() {
        assert_eq!(topics_in_target("/topic/", "/topic/scores"), Some(vec!["scores"]));
        assert_eq!(
            topics_in_target("/topic/", "/topic/a?also=b&x=1&also=c"),
            Some(vec!["a", "b", "c"])
        );
        assert_eq!(topics_in_target("/topic/", "/topic/"), None);
        assert_eq!(topics_in_target("/topic/", "/topic/a/b"), None);
        assert_eq!(topics_in_target("/topic/", "/topic/a?also="), None);
        assert_eq!(topics_in_target("/topic/", "/other/a"), None);
    }

    #[test]
    fn loop_sets_hold_any_index() {
        let mut set = LoopSet::default();
        for i in [0, 3, 63, 64, 130] {
            set.insert(i);
        }
        set.remove(3);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![0, 63, 64, 130]);
        for i in [0, 63, 64, 130] {
            set.remove(i);
        }
        assert!(set.is_empty());
    }

    #[test]
    fn headers_are_minimal_and_unmasked() {
        assert_eq!(
            header(MessageKind::Text, 5),
            ([0x81, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 2)
        );
        assert_eq!(header(MessageKind::Binary, 1024).1, 4);
        assert_eq!(header(MessageKind::Binary, 1 << 20).1, 10);
    }
}
