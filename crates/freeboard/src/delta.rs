//! Delta compression per topic: a subscriber that asks for it gets each publication either
//! whole or as a [Fossil delta](crate::fossil) against the publication before it.
//!
//! Most topics publish a new version of the same document (a scoreboard, an order book, a
//! sensor frame); permessage-deflate does not see across messages when each is compressed
//! once for every subscriber (no context takeover). A delta does: a 10 KB document of which
//! 1 % changed travels as a few hundred bytes.
//!
//! # What a delta subscriber receives
//!
//! Every publication of the topic comes in an envelope of one letter, a decimal sequence
//! number and a colon (ASCII, so a text message stays valid UTF-8):
//!
//! ```text
//! F{seq}:{message}     the whole message, in the kind (text or binary) it was published
//! T{seq}:{delta}       a binary message: the Fossil delta that turns message seq − 1 into
//!                      message seq, which is text
//! B{seq}:{delta}       the same, for a binary message
//! ```
//!
//! `seq` numbers the topic's publications on the connection's server thread; a delta
//! applies only to the message of the sequence number just before its own, and the server
//! sends one only when that is the message the connection was last sent: a subscriber that
//! just joined, that resumed with `since` (the replay comes without this envelope, as the
//! history topic's own `{offset}:{payload}`), or whose queue lost a message to its
//! slow-consumer policy gets the whole message next. Under `drop-oldest`, deltas already
//! queued behind the message it dropped cannot be applied either: a decoder finds the gap by
//! the sequence numbers, drops them (it counts them) and waits for the next whole message,
//! which the server sends next. A history topic's offset envelope is part of the message the
//! delta makes (`F7:18c1f.1763935200123-42:{...}`).
//!
//! The server keeps, per topic with delta subscribers on a thread, a reference to the last
//! publication's frame (in the pool, as a queued message is: no copy) and computes one delta
//! per publication, shared by every delta subscriber as a compressed frame is; with
//! permessage-deflate, each of the two frames is compressed once for all of them.
//!
//! Decoders: [`client::DeltaDecoder`](crate::client::DeltaDecoder) in Rust and
//! `DeltaDecoder` in the browser module (`bindings/browser/freeboard.js`).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;

/// The only delta format: `?delta=fossil`.
pub const FOSSIL: &str = "fossil";

/// The envelope's letter for a whole message.
pub const WHOLE: u8 = b'F';
/// The envelope's letter for a delta that makes a text message.
pub const TEXT_DELTA: u8 = b'T';
/// The envelope's letter for a delta that makes a binary message.
pub const BINARY_DELTA: u8 = b'B';

/// Writes the envelope `{letter}{seq}:` into `out`; its length.
pub fn write_envelope(out: &mut [u8; 22], letter: u8, seq: u64) -> usize {
    out[0] = letter;
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = seq;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let len = digits.len() - at;
    out[1..=len].copy_from_slice(&digits[at..]);
    out[len + 1] = b':';
    len + 2
}

/// Splits a delta envelope off `message`: its letter, sequence number and the rest; `None`
/// if it has none (a history replay, or a message not sent by a topic's fan-out).
pub fn split_envelope(message: &[u8]) -> Option<(u8, u64, &[u8])> {
    let (&letter, rest) = message.split_first()?;
    if ![WHOLE, TEXT_DELTA, BINARY_DELTA].contains(&letter) {
        return None;
    }
    let digits = rest.iter().take(21).position(|b| *b == b':')?;
    if digits == 0 || !rest[..digits].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let seq = std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    Some((letter, seq, &rest[digits + 1..]))
}

/// The delta subscriptions of one loop's connections (inside its topic tables' budget).
#[derive(Debug, Default)]
pub(crate) struct DeltaSubscriptions {
    /// Per connection token: its delta topic (one per connection: its messages carry no topic
    /// name to pick a base by) and where its deliveries stand.
    subscribers: HashMap<usize, DeltaSubscriber>,
    /// Delta subscribers per topic on this loop.
    ///
    /// Invariant: the count of `subscribers` entries of the topic, never 0.
    topics: HashMap<Arc<str>, usize>,
}

