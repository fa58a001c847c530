//! Status codes: 0 for success, negative for errors, grouped by who caused them.
//!
//! -1 to -99: the caller (a null pointer, a bad argument, misuse of the connection);
//! -100 to -199: the peer's protocol violations, each with the close code it earns;
//! -200 to -299: the opening handshake, each with its HTTP status;
//! -300 to -399: the chunk pool.

use core::ffi::{CStr, c_char};

use freeboard_buf::{PoolConfigError, PoolError};
use freeboard_proto::handshake::HandshakeError;
use freeboard_proto::{ProtocolError, UsageError};

/// Success.
pub const FB_OK: i32 = 0;
/// A required pointer argument was null.
pub const FB_ERR_NULL: i32 = -1;
/// The handle is zeroed: its `_init` function has not run (or its `_deinit` has).
pub const FB_ERR_NOT_INITIALIZED: i32 = -2;
/// The output buffer is too small; the `written` output holds the size required.
pub const FB_ERR_INSUFFICIENT_SIZE: i32 = -3;
/// Data, a ping or a pong after this side has sent (or queued) its close frame.
pub const FB_ERR_AFTER_CLOSE: i32 = -4;
/// A continuation frame with no message started.
pub const FB_ERR_NO_MESSAGE_IN_PROGRESS: i32 = -5;
/// A new message while a fragmented one is still open.
pub const FB_ERR_MESSAGE_IN_PROGRESS: i32 = -6;
/// A control opcode where a data frame was expected.
pub const FB_ERR_NOT_DATA: i32 = -7;
/// A ping, pong or close reason over its limit (125 bytes, 123 for a reason).
pub const FB_ERR_CONTROL_PAYLOAD_TOO_LONG: i32 = -8;
/// A close code that may not be sent (1004-1006, 1015, below 1000, 1012-2999, over 4999).
pub const FB_ERR_INVALID_CLOSE_CODE: i32 = -9;
/// A client frame without a masking key, or a server frame with one.
pub const FB_ERR_WRONG_MASKING: i32 = -10;
/// Another misuse of the connection.
pub const FB_ERR_USAGE: i32 = -11;
/// An argument out of range: an unknown enum value, a misaligned handle, a length over
/// `PTRDIFF_MAX`, text that is not UTF-8.
pub const FB_ERR_INVALID_ARGUMENT: i32 = -12;

/// The peer violated RFC 6455 in a way without its own code below (close 1002).
pub const FB_ERR_PROTOCOL: i32 = -100;
/// A reserved opcode (close 1002).
pub const FB_ERR_PROTO_RESERVED_OPCODE: i32 = -101;
/// An RSV bit no negotiated extension defines (close 1002).
pub const FB_ERR_PROTO_RESERVED_BITS: i32 = -102;
/// A client frame without a mask (close 1002).
pub const FB_ERR_PROTO_UNMASKED_FRAME: i32 = -103;
/// A server frame with a mask (close 1002).
pub const FB_ERR_PROTO_MASKED_FRAME: i32 = -104;
/// A length not minimally encoded (close 1002).
pub const FB_ERR_PROTO_NON_MINIMAL_LENGTH: i32 = -105;
/// A 64-bit length with its top bit set (close 1002).
pub const FB_ERR_PROTO_LENGTH_TOP_BIT: i32 = -106;
/// A control frame over 125 bytes (close 1002).
pub const FB_ERR_PROTO_CONTROL_FRAME_TOO_LONG: i32 = -107;
/// A fragmented control frame (close 1002).
pub const FB_ERR_PROTO_FRAGMENTED_CONTROL_FRAME: i32 = -108;
/// A continuation frame without a message (close 1002).
pub const FB_ERR_PROTO_UNEXPECTED_CONTINUATION: i32 = -109;
/// A new message inside a fragmented one (close 1002).
pub const FB_ERR_PROTO_EXPECTED_CONTINUATION: i32 = -110;
/// A close frame with a one-byte payload (close 1002).
pub const FB_ERR_PROTO_INVALID_CLOSE_PAYLOAD: i32 = -111;
/// A close code that must not appear on the wire (close 1002).
pub const FB_ERR_PROTO_INVALID_CLOSE_CODE: i32 = -112;
/// Text or a close reason that is not UTF-8 (close 1007).
pub const FB_ERR_PROTO_INVALID_UTF8: i32 = -113;
/// A frame over `max_frame_size` (close 1009).
pub const FB_ERR_PROTO_FRAME_TOO_LARGE: i32 = -114;
/// A message over `max_message_size` (close 1009).
pub const FB_ERR_PROTO_MESSAGE_TOO_LARGE: i32 = -115;

