//! The LED traffic over real sockets: clients publish 960 B frames at 60 FPS on a topic of a
//! freeboard server with a small memory budget, a device client subscribed to the topic reads
//! them (stalling now and then, as the simulation's LED driver does), and every `sample` the
//! run records delivered FPS, server RSS, pool chunks in use and allocation failures (scraped
//! from `/metrics`), drops, and pattern-switch latency.
//!
//! The publishers connect to `/topic/NAME` of a server started with `--client-publish`; being
//! subscribers too, they read (and discard) every frame, so the server queues each frame three
//! times — by reference, framed once. A pattern switch is a larger message (`pattern_bytes`)
//! after which the publisher's frames carry the new pattern's number; its latency runs from
//! sending the pattern message to the device receiving the first frame of the new pattern.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use freeboard_proto::{Config, Connection, Instant as ProtoInstant, Role};
use freeboard_test::encode_frame;
use serde::{Deserialize, Serialize};

use crate::Target;
use crate::load::{Rng, open};
use crate::process::Sample;

/// One soak run's settings.
#[derive(Debug, Clone)]
pub struct Soak {
    /// The topic's WebSocket URL, e.g. `ws://127.0.0.1:9001/topic/led`.
    pub target: Target,
    /// Publishing clients.
    pub producers: usize,
    /// Frames per second per client.
    pub fps: u32,
    /// Payload bytes per frame (at least [`HEADER`]).
    pub frame_bytes: usize,
    /// Payload bytes of a pattern message.
    pub pattern_bytes: usize,
    /// Time between pattern switches of one client (the clients take turns).
    pub pattern_every: Duration,
    /// Whether the device stalls now and then (every 15 s on average, 20 ms to 4 s).
    pub stalls: bool,
    /// Length of the run.
    pub duration: Duration,
    /// Time between samples.
    pub sample: Duration,
    /// The server process, for its RSS.
    pub server_pid: Option<u32>,
}

/// Bytes at the start of every message: kind (0 frame, 1 pattern), client, pattern number
/// (u32), pattern start (µs since the run began, u64).
pub const HEADER: usize = 14;

/// One sample of a soak run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SoakSample {
    /// Seconds since the start.
    pub t: f64,
    /// Frames the device received per second per client, over the interval.
    pub delivered_fps: f64,
    /// Frames sent over the interval, all clients.
    pub frames_sent: u64,
    /// Frames received by the device over the interval.
    pub frames_delivered: u64,
    /// Server RSS, KiB: the whole process.
    pub server_rss_kib: Option<u64>,
    /// Bytes of the pools that may be resident, KiB (`freeboard_pool_resident_bytes`, from
    /// servers that export it): beside `server_rss_kib`, what of the process is buffer memory.
    #[serde(default)]
    pub pool_resident_kib: Option<u64>,
    /// Pool chunks in use and in total (`/metrics`).
    pub chunks_in_use: Option<u64>,
    /// Pool chunks in total.
    pub chunks_total: Option<u64>,
    /// Chunk allocation failures so far (`/metrics`).
    pub allocation_failures: Option<u64>,
    /// Messages dropped so far by slow-consumer policies and whole-loop topic drops.
    pub drops: Option<u64>,
    /// Pattern switches seen by the device over the interval.
    pub pattern_switches: usize,
    /// Their latency, ms: p50 and max (0 when there were none).
    pub pattern_latency_ms: [f64; 2],
}

/// A whole soak run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SoakRun {
    /// The server's name.
    pub server: String,
    /// Its pool chunk size and memory budget, bytes (as started; 0 if unknown).
    pub chunk: usize,
    /// Memory budget, bytes.
    pub budget: usize,
    /// Frames sent and received over the whole run.
    pub totals: (u64, u64),
    /// One row per sample.
    pub samples: Vec<SoakSample>,
}

