//! A sans-IO HTTP/2 server core (RFC 9113) for WebSockets over HTTP/2 (RFC 8441).
//!
//! Bytes in, events and bytes out, as `freeboard-proto` is for RFC 6455: a
//! [`Connection`] reads the client's frames from the caller's buffer, hands each extended
//! CONNECT (`:protocol = websocket`) and each plain request to the caller as an [`Event`],
//! lends DATA out of the caller's buffer without copying, and queues what it owes the peer
//! (SETTINGS and PING acknowledgements, WINDOW_UPDATEs, response heads, resets, GOAWAY)
//! for the caller to write. It owns no socket, reads no clock and starts no task, so a mio
//! loop, a test, or any other driver can run it; each accepted stream is meant to carry
//! one freeboard session.
//!
//! What it is not: not a client, no server push, no priorities (PRIORITY frames and the
//! HEADERS priority block are parsed and ignored, as RFC 9113 §5.3 allows), no HPACK
//! dynamic table on the encoding side (our responses use the static table and literals),
//! no timers (keep-alive and idle timeouts belong to the driver), no TLS.
//!
//! Memory is bounded by [`Config`], whose defaults are:
//!
//! | limit | default | what it bounds |
//! |---|---|---|
//! | `max_concurrent_streams` | 100 | streams open; one more is `RST_STREAM` `REFUSED_STREAM` |
//! | `initial_stream_window` | 64 KiB | a stream's DATA the caller has not consumed |
//! | `connection_window` | 256 KiB | the same for all streams together |
//! | `max_frame_size` | 16 KiB | a frame; the read buffer needs this + 9 bytes |
//! | `header_table_size` | 4 KiB | the HPACK dynamic table |
//! | `max_header_list_size` | 16 KiB | a decoded request head (past it: `431`), and its encoded block |
//! | `max_header_block_frames` | 8 | HEADERS + CONTINUATIONs of one block (past it: `GOAWAY`) |
//! | `max_unanswered_resets` | 100 | streams reset before an answer, less answered ones (rapid reset) |
//! | `max_error_resets` | 1,024 | streams reset for the peer's errors |
//! | `max_queued_control_frames` | 64 | acknowledgements and resets queued and not yet taken |
//!
//! Nothing is buffered for a stream: its state is 24 bytes (windows, counts, flags). DATA
//! to send stays with the caller until [`Connection::send_capacity`] allows it, so a peer
//! that never opens its window makes the stream unwritable and nothing grows.
//!
//! Every defence has a defined outcome and a count in [`Counters`]; every peer error is a
//! [`ConnectionError`] (GOAWAY with its RFC 9113 §7 code) or a stream reset, and misuse of
//! the API is a [`UsageError`].
#![no_std]

// The README's driver sketch, compiled with the doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

extern crate alloc;
#[cfg(test)]
extern crate std;

mod config;
mod connection;
mod counters;
mod error;
pub mod frame;
pub mod hpack;
mod request;
mod stream;
mod stream_id;

pub use config::{Config, ConfigBuilder, DEFAULT_WINDOW};
pub use connection::{Connection, Event, Received};
pub use counters::Counters;
pub use error::{
    ConnectionError, ERROR_CODE_NAMES, ErrorCode, FrameError, InsufficientSize, UsageError,
};
pub use request::Request;
pub use stream_id::StreamId;

/// The bytes one open stream costs in the connection's table (windows, counts, flags; no
/// buffers): the per-stream state the caller's memory budget should charge.
pub const fn stream_state_size() -> usize {
    core::mem::size_of::<stream::Stream>()
}
