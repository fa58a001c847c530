//! The sans-IO connection behind a handle: `fb_connection_*`.
//!
//! Call order (as `freeboard_proto::Connection`): after each read, `fb_connection_handle_input`
//! repeatedly until the buffer is consumed; at end of stream `fb_connection_handle_eof`; when
//! the deadline of `fb_connection_poll_timeout` passes, `fb_connection_handle_timeout`. After
//! each of these, drain `fb_connection_poll_event` and `fb_connection_poll_transmit`.

use core::mem::{MaybeUninit, align_of, size_of};
use core::time::Duration;

use freeboard_proto::{
    CloseCode, Config, Connection, Event, Instant, MessageKind, OpCode, Parked, Role, State,
};

use crate::{
    FB_ERR_INVALID_ARGUMENT, FB_ERR_NULL, FB_OK, assert_handle, bytes, bytes_mut, mask_key,
    protocol_code, put, slot_clear, slot_init, slot_mut, status, usage_code,
};

/// Bytes of an [`FbConnection`] handle.
pub const FB_CONNECTION_SIZE: usize = 432;

/// Storage for one connection: place it anywhere (static memory, a struct, the stack), then
/// `fb_connection_init`. Opaque; moving it with `memcpy` between calls is allowed.
#[repr(C)]
pub struct FbConnection {
    // `MaybeUninit`: the value inside has padding bytes, so the words are not all initialised
    // integers and a Rust move of the handle must not claim they are (C copies bytes).
    _opaque: [MaybeUninit<u64>; 54],
}
assert_handle!(FbConnection, FB_CONNECTION_SIZE, Connection, slack 7);

const TAG: u32 = 0x4642_434e; // "FBCN"

/// The server role: receives masked frames, sends unmasked ones (pass a null mask).
pub const FB_ROLE_SERVER: u8 = 0;
/// The client role: receives unmasked frames, masks what it sends (pass a fresh random key).
pub const FB_ROLE_CLIENT: u8 = 1;

/// Data flows both ways.
pub const FB_STATE_OPEN: i32 = 0;
/// Our close frame is queued or sent; input is still read.
pub const FB_STATE_CLOSE_SENT: i32 = 1;
/// The close handshake is over, failed or timed out: once `fb_connection_poll_transmit`
/// returns 0, close the transport.
pub const FB_STATE_CLOSED: i32 = 2;

/// A text message (UTF-8, validated by the core).
pub const FB_KIND_TEXT: u8 = 1;
/// A binary message.
pub const FB_KIND_BINARY: u8 = 2;

/// Opcodes for `fb_connection_send_header` / `fb_connection_send_frame`.
pub const FB_OPCODE_CONTINUATION: u8 = 0x0;
/// The first frame of a text message.
pub const FB_OPCODE_TEXT: u8 = 0x1;
/// The first frame of a binary message.
pub const FB_OPCODE_BINARY: u8 = 0x2;

/// A ping arrived (answered already if `auto_pong` is on).
pub const FB_EVENT_PING: u8 = 1;
/// A pong arrived.
pub const FB_EVENT_PONG: u8 = 2;
/// The connection closed; `close_code`, the reason in `data`, and `clean` say how.
pub const FB_EVENT_CLOSED: u8 = 3;

/// Enough for any frame header (2 + 8 length + 4 mask bytes).
pub const FB_MAX_HEADER_LEN: usize = 14;
/// Enough for any frame `fb_connection_poll_transmit` writes (header plus 125 bytes).
pub const FB_MAX_CONTROL_FRAME_LEN: usize = 131;

