//! The Fossil delta format: a target expressed as copies from a source and literal bytes, as
//! the Fossil SCM defines it (`src/delta.c`, "Delta Encoding") and as Centrifugo and its
//! client SDKs use it for delta-compressed publications.
//!
//! ```text
//! delta    = LEN "\n" command* CHECKSUM ";"
//! command  = COUNT "@" OFFSET ","          copy COUNT bytes of the source from OFFSET
//!          | COUNT ":" BYTES               insert the COUNT bytes that follow
//! ```
//!
//! Numbers are base 64, most significant digit first, in the alphabet
//! `0-9 A-Z _ a-z ~`; `LEN` is the target's length and `CHECKSUM` Fossil's 32-bit sum of
//! the target's big-endian words, which [`apply`] checks.
//!
//! Written here rather than taken from crates.io: the one crate there (`fossil-delta` 0.2,
//! unchanged since 2020) panics on some malformed deltas and allocates per call, where a
//! server encodes into buffers it reuses and a client decodes what the network hands it.
//!
//! ```
//! use freeboard::fossil;
//! let old = br#"{"home":1,"away":0,"minute":61,"scorers":["Ada","Grace"],"venue":"Lovelace Park"}"#;
//! let new = br#"{"home":2,"away":0,"minute":64,"scorers":["Ada","Grace","Ada"],"venue":"Lovelace Park"}"#;
//! let mut delta = Vec::new();
//! fossil::encode(old, new, &mut fossil::Encoder::default(), &mut delta);
//! let mut out = Vec::new();
//! fossil::apply(old, &delta, usize::MAX, &mut out).unwrap();
//! assert_eq!(out, new);
//! ```

/// Bytes the rolling hash covers, as Fossil's `NHASH`.
const NHASH: usize = 16;

/// How many candidate source blocks one hash bucket is searched for (Fossil's limit).
const SEARCH_LIMIT: usize = 250;

const DIGITS: &[u8; 64] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~";

/// Why a delta cannot be applied to a source. Every one is the peer's (or a wrong base's)
/// fault: the delta is refused whole, nothing partial is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeltaError {
    /// Not a delta: the length line, a number or a command is malformed or missing.
    Malformed,
    /// The target it announces is longer than the caller allows.
    TooLarge {
        /// The announced length.
        len: usize,
    },
    /// A copy reaches past the end of the source: it was made against another base.
    CopyOutOfSource,
    /// The commands make more or fewer bytes than announced.
    WrongLength,
    /// The target's checksum differs from the one announced: wrong base or damaged delta.
    BadChecksum,
}

impl std::fmt::Display for DeltaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Malformed => f.write_str("not a Fossil delta"),
            Self::TooLarge { len } => write!(f, "the delta's target ({len} bytes) is too large"),
            Self::CopyOutOfSource => f.write_str("a copy reaches past the end of the base"),
            Self::WrongLength => f.write_str("the delta makes another length than it announces"),
            Self::BadChecksum => f.write_str("the delta's checksum does not match (wrong base?)"),
        }
    }
}

impl std::error::Error for DeltaError {}

/// The encoder's tables, kept between calls so that encoding allocates only when a source is
/// larger than any before.
#[derive(Debug, Default)]
pub struct Encoder {
    /// Per hash bucket, the last source block that hashes to it (`u32::MAX`: none).
    landmark: Vec<u32>,
    /// Per source block, the previous block of its bucket (`u32::MAX`: none).
    collide: Vec<u32>,
}

