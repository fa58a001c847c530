//! Results over repeats — median, min and max of each figure — and their renderings:
//! a Markdown table, JSON and CSV.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::broadcast::BroadcastRow;
use crate::buffers::simulation::{SimOutcome, Workload};
use crate::buffers::soak::SoakRun;
use crate::connections::Step;
use crate::load::Measured;
use crate::slow_consumer::Outcome;
pub use crate::spread::Spread;
use crate::watermarks::WatermarkRow;

/// One load experiment (echo or pipeline) against one server, over its repeats.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoadRow {
    /// `echo` or `pipeline`.
    pub experiment: String,
    /// The server's name (a peer's, or the URL).
    pub server: String,
    /// Concurrent connections.
    pub clients: usize,
    /// Messages in flight per connection.
    pub in_flight: usize,
    /// Payload bytes.
    pub size: usize,
    /// Every run, in order.
    pub runs: Vec<Measured>,
    /// Echoes per second.
    pub msgs_per_sec: Spread,
    /// Payload MiB per second, one direction.
    pub mib_per_sec: Spread,
    /// Round-trip latency, µs.
    pub p50_us: Spread,
    /// Round-trip latency, µs.
    pub p99_us: Spread,
    /// Round-trip latency, µs.
    pub p999_us: Spread,
    /// Load generator CPU over wall time.
    pub client_cpu: Spread,
    /// Server CPU µs per message, when the server's PID was known.
    pub server_cpu_us_per_msg: Option<Spread>,
    /// Of that, system time.
    #[serde(default)]
    pub server_sys_us_per_msg: Option<Spread>,
    /// And user time (each run's CPU less its system time).
    #[serde(default)]
    pub server_user_us_per_msg: Option<Spread>,
    /// Largest server RSS seen at the end of a run, KiB.
    pub server_rss_kib: Option<u64>,
}

impl LoadRow {
    /// Summarises `runs` of one experiment.
    pub fn new(
        experiment: &str,
        server: &str,
        (clients, in_flight, size): (usize, usize, usize),
        runs: Vec<Measured>,
    ) -> Self {
        let spread = |f: fn(&Measured) -> f64| Spread::of(runs.iter().map(f));
        let server_cpu = runs.iter().filter_map(|r| r.server_cpu_us_per_msg).collect::<Vec<_>>();
        let server_sys = runs.iter().filter_map(|r| r.server_sys_us_per_msg).collect::<Vec<_>>();
        let server_user = runs
            .iter()
            .filter_map(|r| Some(r.server_cpu_us_per_msg? - r.server_sys_us_per_msg?))
            .collect::<Vec<_>>();
        Self {
            experiment: experiment.into(),
            server: server.into(),
            clients,
            in_flight,
            size,
            msgs_per_sec: spread(|r| r.msgs_per_sec),
            mib_per_sec: spread(|r| r.mib_per_sec),
            p50_us: spread(|r| r.latency_us[0]),
            p99_us: spread(|r| r.latency_us[1]),
            p999_us: spread(|r| r.latency_us[2]),
            client_cpu: spread(|r| r.client_cpu),
            server_cpu_us_per_msg: (!server_cpu.is_empty()).then(|| Spread::of(server_cpu)),
            server_sys_us_per_msg: (!server_sys.is_empty()).then(|| Spread::of(server_sys)),
            server_user_us_per_msg: (!server_user.is_empty()).then(|| Spread::of(server_user)),
            server_rss_kib: runs.iter().filter_map(|r| r.server_rss_kib).max(),
            runs,
        }
    }

    /// Messages sent and received over all runs, and connections failed.
    pub fn totals(&self) -> (u64, u64, usize, u64) {
        self.runs.iter().fold((0, 0, 0, 0), |(s, r, f, m), run| {
            (s + run.sent, r + run.received, f + run.failed, m + run.mismatched)
        })
    }
}

/// The connections experiment against one server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConnectionsRow {
    /// The server's name.
    pub server: String,
    /// One step per connection count.
    pub steps: Vec<Step>,
    /// Server RSS after each connect/close cycle at the largest count, KiB (the first entry
    /// is the baseline before the first cycle).
    pub cycle_rss_kib: Vec<u64>,
}

