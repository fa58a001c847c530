//! Server configuration: one `#[non_exhaustive]` struct with explicit limits.

use std::net::SocketAddr;
use std::time::Duration;

use freeboard_buf::{SlowConsumerPolicy, Watermarks};
use serde::Deserialize;

use crate::{Limits, LimitsError};

/// The smallest pool chunk: a frame header and a useful piece of payload.
pub const MIN_CHUNK_SIZE: usize = 256;

/// How a server's loops move the bytes of plain-TCP connections (`freeboard serve --io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoDriver {
    /// Readiness from epoll, then a `read` per socket and a `writev` per connection touched.
    #[default]
    Epoll,
    /// io_uring (Linux 6.0 or later): multishot accept, receives of up to 64 KiB (bundles of
    /// buffers carved from the loop's pool, Linux 6.17; one buffer on older kernels), the
    /// replies to a read written after it, the turn's queued sends in one submission, and
    /// the loop waiting on its ring. TLS and admin connections stay on epoll. A loop whose
    /// kernel refuses io_uring (seccomp, `kernel.io_uring_disabled`, a missing operation)
    /// runs on epoll instead.
    Uring,
}

impl IoDriver {
    /// The driver's name, as `--io` takes it and the metrics label it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Epoll => "epoll",
            Self::Uring => "uring",
        }
    }
}

/// Everything `freeboard serve` can be told, with the defaults documented on each field.
///
/// Deserializes from TOML in the same language as `freeboard serve`'s flags: sizes as bytes
/// or with a suffix (`"256M"`, `"64K"`, `"1.5G"`; powers of 1024, see [`parse_size()`]),
/// durations as seconds or with a unit (`"30s"`, `"500ms"`, `"2m"`, see
/// [`parse_duration`]); missing fields keep their defaults, an unknown key is refused. The
/// [`limits`](Self::limits)' keys sit at the top level beside the server's own
/// (`send_cap = "1M"`, as `--send-cap 1M`). Settings derived from others follow
/// [`derive_unset`](Self::derive_unset).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Address to listen on. Default `127.0.0.1:9001`. In TOML, anything [`parse_listen`]
    /// reads: `"0.0.0.0:9001"`, `"localhost:9001"`, `"[::]:9001"`, or a bare port (`9001`:
    /// loopback).
    pub listen: SocketAddr,
    /// Join the `SO_REUSEPORT` group of another process already listening on `listen`
    /// (a rolling restart). Default `false`: a taken address fails `Server::bind` with
    /// "address in use".
    pub share_port: bool,
    /// Event loops (threads), each with its own `SO_REUSEPORT` listener. Default: the number
    /// of available cores.
    pub threads: usize,
    /// The memory budget in bytes for all buffers (pool chunks, message assembly, read
    /// buffers), split evenly between the event loops. Default 1 GiB. Chunk pages cost RSS
    /// only once used; the pool's free lists (about 3 % of the budget) are written at start.
    pub memory: usize,
    /// Pool chunk size in bytes. Default 4096.
    pub chunk_size: usize,
    /// Per-loop shared read buffer in bytes, at least 16 KiB. Default 128 KiB. Each loop also
    /// keeps a cork of this size (the replies to one read, written at once); both come out of
    /// the loop's share of `memory`. With `limits.send_high` at least this large, an echo's
    /// replies to one read leave in one write.
    pub read_buffer: usize,
    /// How the loops move plain-TCP bytes: [`IoDriver::Epoll`] (readiness, then `read` and
    /// `writev`) or [`IoDriver::Uring`] (io_uring completions, Linux). A loop whose kernel
    /// refuses io_uring runs on epoll and says so once in the log. Default `epoll`.
    pub io: IoDriver,
    /// Every connection's send queue (watermarks, cap, slow-consumer policy), largest message
    /// and frame, and timeouts (handshake, idle, pong, close); a route may give its own send
    /// queue ([`RouteOptions`](crate::RouteOptions)). Default [`Limits::DEFAULT`].
    pub limits: Limits,
    /// Open connections (WebSocket and HTTP) across all loops; beyond it upgrades get 503.
    /// Default 100,000.
    pub max_connections: usize,
    /// Connections from one IP address; beyond it upgrades get 429 with `Retry-After`.
    /// Default 1,000.
    pub max_connections_per_ip: usize,
    /// New connections per second across the server (token bucket, burst of one second's
    /// worth); beyond it upgrades get 503 with `Retry-After`. 0 (the default) turns it off.
    pub accept_rate: f64,
    /// New connections per second from one IP address (token bucket, burst of one second's
    /// worth); beyond it upgrades get 429 with `Retry-After`. 0 (the default) turns it off.
    pub accept_rate_per_ip: f64,
    /// Seconds a client is told to wait in `Retry-After` (429). Default 1.
    pub retry_after: Duration,
    /// On shutdown, how long to wait for close handshakes before exiting. Default 5 s.
    pub drain_timeout: Duration,
    /// Pool bytes that must be free for an upgrade to be accepted (else 503). Messages that
    /// arrive in pieces may not take the pool below half of it (else close 1013), so the open
    /// connections keep room to send. Default 64 KiB.
    pub connection_reserve: usize,
    /// Bytes the kernel may keep unsent for one connection (`TCP_NOTSENT_LOWAT`, Linux); a
    /// write past them waits in the connection's send queue, inside the budget, where the
    /// slow-consumer policy sees it. 0 leaves the kernel's own limit, which grows each socket's
    /// send buffer up to `net.ipv4.tcp_wmem`'s maximum (4 MiB by default) outside the budget.
    /// What a socket holds while it refuses writes is charged against `memory` (see
    /// `kernel_memory`). Default 64 KiB.
    pub kernel_send_queue: usize,
    /// Origins browsers may open WebSockets from (`scheme://host[:port]`,
    /// `scheme://*.domain`, `*`); any other `Origin` gets 403, counted in
    /// `freeboard_access_refusals_total{reason="origin"}` and logged at `info` (at most 5
    /// lines a second per event loop). Requests without `Origin` (non-browser clients) pass.
    /// Default: empty, every origin is allowed.
    pub allowed_origins: Vec<String>,
    /// Reverse proxies (CIDR blocks) whose `Forwarded` / `X-Forwarded-For` headers name the
    /// client: a connection from one of them is counted, limited and logged as the rightmost
    /// untrusted address of those headers (as the proxy itself without them). Default: none.
    pub trusted_proxies: Vec<String>,
    /// Every connection starts with a PROXY protocol header (v1 text or v2 binary, as HAProxy
    /// and cloud load balancers send), whose source address is the client's. A connection
    /// without one gets 400. Default `false`.
    pub proxy_protocol: bool,
    /// WebSockets over HTTP/2 (RFC 8441): the TLS listener offers `h2` before `http/1.1` by
    /// ALPN, and the plain listener takes a client preface (prior knowledge, h2c). Each
    /// extended CONNECT is a session of its own on the connection, admitted as an upgrade.
    /// `false`: HTTP/1.1 only. Default `true`.
    pub http2: bool,
    /// Upgrade decisions that may be pending at once across the server
    /// ([`Handler::decide_upgrade`](crate::Handler::decide_upgrade) completing later); beyond
    /// it an upgrade whose decision is not made at once gets 503. Default 1,024.
    pub max_pending_upgrades: usize,
    /// permessage-deflate (RFC 7692): `off` (offers declined), `shared` (one compressor per
    /// event loop, no context takeover) or `dedicated` (a context per connection, drawn from
    /// the budget). Default `off`.
    pub compression: crate::Compression,
    /// The LZ77 window of a dedicated context, 9–15 bits (both directions). Default 15.
    pub compression_window: u8,
    /// Messages shorter than this are sent uncompressed. Default 64 bytes; 0 compresses
    /// every message.
    pub compression_threshold: usize,
    /// Pub/sub: the topic endpoints, their send queues and who may publish (the `[topics]`
    /// table in TOML).
    pub topics: TopicsConfig,
    /// TLS (`wss://`): the certificate, the key and where to listen (the `[tls]` table in
    /// TOML). Default: none, plain `ws://` only.
    pub tls: Option<TlsConfig>,
    /// Who may reach the admin routes (`/metrics`, the dashboard and its stream, any route
    /// marked [`RouteOptions::admin`](crate::RouteOptions::admin)): the `[admin]` table in
    /// TOML.
    pub admin: AdminConfig,
}

