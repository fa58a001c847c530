//! The application's side: handlers, the connection handle they get, routing.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use freeboard_buf::{ConflateKey, PushOutcome, SlowConsumerPolicy, Watermarks};
use freeboard_proto::handshake::Request;
use freeboard_proto::{CloseCode, MessageKind};

use crate::MissingFeature;
use crate::backplane::Recoverer;
use crate::history::Replay;
use crate::metrics::{LoopStats, Metrics};
use crate::session::{Context, SendOutcome, Session};
use crate::topics::{Hub, LocalTopics, Outbox, Published, SubscribeError};

/// An application endpoint: what happens on one route.
///
/// Every method runs on the event loop of the connection; none may block. Each loop owns its
/// own handler instances (built by the [`Router`] factory), so `&mut self` needs no locking.
pub trait Handler: 'static {
    /// Decides whether to accept an upgrade request (auth, origin, subprotocol). Default:
    /// accept without a subprotocol.
    fn on_upgrade(&mut self, request: &Request<'_, '_>) -> Upgrade {
        let _ = request;
        Upgrade::Accept { protocol: None }
    }

    /// Decides an upgrade request, now or later: `decision` may be completed in this call or
    /// moved to another thread or a future (a database lookup, a webhook) and completed
    /// there, without blocking the loop. Until it is, the connection waits in the request
    /// phase: it reads nothing, the handshake timeout keeps running (when it passes the
    /// client gets 503 and the late decision is ignored), and at most
    /// [`ServerConfig::max_pending_upgrades`](crate::ServerConfig::max_pending_upgrades)
    /// connections of the server wait at once (beyond them, 503 at once). An [`Accepted`]
    /// decision can carry per-connection data ([`Conn::data`]) and an expiry, at which the
    /// open connection is closed with [`TOKEN_EXPIRED`](crate::auth::TOKEN_EXPIRED).
    ///
    /// Default: [`on_upgrade`](Self::on_upgrade)'s answer, at once.
    fn decide_upgrade(&mut self, request: &Request<'_, '_>, decision: Decision) {
        decision.complete(self.on_upgrade(request));
    }

    /// The connection is open; the `101` response is queued ahead of anything sent here.
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let _ = conn;
    }

    /// A whole data message arrived.
    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>);

    /// The connection's send queue drained to its low watermark after being above its high
    /// watermark: producers may resume.
    fn on_writable(&mut self, conn: &mut Conn<'_>) {
        let _ = conn;
    }

    /// The connection's send queue rose above its high watermark: producers should pause.
    fn on_not_writable(&mut self, conn: &mut Conn<'_>) {
        let _ = conn;
    }

    /// The connection closed with `code` and `reason` (1006 when the transport ended first).
    fn on_close(&mut self, id: ConnId, code: CloseCode, reason: &str) {
        let _ = (id, code, reason);
    }
}

/// The answer to an upgrade request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upgrade {
    /// Switch protocols, optionally naming the chosen subprotocol.
    Accept {
        /// The subprotocol, from [`Request::select_protocol`].
        protocol: Option<&'static str>,
    },
    /// Refuse with this HTTP status.
    Reject(u16),
}

/// An upgrade decision the server waits for: complete it with [`accept`](Self::accept) or
/// [`reject`](Self::reject), on the loop's thread or any other. It is `Send` and `'static`.
/// Dropping it undecided refuses the upgrade with 500.
pub struct Decision {
    token: usize,
    serial: u64,
    peer: SocketAddr,
    decisions: Arc<Decisions>,
    done: bool,
    /// Fetches history from the backplane before an upgrade with `?since=` is accepted, if it
    /// is kept there.
    recoverer: Option<Recoverer>,
}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision").field("peer", &self.peer).finish_non_exhaustive()
    }
}

impl Decision {
    pub(crate) fn new(
        token: usize,
        serial: u64,
        peer: SocketAddr,
        decisions: Arc<Decisions>,
        recoverer: Option<Recoverer>,
    ) -> Self {
        Self { token, serial, peer, decisions, done: false, recoverer }
    }

    /// The client's address (the forwarded one behind a trusted proxy).
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Accepts the upgrade.
    pub fn accept(mut self, accepted: Accepted) {
        self.send(DecisionOutcome::Accept(accepted));
    }

