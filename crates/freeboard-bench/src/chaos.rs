//! The chaos harness's checker: reads every publisher's acknowledgements and every
//! subscriber's log and classifies each acknowledged publication, for each subscriber that
//! was subscribed when it was published, as
//! - **delivered**: exactly once, in order (after every earlier publication of the same
//!   publisher on that topic that it received);
//! - **signalled**: not delivered, and the subscriber was told so: a `Gone` (close 4410, or
//!   an offset of a new epoch) lies between the neighbours it did receive;
//! - **silently lost**: not delivered, and nothing said so;
//! - **duplicated**: delivered more than once (under two offsets: the client drops a repeated
//!   offset itself);
//! - **out of order**: delivered after a later publication of the same publisher.
//!
//! A run fails on any of the last three. Publications that were not acknowledged (a 202, a
//! 503, no answer) may or may not arrive; they are counted apart and fail nothing. The
//! checker is sans-IO: the harness (crates/freeboard-cli/tests/chaos.rs) feeds it what it
//! recorded.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

/// One publication as its publisher saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    /// The publisher (each numbers its publications per topic from 0, one at a time).
    pub publisher: u32,
    /// The topic.
    pub topic: u32,
    /// Its number among the publisher's publications on the topic.
    pub seq: u64,
    /// Whether the server acknowledged it (HTTP 200).
    pub acked: bool,
    /// When the request was sent, from the run's start.
    pub sent_at: Duration,
}

/// One entry of a subscriber's log, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A message delivered by the client: the publication it carries.
    Message {
        /// Its publisher.
        publisher: u32,
        /// Its number.
        seq: u64,
        /// When it arrived.
        at: Duration,
    },
    /// The client reported that it cannot resume (4410, or a new epoch without one).
    Gone {
        /// When.
        at: Duration,
    },
}

/// A subscriber's log of one topic.
#[derive(Debug, Clone, Default)]
pub struct SubscriberLog {
    /// A name for the report (`node1/topic2#0`).
    pub name: String,
    /// The topic.
    pub topic: u32,
    /// Publications sent before this are out of its scope (it was not subscribed yet).
    pub from: Duration,
    /// What it received, in order.
    pub entries: Vec<Entry>,
}

/// What became of one acknowledged publication at one subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Exactly once, in order.
    Delivered,
    /// Not delivered, and the subscriber was told (4410 or a new epoch).
    Signalled,
    /// Not delivered, and nothing said so.
    SilentlyLost,
    /// Delivered more than once.
    Duplicated,
    /// Delivered after a later publication of its publisher.
    OutOfOrder,
}

impl Class {
    /// Every class, in report order.
    pub const ALL: [Class; 5] =
        [Self::Delivered, Self::Signalled, Self::SilentlyLost, Self::Duplicated, Self::OutOfOrder];

    /// Whether a run with this class fails.
    pub fn fails(self) -> bool {
        matches!(self, Self::SilentlyLost | Self::Duplicated | Self::OutOfOrder)
    }

    /// The class named `name` as in `FREEBOARD_CHAOS_GATE` (`silently-lost`, `duplicated`,
    /// `out-of-order`, `signalled`, `delivered`).
    pub fn parse(name: &str) -> Option<Class> {
        Self::ALL.into_iter().find(|c| c.name().split(' ').next() == name.split('-').next())
    }

    /// The report's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Delivered => "delivered once in order",
            Self::Signalled => "signalled (4410)",
            Self::SilentlyLost => "silently lost",
            Self::Duplicated => "duplicated",
            Self::OutOfOrder => "out of order",
        }
    }
}

/// A failing classification, with what the report needs to attribute it to a fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Its class (one that fails).
    pub class: Class,
    /// The subscriber's name.
    pub subscriber: String,
    /// The publication.
    pub publisher: u32,
    /// Its topic.
    pub topic: u32,
    /// Its number.
    pub seq: u64,
    /// When it was sent.
    pub sent_at: Duration,
}

/// The checker's answer.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// (publication, subscriber) pairs per class.
    pub counts: HashMap<Class, u64>,
    /// Every pair of a failing class.
    pub findings: Vec<Finding>,
    /// Acknowledged publications.
    pub acked: u64,
    /// Publications not acknowledged, and of them those some subscriber received.
    pub unacked: u64,
    /// See [`unacked`](Self::unacked).
    pub unacked_delivered: u64,
}

