//! Latency at a fixed rate, measured the way a user feels it: an open-loop generator (as
//! wrk2 and k6's constant-arrival-rate executor) and a sweep for the highest rate whose p99
//! stays under a bound ("capacity at p99 < 1 ms").
//!
//! A closed-loop generator (the [`load`](crate::load) experiments) sends the next message when
//! an echo comes back, so a server that stalls for 100 ms delays one message and the
//! generator politely sends nothing meanwhile: the stall shows as one slow sample among
//! thousands (coordinated omission). Here each message has an *intended* send time fixed in
//! advance — message `j` of the run at `start + j / total rate`, to connection `j mod N`, so
//! every connection sends at the same rate, staggered — and is sent then whether or not the
//! earlier ones have come back. Its round trip is timed from that intended time, so a stall
//! counts for every message it held up, and so does any lateness of the generator itself
//! (reported apart as the send lag: intended time to the frame's last byte handed to the
//! kernel).
//!
//! The generator sleeps on a `timerfd` armed for the next intended send (nanosecond
//! resolution; `epoll_wait`'s millisecond timeout would make every send up to 1 ms late) and
//! reuses its connections for every run of a sweep. Every frame is the same masked frame, so
//! a backlog is a count, not a buffer: a server that falls behind costs the generator 16 bytes
//! per message owed.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use freeboard_proto::{Connection, Event, Instant as ProtoInstant, State};
use freeboard_test::encode_frame;
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use serde::{Deserialize, Serialize};

use crate::Target;
use crate::load::{Rng, echo_reader, open};
use crate::process::{Sample, own_cpu_time};
use crate::spread::Spread;

/// The connections of the open-loop generator, opened once and reused by every run.
pub struct Generator {
    poll: Poll,
    events: Events,
    timer: Timer,
    clients: Vec<Client>,
    /// [`BURST`] copies of the one masked frame every message is.
    burst: Vec<u8>,
    frame_len: usize,
    size: usize,
    /// The read buffer shared by all connections.
    buf: Vec<u8>,
    /// Messages scheduled and not yet echoed, all connections (an earlier run's included).
    /// Invariant: the sum of the live clients' `outstanding` lengths.
    owed: u64,
}

/// What one run at a fixed rate measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FixedRate {
    /// Connections sending.
    pub connections: usize,
    /// Payload bytes per message.
    pub size: usize,
    /// The rate asked for, messages per second, all connections together.
    pub target_rate: f64,
    /// Echoes received per second over the measured window.
    pub achieved_rate: f64,
    /// Whether the achieved rate came within 3 % of the target.
    pub reached: bool,
    /// The measured window (the run less its warm-up), seconds.
    pub seconds: f64,
    /// Messages scheduled over the whole run.
    pub sent: u64,
    /// Echoes received.
    pub received: u64,
    /// Measured messages still unanswered when the run gave up waiting: each is in the
    /// histogram with the time it had waited by then (a lower bound).
    pub unanswered: u64,
    /// Echoes whose length differed from what was sent, or that answered nothing sent.
    pub mismatched: u64,
    /// Round trip from the intended send time, µs (coordinated omission corrected).
    pub latency_us: Percentiles,
    /// From the intended send time to the frame written to the socket, µs: the generator's
    /// own lateness, and the server's when its socket stops taking bytes.
    pub send_lag_us: Percentiles,
    /// The generator's CPU time over wall time (1.0: one core busy).
    pub generator_cpu: f64,
    /// The server's CPU time over wall time, when its PID is known.
    pub server_cpu: Option<f64>,
    /// The server's CPU time per echo, µs, when its PID is known: unlike the percentiles it
    /// barely moves when other work shares the host.
    #[serde(default)]
    pub server_cpu_us_per_msg: Option<f64>,
    /// Connections failed by the end of the run (in an earlier run of the same generator
    /// included: they send no more), by why.
    pub failures: Vec<(String, usize)>,
}

/// Percentiles of one histogram, µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// The median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// The largest sample.
    pub max: f64,
}