/// A connection's limits and switches (`fb_config_default` fills in the defaults).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FbConfig {
    /// The largest frame payload accepted; beyond it, close 1009. Default 16 MiB.
    pub max_frame_size: u64,
    /// The largest message accepted; beyond it, close 1009. Default 16 MiB.
    pub max_message_size: u64,
    /// Milliseconds to wait for the peer's close frame after ours. Default 5000.
    pub close_timeout_ms: u32,
    /// Milliseconds without input before a keep-alive ping; 0 (the default) disables it.
    pub ping_interval_ms: u32,
    /// Milliseconds a keep-alive ping may stay unanswered. Default 10000.
    pub pong_timeout_ms: u32,
    /// Nonzero: answer pings automatically (the default). Zero: the application answers with
    /// `fb_connection_pong`.
    pub auto_pong: u8,
    /// The RSV bits a negotiated extension defines (0b100 = RSV1); default 0.
    pub allowed_rsv: u8,
}

/// What one `fb_connection_handle_input` call produced.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FbInput {
    /// Bytes of the buffer used; call again with the rest.
    pub consumed: usize,
    /// A piece of a data message (unmasked, inside the caller's buffer), or null.
    pub data: *const u8,
    /// The piece's length (it may be 0 for an empty frame: check `has_payload`).
    pub len: usize,
    /// Whether a piece was returned.
    pub has_payload: bool,
    /// `FB_KIND_TEXT` or `FB_KIND_BINARY` (0 without a piece).
    pub kind: u8,
    /// The message's first frame had RSV1 set (permessage-deflate).
    pub compressed: bool,
    /// The first piece of its message.
    pub message_start: bool,
    /// The last piece of its frame.
    pub frame_fin: bool,
    /// The last piece of its message.
    pub message_fin: bool,
    /// After a protocol error: the close code it earned (already queued); 0 otherwise.
    pub close_code: u16,
}

/// Something that happened outside the data stream.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FbEvent {
    /// `FB_EVENT_PING`, `FB_EVENT_PONG` or `FB_EVENT_CLOSED`.
    pub kind: u8,
    /// Whether both close frames were exchanged (`FB_EVENT_CLOSED` only).
    pub clean: bool,
    /// The close code (`FB_EVENT_CLOSED` only): the peer's, the error's, or 1006.
    pub close_code: u16,
    /// The ping or pong payload, or the close reason (UTF-8, not NUL-terminated). Valid until
    /// the next call on the connection.
    pub data: *const u8,
    /// Its length.
    pub len: usize,
}

/// Fills `config` with the defaults: 16 MiB frames and messages, automatic pongs, 5 s close
/// timeout, no keep-alive pings, no extensions.
///
/// # Safety
/// `config` is null or valid for writing an `FbConfig`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_config_default(config: *mut FbConfig) -> i32 {
    let d = Config::DEFAULT;
    let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
    let value = FbConfig {
        max_frame_size: d.max_frame_size,
        max_message_size: d.max_message_size,
        close_timeout_ms: ms(d.close_timeout),
        ping_interval_ms: d.ping_interval.map_or(0, ms),
        pong_timeout_ms: ms(d.pong_timeout),
        auto_pong: u8::from(d.auto_pong),
        allowed_rsv: d.allowed_rsv,
    };
    // SAFETY: null or valid for writes (this function's contract).
    status(unsafe { put(config, value) }.map(|()| FB_OK))
}

/// Initialises `conn` for a connection whose opening handshake completed at `now_ms`.
/// `config` may be null for the defaults. Overwrites whatever `conn` held.
///
/// # Safety
/// `conn` is null or points to a writable `FbConnection`; `config` is null or points to an
/// `FbConfig`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_init(
    conn: *mut FbConnection,
    role: u8,
    config: *const FbConfig,
    now_ms: u64,
) -> i32 {
    let role = match role {
        FB_ROLE_SERVER => Role::Server,
        FB_ROLE_CLIENT => Role::Client,
        _ => return FB_ERR_INVALID_ARGUMENT,
    };
    // SAFETY: as this function's contract.
    let config = unsafe { config_from(config) };
    let value = Connection::new(role, config, Instant::from_millis(now_ms));
    // SAFETY: null or a writable FbConnection (this function's contract), which is large and
    // aligned enough for the slot (assert_handle!).
    status(unsafe { slot_init(conn.cast(), TAG, value) }.map(|()| FB_OK))
}

