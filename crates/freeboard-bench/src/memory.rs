//! Memory that comes back: a server's RSS at rest, with N idle connections open, over the idle
//! time after they close, and over the idle time after a burst of queued messages drains — for
//! several server binaries one after the other in the same run (e.g. two builds of freeboard).
//!
//! The burst: `burst_connections` clients send binary messages to the echo route and read
//! nothing, so the echoes queue in the server's pool (the burst's server runs with a high write
//! watermark of 12 MiB, so it goes on reading that long); the client watches the pool through
//! `/metrics` and stops when the chunks in use reach `burst_fill` of all chunks (or a loop's pool
//! is nearly full). Then every client reads all its echoes (the queues drain) and closes.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Target;
use crate::buffers::soak::scrape;
use crate::load::{Rng, open};
use crate::process::Sample;

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Idle connections opened and closed.
    pub connections: usize,
    /// Clients of the burst.
    pub burst_connections: usize,
    /// Payload bytes of a burst message (at most 65,535: a 4-byte header from the server).
    pub burst_message: usize,
    /// Fraction of the pools' chunks the burst fills.
    pub burst_fill: f64,
    /// Idle time watched after the connections close and after the burst drains.
    pub idle: Duration,
    /// Time between RSS samples during `idle`.
    pub sample: Duration,
    /// Time a fresh server gets before its RSS at rest is read.
    pub settle: Duration,
    /// "Back" means within this fraction above the RSS at rest (0.05: 5 %).
    pub tolerance: f64,
    /// The servers' pool chunk size (their `--chunk-size`), to turn chunks into bytes.
    pub chunk_size: usize,
    /// `serve` arguments for the idle connections (the default budget).
    pub connections_args: Vec<String>,
    /// `serve` arguments for the burst (e.g. `--memory 64M --max-message-size 64K`).
    pub burst_args: Vec<String>,
}

impl Default for Plan {
    fn default() -> Self {
        Self {
            connections: 10_000,
            burst_connections: 8,
            burst_message: 60_000,
            burst_fill: 0.9,
            idle: Duration::from_secs(10),
            sample: Duration::from_millis(500),
            settle: Duration::from_secs(2),
            tolerance: 0.05,
            chunk_size: 4096,
            connections_args: Vec::new(),
            burst_args:
                "--threads 1 --memory 64M --max-message-size 64K --send-low 6M --send-high 12M"
                    .split(' ')
                    .map(String::from)
                    .collect(),
        }
    }
}

/// A server binary to measure: started as `BINARY serve ARGS PLAN-ARGS --listen ADDR`.
#[derive(Debug, Clone)]
pub struct Server {
    /// Its name in the tables.
    pub name: String,
    /// The `freeboard` binary.
    pub binary: PathBuf,
    /// Arguments after `serve`.
    pub args: Vec<String>,
}

/// One run against one server.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Run {
    /// The server's name.
    pub server: String,
    /// RSS at rest, before any connection, KiB.
    pub rest_kib: u64,
    /// Connections that completed their handshake.
    pub connected: usize,
    /// RSS with them open, KiB.
    pub open_kib: u64,
    /// (open − rest) / connected, KiB.
    pub kib_per_conn: f64,
    /// RSS over the idle time after they closed: (seconds since the close, KiB).
    pub after_close: Vec<RssSample>,
    /// Seconds after the close until RSS was within the tolerance of `rest_kib`, if it was.
    pub close_return_s: Option<f64>,
    /// RSS at rest of the server started for the burst (its own budget), KiB.
    pub burst_rest_kib: u64,
    /// Most pool bytes in use during the burst (chunks in use × chunk size, all loops).
    pub burst_bytes: u64,
    /// `burst_bytes` over the pools' total chunk bytes.
    pub burst_fill: f64,
    /// RSS at the top of the burst, KiB.
    pub burst_kib: u64,
    /// Burst clients the server closed before they read their echoes (a loop's pool ran out).
    pub burst_closed: usize,
    /// RSS over the idle time after the burst drained and its clients closed.
    pub after_burst: Vec<RssSample>,
    /// Seconds after the drain until RSS was within the tolerance of `burst_rest_kib`, if it
    /// was (and stayed).
    pub burst_return_s: Option<f64>,
}

