//! WebSockets over HTTP/2 (RFC 8441) in the loop: an HTTP/2 connection's core
//! ([`freeboard_h2::Connection`]) in the loop's `http2` table, keyed by the slot of the
//! connection's entry (which keeps its socket, and its session only for the bytes of an
//! incomplete frame); each stream a slab entry of its own whose transport is
//! [`Stream::Http2`](crate::transport::Stream) and whose session is an ordinary one: its
//! queue, watermarks, policy, timers and handler.
//!
//! A stream is admitted as an HTTP/1.1 request is: its head is written as the HTTP/1.1
//! request it stands for (an extended CONNECT as a GET with `Upgrade: websocket`) and goes
//! through the same routing, origin, token, webhook and budget checks, so that every
//! decision is made in one place. The response the session queues (`101`, a refusal, a
//! plain route's answer) is read back from the front of its queue and sent as HEADERS
//! (`101` is `200`, RFC 8441 §5), the rest of the queue as DATA frames.
//!
//! DATA is handed to the stream's session in the loop's read buffer, as a socket's bytes
//! are: nothing is copied. The peer's window is reopened (`consume`) only while the session
//! wants input, so a stream whose queue is past its high watermark stops its peer after one
//! window, as a paused socket does. A session's queue leaves only within the stream's and
//! the connection's send windows: a peer that does not open them leaves the queue to grow
//! until its watermarks and policy act.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::Ordering;

use freeboard_h2::{Connection, Counters, ErrorCode, Event, StreamId};
use freeboard_proto::Instant;

use super::event_loop::{Entry, EventLoop, READ_BYTES_PER_TURN};
use super::http2_connection::{
    Http2Connection, MAX_DATA, StreamSlot, connection_bound, core_config,
};
use crate::metrics::Reason;
use crate::session::{Phase, Session};
use crate::transport::{Io, Transport};

/// The client connection preface (RFC 9113 §3.4).
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The `Sec-WebSocket-Key` of the HTTP/1.1 request an extended CONNECT stands for: RFC 8441
/// §5 has no key (nor accept), and the 101's accept is never sent.
const STAND_IN_KEY: &str = "AAAAAAAAAAAAAAAAAAAAAA==";
/// How far out the connection entry's own request deadline is put: an HTTP/2 connection
/// ends when its peer does, or at shutdown, not at a handshake timeout.
const NO_DEADLINE_MS: u64 = u64::MAX / 4;

/// What a core event asks of the loop, once the core's borrow of the input is over.
enum Action {
    Open { id: StreamId, head: Vec<u8>, websocket: bool, body: bool },
    Data { id: StreamId, len: usize, end_stream: bool },
    Reset { id: StreamId, remote: bool },
}

impl<T: Transport> EventLoop<T> {
    /// Takes the connection in `token` over as HTTP/2, the client preface at the front of
    /// `buf`. Always `false` (no WebSocket opened on the entry itself).
    pub(super) fn start_http2(&mut self, token: usize, now: Instant, buf: &mut [u8]) -> bool {
        let mut conn = Box::new(Http2Connection {
            core: Connection::new(core_config()),
            streams: HashMap::new(),
            torn: Vec::new(),
            exported: Counters::default(),
            ending: false,
        });
        let chunk = self.pool.chunk_size();
        let reserve = self.config.connection_reserve + connection_bound();
        if self.pool.chunks_free() * chunk < reserve {
            // Not affordable: GOAWAY before any stream (RFC 9113 §6.8), counted.
            self.shared.metrics.access_refusal("budget");
            conn.core.go_away();
            conn.ending = true;
            self.count_goaway(ErrorCode::NO_ERROR);
        }
        let entry = &mut self.conns[token];
        entry.session.phase = Phase::Request { deadline: Instant::from_millis(NO_DEADLINE_MS) };
        if !entry.upgraded {
            entry.upgraded = true;
            self.upgraded += 1;
        }
        self.http2.insert(token, conn);
        self.shared.metrics.http2_connections.inc();
        self.charge_connections();
        self.http2_input(token, now, buf, false);
        self.mark(token);
        false
    }

