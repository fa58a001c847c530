//! Counters and gauges exported on `/metrics` in the Prometheus text format.

use std::sync::atomic::{AtomicU32, Ordering};

use freeboard_buf::{Limit, PushOutcome, SlowConsumerPolicy};
use freeboard_proto::CloseCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels naming why something happened (a close reason, a refusal status, a policy).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    /// The reason.
    pub reason: String,
}

/// Labels carrying an HTTP status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Status {
    /// The status code.
    pub status: u16,
}

/// Labels naming one event loop.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoopLabel {
    /// The loop's index.
    pub event_loop: u32,
}

/// One loop's gauges, looked up once: a family lookup hashes its labels under a lock, too
/// much for every loop turn.
pub(crate) struct LoopGauges {
    pub(crate) chunks_in_use: Gauge,
    pub(crate) chunks_high_water: Gauge,
    pub(crate) slots_in_use: Gauge,
    pub(crate) slots_high_water: Gauge,
    pub(crate) bytes_buffered: Gauge,
    pub(crate) allocation_failures: Gauge,
}

impl LoopGauges {
    pub(crate) fn new(metrics: &Metrics, event_loop: u32) -> Self {
        let label = LoopLabel { event_loop };
        let gauge = |family: &Family<LoopLabel, Gauge>| family.get_or_create(&label).clone();
        Self {
            chunks_in_use: gauge(&metrics.chunks_in_use),
            chunks_high_water: gauge(&metrics.chunks_high_water),
            slots_in_use: gauge(&metrics.slots_in_use),
            slots_high_water: gauge(&metrics.slots_high_water),
            bytes_buffered: gauge(&metrics.bytes_buffered),
            allocation_failures: gauge(&metrics.allocation_failures),
        }
    }
}

/// Per-message counts one loop keeps in plain integers and adds to the shared [`Metrics`]
/// once per loop turn, so the hot path touches no shared cache line.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LoopStats {
    pub(crate) messages_in: u64,
    pub(crate) messages_out: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    /// Published messages queued to subscribers.
    pub(crate) deliveries: u64,
    /// Messages dropped by slow-consumer policies, counted here so a drop allocates nothing.
    pub(crate) policy_drops: PolicyCounts,
    /// Messages refused because the pool was short through no fault of their connection.
    pub(crate) pool_exhausted: u64,
}

/// The `drops` reason of a message refused because the pool was short through no fault of its
/// connection (not a slow consumer: see `session/share.rs`).
pub(crate) const POOL_EXHAUSTED: &str = "pool_exhausted";

/// One count per [`SlowConsumerPolicy`], sized by the enum.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PolicyCounts([u64; SlowConsumerPolicy::ALL.len()]);

impl std::ops::Index<SlowConsumerPolicy> for PolicyCounts {
    type Output = u64;
    fn index(&self, policy: SlowConsumerPolicy) -> &u64 {
        &self.0[policy as usize]
    }
}

impl std::ops::IndexMut<SlowConsumerPolicy> for PolicyCounts {
    fn index_mut(&mut self, policy: SlowConsumerPolicy) -> &mut u64 {
        &mut self.0[policy as usize]
    }
}

impl LoopStats {
    /// Counts what a send did under `policy`; returns the messages it queued (0 or 1).
    pub(crate) fn count_send(&mut self, outcome: PushOutcome, policy: SlowConsumerPolicy) -> u64 {
        let queued = match outcome {
            PushOutcome::Queued | PushOutcome::QueuedAboveHigh => 1,
            PushOutcome::Dropped { newest, messages, .. } => {
                self.policy_drops[policy] += u64::from(messages);
                u64::from(!newest)
            }
            PushOutcome::WouldBlock { limit: Limit::Pool }
                if policy != SlowConsumerPolicy::Block =>
            {
                self.pool_exhausted += 1;
                0
            }
            PushOutcome::WouldBlock { .. } | PushOutcome::MustClose { .. } => 0,
        };
        self.messages_out += queued;
        queued
    }

    /// Adds the counts to `metrics` and zeroes them.
    pub(crate) fn publish(&mut self, metrics: &Metrics) {
        for (counter, n) in [
            (&metrics.messages_in, self.messages_in),
            (&metrics.messages_out, self.messages_out),
            (&metrics.bytes_in, self.bytes_in),
            (&metrics.bytes_out, self.bytes_out),
        ] {
            if n > 0 {
                counter.inc_by(n);
            }
        }
        if self.deliveries > 0 {
            metrics.deliveries.inc_by(self.deliveries);
        }
        let drops = SlowConsumerPolicy::ALL.iter().map(|p| p.name()).zip(self.policy_drops.0);
        for (reason, n) in drops.chain([(POOL_EXHAUSTED, self.pool_exhausted)]) {
            if n > 0 {
                metrics.drops.get_or_create(&Reason { reason: reason.to_owned() }).inc_by(n);
            }
        }
        *self = Self::default();
    }
}

