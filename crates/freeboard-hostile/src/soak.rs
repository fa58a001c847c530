//! The mixed soak: echo, pub/sub and connection churn against one server at the same time, for
//! a bounded duration, with the server's memory sampled as it goes.
//!
//! - **Echo clients** send messages of 0 B to 256 KiB (text and binary, one in eight
//!   fragmented in three) and check every echo byte for byte.
//! - **Publishers** publish numbered messages of 16 B to 4 KiB on one topic (the server runs
//!   with `--client-publish`); **subscribers** check that every publisher's numbers only go up
//!   and every payload is intact, and count the numbers they never saw. One subscriber at a
//!   time leaves and a new one joins, now and then.
//! - **Churn** cycles through upgrade-echo-close, connect-and-hang-up, subscribe-and-vanish,
//!   half a frame then a reset, and half a request head then a hang-up.
//!
//! Every `sample` the run records the server's RSS and, from `/metrics`, pool chunks in use,
//! allocation failures, open connections and drops. Anything corrupted, reordered or refused
//! ends the run with the first such failure; gaps a subscriber sees are compared with the drops
//! the server counted, since a drop is allowed only if it is counted.

use std::fmt;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::metrics::Scrape;
use crate::serve::rss_kib;
use crate::ws::{WsClient, upgrade_request};

/// The topic the publishers and subscribers use.
const TOPIC: &str = "/topic/soak";

/// What runs at once.
#[derive(Debug, Clone)]
pub struct Mix {
    /// Echo clients, each one message in flight.
    pub echo_clients: usize,
    /// Publishers on the topic.
    pub publishers: usize,
    /// Messages per second per publisher.
    pub publish_rate: u32,
    /// Subscribers to the topic (besides the publishers, which receive it too).
    pub subscribers: usize,
    /// Threads cycling connections.
    pub churners: usize,
    /// Length of the run.
    pub duration: Duration,
    /// Time between samples.
    pub sample: Duration,
}

impl Default for Mix {
    fn default() -> Self {
        Self {
            echo_clients: 4,
            publishers: 2,
            publish_rate: 100,
            subscribers: 16,
            churners: 1,
            duration: Duration::from_secs(100),
            sample: Duration::from_secs(10),
        }
    }
}

/// One sample of the server.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Seconds since the start.
    pub t: f64,
    /// Server RSS, KiB.
    pub rss_kib: u64,
    /// Pool chunks in use (all loops).
    pub chunks_in_use: u64,
    /// The most pool chunks in use at once so far (each loop's high water, summed).
    pub chunks_high_water: u64,
    /// Pool chunks in total (all loops).
    pub chunks_total: u64,
    /// Chunk allocations refused so far.
    pub allocation_failures: u64,
    /// Open WebSocket connections.
    pub connections: u64,
    /// Messages dropped so far by slow-consumer policies and whole-loop topic drops.
    pub drops: u64,
    /// Echoes checked over the interval.
    pub echoes: u64,
    /// Topic messages subscribers received over the interval.
    pub deliveries: u64,
    /// Connection cycles over the interval.
    pub cycles: u64,
}

/// What a whole run saw.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// One row per sample, the last one taken after every client has left.
    pub samples: Vec<Sample>,
    /// Echoes checked, all intact.
    pub echoes: u64,
    /// Topic messages received by subscribers, all intact and in order.
    pub deliveries: u64,
    /// Messages published.
    pub published: u64,
    /// Publisher numbers subscribers never saw (each must be a counted drop).
    pub gaps: u64,
    /// Connection cycles completed.
    pub cycles: u64,
    /// The first thing that went wrong, if anything did.
    pub failure: Option<String>,
}

impl Outcome {
    /// The samples as CSV, one line each.
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "t_s,rss_kib,chunks_in_use,chunks_high_water,chunks_total,allocation_failures,connections,drops,echoes,deliveries,cycles\n",
        );
        for x in &self.samples {
            s += &format!(
                "{:.0},{},{},{},{},{},{},{},{},{},{}\n",
                x.t,
                x.rss_kib,
                x.chunks_in_use,
                x.chunks_high_water,
                x.chunks_total,
                x.allocation_failures,
                x.connections,
                x.drops,
                x.echoes,
                x.deliveries,
                x.cycles
            );
        }
        s
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} echoes, {} published, {} delivered, {} gaps, {} connection cycles",
            self.echoes, self.published, self.deliveries, self.gaps, self.cycles
        )?;
        if let Some(failure) = &self.failure {
            write!(f, "; FAILED: {failure}")?;
        }
        Ok(())
    }
}