/// Everything one `freeboard bench` invocation measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// The command line that produced it.
    pub command: String,
    /// One-minute load average before and after the runs.
    pub load_average: (Option<f64>, Option<f64>),
    /// Server and client CPUs, when pinned.
    pub pinned: Option<(usize, usize)>,
    /// Echo and pipeline results.
    pub loads: Vec<LoadRow>,
    /// Connections results.
    pub connections: Vec<ConnectionsRow>,
    /// Slow-consumer results, by server.
    #[serde(default)]
    pub slow_consumers: Vec<(String, Outcome)>,
    /// The buffers study's simulation: the workload and one outcome per allocator.
    #[serde(default)]
    pub simulation: Option<(Workload, Vec<SimOutcome>)>,
    /// The buffers study's real-socket soaks, one per chunk size.
    #[serde(default)]
    pub soaks: Vec<SoakRun>,
    /// Watermark pairs under sequential and burst requests.
    #[serde(default)]
    pub watermarks: Vec<WatermarkRow>,
    /// One publisher to N subscribers.
    #[serde(default)]
    pub broadcasts: Vec<BroadcastRow>,
    /// New `wss://` connections per second, full and resumed.
    #[serde(default)]
    pub handshakes: Vec<HandshakeRow>,
    /// Latency at a fixed rate and capacity under a p99 bound.
    #[serde(default)]
    pub latency: crate::latency::LatencyReport,
}

/// New `wss://` connections against one server with one number of clients, full or resumed
/// handshakes, over its repeats.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandshakeRow {
    /// The server's name.
    pub server: String,
    /// Concurrent clients.
    pub clients: usize,
    /// Whether the server spoke TLS.
    #[serde(default = "yes")]
    pub tls: bool,
    /// Whether the clients resumed sessions with tickets.
    pub resume: bool,
    /// Every run, in order.
    pub runs: Vec<crate::handshakes::Handshakes>,
}

fn yes() -> bool {
    true
}

impl HandshakeRow {
    /// Handshakes per wall second.
    pub fn per_sec(&self) -> Spread {
        Spread::of(self.runs.iter().map(|r| r.per_sec()))
    }

    /// Handshakes per second of one server core, when its CPU time was known.
    pub fn per_core_sec(&self) -> Option<Spread> {
        let v: Vec<f64> = self.runs.iter().filter_map(|r| r.per_core_sec()).collect();
        (!v.is_empty()).then(|| Spread::of(v))
    }
}

/// The servers a load row is compared with, when they ran in the same report.
const BASELINES: [&str; 6] = [
    "raw-tcp-echo",
    "raw-uring-echo",
    "uwebsockets",
    "fastwebsockets",
    "tokio-tungstenite",
    "tokio-tungstenite-rustls",
];

impl Report {
    /// Adds `other`'s results to this report's (a later simulation replaces an earlier one).
    pub fn merge(&mut self, other: Report) {
        self.loads.extend(other.loads);
        self.connections.extend(other.connections);
        self.slow_consumers.extend(other.slow_consumers);
        self.soaks.extend(other.soaks);
        self.watermarks.extend(other.watermarks);
        self.broadcasts.extend(other.broadcasts);
        self.handshakes.extend(other.handshakes);
        self.latency.merge(other.latency);
        self.simulation = other.simulation.or(self.simulation.take());
    }