/// The server's metrics, shared by every event loop (all atomics). Read them as Prometheus
/// text with [`encode`](Self::encode), or one by one with the accessors.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Open WebSocket connections.
    pub(crate) connections: Gauge,
    /// Accepted TCP connections.
    pub(crate) accepted: Counter,
    /// Failed accepts (`EMFILE` and friends); the loop tries again every 50 ms.
    pub(crate) accept_errors: Counter,
    /// Data messages received.
    pub(crate) messages_in: Counter,
    /// Data messages queued for sending.
    pub(crate) messages_out: Counter,
    /// Bytes read from sockets.
    pub(crate) bytes_in: Counter,
    /// Bytes written to sockets.
    pub(crate) bytes_out: Counter,
    /// WebSocket connections closed, by reason (`normal`, `going_away`, `protocol_error`,
    /// `message_too_big`, `invalid_payload`, `policy`, `abnormal`, `try_again_later`, …).
    pub(crate) closes: Family<Reason, Counter>,
    /// Requests refused, by HTTP status.
    pub(crate) refusals: Family<Status, Counter>,
    /// Messages dropped by slow-consumer policies, by policy.
    pub(crate) drops: Family<Reason, Counter>,
    /// Handshakes that timed out.
    pub(crate) handshake_timeouts: Counter,
    /// Connections closed with 1008 by the `close` slow-consumer policy.
    pub(crate) slow_consumer_closes: Counter,
    /// Pool chunks in use, per loop.
    pub(crate) chunks_in_use: Family<LoopLabel, Gauge>,
    /// Pool chunks in total, per loop.
    pub(crate) chunks_total: Family<LoopLabel, Gauge>,
    /// Most chunks ever in use, per loop.
    pub(crate) chunks_high_water: Family<LoopLabel, Gauge>,
    /// Segment slots (each queued message or piece of one holds at least one), per loop.
    pub(crate) slots_in_use: Family<LoopLabel, Gauge>,
    /// Segment slots in total, per loop.
    pub(crate) slots_total: Family<LoopLabel, Gauge>,
    /// Most segment slots ever in use at once, per loop.
    pub(crate) slots_high_water: Family<LoopLabel, Gauge>,
    /// Budget bytes, per loop.
    pub(crate) budget_bytes: Family<LoopLabel, Gauge>,
    /// Chunk allocation failures, per loop (monotonic).
    pub(crate) allocation_failures: Family<LoopLabel, Gauge>,
    /// Bytes buffered in send queues, per loop.
    pub(crate) bytes_buffered: Family<LoopLabel, Gauge>,
    /// Topic subscriptions (connection × topic) open.
    pub(crate) subscriptions: Gauge,
    /// Messages published (from handlers, handles and HTTP), whether or not anyone listened.
    pub(crate) publishes: Counter,
    /// Published messages queued to subscribers (one per subscriber).
    pub(crate) deliveries: Counter,
    /// Publications a whole loop could not take, by reason (`inbox_full`, `pool`); drops
    /// for one subscriber are counted in `drops` by policy.
    pub(crate) topic_drops: Family<Reason, Counter>,
    /// Origins, tokens, proxies and pending upgrade decisions.
    pub(crate) access: AccessMetrics,
    /// TLS handshakes completed.
    pub(crate) tls_handshakes: Counter,
    /// Of those, handshakes that resumed a session with a ticket.
    pub(crate) tls_resumptions: Counter,
    /// TLS connections refused or failed, by reason (`bad_client_hello`, `plain_http`,
    /// `not_tls`, `handshake_timeout`, `upgrade_timeout`, `budget`, `alert_*`, …).
    pub(crate) tls_refusals: Family<Reason, Counter>,
    /// Publications that did not reach the Redis backplane, by reason (`queue_full`,
    /// `redis_down`, `unconfirmed`).
    pub(crate) backplane_lost: Family<Reason, Counter>,
    /// Publications the Redis backplane confirmed.
    pub(crate) backplane_published: Counter,
    /// Publications of other nodes received from the Redis backplane.
    pub(crate) backplane_received: Counter,
    /// 1 while the backplane's subscriber is connected to Redis.
    pub(crate) backplane_up: Gauge,
    /// Subscriptions refused by a topic limit, by reason (`connection_topics`,
    /// `server_topics`); an upgrade naming too many topics is counted in `refusals` (400).
    pub(crate) topic_refusals: Family<Reason, Counter>,
    loops: AtomicU32,
}

