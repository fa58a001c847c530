//! What the experiments send where the bytes matter: JSON as a live-scores feed sends it, so
//! that permessage-deflate compresses it as it would a real feed. The broadcast puts it behind
//! its binary prefix, the compression experiment echoes it.

use std::fmt::Write as _;

/// `len` bytes of JSON as a live-scores feed sends it: records that repeat their keys, with
/// numbers that change (deterministic, so every run sends the same bytes).
pub fn json(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 128);
    out.push(b'[');
    let mut i = 0u64;
    while out.len() < len {
        let x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
        let _ = write!(
            Cursor(&mut out),
            r#"{{"match":{},"home":{},"away":{},"minute":{},"odds":[{}.{:02},{}.{:02}],"event":"{}"}},"#,
            1000 + i,
            x % 5,
            (x >> 3) % 4,
            x % 90,
            1 + x % 7,
            x % 100,
            2 + (x >> 5) % 6,
            (x >> 7) % 100,
            ["goal", "corner", "card", "substitution"][(x % 4) as usize],
        );
        i += 1;
    }
    out.truncate(len);
    out
}

/// `write!` into a `Vec<u8>` without `io::Write`'s error plumbing.
struct Cursor<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Cursor<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}
