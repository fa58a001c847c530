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
//! letters, digits, `.` and `-` (text stays valid UTF-8):
//!
//! ```text
//! {epoch}.{ms}-{sequence}:{payload}        e.g.  18c1f0a2b3d.1763935200123-42:{"price":101.5}
//! ```
//!
//! `epoch` (1 to 16 lowercase hex digits) names the history the offset belongs to: it changes
//! whenever the continuity of the topic's history cannot be vouched for (a restarted server;
//! with Redis, a stream that was lost or recreated). `{ms}-{sequence}` is the position in it:
//! in memory, when the server started and a count of its publications to history topics; in
//! Redis, the stream entry's ID. Two offsets of one topic compare by position only within one
//! epoch; a client keeps the last offset it saw, as an opaque token.
//! Topics outside the prefix are delivered as published, without an envelope.
//!
//! # Recovery
//!
//! A client that reconnects with `?since=OFFSET` on `/topic/{name}` first gets, in offset
//! order and in the same envelope, every message of `name` after `OFFSET` that the ring still
//! holds, then the live stream, each offset once. If the ring has lost some of them (evicted
//! by count, age or memory), or `OFFSET` is of another epoch (a restarted server), was never
//! issued (a future or forged one) or is no offset at all (truncated, or the epoch-less
//! `{ms}-{sequence}` of older versions), the connection is closed with [`HISTORY_GONE`] (4410)
//! instead — never a partial replay — and the client starts afresh without `since`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use freeboard_proto::{CloseCode, MessageKind};

/// The close code telling a client that reconnected with `?since=` that the messages it
/// missed are no longer kept: it starts afresh without `since`.
pub const HISTORY_GONE: CloseCode = CloseCode(4410);

/// The Server-Sent Events equivalent of [`HISTORY_GONE`]: the last event of a stream whose
/// resume offset (`Last-Event-ID`) cannot be honoured, its data `4410 {reason}`. The client
/// closes its `EventSource` and opens a new one, without the offset.
pub const GAP_EVENT: &str = "freeboard-gap";

/// The last event of a Server-Sent Events stream the server ends for any other reason, its
/// data the WebSocket close code and reason (`1008 slow consumer`, `4001 token expired`).
pub const CLOSE_EVENT: &str = "freeboard-close";

/// Bytes each kept message costs beyond its payload (entry, eviction order, envelope).
const ENTRY_OVERHEAD: usize = 96;

/// A publication's place within one epoch of its topic's history, `{ms}-{sequence}`, ordered
/// as a pair: `(server start, sequence)` in memory, a Redis stream entry ID with a backplane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position(pub u64, pub u64);

impl Position {
    /// `a-b`, two decimal numbers (a Redis stream entry ID).
    pub fn parse(text: &str) -> Option<Self> {
        let (a, b) = text.split_once('-')?;
        Some(Position(decimal(a)?, decimal(b)?))
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// A publication's offset, `{epoch}.{ms}-{sequence}`: the epoch of its topic's history and its
/// position in it. Offsets of different epochs are not comparable (so `Offset` is not `Ord`):
/// compare [`position`](Self::position)s only when the epochs are equal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Offset {
    /// Names the history: a new one whenever continuity with the previous one cannot be
    /// vouched for.
    pub epoch: u64,
    /// Where in that history.
    pub position: Position,
}

impl Offset {
    /// `{epoch}.{ms}-{sequence}`: 1 to 16 lowercase hex digits, a dot, two decimal numbers. The
    /// epoch-less `{ms}-{sequence}` of older versions is no offset (`None`).
    pub fn parse(text: &str) -> Option<Self> {
        let (epoch, position) = text.split_once('.')?;
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if epoch.is_empty() || epoch.len() > 16 || !epoch.bytes().all(hex) {
            return None;
        }
        let epoch = u64::from_str_radix(epoch, 16).ok()?;
        Some(Offset { epoch, position: Position::parse(position)? })
    }
}

impl std::fmt::Display for Offset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}.{}", self.epoch, self.position)
    }
}

