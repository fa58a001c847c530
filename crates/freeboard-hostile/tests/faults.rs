//! Transport faults against `freeboard serve`: no connection's data is corrupted or
//! reordered, and every connection's memory comes back.

use freeboard_hostile::faults::{self, numbered};
use freeboard_hostile::{Serve, Watch};

#[test]
fn a_reset_mid_frame_is_an_abnormal_close_and_frees_the_partial_frame() {
    let serve = Serve::start(&[]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    for _ in 0..100 {
        faults::reset_mid_frame(serve.addr());
    }
    let figures = watch.finish();
    let after = serve.wait_metrics("the resets seen", |m| {
        m.delta(&before, "closes_total{reason=\"abnormal\"}") == 100.0
            && m.sum("pool_chunks_in_use") == 0.0
    });
    assert_eq!(after.get("connections"), 0.0);
    figures.report("reset_mid_frame");
}

/// Regression: a FIN that came with the last data was never read (a short read ended the
/// turn and edge-triggered epoll reported nothing more), so the server held the connection
/// until its keep-alive ping went unanswered.
#[test]
fn after_a_half_close_the_server_delivers_what_it_owes_then_closes() {
    let serve = Serve::start(&[]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let mut rounds = 0.0;
    for size in [10, 1000, 64 << 10, 300 << 10] {
        for _ in 0..5 {
            let messages = numbered(20, size);
            let (echoes, eof) = faults::half_close(serve.addr(), &messages);
            assert!(
                eof,
                "the server did not close after the half-close ({size} B, {} echoes)",
                echoes.len()
            );
            assert_eq!(echoes.len(), messages.len(), "{size}-byte echoes missing");
            for (echo, sent) in echoes.iter().zip(&messages) {
                assert!(echo.opcode == 0x2 && echo.payload == *sent, "a {size}-byte echo differs");
            }
            rounds += 1.0;
        }
    }
    let figures = watch.finish();
    let after = serve.wait_metrics("the pool back to idle", |m| m.sum("pool_chunks_in_use") == 0.0);
    // The stream ended without a close frame: 1006, never sent.
    assert_eq!(after.delta(&before, "closes_total{reason=\"abnormal\"}"), rounds);
    figures.report("half_close");
}

#[test]
fn a_peer_that_stops_reading_is_held_at_the_watermark_and_loses_nothing() {
    let serve = Serve::start(&[]);
    let watch = Watch::start(&serve);
    let size = 16 << 10;
    let mut buffered = 0.0;
    let outcome = faults::stop_reading(serve.addr(), size, 20_000, |_| {
        buffered = serve.metrics().sum("send_queue_bytes");
    });
    let figures = watch.finish();
    println!(
        "{} messages written before the server held back; {buffered} bytes buffered",
        outcome.written
    );
    assert!(outcome.written < 20_000, "the server never held the writer back");
    // The send queue's high watermark (128 KiB, `serve`'s default), plus what one read (the
    // 128 KiB read buffer) and one message add before reading pauses.
    assert!(buffered <= f64::from((128 + 128 + 16) << 10), "{buffered} bytes buffered");
    // Regression: the `bytes_buffered` gauge was registered but never set.
    assert!(buffered > 0.0, "no bytes buffered while the server held the writer back");
    let expected = numbered(outcome.written, size);
    assert_eq!(outcome.echoes.len(), expected.len());
    for (i, (echo, sent)) in outcome.echoes.iter().zip(&expected).enumerate() {
        assert!(
            echo.opcode == 0x2 && echo.payload == *sent,
            "echo {i} differs: opcode {}, {} bytes, starts {:?}",
            echo.opcode,
            echo.payload.len(),
            &echo.payload[..echo.payload.len().min(16)]
        );
    }
    serve.wait_metrics("the pool back to idle", |m| m.sum("pool_chunks_in_use") == 0.0);
    figures.report("stop_reading");
}

#[test]
fn a_one_byte_reader_with_a_tiny_receive_buffer_gets_every_byte_in_order() {
    let serve = Serve::start(&[]);
    let watch = Watch::start(&serve);
    let messages = numbered(4, 256 << 10);
    let echoes = faults::tiny_reader(serve.addr(), messages.clone());
    let figures = watch.finish();
    for (i, (echo, sent)) in echoes.iter().zip(&messages).enumerate() {
        assert!(echo.opcode == 0x2 && echo.payload == *sent, "echo {i} differs");
    }
    serve.wait_metrics("the pool back to idle", |m| m.sum("pool_chunks_in_use") == 0.0);
    figures.report("tiny_reader");
}

#[test]
fn a_message_written_one_byte_at_a_time_is_echoed_intact() {
    let serve = Serve::start(&[]);
    let watch = Watch::start(&serve);
    let binary = numbered(1, 64 << 10).remove(0);
    let echo = faults::dribble(serve.addr(), 0x82, &binary).expect("echo");
    assert!(echo.opcode == 0x2 && echo.payload == binary, "the binary echo differs");
    // Text: every UTF-8 character is cut across reads somewhere.
    let text = "héllo wörld € 𝄞 ".repeat(1000).into_bytes();
    let echo = faults::dribble(serve.addr(), 0x81, &text).expect("echo");
    assert!(echo.opcode == 0x1 && echo.payload == text, "the text echo differs");
    let figures = watch.finish();
    figures.report("one_byte_writes");
}
