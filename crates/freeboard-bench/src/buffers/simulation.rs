//! The LED controller's allocation pattern over simulated hours, run through freeboard's chunk
//! pool and through a TLSF heap, event by event (idle time costs nothing).
//!
//! # The workload (one seed gives one sequence of events, the same for every allocator)
//!
//! - **Frames**: `producers` clients (2) each send a `frame_bytes` (960 B: 320 RGB LEDs) frame
//!   every 1/`fps` s (60 FPS) with ±2 ms of network jitter. Each frame is stored until the LED
//!   driver has shown it.
//! - **The LED driver** (the consumer) takes stored messages in arrival order: 0.5–1.5 ms per
//!   frame, 5 ms per pattern message. It stalls now and then (flash writes, Wi-Fi
//!   re-association): every 15 s on average (exponential), 70 % of stalls last 20–100 ms, 25 %
//!   100–800 ms and 5 % 0.8–4 s, so queues build up to the budget and beyond.
//! - **Pattern switches**: each client publishes a new pattern every 90 s on average, a
//!   2–12 KiB message; if it cannot be stored the client retries every 50 ms. The latency of a
//!   switch runs from the first attempt to the delivery (the driver showing it) of the first
//!   frame stored after the pattern message.
//! - **Everything else a device allocates**: status/telemetry buffers (every 2 s on average,
//!   128 B–6 KiB log-uniform, held 50 ms–120 s log-uniform), and per client connection state
//!   (1.5 KiB, held for the connection's life) plus a 2 KiB handshake buffer held 20 ms at
//!   each reconnect (every 20 min on average per client). A client whose state cannot be
//!   allocated is disconnected and retries every second; its frames meanwhile are lost.
//!
//! Every store that fails is refused (the newest message is the one dropped), for both
//! allocators, so the offered load is identical and only the allocator differs.
//!
//! # The allocators
//!
//! - **Pool**: a [`Budget`] of `budget` bytes, a [`Pool`] of `chunk`-byte chunks with
//!   `chunk / 512 + 2` segment slots per chunk (enough for one message per 512 B, plus the
//!   pieces where messages cross chunks) sized to leave the connection states' bytes in the
//!   budget; each client's messages go to its own [`SendQueue`] (packed into chunks, a message
//!   may span several), every other buffer to a queue of its own, and connection state is drawn
//!   from the budget as bytes ([`Budget::try_draw`]).
//! - **TLSF, buffer per message**: an [`rlsf::Tlsf`] over a `budget`-byte arena; each message
//!   takes `ceil(len / buffer)` allocations of `buffer` bytes (as firmware does with a fixed
//!   receive-buffer size: one buffer per frame, larger messages in buffer-size pieces); other
//!   buffers and state are allocated at their exact size.
//! - **TLSF, exact size**: the same heap, each message allocated at its exact size.
//!
//! Fragmentation index: `1 − largest free block / total free` (see
//! [`freeboard_buf::fragmentation_index`]), sampled every `sample_every`. Memory overhead is
//! reported in two parts: fixed metadata (pool: chunk and segment slots for every chunk; TLSF:
//! its control structure), and slack — the share of the memory taken for stored items (pool:
//! chunks in use and drawn state; TLSF: occupied blocks with their headers) that is not
//! payload, averaged over samples.
//! TLSF figures are measured on this 64-bit host, where its granularity is 32 B and a block
//! header 16 B (a 32-bit MCU has half of each).

use std::alloc::Layout;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use freeboard_buf::{
    Budget, Pool, PoolConfig, PushOutcome, SendQueue, SlowConsumerPolicy, Watermarks,
};
use serde::{Deserialize, Serialize};

/// The workload: what the device receives and how its driver drains it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Workload {
    /// Seeds every random choice; the same seed gives the same events.
    pub seed: u64,
    /// Simulated seconds.
    pub seconds: u64,
    /// Clients sending frames.
    pub producers: usize,
    /// Frames per second per client.
    pub fps: u32,
    /// Payload bytes per frame.
    pub frame_bytes: usize,
    /// Bytes of memory for all buffers.
    pub budget: usize,
    /// Simulated seconds between fragmentation samples.
    pub sample_every: u64,
}

impl Default for Workload {
    /// The LED controller: 2 clients × 60 FPS × 960 B, 400 KiB, 24 hours, a sample a minute.
    fn default() -> Self {
        Self {
            seed: 7,
            seconds: 24 * 3600,
            producers: 2,
            fps: 60,
            frame_bytes: 960,
            budget: 400 << 10,
            sample_every: 60,
        }
    }
}

