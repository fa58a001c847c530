//! The session: one WebSocket connection's message layer, sans-IO.
//!
//! A [`Session`] sits between the protocol core (`freeboard-proto`, which sees frames) and a
//! driver (the server's event loop, the client loop, the blocking client), which moves bytes
//! and time. It owns the core's state, the send queue and the reassembly of messages that
//! arrive in pieces, and it is the only place where frames become messages and messages become
//! frames. It never touches a socket or a clock: the driver hands it read bytes and `now`, and
//! writes what [`io_slices`](Session::io_slices) returns.
//!
//! Call order for a driver, per readiness event:
//! 1. [`receive`](Session::receive) with each read, until the buffer is used up; deliver each
//!    [`Received`] message (an [`Assembled`](Received::Assembled) one is taken with
//!    [`take_message`](Session::take_message));
//! 2. [`poll_close`](Session::poll_close) after input, a timeout or a failed write, to report
//!    the close once;
//! 3. with a [`Cork`] lent in the [`Context`], write what it holds once the read is parsed and
//!    report the count with [`corked_written`](Session::corked_written); then
//!    [`io_slices`](Session::io_slices) and [`consume`](Session::consume) to write the queue;
//!    [`take_writability`](Session::take_writability) to report watermark crossings;
//! 4. [`poll_timeout`](Session::poll_timeout) for the next deadline,
//!    [`handle_timeout`](Session::handle_timeout) when it passes.
//!
//! The server's sessions also live through the HTTP request before the upgrade and the
//! close's drain and linger after it ([`Phase`]); the clients' start open.

use freeboard_buf::{
    ChunkChain, Frame, Limit, Pool, PushOutcome, Pushed, SendQueue, SlowConsumerPolicy, Writability,
};
use freeboard_proto::close::MAX_REASON_LEN;
use freeboard_proto::frame::MAX_HEADER_LEN;
use freeboard_proto::mask::apply_mask;
use freeboard_proto::{
    CloseCode, Connection, Event, Instant, MessageKind, ProtocolError, State, UsageError, Whole,
};

use crate::parking::{ParkingLot, ProtocolState};

mod cork;
pub(crate) mod deflate;
pub(crate) mod event_copies;
pub(crate) mod events;
mod fair_share;
mod framing;
mod inbound;
#[cfg(test)]
mod tests;

pub(crate) use cork::Cork;
pub(crate) use fair_share::FairShare;
use fair_share::Room;
pub(crate) use framing::{MaskSource, queue_control, truncate};
pub(crate) use inbound::{Assembly, Reassembler, Reassembly, Received};

use deflate::{Codec, Deflate};
use events::EventStream;

/// What happened to a message given to a send, on the server
/// ([`Conn::send`](crate::Conn::send)), the clients and the tokio driver alike: the send
/// queue's own answer while the connection is open, or `Closed`.
///
/// ```
/// use freeboard::{PushOutcome, SendOutcome};
///
/// fn must_wait(outcome: SendOutcome) -> bool {
///     matches!(
///         outcome,
///         SendOutcome::Queue(PushOutcome::QueuedAboveHigh | PushOutcome::WouldBlock { .. })
///     )
/// }
/// assert!(!must_wait(SendOutcome::Queue(PushOutcome::Queued)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOutcome {
    /// The send queue's answer ([`PushOutcome`]): `Queued`; `QueuedAboveHigh` (pause until
    /// [`Handler::on_writable`](crate::Handler::on_writable), on a client until
    /// `is_writable`); `Dropped` by the slow-consumer policy; or `WouldBlock`, not queued:
    /// under [`SlowConsumerPolicy::Block`] the queue is at its cap, or the pool is short
    /// through no fault of this connection (counted as `pool_exhausted` under the other
    /// policies) — retry after `on_writable` or a later turn (on a client: after a flush).
    /// Never `MustClose`: the session closes the connection itself and answers `Closed`.
    Queue(PushOutcome),
    /// Not queued: the connection is closing or closed (possibly just now, 1008, by the
    /// `close` policy).
    Closed,
}

impl From<PushOutcome> for SendOutcome {
    fn from(outcome: PushOutcome) -> Self {
        match outcome {
            PushOutcome::MustClose { .. } => Self::Closed,
            outcome => Self::Queue(outcome),
        }
    }
}

/// What a session borrows from its driver for one call: the pool its chunks come from, the
/// parking lot of idle protocol states, the masking keys (clients only) and the time.
pub(crate) struct Context<'a> {
    pub(crate) pool: &'a mut Pool<'static>,
    pub(crate) lot: &'a mut ParkingLot,
    /// `Some` for a client: every frame it sends is masked (§5.3).
    pub(crate) masks: Option<&'a mut MaskSource>,
    pub(crate) limits: &'a Reassembly,
    /// What this connection may take from the pool while it is contended.
    pub(crate) share: &'a FairShare,
    /// The loop's compression (permessage-deflate); `None` where no connection compresses.
    pub(crate) codec: Option<&'a mut Codec>,
    /// The driver's cork, lent while it reads this connection: replies go there while the
    /// queue is empty, and the driver writes it when the read is done (and tells
    /// [`Session::corked_written`] what the socket took).
    pub(crate) cork: Option<&'a mut Cork>,
    pub(crate) now: Instant,
}

/// Where a session stands.
pub(crate) enum Phase {
    /// Waiting for a complete HTTP request (server) until `deadline`; its head bytes so far
    /// wait in the session's `partial` chain.
    Request { deadline: Instant },
    /// Reading the body of a plain HTTP request into `partial`.
    Body(Box<Body>),
    /// A WebSocket connection.
    Open(Open),
    /// A final HTTP response or the close's last frames are leaving; then our FIN. What the
    /// peer sends meanwhile is read and discarded (`discarded` bytes so far).
    Draining { deadline: Instant, discarded: u32 },
    /// Our FIN is sent; reading until the peer's EOF so unread bytes cannot turn our close
    /// into a reset.
    Linger { deadline: Instant, discarded: u32 },
}

/// The state of an open WebSocket connection.
pub(crate) struct Open {
    ws: ProtocolState,
    /// Reading stopped: the send queue is above its high watermark.
    paused: bool,
    /// Reading stopped by the application ([`Session::hold_input`]): its handler cannot take
    /// more messages yet.
    held: bool,
    /// The close has been reported ([`Session::poll_close`]).
    close_reported: bool,
    /// A watermark crossing not yet taken by the driver.
    change: Option<Writability>,
    /// Bytes read since our close frame was queued (saturating), up to
    /// [`READ_AFTER_CLOSE`].
    read_after_close: u32,
}