/// Writes into `delta` (cleared first) a Fossil delta that turns `source` into `target`.
///
/// Matches are found as Fossil finds them: the source is hashed in 16-byte blocks, and the
/// target is scanned with a rolling hash of the same width; a match is taken when it is
/// longer than the copy command that names it.
pub fn encode(source: &[u8], target: &[u8], encoder: &mut Encoder, delta: &mut Vec<u8>) {
    delta.clear();
    put_int(delta, target.len() as u32);
    delta.push(b'\n');
    if source.len() <= NHASH {
        insert(delta, target);
        put_int(delta, checksum(target));
        delta.push(b';');
        return;
    }
    let n_hash = source.len() / NHASH;
    let Encoder { landmark, collide } = encoder;
    landmark.clear();
    landmark.resize(n_hash, u32::MAX);
    collide.clear();
    collide.resize(n_hash, u32::MAX);
    let mut i = 0;
    while i + NHASH < source.len() {
        let block = i / NHASH;
        let hv = RollingHash::new(&source[i..i + NHASH]).value() as usize % n_hash;
        collide[block] = landmark[hv];
        landmark[hv] = block as u32;
        i += NHASH;
    }

    let mut base = 0;
    while base + NHASH < target.len() {
        let mut hash = RollingHash::new(&target[base..base + NHASH]);
        let mut i = 0;
        loop {
            let mut best: Option<(usize, usize, usize)> = None; // (count, offset, literal)
            let mut block = landmark[hash.value() as usize % n_hash];
            let mut limit = SEARCH_LIMIT;
            while block != u32::MAX && limit > 0 {
                limit -= 1;
                let src = block as usize * NHASH;
                let at = base + i;
                // Forwards from the block's start, then backwards over the literal.
                let forward =
                    source[src..].iter().zip(&target[at..]).take_while(|(a, b)| a == b).count();
                let backward = (1..=i.min(src.saturating_sub(1)))
                    .take_while(|&k| source[src - k] == target[at - k])
                    .count();
                let offset = src - backward;
                let count = forward + backward;
                let literal = i - backward;
                let cost = digits(literal) + digits(count) + digits(offset) + 3;
                if count >= cost && best.is_none_or(|(c, _, _)| count > c) {
                    best = Some((count, offset, literal));
                }
                block = collide[block as usize];
            }
            if let Some((count, offset, literal)) = best {
                if literal > 0 {
                    insert(delta, &target[base..base + literal]);
                    base += literal;
                }
                base += count;
                put_int(delta, count as u32);
                delta.push(b'@');
                put_int(delta, offset as u32);
                delta.push(b',');
                break;
            }
            if base + i + NHASH >= target.len() {
                insert(delta, &target[base..]);
                base = target.len();
                break;
            }
            hash.roll(target[base + i + NHASH]);
            i += 1;
        }
    }
    if base < target.len() {
        insert(delta, &target[base..]);
    }
    put_int(delta, checksum(target));
    delta.push(b';');
}

/// Applies `delta` to `source`, writing the target into `out` (cleared first). A target
/// announced longer than `max_len` is refused before anything is allocated for it.
pub fn apply(
    source: &[u8],
    delta: &[u8],
    max_len: usize,
    out: &mut Vec<u8>,
) -> Result<(), DeltaError> {
    out.clear();
    let mut rest = delta;
    let len = get_int(&mut rest)?;
    if len > max_len {
        return Err(DeltaError::TooLarge { len });
    }
    rest = rest.strip_prefix(b"\n").ok_or(DeltaError::Malformed)?;
    out.reserve(len);
    loop {
        let count = get_int(&mut rest)?;
        let (&op, tail) = rest.split_first().ok_or(DeltaError::Malformed)?;
        rest = tail;
        match op {
            b'@' => {
                let offset = get_int(&mut rest)?;
                rest = rest.strip_prefix(b",").ok_or(DeltaError::Malformed)?;
                if out.len() + count > len {
                    return Err(DeltaError::WrongLength);
                }
                let copy = offset
                    .checked_add(count)
                    .and_then(|end| source.get(offset..end))
                    .ok_or(DeltaError::CopyOutOfSource)?;
                out.extend_from_slice(copy);
            }
            b':' => {
                if out.len() + count > len {
                    return Err(DeltaError::WrongLength);
                }
                if count > rest.len() {
                    return Err(DeltaError::Malformed);
                }
                let (literal, tail) = rest.split_at(count);
                out.extend_from_slice(literal);
                rest = tail;
            }
            b';' => {
                if out.len() != len {
                    return Err(DeltaError::WrongLength);
                }
                if count != checksum(out) as usize {
                    return Err(DeltaError::BadChecksum);
                }
                return Ok(());
            }
            _ => return Err(DeltaError::Malformed),
        }
    }
}