/// Where the device's messages are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Allocator {
    /// freeboard's budget and chunk pool, chunks of this many bytes.
    Pool {
        /// Chunk bytes.
        chunk: usize,
    },
    /// A TLSF heap, one `buffer`-byte allocation per message (per `buffer` bytes of it).
    TlsfBuffer {
        /// Buffer bytes.
        buffer: usize,
    },
    /// A TLSF heap, each message allocated at its exact size.
    TlsfExact,
}

impl Allocator {
    /// `pool`, `tlsf` or `tlsf exact`.
    pub fn name(self) -> &'static str {
        match self {
            Allocator::Pool { .. } => "freeboard pool",
            Allocator::TlsfBuffer { .. } => "TLSF, buffer/msg",
            Allocator::TlsfExact => "TLSF, exact size",
        }
    }

    /// The chunk or buffer size; 0 for exact-size allocation.
    pub fn size(self) -> usize {
        match self {
            Allocator::Pool { chunk } => chunk,
            Allocator::TlsfBuffer { buffer } => buffer,
            Allocator::TlsfExact => 0,
        }
    }
}

/// One sample of the allocator's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SimSample {
    /// Simulated seconds since the start.
    pub t: u64,
    /// `1 − largest free block / total free`.
    pub fragmentation: f64,
    /// Bytes the allocator has taken (payload, headers, slack, metadata).
    pub taken: usize,
    /// Payload bytes stored.
    pub payload: usize,
    /// Bytes free.
    pub free: usize,
    /// The largest single request that would succeed, bytes.
    pub largest_free: usize,
}

/// What one allocator did with the workload.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SimOutcome {
    /// [`Allocator::name`].
    pub allocator: String,
    /// Chunk or buffer bytes (0: exact size).
    pub size: usize,
    /// Allocation requests (frames, pattern messages and their retries, other buffers,
    /// connection state), and how many succeeded.
    pub requests: u64,
    /// Requests that succeeded.
    pub successes: u64,
    /// Frames the clients sent.
    pub frames_offered: u64,
    /// Frames the driver showed.
    pub frames_delivered: u64,
    /// Frames refused for want of memory.
    pub frames_refused: u64,
    /// Frames lost while their client was disconnected (its state could not be allocated).
    pub frames_lost_disconnected: u64,
    /// Frames still stored at the end.
    pub frames_queued_at_end: u64,
    /// Delivered frames per second per client.
    pub delivered_fps: f64,
    /// Pattern switches completed, and switches started.
    pub pattern_switches: (u64, u64),
    /// Pattern-switch latency, ms: p50, p99, max.
    pub pattern_latency_ms: [f64; 3],
    /// Fragmentation index: mean and max over samples, and the last sample.
    pub fragmentation: [f64; 3],
    /// Slack: the mean share of the memory taken for items (fixed metadata aside) that was
    /// not payload — TLSF block headers and rounding, unused parts of buffers and of chunks —
    /// over samples with something stored.
    pub overhead: f64,
    /// Fixed metadata bytes (pool slots; TLSF control structure).
    pub metadata_bytes: usize,
    /// Most bytes taken at a sample.
    pub peak_taken: usize,
    /// Slack at that sample (when the heap was fullest: a driver stall).
    #[serde(default)]
    pub slack_at_peak: f64,
    /// Samples every `sample_every` simulated seconds.
    pub samples: Vec<SimSample>,
}

impl SimOutcome {
    /// Successful requests over all requests.
    pub fn success_rate(&self) -> f64 {
        if self.requests == 0 { 1.0 } else { self.successes as f64 / self.requests as f64 }
    }
}

/// Runs `workload` through `allocator`; `tick` gets the simulated second now and then.
pub fn simulate(
    workload: &Workload,
    allocator: Allocator,
    tick: &mut dyn FnMut(u64),
) -> Result<SimOutcome, String> {
    let mut outcome = match allocator {
        Allocator::Pool { chunk } => {
            let mut heap = PoolHeap::new(workload, chunk)?;
            let outcome = Simulation::new(workload, &mut heap).run(tick);
            heap.release_all();
            outcome
        }
        Allocator::TlsfBuffer { buffer } => {
            Simulation::new(workload, &mut TlsfHeap::new(workload.budget, Some(buffer))).run(tick)
        }
        Allocator::TlsfExact => {
            Simulation::new(workload, &mut TlsfHeap::new(workload.budget, None)).run(tick)
        }
    };
    outcome.allocator = allocator.name().into();
    outcome.size = allocator.size();
    Ok(outcome)
}

/// Bytes of connection state per client.
const STATE_BYTES: usize = 1536;
/// Bytes of the handshake buffer at each (re)connect.
const HANDSHAKE_BYTES: usize = 2048;
/// Microseconds per second.
const S: u64 = 1_000_000;
/// Microseconds per millisecond.
const MS: u64 = 1_000;

