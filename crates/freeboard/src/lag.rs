//! Subscriber lag as an operator sees it: each loop's slowest subscribers and the
//! distribution of every subscriber's lag (bytes in its send queue, and how long the queue has
//! held unsent bytes), found by a sweep the loop spreads over its turns.
//!
//! # Bounded work
//!
//! A loop sweeps its connection table in steps of at most [`SWEEP_STEP`] slots per turn,
//! and starts a sweep at most once per [`SWEEP_INTERVAL`]. A step costs about 35 ns a slot
//! (a release build, 18,000 topic subscribers on two loops: 36 µs for 1,024 slots; 4,096 took
//! 130 µs, too much to add to a turn), so a loop with a million connections adds some 40 µs to
//! a turn and has the figures within 977 turns, instead of stalling for a whole walk (some
//! 35 ms) on a request; the dashboard
//! and `/metrics` read the last finished sweep of each loop and never walk connections
//! themselves. During a sweep a loop keeps only the [`SLOWEST`] largest queues it has seen
//! (a bounded list of tokens), and builds their records once, at the end.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freeboard_buf::SlowConsumerPolicy;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// Connection-table slots a loop sweeps per turn.
pub(crate) const SWEEP_STEP: usize = 1024;

/// How often a loop starts a sweep, at most.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Subscribers each loop keeps as its slowest (largest send queues).
pub(crate) const SLOWEST: usize = 20;

/// Upper bounds of the queue-bytes distribution (`freeboard_subscriber_lag_queue_bytes{le}`).
pub(crate) const QUEUE_BOUNDS: [u64; 9] =
    [0, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];

/// Upper bounds, in milliseconds, of the distribution of how long subscribers' queues have
/// held unsent bytes (`freeboard_subscriber_lag_oldest_unsent_seconds{le}`).
pub(crate) const AGE_BOUNDS_MS: [u64; 10] =
    [0, 10, 100, 250, 1000, 2500, 5000, 10_000, 30_000, 60_000];

/// One slow subscriber, as its loop saw it at the end of a sweep.
#[derive(Debug, Clone)]
pub(crate) struct SlowSubscriber {
    /// `loop.token.serial`: names the connection while it lives (a reused slot has another
    /// serial).
    pub(crate) id: String,
    pub(crate) peer: SocketAddr,
    /// Who the connection is, as its route's access said (a token's `sub`).
    pub(crate) subject: Option<Arc<str>>,
    pub(crate) path: String,
    pub(crate) policy: SlowConsumerPolicy,
    pub(crate) queue_bytes: usize,
    pub(crate) queued_messages: u32,
    /// Since when (ms since 1970) its queue has held unsent bytes without emptying: its
    /// oldest unsent message is at most that old (exactly, under `block` and `close`; under
    /// `drop-oldest` and `conflate` older messages may have been dropped in favour of newer).
    pub(crate) unsent_since_ms: u64,
    pub(crate) high_watermark: usize,
    pub(crate) cap: usize,
    /// Below its high watermark.
    pub(crate) writable: bool,
    pub(crate) compressed: bool,
    /// Its first topics (at most [`TOPICS_SHOWN`]) and how many it has.
    pub(crate) topics: Vec<Arc<str>>,
    pub(crate) topic_count: usize,
}

/// Topics a slow subscriber's record names.
pub(crate) const TOPICS_SHOWN: usize = 8;

/// A sweep in progress, or the wait for the next.
#[derive(Debug, Default)]
pub(crate) struct LagSweep {
    /// The next slot to look at; `None` between sweeps.
    pub(crate) cursor: Option<usize>,
    /// When the running sweep began, or the last one ended (the loop's clock).
    pub(crate) started: Option<freeboard_proto::Instant>,
    /// The distribution so far.
    pub(crate) lag: LoopLag,
    /// The largest queues so far, `(bytes, token, serial)`, largest first.
    ///
    /// Invariant: at most [`SLOWEST`] entries.
    pub(crate) slowest: Vec<(usize, usize, u64)>,
}

/// What one loop's last finished sweep found.
#[derive(Debug, Clone, Default)]
pub(crate) struct LoopLag {
    /// Largest queue first; at most [`SLOWEST`].
    pub(crate) slowest: Vec<SlowSubscriber>,
    /// Subscribers per bucket of [`QUEUE_BOUNDS`] (not cumulative; the last is above them).
    pub(crate) queue_counts: [u64; QUEUE_BOUNDS.len() + 1],
    /// Subscribers per bucket of [`AGE_BOUNDS_MS`] (not cumulative).
    pub(crate) age_counts: [u64; AGE_BOUNDS_MS.len() + 1],
    /// When the sweep ended, in ms since 1970 (0: none yet).
    pub(crate) swept_at_ms: u64,
    /// How long it took, in ms of the loop's clock.
    pub(crate) took_ms: u64,
    /// The longest one turn's step of it took, in microseconds: what the sweep adds to a turn.
    pub(crate) longest_step_us: u64,
    /// The turns it took (steps of at most [`SWEEP_STEP`] slots).
    pub(crate) steps: u32,
}

