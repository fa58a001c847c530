//! Many resuming subscriptions on one [`ClientLoop`]: each reconnects with jittered backoff,
//! resumes with `since`, drops duplicates by offset and reports 4410, as
//! [`Subscription`](super::Subscription) does on the blocking client.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use freeboard_proto::MessageKind;

use super::event_loop::{ClientHandler, ClientId, ClientLoop, LoopConn};
use super::resume::{Delivery, Next, OffsetToken, Resume};
use super::subscription::{SubscriptionEvent, SubscriptionStats, TokenSource, retryable};
use super::{ClientConfig, ClientError, CloseEvent};

/// Identifies a subscription of a [`SubscriptionLoop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SubscriptionId(pub usize);

/// What a [`SubscriptionLoop`] calls with its subscriptions' events.
pub trait SubscriptionHandler {
    /// An event of subscription `id` ([`SubscriptionEvent::Failed`] and
    /// [`SubscriptionEvent::Closed`] are its last).
    fn on_event(&mut self, id: SubscriptionId, event: SubscriptionEvent<'_>);
}

/// Subscriptions that resume, many in one thread: a [`ClientLoop`] underneath, whose
/// configuration every connection shares.
///
/// [`subscribe`](Self::subscribe) adds one (it connects at the next turn);
/// [`turn`](Self::turn) connects those whose wait is over and runs the loop once.
pub struct SubscriptionLoop<H> {
    inner: ClientLoop<Router<H>>,
}

/// The loop's handler: routes each connection's callbacks to its subscription.
struct Router<H> {
    user: H,
    subs: Vec<Entry>,
    by_conn: HashMap<ClientId, usize>,
}

struct Entry {
    resume: Resume,
    token: Option<TokenSource>,
    state: State,
    since: Option<OffsetToken>,
    stats: SubscriptionStats,
}

enum State {
    Waiting(Instant),
    Connected,
    Stopped,
}

impl<H: SubscriptionHandler> SubscriptionLoop<H> {
    /// A loop with `config` for every connection, reporting to `handler`.
    pub fn new(config: ClientConfig, handler: H) -> Result<Self, ClientError> {
        let router = Router { user: handler, subs: Vec::new(), by_conn: HashMap::new() };
        Ok(Self { inner: ClientLoop::new(config, router)? })
    }

    /// Adds a subscription driven by `resume`; it connects at the next [`turn`](Self::turn).
    pub fn subscribe(&mut self, resume: Resume) -> SubscriptionId {
        self.subscribe_with_token(resume, None)
    }

    /// [`subscribe`](Self::subscribe), asking `token` for a bearer token before every attempt.
    pub fn subscribe_with_token(
        &mut self,
        resume: Resume,
        token: Option<TokenSource>,
    ) -> SubscriptionId {
        let subs = &mut self.inner.handler_mut().subs;
        subs.push(Entry {
            resume,
            token,
            state: State::Waiting(Instant::now()),
            since: None,
            stats: SubscriptionStats::default(),
        });
        SubscriptionId(subs.len() - 1)
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.inner.handler().user
    }

    /// The handler, mutably.
    pub fn handler_mut(&mut self) -> &mut H {
        &mut self.inner.handler_mut().user
    }

    /// A subscription's resumption state (its last offset).
    pub fn resume(&self, id: SubscriptionId) -> Option<&Resume> {
        self.inner.handler().subs.get(id.0).map(|e| &e.resume)
    }

    /// What a subscription has done so far.
    pub fn stats(&self, id: SubscriptionId) -> SubscriptionStats {
        self.inner.handler().subs.get(id.0).map(|e| e.stats).unwrap_or_default()
    }

    /// Connections opening or open.
    pub fn connections(&self) -> usize {
        self.inner.len()
    }

    /// Connects the subscriptions whose wait is over, then runs one turn of the loop for at
    /// most `timeout` (less when a wait ends sooner).
    pub fn turn(&mut self, timeout: Duration) -> Result<(), ClientError> {
        let now = Instant::now();
        let mut next_due = now + timeout;
        let due: Vec<usize> = {
            let subs = &self.inner.handler().subs;
            (0..subs.len())
                .filter(|&i| match subs[i].state {
                    State::Waiting(at) if at <= now => true,
                    State::Waiting(at) => {
                        next_due = next_due.min(at);
                        false
                    }
                    _ => false,
                })
                .collect()
        };
        for i in due {
            self.connect(i);
        }
        self.inner.turn(Some(next_due.saturating_duration_since(Instant::now())))
    }

