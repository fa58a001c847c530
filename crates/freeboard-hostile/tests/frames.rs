//! Frames a correct client never sends, against `freeboard serve`: each gets its close code
//! and its `closes_total` reason, while an innocent client's echoes keep coming back intact.

use freeboard_hostile::frames::{self, INVALID_UTF8, Split, VALID_UTF8};
use freeboard_hostile::{Serve, Watch};

#[test]
fn a_2_63_length_field_gets_1002_and_2_63_minus_1_gets_1009() {
    let serve = Serve::start(&[]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    for _ in 0..100 {
        // RFC 6455 §5.2: "the most significant bit MUST be 0".
        assert_eq!(frames::length_field(serve.addr(), 1 << 63), Some(1002));
        assert_eq!(frames::length_field(serve.addr(), u64::MAX), Some(1002));
        // A valid encoding of a length no server holds: over max_message_size.
        assert_eq!(frames::length_field(serve.addr(), (1 << 63) - 1), Some(1009));
    }
    let figures = watch.finish();
    let after = serve.metrics();
    assert_eq!(after.delta(&before, "closes_total{reason=\"protocol_error\"}"), 200.0);
    assert_eq!(after.delta(&before, "closes_total{reason=\"message_too_big\"}"), 100.0);
    figures.report("length_2_63");
}

#[test]
fn unmasked_client_frames_get_1002() {
    let serve = Serve::start(&[]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    for _ in 0..300 {
        // RFC 6455 §5.1: "a server MUST close the connection upon receiving a frame that is
        // not masked".
        assert_eq!(frames::unmasked(serve.addr()), Some(1002));
    }
    let figures = watch.finish();
    let after = serve.metrics();
    assert_eq!(after.delta(&before, "closes_total{reason=\"protocol_error\"}"), 300.0);
    figures.report("unmasked");
}

#[test]
fn a_fragment_bomb_within_the_limit_is_echoed_intact() {
    let serve = Serve::start(&["--max-message-size", "1M"]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let bomb = frames::fragment_bomb(serve.addr(), 1_000_000);
    let figures = watch.finish();
    let reply = bomb.reply.expect("an echo");
    assert_eq!(reply.opcode, 0x2);
    assert!(reply.payload == bomb.message, "the echo differs from the 1,000,000 fragments");
    let after = serve.wait_metrics("the pool back to idle", |m| m.sum("pool_chunks_in_use") == 0.0);
    assert_eq!(after.delta(&before, "received_messages_total"), 1.0 + figures.echo.count as f64);
    assert!(after.sum("pool_chunks_high_water") >= 1_000_000.0 / 4096.0);
    figures.report("fragment_bomb_1M");
}

#[test]
fn a_fragment_bomb_over_the_limit_gets_1009_and_its_chunks_back() {
    let serve = Serve::start(&["--max-message-size", "1M"]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let bomb = frames::fragment_bomb(serve.addr(), 2_000_000);
    let figures = watch.finish();
    let reply = bomb.reply.expect("a close frame");
    assert_eq!((reply.opcode, reply.close_code()), (0x8, 1009));
    let after = serve.wait_metrics("the pool back to idle", |m| m.sum("pool_chunks_in_use") == 0.0);
    assert_eq!(after.delta(&before, "closes_total{reason=\"message_too_big\"}"), 1.0);
    figures.report("fragment_bomb_2M");
}

#[test]
fn an_unfinished_message_leaves_half_the_connection_reserve_free() {
    // One loop, and messages allowed to be larger than its pool.
    let serve = Serve::start(&["--threads", "1", "--memory", "4M", "--max-message-size", "16M"]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    // All the pool but 8 KiB, under the 32 KiB (half the default 64 KiB reserve) that
    // unfinished messages must leave to the open connections.
    let free = (before.sum("pool_chunks_capacity") - before.sum("pool_chunks_in_use")) * 4096.0;
    let len = free as usize - (8 << 10);
    let code = frames::unfinished(serve.addr(), len).expect("a close before the read timeout");
    let figures = watch.finish();
    assert_eq!(code, Some(1013));
    let after = serve.wait_metrics("the pool back to idle", |m| m.sum("pool_chunks_in_use") == 0.0);
    assert_eq!(after.delta(&before, "closes_total{reason=\"try_again_later\"}"), 1.0);
    assert_eq!(after.sum("pool_allocation_failures_total"), 0.0);
    figures.report("unfinished_message");
}

#[test]
fn invalid_utf8_at_every_split_point_gets_1007() {
    let serve = Serve::start(&[]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let mut cases = 0;
    for payload in INVALID_UTF8 {
        for split in [Split::Fragments, Split::Reads] {
            for at in 0..=payload.len() {
                let reply = frames::split_text(serve.addr(), payload, at, split).expect("reply");
                assert_eq!(
                    (reply.opcode, reply.close_code()),
                    (0x8, 1007),
                    "{payload:?} cut at {at} ({split:?})"
                );
                cases += 1;
            }
        }
    }
    // The control: valid text cut at every point is echoed whole.
    for split in [Split::Fragments, Split::Reads] {
        for at in 0..=VALID_UTF8.len() {
            let reply = frames::split_text(serve.addr(), VALID_UTF8, at, split).expect("echo");
            assert_eq!((reply.opcode, reply.payload.as_slice()), (0x1, VALID_UTF8), "cut at {at}");
        }
    }
    let figures = watch.finish();
    let after = serve.metrics();
    assert_eq!(after.delta(&before, "closes_total{reason=\"invalid_payload\"}"), cases as f64);
    println!("{cases} invalid cuts");
    figures.report("invalid_utf8_splits");
}