/// The length of the target a delta announces, without applying it.
pub fn target_len(delta: &[u8]) -> Result<usize, DeltaError> {
    let mut rest = delta;
    let len = get_int(&mut rest)?;
    rest.strip_prefix(b"\n").map(|_| len).ok_or(DeltaError::Malformed)
}

/// Fossil's checksum: the sum of the target's big-endian 32-bit words, the last partial word
/// padded with zeros on the right.
pub fn checksum(bytes: &[u8]) -> u32 {
    let mut words = bytes.chunks_exact(4);
    let mut sum = 0u32;
    for word in &mut words {
        // NOTE(unwrap): chunks_exact gives 4 bytes.
        sum = sum.wrapping_add(u32::from_be_bytes(word.try_into().unwrap()));
    }
    let mut last = [0u8; 4];
    last[..words.remainder().len()].copy_from_slice(words.remainder());
    sum.wrapping_add(u32::from_be_bytes(last))
}

/// Fossil's rolling hash of a 16-byte window (two 16-bit sums, as Adler's).
struct RollingHash {
    a: u16,
    b: u16,
    window: [u8; NHASH],
    /// Where the window's oldest byte is in `window`.
    oldest: usize,
}

impl RollingHash {
    fn new(window: &[u8]) -> Self {
        let mut a = 0u16;
        let mut b = 0u16;
        for &byte in window {
            a = a.wrapping_add(u16::from(byte));
            b = b.wrapping_add(a);
        }
        let mut copy = [0u8; NHASH];
        copy.copy_from_slice(window);
        Self { a, b, window: copy, oldest: 0 }
    }

    /// Slides the window one byte: `byte` in, the oldest out.
    fn roll(&mut self, byte: u8) {
        let old = u16::from(self.window[self.oldest]);
        self.window[self.oldest] = byte;
        self.oldest = (self.oldest + 1) % NHASH;
        self.a = self.a.wrapping_sub(old).wrapping_add(u16::from(byte));
        self.b = self.b.wrapping_sub((NHASH as u16).wrapping_mul(old)).wrapping_add(self.a);
    }

    fn value(&self) -> u32 {
        u32::from(self.a) | (u32::from(self.b) << 16)
    }
}

/// Appends an insert command for `literal`.
fn insert(delta: &mut Vec<u8>, literal: &[u8]) {
    put_int(delta, literal.len() as u32);
    delta.push(b':');
    delta.extend_from_slice(literal);
}