    /// Joins the rows of the same case and server (from interleaved rounds of one run each)
    /// into one row with all their runs, in the order they first appeared.
    pub fn merge_repeats(&mut self) {
        let mut loads: Vec<LoadRow> = Vec::new();
        for row in std::mem::take(&mut self.loads) {
            let key = |r: &LoadRow| {
                (r.experiment.clone(), r.server.clone(), r.clients, r.in_flight, r.size)
            };
            match loads.iter_mut().find(|r| key(r) == key(&row)) {
                Some(r) => {
                    let mut runs = std::mem::take(&mut r.runs);
                    runs.extend(row.runs);
                    *r = LoadRow::new(
                        &r.experiment,
                        &r.server,
                        (r.clients, r.in_flight, r.size),
                        runs,
                    );
                }
                None => loads.push(row),
            }
        }
        self.loads = loads;
        let mut handshakes: Vec<HandshakeRow> = Vec::new();
        for row in std::mem::take(&mut self.handshakes) {
            let same = |r: &&mut HandshakeRow| {
                (&r.server, r.clients, r.resume) == (&row.server, row.clients, row.resume)
            };
            match handshakes.iter_mut().find(same) {
                Some(r) => r.runs.extend(row.runs),
                None => handshakes.push(row),
            }
        }
        self.handshakes = handshakes;
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // NOTE(unwrap): every field serialises (no maps with non-string keys).
        serde_json::to_string_pretty(self).expect("a report serialises")
    }

