//! A broadcast to more subscribers than one process may open: the subscribers are held by
//! *shards*, child processes of the bench, each below the open-file limit.
//!
//! The parent starts each shard as `PROGRAM bench broadcast-shard SPEC` (the program running
//! now; SPEC is a [`ShardSpec`] as JSON), waits until every shard says `ready`, then publishes
//! over one connection per server, keeping at most `window` messages in flight. A shard writes
//! one line to its standard output for each sequence number once all of its readers have it,
//! with the `CLOCK_MONOTONIC` time it saw the last one: that clock is one for every process of
//! the host, so the parent compares it with the time it wrote the message. A message is
//! complete when every shard with readers has reported it; its latency runs to the latest of
//! those reports.
//!
//! Non-readers (a percentage, spread evenly over the shards and the targets) are opened with
//! a small receive buffer and never read: the window is completed by the readers only, and each reader must still get
//! every sequence number, or the run stalls and fails. At the end, with every subscriber still
//! connected, the parent reads the servers' drop counters (`/metrics`), their resident memory
//! and the host's TCP buffer memory; then it closes each shard's standard input, and the shard
//! exits.
//!
//! A shard's standard error is passed on to the parent's line by line, and its last lines are
//! kept: a shard that fails is reported with them and with how it exited (its status, or the
//! signal that ended it), so the run's error says why.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use serde::{Deserialize, Serialize};

use freeboard_test::{RawHeader, parse_frame};

use super::{
    Broadcast, BroadcastRow, STALL, latency_ms, per_publication, read_available, servers_sample,
};
use crate::Target;
use crate::load::{Rng, open};

/// Descriptors a shard keeps for itself beyond its subscribers (its pipes, its poll, the
/// standard streams): a shard holds at most the hard open-file limit less this.
const MARGIN: u64 = 512;

/// How long the shards may take to open their subscribers.
const OPENING: Duration = Duration::from_secs(600);

/// The receive buffer a non-reader keeps (`SO_RCVBUF`, which the kernel doubles): what it
/// would otherwise hold is held on this host, not on a far client's. Over loopback a socket's
/// unread queue keeps a reference to every page of the server's that its bytes were written
/// into, and the server writes every subscriber's copy of a publication into the same few
/// pages: with default buffers (a 128 KiB window that never closes for small messages) the
/// non-readers of a run pinned nearly every page the servers wrote, 4.4 GiB at 20,000
/// subscribers and 4,000 publications, and the host ran out of memory at 100,000.
const NON_READER_RCVBUF: usize = 4096;

/// How long the parent waits for a report before it gives up: longer than a shard waits for
/// its readers ([`STALL`]), so that a shard whose readers stall says first which message they
/// lack and how many have it.
const PARENT_STALL: Duration = Duration::from_secs(STALL.as_secs() + 5);

/// Lines of a shard's standard error kept for the report of its failure.
const KEPT_ERRORS: usize = 8;

/// How long a shard whose output ended is given to exit before it is reported as running.
const EXITING: Duration = Duration::from_secs(5);

/// What one shard holds; the parent passes it to the child as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardSpec {
    /// Where subscribers connect (URLs): subscriber `g` (counted over all shards) goes to
    /// `subscribe[g % len]`.
    pub subscribe: Vec<String>,
    /// The first of this shard's subscribers, counted over all shards.
    pub first: usize,
    /// This shard's subscribers.
    pub count: usize,
    /// Percent of all subscribers that never read.
    pub non_readers: u8,
    /// Messages the readers must get.
    pub messages: u64,
}

/// Shards needed for `subscribers`: each holds at most the hard open-file limit (which the
/// shard raises its soft limit to) less a margin.
pub fn needed(subscribers: usize) -> io::Result<usize> {
    Ok(subscribers.div_ceil(per_shard()?).max(1))
}

