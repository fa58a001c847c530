//! A reconnect storm: a crowd of connections is opened, then cut all at once (each socket
//! reset, as a network failure or a load balancer's failover leaves them), and every client
//! comes back as a well-behaved client does — after a jittered wait, doubling after each
//! failure, and no sooner than a refusal's `Retry-After` asks. Measured per round: the time
//! until every client is back, the attempts it took, what refused or failed them, and the
//! server's memory (its RSS and the host's socket memory) at its peak during the storm.
//!
//! Built on the [`crowd`] generator's pieces: one thread, one `mio` poll, a
//! non-blocking socket and a few bytes of state per client.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use freeboard::kernel_memory::KernelFigures;
use mio::{Events, Interest, Poll, Token};

use crate::Target;
use crate::crowd::{self, Answer, Gathered};
use crate::process::Sample;

/// What to open, how often to cut it, and how the clients come back.
#[derive(Debug, Clone)]
pub struct Storm {
    /// The server (`ws://`).
    pub target: Target,
    /// Clients.
    pub count: usize,
    /// Cuts: each resets every connection at once and waits until all are back.
    pub rounds: usize,
    /// Most clients between `connect` and their 101 at once.
    pub in_flight: usize,
    /// Loopback source addresses, used in turn (see [`crowd::Crowd::sources`]).
    pub sources: Vec<Ipv4Addr>,
    /// A client's first wait after its connection was cut; each failed attempt doubles it.
    /// The wait is drawn between half and all of the step ("equal jitter"), as
    /// [`freeboard::client::resume::Backoff`] does.
    pub initial: Duration,
    /// The longest step.
    pub max: Duration,
    /// A client not in by then (from its `connect`) has failed this attempt ("timeout").
    pub connect_timeout: Duration,
    /// How long everyone stays connected before each cut.
    pub hold: Duration,
    /// A round that has not brought everyone back by then ends with the rest counted.
    pub round_deadline: Duration,
    /// The server's PID: its RSS is sampled through the storm.
    pub server_pid: Option<u32>,
    /// Seeds the jitter.
    pub seed: u64,
}

impl Storm {
    /// `count` clients of `target`, three cuts, 250 ms doubling to 30 s.
    pub fn new(target: Target, count: usize) -> Self {
        Storm {
            target,
            count,
            rounds: 3,
            in_flight: 4096,
            sources: Vec::new(),
            initial: Duration::from_millis(250),
            max: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            hold: Duration::from_secs(1),
            round_deadline: Duration::from_secs(300),
            server_pid: None,
            seed: 1,
        }
    }
}

/// One round: the first connect (round 0) or a cut and the return.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Round {
    /// 0 for the first connect, then 1, 2… for each cut.
    pub round: usize,
    /// Clients back (upgraded) by the end of the round.
    pub back: usize,
    /// Seconds from the cut (or the start) to the last client back.
    pub seconds_to_all: f64,
    /// Connection attempts made, the successful ones included.
    pub attempts: u64,
    /// Attempts answered with another status than 101, by status.
    pub refused: BTreeMap<u16, u64>,
    /// Of those, answers that carried `Retry-After`.
    pub refused_with_retry_after: u64,
    /// Attempts that failed before an answer, by cause.
    pub failed: BTreeMap<String, u64>,
    /// Clients back over time: `(seconds, back)`, every 250 ms.
    pub timeline: Vec<(f64, usize)>,
    /// The server's RSS before the round, KiB.
    pub rss_before_kib: Option<u64>,
    /// Its RSS at its highest during the round (sampled every 250 ms), KiB.
    pub rss_peak_kib: Option<u64>,
    /// The host's socket slab memory at its highest during the round over its level with
    /// no client connected, halved (both ends of each connection are on this host), KiB:
    /// the kernel's share of the server's connections.
    pub kernel_peak_kib: Option<u64>,
}

/// What a client is doing. A few bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for its next attempt (in the timer heap).
    Waiting,
    /// `connect` in progress since the given millisecond of the run.
    Connecting(u32),
    /// Request sent; the answer's head is being read.
    Answering { matched: u8, status_read: bool, since: u32 },
    /// Upgraded.
    Open,
}

