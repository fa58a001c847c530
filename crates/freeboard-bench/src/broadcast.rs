//! One publisher, N subscribers: deliveries per second and the latency of the last subscriber
//! to get each message.
//!
//! The publisher keeps at most `window` messages in flight (a message is complete when the
//! last subscriber has it), so no slow-consumer policy needs to drop anything; latency runs
//! from publishing to the last subscriber's receipt, so with a window above 1 it includes
//! waiting behind the other messages in flight (`window` 1 measures one message alone).
//! Subscribers are read from one `mio` thread, the publisher writes from another.
//!
//! Payloads are JSON after a 16-byte binary prefix (sequence number, send time), so that
//! with permessage-deflate (`deflate`: the subscribers offer it) they compress as a feed
//! would. A compressed message is inflated by the first subscriber only (it checks the
//! sequence and reads the send time); the others count it in arrival order, which is publish
//! order (one publisher, one queue per subscriber, and no drops at these windows).
//!
//! With `text`, payloads are text: the prefix is 32 hex digits (sequence, send time). That
//! is what a Server-Sent Events subscriber (`sse`: a `GET` with `Accept: text/event-stream`
//! on the same topic) can be sent without base64, so the WebSocket and SSE runs of one
//! comparison carry the same payload bytes.
//!
//! With `document`, the text payload is a JSON document of rows of which each publication
//! changes about 1 % (four 20-digit values and the prefix): the load of delta compression.
//! With `delta` too, subscribers ask for it (`?delta=fossil`): each message comes whole or as
//! a Fossil delta in its envelope; the first subscriber decodes every one (it checks the
//! sequence and reads the send time), the others count them in arrival order.
//!
//! More subscribers than one process may open are held by *shards*: child processes that each
//! hold some of them and report when all of theirs have a message (see [`shard`]); the same
//! path publishes to several servers that share nothing and leaves a share of the
//! subscribers unread (`non_readers`).

pub mod shard;

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use serde::{Deserialize, Serialize};

use freeboard_test::{RawHeader, parse_frame};

use crate::Target;
use crate::load::{Rng, open, open_any};

