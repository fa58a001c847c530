use freeboard_buf::{Budget, ChunkChain, Frame, Pool, PoolConfig};
use freeboard_proto::MessageKind;
use freeboard_proto::frame::FrameHeader;
use freeboard_proto::handshake::Extension;

use super::zlib::*;
use super::*;

fn ext(name: &'static str, params: &'static str) -> Extension<'static> {
    Extension { name, params }
}

fn pool(bytes: usize) -> Pool<'static> {
    Pool::new(Budget::new(bytes), PoolConfig::new().with_chunk_size(1024)).unwrap()
}

const DEDICATED: Compression = Compression::Dedicated;

#[test]
fn off_declines_every_offer() {
    assert_eq!(Agreement::accept(Compression::Off, 15, [ext(NAME, "")]), None);
}

#[test]
fn a_plain_offer_is_accepted_with_the_defaults() {
    let a = Agreement::accept(DEDICATED, 15, [ext(NAME, "")]).unwrap();
    assert_eq!(a.response(), "permessage-deflate");
    assert_eq!((a.server_max_window_bits, a.client_max_window_bits), (15, 15));
    assert!(!a.server_no_context_takeover && !a.client_no_context_takeover);
}

#[test]
fn shared_takes_no_context_in_either_direction() {
    let a =
        Agreement::accept(Compression::Shared, 15, [ext(NAME, "client_max_window_bits")]).unwrap();
    assert_eq!(
        a.response(),
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
    );
    assert_eq!(a.dedicated_cost(true), 0);
}

#[test]
fn the_browser_offer_and_window_parameters() {
    let a = Agreement::accept(Compression::Dedicated, 12, [ext(NAME, "client_max_window_bits")])
        .unwrap();
    assert_eq!(
        a.response(),
        "permessage-deflate; server_max_window_bits=12; client_max_window_bits=12"
    );
    let a = Agreement::accept(
        DEDICATED,
        15,
        [ext(
            NAME,
            "server_max_window_bits=10; client_max_window_bits=\"9\"; client_no_context_takeover",
        )],
    )
    .unwrap();
    assert_eq!(
        a.response(),
        "permessage-deflate; client_no_context_takeover; server_max_window_bits=10; client_max_window_bits=9"
    );
    assert!(a.dedicated_cost(true) > 0);
    // Without client_max_window_bits in the offer the server may not limit the client.
    let a = Agreement::accept(Compression::Dedicated, 10, [ext(NAME, "")]).unwrap();
    assert_eq!(a.client_max_window_bits, 15);
}

#[test]
fn malformed_or_duplicate_offers_are_skipped_and_the_next_is_tried() {
    for bad in [
        "server_max_window_bits",
        "server_max_window_bits=7",
        "server_max_window_bits=16",
        "server_max_window_bits=010",
        "server_max_window_bits=\"10",
        "client_max_window_bits=abc",
        "server_no_context_takeover=1",
        "server_no_context_takeover; server_no_context_takeover",
        "client_max_window_bits; client_max_window_bits=10",
        "server_max_window_bits=10; server_max_window_bits=10",
        "x_unknown",
        // zlib cannot compress with a 256-byte raw window.
        "server_max_window_bits=8",
    ] {
        assert_eq!(Agreement::accept(DEDICATED, 15, [ext(NAME, bad)]), None, "{bad}");
        let a = Agreement::accept(DEDICATED, 15, [ext(NAME, bad), ext(NAME, "")]);
        assert_eq!(a.map(|a| a.response()).as_deref(), Some(NAME), "{bad}");
    }
    assert_eq!(Agreement::accept(DEDICATED, 15, [ext("x-webkit-deflate-frame", "")]), None);
}

#[test]
fn a_client_window_of_8_is_accepted_and_inflated_with_9() {
    let a = Agreement::accept(DEDICATED, 15, [ext(NAME, "client_max_window_bits=8")]).unwrap();
    assert_eq!(a.client_max_window_bits, 8);
    let mut pool = pool(1 << 20);
    let mut d = Deflater::new(9, false);
    let mut i = a.inflater(true);
    let mut out = Vec::new();
    d.compress(b"hello hello hello", &mut out);
    let mut chain = ChunkChain::new();
    i.inflate(&mut pool, [&out[..]], 1 << 20, &mut chain).unwrap();
    assert_eq!(chain.len(), 17);
    chain.clear(&mut pool);
}