struct Client {
    stream: Option<mio::net::TcpStream>,
    phase: Phase,
    /// The current backoff step, in milliseconds.
    step_ms: u32,
}

/// Runs the storm; `progress` sees each round's `(round, back, connecting, refused so far)`
/// about once a second.
pub fn run(
    storm: &Storm,
    progress: &mut dyn FnMut(usize, usize, usize, u64),
) -> io::Result<Vec<Round>> {
    if storm.target.tls || storm.target.raw {
        return Err(io::Error::other("a storm speaks ws:// only"));
    }
    let SocketAddr::V4(dest) = storm.target.addr else {
        return Err(io::Error::other("a storm connects to an IPv4 address"));
    };
    let request = crowd::request_bytes(&storm.target)?;
    let initial_ms = storm.initial.as_millis().max(1) as u32;
    let max_ms = storm.max.as_millis().max(u128::from(initial_ms)) as u32;
    let mut run = Run {
        poll: Poll::new()?,
        clients: (0..storm.count)
            .map(|_| Client { stream: None, phase: Phase::Waiting, step_ms: initial_ms })
            .collect(),
        due: BinaryHeap::new(),
        start: Instant::now(),
        rng: storm.seed | 1,
        buf: vec![0u8; 64 * 1024],
        partial: BTreeMap::new(),
        dest,
        request,
        initial_ms,
        max_ms,
    };
    let baseline = KernelFigures::read().socket_slab_bytes;
    let mut rounds = Vec::with_capacity(storm.rounds + 1);
    for round in 0..=storm.rounds {
        if round > 0 {
            std::thread::sleep(storm.hold);
        }
        // Everyone at once: the first connect is a storm of its own; after a cut, each
        // client waits its first jittered step.
        let began = run.now_ms();
        for i in 0..storm.count {
            let wait = if round == 0 {
                0
            } else {
                run.cut(i);
                run.clients[i].step_ms = initial_ms;
                run.next_wait(i)
            };
            run.due.push(Reverse((began + wait, i)));
        }
        rounds.push(run.round(storm, round, baseline, progress)?);
    }
    Ok(rounds)
}

struct Run {
    poll: Poll,
    clients: Vec<Client>,
    /// Clients waiting for their next attempt: `(due millisecond, index)`.
    due: BinaryHeap<Reverse<(u32, usize)>>,
    start: Instant,
    rng: u64,
    buf: Vec<u8>,
    /// Frame bytes a client that is back got in pieces (rare: control frames are small).
    partial: BTreeMap<usize, Vec<u8>>,
    dest: SocketAddrV4,
    request: Vec<u8>,
    initial_ms: u32,
    max_ms: u32,
}

impl Run {
    fn now_ms(&self) -> u32 {
        self.start.elapsed().as_millis() as u32
    }

    /// The jittered wait before client `i`'s next attempt, and its step doubled.
    fn next_wait(&mut self, i: usize) -> u32 {
        let step = self.clients[i].step_ms;
        self.clients[i].step_ms = step.saturating_mul(2).min(self.max_ms);
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let draw = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        let fraction = draw as f64 / (1u64 << 53) as f64;
        (f64::from(step) * (0.5 + 0.5 * fraction)) as u32
    }

    /// Resets client `i`'s connection, if it has one (`SO_LINGER` 0: an RST, as a network
    /// failure leaves the server to find out).
    fn cut(&mut self, i: usize) {
        if let Some(stream) = self.clients[i].stream.take() {
            let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
            let _ = self.poll.registry().deregister(&mut { stream });
        }
        self.clients[i].phase = Phase::Waiting;
        self.partial.remove(&i);
    }

    /// Client `i`'s attempt failed (`why`) or was refused: it waits and tries again.
    fn retry(&mut self, i: usize, at_least_ms: u32) {
        self.cut(i);
        let wait = self.next_wait(i).max(at_least_ms);
        self.due.push(Reverse((self.now_ms() + wait, i)));
    }