/// One broadcast run.
#[derive(Debug, Clone)]
pub struct Broadcast {
    /// Where subscribers connect, e.g. `ws://127.0.0.1:9001/topic/bench`; with several
    /// targets (nodes of one Redis backplane), subscriber `i` goes to target `i % len`.
    pub subscribe: Vec<Target>,
    /// Where the publisher connects (freeboard: the same topic, with `--client-publish`; the
    /// Node peer: `/pub`): one connection each, every message written to each. Servers that
    /// share nothing (several freeboard processes without a backplane, several raw fan-outs)
    /// each need every message; the nodes of one backplane need one target.
    pub publish: Vec<Target>,
    /// Subscribers.
    pub subscribers: usize,
    /// Payload bytes per message, 16 to 65,535.
    pub size: usize,
    /// Messages in flight at most.
    pub window: u64,
    /// Messages to publish.
    pub messages: u64,
    /// Subscribers offer permessage-deflate.
    pub deflate: bool,
    /// The servers' processes, for their CPU time per publication and their memory.
    pub server_pids: Vec<u32>,
    /// Text payloads with a hex prefix (the WebSocket side of an SSE comparison).
    pub text: bool,
    /// Subscribers are Server-Sent Events streams (implies `text`).
    pub sse: bool,
    /// Payloads are a JSON document changing by about 1 % per publication (implies `text`).
    pub document: bool,
    /// Subscribers ask for deltas (`?delta=fossil`; implies `document`).
    pub delta: bool,
    /// Subscriber processes: 1 holds them all in this one; 0 starts as many as the open-file
    /// limit needs (one when they fit). Above 1, or with several publish targets or
    /// non-readers, the run is sharded ([`shard`]): binary payloads only.
    pub shards: usize,
    /// Percent of the subscribers (spread evenly over shards and targets) that never read.
    pub non_readers: u8,
    /// Each server's `--memory`, to set their RSS and the host's TCP buffers beside.
    pub memory: Option<u64>,
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
    /// Subscribers that agreed on permessage-deflate.
    #[serde(default)]
    pub compressing: usize,
    /// The server's CPU time (user + system) per publication, µs, when its PID is known.
    #[serde(default)]
    pub server_cpu_us_per_msg: Option<f64>,
    /// Of that, system time.
    #[serde(default)]
    pub server_sys_us_per_msg: Option<f64>,
    /// Bytes the subscribers read per delivery (frame headers included).
    #[serde(default)]
    pub wire_bytes_per_delivery: f64,
    /// The server's resident memory per subscriber, KiB: its RSS with every subscriber
    /// connected and idle, less its RSS before they connected, over their number (kernel
    /// socket memory is not in it).
    #[serde(default)]
    pub server_rss_kib_per_subscriber: Option<f64>,
    /// Subscriber processes (0: the subscribers were read in the bench's own process).
    #[serde(default)]
    pub shards: usize,
    /// Servers published to (one publisher connection each).
    #[serde(default)]
    pub servers: usize,
    /// Subscribers that never read; `deliveries_per_sec` counts the readers only.
    #[serde(default)]
    pub non_readers: usize,
    /// Messages the readers received in all: `messages` × readers when none lost one.
    #[serde(default)]
    pub reader_deliveries: u64,
    /// Messages the servers dropped, by series (`freeboard_drops_total{reason="…"}`, summed
    /// over the servers), read from their `/metrics` at the end of a sharded run.
    #[serde(default)]
    pub drops: Option<Vec<(String, u64)>>,
    /// The servers' resident memory at the end, KiB, summed.
    #[serde(default)]
    pub servers_rss_kib: Option<u64>,
    /// The host's TCP buffer memory at the end (`/proc/net/sockstat` `mem`), KiB: both ends'
    /// queues, the non-readers' unread bytes among them.
    #[serde(default)]
    pub tcp_buffers_kib: Option<u64>,
    /// The kernel memory the servers charged against their budgets at the end, KiB, summed
    /// (`freeboard_kernel_memory_estimate_bytes`: their sockets, and the buffers of those that
    /// hold some).
    #[serde(default)]
    pub kernel_charged_kib: Option<u64>,
    /// The servers' budgets summed (`--memory` × servers), KiB.
    #[serde(default)]
    pub budget_kib: Option<u64>,
}

impl BroadcastRow {
    /// The server's CPU time and its system part per delivery, ns, when its PID was known.
    pub fn cpu_ns_per_delivery(&self) -> Option<(f64, f64)> {
        let per = |us: f64| us * 1e3 / self.subscribers.max(1) as f64;
        Some((per(self.server_cpu_us_per_msg?), per(self.server_sys_us_per_msg?)))
    }
}