#[test]
fn client_responses() {
    let a = Agreement::from_response(
        ext(NAME, "server_no_context_takeover; client_max_window_bits=10"),
        false,
    )
    .unwrap();
    // The offer named client_no_context_takeover: the client keeps no context either way.
    assert!(a.server_no_context_takeover && a.client_no_context_takeover);
    assert_eq!((a.server_max_window_bits, a.client_max_window_bits), (15, 10));
    assert_eq!(
        Agreement::from_response(ext(NAME, "client_max_window_bits"), false),
        Err(NegotiationError::InvalidValue)
    );
    assert_eq!(
        Agreement::from_response(ext(NAME, "client_max_window_bits=8"), false),
        Err(NegotiationError::Unacceptable)
    );
    assert_eq!(
        Agreement::from_response(
            ext(NAME, "server_no_context_takeover; server_no_context_takeover"),
            false
        ),
        Err(NegotiationError::DuplicateParameter)
    );
    assert_eq!(
        Agreement::from_response(ext(NAME, "foo=1"), false),
        Err(NegotiationError::UnknownParameter)
    );
    // Asked for server_no_context_takeover, a server must repeat it (§7.1.1.1).
    assert_eq!(Agreement::from_response(ext(NAME, ""), true), Err(NegotiationError::Unacceptable));
    let a = Agreement::from_response(ext(NAME, "server_no_context_takeover"), true).unwrap();
    assert_eq!(a.dedicated_cost(false), 0);
    // A plain acceptance of the default offer: only the server's context needs our state.
    let a = Agreement::from_response(ext(NAME, ""), false).unwrap();
    assert_eq!(a.dedicated_cost(false), inflate_state_bytes(15));
    // Every answer our offers allow is accepted by the server side of this module.
    for server_no_context_takeover in [false, true] {
        let offer = Agreement::offer(server_no_context_takeover);
        let (name, params) = offer.split_once(';').unwrap();
        for mode in [Compression::Shared, DEDICATED] {
            let agreed = Agreement::accept(mode, 12, [Extension { name, params }]).unwrap();
            let response = agreed.response();
            let (name, params) = response.split_once(';').unwrap();
            let back =
                Agreement::from_response(Extension { name, params }, server_no_context_takeover);
            assert_eq!(back, Ok(agreed), "{mode:?} {response}");
        }
    }
}

fn roundtrip(a: &Agreement, messages: &[&[u8]]) {
    let mut pool = pool(4 << 20);
    let mut d = a.deflater(true);
    let mut i = a.inflater(false);
    let mut wire = Vec::new();
    for m in messages {
        d.compress(m, &mut wire);
        // Split the compressed message at every third byte to feed the inflater in pieces.
        let pieces: Vec<&[u8]> = wire.chunks(3).collect();
        let mut chain = ChunkChain::new();
        i.inflate(&mut pool, pieces, 1 << 20, &mut chain).unwrap();
        let mut got = vec![0; chain.len()];
        chain.copy_to(&pool, &mut got);
        assert_eq!(&got[..], *m);
        chain.clear(&mut pool);
    }
    assert_eq!(pool.chunks_in_use(), 0);
}

#[test]
fn messages_roundtrip_with_and_without_context_takeover() {
    let json = br#"{"id":1,"method":"subscribe","params":{"topic":"scores","since":12345}}"#;
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let messages: [&[u8]; 5] = [json, json, b"", &big, json];
    for a in [
        Agreement::accept(DEDICATED, 15, [ext(NAME, "")]).unwrap(),
        Agreement::accept(Compression::Shared, 15, [ext(NAME, "")]).unwrap(),
        Agreement::accept(DEDICATED, 15, [ext(NAME, "server_max_window_bits=9")]).unwrap(),
    ] {
        roundtrip(&a, &messages);
    }
}

#[test]
fn context_takeover_makes_a_repeated_message_smaller() {
    let json = br#"{"id":1,"method":"subscribe","params":{"topic":"scores","since":12345}}"#;
    let (mut keep, mut reset) = (Deflater::new(15, false), Deflater::new(15, true));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    keep.compress(json, &mut a);
    keep.compress(json, &mut a);
    reset.compress(json, &mut b);
    reset.compress(json, &mut b);
    assert!(a.len() < b.len() / 2, "{} vs {}", a.len(), b.len());
}

/// 16 MiB of zeros compressed (about 160 KiB on the wire at the fast level) against a 1 MiB limit: refused as
/// soon as the output passes the limit, holding no more than the limit in chunks.
#[test]
fn a_bomb_is_refused_while_inflating() {
    let zeros = vec![0u8; 16 << 20];
    let mut wire = Vec::new();
    Deflater::new(15, true).compress(&zeros, &mut wire);
    assert!(wire.len() < zeros.len() / 50, "{}", wire.len());
    let mut pool = pool(8 << 20);
    let mut i = Inflater::new(15, false);
    let mut chain = ChunkChain::new();
    let err = i.inflate(&mut pool, wire.chunks(1000), 1 << 20, &mut chain);
    assert_eq!(err, Err(InflateError::TooBig));
    assert_eq!(chain.len(), 0);
    assert_eq!(pool.chunks_in_use(), 0);
    // The pool's high water never passed the limit plus one step.
    let high = pool.counters().chunks_high_water;
    assert!(high * 1024 <= (1 << 20) + 4096 + 1024, "{high} chunks");
    // The inflater is usable again after a refusal.
    let mut ok = Vec::new();
    Deflater::new(15, true).compress(b"after", &mut ok);
    i.inflate(&mut pool, [&ok[..]], 1 << 20, &mut chain).unwrap();
    assert_eq!(chain.len(), 5);
    chain.clear(&mut pool);
}

