//! The topic endpoint of `freeboard serve`: an application handler on the runtime's topic hub.

use std::sync::Arc;
use std::time::SystemTime;

use freeboard::config::{ConfigError, TopicsConfig};
use freeboard::history::HISTORY_GONE;
use freeboard::topics::{SubscribeError, topics_in_target};
use freeboard::{
    Accepted, CloseCode, ConflateKey, Conn, Decision, Handler, Message, Request, RouteOptions,
};

use crate::token::{Grant, TokenError, TokenVerifier, bearer_token};
use crate::webhook::ConnectWebhook;
use freeboard_proto::http::query_value;

/// The `/topic/{name}` endpoint of `freeboard serve`: the upgrade subscribes the connection to
/// `name` and to every `also=` name in the query (`/topic/scores?also=news&also=ticks`; an
/// upgrade naming more topics than [`max_topics`](Self::max_topics) gets 400); messages the
/// client sends are published to `name` if client publishing is allowed, else answered with
/// close 1008. With `delta=fossil` in the query, on a topic that offers it
/// ([`deltas`](Self::deltas)), its publications come whole or as Fossil deltas
/// ([`freeboard::delta`]). With `since=OFFSET` in the query, the connection first gets what it missed on
/// `name` ([`Conn::recover`]), or is closed with [`HISTORY_GONE`] if that is no longer kept.
///
/// With a [`TokenVerifier`] the upgrade needs a bearer token (`Authorization: Bearer`, or
/// `?access_token=` for browsers) whose `subscribe` claim grants every topic asked for (401
/// without a valid token, 403 when a topic is not granted; counted in
/// `freeboard_access_refusals_total{reason}`); the connection is closed with
/// [`TOKEN_EXPIRED`](freeboard::auth::TOKEN_EXPIRED) when the token's `exp` passes, and a client
/// publishes only to topics its `publish` claim grants (else close 1008).
///
/// A `GET` with `Accept: text/event-stream` to the same URL is decided here as an upgrade is
/// and opens a Server-Sent Events stream of the same topics (the runtime frames the messages
/// as events); its `Last-Event-ID` reaches [`decide_upgrade`](Handler::decide_upgrade) and
/// [`on_open`](Handler::on_open) as `since=` in the target, so it resumes as `?since=` does,
/// and [`HISTORY_GONE`] ends the stream with a `freeboard-gap` event.
///
/// [`Service::mount`](crate::Service::mount) mounts it under a prefix, with the topic hub's
/// slow-consumer policy and send queues (see [`TopicsConfig`]).
#[derive(Debug, Clone)]
pub struct TopicRoute {
    prefix: String,
    client_publish: bool,
    verifier: Option<Arc<TokenVerifier>>,
    webhook: Option<Arc<ConnectWebhook>>,
    max_topics: usize,
    /// The name prefix of the topics that keep history, if the hub keeps any.
    history_prefix: Option<String>,
    /// The name prefix of the topics with presence, if the hub keeps any.
    presence_prefix: Option<String>,
    /// The name prefix of the topics that offer deltas, if any does.
    delta_prefix: Option<String>,
}

impl TopicRoute {
    /// A topic endpoint under `prefix` (e.g. `/topic/`), open to anyone.
    pub fn new(prefix: &str, client_publish: bool) -> Self {
        Self {
            prefix: prefix.to_owned(),
            client_publish,
            verifier: None,
            webhook: None,
            max_topics: 64,
            history_prefix: None,
            presence_prefix: None,
            delta_prefix: None,
        }
    }

    /// The topics whose names start with `prefix` have presence (see
    /// [`freeboard::presence`]): a subscriber joins it (as its token's `sub` and the claims
    /// the verifier keeps) and, with `?presence=1`, gets its join and leave events; a
    /// publication that would read as an event is refused. `None`: none has.
    /// [`Service::mount`](crate::Service::mount) sets it from the hub's `presence_prefix`.
    pub fn presence(mut self, prefix: Option<&str>) -> Self {
        self.presence_prefix = prefix.map(str::to_owned);
        self
    }

    /// The topics whose names start with `prefix` offer deltas: an upgrade with
    /// `?delta=fossil` gets its topic's publications as Fossil deltas
    /// ([`Conn::receive_deltas`]); `None`: none does, and such an upgrade gets 400.
    /// [`Service::mount`](crate::Service::mount) sets it from the hub's `delta_prefix`.
    pub fn deltas(mut self, prefix: Option<&str>) -> Self {
        self.delta_prefix = prefix.map(str::to_owned);
        self
    }

