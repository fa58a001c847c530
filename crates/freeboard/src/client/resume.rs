//! Resuming a history topic's subscription, sans-IO: the offset a subscriber last saw, the
//! `?since=` URL it reconnects with, de-duplication by offset, the jittered backoff between
//! attempts, and what each close means. [`Subscription`](super::Subscription) drives it on the
//! blocking client; a [`ClientLoop`](super::ClientLoop) handler drives it the same way.
//!
//! The envelope is `OFFSET:payload` (docs/operating/history.md). An OFFSET is
//! `EPOCH.MS-SEQ`: `EPOCH` is 1 to 16 lowercase hex digits naming the stream's epoch and
//! `MS-SEQ` its position (two decimal `u64`); the older `MS-SEQ` form reads as the epoch `""`.
//! Two offsets of one epoch compare by `(MS, SEQ)`; offsets of two epochs do not compare at
//! all, so a new epoch seen without a 4410 first is reported as a break, never passed off as
//! the continuation.

use std::fmt;
use std::time::Duration;

use freeboard_proto::CloseCode;

/// Close code 4410: "cannot resume from that offset, start afresh" (the server's
/// `freeboard::history::HISTORY_GONE`).
pub const HISTORY_GONE: CloseCode = CloseCode(4410);

/// The longest epoch, in hex digits.
const MAX_EPOCH_DIGITS: usize = 16;

/// A history offset as a subscriber reads it from an envelope: an opaque token for the server,
/// ordered within its epoch for the client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OffsetToken {
    /// The token as the server wrote it (sent back in `?since=`).
    text: String,
    /// Invariant: `text[..epoch_len]` is the epoch (0 for the epoch-less form).
    epoch_len: usize,
    ms: u64,
    seq: u64,
}

impl OffsetToken {
    /// Parses `EPOCH.MS-SEQ` or the epoch-less `MS-SEQ`; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let (epoch, position) = match text.split_once('.') {
            Some((epoch, position)) => {
                let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
                if epoch.is_empty() || epoch.len() > MAX_EPOCH_DIGITS || !epoch.bytes().all(hex) {
                    return None;
                }
                (epoch, position)
            }
            None => ("", text),
        };
        let (ms, seq) = position.split_once('-')?;
        let decimal = |s: &str| -> Option<u64> {
            match !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
                true => s.parse().ok(),
                false => None,
            }
        };
        Some(Self {
            text: text.to_owned(),
            epoch_len: epoch.len(),
            ms: decimal(ms)?,
            seq: decimal(seq)?,
        })
    }

    /// The token as the server wrote it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The epoch (`""` for the epoch-less form).
    pub fn epoch(&self) -> &str {
        &self.text[..self.epoch_len]
    }

    /// The position within the epoch: `(MS, SEQ)`.
    pub fn position(&self) -> (u64, u64) {
        (self.ms, self.seq)
    }

    /// Whether `self` comes after `other` in the same epoch; `None` when the epochs differ
    /// (offsets of two epochs are not comparable).
    pub fn is_after(&self, other: &Self) -> Option<bool> {
        (self.epoch() == other.epoch()).then(|| self.position() > other.position())
    }
}

impl fmt::Display for OffsetToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Splits an enveloped message into its offset and payload; `None` when `data` does not start
/// with a valid offset and `:`.
pub fn split_envelope(data: &[u8]) -> Option<(OffsetToken, &[u8])> {
    // The longest token: 16 hex digits, '.', two u64 of 20 digits and '-'.
    let colon = data.iter().take(60).position(|&b| b == b':')?;
    let text = std::str::from_utf8(&data[..colon]).ok()?;
    Some((OffsetToken::parse(text)?, &data[colon + 1..]))
}

/// Jittered exponential backoff between connection attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backoff {
    /// The first wait after a connection that was up. Default 250 ms.
    pub initial: Duration,
    /// The longest wait. Default 30 s.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial: Duration::from_millis(250), max: Duration::from_secs(30) }
    }
}

impl Backoff {
    /// A backoff from `initial`, doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self { initial, max: max.max(initial) }
    }
}