/// The handshake failed in a way without its own code below (HTTP 400).
pub const FB_ERR_HANDSHAKE: i32 = -200;
/// Not parseable as HTTP/1.1 (400).
pub const FB_ERR_HANDSHAKE_MALFORMED: i32 = -201;
/// The head is over the limit or has too many headers (431).
pub const FB_ERR_HANDSHAKE_HEAD_TOO_LARGE: i32 = -202;
/// The method is not GET (405).
pub const FB_ERR_HANDSHAKE_METHOD_NOT_ALLOWED: i32 = -203;
/// The HTTP version is not 1.1 (400).
pub const FB_ERR_HANDSHAKE_HTTP_VERSION: i32 = -204;
/// No Host header, or more than one (400).
pub const FB_ERR_HANDSHAKE_HOST: i32 = -205;
/// No `Upgrade: websocket` (426).
pub const FB_ERR_HANDSHAKE_UPGRADE_REQUIRED: i32 = -206;
/// `Connection` does not list `upgrade` (400).
pub const FB_ERR_HANDSHAKE_CONNECTION_NOT_UPGRADE: i32 = -207;
/// `Sec-WebSocket-Key` missing, repeated or malformed (400).
pub const FB_ERR_HANDSHAKE_KEY: i32 = -208;
/// `Sec-WebSocket-Version` missing (400).
pub const FB_ERR_HANDSHAKE_VERSION_MISSING: i32 = -209;
/// `Sec-WebSocket-Version` is not 13 (426).
pub const FB_ERR_HANDSHAKE_UNSUPPORTED_VERSION: i32 = -210;
/// The origin is not allowed (403).
pub const FB_ERR_HANDSHAKE_ORIGIN_REFUSED: i32 = -211;
/// Client side: the server answered with a status other than 101 (see `FbHandshake.status`).
pub const FB_ERR_HANDSHAKE_REFUSED: i32 = -212;
/// Client side: `Sec-WebSocket-Accept` missing or wrong.
pub const FB_ERR_HANDSHAKE_ACCEPT_MISMATCH: i32 = -213;
/// Client side: the server chose a subprotocol that was not offered.
pub const FB_ERR_HANDSHAKE_UNEXPECTED_PROTOCOL: i32 = -214;
/// Client side: the server chose an extension that was not offered.
pub const FB_ERR_HANDSHAKE_UNEXPECTED_EXTENSION: i32 = -215;

/// Every chunk is in use.
pub const FB_ERR_POOL_CHUNKS_EXHAUSTED: i32 = -301;
/// Every segment slot is in use.
pub const FB_ERR_POOL_SEGMENTS_EXHAUSTED: i32 = -302;
/// A chunk's reference count would overflow.
pub const FB_ERR_POOL_TOO_MANY_REFERENCES: i32 = -303;
/// The chunk index is out of range or the chunk is free.
pub const FB_ERR_POOL_BAD_CHUNK: i32 = -304;
/// The pool cannot be built as asked: a chunk size outside 1..=`FB_POOL_MAX_CHUNK_SIZE`, no
/// chunk, too many chunks, no segment slot, or a data region not `chunk_size x chunks` long.
pub const FB_ERR_POOL_CONFIG: i32 = -305;
/// The budget does not cover the pool's footprint (`fb_pool_footprint`).
pub const FB_ERR_POOL_BUDGET: i32 = -306;

