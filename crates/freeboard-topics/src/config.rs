//! The service's settings: the `[topics]` table of `freeboard serve`, one flat table whose keys
//! fall into sections (the route, tokens, the connect webhook, Redis) beside the topic hub's
//! own settings ([`freeboard::config::TopicsConfig`]: limits, send queues, history, `POST`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use freeboard::config::{SettingChange, TopicsConfig};
use serde::Deserialize;
use serde::de::{Deserializer, Error as _, IgnoredAny};

/// The `/topic/` service's settings and the topic hub's, as one `[topics]` table.
///
/// ```
/// use freeboard_topics::Config;
///
/// let config = Config::default();
/// assert_eq!(config.route.path, "/topic/");
/// config.validate()?;
/// # Ok::<(), freeboard_topics::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Config {
    /// The topic hub's settings; the server gets them as
    /// [`ServerConfig::topics`](freeboard::ServerConfig::topics).
    pub hub: TopicsConfig,
    /// Where the topics are served and what clients may do there.
    pub route: RouteConfig,
    /// The JWTs a subscriber must carry.
    pub tokens: TokenConfig,
    /// The connect webhook that decides every topic upgrade.
    pub webhook: WebhookConfig,
    /// The Redis backplane.
    pub redis: RedisConfig,
}

/// The topic route.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct RouteConfig {
    /// Path prefix of the topic endpoints: a WebSocket upgrade at `{path}{name}` subscribes to
    /// `name`, a `POST {path}{name}` publishes its body. Must start and end with `/`; empty
    /// serves no topic endpoint. Default `/topic/`.
    pub path: String,
    /// Whether messages clients send on a topic connection are published to its topic (else
    /// they are answered with close 1008). Default `false`.
    pub client_publish: bool,
    /// Whether `POST {path}{name}` publishes its body (text if it is UTF-8 and the
    /// `Content-Type` is `text/*`, `application/json` or `application/*+json`, else binary).
    /// Default `true`.
    pub http_publish: bool,
    /// Whether `POST` needs no credential when neither a publish token, JWT keys nor a
    /// connect webhook is set. Default `true` for a library; `freeboard serve` turns it off
    /// in production (with `--config`, or listening beyond loopback) unless the file sets it.
    /// With any of those set, a `POST` always needs the publish token or a JWT whose
    /// `publish` claim grants the topic.
    pub anonymous_publish: bool,
}

impl Default for RouteConfig {
    fn default() -> Self {
        Self {
            path: "/topic/".into(),
            client_publish: false,
            http_publish: true,
            anonymous_publish: true,
        }
    }
}

/// The tokens a topic upgrade must carry: with a secret or a key set, every upgrade needs a
/// JWT whose claims grant its topics ([`TokenVerifier`](crate::TokenVerifier)).
#[derive(Clone, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct TokenConfig {
    /// HS256 secret (at least 32 bytes) of the JWTs a topic upgrade must carry
    /// (`Authorization: Bearer`, or `?access_token=` for browsers). Default: none.
    pub jwt_secret: Option<String>,
    /// A JWKS file (RFC 7517) of RSA and P-256 keys for RS256 / ES256 tokens. Default: none.
    /// With neither a secret nor a key set, topics need no token.
    pub jwks_file: Option<PathBuf>,
    /// The `iss` tokens must carry. Default: not checked.
    pub jwt_issuer: Option<String>,
    /// The `aud` tokens must carry. Default: not checked.
    pub jwt_audience: Option<String>,
    /// Clock skew allowed with the tokens' issuer: a token is accepted up to this long past
    /// its `exp` (its connection is then closed with 4001 that much later), and up to this
    /// long before its `nbf` or `iat`; beyond, 401 (`token_expired`, `token_not_yet_valid`,
    /// `token_issued_in_future`). Default 30 s: more than NTP-synchronised clocks drift
    /// apart, little next to a token's lifetime.
    #[serde(with = "freeboard::config::duration")]
    pub jwt_leeway: Duration,
}