    /// Accepts the upgrade of a subscriber to `topic` that reconnects having last seen the
    /// offset `since`, once what it missed is at hand for [`Conn::recover`] in `on_open`:
    /// at once when history is kept in memory; with a backplane that keeps it, once it is
    /// fetched from there (503 if it cannot be reached, or too many are being fetched).
    pub fn accept_recovering(mut self, accepted: Accepted, topic: &str, since: &str) {
        let Some(recoverer) = self.recoverer.take() else { return self.accept(accepted) };
        recoverer.recover(topic, since, move |fetched| match fetched {
            Ok(()) => self.accept(accepted),
            Err(reason) => self.reject_because(503, reason),
        });
    }

    /// Refuses the upgrade with `status` (a 4xx or 5xx).
    pub fn reject(mut self, status: u16) {
        self.send(DecisionOutcome::Reject { status, reason: "refused", why: None });
    }

    /// Refuses the upgrade with `status`, counting it in
    /// `freeboard_access_refusals_total{reason}` and saying `reason` in the response body and
    /// the (rate-limited) log line.
    pub fn reject_because(mut self, status: u16, reason: &'static str) {
        self.send(DecisionOutcome::Reject { status, reason, why: None });
    }

    /// Refuses the upgrade with `status`, counted under `reason` as
    /// [`reject_because`](Self::reject_because) does, with `why` (a sentence for the person
    /// reading the client's error) in the response body and the log line.
    pub fn reject_saying(mut self, status: u16, reason: &'static str, why: impl Into<String>) {
        let why = Some(why.into().into_boxed_str());
        self.send(DecisionOutcome::Reject { status, reason, why });
    }

    /// Completes the decision with a synchronous [`Upgrade`] answer.
    pub fn complete(self, upgrade: Upgrade) {
        match upgrade {
            Upgrade::Accept { protocol } => self.accept(Accepted { protocol, ..Accepted::new() }),
            Upgrade::Reject(status) => self.reject(status),
        }
    }

    fn send(&mut self, outcome: DecisionOutcome) {
        self.done = true;
        self.decisions.push(Completion { token: self.token, serial: self.serial, outcome });
    }
}

impl Drop for Decision {
    fn drop(&mut self) {
        if !self.done {
            let reason = "upgrade decision dropped";
            self.send(DecisionOutcome::Reject { status: 500, reason, why: None });
        }
    }
}

/// An accepted upgrade: the subprotocol, per-connection data for the handler, an expiry.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use freeboard::Accepted;
///
/// struct User { id: u64 }
/// let accepted = Accepted::new()
///     .data(User { id: 42 })
///     .expires_at(SystemTime::now() + Duration::from_secs(3600));
/// # let _ = accepted;
/// ```
#[derive(Default)]
pub struct Accepted {
    protocol: Option<&'static str>,
    data: Option<Box<dyn Any + Send>>,
    expires: Option<SystemTime>,
    subject: Option<Arc<str>>,
}

impl std::fmt::Debug for Accepted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accepted")
            .field("protocol", &self.protocol)
            .field("data", &self.data.is_some())
            .field("expires", &self.expires)
            .field("subject", &self.subject)
            .finish()
    }
}

impl Accepted {
    /// Accepts without a subprotocol, data or expiry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The subprotocol, from [`Request::select_protocol`].
    pub fn protocol(mut self, protocol: &'static str) -> Self {
        self.protocol = Some(protocol);
        self
    }

    /// Data the handler gets back with [`Conn::data`] on every callback of this connection.
    /// It lives in a side table of the loop (not in the connection's slot), until the close.
    pub fn data<T: Any + Send>(mut self, data: T) -> Self {
        self.data = Some(Box::new(data));
        self
    }

    /// When the connection's authorization lapses: the loop closes it then with
    /// [`TOKEN_EXPIRED`](crate::auth::TOKEN_EXPIRED) (4001, "token expired"), counted in
    /// `freeboard_access_token_expiries_total`. A time already past refuses the upgrade (401).
    pub fn expires_at(mut self, at: SystemTime) -> Self {
        self.expires = Some(at);
        self
    }

    /// Who the connection is, as an operator should see it (a token's `sub`): the
    /// dashboard names it beside the client's address among the slowest subscribers.
    pub fn subject(mut self, subject: &str) -> Self {
        self.subject = Some(Arc::from(subject));
        self
    }

    pub(crate) fn into_parts(self) -> AcceptedParts {
        (self.protocol, self.data, self.expires, self.subject)
    }
}

