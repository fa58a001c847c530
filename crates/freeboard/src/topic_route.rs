//! The topic endpoint of `freeboard serve`: an application handler on the topic registry.

use freeboard_proto::CloseCode;
use freeboard_proto::handshake::Request;

use crate::config::TopicsConfig;
use crate::handler::{Conn, Handler, Message, RouteOptions, Router, Upgrade};
use crate::topics::topics_in_target;

/// The `/topic/{name}` endpoint of `freeboard serve`: the upgrade subscribes the connection to
/// `name` and to every `also=` name in the query (`/topic/scores?also=news&also=ticks`; an
/// upgrade naming more topics than [`max_topics`](Self::max_topics) gets 400); messages the client sends are published to `name` if client publishing is allowed, else
/// answered with close 1008.
///
/// Mount it with [`Router::route_with`](crate::Router::route_with) under a prefix, with the
/// topic routes' slow-consumer policy (see [`TopicsConfig`]).
#[derive(Debug, Clone)]
pub struct TopicRoute {
    prefix: String,
    client_publish: bool,
    max_topics: usize,
}

impl TopicRoute {
    /// A topic endpoint under `prefix` (e.g. `/topic/`).
    pub fn new(prefix: &str, client_publish: bool) -> Self {
        Self { prefix: prefix.to_owned(), client_publish, max_topics: 64 }
    }

    /// The most topics one upgrade may name (its own and its `also=` list); default 64, as
    /// [`TopicsConfig::max_topics_per_connection`].
    pub fn max_topics(mut self, max: usize) -> Self {
        self.max_topics = max;
        self
    }
}

impl Handler for TopicRoute {
    fn on_upgrade(&mut self, request: &Request<'_, '_>) -> Upgrade {
        match topics_in_target(&self.prefix, request.path()) {
            Some(names) if names.len() <= self.max_topics => Upgrade::Accept { protocol: None },
            _ => Upgrade::Reject(400),
        }
    }

    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let target = conn.target().to_owned();
        for name in topics_in_target(&self.prefix, &target).unwrap_or_default() {
            if let Err(e) = conn.subscribe(name) {
                conn.close(CloseCode::POLICY_VIOLATION, &e.to_string());
                return;
            }
        }
    }

    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        if !self.client_publish {
            conn.close(CloseCode::POLICY_VIOLATION, "publishing is not allowed here");
            return;
        }
        let Some(topic) = conn.topics().next().map(str::to_owned) else { return };
        let _ = conn.publish(&topic, message.kind, message.data);
    }
}

impl Router {
    /// Mounts a [`TopicRoute`] at `config.path` (a prefix route) with the topic routes'
    /// slow-consumer policy and send-queue limits. Does nothing if the path is empty.
    ///
    /// ```
    /// use freeboard::{Echo, Router, ServerConfig};
    ///
    /// let config = ServerConfig::default();
    /// let topics = config.topics.clone();
    /// let routes = move || Router::new().route("/", Echo).topics(&topics);
    /// # let _ = routes;
    /// ```
    pub fn topics(self, config: &TopicsConfig) -> Self {
        let Ok(marks) = config.watermarks() else { return self };
        if config.path.is_empty() {
            return self;
        }
        let options =
            RouteOptions::new().prefix().slow_consumer(config.slow_consumer).watermarks(marks);
        let route = TopicRoute::new(&config.path, config.client_publish)
            .max_topics(config.max_topics_per_connection);
        self.route_with(&config.path, route, options)
    }
}