fn put_int(out: &mut Vec<u8>, mut n: u32) {
    let mut digits = [0u8; 6];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = DIGITS[(n & 63) as usize];
        n >>= 6;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// The base-64 digits of `n`.
fn digits(n: usize) -> usize {
    let mut count = 1;
    let mut n = n >> 6;
    while n > 0 {
        count += 1;
        n >>= 6;
    }
    count
}

/// Reads a base-64 number off the front of `rest`; at least one digit, and at most what a
/// `u32` holds (Fossil's numbers are 32-bit).
fn get_int(rest: &mut &[u8]) -> Result<usize, DeltaError> {
    let mut value: u64 = 0;
    let mut taken = 0;
    for &byte in rest.iter() {
        let Some(digit) = digit_value(byte) else { break };
        value = (value << 6) | u64::from(digit);
        taken += 1;
        if value > u64::from(u32::MAX) {
            return Err(DeltaError::Malformed);
        }
    }
    if taken == 0 {
        return Err(DeltaError::Malformed);
    }
    *rest = &rest[taken..];
    Ok(value as usize)
}

fn digit_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'A'..=b'Z' => Some(byte - b'A' + 10),
        b'_' => Some(36),
        b'a'..=b'z' => Some(byte - b'a' + 37),
        b'~' => Some(63),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(source: &[u8], target: &[u8]) -> usize {
        let mut delta = Vec::new();
        encode(source, target, &mut Encoder::default(), &mut delta);
        let mut out = Vec::new();
        apply(source, &delta, usize::MAX, &mut out).unwrap();
        assert_eq!(out, target);
        delta.len()
    }

    /// A document of `n` numbered fields, some changed by `turn`.
    fn document(n: usize, turn: usize) -> Vec<u8> {
        let fields: Vec<String> = (0..n)
            .map(|i| {
                let v = if i % 97 == 0 { i * 31 + turn } else { i * 31 };
                format!("\"field{i}\":{{\"value\":{v},\"label\":\"sensor {i}\"}}")
            })
            .collect();
        format!("{{{}}}", fields.join(",")).into_bytes()
    }

    #[test]
    fn known_delta_from_fossils_documentation() {
        // A target made of a copy and an insert; digits and checksum in Fossil's spelling.
        let source = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let target = b"abcdefghijklmnopqrstuvwxyz!";
        let mut delta = Vec::new();
        encode(source, target, &mut Encoder::default(), &mut delta);
        let sum = checksum(target);
        let mut expected = b"R\nQ@0,1:!".to_vec();
        put_int(&mut expected, sum);
        expected.push(b';');
        assert_eq!(delta, expected);
    }

    #[test]
    fn round_trips() {
        assert!(round_trip(b"", b"") > 0);
        round_trip(b"short", b"also short");
        round_trip(b"", b"from nothing at all, a longer target");
        round_trip(b"a longer source than sixteen bytes", b"");
        let old = document(200, 1);
        let new = document(200, 2);
        let size = round_trip(&old, &new);
        assert!(size * 10 < new.len(), "{size} bytes for {}", new.len());
        round_trip(&new, &old);
        let binary: Vec<u8> = (0..5000u32).map(|i| (i * 7919 % 251) as u8).collect();
        let mut changed = binary.clone();
        changed[1234] ^= 0xff;
        changed.truncate(4000);
        round_trip(&binary, &changed);
    }

    #[test]
    fn checksum_as_fossil_sums() {
        assert_eq!(checksum(b""), 0);
        assert_eq!(checksum(b"\x01\x02\x03\x04"), 0x0102_0304);
        assert_eq!(checksum(b"\x01\x02\x03\x04\x05"), 0x0102_0304 + 0x0500_0000);
        assert_eq!(checksum(&[0xff; 8]), 0xffff_fffe);
    }

    #[test]
    fn refuses_what_does_not_apply() {
        let old = document(50, 1);
        let new = document(50, 2);
        let mut delta = Vec::new();
        encode(&old, &new, &mut Encoder::default(), &mut delta);
        let mut out = Vec::new();
        // Another base: a copy past its end, or a wrong checksum.
        let short = &old[..old.len() / 2];
        assert_eq!(apply(short, &delta, usize::MAX, &mut out), Err(DeltaError::CopyOutOfSource));
        let mut other = old.clone();
        other[100] ^= 1;
        assert_eq!(apply(&other, &delta, usize::MAX, &mut out), Err(DeltaError::BadChecksum));
        assert_eq!(apply(&old, &delta, 10, &mut out), Err(DeltaError::TooLarge { len: new.len() }));
        // Every truncation is refused, never a panic.
        for cut in 0..delta.len() {
            assert!(apply(&old, &delta[..cut], usize::MAX, &mut out).is_err(), "cut {cut}");
        }
        for garbage in [&b"~~~~~~~~\n"[..], b"1\n1@~~~~~~,1;", b"2\n3:ab0;", b"0\n0?", b"\n"] {
            assert!(apply(&old, garbage, usize::MAX, &mut out).is_err());
        }
    }
}