    /// A report saved with [`to_json`](Self::to_json).
    pub fn from_json(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// The Markdown tables: echo, pipeline (with ratios to the baselines present), connections.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "`{}`", self.command);
        let la = |v: Option<f64>| v.map_or("?".into(), |v| format!("{v:.2}"));
        let _ = write!(
            s,
            "\nload average {} before, {} after",
            la(self.load_average.0),
            la(self.load_average.1)
        );
        match self.pinned {
            Some((server, client)) => {
                let _ = writeln!(s, "; server pinned to CPU {server}, client to CPU {client}");
            }
            None => s.push_str("; not pinned\n"),
        }
        for experiment in ["echo", "pipeline"] {
            let rows: Vec<&LoadRow> =
                self.loads.iter().filter(|r| r.experiment == experiment).collect();
            if rows.is_empty() {
                continue;
            }
            let baselines: Vec<&str> =
                BASELINES.into_iter().filter(|b| rows.iter().any(|r| r.server == *b)).collect();
            let _ = writeln!(s, "\n### {experiment} (median of runs, [min–max])\n");
            s.push_str("| server | clients | in flight | size B | msg/s | MiB/s | p50 µs | p99 µs | p99.9 µs | server CPU µs/msg | server RSS KiB | client CPU |");
            for b in &baselines {
                let _ = write!(s, " × {b} |");
            }
            s.push_str(" sent/received/failed, all runs |\n|");
            for _ in 0..(13 + baselines.len()) {
                s.push_str("---|");
            }
            s.push('\n');
            for r in &rows {
                let cpu = match (r.server_cpu_us_per_msg, r.server_user_us_per_msg) {
                    (None, _) => "–".into(),
                    (Some(c), None) => spread(c, 2, 1.0),
                    // Three places for the split: user time is a few hundredths of a µs.
                    (Some(c), Some(user)) => format!(
                        "{} (user {:.3}, sys {:.3})",
                        spread(c, 3, 1.0),
                        user.median,
                        r.server_sys_us_per_msg.map_or(0.0, |s| s.median)
                    ),
                };
                let rss = r.server_rss_kib.map_or("–".into(), |v| v.to_string());
                let _ = write!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} % |",
                    r.server,
                    r.clients,
                    r.in_flight,
                    r.size,
                    spread(r.msgs_per_sec, 0, 1.0),
                    spread(r.mib_per_sec, 1, 1.0),
                    spread(r.p50_us, 0, 1.0),
                    spread(r.p99_us, 0, 1.0),
                    spread(r.p999_us, 0, 1.0),
                    cpu,
                    rss,
                    r.client_cpu.median * 100.0,
                );
                for b in &baselines {
                    let base = rows.iter().find(|o| {
                        o.server == *b
                            && (o.clients, o.in_flight, o.size) == (r.clients, r.in_flight, r.size)
                    });
                    match base {
                        Some(o) if o.msgs_per_sec.median > 0.0 => {
                            let _ = write!(
                                s,
                                " {:.2} |",
                                r.msgs_per_sec.median / o.msgs_per_sec.median
                            );
                        }
                        _ => s.push_str(" – |"),
                    }
                }
                let (sent, received, failed, _) = r.totals();
                let _ = writeln!(s, " {sent}/{received}/{failed} |");
            }
        }
        if !self.handshakes.is_empty() {
            s.push_str(
                "\n### wss handshakes: connect, TLS, upgrade, drop (median of runs, [min–max])\n\n",
            );
            s.push_str("| server | clients | handshake | per second | per server core-second | server user µs each | server sys µs each | resumed/completed/failed, all runs |\n|---|---|---|---|---|---|---|---|\n");
            for r in &self.handshakes {
                let each = |f: fn(&crate::handshakes::Handshakes) -> Option<f64>| {
                    let v: Vec<f64> = r.runs.iter().filter_map(f).collect();
                    if v.is_empty() { "–".into() } else { spread(Spread::of(v), 0, 1.0) }
                };
                let sum = |f: fn(&crate::handshakes::Handshakes) -> u64| -> u64 {
                    r.runs.iter().map(f).sum()
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {} | {}/{}/{} |",
                    r.server,
                    r.clients,
                    match (r.tls, r.resume) {
                        (false, _) => "no TLS",
                        (true, false) => "full",
                        (true, true) => "resumed",
                    },
                    spread(r.per_sec(), 0, 1.0),
                    r.per_core_sec().map_or("–".into(), |v| spread(v, 0, 1.0)),
                    each(|h| h.server_user_us),
                    each(|h| h.server_sys_us),
                    sum(|h| h.resumed),
                    sum(|h| h.completed),
                    sum(|h| h.failed),
                );
            }
        }
        for c in &self.connections {
            let _ = writeln!(s, "\n### connections: {}\n", c.server);
            s.push_str("| connections | connected | failed (causes) | connect ms | conn/s | RSS before KiB | RSS open KiB | RSS closed KiB | KiB/conn | kernel KiB/conn |\n|---|---|---|---|---|---|---|---|---|---|\n");
            let opt = |v: Option<u64>| v.map_or("–".into(), |v| v.to_string());
            let kib = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
            for st in &c.steps {
                let causes = if st.failed == 0 || st.causes.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", st.causes)
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {}{causes} | {:.0} | {:.0} | {} | {} | {} | {} | {} |",
                    st.count,
                    st.connected,
                    st.failed,
                    st.connect_ms,
                    st.connects_per_sec,
                    opt(st.rss_before_kib),
                    opt(st.rss_open_kib),
                    opt(st.rss_closed_kib),
                    kib(st.kib_per_conn),
                    kib(st.kernel_kib_per_conn),
                );
            }
            for st in c.steps.iter().filter(|st| !st.closed_by_server.is_empty()) {
                let codes: Vec<String> =
                    st.closed_by_server.iter().map(|(code, n)| format!("{code} ×{n}")).collect();
                let _ = writeln!(
                    s,
                    "\n{} connections: the server closed {} in {:.2} s",
                    st.count,
                    codes.join(", "),
                    st.drain_seconds.unwrap_or(0.0)
                );
            }
            if !c.cycle_rss_kib.is_empty() {
                let cycles: Vec<String> = c.cycle_rss_kib.iter().map(u64::to_string).collect();
                let _ = writeln!(
                    s,
                    "\nRSS KiB at baseline and after each connect/close cycle: {}",
                    cycles.join(" → ")
                );
            }
        }
        if !self.slow_consumers.is_empty() {
            s.push_str("\n### slow consumer (one client writes and never reads; an innocent client pings meanwhile)\n\n");
            s.push_str("| server | size B | slow client | MiB written | server RSS KiB start → max → end | innocent msg/s | innocent p50 µs | p99 µs | p99.9 µs | max µs |\n|---|---|---|---|---|---|---|---|---|---|\n");
            for (server, o) in &self.slow_consumers {
                let rss = match (o.rss_kib.first(), o.rss_kib.iter().max(), o.rss_kib.last()) {
                    (Some(a), Some(m), Some(z)) => format!("{a} → {m} → {z}"),
                    _ => "–".into(),
                };
                let l = o.innocent.latency_us;
                let _ = writeln!(
                    s,
                    "| {server} | {} | {} | {:.1} | {rss} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
                    o.size,
                    o.verdict,
                    o.bytes_written as f64 / (1024.0 * 1024.0),
                    o.innocent.msgs_per_sec,
                    l[0],
                    l[1],
                    l[2],
                    l[3],
                );
            }
        }
        if let Some((w, outcomes)) = &self.simulation {
            let _ = writeln!(
                s,
                "\n### buffers: simulation ({:.1} h simulated, {} clients × {} FPS × {} B, budget {} KiB, seed {})\n",
                w.seconds as f64 / 3600.0,
                w.producers,
                w.fps,
                w.frame_bytes,
                w.budget >> 10,
                w.seed
            );
            s.push_str("| allocator | buffer KiB | allocation success % | frames delivered % | refused | lost while disconnected | delivered FPS per client | pattern switch ms p50 / p99 / max | switches done/started | fragmentation mean / max / end | slack % mean / at peak | fixed metadata KiB | peak taken KiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
            for o in outcomes {
                let size = if o.size == 0 { "exact".into() } else { format!("{}", o.size >> 10) };
                let l = o.pattern_latency_ms;
                let f = o.fragmentation;
                let _ = writeln!(
                    s,
                    "| {} | {size} | {:.2} | {:.2} | {} | {} | {:.2} | {:.0} / {:.0} / {:.0} | {}/{} | {:.2} / {:.2} / {:.2} | {:.1} / {:.1} | {:.1} | {:.0} |",
                    o.allocator,
                    o.success_rate() * 100.0,
                    o.frames_delivered as f64 * 100.0 / o.frames_offered.max(1) as f64,
                    o.frames_refused,
                    o.frames_lost_disconnected,
                    o.delivered_fps,
                    l[0],
                    l[1],
                    l[2],
                    o.pattern_switches.0,
                    o.pattern_switches.1,
                    f[0],
                    f[1],
                    f[2],
                    o.overhead * 100.0,
                    o.slack_at_peak * 100.0,
                    o.metadata_bytes as f64 / 1024.0,
                    o.peak_taken as f64 / 1024.0,
                );
            }
        }
        for run in &self.soaks {
            s.push_str(&run.markdown());
        }
        if let Some(first) = self.broadcasts.first() {
            let _ = writeln!(
                s,
                "\n### broadcast (one publisher, up to {} messages in flight; latency: publish to the last subscriber)\n",
                first.window
            );
            s.push_str("| subscribers | size B | server | messages | deliveries/s | first server ÷ this | last subscriber p50 ms | p99 ms | max ms | server CPU ns/delivery (user, sys) |\n|---|---|---|---|---|---|---|---|---|---|\n");
            for (i, r) in self.broadcasts.iter().enumerate() {
                // The first server's run of the same case in the same round: the latest one
                // up to this row (servers run in turn within a round).
                let base = self.broadcasts[..=i].iter().rev().find(|o| {
                    o.server == first.server
                        && (o.subscribers, o.size, o.window) == (r.subscribers, r.size, r.window)
                });
                let ratio = match base {
                    Some(o) if o.server != r.server && r.deliveries_per_sec > 0.0 => {
                        format!("{:.2}", o.deliveries_per_sec / r.deliveries_per_sec)
                    }
                    _ => "–".into(),
                };
                let l = r.latency_ms;
                let cpu = match r.cpu_ns_per_delivery() {
                    Some((cpu, sys)) => format!("{cpu:.0} ({:.0}, {sys:.0})", cpu - sys),
                    None => "–".into(),
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {:.0} | {ratio} | {:.2} | {:.2} | {:.2} | {cpu} |",
                    r.subscribers,
                    r.size,
                    r.server,
                    r.messages,
                    r.deliveries_per_sec,
                    l[0],
                    l[1],
                    l[2]
                );
            }
            if self.broadcasts.iter().any(|r| r.shards > 0) {
                s.push_str(
                    "\nSharded runs: subscribers held by child processes, every publication written \
                     to each server; memory at the end, every subscriber still connected.\n\n\
                     | server | subscribers | shards | servers | non-readers | reader deliveries \
                     | drops | servers' RSS MiB | their kernel memory charged MiB \
                     | host TCP buffers MiB | budget MiB |\n\
                     |---|---|---|---|---|---|---|---|---|---|---|\n",
                );
                let mib = |k: Option<u64>| {
                    k.map_or("–".into(), |k| format!("{:.1}", k as f64 / 1024.0))
                };
                for r in self.broadcasts.iter().filter(|r| r.shards > 0) {
                    let drops = match &r.drops {
                        None => "–".to_string(),
                        Some(d) => {
                            let nonzero: Vec<String> = d
                                .iter()
                                .filter(|(_, v)| *v > 0)
                                .map(|(series, v)| format!("{series} {v}"))
                                .collect();
                            if nonzero.is_empty() { "0".into() } else { nonzero.join(", ") }
                        }
                    };
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} | {} | {} | {drops} | {} | {} | {} | {} |",
                        r.server,
                        r.subscribers,
                        r.shards,
                        r.servers,
                        r.non_readers,
                        r.reader_deliveries,
                        mib(r.servers_rss_kib),
                        mib(r.kernel_charged_kib),
                        mib(r.tcp_buffers_kib),
                        mib(r.budget_kib)
                    );
                }
            }
        }
        if let Some(first) = self.watermarks.first() {
            let _ = writeln!(
                s,
                "\n### watermarks ({} B requests; mean of measured iterations ± 99.9 % confidence interval, Student's t)\n",
                first.size
            );
            s.push_str("| server | low/high KiB | mode | ops/iteration | cnt | score ops/s | error ± (99.9 %) | CI (99.9 %) | min | max | stdev | lost |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
            for r in &self.watermarks {
                let c = r.score;
                let (lo, hi) = c.interval();
                let _ = writeln!(
                    s,
                    "| {} | {}/{} | {} | {} | {} | {:.0} | ± {:.0} | [{:.0}, {:.0}] | {:.0} | {:.0} | {:.0} | {} |",
                    r.server,
                    r.low >> 10,
                    r.high >> 10,
                    r.mode,
                    r.ops_per_iteration,
                    c.n,
                    c.mean,
                    c.error,
                    lo,
                    hi,
                    c.min,
                    c.max,
                    c.stdev,
                    r.lost,
                );
            }
        }
        s.push_str(&self.latency.markdown());
        s
    }

    /// One CSV line per broadcast run.
    pub fn broadcasts_csv(&self) -> String {
        let mut s = String::from(
            "server,subscribers,size,window,messages,deliveries_per_sec,p50_ms,p99_ms,max_ms,server_cpu_ns_per_delivery,server_sys_ns_per_delivery\n",
        );
        for r in &self.broadcasts {
            let l = r.latency_ms;
            let _ = writeln!(
                s,
                "{},{},{},{},{},{:.1},{:.3},{:.3},{:.3},{}",
                r.server,
                r.subscribers,
                r.size,
                r.window,
                r.messages,
                r.deliveries_per_sec,
                l[0],
                l[1],
                l[2],
                r.cpu_ns_per_delivery()
                    .map_or(",".into(), |(cpu, sys)| format!("{cpu:.1},{sys:.1}")),
            );
        }
        s
    }

    /// One CSV line per watermark iteration, warm-up included (`measured` says which).
    pub fn watermarks_csv(&self) -> String {
        let mut s = String::from(
            "server,low,high,mode,size,ops_per_iteration,iteration,measured,ops_per_sec\n",
        );
        for r in &self.watermarks {
            let all =
                r.warmup.iter().map(|v| (false, v)).chain(r.iterations.iter().map(|v| (true, v)));
            for (i, (measured, v)) in all.enumerate() {
                let _ = writeln!(
                    s,
                    "{},{},{},{},{},{},{},{},{:.1}",
                    r.server,
                    r.low,
                    r.high,
                    r.mode,
                    r.size,
                    r.ops_per_iteration,
                    i + 1,
                    measured,
                    v
                );
            }
        }
        s
    }

    /// One CSV line per load run (every repeat, not only the medians).
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "experiment,server,clients,in_flight,size,run,sent,received,failed,seconds,msgs_per_sec,mib_per_sec,p50_us,p99_us,p999_us,max_us,client_cpu,server_cpu_us_per_msg,server_rss_kib,server_sys_us_per_msg\n",
        );
        for r in &self.loads {
            for (i, m) in r.runs.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "{},{},{},{},{},{},{},{},{},{:.3},{:.1},{:.3},{:.1},{:.1},{:.1},{:.1},{:.3},{},{},{}",
                    r.experiment,
                    r.server,
                    r.clients,
                    r.in_flight,
                    r.size,
                    i + 1,
                    m.sent,
                    m.received,
                    m.failed,
                    m.seconds,
                    m.msgs_per_sec,
                    m.mib_per_sec,
                    m.latency_us[0],
                    m.latency_us[1],
                    m.latency_us[2],
                    m.latency_us[3],
                    m.client_cpu,
                    m.server_cpu_us_per_msg.map_or(String::new(), |v| format!("{v:.3}")),
                    m.server_rss_kib.map_or(String::new(), |v| v.to_string()),
                    m.server_sys_us_per_msg.map_or(String::new(), |v| format!("{v:.3}")),
                );
            }
        }
        s
    }
}