    fn round(
        &mut self,
        storm: &Storm,
        round: usize,
        baseline: Option<u64>,
        progress: &mut dyn FnMut(usize, usize, usize, u64),
    ) -> io::Result<Round> {
        let sample = || storm.server_pid.and_then(|pid| Sample::of(pid).ok()).map(|s| s.rss_kib);
        let mut out = Round { round, rss_before_kib: sample(), ..Round::default() };
        let began = self.now_ms();
        let deadline = began + storm.round_deadline.as_millis() as u32;
        let timeout_ms = storm.connect_timeout.as_millis() as u32;
        let mut events = Events::with_capacity(4096);
        let mut back = self.clients.iter().filter(|c| c.phase == Phase::Open).count();
        let mut connecting = 0usize;
        let mut last_back = began;
        let mut next_sample = began;
        let mut next_progress = began + 1000;
        let mut next_timeouts = began + 100;
        let mut kernel_peak = None::<u64>;
        let mut scratch = Gathered::default();
        while back < storm.count {
            let now = self.now_ms();
            if now >= deadline {
                break;
            }
            if now >= next_sample {
                out.timeline.push((f64::from(now - began) / 1e3, back));
                out.rss_peak_kib = out.rss_peak_kib.max(sample());
                kernel_peak = kernel_peak.max(KernelFigures::read().socket_slab_bytes);
                next_sample = now + 250;
            }
            if now >= next_progress {
                progress(round, back, connecting, out.refused.values().sum());
                next_progress = now + 1000;
            }
            // Attempts that are due, as the in-flight bound allows.
            while connecting < storm.in_flight
                && let Some(&Reverse((at, i))) = self.due.peek()
                && at <= now
            {
                self.due.pop();
                out.attempts += 1;
                let source =
                    (!storm.sources.is_empty()).then(|| storm.sources[i % storm.sources.len()]);
                match crowd::connect(source, SocketAddr::V4(self.dest)) {
                    Ok(mut stream) => {
                        self.poll.registry().register(
                            &mut stream,
                            Token(i),
                            Interest::READABLE | Interest::WRITABLE,
                        )?;
                        self.clients[i].stream = Some(stream);
                        self.clients[i].phase = Phase::Connecting(now);
                        connecting += 1;
                    }
                    Err(e) => {
                        *out.failed.entry(crowd::errno_name(&e)).or_default() += 1;
                        self.retry(i, 0);
                    }
                }
            }
            self.poll.poll(&mut events, Some(Duration::from_millis(5)))?;
            for event in events.iter() {
                let i = event.token().0;
                let client = &mut self.clients[i];
                let Some(stream) = client.stream.as_mut() else { continue };
                let outcome = match client.phase {
                    Phase::Waiting | Phase::Open => {
                        // A client that is back answers pings and notices a close.
                        if client.phase != Phase::Open
                            || !(event.is_readable() || event.is_read_closed())
                        {
                            continue;
                        }
                        let partial = self.partial.entry(i).or_default();
                        let closed = crowd::hold_read(stream, &mut self.buf, partial, &mut scratch);
                        if partial.is_empty() {
                            self.partial.remove(&i);
                        }
                        if closed.is_some() {
                            // The server closed it during the round: it comes back too.
                            back -= 1;
                            self.retry(i, 0);
                        }
                        continue;
                    }
                    Phase::Connecting(since) => {
                        if event.is_error() || event.is_write_closed() {
                            let e = stream.take_error().ok().flatten().unwrap_or_else(|| {
                                io::Error::from_raw_os_error(libc::ECONNREFUSED)
                            });
                            Answer::Failed(crowd::errno_name(&e))
                        } else if !event.is_writable() {
                            continue;
                        } else {
                            match io::Write::write(stream, &self.request) {
                                Ok(n) if n == self.request.len() => {
                                    client.phase =
                                        Phase::Answering { matched: 0, status_read: false, since };
                                    continue;
                                }
                                Ok(_) => Answer::Failed("short write".into()),
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                                Err(e) => Answer::Failed(crowd::errno_name(&e)),
                            }
                        }
                    }
                    Phase::Answering { matched, status_read, since } => {
                        if !event.is_readable() && !event.is_read_closed() && !event.is_error() {
                            continue;
                        }
                        match crowd::read_answer(stream, &mut self.buf, matched, status_read, false)
                        {
                            Answer::More(matched) => {
                                client.phase =
                                    Phase::Answering { matched, status_read: true, since };
                                continue;
                            }
                            Answer::Wait => continue,
                            answer => answer,
                        }
                    }
                };
                connecting -= 1;
                match outcome {
                    Answer::Open => {
                        self.clients[i].phase = Phase::Open;
                        self.clients[i].step_ms = self.initial_ms;
                        back += 1;
                        last_back = self.now_ms();
                    }
                    Answer::Refused { status, retry_after } => {
                        *out.refused.entry(status).or_default() += 1;
                        out.refused_with_retry_after += u64::from(retry_after.is_some());
                        let asked = retry_after.unwrap_or(0).saturating_mul(1000);
                        self.retry(i, asked.min(u64::from(u32::MAX)) as u32);
                    }
                    Answer::Failed(why) => {
                        *out.failed.entry(why).or_default() += 1;
                        self.retry(i, 0);
                    }
                    Answer::Wait | Answer::More(_) => unreachable!("handled above"),
                }
            }
            // Attempts past the connect timeout fail (looked for ten times a second).
            let now = self.now_ms();
            if now < next_timeouts {
                continue;
            }
            next_timeouts = now + 100;
            for i in 0..self.clients.len() {
                let since = match self.clients[i].phase {
                    Phase::Connecting(since) | Phase::Answering { since, .. } => since,
                    _ => continue,
                };
                if now - since >= timeout_ms {
                    *out.failed.entry("timeout".into()).or_default() += 1;
                    connecting -= 1;
                    self.retry(i, 0);
                }
            }
        }
        // The last sample, with everyone back (a round may end between two samples).
        out.rss_peak_kib = out.rss_peak_kib.max(sample());
        kernel_peak = kernel_peak.max(KernelFigures::read().socket_slab_bytes);
        out.back = back;
        out.seconds_to_all = f64::from(last_back.max(began) - began) / 1e3;
        out.timeline.push((f64::from(self.now_ms() - began) / 1e3, back));
        out.kernel_peak_kib =
            kernel_peak.zip(baseline).map(|(peak, base)| peak.saturating_sub(base) / 2 / 1024);
        Ok(out)
    }
}

