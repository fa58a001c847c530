//! The optional parts of freeboard (Cargo features) and the error a setting that needs a part
//! left out of the build gets: it is refused, naming the feature, never ignored.

use std::fmt;

use crate::config::{ConfigError, ServerConfig};
use crate::handler::Router;

/// wss:// for the server and the clients (rustls).
pub(crate) const TLS: bool = cfg!(feature = "tls");
/// permessage-deflate (zlib-rs).
pub(crate) const DEFLATE: bool = cfg!(feature = "deflate");
/// The /topic/ service: JWT, the connect webhook, the Redis backplane and its history.
pub(crate) const TOPIC_SERVICE: bool = cfg!(feature = "topic-service");

/// A setting that needs an optional part of freeboard this build was compiled without.
///
/// ```
/// use freeboard::MissingFeature;
///
/// let missing = MissingFeature { setting: "tls", feature: "tls" };
/// assert!(missing.to_string().contains("features = [\"tls\"]"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingFeature {
    /// The setting, by its TOML key (`tls`, `compression`, `topics.redis`) or the client's
    /// (`wss://`, `compression`).
    pub setting: &'static str,
    /// The Cargo feature of the `freeboard` crate that builds it.
    pub feature: &'static str,
}

impl fmt::Display for MissingFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { setting, feature } = self;
        write!(
            f,
            "{setting} needs freeboard's `{feature}` feature, which this build leaves out \
             (in Cargo.toml: freeboard = {{ features = [\"{feature}\"] }})"
        )
    }
}

impl std::error::Error for MissingFeature {}

/// Refuses the first setting of `config` whose part this build leaves out.
pub(crate) fn check(config: &ServerConfig) -> Result<(), ConfigError> {
    let topics = &config.topics;
    let wanted = [
        ("tls", "tls", TLS, config.tls.is_some()),
        ("compression", "deflate", DEFLATE, config.compression != crate::Compression::Off),
        ("topics.jwt_secret", "topic-service", TOPIC_SERVICE, topics.jwt_secret.is_some()),
        ("topics.jwks_file", "topic-service", TOPIC_SERVICE, topics.jwks_file.is_some()),
        (
            "topics.connect_webhook",
            "topic-service",
            TOPIC_SERVICE,
            topics.connect_webhook.is_some(),
        ),
        ("topics.redis", "topic-service", TOPIC_SERVICE, topics.redis.is_some()),
    ];
    match wanted.into_iter().find(|&(_, _, built, asked)| asked && !built) {
        Some((setting, feature, ..)) => {
            Err(ConfigError::MissingFeature(MissingFeature { setting, feature }))
        }
        None => Ok(()),
    }
}

/// Refuses routes that compress ([`RouteOptions::compression`](crate::RouteOptions)) in a
/// build that cannot: one loop's router is built to look (only in such a build).
pub(crate) fn check_routes(routes: &impl Fn() -> Router) -> Result<(), ConfigError> {
    if DEFLATE {
        return Ok(());
    }
    let compresses = |mode: &crate::Compression| *mode != crate::Compression::Off;
    match routes().all_options().any(|o| o.compression.as_ref().is_some_and(compresses)) {
        true => {
            let missing = MissingFeature { setting: "a route's compression", feature: "deflate" };
            Err(ConfigError::MissingFeature(missing))
        }
        false => Ok(()),
    }
}

#[cfg(not(feature = "topic-service"))]
impl crate::config::TopicsConfig {
    /// Nothing of the service to check in a build without it: [`check`] refused its settings.
    pub(crate) fn check_service(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}
