//! Ping floods and close floods against `freeboard serve`.

use std::time::Duration;

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

/// 16 threads publish 900 KiB bodies without pause beside the innocent echo client: bodies
/// are read a share per loop turn (64 KiB) like any connection's bytes, so the echo waits
/// behind a share of each, not behind whole bodies and their fan-out.
#[test]
fn a_flood_of_large_publishes_does_not_hold_up_an_echo() {
    let serve = Serve::start(&["--memory", "16M"]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let outcome =
        floods::post_flood(serve.addr(), "/topic/flood", 16, 900 << 10, Duration::from_secs(5));
    let figures = watch.finish();
    println!("{outcome:?}");
    assert!(outcome.posts > 0);
    // Each is published, or refused for want of budget (503): nothing else.
    assert!(outcome.statuses.keys().all(|s| matches!(s, 200 | 503)), "{outcome:?}");
    let after = serve.metrics();
    assert_eq!(
        after.delta(&before, "refusals_total{status=\"503\"}"),
        outcome.statuses.get(&503).copied().unwrap_or(0) as f64
    );
    // A stalled loop shows as a round trip of seconds; the target (p99 within a few ms of a
    // quiet run, on a release build) is in docs/RELIABILITY.md.
    assert!(figures.echo.max < Duration::from_millis(500), "{figures}");
    figures.assert_rss_within(16);
    figures.report("post_flood");
}
