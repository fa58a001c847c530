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
}

impl Target {
    /// Parses `ws://host:port/path` or `tcp://host:port`.
    pub fn parse(url: &str) -> Result<Self, String> {
        let (raw, tls, rest) = if let Some(rest) = url.strip_prefix("ws://") {
            (false, false, rest)
        } else if let Some(rest) = url.strip_prefix("wss://") {
            (false, true, rest)
        } else if let Some(rest) = url.strip_prefix("tcp://") {
            (true, false, rest)
        } else {
            return Err(format!("{url}: expected ws://, wss://host:port/path or tcp://host:port"));
        };
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let default_port = if tls { 443 } else { 80 };
        let with_port =
            if host.contains(':') { host.to_string() } else { format!("{host}:{default_port}") };
        let addr = with_port
            .to_socket_addrs()
            .map_err(|e| format!("{url}: {e}"))?
            .next()
            .ok_or_else(|| format!("{url}: the host has no address"))?;
        Ok(Self { addr, host: host.to_string(), path: path.to_string(), raw, tls, resume: true })
    }

    /// The same target at another address (a peer started on a free port).
    pub fn at(addr: SocketAddr, path: &str, raw: bool) -> Self {
        Self { addr, host: addr.to_string(), path: path.to_string(), raw, tls: false, resume: true }
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
    }
}
