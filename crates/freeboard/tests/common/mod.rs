//! A blocking loopback WebSocket client for the server's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use freeboard::{Echo, HttpRoute, Router, RunningServer, Server, ServerConfig};
use freeboard_test::Inbox;

/// A config for tests: one loop, an ephemeral port, a small budget, no pings; the I/O driver
/// `FREEBOARD_TEST_IO` names (`epoll` or `uring`; default epoll), so that the same tests run
/// under each (`scripts/test` runs them with `uring` too).
pub fn config() -> ServerConfig {
    let mut config = ServerConfig::default();
    config.io = match std::env::var("FREEBOARD_TEST_IO").as_deref() {
        Ok("uring") => freeboard::IoDriver::Uring,
        Ok("epoll") | Err(_) => freeboard::IoDriver::Epoll,
        Ok(other) => panic!("FREEBOARD_TEST_IO={other}: epoll or uring"),
    };
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.memory = 64 << 20;
    config.limits.max_message_size = 1 << 20;
    config.limits.send_cap = 2 << 20;
    config.limits.idle_timeout = None;
    config.drain_timeout = Duration::from_secs(5);
    config.limits.close_timeout = Duration::from_secs(1);
    config
}

/// An echo server at `/` and `/echo` that also serves `/healthz` and `/metrics`.
pub fn start(config: ServerConfig) -> RunningServer {
    let routes = || {
        Router::new()
            .route("/", Echo)
            .route("/echo", Echo)
            .http("/healthz", HttpRoute::Health)
            .http("/metrics", HttpRoute::Metrics)
    };
    Server::bind(config, routes).unwrap().spawn()
}

/// Sends `request`, ends its side of the connection (a one-shot client: the server answers
/// and closes rather than keeping it alive) and reads the response until the server closes;
/// returns it as text.
pub fn http(addr: SocketAddr, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

pub fn upgrade_request(path: &str) -> String {
    freeboard_test::upgrade_request(path, "")
}

/// A client connection after a successful (or refused) upgrade.
/// A test fails rather than hangs when the server stops answering or stops reading (a write
/// into a full window can otherwise wait out the kernel's retransmission back-off, minutes).
fn set_timeouts(stream: &TcpStream) {
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
}

pub struct Client {
    pub stream: TcpStream,
    /// Bytes read past what was consumed.
    inbox: Inbox,
}

impl Client {
    /// Connects and upgrades; returns the client and the response status.
    pub fn connect(addr: SocketAddr, path: &str) -> (Self, u16, String) {
        let mut stream = TcpStream::connect(addr).unwrap();
        set_timeouts(&stream);
        stream.write_all(upgrade_request(path).as_bytes()).unwrap();
        let mut client = Self { stream, inbox: Inbox::default() };
        let head = client.read_head();
        let status = head[9..12].parse().unwrap();
        (client, status, head)
    }

    /// A client over a raw stream, before or without any handshake.
    pub fn raw(stream: TcpStream) -> Self {
        set_timeouts(&stream);
        Self { stream, inbox: Inbox::default() }
    }

    pub fn open(addr: SocketAddr) -> Self {
        let (client, status, head) = Self::connect(addr, "/");
        assert_eq!(status, 101, "{head}");
        client
    }

    /// Reads an HTTP response head.
    pub fn read_head(&mut self) -> String {
        let head = self.inbox.head(&mut self.stream).unwrap();
        head.expect("connection closed before the response head")
    }

    /// Sends one masked frame.
    pub fn send(&mut self, first_byte: u8, payload: &[u8]) {
        let frame = freeboard_test::frame(first_byte, payload, freeboard_test::TEST_MASK);
        self.stream.write_all(&frame).unwrap();
    }

    /// Reads one frame: `(opcode, payload)`, or `None` at EOF.
    pub fn recv(&mut self) -> Option<(u8, Vec<u8>)> {
        let frame = self.inbox.frame(&mut self.stream).ok()??;
        Some((frame.opcode, frame.payload))
    }

    /// Reads frames until a close frame; returns its code.
    pub fn recv_close(&mut self) -> Option<u16> {
        loop {
            let (opcode, payload) = self.recv()?;
            if opcode == 0x8 {
                return Some(u16::from_be_bytes([payload[0], payload[1]]));
            }
        }
    }

    /// Whether the server has closed the TCP connection (read returns 0).
    pub fn sees_eof(&mut self) -> bool {
        self.inbox.sees_eof(&mut self.stream)
    }
}

/// The value of a metric line `name{labels} value` in `/metrics` text, 0 if absent.
pub fn metric(addr: SocketAddr, series: &str) -> f64 {
    // `/metrics` is rebuilt at most every ADMIN_REFRESH: after that, the build is fresh.
    std::thread::sleep(freeboard::metrics::ADMIN_REFRESH);
    let text = http(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Waits for every pool chunk to come back, then shuts the server down.
pub fn stop_once_idle(server: RunningServer) {
    let metrics = server.metrics();
    wait_until("the chunks to return", || metrics.total_chunks_in_use() == 0);
    server.handle().shutdown();
    server.join().unwrap();
}

/// Waits until `cond` holds (gauges are published at the end of a loop turn, just after the
/// bytes a client may already have read); fails after 10 s.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
