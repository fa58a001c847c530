//! The header block encoder for our responses.
//!
//! Static table and literals without indexing only (RFC 7541 §6.1, §6.2.2): a response head
//! is a status and a few fields, so a dynamic table would save little and would have to be
//! kept in step with the peer's decoder; without one the encoder has no state at all.

use alloc::vec::Vec;

use super::integer;
use super::table::STATIC;

/// Appends `:status` — indexed when the static table has it (200, 204, 206, 304, 400, 404,
/// 500), else a literal with the indexed name `:status` (index 8).
///
/// `status` must be 100–999 (checked by the caller).
pub fn encode_status(status: u16, out: &mut Vec<u8>) {
    let digits =
        [b'0' + (status / 100) as u8, b'0' + (status / 10 % 10) as u8, b'0' + (status % 10) as u8];
    if let Some(index) = STATIC[7..14].iter().position(|&(_, value)| value == digits) {
        integer::encode(8 + index, 7, 0x80, out);
        return;
    }
    integer::encode(8, 4, 0x00, out);
    encode_string(&digits, out);
}

/// Appends a field as a literal without indexing, its name indexed when the static table
/// has it.
pub fn encode_field(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    match STATIC.iter().position(|&(n, _)| n == name) {
        Some(index) => integer::encode(index + 1, 4, 0x00, out),
        None => {
            out.push(0x00);
            encode_string(name, out);
        }
    }
    encode_string(value, out);
}

fn encode_string(value: &[u8], out: &mut Vec<u8>) {
    integer::encode(value.len(), 7, 0x00, out);
    out.extend_from_slice(value);
}