/// Each protocol error's code; the variants' payloads do not change the close code.
const PROTOCOL_ERRORS: [(i32, ProtocolError); 15] = [
    (FB_ERR_PROTO_RESERVED_OPCODE, ProtocolError::ReservedOpcode(0)),
    (FB_ERR_PROTO_RESERVED_BITS, ProtocolError::ReservedBits(0)),
    (FB_ERR_PROTO_UNMASKED_FRAME, ProtocolError::UnmaskedFrame),
    (FB_ERR_PROTO_MASKED_FRAME, ProtocolError::MaskedFrame),
    (FB_ERR_PROTO_NON_MINIMAL_LENGTH, ProtocolError::NonMinimalLength),
    (FB_ERR_PROTO_LENGTH_TOP_BIT, ProtocolError::LengthTopBit),
    (FB_ERR_PROTO_CONTROL_FRAME_TOO_LONG, ProtocolError::ControlFrameTooLong),
    (FB_ERR_PROTO_FRAGMENTED_CONTROL_FRAME, ProtocolError::FragmentedControlFrame),
    (FB_ERR_PROTO_UNEXPECTED_CONTINUATION, ProtocolError::UnexpectedContinuation),
    (FB_ERR_PROTO_EXPECTED_CONTINUATION, ProtocolError::ExpectedContinuation),
    (FB_ERR_PROTO_INVALID_CLOSE_PAYLOAD, ProtocolError::InvalidClosePayload),
    (FB_ERR_PROTO_INVALID_CLOSE_CODE, ProtocolError::InvalidCloseCode(0)),
    (FB_ERR_PROTO_INVALID_UTF8, ProtocolError::InvalidUtf8),
    (FB_ERR_PROTO_FRAME_TOO_LARGE, ProtocolError::FrameTooLarge),
    (FB_ERR_PROTO_MESSAGE_TOO_LARGE, ProtocolError::MessageTooLarge),
];

/// Each server-side handshake error's code (client-side ones carry data or are not statuses).
const HANDSHAKE_ERRORS: [(i32, HandshakeError); 11] = [
    (FB_ERR_HANDSHAKE_MALFORMED, HandshakeError::Malformed),
    (FB_ERR_HANDSHAKE_HEAD_TOO_LARGE, HandshakeError::HeadTooLarge),
    (FB_ERR_HANDSHAKE_METHOD_NOT_ALLOWED, HandshakeError::MethodNotAllowed),
    (FB_ERR_HANDSHAKE_HTTP_VERSION, HandshakeError::HttpVersion),
    (FB_ERR_HANDSHAKE_HOST, HandshakeError::Host),
    (FB_ERR_HANDSHAKE_UPGRADE_REQUIRED, HandshakeError::UpgradeRequired),
    (FB_ERR_HANDSHAKE_CONNECTION_NOT_UPGRADE, HandshakeError::ConnectionNotUpgrade),
    (FB_ERR_HANDSHAKE_KEY, HandshakeError::Key),
    (FB_ERR_HANDSHAKE_VERSION_MISSING, HandshakeError::VersionMissing),
    (FB_ERR_HANDSHAKE_UNSUPPORTED_VERSION, HandshakeError::UnsupportedVersion),
    (FB_ERR_HANDSHAKE_ORIGIN_REFUSED, HandshakeError::OriginRefused),
];

pub(crate) fn protocol_code(error: ProtocolError) -> i32 {
    PROTOCOL_ERRORS
        .iter()
        .find(|(_, e)| core::mem::discriminant(e) == core::mem::discriminant(&error))
        .map_or(FB_ERR_PROTOCOL, |&(code, _)| code)
}

pub(crate) fn handshake_code(error: HandshakeError) -> i32 {
    match error {
        HandshakeError::Refused { .. } => FB_ERR_HANDSHAKE_REFUSED,
        HandshakeError::AcceptMismatch => FB_ERR_HANDSHAKE_ACCEPT_MISMATCH,
        HandshakeError::UnexpectedProtocol => FB_ERR_HANDSHAKE_UNEXPECTED_PROTOCOL,
        HandshakeError::UnexpectedExtension => FB_ERR_HANDSHAKE_UNEXPECTED_EXTENSION,
        other => HANDSHAKE_ERRORS
            .iter()
            .find(|(_, e)| *e == other)
            .map_or(FB_ERR_HANDSHAKE, |&(code, _)| code),
    }
}