impl Report {
    /// The buffers study as CSV: one line per simulated configuration and sample, then one
    /// per soak sample (each part with its own header line).
    pub fn buffers_csv(&self) -> String {
        let mut s = String::new();
        if let Some((_, outcomes)) = &self.simulation {
            s.push_str("allocator,size,t_s,fragmentation,taken,payload,free,largest_free\n");
            for o in outcomes {
                for x in &o.samples {
                    let _ = writeln!(
                        s,
                        "{},{},{},{:.4},{},{},{},{}",
                        o.allocator,
                        o.size,
                        x.t,
                        x.fragmentation,
                        x.taken,
                        x.payload,
                        x.free,
                        x.largest_free
                    );
                }
            }
        }
        for (i, run) in self.soaks.iter().enumerate() {
            let csv = run.csv();
            // One header line for all runs.
            s.push_str(if i == 0 {
                &csv
            } else {
                csv.split_once('\n').map_or("", |(_, rest)| rest)
            });
        }
        s
    }
}

/// `median [min–max]`, each scaled by `scale`, with `digits` decimals.
fn spread(s: Spread, digits: usize, scale: f64) -> String {
    format!("{:.d$} [{:.d$}–{:.d$}]", s.median * scale, s.min * scale, s.max * scale, d = digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_median_min_max() {
        assert_eq!(Spread::of([3.0, 1.0, 2.0]), Spread { median: 2.0, min: 1.0, max: 3.0 });
        assert_eq!(Spread::of([4.0, 1.0]).median, 2.5);
        assert_eq!(Spread::of([]), Spread::default());
    }

    /// Interleaved rounds (`bench broadcast --peers A,B --repeat 2`): each server is compared
    /// with the first server's run of the same case in its own round, not the first round's.
    #[test]
    fn a_broadcast_is_compared_within_its_round() {
        let row = |server: &str, rate: f64| crate::broadcast::BroadcastRow {
            server: server.into(),
            subscribers: 1000,
            size: 64,
            window: 16,
            deliveries_per_sec: rate,
            ..Default::default()
        };
        let report = Report {
            broadcasts: vec![row("a", 100.0), row("b", 50.0), row("a", 300.0), row("b", 200.0)],
            ..Report::default()
        };
        let markdown = report.markdown();
        let ratios: Vec<&str> = markdown
            .lines()
            .filter(|l| l.starts_with("| 1000 "))
            .map(|l| l.split('|').nth(6).unwrap().trim())
            .collect();
        assert_eq!(ratios, ["–", "2.00", "–", "1.50"], "{markdown}");
    }
}