/// Runs a shard in this process (the child's side): opens `spec`'s subscribers, says
/// `ready READERS NON_READERS` on standard output, then `SEQ MONOTONIC_NS` for each message
/// once all its readers have it, then `done DELIVERIES WIRE_BYTES`; then holds every
/// connection until its standard input closes.
pub fn serve(spec: &str) -> io::Result<()> {
    let spec: ShardSpec = serde_json::from_str(spec).map_err(io::Error::other)?;
    crate::process::raise_fd_limit()?;
    let targets = spec
        .subscribe
        .iter()
        .map(|url| Target::parse(url))
        .collect::<Result<Vec<_>, _>>()
        .map_err(io::Error::other)?;
    if targets.is_empty() {
        return Err(io::Error::other("a shard needs a target"));
    }
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut rng = Rng::seeded();
    let mut poll = Poll::new()?;
    let mut readers = Vec::new();
    // Opened and never read: held only so that the server keeps them.
    let mut idle = Vec::new();
    for g in spec.first..spec.first + spec.count {
        // A generous timeout: the shards open their subscribers all at once, beside the
        // servers, on a host that may have fewer cores than processes.
        let (stream, pending) =
            open(&targets[g % targets.len()], Duration::from_secs(30), &mut rng)?;
        // Counted per target, so that each server gets its share of them.
        if is_non_reader(g / targets.len(), spec.non_readers) {
            socket2::SockRef::from(&stream).set_recv_buffer_size(NON_READER_RCVBUF)?;
            idle.push(stream);
            continue;
        }
        stream.set_nonblocking(true)?;
        let mut stream = mio::net::TcpStream::from_std(stream);
        poll.registry().register(&mut stream, Token(readers.len()), Interest::READABLE)?;
        readers.push(Reader { stream, pending });
    }
    writeln!(out, "ready {} {}", readers.len(), idle.len())?;
    out.flush()?;
    let n = readers.len() as u32;
    let messages = spec.messages as usize;
    let mut counts = vec![0u32; messages];
    let (mut done, mut delivered, mut wire_bytes) = (0, 0u64, 0u64);
    let mut events = Events::with_capacity(4096);
    let mut buf = vec![0u8; 1 << 16];
    // The first message comes once every shard has opened its subscribers, which may take
    // longer than a stall: until then only the opening bound applies.
    let ready = Instant::now();
    while n > 0 && done < messages {
        poll.poll(&mut events, Some(STALL))?;
        if events.is_empty() && (wire_bytes > 0 || ready.elapsed() > OPENING) {
            let short = counts.iter().position(|&c| c < n).unwrap_or(messages);
            return Err(io::Error::other(format!(
                "shard at {}: stalled after {done} of {messages} messages (message {short} \
                 reached {} of {n} readers)",
                spec.first,
                counts.get(short).copied().unwrap_or(n)
            )));
        }
        for event in events.iter() {
            let Reader { stream, pending } = &mut readers[event.token().0];
            match read_available(stream, &mut buf, pending)? {
                Some(k) => wire_bytes += k as u64,
                None => return Err(io::Error::other("a reader was closed")),
            }
            let mut at = 0;
            while let Some((_, payload)) = parse_frame(&pending[at..])
                .map_err(|e| io::Error::other(format!("a reader got an invalid frame: {e}")))?
            {
                let p = &pending[at + payload.start..at + payload.end];
                at += payload.end;
                if p.len() < 16 {
                    continue; // not ours
                }
                let seq = u64::from_le_bytes(p[..8].try_into().expect("8 bytes")) as usize;
                let Some(count) = counts.get_mut(seq) else { continue };
                delivered += 1;
                *count += 1;
                if *count == n {
                    writeln!(out, "{seq} {}", monotonic_ns())?;
                    done += 1;
                }
            }
            pending.drain(..at);
        }
        // One write of the reports per turn: their times were taken as each completed.
        out.flush()?;
    }
    writeln!(out, "done {delivered} {wire_bytes}")?;
    out.flush()?;
    // Hold every connection, the non-readers' backlogs included, until the parent has read
    // the servers' figures: it closes our standard input then.
    io::copy(&mut io::stdin().lock(), &mut io::sink())?;
    drop(idle);
    Ok(())
}