/// Appends what `stream` (non-blocking, edge-triggered) holds to `pending`, through `buf`:
/// the bytes read, or `None` if the peer closed.
fn read_available(
    stream: &mut impl Read,
    buf: &mut [u8],
    pending: &mut Vec<u8>,
) -> io::Result<Option<usize>> {
    let mut read = 0;
    loop {
        match stream.read(buf) {
            Ok(0) => return Ok(None),
            Ok(k) => {
                read += k;
                pending.extend_from_slice(&buf[..k]);
                // A short read emptied the socket: the next arrival raises a new edge, so
                // the read that would say `WouldBlock` can be saved.
                if k < buf.len() {
                    return Ok(Some(read));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Some(read)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// How long the subscribers may go without any input before the run is abandoned.
const STALL: Duration = Duration::from_secs(10);

/// Runs `b`; `tick` gets the number of completed messages now and then.
///
/// A sharded run (see [`Broadcast::shards`]) re-executes the running program as
/// `PROGRAM bench broadcast-shard SPEC` for each shard, which the `freeboard` binary answers
/// ([`shard::serve`]).
pub fn run(b: &Broadcast, server: &str, tick: &mut dyn FnMut(u64)) -> io::Result<BroadcastRow> {
    if !(16..=65_535).contains(&b.size) {
        return Err(io::Error::other("broadcast payloads are 16 to 65,535 bytes"));
    }
    let shards = match b.shards {
        0 => shard::needed(b.subscribers)?,
        n => n,
    };
    if shards > 1 || b.publish.len() > 1 || b.non_readers > 0 {
        return shard::run(b, shards, server, tick);
    }
    let [publish] = b.publish.as_slice() else {
        return Err(io::Error::other("no target to publish at"));
    };
    let mut rng = Rng::seeded();
    let mut poll = Poll::new()?;
    let mut subs = Vec::with_capacity(b.subscribers);
    if b.subscribe.is_empty() {
        return Err(io::Error::other("no target to subscribe at"));
    }
    let mut compressing = 0;
    let cpu = || servers_sample(&b.server_pids);
    let rss_before = cpu().map(|s| s.rss_kib);
    let (document, delta) = (b.document || b.delta, b.delta);
    let (text, sse) = (b.text || b.sse || document, b.sse);
    for i in 0..b.subscribers {
        let mut target = b.subscribe[i % b.subscribe.len()].clone().with_deflate(b.deflate);
        if delta {
            let sep = if target.path.contains('?') { '&' } else { '?' };
            target.path = format!("{}{sep}delta=fossil", target.path);
        }
        let (s, leftover) = match sse {
            true => open_event_stream(&target, Duration::from_secs(5))?,
            false => {
                let (opened, leftover) = open_any(&target, Duration::from_secs(5), &mut rng)?;
                compressing += usize::from(opened.deflate);
                (opened.tcp, leftover)
            }
        };
        s.set_nonblocking(true)?;
        let mut s = mio::net::TcpStream::from_std(s);
        poll.registry().register(&mut s, Token(i), Interest::READABLE)?;
        subs.push(Subscriber { stream: s, pending: leftover, received: 0 });
    }
    std::thread::sleep(Duration::from_millis(200)); // subscriptions settle
    let rss_idle = cpu().map(|s| s.rss_kib);
    let (mut publisher, _) = open(publish, Duration::from_secs(5), &mut rng)?;
    let cpu_before = cpu();
    publisher.set_read_timeout(None)?;
    // A server that stops reading the publisher fails the run instead of hanging it.
    publisher.set_write_timeout(Some(STALL))?;
    // On freeboard the publisher is a subscriber too: what it is sent is read and discarded,
    // or its queue would pass its high watermark and the server stop reading its publications.
    let (mut sink, ender) = (publisher.try_clone()?, publisher.try_clone()?);
    let draining = std::thread::spawn(move || io::copy(&mut sink, &mut io::sink()));
    let start = Instant::now();
    let completed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicU64::new(0));
    let (messages, window, size) = (b.messages, b.window.max(1), b.size);
    let raw = publish.raw;
    let publisher = {
        let (completed, stop) = (completed.clone(), stop.clone());
        // The thread gives the stream back rather than closing it: closing a socket with
        // unread input sends a reset, which would make the server discard the last messages
        // it has not read yet.
        std::thread::spawn(move || -> io::Result<std::net::TcpStream> {
            // A raw fan-out passes frames on verbatim, so they go unmasked, as a server's. A
            // zero masking key is a valid key and leaves the payload as it is, so the frame is
            // written once and only the first 16 bytes of its payload change per message.
            let opcode = if text { 0x81 } else { 0x82 };
            let header = RawHeader::new(opcode, size as u64, if raw { None } else { Some([0; 4]) });
            let head = header.len();
            let mut frame = vec![0u8; head];
            header.encode(&mut frame).map_err(io::Error::other)?;
            let prefix = if text { 32 } else { 16 };
            frame.extend_from_slice(&[b'0'; 32][..prefix]);
            let values = match document {
                true => {
                    let (json, values) = changing_document(size - prefix);
                    frame.extend_from_slice(&json);
                    values.into_iter().map(|v| v + head + prefix).collect()
                }
                false => {
                    frame.extend_from_slice(&crate::corpus::json(size - prefix));
                    Vec::new()
                }
            };
            for seq in 0..messages {
                while seq >= completed.load(Ordering::Acquire) + window {
                    if stop.load(Ordering::Relaxed) != 0 {
                        return Ok(publisher);
                    }
                    // Sleep rather than spin: on a small machine a spinning publisher would
                    // take a core from the server and the subscribers.
                    std::thread::sleep(Duration::from_micros(20));
                }
                let t = start.elapsed().as_nanos() as u64;
                // About 1 % of a document: four of its values change each time.
                for k in 0..values.len().min(CHANGED_VALUES) {
                    let at = values[(seq as usize * CHANGED_VALUES + k) % values.len()];
                    let value = format!("{:020}", seq.wrapping_mul(2_654_435_761) + k as u64);
                    frame[at..at + 20].copy_from_slice(value.as_bytes());
                }
                if text {
                    let hex = format!("{seq:016x}{t:016x}");
                    frame[head..head + 32].copy_from_slice(hex.as_bytes());
                } else {
                    frame[head..head + 8].copy_from_slice(&seq.to_le_bytes());
                    frame[head + 8..head + 16].copy_from_slice(&t.to_le_bytes());
                }
                publisher.write_all(&frame)?;
            }
            Ok(publisher)
        })
    };
    let n = b.subscribers;
    let mut counts = vec![0usize; messages as usize];
    // Send times by sequence, from the first subscriber that could read one.
    let mut sent_at = vec![None; messages as usize];
    let mut inflater = flate2::Decompress::new(false);
    let mut decoder = freeboard::client::DeltaDecoder::new(1 << 20);
    let mut inflated = vec![0u8; size + 64];
    let mut wire_bytes = 0u64;
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
            let first = event.token().0 == 0;
            let Subscriber { stream: s, pending, received } = &mut subs[event.token().0];
            match read_available(s, &mut buf, pending) {
                Ok(Some(k)) => wire_bytes += k as u64,
                Ok(None) => {
                    failure = Some("a subscriber was closed".to_string());
                    break 'run;
                }
                Err(e) => {
                    failure = Some(e.to_string());
                    break 'run;
                }
            }
            let mut at = 0;
            loop {
                if sse {
                    // An event: up to its empty line; ours have a data line with the prefix.
                    // memmem, as a browser's parser runs at memory speed: a byte-by-byte
                    // search would make the load generator, not the server, the limit.
                    let Some(end) = memchr::memmem::find(&pending[at..], b"\n\n") else {
                        break;
                    };
                    let event = &pending[at..at + end];
                    at += end + 2;
                    let Some(data) =
                        event.split(|b| *b == b'\n').find_map(|l| l.strip_prefix(b"data: "))
                    else {
                        continue; // `retry:`, a keep-alive
                    };
                    let Some((seq, sent)) = hex_prefix(data) else { continue };
                    if let Some(at) = sent_at.get_mut(seq) {
                        *at = Some(sent);
                    }
                    *received += 1;
                    let Some(count) = counts.get_mut(seq) else { continue };
                    *count += 1;
                    if *count == n {
                        let now = start.elapsed().as_nanos() as u64;
                        latencies.push(now.saturating_sub(sent_at[seq].unwrap_or_default()));
                        done += 1;
                        completed.store(done, Ordering::Release);
                    }
                    continue;
                }
                let (header, payload) = match parse_frame(&pending[at..]) {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(e) => {
                        failure = Some(format!("a subscriber got an invalid frame: {e}"));
                        break 'run;
                    }
                };
                let p = &pending[at + payload.start..at + payload.end];
                at += payload.end;
                let seq = if delta {
                    // Arrival order is publish order; the first subscriber decodes each.
                    let seq = *received as usize;
                    if first {
                        let kind = match header.opcode {
                            freeboard_proto::OpCode::Binary => freeboard::MessageKind::Binary,
                            _ => freeboard::MessageKind::Text,
                        };
                        let decoded = match decoder.decode(kind, p) {
                            Ok(d) => d.data,
                            Err(e) => {
                                failure = Some(format!("a delta did not decode: {e}"));
                                break 'run;
                            }
                        };
                        match hex_prefix(decoded) {
                            Some((said, sent)) if said == seq => {
                                if let Some(at) = sent_at.get_mut(seq) {
                                    *at = Some(sent);
                                }
                            }
                            said => {
                                failure = Some(format!("message {said:?} arrived as number {seq}"));
                                break 'run;
                            }
                        }
                    }
                    seq
                } else if header.rsv & 0b100 != 0 {
                    // permessage-deflate: publish order; the first subscriber checks it.
                    let seq = *received as usize;
                    if first {
                        let prefix = match inflate(&mut inflater, p, &mut inflated) {
                            Some(m) if m.len() >= 16 => m,
                            _ => {
                                failure = Some("a compressed message did not inflate".into());
                                break 'run;
                            }
                        };
                        let said = u64::from_le_bytes(prefix[..8].try_into().expect("8 bytes"));
                        if said as usize != seq {
                            failure = Some(format!("message {said} arrived as number {seq}"));
                            break 'run;
                        }
                        let sent = u64::from_le_bytes(prefix[8..16].try_into().expect("8 bytes"));
                        if let Some(at) = sent_at.get_mut(seq) {
                            *at = Some(sent);
                        }
                    }
                    seq
                } else if text {
                    let Some((seq, sent)) = hex_prefix(p) else { continue };
                    if let Some(at) = sent_at.get_mut(seq) {
                        *at = Some(sent);
                    }
                    seq
                } else {
                    if p.len() < 16 {
                        continue; // not ours
                    }
                    let seq = u64::from_le_bytes(p[..8].try_into().expect("8 bytes")) as usize;
                    let sent = u64::from_le_bytes(p[8..16].try_into().expect("8 bytes"));
                    if let Some(at) = sent_at.get_mut(seq) {
                        *at = Some(sent);
                    }
                    seq
                };
                *received += 1;
                let Some(count) = counts.get_mut(seq) else { continue };
                *count += 1;
                if *count == n {
                    // NOTE: the first subscriber has read this message by now.
                    let sent = sent_at[seq].unwrap_or_default();
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
    let cpu_after = cpu();
    stop.store(1, Ordering::Relaxed);
    let published = publisher.join();
    // Every subscriber has had the last message (or the run failed): the publisher's stream
    // ends, and with it the thread that drained it.
    let _ = ender.shutdown(std::net::Shutdown::Both);
    let _ = draining.join();
    let published = published.map_err(|_| io::Error::other("the publisher panicked"))?;
    if let Some(failure) = failure {
        return Err(io::Error::other(failure));
    }
    let _publisher = published?;
    let per_publication = |f| per_publication(&cpu_before, &cpu_after, done, f);
    Ok(BroadcastRow {
        server: server.into(),
        subscribers: n,
        size,
        window,
        messages: done,
        deliveries_per_sec: (done * n as u64) as f64 / elapsed.as_secs_f64(),
        latency_ms: latency_ms(&mut latencies),
        compressing,
        server_cpu_us_per_msg: per_publication(|s| s.cpu),
        server_sys_us_per_msg: per_publication(|s| s.system),
        wire_bytes_per_delivery: wire_bytes as f64 / (done * n as u64).max(1) as f64,
        server_rss_kib_per_subscriber: match (rss_before, rss_idle) {
            (Some(before), Some(idle)) => Some(idle.saturating_sub(before) as f64 / n as f64),
            _ => None,
        },
        reader_deliveries: done * n as u64,
        ..BroadcastRow::default()
    })
}

/// The CPU times and resident memory of `pids` summed, or `None` without a PID or when one
/// cannot be read (a server gone).
/// Latencies (ns) as the row's p50, p99 and max in ms.
fn latency_ms(latencies: &mut [u64]) -> [f64; 3] {
    latencies.sort_unstable();
    let ms = |q: f64| {
        latencies
            .get(((latencies.len().max(1) - 1) as f64 * q) as usize)
            .map_or(0.0, |&ns| ns as f64 / 1e6)
    };
    [ms(0.5), ms(0.99), ms(1.0)]
}

/// The servers' CPU time `f` (all, or system) per publication in µs, of `done` publications
/// between two samples.
fn per_publication(
    before: &Option<crate::process::Sample>,
    after: &Option<crate::process::Sample>,
    done: u64,
    f: fn(&crate::process::Sample) -> Duration,
) -> Option<f64> {
    match (before, after) {
        (Some(a), Some(b)) if done > 0 => Some((f(b) - f(a)).as_secs_f64() * 1e6 / done as f64),
        _ => None,
    }
}

fn servers_sample(pids: &[u32]) -> Option<crate::process::Sample> {
    let mut sum: Option<crate::process::Sample> = None;
    for &pid in pids {
        let s = crate::process::Sample::of(pid).ok()?;
        sum = Some(match sum {
            None => s,
            Some(t) => crate::process::Sample {
                cpu: t.cpu + s.cpu,
                user: t.user + s.user,
                system: t.system + s.system,
                rss_kib: t.rss_kib + s.rss_kib,
            },
        });
    }
    sum
}

/// Opens a Server-Sent Events stream on `target`'s path: the request, then its response head
/// read up to its end. The stream, and what was read after the head.
fn open_event_stream(
    target: &Target,
    timeout: Duration,
) -> io::Result<(std::net::TcpStream, Vec<u8>)> {
    let mut stream = std::net::TcpStream::connect_timeout(&target.addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {} HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
        target.path, target.host
    )?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(io::Error::other("the server closed the event stream"));
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            if !head.starts_with(b"HTTP/1.1 200") {
                let line = String::from_utf8_lossy(&head[..end]).lines().next().map(str::to_owned);
                return Err(io::Error::other(format!("event stream refused: {line:?}")));
            }
            stream.set_read_timeout(None)?;
            return Ok((stream, head.split_off(end + 4)));
        }
    }
}

/// The sequence number and send time at the front of a text payload (32 hex digits).
fn hex_prefix(payload: &[u8]) -> Option<(usize, u64)> {
    let hex = std::str::from_utf8(payload.get(..32)?).ok()?;
    let seq = u64::from_str_radix(&hex[..16], 16).ok()?;
    let sent = u64::from_str_radix(&hex[16..], 16).ok()?;
    Some((seq as usize, sent))
}

/// One subscriber's socket, the bytes not yet parsed, and the data messages it has had.
struct Subscriber {
    stream: mio::net::TcpStream,
    pending: Vec<u8>,
    received: u64,
}

/// Values a document's publication changes.
const CHANGED_VALUES: usize = 4;

/// A JSON document of `len` bytes: rows with a 20-digit value each (some of which change per
/// publication), padded with spaces; and where each value starts.
fn changing_document(len: usize) -> (Vec<u8>, Vec<usize>) {
    let mut doc = br#"{"rows":["#.to_vec();
    let mut values = Vec::new();
    for id in 0.. {
        let row = format!(
            r#"{}{{"id":{id},"value":"{:020}","label":"sensor {id}, north wall, rack {}"}}"#,
            if id == 0 { "" } else { "," },
            id * 7,
            id % 12
        );
        if doc.len() + row.len() + 2 > len {
            break;
        }
        values.push(doc.len() + row.find("\"value\":\"").map_or(0, |v| v + 9));
        doc.extend_from_slice(row.as_bytes());
    }
    doc.extend_from_slice(b"]}");
    doc.resize(len.max(doc.len()), b' ');
    doc.truncate(len);
    (doc, values)
}

/// The delta comparison of `freeboard bench broadcast --delta` as a Markdown table: per case
/// (subscribers, size), the `…+delta` rows against the `…+whole` row before each (same
/// server, same documents), CPU and bytes per delivery as medians [min–max] over the rounds.
pub fn delta_markdown(rows: &[BroadcastRow]) -> String {
    use std::fmt::Write;
    let mut out = String::from(
        "| subscribers | payload B | rounds | CPU ns/delivery whole | delta | delta/whole \
         | bytes/delivery whole | delta | delta/whole |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    // Per case (subscribers, size), per round: whole CPU, delta CPU, CPU ratio, whole bytes,
    // delta bytes, bytes ratio.
    type Rounds = Vec<[f64; 6]>;
    let mut cases: Vec<((usize, usize), Rounds)> = Vec::new();
    for (i, d) in rows.iter().enumerate().filter(|(_, r)| r.server.ends_with("+delta")) {
        let Some(w) = rows[..i].iter().rev().find(|r| {
            r.server.ends_with("+whole") && r.subscribers == d.subscribers && r.size == d.size
        }) else {
            continue;
        };
        let cpu = |r: &BroadcastRow| r.cpu_ns_per_delivery().map_or(f64::NAN, |c| c.0);
        let (wc, dc) = (cpu(w), cpu(d));
        let (wb, db) = (w.wire_bytes_per_delivery, d.wire_bytes_per_delivery);
        let sample = [wc, dc, dc / wc, wb, db, db / wb];
        let key = (d.subscribers, d.size);
        match cases.iter_mut().find(|(k, _)| *k == key) {
            Some((_, samples)) => samples.push(sample),
            None => cases.push((key, vec![sample])),
        }
    }
    for ((subscribers, size), samples) in cases {
        let cell = |j: usize, digits: usize| {
            let mut v: Vec<f64> = samples.iter().map(|s| s[j]).collect();
            v.sort_by(f64::total_cmp);
            let median = v[v.len() / 2];
            match v.len() {
                1 => format!("{median:.digits$}"),
                _ => format!("{median:.digits$} [{:.digits$}–{:.digits$}]", v[0], v[v.len() - 1]),
            }
        };
        let _ = writeln!(
            out,
            "| {subscribers} | {size} | {} | {} | {} | {} | {} | {} | {} |",
            samples.len(),
            cell(0, 0),
            cell(1, 0),
            cell(2, 2),
            cell(3, 0),
            cell(4, 0),
            cell(5, 3)
        );
    }
    out
}

/// Inflates one message compressed with no context (RFC 7692 §7.2.2: the tail put back)
/// into `out`; the inflated bytes, or `None` if it is not deflate data.
fn inflate<'o>(z: &mut flate2::Decompress, data: &[u8], out: &'o mut [u8]) -> Option<&'o [u8]> {
    z.reset(false);
    let mut n = 0;
    for piece in [data, &[0, 0, 0xff, 0xff][..]] {
        let before = (z.total_in(), z.total_out());
        z.decompress(piece, &mut out[n..], flate2::FlushDecompress::Sync).ok()?;
        n += (z.total_out() - before.1) as usize;
        if (z.total_in() - before.0) as usize != piece.len() {
            return None;
        }
    }
    Some(&out[..n])
}

/// The SSE comparison of `freeboard bench broadcast --sse` as a Markdown table: each
/// `…+sse` row beside the `…+ws-text` row of the same case before it (same subscribers and
/// size), with the ratios SSE / WebSocket of CPU and bytes per delivery.
pub fn sse_markdown(rows: &[BroadcastRow]) -> String {
    use std::fmt::Write;
    let mut out = String::from(
        "| subscribers | payload B | CPU ns/delivery WS | SSE | SSE/WS | bytes/delivery WS | SSE \
         | SSE/WS | RSS KiB/idle subscriber WS | SSE |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let fmt = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.0}"));
    let kib = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.2}"));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "–".to_owned(),
    };
    for (i, sse) in rows.iter().enumerate().filter(|(_, r)| r.server.ends_with("+sse")) {
        let Some(ws) = rows[..i].iter().rev().find(|r| {
            r.server.ends_with("+ws-text") && r.subscribers == sse.subscribers && r.size == sse.size
        }) else {
            continue;
        };
        let (ws_cpu, sse_cpu) =
            (ws.cpu_ns_per_delivery().map(|c| c.0), sse.cpu_ns_per_delivery().map(|c| c.0));
        let (wb, sb) = (Some(ws.wire_bytes_per_delivery), Some(sse.wire_bytes_per_delivery));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            sse.subscribers,
            sse.size,
            fmt(ws_cpu),
            fmt(sse_cpu),
            ratio(sse_cpu, ws_cpu),
            fmt(wb),
            fmt(sb),
            ratio(sb, wb),
            kib(ws.server_rss_kib_per_subscriber),
            kib(sse.server_rss_kib_per_subscriber),
        );
    }
    out
}

/// Messages per run for `subscribers`: 2,000,000 deliveries, 100 to 2,000 messages.
pub fn default_messages(subscribers: usize) -> u64 {
    (2_000_000 / subscribers.max(1) as u64).clamp(100, 2_000)
}