/// Marks `conn` as no longer initialised (it holds no resources; this only guards against use
/// after the application is done with it).
///
/// # Safety
/// `conn` is null or points to an `FbConnection`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_deinit(conn: *mut FbConnection) -> i32 {
    // SAFETY: as this function's contract.
    status(unsafe { slot_clear::<Connection>(conn.cast()) }.map(|()| FB_OK))
}

/// `FB_STATE_OPEN`, `FB_STATE_CLOSE_SENT` or `FB_STATE_CLOSED`, or an error.
///
/// # Safety
/// `conn` is null or points to a zeroed or initialised `FbConnection`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_state(conn: *mut FbConnection) -> i32 {
    // SAFETY: as this function's contract.
    status(unsafe { connection(conn) }.map(|c| match c.state() {
        State::Open => FB_STATE_OPEN,
        State::CloseSent => FB_STATE_CLOSE_SENT,
        State::Closed => FB_STATE_CLOSED,
    }))
}

/// Reads frames from `buf[0..len]`, unmasking in place, and returns the first piece of data
/// found in `out`. Call again with `buf + out->consumed` until the buffer is used up. The piece
/// points into `buf`: use or copy it before `buf` is reused.
///
/// Returns 0, or an `FB_ERR_PROTO_*` code when the peer violated the protocol: the connection
/// has queued the close frame (`out->close_code`), is closed, and ignores later input.
///
/// # Safety
/// `conn` as for `fb_connection_state`; `buf` is valid for reads and writes of `len` bytes (or
/// null with `len` 0); `out` is valid for writing an `FbInput`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_handle_input(
    conn: *mut FbConnection,
    now_ms: u64,
    buf: *mut u8,
    len: usize,
    out: *mut FbInput,
) -> i32 {
    let run = || {
        if out.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: as this function's contract.
        let conn = unsafe { connection(conn) }?;
        // SAFETY: as this function's contract.
        let buf = unsafe { bytes_mut(buf, len) }?;
        let mut input = FbInput {
            consumed: 0,
            data: core::ptr::null(),
            len: 0,
            has_payload: false,
            kind: 0,
            compressed: false,
            message_start: false,
            frame_fin: false,
            message_fin: false,
            close_code: 0,
        };
        let result = match conn.handle_input(Instant::from_millis(now_ms), buf) {
            Ok(got) => {
                input.consumed = got.consumed;
                if let Some(piece) = got.payload {
                    input.data = piece.data.as_ptr();
                    input.len = piece.data.len();
                    input.has_payload = true;
                    input.kind = match piece.kind {
                        MessageKind::Text => FB_KIND_TEXT,
                        MessageKind::Binary => FB_KIND_BINARY,
                    };
                    input.compressed = piece.compressed;
                    input.message_start = piece.message_start;
                    input.frame_fin = piece.frame_fin;
                    input.message_fin = piece.message_fin;
                }
                Ok(FB_OK)
            }
            Err(e) => {
                input.consumed = len;
                input.close_code = e.close_code().0;
                Err(protocol_code(e))
            }
        };
        // SAFETY: non-null (checked) and valid for writes (this function's contract).
        unsafe { put(out, input) }?;
        result
    };
    status(run())
}

/// Reports that the peer ended the transport (read returned 0, or the socket reset).
///
/// # Safety
/// `conn` as for `fb_connection_state`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_handle_eof(conn: *mut FbConnection) -> i32 {
    // SAFETY: as this function's contract.
    status(unsafe { connection(conn) }.map(|c| {
        c.handle_eof();
        FB_OK
    }))
}