/// How [`sweep`] searches for the capacity under a bound.
#[derive(Debug, Clone)]
pub struct SweepPlan {
    /// The p99 a rate must stay under.
    pub bound: Duration,
    /// The first total rate tried, messages per second.
    pub from: f64,
    /// Bisection stops once the highest passing rate and the lowest failing one are within
    /// this factor (1.1: 10 %).
    pub resolution: f64,
    /// Most runs per sweep.
    pub max_steps: usize,
    /// Length of each run.
    pub duration: Duration,
    /// Its first part, sent but not measured.
    pub warmup: Duration,
}

/// One sweep: every run it made and the capacity it found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    /// The p99 bound, µs.
    pub bound_us: f64,
    /// Every run, in the order made.
    pub steps: Vec<FixedRate>,
    /// The highest total rate that passed (achieved, p99 under the bound, nothing lost), msg/s;
    /// 0 when none did.
    pub capacity: f64,
    /// The lowest total rate that failed; `None` when the sweep ran out of steps first (the
    /// capacity is then a lower bound).
    pub failed_at: Option<f64>,
}

/// How long a run waits for the echoes still owed after its last intended send.
const DRAIN: Duration = Duration::from_secs(2);

/// How long a run waits for an earlier run's echoes before starting.
const SETTLE: Duration = Duration::from_secs(10);

/// Frames one write may carry.
const BURST: usize = 16;

/// Below this the generator polls instead of arming its timer: a timer wake-up costs about
/// as much.
const SPIN: Duration = Duration::from_micros(20);

const TIMER: Token = Token(usize::MAX);

