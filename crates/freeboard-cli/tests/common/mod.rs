//! `freeboard serve` as a child process for the CLI's tests: started on a free loopback port
//! (the address read from the URL line it prints), its stderr lines kept for the test to
//! look through, stopped by its PID when dropped.

// Each test file uses its own part of this module.
#![allow(dead_code)]

pub(crate) mod devtools;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use freeboard_test::{Inbox, frame};

/// A running `freeboard serve`.
pub(crate) struct Serve {
    child: Child,
    /// `127.0.0.1:PORT` (`ws://`).
    pub(crate) addr: String,
    /// The `wss://` address, when the server listens for TLS.
    pub(crate) wss: Option<String>,
    log: Receiver<String>,
}

impl Serve {
    /// Starts `freeboard serve` with `extra` flags; on `127.0.0.1:0`, with two event loops and
    /// a 64 MiB budget unless `extra` sets them.
    pub(crate) fn start(extra: &[&str]) -> Self {
        Self::start_with(extra, |_| {})
    }

    /// [`start`](Self::start), with `prepare` given the command before it spawns (a
    /// `pre_exec` hook, say).
    pub(crate) fn start_with(extra: &[&str], prepare: impl FnOnce(&mut Command)) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_freeboard"));
        prepare(&mut command);
        command.arg("serve");
        // The I/O driver `FREEBOARD_TEST_IO` names (`epoll`, `uring`), so the same tests run
        // under each.
        let io = std::env::var("FREEBOARD_TEST_IO").unwrap_or_else(|_| "epoll".into());
        for (flag, default) in [
            ("--listen", "127.0.0.1:0"),
            ("--threads", "2"),
            ("--memory", "64M"),
            ("--io", io.as_str()),
        ] {
            if !extra.contains(&flag) {
                command.args([flag, default]);
            }
        }
        let mut child = command
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start freeboard serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        // `freeboard listening on ws://ADDR/[ and wss://ADDR/]`
        let url = |scheme: &str| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix(scheme))
                .map(|addr| addr.trim_end_matches('/').to_owned())
        };
        let (addr, wss) = (url("ws://"), url("wss://"));
        assert!(addr.is_some() || wss.is_some(), "no URL line from freeboard serve: {line:?}");
        let addr = addr.unwrap_or_default();
        let (tx, log) = channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { child, addr, wss, log }
    }

    /// The address as a [`SocketAddr`].
    pub(crate) fn socket_addr(&self) -> SocketAddr {
        self.addr.parse().unwrap()
    }

    /// The first stderr line from now on that contains `what` (waits up to 20 s).
    pub(crate) fn log_line(&self, what: &str) -> String {
        loop {
            match self.log.recv_timeout(Duration::from_secs(20)) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => {}
                Err(e) => panic!("no log line with {what:?}: {e}"),
            }
        }
    }

    /// Every stderr line from now on for `span`.
    pub(crate) fn log_lines_for(&self, span: Duration) -> Vec<String> {
        let until = std::time::Instant::now() + span;
        let mut lines = Vec::new();
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            match self.log.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(_) => break,
            }
        }
        lines
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` to the server.
    pub(crate) fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as libc::pid_t, sig) }, 0);
    }

    /// Waits for the server to exit.
    pub(crate) fn wait(&mut self) -> ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nobody listens on: bound, noted and closed.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Whether a server listens at `addr`. A connection to a free port in the ephemeral range
/// can meet itself (TCP simultaneous open) and look like one; a request on it would wait for
/// its own answer.
pub(crate) fn listening(addr: impl std::net::ToSocketAddrs) -> bool {
    std::net::TcpStream::connect(addr).is_ok_and(|s| s.local_addr().ok() != s.peer_addr().ok())
}

/// A child process killed and reaped when dropped, so that a failing test leaves none behind.
pub(crate) struct Process(pub(crate) Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill(); // (nothing to kill once it was waited for)
        let _ = self.0.wait();
    }
}

/// `redis-server` on `port` (no persistence), ready for connections; `None` if it is not
/// installed.
pub(crate) fn redis_server(port: u16) -> Option<Process> {
    redis_server_with(port, std::iter::empty::<&str>())
}

/// [`redis_server`] with more arguments (a cluster node's).
pub(crate) fn redis_server_with(
    port: u16,
    extra: impl IntoIterator<Item = impl AsRef<std::ffi::OsStr>>,
) -> Option<Process> {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let process = Process(child);
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !listening(("127.0.0.1", port)) {
        assert!(std::time::Instant::now() < until, "redis-server did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(process)
}

/// A WebSocket on `target` (with `extra` header lines) over `s`, its 101 read.
pub(crate) fn upgrade(mut s: TcpStream, target: &str, extra: &str) -> (TcpStream, Inbox) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(freeboard_test::upgrade_request(target, extra).as_bytes()).unwrap();
    let mut inbox = Inbox::default();
    let head = inbox.head(&mut s).unwrap().expect("a response");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    (s, inbox)
}

/// A WebSocket on `target` at `addr`, its 101 read.
pub(crate) fn subscribe(addr: &str, target: &str) -> (TcpStream, Inbox) {
    upgrade(TcpStream::connect(addr).unwrap(), target, "")
}

/// [`subscribe`] with an 8 KiB receive buffer (no autotuning), so that a subscriber that does
/// not read is soon behind.
pub(crate) fn subscribe_slow(addr: &str, target: &str) -> (TcpStream, Inbox) {
    let addr: SocketAddr = addr.parse().unwrap();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(8 << 10).unwrap();
    socket.connect(&addr.into()).unwrap();
    upgrade(socket.into(), target, "")
}

/// A masked client text frame.
pub(crate) fn text(payload: &[u8]) -> Vec<u8> {
    frame(0x81, payload, Some([1, 2, 3, 4]))
}
