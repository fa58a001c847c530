//! Ping floods and close floods against `freeboard serve`.

use freeboard_hostile::{Serve, Watch, floods};

#[test]
fn a_ping_flood_is_answered_in_order() {
    let serve = Serve::start(&[]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let outcome = floods::ping_flood(serve.addr(), 100_000);
    let figures = watch.finish();
    println!("{outcome:?}");
    // Every pong answers a ping, in order, and the last ping is answered (RFC 6455 §5.5.3
    // allows skipping pongs for pings superseded by a later one, nothing else).
    assert!(outcome.pongs > 0 && outcome.pongs <= outcome.pings);
    assert_eq!(outcome.last, Some(outcome.pings - 1));
    assert!(outcome.echo_after, "the message after the flood was not echoed after the pongs");
    let after = serve.metrics();
    assert!(after.delta(&before, "received_bytes_total") >= f64::from(outcome.pings) * 10.0);
    assert!(after.delta(&before, "written_bytes_total") >= f64::from(outcome.pongs) * 6.0);
    figures.report("ping_flood");
}

#[test]
fn a_ping_flood_that_reads_nothing_is_held_back() {
    let serve = Serve::start(&[]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let outcome = floods::ping_flood_unread(serve.addr(), 2_000_000);
    let figures = watch.finish();
    println!("{outcome:?}");
    // The server stopped reading once its pongs passed the send queue's high watermark.
    assert!(outcome.written_before_backpressure > 0, "the flood was never held back");
    assert_eq!(outcome.last, Some(outcome.pings - 1));
    assert!(outcome.echo_after);
    let after = serve.wait_metrics("the pool back to idle", |m| m.sum("pool_chunks_in_use") == 0.0);
    let high_water = after.sum("pool_chunks_high_water") - before.sum("pool_chunks_high_water");
    println!("pool high water {high_water} chunks");
    // 64 KiB high watermark + one read buffer's worth of pongs, in 4 KiB chunks, per loop.
    assert!(high_water <= 2.0 * (16.0 + 16.0 + 8.0), "pool high water {high_water}");
    figures.report("ping_flood_unread");
}

#[test]
fn a_close_flood_gets_one_close_per_connection() {
    let serve = Serve::start(&[]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let outcome = floods::close_flood(serve.addr(), 3000, 100);
    let figures = watch.finish();
    assert_eq!(outcome.clean, outcome.connections, "{outcome:?}");
    let after = serve.wait_metrics("the connections closed", |m| m.get("connections") == 0.0);
    // Each flooder once, and the innocent client at the end.
    assert_eq!(after.delta(&before, "closes_total{reason=\"normal\"}"), 3001.0);
    figures.report("close_flood");
}