/// An [`Accepted`]'s subprotocol, data, expiry and subject.
pub(crate) type AcceptedParts =
    (Option<&'static str>, Option<Box<dyn Any + Send>>, Option<SystemTime>, Option<Arc<str>>);

/// What a [`Decision`] came to.
pub(crate) enum DecisionOutcome {
    Accept(Accepted),
    Reject {
        status: u16,
        reason: &'static str,
        /// What the response body says, when not `reason`.
        why: Option<Box<str>>,
    },
    /// Not an upgrade: every loop has reported on the connection's HTTP publish.
    Published,
}

/// A decision completed for the connection `token` (whose serial was `serial`).
pub(crate) struct Completion {
    pub(crate) token: usize,
    pub(crate) serial: u64,
    pub(crate) outcome: DecisionOutcome,
}

/// The completed decisions of one event loop, pushed from any thread. A push from outside
/// the loop's own call into the application wakes the loop.
pub(crate) struct Decisions {
    queue: Mutex<Vec<Completion>>,
    queued: AtomicUsize,
    /// The loop is inside `decide_upgrade`, and looks at the queue right after it returns:
    /// no wake-up is needed.
    pub(crate) deciding: AtomicBool,
    waker: Arc<mio::Waker>,
}

impl Decisions {
    pub(crate) fn new(waker: Arc<mio::Waker>) -> Self {
        Self {
            queue: Mutex::new(Vec::new()),
            queued: AtomicUsize::new(0),
            deciding: AtomicBool::new(false),
            waker,
        }
    }

    pub(crate) fn push(&self, completion: Completion) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).push(completion);
        self.queued.fetch_add(1, Ordering::SeqCst);
        if !self.deciding.load(Ordering::SeqCst) {
            let _ = self.waker.wake();
        }
    }

    /// Moves every completed decision into `out`.
    pub(crate) fn drain_into(&self, out: &mut Vec<Completion>) {
        if self.queued.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        self.queued.store(0, Ordering::SeqCst);
        out.append(&mut queue);
    }
}

/// A whole data message, borrowed: from the loop's read buffer when it arrived in one read
/// (no copy), else from the loop's assembly buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// Text (validated UTF-8) or binary.
    pub kind: MessageKind,
    /// The payload.
    pub data: &'a [u8],
}

impl Message<'_> {
    /// The payload as text, if the message is text.
    pub fn as_text(&self) -> Option<&str> {
        match self.kind {
            // NOTE: the core validated the UTF-8 already; this check is cheap insurance.
            MessageKind::Text => std::str::from_utf8(self.data).ok(),
            MessageKind::Binary => None,
        }
    }
}

/// A connection's identity on its loop: the loop's index and a serial number, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    /// The event loop.
    pub event_loop: u32,
    /// The connection's serial number on that loop.
    pub serial: u64,
}

/// Where a connection lives on its loop: its slot (reused once it closes) and its serial
/// (never reused). It reaches the connection between turns of a
/// [`LocalServer`](crate::LocalServer) ([`with_conn`](crate::LocalServer::with_conn)) in
/// O(1); a key whose connection has gone finds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnKey {
    /// The connection's slot on its loop.
    pub slot: usize,
    /// Its serial number on that loop ([`ConnId::serial`]).
    pub serial: u64,
}

/// The handle a handler gets on one connection.
pub struct Conn<'a> {
    pub(crate) id: ConnId,
    pub(crate) peer: SocketAddr,
    pub(crate) session: &'a mut Session,
    pub(crate) cx: Context<'a>,
    pub(crate) metrics: &'a Metrics,
    pub(crate) stats: &'a mut LoopStats,
    /// The connection's slab key on its loop.
    pub(crate) token: usize,
    /// The request target during `on_open`, else empty.
    pub(crate) target: &'a str,
    pub(crate) topics: &'a mut LocalTopics,
    pub(crate) hub: &'a Hub,
    /// Local publishes, fanned out by the loop once the handler returns (or its read is
    /// handled).
    pub(crate) outbox: &'a mut Outbox,
    /// The data its upgrade decision attached ([`Accepted::data`]).
    pub(crate) data: Option<&'a mut Box<dyn Any + Send>>,
}

impl std::fmt::Debug for Conn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("id", &self.id)
            .field("peer", &self.peer)
            .field("buffered_amount", &self.buffered_amount())
            .finish_non_exhaustive()
    }
}