impl SoakRun {
    /// The run as a Markdown table.
    pub fn markdown(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n### buffers: soak, {} (chunk {} KiB, budget {} KiB): {} frames sent, {} delivered\n",
            self.server,
            self.chunk >> 10,
            self.budget >> 10,
            self.totals.0,
            self.totals.1
        );
        s.push_str("| t s | delivered FPS per client | sent | delivered | server RSS KiB | pool resident KiB | chunks in use/total | allocation failures | drops | pattern switches | switch ms p50 / max |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
        let opt = |v: Option<u64>| v.map_or("–".into(), |v| v.to_string());
        for x in &self.samples {
            let _ = writeln!(
                s,
                "| {:.0} | {:.1} | {} | {} | {} | {} | {}/{} | {} | {} | {} | {:.0} / {:.0} |",
                x.t,
                x.delivered_fps,
                x.frames_sent,
                x.frames_delivered,
                opt(x.server_rss_kib),
                opt(x.pool_resident_kib),
                opt(x.chunks_in_use),
                opt(x.chunks_total),
                opt(x.allocation_failures),
                opt(x.drops),
                x.pattern_switches,
                x.pattern_latency_ms[0],
                x.pattern_latency_ms[1],
            );
        }
        s
    }

    /// One CSV line per sample.
    pub fn csv(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::from(
            "server,chunk,budget,t_s,delivered_fps,frames_sent,frames_delivered,server_rss_kib,pool_resident_kib,chunks_in_use,chunks_total,allocation_failures,drops,pattern_switches,switch_p50_ms,switch_max_ms\n",
        );
        let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        for x in &self.samples {
            let _ = writeln!(
                s,
                "{},{},{},{:.1},{:.2},{},{},{},{},{},{},{},{},{},{:.1},{:.1}",
                self.server,
                self.chunk,
                self.budget,
                x.t,
                x.delivered_fps,
                x.frames_sent,
                x.frames_delivered,
                opt(x.server_rss_kib),
                opt(x.pool_resident_kib),
                opt(x.chunks_in_use),
                opt(x.chunks_total),
                opt(x.allocation_failures),
                opt(x.drops),
                x.pattern_switches,
                x.pattern_latency_ms[0],
                x.pattern_latency_ms[1],
            );
        }
        s
    }
}

/// What the threads of a run share.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    sent: AtomicU64,
    delivered: AtomicU64,
    /// Pattern-switch latencies seen since the last sample, µs.
    switches: Mutex<Vec<u64>>,
    error: Mutex<Option<String>>,
}

