//! The runtime's loopback test helpers, and the topic service on a test configuration.
#![allow(dead_code, unreachable_pub)]

#[path = "../../../freeboard/tests/common/mod.rs"]
mod runtime;

pub use runtime::*;

use freeboard::config::TopicsConfig;
use freeboard_topics::{Config, Service};

/// The topic service on the hub settings `hub` (clients may publish or not), built once for
/// every loop's router.
pub fn service(hub: &TopicsConfig, client_publish: bool) -> Service {
    let mut topics = Config::default();
    topics.hub = hub.clone();
    topics.route.client_publish = client_publish;
    Service::new(&topics).unwrap()
}
