//! A crowd of idle connections: opened in parallel at a given rate from one thread, held, and
//! watched — how many got in, how fast, what refused the others, and what the server said to
//! the ones it held (pings, a close code at shutdown, a publication).
//!
//! Built for counts in the hundreds of thousands: a connection is a non-blocking socket and
//! twelve bytes of state in a table, driven by one `mio` poll; the upgrade request is encoded
//! once and sent by every connection; the 101 is recognised by its status line and the end of
//! its head. Ephemeral ports run out at about 28,000 connections per source address and
//! destination (`net.ipv4.ip_local_port_range`), so [`Crowd::sources`] spreads the crowd over
//! loopback addresses (`127.0.0.0/8` is all loopback on Linux) with `IP_BIND_ADDRESS_NO_PORT`,
//! which lets the kernel pick the port at connect time for the whole 4-tuple.
//!
//! Every outcome is counted by its cause: refusals by HTTP status (and whether a
//! `Retry-After` came with them), failures by `errno` name or "timeout", closes by code.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use freeboard_proto::handshake::{ClientRequest, generate_key};
use mio::{Events, Interest, Poll, Token};

use crate::Target;

/// What to open, how fast, and for how long to hold it.
#[derive(Debug, Clone)]
pub struct Crowd {
    /// The server: `ws://` (a WebSocket upgrade) or `tcp://` (one byte echoed stands in for the
    /// 101). `wss://` is not supported here.
    pub target: Target,
    /// Connections to open.
    pub count: usize,
    /// Connections started per second; 0 starts them as fast as `in_flight` allows.
    pub rate: f64,
    /// Most connections between `connect` and their 101 at once.
    pub in_flight: usize,
    /// Source addresses, used in turn; empty lets the kernel choose (one address: about
    /// 28,000 connections per destination).
    pub sources: Vec<Ipv4Addr>,
    /// Destination ports, used in turn; empty is the target's own.
    pub ports: Vec<u16>,
    /// A connection not open by then counts as failed ("timeout").
    pub connect_timeout: Duration,
    /// How long to hold the crowd once every connection has got in or failed.
    pub hold: Duration,
    /// The whole run stops here, whatever is left.
    pub deadline: Duration,
    /// Leave at the end of the hold once the server has closed every connection (a graceful
    /// shutdown watched from the client side).
    pub until_closed: bool,
}

impl Crowd {
    /// `count` connections to `target` at full speed, 1,024 in flight, held for a second.
    pub fn new(target: Target, count: usize) -> Self {
        Crowd {
            target,
            count,
            rate: 0.0,
            in_flight: 1024,
            sources: Vec::new(),
            ports: Vec::new(),
            connect_timeout: Duration::from_secs(30),
            hold: Duration::from_secs(1),
            deadline: Duration::from_secs(600),
            until_closed: false,
        }
    }

    /// `n` consecutive loopback source addresses from `first` on (127.0.1.1, 127.0.1.2, …):
    /// enough for `n × 28,000` connections to one destination.
    pub fn loopback_sources(first: Ipv4Addr, n: usize) -> Vec<Ipv4Addr> {
        (0..n as u32).map(|i| Ipv4Addr::from(u32::from(first) + i)).collect()
    }

    /// Source addresses needed for `count` connections to `ports` destination ports, with the
    /// ephemeral range as it is set now.
    pub fn sources_needed(count: usize, ports: usize) -> usize {
        let range = ephemeral_ports().unwrap_or(28_232);
        // A margin: TIME_WAIT remnants of earlier runs hold some of each address's ports.
        count.div_ceil(ports.max(1) * range * 9 / 10).max(1)
    }
}