impl Default for TokenConfig {
    fn default() -> Self {
        Self {
            jwt_secret: None,
            jwks_file: None,
            jwt_issuer: None,
            jwt_audience: None,
            jwt_leeway: Duration::from_secs(30),
        }
    }
}

impl std::fmt::Debug for TokenConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConfig")
            .field("jwt_secret", &self.jwt_secret.as_ref().map(|_| "<redacted>"))
            .field("jwks_file", &self.jwks_file)
            .field("jwt_issuer", &self.jwt_issuer)
            .field("jwt_audience", &self.jwt_audience)
            .field("jwt_leeway", &self.jwt_leeway)
            .finish()
    }
}

/// The connect webhook ([`ConnectWebhook`](crate::ConnectWebhook)).
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct WebhookConfig {
    /// The connect webhook (`http://host[:port]/path`) that decides every topic upgrade.
    /// Default: none.
    pub connect_webhook: Option<String>,
    /// How long the webhook may take to answer (then 503). Default 2 s.
    #[serde(with = "freeboard::config::duration")]
    pub webhook_timeout: Duration,
    /// Requests to the webhook in flight at once (worker threads). Default 16.
    pub webhook_in_flight: usize,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            connect_webhook: None,
            webhook_timeout: Duration::from_secs(2),
            webhook_in_flight: 16,
        }
    }
}

/// The Redis backplane ([`RedisBackplane`](crate::RedisBackplane)).
#[derive(Clone, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct RedisConfig {
    /// A Redis backplane (`redis://HOST:PORT/`, optionally `redis://:PASSWORD@HOST:PORT/`):
    /// every publication of this node goes to every node on the same Redis, and this node
    /// subscribes in Redis to the topics it has local subscribers to. A Redis Cluster is
    /// found by itself and used with sharded pub/sub; several comma-separated URLs are seeds
    /// of one cluster. With `history`, the history is kept in Redis streams. Default: none,
    /// topics stay on this machine.
    pub redis: Option<String>,
    /// Bytes of publications the queue towards Redis holds (while Redis is slow or down)
    /// before further ones are counted lost
    /// (`freeboard_backplane_lost_total{reason="queue_full"}`). Default 16 MiB.
    #[serde(with = "freeboard::config::size")]
    pub redis_queue: usize,
    /// Refuse to start when Redis cannot be reached at start (fail fast, for a deployment
    /// that would rather restart than serve one node's topics alone). Default `false`: the
    /// server starts, serves its own subscribers, and reconnects until Redis answers.
    pub redis_required: bool,
    /// When a publish answer (`POST`) on a history topic kept in Redis says it was accepted.
    /// Default [`Durability::Redis`].
    pub redis_durability: Durability,
}

/// When a publication to a history topic kept in Redis counts as accepted: what a `POST`
/// answer waits for before it says 200 (it says 503 if that did not happen, 202 if the
/// request timed out first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Durability {
    /// Once queued towards Redis (the answer does not wait; a publication lost on its way is
    /// counted, not answered).
    None,
    /// Once Redis has kept it in the topic's stream (and published it): one round trip to
    /// Redis. Lost with Redis' memory if Redis is lost before it persists or replicates it.
    #[default]
    Redis,
    /// Once a replica has it too (`WAIT 1`): it survives the loss of any one machine, the
    /// master included (a replica promoted in its place has it). Needs replicas.
    Replica,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            redis: None,
            redis_queue: 16 << 20,
            redis_required: false,
            redis_durability: Durability::default(),
        }
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redis = self.redis.as_deref().map(|u| if u.contains('@') { "<redacted>" } else { u });
        f.debug_struct("RedisConfig")
            .field("redis", &redis)
            .field("redis_queue", &self.redis_queue)
            .field("redis_required", &self.redis_required)
            .field("redis_durability", &self.redis_durability)
            .finish()
    }
}