/// Who may reach the admin routes. With neither setting they answer loopback clients only
/// (the client a trusted proxy names, not the proxy), and any other gets 403: what a
/// server reachable from the internet needs by default, while `curl localhost/metrics` and a
/// Prometheus beside the server keep working.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct AdminConfig {
    /// A bearer token the admin routes ask of every client, loopback or not
    /// (`Authorization: Bearer <token>`, or `?token=<token>` for the dashboard page in a
    /// browser; 401 without, 403 if wrong). Default: none.
    pub token: Option<String>,
    /// A listener of their own: the admin routes (and `/healthz`) are served there only, to
    /// any client that reaches it (unless `token` is set too), and answer 404 on the public
    /// listener. Default: none.
    #[serde(with = "opt_listen")]
    pub listen: Option<SocketAddr>,
    /// Admin requests (plain requests and dashboard-stream upgrades) one address may make per
    /// second, a token bucket with a second's burst; beyond it 429 with `Retry-After`. 0
    /// turns it off. Default 100: a Prometheus, an operator's `watch curl` and a few
    /// dashboards, not a client asking in a loop.
    pub rate_per_ip: f64,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self { token: None, listen: None, rate_per_ip: 100.0 }
    }
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("listen", &self.listen)
            .field("rate_per_ip", &self.rate_per_ip)
            .finish()
    }
}

/// TLS settings: `wss://` on rustls (TLS 1.3 and 1.2, ALPN `http/1.1`, session tickets).
///
/// With `listen` unset the server's one listener (`ServerConfig::listen`) speaks TLS; with
/// it set, `ServerConfig::listen` stays plain `ws://` and `listen` speaks TLS beside it.
/// The TLS handshake counts inside `handshake_timeout`. The rustls state of a connection is
/// charged to a share of each loop's memory budget (`state_share`); a connection it cannot
/// cover is refused at accept and counted (`freeboard_tls_refusals_total{reason="budget"}`).
/// Before that, each client address may have `handshakes_per_ip` handshakes in progress and
/// start `handshake_rate_per_ip` a second; beyond, it is refused at accept
/// (`reason="per_ip_handshakes"`, `"per_ip_rate"`) while other addresses are served.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TlsConfig {
    /// PEM file with the certificate chain, leaf first.
    pub cert: std::path::PathBuf,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
    /// A TLS listener beside the plain one. Default: none (the one listener is TLS).
    #[serde(default, with = "opt_listen")]
    pub listen: Option<SocketAddr>,
    /// The share of each loop's memory budget (1 / this) kept for TLS connections' rustls
    /// state: 8 KiB per handshake in progress, 4 KiB per established connection. Default 4.
    #[serde(default = "TlsConfig::default_state_share")]
    pub state_share: usize,
    /// TLS handshakes one client address (an IPv6 /64) may have in progress at once across
    /// the server; a connection beyond it is closed at accept, before it holds any TLS state,
    /// and counted (`freeboard_tls_refusals_total{reason="per_ip_handshakes"}`). A trusted
    /// proxy's connections are not counted. Default 64: an honest client's handshake takes
    /// a round trip or two, so 64 at once serves a busy NAT, and stalled handshakes from one
    /// address hold at most 64 × 12 KiB of the TLS share.
    #[serde(default = "TlsConfig::default_handshakes_per_ip")]
    pub handshakes_per_ip: usize,
    /// TLS handshakes one client address may start per second (a token bucket with a burst
    /// of one second's worth); beyond it, closed at accept before any cryptography
    /// (`reason="per_ip_rate"`). 0 (the default) turns it off: set it to bound the CPU that
    /// one address's full handshakes may take.
    #[serde(default)]
    pub handshake_rate_per_ip: u32,
}