/// The rounds as a Markdown table, with the server's budget beside its peak when given.
pub fn markdown(storm: &Storm, rounds: &[Round], budget_kib: Option<u64>) -> String {
    let mut out = format!(
        "Reconnect storm: {} clients of {}, cut {} times (reset at once), back after \
         {:?} doubling to {:?} (equal jitter), no sooner than Retry-After\n\n\
         | round | back | time to all back | attempts | refused | with Retry-After | failed | \
         server RSS peak | kernel peak | RSS + kernel vs budget |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        storm.count, storm.target, storm.rounds, storm.initial, storm.max
    );
    for r in rounds {
        let refused: Vec<String> = r.refused.iter().map(|(s, n)| format!("{s} ×{n}")).collect();
        let failed: Vec<String> = r.failed.iter().map(|(w, n)| format!("{w} ×{n}")).collect();
        let kib =
            |k: Option<u64>| k.map_or("-".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
        let within = match (r.rss_peak_kib, r.kernel_peak_kib, budget_kib) {
            (Some(rss), Some(kernel), Some(budget)) => {
                format!("{:.2}×", (rss + kernel) as f64 / budget as f64)
            }
            _ => "-".into(),
        };
        out += &format!(
            "| {} | {} of {} | {:.2} s | {} | {} | {} | {} | {} | {} | {} |\n",
            if r.round == 0 { "first connect".to_string() } else { format!("cut {}", r.round) },
            r.back,
            storm.count,
            r.seconds_to_all,
            r.attempts,
            if refused.is_empty() { "none".into() } else { refused.join(", ") },
            r.refused_with_retry_after,
            if failed.is_empty() { "none".into() } else { failed.join(", ") },
            kib(r.rss_peak_kib),
            kib(r.kernel_peak_kib),
            within,
        );
    }
    out
}

/// The rounds as JSON.
pub fn json(rounds: &[Round]) -> String {
    serde_json::to_string_pretty(rounds).expect("rounds serialize")
}
