//! Property tests: split invariance, round trips, the fast paths against their references.

use freeboard_proto::mask::{apply_mask, apply_mask_reference};
use freeboard_proto::utf8::Utf8Validator;
use freeboard_proto::{Config, FrameHeader, MessageKind, OpCode, Role};
use freeboard_test::{Chunker, Endpoint, LengthField, Pair, RawHeader, Side, TEST_MASK};
use proptest::prelude::*;

/// One step of a sender's script.
#[derive(Debug, Clone)]
enum Op {
    Message(bool, Vec<u8>),
    Fragmented(Vec<Vec<u8>>),
    Ping(Vec<u8>),
}

fn op() -> impl Strategy<Value = Op> {
    let text = any::<String>().prop_map(String::into_bytes);
    let bytes = prop::collection::vec(any::<u8>(), 0..300);
    prop_oneof![
        (any::<bool>(), prop_oneof![text, bytes.clone()]).prop_map(|(b, p)| Op::Message(b, p)),
        prop::collection::vec(bytes.clone(), 1..5).prop_map(Op::Fragmented),
        prop::collection::vec(0u8..128, 0..40).prop_map(Op::Ping),
    ]
}

/// A frame's first byte: mostly whole text and binary frames, then fragments and anything.
fn first_byte() -> impl Strategy<Value = u8> {
    prop_oneof![4 => Just(0x81u8), 4 => Just(0x82), 1 => Just(0x01), 1 => Just(0x80), 2 => any::<u8>()]
}

/// A payload: valid UTF-8 or any bytes, across the 7- and 16-bit length classes.
fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<String>().prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..300),
    ]
}

fn run(ops: &[Op], from: Side, chunker: Chunker) -> Pair {
    run_parking(ops, from, chunker, false)
}