/// What a crowd run saw.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Gathered {
    /// Connections asked for.
    pub count: usize,
    /// Upgrades answered 101 (or echoed, over `tcp://`).
    pub connected: usize,
    /// Answered with another status, by status.
    pub refused: BTreeMap<u16, usize>,
    /// Of the refused, those whose answer carried `Retry-After`.
    pub refused_with_retry_after: usize,
    /// Failed before an answer, by cause (`errno` name, "timeout", "eof").
    pub failed: BTreeMap<String, usize>,
    /// Seconds from the first connect to the last connection in (or failed).
    pub connect_seconds: f64,
    /// Connections in per second over `connect_seconds`.
    pub connects_per_sec: f64,
    /// Seconds until every connection that got in was in (the last 101).
    pub seconds_to_all: f64,
    /// Connections open over time while connecting: `(seconds, open)`, twice a second.
    pub timeline: Vec<(f64, usize)>,
    /// Open connections at the end of the hold.
    pub held: usize,
    /// Pings the server sent during the hold (each answered with a pong).
    pub pings: u64,
    /// Close frames the server sent, by code.
    pub closed_by_server: BTreeMap<u16, usize>,
    /// Connections the server dropped without a close frame (EOF or reset) while held.
    pub dropped_by_server: usize,
    /// Data messages received while held.
    pub messages: u64,
    /// From the first close frame to the last connection closed by the server, seconds.
    pub close_seconds: Option<f64>,
}

impl Gathered {
    /// Connections that did not get in, whatever the cause.
    pub fn missing(&self) -> usize {
        self.count - self.connected
    }

    /// The causes of what is missing in one line: "503 ×120 (Retry-After on 120), EMFILE ×3".
    pub fn causes(&self) -> String {
        let mut parts: Vec<String> =
            self.refused.iter().map(|(status, n)| format!("{status} ×{n}")).collect();
        if self.refused_with_retry_after > 0 {
            parts.push(format!("Retry-After on {}", self.refused_with_retry_after));
        }
        parts.extend(self.failed.iter().map(|(why, n)| format!("{why} ×{n}")));
        if parts.is_empty() { "none".into() } else { parts.join(", ") }
    }
}

/// How far a run has got, given to the progress callback about once a second.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Since the first connect.
    pub elapsed: Duration,
    /// Open now.
    pub open: usize,
    /// Between connect and answer now.
    pub connecting: usize,
    /// Refused or failed so far.
    pub lost: usize,
}

/// One connection's state: twelve bytes, so a million cost 12 MB of the generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Slot free.
    Empty,
    /// `connect` in progress: the request goes out when the socket is writable.
    Connecting,
    /// Request sent; `matched` bytes of the head's end (`\r\n\r\n`) seen so far, and
    /// whether the status line (101) was read.
    Answering { matched: u8, status_read: bool },
    /// Upgraded and held; `partial` bytes of a frame header kept in the run's leftovers.
    Open,
}

/// Runs `crowd`, calling `progress` about once a second.
pub fn gather(crowd: &Crowd, progress: &mut dyn FnMut(&Progress)) -> io::Result<Gathered> {
    gather_then(crowd, progress, &mut || {})
}

