//! TLS for the server: `wss://` on rustls' unbuffered API, with every buffer in the loop's
//! pool.
//!
//! rustls' buffered `ServerConnection` keeps its own buffers per connection (a 4 KiB
//! deframer buffer even when idle, and an unbounded outgoing queue); the unbuffered
//! `UnbufferedServerConnection` keeps none: the caller passes the received ciphertext and the
//! space for what it sends. Here both are the loop's scratch buffers (`TlsScratch`, shared
//! by every connection of the loop, as the read buffer is), and what must outlive one call
//! waits in pool chunks of the connection (`TlsStream`):
//!
//! - `cipher_in`: the start of a record that has not fully arrived;
//! - `plain_in`: decrypted bytes the caller's buffer could not take;
//! - `cipher_out`: encrypted bytes the socket did not take.
//!
//! An idle TLS connection holds no chunk. Its rustls state (keys, the handshake state until
//! it ends) is heap memory that the loop charges to its TLS budget, a share of the memory
//! budget; a connection the budget cannot cover is refused at accept (counted). Each client
//! address has a share of the handshakes in progress (`admission.rs`), checked first,
//! so that one address cannot spend the budget and lock the others out.
//!
//! The rustls side is `stream.rs` and `identity.rs` (the `tls` feature). A build without it
//! has `disabled.rs` in their place: the same names, with a `TlsStream` that cannot be made,
//! and a server whose configuration asks for TLS is refused at bind, naming the feature.

use freeboard_buf::Pool;

use crate::metrics::Metrics;

// Without `tls` the server still builds an admission from the settings it refuses; nothing
// asks it.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
mod admission;
#[cfg(not(feature = "tls"))]
mod disabled;
#[cfg(feature = "tls")]
mod identity;
#[cfg(feature = "tls")]
mod stream;

pub(crate) use admission::HandshakeAdmission;
#[cfg(not(feature = "tls"))]
pub use disabled::TlsError;
#[cfg(not(feature = "tls"))]
pub(crate) use disabled::{ServerTls, TlsIdentity, TlsScratch, TlsStream, server_config};
#[cfg(feature = "tls")]
pub use identity::{TlsError, TlsIdentity};
#[cfg(feature = "tls")]
pub(crate) use identity::{provider, server_config};
#[cfg(feature = "tls")]
pub(crate) use stream::{ServerTls, TlsScratch, TlsStream};

/// What a TLS connection's rustls state may hold during its handshake (the handshake state,
/// the transcript, the messages queued for our buffers), charged to the loop's TLS budget
/// from accept until the handshake ends. Measured in `tests/tls_memory.rs`: 4.7 KiB at most
/// (TLS 1.3), 3.3 KiB (TLS 1.2), the boxed connection included.
pub(crate) const HANDSHAKE_CHARGE: usize = 8 * 1024;

/// What a transport call may use besides its connection: the loop's pool, its TLS scratch,
/// the metrics.
// Only the TLS layer reads `tls` and `metrics`.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) struct Io<'a> {
    pub(crate) pool: &'a mut Pool<'static>,
    pub(crate) tls: &'a mut TlsScratch,
    pub(crate) metrics: &'a Metrics,
}
