//! Server configuration: one `#[non_exhaustive]` struct with explicit limits.

use std::net::SocketAddr;
use std::time::Duration;

use freeboard_buf::{SlowConsumerPolicy, Watermarks};
use serde::Deserialize;

/// Everything `freeboard serve` can be told, with the defaults documented on each field.
///
/// Deserializes from TOML (durations in seconds as floats, sizes in bytes); missing fields
/// keep their defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Address to listen on. Default `127.0.0.1:9001`.
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
    /// Per-loop shared read buffer in bytes, at least 16 KiB. Default 64 KiB.
    pub read_buffer: usize,
    /// Largest message accepted (all its frames together); beyond it the connection is closed
    /// with 1009. Default 16 MiB.
    pub max_message_size: u64,
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
    #[serde(with = "secs")]
    pub retry_after: Duration,
    /// Time from accept to a complete upgrade request; slower clients are dropped
    /// (slowloris). Default 10 s.
    #[serde(with = "secs")]
    pub handshake_timeout: Duration,
    /// Send a ping after this long without input; `None` disables automatic pings.
    /// Default 30 s.
    #[serde(with = "opt_secs")]
    pub idle_timeout: Option<Duration>,
    /// How long a ping may stay unanswered before the connection is dropped. Default 10 s.
    #[serde(with = "secs")]
    pub pong_timeout: Duration,
    /// How long to wait for the peer's close frame after ours. Default 5 s.
    #[serde(with = "secs")]
    pub close_timeout: Duration,
    /// On shutdown, how long to wait for close handshakes before exiting. Default 5 s.
    #[serde(with = "secs")]
    pub drain_timeout: Duration,
    /// Send queue low watermark (writable again at or below). Default 32 KiB.
    pub send_low: usize,
    /// Send queue high watermark (not writable above). Default 64 KiB.
    pub send_high: usize,
    /// Send queue hard cap; at it the slow-consumer policy decides. Default: 16 MiB + 64 KiB,
    /// enough to echo one message of the default maximum size.
    pub send_cap: usize,
    /// What happens to a message that would pass the cap: `block`, `drop-newest`,
    /// `drop-oldest`, `conflate` or `close` (1008). Default `close`.
    #[serde(with = "policy")]
    pub slow_consumer: SlowConsumerPolicy,
    /// Pool bytes that must be free for an upgrade to be accepted (else 503). Messages that
    /// arrive in pieces may not take the pool below half of it (else close 1013), so the open
    /// connections keep room to send. Default 64 KiB.
    pub connection_reserve: usize,
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
}

/// Pub/sub settings: the `/topic/{name}` endpoints of `freeboard serve`, `POST /topic/{name}`,
/// and the limits of every topic route.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct TopicsConfig {
    /// Path prefix of the topic endpoints: a WebSocket upgrade at `{path}{name}` subscribes to
    /// `name`, a `POST {path}{name}` publishes its body. Must start and end with `/`.
    /// Default `/topic/`.
    pub path: String,
    /// Whether messages clients send on a topic connection are published to its topic (else
    /// they are answered with close 1008). Default `false`.
    pub client_publish: bool,
    /// Whether `POST {path}{name}` publishes its body (text if it is UTF-8 and the
    /// `Content-Type` is `text/*`, else binary). Default `true`.
    pub http_publish: bool,
    /// Bearer token `POST` must carry (`Authorization: Bearer <token>`; 401 without, 403 if
    /// wrong). Default: none, anyone may publish.
    pub publish_token: Option<String>,
    /// The topic routes' slow-consumer policy. Default `conflate`: a subscriber that falls
    /// behind gets the newest message, not a backlog.
    #[serde(with = "policy")]
    pub slow_consumer: SlowConsumerPolicy,
    /// A subscriber's send queue low watermark. Default 32 KiB.
    pub send_low: usize,
    /// A subscriber's send queue high watermark. Default 64 KiB.
    pub send_high: usize,
    /// A subscriber's send queue hard cap; a published message larger than it is dropped for
    /// that subscriber (counted). Default 1 MiB.
    pub send_cap: usize,
    /// Topics one connection may subscribe to. Default 64.
    pub max_topics_per_connection: usize,
    /// Publications from other threads a loop's inbox holds before further ones are dropped
    /// (counted in `topic_drops{reason="inbox_full"}`). Default 4096.
    pub inbox: usize,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        Self {
            path: "/topic/".into(),
            client_publish: false,
            http_publish: true,
            publish_token: None,
            slow_consumer: SlowConsumerPolicy::Conflate,
            send_low: 32 << 10,
            send_high: 64 << 10,
            send_cap: 1 << 20,
            max_topics_per_connection: 64,
            inbox: 4096,
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
            .field("path", &self.path)
            .field("client_publish", &self.client_publish)
            .field("http_publish", &self.http_publish)
            .field("publish_token", &self.publish_token.as_ref().map(|_| "<redacted>"))
            .field("slow_consumer", &self.slow_consumer)
            .field("send_low", &self.send_low)
            .field("send_high", &self.send_high)
            .field("send_cap", &self.send_cap)
            .field("max_topics_per_connection", &self.max_topics_per_connection)
            .field("inbox", &self.inbox)
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
            read_buffer: 64 << 10,
            max_message_size: 16 << 20,
            max_connections: 100_000,
            max_connections_per_ip: 1_000,
            accept_rate: 0.0,
            accept_rate_per_ip: 0.0,
            retry_after: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(30)),
            pong_timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(5),
            send_low: 32 << 10,
            send_high: 64 << 10,
            send_cap: (16 << 20) + (64 << 10),
            slow_consumer: SlowConsumerPolicy::Close,
            connection_reserve: 64 << 10,
            compression: crate::Compression::Off,
            compression_window: 15,
            compression_threshold: 64,
            topics: TopicsConfig::default(),
        }
    }
}