impl Generator {
    /// Opens `connections` to `target` (handshakes one after the other) for messages of
    /// `size` payload bytes. Plain `ws://` and `tcp://` only.
    pub fn connect(target: &Target, connections: usize, size: usize) -> io::Result<Self> {
        let mut rng = Rng::seeded();
        let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut frame = vec![0u8; size + 14];
        let n =
            encode_frame(0x82, &payload, Some(rng.mask()), &mut frame).map_err(io::Error::other)?;
        frame.truncate(n);
        let poll = Poll::new()?;
        let timer = Timer::new()?;
        poll.registry().register(&mut SourceFd(&timer.0.as_raw_fd()), TIMER, Interest::READABLE)?;
        let mut clients = Vec::with_capacity(connections);
        for i in 0..connections {
            let (stream, leftover) = open(target, Duration::from_secs(5), &mut rng)
                .map_err(|e| io::Error::new(e.kind(), format!("connection {i}: {e}")))?;
            if !leftover.is_empty() {
                return Err(io::Error::other(format!("{target} sent data before any message")));
            }
            stream.set_nonblocking(true)?;
            let mut stream = TcpStream::from_std(stream);
            poll.registry().register(
                &mut stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            clients.push(Client {
                stream,
                rx: echo_reader(target, size),
                outstanding: VecDeque::new(),
                unsent: 0,
                offset: 0,
                partial: 0,
                queued: false,
                failure: None,
            });
        }
        Ok(Self {
            poll,
            events: Events::with_capacity(1024),
            timer,
            clients,
            burst: frame.repeat(BURST),
            frame_len: frame.len(),
            size,
            buf: vec![0u8; 256 * 1024],
            owed: 0,
        })
    }

    /// Connections open and not failed.
    pub fn live(&self) -> usize {
        self.clients.iter().filter(|c| c.failure.is_none()).count()
    }

    /// Sends `rate` messages per second on every connection for `duration`, measuring all
    /// but the first `warmup`, then waits up to 2 s for the echoes still owed.
    /// `server_pid` is sampled for its CPU time.
    pub fn run(
        &mut self,
        rate: f64,
        duration: Duration,
        warmup: Duration,
        server_pid: Option<u32>,
    ) -> io::Result<FixedRate> {
        self.settle()?;
        let n = self.clients.len();
        let total_rate = rate * n as f64;
        if !(total_rate > 0.0 && total_rate.is_finite()) || n == 0 {
            return Err(io::Error::other(format!("no rate to send at: {total_rate} msg/s")));
        }
        let count = (total_rate * duration.as_secs_f64()).round() as u64;
        let server_before = server_pid.and_then(|pid| Sample::of(pid).ok());
        let cpu_before = own_cpu_time();
        let start = Instant::now();
        let end = start + duration;
        let from = start + warmup.min(duration / 2);
        let mut tally = Tally::measuring(from, end)?;
        let intended = |j: u64| start + Duration::from_secs_f64(j as f64 / total_rate);
        let (mut next, mut next_at) = (0u64, start);
        let mut writes: Vec<usize> = Vec::new();
        let mut sent = 0u64;
        loop {
            let now = Instant::now();
            while next < count && next_at <= now {
                let c = (next % n as u64) as usize;
                let client = &mut self.clients[c];
                if client.failure.is_none() {
                    client.outstanding.push_back(next_at);
                    client.unsent += 1;
                    self.owed += 1;
                    sent += 1;
                    if !client.queued {
                        client.queued = true;
                        writes.push(c);
                    }
                }
                next += 1;
                next_at = intended(next);
            }
            for c in writes.drain(..) {
                let client = &mut self.clients[c];
                client.queued = false;
                client.flush(&self.burst, self.frame_len, &mut tally);
                self.owed -= client.forget_if_failed();
            }
            if next == count && self.owed == 0 {
                break;
            }
            if now >= end + DRAIN {
                break;
            }
            let timeout = if next < count {
                let wait = next_at.saturating_duration_since(Instant::now());
                if wait < SPIN {
                    Duration::ZERO
                } else {
                    self.timer.arm(wait)?;
                    // The timer wakes the poll; the timeout is only a backstop.
                    wait + Duration::from_millis(10)
                }
            } else {
                Duration::from_millis(10)
            };
            self.turn(timeout, &mut tally)?;
        }
        let stopped = Instant::now();
        let cpu = own_cpu_time().saturating_sub(cpu_before);
        let server_after = server_pid.and_then(|pid| Sample::of(pid).ok());
        // What is still owed waited at least this long: in the histogram as a lower bound.
        let mut unanswered = 0;
        for client in &self.clients {
            for &t in client.outstanding.iter().filter(|&&t| t >= from) {
                tally.latency.saturating_record(stopped.duration_since(t).as_nanos() as u64);
                unanswered += 1;
            }
        }
        let mut failures: Vec<(String, usize)> = Vec::new();
        for why in self.clients.iter().filter_map(|c| c.failure.clone()) {
            match failures.iter_mut().find(|(w, _)| *w == why) {
                Some((_, n)) => *n += 1,
                None => failures.push((why, 1)),
            }
        }
        let seconds = end.duration_since(from).as_secs_f64();
        let achieved_rate = tally.in_window as f64 / seconds;
        let wall = stopped.duration_since(start).as_secs_f64();
        Ok(FixedRate {
            connections: n,
            size: self.size,
            target_rate: total_rate,
            achieved_rate,
            reached: achieved_rate >= 0.97 * total_rate,
            seconds,
            sent,
            received: tally.received,
            unanswered,
            mismatched: tally.mismatched,
            latency_us: Percentiles::of(&tally.latency),
            send_lag_us: Percentiles::of(&tally.send_lag),
            generator_cpu: cpu.as_secs_f64() / wall,
            server_cpu: match (server_before, server_after) {
                (Some(b), Some(a)) => Some(a.cpu.saturating_sub(b.cpu).as_secs_f64() / wall),
                _ => None,
            },
            server_cpu_us_per_msg: match (server_before, server_after) {
                (Some(b), Some(a)) if tally.received > 0 => {
                    Some(a.cpu.saturating_sub(b.cpu).as_secs_f64() * 1e6 / tally.received as f64)
                }
                _ => None,
            },
            failures,
        })
    }

    /// Waits for the echoes an earlier run still owes (writing what it had not written),
    /// recording nothing.
    fn settle(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + SETTLE;
        let mut tally = Tally::discarding()?;
        while self.owed > 0 {
            if Instant::now() >= deadline {
                return Err(io::Error::other(format!(
                    "the server still owes {} echoes {} s after a run",
                    self.owed,
                    (SETTLE + DRAIN).as_secs()
                )));
            }
            for client in &mut self.clients {
                if client.unsent > 0 {
                    client.flush(&self.burst, self.frame_len, &mut tally);
                }
                self.owed -= client.forget_if_failed();
            }
            self.turn(Duration::from_millis(10), &mut tally)?;
        }
        Ok(())
    }

    /// Waits up to `timeout` for readiness, then reads every readable connection and writes
    /// every writable one that has frames to write.
    fn turn(&mut self, timeout: Duration, tally: &mut Tally) -> io::Result<()> {
        match self.poll.poll(&mut self.events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e),
        }
        for event in self.events.iter() {
            if event.token() == TIMER {
                self.timer.clear();
                continue;
            }
            let Some(client) = self.clients.get_mut(event.token().0) else { continue };
            if client.failure.is_some() {
                continue;
            }
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                self.owed -= client.read(&mut self.buf, self.size, tally);
            }
            if event.is_writable() && client.unsent > 0 && client.failure.is_none() {
                client.flush(&self.burst, self.frame_len, tally);
            }
            self.owed -= client.forget_if_failed();
        }
        Ok(())
    }
}

