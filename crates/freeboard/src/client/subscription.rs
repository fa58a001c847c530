//! A history topic's subscription on the blocking client that reconnects by itself: jittered
//! exponential backoff, `?since=` the last offset delivered, duplicates dropped by offset, a
//! fresh token before every attempt, and 4410 reported as an event the application handles.

use std::time::{Duration, Instant};

use freeboard_proto::{CloseCode, MessageKind};

use super::resume::{Backoff, Delivery, Next, OffsetToken, Resume};
use super::{Client, ClientConfig, ClientError, CloseEvent, Event};

/// Supplies a bearer token before every connection attempt (`None`: connect without one).
pub type TokenSource = Box<dyn FnMut() -> Option<String> + Send>;

/// What [`Subscription::recv`] reports.
#[derive(Debug)]
pub enum SubscriptionEvent<'a> {
    /// A connection opened; `since` is the offset it resumes after (`None`: from now on).
    Opened {
        /// The `since` the connection was made with.
        since: Option<&'a OffsetToken>,
    },
    /// A message not delivered before, in order.
    Message {
        /// Its offset (`None` for a message without an envelope).
        offset: Option<&'a OffsetToken>,
        /// Text or binary.
        kind: MessageKind,
        /// The payload, after the envelope.
        payload: &'a [u8],
    },
    /// The server cannot resume from `last` (close 4410, or an offset of a new epoch that
    /// came without one): what was published meanwhile is not coming. The application starts
    /// afresh (reloads its state); the subscription goes on from the new stream.
    Gone {
        /// The offset that could not be resumed from.
        last: Option<OffsetToken>,
    },
    /// The connection ended (or could not be made) and is tried again after `after`.
    Reconnecting {
        /// The wait before the next attempt.
        after: Duration,
        /// Why: the close code (1006 when the socket failed), or the connection error.
        cause: String,
    },
    /// The server ended the subscription for good (1000, a policy violation, a 4xxx other
    /// than 4410): no further attempt.
    Closed(CloseEvent),
    /// An attempt failed in a way retrying cannot fix (a bad URL, an upgrade refused with 400,
    /// 403 or 404): the subscription has stopped. Only a [`SubscriptionLoop`](super::SubscriptionLoop)
    /// reports it; [`Subscription::recv`] returns the error instead.
    Failed(ClientError),
}

/// Counts of what the subscription did, for a report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubscriptionStats {
    /// Connections opened.
    pub opened: u64,
    /// Attempts that ended or failed and were retried.
    pub reconnects: u64,
    /// Messages dropped because their offset was already delivered.
    pub duplicates: u64,
    /// 4410s and unannounced epoch changes.
    pub gone: u64,
}

/// Where the subscription stands.
enum Phase {
    /// Waiting until the instant, then connecting.
    Waiting(Instant),
    Open(Box<Client>),
    /// A message of a new epoch, held back while its `Gone` is reported.
    Held(Box<Client>, MessageKind),
    Stopped,
}

/// The event [`Subscription::step`] readied, reported by [`Subscription::event`].
enum Ready {
    Nothing,
    Opened,
    Message(MessageKind),
    Gone(Option<OffsetToken>),
    Reconnecting(Duration, String),
    Closed(CloseEvent),
}

/// A subscription to a `/topic/...` URL that survives drops: it resumes with `since` and
/// delivers every publication once, in order, or says it cannot ([`SubscriptionEvent::Gone`]).
///
/// ```no_run
/// use freeboard::client::{ClientConfig, Subscription, SubscriptionEvent};
///
/// let mut feed = Subscription::new("ws://127.0.0.1:9001/topic/chat:room1", ClientConfig::default());
/// loop {
///     match feed.recv()? {
///         SubscriptionEvent::Message { offset, payload, .. } => {
///             println!("{offset:?} {}", String::from_utf8_lossy(payload));
///         }
///         SubscriptionEvent::Gone { .. } => { /* reload the room's state, then go on */ }
///         SubscriptionEvent::Closed(close) => break,
///         _ => {}
///     }
/// }
/// # Ok::<(), freeboard::client::ClientError>(())
/// ```
pub struct Subscription {
    config: ClientConfig,
    resume: Resume,
    token: Option<TokenSource>,
    phase: Phase,
    /// The `since` of the current connection.
    since: Option<OffsetToken>,
    /// The last message's bytes (envelope included), reused.
    message: Vec<u8>,
    payload_at: usize,
    ready: Ready,
    stats: SubscriptionStats,
}