    /// Why `?delta=` cannot be honoured on `topics`, if it cannot.
    fn delta_refusal(&self, topics: &[&str], delta: &str) -> Option<(&'static str, String)> {
        if delta != freeboard::delta::FOSSIL {
            let why = format!(
                "delta={delta:?} is not a delta format this server knows: ask for delta=fossil"
            );
            return Some(("delta_unknown", why));
        }
        if topics.len() > 1 {
            let why = "delta=fossil takes one topic per connection (its messages carry no topic \
                       name to pick the base of a delta by): drop also="
                .to_owned();
            return Some(("delta_several_topics", why));
        }
        let topic = topics[0];
        if !self.delta_prefix.as_deref().is_some_and(|p| topic.starts_with(p)) {
            let why = match &self.delta_prefix {
                None => format!(
                    "topic {topic:?} offers no deltas (the server offers none: topics.delta_prefix \
                     is not set); connect without delta="
                ),
                Some(prefix) => format!(
                    "topic {topic:?} offers no deltas (only topics named {prefix:?}... do); connect \
                     without delta="
                ),
            };
            return Some(("delta_not_offered", why));
        }
        None
    }

    /// The topics whose names start with `prefix` keep history (`?since=` works there);
    /// `None`: none does. [`Service::mount`](crate::Service::mount) sets it from the hub's
    /// `history` and `history_prefix`.
    pub fn history(mut self, prefix: Option<&str>) -> Self {
        self.history_prefix = prefix.map(str::to_owned);
        self
    }

    /// Why `since` cannot be honoured on `topic`, if it cannot.
    fn since_refusal(&self, topic: &str, since: &str) -> Option<(&'static str, String)> {
        // An offset's characters (`EPOCH.MS-SEQ`); one made of them that this server did not
        // issue (truncated, forged, of an older version or another epoch) is told 4410 once
        // open, as a client that resumes expects, never a partial replay.
        let offset_like = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
        if since.is_empty() || since.len() > 64 || !since.bytes().all(offset_like) {
            let why = format!(
                "since={since:?} is not an offset: give the EPOCH.MS-SEQ before the ':' of the \
                 last message received"
            );
            return Some(("since_malformed", why));
        }
        if !self.history_prefix.as_deref().is_some_and(|p| topic.starts_with(p)) {
            let why = match &self.history_prefix {
                None => format!(
                    "topic {topic:?} keeps no history (the server keeps none: topics.history is \
                     0), so since= cannot be honoured; connect without it"
                ),
                Some(prefix) => format!(
                    "topic {topic:?} keeps no history (only topics named {prefix:?}... do), so \
                     since= cannot be honoured; connect without it"
                ),
            };
            return Some(("since_without_history", why));
        }
        None
    }

    /// The most topics one upgrade may name (its own and its `also=` list); default 64, as
    /// [`TopicsConfig::max_topics_per_connection`].
    pub fn max_topics(mut self, max: usize) -> Self {
        self.max_topics = max;
        self
    }

    /// Requires a token `verifier` accepts, whose claims grant the topics.
    pub fn with_tokens(mut self, verifier: Arc<TokenVerifier>) -> Self {
        self.verifier = Some(verifier);
        self
    }

    /// Asks `webhook` (after the token, if one is required) whether each upgrade may go on;
    /// its answer grants the topics and may set an expiry.
    pub fn with_webhook(mut self, webhook: Arc<ConnectWebhook>) -> Self {
        self.webhook = Some(webhook);
        self
    }

    fn authorize(
        &self,
        request: &Request<'_, '_>,
        topics: &[&str],
    ) -> Result<Accepted, TokenError> {
        let Some(verifier) = &self.verifier else { return Ok(Accepted::new()) };
        let token = bearer_token(request).ok_or(TokenError::Missing)?;
        let grant = verifier.verify(token, SystemTime::now())?;
        if !topics.iter().all(|t| grant.may_subscribe(t)) {
            return Err(TokenError::NotGranted);
        }
        let accepted = Accepted::new().expires_at(grant.expires);
        // The dashboard names a subscriber by its token's `sub` beside its address.
        let accepted = match &grant.subject {
            Some(sub) => accepted.subject(sub),
            None => accepted,
        };
        Ok(accepted.data(grant))
    }
}