/// Finds the highest total rate whose p99 stays under `plan.bound` with `generator`: from
/// `plan.from`, doubling while runs pass (halving while they fail), then bisecting between
/// the highest pass and the lowest failure. A run passes when it reached its rate, its p99 is
/// under the bound and no connection failed nor message went unanswered. A run that failed
/// while the generator itself was late (send lag p99 at half the bound or more: it was
/// starved of its CPU, or saturated) says little about the server and is made once more; both
/// are kept in the steps. `step` sees each run as it ends.
pub fn sweep(
    generator: &mut Generator,
    plan: &SweepPlan,
    server_pid: Option<u32>,
    step: &mut dyn FnMut(&FixedRate, bool),
) -> io::Result<Sweep> {
    let bound_us = plan.bound.as_secs_f64() * 1e6;
    let mut steps = Vec::new();
    let connections = generator.clients.len().max(1) as f64;
    let (capacity, failed_at) = search(plan.from, plan.resolution, plan.max_steps, |total| {
        let mut passed = false;
        for attempt in 0..2 {
            let run = generator.run(total / connections, plan.duration, plan.warmup, server_pid)?;
            passed = run.reached
                && run.latency_us.p99 < bound_us
                && run.failures.is_empty()
                && run.unanswered == 0;
            let generator_late = run.send_lag_us.p99 >= bound_us / 2.0;
            step(&run, passed);
            steps.push(run);
            if passed || !generator_late || attempt == 1 {
                break;
            }
        }
        Ok(passed)
    })?;
    Ok(Sweep { bound_us, steps, capacity, failed_at })
}

/// The search behind [`sweep`]: `passes(rate)` runs one step. Returns the highest rate that
/// passed (0 when none did) and the lowest that failed (`None` if none did within
/// `max_steps`). Halving stops at `from / 64`.
pub fn search(
    from: f64,
    resolution: f64,
    max_steps: usize,
    mut passes: impl FnMut(f64) -> io::Result<bool>,
) -> io::Result<(f64, Option<f64>)> {
    let (mut lo, mut hi) = (0.0f64, None::<f64>);
    let mut rate = from;
    let mut steps = 0;
    // Bracket: up by doubling until a failure, or down by halving until a pass.
    while steps < max_steps && rate >= from / 64.0 {
        steps += 1;
        if passes(rate)? {
            lo = rate;
            if hi.is_some() {
                break;
            }
            rate *= 2.0;
        } else {
            hi = Some(rate);
            if lo > 0.0 {
                break;
            }
            rate /= 2.0;
        }
    }
    // Bisect (geometrically: rates span decades) until the bracket is narrow enough.
    while let Some(h) = hi {
        if lo <= 0.0 || h / lo <= resolution || steps >= max_steps {
            break;
        }
        steps += 1;
        let mid = (lo * h).sqrt();
        if passes(mid)? {
            lo = mid;
        } else {
            hi = Some(mid);
        }
    }
    Ok((lo, hi))
}

impl Percentiles {
    /// The percentiles of `h` (nanoseconds) in µs; zeros when it is empty.
    fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        Self {
            p50: us(0.5),
            p90: us(0.9),
            p99: us(0.99),
            p999: us(0.999),
            max: h.max() as f64 / 1000.0,
        }
    }
}

/// What a run counts as echoes come back and frames go out.
struct Tally {
    /// Round trips from the intended send time, ns.
    latency: Histogram<u64>,
    /// Intended send time to written, ns.
    send_lag: Histogram<u64>,
    /// Messages intended from this time on are measured; `None` measures nothing.
    from: Option<Instant>,
    /// Echoes arriving before this time count towards the achieved rate.
    until: Instant,
    received: u64,
    /// Echoes received in `[from, until]`, whichever message they answer.
    in_window: u64,
    mismatched: u64,
}