impl TlsConfig {
    /// TLS with the certificate chain in `cert` and the key in `key`, on the server's one
    /// listener.
    pub fn new(cert: impl Into<std::path::PathBuf>, key: impl Into<std::path::PathBuf>) -> Self {
        Self {
            cert: cert.into(),
            key: key.into(),
            listen: None,
            state_share: Self::default_state_share(),
            handshakes_per_ip: Self::default_handshakes_per_ip(),
            handshake_rate_per_ip: 0,
        }
    }

    /// Serves TLS on `addr`, beside the plain listener.
    pub fn with_listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    fn default_state_share() -> usize {
        4
    }

    fn default_handshakes_per_ip() -> usize {
        64
    }
}

/// The topic hub's settings: its limits, the send queues of topic subscribers, the history it
/// keeps, and `POST` publishing ([`HttpRoute::Publish`](crate::HttpRoute::Publish)). The
/// `/topic/` service of `freeboard-topics` (its route, tokens, webhook and Redis backplane)
/// reads them from the same `[topics]` table.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TopicsConfig {
    /// Bearer token `POST` must carry (`Authorization: Bearer <token>`; 401 without, 403 if
    /// wrong). Default: none, anyone may publish.
    pub publish_token: Option<String>,
    /// The topic routes' slow-consumer policy. Default `conflate`: a subscriber that falls
    /// behind gets the newest message, not a backlog.
    #[serde(with = "policy")]
    pub slow_consumer: SlowConsumerPolicy,
    /// Under `conflate`, the byte that ends a message's key (e.g. `"|"` for `EURUSD|{...}`):
    /// a subscriber that is behind keeps the latest unsent message of each key, so a feed of
    /// several instruments loses none (see [`ConflateKey`](crate::ConflateKey)).
    /// Default: none, conflate keeps only the latest message.
    pub conflate_key: Option<char>,
    /// A subscriber's send queue low watermark. Default 32 KiB.
    #[serde(with = "size")]
    pub send_low: usize,
    /// A subscriber's send queue high watermark. Default 64 KiB.
    #[serde(with = "size")]
    pub send_high: usize,
    /// A subscriber's send queue hard cap; a published message larger than it is dropped for
    /// that subscriber (counted). Default 1 MiB.
    #[serde(with = "size")]
    pub send_cap: usize,
    /// Topics one connection may subscribe to. Default 64. An upgrade naming more (its topic
    /// and its `also=` list) is refused with 400.
    pub max_topics_per_connection: usize,
    /// Topics (with at least one subscriber) the server may have at once; a subscription to a
    /// new topic beyond it is refused (`freeboard_topic_refusals_total{reason="server_topics"}`; the topic
    /// route closes the connection with 1008). Default 100,000.
    pub max_topics: usize,
    /// Publications from other threads a loop's inbox holds before further ones are dropped
    /// (counted in `freeboard_topic_drops_total{reason="inbox_full"}`). Default 4096.
    pub inbox: usize,
    /// Origins whose pages may `POST` to the publish endpoint from a browser (CORS; same
    /// syntax as `allowed_origins`): their requests and `OPTIONS` preflights are answered
    /// with `Access-Control-Allow-Origin`. Default: none.
    pub cors_origins: Vec<String>,
    /// Messages of history kept per topic, for subscribers that reconnect with `?since=` (see
    /// [`history`](crate::history)); 0 keeps none and adds no offsets. Default 0. With a
    /// backplane that keeps history (Redis), kept there.
    pub history: usize,
    /// The oldest a kept message may be, in seconds; 0 for no age limit. Default 0.
    pub history_seconds: u64,
    /// Bytes all topics' history may hold together (payloads and about 96 bytes each); the
    /// server's oldest message goes first. Default 8 MiB.
    #[serde(with = "size")]
    pub history_memory: usize,
    /// Only topics whose name starts with this keep history and carry offsets. Default: every
    /// topic.
    pub history_prefix: String,
    /// Topics whose name starts with this offer delta compression: a subscriber that asks with
    /// `?delta=fossil` gets each publication whole or as a Fossil delta against the one before
    /// (see [`delta`](crate::delta)); the server keeps the last publication of each such topic
    /// that has delta subscribers. `""` offers it on every topic. Default: none offers it.
    pub delta_prefix: Option<String>,
    /// Topics whose name starts with one of these get per-topic series on `/metrics`
    /// (`freeboard_named_topic_*{topic}`) and a row in the dashboard's topics table (`""`
    /// names every topic). Default: none, no per-topic series.
    pub metrics_prefixes: Vec<String>,
    /// Topics that may have per-topic series at once; a subscription to one more named topic
    /// is counted in `freeboard_named_topic_left_out_total` instead. Default 100.
    pub metrics_topics: usize,
    /// The reconnection delay, in milliseconds, a Server-Sent Events subscriber is told at
    /// the start of its stream (`retry:`): how long its `EventSource` waits before it
    /// reconnects with `Last-Event-ID` once the stream is cut. Default 1000.
    pub sse_retry_ms: u64,
    /// Topics whose name starts with this have presence: their subscribers are listed
    /// (`GET /topic/NAME/presence`), and those that ask get join/leave events (see
    /// [`presence`](crate::presence)). `""` gives every topic presence. Default: none.
    pub presence_prefix: Option<String>,
    /// Members one topic's presence holds at most; a subscriber beyond is refused (counted in
    /// `freeboard_topic_refusals_total{reason="presence_topic_full"}`). Default 100,000.
    pub presence_max_per_topic: usize,
    /// Bytes all topics' presence may hold together, members of other nodes included (about
    /// 145 bytes each); a member beyond is refused (`reason="presence_memory"`). Default 8 MiB.
    #[serde(with = "size")]
    pub presence_memory: usize,
    /// How long a node's members stay listed on the other nodes (through Redis) unless the
    /// node refreshes them: a node that dies leaves every listing within this. Default 6 s.
    #[serde(with = "duration")]
    pub presence_ttl: std::time::Duration,
    /// The claims of a subscriber's token that its presence entry shows beside its `sub`.
    /// Default: none.
    pub presence_claims: Vec<String>,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        Self {
            publish_token: None,
            slow_consumer: SlowConsumerPolicy::Conflate,
            conflate_key: None,
            send_low: 32 << 10,
            send_high: 64 << 10,
            send_cap: 1 << 20,
            max_topics_per_connection: 64,
            max_topics: 100_000,
            inbox: 4096,
            cors_origins: Vec::new(),
            history: 0,
            history_seconds: 0,
            history_memory: 8 << 20,
            history_prefix: String::new(),
            delta_prefix: None,
            metrics_prefixes: Vec::new(),
            metrics_topics: 100,
            sse_retry_ms: 1000,
            presence_prefix: None,
            presence_max_per_topic: 100_000,
            presence_memory: 8 << 20,
            presence_ttl: std::time::Duration::from_secs(6),
            presence_claims: Vec::new(),
        }
    }
}