/// What a peer may still send after our close frame before we stop reading it: what it had
/// in flight when the close left (a large message's rest, then its own close frame). A peer
/// that sends more is not reading what we say; its bytes wait in its socket until the close
/// timeout drops it.
pub(crate) const READ_AFTER_CLOSE: u32 = 1 << 20;

/// A plain HTTP request whose body is still arriving.
pub(crate) struct Body {
    pub(crate) deadline: Instant,
    /// What the body is for: the route's own data.
    pub(crate) topic: Box<str>,
    pub(crate) kind: MessageKind,
    /// Body bytes still to read.
    pub(crate) remaining: usize,
    /// Pool chunks the loop counts this body as holding until it is done.
    pub(crate) reserved: usize,
}

/// The close of a session: its code, its reason (copied, at most 123 bytes), and whether
/// both close frames were exchanged.
#[derive(Clone, Copy)]
pub(crate) struct Closed {
    pub(crate) code: CloseCode,
    pub(crate) clean: bool,
    reason: [u8; MAX_REASON_LEN],
    /// Invariant: `reason[..reason_len]` is UTF-8.
    reason_len: u8,
}

impl Closed {
    /// Takes the core's events; the close, if it is among them. Pings and pongs are answered
    /// by the core and concern no driver.
    pub(crate) fn poll(ws: &mut Connection) -> Option<Self> {
        loop {
            if let Event::Closed { code, reason, clean } = ws.poll_event()? {
                return Some(Self::new(code, reason, clean));
            }
        }
    }

    fn new(code: CloseCode, reason: &str, clean: bool) -> Self {
        let reason = truncate(reason, MAX_REASON_LEN);
        let mut bytes = [0; MAX_REASON_LEN];
        bytes[..reason.len()].copy_from_slice(reason.as_bytes());
        Self { code, clean, reason: bytes, reason_len: reason.len() as u8 }
    }

    /// The close reason.
    pub(crate) fn reason(&self) -> &str {
        // NOTE(unwrap): cut at a character boundary of a `str` in `new`.
        std::str::from_utf8(&self.reason[..usize::from(self.reason_len)]).unwrap_or_default()
    }
}

/// What changed after a flush ([`Session::after_flush`]); both may happen at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Transition {
    /// The close handshake is over: the WebSocket part of the connection is gone (its
    /// subscriptions and its count), its last frames are draining.
    pub(crate) closed: bool,
    /// Everything is out: shut down our writing side, then read until EOF.
    pub(crate) shutdown_write: bool,
}

/// One connection's message layer; see the [module docs](self).
pub(crate) struct Session {
    pub(crate) phase: Phase,
    queue: SendQueue,
    /// A partial request head, a request body, or the message being reassembled. Empty (no
    /// chunk) when idle.
    inbound: Reassembler,
    /// permessage-deflate, or a Server-Sent Events response; boxed and in one field, so a
    /// plain WebSocket session pays one pointer for both.
    encoding: Option<Box<Encoding>>,
}

/// How a session's messages differ from plain WebSocket frames: at most one of these.
/// Heap bytes a Server-Sent Events session may hold beyond its connection's entry: its
/// encoding and, once it has ended, the record of its end (each with the allocator's header).
/// A server charges them to the budget with the connection.
pub(crate) const EVENT_STREAM_STATE: usize =
    size_of::<Encoding>() + size_of::<Closed>() + 2 * size_of::<usize>();

enum Encoding {
    /// permessage-deflate, when the handshake agreed on it.
    Deflate(Deflate),
    /// A Server-Sent Events response rather than a WebSocket: its messages are events
    /// ([`events`]), its input is ignored, its keep-alive is a comment and its close a last
    /// event.
    Events(EventStream),
}

impl Encoding {
    fn deflate(encoding: &Option<Box<Self>>) -> Option<&Deflate> {
        match encoding.as_deref()? {
            Self::Deflate(deflate) => Some(deflate),
            Self::Events(_) => None,
        }
    }

    fn deflate_mut(encoding: &mut Option<Box<Self>>) -> Option<&mut Deflate> {
        match encoding.as_deref_mut()? {
            Self::Deflate(deflate) => Some(deflate),
            Self::Events(_) => None,
        }
    }

    fn events(encoding: &Option<Box<Self>>) -> Option<&EventStream> {
        match encoding.as_deref()? {
            Self::Events(events) => Some(events),
            Self::Deflate(_) => None,
        }
    }

    fn events_mut(encoding: &mut Option<Box<Self>>) -> Option<&mut EventStream> {
        match encoding.as_deref_mut()? {
            Self::Events(events) => Some(events),
            Self::Deflate(_) => None,
        }
    }
}

impl Session {
    /// A server session waiting for its HTTP request until `deadline`.
    pub(crate) fn request(queue: SendQueue, deadline: Instant) -> Self {
        Self::with_phase(Phase::Request { deadline }, queue)
    }

    /// A session whose opening handshake is done.
    pub(crate) fn open(ws: ProtocolState, queue: SendQueue) -> Self {
        Self::with_phase(Phase::Open(Open::new(ws)), queue)
    }

    fn with_phase(phase: Phase, queue: SendQueue) -> Self {
        Self { phase, queue, inbound: Reassembler::default(), encoding: None }
    }

    /// Moves a server session from its request to the WebSocket protocol: the `101` response
    /// goes first as a preamble (no policy may drop it for a message queued after it), then
    /// the connection runs with `queue`'s settings. `Err` if the pool cannot hold the response.
    pub(crate) fn upgrade(
        &mut self,
        pool: &mut Pool<'static>,
        ws: ProtocolState,
        queue: Option<SendQueue>,
        response: &[u8],
    ) -> Result<(), freeboard_buf::Limit> {
        if let Some(queue) = queue {
            // NOTE: nothing has been queued before the 101 response, so the queue is empty.
            debug_assert!(self.queue.is_empty());
            self.queue = queue;
        }
        self.queue.push_preamble(pool, response)?;
        self.phase = Phase::Open(Open::new(ws));
        Ok(())
    }

