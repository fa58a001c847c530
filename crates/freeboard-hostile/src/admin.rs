//! Abuse of the admin surfaces: dashboard streams that ask for a snapshot in a tight loop and
//! never read, and `/metrics` scrapers that ask again as soon as they are answered; and
//! [`Responsiveness`], which times `/healthz` while they run.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use freeboard_test::{TEST_MASK, frame, upgrade_request};

/// What the dashboard-stream attackers saw.
#[derive(Debug, Default, Clone)]
pub struct StreamFlood {
    /// Sockets that were upgraded (101).
    pub upgraded: usize,
    /// Upgrades refused, by the status line's code.
    pub refused: Vec<u16>,
    /// One-byte text frames written in all.
    pub frames: u64,
    /// Sockets the server ended (a write failed: reset or closed) before the attack did.
    pub ended_by_server: usize,
}

/// Opens `sockets` connections to `path` (a dashboard stream) with `request_extra` header
/// lines, then on each writes batches of 20 one-byte text frames in a loop for `duration`,
/// never reading. Each socket is on its own thread (a write blocks once the server stops
/// reading it).
pub fn stream_flood(
    addr: SocketAddr,
    path: &str,
    request_extra: &str,
    sockets: usize,
    duration: Duration,
) -> StreamFlood {
    let batch: Vec<u8> = (0..20).flat_map(|_| frame(0x81, b"s", TEST_MASK)).collect();
    let batch = Arc::new(batch);
    let frames = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let mut outcome = StreamFlood::default();
    let mut threads = Vec::new();
    for _ in 0..sockets {
        let Ok(mut stream) = TcpStream::connect(addr) else { continue };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let request = upgrade_request(path, request_extra);
        if stream.write_all(request.as_bytes()).is_err() {
            continue;
        }
        let mut head = [0u8; 12];
        if stream.read_exact(&mut head).is_err() {
            continue;
        }
        let status = std::str::from_utf8(&head[9..12]).ok().and_then(|s| s.parse().ok());
        match status {
            Some(101) => outcome.upgraded += 1,
            other => {
                outcome.refused.push(other.unwrap_or(0));
                continue;
            }
        }
        // Writes block once the server stops reading; the timeout lets the thread see the
        // deadline.
        let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
        let (batch, frames) = (batch.clone(), frames.clone());
        threads.push(std::thread::spawn(move || {
            while Instant::now() < deadline {
                match stream.write(&batch) {
                    Ok(n) => {
                        frames.fetch_add((n / 7) as u64, Ordering::Relaxed);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => return true,
                }
            }
            false
        }));
    }
    for thread in threads {
        if thread.join().unwrap_or(false) {
            outcome.ended_by_server += 1;
        }
    }
    outcome.frames = frames.load(Ordering::Relaxed);
    outcome
}

/// Scrapers that `GET path` on keep-alive connections as fast as they are answered, until
/// dropped; [`finish`](Self::finish) says how many answers came.
pub struct Scrapers {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Scrapers {
    /// Starts `n` scrapers of `path` with `extra` header lines.
    pub fn start(addr: SocketAddr, path: &str, extra: &str, n: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        let threads = (0..n)
            .map(|_| {
                let (stop, answered, request) = (stop.clone(), answered.clone(), request.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(mut stream) = TcpStream::connect(addr) else { return };
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                        while !stop.load(Ordering::Relaxed) {
                            if stream.write_all(request.as_bytes()).is_err()
                                || !read_response(&mut stream)
                            {
                                break;
                            }
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        Self { stop, answered, threads }
    }

    /// Stops the scrapers; the responses they read.
    pub fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
        self.answered.load(Ordering::Relaxed)
    }
}

/// `/healthz` asked every 20 ms on a fresh connection while an attack runs: the slowest
/// answer, and how many never came (within 2 s).
pub struct Responsiveness {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(Duration, usize, usize)>,
}

impl Responsiveness {
    /// Starts probing `addr`'s `/healthz`.
    pub fn start(addr: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut slowest, mut answered, mut missed) = (Duration::ZERO, 0, 0);
            while !stopped.load(Ordering::Relaxed) {
                let start = Instant::now();
                if health(addr) {
                    slowest = slowest.max(start.elapsed());
                    answered += 1;
                } else {
                    missed += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (slowest, answered, missed)
        });
        Self { stop, thread }
    }

    /// Stops probing: the slowest answer, the answers, the probes never answered.
    pub fn finish(self) -> (Duration, usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or((Duration::MAX, 0, usize::MAX))
    }
}

/// One `GET /healthz` on a new connection; whether `200` came back within 2 s.
fn health(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let mut head = [0u8; 12];
    stream.write_all(request).is_ok()
        && stream.read_exact(&mut head).is_ok()
        && &head[9..12] == b"200"
}

/// Reads one HTTP response with a `Content-Length` body; whether it was a whole `200`.
fn read_response(stream: &mut TcpStream) -> bool {
    let mut buf = Vec::with_capacity(16 * 1024);
    let mut chunk = [0u8; 8192];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < end + 4 + length {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        return head.starts_with("http/1.1 200");
    }
}