impl LoopLag {
    /// Counts one subscriber's lag.
    pub(crate) fn observe(&mut self, queue_bytes: u64, age_ms: u64) {
        self.queue_counts[QUEUE_BOUNDS.partition_point(|&b| b < queue_bytes)] += 1;
        self.age_counts[AGE_BOUNDS_MS.partition_point(|&b| b < age_ms)] += 1;
    }
}

/// Every loop's last sweep; what the dashboard and `/metrics` read.
#[derive(Debug, Default)]
pub(crate) struct LagBoard {
    loops: Mutex<Vec<LoopLag>>,
}

impl LagBoard {
    /// Makes room for `n` loops.
    pub(crate) fn set_loops(&self, n: u32) {
        let mut loops = self.loops.lock().unwrap_or_else(|e| e.into_inner());
        loops.resize_with(n as usize, LoopLag::default);
    }

    /// Loop `index` finished a sweep.
    pub(crate) fn report(&self, index: u32, lag: LoopLag) {
        let mut loops = self.loops.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = loops.get_mut(index as usize) {
            *slot = lag;
        }
    }

    /// The `n` slowest subscribers of the server (largest queue first) and the distribution,
    /// as the dashboard's JSON.
    pub(crate) fn slowest_json(&self, n: usize, now_ms: u64) -> serde_json::Value {
        let loops = self.loops.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut all: Vec<&SlowSubscriber> = loops.iter().flat_map(|l| &l.slowest).collect();
        all.sort_by(|a, b| {
            b.queue_bytes.cmp(&a.queue_bytes).then(a.unsent_since_ms.cmp(&b.unsent_since_ms))
        });
        let slowest: Vec<serde_json::Value> =
            all.iter().take(n).map(|s| record(s, now_ms)).collect();
        let (queue, age) = totals(&loops);
        let subscribers: u64 = queue.iter().sum();
        let sweeps: Vec<serde_json::Value> = loops
            .iter()
            .map(|l| {
                serde_json::json!({
                    "swept_at_ms": l.swept_at_ms,
                    "took_ms": l.took_ms,
                    "longest_step_us": l.longest_step_us,
                    "steps": l.steps,
                })
            })
            .collect();
        serde_json::json!({
            "at_ms": now_ms,
            "subscribers": subscribers,
            "slowest": slowest,
            "queue_bytes": bounds_json(&QUEUE_BOUNDS, 1.0, &queue),
            "oldest_unsent_seconds": bounds_json(&AGE_BOUNDS_MS, 0.001, &age),
            "sweeps": sweeps,
        })
    }

    /// One connection's record, if a loop's last sweep counted it among its slowest.
    pub(crate) fn connection_json(&self, id: &str, now_ms: u64) -> Option<serde_json::Value> {
        let loops = self.loops.lock().unwrap_or_else(|e| e.into_inner());
        let found = loops.iter().flat_map(|l| &l.slowest).find(|s| s.id == id)?;
        Some(record(found, now_ms))
    }
}

/// The JSON of one slow subscriber at `now_ms`.
fn record(s: &SlowSubscriber, now_ms: u64) -> serde_json::Value {
    let topics: Vec<&str> = s.topics.iter().map(|t| &**t).collect();
    serde_json::json!({
        "id": s.id,
        "peer": s.peer.to_string(),
        "sub": s.subject.as_deref(),
        "path": s.path,
        "policy": s.policy.name(),
        "queue_bytes": s.queue_bytes,
        "queued_messages": s.queued_messages,
        "oldest_unsent_ms": now_ms.saturating_sub(s.unsent_since_ms),
        "high_watermark": s.high_watermark,
        "cap": s.cap,
        "writable": s.writable,
        "compressed": s.compressed,
        "topics": topics,
        "topic_count": s.topic_count,
    })
}

/// The loops' distributions added up.
fn totals(loops: &[LoopLag]) -> ([u64; QUEUE_BOUNDS.len() + 1], [u64; AGE_BOUNDS_MS.len() + 1]) {
    let mut queue = [0; QUEUE_BOUNDS.len() + 1];
    let mut age = [0; AGE_BOUNDS_MS.len() + 1];
    for l in loops {
        queue.iter_mut().zip(l.queue_counts).for_each(|(a, n)| *a += n);
        age.iter_mut().zip(l.age_counts).for_each(|(a, n)| *a += n);
    }
    (queue, age)
}

