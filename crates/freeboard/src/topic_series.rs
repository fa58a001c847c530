//! Per-topic figures for the topics an operator names by prefix
//! ([`TopicsConfig::metrics_prefixes`](crate::config::TopicsConfig::metrics_prefixes)): their
//! subscribers, publications, deliveries, the bytes those took as published and as sent
//! (after delta and compression), and drops by policy, on `/metrics` as
//! `freeboard_named_topic_*{topic}` and in the dashboard's topics table.
//!
//! The cardinality is bounded twice: only topics whose name starts with a prefix get a
//! series, and at most [`metrics_topics`](crate::config::TopicsConfig::metrics_topics) of them
//! at once; a subscription to one more is counted in `freeboard_named_topic_left_out_total`
//! instead. A topic has its series from its first subscriber on this node to its last (its
//! counters start again at zero when it comes back, which Prometheus reads as a reset).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use freeboard_buf::SlowConsumerPolicy;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The figures of one named topic on this node.
#[derive(Debug, Default)]
pub(crate) struct TopicFigures {
    subscribers: AtomicI64,
    publishes: AtomicU64,
    deliveries: AtomicU64,
    /// The deliveries' bytes as published (whole frames), and as queued: compressed, as a
    /// delta, or as an event.
    bytes_published: AtomicU64,
    bytes_sent: AtomicU64,
    /// Messages dropped for this topic's subscribers, by [`SlowConsumerPolicy`].
    drops: [AtomicU64; SlowConsumerPolicy::ALL.len()],
}

/// What a fan-out queued: messages, and their bytes as published and as sent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivered {
    pub(crate) messages: u64,
    pub(crate) bytes_published: u64,
    pub(crate) bytes_sent: u64,
}

/// Which topics have series, and their figures; shared by every loop.
#[derive(Debug, Default)]
pub(crate) struct TopicSeries {
    /// The prefixes and the cap, set once when the server starts (none: nothing is kept).
    watch: OnceLock<(Vec<String>, usize)>,
    /// Invariant: at most the cap of entries, each a topic with a subscriber on this node
    /// whose name starts with a prefix.
    table: RwLock<HashMap<Arc<str>, Arc<TopicFigures>>>,
    left_out: AtomicU64,
}

impl TopicSeries {
    /// Keeps series for topics starting with one of `prefixes` (an empty one names every
    /// topic), at most `max` at once. Only the first call counts.
    pub(crate) fn watch(&self, prefixes: &[String], max: usize) {
        if !prefixes.is_empty() {
            let _ = self.watch.set((prefixes.to_vec(), max));
        }
    }

    /// Whether `topic` is named by a prefix (the check every hook makes first: no lock when
    /// the operator named nothing, or not this topic).
    fn named(&self, topic: &str) -> Option<usize> {
        let (prefixes, max) = self.watch.get()?;
        prefixes.iter().any(|p| topic.starts_with(p.as_str())).then_some(*max)
    }