/// Runs the timers whose deadline is at or before `now_ms`.
///
/// # Safety
/// `conn` as for `fb_connection_state`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_handle_timeout(conn: *mut FbConnection, now_ms: u64) -> i32 {
    // SAFETY: as this function's contract.
    status(unsafe { connection(conn) }.map(|c| {
        c.handle_timeout(Instant::from_millis(now_ms));
        FB_OK
    }))
}

/// Stores the next deadline (milliseconds, same clock as `now_ms`) in `at_ms` and returns 1,
/// or returns 0 when no timer runs.
///
/// # Safety
/// `conn` as for `fb_connection_state`; `at_ms` valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_poll_timeout(
    conn: *mut FbConnection,
    at_ms: *mut u64,
) -> i32 {
    let run = || {
        // SAFETY: as this function's contract.
        let conn = unsafe { connection(conn) }?;
        match conn.poll_timeout() {
            // SAFETY: as this function's contract.
            Some(at) => unsafe { put(at_ms, at.as_millis()) }.map(|()| 1),
            None => Ok(0),
        }
    };
    status(run())
}

/// Stores the next event in `out` and returns 1, or returns 0 when there is none. Its `data`
/// stays valid until the next call on `conn`.
///
/// # Safety
/// `conn` as for `fb_connection_state`; `out` valid for writing an `FbEvent`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_poll_event(
    conn: *mut FbConnection,
    out: *mut FbEvent,
) -> i32 {
    let run = || {
        if out.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: as this function's contract.
        let conn = unsafe { connection(conn) }?;
        let event = match conn.poll_event() {
            None => return Ok(0),
            Some(Event::Ping(data)) => (FB_EVENT_PING, data, 0, false),
            Some(Event::Pong(data)) => (FB_EVENT_PONG, data, 0, false),
            Some(Event::Closed { code, reason, clean }) => {
                (FB_EVENT_CLOSED, reason.as_bytes(), code.0, clean)
            }
        };
        let (kind, data, close_code, clean) = event;
        let value = FbEvent { kind, clean, close_code, data: data.as_ptr(), len: data.len() };
        // SAFETY: non-null (checked) and valid for writes (this function's contract).
        unsafe { put(out, value) }.map(|()| 1)
    };
    status(run())
}

/// Writes the next control frame the connection owes (a pong, a keep-alive ping, a close)
/// into `out[0..cap]`, stores its length in `written` and returns 1; returns 0 when nothing is
/// owed. `FB_MAX_CONTROL_FRAME_LEN` (131) bytes always suffice. A client passes a fresh random
/// 4-byte `mask` every call; a server passes null.
///
/// # Safety
/// `conn` as for `fb_connection_state`; `mask` null or 4 readable bytes; `out` valid for
/// writes of `cap` bytes; `written` valid for writing a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_poll_transmit(
    conn: *mut FbConnection,
    mask: *const u8,
    out: *mut u8,
    cap: usize,
    written: *mut usize,
) -> i32 {
    let run = || {
        if written.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: as this function's contract.
        let conn = unsafe { connection(conn) }?;
        // SAFETY: as this function's contract.
        let out = unsafe { bytes_mut(out, cap) }?;
        // SAFETY: as this function's contract.
        let mask = unsafe { mask_key(mask) };
        let (result, n) = match conn.poll_transmit(mask, out) {
            Ok(Some(n)) => (Ok(1), n),
            Ok(None) => (Ok(0), 0),
            Err(e) => {
                let (code, required) = usage_code(e);
                (Err(code), required)
            }
        };
        // SAFETY: non-null (checked) and valid for writes (this function's contract).
        unsafe { put(written, n) }?;
        result
    };
    status(run())
}