/// `[[le, subscribers at or below], …]`, cumulative, ending with `"+Inf"`.
fn bounds_json(bounds: &[u64], scale: f64, counts: &[u64]) -> serde_json::Value {
    let mut total = 0;
    let rows: Vec<serde_json::Value> = counts
        .iter()
        .enumerate()
        .map(|(i, n)| {
            total += n;
            match bounds.get(i) {
                Some(&b) => serde_json::json!([b as f64 * scale, total]),
                None => serde_json::json!(["+Inf", total]),
            }
        })
        .collect();
    rows.into()
}

/// The labels of a lag bucket.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct Le {
    le: String,
}

/// The `freeboard_subscriber_lag_*` series: gauges with an `le` label, cumulative like a
/// histogram's buckets (`histogram_quantile` reads them), counting the subscribers at or below
/// each bound as of each loop's last sweep.
#[derive(Debug)]
pub(crate) struct LagCollector(pub(crate) Arc<LagBoard>);

impl Collector for LagCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let loops = self.0.loops.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (queue, age) = totals(&loops);
        // Name, help, bounds (in units), what one unit is in the exposed one, counts.
        let queue_bytes = (
            "freeboard_subscriber_lag_queue_bytes",
            "Subscribers whose send queue holds at most le bytes (each loop's last sweep)",
            &QUEUE_BOUNDS[..],
            1.0,
            &queue[..],
        );
        let oldest_unsent = (
            "freeboard_subscriber_lag_oldest_unsent_seconds",
            "Subscribers whose send queue has held unsent bytes for at most le seconds \
             (each loop's last sweep)",
            &AGE_BOUNDS_MS[..],
            0.001,
            &age[..],
        );
        for (name, help, bounds, scale, counts) in [queue_bytes, oldest_unsent] {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            let mut total = 0;
            for (i, n) in counts.iter().enumerate() {
                total += *n as i64;
                let le = match bounds.get(i) {
                    Some(&b) => format!("{}", b as f64 * scale),
                    None => "+Inf".to_owned(),
                };
                ConstGauge::new(total).encode(e.encode_family(&Le { le })?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slow(id: &str, queue_bytes: usize) -> SlowSubscriber {
        SlowSubscriber {
            id: id.into(),
            peer: "127.0.0.1:4000".parse().unwrap(),
            subject: Some(Arc::from("someone")),
            path: "/topic/".into(),
            policy: SlowConsumerPolicy::Conflate,
            queue_bytes,
            queued_messages: 1,
            unsent_since_ms: 1_000,
            high_watermark: 64 << 10,
            cap: 1 << 20,
            writable: true,
            compressed: false,
            topics: vec![Arc::from("scores")],
            topic_count: 1,
        }
    }

    #[test]
    fn the_slowest_of_every_loop_merge_largest_first_and_the_distribution_adds_up() {
        let board = LagBoard::default();
        board.set_loops(2);
        let mut a =
            LoopLag { slowest: vec![slow("0.1.1", 500), slow("0.2.2", 20)], ..Default::default() };
        a.observe(500, 2_000);
        a.observe(20, 5);
        a.observe(0, 0);
        let mut b = LoopLag { slowest: vec![slow("1.1.1", 9_000)], ..Default::default() };
        b.observe(9_000, 70_000);
        board.report(0, a);
        board.report(1, b);
        board.report(7, LoopLag::default()); // no such loop: ignored

        let json = board.slowest_json(2, 3_500);
        let ids: Vec<&str> =
            json["slowest"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["1.1.1", "0.1.1"], "largest queue first, at most n");
        assert_eq!(json["slowest"][0]["oldest_unsent_ms"], 2_500);
        assert_eq!(json["subscribers"], 4);
        // Cumulative: at most 0 bytes: 1; at most 1 KiB: 3; above 16 MiB: none more.
        assert_eq!(json["queue_bytes"][0], serde_json::json!([0.0, 1]));
        assert_eq!(json["queue_bytes"][1], serde_json::json!([1024.0, 3]));
        assert_eq!(json["queue_bytes"][QUEUE_BOUNDS.len()], serde_json::json!(["+Inf", 4]));
        // 70 s is above the last bound (60 s).
        let age = &json["oldest_unsent_seconds"];
        assert_eq!(age[AGE_BOUNDS_MS.len() - 1], serde_json::json!([60.0, 3]));
        assert_eq!(age[AGE_BOUNDS_MS.len()], serde_json::json!(["+Inf", 4]));

        assert_eq!(board.connection_json("0.2.2", 3_500).unwrap()["sub"], "someone");
        assert!(board.connection_json("0.9.9", 3_500).is_none());
    }
}
