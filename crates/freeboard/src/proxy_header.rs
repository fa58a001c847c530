//! The PROXY protocol header (HAProxy's `proxy-protocol.txt`, versions 1 and 2) that a load
//! balancer sends before the client's bytes, naming the client's address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The longest header accepted: a v1 line is at most 107 bytes; v2 addresses for TCP over
/// IPv6 take 36 bytes after the 16-byte preamble, and TLVs may follow (up to this bound).
pub(crate) const MAX_LEN: usize = 536;

/// The v2 signature: `\r\n\r\n\0\r\nQUIT\n`.
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// Parses the header at the start of `buf`: `Ok(None)` for "need more bytes",
/// `Ok(Some((len, source)))` with the header's length and the client's address (`None` for
/// `UNKNOWN` / `LOCAL`: a health check of the balancer itself, which counts as the
/// connection's own address), `Err(())` when `buf` does not start with a valid header.
#[allow(clippy::result_unit_err)]
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(usize, Option<SocketAddr>)>, ()> {
    if buf.is_empty() {
        return Ok(None);
    }
    let prefix = buf.len().min(V2_SIGNATURE.len());
    if buf[..prefix] == V2_SIGNATURE[..prefix] {
        return parse_v2(buf);
    }
    let v1 = b"PROXY ";
    let prefix = buf.len().min(v1.len());
    if buf[..prefix] != v1[..prefix] {
        return Err(());
    }
    parse_v1(buf)
}

/// `PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\r\n` (or `TCP6`, or `UNKNOWN …`).
fn parse_v1(buf: &[u8]) -> Result<Option<(usize, Option<SocketAddr>)>, ()> {
    const MAX_V1: usize = 107;
    let Some(end) = buf.windows(2).take(MAX_V1 - 1).position(|w| w == b"\r\n") else {
        return if buf.len() >= MAX_V1 { Err(()) } else { Ok(None) };
    };
    let line = std::str::from_utf8(&buf[..end]).map_err(|_| ())?;
    let mut fields = line.split(' ');
    let (_proxy, family) = (fields.next(), fields.next().ok_or(())?);
    if family == "UNKNOWN" {
        return Ok(Some((end + 2, None)));
    }
    let source: IpAddr = fields.next().ok_or(())?.parse().map_err(|_| ())?;
    let _destination: IpAddr = fields.next().ok_or(())?.parse().map_err(|_| ())?;
    let port: u16 = fields.next().ok_or(())?.parse().map_err(|_| ())?;
    let _destination_port: u16 = fields.next().ok_or(())?.parse().map_err(|_| ())?;
    match (family, source) {
        ("TCP4", IpAddr::V4(_)) | ("TCP6", IpAddr::V6(_)) if fields.next().is_none() => {
            Ok(Some((end + 2, Some(SocketAddr::new(source, port)))))
        }
        _ => Err(()),
    }
}

/// The binary header: signature, version and command, family, length, addresses, TLVs.
fn parse_v2(buf: &[u8]) -> Result<Option<(usize, Option<SocketAddr>)>, ()> {
    if buf.len() < 16 {
        return Ok(None);
    }
    let (version_command, family) = (buf[12], buf[13]);
    let len = 16 + usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if version_command >> 4 != 2 || len > MAX_LEN {
        return Err(());
    }
    if buf.len() < len {
        return Ok(None);
    }
    let body = &buf[16..len];
    let source = match (version_command & 0x0f, family) {
        (0, _) => None, // LOCAL: the balancer's own connection
        (1, 0x11) if body.len() >= 12 => {
            // PROXY, TCP over IPv4
            let ip = Ipv4Addr::new(body[0], body[1], body[2], body[3]);
            Some(SocketAddr::new(ip.into(), u16::from_be_bytes([body[8], body[9]])))
        }
        (1, 0x21) if body.len() >= 36 => {
            // PROXY, TCP over IPv6
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&body[..16]);
            let port = u16::from_be_bytes([body[32], body[33]]);
            Some(SocketAddr::new(Ipv6Addr::from(octets).into(), port))
        }
        (1, 0x00) => None, // UNSPEC
        _ => return Err(()),
    };
    Ok(Some((len, source)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_lines() {
        let line = b"PROXY TCP4 192.0.2.1 198.51.100.1 56324 443\r\nGET / HTTP/1.1\r\n";
        let addr = SocketAddr::from(([192, 0, 2, 1], 56324));
        assert_eq!(parse(line), Ok(Some((45, Some(addr)))));
        let v6 = b"PROXY TCP6 2001:db8::1 2001:db8::2 1 2\r\n";
        assert_eq!(
            parse(v6).unwrap().unwrap().1.unwrap().ip(),
            "2001:db8::1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(parse(b"PROXY UNKNOWN\r\n"), Ok(Some((15, None))));
        for split in 0..45 {
            assert_eq!(parse(&line[..split]), Ok(None), "split at {split}");
        }
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(()));
        assert_eq!(parse(b"PROXY TCP4 192.0.2.1 x 1 2\r\n"), Err(()));
        assert_eq!(parse(b"PROXY TCP4 2001:db8::1 2001:db8::2 1 2\r\n"), Err(()));
        assert_eq!(parse(&[b'P', b'R', b'O', b'X', b'Y', b' ', b'A'].repeat(20)), Err(()));
    }

    #[test]
    fn v2_headers() {
        let mut h = V2_SIGNATURE.to_vec();
        h.extend_from_slice(&[
            0x21, 0x11, 0, 12, 203, 0, 113, 9, 10, 0, 0, 1, 0x1f, 0x90, 0x01, 0xbb,
        ]);
        let addr = SocketAddr::from(([203, 0, 113, 9], 8080));
        assert_eq!(parse(&h), Ok(Some((28, Some(addr)))));
        for split in 0..h.len() {
            assert_eq!(parse(&h[..split]), Ok(None), "split at {split}");
        }
        let mut local = V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(parse(&local), Ok(Some((16, None))));
        let mut bad = V2_SIGNATURE.to_vec();
        bad.extend_from_slice(&[0x31, 0x11, 0, 0]);
        assert_eq!(parse(&bad), Err(()));
        let mut huge = V2_SIGNATURE.to_vec();
        huge.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
        assert_eq!(parse(&huge), Err(()));
    }
}
