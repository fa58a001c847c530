//! Per-topic history, for a subscriber that reconnects to get what it missed.
//!
//! With [`TopicsConfig::history`](crate::config::TopicsConfig) set, every publication to a topic
//! whose name starts with `history_prefix` gets an **offset** and is kept in a bounded
//! in-memory ring: the last `history` messages of the topic, none older than `history_seconds`
//! (if set), all topics' rings together within `history_memory` bytes (the oldest message of
//! the server goes first).
//!
//! # What a subscriber sees
//!
//! A message of such a topic is delivered with its offset in front, an envelope of ASCII
//! digits (text stays valid UTF-8):
//!
//! ```text
//! {epoch}-{sequence}:{payload}        e.g.  1763935200123-42:{"price":101.5}
//! ```
//!
//! `epoch` is when the server started (ms since 1970), `sequence` counts the server's
//! publications to history topics; a client keeps the last offset it saw, as an opaque token.
//! Topics outside the prefix are delivered as published, without an envelope.
//!
//! # Recovery
//!
//! A client that reconnects with `?since=OFFSET` on `/topic/{name}` first gets, in offset
//! order and in the same envelope, every message of `name` after `OFFSET` that the ring still
//! holds, then the live stream. If the ring has lost some of them (evicted by count, age or
//! memory; a restarted server; an offset this server never issued) the connection is closed
//! with [`HISTORY_GONE`] (4410) instead, and the client starts afresh without `since`. A
//! message published while the replay is read may arrive twice; its offset tells.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use freeboard_proto::{CloseCode, MessageKind};

/// The close code telling a client that reconnected with `?since=` that the messages it
/// missed are no longer kept: it starts afresh without `since`.
pub const HISTORY_GONE: CloseCode = CloseCode(4410);

/// Bytes each kept message costs beyond its payload (entry, eviction order, envelope).
const ENTRY_OVERHEAD: usize = 96;

/// A publication's offset, `{a}-{b}`, ordered as a pair: `(server epoch, sequence)` in
/// memory, what the backplane numbers it with otherwise (a Redis stream entry ID:
/// `(ms, sequence)`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Offset(pub u64, pub u64);

impl Offset {
    /// `a-b` in decimal.
    pub fn parse(text: &str) -> Option<Self> {
        let (a, b) = text.split_once('-')?;
        Some(Offset(a.parse().ok()?, b.parse().ok()?))
    }
}

impl std::fmt::Display for Offset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// Where offsets come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// This server numbers its publications: `(epoch, sequence)`.
    Memory,
    /// The backplane numbers them (it keeps the history); the rings hold what this node
    /// received while subscribed, and what was fetched for a reconnecting subscriber.
    Backplane,
}

/// The server's topic history: offsets and the bounded rings.
pub struct History {
    prefix: String,
    messages: usize,
    max_age: Option<Duration>,
    memory: usize,
    source: Source,
    /// The offset epoch in memory: when this server started, in ms since 1970.
    epoch: u64,
    state: Mutex<State>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("prefix", &self.prefix)
            .field("messages", &self.messages)
            .field("max_age", &self.max_age)
            .field("memory", &self.memory)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

struct State {
    /// The next sequence number (in memory).
    next: u64,
    rings: HashMap<Arc<str>, Ring>,
    /// Every kept message's topic and offset, in the order they were kept (the memory
    /// limit's eviction order); entries already gone by count or age are skipped when reached.
    order: VecDeque<(Arc<str>, Offset)>,
    /// Invariant: the bytes (with [`ENTRY_OVERHEAD`]) of every ring's entries.
    bytes: usize,
    /// Invariant: the number of every ring's entries.
    kept: usize,
    /// The highest offset a topic whose ring was dropped has lost, so a `since` on a topic
    /// without a ring can be told whether it missed something (a new ring in memory starts
    /// from it: a topic may have lost that much).
    forgotten: Offset,
}

struct Ring {
    /// Invariant: sorted by offset, no offset twice.
    entries: VecDeque<Entry>,
    /// The ring holds every message of its topic after this offset, but for those up to
    /// `lost`; `None`: it vouches for nothing (with a backplane, until a [`fill`](History::fill)).
    since: Option<Offset>,
    /// Invariant: the highest offset of the topic dropped from the ring (by count, age or
    /// memory, or too large to keep).
    lost: Offset,
    /// The highest offset of the topic this ring knows was issued (a `since` past it is not
    /// one of the topic's).
    newest: Offset,
}

struct Entry {
    offset: Offset,
    at: Instant,
    kind: MessageKind,
    /// Envelope and payload, as delivered.
    data: Box<[u8]>,
}

/// An offset's envelope, `{a}-{b}:`, ready to go before a payload.
pub(crate) struct Envelope {
    bytes: [u8; Envelope::MAX],
    len: usize,
}

impl Envelope {
    /// The longest envelope: two u64 in decimal, a dash and a colon.
    pub(crate) const MAX: usize = 42;

