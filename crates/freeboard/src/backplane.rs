//! Topics across machines: what the topic hub asks of a backplane, and the link through which a
//! backplane hands it what other nodes published.
//!
//! The runtime has no backplane of its own; `freeboard-topics` implements one on Redis and
//! Redis Cluster. A server is given one with
//! [`Server::bind_with_backplane`](crate::Server::bind_with_backplane). The hub then tells it
//! when a topic gets its first subscriber on this node and loses its last, and gives it every
//! publication of this node; the backplane delivers what arrives from other nodes through its
//! [`Link`]. A backplane may also keep the topics' history (it gives publications their
//! offsets, and fetches what a reconnecting subscriber missed): the node's own history is
//! then a cache of what the backplane keeps ([`History`] of
//! [`Source::Backplane`](crate::history::Source::Backplane)).

use std::io;
use std::sync::Arc;

use freeboard_proto::MessageKind;

use crate::history::{History, Offset};
use crate::metrics::Metrics;
use crate::presence::Presence;
use crate::receipt::Receipt;

/// A node's end of a backplane. Every method but [`start`](Self::start) is called from the
/// event loops (and `ServerHandle::publish`'s threads): none may block.
pub trait Backplane: Send + Sync + 'static {
    /// Whether the backplane keeps the history of the topics that keep one (giving each
    /// publication its offset and delivering it to this node too); asked once, before
    /// [`start`](Self::start). Default `false`: the node keeps history in memory.
    fn keeps_history(&self) -> bool {
        false
    }

    /// Starts the backplane's work (its threads, its connections), once, when the server is
    /// bound and before any loop runs. An error fails the bind.
    fn start(&mut self, link: Link) -> io::Result<()>;

    /// `topic` got its first subscriber on this node. Calls for one topic come in the order
    /// the changes happened.
    fn subscribe(&self, topic: &Arc<str>);

    /// `topic` lost its last subscriber on this node.
    fn unsubscribe(&self, topic: &Arc<str>);

    /// A publication of this node, for the other nodes (`kept`: the topic's history is kept
    /// by the backplane, which delivers it back to this node with its offset). `false` if it
    /// could not be taken; the backplane counts why in
    /// `freeboard_backplane_lost_total{reason}` ([`Metrics::backplane_lost`]).
    fn publish(&self, topic: &str, kind: MessageKind, payload: &[u8], kept: bool) -> bool;

    /// Whether the backplane is connected now where `topic`'s publications go: what it takes
    /// for the topic is on its way to the broker. While it is not, a publication it queued
    /// may still be lost, so a `POST` answer says its outcome is unknown (202). Default
    /// `true`.
    fn is_connected(&self, topic: &str) -> bool {
        let _ = topic;
        true
    }

    /// Whether [`publish_acknowledged`](Self::publish_acknowledged) reports when a kept
    /// publication is durable, so that a publish answer can wait for it (`--durability`).
    /// Default `false`: answers do not wait.
    fn acknowledges(&self) -> bool {
        false
    }

    /// A publication of this node to a topic whose history the backplane keeps, whose answer
    /// waits for `ack`: the backplane says [`Acknowledgement::durable`] once the publication
    /// would survive what its durability promises (dropping `ack` says it would not).
    /// `false`, as [`publish`](Self::publish), if it could not be taken. Default: taken as by
    /// `publish`, acknowledged at once.
    fn publish_acknowledged(
        &self,
        topic: &str,
        kind: MessageKind,
        payload: &[u8],
        ack: Acknowledgement,
    ) -> bool {
        let taken = self.publish(topic, kind, payload, true);
        if taken {
            ack.durable();
        }
        taken
    }

    /// A subscriber reconnects to `topic` having last seen `since`, and the backplane keeps
    /// its history: bring what it missed into this node's [`History`]
    /// ([`History::fill`]), then say [`AwaitingHistory::ready`]. Default: ready at once.
    fn recover(&self, topic: &str, since: Offset, awaiting: AwaitingHistory) {
        let _ = (topic, since);
        awaiting.ready();
    }
}

/// A publication another node made (or, for a topic whose history the backplane keeps, any
/// node), as the backplane hands it to this node.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'m> {
    /// The topic.
    pub topic: &'m str,
    /// Text or binary.
    pub kind: MessageKind,
    /// The payload; for a topic whose history the backplane keeps, with its envelope
    /// (`{offset}:` first).
    pub data: &'m [u8],
    /// The offset, for a topic whose history the backplane keeps.
    pub offset: Option<Offset>,
}