#[test]
fn a_short_pool_and_garbage_have_their_outcomes() {
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let mut wire = Vec::new();
    Deflater::new(15, true).compress(&data, &mut wire);
    let mut small = pool(64 << 10);
    let mut chain = ChunkChain::new();
    let mut i = Inflater::new(15, false);
    assert_eq!(i.inflate(&mut small, [&wire[..]], 1 << 20, &mut chain), Err(InflateError::Pool));
    assert_eq!(small.chunks_in_use(), 0);
    for garbage in [&[0xffu8, 0xff, 0xff][..], &[0x07, 0x00], &[0x01, 0x05, 0x00, 0x00, 0x00]] {
        let r = Inflater::new(15, false).inflate(&mut small, [garbage], 1 << 20, &mut chain);
        assert_eq!(r, Err(InflateError::Corrupt), "{garbage:?}");
        assert_eq!(small.chunks_in_use(), 0);
    }
}

#[test]
fn inflated_text_is_validated() {
    let mut pool = pool(1 << 20);
    let mut chain = ChunkChain::new();
    chain.append(&mut pool, "héllo".as_bytes()).unwrap();
    assert!(valid_utf8(&pool, &chain));
    chain.append(&mut pool, &[0xc3]).unwrap();
    assert!(!valid_utf8(&pool, &chain));
    chain.clear(&mut pool);
    assert!(valid_utf8(&pool, &chain));
}

/// A compressing connection's own part, beside its `Entry`: the boxed `Deflate`, 32 bytes
/// (its zlib state, when a direction takes context over, is drawn from the budget).
#[test]
fn a_sessions_compression_record_stays_small() {
    let bytes = size_of::<Deflate>();
    println!("Deflate {bytes} B");
    assert!(bytes <= 32, "Deflate is {bytes} bytes");
}

#[test]
fn a_published_frame_compresses_whole_from_its_chunks() {
    // 64 chunks of 1 KiB, and budget left beside them for the shared compressor.
    let config = PoolConfig::new().with_chunk_size(1024).with_chunk_count(64);
    let mut pool = Pool::new(Budget::new(1 << 20), config).unwrap();
    let mut codec = Codec::new(16);
    let agreement = Agreement::accept(Compression::Shared, 15, [ext(NAME, "")]).unwrap();
    let mut inflater = agreement.inflater(false);
    // 3 KB spread over 1 KiB chunks (header in the first), text and binary, and one under
    // the threshold.
    let payload: Vec<u8> = (0..3000u32).map(|i| b"{\"k\":[1,2,3]}"[i as usize % 13]).collect();
    for (kind, data) in [(MessageKind::Text, &payload[..]), (MessageKind::Binary, &payload[..100])]
    {
        let (head, n) = crate::topics::header(kind, data.len());
        let frame = Frame::from_parts(&mut pool, &[&head[..n], data]).unwrap();
        let compressed = codec.compress_frame(&mut pool, &frame, 15).unwrap().unwrap();
        let mut wire = vec![0; compressed.len()];
        let mut at = 0;
        for seg in compressed.segments(&pool) {
            wire[at..at + seg.len()].copy_from_slice(seg);
            at += seg.len();
        }
        let (header, len) = FrameHeader::parse(&wire).unwrap().unwrap();
        assert_eq!((header.fin, header.rsv, header.opcode as u8), (true, 0b100, head[0] & 0x0f));
        assert!(wire.len() < data.len() / 2, "{} bytes", wire.len());
        let mut out = ChunkChain::new();
        inflater.inflate(&mut pool, [&wire[len..]], 1 << 20, &mut out).unwrap();
        let mut got = vec![0; out.len()];
        out.copy_to(&pool, &mut got);
        assert_eq!(got, data);
        out.clear(&mut pool);
        compressed.release(&mut pool);
        frame.release(&mut pool);
    }
    let (head, n) = crate::topics::header(MessageKind::Text, 15);
    let small = Frame::from_parts(&mut pool, &[&head[..n], &payload[..15]]).unwrap();
    assert_eq!(codec.compress_frame(&mut pool, &small, 15), Ok(None));
    small.release(&mut pool);
    assert_eq!(pool.chunks_in_use(), 0);
}