impl Metrics {
    /// Registers every metric under the `freeboard_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("freeboard");
        let m = Self {
            registry: Registry::default(),
            connections: Gauge::default(),
            accepted: Counter::default(),
            accept_errors: Counter::default(),
            messages_in: Counter::default(),
            messages_out: Counter::default(),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            closes: Family::default(),
            refusals: Family::default(),
            drops: Family::default(),
            handshake_timeouts: Counter::default(),
            slow_consumer_closes: Counter::default(),
            chunks_in_use: Family::default(),
            chunks_total: Family::default(),
            chunks_high_water: Family::default(),
            slots_in_use: Family::default(),
            slots_total: Family::default(),
            slots_high_water: Family::default(),
            budget_bytes: Family::default(),
            allocation_failures: Family::default(),
            bytes_buffered: Family::default(),
            subscriptions: Gauge::default(),
            publishes: Counter::default(),
            deliveries: Counter::default(),
            topic_drops: Family::default(),
            access: AccessMetrics::default(),
            tls_handshakes: Counter::default(),
            tls_resumptions: Counter::default(),
            tls_refusals: Family::default(),
            backplane_lost: Family::default(),
            backplane_published: Counter::default(),
            backplane_received: Counter::default(),
            backplane_up: Gauge::default(),
            topic_refusals: Family::default(),
            loops: AtomicU32::new(0),
        };
        m.access.register(&mut registry);
        registry.register("connections", "Open WebSocket connections", m.connections.clone());
        registry.register("accepted", "Accepted TCP connections", m.accepted.clone());
        registry.register(
            "accept_errors",
            "Failed accepts (out of descriptors or memory), retried every 50 ms",
            m.accept_errors.clone(),
        );
        registry.register("messages_in", "Data messages received", m.messages_in.clone());
        registry.register(
            "messages_out",
            "Data messages queued for sending",
            m.messages_out.clone(),
        );
        registry.register("bytes_in", "Bytes read from sockets", m.bytes_in.clone());
        registry.register("bytes_out", "Bytes written to sockets", m.bytes_out.clone());
        registry.register("closes", "WebSocket connections closed, by reason", m.closes.clone());
        registry.register("refusals", "HTTP requests refused, by status", m.refusals.clone());
        registry.register("drops", "Messages dropped by slow-consumer policy", m.drops.clone());
        registry.register(
            "handshake_timeouts",
            "Connections dropped before completing the upgrade request",
            m.handshake_timeouts.clone(),
        );
        registry.register(
            "slow_consumer_closes",
            "Connections closed with 1008 because their send queue reached its cap",
            m.slow_consumer_closes.clone(),
        );
        registry.register("pool_chunks_in_use", "Pool chunks in use", m.chunks_in_use.clone());
        registry.register("pool_chunks_total", "Pool chunks in total", m.chunks_total.clone());
        registry.register(
            "pool_chunks_high_water",
            "Most pool chunks ever in use at once",
            m.chunks_high_water.clone(),
        );
        registry.register(
            "pool_slots_in_use",
            "Pool segment slots in use (a queued message holds at least one)",
            m.slots_in_use.clone(),
        );
        registry.register("pool_slots_total", "Pool segment slots in total", m.slots_total.clone());
        registry.register(
            "pool_slots_high_water",
            "Most pool segment slots ever in use at once",
            m.slots_high_water.clone(),
        );
        registry.register("budget_bytes", "Memory budget per event loop", m.budget_bytes.clone());
        registry.register(
            "pool_allocation_failures",
            "Chunk allocations refused because the pool was exhausted",
            m.allocation_failures.clone(),
        );
        registry.register(
            "bytes_buffered",
            "Bytes waiting in send queues",
            m.bytes_buffered.clone(),
        );
        registry.register("tls_handshakes", "TLS handshakes completed", m.tls_handshakes.clone());
        registry.register(
            "tls_resumptions",
            "TLS handshakes that resumed an earlier session (a ticket)",
            m.tls_resumptions.clone(),
        );
        registry.register(
            "tls_refusals",
            "TLS connections refused or failed, by reason",
            m.tls_refusals.clone(),
        );
        registry.register(
            "topic_subscriptions",
            "Topic subscriptions open (connection x topic)",
            m.subscriptions.clone(),
        );
        registry.register("topic_publishes", "Messages published to topics", m.publishes.clone());
        registry.register(
            "topic_deliveries",
            "Published messages queued to subscribers",
            m.deliveries.clone(),
        );
        registry.register(
            "topic_drops",
            "Publications a whole event loop could not take, by reason",
            m.topic_drops.clone(),
        );
        registry.register(
            "backplane_lost",
            "Publications that did not reach the Redis backplane, by reason",
            m.backplane_lost.clone(),
        );
        registry.register(
            "backplane_published",
            "Publications the Redis backplane confirmed",
            m.backplane_published.clone(),
        );
        registry.register(
            "backplane_received",
            "Publications of other nodes received from the Redis backplane",
            m.backplane_received.clone(),
        );
        registry.register(
            "backplane_up",
            "1 while the backplane's subscriber is connected to Redis",
            m.backplane_up.clone(),
        );
        registry.register(
            "topic_refusals",
            "Subscriptions refused by a topic limit, by reason",
            m.topic_refusals.clone(),
        );
        Self { registry, ..m }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // NOTE(unwrap): writing to a String cannot fail.
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out
    }

    /// Counts a close by reason.
    pub fn close(&self, reason: &str) {
        self.closes.get_or_create(&Reason { reason: reason.to_owned() }).inc();
    }

    /// Counts a refusal by status.
    pub fn refuse(&self, status: u16) {
        self.refusals.get_or_create(&Status { status }).inc();
    }

    /// The value of `refusals{status}`.
    pub fn refusals_for(&self, status: u16) -> u64 {
        self.refusals.get_or_create(&Status { status }).get()
    }

    /// The value of `closes{reason}`.
    pub fn closes_for(&self, reason: &str) -> u64 {
        self.closes.get_or_create(&Reason { reason: reason.to_owned() }).get()
    }

    /// The value of `drops{reason=policy}`.
    pub fn drops_for(&self, policy: &str) -> u64 {
        self.drops.get_or_create(&Reason { reason: policy.to_owned() }).get()
    }

    /// The value of `topic_drops{reason}`.
    pub fn topic_drops_for(&self, reason: &str) -> u64 {
        self.topic_drops.get_or_create(&Reason { reason: reason.to_owned() }).get()
    }

    /// Open WebSocket connections.
    pub fn connections(&self) -> i64 {
        self.connections.get()
    }

    /// Topic subscriptions (connection × topic) open.
    pub fn subscriptions(&self) -> i64 {
        self.subscriptions.get()
    }

    /// Messages published, whether or not anyone listened.
    pub fn publishes(&self) -> u64 {
        self.publishes.get()
    }

    /// Published messages queued to subscribers (one per subscriber).
    pub fn deliveries(&self) -> u64 {
        self.deliveries.get()
    }

    /// TLS handshakes completed.
    pub fn tls_handshakes(&self) -> u64 {
        self.tls_handshakes.get()
    }

    /// TLS handshakes that resumed an earlier session with a ticket (counted in
    /// [`tls_handshakes`](Self::tls_handshakes) too).
    pub fn tls_resumptions(&self) -> u64 {
        self.tls_resumptions.get()
    }

    /// TLS connections refused or failed for `reason` (see `freeboard_tls_refusals`).
    pub fn tls_refusals(&self, reason: &str) -> u64 {
        self.tls_refusals.get_or_create(&Reason { reason: reason.to_owned() }).get()
    }

    /// Counts a TLS refusal.
    pub(crate) fn tls_refusal(&self, reason: &'static str) {
        self.tls_refusals.get_or_create(&Reason { reason: reason.to_owned() }).inc();
    }

    /// Handshakes (and plain HTTP requests) that timed out.
    pub fn handshake_timeouts(&self) -> u64 {
        self.handshake_timeouts.get()
    }

    /// Connections closed with 1008 by the `close` slow-consumer policy.
    pub fn slow_consumer_closes(&self) -> u64 {
        self.slow_consumer_closes.get()
    }

    /// Pool chunks in use, summed over the loops.
    pub fn total_chunks_in_use(&self) -> i64 {
        (0..self.loops())
            .map(|i| self.chunks_in_use.get_or_create(&LoopLabel { event_loop: i }).get())
            .sum()
    }

    /// The loops' chunk high-water marks, summed.
    pub fn total_chunks_high_water(&self) -> i64 {
        (0..self.loops())
            .map(|i| self.chunks_high_water.get_or_create(&LoopLabel { event_loop: i }).get())
            .sum()
    }

    /// Bytes waiting in send queues, summed over the loops.
    pub fn total_bytes_buffered(&self) -> i64 {
        (0..self.loops())
            .map(|i| self.bytes_buffered.get_or_create(&LoopLabel { event_loop: i }).get())
            .sum()
    }

    pub(crate) fn set_loops(&self, n: u32) {
        self.loops.store(n, Ordering::Relaxed);
    }

    fn loops(&self) -> u32 {
        self.loops.load(Ordering::Relaxed)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Counts a publish a whole loop could not take.
    pub(crate) fn topic_drop(&self, reason: &str) {
        self.topic_drops.get_or_create(&Reason { reason: reason.to_owned() }).inc();
    }

    /// Counts publications that did not reach the Redis backplane.
    pub(crate) fn backplane_lost(&self, reason: &str, n: u64) {
        self.backplane_lost.get_or_create(&Reason { reason: reason.to_owned() }).inc_by(n);
    }

    /// Counts publications the Redis backplane confirmed.
    pub(crate) fn backplane_published(&self, n: u64) {
        self.backplane_published.inc_by(n);
    }

    /// Counts a publication received from another node.
    pub(crate) fn backplane_received(&self) {
        self.backplane_received.inc();
    }

    /// Counts a subscription refused by a topic limit.
    pub(crate) fn topic_refusal(&self, reason: &str) {
        self.topic_refusals.get_or_create(&Reason { reason: reason.to_owned() }).inc();
    }

    /// Whether the backplane's subscriber is connected.
    pub(crate) fn set_backplane_up(&self, up: bool) {
        self.backplane_up.set(i64::from(up));
    }
}

