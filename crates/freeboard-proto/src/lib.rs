//! A sans-IO RFC 6455 WebSocket engine.
//!
//! `freeboard-proto` owns no socket, no clock, no random number generator and no heap: bytes
//! and time go in, bytes, events and deadlines come out. The same code runs a 100,000-connection
//! server and a microcontroller on bare metal (`#![no_std]`, no `alloc`, no `unsafe`).
//!
//! - [`handshake`] — the opening handshake, server and client side, over `httparse`.
//! - [`http`] — HTTP/1.1 heads beside the upgrade: header lists, body framing (a chunked
//!   decoder, a strict `Content-Length`), query values, bearer tokens, response heads.
//! - [`frame`] — the frame header as a typed view over raw bytes.
//! - [`mask`] — payload masking at memory speed, continuing across partial chunks.
//! - [`utf8`] — streaming UTF-8 validation that fails as soon as a prefix cannot be valid.
//! - [`close`] — close codes and the close frame payload.
//! - [`Connection`] — the per-connection state machine tying them together.
//!
//! Every error a peer can cause knows what goes on the wire: [`ProtocolError::close_code`] for
//! frames, [`handshake::HandshakeError::status`] for the opening handshake. Misuse of the API is
//! the separate [`UsageError`], which untrusted input can never produce.
#![no_std]
#![forbid(unsafe_code)]

pub mod close;
mod close_code;
mod config;
mod connection;
mod error;
pub mod frame;
/// Fuzzing entry points with their invariants; only `cargo fuzz` builds them (`cfg(fuzzing)`).
#[cfg(fuzzing)]
pub mod fuzzing;
pub mod handshake;
pub mod http;
pub mod mask;
mod timer;
pub mod utf8;

pub use close_code::CloseCode;
pub use config::{Config, ConfigBuilder};
pub use connection::{Connection, Event, Input, MessageKind, Parked, Payload, Role, State, Whole};
pub use error::{InsufficientSize, ProtocolError, UsageError};
pub use frame::{FrameHeader, OpCode};
pub use timer::{Instant, Timer};

/// The README's example, compiled and run with the doctests so that it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The book's page on the protocol core, compiled with the doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library/proto.md")]
struct GuideDoctests;