impl Tally {
    fn measuring(from: Instant, until: Instant) -> io::Result<Self> {
        // 1 ns to an hour at 3 significant digits; `saturating_record` would clamp an
        // auto-resizing histogram to its initial range instead of growing it.
        let histogram = || Histogram::new_with_bounds(1, 3_600_000_000_000, 3);
        Ok(Self {
            latency: histogram().map_err(io::Error::other)?,
            send_lag: histogram().map_err(io::Error::other)?,
            from: Some(from),
            until,
            received: 0,
            in_window: 0,
            mismatched: 0,
        })
    }

    fn discarding() -> io::Result<Self> {
        let mut tally = Self::measuring(Instant::now(), Instant::now())?;
        tally.from = None;
        Ok(tally)
    }

    fn measured(&self, intended: Instant) -> bool {
        self.from.is_some_and(|from| intended >= from)
    }

    fn echo(&mut self, now: Instant, intended: Instant) {
        self.received += 1;
        if let Some(from) = self.from
            && now >= from
            && now <= self.until
        {
            self.in_window += 1;
        }
        if self.measured(intended) {
            self.latency.saturating_record(now.duration_since(intended).as_nanos() as u64);
        }
    }

    fn written(&mut self, now: Instant, intended: Instant) {
        if self.measured(intended) {
            self.send_lag.saturating_record(now.duration_since(intended).as_nanos() as u64);
        }
    }
}

/// One connection of the generator.
struct Client {
    stream: TcpStream,
    /// Parses the echoes.
    rx: Connection,
    /// Intended send times of the messages scheduled and not yet echoed, oldest first (echoes
    /// come back in order). Invariant: `unsent <= outstanding.len()`; the newest `unsent` of
    /// them are not written yet.
    outstanding: VecDeque<Instant>,
    unsent: usize,
    /// Bytes of the first unsent frame already written. Invariant: less than a frame.
    offset: usize,
    /// Payload bytes of the message being received.
    partial: usize,
    /// In the list of connections to write this turn.
    queued: bool,
    /// Why it failed; the first reason is kept.
    failure: Option<String>,
}