impl Subscription {
    /// A subscription to `url` (a `since=` in it is where it starts), connected at the first
    /// [`recv`](Self::recv).
    pub fn new(url: &str, config: ClientConfig) -> Self {
        Self::with_resume(Resume::new(url, Backoff::default()), config)
    }

    /// A subscription driven by `resume` (its backoff and seed).
    pub fn with_resume(resume: Resume, config: ClientConfig) -> Self {
        Self {
            config,
            resume,
            token: None,
            phase: Phase::Waiting(Instant::now()),
            since: None,
            message: Vec::new(),
            payload_at: 0,
            ready: Ready::Nothing,
            stats: SubscriptionStats::default(),
        }
    }

    /// Asks `source` for a bearer token before every attempt (`Authorization: Bearer`): an
    /// expired token is replaced when the subscription reconnects.
    pub fn token(mut self, source: impl FnMut() -> Option<String> + Send + 'static) -> Self {
        self.token = Some(Box::new(source));
        self
    }

    /// The resumption state: the last offset delivered and the URL the next attempt uses.
    pub fn resume(&self) -> &Resume {
        &self.resume
    }

    /// What the subscription has done so far.
    pub fn stats(&self) -> SubscriptionStats {
        self.stats
    }

    /// The open connection, if any (to send on it, or read its handshake).
    pub fn client(&mut self) -> Option<&mut Client> {
        match &mut self.phase {
            Phase::Open(client) | Phase::Held(client, _) => Some(client),
            _ => None,
        }
    }