impl Conn<'_> {
    /// This connection's id.
    pub fn id(&self) -> ConnId {
        self.id
    }

    /// Where this connection lives on its loop, to reach it later from outside a callback
    /// ([`LocalServer::with_conn`](crate::LocalServer::with_conn)).
    pub fn key(&self) -> ConnKey {
        ConnKey { slot: self.token, serial: self.id.serial }
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Queues one message; it leaves with the connection's other output in one `writev` at
    /// the end of the loop turn. The outcome says what the slow-consumer policy did.
    // Always inline: a handler's reply is then framed into the cork without a call
    // (callgrind, 64 B echo: 20 instructions fewer per message than with the call).
    #[inline(always)]
    pub fn send(&mut self, kind: MessageKind, data: &[u8]) -> SendOutcome {
        match self.session.send(&mut self.cx, kind, data) {
            Some(PushOutcome::Queued) => {
                self.stats.messages_out += 1;
                SendOutcome::Queue(PushOutcome::Queued)
            }
            Some(outcome) => self.count_send(outcome),
            None => SendOutcome::Closed,
        }
    }

    /// Counts a send that did not simply queue (out of line: the common send only counts).
    #[inline(never)]
    fn count_send(&mut self, outcome: PushOutcome) -> SendOutcome {
        self.stats.count_send(outcome, self.session.queue().policy());
        if let PushOutcome::MustClose { .. } = outcome {
            self.metrics.slow_consumer_closes.inc();
        }
        outcome.into()
    }

    /// Sends a text message.
    pub fn send_text(&mut self, text: &str) -> SendOutcome {
        self.send(MessageKind::Text, text.as_bytes())
    }

    /// Starts the close handshake with `code` and `reason` (at most 123 bytes). Does nothing
    /// if it has started already.
    pub fn close(&mut self, code: CloseCode, reason: &str) {
        let reason = crate::session::truncate(reason, freeboard_proto::close::MAX_REASON_LEN);
        let _ = self.session.close(&mut self.cx, code, reason);
    }

    /// Unsent bytes in the connection's queue (`bufferedAmount`), replies corked for this turn's
    /// write included. O(1).
    pub fn buffered_amount(&self) -> usize {
        self.session.buffered() + self.cx.cork.as_ref().map_or(0, |cork| cork.len())
    }

    /// Whether the queue is at or under its high watermark.
    pub fn is_writable(&self) -> bool {
        self.session.queue().is_writable()
    }

    /// The endpoint's slow-consumer policy.
    pub fn policy(&self) -> SlowConsumerPolicy {
        self.session.queue().policy()
    }

    /// The upgrade request's target (path and query) during [`Handler::on_open`]; empty in
    /// the other callbacks (it is not kept per connection).
    pub fn target(&self) -> &str {
        self.target
    }

    /// The data the upgrade decision attached with [`Accepted::data`], if it is a `T`.
    pub fn data<T: Any>(&self) -> Option<&T> {
        self.data.as_ref().and_then(|d| d.downcast_ref::<T>())
    }

    /// The attached data, mutably.
    pub fn data_mut<T: Any>(&mut self) -> Option<&mut T> {
        self.data.as_mut().and_then(|d| d.downcast_mut::<T>())
    }

    /// Subscribes this connection to `topic` (O(1) in the topic's subscribers); `Ok(false)`
    /// if it already was. Messages published to the topic from then on are queued to it by
    /// reference, under its endpoint's slow-consumer policy. The subscription ends with
    /// [`unsubscribe`](Self::unsubscribe) or when the connection closes. It is held in the
    /// loop's budget for topic tables: [`SubscribeError::NoMemory`] when that is spent (close
    /// with [`CloseCode::TRY_AGAIN_LATER`], as the topic route does).
    pub fn subscribe(&mut self, topic: &str) -> Result<bool, SubscribeError> {
        let subscribed = self.topics.subscribe(self.hub, self.token, topic)?;
        if subscribed {
            self.outbox.subscription_changed(self.token, topic, true);
        }
        Ok(subscribed)
    }

    /// This connection, subscribed to `topic`, gets its publications as Fossil deltas from
    /// now on, each in the envelope [`delta`](crate::delta) describes (the first one whole).
    /// One topic per connection: `Ok(false)` if it is not subscribed to `topic` or gets
    /// deltas of another topic already. Held in the loop's budget for topic tables, as a
    /// subscription is ([`SubscribeError::NoMemory`]). The server's event loops send deltas;
    /// the tokio driver sends every message whole, without the envelope.
    pub fn receive_deltas(&mut self, topic: &str) -> Result<bool, SubscribeError> {
        self.topics.receive_deltas(self.hub, self.token, topic)
    }

    /// Unsubscribes this connection from `topic`; whether it was subscribed. It leaves the
    /// topic's presence too.
    pub fn unsubscribe(&mut self, topic: &str) -> bool {
        let left = self.topics.unsubscribe(self.hub, self.token, topic);
        if left {
            self.outbox.subscription_changed(self.token, topic, false);
            if let Some(presence) = self.hub.presence() {
                presence.leave(topic, (self.id.event_loop, self.id.serial));
            }
        }
        left
    }

    /// Makes this connection, subscribed to `topic`, a member of the topic's presence (see
    /// [`presence`](crate::presence)), listed as `sub` with `claims` (a JSON object of the
    /// claims an operator allows); the subscribers that watch the topic are told. It leaves
    /// when it unsubscribes or closes. `Ok(false)` when the topic has no presence (the server
    /// has none, or the name is outside its prefix). Refused when the topic's presence is full
    /// or its budget spent: close with [`CloseCode::TRY_AGAIN_LATER`].
    pub fn join_presence(
        &mut self,
        topic: &str,
        sub: Option<&str>,
        claims: Option<&str>,
    ) -> Result<bool, crate::presence::PresenceError> {
        let Some(presence) = self.hub.presence().filter(|p| p.applies(topic)) else {
            return Ok(false);
        };
        presence.join(topic, (self.id.event_loop, self.id.serial), sub, claims).map(|()| true)
    }

    /// The presence of the topics that have it (who subscribes to them, on this node and the
    /// others the backplane tells of), if the server keeps one: for a handler that answers
    /// who is there ([`Presence::page`](crate::presence::Presence::page),
    /// [`count`](crate::presence::Presence::count)).
    pub fn presence(&self) -> Option<&Arc<crate::presence::Presence>> {
        self.hub.presence()
    }

    /// Sends this connection the join and leave events of `topic`'s presence from now on, each
    /// a text message in the envelope [`presence`](crate::presence) describes; `Ok(false)`
    /// when the topic has no presence. It counts as one more of the connection's topics.
    pub fn watch_presence(&mut self, topic: &str) -> Result<bool, SubscribeError> {
        if !self.hub.presence().is_some_and(|p| p.applies(topic)) {
            return Ok(false);
        }
        if !crate::topics::valid_topic(topic) {
            return Err(SubscribeError::InvalidName);
        }
        self.subscribe(&crate::presence::watch_topic(topic))
    }

    /// The first topic this connection subscribed to (its name shared, not copied).
    pub fn first_topic(&self) -> Option<Arc<str>> {
        self.topics.first_topic_of(self.token)
    }

    /// The topics this connection is subscribed to.
    pub fn topics(&self) -> impl Iterator<Item = &str> {
        self.topics.topics_of(self.token)
    }

    /// Publishes one message to every subscriber of `topic` on every loop (this connection
    /// too, if it is subscribed). It is framed once for this loop's subscribers and once for
    /// all other loops that have subscribers. This loop's subscribers get it once this
    /// handler returns, or — from [`on_message`](Handler::on_message) — once the messages of
    /// the same read have been handled (at most 64 publishes wait; this connection's direct
    /// replies go first); either way, exactly the connections subscribed when it was
    /// published. With no subscriber anywhere it costs no pool memory.
    pub fn publish(&mut self, topic: &str, kind: MessageKind, payload: &[u8]) -> Published {
        self.topics.publish(self.hub, self.cx.pool, self.outbox, topic, kind, payload, None)
    }

    /// Sends this connection what it missed on `topic` after the offset `since` (see
    /// [`history`](crate::history)), each message in its envelope, in offset order; call it
    /// right after [`subscribe`](Self::subscribe). `false` if the topic's history no longer
    /// holds all of it, or the send queue could not take it all: close the connection with
    /// [`HISTORY_GONE`](crate::history::HISTORY_GONE). A topic without history has nothing to
    /// recover. Live publications of the topic that the replay already sent are not sent
    /// again: each offset arrives once. The replay is kept from the slow-consumer policy: a
    /// publication arriving behind it never drops or conflates it (the policy acts on what
    /// follows it), and a pool that needs its memory back closes the connection with 1013,
    /// so that the client resumes from what it received.
    pub fn recover(&mut self, topic: &str, since: &str) -> bool {
        let Replay::Missed(missed, through) = self.hub.recover(topic, since) else {
            return false;
        };
        let events = self.session.is_event_stream();
        let resumes = events && self.first_topic().is_some_and(|first| *first == *topic);
        // Into the queue, where it can be kept, behind what the cork holds.
        self.session.spill_cork(&mut self.cx);
        let cork = self.cx.cork.take();
        let sent = missed.iter().all(|(kind, data)| {
            let outcome = match events {
                false => self.send(*kind, data),
                // An event stream's replay is framed as its live events are: the offset is
                // the `id:` (of the topic a reconnect resumes), the topic its `event:`.
                true => {
                    let (offset, payload) = crate::history::split_envelope(data);
                    let id = offset.filter(|_| resumes);
                    let sent =
                        self.session.send_event(&mut self.cx, id, Some(topic), *kind, payload);
                    match sent {
                        Some(outcome) => self.count_send(outcome),
                        None => SendOutcome::Closed,
                    }
                }
            };
            self.session.keep_queued();
            matches!(
                outcome,
                SendOutcome::Queue(PushOutcome::Queued | PushOutcome::QueuedAboveHigh)
            )
        });
        self.cx.cork = cork;
        // What the replay sent may be in the loop's inbox too, on its way live: each offset
        // is sent once.
        sent && through.is_none_or(|through| self.topics.resumed(self.token, topic, through))
    }
}

