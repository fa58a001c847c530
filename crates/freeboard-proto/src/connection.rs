//! The per-connection state machine.

use core::fmt;

use crate::close::{self, MAX_REASON_LEN};
use crate::frame::{FrameHeader, MAX_CONTROL_PAYLOAD, MAX_HEADER_LEN};
use crate::mask::apply_mask;
use crate::timer::TimerTable;
use crate::utf8::Utf8Validator;
use crate::{
    CloseCode, Config, Instant, InsufficientSize, OpCode, ProtocolError, Timer, UsageError,
};

/// Which end of the connection this is; it decides the masking direction (§5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Receives masked frames, sends unmasked ones.
    Server,
    /// Receives unmasked frames, sends masked ones.
    Client,
}

/// Where the close handshake stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Data flows both ways.
    Open,
    /// Our close frame is queued or sent; the peer's has not arrived. Input is still read.
    CloseSent,
    /// The close handshake is over, failed or timed out. No more input is read; once
    /// [`Connection::poll_transmit`] returns `None`, close the transport.
    Closed,
}

/// The type of a data message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// UTF-8 text, validated by the core.
    Text,
    /// Arbitrary bytes.
    Binary,
}

/// A piece of a data message, borrowed from the caller's input buffer and already unmasked
/// (and, for text, validated up to its last complete code point).
#[derive(Debug, PartialEq, Eq)]
pub struct Payload<'a> {
    /// The bytes.
    pub data: &'a [u8],
    /// The message's type.
    pub kind: MessageKind,
    /// Whether the message's first frame had RSV1 set (permessage-deflate compression).
    pub compressed: bool,
    /// The first piece of its message.
    pub message_start: bool,
    /// The last piece of its frame.
    pub frame_fin: bool,
    /// The last piece of its message.
    pub message_fin: bool,
}

/// A whole message in one frame, read by [`Connection::read_whole`]: unmasked and (text)
/// validated in place in the caller's buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct Whole<'a> {
    /// How many bytes of the buffer the frame took.
    pub consumed: usize,
    /// The message's type.
    pub kind: MessageKind,
    /// Its payload.
    pub data: &'a mut [u8],
}

/// What one call to [`Connection::handle_input`] produced.
#[derive(Debug, PartialEq, Eq)]
pub struct Input<'a> {
    /// How many bytes of the buffer were used; call again with the rest.
    pub consumed: usize,
    /// A piece of a data message, if one was ready.
    pub payload: Option<Payload<'a>>,
}

