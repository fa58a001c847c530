//! freeboard's `/topic/` service, built on the runtime's topic hub: the route that subscribes
//! an upgrade to the topics its path names (and lists who did: presence), JWT and
//! connect-webhook access control, and the Redis / Redis Cluster backplane that carries topics
//! and their presence across machines and keeps their history in Redis streams.
//!
//! `freeboard serve` is this crate and the runtime composed; a library user does the same:
//!
//! ```no_run
//! use freeboard::{Echo, Router, ServerConfig};
//! use freeboard_topics::{Config, Service};
//!
//! let mut topics = Config::default();
//! topics.tokens.jwt_secret = Some("a secret of at least thirty-two bytes".into());
//! let mut config = ServerConfig::default();
//! config.topics = topics.hub.clone();
//! // Checks every setting, reads the key files and starts the webhook's workers, once.
//! let service = Service::new(&topics)?;
//! let server = service.bind(config, |service| service.mount(Router::new().route("/", Echo)))?;
//! server.run()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_debug_implementations)]

/// The README's example, compiled with the doctests so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The book's page on writing a server (it mounts this service), compiled with the doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library/server.md")]
struct ServerGuideDoctests;

mod config;
mod publish_access;
mod redis;
mod route;
mod token;
mod webhook;

use std::sync::Arc;

pub use config::{Config, Durability, RedisConfig, RouteConfig, TokenConfig, WebhookConfig};
pub use publish_access::PublishGate;
pub use redis::RedisBackplane;
pub use route::TopicRoute;
use route::topic_route_options;
pub use token::{Grant, TokenError, TokenVerifier, bearer_token};
pub use webhook::ConnectWebhook;

use freeboard::{HttpRoute, Router, Server, ServerConfig};

/// A setting of the service that cannot work, or a part of it that could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// `topics.path` does not start and end with `/`.
    Path(String),
    /// The JWKS file cannot be read or holds no usable key.
    Jwks(String),
    /// `topics.jwt_secret` is shorter than 32 bytes (RFC 7518 §3.2: an HS256 key must be at
    /// least as long as the hash).
    JwtSecret,
    /// The connect webhook's URL or limits cannot work, or its workers cannot start.
    Webhook(String),
    /// A `topics.redis` URL cannot be used.
    Redis(String),
    /// A setting of the topic hub (the runtime's `[topics]` keys) cannot work.
    Hub(freeboard::config::ConfigError),
    /// The server (and its backplane) could not be bound.
    Bind(std::io::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Path(path) => write!(f, "topics.path must start and end with '/', not {path:?}"),
            Self::Jwks(why) => write!(f, "topics.jwks_file: {why}"),
            Self::JwtSecret => f.write_str("topics.jwt_secret must be at least 32 bytes"),
            Self::Webhook(why) => write!(f, "topics.connect_webhook: {why}"),
            Self::Redis(why) => write!(f, "topics.redis: {why}"),
            Self::Hub(e) => e.fmt(f),
            Self::Bind(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Bind(e) => Some(e),
            _ => None,
        }
    }
}

/// The service, built once from its [`Config`]: the token verifier (the JWKS file read here),
/// the connect webhook's workers, and the Redis backplane's address. Every loop's router gets
/// the route from it ([`mount`](Self::mount)), sharing these.
#[derive(Debug)]
pub struct Service {
    config: Config,
    verifier: Option<Arc<TokenVerifier>>,
    webhook: Option<Arc<ConnectWebhook>>,
}

impl Service {
    /// Checks `config` (the error names the setting), reads the key files and starts the
    /// connect webhook's workers.
    pub fn new(config: &Config) -> Result<Self, Error> {
        config.validate()?;
        let verifier = TokenVerifier::from_config(&config.tokens)?
            .map(|v| Arc::new(v.presence_claims(&config.hub.presence_claims)));
        let webhook = ConnectWebhook::from_config(&config.webhook)?.map(Arc::new);
        Ok(Self { config: config.clone(), verifier, webhook })
    }

