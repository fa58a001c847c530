//! The mixed soak, short: echo, pub/sub and connection churn at once against one server for
//! 100 s, its memory sampled every 10 s. `FREEBOARD_SOAK_SECS` and `FREEBOARD_SOAK_SAMPLE_SECS`
//! lengthen it (`FREEBOARD_SOAK_SECS=1800 FREEBOARD_SOAK_SAMPLE_SECS=60` is the 30-minute run),
//! `FREEBOARD_SOAK_CSV=FILE` keeps the samples.

use std::time::Duration;

use freeboard_hostile::soak::{self, Mix};
use freeboard_hostile::{Serve, raise_fd_limit};

fn secs(var: &str, default: u64) -> Duration {
    Duration::from_secs(std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default))
}

#[test]
fn a_mixed_workload_keeps_memory_flat_and_loses_nothing_silently() {
    raise_fd_limit();
    let serve = Serve::start(&["--memory", "32M", "--client-publish"]);
    let mix = Mix {
        duration: secs("FREEBOARD_SOAK_SECS", 100),
        sample: secs("FREEBOARD_SOAK_SAMPLE_SECS", 10),
        ..Mix::default()
    };
    let before = serve.metrics();
    let outcome = soak::run(serve.addr(), serve.pid(), &mix);
    let after = serve.metrics();
    println!("SOAK {outcome}\n{}", outcome.csv());
    if let Ok(path) = std::env::var("FREEBOARD_SOAK_CSV") {
        std::fs::write(&path, outcome.csv()).expect("write the samples");
    }
    assert!(outcome.failure.is_none(), "{outcome}");

    let (last, during) = outcome.samples.split_last().expect("samples");
    assert!(during.len() >= 2, "{outcome}");
    for s in during {
        // Every part of the workload made progress in every interval.
        assert!(s.echoes > 0 && s.deliveries > 0 && s.cycles > 0, "stalled at {s:?}");
        assert_eq!(s.allocation_failures, 0, "{s:?}");
    }
    // A subscriber may miss a message only if the server counted the drop.
    let dropped = soak::drops(&after) - soak::drops(&before);
    assert!(outcome.gaps <= dropped, "{} messages missed, {dropped} drops counted", outcome.gaps);
    // Everyone has left: no connection and no chunk remains.
    assert_eq!((last.connections, last.chunks_in_use), (0, 0), "{last:?}");
    // Flat memory: the second half of the run needs no more than the first half did, give
    // or take 5 %.
    let half = during.len() / 2;
    let peak = |s: &[soak::Sample]| s.iter().map(|s| s.rss_kib).max().unwrap_or(0);
    let (first, second) = (peak(&during[..half]), peak(&during[half..]));
    assert!(second <= first + first / 20, "RSS grew: peak {first} KiB, then {second} KiB");
}