impl Run {
    /// RSS at the end of the idle time after the close, KiB.
    pub fn closed_kib(&self) -> u64 {
        self.after_close.last().map_or(0, |s| s.1)
    }

    /// RSS at the end of the idle time after the burst, KiB.
    pub fn drained_kib(&self) -> u64 {
        self.after_burst.last().map_or(0, |s| s.1)
    }
}

/// A started server, killed (by its PID, through its `Child`) when dropped.
struct Started {
    child: Child,
    target: Target,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(server: &Server, args: &[String]) -> io::Result<Started> {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let child = Command::new(&server.binary)
        .arg("serve")
        .args(["--max-connections-per-ip", "1000000", "--max-connections", "1000000"])
        .args(&server.args)
        .args(args)
        .args(["--listen", &addr.to_string()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()?;
    let mut started = Started { child, target: Target::at(addr, "/", false) };
    let t0 = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) if s.local_addr().ok() != s.peer_addr().ok() => return Ok(started),
            _ => {}
        }
        if let Some(status) = started.child.try_wait()? {
            return Err(io::Error::other(format!("{} exited: {status}", server.name)));
        }
        if t0.elapsed() > Duration::from_secs(10) {
            return Err(io::Error::other(format!("{} did not start listening", server.name)));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the plan once against `server`.
pub fn run(server: &Server, plan: &Plan) -> io::Result<Run> {
    let started = start(server, &plan.connections_args)?;
    let pid = started.child.id();
    let target = &started.target;
    let rss = || Sample::of(pid).map(|s| s.rss_kib);
    std::thread::sleep(plan.settle);
    let rest_kib = rss()?;
    let mut out = Run { server: server.name.clone(), rest_kib, ..Run::default() };
    let back = |rest: u64| move |kib: u64| kib as f64 <= rest as f64 * (1.0 + plan.tolerance);

    // Idle connections.
    let mut rng = Rng::seeded();
    let mut conns = Vec::with_capacity(plan.connections);
    for _ in 0..plan.connections {
        if let Ok((stream, _)) = open(target, Duration::from_secs(5), &mut rng) {
            conns.push(stream);
        }
    }
    out.connected = conns.len();
    std::thread::sleep(Duration::from_millis(500));
    out.open_kib = rss()?;
    out.kib_per_conn = (out.open_kib as f64 - rest_kib as f64) / out.connected.max(1) as f64;
    drop(conns);
    (out.after_close, out.close_return_s) = watch(pid, plan, back(rest_kib))?;
    drop(started);

    // The burst, on a server of its own.
    let started = start(server, &plan.burst_args)?;
    let pid = started.child.id();
    std::thread::sleep(plan.settle);
    out.burst_rest_kib = Sample::of(pid)?.rss_kib;
    let (bytes, fill, kib, closed) = burst(&started.target, pid, plan, &mut rng)
        .map_err(|e| io::Error::new(e.kind(), format!("burst: {e}")))?;
    (out.burst_bytes, out.burst_fill, out.burst_kib) = (bytes, fill, kib);
    out.burst_closed = closed;
    (out.after_burst, out.burst_return_s) = watch(pid, plan, back(out.burst_rest_kib))?;
    Ok(out)
}

/// (seconds since the watch began, RSS in KiB).
pub type RssSample = (f64, u64);

/// RSS every `plan.sample` for `plan.idle`, and the first time it was `back`.
fn watch(
    pid: u32,
    plan: &Plan,
    back: impl Fn(u64) -> bool,
) -> io::Result<(Vec<RssSample>, Option<f64>)> {
    let t0 = Instant::now();
    let mut samples = Vec::new();
    let mut returned = None;
    loop {
        let t = t0.elapsed().as_secs_f64();
        let kib = Sample::of(pid)?.rss_kib;
        samples.push((t, kib));
        if returned.is_none() && back(kib) {
            returned = Some(t);
        } else if !back(kib) {
            returned = None; // it must stay back
        }
        if t0.elapsed() >= plan.idle {
            return Ok((samples, returned));
        }
        std::thread::sleep(plan.sample);
    }
}

/// Chunks in use and in total, summed over the event loops, and each loop's fill.
fn pool_fill(target: &Target) -> io::Result<(u64, u64, f64)> {
    let metrics = scrape(target.addr)?;
    let mut in_use = std::collections::BTreeMap::<String, (f64, f64)>::new();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let (key, value) = match line.rsplit_once(' ') {
            Some((k, v)) => (k, v.parse::<f64>().unwrap_or(0.0)),
            None => continue,
        };
        let name = key.split('{').next().unwrap_or("");
        let labels = key.strip_prefix(name).unwrap_or("").to_string();
        match name {
            "freeboard_pool_chunks_in_use" => in_use.entry(labels).or_default().0 = value,
            "freeboard_pool_chunks_capacity" => in_use.entry(labels).or_default().1 = value,
            _ => {}
        }
    }
    let used: f64 = in_use.values().map(|v| v.0).sum();
    let total: f64 = in_use.values().map(|v| v.1).sum();
    let fullest = in_use.values().map(|v| v.0 / v.1.max(1.0)).fold(0.0, f64::max);
    Ok((used as u64, total as u64, fullest))
}

/// Fills the pools with queued echoes to `plan.burst_fill`, then reads everything back and
/// closes. Returns (most pool bytes in use, their fraction of the pools, RSS at the top, clients
/// the server closed).
fn burst(
    target: &Target,
    pid: u32,
    plan: &Plan,
    rng: &mut Rng,
) -> io::Result<(u64, f64, u64, usize)> {
    let chunk = plan.chunk_size;
    let size = plan.burst_message.min(65_535);
    let mut frame = vec![0u8; size + 8];
    let mut tx = freeboard_proto::Connection::new(
        freeboard_proto::Role::Client,
        freeboard_proto::Config::default(),
        freeboard_proto::Instant::default(),
    );
    let n = tx
        .send_frame(
            freeboard_proto::OpCode::Binary,
            true,
            &vec![b'b'; size],
            Some(rng.mask()),
            &mut frame,
        )
        .map_err(io::Error::other)?;
    frame.truncate(n);
    let echo_len = size + if size < 126 { 2 } else { 4 };
    let mut conns = Vec::with_capacity(plan.burst_connections);
    for _ in 0..plan.burst_connections {
        let (stream, _) = open(target, Duration::from_secs(5), rng)?;
        conns.push((stream, 0u64));
    }
    let (_, total, _) = pool_fill(target)?;
    let goal = (total as f64 * plan.burst_fill) as u64;
    let mut top = (0u64, 0u64);
    let t0 = Instant::now();
    'fill: loop {
        for (stream, sent) in conns.iter_mut() {
            stream
                .write_all(&frame)
                .map_err(|e| io::Error::new(e.kind(), format!("writing message {sent}: {e}")))?;
            *sent += 1;
        }
        std::thread::sleep(Duration::from_millis(2));
        let (used, _, fullest) = pool_fill(target)?;
        if std::env::var_os("FREEBOARD_BENCH_DEBUG").is_some() {
            eprintln!("burst: {} messages per client, {used} chunks in use", conns[0].1);
        }
        if used >= top.0 {
            top = (used, Sample::of(pid)?.rss_kib);
        }
        if used >= goal || fullest > 0.95 || t0.elapsed() > Duration::from_secs(60) {
            break 'fill;
        }
    }
    // Settle: what the kernel had not passed on yet reaches the queues.
    std::thread::sleep(Duration::from_millis(300));
    let (used, _, _) = pool_fill(target)?;
    if used >= top.0 {
        top = (used, Sample::of(pid)?.rss_kib);
    }
    if std::env::var_os("FREEBOARD_BENCH_DEBUG").is_some() {
        eprintln!("burst: filled in {:.1} s, draining", t0.elapsed().as_secs_f64());
    }
    let mut buf = vec![0u8; 1 << 16];
    let mut closed = 0;
    for (stream, sent) in conns.iter_mut() {
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut left = *sent * echo_len as u64;
        while left > 0 {
            match stream.read(&mut buf[..(left.min(1 << 16)) as usize]) {
                Ok(0) | Err(_) if std::env::var_os("FREEBOARD_BENCH_DEBUG").is_some() => {
                    eprintln!("burst: {left} of {} bytes unread", *sent * echo_len as u64);
                    closed += 1;
                    break;
                }
                Ok(0) | Err(_) => {
                    // Closed by the server (its loop's pool ran out: 1013), counted.
                    closed += 1;
                    break;
                }
                Ok(n) => left -= n as u64,
            }
        }
    }
    if std::env::var_os("FREEBOARD_BENCH_DEBUG").is_some() {
        eprintln!("burst: drained at {:.1} s, {closed} closed", t0.elapsed().as_secs_f64());
    }
    drop(conns);
    let bytes = top.0 * chunk as u64;
    Ok((bytes, top.0 as f64 / total.max(1) as f64, top.1, closed))
}

/// The median of `values` and their range.
pub fn median(values: &mut [f64]) -> (f64, f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let mid = if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 };
    (mid, values[0], values[n - 1])
}