/// Routes requests by path (the part before `?`): WebSocket upgrades to handlers, and plain
/// HTTP requests to the [`HttpRoute`]s the application opted into. Everything else gets 404
/// (426 for a plain request to a WebSocket route).
///
/// ```
/// use freeboard::{Echo, HttpRoute, Router};
///
/// let router = Router::new()
///     .route("/echo", Echo)
///     .http("/healthz", HttpRoute::Health)
///     .http("/metrics", HttpRoute::Metrics);
/// # let _ = router;
/// ```
pub struct Router {
    routes: Vec<Route>,
    http: Vec<(String, HttpRoute)>,
    publish_access: Option<Arc<dyn PublishAccess>>,
}

/// Who may `POST` to [`HttpRoute::Publish`] besides the holder of
/// [`TopicsConfig::publish_token`](crate::config::TopicsConfig::publish_token): the `/topic/`
/// service of `freeboard-topics` plugs its JWT verifier in here, so that a server whose
/// subscribers need a token does not take publications from anyone. Set with
/// [`Router::publish_access`]; without it, publishing needs the publish token if one is set,
/// and nothing otherwise.
pub trait PublishAccess: Send + Sync + 'static {
    /// Decides a `POST` that carries the bearer token `bearer` (`None`: no `Authorization`)
    /// and not the publish token: a grant (asked about each topic published to), or a
    /// refusal.
    fn authorize(&self, bearer: Option<&str>) -> Result<Box<dyn PublishGrant>, PublishRefusal>;
}