/// What a backplane is given when it starts: the way to this node's subscribers, the node's
/// history (if the server keeps one) and its metrics.
#[derive(Clone)]
pub struct Link {
    deliver: Arc<dyn Fn(Arrival<'_>) -> bool + Send + Sync>,
    end_history: Arc<dyn Fn(&str) + Send + Sync>,
    history: Option<Arc<History>>,
    presence: Option<Arc<Presence>>,
    metrics: Arc<Metrics>,
}

impl Link {
    pub(crate) fn new(
        deliver: impl Fn(Arrival<'_>) -> bool + Send + Sync + 'static,
        end_history: impl Fn(&str) + Send + Sync + 'static,
        history: Option<Arc<History>>,
        presence: Option<Arc<Presence>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (deliver, end_history) = (Arc::new(deliver), Arc::new(end_history));
        Self { deliver, end_history, history, presence, metrics }
    }

    /// The node's presence, if the server keeps one: a backplane that carries it
    /// ([`Presence::carry`]) writes this node's members where the other nodes read them, and
    /// gives this node the other nodes' parts ([`Presence::sync_node`]).
    pub fn presence(&self) -> Option<&Arc<Presence>> {
        self.presence.as_ref()
    }

    /// Delivers `arrival` to every loop of this node with a subscriber to its topic (keeping
    /// it in the topic's history if it carries an offset). `false` once the server is gone:
    /// the backplane's threads should end then.
    pub fn deliver(&self, arrival: Arrival<'_>) -> bool {
        (self.deliver)(arrival)
    }

    /// The history of `topic` (one whose history the backplane keeps) can no longer be vouched
    /// for on this node: a message of a new epoch arrived, or what it missed while its
    /// subscription was away cannot be fetched. Every local subscriber of the topic is closed
    /// with [`HISTORY_GONE`](crate::history::HISTORY_GONE) before the next message reaches it
    /// (call it before delivering that message), and resumes or starts afresh.
    pub fn end_history(&self, topic: &str) {
        (self.end_history)(topic);
    }

    /// The node's history, if the server keeps one.
    pub fn history(&self) -> Option<&Arc<History>> {
        self.history.as_ref()
    }

    /// The server's metrics (the backplane's counters are among them).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("history", &self.history.is_some()).finish_non_exhaustive()
    }
}

/// A publish answer waiting for the backplane to say whether one publication is durable.
/// Dropping it unanswered says it is not (the answer is then 503).
pub struct Acknowledgement {
    receipt: Option<Arc<Receipt>>,
}

impl Acknowledgement {
    pub(crate) fn new(receipt: Arc<Receipt>) -> Self {
        Self { receipt: Some(receipt) }
    }

    /// The publication is durable: the answer may say it was accepted.
    pub fn durable(mut self) {
        if let Some(receipt) = self.receipt.take() {
            receipt.acknowledge(true);
        }
    }
}

impl Drop for Acknowledgement {
    fn drop(&mut self) {
        if let Some(receipt) = self.receipt.take() {
            receipt.acknowledge(false);
        }
    }
}

impl std::fmt::Debug for Acknowledgement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acknowledgement").finish_non_exhaustive()
    }
}

/// A reconnecting subscriber's upgrade, held until its topic's history is at hand. Dropping it
/// unanswered refuses the upgrade with 503.
pub struct AwaitingHistory {
    answer: Option<Box<Answer>>,
}

/// Completes the upgrade: accepted, or refused with 503 for a reason.
type Answer = dyn FnOnce(Result<(), &'static str>) + Send;

impl AwaitingHistory {
    pub(crate) fn new(answer: impl FnOnce(Result<(), &'static str>) + Send + 'static) -> Self {
        Self { answer: Some(Box::new(answer)) }
    }

    /// What the subscriber missed is in the node's history (or is known to be gone, which the
    /// connection is told when it opens): the upgrade is accepted.
    pub fn ready(mut self) {
        self.answer(Ok(()));
    }

    /// The history cannot be had now: the upgrade is refused with 503, counted in
    /// `freeboard_access_refusals_total{reason}` under `reason`.
    pub fn unavailable(mut self, reason: &'static str) {
        self.answer(Err(reason));
    }

    fn answer(&mut self, result: Result<(), &'static str>) {
        if let Some(answer) = self.answer.take() {
            answer(result);
        }
    }
}

impl Drop for AwaitingHistory {
    fn drop(&mut self) {
        self.answer(Err("history_unavailable"));
    }
}

impl std::fmt::Debug for AwaitingHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwaitingHistory").finish_non_exhaustive()
    }
}

/// Where an upgrade with `?since=` goes when a backplane keeps the topics' history.
#[derive(Clone)]
pub(crate) struct Recoverer {
    pub(crate) backplane: Arc<dyn Backplane>,
    pub(crate) history: Arc<History>,
}

impl Recoverer {
    /// Has what a subscriber of `topic` missed since `since` brought into the node's history,
    /// then calls `answer`; at once when there is nothing to bring (the topic keeps no
    /// history, or `since` is no offset: the connection is told when it opens).
    pub(crate) fn recover(
        &self,
        topic: &str,
        since: &str,
        answer: impl FnOnce(Result<(), &'static str>) + Send + 'static,
    ) {
        match Offset::parse(since).filter(|_| self.history.applies(topic)) {
            Some(since) => self.backplane.recover(topic, since, AwaitingHistory::new(answer)),
            None => answer(Ok(())),
        }
    }
}
