//! What one connection counted: streams, and every defence that fired.

use crate::error::ConnectionError;

/// Counts of one connection, for the caller to add to its metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    /// Extended CONNECTs for a WebSocket handed to the caller.
    pub websockets: u64,
    /// Other requests handed to the caller.
    pub requests: u64,
    /// Streams refused past SETTINGS_MAX_CONCURRENT_STREAMS (`RST_STREAM` `REFUSED_STREAM`).
    pub refused_streams: u64,
    /// Streams the peer reset before they were answered (rapid reset counts these).
    pub unanswered_resets: u64,
    /// `RST_STREAM`s we sent for the peer's errors, refusals included.
    pub error_resets: u64,
    /// Malformed requests (`RST_STREAM` `PROTOCOL_ERROR`, RFC 9113 §8.1.1).
    pub malformed_requests: u64,
    /// Extended CONNECTs for a protocol other than `websocket`, answered `501`.
    pub unsupported_protocols: u64,
    /// Request heads past SETTINGS_MAX_HEADER_LIST_SIZE, answered `431` (HPACK bombs).
    pub header_lists_too_large: u64,
    /// Header blocks past their byte or frame bound (CONTINUATION floods): `GOAWAY`.
    pub header_block_floods: u64,
    /// Acknowledgements and resets piling up unread (PING and SETTINGS floods): `GOAWAY`.
    pub control_floods: u64,
    /// DATA past a window or a WINDOW_UPDATE past 2³¹ − 1 (`FLOW_CONTROL_ERROR`).
    pub flow_control_errors: u64,
    /// Times a stream ran out of send capacity (the peer's windows were closed).
    pub send_blocked: u64,
    /// SETTINGS acknowledged.
    pub settings_acks: u64,
    /// PINGs answered.
    pub ping_acks: u64,
    /// The error of the `GOAWAY` that ended the connection, if one did.
    pub goaway: Option<ConnectionError>,
}