/// [`gather`], calling `held` once at the end of the hold, with every connection still open
/// (to read the server's memory then).
pub fn gather_then(
    crowd: &Crowd,
    progress: &mut dyn FnMut(&Progress),
    held: &mut dyn FnMut(),
) -> io::Result<Gathered> {
    if crowd.target.tls {
        return Err(io::Error::other("a crowd speaks ws:// or tcp://, not wss://"));
    }
    let SocketAddr::V4(dest) = crowd.target.addr else {
        return Err(io::Error::other("a crowd connects to an IPv4 address"));
    };
    let request = request_bytes(&crowd.target)?;
    let mut poll = Poll::new()?;
    let mut events = Events::with_capacity(4096);
    let mut streams: Vec<Option<mio::net::TcpStream>> = Vec::with_capacity(crowd.count);
    let mut phases: Vec<Phase> = Vec::with_capacity(crowd.count);
    // Connections between connect and answer, oldest first, for the timeout.
    let mut pending: VecDeque<(usize, Instant)> = VecDeque::new();
    // Frame bytes a held connection got in pieces (rare: control frames are small).
    let mut partial: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
    let mut out = Gathered { count: crowd.count, ..Gathered::default() };
    let mut buf = vec![0u8; 64 * 1024];
    let start = Instant::now();
    let deadline = start + crowd.deadline;
    let mut started = 0usize;
    let mut connecting = 0usize;
    let mut open = 0usize;
    let mut lost = 0usize;
    let mut last_in = start;
    let mut next_sample = start;
    let mut next_progress = start + Duration::from_secs(1);
    let mut all_in_at: Option<Instant> = None;
    let mut first_close: Option<Instant> = None;
    let mut last_close: Option<Instant> = None;
    let mut out_of_descriptors = false;
    loop {
        let now = Instant::now();
        // Start what the rate and the in-flight bound allow.
        let allowed = if crowd.rate > 0.0 {
            ((now - start).as_secs_f64() * crowd.rate) as usize + 1
        } else {
            usize::MAX
        };
        while started < crowd.count
            && started < allowed
            && connecting < crowd.in_flight
            && !out_of_descriptors
        {
            let i = started;
            started += 1;
            let source =
                (!crowd.sources.is_empty()).then(|| crowd.sources[i % crowd.sources.len()]);
            let port = match crowd.ports.len() {
                0 => dest.port(),
                n => crowd.ports[(i / crowd.sources.len().max(1)) % n],
            };
            let to = SocketAddr::V4(SocketAddrV4::new(*dest.ip(), port));
            match connect(source, to) {
                Ok(mut stream) => {
                    let token = streams.len();
                    poll.registry().register(
                        &mut stream,
                        Token(token),
                        Interest::READABLE | Interest::WRITABLE,
                    )?;
                    streams.push(Some(stream));
                    phases.push(Phase::Connecting);
                    pending.push_back((token, now));
                    connecting += 1;
                }
                Err(e) => {
                    lost += 1;
                    if e.raw_os_error() == Some(libc::EMFILE) {
                        // Nothing more can be opened: the rest are counted as this.
                        out_of_descriptors = true;
                        let rest = crowd.count - started + 1;
                        *out.failed.entry(errno_name(&e)).or_default() += rest;
                        lost += rest - 1;
                        started = crowd.count;
                    } else {
                        *out.failed.entry(errno_name(&e)).or_default() += 1;
                    }
                }
            }
        }
        let done_connecting = started == crowd.count && connecting == 0;
        if done_connecting && all_in_at.is_none() {
            all_in_at = Some(now);
            out.connect_seconds = (last_in - start).as_secs_f64();
            out.seconds_to_all = out.connect_seconds;
        }
        if let Some(at) = all_in_at {
            let closed_all = crowd.until_closed && open == 0 && first_close.is_some();
            if now >= at + crowd.hold || closed_all {
                held();
                break;
            }
        }
        if now >= deadline {
            held();
            break;
        }
        if now >= next_sample {
            out.timeline.push(((now - start).as_secs_f64(), open));
            next_sample = now + Duration::from_millis(500);
        }
        if now >= next_progress {
            progress(&Progress { elapsed: now - start, open, connecting, lost });
            next_progress = now + Duration::from_secs(1);
        }
        // Timeouts, oldest first (an entry whose connection has moved on is skipped).
        while let Some(&(token, at)) = pending.front() {
            if !matches!(phases[token], Phase::Connecting | Phase::Answering { .. }) {
                pending.pop_front();
                continue;
            }
            if now - at < crowd.connect_timeout {
                break;
            }
            pending.pop_front();
            fail(&mut streams, &mut phases, token, &mut out, "timeout");
            connecting -= 1;
            lost += 1;
        }
        let wait = if started < crowd.count {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(50)
        };
        poll.poll(&mut events, Some(wait))?;
        for event in events.iter() {
            let token = event.token().0;
            let Some(stream) = streams.get_mut(token).and_then(|s| s.as_mut()) else { continue };
            match phases[token] {
                Phase::Empty => {}
                Phase::Connecting => {
                    if event.is_error() || event.is_write_closed() {
                        let e =
                            stream.take_error().ok().flatten().unwrap_or_else(|| {
                                io::Error::from_raw_os_error(libc::ECONNREFUSED)
                            });
                        fail(&mut streams, &mut phases, token, &mut out, &errno_name(&e));
                        connecting -= 1;
                        lost += 1;
                        continue;
                    }
                    if !event.is_writable() {
                        continue;
                    }
                    // Small enough to go out in one write on a fresh socket.
                    match stream.write(&request) {
                        Ok(n) if n == request.len() => {
                            phases[token] = Phase::Answering { matched: 0, status_read: false };
                        }
                        Ok(_) => {
                            fail(&mut streams, &mut phases, token, &mut out, "short write");
                            connecting -= 1;
                            lost += 1;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => {
                            fail(&mut streams, &mut phases, token, &mut out, &errno_name(&e));
                            connecting -= 1;
                            lost += 1;
                        }
                    }
                    // The 101 may already be in: fall through to reading on the next event.
                }
                Phase::Answering { matched, status_read } => {
                    if !event.is_readable() && !event.is_read_closed() && !event.is_error() {
                        continue;
                    }
                    match read_answer(stream, &mut buf, matched, status_read, crowd.target.raw) {
                        Answer::More(matched) => {
                            phases[token] = Phase::Answering { matched, status_read: true }
                        }
                        Answer::Wait => {}
                        Answer::Open => {
                            phases[token] = Phase::Open;
                            connecting -= 1;
                            open += 1;
                            out.connected += 1;
                            last_in = Instant::now();
                        }
                        Answer::Refused { status, retry_after } => {
                            *out.refused.entry(status).or_default() += 1;
                            out.refused_with_retry_after += usize::from(retry_after.is_some());
                            drop_slot(&mut streams, &mut phases, token);
                            connecting -= 1;
                            lost += 1;
                        }
                        Answer::Failed(why) => {
                            fail(&mut streams, &mut phases, token, &mut out, &why);
                            connecting -= 1;
                            lost += 1;
                        }
                    }
                }
                Phase::Open => {
                    if !event.is_readable() && !event.is_read_closed() {
                        continue;
                    }
                    let held =
                        hold_read(stream, &mut buf, partial.entry(token).or_default(), &mut out);
                    if partial.get(&token).is_some_and(Vec::is_empty) {
                        partial.remove(&token);
                    }
                    if let Some(code) = held {
                        let now = Instant::now();
                        first_close.get_or_insert(now);
                        last_close = Some(now);
                        match code {
                            Some(code) => *out.closed_by_server.entry(code).or_default() += 1,
                            None => out.dropped_by_server += 1,
                        }
                        drop_slot(&mut streams, &mut phases, token);
                        partial.remove(&token);
                        open -= 1;
                    }
                }
            }
        }
    }
    if all_in_at.is_none() {
        out.connect_seconds = (last_in - start).as_secs_f64();
        out.seconds_to_all = out.connect_seconds;
    }
    out.timeline.push(((Instant::now() - start).as_secs_f64(), open));
    out.connects_per_sec = out.connected as f64 / out.connect_seconds.max(1e-9);
    out.held = open;
    out.close_seconds = first_close.zip(last_close).map(|(a, b)| (b - a).as_secs_f64());
    // Those still connecting at the deadline.
    if connecting > 0 {
        *out.failed.entry("deadline".into()).or_default() += connecting;
    }
    let unstarted = crowd.count - started;
    if unstarted > 0 {
        *out.failed.entry("not started (deadline)".into()).or_default() += unstarted;
    }
    // Closing a crowd of this size takes the kernel a while; the caller measures after.
    drop(streams);
    Ok(out)
}

/// The upgrade request every connection sends (one key: the server's work is the same with
/// fresh ones), or the one byte a raw echo returns.
pub(crate) fn request_bytes(target: &Target) -> io::Result<Vec<u8>> {
    if target.raw {
        return Ok(vec![0]);
    }
    let key = generate_key([7; 16]);
    let request = ClientRequest {
        host: &target.host,
        path: &target.path,
        key: &key,
        protocols: &[],
        extensions: None,
        headers: &[],
    };
    let mut buf = vec![0u8; 1024];
    let n = request.encode(&mut buf).map_err(io::Error::other)?;
    buf.truncate(n);
    Ok(buf)
}

/// A non-blocking connect from `source` (any port: the kernel picks it at connect time for the
/// whole 4-tuple, `IP_BIND_ADDRESS_NO_PORT`).
pub(crate) fn connect(source: Option<Ipv4Addr>, to: SocketAddr) -> io::Result<mio::net::TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::os::fd::AsRawFd;
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(true)?;
    if let Some(source) = source {
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads `on`, an int that outlives the call, on our own socket.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        socket.bind(&SocketAddr::V4(SocketAddrV4::new(source, 0)).into())?;
    }
    match socket.connect(&to.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(mio::net::TcpStream::from_std(socket.into()))
}

pub(crate) enum Answer {
    /// Nothing read yet.
    Wait,
    /// Part of the head read; `matched` bytes of its end seen.
    More(u8),
    Open,
    Refused {
        status: u16,
        /// The `Retry-After` it carried, in seconds (`Some(0)` if not a number).
        retry_after: Option<u64>,
    },
    Failed(String),
}

/// Reads what the server answered: the 101's head up to its blank line (`matched` bytes of
/// `\r\n\r\n` seen before), or a refusal's status line.
pub(crate) fn read_answer(
    stream: &mut mio::net::TcpStream,
    buf: &mut [u8],
    matched: u8,
    status_read: bool,
    raw: bool,
) -> Answer {
    let mut matched = matched as usize;
    let mut first = !status_read;
    loop {
        let n = match stream.read(buf) {
            Ok(0) => return Answer::Failed("eof".into()),
            Ok(n) => n,
            // A WouldBlock before any byte leaves `first` set: the status line is still to come.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && first => return Answer::Wait,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Answer::More(matched as u8),
            Err(e) => return Answer::Failed(errno_name(&e)),
        };
        if raw {
            return Answer::Open;
        }
        let got = &buf[..n];
        if first {
            first = false;
            // "HTTP/1.1 101 Switching Protocols": the status is bytes 9..12 of the first read.
            let status = got
                .get(9..12)
                .and_then(|s| std::str::from_utf8(s).ok())
                .and_then(|s| s.parse::<u16>().ok());
            match status {
                Some(101) => {}
                Some(status) => {
                    let head = String::from_utf8_lossy(got).to_ascii_lowercase();
                    let retry_after = head.split("\nretry-after:").nth(1).map(|rest| {
                        let value = rest.split('\r').next().unwrap_or("").trim();
                        value.parse().unwrap_or(0)
                    });
                    return Answer::Refused { status, retry_after };
                }
                None => return Answer::Failed("not http".into()),
            }
        }
        const END: &[u8; 4] = b"\r\n\r\n";
        for (i, &b) in got.iter().enumerate() {
            matched = if b == END[matched] { matched + 1 } else { usize::from(b == END[0]) };
            if matched == 4 {
                // Bytes after the head would be a first frame: servers send none unasked.
                return if i + 1 == n {
                    Answer::Open
                } else {
                    Answer::Failed("data after 101".into())
                };
            }
        }
    }
}

/// Reads a held connection: answers pings, counts messages; `Some(code)` when the server
/// closed it (`Some(Some(code))` with a close frame, `Some(None)` without).
pub(crate) fn hold_read(
    stream: &mut mio::net::TcpStream,
    buf: &mut [u8],
    partial: &mut Vec<u8>,
    out: &mut Gathered,
) -> Option<Option<u16>> {
    loop {
        let n = match stream.read(buf) {
            Ok(0) => return Some(None),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(_) => return Some(None),
        };
        partial.extend_from_slice(&buf[..n]);
        let mut at = 0;
        while let Some((opcode, payload, len)) = server_frame(&partial[at..]) {
            match opcode {
                0x9 => {
                    out.pings += 1;
                    let pong = masked(0x8A, &partial[at + payload.0..at + payload.1]);
                    let _ = stream.write(&pong);
                }
                0x8 => {
                    let body = &partial[at + payload.0..at + payload.1];
                    let code = (body.len() >= 2).then(|| u16::from_be_bytes([body[0], body[1]]));
                    // RFC 6455 §5.5.1: the endpoint that receives a Close frame "MUST send a
                    // Close frame in response" (its code echoed).
                    let _ = stream.write(&masked(0x88, &body[..body.len().min(2)]));
                    partial.clear();
                    return Some(Some(code.unwrap_or(1005)));
                }
                0x1 | 0x2 => out.messages += 1,
                _ => {}
            }
            at += len;
        }
        partial.drain(..at);
    }
}

/// One unmasked frame from the server at the start of `bytes`: its opcode, its payload's
/// range, and its whole length; `None` until all of it is there.
fn server_frame(bytes: &[u8]) -> Option<(u8, (usize, usize), usize)> {
    let (&b0, &b1) = (bytes.first()?, bytes.get(1)?);
    let (len, head) = match b1 & 0x7f {
        126 => (u16::from_be_bytes([*bytes.get(2)?, *bytes.get(3)?]) as usize, 4),
        127 => (u64::from_be_bytes(bytes.get(2..10)?.try_into().ok()?) as usize, 10),
        n => (n as usize, 2),
    };
    (bytes.len() >= head + len).then_some((b0 & 0x0f, (head, head + len), head + len))
}

/// A masked control frame (the mask is zero: the bytes go out as they are, RFC 6455 §5.3
/// asks for a key the server cannot predict only to protect proxies from browser scripts).
fn masked(b0: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![b0, 0x80 | payload.len() as u8, 0, 0, 0, 0];
    frame.extend_from_slice(payload);
    frame
}

fn fail(
    streams: &mut [Option<mio::net::TcpStream>],
    phases: &mut [Phase],
    token: usize,
    out: &mut Gathered,
    why: &str,
) {
    *out.failed.entry(why.to_owned()).or_default() += 1;
    drop_slot(streams, phases, token);
}

fn drop_slot(streams: &mut [Option<mio::net::TcpStream>], phases: &mut [Phase], token: usize) {
    streams[token] = None;
    phases[token] = Phase::Empty;
}

/// `EADDRNOTAVAIL` for an error with an `errno`, else its kind.
pub(crate) fn errno_name(e: &io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(libc::EMFILE) => "EMFILE (open-file limit)",
        Some(libc::ENFILE) => "ENFILE (fs.file-max)",
        Some(libc::EADDRNOTAVAIL) => "EADDRNOTAVAIL (ephemeral ports)",
        Some(libc::ECONNREFUSED) => "ECONNREFUSED",
        Some(libc::ECONNRESET) => "ECONNRESET",
        Some(libc::ETIMEDOUT) => "ETIMEDOUT",
        Some(libc::ENOBUFS) => "ENOBUFS",
        Some(libc::ENOMEM) => "ENOMEM",
        _ => return format!("{:?}", e.kind()),
    };
    name.to_owned()
}

