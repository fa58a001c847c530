//! Counters, gauges and histograms exported on `/metrics` in the OpenMetrics text format
//! ([`CONTENT_TYPE`]), named by the Prometheus conventions: base units in the name
//! (`_bytes`, `_seconds`), `_total` only on counters, every labelled series present from the
//! start at zero, plus the standard `process_*` series and `freeboard_build_info`.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use freeboard_buf::{Limit, PushOutcome, SlowConsumerPolicy};
use freeboard_proto::CloseCode;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

/// The `Content-Type` of [`Metrics::encode`]'s output: OpenMetrics 1.0 text (it ends in
/// `# EOF`), which Prometheus reads with its OpenMetrics parser.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The reasons a connection is counted as closed with (`freeboard_closes_total{reason}`),
/// every one present from the start.
pub const CLOSE_REASONS: [&str; 10] = [
    "normal",
    "going_away",
    "protocol_error",
    "no_status",
    "abnormal",
    "invalid_payload",
    "policy_violation",
    "message_too_big",
    "try_again_later",
    "other",
];

/// The HTTP statuses a server refuses with (`freeboard_refusals_total{status}`), every one
/// present from the start; a handler's own status is added when first used.
pub const REFUSAL_STATUSES: [u16; 14] =
    [400, 401, 403, 404, 405, 411, 413, 426, 429, 431, 500, 501, 503, 505];

/// Why a whole loop missed a publication (`freeboard_topic_drops_total{reason}`).
pub const TOPIC_DROP_REASONS: [&str; 2] = ["inbox_full", "pool"];

/// Why a subscription was refused by a topic limit (`freeboard_topic_refusals_total{reason}`):
/// a connection's topics, the server's topics, the loop's budget for its topic tables, a
/// topic's presence at its cap, or the presence budget spent.
pub const TOPIC_REFUSAL_REASONS: [&str; 5] =
    ["connection_topics", "server_topics", "budget", "presence_topic_full", "presence_memory"];

/// Why a publication did not reach the Redis backplane (`freeboard_backplane_lost_total{reason}`).
/// `gap`: publications of another node to a topic without history that this node, subscribed,
/// never received (counted by their sequence numbers when the next one arrives).
pub const BACKPLANE_LOST_REASONS: [&str; 5] =
    ["queue_full", "redis_down", "unconfirmed", "refused", "gap"];

/// Why an access check refused an upgrade (`freeboard_access_refusals_total{reason}`); an
/// application's own reason is added when first used.
pub const ACCESS_REFUSAL_REASONS: [&str; 19] = [
    "budget",
    "origin",
    "admin_rate",
    "admin_token_missing",
    "admin_token_invalid",
    "admin_not_loopback",
    "token_missing",
    "token_invalid",
    "token_expired",
    "token_not_yet_valid",
    "token_issued_in_future",
    "topic_not_granted",
    "proxy_header",
    "decision_timeout",
    "pending_full",
    "webhook_busy",
    "webhook_timeout",
    "webhook_refused",
    "webhook_error",
];

/// Why an HTTP/2 stream was reset (`freeboard_http2_resets_total{reason}`): the client
/// reset it, the server did (its session ended abnormally, or for the client's error), or the
/// connection went with the stream open.
pub const HTTP2_RESET_REASONS: [&str; 3] = ["client", "server", "connection_end"];

/// The error codes of the GOAWAYs the server sends (`freeboard_http2_goaways_total{reason}`):
/// every code RFC 9113 §7 names (a code it does not name is exported in hex).
pub const HTTP2_GOAWAY_CODES: [&str; 14] = freeboard_h2::ERROR_CODE_NAMES;

/// Why a TLS connection was refused or failed (`freeboard_tls_refusals_total{reason}`): the
/// server's own reasons, the kinds of TLS error, and each alert a client may send.
pub const TLS_REFUSAL_REASONS: [&str; 37] = [
    "per_ip_handshakes",
    "per_ip_rate",
    "budget",
    "pool_exhausted",
    "plain_http",
    "not_tls",
    "handshake_timeout",
    "upgrade_timeout",
    "bad_client_hello",
    "bad_record",
    "no_application_protocol",
    "peer_incompatible",
    "peer_misbehaved",
    "decrypt_error",
    "unexpected_message",
    "other",
    "alert_close_notify",
    "alert_unexpected_message",
    "alert_bad_record_mac",
    "alert_handshake_failure",
    "alert_bad_certificate",
    "alert_unsupported_certificate",
    "alert_certificate_revoked",
    "alert_certificate_expired",
    "alert_certificate_unknown",
    "alert_illegal_parameter",
    "alert_unknown_ca",
    "alert_access_denied",
    "alert_decode_error",
    "alert_decrypt_error",
    "alert_protocol_version",
    "alert_insufficient_security",
    "alert_internal_error",
    "alert_user_canceled",
    "alert_unrecognised_name",
    "alert_no_application_protocol",
    "alert_other",
];

/// Bucket bounds of `freeboard_message_size_bytes`: 64 B times the powers of 4 (see
/// [`message_size_bucket`]).
const MESSAGE_SIZE_BUCKETS: [u64; 10] =
    [64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];

/// The first of [`MESSAGE_SIZE_BUCKETS`] at or above `len` (10: above them all), looked up by
/// the bit length of `len - 1` rather than searched for: it is counted for every message.
fn message_size_bucket(len: u64) -> usize {
    let bits = u64::BITS - len.saturating_sub(1).leading_zeros();
    usize::from(BUCKET_OF_BITS[bits as usize])
}

/// [`message_size_bucket`] of a length whose `len - 1` is `bits` long (0 to 64 bits): bucket
/// `k` ends at 64 × 4^k, a bit length of 6 + 2k.
const BUCKET_OF_BITS: [u8; 65] = {
    let mut table = [0; 65];
    let mut bits = 0;
    while bits < table.len() {
        let bucket = (bits.saturating_sub(6)).div_ceil(2);
        table[bits] = if bucket < MESSAGE_SIZE_BUCKETS.len() {
            bucket as u8
        } else {
            MESSAGE_SIZE_BUCKETS.len() as u8
        };
        bits += 1;
    }
    table
};

/// Bucket bounds, in milliseconds (the loop's clock), of the duration histograms.
const MILLIS_BUCKETS: [u64; 12] = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10_000];

/// Labels naming why something happened (a close reason, a policy).
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

/// Labels naming one event loop and the I/O driver it runs (`freeboard_loop_io`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoopIoLabel {
    /// The loop's index.
    pub event_loop: u32,
    /// `epoll` or `uring` ([`IoDriver::name`](crate::IoDriver::name)).
    pub io: &'static str,
}

/// The labels of `freeboard_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    rustc_min: &'static str,
}

/// A histogram over fixed integer bucket bounds whose observations a loop counts in a
/// [`LocalHistogram`] and adds once per loop turn: an observation on the hot path is an
/// array increment, not an atomic operation on a shared cache line.
#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    /// Upper bounds of the buckets in integer units (bytes, milliseconds); `+Inf` follows.
    bounds: &'static [u64],
    /// What one unit is in the exposed base unit (1 for bytes, 0.001 for milliseconds).
    scale: f64,
    /// Per-bucket (not cumulative) counts, `bounds.len() + 1` of them.
    counts: Arc<[AtomicU64]>,
    /// The sum of the observations, in units.
    sum: Arc<AtomicU64>,
}

impl Histogram {
    fn new(bounds: &'static [u64], scale: f64) -> Self {
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self { bounds, scale, counts, sum: Arc::new(AtomicU64::new(0)) }
    }