    /// A subscriber of `topic` joined on some loop.
    pub(crate) fn subscribed(&self, topic: &Arc<str>) {
        let Some(max) = self.named(topic) else { return };
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        if !table.contains_key(&**topic) && table.len() >= max {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let figures = table.entry(topic.clone()).or_default();
        figures.subscribers.fetch_add(1, Ordering::Relaxed);
    }

    /// A subscriber of `topic` left; the series goes with the topic's last subscriber.
    pub(crate) fn unsubscribed(&self, topic: &str) {
        if self.named(topic).is_none() {
            return;
        }
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        // A topic left out at its subscription has no entry.
        let Some(figures) = table.get(topic) else { return };
        if figures.subscribers.fetch_sub(1, Ordering::Relaxed) <= 1 {
            table.remove(topic);
        }
    }

    /// The figures of `topic`, if it has a series.
    fn figures(&self, topic: &str) -> Option<Arc<TopicFigures>> {
        self.named(topic)?;
        self.table.read().unwrap_or_else(|e| e.into_inner()).get(topic).cloned()
    }

    /// A publication to `topic` from this node.
    pub(crate) fn published(&self, topic: &str) {
        if let Some(figures) = self.figures(topic) {
            figures.publishes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What one loop's fan-out of a run of publications to `topic` came to: messages queued,
    /// their bytes as published and as sent, and the drops by policy.
    pub(crate) fn fanned_out(&self, topic: &str, delivered: &Delivered, drops: &[u64]) {
        let Some(figures) = self.figures(topic) else { return };
        figures.deliveries.fetch_add(delivered.messages, Ordering::Relaxed);
        figures.bytes_published.fetch_add(delivered.bytes_published, Ordering::Relaxed);
        figures.bytes_sent.fetch_add(delivered.bytes_sent, Ordering::Relaxed);
        for (counter, &n) in figures.drops.iter().zip(drops) {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// Topics with a series now.
    pub(crate) fn len(&self) -> usize {
        self.table.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Subscriptions to named topics that found the series at their cap.
    pub(crate) fn left_out(&self) -> u64 {
        self.left_out.load(Ordering::Relaxed)
    }

    /// The topics table of the dashboard: the prefixes, the cap, what was left out, and per
    /// topic (by subscribers, most first) its counters since its series began.
    pub(crate) fn json(&self) -> serde_json::Value {
        let (prefixes, max) = self.watch.get().cloned().unwrap_or_default();
        let mut rows: Vec<(Arc<str>, Arc<TopicFigures>)> = {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            table.iter().map(|(t, f)| (t.clone(), f.clone())).collect()
        };
        let load = |a: &AtomicI64| a.load(Ordering::Relaxed);
        rows.sort_by(|a, b| {
            load(&b.1.subscribers).cmp(&load(&a.1.subscribers)).then(a.0.cmp(&b.0))
        });
        let topics: Vec<serde_json::Value> = rows
            .iter()
            .map(|(topic, f)| {
                let drops: serde_json::Map<String, serde_json::Value> = SlowConsumerPolicy::ALL
                    .iter()
                    .zip(&f.drops)
                    .map(|(p, n)| (p.name().to_owned(), n.load(Ordering::Relaxed).into()))
                    .collect();
                serde_json::json!({
                    "topic": &**topic,
                    "subscribers": f.subscribers.load(Ordering::Relaxed),
                    "publishes": f.publishes.load(Ordering::Relaxed),
                    "deliveries": f.deliveries.load(Ordering::Relaxed),
                    "bytes_published": f.bytes_published.load(Ordering::Relaxed),
                    "bytes_sent": f.bytes_sent.load(Ordering::Relaxed),
                    "drops": drops,
                })
            })
            .collect();
        serde_json::json!({
            "prefixes": prefixes,
            "max_topics": max,
            "left_out": self.left_out(),
            "topics": topics,
        })
    }
}

/// The `freeboard_named_topic_*` series, read at each scrape.
#[derive(Debug)]
pub(crate) struct TopicSeriesCollector(pub(crate) Arc<TopicSeries>);

/// The labels of a named topic's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct TopicLabel {
    topic: String,
}

/// The labels of a named topic's drops.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct TopicDropLabels {
    topic: String,
    reason: &'static str,
}

impl Collector for TopicSeriesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let series = &self.0;
        let e = encoder.encode_descriptor(
            "freeboard_named_topic_series",
            "Topics with per-topic series now (named by --topic-metrics-prefix, at most \
             --topic-metrics-max)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(series.len() as i64).encode(e)?;
        let e = encoder.encode_descriptor(
            "freeboard_named_topic_left_out",
            "Subscriptions to named topics that got no series: the per-topic series were at \
             their cap",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(series.left_out()).encode(e)?;
        if series.watch.get().is_none() {
            return Ok(());
        }
        let rows: Vec<(String, Arc<TopicFigures>)> = {
            let table = series.table.read().unwrap_or_else(|e| e.into_inner());
            table.iter().map(|(t, f)| (t.to_string(), f.clone())).collect()
        };
        let mut e = encoder.encode_descriptor(
            "freeboard_named_topic_subscribers",
            "Subscribers of a named topic on this node",
            None,
            MetricType::Gauge,
        )?;
        for (topic, f) in &rows {
            let n = f.subscribers.load(Ordering::Relaxed);
            ConstGauge::new(n).encode(e.encode_family(&TopicLabel { topic: topic.clone() })?)?;
        }
        for (name, help, read) in [
            (
                "freeboard_named_topic_publishes",
                "Publications of this node to a named topic",
                (|f: &TopicFigures| f.publishes.load(Ordering::Relaxed))
                    as fn(&TopicFigures) -> u64,
            ),
            (
                "freeboard_named_topic_deliveries",
                "Publications of a named topic queued to its subscribers on this node",
                |f: &TopicFigures| f.deliveries.load(Ordering::Relaxed),
            ),
            (
                "freeboard_named_topic_delivered_bytes_as_published",
                "Bytes of a named topic's deliveries on this node as published (whole frames)",
                |f: &TopicFigures| f.bytes_published.load(Ordering::Relaxed),
            ),
            (
                "freeboard_named_topic_delivered_bytes_sent",
                "Bytes of a named topic's deliveries on this node as queued to its subscribers: \
                 compressed, as deltas or as events",
                |f: &TopicFigures| f.bytes_sent.load(Ordering::Relaxed),
            ),
        ] {
            let mut e = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (topic, f) in &rows {
                let label = TopicLabel { topic: topic.clone() };
                ConstCounter::new(read(f)).encode(e.encode_family(&label)?)?;
            }
        }
        let mut e = encoder.encode_descriptor(
            "freeboard_named_topic_drops",
            "Messages of a named topic dropped for its subscribers, by slow-consumer policy",
            None,
            MetricType::Counter,
        )?;
        for (topic, f) in &rows {
            for (policy, n) in SlowConsumerPolicy::ALL.iter().zip(&f.drops) {
                let labels = TopicDropLabels { topic: topic.clone(), reason: policy.name() };
                ConstCounter::new(n.load(Ordering::Relaxed)).encode(e.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_named_topics_get_series_and_no_more_than_the_cap() {
        let series = TopicSeries::default();
        let name = |t: &str| Arc::<str>::from(t);
        // Nothing named: nothing kept, nothing counted as left out.
        series.subscribed(&name("room.1"));
        assert_eq!((series.len(), series.left_out()), (0, 0));

        series.watch(&["room.".into(), "desk.".into()], 3);
        for topic in ["room.1", "room.2", "lobby", "desk.9", "room.3", "room.4"] {
            series.subscribed(&name(topic));
        }
        // room.1, room.2, desk.9 took the three series; room.3 and room.4 were left out.
        assert_eq!((series.len(), series.left_out()), (3, 2));
        series.subscribed(&name("room.1"));
        assert_eq!(series.len(), 3, "a second subscriber of a topic with a series");
        series.published("room.1");
        series.published("lobby");
        let delivered = Delivered { messages: 2, bytes_published: 2000, bytes_sent: 300 };
        series.fanned_out("room.1", &delivered, &[0, 1, 0, 3, 0]);
        let json = series.json();
        let room = json["topics"].as_array().unwrap().iter().find(|t| t["topic"] == "room.1");
        let room = room.unwrap();
        assert_eq!(room["subscribers"], 2);
        assert_eq!((room["publishes"].as_u64(), room["deliveries"].as_u64()), (Some(1), Some(2)));
        assert_eq!(room["drops"]["conflate"], 3);
        assert_eq!(
            (room["bytes_published"].as_u64(), room["bytes_sent"].as_u64()),
            (Some(2000), Some(300))
        );
        assert_eq!(json["topics"][0]["topic"], "room.1", "most subscribers first");

        // A series goes with its topic's last subscriber, and makes room for another.
        series.unsubscribed("room.1");
        assert_eq!(series.len(), 3);
        series.unsubscribed("room.1");
        series.unsubscribed("room.3"); // left out: nothing to take away
        assert_eq!(series.len(), 2);
        series.subscribed(&name("room.3"));
        assert_eq!((series.len(), series.left_out()), (3, 2));
    }
}