impl TopicsConfig {
    /// The send-queue watermarks of topic routes.
    pub fn watermarks(&self) -> Result<Watermarks, ConfigError> {
        Watermarks::new(self.send_low, self.send_high, self.send_cap)
            .map_err(|_| ConfigError::Watermarks { prefix: "topics." })
    }
}

impl std::fmt::Debug for TopicsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicsConfig")
            .field("publish_token", &self.publish_token.as_ref().map(|_| "<redacted>"))
            .field("slow_consumer", &self.slow_consumer)
            .field("conflate_key", &self.conflate_key)
            .field("send_low", &self.send_low)
            .field("send_high", &self.send_high)
            .field("send_cap", &self.send_cap)
            .field("max_topics_per_connection", &self.max_topics_per_connection)
            .field("max_topics", &self.max_topics)
            .field("inbox", &self.inbox)
            .field("cors_origins", &self.cors_origins)
            .field("history", &self.history)
            .field("history_seconds", &self.history_seconds)
            .field("history_memory", &self.history_memory)
            .field("history_prefix", &self.history_prefix)
            .field("delta_prefix", &self.delta_prefix)
            .field("metrics_prefixes", &self.metrics_prefixes)
            .field("metrics_topics", &self.metrics_topics)
            .field("sse_retry_ms", &self.sse_retry_ms)
            .field("presence_prefix", &self.presence_prefix)
            .field("presence_max_per_topic", &self.presence_max_per_topic)
            .field("presence_memory", &self.presence_memory)
            .field("presence_ttl", &self.presence_ttl)
            .field("presence_claims", &self.presence_claims)
            .finish()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9001)),
            share_port: false,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory: 1 << 30,
            chunk_size: freeboard_buf::DEFAULT_CHUNK_SIZE,
            read_buffer: 128 << 10,
            io: IoDriver::Epoll,
            limits: Limits::DEFAULT,
            max_connections: 100_000,
            max_connections_per_ip: 1_000,
            accept_rate: 0.0,
            accept_rate_per_ip: 0.0,
            retry_after: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(5),
            connection_reserve: 64 << 10,
            kernel_send_queue: 64 << 10,
            allowed_origins: Vec::new(),
            trusted_proxies: Vec::new(),
            proxy_protocol: false,
            http2: true,
            max_pending_upgrades: 1024,
            compression: crate::Compression::Off,
            compression_window: 15,
            compression_threshold: 64,
            topics: TopicsConfig::default(),
            tls: None,
            admin: AdminConfig::default(),
        }
    }
}

/// Every top-level key of `freeboard serve`'s TOML file: the field it sets and how its value is
/// read. One table for the parser and for the keys it names when it refuses an unknown one;
/// the [`Limits`]' keys sit beside the server's own, as their flags do.
macro_rules! server_keys {
    ($($key:literal => $($field:ident).+ as $read:ident;)*) => {
        const SERVER_KEYS: &[&str] = &[$($key),*];

        impl<'de> Deserialize<'de> for ServerConfig {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_struct("ServerConfig", SERVER_KEYS, ServerKeys)
            }
        }

        struct ServerKeys;

        impl<'de> serde::de::Visitor<'de> for ServerKeys {
            type Value = ServerConfig;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a table of server settings")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ServerConfig, A::Error> {
                let mut config = ServerConfig::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        $($key => config.$($field).+ = map.next_value::<$read<_>>()?.0,)*
                        key => return Err(serde::de::Error::unknown_field(key, SERVER_KEYS)),
                    }
                }
                Ok(config)
            }
        }
    };
}

server_keys! {
    "listen" => listen as Listen;
    "share_port" => share_port as Plain;
    "threads" => threads as Plain;
    "memory" => memory as Size;
    "chunk_size" => chunk_size as Size;
    "read_buffer" => read_buffer as Size;
    "io" => io as Plain;
    "max_message_size" => limits.max_message_size as Size;
    "max_connections" => max_connections as Plain;
    "max_connections_per_ip" => max_connections_per_ip as Plain;
    "accept_rate" => accept_rate as Plain;
    "accept_rate_per_ip" => accept_rate_per_ip as Plain;
    "retry_after" => retry_after as Time;
    "handshake_timeout" => limits.handshake_timeout as Time;
    "idle_timeout" => limits.idle_timeout as Time;
    "pong_timeout" => limits.pong_timeout as Time;
    "close_timeout" => limits.close_timeout as Time;
    "drain_timeout" => drain_timeout as Time;
    "send_low" => limits.send_low as Size;
    "send_high" => limits.send_high as Size;
    "send_cap" => limits.send_cap as Size;
    "slow_consumer" => limits.slow_consumer as Policy;
    "connection_reserve" => connection_reserve as Size;
    "kernel_send_queue" => kernel_send_queue as Size;
    "allowed_origins" => allowed_origins as Plain;
    "trusted_proxies" => trusted_proxies as Plain;
    "proxy_protocol" => proxy_protocol as Plain;
    "http2" => http2 as Plain;
    "max_pending_upgrades" => max_pending_upgrades as Plain;
    "compression" => compression as Plain;
    "compression_window" => compression_window as Plain;
    "compression_threshold" => compression_threshold as Size;
    "topics" => topics as Plain;
    "tls" => tls as Plain;
    "admin" => admin as Plain;
}

