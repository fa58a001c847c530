//! The loop's side of presence (see [`presence`](crate::presence)): a closing connection
//! leaves the presence of its topics, and `GET {route}{topic}/presence[/count]` on a route that
//! subscribes lists a topic's members once the route's handler has decided the request as it
//! would an upgrade to `{route}{topic}` (the same token, webhook and origin checks).

use freeboard_proto::Instant;
use freeboard_proto::http;

use super::event_loop::EventLoop;
use super::requests::{Listing, Reply};
use crate::presence::{DEFAULT_PAGE, MAX_PAGE};
use crate::transport::Transport;

impl<T: Transport> EventLoop<T> {
    /// Drops connection `token`'s subscriptions (it is closing), leaving the presence of its
    /// topics first.
    pub(super) fn drop_subscriptions(&mut self, token: usize, serial: u64) {
        if let Some(presence) = self.shared.hub.presence() {
            let id = (self.index, serial);
            for topic in self.topics.topics_of(token) {
                if presence.applies(topic) {
                    presence.leave(topic, id);
                }
            }
        }
        self.topics.drop_conn(&self.shared.hub, token);
    }

    /// Whether a publication of `payload` to `topic` would read as a presence event (refused:
    /// [`RESERVED`](crate::presence::RESERVED)).
    pub(super) fn presence_reserves(&self, topic: &str, payload: &[u8]) -> bool {
        self.shared.hub.presence().is_some_and(|p| p.reserves(topic, payload))
    }

    /// Why `listing` cannot be answered, before it is decided: `(status, reason, why)`.
    pub(super) fn listing_refusal(&self, listing: &Listing) -> Option<(u16, &'static str, String)> {
        let topic = &listing.topic;
        if !crate::topics::valid_topic(topic) {
            let why = format!("{topic:?} is not a topic name");
            return Some((404, "presence_no_topic", why));
        }
        match self.shared.hub.presence() {
            None => Some((
                400,
                "presence_off",
                "this server keeps no presence (topics.presence_prefix is not set)".to_owned(),
            )),
            Some(p) if !p.applies(topic) => Some((
                400,
                "presence_off",
                format!(
                    "topic {topic:?} has no presence (only topics named {:?}... do)",
                    p.prefix()
                ),
            )),
            Some(_) => None,
        }
    }

    /// Answers an accepted listing: `{"topic":…,"count":N}`, or a page of members
    /// (`?cursor=` the previous page's `next`, `?limit=` at most [`MAX_PAGE`]).
    pub(super) fn answer_listing(
        &mut self,
        token: usize,
        now: Instant,
        listing: &Listing,
        target: &str,
    ) {
        let Some(presence) = self.shared.hub.presence().cloned() else { return };
        let topic = &listing.topic;
        let body = if listing.count {
            let count = presence.count(topic);
            format!(
                "{{\"topic\":{},\"count\":{count}}}",
                serde_json::to_string(topic).unwrap_or_default()
            )
        } else {
            let limit = http::query_value(target, "limit").and_then(|l| l.parse().ok());
            let limit = limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE);
            let cursor = http::query_value(target, "cursor").filter(|c| !c.is_empty());
            presence.page(topic, cursor, limit).to_json()
        };
        let reply = Reply { keep_alive: false, head_only: false };
        let extra = "Cache-Control: no-store\r\n";
        self.reply(token, now, 200, extra, "application/json", body.as_bytes(), reply);
    }
}
