//! A client that sends and never reads: the server's echoes pile up behind it. What did the
//! server do (close it, stop reading from it, or buffer without end), what did its memory do,
//! and did an innocent client's echo latency suffer meanwhile?

use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::Target;
use crate::load::{self, Load, Measured, Rng, open};
use crate::process::Sample;

/// What the experiment saw.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    /// Payload bytes per message the slow client sent.
    pub size: usize,
    /// Bytes the slow client managed to write.
    pub bytes_written: u64,
    /// How its connection ended: `closed by the server` (a write failed), `blocked` (the
    /// server stopped reading: writes made no progress for the last second) or `open`.
    pub verdict: String,
    /// Server RSS every 250 ms, KiB.
    pub rss_kib: Vec<u64>,
    /// The innocent client's echo run during the same time.
    pub innocent: Measured,
}

/// Runs the slow client and an innocent ping-pong client side by side for `duration`.
pub fn run(
    target: &Target,
    size: usize,
    duration: Duration,
    server_pid: Option<u32>,
) -> io::Result<Outcome> {
    let mut rng = Rng::seeded();
    let (mut slow, _) = open(target, Duration::from_secs(5), &mut rng)?;
    slow.set_write_timeout(Some(Duration::from_millis(100)))?;
    let mut frame = vec![0u8; size + 14];
    let payload = vec![b'x'; size];
    let n = freeboard_test::encode_frame(0x82, &payload, Some(rng.mask()), &mut frame)
        .map_err(io::Error::other)?;
    frame.truncate(n);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let closed =
                || format!("closed by the server after {:.1} s", started.elapsed().as_secs_f64());
            let mut written = 0u64;
            let mut last_progress = Instant::now();
            let mut block = frame.repeat(64.max(65536 / frame.len()));
            let verdict = loop {
                if stop.load(Ordering::Relaxed) {
                    break if last_progress.elapsed() > Duration::from_secs(1) {
                        "blocked (the server stopped reading)".to_string()
                    } else {
                        "open, still read by the server".to_string()
                    };
                }
                match slow.write(&block) {
                    Ok(0) => break closed(),
                    Ok(n) => {
                        written += n as u64;
                        last_progress = Instant::now();
                        // Keep frames aligned: rotate what was not written to the front.
                        let len = block.len();
                        block.rotate_left(n % len);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break closed(),
                }
            };
            (written, verdict)
        })
    };
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rss = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some(s) = server_pid.and_then(|pid| Sample::of(pid).ok()) {
                    rss.push(s.rss_kib);
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            rss
        })
    };
    let innocent = load::run(
        target,
        &Load { clients: 1, in_flight: 1, size: 64, messages: None, duration, server_pid: None },
        &mut |_| {},
    );
    stop.store(true, Ordering::Relaxed);
    let (bytes_written, verdict) =
        writer.join().map_err(|_| io::Error::other("writer panicked"))?;
    let rss_kib = sampler.join().map_err(|_| io::Error::other("sampler panicked"))?;
    Ok(Outcome { size, bytes_written, verdict, rss_kib, innocent: innocent? })
}
