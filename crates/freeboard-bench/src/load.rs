//! The load generator: many connections from one thread, each keeping a fixed number of
//! messages in flight, timed with an HDR histogram.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream as StdStream;
use std::time::{Duration, Instant};

use freeboard::client::ClientStream;
use freeboard_proto::handshake::{ClientRequest, EMPTY_HEADER, Response, generate_key};
use freeboard_proto::{CloseCode, Config, Connection, Event, Instant as ProtoInstant, Role, State};
use freeboard_test::{close_frame, encode_frame};
use hdrhistogram::Histogram;
use mio::{Events, Interest, Poll, Token};

use crate::Target;
use crate::process::{Sample, own_cpu_time};

/// One load run: `clients` connections, each with `in_flight` binary messages of `size`
/// bytes outstanding, until each has sent `messages` or `duration` has passed.
#[derive(Debug, Clone)]
pub struct Load {
    /// Concurrent connections.
    pub clients: usize,
    /// Messages each client keeps outstanding (1: ping-pong).
    pub in_flight: usize,
    /// Payload bytes per message.
    pub size: usize,
    /// Messages per client; `None` runs for `duration`.
    pub messages: Option<u64>,
    /// Longest run; the messages still in flight then are awaited, none are sent after it.
    pub duration: Duration,
    /// The server process, to sample its CPU time and RSS around the run.
    pub server_pid: Option<u32>,
}

/// What a run measured.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Measured {
    /// Connections that completed the handshake.
    pub connected: usize,
    /// Connections that could not connect, or that failed or closed during the run.
    pub failed: usize,
    /// Why each failed connection failed, with how many failed so (`"closed by the server
    /// with 1009 (message too big)"`).
    #[serde(default)]
    pub failures: Vec<(String, usize)>,
    /// Messages sent, all clients.
    pub sent: u64,
    /// Messages echoed back.
    pub received: u64,
    /// Echoes whose length differed from what was sent.
    pub mismatched: u64,
    /// From the first send to the last echo, seconds.
    pub seconds: f64,
    /// Echoes per second.
    pub msgs_per_sec: f64,
    /// Payload MiB echoed per second (one direction).
    pub mib_per_sec: f64,
    /// Round-trip latency percentiles in microseconds: 50, 99, 99.9 and the maximum.
    pub latency_us: [f64; 4],
    /// The load generator's own CPU time over wall time (1.0 = one core busy).
    pub client_cpu: f64,
    /// Server CPU time (user + system) per echoed message in microseconds, when its PID is
    /// known.
    pub server_cpu_us_per_msg: Option<f64>,
    /// Of that, system time.
    #[serde(default)]
    pub server_sys_us_per_msg: Option<f64>,
    /// Server RSS at the end of the run, KiB.
    pub server_rss_kib: Option<u64>,
}

/// How long a run waits for the echoes still in flight when it ends.
const DRAIN: Duration = Duration::from_secs(5);

