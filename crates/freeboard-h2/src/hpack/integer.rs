//! HPACK integers (RFC 7541 §5.1): an N-bit prefix, then 7 bits per octet.

use alloc::vec::Vec;

use super::HpackError;

/// The largest integer accepted: four continuation octets after a full prefix, far above
/// any length or index a bounded header block can hold, so a long run of continuation
/// octets is an error instead of an overflow.
const MAX_CONTINUATION_OCTETS: usize = 4;

/// Decodes the integer at `buf[*pos]` with a `prefix_bits`-bit prefix, advancing `pos`.
pub(crate) fn decode(buf: &[u8], pos: &mut usize, prefix_bits: u8) -> Result<usize, HpackError> {
    let mask = (1usize << prefix_bits) - 1;
    let first = *buf.get(*pos).ok_or(HpackError::Truncated)?;
    *pos += 1;
    let mut value = usize::from(first) & mask;
    if value < mask {
        return Ok(value);
    }
    for shift in 0..=MAX_CONTINUATION_OCTETS {
        let octet = *buf.get(*pos).ok_or(HpackError::Truncated)?;
        *pos += 1;
        value += usize::from(octet & 0x7f) << (7 * shift);
        if octet & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(HpackError::IntegerOverflow)
}

/// Appends `value` with a `prefix_bits`-bit prefix; `high_bits` are the first octet's bits
/// above the prefix (the representation's pattern).
pub(crate) fn encode(value: usize, prefix_bits: u8, high_bits: u8, out: &mut Vec<u8>) {
    let mask = (1usize << prefix_bits) - 1;
    if value < mask {
        out.push(high_bits | value as u8);
        return;
    }
    out.push(high_bits | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_7541_c1_examples() {
        // C.1.1: 10 with a 5-bit prefix; C.1.2: 1337 with a 5-bit prefix; C.1.3: 42, 8 bits.
        for (value, prefix, wire) in
            [(10, 5, &[0x0a][..]), (1337, 5, &[0x1f, 0x9a, 0x0a]), (42, 8, &[0x2a])]
        {
            let mut out = Vec::new();
            encode(value, prefix, 0, &mut out);
            assert_eq!(out, wire);
            let mut pos = 0;
            assert_eq!(decode(wire, &mut pos, prefix), Ok(value));
            assert_eq!(pos, wire.len());
        }
    }

    #[test]
    fn truncated_and_overlong_integers_are_errors() {
        assert_eq!(decode(&[0x1f, 0x9a], &mut 0, 5), Err(HpackError::Truncated));
        assert_eq!(
            decode(&[0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], &mut 0, 5),
            Err(HpackError::IntegerOverflow)
        );
        for value in [0, 30, 31, 127, 128, 4096, 1 << 20] {
            let mut out = Vec::new();
            encode(value, 5, 0xe0, &mut out);
            assert_eq!(out[0] & 0xe0, 0xe0);
            assert_eq!(decode(&out, &mut 0, 5), Ok(value));
        }
    }
}
