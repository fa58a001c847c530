//! The innocent bystander: a client that keeps echoing while an attack runs, checks every
//! echo byte for byte and in order, and times the round trips; and [`Watch`], which adds the
//! server's RSS to it.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::serve::{Serve, rss_kib};
use crate::ws::WsClient;

/// Pause between two round trips, so the bystander measures the server rather than
/// competing with the attack for the CPU.
const PACE: Duration = Duration::from_millis(2);

/// A client echoing numbered binary messages of varying size on its own thread.
pub struct Innocent {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<EchoReport>,
}

/// What the innocent client saw.
#[derive(Debug, Clone, Default)]
pub struct EchoReport {
    /// Round trips completed, every one intact and in order.
    pub count: usize,
    /// Median round trip.
    pub p50: Duration,
    /// 99th percentile round trip.
    pub p99: Duration,
    /// Slowest round trip.
    pub max: Duration,
    /// The first thing that went wrong (an error, a wrong or missing echo), if any.
    pub failure: Option<String>,
}

impl EchoReport {
    /// Panics unless at least one echo came back and every echo came back intact, in order.
    pub fn assert_intact(&self) {
        assert!(self.failure.is_none(), "the innocent client failed: {:?}", self.failure);
        assert!(self.count > 0, "the innocent client completed no echo");
    }
}

impl Innocent {
    /// Connects to `addr`'s `/echo` and starts echoing.
    pub fn start(addr: SocketAddr) -> Self {
        let mut client = WsClient::open(addr);
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut rtts = Vec::new();
            let mut failure = None;
            let mut seq: u64 = 0;
            while !stopped.load(Ordering::Relaxed) {
                let payload = message(seq);
                let start = Instant::now();
                let echoed = client.send(0x82, &payload).and_then(|()| client.recv());
                match echoed {
                    Ok(Some(frame)) if frame.opcode == 0x2 && frame.payload == payload => {
                        rtts.push(start.elapsed());
                    }
                    Ok(Some(frame)) if frame.opcode == 0x8 && frame.payload.len() >= 2 => {
                        let code = u16::from_be_bytes([frame.payload[0], frame.payload[1]]);
                        let reason = String::from_utf8_lossy(&frame.payload[2..]);
                        failure =
                            Some(format!("echo {seq}: the server closed with {code} {reason:?}"));
                        break;
                    }
                    Ok(Some(frame)) => {
                        failure = Some(format!(
                            "echo {seq}: got opcode {} with {} bytes, expected {} bytes",
                            frame.opcode,
                            frame.payload.len(),
                            payload.len()
                        ));
                        break;
                    }
                    Ok(None) => {
                        failure = Some(format!("echo {seq}: the server closed the connection"));
                        break;
                    }
                    Err(e) => {
                        failure = Some(format!("echo {seq}: {e}"));
                        break;
                    }
                }
                seq += 1;
                std::thread::sleep(PACE);
            }
            if failure.is_none() {
                match client.close(1000) {
                    Ok(Some(1000)) => {}
                    other => failure = Some(format!("closing: {other:?}")),
                }
            }
            rtts.sort_unstable();
            let at = |q: f64| {
                rtts.get(((rtts.len() as f64 * q) as usize).min(rtts.len().saturating_sub(1)))
                    .copied()
                    .unwrap_or_default()
            };
            EchoReport {
                count: rtts.len(),
                p50: at(0.50),
                p99: at(0.99),
                max: rtts.last().copied().unwrap_or_default(),
                failure,
            }
        });
        Self { stop, thread }
    }

    /// Stops echoing, closes with 1000 and returns the report.
    pub fn finish(self) -> EchoReport {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_else(|_| EchoReport {
            failure: Some("the innocent client panicked".into()),
            ..EchoReport::default()
        })
    }
}

/// Message `seq`: its number, then a pattern derived from it; 16 B to about 4 KiB.
fn message(seq: u64) -> Vec<u8> {
    let len = 16 + (seq as usize * 97) % 4000;
    let mut payload = seq.to_le_bytes().to_vec();
    payload.extend((8..len).map(|i| (i as u64 ^ seq.wrapping_mul(31)) as u8));
    payload
}

/// An attack in progress, watched: the innocent client echoes and the server's RSS is
/// sampled every 20 ms.
pub struct Watch {
    innocent: Innocent,
    pid: u32,
    rss_before: u64,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    sampler: JoinHandle<()>,
    started: Instant,
}

/// The figures of one attack: the bystander's echoes and the server's memory.
#[derive(Debug, Clone)]
pub struct Figures {
    /// What the innocent client saw during the attack.
    pub echo: EchoReport,
    /// Server RSS before the attack, KiB.
    pub rss_before: u64,
    /// Highest server RSS sampled during the attack, KiB.
    pub rss_peak: u64,
    /// Server RSS once the attack was over and the server idle again, KiB.
    pub rss_after: u64,
    /// How long the attack ran.
    pub elapsed: Duration,
}

impl Watch {
    /// Starts the innocent client and the RSS sampler on `serve`.
    pub fn start(serve: &Serve) -> Self {
        let pid = serve.pid();
        let rss_before = rss_kib(pid);
        let peak = Arc::new(AtomicU64::new(rss_before));
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (peak, stop) = (peak.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        let innocent = Innocent::start(serve.addr());
        Self { innocent, pid, rss_before, peak, stop, sampler, started: Instant::now() }
    }

    /// Ends the watch: stops the innocent client (checking its close handshake) and the
    /// sampler; reads the RSS once more after the server has had a moment to go idle.
    pub fn finish(self) -> Figures {
        let elapsed = self.started.elapsed();
        let echo = self.innocent.finish();
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.sampler.join();
        std::thread::sleep(Duration::from_millis(300));
        let rss_after = rss_kib(self.pid);
        Figures {
            echo,
            rss_before: self.rss_before,
            rss_peak: self.peak.load(Ordering::Relaxed).max(rss_after),
            rss_after,
            elapsed,
        }
    }
}

impl Figures {
    /// Panics unless the server's RSS stayed within `budget_mib` (its `--memory`) plus 10 %
    /// above its RSS before the attack.
    pub fn assert_rss_within(&self, budget_mib: u64) {
        let bound = self.rss_before + budget_mib * 1024 * 11 / 10;
        assert!(self.rss_peak <= bound, "RSS peaked at {} KiB, over {bound} KiB", self.rss_peak);
    }

    /// Prints the figures as one line tagged with `name` (collected for
    /// `docs/RELIABILITY.md`; shown with `--nocapture`) and checks the innocent client.
    pub fn report(&self, name: &str) {
        println!("HOSTILE {name}: {self}");
        self.echo.assert_intact();
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "echo p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} echoes; \
             RSS {} / {} / {} KiB (before / peak / after); {:.1} s",
            ms(self.echo.p50),
            ms(self.echo.p99),
            ms(self.echo.max),
            self.echo.count,
            self.rss_before,
            self.rss_peak,
            self.rss_after,
            self.elapsed.as_secs_f64()
        )
    }
}
