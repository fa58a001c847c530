//! The server side of one HTTP/2 connection, sans-IO.

use alloc::vec::Vec;

use crate::config::{Config, DEFAULT_WINDOW};
use crate::counters::Counters;
use crate::error::{ConnectionError, ErrorCode, FrameError, UsageError};
use crate::frame::{
    self, FrameHeader, FrameType, HEADER_LEN, MAX_WINDOW, MIN_MAX_FRAME_SIZE, PREFACE, Setting,
    Settings, StreamId, flags,
};
use crate::hpack::{self, Decoder, HeaderList};
use crate::request::{PseudoFields, Request, RequestKind};
use crate::stream::{Stream, StreamTable};

/// What one call to [`Connection::receive`] produced.
#[derive(Debug)]
pub struct Received<'a> {
    /// How many bytes of the buffer were used. The rest must be passed again, with whatever
    /// arrives after it: an incomplete frame (other than DATA, whose payload is handed out
    /// as it arrives) is left in the caller's buffer, not copied.
    pub consumed: usize,
    /// What happened, if anything did.
    pub event: Option<Event<'a>>,
}

/// Something the peer did that the caller must act on.
#[derive(Debug)]
pub enum Event<'a> {
    /// An extended CONNECT with `:protocol = websocket` (RFC 8441 §4): answer it with
    /// [`Connection::respond`], `200` to accept (then DATA carries the WebSocket's bytes),
    /// or another status with `end_stream` to refuse.
    WebSocket {
        /// The stream.
        stream: StreamId,
        /// The request head.
        request: Request<'a>,
    },
    /// Any other request (GET, HEAD, POST, a plain CONNECT): answer it with
    /// [`Connection::respond`] and a body through [`Connection::send_data_header`].
    Request {
        /// The stream.
        stream: StreamId,
        /// The request head.
        request: Request<'a>,
        /// The request has no body.
        end_stream: bool,
    },
    /// DATA for a stream, borrowed from the input buffer. Hand it on and call
    /// [`Connection::consume`] when it is processed: only that reopens the peer's window.
    Data {
        /// The stream.
        stream: StreamId,
        /// The bytes (empty when only `end_stream` is news).
        data: &'a [u8],
        /// The peer sent its last byte on this stream.
        end_stream: bool,
    },
    /// The stream is gone: the peer reset it (`remote`), or we did for the peer's error.
    /// Drop everything held for it; nothing is left to consume.
    Reset {
        /// The stream.
        stream: StreamId,
        /// The code of the `RST_STREAM`.
        code: ErrorCode,
        /// Whether the peer sent it.
        remote: bool,
    },
    /// The peer will open no more streams; those open go on.
    GoAway {
        /// The last stream of ours the peer processed (0: we open none).
        last_stream: StreamId,
        /// Why.
        code: ErrorCode,
    },
}

/// The server side of one HTTP/2 connection, without I/O.
///
/// Feed it with [`receive`](Self::receive) after each read — repeatedly, passing the bytes
/// not yet consumed, until it consumes nothing more — and act on each [`Event`]. The read
/// buffer must hold [`Config::min_read_buffer`] bytes, so any whole frame fits. Then take
/// what it owes the peer with [`poll_transmit`](Self::poll_transmit) (SETTINGS and PING
/// acknowledgements, WINDOW_UPDATEs, response heads, resets, GOAWAY), ask
/// [`poll_writable`](Self::poll_writable) which blocked streams may send again, and send
/// DATA with [`send_capacity`](Self::send_capacity) and
/// [`send_data_header`](Self::send_data_header), writing the payload after the header
/// yourself. Close the socket when [`is_done`](Self::is_done).
///
/// It reads no clock and has no timers: a keep-alive or an idle timeout is the driver's.
#[derive(Debug)]
pub struct Connection {
    config: Config,
    phase: Phase,
    decoder: Decoder,
    /// The last request head decoded; lent out by [`Event::WebSocket`] and
    /// [`Event::Request`].
    headers: HeaderList,
    /// Where the request head's pseudo-header fields are in `headers`.
    pseudo: Option<PseudoFields>,
    /// A header block spread over CONTINUATION frames (empty otherwise, and unallocated).
    block: Vec<u8>,
    continuation: Option<Continuation>,
    /// The DATA frame whose payload is arriving.
    data: Option<DataFrame>,
    streams: StreamTable,
    /// The highest stream the peer opened or tried to; lower ones not in `streams` are closed.
    last_peer_stream: StreamId,
    /// The last stream our graceful GOAWAY named; streams above it are ignored (and a later
    /// GOAWAY for an error names it again: the last stream never grows, RFC 9113 §6.8).
    going_away: Option<StreamId>,
    peer_going_away: bool,
    /// The connection's send window (the peer's for us).
    send_window: i64,
    /// What the peer may still send on all streams.
    recv_window: i64,
    /// Consumed (or discarded) and not yet announced on the connection.
    to_announce: u32,
    /// The peer's SETTINGS_INITIAL_WINDOW_SIZE.
    peer_initial_window: u32,
    /// Our SETTINGS_INITIAL_WINDOW_SIZE in effect: 65,535 until the peer acknowledges ours.
    local_initial_window: u32,
    settings_acked: bool,
    peer_max_frame_size: u32,
    /// Frames owed to the peer; `tx[tx_start..]` is not yet taken.
    tx: Vec<u8>,
    tx_start: usize,
    /// Frames the peer caused (acknowledgements, resets) in `tx` since it was last empty.
    queued_control: u32,
    /// Unanswered streams the peer reset, less streams answered (rapid reset).
    reset_debt: u32,
    error_resets: u32,
    counters: Counters,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the 24 octets of the client preface.
    Preface,
    /// The preface arrived; its SETTINGS frame must come first (RFC 9113 §3.4).
    FirstSettings,
    Open,
    /// A connection error: GOAWAY is queued, input is ignored.
    Failed,
}

