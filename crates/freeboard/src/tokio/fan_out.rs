//! Pub/sub inside tokio: a connection subscribes to topics of its endpoint, any task
//! publishes. The registry is the server's (`topics.rs`: `LocalTopics` as one loop's, a
//! `topics::Hub` with no other loop to send to); a publication is framed once into the
//! endpoint's pool and queued by reference to every subscriber's session, each under its own
//! slow-consumer policy, as the server's loop fans out.

use std::sync::{Arc, Weak};

use ::tokio::io::{AsyncRead, AsyncWrite};
use freeboard_buf::{Frame, PushOutcome};
use freeboard_proto::{MessageKind, Role};

use super::driver::Turn;
use super::endpoint::{Copies, Endpoint, Subscriber};
use super::{Shared, WsWriter};
use crate::session::event_copies::EventCopies;
use crate::session::events::Variant;
use crate::topics::{self, Reach, SubscribeError};

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Subscriber for Shared<S> {
    fn deliver(&self, copies: &mut Copies<'_>) -> Option<bool> {
        let mut guard = self.lock();
        let conn = &mut *guard;
        let mut turn = Turn::new(&self.endpoint);
        let cx = &mut turn.cx(conn.role, conn.read_at, conn.cork.as_deref_mut());
        let outcome = match conn.session.event_stream() {
            None => conn.session.send_frame(cx, &copies.frame)?,
            Some(several) => {
                // The tokio driver keeps no history: no `id:`, and `event:` only when the
                // stream carries several topics (as `freeboard serve`'s streams).
                let variant = Variant { id: false, topic: several };
                let Copies { topic, frame, events, scratch, .. } = copies;
                events.make(variant, frame, topic, false, cx.pool, scratch);
                match events.get(variant) {
                    Some(event) => conn.session.send_frame(cx, event)?,
                    // The pool could not hold the event: dropped for this subscriber.
                    None => return Some(false),
                }
            }
        };
        self.endpoint.count_push(conn.session.queue().policy(), &outcome, true);
        if let PushOutcome::MustClose { .. } = outcome {
            copies.ended_stream = conn.session.event_stream().is_some();
        }
        conn.note_close();
        conn.schedule_write(&mut turn);
        Some(match outcome {
            PushOutcome::Queued | PushOutcome::QueuedAboveHigh => true,
            PushOutcome::Dropped { newest, .. } => !newest,
            // A publisher cannot wait for one subscriber: under `block` the message is
            // dropped for it; under `close` it is closing with 1008.
            PushOutcome::WouldBlock { .. } | PushOutcome::MustClose { .. } => false,
        })
    }

    fn give_up(&self) {
        let mut conn = self.lock();
        if conn.session.buffered() > 0 {
            conn.fail(&mut Turn::new(&self.endpoint));
        }
    }
}

impl Endpoint {
    /// Publishes one message to every connection of this endpoint subscribed to `topic`:
    /// framed once into the pool, queued by reference to each subscriber under its
    /// slow-consumer policy (a subscriber that is behind never delays the others), written
    /// by each connection's reader as a `send` is. With no subscriber it costs a look-up.
    /// Returns how many subscribers took it and for how many it was dropped (all of them if
    /// the pool could not hold the frame).
    pub fn publish(&self, topic: &str, kind: MessageKind, payload: &[u8]) -> Reach {
        let mut reach = Reach::default();
        let (frame, mut targets) = {
            let mut guard = self.lock();
            let hub = &mut *guard;
            let Some(subscribers) = hub.subscriptions.subscribers(topic) else { return reach };
            let (head, n) = topics::header(kind, payload.len());
            let Ok(frame) = Frame::from_parts(&mut hub.pool, &[&head[..n], payload]) else {
                reach.dropped = subscribers.len() as u64;
                return reach;
            };
            let mut targets = std::mem::take(&mut hub.fan_out);
            targets.extend(
                subscribers.iter().filter_map(|(_, &token)| hub.subscribers[token].upgrade()),
            );
            (frame, targets)
        };
        let mut copies = Copies {
            topic,
            frame,
            events: EventCopies::default(),
            scratch: Default::default(),
            ended_stream: false,
        };
        // Each delivery takes the connection's lock, then the endpoint's: not held here.
        for subscriber in &targets {
            match subscriber.deliver(&mut copies) {
                Some(true) => reach.delivered += 1,
                Some(false) => reach.dropped += 1,
                None => {}
            }
            if std::mem::take(&mut copies.ended_stream) {
                self.give_up_unread(Arc::downgrade(subscriber));
            }
        }
        // Dropped outside the endpoint's lock: the last reference to a connection takes it.
        targets.clear();
        let mut hub = self.lock();
        copies.frame.release(&mut hub.pool);
        copies.events.release(&mut hub.pool);
        hub.fan_out = targets;
        reach
    }