/// Runs `load` against `target`; `tick` gets the number of echoes so far, now and then.
pub fn run(target: &Target, load: &Load, tick: &mut dyn FnMut(u64)) -> io::Result<Measured> {
    let mut rng = Rng::seeded();
    let size = load.size;
    // One masked frame, sent by every client again and again: the server unmasks each copy,
    // so its work is the same as with fresh keys, and the client spends no time masking.
    let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let mut frame = vec![0u8; size + 14];
    let n = encode_frame(0x82, &payload, Some(rng.mask()), &mut frame).map_err(io::Error::other)?;
    frame.truncate(n);

    let mut poll = Poll::new()?;
    let mut clients = Vec::with_capacity(load.clients);
    let mut failed = 0;
    let mut first_error = None;
    for _ in 0..load.clients {
        match open_any(target, Duration::from_secs(5), &mut rng) {
            Ok((stream, _)) => {
                let mut stream = stream.into_nonblocking()?;
                let token = Token(clients.len());
                poll.registry().register(
                    &mut stream,
                    token,
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                clients.push(Client {
                    stream,
                    rx: echo_reader(target, size),
                    out: Vec::with_capacity(frame.len() * load.in_flight),
                    out_at: 0,
                    sent_at: VecDeque::with_capacity(load.in_flight),
                    sent: 0,
                    received: 0,
                    partial: 0,
                    failed: false,
                    failure: None,
                });
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    // A target that refuses us is a failed measurement, not a row of zeros.
    if let Some(e) = first_error {
        let why =
            format!("{failed} of {} clients could not connect to {target}: {e}", load.clients);
        return Err(io::Error::new(e.kind(), why));
    }

    let mut hist = Histogram::<u64>::new(3).map_err(io::Error::other)?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut events = Events::with_capacity(1024);
    let limit = load.messages.unwrap_or(u64::MAX);
    let server_before = load.server_pid.and_then(|pid| Sample::of(pid).ok());
    let cpu_before = own_cpu_time();
    let start = Instant::now();
    let deadline = start + load.duration;
    let mut last_echo = start;
    let mut received = 0u64;
    let mut mismatched = 0u64;
    let mut next_tick = start;
    for client in &mut clients {
        client.fill(&frame, load.in_flight, limit, start);
        client.flush();
    }
    loop {
        let now = Instant::now();
        let stopping = now >= deadline;
        let busy = clients.iter().any(|c| !c.failed && (!c.sent_at.is_empty() || c.sent < limit));
        if !busy || (stopping && clients.iter().all(|c| c.failed || c.sent_at.is_empty())) {
            break;
        }
        if now >= deadline + DRAIN {
            break; // echoes lost: sent != received tells
        }
        if now >= next_tick {
            tick(received);
            next_tick = now + Duration::from_millis(100);
        }
        poll.poll(&mut events, Some(Duration::from_millis(10)))?;
        for event in events.iter() {
            let Some(client) = clients.get_mut(event.token().0) else { continue };
            if client.failed {
                continue;
            }
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                let got = client.read(&mut buf, size, &mut hist, &mut mismatched);
                if got > 0 {
                    received += got;
                    last_echo = Instant::now();
                }
            }
            if !client.failed {
                let stop = Instant::now() >= deadline;
                if !stop {
                    client.fill(&frame, load.in_flight, limit, Instant::now());
                }
                client.flush();
            }
        }
    }
    let cpu = own_cpu_time().saturating_sub(cpu_before);
    let server_after = load.server_pid.and_then(|pid| Sample::of(pid).ok());
    for client in &mut clients {
        client.close(&mut rng);
    }
    let seconds = last_echo.duration_since(start).as_secs_f64().max(1e-9);
    let sent = clients.iter().map(|c| c.sent).sum();
    let per_msg = |f: fn(&Sample) -> Duration| match (&server_before, &server_after) {
        (Some(b), Some(a)) if received > 0 => {
            Some(f(a).saturating_sub(f(b)).as_secs_f64() * 1e6 / received as f64)
        }
        _ => None,
    };
    let mut failures: Vec<(String, usize)> = Vec::new();
    for why in clients.iter().filter(|c| c.failed).map(|c| c.failure.clone().unwrap_or_default()) {
        match failures.iter_mut().find(|(w, _)| *w == why) {
            Some((_, n)) => *n += 1,
            None => failures.push((why, 1)),
        }
    }
    if received == 0 && sent > 0 {
        let why = match failures.is_empty() {
            true => "not an echo server?".to_owned(),
            false => {
                let each: Vec<String> =
                    failures.iter().map(|(why, n)| format!("{n} × {why}")).collect();
                format!("the connections failed: {}", each.join("; "))
            }
        };
        let why = format!("{target}: none of the {sent} messages sent came back ({why})");
        return Err(io::Error::other(why));
    }
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    Ok(Measured {
        connected: clients.len(),
        failed: failed + clients.iter().filter(|c| c.failed).count(),
        failures,
        sent,
        received,
        mismatched,
        seconds,
        msgs_per_sec: received as f64 / seconds,
        mib_per_sec: received as f64 * size as f64 / seconds / (1024.0 * 1024.0),
        latency_us: [us(0.5), us(0.99), us(0.999), hist.max() as f64 / 1000.0],
        client_cpu: cpu.as_secs_f64() / start.elapsed().as_secs_f64(),
        server_cpu_us_per_msg: per_msg(|s| s.cpu),
        server_sys_us_per_msg: per_msg(|s| s.system),
        server_rss_kib: server_after.map(|s| s.rss_kib),
    })
}

/// The permessage-deflate offer the load generator makes: what browsers send.
pub const OFFER: &str = "permessage-deflate; client_max_window_bits";

/// An opened connection: the blocking socket and, over `wss://`, its TLS connection.
pub struct Opened {
    /// The socket (blocking).
    pub tcp: StdStream,
    /// The TLS connection over it.
    pub tls: Option<rustls::ClientConnection>,
    /// The server accepted the permessage-deflate offer.
    pub deflate: bool,
}

/// The protocol state that reads `target`'s echoes of messages of `size` payload bytes: a raw
/// echo returns our own masked frames, read as a server would.
pub(crate) fn echo_reader(target: &Target, size: usize) -> Connection {
    let role = if target.raw { Role::Server } else { Role::Client };
    let config = Config::builder().max_message_size(size.max(1 << 16) as u64).build();
    Connection::new(role, config, ProtoInstant::default())
}

impl Opened {
    /// The non-blocking stream the load generator reads and writes.
    pub fn into_nonblocking(self) -> io::Result<ClientStream> {
        self.tcp.set_nonblocking(true)?;
        let tcp = mio::net::TcpStream::from_std(self.tcp);
        Ok(match self.tls {
            Some(conn) => ClientStream::Tls(Box::new((tcp, conn))),
            None => ClientStream::Plain(tcp),
        })
    }
}

/// Connects to `target` and completes the opening handshake (for a raw TCP echo: one byte
/// sent and echoed). Returns the blocking stream and any bytes that arrived after the
/// server's head. Plain TCP only: see [`open_any`] for `wss://`.
pub fn open(target: &Target, timeout: Duration, rng: &mut Rng) -> io::Result<(StdStream, Vec<u8>)> {
    if target.tls {
        return Err(io::Error::other(format!("{target}: this experiment has no TLS")));
    }
    open_any(target, timeout, rng).map(|(opened, leftover)| (opened.tcp, leftover))
}

/// [`open`], and over `wss://` the TLS handshake first.
pub fn open_any(
    target: &Target,
    timeout: Duration,
    rng: &mut Rng,
) -> io::Result<(Opened, Vec<u8>)> {
    let stream = StdStream::connect_timeout(&target.addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    if target.tls {
        let conn = crate::tls::connect(&target.host, target.resume)?;
        let mut tls = rustls::StreamOwned::new(conn, stream);
        let (leftover, deflate) = upgrade(target, &mut tls, rng)?;
        let (conn, tcp) = tls.into_parts();
        tcp.set_read_timeout(None)?;
        return Ok((Opened { tcp, tls: Some(conn), deflate }, leftover));
    }
    let mut stream = stream;
    if target.raw {
        // One echoed byte stands in for the 101: it proves the server has accepted the
        // connection, so opening many connections is paced by the server as with a handshake.
        stream.write_all(&[0])?;
        stream.read_exact(&mut [0])?;
        stream.set_read_timeout(None)?;
        return Ok((Opened { tcp: stream, tls: None, deflate: false }, Vec::new()));
    }
    let (leftover, deflate) = upgrade(target, &mut stream, rng)?;
    stream.set_read_timeout(None)?;
    Ok((Opened { tcp: stream, tls: None, deflate }, leftover))
}

/// Sends the upgrade request over `stream` and reads the 101; returns the bytes after it and
/// whether permessage-deflate was agreed.
fn upgrade(
    target: &Target,
    stream: &mut impl ReadWrite,
    rng: &mut Rng,
) -> io::Result<(Vec<u8>, bool)> {
    let key = generate_key(rng.nonce());
    let request = ClientRequest {
        host: &target.host,
        path: &target.path,
        key: &key,
        protocols: &[],
        extensions: target.deflate.then_some(OFFER),
        headers: &[],
    };
    let mut buf = vec![0u8; 4096];
    let n = request.encode(&mut buf).map_err(io::Error::other)?;
    stream.write_all(&buf[..n])?;
    let mut len = 0;
    loop {
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        len += n;
        let mut headers = [EMPTY_HEADER; 32];
        match Response::parse(&buf[..len], &mut headers, &request, buf.len()) {
            Ok(None) => continue,
            Ok(Some((response, head_len))) => {
                let deflate = response.extensions().next().is_some();
                return Ok((buf[head_len..len].to_vec(), deflate));
            }
            Err(e) => return Err(io::Error::other(format!("{target}: {e}"))),
        }
    }
}

/// A blocking byte stream (a socket, or TLS over it).
trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// One connection of the load generator.
struct Client {
    stream: ClientStream,
    /// Parses the echoes.
    rx: Connection,
    /// Frames not yet written. Invariant: `out_at <= out.len()`.
    out: Vec<u8>,
    out_at: usize,
    /// When each outstanding message was queued, oldest first (echoes come back in order).
    sent_at: VecDeque<Instant>,
    sent: u64,
    received: u64,
    /// Payload bytes of the message being received.
    partial: usize,
    failed: bool,
    /// Why it failed, in words.
    failure: Option<String>,
}

impl Client {
    /// Queues messages until `in_flight` are outstanding or `limit` have been sent.
    fn fill(&mut self, frame: &[u8], in_flight: usize, limit: u64, now: Instant) {
        if self.out_at == self.out.len() {
            self.out.clear();
            self.out_at = 0;
        }
        while self.sent_at.len() < in_flight && self.sent < limit {
            self.out.extend_from_slice(frame);
            self.sent_at.push_back(now);
            self.sent += 1;
        }
    }

    /// Writes what is queued until the socket takes no more.
    fn flush(&mut self) {
        while self.out_at < self.out.len() {
            match self.stream.write(&self.out[self.out_at..]) {
                Ok(n) => self.out_at += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.fail(format!("writing failed: {e}"));
                    return;
                }
            }
        }
    }

    /// Reads until the socket is empty; returns the number of complete echoes.
    fn read(
        &mut self,
        buf: &mut [u8],
        size: usize,
        hist: &mut Histogram<u64>,
        mismatched: &mut u64,
    ) -> u64 {
        let before = self.received;
        loop {
            let n = match self.stream.read(buf) {
                Ok(0) => {
                    self.fail("the server closed the connection without a close frame".into());
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.fail(format!("reading failed: {e}"));
                    break;
                }
            };
            let now = Instant::now();
            let mut at = 0;
            while at < n {
                let input = match self.rx.handle_input(ProtoInstant::default(), &mut buf[at..n]) {
                    Ok(input) => input,
                    Err(e) => {
                        self.fail(format!("the server broke the protocol: {e}"));
                        break;
                    }
                };
                at += input.consumed;
                if let Some(piece) = input.payload {
                    self.partial += piece.data.len();
                    if piece.message_fin {
                        if self.partial != size {
                            *mismatched += 1;
                        }
                        self.partial = 0;
                        self.received += 1;
                        if let Some(t) = self.sent_at.pop_front() {
                            let _ = hist.record(now.duration_since(t).as_nanos() as u64);
                        }
                    }
                }
                while let Some(event) = self.rx.poll_event() {
                    if let Event::Closed { code, reason, .. } = event {
                        let reason =
                            if reason.is_empty() { String::new() } else { format!(" ({reason})") };
                        self.fail(format!("closed by the server with {}{reason}", code.0));
                    }
                }
            }
            if self.failed || self.rx.state() == State::Closed {
                self.fail("closed by the server".into());
                break;
            }
        }
        self.received - before
    }

    /// Marks the connection failed; the first reason is kept.
    fn fail(&mut self, why: String) {
        self.failed = true;
        self.failure.get_or_insert(why);
    }

    /// Sends a close frame (best effort) and lets the socket go.
    fn close(&mut self, rng: &mut Rng) {
        if self.failed {
            return;
        }
        let mut out = [0u8; 8];
        let n = close_frame(CloseCode::NORMAL, Some(rng.mask()), &mut out).expect("8 bytes fit");
        let _ = self.stream.write(&out[..n]);
    }
}

/// A small xorshift generator for handshake nonces and masking keys. Benchmark traffic needs
/// keys that vary, not keys an attacker cannot predict.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded from the clock and the process id.
    pub fn seeded() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self(t ^ (u64::from(std::process::id()) << 32) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A masking key.
    pub fn mask(&mut self) -> [u8; 4] {
        (self.next() as u32).to_ne_bytes()
    }

    /// A handshake nonce.
    pub fn nonce(&mut self) -> [u8; 16] {
        let mut n = [0u8; 16];
        n[..8].copy_from_slice(&self.next().to_ne_bytes());
        n[8..].copy_from_slice(&self.next().to_ne_bytes());
        n
    }
}
