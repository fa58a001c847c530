//! What the load generator connects to.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

/// A server to measure: a WebSocket URL (`ws://host:port/path`) or a raw TCP echo
/// (`tcp://host:port`).
///
/// Against a raw TCP echo the client replaces the opening handshake with one byte that comes
/// back (so the server has accepted the connection, as after a 101) and then sends the very same
/// masked frames; the echo returns them byte for byte, and the client parses them as a server
/// would (masked frames, unmasked in place). Both sides therefore do the same work per message
/// as against a WebSocket server, and the raw echo shows what the kernel and loopback cost
/// with no protocol work at all on the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The resolved address.
    pub addr: SocketAddr,
    /// `host:port` as written in the URL (the `Host` header).
    pub host: String,
    /// The request path, starting with `/`.
    pub path: String,
    /// A raw TCP echo: no handshake, frames come back masked.
    pub raw: bool,
    /// `wss://`: TLS (certificates not verified; see [`crate::tls`]).
    pub tls: bool,
    /// Over TLS, resume sessions with tickets (else every handshake is full).
    pub resume: bool,
    /// Offer permessage-deflate as browsers do ([`crate::load::OFFER`]).
    pub deflate: bool,
}

impl Target {
    /// Parses `ws://host:port/path` or `tcp://host:port` with the client's URL parser
    /// ([`freeboard::client::Target`]), so the bench takes every URL `freeboard client` takes
    /// (IPv6 literals such as `ws://[::1]:9001/`, default ports, queries).
    pub fn parse(url: &str) -> Result<Self, String> {
        let (raw, ws_url) = match url.strip_prefix("tcp://") {
            Some(rest) => (true, format!("ws://{rest}")),
            None if url.starts_with("ws://") || url.starts_with("wss://") => {
                (false, url.to_owned())
            }
            None => {
                return Err(format!(
                    "{url}: expected ws://host:port/path, wss://host:port/path or tcp://host:port"
                ));
            }
        };
        let parsed = freeboard::client::Target::parse(&ws_url).map_err(|e| e.to_string())?;
        let addr = (parsed.host(), parsed.port())
            .to_socket_addrs()
            .map_err(|e| format!("{url}: {e}"))?
            .next()
            .ok_or_else(|| format!("{url}: the host has no address"))?;
        let (host, path, tls) =
            (parsed.host_header().to_owned(), parsed.resource().to_owned(), parsed.is_secure());
        Ok(Self { addr, host, path, raw, tls, resume: true, deflate: false })
    }

    /// The same target at another address (a peer started on a free port).
    pub fn at(addr: SocketAddr, path: &str, raw: bool) -> Self {
        let host = addr.to_string();
        Self { addr, host, path: path.to_string(), raw, tls: false, resume: true, deflate: false }
    }

    /// This target with the permessage-deflate offer, or without.
    pub fn with_deflate(mut self, deflate: bool) -> Self {
        self.deflate = deflate;
        self
    }

    /// This target over TLS (`wss://`).
    pub fn with_tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.raw, self.tls) {
            (true, _) => write!(f, "tcp://{}", self.host),
            (false, false) => write!(f, "ws://{}{}", self.host, self.path),
            (false, true) => write!(f, "wss://{}{}", self.host, self.path),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = Target::parse("ws://127.0.0.1:9001/echo").unwrap();
        assert_eq!((t.addr.port(), t.path.as_str(), t.raw), (9001, "/echo", false));
        let t = Target::parse("ws://127.0.0.1:9001").unwrap();
        assert_eq!(t.path, "/");
        let t = Target::parse("tcp://127.0.0.1:7").unwrap();
        assert!(t.raw);
        assert_eq!(t.to_string(), "tcp://127.0.0.1:7");
        assert!(Target::parse("http://x").is_err());
        // One parser with the client: IPv6 literals and default ports.
        let t = Target::parse("ws://[::1]:9001/echo?x=1").unwrap();
        assert_eq!(
            (t.addr, t.host.as_str(), t.path.as_str()),
            ("[::1]:9001".parse().unwrap(), "[::1]:9001", "/echo?x=1")
        );
        let t = Target::parse("ws://127.0.0.1/").unwrap();
        assert_eq!(t.addr.port(), 80);
    }
}