    /// Adds one observation (for rare events: handshakes).
    pub(crate) fn observe(&self, value: u64) {
        let bucket = self.bounds.partition_point(|&b| b < value);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    fn add(&self, local: &LocalHistogram) {
        for (shared, &n) in self.counts.iter().zip(&local.counts) {
            if n > 0 {
                shared.fetch_add(n, Ordering::Relaxed);
            }
        }
        self.sum.fetch_add(local.sum, Ordering::Relaxed);
    }

    /// Observations so far.
    pub(crate) fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .map(|&b| b as f64 * self.scale)
            .chain([f64::MAX])
            .zip(self.counts.iter().map(|c| c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.sum.load(Ordering::Relaxed) as f64 * self.scale;
        encoder
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// A loop's own counts for one [`Histogram`], added to it and zeroed once per turn.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LocalHistogram {
    counts: [u64; 16],
    sum: u64,
}

impl LocalHistogram {
    fn observe(&mut self, bounds: &[u64], value: u64) {
        self.observe_in(bounds.partition_point(|&b| b < value), value);
    }

    fn observe_in(&mut self, bucket: usize, value: u64) {
        self.counts[bucket] += 1;
        self.sum += value;
    }

    fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    fn is_empty(&self) -> bool {
        self.counts.iter().all(|&n| n == 0)
    }
}

/// One loop's series, looked up once: a family lookup hashes its labels under a lock, too
/// much for every loop turn.
pub(crate) struct LoopGauges {
    pub(crate) chunks_in_use: Gauge,
    pub(crate) chunks_high_water: Gauge,
    pub(crate) slots_in_use: Gauge,
    pub(crate) slots_high_water: Gauge,
    pub(crate) send_queue_bytes: Gauge,
    pub(crate) pool_resident_bytes: Gauge,
    pub(crate) chunks_withheld: Gauge,
    allocation_failures: Counter,
    /// The pool's failure count at the last turn (the pool counts from its start).
    failures_seen: u64,
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
            send_queue_bytes: gauge(&metrics.send_queue_bytes),
            pool_resident_bytes: gauge(&metrics.pool_resident_bytes),
            chunks_withheld: gauge(&metrics.chunks_withheld),
            allocation_failures: metrics.allocation_failures.get_or_create(&label).clone(),
            failures_seen: 0,
        }
    }

    /// Counts the pool's allocation failures since the last call (`total` is the pool's
    /// running count).
    pub(crate) fn allocation_failures(&mut self, total: u64) {
        if total > self.failures_seen {
            self.allocation_failures.inc_by(total - self.failures_seen);
            self.failures_seen = total;
        }
    }
}

/// Per-message counts one loop keeps in plain integers and adds to the shared [`Metrics`]
/// once per loop turn, so the hot path touches no shared cache line.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LoopStats {
    pub(crate) messages_out: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    /// Published messages queued to subscribers.
    pub(crate) deliveries: u64,
    /// Publications compressed once for their compressing subscribers.
    pub(crate) compressions: u64,
    /// Publications sent uncompressed to compressing subscribers: no budget to compress.
    pub(crate) compression_fallbacks: u64,
    /// Publications a loop made a delta of, once for its delta subscribers.
    pub(crate) deltas: u64,
    /// Deltas queued to delta subscribers.
    pub(crate) delta_deliveries: u64,
    /// Messages dropped by slow-consumer policies, counted here so a drop allocates nothing.
    pub(crate) policy_drops: PolicyCounts,
    /// Messages refused because the pool was short through no fault of their connection.
    pub(crate) pool_exhausted: u64,
    /// Data messages lost with a closing connection ([`CLOSED`]).
    pub(crate) closed: u64,
    /// Sizes of the data messages received (their count is the received messages').
    message_sizes: LocalHistogram,
    /// How long send queues stayed non-empty, in milliseconds.
    queue_delays: LocalHistogram,
}

/// The `drops` reason of a message refused because the pool was short through no fault of its
/// connection (not a slow consumer: see `session/fair_share.rs`).
pub(crate) const POOL_EXHAUSTED: &str = "pool_exhausted";

/// The `drops` reason of a data message its connection's closing took: still queued (unsent,
/// or sent in part) when the connection went, or sent to a connection already closing.
pub(crate) const CLOSED: &str = "closed";

/// One count per [`SlowConsumerPolicy`], sized by the enum.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PolicyCounts([u64; SlowConsumerPolicy::ALL.len()]);

impl PolicyCounts {
    /// The counts added since `before` (an earlier copy), per policy.
    pub(crate) fn since(&self, before: &Self) -> [u64; SlowConsumerPolicy::ALL.len()] {
        std::array::from_fn(|i| self.0[i] - before.0[i])
    }
}

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
            PushOutcome::MustClose { messages, .. } => {
                self.policy_drops[SlowConsumerPolicy::Close] += u64::from(messages);
                0
            }
            PushOutcome::WouldBlock { .. } => 0,
        };
        self.messages_out += queued;
        queued
    }

    /// Counts one received data message of `len` bytes.
    pub(crate) fn received(&mut self, len: usize) {
        self.message_sizes.observe_in(message_size_bucket(len as u64), len as u64);
    }

    /// Counts a send queue that was emptied `millis` after it got its first byte.
    pub(crate) fn queue_drained(&mut self, millis: u64) {
        self.queue_delays.observe(&MILLIS_BUCKETS, millis);
    }

    /// Adds the counts to `metrics` and zeroes them.
    pub(crate) fn publish(&mut self, metrics: &Metrics) {
        for (counter, n) in [
            (&metrics.messages_in, self.message_sizes.count()),
            (&metrics.messages_out, self.messages_out),
            (&metrics.bytes_in, self.bytes_in),
            (&metrics.bytes_out, self.bytes_out),
            (&metrics.deliveries, self.deliveries),
            (&metrics.compressions, self.compressions),
            (&metrics.compression_fallbacks, self.compression_fallbacks),
            (&metrics.deltas, self.deltas),
            (&metrics.delta_deliveries, self.delta_deliveries),
        ] {
            if n > 0 {
                counter.inc_by(n);
            }
        }
        let drops = SlowConsumerPolicy::ALL.iter().map(|p| p.name()).zip(self.policy_drops.0);
        let others = [(POOL_EXHAUSTED, self.pool_exhausted), (CLOSED, self.closed)];
        for (reason, n) in drops.chain(others) {
            if n > 0 {
                metrics.drops.get_or_create(&Reason { reason: reason.to_owned() }).inc_by(n);
            }
        }
        if !self.message_sizes.is_empty() {
            metrics.message_size.add(&self.message_sizes);
        }
        if !self.queue_delays.is_empty() {
            metrics.queue_delay.add(&self.queue_delays);
        }
        *self = Self::default();
    }
}