    /// After an event stream's `close` policy queued its last event: the event waits for a
    /// reader that is behind, and hyper polls the body only once its own buffers drain, so
    /// none of the session's timers runs meanwhile. If the queue still holds bytes after the
    /// close timeout, they go back to the pool unsent (as `freeboard serve` drops a
    /// connection whose last bytes do not leave in time) and the body ends when next polled.
    /// Needs a tokio runtime: a publication from outside one leaves the queue to the reader.
    fn give_up_unread(&self, subscriber: Weak<dyn Subscriber>) {
        let Ok(runtime) = ::tokio::runtime::Handle::try_current() else { return };
        let timeout = self.limits.close_timeout;
        runtime.spawn(async move {
            ::tokio::time::sleep(timeout).await;
            if let Some(subscriber) = subscriber.upgrade() {
                subscriber.give_up();
            }
        });
    }

    /// Connections of this endpoint subscribed to `topic`.
    pub fn subscribers(&self, topic: &str) -> usize {
        self.lock().subscriptions.subscribers(topic).map_or(0, |s| s.len())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> WsWriter<S> {
    /// Subscribes this (server) connection to `topic` of its endpoint; `Ok(false)` if it
    /// already was. Messages [published](Endpoint::publish) from then on are queued to it by
    /// reference under its slow-consumer policy, until [`unsubscribe`](Self::unsubscribe) or
    /// the connection is dropped (a closed one gets nothing). Refused for an invalid name, past
    /// the endpoint's topic limits, and for a client connection (its frames must be masked).
    pub fn subscribe(&self, topic: &str) -> Result<bool, SubscribeError> {
        let mut conn = self.shared.lock();
        if conn.role == Role::Client {
            return Err(SubscribeError::ClientConnection);
        }
        let mut guard = self.shared.endpoint.lock();
        let hub = &mut *guard;
        let token = *conn.rare().token.get_or_insert_with(|| {
            let weak: Weak<Shared<S>> = Arc::downgrade(&self.shared);
            hub.subscribers.insert(weak)
        });
        hub.subscriptions.subscribe(&self.shared.endpoint.topics, token, topic)
    }

    /// Unsubscribes this connection from `topic`; whether it was subscribed.
    pub fn unsubscribe(&self, topic: &str) -> bool {
        let conn = self.shared.lock();
        let Some(token) = conn.rare.as_ref().and_then(|rare| rare.token) else { return false };
        let mut hub = self.shared.endpoint.lock();
        hub.subscriptions.unsubscribe(&self.shared.endpoint.topics, token, topic)
    }

    /// The topics this connection is subscribed to.
    pub fn topics(&self) -> Vec<String> {
        let conn = self.shared.lock();
        let Some(token) = conn.rare.as_ref().and_then(|rare| rare.token) else {
            return Vec::new();
        };
        let hub = self.shared.endpoint.lock();
        hub.subscriptions.topics_of(token).map(str::to_owned).collect()
    }
}
