//! Many idle connections: how many connect, how fast, and what they cost the server in memory
//! (and whether it gives the memory back when they close).

use std::io;
use std::time::{Duration, Instant};

use crate::Target;
use crate::load::{Opened, Rng, open_any};
use crate::process::Sample;

/// One step of the experiment: `count` connections opened, held, then closed.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// Connections attempted.
    pub count: usize,
    /// Handshakes completed.
    pub connected: usize,
    /// Connections refused or failed.
    pub failed: usize,
    /// Time to open all of them (one after the other), milliseconds.
    pub connect_ms: f64,
    /// Per connection, microseconds.
    pub connect_us_each: f64,
    /// Server RSS before connecting, KiB.
    pub rss_before_kib: Option<u64>,
    /// Server RSS with every connection open, KiB.
    pub rss_open_kib: Option<u64>,
    /// Server RSS after they closed, KiB.
    pub rss_closed_kib: Option<u64>,
    /// (open − before) / connected, KiB.
    pub kib_per_conn: Option<f64>,
}

/// How long the server gets to settle before its RSS is read.
const SETTLE: Duration = Duration::from_millis(300);

/// Opens `count` connections to `target`, holds them, closes them; samples the server's RSS
/// around it when `server_pid` is given.
pub fn step(target: &Target, count: usize, server_pid: Option<u32>) -> io::Result<Step> {
    let rss = || server_pid.and_then(|pid| Sample::of(pid).ok()).map(|s| s.rss_kib);
    let mut rng = Rng::seeded();
    let rss_before_kib = rss();
    let start = Instant::now();
    let mut open_streams: Vec<Opened> = Vec::with_capacity(count);
    let mut failed = 0;
    for _ in 0..count {
        match open_any(target, Duration::from_secs(5), &mut rng) {
            Ok((stream, _)) => open_streams.push(stream),
            Err(_) => failed += 1,
        }
    }
    let connect = start.elapsed();
    std::thread::sleep(SETTLE);
    let rss_open_kib = rss();
    let connected = open_streams.len();
    drop(open_streams);
    std::thread::sleep(SETTLE * 2);
    let rss_closed_kib = rss();
    let kib_per_conn = match (rss_before_kib, rss_open_kib) {
        (Some(b), Some(o)) if connected > 0 => Some((o as f64 - b as f64) / connected as f64),
        _ => None,
    };
    Ok(Step {
        count,
        connected,
        failed,
        connect_ms: connect.as_secs_f64() * 1e3,
        connect_us_each: connect.as_secs_f64() * 1e6 / count.max(1) as f64,
        rss_before_kib,
        rss_open_kib,
        rss_closed_kib,
        kib_per_conn,
    })
}