/// Writes the header of a data frame into `out[0..cap]` (`FB_MAX_HEADER_LEN` bytes suffice)
/// and stores its length in `written`; the `payload_len` payload bytes must follow on the wire
/// (a client masks them with `fb_apply_mask` and the same `mask`). `opcode` is
/// `FB_OPCODE_TEXT` or `FB_OPCODE_BINARY` for a message's first frame and
/// `FB_OPCODE_CONTINUATION` for the others; `fin` ends the message.
///
/// # Safety
/// As `fb_connection_poll_transmit`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_send_header(
    conn: *mut FbConnection,
    opcode: u8,
    fin: bool,
    payload_len: u64,
    mask: *const u8,
    out: *mut u8,
    cap: usize,
    written: *mut usize,
) -> i32 {
    let run = || {
        let opcode = data_opcode(opcode)?;
        // SAFETY: as this function's contract.
        let (conn, out, mask) = unsafe { send_args(conn, mask, out, cap, written) }?;
        let result = conn.send_header(opcode, fin, payload_len, mask, out);
        // SAFETY: as this function's contract (checked non-null by send_args).
        unsafe { finish_send(result, written) }
    };
    status(run())
}

/// Writes a whole data frame (header and payload, masked for a client) into `out[0..cap]`;
/// see `fb_connection_send_header`.
///
/// # Safety
/// As `fb_connection_poll_transmit`; `payload` valid for reads of `len` bytes (or null with 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_send_frame(
    conn: *mut FbConnection,
    opcode: u8,
    fin: bool,
    payload: *const u8,
    len: usize,
    mask: *const u8,
    out: *mut u8,
    cap: usize,
    written: *mut usize,
) -> i32 {
    let run = || {
        let opcode = data_opcode(opcode)?;
        // SAFETY: as this function's contract.
        let payload = unsafe { bytes(payload, len) }?;
        // SAFETY: as this function's contract.
        let (conn, out, mask) = unsafe { send_args(conn, mask, out, cap, written) }?;
        let result = conn.send_frame(opcode, fin, payload, mask, out);
        // SAFETY: as this function's contract (checked non-null by send_args).
        unsafe { finish_send(result, written) }
    };
    status(run())
}

/// Writes a ping frame (payload at most 125 bytes) into `out[0..cap]`.
///
/// # Safety
/// As `fb_connection_send_frame`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_send_ping(
    conn: *mut FbConnection,
    payload: *const u8,
    len: usize,
    mask: *const u8,
    out: *mut u8,
    cap: usize,
    written: *mut usize,
) -> i32 {
    let run = || {
        // SAFETY: as this function's contract.
        let payload = unsafe { bytes(payload, len) }?;
        // SAFETY: as this function's contract.
        let (conn, out, mask) = unsafe { send_args(conn, mask, out, cap, written) }?;
        let result = conn.send_ping(payload, mask, out);
        // SAFETY: as this function's contract (checked non-null by send_args).
        unsafe { finish_send(result, written) }
    };
    status(run())
}

/// Writes a pong frame into `out[0..cap]` (when `auto_pong` is off).
///
/// # Safety
/// As `fb_connection_send_frame`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_pong(
    conn: *mut FbConnection,
    payload: *const u8,
    len: usize,
    mask: *const u8,
    out: *mut u8,
    cap: usize,
    written: *mut usize,
) -> i32 {
    let run = || {
        // SAFETY: as this function's contract.
        let payload = unsafe { bytes(payload, len) }?;
        // SAFETY: as this function's contract.
        let (conn, out, mask) = unsafe { send_args(conn, mask, out, cap, written) }?;
        let result = conn.pong(payload, mask, out);
        // SAFETY: as this function's contract (checked non-null by send_args).
        unsafe { finish_send(result, written) }
    };
    status(run())
}