/// The code of a misuse, and the size required for a too-small buffer.
pub(crate) fn usage_code(error: UsageError) -> (i32, usize) {
    let code = match error {
        UsageError::InsufficientSize(e) => return (FB_ERR_INSUFFICIENT_SIZE, e.required),
        UsageError::AfterClose => FB_ERR_AFTER_CLOSE,
        UsageError::NoMessageInProgress => FB_ERR_NO_MESSAGE_IN_PROGRESS,
        UsageError::MessageInProgress => FB_ERR_MESSAGE_IN_PROGRESS,
        UsageError::NotData => FB_ERR_NOT_DATA,
        UsageError::ControlPayloadTooLong => FB_ERR_CONTROL_PAYLOAD_TOO_LONG,
        UsageError::InvalidCloseCode(_) => FB_ERR_INVALID_CLOSE_CODE,
        UsageError::WrongMasking => FB_ERR_WRONG_MASKING,
        _ => FB_ERR_USAGE,
    };
    (code, 0)
}

pub(crate) fn pool_code(error: PoolError) -> i32 {
    match error {
        PoolError::ChunksExhausted => FB_ERR_POOL_CHUNKS_EXHAUSTED,
        PoolError::SegmentsExhausted => FB_ERR_POOL_SEGMENTS_EXHAUSTED,
        PoolError::TooManyReferences => FB_ERR_POOL_TOO_MANY_REFERENCES,
    }
}

pub(crate) fn pool_config_code(error: PoolConfigError) -> i32 {
    match error {
        PoolConfigError::Budget(_) => FB_ERR_POOL_BUDGET,
        _ => FB_ERR_POOL_CONFIG,
    }
}

/// The close code a peer error earns (1002, 1007 or 1009), the code to put in the close frame;
/// 0 for any other status.
#[unsafe(no_mangle)]
pub extern "C" fn fb_error_close_code(status: i32) -> u16 {
    if status == FB_ERR_PROTOCOL {
        return freeboard_proto::CloseCode::PROTOCOL_ERROR.0;
    }
    PROTOCOL_ERRORS.iter().find(|&&(code, _)| code == status).map_or(0, |(_, e)| e.close_code().0)
}

/// The HTTP status a server answers a handshake error with (400, 403, 405, 426, 431); 0 for
/// any other status, and for client-side handshake errors.
#[unsafe(no_mangle)]
pub extern "C" fn fb_error_http_status(status: i32) -> u16 {
    if status == FB_ERR_HANDSHAKE {
        return 400;
    }
    HANDSHAKE_ERRORS.iter().find(|&&(code, _)| code == status).map_or(0, |(_, e)| e.status())
}