/// What a stored message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Frame,
    Pattern,
}

/// Something that happens at a simulated instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Frame(usize),
    PatternSwitch(usize),
    PatternRetry(usize),
    Reconnect(usize),
    HandshakeDone(usize),
    Buffer,
    BufferFree(u64),
    StallStart,
    DriverWake,
    Sample,
}

/// The allocator under test, as the simulation sees it.
trait Heap {
    type Handle;
    /// Stores a message of `len` bytes of client `producer`.
    fn store_message(&mut self, producer: usize, len: usize) -> Option<Self::Handle>;
    /// Stores a buffer of `len` bytes that is not a client's message.
    fn store_buffer(&mut self, len: usize) -> Option<Self::Handle>;
    /// Takes `len` bytes of long-lived state.
    fn take_state(&mut self, len: usize) -> Option<Self::Handle>;
    /// Gives back what `handle` holds (messages in the order they were stored, per client).
    fn release(&mut self, handle: Self::Handle);
    /// Bytes taken, free, and the largest free block.
    fn sample(&self) -> (usize, usize, usize);
    /// Fixed metadata bytes.
    fn metadata_bytes(&self) -> usize;
}

/// A message waiting for the driver.
struct Stored<H> {
    producer: usize,
    kind: Kind,
    len: usize,
    handle: H,
    /// The start of the pattern switch whose first frame this is.
    switch_started: Option<u64>,
}

/// One client as the device sees it.
#[derive(Default)]
struct Client<H> {
    state: Option<H>,
    handshake: Option<H>,
    /// A pattern message not yet stored: when the switch started, and its bytes.
    pattern_pending: Option<(u64, usize)>,
    /// The pattern message is stored; the next stored frame is the first of the pattern.
    first_frame_of: Option<u64>,
}

struct Simulation<'h, H: Heap> {
    workload: &'h Workload,
    heap: &'h mut H,
    /// One random stream per source of events, so what one allocator refuses never shifts
    /// another source's sequence: the offered load is the same for every allocator.
    rng: Streams,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    clients: Vec<Client<H::Handle>>,
    queue: VecDeque<Stored<H::Handle>>,
    buffers: std::collections::HashMap<u64, (usize, H::Handle)>,
    next_buffer: u64,
    /// The driver is showing a message until this instant, or stalled until it.
    driver_busy_until: u64,
    driver_stalled: bool,
    payload: usize,
    latencies: Vec<u64>,
    outcome: SimOutcome,
}

impl<'h, H: Heap> Simulation<'h, H> {
    fn new(workload: &'h Workload, heap: &'h mut H) -> Self {
        Self {
            workload,
            heap,
            rng: Streams::new(workload.seed, workload.producers),
            events: BinaryHeap::new(),
            seq: 0,
            clients: (0..workload.producers)
                .map(|_| Client {
                    state: None,
                    handshake: None,
                    pattern_pending: None,
                    first_frame_of: None,
                })
                .collect(),
            queue: VecDeque::new(),
            buffers: std::collections::HashMap::new(),
            next_buffer: 0,
            driver_busy_until: 0,
            driver_stalled: false,
            payload: 0,
            latencies: Vec::new(),
            outcome: SimOutcome::default(),
        }
    }

