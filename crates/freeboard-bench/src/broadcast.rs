//! One publisher, N subscribers: deliveries per second and the latency of the last subscriber
//! to get each message.
//!
//! The publisher keeps at most `window` messages in flight (a message is complete when the
//! last subscriber has it), so no slow-consumer policy needs to drop anything; latency runs
//! from publishing to the last subscriber's receipt, so with a window above 1 it includes
//! waiting behind the other messages in flight (`window` 1 measures one message alone).
//! Subscribers are read from one `mio` thread, the publisher writes from another.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use serde::{Deserialize, Serialize};

use freeboard_test::{RawHeader, parse_frame};

use crate::Target;
use crate::load::{Rng, open};

/// One broadcast run.
#[derive(Debug, Clone)]
pub struct Broadcast {
    /// Where subscribers connect, e.g. `ws://127.0.0.1:9001/topic/bench`; with several
    /// targets (nodes of one Redis backplane), subscriber `i` goes to target `i % len`.
    pub subscribe: Vec<Target>,
    /// Where the publisher connects (freeboard: the same topic, with `--client-publish`; the
    /// Node peer: `/pub`).
    pub publish: Target,
    /// Subscribers.
    pub subscribers: usize,
    /// Payload bytes per message, 16 to 65,535.
    pub size: usize,
    /// Messages in flight at most.
    pub window: u64,
    /// Messages to publish.
    pub messages: u64,
}

/// What a run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BroadcastRow {
    /// The server's name.
    pub server: String,
    /// Subscribers connected.
    pub subscribers: usize,
    /// Payload bytes.
    pub size: usize,
    /// Messages in flight at most.
    pub window: u64,
    /// Messages every subscriber received.
    pub messages: u64,
    /// Messages × subscribers per second.
    pub deliveries_per_sec: f64,
    /// Publish-to-last-subscriber latency, ms: p50, p99, max.
    pub latency_ms: [f64; 3],
}

/// How long the subscribers may go without any input before the run is abandoned.
const STALL: Duration = Duration::from_secs(10);