/// Runs `soak`; `on_sample` sees each sample as it is taken.
pub fn run(soak: &Soak, on_sample: &mut dyn FnMut(&SoakSample)) -> io::Result<SoakRun> {
    let shared = Arc::new(Shared::default());
    let start = Instant::now();
    let mut rng = Rng::seeded();
    let (device, leftover) = open(&soak.target, Duration::from_secs(5), &mut rng)?;
    let mut threads = Vec::new();
    {
        let shared = shared.clone();
        let soak = soak.clone();
        threads.push(std::thread::spawn(move || {
            device_loop(device, leftover, &soak, &shared, start);
        }));
    }
    for producer in 0..soak.producers {
        let (stream, _) = open(&soak.target, Duration::from_secs(5), &mut rng)?;
        let reader = stream.try_clone()?;
        let shared_r = shared.clone();
        threads.push(std::thread::spawn(move || discard(reader, &shared_r)));
        let shared = shared.clone();
        let soak = soak.clone();
        let mask = Rng::seeded();
        threads.push(std::thread::spawn(move || {
            if let Err(e) = publish(stream, producer, &soak, &shared, start, mask) {
                shared.error.lock().map(|mut g| g.get_or_insert(e.to_string()).clone()).ok();
            }
        }));
    }
    let metrics_addr = soak.target.addr;
    let mut samples = Vec::new();
    let (mut last_sent, mut last_delivered, mut last_t) = (0, 0, 0.0);
    let mut next = start + soak.sample;
    let end = start + soak.duration;
    loop {
        let now = Instant::now();
        if now < next.min(end) {
            std::thread::sleep((next.min(end) - now).min(Duration::from_millis(100)));
            continue;
        }
        let t = start.elapsed().as_secs_f64();
        let sent = shared.sent.load(Ordering::Relaxed);
        let delivered = shared.delivered.load(Ordering::Relaxed);
        let metrics = scrape(metrics_addr).unwrap_or_default();
        let value = |name: &str| -> Option<u64> {
            let mut found = false;
            let mut sum = 0.0;
            for line in metrics.lines().filter(|l| !l.starts_with('#')) {
                let key = line.split(['{', ' ']).next().unwrap_or("");
                if key == name {
                    found = true;
                    sum +=
                        line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                }
            }
            // A family with no entry yet (no failure, no drop) is absent: zero, if the
            // scrape worked at all.
            (found || !metrics.is_empty()).then_some(sum as u64)
        };
        let mut switches = std::mem::take(&mut *shared.switches.lock().expect("not poisoned"));
        switches.sort_unstable();
        let ms = |us: u64| us as f64 / 1000.0;
        let interval = (t - last_t).max(1e-9);
        let drops = value("freeboard_drops_total")
            .map(|d| d + value("freeboard_topic_drops_total").unwrap_or(0));
        let sample = SoakSample {
            t,
            delivered_fps: (delivered - last_delivered) as f64
                / interval
                / soak.producers.max(1) as f64,
            frames_sent: sent - last_sent,
            frames_delivered: delivered - last_delivered,
            server_rss_kib: soak.server_pid.and_then(|pid| Sample::of(pid).ok()).map(|s| s.rss_kib),
            // Absent from servers that do not export it yet (no family at all): "–".
            pool_resident_kib: metrics
                .lines()
                .any(|l| l.starts_with("freeboard_pool_resident_bytes"))
                .then(|| value("freeboard_pool_resident_bytes").map(|b| b / 1024))
                .flatten(),
            chunks_in_use: value("freeboard_pool_chunks_in_use"),
            chunks_total: value("freeboard_pool_chunks_capacity"),
            allocation_failures: value("freeboard_pool_allocation_failures_total"),
            drops,
            pattern_switches: switches.len(),
            pattern_latency_ms: match switches.last() {
                Some(&max) => [ms(switches[switches.len() / 2]), ms(max)],
                None => [0.0, 0.0],
            },
        };
        on_sample(&sample);
        samples.push(sample);
        (last_sent, last_delivered, last_t) = (sent, delivered, t);
        if Instant::now() >= end {
            break;
        }
        next += soak.sample;
    }
    shared.stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    if let Some(e) = shared.error.lock().expect("not poisoned").take() {
        return Err(io::Error::other(e));
    }
    Ok(SoakRun {
        server: soak.target.to_string(),
        chunk: 0,
        budget: 0,
        totals: (shared.sent.load(Ordering::Relaxed), shared.delivered.load(Ordering::Relaxed)),
        samples,
    })
}

/// A publisher: frames at `fps`, a pattern message every `pattern_every` (clients take turns).
fn publish(
    mut stream: TcpStream,
    producer: usize,
    soak: &Soak,
    shared: &Shared,
    start: Instant,
    mut rng: Rng,
) -> io::Result<()> {
    let mut payload = vec![0u8; soak.frame_bytes.max(HEADER)];
    let mut pattern = vec![0u8; soak.pattern_bytes.max(HEADER)];
    let mut out = vec![0u8; payload.len().max(pattern.len()) + 14];
    let period = Duration::from_secs_f64(1.0 / f64::from(soak.fps.max(1)));
    let every = soak.pattern_every.mul_f64(soak.producers.max(1) as f64);
    let mut next_pattern = start + soak.pattern_every.mul_f64(producer as f64 + 1.0);
    let (mut number, mut pattern_at) = (0u32, 0u64);
    let mut next = start + period.mul_f64(producer as f64 / soak.producers.max(1) as f64);
    while !shared.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep(next - now);
            continue;
        }
        next += period;
        if now >= next_pattern && !soak.pattern_every.is_zero() {
            next_pattern += every;
            number += 1;
            pattern_at = start.elapsed().as_micros() as u64;
            stamp(&mut pattern, 1, producer, number, pattern_at);
            let n = encode_frame(0x82, &pattern, Some(rng.mask()), &mut out)
                .map_err(io::Error::other)?;
            stream.write_all(&out[..n])?;
        }
        stamp(&mut payload, 0, producer, number, pattern_at);
        let n =
            encode_frame(0x82, &payload, Some(rng.mask()), &mut out).map_err(io::Error::other)?;
        stream.write_all(&out[..n])?;
        shared.sent.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