    fn at(&mut self, t: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, event)));
    }

    fn run(mut self, tick: &mut dyn FnMut(u64)) -> SimOutcome {
        let w = self.workload;
        let period = S / u64::from(w.fps.max(1));
        for p in 0..w.producers {
            // Clients connect at the start, a little apart.
            self.at(p as u64 * 3 * MS, Event::Reconnect(p));
            let first = p as u64 * 3 * MS + 50 * MS + self.rng.frames[p].below(period);
            self.at(first, Event::Frame(p));
            let first = self.rng.patterns[p].exp(90.0 * S as f64);
            self.at(first, Event::PatternSwitch(p));
        }
        let first = self.rng.buffers.exp(2.0 * S as f64);
        self.at(first, Event::Buffer);
        let first = self.rng.stalls.exp(15.0 * S as f64);
        self.at(first, Event::StallStart);
        self.at(0, Event::Sample);
        let end = w.seconds * S;
        let mut next_tick = 0;
        while let Some(Reverse((now, _, event))) = self.events.pop() {
            if now >= end {
                break;
            }
            if now >= next_tick {
                tick(now / S);
                next_tick = now + 600 * S;
            }
            self.handle(now, event, period);
        }
        self.finish(end)
    }

    fn handle(&mut self, now: u64, event: Event, period: u64) {
        let w = self.workload;
        match event {
            Event::Frame(p) => {
                self.outcome.frames_offered += 1;
                let jitter = self.rng.frames[p].below(4 * MS);
                self.at(now + period - 2 * MS + jitter, Event::Frame(p));
                if self.clients[p].state.is_none() {
                    self.outcome.frames_lost_disconnected += 1;
                } else if self.store(
                    now,
                    p,
                    Kind::Frame,
                    w.frame_bytes,
                    self.clients[p].first_frame_of,
                ) {
                    self.clients[p].first_frame_of = None;
                } else {
                    self.outcome.frames_refused += 1;
                }
            }
            Event::PatternSwitch(p) => {
                let next = now + self.rng.patterns[p].exp(90.0 * S as f64);
                self.at(next, Event::PatternSwitch(p));
                // A size is drawn at every switch, taken or not, to keep the sequence fixed.
                let len = 2048 + self.rng.patterns[p].below(10 * 1024) as usize;
                let client = &mut self.clients[p];
                if client.pattern_pending.is_none() && client.state.is_some() {
                    client.pattern_pending = Some((now, len));
                    self.outcome.pattern_switches.1 += 1;
                    self.try_pattern(now, p);
                }
            }
            Event::PatternRetry(p) => self.try_pattern(now, p),
            Event::Reconnect(p) => {
                if let Some(old) = self.clients[p].state.take() {
                    self.heap.release(old);
                    self.payload -= STATE_BYTES;
                }
                self.outcome.requests += 1;
                match self.heap.take_state(STATE_BYTES) {
                    Some(state) => {
                        self.outcome.successes += 1;
                        self.payload += STATE_BYTES;
                        self.clients[p].state = Some(state);
                        self.outcome.requests += 1;
                        if let Some(hs) = self.heap.store_buffer(HANDSHAKE_BYTES) {
                            self.outcome.successes += 1;
                            self.payload += HANDSHAKE_BYTES;
                            if let Some(old) = self.clients[p].handshake.replace(hs) {
                                self.heap.release(old);
                                self.payload -= HANDSHAKE_BYTES;
                            }
                            self.at(now + 20 * MS, Event::HandshakeDone(p));
                        }
                        let next = now + self.rng.reconnects[p].exp(20.0 * 60.0 * S as f64);
                        self.at(next, Event::Reconnect(p));
                    }
                    // Disconnected: try again in a second.
                    None => self.at(now + S, Event::Reconnect(p)),
                }
            }
            Event::HandshakeDone(p) => {
                if let Some(hs) = self.clients[p].handshake.take() {
                    self.heap.release(hs);
                    self.payload -= HANDSHAKE_BYTES;
                }
            }
            Event::Buffer => {
                let rng = &mut self.rng.buffers;
                let next = now + rng.exp(2.0 * S as f64);
                let len = rng.log_uniform(128.0, 6144.0) as usize;
                let hold = rng.log_uniform(50.0 * MS as f64, 120.0 * S as f64) as u64;
                self.at(next, Event::Buffer);
                self.outcome.requests += 1;
                if let Some(handle) = self.heap.store_buffer(len) {
                    self.outcome.successes += 1;
                    self.payload += len;
                    let id = self.next_buffer;
                    self.next_buffer += 1;
                    self.buffers.insert(id, (len, handle));
                    self.at(now + hold, Event::BufferFree(id));
                }
            }
            Event::BufferFree(id) => {
                if let Some((len, handle)) = self.buffers.remove(&id) {
                    self.heap.release(handle);
                    self.payload -= len;
                }
            }
            Event::StallStart => {
                let rng = &mut self.rng.stalls;
                let next = now + rng.exp(15.0 * S as f64);
                let r = rng.unit();
                let ms = if r < 0.70 {
                    20.0 + 80.0 * rng.unit()
                } else if r < 0.95 {
                    100.0 + 700.0 * rng.unit()
                } else {
                    800.0 + 3200.0 * rng.unit()
                };
                self.at(next, Event::StallStart);
                let until = self.driver_busy_until.max(now) + (ms * MS as f64) as u64;
                self.driver_busy_until = until;
                self.driver_stalled = true;
                self.at(until, Event::DriverWake);
            }
            Event::DriverWake => {
                if now >= self.driver_busy_until {
                    self.driver_stalled = false;
                    self.show_next(now);
                }
            }
            Event::Sample => {
                self.at(now + w.sample_every * S, Event::Sample);
                let (taken, free, largest_free) = self.heap.sample();
                self.outcome.samples.push(SimSample {
                    t: now / S,
                    fragmentation: freeboard_buf::fragmentation_index(largest_free, free),
                    taken,
                    payload: self.payload,
                    free,
                    largest_free,
                });
            }
        }
    }

    /// Stores a message and wakes the driver if it was idle; false if refused.
    /// `switch_started`: the frame is the first of a pattern switch started then.
    fn store(
        &mut self,
        now: u64,
        producer: usize,
        kind: Kind,
        len: usize,
        switch_started: Option<u64>,
    ) -> bool {
        self.outcome.requests += 1;
        let Some(handle) = self.heap.store_message(producer, len) else { return false };
        self.outcome.successes += 1;
        self.payload += len;
        self.queue.push_back(Stored { producer, kind, len, handle, switch_started });
        if !self.driver_stalled && now >= self.driver_busy_until && self.queue.len() == 1 {
            self.show_next(now);
        }
        true
    }

    fn try_pattern(&mut self, now: u64, p: usize) {
        let Some((started, len)) = self.clients[p].pattern_pending else { return };
        if self.clients[p].state.is_some() && self.store(now, p, Kind::Pattern, len, None) {
            self.clients[p].pattern_pending = None;
            self.clients[p].first_frame_of = Some(started);
        } else {
            self.at(now + 50 * MS, Event::PatternRetry(p));
        }
    }

    /// The driver takes the oldest message, shows it and frees it when done.
    fn show_next(&mut self, now: u64) {
        let Some(message) = self.queue.pop_front() else { return };
        let busy = match message.kind {
            Kind::Frame => 500 + self.rng.driver.below(MS),
            Kind::Pattern => 5 * MS,
        };
        let done = now + busy;
        if message.kind == Kind::Frame {
            self.outcome.frames_delivered += 1;
            if let Some(started) = message.switch_started {
                self.latencies.push(done - started);
            }
        }
        let _ = message.producer;
        self.heap.release(message.handle);
        self.payload -= message.len;
        self.driver_busy_until = done;
        self.at(done, Event::DriverWake);
    }

    fn finish(mut self, end: u64) -> SimOutcome {
        let mut o = std::mem::take(&mut self.outcome);
        o.frames_queued_at_end = self.queue.iter().filter(|m| m.kind == Kind::Frame).count() as u64;
        for m in self.queue.drain(..) {
            self.heap.release(m.handle);
        }
        for (_, (_, handle)) in self.buffers.drain() {
            self.heap.release(handle);
        }
        for client in &mut self.clients {
            for handle in [client.state.take(), client.handshake.take()].into_iter().flatten() {
                self.heap.release(handle);
            }
        }
        let seconds = (end / S).max(1) as f64;
        o.delivered_fps = o.frames_delivered as f64 / seconds / self.workload.producers as f64;
        o.pattern_switches.0 = self.latencies.len() as u64;
        self.latencies.sort_unstable();
        let q = |q: f64| -> f64 {
            if self.latencies.is_empty() {
                return 0.0;
            }
            let i = ((self.latencies.len() - 1) as f64 * q).round() as usize;
            self.latencies[i] as f64 / MS as f64
        };
        o.pattern_latency_ms = [q(0.5), q(0.99), q(1.0)];
        let n = o.samples.len().max(1) as f64;
        o.fragmentation = [
            o.samples.iter().map(|s| s.fragmentation).sum::<f64>() / n,
            o.samples.iter().map(|s| s.fragmentation).fold(0.0, f64::max),
            o.samples.last().map_or(0.0, |s| s.fragmentation),
        ];
        o.metadata_bytes = self.heap.metadata_bytes();
        let slack: Vec<f64> = o
            .samples
            .iter()
            .map(|s| s.taken.saturating_sub(o.metadata_bytes))
            .zip(o.samples.iter().map(|s| s.payload))
            .filter(|&(taken, payload)| taken > 0 && payload > 0)
            .map(|(taken, payload)| 1.0 - payload as f64 / taken as f64)
            .collect();
        o.overhead = slack.iter().sum::<f64>() / slack.len().max(1) as f64;
        if let Some(peak) = o.samples.iter().max_by_key(|s| s.taken) {
            o.peak_taken = peak.taken;
            let taken = peak.taken.saturating_sub(o.metadata_bytes);
            o.slack_at_peak =
                if taken > 0 { 1.0 - peak.payload.min(taken) as f64 / taken as f64 } else { 0.0 };
        }
        o
    }
}

