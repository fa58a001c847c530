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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use freeboard_proto::{CloseCode, MessageKind};

/// The close code telling a client that reconnected with `?since=` that the messages it
/// missed are no longer kept: it starts afresh without `since`.
pub const HISTORY_GONE: CloseCode = CloseCode(4410);

/// Bytes each kept message costs beyond its payload (entry, eviction order, envelope).
const ENTRY_OVERHEAD: usize = 96;

/// The server's topic history: offsets and the bounded rings.
pub(crate) struct History {
    prefix: String,
    messages: usize,
    max_age: Option<Duration>,
    memory: usize,
    /// The offset epoch: when this server started, in ms since 1970.
    epoch: u64,
    state: Mutex<State>,
}

struct State {
    /// The next sequence number.
    next: u64,
    rings: HashMap<Arc<str>, Ring>,
    /// Every kept message's topic and sequence, oldest first (the memory limit's eviction
    /// order); entries already gone by count or age are skipped when reached.
    order: VecDeque<(Arc<str>, u64)>,
    /// Invariant: the bytes (with [`ENTRY_OVERHEAD`]) of every ring's entries.
    bytes: usize,
    /// Invariant: the number of every ring's entries.
    kept: usize,
    /// Invariant: the highest sequence a topic whose ring was dropped has lost, so a `since`
    /// on a topic without a ring can be told whether it missed something (a new ring starts
    /// from it: a topic may have lost that much).
    forgotten: u64,
}

struct Ring {
    entries: VecDeque<Entry>,
    /// Invariant: the highest sequence this topic has lost (0: none).
    lost: u64,
}

struct Entry {
    sequence: u64,
    at: Instant,
    kind: MessageKind,
    /// Envelope and payload, as delivered.
    data: Box<[u8]>,
}

/// An offset's envelope, `{epoch}-{sequence}:`, ready to go before a payload.
pub(crate) struct Envelope {
    bytes: [u8; 42],
    len: usize,
}

impl Envelope {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// What a reconnecting subscriber missed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Recovery {
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
    ) -> Self {
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Self {
            prefix: prefix.to_owned(),
            messages,
            max_age,
            memory,
            epoch,
            state: Mutex::new(State {
                next: 1,
                rings: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
                kept: 0,
                forgotten: 0,
            }),
        }
    }

    /// Whether `topic`'s publications carry offsets and are kept.
    pub(crate) fn applies(&self, topic: &str) -> bool {
        topic.starts_with(&self.prefix)
    }

    /// Gives a publication to `topic` (which [`applies`](Self::applies)) its offset and keeps
    /// it; the envelope to deliver before the payload.
    pub(crate) fn record(&self, topic: &str, kind: MessageKind, payload: &[u8]) -> Envelope {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let sequence = state.next;
        state.next += 1;
        let envelope = self.envelope(sequence);
        let size = envelope.len + payload.len() + ENTRY_OVERHEAD;
        if size > self.memory {
            // Never kept: a `since` before it is told so.
            let ring = state.ring(topic);
            ring.lost = sequence;
            return envelope;
        }
        let now = Instant::now();
        while state.bytes + size > self.memory && !state.order.is_empty() {
            state.evict_oldest();
        }
        let (messages, max_age) = (self.messages, self.max_age);
        let State { rings, order, bytes, kept, forgotten, .. } = &mut *state;
        let name = match rings.get_key_value(topic) {
            Some((name, _)) => name.clone(),
            None => Arc::from(topic),
        };
        let ring = rings
            .entry(name.clone())
            .or_insert_with(|| Ring { entries: VecDeque::new(), lost: *forgotten });
        let data = [envelope.as_bytes(), payload].concat().into_boxed_slice();
        ring.entries.push_back(Entry { sequence, at: now, kind, data });
        *bytes += size;
        *kept += 1;
        order.push_back((name, sequence));
        while ring.entries.len() > messages
            || ring.entries.front().is_some_and(|e| expired(e, now, max_age))
        {
            *bytes -= ring.pop_front();
            *kept -= 1;
        }
        state.compact();
        envelope
    }

    /// What a subscriber of `topic` that last saw `since` missed.
    pub(crate) fn recover(&self, topic: &str, since: &str) -> Recovery {
        let Some((epoch, seen)) = since
            .split_once('-')
            .and_then(|(e, s)| Some((e.parse::<u64>().ok()?, s.parse::<u64>().ok()?)))
        else {
            return Recovery::Gone;
        };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if epoch != self.epoch || seen >= state.next {
            return Recovery::Gone;
        }
        let now = Instant::now();
        let forgotten = state.forgotten;
        let State { rings, bytes, kept, .. } = &mut *state;
        let Some(ring) = rings.get_mut(topic) else {
            return if seen < forgotten { Recovery::Gone } else { Recovery::Missed(Vec::new()) };
        };
        while ring.entries.front().is_some_and(|e| expired(e, now, self.max_age)) {
            *bytes -= ring.pop_front();
            *kept -= 1;
        }
        if seen < ring.lost {
            return Recovery::Gone;
        }
        let missed = ring
            .entries
            .iter()
            .filter(|e| e.sequence > seen)
            .map(|e| (e.kind, e.data.clone()))
            .collect();
        Recovery::Missed(missed)
    }

    fn envelope(&self, sequence: u64) -> Envelope {
        use std::io::Write;
        let mut bytes = [0u8; 42];
        let mut out = &mut bytes[..];
        // NOTE(unwrap): two u64 in decimal, a dash and a colon take at most 42 bytes.
        write!(out, "{}-{sequence}:", self.epoch).unwrap();
        let len = 42 - out.len();
        Envelope { bytes, len }
    }
}