    /// Makes this open session a Server-Sent Events response (after its `200` went as the
    /// preamble): `several` when it carries several topics, so each event names its own.
    pub(crate) fn set_event_stream(&mut self, several: bool) {
        self.encoding = Some(Box::new(Encoding::Events(EventStream::new(several))));
    }

    /// Whether this session is a Server-Sent Events response.
    pub(crate) fn is_event_stream(&self) -> bool {
        Encoding::events(&self.encoding).is_some()
    }

    /// `Some(several)` for a Server-Sent Events response (`several`: it carries several
    /// topics, so each event names its own), `None` for a WebSocket.
    #[cfg(feature = "tokio")]
    pub(crate) fn event_stream(&self) -> Option<bool> {
        Encoding::events(&self.encoding).map(|events| events.several)
    }

    /// Turns permessage-deflate on for this open session (after the handshake agreed on it).
    pub(crate) fn set_deflate(&mut self, deflate: Deflate) {
        self.encoding = Some(Box::new(Encoding::Deflate(deflate)));
    }

    /// The permessage-deflate parameters agreed, if any.
    pub(crate) fn compression(&self) -> Option<&deflate::Agreement> {
        Encoding::deflate(&self.encoding).map(|d| &d.agreement)
    }

    /// The window of the shared compressed frames this session can take in a topic fan-out
    /// ([`Codec::compress_frame`]): `Some(bits)` when permessage-deflate agreed on no server
    /// context takeover (shared mode, or dedicated with `server_no_context_takeover`). `None`
    /// with server context takeover (a message compressed without our context would leave
    /// the peer's window ahead of ours), without compression, or under a keyed `conflate`
    /// queue (which reads each message's key from its payload); those take the uncompressed
    /// frame.
    pub(crate) fn shared_compression(&self) -> Option<u8> {
        let agreement = &Encoding::deflate(&self.encoding)?.agreement;
        (agreement.server_no_context_takeover && self.queue.conflate_key().is_none())
            .then_some(agreement.server_max_window_bits)
    }

    /// The send queue (watermarks, policy, `bufferedAmount`).
    pub(crate) fn queue(&self) -> &SendQueue {
        &self.queue
    }

    /// The partial request head or body (server, before the upgrade).
    pub(crate) fn partial_mut(&mut self) -> &mut ChunkChain {
        self.inbound.partial_mut()
    }

    /// The protocol state: `Open` until the close starts; a session that is not open reads
    /// as closed.
    pub(crate) fn state(&self) -> State {
        match &self.phase {
            Phase::Open(open) => open.ws.state(),
            _ => State::Closed,
        }
    }

    /// Whether data messages can be sent: open, and no close sent or received.
    pub(crate) fn is_open(&self) -> bool {
        self.state() == State::Open
    }

    /// Whether the driver should read the socket for this session's WebSocket input: open,
    /// not closed, not paused above the high watermark, not held by the application.
    pub(crate) fn wants_input(&self) -> bool {
        matches!(&self.phase, Phase::Open(open) if !open.paused && !open.held && match open.ws.state() {
            State::Open => true,
            State::CloseSent => open.read_after_close < READ_AFTER_CLOSE,
            State::Closed => false,
        })
    }

    /// Whether its input will never be read again: it sent its close and has read what the
    /// peer may still have had in flight ([`READ_AFTER_CLOSE`]). A driver that receives
    /// without being asked stops, as a reader of a socket leaves further bytes in it.
    pub(crate) fn reads_no_more(&self) -> bool {
        matches!(&self.phase, Phase::Open(open)
            if open.ws.state() == State::CloseSent && open.read_after_close >= READ_AFTER_CLOSE)
    }

    /// Stops (`true`) or resumes reading this session's input for its application, whose
    /// handler cannot take more messages yet: the peer then meets TCP's flow control, as a
    /// reader above the high watermark does. Whether the session is open.
    pub(crate) fn hold_input(&mut self, held: bool) -> bool {
        match &mut self.phase {
            Phase::Open(open) => {
                open.held = held;
                true
            }
            _ => false,
        }
    }

    /// Counts `n` bytes read and discarded after our final response or close (draining or
    /// lingering); whether the peer may send more before we stop reading it: what it had in
    /// flight (a refused request's body, a large message's rest), up to [`READ_AFTER_CLOSE`].
    pub(crate) fn count_discarded(&mut self, n: usize) -> bool {
        match &mut self.phase {
            Phase::Draining { discarded, .. } | Phase::Linger { discarded, .. } => {
                *discarded = discarded.saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
                *discarded < READ_AFTER_CLOSE
            }
            _ => false,
        }
    }

    /// Counts `n` bytes read, against [`READ_AFTER_CLOSE`] once our close frame is queued.
    #[inline]
    pub(crate) fn count_read(&mut self, n: usize) {
        if let Phase::Open(open) = &mut self.phase
            && open.ws.state() == State::CloseSent
        {
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            open.read_after_close = open.read_after_close.saturating_add(n);
        }
    }