/// freeboard's budget and pool, one send queue per client.
struct PoolHeap {
    pool: Pool<'static>,
    queues: Vec<SendQueue>,
    /// Queues of other buffers; `None` slots are free.
    buffers: Vec<Option<SendQueue>>,
    free_slots: Vec<usize>,
    metadata: usize,
    chunk_total: usize,
}

/// What the pool side holds for one stored item.
enum PoolHandle {
    /// A message of `len` bytes at the head of client `producer`'s queue (when released).
    Message { producer: usize, len: usize },
    /// A buffer in its own queue.
    Buffer(usize),
    /// Bytes drawn from the budget.
    State(usize),
}

impl PoolHeap {
    fn new(workload: &Workload, chunk: usize) -> Result<Self, String> {
        let segments = chunk / 512 + 2;
        let reserve = workload.producers * STATE_BYTES;
        let per_chunk = Pool::footprint(chunk, 1, segments);
        let chunks = workload.budget.saturating_sub(reserve) / per_chunk;
        let config = PoolConfig::new()
            .with_chunk_size(chunk)
            .with_chunk_count(chunks)
            .with_segments_per_chunk(segments);
        let pool = Pool::new(Budget::new(workload.budget), config).map_err(|e| e.to_string())?;
        Ok(Self {
            metadata: pool.footprint_bytes() - chunks * chunk,
            chunk_total: chunks,
            pool,
            queues: (0..workload.producers).map(|_| unbounded_queue()).collect(),
            buffers: Vec::new(),
            free_slots: Vec::new(),
        })
    }