/// What the client threads share.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    echoes: AtomicU64,
    published: AtomicU64,
    deliveries: AtomicU64,
    gaps: AtomicU64,
    cycles: AtomicU64,
    failure: Mutex<Option<String>>,
}

impl Shared {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// Records the first failure and stops the run.
    fn fail(&self, what: String) {
        if let Ok(mut first) = self.failure.lock() {
            first.get_or_insert(what);
        }
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One client's part of the run; an `Err` is the run's failure.
type Part = Box<dyn FnOnce(&Shared) -> Result<(), String> + Send>;

/// Runs `mix` against the server at `addr` (process `pid`, started with `--client-publish`).
pub fn run(addr: SocketAddr, pid: u32, mix: &Mix) -> Outcome {
    let shared = Arc::new(Shared::default());
    let start = Instant::now();
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    let mut spawn = |f: Part| {
        let shared = shared.clone();
        threads.push(std::thread::spawn(move || {
            if let Err(e) = f(&shared) {
                shared.fail(e);
            }
        }));
    };
    for i in 0..mix.echo_clients {
        spawn(Box::new(move |s| echo_client(addr, i as u64, s)));
    }
    for i in 0..mix.subscribers {
        // Each subscriber slot replaces its connection now and then, at its own pace.
        let stay = Duration::from_secs(5 + 3 * i as u64);
        spawn(Box::new(move |s| subscriber(addr, stay, s)));
    }
    for i in 0..mix.publishers {
        let rate = mix.publish_rate;
        spawn(Box::new(move |s| publisher(addr, i as u8, rate, s)));
    }
    for i in 0..mix.churners {
        spawn(Box::new(move |s| churn(addr, i as u64, s)));
    }

    let mut outcome = Outcome::default();
    let mut last = [0u64; 3];
    let mut take = |t: f64, shared: &Shared| {
        let m = Scrape::of(addr);
        let now = [
            shared.echoes.load(Ordering::Relaxed),
            shared.deliveries.load(Ordering::Relaxed),
            shared.cycles.load(Ordering::Relaxed),
        ];
        let sample = Sample {
            t,
            rss_kib: rss_kib(pid),
            chunks_in_use: m.sum("pool_chunks_in_use") as u64,
            chunks_high_water: m.sum("pool_chunks_high_water") as u64,
            chunks_total: m.sum("pool_chunks_capacity") as u64,
            allocation_failures: m.sum("pool_allocation_failures_total") as u64,
            connections: m.get("connections") as u64,
            drops: drops(&m),
            echoes: now[0] - last[0],
            deliveries: now[1] - last[1],
            cycles: now[2] - last[2],
        };
        last = now;
        sample
    };
    let mut next = start + mix.sample;
    let end = start + mix.duration;
    while shared.running() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
        if Instant::now() >= next {
            next += mix.sample;
            outcome.samples.push(take(start.elapsed().as_secs_f64(), &shared));
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    for t in threads {
        if t.join().is_err() {
            shared.fail("a client thread panicked".into());
        }
    }
    // Everyone has left: the pool must come back to idle.
    let quiet = Instant::now() + Duration::from_secs(10);
    while Instant::now() < quiet {
        let m = Scrape::of(addr);
        if m.get("connections") == 0.0 && m.sum("pool_chunks_in_use") == 0.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    outcome.samples.push(take(start.elapsed().as_secs_f64(), &shared));
    outcome.echoes = shared.echoes.load(Ordering::Relaxed);
    outcome.published = shared.published.load(Ordering::Relaxed);
    outcome.deliveries = shared.deliveries.load(Ordering::Relaxed);
    outcome.gaps = shared.gaps.load(Ordering::Relaxed);
    outcome.cycles = shared.cycles.load(Ordering::Relaxed);
    outcome.failure = shared.failure.lock().ok().and_then(|mut f| f.take());
    outcome
}

/// Every message the server counted as dropped, by any policy or reason.
pub fn drops(m: &Scrape) -> u64 {
    (m.sum("drops_total") + m.sum("topic_drops_total")) as u64
}

/// A small xorshift generator: the same seed gives the same sizes and bytes.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Echo sizes: mostly small, some medium, a few large.
fn echo_size(rng: &mut Rng) -> usize {
    match rng.below(100) {
        0..70 => rng.below(513) as usize,
        70..95 => 513 + rng.below(16 << 10) as usize,
        _ => (16 << 10) + rng.below(240 << 10) as usize,
    }
}

/// One echo client: messages of mixed size and kind, each checked byte for byte.
fn echo_client(addr: SocketAddr, seed: u64, shared: &Shared) -> Result<(), String> {
    let mut rng = Rng::new(seed + 1);
    let mut client = upgrade(addr, "/echo")?;
    let mut seq = 0u64;
    while shared.running() {
        let text = rng.below(2) == 0;
        // Text is ASCII, so any cut is a valid fragment boundary; binary is any byte.
        let payload: Vec<u8> = (0..echo_size(&mut rng))
            .map(|_| if text { b' ' + rng.below(95) as u8 } else { rng.next() as u8 })
            .collect();
        let opcode = if text { 0x1 } else { 0x2 };
        let sent = if rng.below(8) == 0 && payload.len() >= 3 {
            let (a, rest) = payload.split_at(payload.len() / 3);
            let (b, c) = rest.split_at(rest.len() / 2);
            client
                .send(opcode, a)
                .and_then(|()| client.send(0x00, b))
                .and_then(|()| client.send(0x80, c))
        } else {
            client.send(0x80 | opcode, &payload)
        };
        sent.map_err(|e| format!("echo client {seed}, message {seq}: send: {e}"))?;
        match client.recv() {
            Ok(Some(f)) if f.fin && f.opcode == opcode && f.payload == payload => {}
            Ok(Some(f)) => {
                return Err(format!(
                    "echo client {seed}, message {seq}: {} B sent as opcode {opcode}, got opcode {} with {} B{}",
                    payload.len(),
                    f.opcode,
                    f.payload.len(),
                    if f.opcode == 0x8 {
                        format!(" (close {})", f.close_code())
                    } else {
                        String::new()
                    }
                ));
            }
            Ok(None) => return Err(format!("echo client {seed}, message {seq}: EOF")),
            Err(e) => return Err(format!("echo client {seed}, message {seq}: {e}")),
        }
        shared.echoes.fetch_add(1, Ordering::Relaxed);
        seq += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    close(client, &format!("echo client {seed}"))
}

/// A topic message: publisher, number, then bytes that follow from both.
fn topic_message(publisher: u8, seq: u64, len: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(len.max(9));
    m.push(publisher);
    m.extend_from_slice(&seq.to_le_bytes());
    m.extend((9..len).map(|i| (seq as usize).wrapping_add(i) as u8));
    m
}

/// A publisher: `rate` numbered messages a second on the topic. It is a subscriber too, and
/// checks its own copies like any other.
fn publisher(addr: SocketAddr, id: u8, rate: u32, shared: &Shared) -> Result<(), String> {
    let mut rng = Rng::new(1000 + u64::from(id));
    let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let mut next = Instant::now();
    on_topic(addr, &format!("publisher {id}"), shared, |writer| {
        let mut seq = 0u64;
        while shared.running() {
            let now = Instant::now();
            if now < next {
                std::thread::sleep(next - now);
                continue;
            }
            next += period;
            let message = topic_message(id, seq, 16 + rng.below(4081) as usize);
            send(writer, 0x82, &message)
                .map_err(|e| format!("publisher {id}, message {seq}: {e}"))?;
            shared.published.fetch_add(1, Ordering::Relaxed);
            seq += 1;
        }
        Ok(())
    })
}

/// A subscriber slot: subscribes, checks what arrives for `stay`, closes, subscribes again.
fn subscriber(addr: SocketAddr, stay: Duration, shared: &Shared) -> Result<(), String> {
    while shared.running() {
        let leave = Instant::now() + stay;
        on_topic(addr, "subscriber", shared, |_| {
            while shared.running() && Instant::now() < leave {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// One connection to the topic: `act` writes through the lock while another thread checks
/// every delivery (see [`check_deliveries`]); then a close 1000, whose answer ends the check.
fn on_topic(
    addr: SocketAddr,
    who: &str,
    shared: &Shared,
    act: impl FnOnce(&Mutex<WsClient>) -> Result<(), String>,
) -> Result<(), String> {
    let mut client = upgrade(addr, TOPIC)?;
    let reader = client.reader().map_err(|e| e.to_string())?;
    let writer = Mutex::new(client);
    std::thread::scope(|scope| {
        let check = scope.spawn(|| check_deliveries(reader, &writer, who, shared));
        let acted = act(&writer);
        let _ = send(&writer, 0x88, &1000u16.to_be_bytes());
        let checked = check.join().map_err(|_| format!("{who}: the reader panicked"))?;
        acted.and(checked)
    })
}

/// Sends one frame on a connection whose reader runs on another thread (and pongs through the
/// same lock, so frames never interleave).
fn send(writer: &Mutex<WsClient>, first_byte: u8, payload: &[u8]) -> std::io::Result<()> {
    writer.lock().map_err(|_| std::io::Error::other("poisoned"))?.send(first_byte, payload)
}

/// Reads topic messages until the close answer: numbers only go up per publisher, payloads
/// are intact; the numbers skipped are counted as gaps. Pings get their pong, as from a
/// browser: the server's keep-alive closes a subscriber that stays silent.
fn check_deliveries(
    mut reader: WsClient,
    writer: &Mutex<WsClient>,
    who: &str,
    shared: &Shared,
) -> Result<(), String> {
    let mut last: [Option<u64>; 256] = [None; 256];
    loop {
        let frame = match reader.recv() {
            Ok(Some(f)) => f,
            Ok(None) => return Err(format!("{who}: EOF before the close answer")),
            Err(e) => return Err(format!("{who}: {e}")),
        };
        match frame.opcode {
            0x8 if frame.close_code() == 1000 => return Ok(()),
            0x8 => return Err(format!("{who}: closed with {}", frame.close_code())),
            0x2 if frame.fin && frame.payload.len() >= 9 => {
                let p = frame.payload[0];
                let seq = u64::from_le_bytes(frame.payload[1..9].try_into().expect("8 bytes"));
                if frame.payload != topic_message(p, seq, frame.payload.len()) {
                    return Err(format!("{who}: publisher {p}'s message {seq} is corrupted"));
                }
                let prev = &mut last[usize::from(p)];
                match *prev {
                    Some(l) if seq <= l => {
                        return Err(format!("{who}: publisher {p}'s message {seq} after {l}"));
                    }
                    Some(l) => {
                        shared.gaps.fetch_add(seq - l - 1, Ordering::Relaxed);
                    }
                    None => {}
                }
                *prev = Some(seq);
                shared.deliveries.fetch_add(1, Ordering::Relaxed);
            }
            0x9 => send(writer, 0x8A, &frame.payload).map_err(|e| format!("{who}: pong: {e}"))?,
            0xA => {}
            op => return Err(format!("{who}: unexpected frame, opcode {op}")),
        }
    }
}

/// Connection cycles, each ending a different way.
fn churn(addr: SocketAddr, seed: u64, shared: &Shared) -> Result<(), String> {
    let mut rng = Rng::new(2000 + seed);
    let mut i = 0u64;
    while shared.running() {
        let what = match i % 5 {
            0 => "upgrade, echo, close 1000",
            1 => "connect and hang up",
            2 => "subscribe and vanish",
            3 => "half a frame, then a reset",
            _ => "half a request head, then hang up",
        };
        let result = match i % 5 {
            0 => upgrade(addr, "/echo").and_then(|mut c| {
                let payload: Vec<u8> = (0..rng.below(2048)).map(|_| rng.next() as u8).collect();
                match c.echo(&payload) {
                    true => close(c, "churn"),
                    false => Err("the echo did not come back intact".into()),
                }
            }),
            1 => TcpStream::connect(addr).map(drop).map_err(|e| e.to_string()),
            // Its queue and subscription must go with it.
            2 => upgrade(addr, TOPIC).map(drop),
            3 => upgrade(addr, "/echo").and_then(|mut c| {
                let frame = freeboard_test::frame(0x82, &[7; 4000], freeboard_test::TEST_MASK);
                c.send_raw(&frame[..frame.len() / 2]).map_err(|e| e.to_string())?;
                socket2::SockRef::from(&c.stream)
                    .set_linger(Some(Duration::ZERO))
                    .map_err(|e| e.to_string())
            }),
            _ => TcpStream::connect(addr)
                .and_then(|mut s| s.write_all(&upgrade_request("/echo", "").as_bytes()[..40]))
                .map_err(|e| e.to_string()),
        };
        result.map_err(|e| format!("churn cycle {i} ({what}): {e}"))?;
        shared.cycles.fetch_add(1, Ordering::Relaxed);
        i += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// Connects and upgrades `path`; anything but 101 is an error naming the status.
fn upgrade(addr: SocketAddr, path: &str) -> Result<WsClient, String> {
    let (client, status, head) = WsClient::handshake(addr, &upgrade_request(path, ""))
        .map_err(|e| format!("upgrade {path}: {e}"))?;
    match status {
        101 => Ok(client),
        _ => Err(format!("upgrade {path}: {}", head.lines().next().unwrap_or(""))),
    }
}

/// Closes with 1000 and expects 1000 back.
fn close(client: WsClient, who: &str) -> Result<(), String> {
    match client.close(1000) {
        Ok(Some(1000)) => Ok(()),
        other => Err(format!("{who}: closing: {other:?}")),
    }
}