impl ServerConfig {
    /// The default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks that the limits fit together; the error says which does not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_features()?;
        if self.threads == 0 {
            return Err(ConfigError::NoThreads);
        }
        self.limits.validate()?;
        for (setting, value) in [
            ("max_connections", self.max_connections),
            ("max_connections_per_ip", self.max_connections_per_ip),
            ("topics.send_cap", self.topics.send_cap),
            ("topics.presence_max_per_topic", self.topics.presence_max_per_topic),
            ("topics.presence_ttl", self.topics.presence_ttl.as_millis() as usize),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(setting));
            }
        }
        if !(self.accept_rate >= 0.0
            && self.accept_rate_per_ip >= 0.0
            && self.admin.rate_per_ip >= 0.0)
        {
            return Err(ConfigError::AcceptRate);
        }
        // A request head (up to 8 KiB) must fit in one read buffer.
        let min = 2 * freeboard_proto::handshake::DEFAULT_MAX_HEAD_LEN;
        if self.read_buffer < min {
            return Err(ConfigError::ReadBuffer { given: self.read_buffer, min });
        }
        if !(MIN_CHUNK_SIZE..=freeboard_buf::MAX_CHUNK_SIZE).contains(&self.chunk_size) {
            let (min, max) = (MIN_CHUNK_SIZE, freeboard_buf::MAX_CHUNK_SIZE);
            return Err(ConfigError::ChunkSize { given: self.chunk_size, min, max });
        }
        let topics = &self.topics;
        topics.watermarks()?;
        if topics.inbox == 0 || topics.max_topics_per_connection == 0 || topics.max_topics == 0 {
            return Err(ConfigError::TopicLimits);
        }
        if topics.conflate_key.is_some_and(|c| !c.is_ascii()) {
            return Err(ConfigError::ConflateKey);
        }
        crate::auth::Origins::new(&self.allowed_origins).map_err(ConfigError::Origin)?;
        crate::auth::Origins::new(&topics.cors_origins).map_err(ConfigError::Origin)?;
        crate::auth::TrustedProxies::new(&self.trusted_proxies)
            .map_err(ConfigError::TrustedProxy)?;
        if self.max_pending_upgrades == 0 {
            return Err(ConfigError::PendingUpgrades);
        }
        if !(9..=15).contains(&self.compression_window) {
            return Err(ConfigError::CompressionWindow(self.compression_window));
        }
        let per_loop = self.memory / self.threads;
        // The read buffer and the cork beside it, and a few chunks.
        let mut needed = 2 * self.read_buffer + 16 * self.chunk_size;
        if let Some(tls) = &self.tls {
            if tls.state_share < 2 {
                return Err(ConfigError::TlsStateShare(tls.state_share));
            }
            if tls.handshakes_per_ip == 0 {
                return Err(ConfigError::Zero("tls.handshakes_per_ip"));
            }
            needed += crate::tls::TlsScratch::BYTES + crate::tls::HANDSHAKE_CHARGE * 16;
        }
        if per_loop < needed {
            return Err(ConfigError::Memory { memory: self.memory, threads: self.threads, needed });
        }
        Ok(())
    }

    /// Refuses the first setting whose part this build leaves out, naming its feature.
    fn check_features(&self) -> Result<(), ConfigError> {
        use crate::features::{DEFLATE, TLS};
        let wanted = [
            ("tls", "tls", TLS, self.tls.is_some()),
            ("compression", "deflate", DEFLATE, self.compression != crate::Compression::Off),
        ];
        match wanted.into_iter().find(|&(_, _, built, asked)| asked && !built) {
            Some((setting, feature, ..)) => {
                Err(ConfigError::MissingFeature(crate::MissingFeature { setting, feature }))
            }
            None => Ok(()),
        }
    }

    /// Fills the settings derived from others that were not given (`given("send_cap")`
    /// says whether a setting was, by its TOML key; `topics.` keys for the `[topics]`
    /// table). `freeboard serve` applies it once, after the file and the flags, so both
    /// derive the same way:
    ///
    /// - `send_cap` not given: at least `max_message_size` + 64 KiB (the default cap's
    ///   headroom), so a message of the maximum size can always be echoed;
    /// - a cap given without its watermarks: `send_high` lowered to the cap and `send_low` to
    ///   `send_high` when they would exceed it (the same for `topics.`).
    pub fn derive_unset(&mut self, given: impl Fn(&str) -> bool) {
        let limits = &mut self.limits;
        if !given("send_cap") {
            limits.send_cap = limits.send_cap.max(limits.max_message_size.saturating_add(64 << 10));
        }
        let topics = &mut self.topics;
        for (prefix, low, high, cap) in [
            ("", &mut limits.send_low, &mut limits.send_high, limits.send_cap),
            ("topics.", &mut topics.send_low, &mut topics.send_high, topics.send_cap),
        ] {
            if !given(&format!("{prefix}send_high")) {
                *high = (*high).min(cap);
            }
            if !given(&format!("{prefix}send_low")) {
                *low = (*low).min(*high);
            }
        }
    }
}

/// What a reload changed ([`ServerHandle::reload`](crate::ServerHandle::reload), SIGHUP in
/// `freeboard serve`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reload {
    /// Settings now in force: for connections accepted from now on (admission limits,
    /// timeouts of new requests and closes, send queues and policies), and for every request
    /// (the publish token).
    pub applied: Vec<SettingChange>,
    /// Settings that differ but need a restart (listeners, threads, memory, the protocol
    /// limits parked connections resume with, the topic routes); left as they were.
    pub needs_restart: Vec<SettingChange>,
}

/// One setting a reload found changed, by its TOML key, with its old and new values
/// (secrets redacted).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SettingChange {
    /// The setting's TOML key (`max_connections`, `topics.publish_token`).
    pub setting: &'static str,
    /// The value before.
    pub from: String,
    /// The value given.
    pub to: String,
}