    fn push(pool: &mut Pool<'static>, queue: &mut SendQueue, len: usize) -> bool {
        static ZEROS: [u8; 16 << 10] = [0; 16 << 10];
        let mut parts: [&[u8]; 8] = [&[]; 8];
        let mut rest = len;
        for part in &mut parts {
            let n = rest.min(ZEROS.len());
            *part = &ZEROS[..n];
            rest -= n;
        }
        debug_assert_eq!(rest, 0, "messages up to 128 KiB");
        matches!(
            queue.push_message(pool, &parts).outcome,
            PushOutcome::Queued | PushOutcome::QueuedAboveHigh
        )
    }

    /// Empties every queue (the pool would otherwise report chunks in use).
    fn release_all(&mut self) {
        for q in self.queues.iter_mut().chain(self.buffers.iter_mut().flatten()) {
            let _ = q.clear(&mut self.pool);
        }
    }
}

/// A queue whose only limit is the pool (no cap below it), refusing what the pool cannot hold.
fn unbounded_queue() -> SendQueue {
    let top = Watermarks::MAX_CAP;
    // NOTE(unwrap): low <= high <= cap <= MAX_CAP.
    let marks = Watermarks::new(top, top, top).expect("ordered marks");
    SendQueue::new(marks, SlowConsumerPolicy::Block)
}

impl Heap for PoolHeap {
    type Handle = PoolHandle;

    fn store_message(&mut self, producer: usize, len: usize) -> Option<PoolHandle> {
        Self::push(&mut self.pool, &mut self.queues[producer], len)
            .then_some(PoolHandle::Message { producer, len })
    }

    fn store_buffer(&mut self, len: usize) -> Option<PoolHandle> {
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.buffers.push(None);
                self.buffers.len() - 1
            }
        };
        let mut queue = unbounded_queue();
        if Self::push(&mut self.pool, &mut queue, len) {
            self.buffers[slot] = Some(queue);
            Some(PoolHandle::Buffer(slot))
        } else {
            self.free_slots.push(slot);
            None
        }
    }

    fn take_state(&mut self, len: usize) -> Option<PoolHandle> {
        self.pool.budget_mut().try_draw(len).ok().map(|()| PoolHandle::State(len))
    }

    fn release(&mut self, handle: PoolHandle) {
        match handle {
            PoolHandle::Message { producer, len } => {
                let _ = self.queues[producer].consume(&mut self.pool, len);
            }
            PoolHandle::Buffer(slot) => {
                if let Some(mut queue) = self.buffers[slot].take() {
                    let _ = queue.clear(&mut self.pool);
                }
                self.free_slots.push(slot);
            }
            PoolHandle::State(len) => self.pool.budget_mut().give_back(len),
        }
    }

    fn sample(&self) -> (usize, usize, usize) {
        let chunk = self.pool.chunk_size();
        let in_use = self.pool.chunks_in_use();
        let state = self.pool.budget().drawn() - self.pool.footprint_bytes();
        let taken = in_use * chunk + self.metadata + state;
        // Any free chunk serves any request: chains span chunks.
        let free = (self.chunk_total - in_use) * chunk;
        (taken, free, free)
    }

    fn metadata_bytes(&self) -> usize {
        self.metadata
    }
}

/// The TLSF control structure: first level up to 32 B << 16 (2 MiB blocks), 32 second-level
/// lists (as ESP-IDF's `SL_INDEX_COUNT_LOG2 = 5`).
type Tlsf = rlsf::Tlsf<'static, u32, u32, 16, 32>;

