//! What stands in for the Redis backplane in a build without the `topic-service` feature: the
//! names the hub and the server use, none of which can be made. A server configured with
//! `topics.redis` is refused at bind, naming the feature.

use std::convert::Infallible;
use std::io;
use std::sync::Arc;

use freeboard_proto::MessageKind;

use crate::MissingFeature;
use crate::handler::{Accepted, Decision};
use crate::history::{History, Offset};
use crate::metrics::Metrics;

/// The Redis servers to use: none in this build.
pub(crate) struct RedisAddr {
    never: Infallible,
}

impl RedisAddr {
    /// Refuses every URL: this build has no Redis client.
    pub(crate) fn parse(_urls: &str) -> Result<Self, String> {
        Err(MissingFeature { setting: "topics.redis", feature: "topic-service" }.to_string())
    }
}

/// A message from another node. The hub's delivery path is written against it; nothing makes
/// one in this build.
#[allow(dead_code)]
pub(crate) struct Incoming<'m> {
    pub(crate) topic: &'m str,
    pub(crate) kind: MessageKind,
    pub(crate) data: &'m [u8],
    pub(crate) offset: Option<Offset>,
}

/// Where upgrades with `?since=` on topics kept in Redis go: nowhere in this build.
#[derive(Clone)]
pub(crate) struct Recoverer {
    never: Infallible,
}

impl Recoverer {
    pub(crate) fn recover(&self, _topic: &str, _since: &str, _: Decision, _: Accepted) {
        match self.never {}
    }
}

/// This node's end of the backplane: never started in this build.
pub(crate) struct Backplane {
    pub(crate) recoverer: Option<Recoverer>,
    never: Infallible,
}

impl Backplane {
    pub(crate) fn start(
        addr: RedisAddr,
        _queue_bytes: usize,
        _metrics: Arc<Metrics>,
        _history: Option<Arc<History>>,
        _deliver: impl Fn(Incoming<'_>) -> bool + Send + Sync + 'static,
    ) -> io::Result<Self> {
        match addr.never {}
    }

    pub(crate) fn subscribe(&self, _topic: &Arc<str>) {
        match self.never {}
    }

    pub(crate) fn unsubscribe(&self, _topic: &Arc<str>) {
        match self.never {}
    }

    pub(crate) fn publish(&self, _: &str, _: MessageKind, _: &[u8], _kept: bool) -> bool {
        match self.never {}
    }
}
