//! Properties over arbitrary input: the parsers never panic and keep their bounds, and the
//! connection gives the same events however its input is split.

mod support;

use freeboard_h2::frame::{Frame, MAX_MAX_FRAME_SIZE};
use freeboard_h2::hpack::{Decoder, HeaderList, encode_field, huffman};
use freeboard_h2::{Config, Connection, StreamId};
use proptest::prelude::*;
use support::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary bytes: a frame, "need more", or a defined error — and a frame re-encoded
    /// reads back as itself.
    #[test]
    fn the_frame_parser_never_panics_and_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(Some((frame, used))) = Frame::decode(&bytes, MAX_MAX_FRAME_SIZE) {
            prop_assert!(used <= bytes.len());
            let mut out = vec![0u8; used + 16];
            let n = frame.encode(&mut out).unwrap();
            let (again, used_again) = Frame::decode(&out[..n], MAX_MAX_FRAME_SIZE).unwrap().unwrap();
            prop_assert_eq!(again, frame);
            prop_assert_eq!(used_again, n);
        }
    }

    /// Arbitrary header blocks never panic, and the decoded list never passes its bound.
    #[test]
    fn the_hpack_decoder_never_panics_and_keeps_its_bound(
        blocks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..4),
        limit in 0usize..600,
    ) {
        let mut decoder = Decoder::new(256);
        for block in blocks {
            let mut list = HeaderList::new(limit);
            if decoder.decode(&block, &mut list).is_err() {
                break;
            }
            prop_assert!(list.size() <= limit);
            let size: usize = list.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
            prop_assert_eq!(size, list.size());
        }
    }

    /// What our encoder writes, our decoder reads back; Huffman strings too.
    #[test]
    fn hpack_round_trips(
        fields in proptest::collection::vec(("[a-z-]{1,20}", proptest::collection::vec(any::<u8>(), 0..50)), 0..10),
        text in proptest::collection::vec(any::<u8>(), 0..100),
    ) {
        let mut block = Vec::new();
        for (name, value) in &fields {
            encode_field(name.as_bytes(), value, &mut block);
        }
        let mut list = HeaderList::new(1 << 20);
        Decoder::new(4096).decode(&block, &mut list).unwrap();
        let decoded: Vec<(Vec<u8>, Vec<u8>)> = list.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
        let expected: Vec<(Vec<u8>, Vec<u8>)> = fields.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.clone())).collect();
        prop_assert_eq!(decoded, expected);
        let mut encoded = Vec::new();
        huffman::encode(&text, &mut encoded);
        prop_assert_eq!(encoded.len(), huffman::encoded_len(&text));
        let mut block = vec![0x00, 0x01, b'x'];
        // The string's length: an HPACK integer with a 7-bit prefix, the H bit set.
        if encoded.len() < 127 {
            block.push(0x80 | encoded.len() as u8);
        } else {
            let rest = encoded.len() - 127;
            block.extend([0xff, 0x80 | (rest & 0x7f) as u8, (rest >> 7) as u8]);
        }
        block.extend(&encoded);
        let mut list = HeaderList::new(1 << 20);
        Decoder::new(4096).decode(&block, &mut list).unwrap();
        prop_assert_eq!(list.get(0).unwrap().1, &text[..]);
    }

    /// Arbitrary frames after a valid preface: never a panic, and what the connection owes
    /// the peer stays bounded.
    #[test]
    fn the_connection_never_panics_on_arbitrary_frames(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let (mut conn, _) = open(Config::default());
        let mut input = websocket_request(1, "/");
        input.extend(&bytes);
        let _ = feed(&mut conn, &input);
        prop_assert!(conn.transmit_buffer().len() < 8 << 10);
        // Whatever happened, the API still answers.
        let _ = conn.send_capacity(StreamId(1));
        let _ = conn.consume(StreamId(1), 1);
    }

    /// Split invariance (the defining property of a sans-IO parser): a conversation fed in
    /// arbitrary pieces gives the same events as fed whole.
    #[test]
    fn events_do_not_depend_on_how_input_is_split(
        payloads in proptest::collection::vec((0u32..3, proptest::collection::vec(any::<u8>(), 0..3000), any::<bool>()), 1..12),
        cuts in proptest::collection::vec(1usize..5000, 0..30),
    ) {
        let mut conversation = preface();
        for stream in [1, 3, 5] {
            conversation.extend(websocket_request(stream, "/"));
        }
        for (i, (stream, payload, padded)) in payloads.iter().enumerate() {
            let stream = 1 + 2 * stream;
            if *padded {
                let pad = (i % 7) as u8;
                let length = payload.len() + 1 + usize::from(pad);
                let mut frame = vec![(length >> 16) as u8, (length >> 8) as u8, length as u8, 0, 0x8, 0, 0, 0, stream as u8, pad];
                frame.extend(payload);
                frame.extend(std::iter::repeat_n(0, usize::from(pad)));
                conversation.extend(frame);
            } else {
                conversation.extend(data(stream, payload, false));
            }
            if i % 3 == 0 {
                conversation.extend(ping([i as u8; 8]));
            }
        }
        let mut whole = Connection::new(Config::default());
        let expected = merge(feed_all(&mut whole, &conversation));

        let mut split = Connection::new(Config::default());
        let mut events = Vec::new();
        let mut held = Vec::new();
        let mut at = 0;
        let mut cuts = cuts.into_iter();
        while at < conversation.len() {
            let n = cuts.next().unwrap_or(usize::MAX).min(conversation.len() - at);
            held.extend_from_slice(&conversation[at..at + n]);
            at += n;
            let (got, left) = feed(&mut split, &held).unwrap();
            events.extend(got);
            held.drain(..held.len() - left);
        }
        prop_assert!(held.is_empty());
        prop_assert_eq!(merge(events), expected);
    }
}

/// Joins consecutive DATA pieces of one stream: how DATA is cut depends on the reads.
fn merge(events: Vec<Ev>) -> Vec<Ev> {
    let mut merged: Vec<Ev> = Vec::new();
    for event in events {
        match (merged.last_mut(), event) {
            (
                Some(Ev::Data { stream: s, data: d, end_stream: false }),
                Ev::Data { stream, data, end_stream },
            ) if *s == stream => {
                d.extend(data);
                if end_stream {
                    merged.push(Ev::Data { stream, data: vec![], end_stream });
                }
            }
            (_, Ev::Data { data, .. }) if data.is_empty() => {}
            (_, event) => merged.push(event),
        }
    }
    merged
}
