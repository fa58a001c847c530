//! The close frame payload (RFC 6455 §5.5.1): a close code and a UTF-8 reason.

pub use crate::close_code::CloseCode;
use crate::{ProtocolError, utf8};

/// The longest close reason: 125 bytes of control payload minus 2 for the code.
pub const MAX_REASON_LEN: usize = 123;

/// Parses a received close payload into its code and reason.
///
/// An empty payload means no code was given (reported as 1005).
pub fn parse_payload(payload: &[u8]) -> Result<(CloseCode, &str), ProtocolError> {
    match payload {
        [] => Ok((CloseCode::NO_STATUS, "")),
        // §5.5.1: "If there is a body, the first two bytes of the body MUST be a 2-byte
        // unsigned integer ... representing a status code".
        [_] => Err(ProtocolError::InvalidClosePayload),
        [hi, lo, reason @ ..] => {
            let code = CloseCode(u16::from_be_bytes([*hi, *lo]));
            if !code.is_sendable() {
                return Err(ProtocolError::InvalidCloseCode(code.0));
            }
            let reason = utf8::validate(reason)?;
            Ok((code, reason))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads() {
        assert_eq!(parse_payload(&[]), Ok((CloseCode::NO_STATUS, "")));
        assert_eq!(parse_payload(&[3]), Err(ProtocolError::InvalidClosePayload));
        assert_eq!(parse_payload(&[0x03, 0xe8, b'o', b'k']), Ok((CloseCode::NORMAL, "ok")));
        assert_eq!(parse_payload(&[0x03, 0xed]), Err(ProtocolError::InvalidCloseCode(1005)));
        assert_eq!(parse_payload(&[0x03, 0xe8, 0xff]), Err(ProtocolError::InvalidUtf8));
    }
}