/// The topics a `POST` that [`PublishAccess`] let through may publish to.
pub trait PublishGrant: Send + Sync {
    /// Whether the publication may go to `topic` (403 otherwise).
    fn may_publish(&self, topic: &str) -> bool;
}

/// A `POST` that [`PublishAccess`] refused: its status (401 gets a `WWW-Authenticate:
/// Bearer` challenge), the reason counted in `freeboard_access_refusals_total{reason}`, and
/// what the response body says.
#[derive(Debug, Clone)]
pub struct PublishRefusal {
    /// The HTTP status: 401 (no valid credential) or 403 (not allowed).
    pub status: u16,
    /// The `reason` label.
    pub reason: &'static str,
    /// A sentence for the publisher.
    pub why: String,
}

/// A plain HTTP endpoint the server answers itself, beside the WebSocket routes. None is
/// served unless a [`Router`] asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HttpRoute {
    /// `GET` answers `200 ok`: a liveness probe.
    Health,
    /// `GET` answers the server's metrics as OpenMetrics text
    /// ([`metrics::CONTENT_TYPE`](crate::metrics::CONTENT_TYPE)), rebuilt at most every
    /// [`ADMIN_REFRESH`](crate::metrics::ADMIN_REFRESH). An admin route.
    Metrics,
    /// A prefix: `POST {path}{topic}` publishes its body to `topic` (text when the
    /// `Content-Type` is `text/*`, `application/json` or `application/*+json`, else binary),
    /// behind the bearer token of
    /// [`TopicsConfig::publish_token`](crate::config::TopicsConfig::publish_token) when one is
    /// set (or a credential [`Router::publish_access`] accepts), and answers what the publish
    /// reached. A browser's request from another origin is refused (403) unless
    /// [`TopicsConfig::cors_origins`](crate::config::TopicsConfig::cors_origins) allows it.
    Publish,
    /// `GET` answers the live dashboard page (mount it with [`Router::dashboard`], which also
    /// adds the WebSocket the page reads from). An admin route.
    Dashboard,
    /// `GET` answers the topics the operator named for per-topic figures, as JSON
    /// ([`Metrics::topics_json`](crate::Metrics::topics_json)); [`Router::dashboard`] mounts it
    /// at `{path}/topics`. An admin route.
    Topics,
    /// `GET` answers the slowest subscribers and the lag distribution, as JSON
    /// ([`Metrics::slowest_json`](crate::Metrics::slowest_json); `?n=` of them, default 10, at
    /// most 100); [`Router::dashboard`] mounts it at `{path}/slowest`. An admin route.
    Slowest,
    /// `GET ?id=ID` answers one connection among the slowest, as JSON
    /// ([`Metrics::connection_json`](crate::Metrics::connection_json)), or 404 when no loop's
    /// last sweep counted it among its slowest; [`Router::dashboard`] mounts it at
    /// `{path}/connection`. An admin route.
    Connection,
    /// `GET` answers a fixed file: `body` as `content_type`, readable from any origin
    /// (`Access-Control-Allow-Origin: *`), so that a page elsewhere may import it (the
    /// browser module `freeboard serve` serves at `/js/freeboard.js`).
    File {
        /// The `Content-Type`.
        content_type: &'static str,
        /// The bytes.
        body: &'static [u8],
    },
}