/// A TLSF heap over an arena of its own.
struct TlsfHeap {
    tlsf: Box<Tlsf>,
    /// The memory `tlsf` manages. Invariant: outlives `tlsf`'s use of it (both are dropped
    /// together, and `Tlsf` has no `Drop`), and is only reached through `tlsf`.
    arena: NonNull<[u8]>,
    /// The whole allocation behind `arena`, from `Box::into_raw`; freed in `Drop`.
    storage: NonNull<[MaybeUninit<u8>]>,
    /// `None`: exact sizes; `Some(b)`: messages in `b`-byte buffers.
    buffer: Option<usize>,
}

/// The blocks of one stored item (most items have one).
enum TlsfHandle {
    One(NonNull<u8>),
    Many(Vec<NonNull<u8>>),
}

const ALIGN: usize = 4;

impl TlsfHeap {
    fn new(bytes: usize, buffer: Option<usize>) -> Self {
        let storage: Box<[MaybeUninit<u8>]> = vec![MaybeUninit::uninit(); bytes].into();
        let storage = NonNull::from(Box::leak(storage));
        let mut tlsf = Box::new(Tlsf::new());
        let ptr = storage.cast::<u8>();
        let block = NonNull::slice_from_raw_parts(ptr, bytes);
        // SAFETY: the arena is valid for reads and writes, owned by this heap, handed to no one
        // else, and lives as long as `tlsf` (same struct, dropped together).
        let len = unsafe { tlsf.insert_free_block_ptr(block) }.map_or(0, |n| n.get());
        let arena = NonNull::slice_from_raw_parts(ptr, len);
        Self { tlsf, arena, storage, buffer }
    }

    fn alloc(&mut self, len: usize) -> Option<NonNull<u8>> {
        self.tlsf.allocate(Layout::from_size_align(len.max(1), ALIGN).ok()?)
    }

    fn free(&mut self, ptr: NonNull<u8>) {
        // SAFETY: `ptr` came from `self.tlsf.allocate` with alignment `ALIGN` and is freed once
        // (handles are moved into `release`).
        unsafe { self.tlsf.deallocate(ptr, ALIGN) }
    }
}

impl Drop for TlsfHeap {
    fn drop(&mut self) {
        // SAFETY: `storage` came from `Box::leak` in `new` and is freed only here; `tlsf`
        // is not used after this (it has no `Drop` of its own that would touch the arena).
        drop(unsafe { Box::from_raw(self.storage.as_ptr()) });
    }
}

impl Heap for TlsfHeap {
    type Handle = TlsfHandle;

    fn store_message(&mut self, _producer: usize, len: usize) -> Option<TlsfHandle> {
        let Some(buffer) = self.buffer else { return self.alloc(len).map(TlsfHandle::One) };
        let pieces = len.div_ceil(buffer);
        if pieces == 1 {
            return self.alloc(buffer).map(TlsfHandle::One);
        }
        let mut held = Vec::with_capacity(pieces);
        for _ in 0..pieces {
            match self.alloc(buffer) {
                Some(p) => held.push(p),
                None => {
                    for p in held {
                        self.free(p);
                    }
                    return None;
                }
            }
        }
        Some(TlsfHandle::Many(held))
    }

    fn store_buffer(&mut self, len: usize) -> Option<TlsfHandle> {
        self.alloc(len).map(TlsfHandle::One)
    }

    fn take_state(&mut self, len: usize) -> Option<TlsfHandle> {
        self.alloc(len).map(TlsfHandle::One)
    }

    fn release(&mut self, handle: TlsfHandle) {
        match handle {
            TlsfHandle::One(p) => self.free(p),
            TlsfHandle::Many(ps) => ps.into_iter().for_each(|p| self.free(p)),
        }
    }

    fn sample(&self) -> (usize, usize, usize) {
        let (mut taken, mut free, mut largest) = (std::mem::size_of::<Tlsf>(), 0, 0);
        // SAFETY: `arena` is exactly the block given to `insert_free_block_ptr`, trimmed to
        // the length it reported, and is the heap's only pool.
        for block in unsafe { self.tlsf.iter_blocks(self.arena) } {
            if block.is_occupied() {
                taken += block.size();
            } else {
                free += block.max_payload_size();
                largest = largest.max(block.max_payload_size());
            }
        }
        (taken, free, largest)
    }

    fn metadata_bytes(&self) -> usize {
        std::mem::size_of::<Tlsf>()
    }
}