impl Client {
    /// Writes unsent frames until none is left or the socket takes no more.
    fn flush(&mut self, burst: &[u8], frame_len: usize, tally: &mut Tally) {
        while self.unsent > 0 {
            let frames = self.unsent.min(BURST);
            match self.stream.write(&burst[self.offset..frames * frame_len]) {
                Ok(0) => return self.fail("the socket took no bytes".into()),
                Ok(n) => {
                    let done = (self.offset + n) / frame_len;
                    self.offset = (self.offset + n) % frame_len;
                    if done > 0 {
                        let now = Instant::now();
                        let first = self.outstanding.len() - self.unsent;
                        for &t in self.outstanding.range(first..first + done) {
                            tally.written(now, t);
                        }
                        self.unsent -= done;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return self.fail(format!("writing failed: {e}")),
            }
        }
    }

    /// Reads and parses until the socket is empty, timing each echo; returns how many
    /// messages were answered.
    fn read(&mut self, buf: &mut [u8], size: usize, tally: &mut Tally) -> u64 {
        let before = self.outstanding.len();
        self.read_echoes(buf, size, tally);
        (before - self.outstanding.len()) as u64
    }

    fn read_echoes(&mut self, buf: &mut [u8], size: usize, tally: &mut Tally) {
        loop {
            let n = match self.stream.read(buf) {
                Ok(0) => {
                    return self
                        .fail("the server closed the connection without a close frame".into());
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return self.fail(format!("reading failed: {e}")),
            };
            let now = Instant::now();
            let mut at = 0;
            while at < n {
                let input = match self.rx.handle_input(ProtoInstant::default(), &mut buf[at..n]) {
                    Ok(input) => input,
                    Err(e) => return self.fail(format!("the server broke the protocol: {e}")),
                };
                at += input.consumed;
                if let Some(piece) = input.payload {
                    self.partial += piece.data.len();
                    if piece.message_fin {
                        // An echo answers the oldest message written; one with nothing
                        // written before it answers nothing this generator sent.
                        match self.outstanding.len() > self.unsent {
                            true if self.partial == size => {
                                let t = self.outstanding.pop_front().expect("outstanding");
                                tally.echo(now, t);
                            }
                            true => {
                                self.outstanding.pop_front();
                                tally.received += 1;
                                tally.mismatched += 1;
                            }
                            false => tally.mismatched += 1,
                        }
                        self.partial = 0;
                    }
                }
                while let Some(event) = self.rx.poll_event() {
                    if let Event::Closed { code, .. } = event {
                        self.fail(format!("closed by the server with {}", code.0));
                    }
                }
            }
            if self.failure.is_some() || self.rx.state() == State::Closed {
                return self.fail("closed by the server".into());
            }
            // A short read emptied the socket; more data is a new edge of readiness.
            if n < buf.len() {
                return;
            }
        }
    }

    fn fail(&mut self, why: String) {
        self.failure.get_or_insert(why);
    }

    /// A failed connection owes nothing more: forgets its messages and says how many.
    fn forget_if_failed(&mut self) -> u64 {
        if self.failure.is_none() || self.outstanding.is_empty() {
            return 0;
        }
        let owed = self.outstanding.len() as u64;
        self.outstanding.clear();
        self.unsent = 0;
        owed
    }
}

/// A one-shot `timerfd` on the monotonic clock: a wake-up with nanosecond resolution for the
/// poll.
struct Timer(OwnedFd);

impl Timer {
    fn new() -> io::Result<Self> {
        // SAFETY: `timerfd_create` takes no pointers; a non-negative result is a new file
        // descriptor that nothing else owns.
        unsafe {
            let fd =
                libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Self(OwnedFd::from_raw_fd(fd)))
        }
    }

    /// Fires once, `after` from now (at least 1 ns: a zero time would disarm it).
    fn arm(&self, after: Duration) -> io::Result<()> {
        let after = after.max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: the descriptor is ours and open; `spec` is a valid `itimerspec` and the old
        // value is not asked for.
        let rc =
            unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }

    /// Consumes the expiry so the next one is a new edge.
    fn clear(&self) {
        let mut expirations = [0u8; 8];
        // SAFETY: reads at most 8 bytes into an 8-byte buffer from our own descriptor.
        unsafe { libc::read(self.0.as_raw_fd(), expirations.as_mut_ptr().cast(), 8) };
    }
}

/// The results of `freeboard bench latency`: sweeps and fixed-rate runs, by server.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LatencyReport {
    /// Capacity under a p99 bound, one row per server and connection count.
    pub capacities: Vec<CapacityRow>,
    /// Runs at a fixed rate, one row per server, connection count and rate.
    pub fixed: Vec<FixedRateRow>,
}

/// Sweeps of one server with one number of connections, one per round.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CapacityRow {
    /// The server's name.
    pub server: String,
    /// Connections.
    pub connections: usize,
    /// Payload bytes.
    pub size: usize,
    /// Every round's sweep, in order.
    pub sweeps: Vec<Sweep>,
}

/// Runs of one server at one rate, one per round.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct FixedRateRow {
    /// The server's name.
    pub server: String,
    /// Connections.
    pub connections: usize,
    /// How the rate was chosen ("1000/s per connection", "50 % of freeboard's capacity").
    pub rate: String,
    /// Every round's run, in order.
    pub runs: Vec<FixedRate>,
}

impl LatencyReport {
    /// Whether it holds anything.
    pub fn is_empty(&self) -> bool {
        self.capacities.is_empty() && self.fixed.is_empty()
    }

    /// Adds a round's sweep to its row.
    pub fn add_sweep(&mut self, server: &str, connections: usize, size: usize, sweep: Sweep) {
        match self
            .capacities
            .iter_mut()
            .find(|r| (r.server.as_str(), r.connections, r.size) == (server, connections, size))
        {
            Some(row) => row.sweeps.push(sweep),
            None => self.capacities.push(CapacityRow {
                server: server.into(),
                connections,
                size,
                sweeps: vec![sweep],
            }),
        }
    }