    /// Waits for the next event.
    pub fn recv(&mut self) -> Result<SubscriptionEvent<'_>, ClientError> {
        loop {
            // NOTE: a `None` only comes from a timeout; `recv_timeout(None)` has none.
            if self.step(None)? {
                return Ok(self.event());
            }
        }
    }

    /// Waits at most `timeout` for the next event; `Ok(None)` when the time ran out. An
    /// error is one retrying cannot fix (a bad URL or configuration, an upgrade refused with
    /// 400, 403 or 404): the subscription has stopped.
    pub fn recv_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<SubscriptionEvent<'_>>, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.step(Some(left))? {
                return Ok(Some(self.event()));
            }
            if left.is_zero() {
                return Ok(None);
            }
        }
    }

    /// Closes with 1000 and stops: no further attempt.
    pub fn close(&mut self) -> Result<(), ClientError> {
        if let Phase::Open(client) | Phase::Held(client, _) = &mut self.phase {
            client.close(CloseCode::NORMAL, "")?;
            let until = Instant::now() + Duration::from_secs(2);
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                match client.recv_timeout(Some(left)) {
                    Ok(Some(Event::Closed(_))) | Err(_) | Ok(None) => break,
                    Ok(Some(Event::Message(_))) => {}
                }
            }
        }
        self.phase = Phase::Stopped;
        Ok(())
    }

    /// Makes progress for at most `timeout`; `true` when an event is ready.
    fn step(&mut self, timeout: Option<Duration>) -> Result<bool, ClientError> {
        let phase = std::mem::replace(&mut self.phase, Phase::Stopped);
        match phase {
            Phase::Stopped => Err(ClientError::AlreadyClosed),
            Phase::Waiting(at) => {
                let now = Instant::now();
                if at > now {
                    let nap = at - now;
                    std::thread::sleep(timeout.map_or(nap, |t| t.min(nap)));
                    self.phase = Phase::Waiting(at);
                    return Ok(false);
                }
                self.connect()
            }
            Phase::Held(client, kind) => {
                self.phase = Phase::Open(client);
                self.ready = Ready::Message(kind);
                Ok(true)
            }
            Phase::Open(mut client) => {
                let event = match client.recv_timeout(timeout) {
                    Ok(event) => event,
                    Err(e) => {
                        let cause = e.to_string();
                        let next = self.resume.closed(CloseCode::ABNORMAL);
                        return Ok(self.retry(next, cause));
                    }
                };
                match event {
                    None => {
                        self.phase = Phase::Open(client);
                        Ok(false)
                    }
                    Some(Event::Message(message)) => {
                        let kind = message.kind();
                        self.message.clear();
                        message.segments().for_each(|s| self.message.extend_from_slice(s));
                        match self.resume.on_message(&self.message) {
                            Delivery::Fresh { payload_at, .. } => {
                                self.payload_at = payload_at;
                                self.phase = Phase::Open(client);
                                self.ready = Ready::Message(kind);
                                Ok(true)
                            }
                            Delivery::Duplicate(_) => {
                                self.stats.duplicates += 1;
                                self.phase = Phase::Open(client);
                                Ok(false)
                            }
                            Delivery::EpochChanged { last, payload_at, .. } => {
                                self.stats.gone += 1;
                                self.payload_at = payload_at;
                                self.phase = Phase::Held(client, kind);
                                self.ready = Ready::Gone(Some(last));
                                Ok(true)
                            }
                        }
                    }
                    Some(Event::Closed(close)) => {
                        let cause = format!("closed with {}", close.code);
                        match self.resume.closed(close.code) {
                            Next::Stop => {
                                self.ready = Ready::Closed(close);
                                Ok(true)
                            }
                            next => Ok(self.retry(next, cause)),
                        }
                    }
                }
            }
        }
    }

    /// Opens a connection to the resume URL.
    fn connect(&mut self) -> Result<bool, ClientError> {
        let mut config = self.config.clone();
        if let Some(token) = self.token.as_mut().and_then(|source| source()) {
            config.headers.retain(|(name, _)| !name.eq_ignore_ascii_case("authorization"));
            config.headers.push(("Authorization".to_owned(), format!("Bearer {token}")));
        }
        match Client::connect(&self.resume.url(), config) {
            Ok(client) => {
                self.resume.opened();
                self.stats.opened += 1;
                self.since = self.resume.last().cloned();
                self.phase = Phase::Open(Box::new(client));
                self.ready = Ready::Opened;
                Ok(true)
            }
            Err(e) if retryable(&e) => {
                let after = self.resume.failed();
                Ok(self.retry(Next::Reconnect(after), e.to_string()))
            }
            Err(e) => Err(e),
        }
    }

    /// Schedules the next attempt after `next` and readies its event.
    fn retry(&mut self, next: Next, cause: String) -> bool {
        self.stats.reconnects += 1;
        let (after, ready) = match next {
            Next::Reconnect(after) => (after, Ready::Reconnecting(after, cause)),
            Next::Gone { last, after } => {
                self.stats.gone += 1;
                (after, Ready::Gone(last))
            }
            Next::Stop => unreachable!("a stop is reported as Closed"),
        };
        self.phase = Phase::Waiting(Instant::now() + after);
        self.ready = ready;
        true
    }

    fn event(&mut self) -> SubscriptionEvent<'_> {
        match std::mem::replace(&mut self.ready, Ready::Nothing) {
            Ready::Opened => SubscriptionEvent::Opened { since: self.since.as_ref() },
            Ready::Message(kind) => SubscriptionEvent::Message {
                offset: self.resume.last().filter(|_| self.payload_at > 0),
                kind,
                payload: &self.message[self.payload_at..],
            },
            Ready::Gone(last) => SubscriptionEvent::Gone { last },
            Ready::Reconnecting(after, cause) => SubscriptionEvent::Reconnecting { after, cause },
            Ready::Closed(close) => SubscriptionEvent::Closed(close),
            Ready::Nothing => unreachable!("an event is ready when step says so"),
        }
    }
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("url", &self.resume.url())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Whether a failed attempt may succeed later: the network, a timeout, a server restarting
/// (5xx, 429) or a token that a refresh may fix (401); not a bad URL, a configuration, or an
/// upgrade refused for what the request is (400, 403, 404).
pub(super) fn retryable(e: &ClientError) -> bool {
    match e {
        ClientError::Refused { status, .. } => matches!(status, 401 | 408 | 429 | 500..=599),
        ClientError::InvalidUrl { .. }
        | ClientError::Config(_)
        | ClientError::Limits(_)
        | ClientError::MissingFeature(_)
        | ClientError::Usage(_) => false,
        _ => true,
    }
}