impl ServerConfig {
    /// The default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks that the limits fit together; the error says which does not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.threads == 0 {
            return Err(ConfigError::NoThreads);
        }
        if !(self.send_low <= self.send_high && self.send_high <= self.send_cap) {
            return Err(ConfigError::Watermarks { prefix: "" });
        }
        if !(self.accept_rate >= 0.0 && self.accept_rate_per_ip >= 0.0) {
            return Err(ConfigError::AcceptRate);
        }
        // A request head (up to 8 KiB) must fit in one read buffer.
        let min = 2 * freeboard_proto::handshake::DEFAULT_MAX_HEAD_LEN;
        if self.read_buffer < min {
            return Err(ConfigError::ReadBuffer { given: self.read_buffer, min });
        }
        if self.chunk_size == 0 || self.chunk_size > freeboard_buf::MAX_CHUNK_SIZE {
            let max = freeboard_buf::MAX_CHUNK_SIZE;
            return Err(ConfigError::ChunkSize { given: self.chunk_size, max });
        }
        let topics = &self.topics;
        topics.watermarks()?;
        let path = &topics.path;
        if !(path.is_empty() || path.starts_with('/') && path.ends_with('/')) {
            return Err(ConfigError::TopicsPath(path.clone()));
        }
        if topics.inbox == 0 || topics.max_topics_per_connection == 0 {
            return Err(ConfigError::TopicLimits);
        }
        let per_loop = self.memory / self.threads;
        let needed = self.read_buffer + 16 * self.chunk_size;
        if per_loop < needed {
            return Err(ConfigError::Memory { memory: self.memory, threads: self.threads, needed });
        }
        Ok(())
    }

    /// The protocol core's per-connection configuration derived from this one.
    pub fn protocol(&self) -> freeboard_proto::Config {
        freeboard_proto::Config::builder()
            .max_message_size(self.max_message_size)
            .max_frame_size(self.max_message_size)
            .ping_interval(self.idle_timeout)
            .pong_timeout(self.pong_timeout)
            .close_timeout(self.close_timeout)
            .build()
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
    /// `{prefix}send_low <= {prefix}send_high <= {prefix}send_cap` does not hold (the prefix
    /// is `topics.` for the topic routes' queues).
    Watermarks {
        /// `""` or `"topics."`.
        prefix: &'static str,
    },
    /// An accept rate is negative or not a number.
    AcceptRate,
    /// `read_buffer` cannot hold a request head twice over.
    ReadBuffer {
        /// The size given.
        given: usize,
        /// The smallest accepted.
        min: usize,
    },
    /// `chunk_size` is 0 or over the pool's maximum.
    ChunkSize {
        /// The size given.
        given: usize,
        /// The largest accepted.
        max: usize,
    },
    /// `topics.path` does not start and end with `/`.
    TopicsPath(String),
    /// `topics.inbox` or `topics.max_topics_per_connection` is 0.
    TopicLimits,
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
    /// `memory` is more than the machine (or the process's cgroup) has: the budget could not
    /// be kept.
    MemoryExceedsMachine {
        /// The budget given.
        memory: usize,
        /// The machine's or the cgroup's memory.
        machine: usize,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoThreads => f.write_str("threads must be at least 1"),
            Self::Watermarks { prefix } => write!(
                f,
                "send watermarks must satisfy {prefix}send_low <= {prefix}send_high <= {prefix}send_cap"
            ),
            Self::AcceptRate => f.write_str("accept rates must be 0 (off) or positive"),
            Self::ReadBuffer { given, min } => {
                write!(
                    f,
                    "read_buffer must be at least {min} bytes (a request head twice), not {given}"
                )
            }
            Self::ChunkSize { given, max } => {
                write!(f, "chunk_size must be 1 to {max} bytes, not {given}")
            }
            Self::TopicsPath(path) => {
                write!(f, "topics.path must start and end with '/', not {path:?}")
            }
            Self::TopicLimits => {
                f.write_str("topics.inbox and topics.max_topics_per_connection must be at least 1")
            }
            Self::Memory { memory, threads, needed } => write!(
                f,
                "memory {memory} is too small for {threads} loops: each needs {needed} bytes (its read buffer and 16 chunks)"
            ),
            Self::MemoryExceedsMachine { memory, machine } => write!(
                f,
                "memory {memory} is more than this machine can give ({machine} bytes): lower it"
            ),
            Self::UnknownPolicy(name) => write!(
                f,
                "unknown slow-consumer policy {name:?} (one of: block, drop-newest, drop-oldest, conflate, close)"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

mod secs {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}

mod opt_secs {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    /// `0` turns the timer off.
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let secs = f64::deserialize(d)?;
        if secs == 0.0 {
            return Ok(None);
        }
        Duration::try_from_secs_f64(secs).map(Some).map_err(serde::de::Error::custom)
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
