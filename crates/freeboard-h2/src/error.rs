//! Errors: what a peer did wrong (with the RFC 9113 §7 code it earns) and what the caller did
//! wrong.

use core::fmt;

use crate::stream_id::StreamId;

/// An HTTP/2 error code (RFC 9113 §7), as carried by `RST_STREAM` and `GOAWAY`.
///
/// A newtype rather than an enum: a peer may send any 32-bit value, and §7 says unknown codes
/// "MUST NOT trigger any special behavior".
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u32);

impl ErrorCode {
    /// Graceful shutdown, or a stream no longer needed.
    pub const NO_ERROR: Self = Self(0x0);
    /// An unspecific protocol error.
    pub const PROTOCOL_ERROR: Self = Self(0x1);
    /// An unexpected internal error.
    pub const INTERNAL_ERROR: Self = Self(0x2);
    /// The peer violated flow control.
    pub const FLOW_CONTROL_ERROR: Self = Self(0x3);
    /// SETTINGS were not acknowledged in time.
    pub const SETTINGS_TIMEOUT: Self = Self(0x4);
    /// A frame arrived on a half-closed stream.
    pub const STREAM_CLOSED: Self = Self(0x5);
    /// A frame of the wrong size.
    pub const FRAME_SIZE_ERROR: Self = Self(0x6);
    /// The stream was refused before any processing; the request may be retried.
    pub const REFUSED_STREAM: Self = Self(0x7);
    /// The stream is no longer needed.
    pub const CANCEL: Self = Self(0x8);
    /// The HPACK state cannot be kept.
    pub const COMPRESSION_ERROR: Self = Self(0x9);
    /// The CONNECT tunnel failed.
    pub const CONNECT_ERROR: Self = Self(0xa);
    /// The peer is generating excessive load.
    pub const ENHANCE_YOUR_CALM: Self = Self(0xb);
    /// The transport's security is inadequate.
    pub const INADEQUATE_SECURITY: Self = Self(0xc);
    /// Use HTTP/1.1 instead.
    pub const HTTP_1_1_REQUIRED: Self = Self(0xd);

    /// The code's name in RFC 9113 §7, or `None` for a code it does not define.
    pub fn name(self) -> Option<&'static str> {
        ERROR_CODE_NAMES.get(self.0 as usize).copied()
    }
}

impl fmt::Debug for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "ErrorCode({:#x})", self.0),
        }
    }
}

/// A peer error that ends the whole connection: `GOAWAY` with [`code`](Self::code) is queued
/// and no further input is read (RFC 9113 §5.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionError {
    /// The code the `GOAWAY` carries.
    pub code: ErrorCode,
    /// What the peer did, for logs (also the `GOAWAY`'s debug data).
    pub reason: &'static str,
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP/2 connection error {:?}: {}", self.code, self.reason)
    }
}

impl core::error::Error for ConnectionError {}

/// What a malformed frame earns: the end of the connection, or of one stream
/// (RFC 9113 §5.4: `RST_STREAM` with the code, the connection going on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// A connection error.
    Connection(ConnectionError),
    /// A stream error on this stream.
    Stream(StreamId, ErrorCode),
}

impl FrameError {
    pub(crate) const fn connection(code: ErrorCode, reason: &'static str) -> Self {
        Self::Connection(ConnectionError { code, reason })
    }
}

/// The output buffer is too small; `required` bytes would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsufficientSize {
    /// The bytes needed.
    pub required: usize,
}

/// A misuse of the API by the caller: never caused by what a peer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UsageError {
    /// No such stream is open (never opened, reset, or closed).
    UnknownStream(StreamId),
    /// The stream was already answered (`respond` twice).
    AlreadyAnswered(StreamId),
    /// DATA before the stream's response head.
    NotAnswered(StreamId),
    /// The stream's send side is already ended.
    SendEnded(StreamId),
    /// More DATA than the flow-control windows or the peer's frame size allow; ask
    /// [`Connection::send_capacity`](crate::Connection::send_capacity) first.
    ExceedsCapacity {
        /// The bytes asked for.
        requested: usize,
        /// The bytes allowed in one frame now.
        allowed: usize,
    },
    /// More bytes consumed than were delivered on the stream.
    ConsumedTooMuch(StreamId),
    /// Frames the connection queued must reach the wire before DATA: drain
    /// [`Connection::poll_transmit`](crate::Connection::poll_transmit) first.
    TransmitPending,
    /// A status outside 100–999, or a header name that is not lowercase token characters,
    /// or a connection-specific header (RFC 9113 §8.2.2).
    InvalidHeader,
    /// The connection failed or went away; nothing more can be sent.
    Closed,
    /// The output buffer is too small.
    InsufficientSize(InsufficientSize),
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl core::error::Error for UsageError {}

impl From<InsufficientSize> for UsageError {
    fn from(error: InsufficientSize) -> Self {
        Self::InsufficientSize(error)
    }
}

/// The error codes' names in RFC 9113 §7, indexed by their value.
pub const ERROR_CODE_NAMES: [&str; 14] = [
    "NO_ERROR",
    "PROTOCOL_ERROR",
    "INTERNAL_ERROR",
    "FLOW_CONTROL_ERROR",
    "SETTINGS_TIMEOUT",
    "STREAM_CLOSED",
    "FRAME_SIZE_ERROR",
    "REFUSED_STREAM",
    "CANCEL",
    "COMPRESSION_ERROR",
    "CONNECT_ERROR",
    "ENHANCE_YOUR_CALM",
    "INADEQUATE_SECURITY",
    "HTTP_1_1_REQUIRED",
];