impl HttpRoute {
    /// Whether it is an admin route, served only to the clients
    /// [`ServerConfig::admin`](crate::ServerConfig::admin) allows.
    pub fn is_admin(self) -> bool {
        matches!(
            self,
            Self::Metrics | Self::Dashboard | Self::Topics | Self::Slowest | Self::Connection
        )
    }
}

struct Route {
    path: String,
    options: RouteOptions,
    handler: Box<dyn Handler>,
}

impl Router {
    /// A router without routes.
    pub fn new() -> Self {
        Self { routes: Vec::new(), http: Vec::new(), publish_access: None }
    }

    /// Who besides the publish token's holder may `POST` to [`HttpRoute::Publish`].
    pub fn publish_access(mut self, access: Arc<dyn PublishAccess>) -> Self {
        self.publish_access = Some(access);
        self
    }

    /// Whether the loops keep the dashboard's last minutes (a router that serves it).
    pub(crate) fn keeps_dashboard_samples(&self) -> bool {
        self.http.iter().any(|(_, route)| *route == HttpRoute::Dashboard)
    }

    /// Whether the loops sweep their subscribers' lag (a router that serves `/metrics` or the
    /// dashboard).
    pub(crate) fn serves_admin_views(&self) -> bool {
        self.http.iter().any(|(_, route)| route.is_admin())
    }

    /// The publish access set with [`publish_access`](Self::publish_access).
    pub(crate) fn publisher_access(&self) -> Option<&Arc<dyn PublishAccess>> {
        self.publish_access.as_ref()
    }

    /// Adds `handler` at `path` (exact match), with the server's send-queue settings.
    pub fn route(self, path: &str, handler: impl Handler) -> Self {
        self.route_with(path, handler, RouteOptions::new())
    }

    /// Adds `handler` at `path` with its own options (a prefix match, a slow-consumer policy,
    /// watermarks). Exact routes win over prefix routes; among prefixes the first added wins.
    pub fn route_with(mut self, path: &str, handler: impl Handler, options: RouteOptions) -> Self {
        self.routes.push(Route { path: path.to_owned(), options, handler: Box::new(handler) });
        self
    }

    /// Serves the plain HTTP endpoint `route` at `path` (exact, or a prefix for
    /// [`HttpRoute::Publish`]).
    pub fn http(mut self, path: &str, route: HttpRoute) -> Self {
        self.http.push((path.to_owned(), route));
        self
    }

    /// The plain HTTP endpoint for `path`, and the rest of the path after a prefix.
    pub(crate) fn find_http<'p>(&self, path: &'p str) -> Option<(HttpRoute, &'p str)> {
        self.http.iter().find_map(|(at, route)| match route {
            HttpRoute::Publish => path.strip_prefix(at.as_str()).map(|rest| (*route, rest)),
            _ => (path == at).then_some((*route, "")),
        })
    }

    /// The index of the route for `target` (path and query).
    pub(crate) fn find(&self, target: &str) -> Option<usize> {
        let path = target.split('?').next().unwrap_or(target);
        self.routes.iter().position(|r| !r.options.prefix && r.path == path).or_else(|| {
            self.routes.iter().position(|r| r.options.prefix && path.starts_with(&r.path))
        })
    }

    pub(crate) fn handler(&mut self, route: usize) -> &mut dyn Handler {
        &mut *self.routes[route].handler
    }

    pub(crate) fn options(&self, route: usize) -> &RouteOptions {
        &self.routes[route].options
    }

    /// The path route `route` was mounted at.
    pub(crate) fn path(&self, route: usize) -> &str {
        &self.routes[route].path
    }

    /// Refuses routes that compress ([`RouteOptions::compression`]) in a build without
    /// permessage-deflate: one loop's router is built to look (in such a build only).
    pub(crate) fn check_features(routes: &dyn Fn() -> Router) -> Result<(), MissingFeature> {
        if crate::features::DEFLATE {
            return Ok(());
        }
        routes().check_compression()
    }

    /// [`check_features`](Self::check_features) of this router.
    pub(crate) fn check_compression(&self) -> Result<(), MissingFeature> {
        if crate::features::DEFLATE {
            return Ok(());
        }
        let compresses = |mode: &crate::Compression| *mode != crate::Compression::Off;
        match self.routes.iter().any(|r| r.options.compression.as_ref().is_some_and(compresses)) {
            true => Err(MissingFeature { setting: "a route's compression", feature: "deflate" }),
            false => Ok(()),
        }
    }
}

