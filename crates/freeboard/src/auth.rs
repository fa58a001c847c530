//! Who may connect and from where: the `Origin` allow-list, the addresses of trusted reverse
//! proxies ([`TrustedProxies`]) whose forwarding headers name the real client, and the close
//! code of a lapsed authorization. (Tokens are `freeboard-topics`' JWT verifier's.)
//!
//! Everything here is a pure function of the request and the configuration; the event loop
//! decides what a refusal costs (a status, a counter, a rate-limited log line).

use std::net::IpAddr;

/// The close code of a connection whose authorization lapsed
/// ([`Accepted::expires_at`](crate::Accepted::expires_at), a token's `exp`): 4001, reason
/// "token expired". A
/// private-use code (RFC 6455 §7.4.2), distinct from other policy closes (1008) so that a
/// client knows to fetch a new token before it reconnects.
pub const TOKEN_EXPIRED: freeboard_proto::CloseCode = freeboard_proto::CloseCode(4001);

/// The origins a browser may open WebSockets from (cross-site WebSocket hijacking defence).
///
/// Entries are `scheme://host[:port]` (compared case-insensitively), `scheme://*.domain`
/// (any subdomain of `domain`, not `domain` itself) or `*` (anything). An empty list allows
/// every origin. A request without `Origin` does not come from a browser (browsers always
/// send it on a WebSocket upgrade) and is allowed: the list protects browser users' cookies
/// and credentials, it does not identify clients — use tokens for that.
///
/// ```
/// use freeboard::auth::Origins;
///
/// let origins = Origins::new(&["https://app.example.com", "https://*.example.org"]).unwrap();
/// assert!(origins.allows(Some(b"https://APP.example.com")));
/// assert!(origins.allows(Some(b"https://eu.example.org")));
/// assert!(!origins.allows(Some(b"https://example.org")));
/// assert!(!origins.allows(Some(b"https://evil.example")));
/// assert!(origins.allows(None));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Origins {
    any: bool,
    /// Invariant: lowercase.
    exact: Vec<String>,
    /// `(scheme "://", ".domain")`, lowercase.
    subdomains: Vec<(String, String)>,
}

impl Origins {
    /// Parses the allow-list; an entry without `scheme://` is refused (the error is that
    /// entry).
    pub fn new<S: AsRef<str>>(list: &[S]) -> Result<Self, String> {
        let mut origins = Self::default();
        for entry in list {
            let entry = entry.as_ref().trim().to_ascii_lowercase();
            if entry == "*" {
                origins.any = true;
                continue;
            }
            let Some((scheme, host)) = entry.split_once("://") else {
                return Err(entry);
            };
            if scheme.is_empty() || host.is_empty() || host.contains('/') {
                return Err(entry);
            }
            match host.strip_prefix("*.") {
                Some(domain) if !domain.is_empty() => {
                    origins.subdomains.push((format!("{scheme}://"), format!(".{domain}")));
                }
                Some(_) => return Err(entry),
                None => origins.exact.push(entry),
            }
        }
        Ok(origins)
    }

    /// Whether the list restricts anything.
    pub fn is_restricted(&self) -> bool {
        let empty = self.exact.is_empty() && self.subdomains.is_empty();
        !self.any && !empty
    }

    /// Whether a request with this `Origin` header (or none) may upgrade.
    pub fn allows(&self, origin: Option<&[u8]>) -> bool {
        let Some(origin) = origin else { return true };
        if !self.is_restricted() {
            return true;
        }
        let Ok(origin) = std::str::from_utf8(origin) else { return false };
        let origin = origin.trim().to_ascii_lowercase();
        self.exact.contains(&origin)
            || self.subdomains.iter().any(|(scheme, domain)| {
                origin.strip_prefix(scheme.as_str()).is_some_and(|host| {
                    let name = host.rsplit_once(':').map_or(host, |(name, port)| {
                        if port.bytes().all(|b| b.is_ascii_digit()) { name } else { host }
                    });
                    name.len() > domain.len() && name.ends_with(domain.as_str())
                })
            })
    }
}

/// The reverse proxies whose forwarding headers are believed: CIDR blocks (`10.0.0.0/8`,
/// `::1/128`, or a bare address).
///
/// For a connection from a trusted address, the client is the rightmost address of
/// `Forwarded: for=` (RFC 7239) or, without it, `X-Forwarded-For` that is not itself
/// trusted: each proxy appends the address it received the connection from, so addresses to
/// the left of the first untrusted one could have been written by the client.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    blocks: Vec<(IpAddr, u8)>,
}

impl TrustedProxies {
    /// Parses addresses and CIDR blocks (the error is the entry that is neither).
    pub fn new<S: AsRef<str>>(list: &[S]) -> Result<Self, String> {
        let mut blocks = Vec::new();
        for entry in list {
            let entry = entry.as_ref().trim();
            let bad = || entry.to_owned();
            let (addr, bits) = match entry.split_once('/') {
                Some((addr, bits)) => (addr, Some(bits)),
                None => (entry, None),
            };
            let addr: IpAddr = addr.parse().map_err(|_| bad())?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let bits = match bits {
                Some(bits) => bits.parse::<u8>().ok().filter(|b| *b <= max).ok_or_else(bad)?,
                None => max,
            };
            blocks.push((addr, bits));
        }
        Ok(Self { blocks })
    }