/// A Markdown table of the runs: per server the median [min–max] of each figure over its runs.
pub fn table(runs: &[Run], plan: &Plan) -> String {
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        if !names.contains(&r.server.as_str()) {
            names.push(&r.server);
        }
    }
    let mut out = format!(
        "| server | RSS at rest | {} connections open | KiB/conn | {:.0} s after close | \
         back within {:.0} % | burst server at rest | burst: pool in use | RSS at the top | \
         {:.0} s after drain | back within {:.0} % |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        plan.connections,
        plan.idle.as_secs_f64(),
        plan.tolerance * 100.0,
        plan.idle.as_secs_f64(),
        plan.tolerance * 100.0,
    );
    for name in names {
        let mine: Vec<&Run> = runs.iter().filter(|r| r.server == name).collect();
        let col = |f: &dyn Fn(&Run) -> f64, unit: &str, scale: f64| {
            let mut v: Vec<f64> = mine.iter().map(|r| f(r) * scale).collect();
            let (m, lo, hi) = median(&mut v);
            if v.len() > 1 {
                format!("{m:.2} {unit} [{lo:.2}–{hi:.2}]")
            } else {
                format!("{m:.2} {unit}")
            }
        };
        let mib = 1.0 / 1024.0;
        let returned = |f: &dyn Fn(&Run) -> Option<f64>| {
            let times: Vec<String> = mine
                .iter()
                .map(|r| f(r).map_or("no".to_string(), |t| format!("{t:.1} s")))
                .collect();
            times.join(", ")
        };
        out += &format!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} |\n",
            col(&|r| r.rest_kib as f64, "MiB", mib),
            col(&|r| r.open_kib as f64, "MiB", mib),
            col(&|r| r.kib_per_conn, "", 1.0),
            col(&|r| r.closed_kib() as f64, "MiB", mib),
            returned(&|r| r.close_return_s),
            col(&|r| r.burst_rest_kib as f64, "MiB", mib),
            col(&|r| r.burst_bytes as f64, "MiB", mib / 1024.0),
            col(&|r| r.burst_fill * 100.0, "%", 1.0),
            col(&|r| r.burst_kib as f64, "MiB", mib),
            col(&|r| r.drained_kib() as f64, "MiB", mib),
            returned(&|r| r.burst_return_s),
        );
    }
    out
}

/// The runs as pretty JSON.
pub fn to_json(runs: &[Run]) -> String {
    serde_json::to_string_pretty(runs).unwrap_or_default()
}