/// The `closes` metric label for a close code.
pub(crate) fn close_label(code: CloseCode) -> &'static str {
    match code {
        CloseCode::NORMAL => "normal",
        CloseCode::GOING_AWAY => "going_away",
        CloseCode::PROTOCOL_ERROR => "protocol_error",
        CloseCode::NO_STATUS => "no_status",
        CloseCode::ABNORMAL => "abnormal",
        CloseCode::INVALID_PAYLOAD => "invalid_payload",
        CloseCode::POLICY_VIOLATION => "policy_violation",
        CloseCode::MESSAGE_TOO_BIG => "message_too_big",
        CloseCode::TRY_AGAIN_LATER => "try_again_later",
        _ => "other",
    }
}

/// Who was let in and who was not: the metrics of origins, tokens, forwarded addresses and
/// upgrade decisions (`freeboard_access_*`).
#[derive(Debug, Default)]
pub(crate) struct AccessMetrics {
    /// Upgrades refused by an access check, by reason (`origin`, `token_missing`,
    /// `token_invalid`, `token_expired`, `topic_not_granted`, `proxy_header`,
    /// `decision_timeout`, `pending_full`, or an application's own reason).
    pub(crate) refusals: Family<Reason, Counter>,
    /// Upgrade decisions pending now.
    pub(crate) pending_upgrades: Gauge,
    /// Open connections closed because their authorization expired.
    pub(crate) token_expiries: Counter,
    /// Connections attributed to an address a trusted proxy forwarded (header or PROXY
    /// protocol).
    pub(crate) forwarded: Counter,
}