    fn new(offset: Offset) -> Self {
        use std::io::Write;
        let mut bytes = [0u8; Self::MAX];
        let mut out = &mut bytes[..];
        // NOTE(unwrap): two u64 in decimal, a dash and a colon take at most MAX bytes.
        write!(out, "{offset}:").unwrap();
        let len = Self::MAX - out.len();
        Envelope { bytes, len }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// What a reconnecting subscriber missed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Replay {
    /// These messages (envelope included), in offset order; maybe none.
    Missed(Vec<(MessageKind, Box<[u8]>)>),
    /// Some are no longer kept (or the offset is not one of this server's).
    Gone,
}

impl History {
    /// The history of topics named `prefix…` (every topic if empty): at most `messages` per
    /// topic, none older than `max_age`, within `memory` bytes in all.
    pub(crate) fn new(
        prefix: &str,
        messages: usize,
        max_age: Option<Duration>,
        memory: usize,
        source: Source,
    ) -> Self {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Self {
            prefix: prefix.to_owned(),
            messages,
            max_age,
            memory,
            source,
            epoch,
            state: Mutex::new(State {
                next: 1,
                rings: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
                kept: 0,
                forgotten: Offset::default(),
            }),
        }
    }

    /// Whether `topic`'s publications carry offsets and are kept.
    pub fn applies(&self, topic: &str) -> bool {
        topic.starts_with(&self.prefix)
    }

    /// Where offsets come from.
    pub fn source(&self) -> Source {
        self.source
    }

    /// The most messages a topic keeps.
    pub fn messages(&self) -> usize {
        self.messages
    }

    /// The oldest a kept message may be, if limited.
    pub fn max_age(&self) -> Option<Duration> {
        self.max_age
    }

    /// In memory: gives a publication to `topic` (which [`applies`](Self::applies)) its
    /// offset and keeps it; the envelope to deliver before the payload.
    pub(crate) fn record(&self, topic: &str, kind: MessageKind, payload: &[u8]) -> Envelope {
        let mut state = self.lock();
        let offset = Offset(self.epoch, state.next);
        state.next += 1;
        let envelope = Envelope::new(offset);
        let data = [envelope.as_bytes(), payload].concat().into_boxed_slice();
        self.keep(&mut state, topic, offset, kind, data);
        envelope
    }

    /// With a backplane: keeps a message of `topic` that arrived with `offset`, `data` being its
    /// envelope and payload.
    pub(crate) fn record_at(&self, topic: &str, offset: Offset, kind: MessageKind, data: &[u8]) {
        let mut state = self.lock();
        self.keep(&mut state, topic, offset, kind, data.into());
    }

    /// With a backplane: keeps what was fetched for a subscriber that last saw `since` (every
    /// message of the topic after it, `data` with envelopes, up to `newest`, the stream's
    /// last), while this node was already subscribed: the ring then holds every message after
    /// `since`.
    pub fn fill(
        &self,
        topic: &str,
        since: Offset,
        newest: Offset,
        fetched: Vec<(Offset, MessageKind, Box<[u8]>)>,
    ) {
        let mut state = self.lock();
        for (offset, kind, data) in fetched {
            self.keep(&mut state, topic, offset, kind, data);
        }
        let ring = state.ring(topic, self.source);
        ring.since = Some(ring.since.map_or(since, |s| s.min(since)));
        ring.newest = ring.newest.max(newest);
    }