#[derive(Debug, Clone, Copy)]
struct Continuation {
    stream: StreamId,
    end_stream: bool,
    self_dependent: bool,
    frames: u32,
}

#[derive(Debug, Clone, Copy)]
struct DataFrame {
    stream: StreamId,
    data_left: u32,
    pad_left: u32,
    end_stream: bool,
    /// Whether the payload goes to the caller (else it is discarded and credited back).
    deliver: bool,
}

/// What a step of input produced, without borrowing (turned into an [`Event`] at the end).
enum Step {
    More,
    Continue,
    WebSocket(StreamId),
    Request(StreamId, bool),
    Data { stream: StreamId, len: usize, end_stream: bool },
    Reset(StreamId, ErrorCode, bool),
    GoAway(StreamId, ErrorCode),
}

impl Connection {
    /// A connection whose client preface is still to come; our SETTINGS (with
    /// SETTINGS_ENABLE_CONNECT_PROTOCOL = 1, RFC 8441 §3) and the connection's WINDOW_UPDATE
    /// are queued at once.
    pub fn new(config: Config) -> Self {
        let mut connection = Self {
            config,
            phase: Phase::Preface,
            decoder: Decoder::new(config.header_table_size.max(4096) as usize),
            headers: HeaderList::new(config.max_header_list_size as usize),
            pseudo: None,
            block: Vec::new(),
            continuation: None,
            data: None,
            streams: StreamTable::default(),
            last_peer_stream: StreamId::CONNECTION,
            going_away: None,
            peer_going_away: false,
            send_window: i64::from(DEFAULT_WINDOW),
            recv_window: i64::from(config.connection_window),
            to_announce: 0,
            peer_initial_window: DEFAULT_WINDOW,
            local_initial_window: DEFAULT_WINDOW,
            settings_acked: false,
            peer_max_frame_size: MIN_MAX_FRAME_SIZE,
            tx: Vec::new(),
            tx_start: 0,
            queued_control: 0,
            reset_debt: 0,
            error_resets: 0,
            counters: Counters::default(),
        };
        let mut settings = Vec::with_capacity(7);
        if config.header_table_size != 4096 {
            settings.push((Setting::HEADER_TABLE_SIZE, config.header_table_size));
        }
        settings.push((Setting::ENABLE_PUSH, 0));
        settings.push((Setting::MAX_CONCURRENT_STREAMS, config.max_concurrent_streams));
        settings.push((Setting::INITIAL_WINDOW_SIZE, config.initial_stream_window));
        if config.max_frame_size != MIN_MAX_FRAME_SIZE {
            settings.push((Setting::MAX_FRAME_SIZE, config.max_frame_size));
        }
        settings.push((Setting::MAX_HEADER_LIST_SIZE, config.max_header_list_size));
        settings.push((Setting::ENABLE_CONNECT_PROTOCOL, 1));
        let settings: Vec<Setting> =
            settings.into_iter().map(|(id, value)| Setting { id, value }).collect();
        let mut payload = [0u8; 7 * 6];
        // NOTE(unwrap): at most 7 settings of 6 bytes.
        let len = frame::encode_settings(&settings, &mut payload).unwrap();
        // NOTE(unwrap): a payload of a multiple of 6 bytes.
        let settings = Settings::from_payload(&payload[..len]).unwrap();
        connection.queue(frame::Frame::Settings { ack: false, settings });
        if config.connection_window > DEFAULT_WINDOW {
            connection.queue(frame::Frame::WindowUpdate {
                stream: StreamId::CONNECTION,
                increment: config.connection_window - DEFAULT_WINDOW,
            });
        }
        connection
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What this connection counted.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Streams open (the peer's requests not yet finished both ways).
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Whether the connection is over: failed, or gone away with no stream left, and every
    /// frame owed taken. Close the transport then.
    pub fn is_done(&self) -> bool {
        self.tx_start == self.tx.len()
            && (self.phase == Phase::Failed
                || ((self.going_away.is_some() || self.peer_going_away) && self.streams.is_empty()))
    }

    /// Reads what `buf` holds, up to the first event.
    ///
    /// Call again with `&buf[consumed..]` (after acting on the event) until it returns no
    /// event and consumes nothing more; keep the unconsumed bytes for the next read. A
    /// peer's connection error queues GOAWAY with its code and is returned; after it, input
    /// is ignored. A stream error resets the stream and goes on.
    pub fn receive<'a>(&'a mut self, buf: &'a [u8]) -> Result<Received<'a>, ConnectionError> {
        if self.pseudo.take().is_some() {
            // The request head lent out last time is the caller's no more: an idle
            // connection keeps no decoded fields.
            self.headers.clear(true);
        }
        let mut consumed = 0;
        let step = loop {
            if self.phase == Phase::Failed {
                return Ok(Received { consumed: buf.len(), event: None });
            }
            match self.step(&buf[consumed..]) {
                Ok((used, step)) => {
                    consumed += used;
                    match step {
                        Step::Continue => continue,
                        Step::More => break None,
                        step => break Some(step),
                    }
                }
                Err(error) => {
                    self.fail(error);
                    return Err(error);
                }
            }
        };
        let event = step.map(|step| match step {
            Step::WebSocket(stream) => Event::WebSocket { stream, request: self.request() },
            Step::Request(stream, end_stream) => {
                Event::Request { stream, request: self.request(), end_stream }
            }
            Step::Data { stream, len, end_stream } => {
                // A DATA piece is the last `len` bytes the step used.
                Event::Data { stream, data: &buf[consumed - len..consumed], end_stream }
            }
            Step::Reset(stream, code, remote) => Event::Reset { stream, code, remote },
            Step::GoAway(last_stream, code) => Event::GoAway { last_stream, code },
            Step::More | Step::Continue => unreachable!("the loop goes on past these"),
        });
        Ok(Received { consumed, event })
    }

    /// Marks `len` bytes of a stream's DATA as processed, which reopens the peer's windows:
    /// a WINDOW_UPDATE is queued once half a window is consumed.
    pub fn consume(&mut self, stream: StreamId, len: usize) -> Result<(), UsageError> {
        let local_initial = self.local_initial_window;
        let s = self.streams.get_mut(stream).ok_or(UsageError::UnknownStream(stream))?;
        let len = u32::try_from(len).ok().filter(|&len| len <= s.unconsumed);
        let len = len.ok_or(UsageError::ConsumedTooMuch(stream))?;
        s.unconsumed -= len;
        let mut update = None;
        if !s.has(Stream::REMOTE_ENDED) {
            s.to_announce += len;
            if s.to_announce >= local_initial / 2 {
                s.recv_window += s.to_announce as i32;
                update = Some(core::mem::take(&mut s.to_announce));
            }
        }
        let finished = s.finished();
        if let Some(increment) = update {
            self.queue(frame::Frame::WindowUpdate { stream, increment });
        }
        if finished {
            self.streams.remove(stream);
        }
        self.announce(len);
        Ok(())
    }

    /// Answers a request: queues its final response head (`:status` and `headers`, names
    /// lowercase), ending the stream if `end_stream`. Informational (1xx) heads before it
    /// are not supported: the first head sent is the answer.
    ///
    /// `200` accepts a WebSocket (RFC 8441 §5: no `sec-websocket-accept`); DATA then flows
    /// both ways. A final response that ends the stream before the peer ended its side
    /// also resets the stream with `NO_ERROR`, so the peer stops sending (RFC 9113 §8.1).
    pub fn respond(
        &mut self,
        stream: StreamId,
        status: u16,
        headers: &[(&[u8], &[u8])],
        end_stream: bool,
    ) -> Result<(), UsageError> {
        if self.phase == Phase::Failed {
            return Err(UsageError::Closed);
        }
        if !(100..=999).contains(&status) || !headers.iter().all(|(n, v)| valid_field(n, v)) {
            return Err(UsageError::InvalidHeader);
        }
        let s = self.streams.get_mut(stream).ok_or(UsageError::UnknownStream(stream))?;
        if s.has(Stream::ANSWERED) {
            return Err(UsageError::AlreadyAnswered(stream));
        }
        s.set(Stream::ANSWERED);
        let remote_ended = s.has(Stream::REMOTE_ENDED);
        self.reset_debt = self.reset_debt.saturating_sub(1);
        self.queue_response(stream, status, headers, end_stream);
        if end_stream {
            self.end_local(stream, remote_ended);
        }
        Ok(())
    }

    /// Resets a stream (the caller's session for it ended abnormally).
    pub fn reset(&mut self, stream: StreamId, code: ErrorCode) -> Result<(), UsageError> {
        if self.streams.get(stream).is_none() {
            return Err(UsageError::UnknownStream(stream));
        }
        self.queue(frame::Frame::RstStream { stream, code });
        self.remove_stream(stream);
        Ok(())
    }

    /// Starts a graceful shutdown: GOAWAY `NO_ERROR` naming the last stream opened; streams
    /// open go on, new ones are ignored (RFC 9113 §6.8).
    pub fn go_away(&mut self) {
        if self.phase == Phase::Failed || self.going_away.is_some() {
            return;
        }
        self.going_away = Some(self.last_peer_stream);
        self.queue(frame::Frame::GoAway {
            last_stream: self.last_peer_stream,
            code: ErrorCode::NO_ERROR,
            debug: &[],
        });
    }

    /// How many bytes one DATA frame on `stream` may carry now: the smaller of the two send
    /// windows and the peer's frame size. At 0 the stream is blocked, and
    /// [`poll_writable`](Self::poll_writable) names it when the peer opens a window.
    pub fn send_capacity(&mut self, stream: StreamId) -> Result<usize, UsageError> {
        let capacity = self.capacity(stream)?;
        if capacity == 0 {
            // NOTE(unwrap): `capacity` found the stream.
            let s = self.streams.get_mut(stream).unwrap();
            if !s.has(Stream::SEND_BLOCKED) {
                s.set(Stream::SEND_BLOCKED);
                self.counters.send_blocked += 1;
            }
        }
        Ok(capacity)
    }

    /// Writes the 9-byte header of a DATA frame of `len` bytes into `out` (the payload goes
    /// after it on the wire, from the caller's own buffer) and debits the windows.
    ///
    /// `len` may be at most [`send_capacity`](Self::send_capacity); an empty frame that
    /// ends the stream is always allowed. Frames queued by the connection go first: this
    /// fails with [`UsageError::TransmitPending`] until `poll_transmit` has taken them.
    pub fn send_data_header(
        &mut self,
        stream: StreamId,
        len: usize,
        end_stream: bool,
        out: &mut [u8],
    ) -> Result<usize, UsageError> {
        if self.tx_start != self.tx.len() {
            return Err(UsageError::TransmitPending);
        }
        let allowed = self.capacity(stream)?;
        if len > allowed {
            return Err(UsageError::ExceedsCapacity { requested: len, allowed });
        }
        let header = FrameHeader {
            length: len as u32,
            kind: FrameType::Data,
            flags: if end_stream { flags::END_STREAM } else { 0 },
            stream,
        };
        let written = header.encode(out)?;
        self.send_window -= len as i64;
        // NOTE(unwrap): `capacity` found the stream.
        let s = self.streams.get_mut(stream).unwrap();
        s.send_window -= len as i32;
        let remote_ended = s.has(Stream::REMOTE_ENDED);
        if end_stream {
            self.end_local(stream, remote_ended);
        }
        Ok(written)
    }

    /// The next stream that was blocked (its send capacity was 0) and may send again.
    pub fn poll_writable(&mut self) -> Option<StreamId> {
        let s = self.streams.iter_mut().find(|s| s.has(Stream::WRITABLE_DUE))?;
        s.flags &= !(Stream::WRITABLE_DUE | Stream::SEND_BLOCKED);
        Some(s.id)
    }

    /// Whether frames are owed to the peer.
    pub fn wants_transmit(&self) -> bool {
        self.tx_start != self.tx.len()
    }

    /// Copies the frames owed to the peer into `out` and returns how many bytes it wrote;
    /// call until it returns 0.
    pub fn poll_transmit(&mut self, out: &mut [u8]) -> usize {
        let pending = &self.tx[self.tx_start..];
        let n = pending.len().min(out.len());
        out[..n].copy_from_slice(&pending[..n]);
        self.advance_transmit(n);
        n
    }

    /// The frames owed to the peer, for a caller that writes them from here (`writev`);
    /// tell [`advance_transmit`](Self::advance_transmit) how many bytes went out.
    pub fn transmit_buffer(&self) -> &[u8] {
        &self.tx[self.tx_start..]
    }

    /// Drops `n` bytes from the front of [`transmit_buffer`](Self::transmit_buffer).
    pub fn advance_transmit(&mut self, n: usize) {
        self.tx_start = (self.tx_start + n).min(self.tx.len());
        if self.tx_start == self.tx.len() {
            self.tx_start = 0;
            self.queued_control = 0;
            if self.tx.capacity() > 256 {
                // A burst of response heads is over: an idle connection keeps little.
                self.tx = Vec::new();
            } else {
                self.tx.clear();
            }
        }
    }

    fn request(&self) -> Request<'_> {
        // NOTE(unwrap): set with the step that produces a request event.
        Request::new(&self.headers, self.pseudo.unwrap())
    }

    /// Reads one frame (or one piece of a DATA payload) from the front of `input`.
    fn step(&mut self, input: &[u8]) -> Result<(usize, Step), ConnectionError> {
        if self.phase == Phase::Preface {
            // §3.4: "Clients and servers MUST treat an invalid connection preface as a
            // connection error of type PROTOCOL_ERROR."
            let n = input.len().min(PREFACE.len());
            if input[..n] != PREFACE[..n] {
                return Err(protocol_error("invalid connection preface"));
            }
            if n < PREFACE.len() {
                return Ok((0, Step::More));
            }
            self.phase = Phase::FirstSettings;
            return Ok((n, Step::Continue));
        }
        if let Some(data) = self.data {
            return Ok(self.data_payload(data, input));
        }
        let Some(header) = FrameHeader::parse(input) else { return Ok((0, Step::More)) };
        if header.length > self.config.max_frame_size {
            return Err(ConnectionError {
                code: ErrorCode::FRAME_SIZE_ERROR,
                reason: "frame larger than SETTINGS_MAX_FRAME_SIZE",
            });
        }
        // §3.4: the preface's SETTINGS "MUST be the first frame the client sends".
        if self.phase == Phase::FirstSettings
            && (header.kind != FrameType::Settings || header.has(flags::ACK))
        {
            return Err(protocol_error("first frame not SETTINGS"));
        }
        // §6.10: a header block must be followed by its CONTINUATIONs and nothing else,
        // "Any other type of frame or a frame on a different stream MUST be treated as a
        // connection error ... PROTOCOL_ERROR."
        if let Some(c) = self.continuation
            && (header.kind != FrameType::Continuation || header.stream != c.stream)
        {
            return Err(protocol_error("header block interrupted"));
        }
        if header.kind == FrameType::Data {
            return self.data_header(&header, input);
        }
        let end = HEADER_LEN + header.length as usize;
        let Some(payload) = input.get(HEADER_LEN..end) else { return Ok((0, Step::More)) };
        let step = match frame::Frame::parse(&header, payload) {
            Ok(frame) => self.frame(frame)?,
            Err(FrameError::Connection(error)) => return Err(error),
            Err(FrameError::Stream(stream, code)) => self.stream_error(stream, code)?,
        };
        Ok((end, step))
    }

    /// A DATA frame's header (and pad length): flow control and the stream's state are
    /// checked on the whole frame before any of its payload is handed out.
    fn data_header(
        &mut self,
        header: &FrameHeader,
        input: &[u8],
    ) -> Result<(usize, Step), ConnectionError> {
        let stream = header.stream;
        if stream == StreamId::CONNECTION {
            return Err(protocol_error("DATA on stream 0"));
        }
        let (used, pad) = if header.has(flags::PADDED) {
            let Some(&pad) = input.get(HEADER_LEN) else { return Ok((0, Step::More)) };
            // §6.1: padding as long as the payload or longer is a PROTOCOL_ERROR.
            if u32::from(pad) >= header.length {
                return Err(protocol_error("padding longer than the frame"));
            }
            (HEADER_LEN + 1, u32::from(pad))
        } else {
            (HEADER_LEN, 0)
        };
        let data_len = header.length - pad - (used - HEADER_LEN) as u32;
        let end_stream = header.has(flags::END_STREAM);
        // §6.9.1: "A receiver MAY respond with a GOAWAY frame with FLOW_CONTROL_ERROR
        // ... if it is unable to accept a frame": the connection window is a hard bound.
        self.recv_window -= i64::from(header.length);
        if self.recv_window < 0 {
            self.counters.flow_control_errors += 1;
            return Err(ConnectionError {
                code: ErrorCode::FLOW_CONTROL_ERROR,
                reason: "DATA past the connection window",
            });
        }
        // §5.1: DATA on an idle stream is a connection error PROTOCOL_ERROR.
        if stream > self.last_peer_stream || !stream.is_client_initiated() {
            return Err(protocol_error("DATA on an idle stream"));
        }
        let mut step = Step::Continue;
        let state = self.streams.get_mut(stream).map(|s| {
            if s.has(Stream::REMOTE_ENDED) {
                return Err(ErrorCode::STREAM_CLOSED);
            }
            s.recv_window -= header.length as i32;
            if s.recv_window < 0 {
                return Err(ErrorCode::FLOW_CONTROL_ERROR);
            }
            // Padding is flow-controlled but never reaches the caller: credit it now.
            s.to_announce += header.length - data_len;
            s.unconsumed += data_len;
            if end_stream {
                s.set(Stream::REMOTE_ENDED);
            }
            Ok(())
        });
        let deliver = match state {
            Some(Ok(())) => {
                self.to_announce += header.length - data_len;
                true
            }
            // §6.9: past the stream's window, a stream error FLOW_CONTROL_ERROR. §5.1
            // half-closed (remote): "an endpoint ... MUST respond with a stream error ...
            // STREAM_CLOSED".
            Some(Err(code)) => {
                if code == ErrorCode::FLOW_CONTROL_ERROR {
                    self.counters.flow_control_errors += 1;
                }
                step = self.stream_error(stream, code)?;
                false
            }
            // A closed stream (reset, or finished): the frame may have crossed our
            // RST_STREAM, so it is dropped without another reset.
            None => false,
        };
        if !deliver {
            self.announce(header.length);
        }
        self.data =
            Some(DataFrame { stream, data_left: data_len, pad_left: pad, end_stream, deliver });
        if deliver && data_len == 0 {
            if pad == 0 {
                self.data = None;
            }
            if end_stream {
                step = Step::Data { stream, len: 0, end_stream: true };
            }
        }
        Ok((used, step))
    }

    /// The next piece of the DATA payload (or its padding) that `input` holds.
    fn data_payload(&mut self, mut data: DataFrame, input: &[u8]) -> (usize, Step) {
        let (used, step) = if data.data_left > 0 {
            let n = input.len().min(data.data_left as usize);
            if n == 0 {
                return (0, Step::More);
            }
            data.data_left -= n as u32;
            let end_stream = data.end_stream && data.data_left == 0;
            let step = if data.deliver {
                Step::Data { stream: data.stream, len: n, end_stream }
            } else {
                Step::Continue
            };
            (n, step)
        } else {
            let n = input.len().min(data.pad_left as usize);
            if n == 0 && data.pad_left > 0 {
                return (0, Step::More);
            }
            data.pad_left -= n as u32;
            (n, Step::Continue)
        };
        self.data = (data.data_left > 0 || data.pad_left > 0).then_some(data);
        (used, step)
    }

    /// A whole frame other than DATA.
    fn frame(&mut self, frame: frame::Frame<'_>) -> Result<Step, ConnectionError> {
        use frame::Frame;
        match frame {
            Frame::Headers { stream, block, end_stream, end_headers, priority } => {
                // §5.1.1: "Streams initiated by a client MUST use odd-numbered stream
                // identifiers".
                if !stream.is_client_initiated() {
                    return Err(protocol_error("HEADERS on an even stream"));
                }
                // §5.3.1: "A stream cannot depend on itself ... stream error PROTOCOL_ERROR."
                let self_dependent = priority.is_some_and(|p| p.dependency == stream);
                if end_headers {
                    return self.header_block(stream, block, end_stream, self_dependent);
                }
                if block.len() > self.config.max_header_list_size as usize {
                    return Err(self.header_block_flood());
                }
                self.block = block.to_vec();
                self.continuation =
                    Some(Continuation { stream, end_stream, self_dependent, frames: 1 });
                Ok(Step::Continue)
            }
            Frame::Continuation { stream, block, end_headers } => {
                let Some(mut c) = self.continuation else {
                    return Err(protocol_error("CONTINUATION without HEADERS"));
                };
                c.frames += 1;
                let too_long =
                    self.block.len() + block.len() > self.config.max_header_list_size as usize;
                if c.frames > self.config.max_header_block_frames || too_long {
                    return Err(self.header_block_flood());
                }
                self.block.extend_from_slice(block);
                if !end_headers {
                    self.continuation = Some(c);
                    return Ok(Step::Continue);
                }
                self.continuation = None;
                let block = core::mem::take(&mut self.block);
                self.header_block(stream, &block, c.end_stream, c.self_dependent)
            }
            Frame::Priority { .. } | Frame::Unknown { .. } => Ok(Step::Continue),
            Frame::RstStream { stream, code } => {
                // §6.4: "If a RST_STREAM frame identifying an idle stream is received, the
                // recipient MUST treat this as a connection error ... PROTOCOL_ERROR."
                if stream > self.last_peer_stream {
                    return Err(protocol_error("RST_STREAM on an idle stream"));
                }
                let Some(s) = self.streams.get(stream) else { return Ok(Step::Continue) };
                if !s.has(Stream::ANSWERED) {
                    self.counters.unanswered_resets += 1;
                    self.reset_debt += 1;
                    if self.reset_debt > self.config.max_unanswered_resets {
                        return Err(ConnectionError {
                            code: ErrorCode::ENHANCE_YOUR_CALM,
                            reason: "too many streams reset before an answer (rapid reset)",
                        });
                    }
                }
                self.remove_stream(stream);
                Ok(Step::Reset(stream, code, true))
            }
            Frame::Settings { ack: true, .. } => {
                if !self.settings_acked {
                    // Our SETTINGS are in effect from now on (§6.5.3).
                    self.settings_acked = true;
                    let delta = i64::from(self.config.initial_stream_window)
                        - i64::from(self.local_initial_window);
                    for s in self.streams.iter_mut() {
                        s.recv_window = (i64::from(s.recv_window) + delta) as i32;
                    }
                    self.local_initial_window = self.config.initial_stream_window;
                    self.decoder.set_max_allowed(self.config.header_table_size as usize);
                }
                Ok(Step::Continue)
            }
            Frame::Settings { ack: false, settings } => {
                for setting in settings.iter() {
                    match setting.id {
                        Setting::INITIAL_WINDOW_SIZE => self.peer_initial_window(setting.value)?,
                        Setting::MAX_FRAME_SIZE => self.peer_max_frame_size = setting.value,
                        // Our encoder uses no dynamic table; we push nothing; the rest is
                        // advisory or unknown ("MUST ignore", §6.5.2).
                        _ => {}
                    }
                }
                if self.phase == Phase::FirstSettings {
                    self.phase = Phase::Open;
                }
                self.counters.settings_acks += 1;
                self.queue(Frame::Settings { ack: true, settings: Settings::EMPTY });
                self.control_queued()?;
                Ok(Step::Continue)
            }
            Frame::Ping { ack: false, data } => {
                self.counters.ping_acks += 1;
                self.queue(Frame::Ping { ack: true, data });
                self.control_queued()?;
                Ok(Step::Continue)
            }
            Frame::Ping { ack: true, .. } => Ok(Step::Continue),
            Frame::GoAway { last_stream, code, .. } => {
                self.peer_going_away = true;
                Ok(Step::GoAway(last_stream, code))
            }
            Frame::WindowUpdate { stream: StreamId::CONNECTION, increment } => {
                // §6.9.1: "A sender MUST NOT allow a flow-control window to exceed 2^31-1
                // octets. If a sender receives a WINDOW_UPDATE that causes a flow-control
                // window to exceed this maximum, it MUST terminate either the stream or the
                // connection ... FLOW_CONTROL_ERROR."
                self.send_window += i64::from(increment);
                if self.send_window > i64::from(MAX_WINDOW) {
                    self.counters.flow_control_errors += 1;
                    return Err(ConnectionError {
                        code: ErrorCode::FLOW_CONTROL_ERROR,
                        reason: "connection window past 2^31-1",
                    });
                }
                self.wake_blocked();
                Ok(Step::Continue)
            }
            Frame::WindowUpdate { stream, increment } => {
                if stream > self.last_peer_stream {
                    return Err(protocol_error("WINDOW_UPDATE on an idle stream"));
                }
                let Some(s) = self.streams.get_mut(stream) else { return Ok(Step::Continue) };
                let window = i64::from(s.send_window) + i64::from(increment);
                if window > i64::from(MAX_WINDOW) {
                    self.counters.flow_control_errors += 1;
                    return self.stream_error(stream, ErrorCode::FLOW_CONTROL_ERROR);
                }
                s.send_window = window as i32;
                self.wake_blocked();
                Ok(Step::Continue)
            }
            // §8.4: "A client cannot push."
            Frame::PushPromise { .. } => Err(protocol_error("PUSH_PROMISE from a client")),
            Frame::Data { .. } => unreachable!("DATA is read by data_header"),
        }
    }

    /// A whole header block on `stream`: a new request, trailers, or one to drop.
    fn header_block(
        &mut self,
        stream: StreamId,
        block: &[u8],
        end_stream: bool,
        self_dependent: bool,
    ) -> Result<Step, ConnectionError> {
        // Decoded whatever happens to the stream, so the dynamic table stays in step.
        self.headers.clear(false);
        if self.decoder.decode(block, &mut self.headers).is_err() {
            return Err(ConnectionError {
                code: ErrorCode::COMPRESSION_ERROR,
                reason: "header block does not decode",
            });
        }
        if let Some(s) = self.streams.get_mut(stream) {
            self.headers.clear(true);
            // Trailers: "MUST ... END_STREAM" (§8.1), and only while the peer's side is open.
            let error = if s.has(Stream::REMOTE_ENDED) {
                ErrorCode::STREAM_CLOSED
            } else if !end_stream {
                ErrorCode::PROTOCOL_ERROR
            } else {
                s.set(Stream::REMOTE_ENDED);
                return Ok(Step::Data { stream, len: 0, end_stream: true });
            };
            return self.stream_error(stream, error);
        }
        if stream <= self.last_peer_stream {
            // A closed stream: its frames may cross our reset.
            self.headers.clear(true);
            return Ok(Step::Continue);
        }
        self.last_peer_stream = stream;
        if self.going_away.is_some() {
            // Opened after our GOAWAY: ignored (§6.8), and its DATA dropped as a closed
            // stream's.
            self.headers.clear(true);
            return Ok(Step::Continue);
        }
        if self.streams.len() >= self.config.max_concurrent_streams as usize {
            // §5.1.2: "An endpoint that receives a HEADERS frame that causes its advertised
            // concurrent stream limit to be exceeded MUST treat this as a stream error ...
            // PROTOCOL_ERROR or REFUSED_STREAM."
            self.counters.refused_streams += 1;
            self.headers.clear(true);
            return self.stream_error(stream, ErrorCode::REFUSED_STREAM);
        }
        if self_dependent {
            self.headers.clear(true);
            return self.stream_error(stream, ErrorCode::PROTOCOL_ERROR);
        }
        if self.headers.overflowed() {
            // §10.5.1: "A server that receives a larger header section than it is willing
            // to handle can send an HTTP 431 (Request Header Fields Too Large) status code".
            self.counters.header_lists_too_large += 1;
            self.headers.clear(true);
            return self.answer_for_peer(stream, 431, end_stream);
        }
        let (pseudo, kind) = match PseudoFields::check(&self.headers) {
            Ok(checked) => checked,
            Err(_) => {
                self.counters.malformed_requests += 1;
                self.headers.clear(true);
                return self.stream_error(stream, ErrorCode::PROTOCOL_ERROR);
            }
        };
        if kind == RequestKind::OtherProtocol {
            // RFC 9220 §3 (for RFC 8441 too): an unsupported :protocol "SHOULD" get 501.
            self.counters.unsupported_protocols += 1;
            self.headers.clear(true);
            return self.answer_for_peer(stream, 501, end_stream);
        }
        let mut flags = if end_stream { Stream::REMOTE_ENDED } else { 0 };
        if kind == RequestKind::WebSocket {
            flags |= Stream::WEBSOCKET;
        }
        self.streams.push(Stream::new(
            stream,
            self.peer_initial_window,
            self.local_initial_window,
            flags,
        ));
        self.pseudo = Some(pseudo);
        Ok(if kind == RequestKind::WebSocket {
            self.counters.websockets += 1;
            Step::WebSocket(stream)
        } else {
            self.counters.requests += 1;
            Step::Request(stream, end_stream)
        })
    }

    /// Answers a stream the caller never saw with `status` (431, 501) and ends it.
    fn answer_for_peer(
        &mut self,
        stream: StreamId,
        status: u16,
        end_stream: bool,
    ) -> Result<Step, ConnectionError> {
        self.queue_response(stream, status, &[], true);
        if !end_stream {
            self.queue(frame::Frame::RstStream { stream, code: ErrorCode::NO_ERROR });
        }
        self.count_error_reset()?;
        Ok(Step::Continue)
    }

    /// A stream error: `RST_STREAM` with `code`, and the stream forgotten.
    fn stream_error(&mut self, stream: StreamId, code: ErrorCode) -> Result<Step, ConnectionError> {
        // §6.4: "RST_STREAM frames MUST NOT be sent for a stream in the idle state."
        if stream > self.last_peer_stream {
            return Err(protocol_error("stream error on an idle stream"));
        }
        self.queue(frame::Frame::RstStream { stream, code });
        self.count_error_reset()?;
        Ok(match self.remove_stream(stream) {
            Some(_) => Step::Reset(stream, code, false),
            None => Step::Continue,
        })
    }

    fn count_error_reset(&mut self) -> Result<(), ConnectionError> {
        self.counters.error_resets += 1;
        self.error_resets += 1;
        if self.error_resets > self.config.max_error_resets {
            return Err(ConnectionError {
                code: ErrorCode::ENHANCE_YOUR_CALM,
                reason: "too many stream errors",
            });
        }
        self.control_queued()
    }

    fn header_block_flood(&mut self) -> ConnectionError {
        self.counters.header_block_floods += 1;
        ConnectionError {
            code: ErrorCode::ENHANCE_YOUR_CALM,
            reason: "header block past its bound (CONTINUATION flood)",
        }
    }

    /// One more frame the peer made us queue; too many unread is a flood.
    fn control_queued(&mut self) -> Result<(), ConnectionError> {
        self.queued_control += 1;
        if self.queued_control > self.config.max_queued_control_frames {
            self.counters.control_floods += 1;
            return Err(ConnectionError {
                code: ErrorCode::ENHANCE_YOUR_CALM,
                reason: "control frames queued faster than they are read",
            });
        }
        Ok(())
    }

    /// A new SETTINGS_INITIAL_WINDOW_SIZE from the peer changes every stream's send window
    /// by the difference (§6.9.2).
    fn peer_initial_window(&mut self, value: u32) -> Result<(), ConnectionError> {
        let delta = i64::from(value) - i64::from(self.peer_initial_window);
        for s in self.streams.iter_mut() {
            let window = i64::from(s.send_window) + delta;
            // §6.9.2: "An endpoint MUST treat a change to SETTINGS_INITIAL_WINDOW_SIZE that
            // causes any flow-control window to exceed the maximum size as a connection
            // error ... FLOW_CONTROL_ERROR."
            if window > i64::from(MAX_WINDOW) {
                self.counters.flow_control_errors += 1;
                return Err(ConnectionError {
                    code: ErrorCode::FLOW_CONTROL_ERROR,
                    reason: "initial window change past 2^31-1",
                });
            }
            s.send_window = window as i32;
        }
        self.peer_initial_window = value;
        self.wake_blocked();
        Ok(())
    }

    /// Marks the blocked streams that have send capacity again.
    fn wake_blocked(&mut self) {
        if self.send_window <= 0 {
            return;
        }
        for s in self.streams.iter_mut() {
            if s.has(Stream::SEND_BLOCKED) && s.send_window > 0 {
                s.set(Stream::WRITABLE_DUE);
            }
        }
    }

    fn capacity(&self, stream: StreamId) -> Result<usize, UsageError> {
        if self.phase == Phase::Failed {
            return Err(UsageError::Closed);
        }
        let s = self.streams.get(stream).ok_or(UsageError::UnknownStream(stream))?;
        if !s.has(Stream::ANSWERED) {
            return Err(UsageError::NotAnswered(stream));
        }
        if s.has(Stream::LOCAL_ENDED) {
            return Err(UsageError::SendEnded(stream));
        }
        let window = self.send_window.min(i64::from(s.send_window)).max(0);
        Ok(window.min(i64::from(self.peer_max_frame_size)) as usize)
    }

    /// We ended our side of `stream`: it goes when the peer's side is done too, or at once
    /// (with `RST_STREAM` `NO_ERROR`, §8.1) when the peer is still sending.
    fn end_local(&mut self, stream: StreamId, remote_ended: bool) {
        if !remote_ended {
            self.queue(frame::Frame::RstStream { stream, code: ErrorCode::NO_ERROR });
            self.remove_stream(stream);
            return;
        }
        // NOTE(unwrap): callers found the stream.
        let s = self.streams.get_mut(stream).unwrap();
        s.set(Stream::LOCAL_ENDED);
        if s.finished() {
            self.streams.remove(stream);
        }
    }

    /// Forgets a stream; what it held unconsumed (and the rest of a DATA frame arriving for
    /// it) goes back to the connection window, since the caller drops it.
    fn remove_stream(&mut self, stream: StreamId) -> Option<Stream> {
        let s = self.streams.remove(stream)?;
        let mut credit = s.unconsumed;
        if let Some(data) = &mut self.data
            && data.stream == stream
            && data.deliver
        {
            data.deliver = false;
            credit += data.data_left;
        }
        self.announce(credit);
        Some(s)
    }

    /// Credits `len` consumed bytes to the connection window, announcing them once half the
    /// window is consumed.
    fn announce(&mut self, len: u32) {
        self.to_announce += len;
        if self.to_announce >= self.config.connection_window / 2 && self.phase != Phase::Failed {
            let increment = core::mem::take(&mut self.to_announce);
            self.recv_window += i64::from(increment);
            self.queue(frame::Frame::WindowUpdate { stream: StreamId::CONNECTION, increment });
        }
    }

    /// Queues a response head, split into HEADERS and CONTINUATIONs by the peer's frame size.
    fn queue_response(
        &mut self,
        stream: StreamId,
        status: u16,
        headers: &[(&[u8], &[u8])],
        end_stream: bool,
    ) {
        let mut block = Vec::new();
        hpack::encode_status(status, &mut block);
        for (name, value) in headers {
            hpack::encode_field(name, value, &mut block);
        }
        let max = self.peer_max_frame_size as usize;
        let mut chunks = block.chunks(max).peekable();
        let first = chunks.next().unwrap_or_default();
        let last = chunks.peek().is_none();
        self.queue(frame::Frame::Headers {
            stream,
            block: first,
            end_stream,
            end_headers: last,
            priority: None,
        });
        while let Some(chunk) = chunks.next() {
            let end_headers = chunks.peek().is_none();
            self.queue(frame::Frame::Continuation { stream, block: chunk, end_headers });
        }
    }

    fn queue(&mut self, frame: frame::Frame<'_>) {
        let start = self.tx.len();
        self.tx.resize(start + HEADER_LEN + 16, 0);
        let written = match frame.encode(&mut self.tx[start..]) {
            Ok(n) => n,
            Err(too_small) => {
                self.tx.resize(start + too_small.required, 0);
                // NOTE(unwrap): the buffer now has the size the frame asked for.
                frame.encode(&mut self.tx[start..]).unwrap()
            }
        };
        self.tx.truncate(start + written);
    }

    /// A connection error: GOAWAY with its code, naming the last stream we processed
    /// (§5.4.1), its reason as debug data; nothing more is read.
    fn fail(&mut self, error: ConnectionError) {
        self.phase = Phase::Failed;
        self.counters.goaway = Some(error);
        self.data = None;
        self.continuation = None;
        self.block = Vec::new();
        self.queue(frame::Frame::GoAway {
            last_stream: self.going_away.unwrap_or(self.last_peer_stream),
            code: error.code,
            debug: error.reason.as_bytes(),
        });
    }
}

/// Whether a response field is one we may send: a lowercase token name, not a pseudo-header
/// nor connection-specific (RFC 9113 §8.2), and a value without CR, LF or NUL.
fn valid_field(name: &[u8], value: &[u8]) -> bool {
    !name.is_empty()
        && name.iter().all(|&c| c.is_ascii_graphic() && !c.is_ascii_uppercase() && c != b':')
        && !matches!(
            name,
            b"connection" | b"proxy-connection" | b"keep-alive" | b"transfer-encoding" | b"upgrade"
        )
        && !value.iter().any(|&c| matches!(c, 0 | b'\r' | b'\n'))
}

fn protocol_error(reason: &'static str) -> ConnectionError {
    ConnectionError { code: ErrorCode::PROTOCOL_ERROR, reason }
}