/// The server's metrics, shared by every event loop (all atomics). Read them as OpenMetrics
/// text with [`encode`](Self::encode), or one by one with the accessors.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Open subscriber sessions: WebSocket connections and Server-Sent Events streams.
    pub(crate) connections: Gauge,
    /// Of `connections`, the Server-Sent Events streams.
    pub(crate) event_streams: Gauge,
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
    /// WebSocket connections closed, by reason ([`CLOSE_REASONS`]).
    pub(crate) closes: Family<Reason, Counter>,
    /// Requests refused, by HTTP status.
    pub(crate) refusals: Family<Status, Counter>,
    /// Messages dropped, by reason: a slow-consumer policy, [`POOL_EXHAUSTED`], [`CLOSED`].
    pub(crate) drops: Family<Reason, Counter>,
    /// Handshakes that timed out.
    pub(crate) handshake_timeouts: Counter,
    /// Connections closed with 1008 by the `close` slow-consumer policy.
    pub(crate) slow_consumer_closes: Counter,
    /// HTTP/2 connections open (WebSockets over HTTP/2, RFC 8441).
    pub(crate) http2_connections: Gauge,
    /// HTTP/2 streams open with a session (WebSockets and requests being answered).
    pub(crate) http2_streams: Gauge,
    /// HTTP/2 streams opened with a session.
    pub(crate) http2_streams_opened: Counter,
    /// HTTP/2 streams refused past SETTINGS_MAX_CONCURRENT_STREAMS (`REFUSED_STREAM`).
    pub(crate) http2_refused_streams: Counter,
    /// HTTP/2 streams reset, by who: `client`, `server` (its session ended abnormally, or
    /// the client's error), `connection_end` (the connection went with the stream open).
    pub(crate) http2_resets: Family<Reason, Counter>,
    /// GOAWAYs the server sent, by error code (`NO_ERROR` for a shutdown).
    pub(crate) http2_goaways: Family<Reason, Counter>,
    /// Pool chunks in use, per loop.
    pub(crate) chunks_in_use: Family<LoopLabel, Gauge>,
    /// Pool chunks in total, per loop.
    pub(crate) chunks_capacity: Family<LoopLabel, Gauge>,
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
    /// 1 for the I/O driver each loop runs (io_uring may have been refused).
    pub(crate) loop_io: Family<LoopIoLabel, Gauge>,
    /// Pool chunks a loop's io_uring receives into, in use for the loop's life (0 on epoll).
    pub(crate) receive_buffer_chunks: Family<LoopLabel, Gauge>,
    /// Bytes of one pool chunk.
    pub(crate) chunk_size: Gauge,
    /// Chunk allocation failures, per loop.
    pub(crate) allocation_failures: Family<LoopLabel, Counter>,
    /// Bytes waiting in send queues, per loop.
    pub(crate) send_queue_bytes: Family<LoopLabel, Gauge>,
    /// Topic subscriptions (connection × topic) open.
    pub(crate) subscriptions: Gauge,
    /// Members of topics' presence this node lists (its own and other nodes').
    pub(crate) presence_members: Gauge,
    /// Bytes the presence members are charged.
    pub(crate) presence_bytes: Gauge,
    /// Messages published (from handlers, handles and HTTP), whether or not anyone listened.
    pub(crate) publishes: Counter,
    /// Published messages queued to subscribers (one per subscriber).
    pub(crate) deliveries: Counter,
    /// Publications compressed for the compressing subscribers of a loop (once per
    /// publication, loop and window size).
    pub(crate) compressions: Counter,
    /// Publications sent uncompressed to compressing subscribers because the budget could
    /// not cover their compression.
    pub(crate) compression_fallbacks: Counter,
    /// Publications made into a delta for a loop's delta subscribers (once per publication
    /// and loop).
    pub(crate) deltas: Counter,
    /// Deltas queued to delta subscribers (the rest of their deliveries went whole).
    pub(crate) delta_deliveries: Counter,
    /// Publications a whole loop could not take, by reason ([`TOPIC_DROP_REASONS`]); drops
    /// for one subscriber are counted in `drops` by policy.
    pub(crate) topic_drops: Family<Reason, Counter>,
    /// Accept to `101`, in milliseconds.
    pub(crate) handshake_duration: Histogram,
    /// Sizes of the data messages received.
    pub(crate) message_size: Histogram,
    /// How long a send queue stays non-empty, in milliseconds.
    pub(crate) queue_delay: Histogram,
    /// Configuration reloads applied (SIGHUP, [`ServerHandle::reload`](crate::ServerHandle::reload)).
    pub(crate) reloads: Counter,
    /// Pool bytes that may be resident (touched and not given back), per loop.
    pub(crate) pool_resident_bytes: Family<LoopLabel, Gauge>,
    /// Pool chunks withheld for the connections' kernel memory and table entries, per loop.
    pub(crate) chunks_withheld: Family<LoopLabel, Gauge>,
    /// The kernel memory charged per connection ([`SocketCost`](crate::kernel_memory::SocketCost)).
    pub(crate) connection_kernel_bytes: Gauge,
    /// The kernel memory charged for every open connection: open connections × the charge,
    /// plus the buffers of the sockets that hold some (`kernel_buffer_charge_bytes`).
    pub(crate) kernel_estimate_bytes: Gauge,
    /// Of it, the buffers of the sockets that refuse writes or whose reads pause, as the
    /// kernel reports them (`SO_MEMINFO`).
    pub(crate) kernel_buffer_charge_bytes: Gauge,
    /// Origins, tokens, proxies and pending upgrade decisions.
    pub(crate) access: AccessMetrics,
    /// TLS handshakes completed.
    pub(crate) tls_handshakes: Counter,
    /// Of those, handshakes that resumed a session with a ticket.
    pub(crate) tls_resumptions: Counter,
    /// TLS connections refused or failed, by reason ([`TLS_REFUSAL_REASONS`]).
    pub(crate) tls_refusals: Family<Reason, Counter>,
    /// Publications that did not reach the Redis backplane, by reason
    /// ([`BACKPLANE_LOST_REASONS`]).
    pub(crate) backplane_lost: Family<Reason, Counter>,
    /// Publications the Redis backplane confirmed.
    pub(crate) backplane_published: Counter,
    /// Publications of other nodes received from the Redis backplane.
    pub(crate) backplane_received: Counter,
    /// Reads of a history topic's stream for reconnecting subscribers (one serves every
    /// subscriber of the topic that waits for it).
    pub(crate) backplane_history_reads: Counter,
    /// 1 while Redis is mapped and every server holding this node's subscriptions is connected.
    pub(crate) backplane_up: Gauge,
    /// Subscriptions refused by a topic limit, by reason ([`TOPIC_REFUSAL_REASONS`]); an
    /// upgrade naming too many topics is counted in `refusals` (400).
    pub(crate) topic_refusals: Family<Reason, Counter>,
    /// Each loop's slowest subscribers and lag distribution, from its last sweep.
    pub(crate) lag: Arc<crate::lag::LagBoard>,
    /// The per-topic figures of the topics the operator named.
    pub(crate) topic_series: Arc<crate::topic_series::TopicSeries>,
    loops: AtomicU32,
    /// The dashboard snapshot and the exposition, as last built for the admin surfaces.
    admin: [Mutex<Built>; 2],
    /// The dashboard's last minutes, so that a page opened now draws them at once.
    samples: Mutex<Samples>,
    /// When the server started, in ms since 1970.
    started_at_ms: u64,
    /// What the server runs with, for the dashboard (secrets left out): a JSON array of
    /// `[setting, value]` pairs, set by whoever composed the server.
    summary: Mutex<Arc<str>>,
}

/// How many dashboard samples are kept: five minutes, one a second.
pub const DASHBOARD_SAMPLES: usize = 300;

/// The dashboard's samples: taken at most once a second by an event loop at the end of a
/// turn (a loop that does not turn has changed nothing, so a page fills the gaps with the
/// sample before).
#[derive(Debug, Default)]
struct Samples {
    ring: std::collections::VecDeque<Sample>,
    /// When the last one was taken, in ms since 1970.
    last_ms: u64,
}

/// The figures a dashboard chart draws, at one moment.
#[derive(Debug)]
struct Sample {
    at_ms: u64,
    /// Counters: messages in and out, bytes in and out, drops, closes, refusals.
    counters: [u64; 7],
    connections: i64,
    /// Per loop: chunks in use, their high water, send-queue bytes.
    loops: Box<[[i64; 3]]>,
}

/// Milliseconds since 1970.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How old an admin answer may be before a request builds it again: whatever the number of
/// dashboards and scrapers, and however fast they ask, the server builds each at most 100
/// times a second, and every request in between is answered with a copy of the last one.
pub const ADMIN_REFRESH: Duration = Duration::from_millis(10);

/// An admin answer and when it was built.
#[derive(Debug, Default)]
struct Built {
    at: Option<std::time::Instant>,
    text: Arc<str>,
}

/// Which admin answer ([`Metrics::admin`]'s index).
#[derive(Debug, Clone, Copy)]
enum AdminAnswer {
    Snapshot,
    Exposition,
}