/// Something that happened outside the data stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// A ping arrived (answered already if [`Config::auto_pong`] is on).
    Ping(&'a [u8]),
    /// A pong arrived.
    Pong(&'a [u8]),
    /// The connection closed. `code` and `reason` are the peer's for a clean close, the error's
    /// for a failed one, and 1006 when the transport ended or a timer expired first.
    Closed {
        /// The close code (1005 if the peer's close frame had none).
        code: CloseCode,
        /// The close reason.
        reason: &'a str,
        /// Whether both close frames were exchanged (the browser's `wasClean`).
        clean: bool,
    },
}

/// The RFC 6455 state of one connection, after the opening handshake.
///
/// Feed it with [`handle_input`](Self::handle_input) after each read — repeatedly, until it has
/// consumed the whole buffer — and with [`handle_eof`](Self::handle_eof) at end of stream and
/// [`handle_timeout`](Self::handle_timeout) when [`poll_timeout`](Self::poll_timeout)'s
/// deadline passes. After each of these calls, drain [`poll_event`](Self::poll_event) and
/// [`poll_transmit`](Self::poll_transmit) (into a cork buffer: nothing needs to reach the
/// socket yet). The connection owes at most one pong at a time, so a caller that reads
/// several pings before draining answers only the last (§5.5.3 allows it). Send data by writing a header with
/// [`send_header`](Self::send_header) followed by the payload (masked with
/// [`apply_mask`](crate::mask::apply_mask) on the client), or a whole frame with
/// [`send_frame`](Self::send_frame).
///
/// The struct holds everything: no allocation, no borrowed buffers between calls.
#[derive(Clone)]
pub struct Connection {
    role: Role,
    config: Config,
    state: State,
    timers: TimerTable,
    rx: Receiver,
    /// Invariant: `Some` while a data message we send is unfinished.
    tx_message: Option<MessageKind>,
    /// The control frame we owe the peer: a pong (automatic pongs) or our close frame. Never
    /// both: once closing we owe no pongs (§5.5.1), so a close replaces an owed pong.
    owed: Option<(OpCode, ControlPayload)>,
    /// A keep-alive ping is due.
    ping_due: bool,
    /// What [`Event::Closed`] reports, once the state is `Closed`.
    closed: Option<CloseRecord>,
    /// Invariant: at most one informational event waits; `Closed` is reported separately.
    event: Option<PendingEvent>,
    closed_event_due: bool,
}

/// A control frame payload of at most 125 bytes.
#[derive(Clone)]
struct ControlPayload {
    bytes: [u8; MAX_CONTROL_PAYLOAD],
    /// Invariant: `len <= MAX_CONTROL_PAYLOAD`.
    len: u8,
}

#[derive(Clone, Copy)]
struct CloseRecord {
    code: CloseCode,
    reason: Reason,
    clean: bool,
}

/// Where the close reason lives; no copy of it is kept, not even a `&'static str` (16 bytes
/// where these take 4).
#[derive(Clone, Copy)]
enum Reason {
    /// The transport ended: no reason.
    Eof,
    CloseTimeout,
    PongTimeout,
    /// The connection failed for this error: [`ProtocolError::reason`].
    Error(ProtocolError),
    /// The reason of the peer's close frame, still in `rx.control` (no input is read after it).
    /// Invariant: `rx.control[2..]` is UTF-8 (checked by `close::parse_payload`).
    Received,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PendingEvent {
    Ping,
    Pong,
}

/// The receive half: an unfinished header, the frame being read, the message it belongs to.
#[derive(Clone)]
struct Receiver {
    /// Bytes of a header cut off by the end of the previous input.
    /// Invariant: `header_len < MAX_HEADER_LEN` and `header[..header_len]` does not parse yet.
    header: [u8; MAX_HEADER_LEN],
    header_len: u8,
    frame: Option<FrameProgress>,
    message: Option<MessageProgress>,
    utf8: Utf8Validator,
    /// The payload of the control frame being read (its last complete one, once read).
    control: ControlPayload,
}

#[derive(Clone, Copy)]
struct FrameProgress {
    opcode: OpCode,
    fin: bool,
    mask: Option<[u8; 4]>,
    /// Payload bytes already read, modulo 4: where the next byte falls in the masking key.
    /// Invariant: `< 4`.
    mask_offset: u8,
    /// Payload bytes not read yet (the frame's length and the bytes read would take 8 more).
    remaining: u64,
}

#[derive(Clone, Copy)]
struct MessageProgress {
    kind: MessageKind,
    compressed: bool,
    /// Bytes of all the message's frames announced so far (checked against the limit when
    /// each header arrives, before its payload is read).
    announced: u64,
    /// No piece of the message has been returned yet.
    at_start: bool,
}

impl Connection {
    /// A connection that has just completed its opening handshake at `now`.
    pub fn new(role: Role, config: Config, now: Instant) -> Self {
        let mut timers = TimerTable::default();
        if let Some(interval) = config.ping_interval {
            timers.set(Timer::KeepAlive, now + interval);
        }
        Self::open(role, config, timers)
    }

    /// An open connection with nothing in flight and `timers` running. Inlined so that
    /// resuming a parked connection builds it in place.
    #[inline]
    fn open(role: Role, config: Config, timers: TimerTable) -> Self {
        Self {
            role,
            config,
            state: State::Open,
            timers,
            rx: Receiver {
                header: [0; MAX_HEADER_LEN],
                header_len: 0,
                frame: None,
                message: None,
                utf8: Utf8Validator::new(),
                control: ControlPayload::EMPTY,
            },
            tx_message: None,
            owed: None,
            ping_due: false,
            closed: None,
            event: None,
            closed_event_due: false,
        }
    }

    /// This connection's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// This connection's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Sets the RSV bits a negotiated extension defines for this connection
    /// ([`Config::allowed_rsv`]), once the handshake has agreed on it (a driver that keeps
    /// one [`Config`] for every connection sets it after each resume).
    pub fn set_allowed_rsv(&mut self, rsv: u8) {
        self.config.allowed_rsv = rsv & 0b111;
    }

    /// Where the close handshake stands.
    #[inline]
    pub fn state(&self) -> State {
        self.state
    }

    /// Reads frames from `buf`, unmasking in place, and returns the first piece of data found.
    ///
    /// Never copies payload bytes: a piece of a message is returned as a slice of `buf`.
    /// Returns after each piece of data and after each control frame (check
    /// [`poll_event`](Self::poll_event)), so call it again with `&mut buf[consumed..]` until
    /// the buffer is used up. Bytes of an unfinished frame header are kept inside the
    /// connection, so `consumed` reaches `buf.len()` whenever no piece is returned.
    ///
    /// A protocol error fails the connection: the close frame for it is queued, the state
    /// becomes [`State::Closed`] and later input is ignored.
    #[inline]
    pub fn handle_input<'a>(
        &mut self,
        now: Instant,
        buf: &'a mut [u8],
    ) -> Result<Input<'a>, ProtocolError> {
        let buf = match self.read_whole(now, buf)? {
            Ok(Whole { consumed, kind, data }) => {
                let payload = Payload {
                    data,
                    kind,
                    compressed: false,
                    message_start: true,
                    frame_fin: true,
                    message_fin: true,
                };
                return Ok(Input { consumed, payload: Some(payload) });
            }
            Err(buf) => buf,
        };
        if self.state == State::Closed {
            return Ok(Input { consumed: buf.len(), payload: None });
        }
        if buf.is_empty() {
            return Ok(Input { consumed: 0, payload: None });
        }
        self.input_seen(now);
        self.read_piece(buf)
    }

    /// [`handle_input`](Self::handle_input)'s common case alone, for a driver that wants it
    /// without the general result to look through: the frame nearly every message is — one
    /// unfragmented text or binary frame without RSV bits, masked as the role requires, of
    /// at most 65,535 bytes within the size limits — whole at the front of `buf`, with no
    /// frame or message in progress. Unmasks and validates it in place; `Ok(Err(buf))` gives
    /// `buf` back untouched when its front is anything else, for `handle_input`.
    // Always inline: the compiler declines a plain `#[inline]` here, and inlined the common
    // frame need not pass through memory (callgrind, 64 B echo).
    #[inline(always)]
    pub fn read_whole<'a>(
        &mut self,
        now: Instant,
        buf: &'a mut [u8],
    ) -> Result<Result<Whole<'a>, &'a mut [u8]>, ProtocolError> {
        if self.state == State::Closed
            || self.rx.frame.is_some()
            || self.rx.header_len != 0
            || self.rx.message.is_some()
        {
            return Ok(Err(buf));
        }
        let Some((header_len, len, kind)) = self.whole_frame(buf) else { return Ok(Err(buf)) };
        self.input_seen(now);
        let (header, rest) = buf.split_at_mut(header_len);
        let data = &mut rest[..len];
        if self.role == Role::Server
            && let Some(&key) = header.last_chunk::<4>()
        {
            // A server's frames are masked: the header ends with the key.
            apply_mask(data, key, 0);
        }
        if kind == MessageKind::Text {
            self.rx.utf8.feed(data, true).map_err(|e| self.fail(e))?;
        }
        Ok(Ok(Whole { consumed: header_len + len, kind, data }))
    }

    /// Any input proves the peer alive: the keep-alive ping waits a full interval again.
    #[inline(always)]
    fn input_seen(&mut self, now: Instant) {
        if let (Some(interval), State::Open) = (self.config.ping_interval, self.state) {
            self.timers.set(Timer::KeepAlive, now + interval);
            self.timers.stop(Timer::PongDeadline);
        }
    }

    /// [`handle_input`](Self::handle_input) for every frame but the common one: a header cut
    /// by the end of a read, a frame in several reads, a fragment, a control frame, an error.
    #[inline(never)]
    fn read_piece<'a>(&mut self, buf: &'a mut [u8]) -> Result<Input<'a>, ProtocolError> {
        let mut consumed = 0;
        let frame = match self.rx.frame {
            Some(frame) => frame,
            None => match self.read_header(buf) {
                Ok((used, Some(frame))) => {
                    consumed = used;
                    frame
                }
                Ok((used, None)) => return Ok(Input { consumed: used, payload: None }),
                Err(e) => return Err(self.fail(e)),
            },
        };
        let rest = &mut buf[consumed..];
        let take = usize::try_from(frame.remaining).map_or(rest.len(), |n| n.min(rest.len()));
        let (chunk, _) = rest.split_at_mut(take);
        if let Some(key) = frame.mask {
            apply_mask(chunk, key, usize::from(frame.mask_offset));
        }
        consumed += take;
        let frame_fin = frame.remaining == take as u64;
        self.rx.frame = if frame_fin {
            None
        } else {
            Some(FrameProgress {
                remaining: frame.remaining - take as u64,
                // NOTE(truncation): the sum modulo 4 is below 4.
                mask_offset: ((usize::from(frame.mask_offset) + take) % 4) as u8,
                ..frame
            })
        };
        if take == 0 && !frame_fin {
            return Ok(Input { consumed, payload: None });
        }
        if frame.opcode.is_control() {
            let control = &mut self.rx.control;
            let at = usize::from(control.len);
            control.bytes[at..at + take].copy_from_slice(chunk);
            control.len += take as u8;
            if frame_fin {
                self.handle_control(frame.opcode).map_err(|e| self.fail(e))?;
            }
            return Ok(Input { consumed, payload: None });
        }
        match self.data_piece(chunk, frame.fin && frame_fin, frame_fin) {
            Ok(payload) => Ok(Input { consumed, payload: Some(payload) }),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Reports that the peer ended the transport (read returned 0 or the socket reset).
    pub fn handle_eof(&mut self) {
        if self.state != State::Closed {
            self.finish(CloseCode::ABNORMAL, Reason::Eof, false);
        }
    }

    /// Runs the timers whose deadline is at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(timer) = self.timers.expire(now) {
            match timer {
                Timer::Close => self.finish(CloseCode::ABNORMAL, Reason::CloseTimeout, false),
                Timer::PongDeadline => self.finish(CloseCode::ABNORMAL, Reason::PongTimeout, false),
                Timer::KeepAlive if self.state == State::Open => {
                    self.ping_due = true;
                    self.timers.set(Timer::PongDeadline, now + self.config.pong_timeout);
                }
                Timer::KeepAlive => {}
            }
        }
    }

    /// Reports that the keep-alive just sent needs no answer: on a one-way transport (a
    /// Server-Sent Events response, whose keep-alive is a comment the client cannot answer)
    /// a write that succeeds is all the liveness there is. The keep-alive waits a full
    /// interval again and no pong is awaited.
    pub fn keep_alive_unanswered(&mut self, now: Instant) {
        self.input_seen(now);
    }

    /// The next deadline at which [`handle_timeout`](Self::handle_timeout) must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// This connection's state without its buffers, if it has nothing in flight: open, no
    /// frame or message half read or half sent, no event or control frame waiting. Resuming
    /// the result gives a connection that behaves exactly like this one.
    pub fn park(&self) -> Option<Parked> {
        let rx = &self.rx;
        let quiet = self.state == State::Open
            && rx.header_len == 0
            && rx.frame.is_none()
            && rx.message.is_none()
            && self.tx_message.is_none()
            && self.owed.is_none()
            && !self.ping_due
            && self.event.is_none()
            && self.timers.get(Timer::Close).is_none();
        let deadline = |timer| self.timers.get(timer).map_or(Parked::NEVER, Instant::as_millis);
        quiet.then(|| Parked {
            keep_alive: deadline(Timer::KeepAlive),
            pong_deadline: deadline(Timer::PongDeadline),
            role: self.role,
        })
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event<'_>> {
        if let Some(event) = self.event.take() {
            let payload = self.rx.control.as_slice();
            return Some(match event {
                PendingEvent::Ping => Event::Ping(payload),
                PendingEvent::Pong => Event::Pong(payload),
            });
        }
        if !self.closed_event_due {
            return None;
        }
        self.closed_event_due = false;
        let record = self.closed?;
        let reason = match record.reason {
            Reason::Eof => "",
            Reason::CloseTimeout => "close timeout",
            Reason::PongTimeout => "pong timeout",
            Reason::Error(error) => error.reason(),
            Reason::Received => {
                let payload = self.rx.control.as_slice();
                core::str::from_utf8(payload.get(2..).unwrap_or_default()).unwrap_or_default()
            }
        };
        Some(Event::Closed { code: record.code, reason, clean: record.clean })
    }

    /// Whether [`poll_transmit`](Self::poll_transmit) has a control frame to give (a pong, a
    /// keep-alive ping, a close).
    #[inline]
    pub fn wants_transmit(&self) -> bool {
        self.owed.is_some() || self.ping_due
    }

    /// Writes the next control frame the connection owes (a pong, a keep-alive ping, a close)
    /// into `out` and returns its length, or `None` when nothing is owed.
    ///
    /// A client passes a fresh random masking key with every call (§5.3: "unpredictable");
    /// a server passes `None`. 131 bytes always suffice.
    pub fn poll_transmit(
        &mut self,
        mask: Option<[u8; 4]>,
        out: &mut [u8],
    ) -> Result<Option<usize>, UsageError> {
        self.check_mask(mask)?;
        let (opcode, payload) = match &self.owed {
            Some((OpCode::Pong, pong)) => (OpCode::Pong, pong.as_slice()),
            _ if self.ping_due => (OpCode::Ping, &[][..]),
            Some((opcode, payload)) => (*opcode, payload.as_slice()),
            None => return Ok(None),
        };
        let n = encode_frame(opcode, true, payload, mask, out)?;
        if opcode == OpCode::Ping {
            self.ping_due = false;
        } else {
            self.owed = None;
        }
        Ok(Some(n))
    }

    /// Writes the header of a data frame into `out` and returns its length; the `payload_len`
    /// payload bytes must follow it on the wire (masked with `mask` on the client).
    ///
    /// `opcode` is `Text` or `Binary` for a message's first frame, `Continuation` for the
    /// others; `fin` ends the message.
    #[inline]
    pub fn send_header(
        &mut self,
        opcode: OpCode,
        fin: bool,
        payload_len: u64,
        mask: Option<[u8; 4]>,
        out: &mut [u8],
    ) -> Result<usize, UsageError> {
        self.send_header_rsv(opcode, fin, 0, payload_len, mask, out)
    }

    /// [`send_header`](Self::send_header) with RSV bits (as in [`FrameHeader::rsv`]): only
    /// bits the connection allows ([`Config::allowed_rsv`]), and only on a message's first
    /// frame (RFC 7692 §6: permessage-deflate sets RSV1 on the first frame alone).
    pub fn send_header_rsv(
        &mut self,
        opcode: OpCode,
        fin: bool,
        rsv: u8,
        payload_len: u64,
        mask: Option<[u8; 4]>,
        out: &mut [u8],
    ) -> Result<usize, UsageError> {
        if rsv & !self.config.allowed_rsv != 0 || (rsv != 0 && opcode == OpCode::Continuation) {
            return Err(UsageError::ReservedBits(rsv));
        }
        let next = self.next_tx_message(opcode, fin, mask)?;
        let n = FrameHeader { fin, rsv, opcode, mask, payload_len }.encode(out)?;
        self.tx_message = next;
        Ok(n)
    }

    /// Writes the header of a whole data message of `payload_len` bytes in one frame (FIN
    /// set), with `rsv` as in [`send_header_rsv`](Self::send_header_rsv), into the front of
    /// `out` ([`FrameHeader::write`]); returns its length. The common send, with no output
    /// slice to check.
    #[inline]
    pub fn message_header(
        &mut self,
        kind: MessageKind,
        rsv: u8,
        payload_len: u64,
        mask: Option<[u8; 4]>,
        out: &mut [u8; MAX_HEADER_LEN],
    ) -> Result<usize, UsageError> {
        if rsv & !self.config.allowed_rsv != 0 {
            return Err(UsageError::ReservedBits(rsv));
        }
        let opcode = match kind {
            MessageKind::Text => OpCode::Text,
            MessageKind::Binary => OpCode::Binary,
        };
        // NOTE: a whole message leaves no message in progress.
        self.next_tx_message(opcode, true, mask)?;
        Ok(FrameHeader { fin: true, rsv, opcode, mask, payload_len }.write(out))
    }

    /// Writes a whole data frame — header and (masked) payload — into `out`; see
    /// [`send_header`](Self::send_header).
    pub fn send_frame(
        &mut self,
        opcode: OpCode,
        fin: bool,
        payload: &[u8],
        mask: Option<[u8; 4]>,
        out: &mut [u8],
    ) -> Result<usize, UsageError> {
        let next = self.next_tx_message(opcode, fin, mask)?;
        let n = encode_frame(opcode, fin, payload, mask, out)?;
        self.tx_message = next;
        Ok(n)
    }

    /// Writes a ping frame into `out`.
    pub fn send_ping(
        &mut self,
        payload: &[u8],
        mask: Option<[u8; 4]>,
        out: &mut [u8],
    ) -> Result<usize, UsageError> {
        self.send_control(OpCode::Ping, payload, mask, out)
    }

    /// Writes a pong frame into `out` (when [`Config::auto_pong`] is off).
    pub fn pong(
        &mut self,
        payload: &[u8],
        mask: Option<[u8; 4]>,
        out: &mut [u8],
    ) -> Result<usize, UsageError> {
        self.send_control(OpCode::Pong, payload, mask, out)
    }

    /// Starts the close handshake: queues a close frame for
    /// [`poll_transmit`](Self::poll_transmit) and starts the close timer. Does nothing if the
    /// handshake has already started.
    ///
    /// The close frame takes the slot of an owed pong, so drain `poll_transmit` after each
    /// input (as the type's documentation says) before closing, or that pong is not sent.
    pub fn close(&mut self, now: Instant, code: CloseCode, reason: &str) -> Result<(), UsageError> {
        if !code.is_sendable() {
            return Err(UsageError::InvalidCloseCode(code.0));
        }
        if reason.len() > MAX_REASON_LEN {
            return Err(UsageError::ControlPayloadTooLong);
        }
        if self.state == State::Open {
            self.owed = Some((OpCode::Close, ControlPayload::close(code, reason.as_bytes())));
            self.state = State::CloseSent;
            self.tx_message = None;
            self.timers.stop_all();
            self.timers.set(Timer::Close, now + self.config.close_timeout);
        }
        Ok(())
    }

    /// Checks that a data frame may be sent now and returns the message in progress after it.
    #[inline]
    fn next_tx_message(
        &self,
        opcode: OpCode,
        fin: bool,
        mask: Option<[u8; 4]>,
    ) -> Result<Option<MessageKind>, UsageError> {
        self.check_mask(mask)?;
        if self.state != State::Open {
            return Err(UsageError::AfterClose);
        }
        let kind = match (opcode, self.tx_message) {
            (OpCode::Text, None) => MessageKind::Text,
            (OpCode::Binary, None) => MessageKind::Binary,
            (OpCode::Continuation, Some(kind)) => kind,
            (OpCode::Continuation, None) => return Err(UsageError::NoMessageInProgress),
            (OpCode::Text | OpCode::Binary, Some(_)) => return Err(UsageError::MessageInProgress),
            (OpCode::Close | OpCode::Ping | OpCode::Pong, _) => return Err(UsageError::NotData),
        };
        Ok(if fin { None } else { Some(kind) })
    }

    #[inline]
    fn check_mask(&self, mask: Option<[u8; 4]>) -> Result<(), UsageError> {
        match (self.role, mask) {
            (Role::Client, Some(_)) | (Role::Server, None) => Ok(()),
            _ => Err(UsageError::WrongMasking),
        }
    }

    fn send_control(
        &mut self,
        opcode: OpCode,
        payload: &[u8],
        mask: Option<[u8; 4]>,
        out: &mut [u8],
    ) -> Result<usize, UsageError> {
        self.check_mask(mask)?;
        if self.state != State::Open {
            return Err(UsageError::AfterClose);
        }
        encode_frame(opcode, true, payload, mask, out)
    }

    /// The frame nearly every message is, when all of it is at the front of `buf`: one
    /// unfragmented text or binary frame without RSV bits, masked as the role requires, of at
    /// most 65,535 bytes within the size limits. Returns its header length, payload length and
    /// kind; `None` leaves the frame (and every error) to the general path. Call only with no
    /// frame, header or message in progress.
    #[inline]
    fn whole_frame(&self, buf: &[u8]) -> Option<(usize, usize, MessageKind)> {
        let [b0, b1, rest @ ..] = buf else { return None };
        let kind = match *b0 {
            0x81 => MessageKind::Text,
            0x82 => MessageKind::Binary,
            _ => return None,
        };
        let masked = b1 & 0x80 != 0;
        if masked != (self.role == Role::Server) {
            return None;
        }
        let (len, len_bytes) = match b1 & 0x7f {
            // §5.2: "the minimal number of bytes MUST be used": a shorter one is an error the
            // general path reports.
            126 => match u16::from_be_bytes(*rest.first_chunk::<2>()?) {
                len @ 126.. => (usize::from(len), 2),
                _ => return None,
            },
            127 => return None,
            len => (usize::from(len), 0),
        };
        let header_len = 2 + len_bytes + if masked { 4 } else { 0 };
        let fits = len as u64 <= self.config.max_frame_size.min(self.config.max_message_size);
        (fits && buf.len() >= header_len + len).then_some((header_len, len, kind))
    }

    /// Reads a frame header from `buf` (after any bytes kept from the previous input).
    /// Returns the bytes of `buf` used and the new frame, or `None` if the header is unfinished.
    fn read_header(&mut self, buf: &[u8]) -> Result<(usize, Option<FrameProgress>), ProtocolError> {
        let kept = usize::from(self.rx.header_len);
        let parsed = if kept == 0 {
            FrameHeader::parse(buf)?
        } else {
            let add = buf.len().min(MAX_HEADER_LEN - kept);
            self.rx.header[kept..kept + add].copy_from_slice(&buf[..add]);
            FrameHeader::parse(&self.rx.header[..kept + add])?
                .map(|(header, len)| (header, len - kept))
        };
        let Some((header, used)) = parsed else {
            // An unfinished header is shorter than MAX_HEADER_LEN, so it fits.
            let kept_now = kept + buf.len();
            self.rx.header[kept..kept_now].copy_from_slice(buf);
            // NOTE(truncation): kept_now < MAX_HEADER_LEN.
            self.rx.header_len = kept_now as u8;
            return Ok((buf.len(), None));
        };
        self.rx.header_len = 0;
        self.start_frame(&header)?;
        Ok((
            used,
            Some(FrameProgress {
                opcode: header.opcode,
                fin: header.fin,
                mask: header.mask,
                mask_offset: 0,
                remaining: header.payload_len,
            }),
        ))
    }

    /// Checks a new frame against the role, the negotiated extensions, the message in progress
    /// and the size limits.
    fn start_frame(&mut self, header: &FrameHeader) -> Result<(), ProtocolError> {
        match (self.role, header.mask) {
            (Role::Server, None) => return Err(ProtocolError::UnmaskedFrame),
            (Role::Client, Some(_)) => return Err(ProtocolError::MaskedFrame),
            _ => {}
        }
        // §5.2: "If a nonzero value is received and none of the negotiated extensions defines
        // the meaning of such a nonzero value, the receiving endpoint MUST _Fail_". Extensions
        // (RFC 7692) define the bits on a message's first frame only.
        let first_data_frame = matches!(header.opcode, OpCode::Text | OpCode::Binary);
        let allowed = if first_data_frame { self.config.allowed_rsv } else { 0 };
        if header.rsv & !allowed != 0 {
            return Err(ProtocolError::ReservedBits(header.rsv));
        }
        if header.opcode.is_control() {
            self.rx.control.len = 0;
            return Ok(());
        }
        if header.payload_len > self.config.max_frame_size {
            return Err(ProtocolError::FrameTooLarge);
        }
        let message = match (header.opcode, self.rx.message) {
            (OpCode::Continuation, Some(message)) => message,
            // §5.4: a continuation needs a message to continue, and a message's fragments may
            // only be interleaved with control frames.
            (OpCode::Continuation, None) => return Err(ProtocolError::UnexpectedContinuation),
            (_, Some(_)) => return Err(ProtocolError::ExpectedContinuation),
            (opcode, None) => MessageProgress {
                kind: if opcode == OpCode::Text { MessageKind::Text } else { MessageKind::Binary },
                compressed: header.rsv1(),
                announced: 0,
                at_start: true,
            },
        };
        let announced = message.announced.saturating_add(header.payload_len);
        if announced > self.config.max_message_size {
            return Err(ProtocolError::MessageTooLarge);
        }
        self.rx.message = Some(MessageProgress { announced, ..message });
        Ok(())
    }

    /// Validates a piece of a data frame and describes it.
    fn data_piece<'a>(
        &mut self,
        chunk: &'a [u8],
        message_fin: bool,
        frame_fin: bool,
    ) -> Result<Payload<'a>, ProtocolError> {
        // NOTE(unwrap): start_frame set the message before any data frame is read.
        let message = self.rx.message.as_mut().expect("a data frame belongs to a message");
        // Compressed text is validated after inflation, one layer up.
        if message.kind == MessageKind::Text && !message.compressed {
            self.rx.utf8.feed(chunk, message_fin)?;
        }
        let payload = Payload {
            data: chunk,
            kind: message.kind,
            compressed: message.compressed,
            message_start: message.at_start,
            frame_fin,
            message_fin,
        };
        message.at_start = false;
        if message_fin {
            self.rx.message = None;
        }
        Ok(payload)
    }

    /// Acts on a complete control frame whose payload is in `self.rx.control`.
    fn handle_control(&mut self, opcode: OpCode) -> Result<(), ProtocolError> {
        match opcode {
            OpCode::Ping => {
                // §5.5.2: "Upon receipt of a Ping frame, an endpoint MUST send a Pong frame in
                // response ... with identical Application data". One owed pong is enough: §5.5.3
                // allows answering only the most recent ping.
                if self.config.auto_pong && self.state == State::Open {
                    self.owed = Some((OpCode::Pong, self.rx.control.clone()));
                }
                self.event = Some(PendingEvent::Ping);
            }
            OpCode::Pong => {
                self.timers.stop(Timer::PongDeadline);
                self.event = Some(PendingEvent::Pong);
            }
            OpCode::Close => {
                let (code, _) = close::parse_payload(self.rx.control.as_slice())?;
                if self.state == State::Open {
                    // §5.5.1: "the endpoint MUST send a Close frame in response ... It SHOULD
                    // use the status code it received". 1005 means none: answer with none.
                    let echo = if code == CloseCode::NO_STATUS {
                        &[][..]
                    } else {
                        &code.0.to_be_bytes()[..]
                    };
                    self.owed = Some((OpCode::Close, ControlPayload::from_slice(echo)));
                }
                self.finish(code, Reason::Received, true);
            }
            _ => unreachable!("handle_control is called for control opcodes only"),
        }
        Ok(())
    }

    /// Fails the connection for a protocol error (§7.1.7) and hands the error back.
    fn fail(&mut self, error: ProtocolError) -> ProtocolError {
        if self.state == State::Open {
            let payload = ControlPayload::close(error.close_code(), error.reason().as_bytes());
            self.owed = Some((OpCode::Close, payload));
        }
        self.finish(error.close_code(), Reason::Error(error), false);
        error
    }

    /// Moves to `Closed` and records what the close event reports.
    fn finish(&mut self, code: CloseCode, reason: Reason, clean: bool) {
        if self.state == State::Closed {
            return;
        }
        self.state = State::Closed;
        self.timers.stop_all();
        self.ping_due = false;
        self.closed = Some(CloseRecord { code, reason, clean });
        self.closed_event_due = true;
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("role", &self.role)
            .field("state", &self.state)
            .field("next_timeout", &self.poll_timeout())
            .finish_non_exhaustive()
    }
}