/// Starts the close handshake with `code` and a UTF-8 `reason` of at most 123 bytes: queues
/// the close frame for `fb_connection_poll_transmit` and starts the close timer. Does nothing
/// if the handshake has already started.
///
/// # Safety
/// `conn` as for `fb_connection_state`; `reason` valid for reads of `len` bytes (or null, 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_close(
    conn: *mut FbConnection,
    now_ms: u64,
    code: u16,
    reason: *const u8,
    len: usize,
) -> i32 {
    let run = || {
        // SAFETY: as this function's contract.
        let conn = unsafe { connection(conn) }?;
        // SAFETY: as this function's contract.
        let reason = unsafe { bytes(reason, len) }?;
        let reason = core::str::from_utf8(reason).map_err(|_| FB_ERR_INVALID_ARGUMENT)?;
        conn.close(Instant::from_millis(now_ms), CloseCode(code), reason)
            .map(|()| FB_OK)
            .map_err(|e| usage_code(e).0)
    };
    status(run())
}

/// Masks (or unmasks) `buf[0..len]` with `key`, starting `offset` bytes into the key's cycle
/// (the payload bytes already masked, for a payload masked in several pieces).
///
/// # Safety
/// `buf` valid for reads and writes of `len` bytes (or null with 0); `key` 4 readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_apply_mask(
    buf: *mut u8,
    len: usize,
    key: *const u8,
    offset: usize,
) -> i32 {
    let run = || {
        // SAFETY: as this function's contract.
        let buf = unsafe { bytes_mut(buf, len) }?;
        // SAFETY: as this function's contract.
        let key = unsafe { mask_key(key) }.ok_or(FB_ERR_NULL)?;
        freeboard_proto::mask::apply_mask(buf, key, offset % 4);
        Ok(FB_OK)
    };
    status(run())
}

/// The configuration `config` describes, or the defaults for null.
///
/// # Safety
/// `config` is null or points to an `FbConfig`.
unsafe fn config_from(config: *const FbConfig) -> Config {
    if config.is_null() {
        return Config::DEFAULT;
    }
    // SAFETY: non-null and pointing to an FbConfig (this function's contract); every bit
    // pattern of its integer fields is valid.
    let c = unsafe { config.read() };
    Config::builder()
        .max_message_size(c.max_message_size)
        .max_frame_size(c.max_frame_size)
        .auto_pong(c.auto_pong != 0)
        .close_timeout(Duration::from_millis(c.close_timeout_ms.into()))
        .ping_interval(
            (c.ping_interval_ms != 0).then(|| Duration::from_millis(c.ping_interval_ms.into())),
        )
        .pong_timeout(Duration::from_millis(c.pong_timeout_ms.into()))
        .allowed_rsv(c.allowed_rsv)
        .build()
}

/// Bytes of an [`FbParked`] handle.
pub const FB_PARKED_SIZE: usize = 32;

/// An idle connection's state without its buffers (`fb_connection_park`): keep these for
/// many mostly idle connections and resume one into an `FbConnection` when its socket has
/// something to say. Opaque.
#[repr(C)]
pub struct FbParked {
    // See FbConnection.
    _opaque: [MaybeUninit<u64>; 4],
}
assert_handle!(FbParked, FB_PARKED_SIZE, Parked, slack 7);

const PARKED_TAG: u32 = 0x4642_504b; // "FBPK"

/// Stores `conn`'s state in `parked` and returns 1 if the connection has nothing in flight
/// (open, no frame or message half read or half sent, no event or control frame waiting);
/// returns 0 and leaves `parked` alone otherwise. `conn` is unchanged either way: reuse its
/// storage for another connection once parked.
///
/// # Safety
/// `conn` as for `fb_connection_state`; `parked` null or a writable `FbParked`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_park(conn: *mut FbConnection, parked: *mut FbParked) -> i32 {
    let run = || {
        if parked.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: as this function's contract.
        let conn = unsafe { connection(conn) }?;
        match conn.park() {
            // SAFETY: non-null (checked), a writable FbParked (this function's contract).
            Some(state) => unsafe { slot_init(parked.cast(), PARKED_TAG, state) }.map(|()| 1),
            None => Ok(0),
        }
    };
    status(run())
}