/// [`run`], parking both ends whenever they are idle between reads if `park`.
fn run_parking(ops: &[Op], from: Side, chunker: Chunker, park: bool) -> Pair {
    let mut pair = Pair::new(Config::default());
    pair.chunker = chunker;
    pair.client.park_when_idle = park;
    pair.server.park_when_idle = park;
    for op in ops {
        match op {
            Op::Message(binary, payload) => {
                let kind = if *binary || std::str::from_utf8(payload).is_err() {
                    MessageKind::Binary
                } else {
                    MessageKind::Text
                };
                pair.send_message(from, kind, payload);
            }
            Op::Fragmented(parts) => {
                for (i, part) in parts.iter().enumerate() {
                    let opcode = if i == 0 { OpCode::Binary } else { OpCode::Continuation };
                    pair.send(from, opcode, i + 1 == parts.len(), part).unwrap();
                }
            }
            Op::Ping(payload) => pair.ping(from, payload).unwrap(),
        }
    }
    pair.drive();
    pair
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 }))]

    /// One byte at a time, random cuts, and all at once give the same records (both directions).
    #[test]
    fn split_invariance(ops in prop::collection::vec(op(), 0..12), cuts in prop::collection::vec(0usize..40, 1..8)) {
        for from in [Side::Client, Side::Server] {
            let whole = run(&ops, from, Chunker::Whole);
            let bytes = run(&ops, from, Chunker::Max(1));
            let random = run(&ops, from, Chunker::Pattern(cuts.clone()));
            let parking = run_parking(&ops, from, Chunker::Pattern(cuts.clone()), true);
            let to = from.peer();
            prop_assert_eq!(whole.records(to), bytes.records(to));
            prop_assert_eq!(whole.records(to), random.records(to));
            prop_assert_eq!(whole.records(to), parking.records(to));
            prop_assert_eq!(whole.records(from), parking.records(from), "pongs, in both directions");
            prop_assert_eq!(whole.records(to).len(), ops.len());
        }
    }

    /// Arbitrary bytes, valid or not, give the same records however they are cut.
    #[test]
    fn split_invariance_on_arbitrary_input(bytes in prop::collection::vec(any::<u8>(), 0..400), cut in 1usize..17, server in any::<bool>()) {
        let role = if server { Role::Server } else { Role::Client };
        let mut whole = Endpoint::new(role, Config::default());
        whole.feed(Default::default(), &bytes, &Chunker::Whole);
        let mut cut_up = Endpoint::new(role, Config::default());
        cut_up.feed(Default::default(), &bytes, &Chunker::Max(cut));
        prop_assert_eq!(whole.records, cut_up.records);
    }

    /// Whole frames read at once (the core's fast path) and a byte at a time (its general
    /// path) give the same records at the size limits, with invalid text and with
    /// non-minimal lengths: masked frames of every first byte, length and length field.
    #[test]
    fn whole_frames_agree_with_the_general_path(
        frames in prop::collection::vec((first_byte(), payload(), 0usize..3), 1..6),
        limit in 60u64..400,
    ) {
        let mut bytes = Vec::new();
        for (first, payload, field) in &frames {
            let mut header = RawHeader::new(*first, payload.len() as u64, TEST_MASK);
            header.length_field = [LengthField::Minimal, LengthField::Bits16, LengthField::Bits64][*field];
            let mut out = [0; 14];
            let n = header.encode(&mut out).unwrap();
            bytes.extend_from_slice(&out[..n]);
            let at = bytes.len();
            bytes.extend_from_slice(payload);
            apply_mask(&mut bytes[at..], TEST_MASK.unwrap(), 0);
        }
        let config = Config::builder().max_message_size(limit).build();
        let mut whole = Endpoint::new(Role::Server, config);
        whole.feed(Default::default(), &bytes, &Chunker::Whole);
        let mut bytewise = Endpoint::new(Role::Server, config);
        bytewise.feed(Default::default(), &bytes, &Chunker::Max(1));
        prop_assert_eq!(whole.records, bytewise.records);
    }

    /// Parking the connection whenever it is idle between reads changes nothing observable:
    /// the same records and the same bytes on the wire.
    #[test]
    fn parking_between_reads_is_invisible(bytes in prop::collection::vec(any::<u8>(), 0..400), cut in 1usize..17, server in any::<bool>()) {
        let role = if server { Role::Server } else { Role::Client };
        let mut awake = Endpoint::new(role, Config::default());
        awake.feed(Default::default(), &bytes, &Chunker::Max(cut));
        let mut parking = Endpoint::new(role, Config::default());
        parking.park_when_idle = true;
        parking.feed(Default::default(), &bytes, &Chunker::Max(cut));
        prop_assert_eq!(awake.transmit(), parking.transmit());
        prop_assert_eq!(awake.records, parking.records);
    }

    #[test]
    fn header_round_trip(fin: bool, rsv in 0u8..8, op in 0usize..6, mask: Option<[u8; 4]>, len in prop_oneof![0u64..200, 0u64..70_000, 0u64..(1 << 63)]) {
        let opcode = [OpCode::Continuation, OpCode::Text, OpCode::Binary, OpCode::Close, OpCode::Ping, OpCode::Pong][op];
        let (fin, len) = if opcode.is_control() { (true, len % 126) } else { (fin, len) };
        let header = FrameHeader { fin, rsv, opcode, mask, payload_len: len };
        let mut out = [0u8; 14];
        let n = header.encode(&mut out).unwrap();
        prop_assert_eq!(FrameHeader::parse(&out[..n]).unwrap(), Some((header, n)));
        prop_assert_eq!(FrameHeader::parse(&out[..n - 1]).unwrap(), None);
    }

    #[test]
    fn mask_matches_reference(data in prop::collection::vec(any::<u8>(), 0..200), key: [u8; 4], offset in 0usize..8, start in 0usize..8) {
        let start = start.min(data.len());
        let mut fast = data.clone();
        let mut slow = data;
        apply_mask(&mut fast[start..], key, offset);
        apply_mask_reference(&mut slow[start..], key, offset);
        prop_assert_eq!(fast, slow);
    }

    /// The streaming validator agrees with `core::str::from_utf8` at every split point.
    #[test]
    fn utf8_matches_core(s: String, corrupt in prop::option::of((any::<prop::sample::Index>(), any::<u8>()))) {
        let mut bytes = s.into_bytes();
        if let (Some((at, byte)), false) = (corrupt, bytes.is_empty()) {
            let at = at.index(bytes.len());
            bytes[at] = byte;
        }
        let expected = std::str::from_utf8(&bytes).is_ok();
        for split in 0..=bytes.len() {
            let mut v = Utf8Validator::new();
            let ok = v.feed(&bytes[..split], false).and_then(|_| v.feed(&bytes[split..], true)).is_ok();
            prop_assert_eq!(ok, expected, "split {}", split);
        }
    }
}