impl ControlPayload {
    const EMPTY: Self = Self { bytes: [0; MAX_CONTROL_PAYLOAD], len: 0 };

    /// Copies `bytes`, which the caller has checked to be at most 125 long.
    fn from_slice(bytes: &[u8]) -> Self {
        let mut payload = Self::EMPTY;
        payload.bytes[..bytes.len()].copy_from_slice(bytes);
        // NOTE(truncation): callers pass at most MAX_CONTROL_PAYLOAD bytes.
        payload.len = bytes.len() as u8;
        payload
    }

    fn close(code: CloseCode, reason: &[u8]) -> Self {
        let mut payload = Self::from_slice(&code.0.to_be_bytes());
        payload.bytes[2..2 + reason.len()].copy_from_slice(reason);
        payload.len += reason.len() as u8;
        payload
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// Writes a whole frame; used for control frames, whose payloads are at most 125 bytes.
fn encode_frame(
    opcode: OpCode,
    fin: bool,
    payload: &[u8],
    mask: Option<[u8; 4]>,
    out: &mut [u8],
) -> Result<usize, UsageError> {
    if opcode.is_control() && payload.len() > MAX_CONTROL_PAYLOAD {
        return Err(UsageError::ControlPayloadTooLong);
    }
    let header = FrameHeader { fin, rsv: 0, opcode, mask, payload_len: payload.len() as u64 };
    let required = header.len() + payload.len();
    if out.len() < required {
        return Err(InsufficientSize { required }.into());
    }
    let n = header.encode(out)?;
    let body = &mut out[n..required];
    body.copy_from_slice(payload);
    if let Some(key) = mask {
        apply_mask(body, key, 0);
    }
    Ok(required)
}

/// An idle open connection's state without its buffers: 24 bytes instead of a
/// [`Connection`]'s 424.
///
/// A server with 100,000 mostly idle connections keeps these and resumes one into a full
/// [`Connection`] when its socket has something to say. Only a connection with nothing in
/// flight can be parked (see [`Connection::park`]), so parking loses nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parked {
    /// The keep-alive and pong deadlines, in milliseconds; `u64::MAX` when not running.
    keep_alive: u64,
    pong_deadline: u64,
    role: Role,
}

impl Parked {
    const NEVER: u64 = u64::MAX;

