//! Where a client connects: a `ws://` or `wss://` URL checked once and split into what the socket and the
//! upgrade request need.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use http::Uri;

use super::ClientError;

/// A parsed WebSocket URL (RFC 6455 §3).
///
/// ```
/// use freeboard::client::Target;
///
/// let t = Target::parse("ws://[::1]:9001/rpc?v=2").unwrap();
/// assert_eq!((t.host(), t.port()), ("::1", 9001));
/// assert_eq!(t.host_header(), "[::1]:9001");
/// assert_eq!(t.resource(), "/rpc?v=2");
///
/// let t = Target::parse("ws://example.com").unwrap();
/// assert_eq!((t.port(), t.host_header(), t.resource()), (80, "example.com", "/"));
///
/// let t = Target::parse("wss://example.com/live").unwrap();
/// assert_eq!((t.port(), t.is_secure(), t.host_header()), (443, true, "example.com"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The host as the resolver wants it: a name, or an IP literal without brackets.
    host: String,
    port: u16,
    /// The `Host` header: brackets around IPv6, the port unless it is the scheme's default.
    host_header: String,
    /// Path and query, starting with `/`.
    resource: String,
    secure: bool,
}

impl Target {
    /// Parses `ws://` or `wss://host[:port][/path][?query]`; fragments are refused (§3:
    /// "Fragment identifiers are meaningless in the context of WebSocket URIs and MUST NOT be
    /// used").
    pub fn parse(input: &str) -> Result<Self, ClientError> {
        Self::parse_any(input)
    }

    /// The same as [`parse`](Self::parse) (kept for callers from before TLS).
    pub fn parse_any(input: &str) -> Result<Self, ClientError> {
        let invalid = |why: String| ClientError::InvalidUrl { url: input.to_owned(), why };
        // `http`'s URI parser drops a fragment silently; RFC 6455 refuses it.
        if input.contains('#') {
            return Err(invalid("a WebSocket URL has no fragment (#…)".into()));
        }
        let uri: Uri = input.parse().map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
        let secure = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("ws") => false,
            Some(s) if s.eq_ignore_ascii_case("wss") => true,
            Some(other) => return Err(invalid(format!("scheme {other}: is not ws: or wss:"))),
            None => return Err(invalid("no scheme: not ws: or wss:".into())),
        };
        let name = uri.host().filter(|h| !h.is_empty()).ok_or_else(|| invalid("no host".into()))?;
        // Host names are case-insensitive (RFC 3986 §3.2.2); IP literals are written the one
        // way the standard library prints them.
        let (host, bracketed) = match name.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) => match v6.parse::<Ipv6Addr>() {
                Ok(ip) => (ip.to_string(), format!("[{ip}]")),
                Err(_) => return Err(invalid(format!("{v6:?} is not an IPv6 address"))),
            },
            None => match name.parse::<Ipv4Addr>() {
                Ok(ip) => (ip.to_string(), ip.to_string()),
                Err(_) => (name.to_ascii_lowercase(), name.to_ascii_lowercase()),
            },
        };
        let default_port = if secure { 443 } else { 80 };
        let port = uri.port_u16().unwrap_or(default_port);
        // The scheme's own port is left out of the `Host` header, as browsers do.
        let host_header = match port == default_port {
            true => bracketed,
            false => format!("{bracketed}:{port}"),
        };
        let resource = uri.path_and_query().map_or("/", |p| p.as_str());
        let resource = match resource.starts_with('/') {
            true => resource.to_owned(),
            false => format!("/{resource}"),
        };
        Ok(Self { host, port, host_header, resource, secure })
    }

    /// The host to resolve or the IP literal (IPv6 without brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port: explicit, or 80 for `ws://` and 443 for `wss://`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The value of the `Host` header.
    pub fn host_header(&self) -> &str {
        &self.host_header
    }

    /// The request target: path and query.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Whether the URL is `wss://`.
    pub fn is_secure(&self) -> bool {
        self.secure
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.secure { "wss" } else { "ws" };
        write!(f, "{scheme}://{}{}", self.host_header, self.resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_parts_a_client_needs() {
        let t = Target::parse("ws://127.0.0.1:9001/a/b?x=1&y=2").unwrap();
        assert_eq!((t.host(), t.port()), ("127.0.0.1", 9001));
        assert_eq!(t.host_header(), "127.0.0.1:9001");
        assert_eq!(t.resource(), "/a/b?x=1&y=2");
        assert_eq!(t.to_string(), "ws://127.0.0.1:9001/a/b?x=1&y=2");

        let t = Target::parse("ws://[::1]/").unwrap();
        assert_eq!((t.host(), t.port(), t.host_header()), ("::1", 80, "[::1]"));
        // An explicit default port is left out of the Host header.
        let t = Target::parse("ws://example.com:80/x").unwrap();
        assert_eq!((t.port(), t.host_header()), (80, "example.com"));
        let t = Target::parse_any("wss://example.com/x").unwrap();
        assert_eq!((t.port(), t.is_secure()), (443, true));
        // Case-insensitive parts come out in lower case; a query without a path gets `/`.
        let t = Target::parse("WS://Example.COM:8080?q=A").unwrap();
        assert_eq!(
            (t.host(), t.host_header(), t.resource()),
            ("example.com", "example.com:8080", "/?q=A")
        );
        let t = Target::parse("wss://[0:0::1]:443/").unwrap();
        assert_eq!((t.host(), t.host_header(), t.is_secure()), ("::1", "[::1]", true));
        let t = Target::parse("ws://user:pw@10.0.0.1/").unwrap();
        assert_eq!((t.host(), t.host_header()), ("10.0.0.1", "10.0.0.1"));
    }

    #[test]
    fn refuses_what_is_not_a_websocket_url() {
        for bad in [
            "http://example.com/",
            "ws://",
            "ws://host/#frag",
            "not a url",
            "ws://[::1",
            "ws://[not:v6]/",
            "example.com:80",
            "/just/a/path",
            "ws://bücher.example/",
        ] {
            assert!(
                matches!(Target::parse(bad), Err(ClientError::InvalidUrl { .. })),
                "{bad} should be refused"
            );
        }
        assert!(Target::parse("wss://host/").is_ok_and(|t| t.is_secure()));
    }
}