impl Metrics {
    /// Registers every metric: the server's under the `freeboard_` prefix, the process's as
    /// `process_*`.
    pub fn new() -> Self {
        let mut root = Registry::default();
        let m = Self {
            registry: Registry::default(),
            connections: Gauge::default(),
            event_streams: Gauge::default(),
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
            http2_connections: Gauge::default(),
            http2_streams: Gauge::default(),
            http2_streams_opened: Counter::default(),
            http2_refused_streams: Counter::default(),
            http2_resets: Family::default(),
            http2_goaways: Family::default(),
            chunks_in_use: Family::default(),
            chunks_capacity: Family::default(),
            chunks_high_water: Family::default(),
            slots_in_use: Family::default(),
            slots_total: Family::default(),
            slots_high_water: Family::default(),
            budget_bytes: Family::default(),
            loop_io: Family::default(),
            receive_buffer_chunks: Family::default(),
            chunk_size: Gauge::default(),
            allocation_failures: Family::default(),
            send_queue_bytes: Family::default(),
            subscriptions: Gauge::default(),
            presence_members: Gauge::default(),
            presence_bytes: Gauge::default(),
            publishes: Counter::default(),
            deliveries: Counter::default(),
            compressions: Counter::default(),
            compression_fallbacks: Counter::default(),
            deltas: Counter::default(),
            delta_deliveries: Counter::default(),
            topic_drops: Family::default(),
            handshake_duration: Histogram::new(&MILLIS_BUCKETS, 0.001),
            message_size: Histogram::new(&MESSAGE_SIZE_BUCKETS, 1.0),
            queue_delay: Histogram::new(&MILLIS_BUCKETS, 0.001),
            reloads: Counter::default(),
            pool_resident_bytes: Family::default(),
            chunks_withheld: Family::default(),
            connection_kernel_bytes: Gauge::default(),
            kernel_estimate_bytes: Gauge::default(),
            kernel_buffer_charge_bytes: Gauge::default(),
            access: AccessMetrics::default(),
            tls_handshakes: Counter::default(),
            tls_resumptions: Counter::default(),
            tls_refusals: Family::default(),
            backplane_lost: Family::default(),
            backplane_published: Counter::default(),
            backplane_received: Counter::default(),
            backplane_history_reads: Counter::default(),
            backplane_up: Gauge::default(),
            topic_refusals: Family::default(),
            lag: Arc::default(),
            topic_series: Arc::default(),
            loops: AtomicU32::new(0),
            admin: Default::default(),
            samples: Mutex::default(),
            started_at_ms: now_ms(),
            summary: Mutex::new(Arc::from("[]")),
        };
        for reason in CLOSE_REASONS {
            let _ = m.closes.get_or_create(&Reason { reason: reason.into() });
        }
        for status in REFUSAL_STATUSES {
            let _ = m.refusals.get_or_create(&Status { status });
        }
        let policies = SlowConsumerPolicy::ALL.iter().map(|p| p.name());
        for reason in policies.chain([POOL_EXHAUSTED, CLOSED]) {
            let _ = m.drops.get_or_create(&Reason { reason: reason.into() });
        }
        for (family, reasons) in [
            (&m.topic_drops, &TOPIC_DROP_REASONS[..]),
            (&m.topic_refusals, &TOPIC_REFUSAL_REASONS),
            (&m.backplane_lost, &BACKPLANE_LOST_REASONS),
            (&m.access.refusals, &ACCESS_REFUSAL_REASONS),
            (&m.tls_refusals, &TLS_REFUSAL_REASONS),
            (&m.http2_resets, &HTTP2_RESET_REASONS),
            (&m.http2_goaways, &HTTP2_GOAWAY_CODES),
        ] {
            for reason in reasons {
                let _ = family.get_or_create(&Reason { reason: (*reason).into() });
            }
        }
        root.register_collector(Box::new(ProcessCollector));
        root.register_collector(Box::new(KernelCollector));
        root.register_collector(Box::new(crate::lag::LagCollector(m.lag.clone())));
        root.register_collector(Box::new(crate::topic_series::TopicSeriesCollector(
            m.topic_series.clone(),
        )));
        let r = root.sub_registry_with_prefix("freeboard");
        let version = env!("CARGO_PKG_VERSION");
        let rustc_min = env!("CARGO_PKG_RUST_VERSION");
        r.register("build", "The running build", Info::new(BuildLabels { version, rustc_min }));
        r.register(
            "connections",
            "Open connections: WebSockets and Server-Sent Events streams",
            m.connections.clone(),
        );
        r.register(
            "sse_connections",
            "Open Server-Sent Events streams (counted in connections too)",
            m.event_streams.clone(),
        );
        r.register("accepted", "Accepted TCP connections", m.accepted.clone());
        r.register(
            "accept_errors",
            "Failed accepts (out of descriptors or memory), retried every 50 ms",
            m.accept_errors.clone(),
        );
        r.register("received_messages", "Data messages received", m.messages_in.clone());
        r.register("sent_messages", "Data messages queued for sending", m.messages_out.clone());
        let bytes = Unit::Bytes;
        r.register_with_unit(
            "received",
            "Bytes read from sockets",
            bytes.clone(),
            m.bytes_in.clone(),
        );
        r.register_with_unit(
            "written",
            "Bytes written to sockets",
            bytes.clone(),
            m.bytes_out.clone(),
        );
        r.register("closes", "WebSocket connections closed, by reason", m.closes.clone());
        r.register("refusals", "HTTP requests refused, by status", m.refusals.clone());
        r.register(
            "drops",
            "Messages dropped, by reason: a slow-consumer policy, pool_exhausted, or closed \
             (lost with a closing connection)",
            m.drops.clone(),
        );
        r.register(
            "handshake_timeouts",
            "Connections dropped before completing the upgrade request",
            m.handshake_timeouts.clone(),
        );
        r.register(
            "slow_consumer_closes",
            "Connections closed with 1008 because their send queue reached its cap",
            m.slow_consumer_closes.clone(),
        );
        r.register(
            "http2_connections",
            "HTTP/2 connections open (WebSockets over HTTP/2)",
            m.http2_connections.clone(),
        );
        r.register(
            "http2_streams",
            "HTTP/2 streams open with a session (WebSockets, requests being answered)",
            m.http2_streams.clone(),
        );
        r.register(
            "http2_streams_opened",
            "HTTP/2 streams opened with a session",
            m.http2_streams_opened.clone(),
        );
        r.register(
            "http2_refused_streams",
            "HTTP/2 streams refused past SETTINGS_MAX_CONCURRENT_STREAMS",
            m.http2_refused_streams.clone(),
        );
        r.register(
            "http2_resets",
            "HTTP/2 streams reset, by reason: client, server, connection_end",
            m.http2_resets.clone(),
        );
        r.register(
            "http2_goaways",
            "GOAWAY frames sent, by error code (reason label)",
            m.http2_goaways.clone(),
        );
        r.register(
            "pool_chunks_in_use",
            "Pool chunks in use (an io_uring loop's receive buffers counted apart)",
            m.chunks_in_use.clone(),
        );
        r.register("pool_chunks_capacity", "Pool chunks in total", m.chunks_capacity.clone());
        r.register(
            "pool_chunks_high_water",
            "Most pool chunks ever in use at once",
            m.chunks_high_water.clone(),
        );
        r.register(
            "pool_slots_in_use",
            "Pool segment slots in use (a queued message holds at least one)",
            m.slots_in_use.clone(),
        );
        r.register("pool_slots_capacity", "Pool segment slots in total", m.slots_total.clone());
        r.register(
            "pool_slots_high_water",
            "Most pool segment slots ever in use at once",
            m.slots_high_water.clone(),
        );
        r.register_with_unit(
            "pool_chunk_size",
            "Bytes of one pool chunk",
            bytes.clone(),
            m.chunk_size.clone(),
        );
        r.register_with_unit(
            "budget",
            "Memory budget per event loop",
            bytes.clone(),
            m.budget_bytes.clone(),
        );
        r.register(
            "loop_io",
            "The I/O driver an event loop runs (epoll, or uring unless the kernel refused it)",
            m.loop_io.clone(),
        );
        r.register(
            "pool_receive_buffer_chunks",
            "Pool chunks an event loop's io_uring receives into (in use while the loop runs; 0 on epoll)",
            m.receive_buffer_chunks.clone(),
        );
        r.register(
            "pool_chunks_withheld",
            "Pool chunks withheld for the open connections' kernel memory, table entries and event-stream state",
            m.chunks_withheld.clone(),
        );
        r.register_with_unit(
            "connection_kernel",
            "Kernel memory charged to the budget per connection (socket, inode, file, epoll \
             entry; measured from /proc/slabinfo)",
            bytes.clone(),
            m.connection_kernel_bytes.clone(),
        );
        r.register_with_unit(
            "kernel_memory_estimate",
            "Kernel memory charged to the budget for the open connections: their sockets, and \
             the buffers of those that hold some",
            bytes.clone(),
            m.kernel_estimate_bytes.clone(),
        );
        r.register_with_unit(
            "kernel_buffer_charge",
            "Of the kernel memory charged, the socket buffers of connections whose sockets refuse \
             writes or whose reads pause (SO_MEMINFO)",
            bytes.clone(),
            m.kernel_buffer_charge_bytes.clone(),
        );
        r.register(
            "pool_allocation_failures",
            "Chunk allocations refused because the pool was exhausted",
            m.allocation_failures.clone(),
        );
        r.register_with_unit(
            "send_queue",
            "Bytes waiting in send queues",
            bytes.clone(),
            m.send_queue_bytes.clone(),
        );
        r.register(
            "topic_subscriptions",
            "Topic subscriptions open (connection x topic)",
            m.subscriptions.clone(),
        );
        r.register(
            "presence_members",
            "Members of topics' presence listed on this node (its own and other nodes')",
            m.presence_members.clone(),
        );
        r.register_with_unit(
            "presence",
            "Bytes the presence members are charged (presence_memory)",
            bytes.clone(),
            m.presence_bytes.clone(),
        );
        r.register("topic_publishes", "Messages published to topics", m.publishes.clone());
        r.register(
            "topic_deliveries",
            "Published messages queued to subscribers",
            m.deliveries.clone(),
        );
        r.register(
            "topic_compressions",
            "Publications compressed once per event loop for its compressing subscribers",
            m.compressions.clone(),
        );
        r.register(
            "topic_compression_fallbacks",
            "Publications sent uncompressed to compressing subscribers: no budget to compress",
            m.compression_fallbacks.clone(),
        );
        r.register(
            "topic_deltas",
            "Publications made into a Fossil delta once per event loop for its delta subscribers",
            m.deltas.clone(),
        );
        r.register(
            "topic_delta_deliveries",
            "Deltas queued to delta subscribers (their other deliveries went whole)",
            m.delta_deliveries.clone(),
        );
        r.register(
            "topic_drops",
            "Publications a whole event loop could not take, by reason",
            m.topic_drops.clone(),
        );
        r.register_with_unit(
            "handshake_duration",
            "From accept to the 101 response (the loop's millisecond clock)",
            Unit::Seconds,
            m.handshake_duration.clone(),
        );
        r.register_with_unit(
            "message_size",
            "Sizes of the data messages received",
            bytes,
            m.message_size.clone(),
        );
        r.register_with_unit(
            "send_queue_delay",
            "How long a send queue stays non-empty, from its first byte to the write that empties it",
            Unit::Seconds,
            m.queue_delay.clone(),
        );
        r.register("config_reloads", "Configuration reloads applied", m.reloads.clone());
        r.register_with_unit(
            "pool_resident",
            "Pool bytes that may be resident (touched, not yet given back), per event loop",
            Unit::Bytes,
            m.pool_resident_bytes.clone(),
        );
        m.access.register(r);
        r.register("tls_handshakes", "TLS handshakes completed", m.tls_handshakes.clone());
        r.register(
            "tls_resumptions",
            "TLS handshakes that resumed an earlier session (a ticket)",
            m.tls_resumptions.clone(),
        );
        r.register(
            "tls_refusals",
            "TLS connections refused or failed, by reason",
            m.tls_refusals.clone(),
        );
        r.register(
            "backplane_lost",
            "Publications that did not reach the Redis backplane, by reason",
            m.backplane_lost.clone(),
        );
        r.register(
            "backplane_published",
            "Publications the Redis backplane confirmed",
            m.backplane_published.clone(),
        );
        r.register(
            "backplane_received",
            "Publications of other nodes received from the Redis backplane",
            m.backplane_received.clone(),
        );
        r.register(
            "backplane_history_reads",
            "Reads of history topics' streams for reconnecting subscribers",
            m.backplane_history_reads.clone(),
        );
        r.register(
            "backplane_up",
            "1 while Redis is mapped and every server holding the subscriptions is connected",
            m.backplane_up.clone(),
        );
        r.register(
            "topic_refusals",
            "Subscriptions refused by a topic limit, by reason",
            m.topic_refusals.clone(),
        );
        Self { registry: root, ..m }
    }

