//! Errors: what a peer did wrong (with its close code) and what the caller did wrong.

use core::fmt;

use crate::close_code::CloseCode;

/// A violation of RFC 6455 by the peer. Each one knows the close code it earns.
///
/// After a `ProtocolError` the connection is failed: a close frame with
/// [`close_code`](Self::close_code) is queued and no further input is processed
/// (RFC 6455 §7.1.7, _Fail the WebSocket Connection_).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    /// An opcode RFC 6455 reserves (3–7, 0xB–0xF).
    ReservedOpcode(u8),
    /// An RSV bit is set that no negotiated extension defines.
    ReservedBits(u8),
    /// A client sent an unmasked frame ("a client MUST mask all frames", §5.1).
    UnmaskedFrame,
    /// A server sent a masked frame ("a server MUST NOT mask any frames", §5.1).
    MaskedFrame,
    /// A 16- or 64-bit length that would have fit a shorter encoding (§5.2).
    NonMinimalLength,
    /// A 64-bit length with its most significant bit set (§5.2).
    LengthTopBit,
    /// A control frame with a payload over 125 bytes (§5.5).
    ControlFrameTooLong,
    /// A control frame without FIN (§5.5: "control frames MUST NOT be fragmented").
    FragmentedControlFrame,
    /// A continuation frame with no message in progress (§5.4).
    UnexpectedContinuation,
    /// A new text/binary frame while a fragmented message is still open (§5.4).
    ExpectedContinuation,
    /// A close frame whose payload is one byte long (§5.5.1).
    InvalidClosePayload,
    /// A close code that must not appear on the wire (§7.4).
    InvalidCloseCode(u16),
    /// Text (or a close reason) that is not UTF-8 (§8.1).
    InvalidUtf8,
    /// A frame longer than [`Config::max_frame_size`](crate::Config::max_frame_size).
    FrameTooLarge,
    /// A message longer than [`Config::max_message_size`](crate::Config::max_message_size).
    MessageTooLarge,
}

impl ProtocolError {
    /// The close code this error puts on the wire.
    pub fn close_code(self) -> CloseCode {
        match self {
            Self::InvalidUtf8 => CloseCode::INVALID_PAYLOAD,
            Self::FrameTooLarge | Self::MessageTooLarge => CloseCode::MESSAGE_TOO_BIG,
            _ => CloseCode::PROTOCOL_ERROR,
        }
    }

    /// A short reason phrase for the close frame (always well under 123 bytes).
    pub fn reason(self) -> &'static str {
        match self {
            Self::ReservedOpcode(_) => "reserved opcode",
            Self::ReservedBits(_) => "reserved bits set",
            Self::UnmaskedFrame => "client frame not masked",
            Self::MaskedFrame => "server frame masked",
            Self::NonMinimalLength => "length not minimally encoded",
            Self::LengthTopBit => "64-bit length with top bit set",
            Self::ControlFrameTooLong => "control frame over 125 bytes",
            Self::FragmentedControlFrame => "fragmented control frame",
            Self::UnexpectedContinuation => "continuation without a message",
            Self::ExpectedContinuation => "new message inside a fragmented one",
            Self::InvalidClosePayload => "close payload of one byte",
            Self::InvalidCloseCode(_) => "invalid close code",
            Self::InvalidUtf8 => "invalid UTF-8",
            Self::FrameTooLarge => "frame too large",
            Self::MessageTooLarge => "message too large",
        }
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ReservedOpcode(op) => write!(f, "reserved opcode {op:#x}"),
            Self::ReservedBits(bits) => write!(f, "reserved bits {bits:#05b} set"),
            Self::InvalidCloseCode(code) => write!(f, "invalid close code {code}"),
            other => f.write_str(other.reason()),
        }?;
        write!(f, " (close {})", self.close_code().0)
    }
}

impl core::error::Error for ProtocolError {}

/// A mistake by the code calling this crate; untrusted input can never cause one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UsageError {
    /// The output buffer is too small; `required` bytes would fit.
    InsufficientSize(InsufficientSize),
    /// Data or a ping after this side has sent (or queued) its close frame.
    AfterClose,
    /// A continuation frame with no message started.
    NoMessageInProgress,
    /// A new message while a fragmented one is still open.
    MessageInProgress,
    /// A control opcode given where a data frame was expected.
    NotData,
    /// A control payload (ping, pong, close reason) over its limit.
    ControlPayloadTooLong,
    /// A close code that may not be sent (1004–1006, 1015, below 1000, 1012–2999, over 4999).
    InvalidCloseCode(u16),
    /// A client frame without a masking key, or a server frame with one.
    WrongMasking,
    /// RSV bits no negotiated extension allows, or set on a continuation frame.
    ReservedBits(u8),
}

impl From<InsufficientSize> for UsageError {
    fn from(e: InsufficientSize) -> Self {
        Self::InsufficientSize(e)
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InsufficientSize(e) => e.fmt(f),
            Self::AfterClose => f.write_str("cannot send after the close frame"),
            Self::NoMessageInProgress => f.write_str("continuation frame without a message"),
            Self::MessageInProgress => f.write_str("a fragmented message is still open"),
            Self::NotData => f.write_str("control opcode where a data frame was expected"),
            Self::ControlPayloadTooLong => f.write_str("control payload over 125 bytes"),
            Self::InvalidCloseCode(code) => write!(f, "close code {code} may not be sent"),
            Self::WrongMasking => {
                f.write_str("clients must mask every frame and servers must mask none")
            }
            Self::ReservedBits(rsv) => write!(f, "RSV bits {rsv:#05b} are not negotiated here"),
        }
    }
}

impl core::error::Error for UsageError {}

/// The output buffer was too small for what had to be written into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsufficientSize {
    /// The number of bytes that would have been written.
    pub required: usize,
}

impl fmt::Display for InsufficientSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "output buffer too small: {} bytes required", self.required)
    }
}

impl core::error::Error for InsufficientSize {}