impl<'de> Deserialize<'de> for Config {
    /// One flat table: each section takes its keys, and a key no section knows is refused
    /// with the list of every key of the table.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Table {
            #[serde(flatten)]
            hub: TopicsConfig,
            #[serde(flatten)]
            route: RouteConfig,
            #[serde(flatten)]
            tokens: TokenConfig,
            #[serde(flatten)]
            webhook: WebhookConfig,
            #[serde(flatten)]
            redis: RedisConfig,
            /// What no section took.
            #[serde(flatten)]
            rest: BTreeMap<String, IgnoredAny>,
        }
        let Table { hub, route, tokens, webhook, redis, rest } = Table::deserialize(d)?;
        if let Some(key) = rest.keys().next() {
            return Err(D::Error::unknown_field(key, keys()));
        }
        Ok(Self { hub, route, tokens, webhook, redis })
    }
}

/// Every key of the table, in the sections' order.
fn keys() -> &'static [&'static str] {
    static KEYS: OnceLock<Vec<&'static str>> = OnceLock::new();
    KEYS.get_or_init(|| {
        [
            fields::<TopicsConfig>(),
            fields::<RouteConfig>(),
            fields::<TokenConfig>(),
            fields::<WebhookConfig>(),
            fields::<RedisConfig>(),
        ]
        .concat()
    })
}

/// The field names a derived `Deserialize` struct asks for (serde passes them to
/// `deserialize_struct`; a deserializer that only listens hears them).
fn fields<T: Deserialize<'static>>() -> &'static [&'static str] {
    struct Listen(Option<&'static [&'static str]>);
    #[derive(Debug)]
    struct Heard;
    impl std::fmt::Display for Heard {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("fields heard")
        }
    }
    impl std::error::Error for Heard {}
    impl serde::de::Error for Heard {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Heard
        }
    }
    impl<'de> Deserializer<'de> for &mut Listen {
        type Error = Heard;
        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Heard> {
            Err(Heard)
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Heard> {
            self.0 = Some(fields);
            Err(Heard)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut listen = Listen(None);
    let _ = T::deserialize(&mut listen);
    listen.0.unwrap_or_default()
}

impl Config {
    /// The service's settings that differ in `new`, for a reload: none of them can change
    /// while the server runs (secrets, and a Redis URL with a password, redacted).
    pub fn changes(&self, new: &Config) -> Vec<SettingChange> {
        let mut changes = Vec::new();
        macro_rules! settings {
            ($($name:literal $($field:ident).+;)*) => {$(
                if self.$($field).+ != new.$($field).+ {
                    changes.push(SettingChange::new($name, &self.$($field).+, &new.$($field).+));
                }
            )*};
        }
        settings! {
            "topics.path" route.path;
            "topics.client_publish" route.client_publish;
            "topics.http_publish" route.http_publish;
            "topics.anonymous_publish" route.anonymous_publish;
            "topics.jwt_secret" tokens.jwt_secret;
            "topics.jwks_file" tokens.jwks_file;
            "topics.jwt_issuer" tokens.jwt_issuer;
            "topics.jwt_audience" tokens.jwt_audience;
            "topics.jwt_leeway" tokens.jwt_leeway;
            "topics.connect_webhook" webhook.connect_webhook;
            "topics.webhook_timeout" webhook.webhook_timeout;
            "topics.webhook_in_flight" webhook.webhook_in_flight;
            "topics.redis" redis.redis;
            "topics.redis_queue" redis.redis_queue;
            "topics.redis_required" redis.redis_required;
            "topics.redis_durability" redis.redis_durability;
        }
        for change in &mut changes {
            let secret = match change.setting {
                "topics.jwt_secret" => true,
                "topics.redis" => change.from.contains('@') || change.to.contains('@'),
                _ => false,
            };
            if secret {
                change.redact();
            }
        }
        changes
    }
}