    /// With a backplane: forgets `topic`'s ring (this node no longer receives it), or every ring
    /// (`None`: the backplane lost its subscriptions).
    pub fn forget(&self, topic: Option<&str>) {
        let mut state = self.lock();
        let State { rings, bytes, kept, .. } = &mut *state;
        let mut drop_ring = |ring: Ring| {
            for e in ring.entries {
                *bytes -= e.data.len() + ENTRY_OVERHEAD;
                *kept -= 1;
            }
        };
        match topic {
            Some(topic) => {
                if let Some(ring) = rings.remove(topic) {
                    drop_ring(ring);
                }
            }
            None => rings.drain().for_each(|(_, ring)| drop_ring(ring)),
        }
        state.compact(self.source);
    }

    /// What a subscriber of `topic` that last saw `since` missed.
    pub(crate) fn recover(&self, topic: &str, since: &str) -> Replay {
        let Some(seen) = Offset::parse(since) else { return Replay::Gone };
        let mut state = self.lock();
        if self.source == Source::Memory && (seen.0 != self.epoch || seen.1 >= state.next) {
            return Replay::Gone;
        }
        let now = Instant::now();
        let forgotten = state.forgotten;
        let State { rings, bytes, kept, .. } = &mut *state;
        let Some(ring) = rings.get_mut(topic) else {
            return match self.source {
                Source::Memory if seen >= forgotten => Replay::Missed(Vec::new()),
                _ => Replay::Gone,
            };
        };
        while ring.entries.front().is_some_and(|e| expired(e, now, self.max_age)) {
            *bytes -= ring.pop_front();
            *kept -= 1;
        }
        let foreign = self.source == Source::Backplane && seen > ring.newest;
        if ring.since.is_none_or(|s| seen < s) || seen < ring.lost || foreign {
            return Replay::Gone;
        }
        let missed = ring
            .entries
            .iter()
            .filter(|e| e.offset > seen)
            .map(|e| (e.kind, e.data.clone()))
            .collect();
        Replay::Missed(missed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps one message in its topic's ring (in offset order; an offset kept already is not
    /// kept twice), within the count, age and memory limits.
    fn keep(
        &self,
        state: &mut State,
        topic: &str,
        offset: Offset,
        kind: MessageKind,
        data: Box<[u8]>,
    ) {
        let size = data.len() + ENTRY_OVERHEAD;
        let ring = state.ring(topic, self.source);
        ring.newest = ring.newest.max(offset);
        if size > self.memory {
            // Never kept: a `since` before it is told so.
            ring.lost = ring.lost.max(offset);
            return;
        }
        while state.bytes + size > self.memory && !state.order.is_empty() {
            state.evict_oldest(self.source);
        }
        let now = Instant::now();
        state.ring(topic, self.source);
        let State { rings, order, bytes, kept, .. } = state;
        // NOTE(unwrap): `ring` made it.
        let (name, ring) =
            rings.get_key_value(topic).map(|(n, _)| n.clone()).zip(rings.get_mut(topic)).unwrap();
        let at = match ring.entries.back() {
            Some(last) if last.offset >= offset => {
                match ring.entries.binary_search_by_key(&offset, |e| e.offset) {
                    Ok(_) => return,
                    Err(at) => at,
                }
            }
            _ => ring.entries.len(),
        };
        ring.entries.insert(at, Entry { offset, at: now, kind, data });
        *bytes += size;
        *kept += 1;
        order.push_back((name, offset));
        while ring.entries.len() > self.messages
            || ring.entries.front().is_some_and(|e| expired(e, now, self.max_age))
        {
            *bytes -= ring.pop_front();
            *kept -= 1;
        }
        state.compact(self.source);
    }
}

impl State {
    fn ring(&mut self, topic: &str, source: Source) -> &mut Ring {
        if !self.rings.contains_key(topic) {
            let since = match source {
                Source::Memory => Some(self.forgotten),
                Source::Backplane => None,
            };
            let ring = Ring {
                entries: VecDeque::new(),
                since,
                lost: Offset::default(),
                newest: Offset::default(),
            };
            self.rings.insert(Arc::from(topic), ring);
        }
        // NOTE(unwrap): inserted above if it was missing.
        self.rings.get_mut(topic).unwrap()
    }

    /// Drops the message kept first of those still kept (and its topic's ring, if that
    /// empties it).
    fn evict_oldest(&mut self, source: Source) {
        while let Some((topic, offset)) = self.order.pop_front() {
            let Some(ring) = self.rings.get_mut(&topic) else { continue };
            let Ok(at) = ring.entries.binary_search_by_key(&offset, |e| e.offset) else {
                continue; // gone already, by count or age
            };
            // NOTE(unwrap): found just above.
            let e = ring.entries.remove(at).unwrap();
            ring.lost = ring.lost.max(offset);
            self.bytes -= e.data.len() + ENTRY_OVERHEAD;
            self.kept -= 1;
            if ring.entries.is_empty() {
                if source == Source::Memory {
                    self.forgotten = self.forgotten.max(ring.lost);
                }
                self.rings.remove(&topic);
            }
            return;
        }
    }

    /// Forgets eviction-order entries of messages gone by count or age once they outnumber
    /// the kept ones, so the order stays within a small multiple of what is kept. In memory,
    /// rings emptied by age go too (with a backplane a ring lives while its topic is subscribed).
    fn compact(&mut self, source: Source) {
        if self.order.len() <= 2 * self.kept + 64 {
            return;
        }
        let rings = &self.rings;
        self.order.retain(|(topic, offset)| {
            rings
                .get(topic)
                .is_some_and(|r| r.entries.binary_search_by_key(offset, |e| e.offset).is_ok())
        });
        if source == Source::Memory {
            let mut forgotten = self.forgotten;
            self.rings.retain(|_, r| {
                if r.entries.is_empty() {
                    forgotten = forgotten.max(r.lost);
                }
                !r.entries.is_empty()
            });
            self.forgotten = forgotten;
        }
    }
}

impl Ring {
    /// Drops the oldest entry; the bytes it freed.
    fn pop_front(&mut self) -> usize {
        match self.entries.pop_front() {
            Some(e) => {
                self.lost = self.lost.max(e.offset);
                e.data.len() + ENTRY_OVERHEAD
            }
            None => 0,
        }
    }
}

fn expired(entry: &Entry, now: Instant, max_age: Option<Duration>) -> bool {
    max_age.is_some_and(|age| now.duration_since(entry.at) > age)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offset(envelope: &Envelope) -> String {
        std::str::from_utf8(envelope.as_bytes()).unwrap().trim_end_matches(':').to_owned()
    }

    fn payloads(recovery: Replay) -> Vec<String> {
        let Replay::Missed(missed) = recovery else { panic!("gone") };
        missed.iter().map(|(_, d)| String::from_utf8(d.to_vec()).unwrap()).collect()
    }

    #[test]
    fn a_reconnect_gets_what_it_missed_in_order() {
        let history = History::new("", 100, None, 1 << 20, Source::Memory);
        let first = history.record("a", MessageKind::Text, b"0");
        let since = offset(&first);
        for i in 1..=5 {
            history.record("a", MessageKind::Text, format!("{i}").as_bytes());
            history.record("b", MessageKind::Text, b"other");
        }
        let got = payloads(history.recover("a", &since));
        assert_eq!(got.len(), 5);
        for (i, m) in got.iter().enumerate() {
            assert!(m.ends_with(&format!(":{}", i + 1)), "{m}");
            assert!(m.starts_with(&format!("{}-", history.epoch)), "{m}");
        }
        let last = history.record("a", MessageKind::Text, b"x");
        assert_eq!(payloads(history.recover("a", &offset(&last))), Vec::<String>::new());
    }

    #[test]
    fn gaps_too_old_or_foreign_are_gone() {
        let history = History::new("h:", 3, None, 1 << 20, Source::Memory);
        assert!(!history.applies("x") && history.applies("h:x"));
        let since = offset(&history.record("h:a", MessageKind::Text, b"0"));
        for _ in 0..3 {
            history.record("h:a", MessageKind::Text, b"n");
        }
        assert_eq!(payloads(history.recover("h:a", &since)).len(), 3, "exactly the last 3");
        history.record("h:a", MessageKind::Text, b"n");
        assert_eq!(history.recover("h:a", &since), Replay::Gone, "one evicted by count");
        assert_eq!(history.recover("h:a", "1-1"), Replay::Gone, "another epoch");
        assert_eq!(history.recover("h:a", "garbage"), Replay::Gone);
        let future = format!("{}-999", history.epoch);
        assert_eq!(history.recover("h:a", &future), Replay::Gone, "never issued");
    }

    #[test]
    fn memory_is_bounded_and_evicts_the_oldest_of_the_server() {
        let size = 100 + 20 + ENTRY_OVERHEAD;
        let history = History::new("", 1000, None, 10 * size, Source::Memory);
        let since = offset(&history.record("old", MessageKind::Binary, &[0; 100]));
        history.record("old", MessageKind::Binary, &[0; 100]);
        for i in 0..50 {
            history.record(&format!("t{}", i % 3), MessageKind::Binary, &[1; 100]);
        }
        let state = history.state.lock().unwrap();
        assert!(state.bytes <= 10 * size, "{}", state.bytes);
        assert!(!state.rings.contains_key("old"));
        assert!(state.order.len() <= 2 * 10 + 64);
        drop(state);
        assert_eq!(history.recover("old", &since), Replay::Gone);
        // Larger than the whole limit: never kept, and a `since` before it is told.
        let before = offset(&history.record("big", MessageKind::Binary, b"0"));
        history.record("big", MessageKind::Binary, &vec![0; 20 * size]);
        assert_eq!(history.recover("big", &before), Replay::Gone);
    }

    #[test]
    fn with_a_backplane_a_ring_vouches_only_after_a_fill() {
        let history = History::new("", 5, None, 1 << 20, Source::Backplane);
        let message = |o: Offset| (o, MessageKind::Text, format!("{o}:m").into_bytes().into());
        // Live messages while subscribed: not enough alone, the node may have missed some.
        history.record_at("a", Offset(10, 0), MessageKind::Text, b"10-0:m");
        history.record_at("a", Offset(12, 0), MessageKind::Text, b"12-0:m");
        assert_eq!(history.recover("a", "9-0"), Replay::Gone);
        assert_eq!(history.recover("b", "9-0"), Replay::Gone, "never received");
        // Fetched from Redis after the subscription: merged in order, without twins.
        let fetched = vec![message(Offset(11, 0)), message(Offset(12, 0))];
        history.fill("a", Offset(9, 0), Offset(12, 0), fetched);
        assert_eq!(history.recover("a", "13-0"), Replay::Gone, "never issued");
        assert_eq!(payloads(history.recover("a", "9-0")), ["10-0:m", "11-0:m", "12-0:m"]);
        assert_eq!(payloads(history.recover("a", "11-0")), ["12-0:m"]);
        assert_eq!(history.recover("a", "8-0"), Replay::Gone, "before the fill");
        for t in 13..16 {
            history.record_at("a", Offset(t, 0), MessageKind::Text, b"x");
        }
        assert_eq!(history.recover("a", "9-0"), Replay::Gone, "evicted by count");
        assert_eq!(payloads(history.recover("a", "10-0")).len(), 5);
        history.forget(None);
        assert_eq!(history.recover("a", "14-0"), Replay::Gone, "no longer received");
        assert_eq!(history.state.lock().unwrap().bytes, 0);
    }

    #[test]
    fn age_expires_messages() {
        let history =
            History::new("", 100, Some(Duration::from_millis(30)), 1 << 20, Source::Memory);
        let since = offset(&history.record("a", MessageKind::Text, b"0"));
        history.record("a", MessageKind::Text, b"1");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(history.recover("a", &since), Replay::Gone);
    }
}