    fn connect(&mut self, i: usize) {
        let router = self.inner.handler_mut();
        let entry = &mut router.subs[i];
        let url = entry.resume.url();
        let headers = match entry.token.as_mut().and_then(|source| source()) {
            Some(token) => vec![("Authorization".to_owned(), format!("Bearer {token}"))],
            None => Vec::new(),
        };
        entry.since = entry.resume.last().cloned();
        entry.state = State::Connected;
        match self.inner.connect_with(&url, &headers) {
            Ok(conn) => {
                self.inner.handler_mut().by_conn.insert(conn, i);
            }
            Err(e) => self.inner.handler_mut().failed(i, e),
        }
    }
}

impl<H> std::fmt::Debug for SubscriptionLoop<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionLoop").field("inner", &self.inner).finish()
    }
}

impl<H: SubscriptionHandler> Router<H> {
    /// Attempt `i` could not be made: retried or stopped.
    fn failed(&mut self, i: usize, error: ClientError) {
        let entry = &mut self.subs[i];
        if !retryable(&error) {
            entry.state = State::Stopped;
            self.user.on_event(SubscriptionId(i), SubscriptionEvent::Failed(error));
            return;
        }
        let after = entry.resume.failed();
        self.retry(i, Next::Reconnect(after), error.to_string());
    }

    /// Schedules subscription `i`'s next attempt after `next` and reports it.
    fn retry(&mut self, i: usize, next: Next, cause: String) {
        let entry = &mut self.subs[i];
        entry.stats.reconnects += 1;
        let id = SubscriptionId(i);
        match next {
            Next::Reconnect(after) => {
                entry.state = State::Waiting(Instant::now() + after);
                self.user.on_event(id, SubscriptionEvent::Reconnecting { after, cause });
            }
            Next::Gone { last, after } => {
                entry.stats.gone += 1;
                entry.state = State::Waiting(Instant::now() + after);
                self.user.on_event(id, SubscriptionEvent::Gone { last });
            }
            Next::Stop => unreachable!("a stop is reported as Closed"),
        }
    }
}

impl<H: SubscriptionHandler> ClientHandler for Router<H> {
    fn on_open(&mut self, conn: &mut LoopConn<'_>) {
        let Some(&i) = self.by_conn.get(&conn.id()) else { return };
        let entry = &mut self.subs[i];
        entry.resume.opened();
        entry.stats.opened += 1;
        let since = entry.since.as_ref();
        self.user.on_event(SubscriptionId(i), SubscriptionEvent::Opened { since });
    }

    fn on_message(&mut self, conn: &mut LoopConn<'_>, kind: MessageKind, data: &[u8]) {
        let Some(&i) = self.by_conn.get(&conn.id()) else { return };
        let id = SubscriptionId(i);
        let entry = &mut self.subs[i];
        let payload_at = match entry.resume.on_message(data) {
            Delivery::Fresh { payload_at, .. } => payload_at,
            Delivery::Duplicate(_) => {
                entry.stats.duplicates += 1;
                return;
            }
            Delivery::EpochChanged { last, payload_at, .. } => {
                entry.stats.gone += 1;
                self.user.on_event(id, SubscriptionEvent::Gone { last: Some(last) });
                payload_at
            }
        };
        let offset = self.subs[i].resume.last().filter(|_| payload_at > 0);
        let payload = &data[payload_at..];
        self.user.on_event(id, SubscriptionEvent::Message { offset, kind, payload });
    }

    fn on_close(&mut self, conn: ClientId, close: CloseEvent) {
        let Some(i) = self.by_conn.remove(&conn) else { return };
        let cause = format!("closed with {}", close.code);
        match self.subs[i].resume.closed(close.code) {
            Next::Stop => {
                self.subs[i].state = State::Stopped;
                self.user.on_event(SubscriptionId(i), SubscriptionEvent::Closed(close));
            }
            next => self.retry(i, next, cause),
        }
    }

    fn on_error(&mut self, conn: ClientId, error: ClientError) {
        if let Some(i) = self.by_conn.remove(&conn) {
            self.failed(i, error);
        }
    }
}