    /// Whether any proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Whether `addr` is a trusted proxy.
    pub fn contains(&self, addr: IpAddr) -> bool {
        let addr = canonical(addr);
        self.blocks.iter().any(|&(net, bits)| match (canonical(net), addr) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        })
    }

    /// The client address a request from the trusted proxy `peer` carries in `Forwarded`
    /// or `X-Forwarded-For`; `None` when it names none (or only trusted ones), or when a
    /// value is not an address — then the connection counts as the proxy's own.
    pub fn client(&self, headers: &[httparse::Header<'_>]) -> Option<IpAddr> {
        let values = |name: &str| {
            headers
                .iter()
                .filter(move |h| h.name.eq_ignore_ascii_case(name))
                .filter_map(|h| std::str::from_utf8(h.value).ok())
                .flat_map(|v| v.split(','))
                .collect::<Vec<&str>>()
        };
        let forwarded = values("forwarded");
        let hops: Vec<IpAddr> = if !forwarded.is_empty() {
            forwarded
                .iter()
                .filter_map(|element| {
                    element.split(';').find_map(|pair| {
                        let (name, value) = pair.trim().split_once('=')?;
                        name.trim().eq_ignore_ascii_case("for").then(|| forwarded_node(value))
                    })
                })
                .collect::<Option<Vec<_>>>()?
        } else {
            values("x-forwarded-for")
                .iter()
                .map(|v| parse_addr(v.trim()))
                .collect::<Option<Vec<_>>>()?
        };
        hops.into_iter().rev().find(|addr| !self.contains(*addr))
    }
}

/// An IPv4-mapped IPv6 address as IPv4, so `::ffff:10.0.0.1` matches `10.0.0.0/8`.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

/// An address in `X-Forwarded-For`: `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`,
/// `[2001:db8::1]:5678`.
fn parse_addr(v: &str) -> Option<IpAddr> {
    if let Ok(addr) = v.parse::<IpAddr>() {
        return Some(canonical(addr));
    }
    if let Ok(addr) = v.parse::<std::net::SocketAddr>() {
        return Some(canonical(addr.ip()));
    }
    None
}

/// A `for=` node of RFC 7239 §6: an address, quoted or not, IPv6 in brackets, with an
/// optional port. Obfuscated identifiers and `unknown` are not addresses: `None`.
fn forwarded_node(value: &str) -> Option<IpAddr> {
    let v = value.trim().trim_matches('"');
    if let Some(rest) = v.strip_prefix('[') {
        let (addr, _) = rest.split_once(']')?;
        return addr.parse::<IpAddr>().ok().map(canonical);
    }
    parse_addr(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> Vec<httparse::Header<'a>> {
        pairs.iter().map(|(n, v)| httparse::Header { name: n, value: v.as_bytes() }).collect()
    }

    #[test]
    fn forwarded_for_is_the_rightmost_untrusted_hop() {
        let proxies = TrustedProxies::new(&["127.0.0.1", "10.0.0.0/8"]).unwrap();
        let client = |pairs: &[(&str, &str)]| proxies.client(&headers(pairs));
        assert_eq!(client(&[("X-Forwarded-For", "203.0.113.7")]), Some([203, 0, 113, 7].into()));
        // A client-written first entry is ignored: the last untrusted hop is the client.
        let spoofed = "1.1.1.1, 198.51.100.2, 10.1.2.3";
        assert_eq!(client(&[("X-Forwarded-For", spoofed)]), Some([198, 51, 100, 2].into()));
        assert_eq!(client(&[("x-forwarded-for", "10.0.0.1, 127.0.0.1")]), None);
        assert_eq!(client(&[("X-Forwarded-For", "not-an-address")]), None);
        assert_eq!(client(&[]), None);
        let fwd = r#"for=192.0.2.43, for="[2001:db8:cafe::17]:4711";proto=https"#;
        assert_eq!(client(&[("Forwarded", fwd)]), Some("2001:db8:cafe::17".parse().unwrap()));
        // Forwarded wins over X-Forwarded-For.
        let both = [("X-Forwarded-For", "198.51.100.9"), ("Forwarded", "for=192.0.2.1")];
        assert_eq!(client(&both), Some([192, 0, 2, 1].into()));
        assert_eq!(client(&[("Forwarded", "for=unknown")]), None);
        assert_eq!(client(&[("X-Forwarded-For", "[::ffff:10.9.9.9]:80, 192.0.2.5:1234")]), {
            Some([192, 0, 2, 5].into())
        });
    }

    #[test]
    fn cidr_blocks() {
        let proxies = TrustedProxies::new(&["192.168.0.0/16", "::1/128", "0.0.0.0/0"]).unwrap();
        assert!(proxies.contains([8, 8, 8, 8].into()));
        let v6 = TrustedProxies::new(&["2001:db8::/32"]).unwrap();
        assert!(v6.contains("2001:db8:1::1".parse().unwrap()));
        assert!(!v6.contains("2001:db9::1".parse().unwrap()));
        assert!(TrustedProxies::new(&["10.0.0.0/33"]).is_err());
        assert!(TrustedProxies::new(&["example.com"]).is_err());
    }

    #[test]
    fn origins() {
        let o = Origins::new(&["https://a.example", "http://*.local.test"]).unwrap();
        assert!(o.allows(Some(b"https://a.example")));
        assert!(!o.allows(Some(b"http://a.example")));
        assert!(o.allows(Some(b"http://x.local.test:8080")));
        assert!(!o.allows(Some(b"http://xlocal.test")));
        assert!(!o.allows(Some(b"null")));
        assert!(Origins::new(&["example.com"]).is_err());
        assert!(Origins::new(&["*"]).unwrap().allows(Some(b"https://evil.example")));
    }
}