impl State {
    fn ring(&mut self, topic: &str) -> &mut Ring {
        if !self.rings.contains_key(topic) {
            let ring = Ring { entries: VecDeque::new(), lost: self.forgotten };
            self.rings.insert(Arc::from(topic), ring);
        }
        // NOTE(unwrap): inserted above if it was missing.
        self.rings.get_mut(topic).unwrap()
    }

    /// Drops the server's oldest kept message (and its topic's ring, if that empties it).
    fn evict_oldest(&mut self) {
        while let Some((topic, sequence)) = self.order.pop_front() {
            let Some(ring) = self.rings.get_mut(&topic) else { continue };
            if ring.entries.front().is_none_or(|e| e.sequence != sequence) {
                continue; // gone already, by count or age
            }
            self.bytes -= ring.pop_front();
            self.kept -= 1;
            if ring.entries.is_empty() {
                self.forgotten = self.forgotten.max(ring.lost);
                self.rings.remove(&topic);
            }
            return;
        }
    }

    /// Forgets eviction-order entries of messages gone by count or age once they outnumber
    /// the kept ones, so the order stays within a small multiple of what is kept.
    fn compact(&mut self) {
        if self.order.len() <= 2 * self.kept + 64 {
            return;
        }
        let rings = &self.rings;
        self.order.retain(|(topic, sequence)| {
            rings.get(topic).is_some_and(|r| {
                r.entries.binary_search_by_key(sequence, |e| e.sequence).is_ok()
            })
        });
        // Rings emptied by age are dropped here too.
        let mut forgotten = self.forgotten;
        self.rings.retain(|_, r| {
            let keep = !r.entries.is_empty();
            if !keep {
                forgotten = forgotten.max(r.lost);
            }
            keep
        });
        self.forgotten = forgotten;
    }
}

impl Ring {
    /// Drops the oldest entry; the bytes it freed.
    fn pop_front(&mut self) -> usize {
        match self.entries.pop_front() {
            Some(e) => {
                self.lost = e.sequence;
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

    fn payloads(recovery: Recovery) -> Vec<String> {
        let Recovery::Missed(missed) = recovery else { panic!("gone") };
        missed.iter().map(|(_, d)| String::from_utf8(d.to_vec()).unwrap()).collect()
    }

    #[test]
    fn a_reconnect_gets_what_it_missed_in_order() {
        let history = History::new("", 100, None, 1 << 20);
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
        let history = History::new("h:", 3, None, 1 << 20);
        assert!(!history.applies("x") && history.applies("h:x"));
        let since = offset(&history.record("h:a", MessageKind::Text, b"0"));
        for _ in 0..3 {
            history.record("h:a", MessageKind::Text, b"n");
        }
        assert_eq!(payloads(history.recover("h:a", &since)).len(), 3, "exactly the last 3");
        history.record("h:a", MessageKind::Text, b"n");
        assert_eq!(history.recover("h:a", &since), Recovery::Gone, "one evicted by count");
        assert_eq!(history.recover("h:a", "1-1"), Recovery::Gone, "another epoch");
        assert_eq!(history.recover("h:a", "garbage"), Recovery::Gone);
        let future = format!("{}-999", history.epoch);
        assert_eq!(history.recover("h:a", &future), Recovery::Gone, "never issued");
    }

    #[test]
    fn memory_is_bounded_and_evicts_the_oldest_of_the_server() {
        let size = 100 + 20 + ENTRY_OVERHEAD;
        let history = History::new("", 1000, None, 10 * size);
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
        assert_eq!(history.recover("old", &since), Recovery::Gone);
        // Larger than the whole limit: never kept, and a `since` before it is told.
        let before = offset(&history.record("big", MessageKind::Binary, b"0"));
        history.record("big", MessageKind::Binary, &vec![0; 20 * size]);
        assert_eq!(history.recover("big", &before), Recovery::Gone);
    }

    #[test]
    fn age_expires_messages() {
        let history = History::new("", 100, Some(Duration::from_millis(30)), 1 << 20);
        let since = offset(&history.record("a", MessageKind::Text, b"0"));
        history.record("a", MessageKind::Text, b"1");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(history.recover("a", &since), Recovery::Gone);
    }
}