    /// The OpenMetrics text exposition of every metric (serve it as [`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // NOTE(unwrap): writing to a String cannot fail.
        prometheus_client::encoding::text::encode(&mut out, &self.registry).unwrap();
        out
    }

    /// [`encode`](Self::encode)'s text, built at most once per [`ADMIN_REFRESH`] and shared
    /// by the requests in between: what `/metrics` answers.
    pub fn shared_exposition(&self) -> Arc<str> {
        self.shared(AdminAnswer::Exposition)
    }

    /// [`snapshot_json`](Self::snapshot_json), built at most once per [`ADMIN_REFRESH`] and
    /// shared by the requests in between: what the dashboard stream sends.
    pub fn shared_snapshot(&self) -> Arc<str> {
        self.shared(AdminAnswer::Snapshot)
    }

    fn shared(&self, answer: AdminAnswer) -> Arc<str> {
        let mut built = self.admin[answer as usize].lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if built.at.is_none_or(|at| now.duration_since(at) >= ADMIN_REFRESH) {
            let text = match answer {
                AdminAnswer::Snapshot => self.snapshot_json(),
                AdminAnswer::Exposition => self.encode(),
            };
            *built = Built { at: Some(now), text: text.into() };
        }
        built.text.clone()
    }

    /// Counts a close by reason.
    pub fn close(&self, reason: &str) {
        self.closes.get_or_create(&Reason { reason: reason.to_owned() }).inc();
    }

    /// Counts a refusal by status.
    pub fn refuse(&self, status: u16) {
        self.refusals.get_or_create(&Status { status }).inc();
    }

    /// The value of `refusals_total{status}`.
    pub fn refusals_for(&self, status: u16) -> u64 {
        self.refusals.get_or_create(&Status { status }).get()
    }

    /// The value of `closes_total{reason}`.
    pub fn closes_for(&self, reason: &str) -> u64 {
        self.closes.get_or_create(&Reason { reason: reason.to_owned() }).get()
    }

    /// The value of `drops_total{reason=policy}`.
    pub fn drops_for(&self, policy: &str) -> u64 {
        self.drops.get_or_create(&Reason { reason: policy.to_owned() }).get()
    }

    /// The value of `topic_drops_total{reason}`.
    pub fn topic_drops_for(&self, reason: &str) -> u64 {
        self.topic_drops.get_or_create(&Reason { reason: reason.to_owned() }).get()
    }

    /// Connections accepted since start.
    pub fn accepted(&self) -> u64 {
        self.accepted.get()
    }

    /// Messages received since start.
    pub fn messages_in(&self) -> u64 {
        self.messages_in.get()
    }

    /// Messages sent since start.
    pub fn messages_out(&self) -> u64 {
        self.messages_out.get()
    }

    /// WebSocket connections closed since start, whatever the reason.
    pub fn closes_total(&self) -> u64 {
        CLOSE_REASONS.iter().map(|r| self.closes_for(r)).sum()
    }

    /// Open connections: WebSockets and Server-Sent Events streams.
    pub fn connections(&self) -> i64 {
        self.connections.get()
    }

    /// Open Server-Sent Events streams (counted in [`connections`](Self::connections) too).
    pub fn sse_connections(&self) -> i64 {
        self.event_streams.get()
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

    /// Publications compressed for compressing subscribers (once per publication, event
    /// loop and window size).
    pub fn topic_compressions(&self) -> u64 {
        self.compressions.get()
    }

    /// Publications sent uncompressed to compressing subscribers for want of budget.
    pub fn topic_compression_fallbacks(&self) -> u64 {
        self.compression_fallbacks.get()
    }

    /// Publications made into a delta for delta subscribers (once per publication and event
    /// loop).
    pub fn topic_deltas(&self) -> u64 {
        self.deltas.get()
    }

    /// Deltas queued to delta subscribers.
    pub fn topic_delta_deliveries(&self) -> u64 {
        self.delta_deliveries.get()
    }

    /// Handshakes (and plain HTTP requests) that timed out.
    pub fn handshake_timeouts(&self) -> u64 {
        self.handshake_timeouts.get()
    }

    /// Connections closed with 1008 by the `close` slow-consumer policy.
    pub fn slow_consumer_closes(&self) -> u64 {
        self.slow_consumer_closes.get()
    }

    /// Completed upgrades timed in `freeboard_handshake_duration_seconds`.
    pub fn handshakes(&self) -> u64 {
        self.handshake_duration.count()
    }

    /// Configuration reloads applied.
    pub fn reloads(&self) -> u64 {
        self.reloads.get()
    }

    /// Pool chunks in use, summed over the loops.
    pub fn total_chunks_in_use(&self) -> i64 {
        self.sum_over_loops(&self.chunks_in_use)
    }

    /// The loops' chunks withheld for what the open connections cost outside the pool (their
    /// kernel memory and table entries), summed.
    pub fn total_chunks_withheld(&self) -> i64 {
        self.sum_over_loops(&self.chunks_withheld)
    }

    /// The loops' chunk high-water marks, summed.
    pub fn total_chunks_high_water(&self) -> i64 {
        self.sum_over_loops(&self.chunks_high_water)
    }

    /// Bytes waiting in send queues, summed over the loops.
    pub fn total_bytes_buffered(&self) -> i64 {
        self.sum_over_loops(&self.send_queue_bytes)
    }

    /// Takes a dashboard sample if the last is a second old or more (any loop may call it at
    /// the end of its turn; one of them takes it).
    pub(crate) fn sample_for_dashboard(&self) {
        let now = now_ms();
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if now < samples.last_ms + 1000 {
            return;
        }
        samples.last_ms = now;
        let total = |family: &Family<Reason, Counter>, reasons: &mut dyn Iterator<Item = &str>| {
            reasons.map(|r| family.get_or_create(&Reason { reason: r.to_owned() }).get()).sum()
        };
        let policies = SlowConsumerPolicy::ALL.iter().map(|p| p.name());
        let drops = total(&self.drops, &mut policies.chain([POOL_EXHAUSTED, CLOSED]));
        let closes = total(&self.closes, &mut CLOSE_REASONS.iter().copied());
        let refusals = REFUSAL_STATUSES.iter().map(|&s| self.refusals_for(s)).sum();
        let loop_figures = |i| {
            let label = LoopLabel { event_loop: i };
            [
                self.chunks_in_use.get_or_create(&label).get(),
                self.chunks_high_water.get_or_create(&label).get(),
                self.send_queue_bytes.get_or_create(&label).get(),
            ]
        };
        let sample = Sample {
            at_ms: now,
            counters: [
                self.messages_in.get(),
                self.messages_out.get(),
                self.bytes_in.get(),
                self.bytes_out.get(),
                drops,
                closes,
                refusals,
            ],
            connections: self.connections.get(),
            loops: (0..self.loops()).map(loop_figures).collect(),
        };
        if samples.ring.len() == DASHBOARD_SAMPLES {
            samples.ring.pop_front();
        }
        samples.ring.push_back(sample);
    }

    /// What a dashboard page gets when it opens: the samples of the last minutes (`history`,
    /// each `[at_ms, messages_in, messages_out, bytes_in, bytes_out, drops, closes, refusals,
    /// connections, [[chunks_in_use, chunks_high_water, send_queue_bytes], …]]`), and the
    /// server's `info` (version, start, configuration summary).
    pub fn dashboard_history_json(&self) -> String {
        use std::fmt::Write;
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::with_capacity(64 + samples.ring.len() * 96);
        out.push_str("{\"history\":[");
        for (i, sample) in samples.ring.iter().enumerate() {
            let _ = write!(out, "{}[{}", if i == 0 { "" } else { "," }, sample.at_ms);
            for n in sample.counters {
                let _ = write!(out, ",{n}");
            }
            let _ = write!(out, ",{},[", sample.connections);
            for (j, [a, b, c]) in sample.loops.iter().enumerate() {
                let _ = write!(out, "{}[{a},{b},{c}]", if j == 0 { "" } else { "," });
            }
            out.push_str("]]");
        }
        drop(samples);
        let summary = self.summary.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let _ = write!(
            out,
            "],\"info\":{{\"version\":\"{}\",\"started_at_ms\":{},\"config\":{summary}}}}}",
            env!("CARGO_PKG_VERSION"),
            self.started_at_ms,
        );
        out
    }

    /// Sets what the dashboard shows of the server's configuration: `[setting, value]` pairs,
    /// with no secret among the values (say "set" for a token).
    pub fn set_summary(&self, pairs: &[(&str, String)]) {
        let json = serde_json::to_string(pairs).unwrap_or_else(|_| "[]".into());
        *self.summary.lock().unwrap_or_else(|e| e.into_inner()) = json.into();
    }

    /// A snapshot of the figures the dashboard draws, as one JSON object: when it was taken
    /// (`at_ms`, milliseconds since the Unix epoch), when the server started
    /// (`started_at_ms`), totals (counters since start), and per loop the pool, budget and
    /// send queues.
    pub fn snapshot_json(&self) -> String {
        use std::fmt::Write;
        let mut out = String::with_capacity(1024);
        let chunk = self.chunk_size.get();
        let _ = write!(out, "{{\"started_at_ms\":{},", self.started_at_ms);
        let _ = write!(
            out,
            "\"at_ms\":{},\"connections\":{},\"sse_connections\":{},\"accepted\":{},\"messages_in\":{},\"messages_out\":{},\
             \"bytes_in\":{},\"bytes_out\":{},\"subscriptions\":{},\"publishes\":{},\
             \"deliveries\":{},\"handshakes\":{},\"chunk_size\":{chunk},\
             \"resident_memory_bytes\":{},\"connection_kernel_bytes\":{},\
             \"kernel_memory_estimate_bytes\":{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis()),
            self.connections.get(),
            self.event_streams.get(),
            self.accepted.get(),
            self.messages_in.get(),
            self.messages_out.get(),
            self.bytes_in.get(),
            self.bytes_out.get(),
            self.subscriptions.get(),
            self.publishes.get(),
            self.deliveries.get(),
            self.handshake_duration.count(),
            resident_memory_bytes().unwrap_or(0),
            self.connection_kernel_bytes.get(),
            self.kernel_estimate_bytes.get(),
        );
        let mut labelled = |name: &str, pairs: &mut dyn Iterator<Item = (String, u64)>| {
            let _ = write!(out, ",\"{name}\":{{");
            for (i, (label, n)) in pairs.enumerate() {
                let _ = write!(out, "{}\"{label}\":{n}", if i == 0 { "" } else { "," });
            }
            out.push('}');
        };
        labelled("closes", &mut CLOSE_REASONS.iter().map(|r| (r.to_string(), self.closes_for(r))));
        labelled(
            "drops",
            &mut SlowConsumerPolicy::ALL
                .iter()
                .map(|p| p.name())
                .chain([POOL_EXHAUSTED, CLOSED])
                .map(|r| (r.to_string(), self.drops_for(r)))
                .chain(
                    TOPIC_DROP_REASONS
                        .iter()
                        .map(|r| (format!("topic_{r}"), self.topic_drops_for(r))),
                ),
        );
        labelled(
            "refusals",
            &mut REFUSAL_STATUSES.iter().map(|&s| (s.to_string(), self.refusals_for(s))),
        );
        out.push_str(",\"loops\":[");
        for i in 0..self.loops() {
            let label = LoopLabel { event_loop: i };
            let _ = write!(
                out,
                "{}{{\"chunks_in_use\":{},\"chunks_high_water\":{},\"chunks_capacity\":{},\
                 \"budget_bytes\":{},\"pool_resident_bytes\":{},\"send_queue_bytes\":{},\
                 \"allocation_failures\":{},\"chunks_withheld\":{}}}",
                if i == 0 { "" } else { "," },
                self.chunks_in_use.get_or_create(&label).get(),
                self.chunks_high_water.get_or_create(&label).get(),
                self.chunks_capacity.get_or_create(&label).get(),
                self.budget_bytes.get_or_create(&label).get(),
                self.pool_resident_bytes.get_or_create(&label).get(),
                self.send_queue_bytes.get_or_create(&label).get(),
                self.allocation_failures.get_or_create(&label).get(),
                self.chunks_withheld.get_or_create(&label).get(),
            );
        }
        out.push_str("]}");
        out
    }

    /// Keeps per-topic series (`freeboard_named_topic_*{topic}`, the dashboard's topics
    /// table) for the topics whose name starts with one of `prefixes` (`""` names every
    /// topic), at most `max_topics` at once; a subscription to one more is counted in
    /// `freeboard_named_topic_left_out_total`. Only the first call counts (the server makes it
    /// from [`TopicsConfig::metrics_prefixes`](crate::config::TopicsConfig::metrics_prefixes)).
    pub fn watch_topics(&self, prefixes: &[String], max_topics: usize) {
        self.topic_series.watch(prefixes, max_topics);
    }

    /// Topics with per-topic series now.
    pub fn named_topics(&self) -> usize {
        self.topic_series.len()
    }

    /// Subscriptions to named topics that got no series (the series were at their cap).
    pub fn named_topics_left_out(&self) -> u64 {
        self.topic_series.left_out()
    }

    /// The dashboard's topics table as JSON: `prefixes`, `max_topics`, `left_out`, and
    /// `topics`, each `{topic, subscribers, publishes, deliveries, drops: {policy: n}}`
    /// (counters since the topic's series began; most subscribers first).
    pub fn topics_json(&self) -> String {
        self.topic_series.json().to_string()
    }

    /// The `n` slowest subscribers (largest send queue first) of each loop's last sweep, with
    /// the lag distribution, as JSON: `subscribers`, `slowest` (each `{id, peer, sub, path,
    /// policy, queue_bytes, queued_messages, oldest_unsent_ms, high_watermark, cap, writable,
    /// compressed, topics, topic_count}`), `queue_bytes` and
    /// `oldest_unsent_seconds` (cumulative `[le, subscribers]` pairs), `sweeps` (per loop: `swept_at_ms`, `took_ms`, `steps`, `longest_step_us`).
    pub fn slowest_json(&self, n: usize) -> String {
        self.lag.slowest_json(n, now_ms()).to_string()
    }

    /// One connection among the slowest of its loop's last sweep, by `id` (`loop.token.serial`,
    /// as [`slowest_json`](Self::slowest_json) names it), as JSON.
    pub fn connection_json(&self, id: &str) -> Option<String> {
        self.lag.connection_json(id, now_ms()).map(|v| v.to_string())
    }

    /// Creates every per-loop series at zero, so a scrape lists each loop from the start.
    pub(crate) fn set_loops(&self, n: u32) {
        self.loops.store(n, Ordering::Relaxed);
        self.lag.set_loops(n);
        for event_loop in 0..n {
            let label = LoopLabel { event_loop };
            let _ = self.chunks_in_use.get_or_create(&label);
            let _ = self.chunks_capacity.get_or_create(&label);
            let _ = self.chunks_high_water.get_or_create(&label);
            let _ = self.slots_in_use.get_or_create(&label);
            let _ = self.slots_total.get_or_create(&label);
            let _ = self.slots_high_water.get_or_create(&label);
            let _ = self.budget_bytes.get_or_create(&label);
            let _ = self.send_queue_bytes.get_or_create(&label);
            let _ = self.allocation_failures.get_or_create(&label);
            let _ = self.pool_resident_bytes.get_or_create(&label);
            let _ = self.chunks_withheld.get_or_create(&label);
        }
    }

    fn loops(&self) -> u32 {
        self.loops.load(Ordering::Relaxed)
    }

    fn sum_over_loops(&self, family: &Family<LoopLabel, Gauge>) -> i64 {
        (0..self.loops()).map(|i| family.get_or_create(&LoopLabel { event_loop: i }).get()).sum()
    }

    /// Counts a publish a whole loop could not take.
    pub(crate) fn topic_drop(&self, reason: &str) {
        self.topic_drops.get_or_create(&Reason { reason: reason.to_owned() }).inc();
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

    /// TLS connections refused or failed for `reason` (see `freeboard_tls_refusals_total`).
    pub fn tls_refusals(&self, reason: &str) -> u64 {
        self.tls_refusals.get_or_create(&Reason { reason: reason.to_owned() }).get()
    }

    /// Counts a TLS refusal.
    pub(crate) fn tls_refusal(&self, reason: &'static str) {
        self.tls_refusals.get_or_create(&Reason { reason: reason.to_owned() }).inc();
    }

    /// Counts a subscription refused by a topic limit.
    pub(crate) fn topic_refusal(&self, reason: &str) {
        self.topic_refusals.get_or_create(&Reason { reason: reason.to_owned() }).inc();
    }

    /// Counts an access refusal by reason.
    pub(crate) fn access_refusal(&self, reason: &str) {
        self.access.refusals.get_or_create(&Reason { reason: reason.to_owned() }).inc();
    }

    /// The value of `access_refusals_total{reason}`.
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

/// Who was let in and who was not: the metrics of origins, tokens, forwarded addresses and
/// upgrade decisions (`freeboard_access_*`).
#[derive(Debug, Default)]
pub(crate) struct AccessMetrics {
    /// Upgrades refused by an access check, by reason ([`ACCESS_REFUSAL_REASONS`], or an
    /// application's own reason).
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

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The standard `process_*` series, read from `/proc/self` at each scrape (Linux; elsewhere
/// only `process_max_fds` and nothing else).
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // The fields after the command (which may hold spaces) in its parentheses.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        // SAFETY: sysconf only reads a system constant.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        if let (Some(utime), Some(stime)) = (field(14), field(15)) {
            let cpu = (utime + stime) as f64 / ticks;
            let e = encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time spent, in seconds",
                None,
                MetricType::Counter,
            )?;
            ConstCounter(cpu).encode(e)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                resident_memory_bytes().map(|b| b as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                field(23).map(|b| b as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds",
                field(22).and_then(|start| Some(boot_time()? + start as f64 / ticks)),
            ),
            (
                "process_open_fds",
                "Open file descriptors",
                crate::capacity::open_descriptors().map(|n| n as f64),
            ),
            ("process_max_fds", "Maximum number of open file descriptors", max_fds()),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                let mut e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                e.encode_gauge(&value)?;
            }
        }
        Ok(())
    }
}