/// What a received message is to the subscriber.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// New: deliver it. `offset` is `None` for a message without an envelope (a topic
    /// without history: at most once, nothing to de-duplicate by).
    Fresh {
        /// Its offset, now the one `since` resumes from.
        offset: Option<OffsetToken>,
        /// Where the payload starts in the message.
        payload_at: usize,
    },
    /// At or before the last offset delivered (a replay overlapping live delivery): drop it.
    Duplicate(OffsetToken),
    /// An offset of another epoch than the last one, without a 4410 first: continuity
    /// cannot be proven. The subscriber must start afresh (as after [`HISTORY_GONE`]);
    /// the message is the first of the new epoch and is delivered.
    EpochChanged {
        /// The last offset of the old epoch.
        last: OffsetToken,
        /// The message's offset, now the one `since` resumes from.
        offset: OffsetToken,
        /// Where the payload starts in the message.
        payload_at: usize,
    },
}

/// What to do after a connection ended or could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Connect again (to [`Resume::url`]) after this wait.
    Reconnect(Duration),
    /// The server cannot resume from the last offset (4410): the subscriber must start
    /// afresh; the offset is forgotten, so the next connection (after the wait) has no
    /// `since`.
    Gone {
        /// The offset that could not be resumed from.
        last: Option<OffsetToken>,
        /// The wait before connecting again.
        after: Duration,
    },
    /// Stop: the close says not to come back (1000, or a code that retrying will not fix).
    Stop,
}

/// One subscription's resumption state: the URL, the last offset, the backoff.
///
/// Call order: connect to [`url`](Self::url); [`opened`](Self::opened) once the handshake
/// succeeded; [`on_message`](Self::on_message) for every message; then
/// [`closed`](Self::closed) or [`failed`](Self::failed), whose [`Next`] says when to connect
/// again. The caller owns the socket and the clock.
#[derive(Debug, Clone)]
pub struct Resume {
    /// The URL without `since`.
    base: String,
    last: Option<OffsetToken>,
    backoff: Backoff,
    /// The next wait before jitter.
    wait: Duration,
    /// Whether the current connection delivered a message (then the backoff starts over).
    delivered: bool,
    /// xorshift64* state for the jitter: spread, not secret.
    rng: u64,
}

impl Resume {
    /// A subscription to `url` (a `/topic/...` URL; a `since` in it is the starting offset),
    /// with jitter seeded from the process's random hasher keys.
    pub fn new(url: &str, backoff: Backoff) -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write(url.as_bytes());
        Self::with_seed(url, backoff, h.finish())
    }

    /// [`new`](Self::new) with the jitter drawn from `seed`: repeatable waits for tests.
    pub fn with_seed(url: &str, backoff: Backoff, seed: u64) -> Self {
        let (base, since) = strip_since(url);
        Self {
            base,
            last: since.as_deref().and_then(OffsetToken::parse),
            backoff,
            wait: backoff.initial,
            delivered: false,
            rng: seed | 1,
        }
    }

    /// The URL to connect to: the base, with `since=` the last offset delivered, if any.
    pub fn url(&self) -> String {
        match &self.last {
            None => self.base.clone(),
            Some(offset) => {
                let sep = if self.base.contains('?') { '&' } else { '?' };
                format!("{}{sep}since={}", self.base, offset.as_str())
            }
        }
    }

    /// The last offset delivered (the one `since` resumes from).
    pub fn last(&self) -> Option<&OffsetToken> {
        self.last.as_ref()
    }

    /// Forgets the last offset: the next connection starts afresh.
    pub fn forget(&mut self) {
        self.last = None;
    }

    /// The handshake succeeded.
    pub fn opened(&mut self) {
        self.delivered = false;
    }

    /// Classifies a received message and, if it is new, makes its offset the last one.
    pub fn on_message(&mut self, data: &[u8]) -> Delivery {
        self.delivered = true;
        let Some((offset, payload)) = split_envelope(data) else {
            return Delivery::Fresh { offset: None, payload_at: 0 };
        };
        let payload_at = data.len() - payload.len();
        match self.last.as_ref().map(|last| offset.is_after(last)) {
            Some(Some(false)) => Delivery::Duplicate(offset),
            Some(None) => {
                // NOTE(unwrap): the match above saw `last`.
                let last = self.last.replace(offset.clone()).unwrap();
                Delivery::EpochChanged { last, offset, payload_at }
            }
            None | Some(Some(true)) => {
                self.last = Some(offset.clone());
                Delivery::Fresh { offset: Some(offset), payload_at }
            }
        }
    }

    /// The connection closed with `code`: what comes next.
    pub fn closed(&mut self, code: CloseCode) -> Next {
        match code {
            HISTORY_GONE => Next::Gone { last: self.last.take(), after: self.next_wait() },
            // 1000: the server ended the subscription on purpose; 1002/1007/1008/1009/1010
            // and 4000-4409, 4411+: an error retrying will not fix.
            CloseCode::NORMAL
            | CloseCode::PROTOCOL_ERROR
            | CloseCode::INVALID_PAYLOAD
            | CloseCode::POLICY_VIOLATION
            | CloseCode::MESSAGE_TOO_BIG => Next::Stop,
            CloseCode(4000..=4999) => Next::Stop,
            // 1001 going away, 1005, 1006 abnormal, 1011, 1012 restart, 1013 try again later.
            _ => Next::Reconnect(self.next_wait()),
        }
    }

    /// The connection could not be made (connect, TLS, a refused upgrade that may pass):
    /// the wait before the next attempt.
    pub fn failed(&mut self) -> Duration {
        self.delivered = false;
        self.next_wait()
    }

    /// The jittered wait ("equal jitter": between half and all of the current step), and the
    /// step doubled for next time; a connection that delivered something starts over.
    fn next_wait(&mut self) -> Duration {
        if std::mem::take(&mut self.delivered) {
            self.wait = self.backoff.initial;
        }
        let step = self.wait;
        self.wait = (self.wait * 2).min(self.backoff.max);
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let draw = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let fraction = (draw >> 11) as f64 / (1u64 << 53) as f64;
        step.mul_f64(0.5 + 0.5 * fraction)
    }
}

