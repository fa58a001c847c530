//! permessage-deflate (RFC 7692): negotiation in both roles, here; the compressor and
//! decompressor a session uses, with their memory drawn from the pool's budget, in `zlib.rs`
//! (the `deflate` feature). A build without it has `disabled.rs` in their place: its
//! `Deflate` cannot be made, so no agreement ever reaches a session, and a server or client
//! configured to compress is refused before it runs, naming the feature.

use std::fmt::Write as _;

use freeboard_proto::handshake::Extension;

#[cfg(not(feature = "deflate"))]
mod disabled;
#[cfg(feature = "deflate")]
mod zlib;

#[cfg(not(feature = "deflate"))]
pub(crate) use disabled::{Codec, Deflate, receive};
#[cfg(feature = "deflate")]
pub(crate) use zlib::{Codec, Deflate, receive};

/// The extension's registered name.
pub(crate) const NAME: &str = "permessage-deflate";

/// How a server compresses (`freeboard serve --compression`, per route with
/// [`RouteOptions::compression`](crate::RouteOptions::compression)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Compression {
    /// `permessage-deflate` offers are declined (the upgrade succeeds without it).
    #[default]
    Off,
    /// One compressor and one decompressor per event loop; both directions negotiate no
    /// context takeover, so a connection holds no compression state between messages.
    Shared,
    /// A compressor and a decompressor per connection, with a window of
    /// [`ServerConfig::compression_window`](crate::ServerConfig::compression_window) bits
    /// (9–15) in both directions; their memory is drawn from the budget at the upgrade, and
    /// a connection the budget cannot cover goes on without compression.
    Dedicated,
}

impl Compression {
    /// Parses `off`, `shared` or `dedicated`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "off" => Some(Self::Off),
            "shared" => Some(Self::Shared),
            "dedicated" => Some(Self::Dedicated),
            _ => None,
        }
    }
}

/// The parameters both ends agreed on (RFC 7692 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agreement {
    /// The server starts every message with an empty window.
    pub server_no_context_takeover: bool,
    /// The client starts every message with an empty window.
    pub client_no_context_takeover: bool,
    /// The server's LZ77 window, 8–15.
    pub server_max_window_bits: u8,
    /// The client's LZ77 window, 8–15.
    pub client_max_window_bits: u8,
}

/// Why an offer or a response was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NegotiationError {
    /// A parameter RFC 7692 does not define.
    UnknownParameter,
    /// A parameter given twice (§7: "MUST NOT include more than one").
    DuplicateParameter,
    /// A value that is not a decimal 8–15 without leading zeros, or a value on a flag.
    InvalidValue,
    /// A response that answers parameters the offer did not allow, or that this end
    /// cannot honour (a window of 8 for our own compressor: zlib cannot produce it).
    Unacceptable,
    /// The memory budget cannot hold the compression state the agreement needs.
    NoMemory,
}

impl std::fmt::Display for NegotiationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::UnknownParameter => "a parameter RFC 7692 does not define",
            Self::DuplicateParameter => "a parameter given twice",
            Self::InvalidValue => "a parameter value that is not allowed",
            Self::Unacceptable => "parameters the offer did not allow or this end cannot honour",
            Self::NoMemory => "the memory budget cannot hold the compression state",
        })
    }
}

impl std::error::Error for NegotiationError {}

/// The parameters of one `permessage-deflate` element, as written.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Params {
    server_no_context_takeover: bool,
    client_no_context_takeover: bool,
    server_max_window_bits: Option<u8>,
    /// `Some(None)`: the parameter without a value (allowed in an offer only).
    client_max_window_bits: Option<Option<u8>>,
}