/// Runs `b`; `tick` gets the number of completed messages now and then.
pub fn run(b: &Broadcast, server: &str, tick: &mut dyn FnMut(u64)) -> io::Result<BroadcastRow> {
    if !(16..=65_535).contains(&b.size) {
        return Err(io::Error::other("broadcast payloads are 16 to 65,535 bytes"));
    }
    let mut rng = Rng::seeded();
    let mut poll = Poll::new()?;
    let mut subs = Vec::with_capacity(b.subscribers);
    if b.subscribe.is_empty() {
        return Err(io::Error::other("no target to subscribe at"));
    }
    for i in 0..b.subscribers {
        let target = &b.subscribe[i % b.subscribe.len()];
        let (s, leftover) = open(target, Duration::from_secs(5), &mut rng)?;
        s.set_nonblocking(true)?;
        let mut s = mio::net::TcpStream::from_std(s);
        poll.registry().register(&mut s, Token(i), Interest::READABLE)?;
        subs.push((s, leftover));
    }
    std::thread::sleep(Duration::from_millis(200)); // subscriptions settle
    let (mut publisher, _) = open(&b.publish, Duration::from_secs(5), &mut rng)?;
    publisher.set_read_timeout(None)?;
    // A server that stops reading the publisher fails the run instead of hanging it.
    publisher.set_write_timeout(Some(STALL))?;
    let start = Instant::now();
    let completed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicU64::new(0));
    let (messages, window, size) = (b.messages, b.window.max(1), b.size);
    let raw = b.publish.raw;
    let publisher = {
        let (completed, stop) = (completed.clone(), stop.clone());
        // The thread gives the stream back rather than closing it: the publisher never reads
        // (on freeboard it is a subscriber too), and closing a socket with unread input sends
        // a reset, which would make the server discard the last messages it has not read yet.
        std::thread::spawn(move || -> io::Result<std::net::TcpStream> {
            // A raw fan-out passes frames on verbatim, so they go unmasked, as a server's. A
            // zero masking key is a valid key and leaves the payload as it is, so the frame is
            // written once and only the first 16 bytes of its payload change per message.
            let header = RawHeader::new(0x82, size as u64, if raw { None } else { Some([0; 4]) });
            let head = header.len();
            let mut frame = vec![0u8; head + size];
            header.encode(&mut frame).map_err(io::Error::other)?;
            for seq in 0..messages {
                while seq >= completed.load(Ordering::Acquire) + window {
                    if stop.load(Ordering::Relaxed) != 0 {
                        return Ok(publisher);
                    }
                    // Sleep rather than spin: on a small machine a spinning publisher would
                    // take a core from the server and the subscribers.
                    std::thread::sleep(Duration::from_micros(20));
                }
                frame[head..head + 8].copy_from_slice(&seq.to_le_bytes());
                let t = start.elapsed().as_nanos() as u64;
                frame[head + 8..head + 16].copy_from_slice(&t.to_le_bytes());
                publisher.write_all(&frame)?;
            }
            Ok(publisher)
        })
    };
    let n = b.subscribers;
    let mut counts = vec![0usize; messages as usize];
    let mut latencies = Vec::with_capacity(messages as usize);
    let mut events = Events::with_capacity(4096);
    let mut buf = vec![0u8; 1 << 16];
    let mut done = 0u64;
    let mut failure = None;
    let mut last_tick = Instant::now();
    'run: while done < messages {
        poll.poll(&mut events, Some(STALL))?;
        if events.is_empty() {
            let short: Vec<String> = counts
                .iter()
                .enumerate()
                .filter(|&(_, &c)| c < n)
                .take(5)
                .map(|(seq, c)| format!("message {seq} reached {c}"))
                .collect();
            failure = Some(format!(
                "stalled after {done} of {messages} messages ({} of {n} subscribers)",
                short.join(", ")
            ));
            break;
        }
        for event in events.iter() {
            let (s, pending) = &mut subs[event.token().0];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => {
                        failure = Some("a subscriber was closed".to_string());
                        break 'run;
                    }
                    Ok(k) => {
                        pending.extend_from_slice(&buf[..k]);
                        // A short read emptied the socket: the next arrival raises a new
                        // edge, so the read that would say `WouldBlock` can be saved.
                        if k < buf.len() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        failure = Some(e.to_string());
                        break 'run;
                    }
                }
            }
            let mut at = 0;
            loop {
                let (_, payload) = match parse_frame(&pending[at..]) {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(e) => {
                        failure = Some(format!("a subscriber got an invalid frame: {e}"));
                        break 'run;
                    }
                };
                let p = &pending[at + payload.start..at + payload.end];
                at += payload.end;
                if p.len() < 16 {
                    continue; // not ours
                }
                let seq = u64::from_le_bytes(p[..8].try_into().expect("8 bytes")) as usize;
                let Some(count) = counts.get_mut(seq) else { continue };
                *count += 1;
                if *count == n {
                    let sent = u64::from_le_bytes(p[8..16].try_into().expect("8 bytes"));
                    let now = start.elapsed().as_nanos() as u64;
                    latencies.push(now.saturating_sub(sent));
                    done += 1;
                    completed.store(done, Ordering::Release);
                }
            }
            pending.drain(..at);
        }
        if last_tick.elapsed() > Duration::from_millis(100) {
            tick(done);
            last_tick = Instant::now();
        }
    }
    let elapsed = start.elapsed();
    stop.store(1, Ordering::Relaxed);
    // The publisher's stream closes when this function returns, after every subscriber's
    // last read.
    let published = publisher.join().map_err(|_| io::Error::other("the publisher panicked"))?;
    if let Some(failure) = failure {
        return Err(io::Error::other(failure));
    }
    let _publisher = published?;
    latencies.sort_unstable();
    let ms = |q: f64| {
        latencies
            .get(((latencies.len().max(1) - 1) as f64 * q) as usize)
            .map_or(0.0, |&ns| ns as f64 / 1e6)
    };
    Ok(BroadcastRow {
        server: server.into(),
        subscribers: n,
        size,
        window,
        messages: done,
        deliveries_per_sec: (done * n as u64) as f64 / elapsed.as_secs_f64(),
        latency_ms: [ms(0.5), ms(0.99), ms(1.0)],
    })
}

/// Messages per run for `subscribers`: 2,000,000 deliveries, 100 to 2,000 messages.
pub fn default_messages(subscribers: usize) -> u64 {
    (2_000_000 / subscribers.max(1) as u64).clamp(100, 2_000)
}