/// The random streams of a simulation, one per source of events.
struct Streams {
    frames: Vec<Rng>,
    patterns: Vec<Rng>,
    reconnects: Vec<Rng>,
    buffers: Rng,
    stalls: Rng,
    driver: Rng,
}

impl Streams {
    fn new(seed: u64, producers: usize) -> Self {
        let stream = |n: u64| Rng(seed ^ n.wrapping_mul(0xd1b5_4a32_d192_ed03));
        let per_client = |base: u64| (0..producers as u64).map(|p| stream(base + p)).collect();
        Self {
            frames: per_client(1 << 8),
            patterns: per_client(2 << 8),
            reconnects: per_client(3 << 8),
            buffers: stream(1),
            stalls: stream(2),
            driver: stream(3),
        }
    }
}

/// splitmix64: small, seeded, and the same on every platform.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// Exponential with mean `mean`, at least 1.
    fn exp(&mut self, mean: f64) -> u64 {
        ((-(1.0 - self.unit()).ln() * mean) as u64).max(1)
    }

    /// Log-uniform in [lo, hi).
    fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + (hi.ln() - lo.ln()) * self.unit()).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn short() -> Workload {
        Workload { seconds: 30 * 60, sample_every: 10, ..Workload::default() }
    }

    fn all() -> Vec<Allocator> {
        let mut all: Vec<Allocator> = [1024, 4096, 16384]
            .into_iter()
            .flat_map(|size| {
                [Allocator::Pool { chunk: size }, Allocator::TlsfBuffer { buffer: size }]
            })
            .collect();
        all.push(Allocator::TlsfExact);
        all
    }

    #[test]
    fn counts_add_up_and_the_budget_holds() {
        let w = short();
        for allocator in all() {
            let o = simulate(&w, allocator, &mut |_| {}).unwrap();
            assert_eq!(
                o.frames_offered,
                o.frames_delivered
                    + o.frames_refused
                    + o.frames_lost_disconnected
                    + o.frames_queued_at_end,
                "{allocator:?}"
            );
            // About 60 FPS × 2 clients were offered.
            let nominal = w.seconds * 60 * 2;
            assert!(o.frames_offered.abs_diff(nominal) < nominal / 50, "{o:?}");
            assert!(o.successes <= o.requests && o.requests > o.frames_offered);
            assert!(o.frames_delivered > 0 && o.pattern_switches.0 > 0, "{allocator:?}");
            assert_eq!(o.samples.len() as u64, w.seconds / w.sample_every);
            for s in &o.samples {
                // Everything taken, metadata included, stays within the budget.
                assert!(s.taken + s.free <= w.budget + o.metadata_bytes, "{allocator:?} {s:?}");
                assert!(s.payload <= s.taken, "{allocator:?} {s:?}");
                assert!((0.0..=1.0).contains(&s.fragmentation));
            }
            if let Allocator::Pool { .. } = allocator {
                assert!(o.samples.iter().all(|s| s.fragmentation == 0.0));
                assert!(o.peak_taken <= w.budget);
            }
        }
    }

    #[test]
    fn the_pool_stays_within_its_budget_and_gives_everything_back() {
        let w = short();
        let mut heap = PoolHeap::new(&w, 2048).unwrap();
        let o = Simulation::new(&w, &mut heap).run(&mut |_| {});
        assert!(heap.pool.budget().high_water() <= w.budget);
        assert_eq!(heap.pool.chunks_in_use(), 0, "the simulation released everything");
        assert_eq!(heap.pool.budget().drawn(), heap.pool.footprint_bytes());
        assert!(o.requests > 0);
        assert_eq!(heap.pool.counters().chunks_in_use, 0);
    }

    #[test]
    fn the_same_seed_gives_the_same_result() {
        let w = Workload { seconds: 10 * 60, ..Workload::default() };
        for allocator in [Allocator::Pool { chunk: 4096 }, Allocator::TlsfBuffer { buffer: 4096 }] {
            let a = simulate(&w, allocator, &mut |_| {}).unwrap();
            let b = simulate(&w, allocator, &mut |_| {}).unwrap();
            assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
            let c = simulate(&Workload { seed: 8, ..w.clone() }, allocator, &mut |_| {}).unwrap();
            assert_ne!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&c).unwrap());
        }
    }

    #[test]
    fn the_offered_load_does_not_depend_on_the_allocator() {
        let w = short();
        let a = simulate(&w, Allocator::Pool { chunk: 1024 }, &mut |_| {}).unwrap();
        let b = simulate(&w, Allocator::TlsfBuffer { buffer: 16384 }, &mut |_| {}).unwrap();
        assert_eq!(a.frames_offered, b.frames_offered);
        assert_eq!(a.pattern_switches.1, b.pattern_switches.1);
    }
}