/// Initialises `conn` with the connection parked in `parked` (which stays valid) and the
/// `config` it was parked under (null for the defaults).
///
/// # Safety
/// `parked` null or a zeroed or parked `FbParked`; `config` null or an `FbConfig`; `conn` null
/// or a writable `FbConnection`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_connection_resume(
    parked: *mut FbParked,
    config: *const FbConfig,
    conn: *mut FbConnection,
) -> i32 {
    let run = || {
        if conn.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: as this function's contract.
        let state = *unsafe { slot_mut::<Parked>(parked.cast(), PARKED_TAG) }?;
        // SAFETY: as this function's contract.
        let value = state.resume(unsafe { config_from(config) });
        // SAFETY: non-null (checked), a writable FbConnection (this function's contract).
        unsafe { slot_init(conn.cast(), TAG, value) }.map(|()| FB_OK)
    };
    status(run())
}

/// The next deadline of a parked connection, as `fb_connection_poll_timeout`: 1 with
/// `at_ms` set, or 0 when no timer runs. Resume it when the deadline passes.
///
/// # Safety
/// `parked` null or a zeroed or parked `FbParked`; `at_ms` valid for writing a `uint64_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_parked_poll_timeout(parked: *mut FbParked, at_ms: *mut u64) -> i32 {
    let run = || {
        // SAFETY: as this function's contract.
        let state = unsafe { slot_mut::<Parked>(parked.cast(), PARKED_TAG) }?;
        match state.poll_timeout() {
            // SAFETY: as this function's contract.
            Some(at) => unsafe { put(at_ms, at.as_millis()) }.map(|()| 1),
            None => Ok(0),
        }
    };
    status(run())
}

/// The connection in handle `conn`.
///
/// # Safety
/// `conn` is null or points to a zeroed or initialised `FbConnection` with no other live
/// reference.
unsafe fn connection<'a>(conn: *mut FbConnection) -> Result<&'a mut Connection, i32> {
    // SAFETY: as this function's contract; the handle is large and aligned enough for the slot.
    unsafe { slot_mut::<Connection>(conn.cast(), TAG) }
}

fn data_opcode(opcode: u8) -> Result<OpCode, i32> {
    match opcode {
        FB_OPCODE_CONTINUATION => Ok(OpCode::Continuation),
        FB_OPCODE_TEXT => Ok(OpCode::Text),
        FB_OPCODE_BINARY => Ok(OpCode::Binary),
        _ => Err(FB_ERR_INVALID_ARGUMENT),
    }
}

/// The connection, output buffer and masking key of a `send` function.
type SendArgs<'a> = (&'a mut Connection, &'a mut [u8], Option<[u8; 4]>);

/// The connection, output buffer and mask of a `send` function, with `written` checked.
///
/// # Safety
/// As `fb_connection_poll_transmit`.
unsafe fn send_args<'a>(
    conn: *mut FbConnection,
    mask: *const u8,
    out: *mut u8,
    cap: usize,
    written: *mut usize,
) -> Result<SendArgs<'a>, i32> {
    if written.is_null() {
        return Err(FB_ERR_NULL);
    }
    // SAFETY: as this function's contract.
    let conn = unsafe { connection(conn) }?;
    // SAFETY: as this function's contract.
    let out = unsafe { bytes_mut(out, cap) }?;
    // SAFETY: as this function's contract.
    Ok((conn, out, unsafe { mask_key(mask) }))
}

/// Stores a send's length (or the size a too-small buffer needed) and returns its status.
///
/// # Safety
/// `written` is non-null and valid for writing a `size_t`.
unsafe fn finish_send(
    result: Result<usize, freeboard_proto::UsageError>,
    written: *mut usize,
) -> Result<i32, i32> {
    let (result, n) = match result {
        Ok(n) => (Ok(FB_OK), n),
        Err(e) => {
            let (code, required) = usage_code(e);
            (Err(code), required)
        }
    };
    // SAFETY: as this function's contract.
    unsafe { put(written, n) }?;
    result
}