/// The kernel's own figures of its socket memory ([`KernelFigures`](crate::kernel_memory::KernelFigures)),
/// read at each scrape, beside which `freeboard_kernel_memory_estimate_bytes` is judged.
#[derive(Debug)]
struct KernelCollector;

impl Collector for KernelCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let k = crate::kernel_memory::KernelFigures::read();
        let gauges = [
            (
                "freeboard_kernel_tcp_sockets",
                "TCP sockets in use on the host (/proc/net/sockstat)",
                k.tcp_sockets,
            ),
            (
                "freeboard_kernel_tcp_buffer_bytes",
                "TCP buffer memory of the host (/proc/net/sockstat mem)",
                k.tcp_buffer_bytes,
            ),
            (
                "freeboard_kernel_socket_slab_bytes",
                "Slab memory of the host's TCP sockets, their inodes, files, dentries and epoll \
                 entries (/proc/slabinfo)",
                k.socket_slab_bytes,
            ),
            ("freeboard_cgroup_memory_bytes", "Memory of the server's cgroup", k.cgroup_bytes),
            (
                "freeboard_cgroup_kernel_memory_bytes",
                "Kernel memory of the server's cgroup",
                k.cgroup_kernel_bytes,
            ),
            (
                "freeboard_cgroup_socket_memory_bytes",
                "Socket buffer memory of the server's cgroup",
                k.cgroup_socket_bytes,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                let mut e = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                e.encode_gauge(&(value as f64))?;
            }
        }
        Ok(())
    }
}