    /// A connection that has just completed its opening handshake at `now`, parked:
    /// the same state as [`Connection::new`] without building one.
    pub fn new(role: Role, config: &Config, now: Instant) -> Self {
        let keep_alive = config.ping_interval.map_or(Self::NEVER, |i| (now + i).as_millis());
        Self { keep_alive, pong_deadline: Self::NEVER, role }
    }

    /// This connection's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The next deadline, as [`Connection::poll_timeout`] would say.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let next = self.keep_alive.min(self.pong_deadline);
        (next != Self::NEVER).then_some(Instant(next))
    }

    /// The full connection again, with the `config` it was parked under.
    #[inline]
    pub fn resume(self, config: Config) -> Connection {
        let mut timers = TimerTable::default();
        for (timer, at) in
            [(Timer::KeepAlive, self.keep_alive), (Timer::PongDeadline, self.pong_deadline)]
        {
            if at != Self::NEVER {
                timers.set(timer, Instant(at));
            }
        }
        Connection::open(self.role, config, timers)
    }
}

/// The connection state must stay small: 100,000 idle connections hold 100,000 of these.
/// 424 bytes on 64-bit and 32-bit targets alike (it holds no pointer), and what holds them:
///
/// | bytes | what | why it must |
/// |---|---|---|
/// | 126 + 127 | the control payload being read (`rx.control`, which `poll_event` lends out) and the pong or close frame we owe (`owed`) | a control payload may be 125 bytes and arrive split across reads; the pong for a ping must carry its payload whole (§5.5.2) even when the caller reads the next control frame before draining `poll_transmit` (documented as allowed), and a close reason given to `close` must survive the peer's control frames read before it is sent: one buffer cannot serve both |
/// | 72 | [`Config`] | [`Connection::config`] returns `&Config`, whose fields are public `u64`s and `Duration`s |
/// | 14 + 1 | a frame header cut off by the end of an input | headers are up to 14 bytes and may arrive a byte at a time |
/// | 16 + 16 | the frame and the message being read | a 64-bit remaining length and message length (frames and messages may exceed 4 GiB), the mask key |
/// | 24 | three deadlines | one `u64` per [`Timer`] |
/// | 8 | how it closed | code, reason as an error kind (not a `&str`), clean |
/// | 4 + 6 | UTF-8 validator state, role, state and flags | |
///
/// Parked, an idle connection is 24 bytes (below).
const _: () = assert!(core::mem::size_of::<Connection>() <= 424);
const _: () = assert!(core::mem::size_of::<Parked>() <= 24);
