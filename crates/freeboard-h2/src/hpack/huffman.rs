//! HPACK's Huffman code (RFC 7541 §5.2, Appendix B).
//!
//! The code is canonical, so its code lengths define it and decoding needs only, per code
//! length, the first code and the symbols of that length in order: a header block is at most
//! a few KiB, so a bit at a time is fast enough, and there is no 4 KiB state table to keep.

use alloc::vec::Vec;

use super::HpackError;

/// The end-of-string symbol; decoding it is an error (§5.2).
const EOS: u16 = 256;

/// The longest code, in bits.
const MAX_LEN: usize = 30;

/// Per code length: the first canonical code of that length, the index in [`SYMBOLS`] of its
/// symbol, and how many codes have that length.
struct Canonical {
    first_code: [u32; MAX_LEN + 1],
    first_symbol: [u16; MAX_LEN + 1],
    count: [u16; MAX_LEN + 1],
    /// Symbols ordered by (code length, symbol).
    symbols: [u16; 257],
    /// Each symbol's code (right-aligned).
    codes: [u32; 257],
}

const CANONICAL: Canonical = canonical();

const fn canonical() -> Canonical {
    let mut c = Canonical {
        first_code: [0; MAX_LEN + 1],
        first_symbol: [0; MAX_LEN + 1],
        count: [0; MAX_LEN + 1],
        symbols: [0; 257],
        codes: [0; 257],
    };
    let mut symbol = 0;
    while symbol < 257 {
        c.count[CODE_LENGTHS[symbol] as usize] += 1;
        symbol += 1;
    }
    let mut code = 0u32;
    let mut next_symbol = 0u16;
    let mut len = 1;
    while len <= MAX_LEN {
        code <<= 1;
        c.first_code[len] = code;
        c.first_symbol[len] = next_symbol;
        let mut symbol = 0;
        while symbol < 257 {
            if CODE_LENGTHS[symbol] as usize == len {
                c.symbols[next_symbol as usize] = symbol as u16;
                c.codes[symbol] = code;
                next_symbol += 1;
                code += 1;
            }
            symbol += 1;
        }
        len += 1;
    }
    c
}

/// Decodes `input`, handing each octet to `emit`.
///
/// §5.2: "A padding strictly longer than 7 bits MUST be treated as a decoding error. A padding
/// not corresponding to the most significant bits of the code for the EOS symbol MUST be
/// treated as a decoding error. A Huffman-encoded string literal containing the EOS symbol
/// MUST be treated as a decoding error."
pub(crate) fn decode(input: &[u8], mut emit: impl FnMut(u8)) -> Result<(), HpackError> {
    let c = &CANONICAL;
    let (mut code, mut len) = (0u32, 0usize);
    for &octet in input {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((octet >> bit) & 1);
            len += 1;
            let offset = code.wrapping_sub(c.first_code[len]);
            if offset < u32::from(c.count[len]) {
                let symbol = c.symbols[usize::from(c.first_symbol[len]) + offset as usize];
                if symbol == EOS {
                    return Err(HpackError::InvalidHuffman);
                }
                emit(symbol as u8);
                (code, len) = (0, 0);
            } else if len == MAX_LEN {
                // Every 30-bit value is a code or past the last one.
                return Err(HpackError::InvalidHuffman);
            }
        }
    }
    // What is left must be padding: at most 7 bits, all ones (EOS's leading bits).
    if len > 7 || code != (1 << len) - 1 {
        return Err(HpackError::InvalidHuffman);
    }
    Ok(())
}

/// Appends the Huffman encoding of `input`, padded with ones.
pub fn encode(input: &[u8], out: &mut Vec<u8>) {
    let (mut bits, mut held) = (0u64, 0u32);
    for &octet in input {
        let len = u32::from(CODE_LENGTHS[usize::from(octet)]);
        bits = (bits << len) | u64::from(CANONICAL.codes[usize::from(octet)]);
        held += len;
        while held >= 8 {
            held -= 8;
            out.push((bits >> held) as u8);
        }
    }
    if held > 0 {
        out.push(((bits << (8 - held)) | ((1 << (8 - held)) - 1)) as u8);
    }
}

/// The length of `input`'s Huffman encoding.
pub fn encoded_len(input: &[u8]) -> usize {
    let bits: usize = input.iter().map(|&b| usize::from(CODE_LENGTHS[usize::from(b)])).sum();
    bits.div_ceil(8)
}

/// Code lengths in bits of the 256 octets and EOS (index 256), RFC 7541 Appendix B.
/// The code is canonical (codes of one length are consecutive, in symbol order), so the
/// lengths alone define it.
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_octet_round_trips_and_codes_match_appendix_b() {
        // Spot checks against Appendix B: '0' = 00000 (5 bits), 'a' = 00011, ' ' = 010100,
        // EOS = 3fffffff (30 bits).
        assert_eq!((CANONICAL.codes[usize::from(b'0')], CODE_LENGTHS[usize::from(b'0')]), (0x0, 5));
        assert_eq!((CANONICAL.codes[usize::from(b'a')], CODE_LENGTHS[usize::from(b'a')]), (0x3, 5));
        assert_eq!(
            (CANONICAL.codes[usize::from(b' ')], CODE_LENGTHS[usize::from(b' ')]),
            (0x14, 6)
        );
        assert_eq!((CANONICAL.codes[256], CODE_LENGTHS[256]), (0x3fff_ffff, 30));
        assert_eq!((CANONICAL.codes[255], CODE_LENGTHS[255]), (0x3ff_ffee, 26));
        let all: Vec<u8> = (0..=255).collect();
        let mut encoded = Vec::new();
        encode(&all, &mut encoded);
        assert_eq!(encoded.len(), encoded_len(&all));
        let mut decoded = Vec::new();
        decode(&encoded, |b| decoded.push(b)).unwrap();
        assert_eq!(decoded, all);
    }

    #[test]
    fn rfc_7541_c4_strings() {
        // C.4.1: "www.example.com".
        let wire = [0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff];
        let mut out = Vec::new();
        decode(&wire, |b| out.push(b)).unwrap();
        assert_eq!(out, b"www.example.com");
        let mut again = Vec::new();
        encode(b"www.example.com", &mut again);
        assert_eq!(again, wire);
    }

    #[test]
    fn bad_padding_and_eos_are_errors() {
        // 'a' (00011) padded with zeros instead of ones.
        assert_eq!(decode(&[0b0001_1000], |_| {}), Err(HpackError::InvalidHuffman));
        // A whole octet of padding (more than 7 bits).
        assert_eq!(decode(&[0b0001_1111, 0xff], |_| {}), Err(HpackError::InvalidHuffman));
        // EOS itself: 30 ones, then padding.
        assert_eq!(decode(&[0xff, 0xff, 0xff, 0xff], |_| {}), Err(HpackError::InvalidHuffman));
        assert_eq!(decode(&[], |_| {}), Ok(()));
    }
}