/// A short description of a status, as a static NUL-terminated string (never null).
#[unsafe(no_mangle)]
pub extern "C" fn fb_error_str(status: i32) -> *const c_char {
    let text: &CStr = match status {
        FB_OK => c"ok",
        FB_ERR_NULL => c"null pointer argument",
        FB_ERR_NOT_INITIALIZED => c"handle not initialised",
        FB_ERR_INSUFFICIENT_SIZE => c"output buffer too small",
        FB_ERR_AFTER_CLOSE => c"cannot send after the close frame",
        FB_ERR_NO_MESSAGE_IN_PROGRESS => c"continuation frame without a message",
        FB_ERR_MESSAGE_IN_PROGRESS => c"a fragmented message is still open",
        FB_ERR_NOT_DATA => c"control opcode where a data frame was expected",
        FB_ERR_CONTROL_PAYLOAD_TOO_LONG => c"control payload over 125 bytes",
        FB_ERR_INVALID_CLOSE_CODE => c"close code may not be sent",
        FB_ERR_WRONG_MASKING => c"clients must mask every frame and servers none",
        FB_ERR_USAGE => c"API misuse",
        FB_ERR_INVALID_ARGUMENT => c"invalid argument",
        FB_ERR_PROTOCOL => c"protocol error",
        FB_ERR_PROTO_RESERVED_OPCODE => c"reserved opcode",
        FB_ERR_PROTO_RESERVED_BITS => c"reserved bits set",
        FB_ERR_PROTO_UNMASKED_FRAME => c"client frame not masked",
        FB_ERR_PROTO_MASKED_FRAME => c"server frame masked",
        FB_ERR_PROTO_NON_MINIMAL_LENGTH => c"length not minimally encoded",
        FB_ERR_PROTO_LENGTH_TOP_BIT => c"64-bit length with top bit set",
        FB_ERR_PROTO_CONTROL_FRAME_TOO_LONG => c"control frame over 125 bytes",
        FB_ERR_PROTO_FRAGMENTED_CONTROL_FRAME => c"fragmented control frame",
        FB_ERR_PROTO_UNEXPECTED_CONTINUATION => c"continuation without a message",
        FB_ERR_PROTO_EXPECTED_CONTINUATION => c"new message inside a fragmented one",
        FB_ERR_PROTO_INVALID_CLOSE_PAYLOAD => c"close payload of one byte",
        FB_ERR_PROTO_INVALID_CLOSE_CODE => c"invalid close code",
        FB_ERR_PROTO_INVALID_UTF8 => c"invalid UTF-8",
        FB_ERR_PROTO_FRAME_TOO_LARGE => c"frame too large",
        FB_ERR_PROTO_MESSAGE_TOO_LARGE => c"message too large",
        FB_ERR_HANDSHAKE => c"handshake failed",
        FB_ERR_HANDSHAKE_MALFORMED => c"malformed HTTP request",
        FB_ERR_HANDSHAKE_HEAD_TOO_LARGE => c"request head too large",
        FB_ERR_HANDSHAKE_METHOD_NOT_ALLOWED => c"WebSocket upgrade needs GET",
        FB_ERR_HANDSHAKE_HTTP_VERSION => c"WebSocket upgrade needs HTTP/1.1",
        FB_ERR_HANDSHAKE_HOST => c"exactly one Host header is required",
        FB_ERR_HANDSHAKE_UPGRADE_REQUIRED => c"Upgrade: websocket is required",
        FB_ERR_HANDSHAKE_CONNECTION_NOT_UPGRADE => c"Connection header must include upgrade",
        FB_ERR_HANDSHAKE_KEY => c"Sec-WebSocket-Key must be 16 bytes in base64",
        FB_ERR_HANDSHAKE_VERSION_MISSING => c"Sec-WebSocket-Version is missing",
        FB_ERR_HANDSHAKE_UNSUPPORTED_VERSION => c"only Sec-WebSocket-Version 13 is supported",
        FB_ERR_HANDSHAKE_ORIGIN_REFUSED => c"origin not allowed",
        FB_ERR_HANDSHAKE_REFUSED => c"server refused the upgrade",
        FB_ERR_HANDSHAKE_ACCEPT_MISMATCH => c"Sec-WebSocket-Accept does not match the key",
        FB_ERR_HANDSHAKE_UNEXPECTED_PROTOCOL => c"server chose a subprotocol not offered",
        FB_ERR_HANDSHAKE_UNEXPECTED_EXTENSION => c"server chose an extension not offered",
        FB_ERR_POOL_CHUNKS_EXHAUSTED => c"chunk pool exhausted",
        FB_ERR_POOL_SEGMENTS_EXHAUSTED => c"segment slots exhausted",
        FB_ERR_POOL_TOO_MANY_REFERENCES => c"chunk reference count overflow",
        FB_ERR_POOL_BAD_CHUNK => c"chunk index out of range or free",
        FB_ERR_POOL_CONFIG => c"pool cannot be built as asked",
        FB_ERR_POOL_BUDGET => c"budget does not cover the pool",
        s if s > 0 => c"ok",
        _ => c"unknown status",
    };
    text.as_ptr()
}