    /// Adds a round's fixed-rate run to its row.
    pub fn add_fixed(&mut self, server: &str, rate: &str, run: FixedRate) {
        let connections = run.connections;
        match self.fixed.iter_mut().find(|r| {
            (r.server.as_str(), r.connections, r.rate.as_str()) == (server, connections, rate)
        }) {
            Some(row) => row.runs.push(run),
            None => self.fixed.push(FixedRateRow {
                server: server.into(),
                connections,
                rate: rate.into(),
                runs: vec![run],
            }),
        }
    }

    /// Adds `other`'s rows after this report's.
    pub fn merge(&mut self, other: LatencyReport) {
        self.capacities.extend(other.capacities);
        self.fixed.extend(other.fixed);
    }

    /// The Markdown tables: capacity (with same-round ratios of the first server to each
    /// other), then the fixed-rate runs.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        if let Some(first) = self.capacities.first() {
            let _ = writeln!(
                s,
                "\n### capacity at p99 < {} µs (open loop, {} B; median of rounds [min–max])\n",
                first.sweeps.first().map_or(0.0, |w| w.bound_us),
                first.size
            );
            let _ = writeln!(
                s,
                "| connections | server | rounds | capacity msg/s | {} ÷ this (same round) | p99.9 µs at capacity | lowest p99 µs of a sweep | send lag p99 µs (median run) | runs per sweep |",
                first.server
            );
            s.push_str("|---|---|---|---|---|---|---|---|---|\n");
            for row in &self.capacities {
                let reference = self.capacities.iter().find(|r| {
                    r.server == first.server
                        && (r.connections, r.size) == (row.connections, row.size)
                });
                let ratio = match reference {
                    Some(r) if r.server != row.server => {
                        let ratios = r
                            .sweeps
                            .iter()
                            .zip(&row.sweeps)
                            .filter(|(_, b)| b.capacity > 0.0)
                            .map(|(a, b)| a.capacity / b.capacity);
                        let ratios: Vec<f64> = ratios.collect();
                        match ratios.is_empty() {
                            true => "–".into(),
                            false => spread(Spread::of(ratios), 2),
                        }
                    }
                    _ => "–".into(),
                };
                let lower = row.sweeps.iter().any(|w| w.failed_at.is_none());
                let at_capacity: Vec<f64> = row
                    .sweeps
                    .iter()
                    .filter_map(|w| {
                        let passed = w.steps.iter().rev().find(|r| r.target_rate == w.capacity);
                        passed.map(|r| r.latency_us.p999)
                    })
                    .collect();
                let at_capacity = match at_capacity.is_empty() {
                    true => "–".into(),
                    false => spread(Spread::of(at_capacity), 0),
                };
                // The floor under the bound: the best p99 each sweep saw, and how late the
                // generator itself was (when that is near the bound, the host, not the server,
                // set the p99).
                let lowest = row.sweeps.iter().map(|w| {
                    w.steps.iter().map(|r| r.latency_us.p99).fold(f64::INFINITY, f64::min)
                });
                let lag = row.sweeps.iter().flat_map(|w| w.steps.iter().map(|r| r.send_lag_us.p99));
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {}{} | {} | {} | {} | {} | {} |",
                    row.connections,
                    row.server,
                    row.sweeps.len(),
                    spread(Spread::of(row.sweeps.iter().map(|w| w.capacity)), 0),
                    if lower { " (at least: no rate failed)" } else { "" },
                    ratio,
                    at_capacity,
                    spread(Spread::of(lowest.filter(|v| v.is_finite())), 0),
                    Spread::of(lag).median.round(),
                    spread(Spread::of(row.sweeps.iter().map(|w| w.steps.len() as f64)), 0),
                );
            }
        }
        if !self.fixed.is_empty() {
            s.push_str("\n### at a fixed rate (round trip from the intended send time: coordinated omission corrected; median of rounds [min–max])\n\n");
            s.push_str("| connections | server | rate | target msg/s | achieved msg/s | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | send lag p99 µs | generator CPU | server CPU | server CPU µs/msg | unanswered / failed |\n");
            s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
            for row in &self.fixed {
                let of = |f: fn(&FixedRate) -> f64| Spread::of(row.runs.iter().map(f));
                let short = row.runs.iter().filter(|r| !r.reached).count();
                let reached = match short {
                    0 => String::new(),
                    n => format!(" (**target not reached** in {n} of {})", row.runs.len()),
                };
                let (server_cpu, per_msg) = match row.runs.iter().all(|r| r.server_cpu.is_some()) {
                    true => (
                        format!("{:.0} %", of(|r| r.server_cpu.unwrap_or(0.0)).median * 100.0),
                        spread(of(|r| r.server_cpu_us_per_msg.unwrap_or(0.0)), 2),
                    ),
                    false => ("–".into(), "–".into()),
                };
                let failed: usize =
                    row.runs.iter().flat_map(|r| r.failures.iter().map(|(_, n)| n)).sum();
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {:.0} % | {} | {} | {} / {} |",
                    row.connections,
                    row.server,
                    row.rate,
                    spread(of(|r| r.target_rate), 0),
                    spread(of(|r| r.achieved_rate), 0),
                    reached,
                    spread(of(|r| r.latency_us.p50), 0),
                    spread(of(|r| r.latency_us.p90), 0),
                    spread(of(|r| r.latency_us.p99), 0),
                    spread(of(|r| r.latency_us.p999), 0),
                    spread(of(|r| r.latency_us.max), 0),
                    spread(of(|r| r.send_lag_us.p99), 0),
                    of(|r| r.generator_cpu).median * 100.0,
                    server_cpu,
                    per_msg,
                    row.runs.iter().map(|r| r.unanswered).sum::<u64>(),
                    failed,
                );
            }
        }
        s
    }

    /// One CSV line per run: every sweep step, then every fixed-rate run.
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "kind,server,connections,size,round,target_msgs_per_sec,achieved_msgs_per_sec,reached,p50_us,p90_us,p99_us,p999_us,max_us,send_lag_p99_us,server_cpu_us_per_msg,unanswered,failed\n",
        );
        let mut line = |kind: &str, server: &str, round: usize, r: &FixedRate| {
            let l = r.latency_us;
            let failed: usize = r.failures.iter().map(|(_, n)| n).sum();
            let _ = writeln!(
                s,
                "{kind},{server},{},{},{round},{:.0},{:.0},{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{},{},{failed}",
                r.connections,
                r.size,
                r.target_rate,
                r.achieved_rate,
                r.reached,
                l.p50,
                l.p90,
                l.p99,
                l.p999,
                l.max,
                r.send_lag_us.p99,
                r.server_cpu_us_per_msg.map_or(String::new(), |v| format!("{v:.3}")),
                r.unanswered,
            );
        };
        for row in &self.capacities {
            for (round, sweep) in row.sweeps.iter().enumerate() {
                for step in &sweep.steps {
                    line("sweep", &row.server, round + 1, step);
                }
            }
        }
        for row in &self.fixed {
            for (round, run) in row.runs.iter().enumerate() {
                line("fixed", &row.server, round + 1, run);
            }
        }
        s
    }
}