/// Ports in `net.ipv4.ip_local_port_range`.
pub fn ephemeral_ports() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut words = text.split_whitespace().map(|w| w.parse::<usize>().ok());
    let (low, high) = (words.next()??, words.next()??);
    Some(high.saturating_sub(low) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_frames_are_read_whole_or_not_at_all() {
        let ping = [0x89, 3, b'a', b'b', b'c'];
        assert_eq!(server_frame(&ping), Some((0x9, (2, 5), 5)));
        for cut in 0..ping.len() {
            assert_eq!(server_frame(&ping[..cut]), None, "{cut}");
        }
        let mut long = vec![0x82, 126, 0x01, 0x00];
        long.extend(std::iter::repeat_n(0, 256));
        assert_eq!(server_frame(&long), Some((0x2, (4, 260), 260)));
    }

    #[test]
    fn sources_cover_the_count() {
        let range = ephemeral_ports().unwrap_or(28_232);
        assert_eq!(Crowd::sources_needed(10, 1), 1);
        let n = Crowd::sources_needed(1_000_000, 1);
        assert!(n * range >= 1_000_000, "{n}");
        assert!(Crowd::sources_needed(1_000_000, 4) < n);
        let sources = Crowd::loopback_sources(Ipv4Addr::new(127, 0, 1, 1), 300);
        assert_eq!(sources[0], Ipv4Addr::new(127, 0, 1, 1));
        assert_eq!(sources[299], Ipv4Addr::new(127, 0, 2, 44));
    }
}