/// The offset in the envelope of a server frame (unmasked, its header first) whose first
/// bytes are `head` (at least [`Envelope::MAX`] after the header, or the whole frame).
pub(crate) fn offset_in_frame(head: &[u8]) -> Option<Offset> {
    let header = match head.get(1)? & 0x7f {
        126 => 4,
        127 => 10,
        _ => 2,
    };
    let envelope = head.get(header..)?;
    let colon = envelope.iter().take(Envelope::MAX).position(|b| *b == b':')?;
    Offset::parse(std::str::from_utf8(&envelope[..colon]).ok()?)
}

/// A history topic's payload, `{offset}:{payload}`: the offset and the payload after it.
pub(crate) fn split_envelope(enveloped: &[u8]) -> (Option<Offset>, &[u8]) {
    let colon = enveloped.iter().take(Envelope::MAX).position(|b| *b == b':');
    let Some(colon) = colon else { return (None, enveloped) };
    let offset = std::str::from_utf8(&enveloped[..colon]).ok().and_then(Offset::parse);
    match offset {
        Some(offset) => (Some(offset), &enveloped[colon + 1..]),
        None => (None, enveloped),
    }
}

/// A decimal `u64` made of ASCII digits only (no sign, unlike `str::parse`).
fn decimal(text: &str) -> Option<u64> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then(|| text.parse().ok())?
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
    /// In memory: this server's epoch, drawn at its start (so a restarted server's offsets
    /// never pass for its predecessor's), and the start in ms since 1970 (the offsets' `ms`).
    epoch: u64,
    started_ms: u64,
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
    /// Every kept message's topic and position, in the order they were kept (the memory
    /// limit's eviction order); entries already gone by count or age are skipped when reached.
    order: VecDeque<(Arc<str>, Position)>,
    /// Invariant: the bytes (with [`ENTRY_OVERHEAD`]) of every ring's entries.
    bytes: usize,
    /// Invariant: the number of every ring's entries.
    kept: usize,
    /// In memory: the highest position a topic whose ring was dropped has lost, so a `since`
    /// on a topic without a ring can be told whether it missed something (a new ring in
    /// memory starts from it: a topic may have lost that much).
    forgotten: Position,
}

struct Ring {
    /// The epoch of every position below: a message of another epoch starts the ring afresh.
    epoch: u64,
    /// Invariant: sorted by position, no position twice.
    entries: VecDeque<Entry>,
    /// The ring holds every message of its topic after this position, but for those up to
    /// `lost`; `None`: it vouches for nothing (with a backplane, until a [`fill`](History::fill)).
    since: Option<Position>,
    /// Invariant: the highest position of the topic dropped from the ring (by count, age or
    /// memory, or too large to keep).
    lost: Position,
    /// The highest position of the topic this ring knows was issued (a `since` past it is not
    /// one of the topic's).
    newest: Position,
}

struct Entry {
    position: Position,
    at: Instant,
    kind: MessageKind,
    /// Envelope and payload, as delivered.
    data: Box<[u8]>,
}

/// An offset's envelope, `{epoch}.{ms}-{sequence}:`, ready to go before a payload.
pub(crate) struct Envelope {
    bytes: [u8; Envelope::MAX],
    len: usize,
}

impl Envelope {
    /// The longest envelope: 16 hex digits, a dot, two u64 in decimal, a dash and a colon.
    pub(crate) const MAX: usize = 16 + 1 + 20 + 1 + 20 + 1;