/// How a route matches and the send-queue settings its connections get instead of the
/// server's.
///
/// ```
/// use freeboard::{RouteOptions, SlowConsumerPolicy};
///
/// let options = RouteOptions::new().prefix().slow_consumer(SlowConsumerPolicy::Conflate);
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteOptions {
    /// The route's path is a prefix: `/topic/` matches `/topic/scores`.
    pub prefix: bool,
    /// The slow-consumer policy of the route's connections.
    pub slow_consumer: Option<SlowConsumerPolicy>,
    /// The send-queue watermarks and cap of the route's connections.
    pub watermarks: Option<Watermarks>,
    /// The route's permessage-deflate mode (else the server's).
    pub compression: Option<crate::Compression>,
    /// Under `conflate`, conflate per key (see [`ConflateKey`]).
    pub conflate_key: Option<ConflateKey>,
    /// An admin route: served only to the clients
    /// [`ServerConfig::admin`](crate::ServerConfig::admin) allows (as `/metrics` and the
    /// dashboard are).
    pub admin: bool,
    /// The upgrade subscribes to the topics its target names under the route's path
    /// (`{path}{name}?also=…`, as `freeboard-topics`' route does in
    /// `on_open`): the loop answers 503 instead of its 101 when its budget for topic tables
    /// cannot hold them (counted in `freeboard_topic_refusals_total{reason="budget"}`).
    pub subscribes: bool,
}

impl RouteOptions {
    /// An exact route with the server's send-queue settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Matches every path that starts with the route's.
    pub fn prefix(mut self) -> Self {
        self.prefix = true;
        self
    }

    /// The route's slow-consumer policy.
    pub fn slow_consumer(mut self, policy: SlowConsumerPolicy) -> Self {
        self.slow_consumer = Some(policy);
        self
    }

    /// The route's send-queue watermarks and cap.
    pub fn watermarks(mut self, marks: Watermarks) -> Self {
        self.watermarks = Some(marks);
        self
    }

    /// The route's permessage-deflate mode, in place of
    /// [`ServerConfig::compression`](crate::ServerConfig::compression).
    pub fn compression(mut self, mode: crate::Compression) -> Self {
        self.compression = Some(mode);
        self
    }

    /// Under `conflate`, keeps the latest unsent message per key rather than only the latest.
    pub fn conflate_key(mut self, key: ConflateKey) -> Self {
        self.conflate_key = Some(key);
        self
    }

    /// Makes it an admin route (see [`admin`](Self::admin)).
    pub fn admin(mut self) -> Self {
        self.admin = true;
        self
    }

    /// Its upgrades subscribe to the topics their target names (see
    /// [`subscribes`](Self::subscribes)): refused with 503 when they cannot be held.
    pub fn subscribes(mut self) -> Self {
        self.subscribes = true;
        self
    }
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("routes", &self.routes.iter().map(|r| &r.path).collect::<Vec<_>>())
            .field("http", &self.http)
            .field("publish_access", &self.publish_access.is_some())
            .finish()
    }
}

impl Default for Router {
    fn default() -> Self {
        Self::new()
    }
}

/// Builds one [`Router`] per event loop.
pub type RouterFactory = Arc<dyn Fn() -> Router + Send + Sync>;

/// Echoes every message: text as text, binary as binary.
#[derive(Debug, Default, Clone, Copy)]
pub struct Echo;

impl Handler for Echo {
    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        if let SendOutcome::Queue(PushOutcome::WouldBlock { .. }) =
            conn.send(message.kind, message.data)
        {
            // `block` holds the sender back above the high watermark; a message that still
            // finds no room (pool exhausted, or past the cap) cannot be kept for later, so
            // the sender hears why instead of losing its echo in silence.
            conn.close(CloseCode::TRY_AGAIN_LATER, "send queue full");
        }
    }
}
