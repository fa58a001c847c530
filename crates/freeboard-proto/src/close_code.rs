//! Close status codes (RFC 6455 §7.4): which exist and which may be sent.

use core::fmt;

/// A close status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CloseCode(pub u16);

impl CloseCode {
    /// 1000: the purpose of the connection has been fulfilled.
    pub const NORMAL: Self = Self(1000);
    /// 1001: the endpoint is going away (server shutdown, page navigation).
    pub const GOING_AWAY: Self = Self(1001);
    /// 1002: the peer broke the protocol.
    pub const PROTOCOL_ERROR: Self = Self(1002);
    /// 1003: a data type this endpoint cannot accept.
    pub const UNSUPPORTED_DATA: Self = Self(1003);
    /// 1005: no status code was present. Reported locally, never sent.
    pub const NO_STATUS: Self = Self(1005);
    /// 1006: closed without a close frame. Reported locally, never sent.
    pub const ABNORMAL: Self = Self(1006);
    /// 1007: a message's payload did not match its type (invalid UTF-8 text).
    pub const INVALID_PAYLOAD: Self = Self(1007);
    /// 1008: a message violated the endpoint's policy (also: slow consumer).
    pub const POLICY_VIOLATION: Self = Self(1008);
    /// 1009: a message or frame was too big to process.
    pub const MESSAGE_TOO_BIG: Self = Self(1009);
    /// 1010: the client expected an extension the server did not negotiate.
    pub const MANDATORY_EXTENSION: Self = Self(1010);
    /// 1011: the server hit an unexpected condition.
    pub const INTERNAL_ERROR: Self = Self(1011);
    /// 1012: the service is restarting. Registered with IANA.
    pub const SERVICE_RESTART: Self = Self(1012);
    /// 1013: try again later (out of memory budget). Registered with IANA.
    pub const TRY_AGAIN_LATER: Self = Self(1013);

    /// Whether this code may appear in a close frame.
    ///
    /// RFC 6455 §7.4.1 defines 1000–1003 and 1007–1011; IANA registered 1012–1014 since;
    /// 3000–4999 belong to libraries and applications. 1004 is reserved and 1005, 1006 and
    /// 1015 "MUST NOT be set as a status code in a Close control frame by an endpoint".
    pub fn is_sendable(self) -> bool {
        matches!(self.0, 1000..=1003 | 1007..=1014 | 3000..=4999)
    }
}

impl fmt::Display for CloseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sendable_codes_follow_rfc_and_iana() {
        for code in 0..=u16::MAX {
            let expected = matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999);
            assert_eq!(CloseCode(code).is_sendable(), expected, "code {code}");
        }
    }
}