impl Params {
    /// Parses `name[=value]` parameters separated by `;` (§7.1); every error refuses the
    /// whole element.
    fn parse(params: &str) -> Result<Self, NegotiationError> {
        let mut p = Self::default();
        for param in params.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) = match param.split_once('=') {
                Some((n, v)) => (n.trim(), Some(unquote(v.trim())?)),
                None => (param, None),
            };
            let flag = |seen: &mut bool| {
                if value.is_some() {
                    return Err(NegotiationError::InvalidValue);
                }
                if std::mem::replace(seen, true) {
                    return Err(NegotiationError::DuplicateParameter);
                }
                Ok(())
            };
            if name.eq_ignore_ascii_case("server_no_context_takeover") {
                flag(&mut p.server_no_context_takeover)?;
            } else if name.eq_ignore_ascii_case("client_no_context_takeover") {
                flag(&mut p.client_no_context_takeover)?;
            } else if name.eq_ignore_ascii_case("server_max_window_bits") {
                if p.server_max_window_bits.is_some() {
                    return Err(NegotiationError::DuplicateParameter);
                }
                p.server_max_window_bits =
                    Some(window_bits(value.ok_or(NegotiationError::InvalidValue)?)?);
            } else if name.eq_ignore_ascii_case("client_max_window_bits") {
                if p.client_max_window_bits.is_some() {
                    return Err(NegotiationError::DuplicateParameter);
                }
                p.client_max_window_bits = Some(value.map(window_bits).transpose()?);
            } else {
                return Err(NegotiationError::UnknownParameter);
            }
        }
        Ok(p)
    }
}

/// A quoted-string value loses its quotes (RFC 6455 §9.1 allows either form).
fn unquote(v: &str) -> Result<&str, NegotiationError> {
    match v.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"').ok_or(NegotiationError::InvalidValue),
        None => Ok(v),
    }
}

/// §7.1.2.1: "a decimal integer value ... without leading zeros, between 8 to 15, inclusive".
fn window_bits(v: &str) -> Result<u8, NegotiationError> {
    match v.as_bytes() {
        [b'8'] => Ok(8),
        [b'9'] => Ok(9),
        [b'1', d @ b'0'..=b'5'] => Ok(10 + (d - b'0')),
        _ => Err(NegotiationError::InvalidValue),
    }
}

