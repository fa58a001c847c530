//! Where a client connects: a `ws://` or `wss://` URL checked once and split into what the socket and the
//! upgrade request need.

use std::fmt;

use url::{Host, Url};

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
        let url = Url::parse(input).map_err(|e| invalid(e.to_string()))?;
        let secure = match url.scheme() {
            "ws" => false,
            "wss" => true,
            other => return Err(invalid(format!("scheme {other}: is not ws: or wss:"))),
        };
        if url.fragment().is_some() {
            return Err(invalid("a WebSocket URL has no fragment (#…)".into()));
        }
        let (host, bracketed) = match url.host() {
            Some(Host::Domain(name)) => (name.to_owned(), name.to_owned()),
            Some(Host::Ipv4(ip)) => (ip.to_string(), ip.to_string()),
            Some(Host::Ipv6(ip)) => (ip.to_string(), format!("[{ip}]")),
            None => return Err(invalid("no host".into())),
        };
        // NOTE(unwrap): ws and wss are special schemes to the url crate, with default ports.
        let port = url.port_or_known_default().unwrap_or(if secure { 443 } else { 80 });
        let host_header = match url.port() {
            Some(port) => format!("{bracketed}:{port}"),
            None => bracketed,
        };
        let mut resource = url.path().to_owned();
        if resource.is_empty() {
            resource.push('/');
        }
        if let Some(query) = url.query() {
            resource.push('?');
            resource.push_str(query);
        }
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
        // The url crate drops an explicit default port; the Host header then omits it too.
        let t = Target::parse("ws://example.com:80/x").unwrap();
        assert_eq!((t.port(), t.host_header()), (80, "example.com"));
        let t = Target::parse_any("wss://example.com/x").unwrap();
        assert_eq!((t.port(), t.is_secure()), (443, true));
    }

    #[test]
    fn refuses_what_is_not_a_websocket_url() {
        for bad in ["http://example.com/", "ws://", "ws://host/#frag", "not a url", "ws://[::1"] {
            assert!(
                matches!(Target::parse(bad), Err(ClientError::InvalidUrl { .. })),
                "{bad} should be refused"
            );
        }
        assert!(Target::parse("wss://host/").is_ok_and(|t| t.is_secure()));
    }
}