    fn new(offset: Offset) -> Self {
        use std::io::Write;
        let mut bytes = [0u8; Self::MAX];
        let mut out = &mut bytes[..];
        // NOTE(unwrap): an offset and a colon take at most MAX bytes.
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
    /// These messages (envelope included), in offset order, maybe none, and the offset of the
    /// last of them (or `since` itself): live messages up to it are not sent again.
    Missed(Vec<(MessageKind, Box<[u8]>)>, Option<Offset>),
    /// Some are no longer kept, or the offset is not one this history issued (another epoch,
    /// a future or forged one, no offset at all).
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
        let since_1970 =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Self {
            prefix: prefix.to_owned(),
            messages,
            max_age,
            memory,
            source,
            epoch: epoch_at_start(since_1970),
            started_ms: since_1970.as_millis() as u64,
            state: Mutex::new(State {
                next: 1,
                rings: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
                kept: 0,
                forgotten: Position::default(),
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
        let offset = Offset { epoch: self.epoch, position: Position(self.started_ms, state.next) };
        state.next += 1;
        let envelope = Envelope::new(offset);
        let data = [envelope.as_bytes(), payload].concat().into_boxed_slice();
        self.keep(&mut state, topic, offset, kind, data);
        envelope
    }

    /// With a backplane: keeps a message of `topic` that arrived with `offset`, `data` being its
    /// envelope and payload. A message of another epoch than the ring's starts it afresh.
    pub(crate) fn record_at(&self, topic: &str, offset: Offset, kind: MessageKind, data: &[u8]) {
        let mut state = self.lock();
        self.keep(&mut state, topic, offset, kind, data.into());
    }

    /// With a backplane: keeps what was fetched for a subscriber that last saw `since` (every
    /// message of the topic after it, `data` with envelopes, up to `newest`, the stream's
    /// last; all of `since`'s epoch), while this node was already subscribed: the ring then
    /// holds every message after `since`.
    pub fn fill(
        &self,
        topic: &str,
        since: Offset,
        newest: Offset,
        fetched: Vec<(Offset, MessageKind, Box<[u8]>)>,
    ) {
        let mut state = self.lock();
        let State { rings, bytes, kept, .. } = &mut *state;
        // What the ring holds of another epoch belongs to a history that is over.
        if rings.get(topic).is_some_and(|r| r.epoch != since.epoch)
            && let Some(ring) = rings.remove(topic)
        {
            ring.release(bytes, kept);
        }
        for (offset, kind, data) in fetched {
            self.keep(&mut state, topic, offset, kind, data);
        }
        let forgotten = state.forgotten;
        let ring = State::ring_in(&mut state.rings, topic, self.source, since.epoch, forgotten);
        ring.since = Some(ring.since.map_or(since.position, |s| s.min(since.position)));
        ring.newest = ring.newest.max(newest.position);
    }

    /// With a backplane: forgets `topic`'s ring (this node no longer receives it), or every ring
    /// (`None`: the backplane lost its subscriptions).
    pub fn forget(&self, topic: Option<&str>) {
        let mut state = self.lock();
        let State { rings, bytes, kept, .. } = &mut *state;
        match topic {
            Some(topic) => {
                if let Some(ring) = rings.remove(topic) {
                    ring.release(bytes, kept);
                }
            }
            None => rings.drain().for_each(|(_, ring)| ring.release(bytes, kept)),
        }
        state.compact(self.source);
    }

    /// With a backplane: whether `topic`'s ring holds every message after `since` (so a
    /// subscriber resuming from it needs nothing fetched).
    pub fn vouches(&self, topic: &str, since: Offset) -> bool {
        let state = self.lock();
        state.rings.get(topic).is_some_and(|ring| {
            let at = since.position;
            ring.epoch == since.epoch
                && ring.since.is_some_and(|s| s <= at)
                && at >= ring.lost
                && at <= ring.newest
        })
    }

    /// What a subscriber of `topic` that last saw `since` missed.
    pub(crate) fn recover(&self, topic: &str, since: &str) -> Replay {
        let Some(seen) = Offset::parse(since) else { return Replay::Gone };
        let mut state = self.lock();
        if self.source == Source::Memory
            && (seen.epoch != self.epoch
                || seen.position.0 != self.started_ms
                || seen.position.1 >= state.next)
        {
            return Replay::Gone;
        }
        let now = Instant::now();
        let forgotten = state.forgotten;
        let State { rings, bytes, kept, .. } = &mut *state;
        let Some(ring) = rings.get_mut(topic) else {
            return match self.source {
                Source::Memory if seen.position >= forgotten => Replay::Missed(Vec::new(), None),
                _ => Replay::Gone,
            };
        };
        if ring.epoch != seen.epoch {
            return Replay::Gone;
        }
        while ring.entries.front().is_some_and(|e| expired(e, now, self.max_age)) {
            *bytes -= ring.pop_front();
            *kept -= 1;
        }
        let seen_at = seen.position;
        let foreign = self.source == Source::Backplane && seen_at > ring.newest;
        if ring.since.is_none_or(|s| seen_at < s) || seen_at < ring.lost || foreign {
            return Replay::Gone;
        }
        let missed: Vec<_> = ring
            .entries
            .iter()
            .filter(|e| e.position > seen_at)
            .map(|e| (e.kind, e.data.clone()))
            .collect();
        let last = ring.entries.back().map(|e| e.position).filter(|p| *p > seen_at);
        let through = Offset { epoch: ring.epoch, position: last.unwrap_or(seen_at) };
        Replay::Missed(missed, Some(through))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps one message in its topic's ring (in position order; a position kept already is
    /// not kept twice), within the count, age and memory limits.
    fn keep(
        &self,
        state: &mut State,
        topic: &str,
        offset: Offset,
        kind: MessageKind,
        data: Box<[u8]>,
    ) {
        let position = offset.position;
        let size = data.len() + ENTRY_OVERHEAD;
        let State { rings, bytes, kept, forgotten, .. } = &mut *state;
        // Another epoch: the ring's messages belong to a history that is over.
        if rings.get(topic).is_some_and(|r| r.epoch != offset.epoch)
            && let Some(ring) = rings.remove(topic)
        {
            ring.release(bytes, kept);
        }
        let ring = State::ring_in(rings, topic, self.source, offset.epoch, *forgotten);
        ring.newest = ring.newest.max(position);
        if size > self.memory {
            // Never kept: a `since` before it is told so.
            ring.lost = ring.lost.max(position);
            return;
        }
        while state.bytes + size > self.memory && !state.order.is_empty() {
            state.evict_oldest(self.source);
        }
        let now = Instant::now();
        let State { rings, order, bytes, kept, forgotten, .. } = state;
        State::ring_in(rings, topic, self.source, offset.epoch, *forgotten);
        // NOTE(unwrap): `ring_in` made it.
        let (name, ring) =
            rings.get_key_value(topic).map(|(n, _)| n.clone()).zip(rings.get_mut(topic)).unwrap();
        let at = match ring.entries.back() {
            Some(last) if last.position >= position => {
                match ring.entries.binary_search_by_key(&position, |e| e.position) {
                    Ok(_) => return,
                    Err(at) => at,
                }
            }
            _ => ring.entries.len(),
        };
        ring.entries.insert(at, Entry { position, at: now, kind, data });
        *bytes += size;
        *kept += 1;
        order.push_back((name, position));
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
    /// `topic`'s ring in `rings`, made (of `epoch`) if there is none: in memory it vouches for
    /// what came after `forgotten`, with a backplane for nothing yet.
    fn ring_in<'r>(
        rings: &'r mut HashMap<Arc<str>, Ring>,
        topic: &str,
        source: Source,
        epoch: u64,
        forgotten: Position,
    ) -> &'r mut Ring {
        if !rings.contains_key(topic) {
            let since = match source {
                Source::Memory => Some(forgotten),
                Source::Backplane => None,
            };
            let ring = Ring {
                epoch,
                entries: VecDeque::new(),
                since,
                lost: Position::default(),
                newest: Position::default(),
            };
            rings.insert(Arc::from(topic), ring);
        }
        // NOTE(unwrap): inserted above if it was missing.
        rings.get_mut(topic).unwrap()
    }

    /// Drops the message kept first of those still kept (and its topic's ring, if that
    /// empties it).
    fn evict_oldest(&mut self, source: Source) {
        while let Some((topic, position)) = self.order.pop_front() {
            let Some(ring) = self.rings.get_mut(&topic) else { continue };
            let Ok(at) = ring.entries.binary_search_by_key(&position, |e| e.position) else {
                continue; // gone already, by count or age
            };
            // NOTE(unwrap): found just above.
            let e = ring.entries.remove(at).unwrap();
            ring.lost = ring.lost.max(position);
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
        self.order.retain(|(topic, position)| {
            rings
                .get(topic)
                .is_some_and(|r| r.entries.binary_search_by_key(position, |e| e.position).is_ok())
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
                self.lost = self.lost.max(e.position);
                e.data.len() + ENTRY_OVERHEAD
            }
            None => 0,
        }
    }

    /// Takes the ring's entries out of the totals (the ring is being dropped).
    fn release(self, bytes: &mut usize, kept: &mut usize) {
        for e in self.entries {
            *bytes -= e.data.len() + ENTRY_OVERHEAD;
            *kept -= 1;
        }
    }
}

fn expired(entry: &Entry, now: Instant, max_age: Option<Duration>) -> bool {
    max_age.is_some_and(|age| now.duration_since(entry.at) > age)
}

/// A server's epoch: 64 bits from the standard library's per-process random hasher keys, the
/// start time and the process id, so that two starts never share one (never 0).
fn epoch_at_start(since_1970: Duration) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(since_1970.as_nanos());
    h.write_u32(std::process::id());
    h.finish().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offset(envelope: &Envelope) -> String {
        std::str::from_utf8(envelope.as_bytes()).unwrap().trim_end_matches(':').to_owned()
    }

    fn payloads(recovery: Replay) -> Vec<String> {
        let Replay::Missed(missed, _) = recovery else { panic!("gone") };
        missed.iter().map(|(_, d)| String::from_utf8(d.to_vec()).unwrap()).collect()
    }

    /// An offset of epoch `e` at `ms-0`, as text.
    fn at(e: u64, ms: u64) -> Offset {
        Offset { epoch: e, position: Position(ms, 0) }
    }

    #[test]
    fn offsets_name_their_epoch_and_parse_strictly() {
        let o = Offset { epoch: 0x18c1f0a2b3d, position: Position(1763935200123, 42) };
        assert_eq!(o.to_string(), "18c1f0a2b3d.1763935200123-42");
        assert_eq!(Offset::parse(&o.to_string()), Some(o));
        let max = Offset { epoch: u64::MAX, position: Position(u64::MAX, u64::MAX) };
        assert_eq!(Envelope::new(max).as_bytes().len(), Envelope::MAX);
        for bad in [
            "1763935200123-42",      // the epoch-less form of older versions
            ".1-2",                  // no epoch
            "18C1.1-2",              // not lowercase
            "12345678901234567.1-2", // 17 digits
            "1.1-",                  // truncated
            "1.1",
            "1.+1-2",
            "1.1-+2",
            "g.1-2",
            "1.1-2:",
            "",
        ] {
            assert_eq!(Offset::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_frame_tells_its_offset() {
        let o = Offset { epoch: 0xabc, position: Position(17, 4) };
        let envelope = Envelope::new(o);
        for (payload, header) in [
            (10, &[0x81, 19][..]),
            (300, &[0x81, 126, 1, 53]),
            (70_000, &[0x82, 127, 0, 0, 0, 0, 0, 1, 17, 123]),
        ] {
            let frame = [header, envelope.as_bytes(), &vec![b'x'; payload]].concat();
            assert_eq!(offset_in_frame(&frame[..frame.len().min(10 + Envelope::MAX)]), Some(o));
        }
        assert_eq!(offset_in_frame(&[0x81, 3, b'a', b'b', b'c']), None);
        assert_eq!(offset_in_frame(&[0x81]), None);
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
        let Replay::Missed(got, through) = history.recover("a", &since) else { panic!("gone") };
        assert_eq!(got.len(), 5);
        for (i, (_, m)) in got.iter().enumerate() {
            let m = std::str::from_utf8(m).unwrap();
            assert!(m.ends_with(&format!(":{}", i + 1)), "{m}");
            assert!(m.starts_with(&format!("{:x}.{}-", history.epoch, history.started_ms)), "{m}");
        }
        // Live delivery up to the replay's last offset is not sent again.
        let (newest, _) = std::str::from_utf8(&got[4].1).unwrap().split_once(':').unwrap();
        assert_eq!(through, Offset::parse(newest));
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
        let seen = Offset::parse(&since).unwrap();
        let other = Offset { epoch: seen.epoch ^ 1, ..seen };
        assert_eq!(history.recover("h:a", &other.to_string()), Replay::Gone, "another epoch");
        assert_eq!(history.recover("h:a", &seen.position.to_string()), Replay::Gone, "no epoch");
        assert_eq!(history.recover("h:a", "garbage"), Replay::Gone);
        let future = Offset { position: Position(seen.position.0, 999), ..seen };
        assert_eq!(history.recover("h:a", &future.to_string()), Replay::Gone, "never issued");
        let forged = Offset { position: Position(seen.position.0 - 1, 1), ..seen };
        assert_eq!(history.recover("h:a", &forged.to_string()), Replay::Gone, "forged");
        // A restarted server has another epoch: its predecessor's offsets are not its own.
        let restarted = History::new("h:", 3, None, 1 << 20, Source::Memory);
        restarted.record("h:a", MessageKind::Text, b"0");
        assert_ne!(restarted.epoch, history.epoch);
        assert_eq!(restarted.recover("h:a", &since), Replay::Gone);
    }

    #[test]
    fn memory_is_bounded_and_evicts_the_oldest_of_the_server() {
        let size = 100 + 40 + ENTRY_OVERHEAD;
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
        let s = |o: Offset| o.to_string();
        // Live messages while subscribed: not enough alone, the node may have missed some.
        history.record_at("a", at(7, 10), MessageKind::Text, b"7.10-0:m");
        history.record_at("a", at(7, 12), MessageKind::Text, b"7.12-0:m");
        assert_eq!(history.recover("a", &s(at(7, 9))), Replay::Gone);
        assert_eq!(history.recover("b", &s(at(7, 9))), Replay::Gone, "never received");
        // Fetched from Redis after the subscription: merged in order, without twins.
        let fetched = vec![message(at(7, 11)), message(at(7, 12))];
        history.fill("a", at(7, 9), at(7, 12), fetched);
        assert!(history.vouches("a", at(7, 9)) && history.vouches("a", at(7, 12)));
        assert!(!history.vouches("a", at(7, 8)) && !history.vouches("a", at(8, 9)));
        assert_eq!(history.recover("a", &s(at(7, 13))), Replay::Gone, "never issued");
        assert_eq!(history.recover("a", &s(at(8, 9))), Replay::Gone, "another epoch");
        assert_eq!(
            payloads(history.recover("a", &s(at(7, 9)))),
            ["7.10-0:m", "7.11-0:m", "7.12-0:m"]
        );
        assert_eq!(payloads(history.recover("a", &s(at(7, 11)))), ["7.12-0:m"]);
        assert_eq!(history.recover("a", &s(at(7, 8))), Replay::Gone, "before the fill");
        for t in 13..16 {
            history.record_at("a", at(7, t), MessageKind::Text, b"x");
        }
        assert_eq!(history.recover("a", &s(at(7, 9))), Replay::Gone, "evicted by count");
        assert_eq!(payloads(history.recover("a", &s(at(7, 10)))).len(), 5);
        // A message of a new epoch (the stream was lost and made again): the old history
        // is over, and the new one vouches for nothing until a fill.
        history.record_at("a", at(9, 1), MessageKind::Text, b"9.1-0:m");
        assert_eq!(history.recover("a", &s(at(7, 14))), Replay::Gone, "the old epoch is over");
        assert_eq!(history.recover("a", &s(at(9, 0))), Replay::Gone, "not filled yet");
        assert_eq!(history.state.lock().unwrap().kept, 1);
        history.fill("a", at(9, 0), at(9, 1), Vec::new());
        assert_eq!(payloads(history.recover("a", &s(at(9, 0)))), ["9.1-0:m"]);
        history.forget(None);
        assert_eq!(history.recover("a", &s(at(9, 1))), Replay::Gone, "no longer received");
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