impl SettingChange {
    /// A change of `setting` from `from` to `to`, as `Debug` shows them.
    pub fn new(
        setting: &'static str,
        from: &impl std::fmt::Debug,
        to: &impl std::fmt::Debug,
    ) -> Self {
        Self { setting, from: format!("{from:?}"), to: format!("{to:?}") }
    }

    /// Hides the values of a secret (a value that is not set stays `None`), so that a log of
    /// the change does not show them.
    pub fn redact(&mut self) {
        let redact = |v: &str| if v == "None" { v.to_owned() } else { "<redacted>".into() };
        (self.from, self.to) = (redact(&self.from), redact(&self.to));
    }
}

impl ServerConfig {
    /// Takes from `new` the settings a running server can change and lists what differed,
    /// applied or not. Both must have passed [`validate`](Self::validate). The one place
    /// that says what is reloadable: a TLS certificate reload can join here.
    pub fn reload_from(&mut self, new: &ServerConfig) -> Reload {
        let mut reload = Reload::default();
        macro_rules! settings {
            ($($reloadable:literal $name:literal $($field:ident).+;)*) => {$(
                if self.$($field).+ != new.$($field).+ {
                    let change = SettingChange::new($name, &self.$($field).+, &new.$($field).+);
                    if $reloadable {
                        self.$($field).+ = new.$($field).+.clone();
                        reload.applied.push(change);
                    } else {
                        reload.needs_restart.push(change);
                    }
                }
            )*};
        }
        settings! {
            true "max_connections" max_connections;
            true "max_connections_per_ip" max_connections_per_ip;
            true "accept_rate" accept_rate;
            true "accept_rate_per_ip" accept_rate_per_ip;
            true "retry_after" retry_after;
            true "handshake_timeout" limits.handshake_timeout;
            true "close_timeout" limits.close_timeout;
            true "drain_timeout" drain_timeout;
            true "send_low" limits.send_low;
            true "send_high" limits.send_high;
            true "send_cap" limits.send_cap;
            true "slow_consumer" limits.slow_consumer;
            true "connection_reserve" connection_reserve;
            true "kernel_send_queue" kernel_send_queue;
            true "topics.publish_token" topics.publish_token;
            true "admin.token" admin.token;
            false "admin.listen" admin.listen;
            true "admin.rate_per_ip" admin.rate_per_ip;
            false "listen" listen;
            false "share_port" share_port;
            false "threads" threads;
            false "memory" memory;
            false "chunk_size" chunk_size;
            false "read_buffer" read_buffer;
            false "io" io;
            false "max_message_size" limits.max_message_size;
            false "idle_timeout" limits.idle_timeout;
            false "pong_timeout" limits.pong_timeout;
            false "topics.slow_consumer" topics.slow_consumer;
            false "topics.send_low" topics.send_low;
            false "topics.send_high" topics.send_high;
            false "topics.send_cap" topics.send_cap;
            false "topics.max_topics_per_connection" topics.max_topics_per_connection;
            false "topics.inbox" topics.inbox;
            false "allowed_origins" allowed_origins;
            false "trusted_proxies" trusted_proxies;
            false "proxy_protocol" proxy_protocol;
            false "http2" http2;
            false "max_pending_upgrades" max_pending_upgrades;
            false "compression" compression;
            false "compression_window" compression_window;
            false "compression_threshold" compression_threshold;
            false "topics.max_topics" topics.max_topics;
            false "topics.cors_origins" topics.cors_origins;
            false "topics.metrics_prefixes" topics.metrics_prefixes;
            false "topics.metrics_topics" topics.metrics_topics;
            false "tls" tls;
        }
        for change in reload.applied.iter_mut().chain(&mut reload.needs_restart) {
            if matches!(change.setting, "topics.publish_token" | "admin.token") {
                change.redact();
            }
        }
        reload
    }
}

/// Parses a slow-consumer policy by its name (`drop-oldest`, …).
pub fn parse_policy(name: &str) -> Result<SlowConsumerPolicy, ConfigError> {
    SlowConsumerPolicy::ALL
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| ConfigError::UnknownPolicy(name.to_owned()))
}

/// A configuration that cannot work, and which setting says so.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `threads` is 0.
    NoThreads,
    /// `{prefix}send_low <= {prefix}send_high <= {prefix}send_cap <= 4 GiB` does not hold (the prefix
    /// is `topics.` for the topic routes' queues).
    Watermarks {
        /// `""` or `"topics."`.
        prefix: &'static str,
    },
    /// An accept rate (or `admin.rate_per_ip`) is negative or not a number.
    AcceptRate,
    /// `read_buffer` cannot hold a request head twice over.
    ReadBuffer {
        /// The size given.
        given: usize,
        /// The smallest accepted.
        min: usize,
    },
    /// `chunk_size` is under [`MIN_CHUNK_SIZE`] or over the pool's maximum.
    ChunkSize {
        /// The size given.
        given: usize,
        /// The smallest accepted.
        min: usize,
        /// The largest accepted.
        max: usize,
    },
    /// `topics.inbox` or `topics.max_topics_per_connection` is 0.
    TopicLimits,
    /// `topics.conflate_key` is not an ASCII character.
    ConflateKey,
    /// `memory` does not give each loop its read buffer and 16 chunks.
    Memory {
        /// The budget given.
        memory: usize,
        /// The loops it is split between.
        threads: usize,
        /// Bytes each loop needs at least.
        needed: usize,
    },
    /// No slow-consumer policy has this name.
    UnknownPolicy(String),
    /// An `allowed_origins` entry is not `scheme://host[:port]`, `scheme://*.domain` or `*`.
    Origin(String),
    /// A `trusted_proxies` entry is not an address or a CIDR block.
    TrustedProxy(String),
    /// `max_pending_upgrades` is 0.
    PendingUpgrades,
    /// A setting that must be more than 0 is 0 (its name).
    Zero(&'static str),
    /// `memory` is more than the machine (or the process's cgroup) has: the budget could not
    /// be kept.
    MemoryExceedsMachine {
        /// The budget given.
        memory: usize,
        /// The machine's or the cgroup's memory.
        machine: usize,
    },
    /// `tls.state_share` is below 2 (TLS state would take at least half of the budget).
    TlsStateShare(usize),
    /// `compression_window` is not 9–15 bits (zlib cannot compress raw deflate with 8).
    CompressionWindow(u8),
    /// A setting needs an optional part of freeboard this build leaves out.
    MissingFeature(crate::MissingFeature),
    /// A connection limit cannot work ([`ServerConfig::limits`]).
    Limits(LimitsError),
}