/// `url` without its `since=` parameter, and that parameter's value.
fn strip_since(url: &str) -> (String, Option<String>) {
    let Some((path, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut since = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("since=") {
            Some(value) => {
                since = Some(value.to_owned());
                false
            }
            None => !pair.is_empty(),
        })
        .collect();
    match kept.is_empty() {
        true => (path.to_owned(), since),
        false => (format!("{path}?{}", kept.join("&")), since),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_per_the_contract_and_refuse_the_rest() {
        let t = OffsetToken::parse("1a2b.1763935200123-42").unwrap();
        assert_eq!((t.epoch(), t.position()), ("1a2b", (1763935200123, 42)));
        let old = OffsetToken::parse("1763935200123-42").unwrap();
        assert_eq!((old.epoch(), old.position()), ("", (1763935200123, 42)));
        for bad in [
            "",
            "-",
            "1-",
            "-1",
            "1-2-3",
            "A.1-2",
            ".1-2",
            "1.2.3-4",
            "12345678901234567.1-2",
            "1-+2",
            " 1-2",
            "1-18446744073709551616",
            "x:1-2",
        ] {
            assert_eq!(OffsetToken::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn offsets_compare_within_an_epoch_only() {
        let p = |s| OffsetToken::parse(s).unwrap();
        assert_eq!(p("a.10-0").is_after(&p("a.9-5")), Some(true), "numeric, not textual");
        assert_eq!(p("a.9-5").is_after(&p("a.9-5")), Some(false));
        assert_eq!(p("a.9-6").is_after(&p("a.9-5")), Some(true));
        assert_eq!(p("b.9-6").is_after(&p("a.9-5")), None);
        assert_eq!(p("9-6").is_after(&p("a.9-5")), None);
    }

    #[test]
    fn envelopes_split_and_plain_messages_do_not() {
        let (offset, payload) = split_envelope(b"ff.1-2:{\"a\":1}").unwrap();
        assert_eq!((offset.as_str(), payload), ("ff.1-2", &b"{\"a\":1}"[..]));
        assert_eq!(split_envelope(b"{\"a\":1}"), None);
        assert_eq!(split_envelope(b"hello world"), None);
        assert_eq!(split_envelope(b"1-2"), None, "no colon");
    }

    #[test]
    fn the_url_carries_since_and_keeps_other_parameters() {
        let mut r = Resume::with_seed("ws://h/topic/t?since=e.1-1&x=2", Backoff::default(), 7);
        assert_eq!(r.url(), "ws://h/topic/t?x=2&since=e.1-1");
        assert_eq!(
            r.on_message(b"e.1-2:p"),
            Delivery::Fresh { offset: OffsetToken::parse("e.1-2"), payload_at: 6 }
        );
        assert_eq!(r.url(), "ws://h/topic/t?x=2&since=e.1-2");
        let mut plain = Resume::with_seed("ws://h/topic/t", Backoff::default(), 7);
        assert_eq!(plain.url(), "ws://h/topic/t");
        plain.on_message(b"e.5-0:p");
        assert_eq!(plain.url(), "ws://h/topic/t?since=e.5-0");
    }

    #[test]
    fn replays_overlapping_live_delivery_are_dropped_by_offset() {
        let mut r = Resume::with_seed("ws://h/topic/t", Backoff::default(), 1);
        let fresh = |d: Delivery| matches!(d, Delivery::Fresh { .. });
        assert!(fresh(r.on_message(b"e.1-0:a")));
        assert!(fresh(r.on_message(b"e.1-1:b")));
        assert_eq!(
            r.on_message(b"e.1-1:b"),
            Delivery::Duplicate(OffsetToken::parse("e.1-1").unwrap())
        );
        assert!(matches!(r.on_message(b"e.1-0:a"), Delivery::Duplicate(_)));
        assert!(fresh(r.on_message(b"e.2-0:c")));
        assert_eq!(r.last().unwrap().as_str(), "e.2-0");
    }

    #[test]
    fn a_new_epoch_without_4410_is_a_reported_break() {
        let mut r = Resume::with_seed("ws://h/topic/t", Backoff::default(), 1);
        r.on_message(b"e.9-0:a");
        match r.on_message(b"f.1-0:b") {
            Delivery::EpochChanged { last, offset, payload_at: 6 } => {
                assert_eq!((last.as_str(), offset.as_str()), ("e.9-0", "f.1-0"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(r.on_message(b"f.1-1:c"), Delivery::Fresh { .. }));
    }

    #[test]
    fn closes_say_whether_to_come_back() {
        let mut r = Resume::with_seed("ws://h/topic/t", Backoff::default(), 3);
        r.on_message(b"e.1-0:a");
        assert!(matches!(r.closed(CloseCode::ABNORMAL), Next::Reconnect(_)));
        assert!(matches!(r.closed(CloseCode::GOING_AWAY), Next::Reconnect(_)));
        assert!(matches!(r.closed(CloseCode::TRY_AGAIN_LATER), Next::Reconnect(_)));
        assert_eq!(r.url(), "ws://h/topic/t?since=e.1-0");
        match r.closed(HISTORY_GONE) {
            Next::Gone { last, .. } => assert_eq!(last.unwrap().as_str(), "e.1-0"),
            other => panic!("{other:?}"),
        }
        assert_eq!(r.url(), "ws://h/topic/t", "4410: start afresh, without since");
        assert_eq!(r.closed(CloseCode::NORMAL), Next::Stop);
        assert_eq!(r.closed(CloseCode::POLICY_VIOLATION), Next::Stop);
        assert_eq!(r.closed(CloseCode(4403)), Next::Stop);
    }

    #[test]
    fn waits_double_with_jitter_up_to_the_cap_and_start_over_after_a_delivery() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
        let mut r = Resume::with_seed("ws://h/t", backoff, 42);
        let steps = [100, 200, 400, 800, 800, 800];
        for step in steps {
            let wait = r.failed();
            let step = Duration::from_millis(step);
            assert!(
                wait >= step / 2 && wait <= step,
                "{wait:?} outside [{:?}, {step:?}]",
                step / 2
            );
        }
        r.opened();
        r.on_message(b"e.1-0:a");
        let wait = r.closed(CloseCode::ABNORMAL);
        assert!(matches!(wait, Next::Reconnect(w) if w <= Duration::from_millis(100)), "{wait:?}");
        let again = Resume::with_seed("ws://h/t", backoff, 42).failed();
        assert_eq!(
            again,
            Resume::with_seed("ws://h/t", backoff, 42).failed(),
            "seeded: repeatable"
        );
    }
}