    /// Feeds read bytes to the core; returns how many it used and the message they
    /// completed, if any. Call again with the rest until the buffer is used up or the session
    /// closes. Control frames the core owes (pongs, close) are queued on the way.
    #[inline]
    pub(crate) fn receive<'b>(
        &mut self,
        cx: &mut Context<'_>,
        buf: &'b mut [u8],
    ) -> (usize, Option<Received<'b>>) {
        let Phase::Open(open) = &mut self.phase else { return (buf.len(), None) };
        if Encoding::events(&self.encoding).is_some() {
            // An event stream's client has nothing to say after its request; what it sends
            // is not WebSocket and is dropped.
            return (buf.len(), None);
        }
        let ws = cx.lot.wake(&mut open.ws);
        // The common message, whole in one frame (never a compressed one: RSV1 is not set).
        let len = buf.len();
        match ws.read_whole(cx.now, buf) {
            Ok(Ok(Whole { consumed, kind, data })) => (consumed, Some(Received::Whole(kind, data))),
            Ok(Err(buf)) => self.receive_other(cx, buf),
            Err(e) => self.protocol_error(cx, len, e),
        }
    }

    /// [`receive`](Self::receive)'s common message alone, for a driver that lends the pool
    /// only when it must (the tokio driver): one unfragmented text or binary frame whole at
    /// the front of `buf`, unmasked and validated in place, on an awake session
    /// ([`wake`](Self::wake)). `None` when the front of `buf` is anything else, the session
    /// is parked, or the core failed the connection on it: call `receive` with the context
    /// then (a failed core owes its close frame, which `receive` queues).
    #[inline]
    #[cfg(feature = "tokio")]
    pub(crate) fn receive_whole<'b>(
        &mut self,
        now: Instant,
        buf: &'b mut [u8],
    ) -> Option<Whole<'b>> {
        let Phase::Open(open) = &mut self.phase else { return None };
        if self.encoding.is_some() {
            return None;
        }
        match open.ws.awake()?.read_whole(now, buf) {
            Ok(Ok(whole)) => Some(whole),
            Ok(Err(_)) => None,
            Err(error) => {
                tracing::debug!(%error, "protocol error");
                None
            }
        }
    }

    /// [`receive`](Self::receive) for anything but the common message: a frame cut by the
    /// read, a fragment, a compressed message, a control frame, an error.
    #[inline(never)]
    fn receive_other<'b>(
        &mut self,
        cx: &mut Context<'_>,
        buf: &'b mut [u8],
    ) -> (usize, Option<Received<'b>>) {
        let Phase::Open(open) = &mut self.phase else { return (buf.len(), None) };
        let ws = cx.lot.wake(&mut open.ws);
        if Encoding::deflate(&self.encoding).is_some() {
            // RFC 7692 §6: RSV1 marks a compressed message's first frame.
            ws.set_allowed_rsv(0b100);
        }
        let len = buf.len();
        let input = match ws.handle_input(cx.now, buf) {
            Ok(input) => input,
            Err(e) => return self.protocol_error(cx, len, e),
        };
        let Some(piece) = input.payload else {
            // A control frame (or the end of one) may have to be answered.
            self.queue_control(cx);
            return (input.consumed, None);
        };
        // Asked only of a message in pieces.
        let (share, queue) = (cx.share, &self.queue);
        let room = |pool: &Pool<'static>| share.reassembly_room(pool, queue);
        let received = match Encoding::deflate_mut(&mut self.encoding) {
            Some(deflate) if piece.compressed => {
                let codec = cx.codec.as_deref_mut();
                let (pool, limits, now) = (&mut *cx.pool, cx.limits, cx.now);
                let inbound = &mut self.inbound;
                deflate::receive(inbound, deflate, codec, pool, limits, room, now, ws, piece)
            }
            _ => self.inbound.piece(cx.pool, cx.limits, room, cx.now, ws, piece),
        };
        // A data piece makes the core owe nothing, unless the message did not fit (or did not
        // inflate) and the session closed.
        if ws.state() != State::Open {
            self.queue_control(cx);
        }
        (input.consumed, received)
    }

    /// The core failed the connection on `len` bytes of input and owes its close frame;
    /// later input is void.
    #[cold]
    fn protocol_error<'b>(
        &mut self,
        cx: &mut Context<'_>,
        len: usize,
        error: ProtocolError,
    ) -> (usize, Option<Received<'b>>) {
        tracing::debug!(%error, "protocol error");
        self.queue_control(cx);
        (len, None)
    }

    /// The message [`receive`](Self::receive) reported as [`Received::Assembled`], as a chain
    /// of pool chunks; the caller releases it.
    pub(crate) fn take_message(&mut self) -> ChunkChain {
        self.inbound.take()
    }

    /// Reports that the peer ended the transport, or that writing to it failed: the
    /// connection is over (1006 unless the close handshake was done).
    pub(crate) fn handle_eof(&mut self, cx: &mut Context<'_>) {
        if let Phase::Open(open) = &mut self.phase {
            let ws = cx.lot.wake(&mut open.ws);
            if let Some(events) = Encoding::events_mut(&mut self.encoding)
                && ws.state() != State::Closed
                && events.closed.is_none()
            {
                // Hanging up is how an event stream's client leaves (`EventSource.close()`).
                let left = Closed::new(CloseCode::GOING_AWAY, "the client left", true);
                events.closed = Some(Box::new(left));
            }
            ws.handle_eof();
        }
    }

    /// Runs the timers due at `cx.now`. Returns `true` when the session's own deadline (the
    /// request, drain or linger phase) has passed: the driver drops the connection.
    pub(crate) fn handle_timeout(&mut self, cx: &mut Context<'_>) -> bool {
        match &mut self.phase {
            Phase::Open(open) => {
                cx.lot.wake(&mut open.ws).handle_timeout(cx.now);
                self.queue_control(cx);
                false
            }
            _ => self.poll_timeout().is_some_and(|at| at <= cx.now),
        }
    }

    /// The next deadline: the phase's, or the core's timers when open.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Request { deadline }
            | Phase::Draining { deadline, .. }
            | Phase::Linger { deadline, .. } => Some(*deadline),
            Phase::Body(body) => Some(body.deadline),
            Phase::Open(open) => open.ws.poll_timeout(),
        }
    }

    /// The close, once, when the core reports it (`None` before, and after it was taken).
    /// Costs a state check until the connection has closed.
    pub(crate) fn poll_close(&mut self) -> Option<Closed> {
        let Phase::Open(open) = &mut self.phase else { return None };
        if open.close_reported || open.ws.state() != State::Closed {
            return None;
        }
        // NOTE: a closed connection is awake (only quiet, open ones park).
        let closed = Closed::poll(open.ws.awake()?)?;
        open.close_reported = true;
        // An event stream's end is its own: the core saw only its transport end.
        let ended = Encoding::events(&self.encoding).and_then(|e| e.closed.as_deref().copied());
        Some(ended.unwrap_or(closed))
    }

    /// Whether the close was reported; a connection dropped before that reports 1006.
    pub(crate) fn close_reported(&self) -> bool {
        matches!(&self.phase, Phase::Open(open) if open.close_reported)
    }

    /// Queues one data message, framed (and masked, for a client) on its way into the cork
    /// (while the queue is empty) or the pool chunks. `None` if the connection is not open;
    /// `MustClose` has closed it with 1008.
    // Always inline: a handler's send is this and a count (one call less per reply).
    #[inline(always)]
    pub(crate) fn send(
        &mut self,
        cx: &mut Context<'_>,
        kind: MessageKind,
        data: &[u8],
    ) -> Option<PushOutcome> {
        if self.encoding.is_some() {
            return self.send_other(cx, kind, data);
        }
        let mask = cx.masks.as_deref_mut().map(MaskSource::next);
        let len = data.len() as u64;
        self.queue_framed(cx, data, mask, |ws, out| ws.message_header(kind, 0, len, mask, out))
    }

    /// [`send`](Self::send)'s common case alone, for a driver that lends the pool only when it
    /// must (the tokio driver): a server's message framed into `cork` while the session is
    /// awake and its queue empty, if the cork stays at or under the high watermark and within
    /// `room` (what [`FairShare::uncontended_room`] said at the driver's last look at the
    /// pool). `None` when any of that does not hold: call `send` with the context then.
    #[inline(always)]
    #[cfg(feature = "tokio")]
    pub(crate) fn send_corked(
        &mut self,
        cork: &mut Cork,
        room: usize,
        kind: MessageKind,
        data: &[u8],
    ) -> Option<PushOutcome> {
        let Phase::Open(open) = &mut self.phase else { return None };
        if self.encoding.is_some() || !self.queue.is_empty() {
            return None;
        }
        let held = cork.len();
        let slot = cork.slot(data.len())?;
        let ws = open.ws.awake()?;
        let n = ws.message_header(kind, 0, data.len() as u64, None, slot).ok()?;
        let corked = held + n + data.len();
        if corked > self.queue.watermarks().high() || corked > room {
            return None;
        }
        cork.commit(n, data);
        Some(PushOutcome::Queued)
    }

    /// [`send`](Self::send) for a connection that compresses or is an event stream, out of
    /// line.
    #[inline(never)]
    fn send_other(
        &mut self,
        cx: &mut Context<'_>,
        kind: MessageKind,
        data: &[u8],
    ) -> Option<PushOutcome> {
        match Encoding::events(&self.encoding) {
            Some(_) => self.send_event(cx, None, None, kind, data),
            None => self.send_compressed(cx, kind, data),
        }
    }

    /// Queues one message of an event stream as an event ([`events::write_event`]): with
    /// `id` and `topic` if given (a replay's), else its data alone. `None` if the session is
    /// not open or not an event stream.
    pub(crate) fn send_event(
        &mut self,
        cx: &mut Context<'_>,
        id: Option<crate::history::Offset>,
        topic: Option<&str>,
        kind: MessageKind,
        data: &[u8],
    ) -> Option<PushOutcome> {
        let several = Encoding::events(&self.encoding)?.several;
        if !self.is_open() {
            return None;
        }
        let mut event = Vec::with_capacity(data.len() + 64);
        events::write_event(&mut event, id, topic.filter(|_| several), kind, data);
        self.spill_cork(cx);
        Some(self.push(cx, event.len(), |queue, pool| queue.push_message(pool, &[&event])))
    }

    /// [`send`](Self::send) for a connection that compresses (plain when the driver lends no
    /// codec).
    fn send_compressed(
        &mut self,
        cx: &mut Context<'_>,
        kind: MessageKind,
        data: &[u8],
    ) -> Option<PushOutcome> {
        let mask = cx.masks.as_deref_mut().map(MaskSource::next);
        let compressed = match (Encoding::deflate_mut(&mut self.encoding), cx.codec.as_deref_mut())
        {
            (Some(deflate), Some(codec)) => deflate.compress(cx.pool, codec, data),
            _ => None,
        };
        // RFC 7692 §6: RSV1 marks a compressed message's first frame.
        let (data, rsv) = compressed.as_deref().map_or((data, 0), |c| (c, 0b100));
        let len = data.len() as u64;
        let outcome = self.queue_framed(cx, data, mask, |ws, out| {
            ws.set_allowed_rsv(0b100);
            ws.message_header(kind, rsv, len, mask, out)
        });
        if let (Some(scratch), Some(codec)) = (compressed, cx.codec.as_deref_mut()) {
            codec.put_scratch(scratch);
        }
        outcome
    }

    /// Queues a data message, the header `frame` writes then `data` masked with `mask` (a
    /// client's): framed straight into the driver's cork while the queue is empty, else into
    /// pool chunks. `None` if the connection is not open or `frame` refuses the message.
    // Always inline, as the core's `Connection::read_whole`: then the common reply's header
    // and outcome need not pass through memory.
    #[inline(always)]
    fn queue_framed(
        &mut self,
        cx: &mut Context<'_>,
        data: &[u8],
        mask: Option<[u8; 4]>,
        frame: impl FnOnce(&mut Connection, &mut [u8; MAX_HEADER_LEN]) -> Result<usize, UsageError>,
    ) -> Option<PushOutcome> {
        let Phase::Open(open) = &mut self.phase else { return None };
        let ws = cx.lot.wake(&mut open.ws);
        let mut header = [0; MAX_HEADER_LEN];
        // A server's frames are not masked: only a server lends a cork.
        if let Some(cork) = cx.cork.as_deref_mut()
            && mask.is_none()
            && self.queue.is_empty()
            && let held = cork.len()
            && let Some(slot) = cork.slot(data.len())
        {
            // The common case: the queue is empty and the pool is not contended, so the reply
            // joins the cork, which stays at or under the high watermark (corked bytes count
            // as buffered: a producer hears `QueuedAboveHigh` exactly as without a cork);
            // nothing is decided per message but room.
            let n = frame(ws, slot).ok()?;
            let corked = held + n + data.len();
            if corked <= self.queue.watermarks().high() && cx.share.uncontended(cx.pool, corked) {
                cork.commit(n, data);
                return Some(PushOutcome::Queued);
            }
            header = *slot;
            return Some(self.queue_chunks(cx, &header, n, data, mask));
        }
        let n = frame(ws, &mut header).ok()?;
        Some(self.queue_chunks(cx, &header, n, data, mask))
    }

    /// [`queue_framed`](Self::queue_framed) into pool chunks, after what the cork holds.
    #[inline(never)]
    fn queue_chunks(
        &mut self,
        cx: &mut Context<'_>,
        header: &[u8; MAX_HEADER_LEN],
        n: usize,
        data: &[u8],
        mask: Option<[u8; 4]>,
    ) -> PushOutcome {
        self.spill_cork(cx);
        let bytes = n + data.len();
        self.push(cx, bytes, |queue, pool| match mask {
            None => queue.push_message(pool, &[&header[..n], data]),
            Some(mask) => queue.push_message_with(pool, &header[..n], data, |dst, src, offset| {
                dst.copy_from_slice(src);
                apply_mask(dst, mask, offset);
            }),
        })
    }

    /// Queues a published frame by reference (server only: published frames are unmasked).
    pub(crate) fn send_frame(
        &mut self,
        cx: &mut Context<'_>,
        frame: &Frame,
    ) -> Option<PushOutcome> {
        if !self.is_open() {
            return None;
        }
        self.spill_cork(cx);
        Some(self.push(cx, frame.len(), |queue, pool| queue.push_frame(pool, frame)))
    }

    /// Whether messages of `bytes` in all would be queued as they are, none dropped or refused:
    /// under the queue's cap, and within what the pool's [`FairShare`] lets it take. A driver may
    /// write such messages straight to the socket while the queue is empty — what the socket
    /// does not take then goes in the queue with [`send_frame_rest`](Self::send_frame_rest),
    /// which cannot refuse it.
    pub(crate) fn takes_whole(&self, cx: &Context<'_>, bytes: usize) -> bool {
        self.queue.len() + bytes <= self.queue.watermarks().cap()
            && cx.share.judge(cx.pool, &self.queue, bytes) == Room::Fits
    }

    /// [`send_frame`](Self::send_frame) for a frame of which the socket already took the first
    /// `written` bytes, written straight from a fan-out while the queue was empty: the rest
    /// goes first in the queue, in flight, whatever the policy or the pool's share say (the
    /// message was accepted when its first byte went). `None` if the session is not open, or
    /// if the pool has no segment slot for the rest: the stream would be torn, so the
    /// connection is over.
    pub(crate) fn send_frame_rest(
        &mut self,
        cx: &mut Context<'_>,
        frame: &Frame,
        written: usize,
    ) -> Option<PushOutcome> {
        if !self.is_open() {
            return None;
        }
        match self.queue.push_frame_rest(cx.pool, frame, written) {
            Ok(change) => {
                self.note(change);
                let above = self.queue.len() > self.queue.watermarks().high();
                Some(if above { PushOutcome::QueuedAboveHigh } else { PushOutcome::Queued })
            }
            Err(_) => {
                self.tear_down(cx);
                None
            }
        }
    }

    /// Pushes a message of `bytes` as the pool's [`FairShare`] allows, notes what it did to the
    /// watermarks, and closes with 1008 when the `close` policy says this peer cannot keep
    /// up.
    #[inline]
    fn push(
        &mut self,
        cx: &mut Context<'_>,
        bytes: usize,
        push: impl FnOnce(&mut SendQueue, &mut Pool<'static>) -> Pushed,
    ) -> PushOutcome {
        let refused =
            |limit| Pushed { outcome: PushOutcome::WouldBlock { limit }, writability: None };
        let pushed = match cx.share.judge(cx.pool, &self.queue, bytes) {
            Room::Fits => push(&mut self.queue, cx.pool),
            Room::Exhausted => refused(Limit::Pool),
            // Behind and past its share: its own policy acts, as at its cap.
            Room::Culprit => match self.queue.policy() {
                // What it holds was asked for whole (a replay): rather than cut it, close, so
                // that the client resumes from the last offset it has.
                SlowConsumerPolicy::DropOldest | SlowConsumerPolicy::Conflate
                    if self.queue.kept() > 0 =>
                {
                    let _ = self.close(cx, CloseCode::TRY_AGAIN_LATER, "server memory short");
                    Pushed {
                        outcome: PushOutcome::MustClose { limit: Limit::Pool, messages: 1 },
                        writability: None,
                    }
                }
                SlowConsumerPolicy::Block => refused(Limit::Pool),
                SlowConsumerPolicy::Close => Pushed {
                    outcome: PushOutcome::MustClose { limit: Limit::Pool, messages: 1 },
                    writability: None,
                },
                SlowConsumerPolicy::DropNewest => Pushed {
                    outcome: PushOutcome::Dropped { newest: true, messages: 1, bytes },
                    writability: None,
                },
                SlowConsumerPolicy::DropOldest | SlowConsumerPolicy::Conflate => {
                    let gone = self.queue.discard_unsent(cx.pool);
                    self.note(gone.writability);
                    let pushed = push(&mut self.queue, cx.pool);
                    let (newest, messages, dropped) = match pushed.outcome {
                        PushOutcome::Queued | PushOutcome::QueuedAboveHigh => (false, 0, 0),
                        _ => (true, 1, bytes),
                    };
                    let outcome = PushOutcome::Dropped {
                        newest,
                        messages: gone.messages + messages,
                        bytes: gone.bytes + dropped,
                    };
                    Pushed { outcome, writability: pushed.writability }
                }
            },
        };
        self.note(pushed.writability);
        match pushed.outcome {
            // The pool ran out under a queue that keeps up: not a slow consumer.
            PushOutcome::MustClose { limit: Limit::Pool, .. } if self.queue.is_writable() => {
                PushOutcome::WouldBlock { limit: Limit::Pool }
            }
            PushOutcome::MustClose { limit, messages } => {
                PushOutcome::MustClose { limit, messages: messages + self.shed(cx) }
            }
            outcome => outcome,
        }
    }

    /// Ends a message in pieces that holds more than what is left of its connection's share
    /// of a contended pool ([`FairShare::reassembly_room`]), with the reassembly limits' code
    /// (1013), as its next piece would. Shares shrink as connections open: what a sender took
    /// when few were open is charged now, before a reply to a connection that keeps up finds
    /// the pool short. Whether it did.
    pub(crate) fn reclaim_reassembly(&mut self, cx: &mut Context<'_>) -> bool {
        let Phase::Open(open) = &mut self.phase else { return false };
        if !self.inbound.holds_more_than(cx.share.reassembly_room(cx.pool, &self.queue)) {
            return false;
        }
        self.inbound.abandon(cx.pool);
        let _ = cx.lot.wake(&mut open.ws).close(cx.now, cx.limits.code, cx.limits.reason);
        self.queue_control(cx);
        true
    }

    /// Applies this connection's policy to what it already holds when it is past its share of
    /// a contended pool ([`FairShare::over_share`]): `close` ends it — 1008 if it is behind,
    /// else 1013 (the pool is tight, it may be reading) — and `drop_oldest`/`conflate` discard
    /// its unsent messages, or close it with 1013 if some were kept from the policy (a replay,
    /// which the client then resumes); `drop_newest` and `block` keep what they queued.
    /// `need`: slots a fan-out is about to take ([`FairShare::over_share`]). Returns what was
    /// done, or `None`.
    pub(crate) fn reclaim(&mut self, cx: &mut Context<'_>, need: usize) -> Option<PushOutcome> {
        if !matches!(self.phase, Phase::Open(_)) || !cx.share.over_share(cx.pool, &self.queue, need)
        {
            return None;
        }
        let policy = self.queue.policy();
        if matches!(policy, SlowConsumerPolicy::Block | SlowConsumerPolicy::DropNewest) {
            return None;
        }
        let behind = !self.queue.is_writable();
        let kept = self.queue.kept() > 0;
        let gone = self.queue.discard_unsent(cx.pool);
        self.note(gone.writability);
        if policy == SlowConsumerPolicy::Close || kept {
            let _ = if behind && policy == SlowConsumerPolicy::Close {
                self.close(cx, CloseCode::POLICY_VIOLATION, "slow consumer")
            } else {
                self.close(cx, CloseCode::TRY_AGAIN_LATER, "server memory short")
            };
            return Some(PushOutcome::MustClose { limit: Limit::Pool, messages: gone.messages });
        }
        Some(PushOutcome::Dropped { newest: false, messages: gone.messages, bytes: gone.bytes })
    }

    /// Ends a slow consumer as the `close` policy does: its unsent messages go, and it closes
    /// with 1008. At its cap, and when its socket's buffers pass their share of a contended
    /// pool (`server/kernel_buffers.rs`). Returns the messages discarded.
    pub(crate) fn shed(&mut self, cx: &mut Context<'_>) -> u32 {
        let gone = self.queue.discard_unsent(cx.pool);
        self.note(gone.writability);
        let _ = self.close(cx, CloseCode::POLICY_VIOLATION, "slow consumer");
        gone.messages
    }

    /// Starts the close handshake with `code` and `reason` (at most 123 bytes). Does nothing
    /// if the session is not open; the core refuses a code that may not be sent, or a second
    /// close.
    pub(crate) fn close(
        &mut self,
        cx: &mut Context<'_>,
        code: CloseCode,
        reason: &str,
    ) -> Result<(), UsageError> {
        let Phase::Open(open) = &mut self.phase else { return Ok(()) };
        let closed = cx.lot.wake(&mut open.ws).close(cx.now, code, reason);
        self.queue_control(cx);
        closed
    }

    /// Queues a final HTTP response (or the bytes of a refusal) and moves to draining until
    /// `deadline`. `Err` gives the bytes back when the pool cannot hold them.
    pub(crate) fn respond_final<'p>(
        &mut self,
        pool: &mut Pool<'static>,
        parts: &'p [&'p [u8]],
        deadline: Instant,
    ) -> Result<(), &'p [&'p [u8]]> {
        let pushed = self.queue.push_message(pool, parts);
        self.phase = Phase::Draining { deadline, discarded: 0 };
        match pushed.outcome {
            PushOutcome::Queued | PushOutcome::QueuedAboveHigh => Ok(()),
            _ => Err(parts),
        }
    }

    /// Queues the control frames the core owes. A peer that floods pings and reads nothing
    /// pauses its own input like any other reader that falls behind.
    fn queue_control(&mut self, cx: &mut Context<'_>) {
        let Phase::Open(open) = &mut self.phase else { return };
        let Some(ws) = open.ws.awake() else { return };
        if !ws.wants_transmit() {
            return;
        }
        if Encoding::events(&self.encoding).is_some() {
            return self.queue_event_control(cx);
        }
        if let Some(cork) = cx.cork.as_deref_mut()
            && !cork.is_empty()
        {
            match cork.spill(&mut self.queue, cx.pool, 0) {
                Ok(change) => {
                    if let Some(change) = change {
                        open.change = Some(change);
                        open.paused = change == Writability::NotWritable;
                    }
                }
                Err(_) => {
                    // The replies already promised cannot be kept: the connection is over.
                    ws.handle_eof();
                    return;
                }
            }
        }
        match queue_control(ws, &mut self.queue, cx.pool, cx.masks.as_deref_mut()) {
            Ok(change) => self.note(change),
            // No room even past the cap: the peer is not reading, the connection is over.
            Err(_) => ws.handle_eof(),
        }
    }

    /// [`queue_control`](Self::queue_control) for an event stream: its keep-alive ping is a
    /// comment that needs no answer, and its close is its last event, after which the
    /// stream ends (there is no close frame to wait for).
    #[cold]
    fn queue_event_control(&mut self, cx: &mut Context<'_>) {
        self.spill_cork(cx);
        let Phase::Open(open) = &mut self.phase else { return };
        let Some(ws) = open.ws.awake() else { return };
        let mut out = [0u8; freeboard_buf::MAX_CONTROL_FRAME];
        while let Ok(Some(n)) = ws.poll_transmit(None, &mut out) {
            const PING: u8 = 0x89;
            const CLOSE: u8 = 0x88;
            let (change, close) = match out[0] {
                PING => {
                    ws.keep_alive_unanswered(cx.now);
                    (self.queue.push_control(cx.pool, &[events::KEEP_ALIVE]), None)
                }
                CLOSE => {
                    let payload = &out[2..n];
                    let code = match payload {
                        [a, b, ..] => CloseCode(u16::from_be_bytes([*a, *b])),
                        _ => CloseCode::NORMAL,
                    };
                    let reason = std::str::from_utf8(payload.get(2..).unwrap_or_default());
                    let closed = Closed::new(code, reason.unwrap_or_default(), true);
                    let mut end = Vec::with_capacity(freeboard_buf::MAX_CONTROL_FRAME);
                    let room = freeboard_buf::MAX_CONTROL_FRAME - events::END_OVERHEAD;
                    events::write_end(&mut end, code, truncate(closed.reason(), room));
                    // The last event may pass the cap as a close frame may.
                    (self.queue.push_control(cx.pool, &[&end]), Some(closed))
                }
                _ => continue, // a pong: never owed, since no input is read
            };
            match change {
                Ok(change) => {
                    if let Some(change) = change {
                        open.change = Some(change);
                        open.paused = change == Writability::NotWritable;
                    }
                }
                Err(_) => {
                    ws.handle_eof();
                    return;
                }
            }
            if let Some(closed) = close {
                // Nothing comes back on an event stream: it is over once the event is out.
                if let Some(events) = Encoding::events_mut(&mut self.encoding) {
                    events.closed = Some(Box::new(closed));
                }
                ws.handle_eof();
                return;
            }
        }
    }

    /// The queued bytes as slices for one `writev`.
    pub(crate) fn io_slices<'p>(
        &self,
        pool: &'p Pool<'static>,
        out: &mut [std::io::IoSlice<'p>],
    ) -> usize {
        self.queue.io_slices(pool, out)
    }

    /// Bytes queued and not yet written (`bufferedAmount`), the corked ones not included.
    pub(crate) fn buffered(&self) -> usize {
        self.queue.len()
    }

    /// After the driver wrote what `cork` holds for this session (one call, `written`): moves
    /// what the socket did not take into the queue and empties the cork. `Err` when the write
    /// failed, or when the pool cannot hold the rest (the stream would be torn): the
    /// connection is over.
    pub(crate) fn corked_written(
        &mut self,
        cork: &mut Cork,
        pool: &mut Pool<'static>,
        written: std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        let written = match written {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
            Err(e) => {
                cork.clear();
                return Err(e);
            }
        };
        match cork.spill(&mut self.queue, pool, written) {
            Ok(change) => {
                self.note(change);
                Ok(written)
            }
            Err(_) => Err(std::io::Error::other("pool exhausted spilling the cork")),
        }
    }

    /// Whether the driver should write `cork` before this session parses `unread`, the rest
    /// of its read ([`Cork::must_write`]).
    pub(crate) fn cork_must_write(&self, cork: &Cork, unread: &[u8]) -> bool {
        cork.must_write(self.queue.watermarks().high(), unread)
    }

    /// Moves what the cork holds into the queue before anything else is queued after it.
    pub(crate) fn spill_cork(&mut self, cx: &mut Context<'_>) {
        let Some(cork) = cx.cork.as_deref_mut() else { return };
        if cork.is_empty() {
            return;
        }
        match cork.spill(&mut self.queue, cx.pool, 0) {
            Ok(change) => self.note(change),
            // The replies already promised cannot be kept.
            Err(_) => self.tear_down(cx),
        }
    }

    /// Ends a connection whose stream cannot go on whole: it is over, as at the end of input.
    fn tear_down(&mut self, cx: &mut Context<'_>) {
        if let Phase::Open(open) = &mut self.phase {
            cx.lot.wake(&mut open.ws).handle_eof();
        }
    }

    /// Keeps every message queued now from the policy ([`SendQueue::keep_queued`]).
    pub(crate) fn keep_queued(&mut self) {
        self.queue.keep_queued();
    }

    /// Releases `n` written bytes.
    pub(crate) fn consume(&mut self, pool: &mut Pool<'static>, n: usize) {
        let change = self.queue.consume(pool, n);
        self.note(change);
    }

    /// The last watermark crossing since the previous call. `Writable` also resumes reading.
    pub(crate) fn take_writability(&mut self) -> Option<Writability> {
        match &mut self.phase {
            Phase::Open(open) => open.change.take(),
            _ => None,
        }
    }

    /// Whether a watermark crossing waits for [`take_writability`](Self::take_writability).
    pub(crate) fn has_writability_change(&self) -> bool {
        matches!(&self.phase, Phase::Open(open) if open.change.is_some())
    }

    /// Records a watermark crossing (only an open connection has anyone to tell).
    fn note(&mut self, change: Option<Writability>) {
        if let (Some(change), Phase::Open(open)) = (change, &mut self.phase) {
            open.change = Some(change);
            open.paused = change == Writability::NotWritable;
        }
    }

    /// After a flush: a closed connection starts draining what is queued (for at most
    /// `close_timeout`: a peer that stopped reading cannot hold its chunks for ever), and a
    /// drained one shuts down its side (the server closes TCP first, §7.1.1) and lingers.
    pub(crate) fn after_flush(
        &mut self,
        pool: &mut Pool<'static>,
        now: Instant,
        close_timeout: core::time::Duration,
        linger: core::time::Duration,
    ) -> Transition {
        let mut transition = Transition::default();
        if let Phase::Open(open) = &self.phase
            && open.ws.state() == State::Closed
        {
            self.inbound.clear(pool);
            self.phase = Phase::Draining { deadline: now + close_timeout, discarded: 0 };
            transition.closed = true;
        }
        if let Phase::Draining { discarded, .. } = self.phase
            && self.queue.is_empty()
        {
            self.phase = Phase::Linger { deadline: now + linger, discarded };
            transition.shutdown_write = true;
        }
        transition
    }

    /// Wakes the protocol state, if parked: before input arrives for the common paths that
    /// take no [`Context`] ([`receive_whole`](Self::receive_whole),
    /// [`send_corked`](Self::send_corked)).
    #[cfg(feature = "tokio")]
    pub(crate) fn wake(&mut self, lot: &mut ParkingLot) {
        if let Phase::Open(open) = &mut self.phase {
            lot.wake(&mut open.ws);
        }
    }

    /// Parks the protocol state if nothing is in flight (server: an idle connection keeps 24
    /// bytes of it).
    pub(crate) fn park(&mut self, lot: &mut ParkingLot) {
        let Phase::Open(open) = &mut self.phase else { return };
        if let Some(ws) = open.ws.awake()
            && ws.state() == State::Open
        {
            // Pings and pongs were answered by the core; their events concern no driver, and
            // a pending one would keep the connection awake.
            while ws.poll_event().is_some() {}
        }
        lot.park(&mut open.ws);
    }

    /// Gives every chunk back to the pool; the data messages its queue still held (sent in
    /// part or not at all), which the peer will never get.
    pub(crate) fn release(&mut self, pool: &mut Pool<'static>) -> u32 {
        let lost = self.clear_queue(pool);
        self.inbound.clear(pool);
        if let Some(deflate) = Encoding::deflate_mut(&mut self.encoding) {
            deflate.release(pool);
        }
        lost
    }

    /// Drops everything queued, in flight or not: the transport is gone. Returns the data
    /// messages it held.
    pub(crate) fn clear_queue(&mut self, pool: &mut Pool<'static>) -> u32 {
        self.queue.clear(pool).messages
    }
}

impl Open {
    fn new(ws: ProtocolState) -> Self {
        Self {
            ws,
            paused: false,
            held: false,
            close_reported: false,
            change: None,
            read_after_close: 0,
        }
    }
}
