//! Payload masking (RFC 6455 §5.3): `data[i] ^= key[(offset + i) % 4]`.
//!
//! A frame's payload may arrive in many reads, so every call takes the offset of its first byte
//! within the payload; the key rotates to match. The fast path XORs 32-byte blocks of 8-byte
//! words, then 8-byte words, then bytes, with safe code and no alignment prologue (a 64-byte
//! message is two blocks and nothing else), and is checked against [`apply_mask_reference`]
//! over every alignment and offset.

/// Masks (or unmasks, the operation is its own inverse) `data` in place.
///
/// `offset` is the position of `data[0]` within the frame's payload.
pub fn apply_mask(data: &mut [u8], key: [u8; 4], offset: usize) {
    let key = rotate(key, offset);
    // 32 bytes at a time as four 8-byte words against the key repeated over a word, which the
    // compiler turns into 16-byte vector XORs (SSE2, NEON) with unaligned loads, from
    // wherever `data` starts; then eight bytes at a time, then single bytes. Every step
    // consumes a multiple of 4 bytes, so the key stays aligned.
    let word = u64::from(u32::from_ne_bytes(key)) * 0x1_0000_0001;
    let (blocks, rest) = data.as_chunks_mut::<32>();
    for block in blocks {
        for bytes in block.as_chunks_mut::<8>().0 {
            *bytes = (u64::from_ne_bytes(*bytes) ^ word).to_ne_bytes();
        }
    }
    let (words, tail) = rest.as_chunks_mut::<8>();
    for bytes in words {
        *bytes = (u64::from_ne_bytes(*bytes) ^ word).to_ne_bytes();
    }
    for (byte, k) in tail.iter_mut().zip(word.to_ne_bytes()) {
        *byte ^= k;
    }
}

/// The plain byte-at-a-time loop, kept as the reference for [`apply_mask`].
pub fn apply_mask_reference(data: &mut [u8], key: [u8; 4], offset: usize) {
    for (i, byte) in data.iter_mut().enumerate() {
        *byte ^= key[(offset + i) % 4];
    }
}

/// `key` as seen from byte `by` of the payload on: the key's bytes turned left by `by % 4`.
fn rotate(key: [u8; 4], by: usize) -> [u8; 4] {
    let turn = 8 * (by as u32 & 3);
    let word = u32::from_le_bytes(key);
    word.rotate_right(turn).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_example_hello() {
        let mut data = [0x7f, 0x9f, 0x4d, 0x51, 0x58];
        apply_mask(&mut data, [0x37, 0xfa, 0x21, 0x3d], 0);
        assert_eq!(&data, b"Hello");
    }

    /// Every alignment, length up to 200 bytes (six 32-byte blocks and every remainder) and
    /// key offset agrees with the reference.
    #[test]
    fn matches_reference_at_every_alignment_and_offset() {
        let key = [0x12, 0x34, 0x56, 0x78];
        let source: [u8; 208] = core::array::from_fn(|i| (i * 7 + 3) as u8);
        for align in 0..8 {
            for len in 0..200 {
                for offset in 0..8 {
                    let mut fast = source;
                    let mut slow = source;
                    apply_mask(&mut fast[align..align + len], key, offset);
                    apply_mask_reference(&mut slow[align..align + len], key, offset);
                    assert_eq!(fast, slow, "align {align} len {len} offset {offset}");
                }
            }
        }
    }

    /// Masking a payload in pieces equals masking it at once.
    #[test]
    fn continues_across_partial_chunks() {
        let key = [0xde, 0xad, 0xbe, 0xef];
        let source: [u8; 64] = core::array::from_fn(|i| i as u8);
        let mut whole = source;
        apply_mask(&mut whole, key, 0);
        for split in 0..=64 {
            let mut parts = source;
            let (a, b) = parts.split_at_mut(split);
            apply_mask(a, key, 0);
            apply_mask(b, key, split);
            assert_eq!(parts, whole, "split {split}");
        }
    }
}