    /// The service's settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// `router` with the topic route at `topics.path` (a prefix route with the topic hub's
    /// send-queue settings and the configured tokens and webhook) and, with `http_publish`,
    /// `POST {path}{topic}` ([`HttpRoute::Publish`]). An empty path mounts neither.
    pub fn mount(&self, router: Router) -> Router {
        let config = &self.config.route;
        if config.path.is_empty() {
            return router;
        }
        let hub = &self.config.hub;
        let mut route = TopicRoute::new(&config.path, config.client_publish)
            .max_topics(hub.max_topics_per_connection)
            .history((hub.history > 0).then_some(hub.history_prefix.as_str()))
            .presence(hub.presence_prefix.as_deref())
            .deltas(hub.delta_prefix.as_deref());
        if let Some(verifier) = &self.verifier {
            route = route.with_tokens(verifier.clone());
        }
        if let Some(webhook) = &self.webhook {
            route = route.with_webhook(webhook.clone());
        }
        // NOTE: `Config::validate` checked the hub's send queues when the service was built.
        let Ok(options) = topic_route_options(&self.config.hub) else { return router };
        let router = router.route_with(&config.path, route, options);
        if !config.http_publish {
            return router;
        }
        let router = router.http(&config.path, HttpRoute::Publish);
        match self.publish_gate() {
            Some(gate) => router.publish_access(Arc::new(gate)),
            None => router,
        }
    }

    /// Who besides the publish token's holder may `POST`: with JWT keys, a token whose
    /// `publish` claim grants the topic; with a connect webhook alone, or anonymous
    /// publishing off ([`RouteConfig::anonymous_publish`]), nobody. `None`: anyone (when no
    /// publish token is set either).
    pub fn publish_gate(&self) -> Option<PublishGate> {
        if let Some(verifier) = &self.verifier {
            return Some(PublishGate::tokens(verifier.clone()));
        }
        if self.webhook.is_some() {
            return Some(PublishGate::only_publish_token(
                "the connect webhook decides subscriptions, not publications: POST needs the \
                 publish token (topics.publish_token, --publish-token)",
            ));
        }
        (!self.config.route.anonymous_publish).then(|| {
            PublishGate::only_publish_token(
                "publishing needs a credential: the publish token (topics.publish_token, \
                 --publish-token) or a JWT with a publish claim; or set \
                 topics.anonymous_publish = true",
            )
        })
    }

    /// The Redis backplane, if `topics.redis` names one.
    pub fn backplane(&self) -> Result<Option<RedisBackplane>, Error> {
        let redis = &self.config.redis;
        let Some(urls) = &redis.redis else { return Ok(None) };
        let backplane = RedisBackplane::new(urls, redis.redis_queue, self.config.hub.history > 0)?;
        Ok(Some(backplane.required(redis.redis_required).durability(redis.redis_durability)))
    }

    /// Binds a server with `config` (whose [`topics`](ServerConfig::topics) should be this
    /// service's hub settings), its routes from `routes` (given the service, to
    /// [`mount`](Self::mount) it), and the Redis backplane if one is configured.
    pub fn bind(
        self,
        config: ServerConfig,
        routes: impl Fn(&Service) -> Router + Send + Sync + 'static,
    ) -> Result<Server, Error> {
        let backplane = self.backplane()?;
        let routes = move || routes(&self);
        match backplane {
            Some(backplane) => Server::bind_with_backplane(config, routes, backplane),
            None => Server::bind(config, routes),
        }
        .map_err(Error::Bind)
    }
}

impl Config {
    /// Checks the service's own settings (the hub's are checked by
    /// [`ServerConfig::validate`](freeboard::ServerConfig::validate)): the path, the token
    /// keys (reads the JWKS file), the webhook's URL and limits, the Redis URLs.
    pub fn validate(&self) -> Result<(), Error> {
        self.hub.watermarks().map_err(Error::Hub)?;
        let path = &self.route.path;
        if !(path.is_empty() || path.starts_with('/') && path.ends_with('/')) {
            return Err(Error::Path(path.clone()));
        }
        TokenVerifier::from_config(&self.tokens)?;
        crate::webhook::check(&self.webhook)?;
        if let Some(urls) = &self.redis.redis {
            crate::redis::RedisAddr::parse(urls).map_err(Error::Redis)?;
        }
        Ok(())
    }
}

/// `router` with the `/topic/` service of `config` mounted ([`Service::mount`]): for a router
/// built once. A server builds a router per loop: build the [`Service`] once and mount it in
/// each, so the key files are read and the webhook started once.
pub fn mount(router: Router, config: &Config) -> Result<Router, Error> {
    Ok(Service::new(config)?.mount(router))
}