/// The parent's side: starts `shards` shards for `b`'s subscribers and publishes to every
/// target of `b.publish`.
pub(super) fn run(
    b: &Broadcast,
    shards: usize,
    server: &str,
    tick: &mut dyn FnMut(u64),
) -> io::Result<BroadcastRow> {
    if b.deflate || b.text || b.sse || b.document || b.delta {
        return Err(io::Error::other(
            "a sharded broadcast carries binary payloads only (no deflate, text, SSE or deltas)",
        ));
    }
    if b.subscribe.is_empty() || b.publish.is_empty() {
        return Err(io::Error::other("no target to subscribe or publish at"));
    }
    if b.subscribe.iter().chain(&b.publish).any(|t| t.tls) {
        return Err(io::Error::other("a sharded broadcast has no TLS"));
    }
    if b.non_readers >= 100 {
        return Err(io::Error::other("--non-readers is a percentage below 100"));
    }
    let n = b.subscribers;
    let per = n.div_ceil(shards.max(1));
    if per > per_shard()? {
        return Err(io::Error::other(format!(
            "{per} subscribers per shard is more than the open-file limit allows ({}): use more \
             shards",
            per_shard()?
        )));
    }
    let rss_before = servers_sample(&b.server_pids).map(|s| s.rss_kib);
    let program = std::env::current_exe()?;
    let (tx, rx) = mpsc::channel();
    let mut children = Shards(Vec::new());
    for first in (0..n).step_by(per.max(1)) {
        let spec = ShardSpec {
            subscribe: b.subscribe.iter().map(Target::to_string).collect(),
            first,
            count: per.min(n - first),
            non_readers: b.non_readers,
            messages: b.messages,
        };
        let mut child = Command::new(&program)
            .args(["bench", "broadcast-shard"])
            .arg(serde_json::to_string(&spec).map_err(io::Error::other)?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let (tx, shard) = (tx.clone(), children.0.len());
        std::thread::spawn(move || forward(shard, stdout, tx));
        let errors = Arc::new(Mutex::new(VecDeque::new()));
        let kept = errors.clone();
        std::thread::spawn(move || pass_on_errors(shard, stderr, &kept));
        children.0.push(Shard { child, errors });
    }
    drop(tx);
    let k = children.0.len();
    // Readers per shard, from its `ready` line.
    let mut readers = vec![None; k];
    let mut non_readers = 0;
    // What each shard's readers got, from its `done` line (a shard without readers says it
    // at once).
    let mut finished = vec![None; k];
    let opening = Instant::now() + OPENING;
    while readers.iter().any(Option::is_none) {
        let wait = opening.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok((shard, Line::Ready(r, idle))) => {
                readers[shard] = Some(r);
                non_readers += idle;
            }
            Ok((shard, Line::Done(deliveries, wire))) => finished[shard] = Some((deliveries, wire)),
            Ok((shard, line)) => return Err(children.failed(shard, line)),
            Err(_) => return Err(io::Error::other("the shards did not open their subscribers")),
        }
    }
    let readers: Vec<usize> = readers.into_iter().map(Option::unwrap_or_default).collect();
    let reader_count: usize = readers.iter().sum();
    let reading = readers.iter().filter(|&&r| r > 0).count();
    if reading == 0 {
        return Err(io::Error::other("no subscriber reads"));
    }
    std::thread::sleep(Duration::from_millis(200)); // subscriptions settle
    let rss_idle = servers_sample(&b.server_pids).map(|s| s.rss_kib);
    let mut rng = Rng::seeded();
    let mut publishers = Vec::with_capacity(b.publish.len());
    for target in &b.publish {
        let (stream, _) = open(target, Duration::from_secs(5), &mut rng)?;
        // A server that stops reading the publisher fails the run instead of hanging it.
        stream.set_write_timeout(Some(STALL))?;
        stream.set_read_timeout(None)?;
        // On freeboard the publisher is a subscriber too: what it is sent is read and
        // discarded, so that its queue meets no policy and its drops are not counted as the
        // non-readers'.
        let mut sink = stream.try_clone()?;
        std::thread::spawn(move || io::copy(&mut sink, &mut io::sink()));
        // A raw fan-out passes frames on verbatim, so they go unmasked, as a server's; a zero
        // masking key is a valid key and leaves the payload as it is.
        let header = RawHeader::new(0x82, b.size as u64, (!target.raw).then_some([0; 4]));
        let head = header.len();
        let mut frame = vec![0u8; head];
        header.encode(&mut frame).map_err(io::Error::other)?;
        frame.extend_from_slice(&[0; 16]);
        frame.extend_from_slice(&crate::corpus::json(b.size - 16));
        publishers.push((stream, frame, head));
    }
    let cpu_before = servers_sample(&b.server_pids);
    let (messages, window) = (b.messages, b.window.max(1));
    let mut sent_at = vec![0u64; messages as usize];
    // Per message: the shards that have reported it, and the latest time among them.
    let mut reported = vec![(0usize, 0u64); messages as usize];
    let mut latencies = Vec::with_capacity(messages as usize);
    let (mut seq, mut done) = (0u64, 0u64);
    let start = Instant::now();
    let mut last_tick = start;
    while done < messages || finished.iter().any(Option::is_none) {
        while seq < messages && seq < done + window {
            let t = monotonic_ns();
            for (stream, frame, head) in &mut publishers {
                frame[*head..*head + 8].copy_from_slice(&seq.to_le_bytes());
                frame[*head + 8..*head + 16].copy_from_slice(&t.to_le_bytes());
                stream.write_all(frame)?;
            }
            sent_at[seq as usize] = t;
            seq += 1;
        }
        match rx.recv_timeout(PARENT_STALL) {
            Ok((_, Line::Complete(s, at))) => {
                let Some((count, latest)) = reported.get_mut(s as usize) else { continue };
                *count += 1;
                *latest = (*latest).max(at);
                if *count == reading {
                    latencies.push(latest.saturating_sub(sent_at[s as usize]));
                    done += 1;
                }
            }
            Ok((shard, Line::Done(deliveries, wire))) => finished[shard] = Some((deliveries, wire)),
            Ok((shard, line)) => return Err(children.failed(shard, line)),
            Err(_) => {
                return Err(io::Error::other(format!(
                    "stalled after {done} of {messages} messages: no shard reported for \
                     {PARENT_STALL:?}"
                )));
            }
        }
        if last_tick.elapsed() > Duration::from_millis(100) {
            tick(done);
            last_tick = Instant::now();
        }
    }
    // The last completion's time, in the clock of the reports.
    let end = reported.iter().map(|r| r.1).max().unwrap_or_default();
    let elapsed = Duration::from_nanos(end.saturating_sub(sent_at.first().copied().unwrap_or(end)));
    let cpu_after = servers_sample(&b.server_pids);
    // The figures at the end, every subscriber still connected. A loop adds its counts to
    // the shared metrics at the end of its turn.
    std::thread::sleep(Duration::from_millis(200));
    let servers_rss_kib = servers_sample(&b.server_pids).map(|s| s.rss_kib);
    let tcp_buffers_kib = tcp_buffer_kib();
    let series = server_series(
        b,
        &[
            "freeboard_drops_total",
            "freeboard_topic_drops_total",
            "freeboard_kernel_memory_estimate_bytes",
        ],
    );
    let kernel = "freeboard_kernel_memory_estimate_bytes";
    let kernel_charged_kib =
        series.as_ref().and_then(|s| s.iter().find(|(n, _)| n == kernel)).map(|(_, v)| v / 1024);
    let drops = series.map(|s| s.into_iter().filter(|(n, _)| n != kernel).collect());
    for shard in &mut children.0 {
        drop(shard.child.stdin.take());
    }
    for (i, shard) in children.0.iter_mut().enumerate() {
        let status = shard.child.wait()?;
        if !status.success() {
            return Err(io::Error::other(format!(
                "shard {i} {} after the run{}",
                exit_status(status),
                shard.last_errors()
            )));
        }
    }
    for (stream, _, _) in &publishers {
        let _ = stream.shutdown(Shutdown::Both);
    }
    let per_publication = |f| per_publication(&cpu_before, &cpu_after, done, f);
    let (reader_deliveries, wire_bytes) = finished
        .iter()
        .flatten()
        .fold((0, 0), |(d, w), &(deliveries, wire)| (d + deliveries, w + wire));
    let deliveries = done * reader_count as u64;
    Ok(BroadcastRow {
        server: server.into(),
        subscribers: n,
        size: b.size,
        window,
        messages: done,
        deliveries_per_sec: deliveries as f64 / elapsed.as_secs_f64().max(1e-9),
        latency_ms: latency_ms(&mut latencies),
        compressing: 0,
        server_cpu_us_per_msg: per_publication(|s| s.cpu),
        server_sys_us_per_msg: per_publication(|s| s.system),
        wire_bytes_per_delivery: wire_bytes as f64 / deliveries.max(1) as f64,
        server_rss_kib_per_subscriber: match (rss_before, rss_idle) {
            (Some(before), Some(idle)) => Some(idle.saturating_sub(before) as f64 / n as f64),
            _ => None,
        },
        shards: k,
        servers: publishers.len(),
        non_readers,
        reader_deliveries,
        drops,
        servers_rss_kib,
        tcp_buffers_kib,
        kernel_charged_kib,
        budget_kib: b.memory.map(|m| m * distinct_servers(b).len() as u64 / 1024),
    })
}