/// A counter value read at scrape time.
struct ConstCounter(f64);

impl ConstCounter {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<prometheus_client::encoding::NoLabelSet, _, f64>(&self.0, None)
    }
}

/// The process's resident memory (RSS) in bytes: the second field of `/proc/self/statm`
/// (pages), what `ps` and a container's memory limit see.
pub fn resident_memory_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    Some(pages * page)
}

/// The system's boot time in seconds since the epoch (`btime` in `/proc/stat`).
fn boot_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

fn max_fds() -> Option<f64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the limit into the struct we pass.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    ok.then_some(limit.rlim_cur as f64)
}

/// Keeps a loop's `info` lines about refusals and abnormal closes to a few a second: a flood
/// of refused clients must not become a flood of log lines. The lines held back are counted
/// and the next line says how many (`suppressed`).
#[derive(Debug, Default)]
pub(crate) struct LogThrottle {
    /// The second (of the loop's clock) the count is for.
    second: u64,
    lines: u32,
    suppressed: u64,
}

impl LogThrottle {
    /// Lines per second and loop.
    const PER_SECOND: u32 = 5;

    /// Whether a line may be written at `now_ms`; if so, how many were held back before it.
    pub(crate) fn allow(&mut self, now_ms: u64) -> Option<u64> {
        let second = now_ms / 1000;
        if second != self.second {
            (self.second, self.lines) = (second, 0);
        }
        if self.lines == Self::PER_SECOND {
            self.suppressed += 1;
            return None;
        }
        self.lines += 1;
        Some(std::mem::take(&mut self.suppressed))
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

/// A backplane's counters (listed at 0 on a node without one).
impl Metrics {
    /// Counts publications that did not reach the backplane, by `reason` (the Redis
    /// backplane's: `queue_full`, `redis_down`, `unconfirmed`, `refused`).
    pub fn backplane_lost(&self, reason: &str, n: u64) {
        self.backplane_lost.get_or_create(&Reason { reason: reason.to_owned() }).inc_by(n);
    }

    /// Counts publications the backplane confirmed.
    pub fn backplane_published(&self, n: u64) {
        self.backplane_published.inc_by(n);
    }

    /// Counts a publication received from another node.
    pub fn backplane_received(&self) {
        self.backplane_received.inc();
    }

    /// Counts a read of a history topic's stream for reconnecting subscribers.
    pub fn backplane_history_read(&self) {
        self.backplane_history_reads.inc();
    }

    /// Whether the backplane is connected where it holds the subscriptions.
    pub fn set_backplane_up(&self, up: bool) {
        self.backplane_up.set(i64::from(up));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_size_buckets_match_a_search_of_the_bounds() {
        let edges = MESSAGE_SIZE_BUCKETS.iter().flat_map(|&b| [b - 1, b, b + 1]);
        for len in (0..=300).chain(edges).chain([u64::MAX]) {
            let searched = MESSAGE_SIZE_BUCKETS.partition_point(|&b| b < len);
            assert_eq!(message_size_bucket(len), searched, "{len} bytes");
        }
    }

    #[test]
    fn every_labelled_series_is_there_from_the_start() {
        let metrics = Metrics::new();
        metrics.set_loops(2);
        let text = metrics.encode();
        for reason in CLOSE_REASONS {
            assert!(text.contains(&format!("freeboard_closes_total{{reason=\"{reason}\"}} 0")));
        }
        assert!(text.contains("freeboard_refusals_total{status=\"503\"} 0"), "{text}");
        let policies = SlowConsumerPolicy::ALL.iter().map(|p| p.name());
        for reason in policies.chain([POOL_EXHAUSTED, CLOSED]) {
            let series = format!("freeboard_drops_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&series), "{series} missing");
        }
        assert!(text.contains("freeboard_pool_chunks_in_use{event_loop=\"1\"} 0"));
        assert!(text.contains("freeboard_pool_allocation_failures_total{event_loop=\"0\"} 0"));
        assert!(text.contains("freeboard_build_info{version=\""));
        assert!(text.contains("freeboard_message_size_bytes_bucket{le=\"+Inf\"} 0"));
        for (family, reasons) in [
            ("tls_refusals", &TLS_REFUSAL_REASONS[..]),
            ("access_refusals", &ACCESS_REFUSAL_REASONS),
            ("backplane_lost", &BACKPLANE_LOST_REASONS),
            ("topic_refusals", &TOPIC_REFUSAL_REASONS),
            ("topic_drops", &TOPIC_DROP_REASONS),
            ("http2_resets", &HTTP2_RESET_REASONS),
            ("http2_goaways", &HTTP2_GOAWAY_CODES),
        ] {
            for reason in reasons {
                let series = format!("freeboard_{family}_total{{reason=\"{reason}\"}} 0");
                assert!(text.contains(&series), "{series} missing");
            }
        }
        assert!(text.contains("freeboard_pool_resident_bytes{event_loop=\"1\"} 0"));
        assert!(text.contains("freeboard_backplane_up 0"));
        // RSS from /proc/self/statm: this test process holds more than a MiB.
        let rss = text.lines().find_map(|l| l.strip_prefix("process_resident_memory_bytes "));
        assert!(rss.and_then(|v| v.parse::<f64>().ok()).is_some_and(|v| v > 1e6), "{rss:?}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn gauges_never_end_in_total_and_counters_always_do() {
        let text = Metrics::new().encode();
        let mut kind = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, t) = rest.split_once(' ').unwrap();
                kind = t;
                assert!(t == "counter" || !name.ends_with("_total"), "{name} is a {t}");
            } else if !line.starts_with('#') && kind == "counter" {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(name.ends_with("_total") || name.ends_with("_created"), "{line}");
            }
        }
    }

    #[test]
    fn the_grafana_dashboard_asks_only_for_series_that_exist() {
        let dashboard = include_str!("../../../docs/grafana/freeboard.json");
        let metrics = Metrics::new();
        metrics.set_loops(1);
        let text = metrics.encode();
        let mut asked = 0;
        for (i, _) in
            dashboard.match_indices("freeboard_").chain(dashboard.match_indices("process_"))
        {
            let name: String = dashboard[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let series = name.strip_suffix("_bucket").unwrap_or(&name);
            assert!(text.contains(series), "{name} is not exported");
            asked += 1;
        }
        assert!(asked > 20);
    }

    #[test]
    fn log_lines_are_throttled_and_the_held_back_counted() {
        let mut throttle = LogThrottle::default();
        let allowed = (0..8).filter(|_| throttle.allow(1_500).is_some()).count();
        assert_eq!(allowed, LogThrottle::PER_SECOND as usize);
        assert_eq!(throttle.allow(2_000), Some(3), "the next second says what was held back");
    }

    #[test]
    fn loop_histograms_add_their_turns() {
        let metrics = Metrics::new();
        let mut stats = LoopStats::default();
        stats.received(10);
        stats.received(100_000);
        stats.queue_drained(3);
        stats.publish(&metrics);
        assert_eq!(metrics.message_size.count(), 2);
        let text = metrics.encode();
        assert!(text.contains("freeboard_message_size_bytes_bucket{le=\"64.0\"} 1"), "{text}");
        assert!(text.contains("freeboard_message_size_bytes_sum 100010"), "{text}");
        assert!(text.contains("freeboard_send_queue_delay_seconds_bucket{le=\"0.005\"} 1"));
        assert!(metrics.snapshot_json().contains("\"messages_in\":2"));
    }
}
