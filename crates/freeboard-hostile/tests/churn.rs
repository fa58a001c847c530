//! Connection churn against `freeboard serve`: every cycle is counted, every connection's
//! memory comes back.

use freeboard_hostile::{Serve, Watch, churn, raise_fd_limit};

/// The figure: 100,000 connect/close cycles (about 15 s here).
const CYCLES: usize = 100_000;

#[test]
fn connection_churn_is_counted_and_gives_its_memory_back() {
    raise_fd_limit();
    let cycles = CYCLES;
    let serve = Serve::start(&[]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let outcome = churn::run(serve.addr(), cycles, 4);
    let figures = watch.finish();
    println!("{cycles} cycles: {outcome:?}");
    assert_eq!(outcome.failed, 0, "{:?}", outcome.first_failure);
    assert_eq!(outcome.closed + outcome.bare, cycles);
    let after = serve.wait_metrics("the connections closed", |m| {
        m.get("connections") == 0.0 && m.sum("pool_chunks_in_use") == 0.0
    });
    // Every cycle, the innocent client and this scrape were accepted.
    assert!(after.delta(&before, "accepted_total") >= (cycles + 2) as f64);
    // The upgraded cycles and the innocent client closed normally.
    assert_eq!(
        after.delta(&before, "closes_total{reason=\"normal\"}"),
        (outcome.closed + 1) as f64
    );
    // Nothing per cycle stays behind: 100,000 cycles leaking even 100 bytes each would show.
    assert!(figures.rss_after <= figures.rss_before + (8 << 10), "{figures}");
    figures.report(&format!("churn_{cycles}"));
}