impl Agreement {
    /// Server side: the first `permessage-deflate` offer among `offers` this server can
    /// accept in `mode`, or `None` (offers are tried in order; a malformed one is skipped,
    /// and the upgrade goes on without the extension if none is left).
    /// `window_bits` bounds both windows in dedicated mode.
    pub fn accept<'b>(
        mode: Compression,
        window_bits: u8,
        offers: impl IntoIterator<Item = Extension<'b>>,
    ) -> Option<Self> {
        let own_window = match mode {
            Compression::Off => return None,
            Compression::Shared => 15,
            Compression::Dedicated => window_bits.clamp(9, 15),
        };
        let shared = mode == Compression::Shared;
        offers.into_iter().filter(|o| o.name.eq_ignore_ascii_case(NAME)).find_map(|offer| {
            let p = Params::parse(offer.params).ok()?;
            let server_max_window_bits = p.server_max_window_bits.unwrap_or(15).min(own_window);
            // zlib cannot compress raw deflate with a 256-byte window: decline, and let the
            // client's next offer (if any) be tried.
            if server_max_window_bits < 9 {
                return None;
            }
            let client_max_window_bits = match p.client_max_window_bits {
                // We may only limit the client's window if it said it can be limited.
                Some(limit) => limit.unwrap_or(15).min(own_window),
                None => 15,
            };
            Some(Self {
                server_no_context_takeover: shared || p.server_no_context_takeover,
                // Shared: the decompressor is the loop's too, so no client context either
                // (§7.1.1.2: a server may add it although the offer did not ask).
                client_no_context_takeover: shared || p.client_no_context_takeover,
                server_max_window_bits,
                client_max_window_bits,
            })
        })
    }

    /// The `Sec-WebSocket-Extensions` value of the server's response.
    pub fn response(&self) -> String {
        let mut s = String::from(NAME);
        if self.server_no_context_takeover {
            s.push_str("; server_no_context_takeover");
        }
        if self.client_no_context_takeover {
            s.push_str("; client_no_context_takeover");
        }
        if self.server_max_window_bits < 15 {
            let _ = write!(s, "; server_max_window_bits={}", self.server_max_window_bits);
        }
        if self.client_max_window_bits < 15 {
            let _ = write!(s, "; client_max_window_bits={}", self.client_max_window_bits);
        }
        s
    }

    /// The client's offer. It always names `client_no_context_takeover`: this client keeps
    /// no compression context between messages (§7.1.1.2: a hint the client honours even if
    /// the server does not repeat it), so a server needs no inflate state for it, and every
    /// server can accept it. Both windows are left to the server's choice. With
    /// `server_no_context_takeover` the server is asked to keep none either, so that neither
    /// side holds per-connection state (the client loop, which has many connections).
    pub fn offer(server_no_context_takeover: bool) -> &'static str {
        if server_no_context_takeover {
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; client_max_window_bits"
        } else {
            "permessage-deflate; client_no_context_takeover; client_max_window_bits"
        }
    }

    /// Client side: the agreement a server's response (one accepted element) makes to
    /// [`offer`](Self::offer)`(offered_server_no_context_takeover)`. A response this client
    /// cannot honour is an error: the client fails the connection (§5: "the client MUST
    /// _Fail the WebSocket Connection_").
    pub fn from_response(
        response: Extension<'_>,
        offered_server_no_context_takeover: bool,
    ) -> Result<Self, NegotiationError> {
        if !response.name.eq_ignore_ascii_case(NAME) {
            return Err(NegotiationError::Unacceptable);
        }
        let p = Params::parse(response.params)?;
        let client_max_window_bits = match p.client_max_window_bits {
            Some(Some(bits)) => bits,
            // §7.1.2.2: the response must carry a value.
            Some(None) => return Err(NegotiationError::InvalidValue),
            None => 15,
        };
        // Our compressor cannot honour a 256-byte window; §7.1.1.1: a server accepting
        // server_no_context_takeover MUST include it in the response.
        if client_max_window_bits < 9
            || offered_server_no_context_takeover && !p.server_no_context_takeover
        {
            return Err(NegotiationError::Unacceptable);
        }
        Ok(Self {
            server_no_context_takeover: p.server_no_context_takeover,
            // The offer promised it, whatever the response says.
            client_no_context_takeover: true,
            server_max_window_bits: p.server_max_window_bits.unwrap_or(15),
            client_max_window_bits,
        })
    }

    /// (window bits, no context takeover) for the side that sends as `server` or not.
    pub(crate) fn side(&self, server: bool) -> (u8, bool) {
        if server {
            (self.server_max_window_bits, self.server_no_context_takeover)
        } else {
            (self.client_max_window_bits, self.client_no_context_takeover)
        }
    }

    /// What a connection's own compression state costs (both directions), to reserve from
    /// the budget: 0 when both sides take no context.
    pub fn dedicated_cost(&self, server: bool) -> usize {
        let (tx_bits, tx_reset) = self.side(server);
        let (rx_bits, rx_reset) = self.side(!server);
        let tx = if tx_reset { 0 } else { deflate_state_bytes(tx_bits) };
        let rx = if rx_reset { 0 } else { inflate_state_bytes(rx_bits) };
        tx + rx
    }
}

/// One compressor and one decompressor of the largest window: what a client keeps in its
/// budget for compression.
pub(crate) const STATE_BYTES: usize = deflate_state_bytes(15) + inflate_state_bytes(15);

/// What zlib-rs allocates for one raw-deflate compressor at memLevel 8 (its
/// `DeflateAllocOffsets`), all of which may become resident: a double window and its `prev`
/// chain (2 bytes per position), a hash head of 2^16 entries (2 bytes each, whatever the
/// window; zlib's own formula assumes 2^15), pending and symbol buffers of 7 × 16 KiB, and
/// the stream state. ≈ 374 KiB at 15 bits, 250 KiB at 10.
pub(crate) const fn deflate_state_bytes(window_bits: u8) -> usize {
    let window = 1 << window_bits as usize;
    2 * window + 2 * window + (2 << 16) + 7 * (16 << 10) + 6 * 1024
}

/// zlib's documented inflate memory: `1 << windowBits` plus about 7 KiB of state.
pub(crate) const fn inflate_state_bytes(window_bits: u8) -> usize {
    (1 << window_bits as usize) + 7 * 1024
}

/// The budget cannot cover a compressor or the chunks of a compressed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoMemory;

#[cfg(all(test, feature = "deflate"))]
mod tests;