fn stamp(buf: &mut [u8], kind: u8, producer: usize, number: u32, at: u64) {
    buf[0] = kind;
    buf[1] = producer as u8;
    buf[2..6].copy_from_slice(&number.to_le_bytes());
    buf[6..14].copy_from_slice(&at.to_le_bytes());
}

/// The device: reads the topic, counts frames, notices pattern switches, stalls now and then.
fn device_loop(
    mut stream: TcpStream,
    leftover: Vec<u8>,
    soak: &Soak,
    shared: &Shared,
    start: Instant,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let mut rx = Connection::new(
        Role::Client,
        Config::builder().max_message_size(1 << 24).build(),
        ProtoInstant::default(),
    );
    let mut buf = vec![0u8; 64 << 10];
    let mut head = Vec::with_capacity(HEADER);
    let mut patterns = vec![0u32; 256];
    let mut stall_rng = Rng::seeded();
    let mut next_stall = start + exp(&mut stall_rng, 15.0);
    let mut pending = leftover;
    while !shared.stop.load(Ordering::Relaxed) {
        if soak.stalls && Instant::now() >= next_stall {
            let r = unit(&mut stall_rng);
            let ms = if r < 0.70 {
                20.0 + 80.0 * unit(&mut stall_rng)
            } else if r < 0.95 {
                100.0 + 700.0 * unit(&mut stall_rng)
            } else {
                800.0 + 3200.0 * unit(&mut stall_rng)
            };
            std::thread::sleep(Duration::from_secs_f64(ms / 1000.0));
            next_stall = Instant::now() + exp(&mut stall_rng, 15.0);
        }
        let n = if pending.is_empty() {
            match stream.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e)
                    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
                {
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        } else {
            let n = pending.len().min(buf.len());
            buf[..n].copy_from_slice(&pending[..n]);
            pending.drain(..n);
            n
        };
        let mut at = 0;
        while at < n {
            let Ok(input) = rx.handle_input(ProtoInstant::default(), &mut buf[at..n]) else {
                return;
            };
            at += input.consumed;
            if let Some(piece) = input.payload {
                let want = HEADER.saturating_sub(head.len()).min(piece.data.len());
                head.extend_from_slice(&piece.data[..want]);
                if piece.message_fin {
                    if head.len() == HEADER && head[0] == 0 {
                        shared.delivered.fetch_add(1, Ordering::Relaxed);
                        let p = usize::from(head[1]);
                        let number = u32::from_le_bytes([head[2], head[3], head[4], head[5]]);
                        if number != patterns[p] {
                            patterns[p] = number;
                            let mut at_us = [0u8; 8];
                            at_us.copy_from_slice(&head[6..14]);
                            let since = u64::from_le_bytes(at_us);
                            let now = start.elapsed().as_micros() as u64;
                            if let Ok(mut s) = shared.switches.lock() {
                                s.push(now.saturating_sub(since));
                            }
                        }
                    }
                    head.clear();
                }
            }
            while rx.poll_event().is_some() {}
            if input.consumed == 0 {
                break;
            }
        }
    }
}

/// Reads and throws away what a publisher receives (it is a subscriber too).
fn discard(mut stream: TcpStream, shared: &Shared) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0u8; 64 << 10];
    while !shared.stop.load(Ordering::Relaxed) {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// `GET /metrics` from the server at `addr`.
pub fn scrape(addr: std::net::SocketAddr) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body.split_once("\r\n\r\n").map_or(body.clone(), |(_, b)| b.to_string()))
}

fn unit(rng: &mut Rng) -> f64 {
    f64::from(u32::from_ne_bytes(rng.mask())) / f64::from(u32::MAX)
}

fn exp(rng: &mut Rng, mean_secs: f64) -> Duration {
    Duration::from_secs_f64(-(1.0 - unit(rng)).max(1e-12).ln() * mean_secs)
}