impl Handler for TopicRoute {
    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        if !self.client_publish {
            conn.close(CloseCode::POLICY_VIOLATION, "publishing is not allowed here");
            return;
        }
        let Some(topic) = conn.first_topic() else { return };
        let checked = self.verifier.is_some() || self.webhook.is_some();
        if checked && !conn.data::<Grant>().is_some_and(|g| g.may_publish(&topic)) {
            conn.close(CloseCode::POLICY_VIOLATION, "the token does not grant publishing here");
            return;
        }
        if self.presence_prefix.as_deref().is_some_and(|p| topic.starts_with(p))
            && message.data.starts_with(freeboard::presence::EVENT_PREFIX.as_bytes())
        {
            conn.close(
                CloseCode::POLICY_VIOLATION,
                "a publication cannot look like a presence event",
            );
            return;
        }
        let published = conn.publish(&topic, message.kind, message.data);
        if published.backplane_lost > 0
            && self.history_prefix.as_deref().is_some_and(|p| topic.starts_with(p))
        {
            // A history topic's publication goes to Redis first: refused there (Redis
            // unreachable, its queue full), it reached no one. The client is told to try
            // again later rather than left to believe it was sent.
            conn.close(
                CloseCode::TRY_AGAIN_LATER,
                "Redis cannot take this topic's publications now",
            );
        }
    }

    fn decide_upgrade(&mut self, request: &Request<'_, '_>, decision: Decision) {
        let Some(topics) = topics_in_target(&self.prefix, request.path())
            .filter(|names| names.len() <= self.max_topics)
        else {
            return decision.reject(400);
        };
        if query_value(request.path(), "presence").is_some_and(|v| v == "1")
            && let Some(topic) = topics
                .iter()
                .find(|t| !self.presence_prefix.as_deref().is_some_and(|p| t.starts_with(p)))
        {
            let why = format!("topic {topic:?} has no presence, so presence=1 cannot be honoured");
            return decision.reject_saying(400, "presence_off", why);
        }
        if let Some((reason, why)) = query_value(request.path(), "since")
            .and_then(|since| self.since_refusal(topics[0], since))
        {
            return decision.reject_saying(400, reason, why);
        }
        if let Some((reason, why)) = query_value(request.path(), "delta")
            .and_then(|delta| self.delta_refusal(&topics, delta))
        {
            return decision.reject_saying(400, reason, why);
        }
        match (self.authorize(request, &topics), &self.webhook) {
            (Ok(_), Some(webhook)) => {
                let origin = request.origin().and_then(|o| std::str::from_utf8(o).ok());
                let token = bearer_token(request);
                webhook.ask(decision, request.path(), &topics, origin, token);
            }
            (Ok(accepted), None) => match query_value(request.path(), "since") {
                Some(since) => decision.accept_recovering(accepted, topics[0], since),
                None => decision.accept(accepted),
            },
            (Err(e), _) => decision.reject_because(e.status(), e.label()),
        }
    }

    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let target = conn.target().to_owned();
        let topics = topics_in_target(&self.prefix, &target).unwrap_or_default();
        let watch = query_value(&target, "presence").is_some_and(|v| v == "1");
        let grant = conn.data::<Grant>();
        let sub = grant.and_then(|g| g.subject.clone());
        let claims = grant.and_then(|g| g.presence_claims.clone());
        for name in &topics {
            // Watching first: the subscriber's own join is among the events it gets.
            let watched = match watch {
                true => conn.watch_presence(name).map(|_| ()),
                false => Ok(()),
            };
            let subscribed = watched.and_then(|()| conn.subscribe(name));
            let joined =
                subscribed.map(|_| conn.join_presence(name, sub.as_deref(), claims.as_deref()));
            match joined {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    conn.close(CloseCode::TRY_AGAIN_LATER, &e.to_string());
                    return;
                }
                // Not the client's fault: 1013, try again later.
                Err(e @ SubscribeError::NoMemory) => {
                    conn.close(CloseCode::TRY_AGAIN_LATER, &e.to_string());
                    return;
                }
                Err(e) => {
                    conn.close(CloseCode::POLICY_VIOLATION, &e.to_string());
                    return;
                }
            }
        }
        // Asked for and offered (checked at the upgrade): before the replay, so that the first
        // live message after it goes whole.
        if let (Some(_), Some(topic)) = (query_value(&target, "delta"), topics.first()) {
            match conn.receive_deltas(topic) {
                Ok(_) => {}
                Err(e) => {
                    conn.close(CloseCode::TRY_AGAIN_LATER, &e.to_string());
                    return;
                }
            }
        }
        if let (Some(since), Some(topic)) = (query_value(&target, "since"), topics.first())
            && !conn.recover(topic, since)
        {
            conn.close(HISTORY_GONE, "the messages since that offset are no longer kept");
        }
    }
}

/// The options of the topic route: a prefix route that subscribes on upgrade, with the topic
/// hub's slow-consumer policy and send-queue limits.
pub(crate) fn topic_route_options(hub: &TopicsConfig) -> Result<RouteOptions, ConfigError> {
    let mut options = RouteOptions::new()
        .prefix()
        .subscribes()
        .slow_consumer(hub.slow_consumer)
        .watermarks(hub.watermarks()?);
    if let Some(delimiter) = hub.conflate_key.filter(char::is_ascii) {
        let after_envelope = hub.history > 0;
        options = options.conflate_key(ConflateKey {
            delimiter: delimiter as u8,
            after_envelope,
            events: false,
        });
    }
    Ok(options)
}