impl Verdict {
    /// Pairs of `class`.
    pub fn count(&self, class: Class) -> u64 {
        self.counts.get(&class).copied().unwrap_or(0)
    }

    /// Distinct publications with at least one pair of `class` (a failing one).
    pub fn publications(&self, class: Class) -> usize {
        let mut seen: Vec<(u32, u32, u64)> = self
            .findings
            .iter()
            .filter(|f| f.class == class)
            .map(|f| (f.topic, f.publisher, f.seq))
            .collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }

    /// Whether no pair failed.
    pub fn passed(&self) -> bool {
        self.findings.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} acknowledged publications ({} not acknowledged, {} of them received)",
            self.acked, self.unacked, self.unacked_delivered
        )?;
        writeln!(f, "  (publication, subscriber) pairs by class:")?;
        for class in Class::ALL {
            write!(f, "  {:<26} {}", class.name(), self.count(class))?;
            match class.fails() {
                true => writeln!(f, " ({} publications)", self.publications(class))?,
                false => writeln!(f)?,
            }
        }
        Ok(())
    }
}

/// Classifies every acknowledged publication at every subscriber of its topic that was
/// subscribed when it was sent.
pub fn check(publications: &[Publication], subscribers: &[SubscriberLog]) -> Verdict {
    let mut verdict = Verdict::default();
    let mut delivered_anywhere: HashMap<(u32, u32, u64), bool> = HashMap::new();
    for sub in subscribers {
        // Per publisher: the positions in the log of each of its publications, and where the
        // Gones are.
        let mut positions: HashMap<(u32, u64), Vec<usize>> = HashMap::new();
        let mut by_publisher: HashMap<u32, Vec<(usize, u64)>> = HashMap::new();
        let mut gones = Vec::new();
        for (i, entry) in sub.entries.iter().enumerate() {
            match entry {
                Entry::Message { publisher, seq, .. } => {
                    positions.entry((*publisher, *seq)).or_default().push(i);
                    by_publisher.entry(*publisher).or_default().push((i, *seq));
                    delivered_anywhere.insert((sub.topic, *publisher, *seq), true);
                }
                Entry::Gone { .. } => gones.push(i),
            }
        }
        // Out of order: a first delivery after one of a later number, with no Gone between
        // (after a Gone the stream starts afresh).
        let mut late: HashMap<(u32, u64), bool> = HashMap::new();
        for (publisher, seen) in &by_publisher {
            let mut highest: Option<(usize, u64)> = None;
            for &(i, seq) in seen {
                if let Some((at, high)) = highest {
                    let gone_between = gones.iter().any(|&g| g > at && g < i);
                    if seq < high && !gone_between {
                        late.insert((*publisher, seq), true);
                        continue;
                    }
                    if gone_between || seq > high {
                        highest = Some((i, seq));
                    }
                } else {
                    highest = Some((i, seq));
                }
            }
        }
        for p in publications.iter().filter(|p| p.topic == sub.topic && p.acked) {
            if p.sent_at < sub.from {
                continue;
            }
            let class = match positions.get(&(p.publisher, p.seq)).map_or(0, Vec::len) {
                0 => {
                    // The neighbours it did receive, by position in the log.
                    let seen = by_publisher.get(&p.publisher).map_or(&[][..], Vec::as_slice);
                    let before = seen.iter().filter(|(_, s)| *s < p.seq).map(|(i, _)| *i).max();
                    let after = seen.iter().filter(|(_, s)| *s > p.seq).map(|(i, _)| *i).min();
                    let (lo, hi) = (before.unwrap_or(0), after.unwrap_or(usize::MAX));
                    let told = gones.iter().any(|&g| g >= lo && g <= hi);
                    if told { Class::Signalled } else { Class::SilentlyLost }
                }
                1 if late.contains_key(&(p.publisher, p.seq)) => Class::OutOfOrder,
                1 => Class::Delivered,
                _ => Class::Duplicated,
            };
            *verdict.counts.entry(class).or_default() += 1;
            if class.fails() {
                verdict.findings.push(Finding {
                    class,
                    subscriber: sub.name.clone(),
                    publisher: p.publisher,
                    topic: p.topic,
                    seq: p.seq,
                    sent_at: p.sent_at,
                });
            }
        }
    }
    for p in publications {
        match p.acked {
            true => verdict.acked += 1,
            false => {
                verdict.unacked += 1;
                if delivered_anywhere.contains_key(&(p.topic, p.publisher, p.seq)) {
                    verdict.unacked_delivered += 1;
                }
            }
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publication(seq: u64, acked: bool) -> Publication {
        Publication {
            publisher: 1,
            topic: 0,
            seq,
            acked,
            sent_at: Duration::from_millis(100 + seq),
        }
    }

    fn message(seq: u64) -> Entry {
        Entry::Message { publisher: 1, seq, at: Duration::ZERO }
    }

    fn gone() -> Entry {
        Entry::Gone { at: Duration::ZERO }
    }

    fn log(entries: Vec<Entry>) -> SubscriberLog {
        SubscriberLog { name: "s".into(), topic: 0, from: Duration::ZERO, entries }
    }

    #[test]
    fn every_class_is_told_apart() {
        let publications: Vec<Publication> = (0..10).map(|s| publication(s, true)).collect();
        // 0 1 _ 3 | gone | _ 6 6 8 7 9  (2 lost silently, 4 and 5 signalled, 6 twice,
        // 7 after 8).
        let entries = vec![
            message(0),
            message(1),
            message(3),
            gone(),
            message(6),
            message(6),
            message(8),
            message(7),
            message(9),
        ];
        let verdict = check(&publications, &[log(entries)]);
        assert_eq!(verdict.count(Class::Delivered), 5, "0 1 3 8 9: {verdict}");
        assert_eq!(verdict.count(Class::SilentlyLost), 1, "2");
        assert_eq!(verdict.count(Class::Signalled), 2, "4 5");
        assert_eq!(verdict.count(Class::Duplicated), 1, "6");
        assert_eq!(verdict.count(Class::OutOfOrder), 1, "7");
        let failing: Vec<(Class, u64)> =
            verdict.findings.iter().map(|f| (f.class, f.seq)).collect();
        assert_eq!(
            failing,
            [(Class::SilentlyLost, 2), (Class::Duplicated, 6), (Class::OutOfOrder, 7)]
        );
        assert_eq!(verdict.publications(Class::SilentlyLost), 1);
        let names = ["delivered", "signalled", "silently-lost", "duplicated", "out-of-order"];
        assert_eq!(names.map(|n| Class::parse(n).unwrap()), Class::ALL);
        assert_eq!(Class::parse("lost"), None);
        assert!(!verdict.passed());
    }

    #[test]
    fn a_missing_tail_is_lost_unless_a_gone_came_after_the_last_delivery() {
        let publications: Vec<Publication> = (0..4).map(|s| publication(s, true)).collect();
        let verdict = check(&publications, &[log(vec![message(0), message(1)])]);
        assert_eq!(verdict.count(Class::SilentlyLost), 2);
        let verdict = check(&publications, &[log(vec![message(0), message(1), gone()])]);
        assert_eq!(verdict.count(Class::Signalled), 2);
        assert!(verdict.passed());
    }

    #[test]
    fn a_gone_before_a_hole_does_not_excuse_it() {
        // The Gone came before 1 and 2 were delivered: 3, missing between 2 and 4, was not
        // signalled.
        let publications: Vec<Publication> = (0..5).map(|s| publication(s, true)).collect();
        let entries = vec![message(0), gone(), message(1), message(2), message(4)];
        let verdict = check(&publications, &[log(entries)]);
        assert_eq!(verdict.count(Class::SilentlyLost), 1);
        assert_eq!(verdict.findings[0].seq, 3);
    }

    #[test]
    fn unacknowledged_publications_fail_nothing_and_out_of_scope_ones_are_skipped() {
        let publications = vec![publication(0, true), publication(1, false), publication(2, true)];
        let mut sub = log(vec![message(2)]);
        sub.from = Duration::from_millis(101); // after 0 was sent
        let verdict = check(&publications, &[sub]);
        assert!(verdict.passed(), "{verdict}");
        assert_eq!(verdict.count(Class::Delivered), 1);
        assert_eq!((verdict.acked, verdict.unacked, verdict.unacked_delivered), (2, 1, 0));
    }

    #[test]
    fn order_starts_over_after_a_gone() {
        // After 4410 the subscription starts afresh: an earlier number is no reordering.
        let publications: Vec<Publication> = (0..3).map(|s| publication(s, true)).collect();
        let entries = vec![message(2), gone(), message(0), message(1)];
        let verdict = check(&publications, &[log(entries)]);
        assert_eq!(verdict.count(Class::OutOfOrder), 0, "{verdict}");
        assert_eq!(verdict.count(Class::Delivered), 3);
    }
}