    /// Reads an HTTP/2 connection and hands what it sent to its core and streams.
    pub(super) fn read_http2(&mut self, token: usize, now: Instant) {
        let mut buf = std::mem::take(&mut self.read_buf);
        let entry = &mut self.conns[token];
        let partial = entry.session.partial_mut();
        let mut have = partial.copy_to(&self.pool, &mut buf);
        self.head_chunks -= have.div_ceil(self.pool.chunk_size());
        partial.clear(&mut self.pool);
        let mut eof = false;
        let mut io = Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
        let start = have;
        while have < buf.len() && have - start < READ_BYTES_PER_TURN {
            match entry.stream.read(&mut io, &mut buf[have..]) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => have += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
        self.stats.bytes_in += (have - start) as u64;
        if !eof && (have == buf.len() || have - start >= READ_BYTES_PER_TURN) {
            // More may wait in the socket, and no new edge will say so.
            self.resume.push(token);
        }
        self.http2_input(token, now, &mut buf[..have], eof);
        self.read_buf = buf;
        self.mark(token);
    }

    /// Feeds `buf` to the connection's core and acts on each event; keeps an incomplete
    /// frame for the next read.
    fn http2_input(&mut self, token: usize, now: Instant, buf: &mut [u8], eof: bool) {
        let mut at = 0;
        loop {
            let Some(conn) = self.http2.get_mut(&token) else { return };
            let received = match conn.core.receive(&buf[at..]) {
                Ok(received) => received,
                Err(error) => {
                    conn.ending = true;
                    let code = error.code;
                    tracing::debug!(peer = %self.conns[token].peer, reason = error.reason, "HTTP/2 connection error");
                    self.count_goaway(code);
                    at = buf.len();
                    break;
                }
            };
            let consumed = received.consumed;
            let action = match received.event {
                None => None,
                Some(Event::WebSocket { stream, request }) => Some(Action::Open {
                    id: stream,
                    head: http1_head(&request, true),
                    websocket: true,
                    body: false,
                }),
                Some(Event::Request { stream, request, end_stream }) => Some(Action::Open {
                    id: stream,
                    head: http1_head(&request, false),
                    websocket: false,
                    body: !end_stream,
                }),
                Some(Event::Data { stream, data, end_stream }) => {
                    Some(Action::Data { id: stream, len: data.len(), end_stream })
                }
                Some(Event::Reset { stream, remote, .. }) => {
                    Some(Action::Reset { id: stream, remote })
                }
                Some(Event::GoAway { .. }) => None,
            };
            at += consumed;
            match action {
                None if consumed == 0 || at == buf.len() => break,
                None => {}
                Some(Action::Open { id, head, websocket, body }) => {
                    self.open_stream(token, now, id, head, websocket, body);
                }
                Some(Action::Data { id, len, end_stream }) => {
                    self.stream_data(token, now, id, &mut buf[at - len..at], end_stream);
                }
                Some(Action::Reset { id, remote }) => self.stream_reset(token, now, id, remote),
            }
        }
        self.export_counters(token);
        if eof {
            self.remove(token);
            return;
        }
        if at < buf.len() && self.conns.contains(token) {
            let rest = &buf[at..];
            let chunks = rest.len().div_ceil(self.pool.chunk_size());
            let partial = self.conns[token].session.partial_mut();
            if partial.append(&mut self.pool, rest).is_err() {
                // The pool cannot keep an incomplete frame: the connection cannot go on.
                partial.clear(&mut self.pool);
                self.shared.metrics.access_refusal("budget");
                self.remove(token);
                return;
            }
            self.head_chunks += chunks;
        }
    }

    /// Opens a session for stream `id` of the connection in `token`, and admits it as the
    /// HTTP/1.1 request `head` would be.
    fn open_stream(
        &mut self,
        token: usize,
        now: Instant,
        id: StreamId,
        mut head: Vec<u8>,
        websocket: bool,
        body: bool,
    ) {
        let Some(stream) = T::http2_stream(token, id) else { return };
        if body {
            // A request body (an HTTP publish) is not read over HTTP/2: 501, said so.
            let conn = self.http2.get_mut(&token).expect("the connection being read");
            let _ = conn.core.respond(id, 501, &[], true);
            self.shared.metrics.refuse(501);
            return;
        }
        let parent = &self.conns[token];
        let (peer, limited, admin) = (parent.peer, parent.limited, parent.admin_listener);
        // Counted as a connection (max_connections, per address) while it is open.
        self.shared.open.fetch_add(1, Ordering::Relaxed);
        let seconds = now.as_millis() as f64 / 1000.0;
        let limited = limited.or(self.shared.attribute(&self.config, peer.ip(), seconds));
        self.serial += 1;
        let limits = &self.config.limits;
        let stream_token = self.conns.insert(Entry {
            serial: self.serial,
            stream,
            peer,
            session: Session::request(limits.send_queue(), now + limits.handshake_timeout),
            route: 0,
            limited,
            attributed: true,
            read_closed: false,
            admin_listener: admin,
            event_stream: None,
            armed: None,
            dirty: false,
            upgraded: false,
            counted: 0,
            queued_at: 0,
        });
        let slot = StreamSlot {
            token: stream_token,
            serial: self.serial,
            answered: false,
            unconsumed: 0,
            remote_ended: !websocket,
        };
        // NOTE(unwrap): the connection is being read.
        self.http2.get_mut(&token).unwrap().streams.insert(id, slot);
        self.http2_streams += 1;
        self.shared.metrics.http2_streams.inc();
        self.shared.metrics.http2_streams_opened.inc();
        self.charge_connections();
        self.request(stream_token, now, &mut head, !websocket);
        self.mark(stream_token);
    }

    /// DATA for stream `id`: its session parses it in place.
    fn stream_data(
        &mut self,
        token: usize,
        now: Instant,
        id: StreamId,
        data: &mut [u8],
        end_stream: bool,
    ) {
        let len = data.len();
        let Some(stream_token) = self.stream_token(token, id) else {
            // Nobody's: the window is the connection's to reopen.
            let conn = self.http2.get_mut(&token).expect("the connection being read");
            let _ = conn.core.consume(id, len);
            return;
        };
        let open = matches!(self.conns[stream_token].session.phase, Phase::Open(_));
        if !open && matches!(self.conns[stream_token].session.phase, Phase::Request { .. }) {
            // Data before the 200 (the decision is pending). RFC 8441 §5 has the client wait
            // for the response: refused as an HTTP/1.1 client's early data is.
            self.remove(stream_token);
            return;
        }
        if open && len > 0 {
            self.conns[stream_token].session.count_read(len);
            self.reading = Some(stream_token);
            self.receive(stream_token, now, data, false);
            self.reading = None;
            self.fan_out_outbox(now);
        }
        let wants = self.conns.get(stream_token).is_some_and(|e| e.session.wants_input());
        let Some(conn) = self.http2.get_mut(&token) else { return };
        if let Some(slot) = conn.streams.get_mut(&id) {
            if wants || !open {
                let _ = conn.core.consume(id, len + std::mem::take(&mut slot.unconsumed));
            } else {
                slot.unconsumed += len;
            }
            if end_stream {
                slot.remote_ended = true;
            }
        }
        if end_stream && self.conns.contains(stream_token) {
            match self.conns[stream_token].session.phase {
                Phase::Linger { .. } => {
                    self.remove(stream_token);
                    return;
                }
                Phase::Open(_) => self.end_of_input(stream_token, now),
                _ => {}
            }
        }
        self.mark(stream_token);
    }

    /// The peer (`remote`) or the core reset stream `id`: its session ends.
    fn stream_reset(&mut self, token: usize, now: Instant, id: StreamId, remote: bool) {
        let reason = if remote { "client" } else { "server" };
        self.shared.metrics.http2_resets.get_or_create(&Reason { reason: reason.into() }).inc();
        let Some(stream_token) = self.stream_token(token, id) else { return };
        if let Some(conn) = self.http2.get_mut(&token) {
            conn.streams.remove(&id);
        }
        self.end_of_input(stream_token, now);
        self.remove(stream_token);
    }

    /// The entry of stream `id` of the connection in `token`, if it still has one.
    fn stream_token(&self, token: usize, id: StreamId) -> Option<usize> {
        let slot = self.http2.get(&token)?.streams.get(&id)?;
        let entry = self.conns.get(slot.token)?;
        (entry.serial == slot.serial).then_some(slot.token)
    }

    /// A flush of the connection's own entry: what the core and a torn frame owe, then the
    /// streams it may now write (a window reopened, the socket writable again) are marked.
    /// Removed once it has ended and owes nothing.
    pub(super) fn flush_http2(&mut self, token: usize) {
        let Some(conn) = self.http2.get_mut(&token) else { return };
        let mut io = Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
        match write_owed(conn, &mut self.conns[token].stream, &mut io) {
            Err(_) => {
                self.remove(token);
                return;
            }
            Ok(false) => return, // WRITABLE brings it back
            Ok(true) => {}
        }
        let mut wake = Vec::new();
        while let Some(id) = conn.core.poll_writable() {
            wake.extend(conn.streams.get(&id).map(|slot| slot.token));
        }
        for slot in conn.streams.values() {
            if self.conns.get(slot.token).is_some_and(|e| e.session.buffered() > 0) {
                wake.push(slot.token);
            }
        }
        let done = conn.core.is_done() || (conn.ending && !conn.core.wants_transmit());
        for stream_token in wake {
            self.mark(stream_token);
        }
        if done {
            self.remove(token);
        }
    }

    /// Writes stream `token`'s queue as DATA of stream `id` on the connection in
    /// `connection`, within its send windows; first its response head (read back from the
    /// queue), and the window its session reopened. `false` when the stream (or its
    /// connection) is gone.
    pub(super) fn write_http2_stream(
        &mut self,
        token: usize,
        connection: usize,
        id: StreamId,
    ) -> bool {
        let Some(conn) = self.http2.get_mut(&connection) else {
            self.remove(token);
            return false;
        };
        let Some(slot) = conn.streams.get_mut(&id) else {
            self.remove(token);
            return false;
        };
        let entry = &mut self.conns[token];
        if slot.unconsumed > 0 && entry.session.wants_input() {
            let _ = conn.core.consume(id, std::mem::take(&mut slot.unconsumed));
        }
        let answerable = !matches!(entry.session.phase, Phase::Request { .. } | Phase::Body(_));
        if !slot.answered && answerable && entry.session.buffered() > 0 {
            if answer(&mut conn.core, id, &mut entry.session, &mut self.pool).is_err() {
                // Not a head we can answer with: the stream is reset.
                self.remove(token);
                return false;
            }
            slot.answered = true;
        }
        if !slot.answered {
            return true;
        }
        // NOTE(unwrap): both entries exist (the connection's removal removes its streams).
        let (entry, parent) = self.conns.get2_mut(token, connection).unwrap();
        let mut io = Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
        let mut frame = [0u8; freeboard_h2::frame::HEADER_LEN + MAX_DATA];
        let written = loop {
            match write_owed(conn, &mut parent.stream, &mut io) {
                Ok(true) => {}
                other => break other.map(|_| ()),
            }
            let queued = entry.session.buffered();
            if queued == 0 {
                break Ok(());
            }
            let capacity = match conn.core.send_capacity(id) {
                Ok(0) | Err(_) => break Ok(()),
                Ok(capacity) => capacity.min(MAX_DATA).min(queued),
            };
            let header = freeboard_h2::frame::HEADER_LEN;
            let mut slices = [io::IoSlice::new(&[]); 16];
            let n = entry.session.io_slices(io.pool, &mut slices);
            let mut len = 0;
            for slice in &slices[..n] {
                let take = slice.len().min(capacity - len);
                frame[header + len..header + len + take].copy_from_slice(&slice[..take]);
                len += take;
                if len == capacity {
                    break;
                }
            }
            // NOTE(unwrap): nothing is owed (written above) and `len` is within capacity.
            conn.core.send_data_header(id, len, false, &mut frame[..header]).unwrap();
            entry.session.consume(io.pool, len);
            let bytes = &frame[..header + len];
            match parent.stream.write_vectored(&mut io, &[io::IoSlice::new(bytes)]) {
                Ok(n) if n == bytes.len() => {}
                Ok(n) => {
                    conn.torn.extend_from_slice(&bytes[n..]);
                    break Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    conn.torn.extend_from_slice(bytes);
                    break Ok(());
                }
                Err(e) => break Err(e),
            }
        };
        if written.is_err() {
            self.remove(connection);
            return false;
        }
        true
    }

    /// The session of stream `token` finished sending (its close frame, or its response):
    /// END_STREAM (or, when the frames before it cannot leave now, a reset), and the stream
    /// goes: the core forgets a stream both sides ended, and resets one the peer has not
    /// (RFC 9113 §8.1), whose later DATA it discards.
    pub(super) fn end_http2_stream(&mut self, token: usize, connection: usize, id: StreamId) {
        if let Some(conn) = self.http2.get_mut(&connection)
            && let Some(slot) = conn.streams.remove(&id)
        {
            let mut header = [0u8; freeboard_h2::frame::HEADER_LEN];
            let mut io =
                Io { pool: &mut self.pool, tls: &mut self.tls, metrics: &self.shared.metrics };
            let parent = &mut self.conns[connection].stream;
            let owed = write_owed(conn, parent, &mut io);
            if slot.answered
                && matches!(owed, Ok(true))
                && conn.core.send_data_header(id, 0, true, &mut header).is_ok()
            {
                match parent.write_vectored(&mut io, &[io::IoSlice::new(&header)]) {
                    Ok(n) => conn.torn.extend_from_slice(&header[n..]),
                    Err(_) => conn.torn.extend_from_slice(&header),
                }
            } else {
                let code = if slot.answered { ErrorCode::NO_ERROR } else { ErrorCode::CANCEL };
                let _ = conn.core.reset(id, code);
            }
            self.mark(connection);
        }
        self.remove(token);
    }

    /// Stream `token` goes: the core forgets it (a reset if it was still open), and its
    /// connection is flushed.
    pub(super) fn forget_http2_stream(&mut self, connection: usize, id: StreamId) {
        self.http2_streams -= 1;
        self.shared.metrics.http2_streams.dec();
        let Some(conn) = self.http2.get_mut(&connection) else { return };
        conn.streams.remove(&id);
        if conn.core.reset(id, ErrorCode::CANCEL).is_ok() {
            self.shared
                .metrics
                .http2_resets
                .get_or_create(&Reason { reason: "server".into() })
                .inc();
        }
        self.mark(connection);
    }

    /// The connection in `token` goes: every stream's session with it (each counted).
    pub(super) fn forget_http2_connection(&mut self, token: usize) {
        let Some(conn) = self.http2.remove(&token) else { return };
        self.shared.metrics.http2_connections.dec();
        let label = Reason { reason: "connection_end".into() };
        for slot in conn.streams.values() {
            if self.conns.get(slot.token).is_some_and(|e| e.serial == slot.serial) {
                self.shared.metrics.http2_resets.get_or_create(&label).inc();
                self.remove(slot.token);
            }
        }
        self.charge_connections();
    }

    /// A shutdown: GOAWAY `NO_ERROR`; the streams close on their own (1001), and the
    /// connection goes once the core has none left (`is_done`) or the drain deadline passes.
    pub(super) fn go_away_http2(&mut self, token: usize) {
        if let Some(conn) = self.http2.get_mut(&token) {
            conn.core.go_away();
            self.count_goaway(ErrorCode::NO_ERROR);
        }
    }

    fn count_goaway(&self, code: ErrorCode) {
        let name = code.name().map_or_else(|| format!("0x{:x}", code.0), str::to_owned);
        self.shared.metrics.http2_goaways.get_or_create(&Reason { reason: name }).inc();
    }

    /// Adds what the core counted since the last time to the metrics.
    fn export_counters(&mut self, token: usize) {
        let Some(conn) = self.http2.get_mut(&token) else { return };
        let now = *conn.core.counters();
        let refused = now.refused_streams - conn.exported.refused_streams;
        self.shared.metrics.http2_refused_streams.inc_by(refused);
        conn.exported = now;
    }
}

/// Writes what the connection owes before any DATA: what its TLS layer holds, the rest of
/// a torn frame, the core's frames. `Ok(true)` once all of it is out.
fn write_owed<T: Transport>(
    conn: &mut Http2Connection,
    stream: &mut T,
    io: &mut Io<'_>,
) -> io::Result<bool> {
    if !stream.write_pending(io)? {
        return Ok(false);
    }
    for owed in [true, false] {
        loop {
            let bytes = if owed { &conn.torn[..] } else { conn.core.transmit_buffer() };
            let total = bytes.len();
            if total == 0 {
                break;
            }
            let n = match stream.write_vectored(io, &[io::IoSlice::new(bytes)]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if owed {
                conn.torn.drain(..n);
                if conn.torn.is_empty() {
                    conn.torn = Vec::new();
                }
            } else {
                conn.core.advance_transmit(n);
            }
            if n < total {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Answers stream `id` with the HTTP/1.1 response head at the front of `session`'s queue:
/// its status (`101` as `200`, RFC 8441 §5) and its fields but those HTTP/2 forbids; the
/// head leaves the queue, its body stays for DATA.
fn answer(
    core: &mut Connection,
    id: StreamId,
    session: &mut Session,
    pool: &mut freeboard_buf::Pool<'static>,
) -> Result<(), ()> {
    let mut head = [0u8; 4096];
    let mut slices = [io::IoSlice::new(&[]); 16];
    let n = session.io_slices(pool, &mut slices);
    let mut len = 0;
    for slice in &slices[..n] {
        let take = slice.len().min(head.len() - len);
        head[len..len + take].copy_from_slice(&slice[..take]);
        len += take;
    }
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut fields);
    let Ok(httparse::Status::Complete(head_len)) = response.parse(&head[..len]) else {
        return Err(());
    };
    let status = match response.code.ok_or(())? {
        101 => 200,
        status => status,
    };
    let mut names: Vec<Vec<u8>> = Vec::new();
    let mut values: Vec<&[u8]> = Vec::new();
    for field in response.headers.iter() {
        let name = field.name.to_ascii_lowercase();
        if matches!(
            name.as_str(),
            "connection"
                | "keep-alive"
                | "proxy-connection"
                | "transfer-encoding"
                | "upgrade"
                | "sec-websocket-accept"
        ) {
            continue;
        }
        names.push(name.into_bytes());
        values.push(field.value);
    }
    let fields: Vec<(&[u8], &[u8])> =
        names.iter().map(Vec::as_slice).zip(values.iter().copied()).collect();
    core.respond(id, status, &fields, false).map_err(|_| ())?;
    session.consume(pool, head_len);
    Ok(())
}

/// The HTTP/1.1 request an HTTP/2 request head stands for: an extended CONNECT as the
/// `GET` with `Upgrade: websocket` it replaces (RFC 8441 §4), `:authority` as `Host`, the
/// regular fields as they are (the core checked them: no CR, LF or NUL).
fn http1_head(request: &freeboard_h2::Request<'_>, websocket: bool) -> Vec<u8> {
    let mut head = Vec::with_capacity(512);
    let method = if websocket { &b"GET"[..] } else { request.method() };
    head.extend_from_slice(method);
    head.push(b' ');
    head.extend_from_slice(request.path().unwrap_or(b"/"));
    head.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(authority) = request.authority() {
        head.extend_from_slice(b"host: ");
        head.extend_from_slice(authority);
        head.extend_from_slice(b"\r\n");
    }
    if websocket {
        head.extend_from_slice(b"connection: upgrade\r\nupgrade: websocket\r\n");
        head.extend_from_slice(b"sec-websocket-key: ");
        head.extend_from_slice(STAND_IN_KEY.as_bytes());
        head.extend_from_slice(b"\r\n");
        if request.header(b"sec-websocket-version").is_none() {
            head.extend_from_slice(b"sec-websocket-version: 13\r\n");
        }
    } else {
        head.extend_from_slice(b"connection: close\r\n");
    }
    for (name, value) in request.headers() {
        if matches!(name, b"host" | b"connection" | b"upgrade" | b"sec-websocket-key") {
            continue;
        }
        head.extend_from_slice(name);
        head.extend_from_slice(b": ");
        head.extend_from_slice(value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}