/// One line of a shard's report.
#[derive(Debug)]
enum Line {
    /// Its readers and non-readers are open.
    Ready(usize, usize),
    /// All its readers have a message (sequence, `CLOCK_MONOTONIC` ns).
    Complete(u64, u64),
    /// Every message is in: deliveries its readers counted, bytes they read.
    Done(u64, u64),
    /// Its output ended, or said something else.
    Ended(String),
}

/// Forwards shard `shard`'s report lines to `tx` until its output ends.
fn forward(shard: usize, stdout: ChildStdout, tx: mpsc::Sender<(usize, Line)>) {
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = match lines.next() {
            Some(Ok(line)) => line,
            Some(Err(e)) => {
                let _ = tx.send((shard, Line::Ended(e.to_string())));
                return;
            }
            None => {
                let _ = tx.send((shard, Line::Ended("its output ended".into())));
                return;
            }
        };
        let mut words = line.split(' ');
        let (a, b, c) = (words.next(), words.next(), words.next());
        let num = |w: Option<&str>| w.and_then(|w| w.parse::<u64>().ok());
        let parsed = match (a, num(b), num(c)) {
            (Some("ready"), Some(r), Some(i)) => Line::Ready(r as usize, i as usize),
            (Some("done"), Some(d), Some(w)) => Line::Done(d, w),
            (Some(seq), Some(at), None) => match seq.parse() {
                Ok(seq) => Line::Complete(seq, at),
                Err(_) => Line::Ended(format!("it said {line:?}")),
            },
            _ => Line::Ended(format!("it said {line:?}")),
        };
        if tx.send((shard, parsed)).is_err() {
            return;
        }
    }
}