fn spread(s: Spread, digits: usize) -> String {
    format!("{:.d$} [{:.d$}–{:.d$}]", s.median, s.min, s.max, d = digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_brackets_then_bisects_to_the_resolution() {
        for capacity in [900.0, 37_000.0, 1e6] {
            let mut tried = Vec::new();
            let (lo, hi) = search(10_000.0, 1.1, 20, |rate| {
                tried.push(rate);
                Ok(rate < capacity)
            })
            .unwrap();
            let hi = hi.unwrap();
            assert!(lo < capacity && hi >= capacity, "{capacity}: {lo}..{hi} from {tried:?}");
            assert!(hi / lo <= 1.1, "{capacity}: {lo}..{hi}");
            assert!(tried.len() <= 12, "{tried:?}");
        }
    }

    #[test]
    fn search_reports_a_lower_bound_or_nothing() {
        // Every rate passes: the last one is a lower bound and nothing failed.
        let (lo, hi) = search(1000.0, 1.1, 4, |_| Ok(true)).unwrap();
        assert_eq!((lo, hi), (8000.0, None));
        // Nothing passes, down to from / 64.
        let (lo, hi) = search(1000.0, 1.1, 20, |_| Ok(false)).unwrap();
        assert_eq!(lo, 0.0);
        assert!(hi.unwrap() <= 1000.0 / 32.0);
    }
}