impl AccessMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "access_refusals",
            "Upgrades refused by an access check (origin, token, proxy header, pending decisions), by reason",
            self.refusals.clone(),
        );
        registry.register(
            "access_pending_upgrades",
            "Upgrade decisions pending",
            self.pending_upgrades.clone(),
        );
        registry.register(
            "access_token_expiries",
            "Open connections closed because their token expired",
            self.token_expiries.clone(),
        );
        registry.register(
            "access_forwarded",
            "Connections attributed to a client address forwarded by a trusted proxy",
            self.forwarded.clone(),
        );
    }
}

impl Metrics {
    /// Counts an access refusal by reason.
    pub(crate) fn access_refusal(&self, reason: &str) {
        self.access.refusals.get_or_create(&Reason { reason: reason.to_owned() }).inc();
    }

    /// The value of `access_refusals{reason}`.
    pub fn access_refusals_for(&self, reason: &str) -> u64 {
        self.access.refusals.get_or_create(&Reason { reason: reason.to_owned() }).get()
    }

    /// Upgrade decisions pending now.
    pub fn pending_upgrades(&self) -> i64 {
        self.access.pending_upgrades.get()
    }

    /// Open connections closed because their authorization expired.
    pub fn token_expiries(&self) -> u64 {
        self.access.token_expiries.get()
    }

    /// Connections attributed to a forwarded client address.
    pub fn forwarded(&self) -> u64 {
        self.access.forwarded.get()
    }
}
