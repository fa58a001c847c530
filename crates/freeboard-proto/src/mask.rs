//! Payload masking (RFC 6455 §5.3): `data[i] ^= key[(offset + i) % 4]`.
//!
//! A frame's payload may arrive in many reads, so every call takes the offset of its first byte
//! within the payload; the key rotates to match. The fast path XORs eight bytes at a time with
//! safe code (no alignment prologue: a 64-byte message is eight words and nothing else) and is
//! checked against [`apply_mask_reference`] over every alignment and offset.

/// Masks (or unmasks, the operation is its own inverse) `data` in place.
///
/// `offset` is the position of `data[0]` within the frame's payload.
pub fn apply_mask(data: &mut [u8], key: [u8; 4], offset: usize) {
    let key = rotate(key, offset);
    let word = u64::from_ne_bytes([key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3]]);
    // Eight bytes at a time from wherever `data` starts: unaligned loads cost nothing extra
    // on the targets that serve traffic, and the compiler splits them where they would.
    let mut chunks = data.chunks_exact_mut(8);
    for chunk in &mut chunks {
        // NOTE(unwrap): chunks_exact_mut(8) yields exactly 8 bytes.
        let bytes: &mut [u8; 8] = chunk.try_into().unwrap();
        *bytes = (u64::from_ne_bytes(*bytes) ^ word).to_ne_bytes();
    }
    // The whole words consumed a multiple of 4 bytes, so the key is still aligned.
    for (i, byte) in chunks.into_remainder().iter_mut().enumerate() {
        *byte ^= key[i & 3];
    }
}

/// The plain byte-at-a-time loop, kept as the reference for [`apply_mask`].
pub fn apply_mask_reference(data: &mut [u8], key: [u8; 4], offset: usize) {
    for (i, byte) in data.iter_mut().enumerate() {
        *byte ^= key[(offset + i) % 4];
    }
}

fn rotate(key: [u8; 4], by: usize) -> [u8; 4] {
    [key[by & 3], key[(by + 1) & 3], key[(by + 2) & 3], key[(by + 3) & 3]]
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

    /// Every alignment, length up to 70 bytes and key offset agrees with the reference.
    #[test]
    fn matches_reference_at_every_alignment_and_offset() {
        let key = [0x12, 0x34, 0x56, 0x78];
        let source: [u8; 80] = core::array::from_fn(|i| (i * 7 + 3) as u8);
        for align in 0..8 {
            for len in 0..70 {
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