/// Passes shard `shard`'s standard error on to this process's, a line at a time, and keeps its
/// last [`KEPT_ERRORS`] lines in `kept`.
fn pass_on_errors(shard: usize, stderr: ChildStderr, kept: &Mutex<VecDeque<String>>) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { return };
        eprintln!("shard {shard}: {line}");
        let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() == KEPT_ERRORS {
            kept.pop_front();
        }
        kept.push_back(line);
    }
}

/// How a shard exited, in words: its exit code or the signal that ended it.
fn exit_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => {
            // SAFETY: `strsignal` returns a pointer to a static or thread-local string (or
            // null), read at once and copied.
            let name = unsafe { libc::strsignal(signal) };
            let name = match name.is_null() {
                true => String::new(),
                // SAFETY: a non-null `strsignal` result is a NUL-terminated string.
                false => unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned(),
            };
            let core = if status.core_dumped() { ", core dumped" } else { "" };
            format!("was killed by signal {signal} ({name}{core})")
        }
        (None, None) => format!("ended ({status})"),
    }
}

/// The shards started, killed and reaped if the run ends early.
struct Shards(Vec<Shard>);

impl Shards {
    /// The error for shard `shard`, which said `line` where it should not have: what it said
    /// or that its output ended, how it exited (waiting up to [`EXITING`] for it), and the
    /// last lines of its standard error.
    fn failed(&mut self, shard: usize, line: Line) -> io::Error {
        let what = match line {
            Line::Ended(why) => why,
            other => format!("it said {other:?} out of turn"),
        };
        let Some(s) = self.0.get_mut(shard) else {
            return io::Error::other(format!("shard {shard} failed: {what}"));
        };
        let deadline = Instant::now() + EXITING;
        let exit = loop {
            match s.child.try_wait() {
                Ok(Some(status)) => break exit_status(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) => break format!("was still running {EXITING:?} later"),
                Err(e) => break format!("could not be waited for ({e})"),
            }
        };
        // The thread passing its errors on reads them to their end once it has exited.
        std::thread::sleep(Duration::from_millis(50));
        io::Error::other(format!("shard {shard} failed: {what}; it {exit}{}", s.last_errors()))
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        for Shard { child, .. } in &mut self.0 {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// One shard process and the last lines of its standard error.
struct Shard {
    child: Child,
    errors: Arc<Mutex<VecDeque<String>>>,
}

impl Shard {
    /// `; its last errors: …`, or nothing if it wrote none.
    fn last_errors(&self) -> String {
        let errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        match errors.is_empty() {
            true => "; it wrote no error".into(),
            false => format!("; its last errors: {}", Vec::from(errors.clone()).join(" | ")),
        }
    }
}

/// One reader's socket and the bytes not yet parsed.
struct Reader {
    stream: mio::net::TcpStream,
    pending: Vec<u8>,
}

/// Whether the `i`th subscriber of a target never reads: exactly `percent` % of every hundred
/// consecutive ones, so they spread over targets and shards alike.
fn is_non_reader(i: usize, percent: u8) -> bool {
    let p = usize::from(percent);
    (i + 1) * p / 100 != i * p / 100
}

/// Subscribers one shard may hold: the hard open-file limit less [`MARGIN`].
fn per_shard() -> io::Result<usize> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `getrlimit` writes one `rlimit` through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(lim.rlim_max.saturating_sub(MARGIN).clamp(1, 1_000_000) as usize)
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process of the host.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` writes one `timespec` through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The host's TCP buffer memory (`/proc/net/sockstat`, `TCP: … mem PAGES`), KiB.
fn tcp_buffer_kib() -> Option<u64> {
    let sockstat = std::fs::read_to_string("/proc/net/sockstat").ok()?;
    let tcp = sockstat.lines().find(|l| l.starts_with("TCP:"))?;
    let mut words = tcp.split_whitespace();
    let pages: u64 = words.find(|&w| w == "mem").and(words.next())?.parse().ok()?;
    // SAFETY: `sysconf` only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    Some(pages * page / 1024)
}

/// Each server's address once (subscribe and publish targets).
fn distinct_servers(b: &Broadcast) -> Vec<SocketAddr> {
    let mut addrs: Vec<SocketAddr> = b.subscribe.iter().chain(&b.publish).map(|t| t.addr).collect();
    addrs.sort_unstable();
    addrs.dedup();
    addrs
}

/// The servers' drop counters summed by series (`freeboard_drops_total{reason="…"}`,
/// `freeboard_topic_drops_total{…}`), from each one's `/metrics`; `None` if a server does not
/// answer it (a raw fan-out is never asked: it would pass the request on to its subscribers).
/// The series of the servers' `/metrics` named `names`, each summed over the servers; `None`
/// for a raw peer or a server that did not answer.
fn server_series(b: &Broadcast, names: &[&str]) -> Option<Vec<(String, u64)>> {
    if b.subscribe.iter().chain(&b.publish).any(|t| t.raw) {
        return None;
    }
    let mut sums: Vec<(String, u64)> = Vec::new();
    for addr in distinct_servers(b) {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").ok()?;
        let mut metrics = String::new();
        s.read_to_string(&mut metrics).ok()?;
        if !metrics.starts_with("HTTP/1.1 200") {
            return None;
        }
        for line in metrics.lines() {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            if !names.contains(&name) {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let value = value.parse::<f64>().unwrap_or(0.0) as u64;
            match sums.iter_mut().find(|(s, _)| s == series) {
                Some((_, sum)) => *sum += value,
                None => sums.push((series.to_string(), value)),
            }
        }
    }
    Some(sums)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_readers_are_the_share_asked_in_every_hundred() {
        for percent in [0u8, 1, 10, 33, 99] {
            let count = (0..1000).filter(|&g| is_non_reader(g, percent)).count();
            assert_eq!(count, usize::from(percent) * 10, "{percent} %");
            let first = (0..100).filter(|&g| is_non_reader(g, percent)).count();
            assert_eq!(first, usize::from(percent));
        }
    }
}