impl From<LimitsError> for ConfigError {
    fn from(e: LimitsError) -> Self {
        Self::Limits(e)
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoThreads => f.write_str("threads must be at least 1"),
            Self::Watermarks { prefix } => write!(
                f,
                "send watermarks must satisfy {prefix}send_low <= {prefix}send_high <= {prefix}send_cap <= 4 GiB"
            ),
            Self::AcceptRate => f.write_str(
                "accept_rate, accept_rate_per_ip and admin.rate_per_ip must be 0 (off) or positive",
            ),
            Self::ReadBuffer { given, min } => {
                write!(
                    f,
                    "read_buffer must be at least {min} bytes (a request head twice), not {given}"
                )
            }
            Self::ChunkSize { given, min, max } => {
                write!(f, "chunk_size must be {min} to {max} bytes, not {given}")
            }
            Self::Zero(setting) => write!(f, "{setting} must be more than 0"),
            Self::ConflateKey => f.write_str("topics.conflate_key must be one ASCII character"),
            Self::TopicLimits => {
                f.write_str(
                    "topics.inbox, topics.max_topics_per_connection and topics.max_topics must be at least 1",
                )
            }
            Self::Memory { memory, threads, needed } => write!(
                f,
                "memory {memory} is too small for {threads} loops: each needs {needed} bytes (its read buffer and 16 chunks)"
            ),
            Self::MemoryExceedsMachine { memory, machine } => write!(
                f,
                "memory {memory} is more than this machine can give ({machine} bytes): lower it"
            ),
            Self::Origin(entry) => write!(
                f,
                "allowed_origins entry {entry:?} must be scheme://host[:port], scheme://*.domain or *"
            ),
            Self::TrustedProxy(entry) => {
                write!(f, "trusted_proxies entry {entry:?} is not an address or CIDR block")
            }
            Self::PendingUpgrades => f.write_str("max_pending_upgrades must be at least 1"),
            Self::UnknownPolicy(name) => write!(
                f,
                "unknown slow-consumer policy {name:?} (one of: block, drop-newest, drop-oldest, conflate, close)"
            ),
            Self::TlsStateShare(share) => {
                write!(f, "tls.state_share is {share}; it must be at least 2")
            }
            Self::CompressionWindow(bits) => {
                write!(f, "compression_window is {bits}; it must be 9 to 15 bits")
            }
            Self::MissingFeature(missing) => missing.fmt(f),
            Self::Limits(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Parses a size: a number of bytes, or a number (fractions allowed) with a suffix `K`,
/// `M`, `G`, `T` (or `KiB`, `KB`, …: always powers of 1024, as the flags have always meant).
/// The one parser behind the flags and the TOML file.
///
/// ```
/// use freeboard::config::parse_size;
/// assert_eq!(parse_size("256M"), Ok(256 << 20));
/// assert_eq!(parse_size("64k"), Ok(64 << 10));
/// assert_eq!(parse_size("1.5K"), Ok(1536));
/// assert!(parse_size("lots").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(text.trim())
        .map_err(|e| format!("{text:?} is not a size ({e}); e.g. 4096, 64K, 256M, 1G"))
}

/// Parses a duration: a number of seconds (`30`, `0.5`), or a number with units (`30s`,
/// `500ms`, `2m`, `1h 30m`). The one parser behind the flags and the TOML file.
///
/// ```
/// use std::time::Duration;
/// use freeboard::config::parse_duration;
/// assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
/// assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|e| format!("{text:?}: {e}"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); e.g. 30s, 500ms, 2m, or seconds"))
}

/// Parses a listen address: `HOST:PORT` with an IP address (`0.0.0.0:9001`, `[::]:9001`) or a
/// name that resolves (`localhost:9001`: its first IPv4 address, else its first address), or
/// a bare port (`9001`), which listens on loopback (`127.0.0.1`), as the default does. The one
/// parser behind `--listen`, `--listen-tls`, `--admin-listen` and their TOML keys.
///
/// ```
/// use freeboard::config::parse_listen;
/// assert_eq!(parse_listen("9301").unwrap().to_string(), "127.0.0.1:9301");
/// assert_eq!(parse_listen("0.0.0.0:9301").unwrap().to_string(), "0.0.0.0:9301");
/// assert_eq!(parse_listen("[::1]:9301").unwrap().to_string(), "[::1]:9301");
/// assert!(parse_listen("localhost:9301").unwrap().ip().is_loopback());
/// assert!(parse_listen(":9301").unwrap_err().contains("0.0.0.0:9301"));
/// ```
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let text = text.trim();
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let example = "e.g. 127.0.0.1:9001, 0.0.0.0:9001 (every interface), [::]:9001, localhost:9001, \
                   or a port alone (9001, on loopback)";
    let port = text.rsplit_once(':').map(|(_, port)| port);
    match text.rsplit_once(':') {
        Some(("", port)) if port.parse::<u16>().is_ok() => {
            return Err(format!(
                "{text:?} names no host: give 0.0.0.0:{port} to listen on every interface, or \
                 {port} for loopback"
            ));
        }
        Some((host, _)) if !host.is_empty() && port.is_some_and(|p| p.parse::<u16>().is_ok()) => {}
        _ => return Err(format!("{text:?} is not HOST:PORT or a port; {example}")),
    }
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("{text:?}: the host name does not resolve ({e}); {example}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{text:?}: the host name resolves to no address"))
}