/// A delta subscriber's state.
#[derive(Debug)]
pub(crate) struct DeltaSubscriber {
    topic: Arc<str>,
    /// The sequence number of the last publication it was sent (whole or as a delta) with
    /// nothing lost before it since its last whole message: the base its next delta may
    /// name. `None`: its next message goes whole. A `Cell`, set by the fan-out while it walks
    /// the topic's subscribers.
    pub(crate) base: Cell<Option<u64>>,
}

/// Bytes of one entry of [`DeltaSubscriptions::subscribers`].
pub(crate) const SUBSCRIBER_ENTRY: usize = size_of::<(usize, DeltaSubscriber)>();
/// Bytes of one entry of [`DeltaSubscriptions::topics`].
pub(crate) const TOPIC_ENTRY: usize = size_of::<(Arc<str>, usize)>();

impl DeltaSubscriptions {
    /// Connection `token` gets deltas of `topic` (a topic it subscribes to); `false` if it
    /// already gets them of another topic.
    pub(crate) fn add(&mut self, token: usize, topic: &Arc<str>) -> bool {
        match self.subscribers.get(&token) {
            Some(s) => *s.topic == **topic,
            None => {
                let base = Cell::new(None);
                self.subscribers.insert(token, DeltaSubscriber { topic: topic.clone(), base });
                *self.topics.entry(topic.clone()).or_default() += 1;
                true
            }
        }
    }

    /// Connection `token` no longer gets deltas (of `topic`, if given: it left that topic).
    pub(crate) fn remove(&mut self, token: usize, topic: Option<&str>) {
        let Some(s) = self.subscribers.get(&token) else { return };
        if topic.is_some_and(|t| *s.topic != *t) {
            return;
        }
        // NOTE(unwrap): found just above.
        let s = self.subscribers.remove(&token).unwrap();
        if let Some(count) = self.topics.get_mut(&s.topic) {
            *count -= 1;
            if *count == 0 {
                self.topics.remove(&s.topic);
            }
        }
        if self.subscribers.capacity() > 16
            && self.subscribers.len() < self.subscribers.capacity() / 4
        {
            self.subscribers.shrink_to(self.subscribers.len() * 2);
        }
    }

    /// Whether `topic` has delta subscribers on this loop.
    pub(crate) fn has_topic(&self, topic: &str) -> bool {
        self.topics.contains_key(topic)
    }

    /// How many topics have delta subscribers on this loop.
    pub(crate) fn topic_count(&self) -> usize {
        self.topics.len()
    }

    /// Connection `token`'s state, if it gets deltas of `topic`.
    pub(crate) fn subscriber(&self, token: usize, topic: &str) -> Option<&DeltaSubscriber> {
        self.subscribers.get(&token).filter(|s| *s.topic == *topic)
    }

    /// Entries the two tables have room for (the topic tables' footprint counts them).
    pub(crate) fn capacities(&self) -> (usize, usize) {
        (self.subscribers.capacity(), self.topics.capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_others_are_not_envelopes() {
        let mut out = [0u8; 22];
        for (letter, seq) in [(WHOLE, 0), (TEXT_DELTA, 7), (BINARY_DELTA, u64::MAX)] {
            let n = write_envelope(&mut out, letter, seq);
            let mut message = out[..n].to_vec();
            message.extend_from_slice(b"rest:x");
            assert_eq!(split_envelope(&message), Some((letter, seq, &b"rest:x"[..])));
        }
        for plain in [&b"18c1f.1-2:{}"[..], b"F:x", b"Fx1:", b"T12", b"", b"F99999999999999999999:"]
        {
            assert_eq!(split_envelope(plain), None, "{:?}", String::from_utf8_lossy(plain));
        }
    }

    #[test]
    fn one_delta_topic_per_connection_counted_per_topic() {
        let mut subs = DeltaSubscriptions::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        assert!(subs.add(1, &a));
        assert!(subs.add(1, &a), "again: the same");
        assert!(!subs.add(1, &b), "a second topic");
        assert!(subs.add(2, &a));
        subs.remove(1, Some("b"));
        assert!(subs.subscriber(1, "a").is_some(), "left another topic only");
        subs.remove(1, None);
        assert!(subs.has_topic("a"));
        subs.remove(2, Some("a"));
        assert!(!subs.has_topic("a"));
        assert_eq!(subs.subscribers.len() + subs.topics.len(), 0);
    }
}