/// Reads a size or a duration given as a TOML integer, float or string.
#[derive(Debug)]
enum Scalar {
    Int(u64),
    Float(f64),
    Text(String),
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number or a string with a unit")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Scalar, E> {
                u64::try_from(v).map(Scalar::Int).map_err(|_| E::custom("must not be negative"))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.to_owned()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// How a key of [`ServerConfig`] is read: by its type's own `Deserialize`, as a size, as a
/// duration (`Option<Duration>`: 0 is `None`) or as a slow-consumer policy's name.
struct Plain<T>(T);
struct Size<T>(T);
struct Time<T>(T);
struct Policy<T>(T);
struct Listen<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Plain<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Plain)
    }
}

impl<'de, T: TryFrom<u64>> Deserialize<'de> for Size<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        size::deserialize(d).map(Size)
    }
}

impl<'de> Deserialize<'de> for Time<Duration> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        duration::deserialize(d).map(Time)
    }
}

impl<'de> Deserialize<'de> for Time<Option<Duration>> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        opt_duration::deserialize(d).map(Time)
    }
}

impl<'de> Deserialize<'de> for Listen<SocketAddr> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        listen::deserialize(d).map(Listen)
    }
}

impl<'de> Deserialize<'de> for Policy<SlowConsumerPolicy> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        policy::deserialize(d).map(Policy)
    }
}

/// A size in a TOML file or a flag, for `#[serde(with = "freeboard::config::size")]`: bytes,
/// or a string with a unit (`"256M"`, [`parse_size()`]).
pub mod size {
    use super::Scalar;
    use serde::{Deserialize, Deserializer, de::Error};

    /// Deserializes a size.
    pub fn deserialize<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
        let bytes = match Scalar::deserialize(d)? {
            Scalar::Int(n) => n,
            Scalar::Float(f) if f >= 0.0 && f.fract() == 0.0 => f as u64,
            Scalar::Float(f) => {
                return Err(D::Error::custom(format!("{f} is not a whole number of bytes")));
            }
            Scalar::Text(text) => super::parse_size(&text).map_err(D::Error::custom)?,
        };
        T::try_from(bytes).map_err(|_| D::Error::custom(format!("{bytes} bytes is too large")))
    }
}

/// A duration in a TOML file or a flag, for `#[serde(with = "freeboard::config::duration")]`:
/// seconds, or a string with units (`"1m 30s"`, [`parse_duration`]).
pub mod duration {
    use super::Scalar;
    use serde::{Deserialize, Deserializer, de::Error};
    use std::time::Duration;

    /// Deserializes a duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match Scalar::deserialize(d)? {
            Scalar::Int(secs) => Ok(Duration::from_secs(secs)),
            Scalar::Float(secs) => Duration::try_from_secs_f64(secs).map_err(D::Error::custom),
            Scalar::Text(text) => super::parse_duration(&text).map_err(D::Error::custom),
        }
    }
}

mod opt_duration {
    use serde::Deserializer;
    use std::time::Duration;

    /// `0` (or `"0s"`) turns the timer off.
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let duration = super::duration::deserialize(d)?;
        Ok((!duration.is_zero()).then_some(duration))
    }
}

/// A listen address in TOML: a string [`parse_listen`] reads, or a port number.
mod listen {
    use serde::{Deserialize, Deserializer, de::Error};
    use std::net::SocketAddr;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Port(u16),
        Text(String),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        match Given::deserialize(d)? {
            Given::Port(port) => Ok(SocketAddr::from(([127, 0, 0, 1], port))),
            Given::Text(text) => super::parse_listen(&text).map_err(D::Error::custom),
        }
    }
}

/// An optional listen address in TOML (`[tls] listen`, `[admin] listen`).
mod opt_listen {
    use serde::Deserializer;
    use std::net::SocketAddr;

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SocketAddr>, D::Error> {
        super::listen::deserialize(d).map(Some)
    }
}

mod policy {
    use freeboard_buf::SlowConsumerPolicy;
    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<SlowConsumerPolicy, D::Error> {
        let name = String::deserialize(d)?;
        super::parse_policy(&name).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_keys_are_read_at_the_top_level_in_the_language_of_the_flags() {
        let file = serde_json::json!({
            "threads": 2,
            "max_message_size": "1M",
            "send_low": "8K",
            "send_high": 16384,
            "send_cap": "2M",
            "slow_consumer": "drop-oldest",
            "handshake_timeout": "500ms",
            "idle_timeout": 0,
            "pong_timeout": 2.5,
            "close_timeout": "1s",
            "topics": { "send_cap": "64K" },
        });
        let config = ServerConfig::deserialize(file).unwrap();
        let limits = Limits::DEFAULT
            .max_message_size(1 << 20)
            .send_low(8 << 10)
            .send_high(16 << 10)
            .send_cap(2 << 20)
            .slow_consumer(SlowConsumerPolicy::DropOldest)
            .handshake_timeout(Duration::from_millis(500))
            .idle_timeout(None)
            .pong_timeout(Duration::from_millis(2500))
            .close_timeout(Duration::from_secs(1));
        assert_eq!(config.limits, limits);
        assert_eq!((config.threads, config.topics.send_cap), (2, 64 << 10));
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn an_unknown_key_is_refused_with_every_key_there_is() {
        let error = ServerConfig::deserialize(serde_json::json!({ "send_capp": 1 })).unwrap_err();
        let error = error.to_string();
        assert!(error.starts_with("unknown field `send_capp`, expected one of"), "{error}");
        for key in ["listen", "send_cap", "slow_consumer", "idle_timeout", "topics", "admin"] {
            assert!(error.contains(&format!("`{key}`")), "{key} missing from: {error}");
        }
    }

    #[test]
    fn a_limit_that_cannot_work_fails_the_configuration_by_its_name() {
        let mut config = ServerConfig::default();
        config.limits.send_low = config.limits.send_cap + 1;
        let error = config.validate().unwrap_err();
        assert!(matches!(error, ConfigError::Limits(LimitsError::Watermarks { .. })));
        assert!(error.to_string().contains("send_low <= send_high <= send_cap"), "{error}");
        config.limits = Limits::DEFAULT.close_timeout(Duration::ZERO);
        assert_eq!(config.validate().unwrap_err().to_string(), "close_timeout must be more than 0");
    }
}
