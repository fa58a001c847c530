//! The hostile families against the Node and Python bindings: what `freeboard serve` refuses,
//! a server written with either binding refuses with the same outcome (protocol errors, the
//! budget, slowloris), while an innocent client's echoes come back intact.
//!
//! Each server is the binding's benchmark echo server (`bindings/node/bench/server.js`,
//! `bindings/python/bench/servers.py`) in both of its styles — an object per connection
//! (`ws`, `websockets`) and none (Node's connections by id, Python's listener) — started per
//! test and killed by its PID. Ignored in
//! the workspace run: they need the bindings built, and `scripts/test` runs them
//! (`--ignored`) right after building them.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use freeboard_hostile::budget::attack;
use freeboard_hostile::{Innocent, frames, raise_fd_limit, slowloris};

/// A binding's echo server, killed on drop.
struct Binding {
    name: &'static str,
    child: Child,
    addr: SocketAddr,
}

impl Binding {
    /// Starts the `name` binding's echo server (one of [`BINDINGS`]) with extra settings.
    fn start(name: &'static str, settings: &str) -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let at = format!("127.0.0.1:{port}");
        let mut command = match name {
            "node" | "node-ids" => {
                let mode = if name == "node" { "echo" } else { "echo-ids" };
                let mut c = Command::new("node");
                c.arg(root.join("bindings/node/bench/server.js")).args([mode, &at, settings]);
                c
            }
            _ => {
                let python: PathBuf = root.join("bindings/python/.venv/bin/python");
                let server = if name == "python" { "freeboard" } else { "freeboard-listener" };
                let mut c = Command::new(python);
                c.arg(root.join("bindings/python/bench/servers.py"));
                c.args([server, "echo", &at, settings]);
                c
            }
        };
        let child = command.stdout(Stdio::null()).spawn().unwrap_or_else(|e| {
            panic!("{name}: cannot start the binding's server (built? see scripts/test): {e}")
        });
        let addr: SocketAddr = at.parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "{name}: the server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { name, child, addr }
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each binding in each style: a `WebSocket` per connection and by id (Node), a coroutine per
/// connection and a listener (Python).
const BINDINGS: [&str; 4] = ["node", "node-ids", "python", "python-listener"];

/// The families run one at a time: each measures an innocent client beside one attack.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
#[ignore = "needs the bindings built; scripts/test runs it after building them"]
fn protocol_errors_get_the_close_codes_freeboard_serve_sends() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for name in BINDINGS {
        let server = Binding::start(name, "{}");
        let innocent = Innocent::start(server.addr);
        for _ in 0..20 {
            // RFC 6455 §5.2: "the most significant bit MUST be 0".
            assert_eq!(frames::length_field(server.addr, 1 << 63), Some(1002), "{name}");
            // A valid length no server holds: over max_message_size.
            assert_eq!(frames::length_field(server.addr, (1 << 63) - 1), Some(1009), "{name}");
            // RFC 6455 §5.1: "a server MUST close the connection upon receiving a frame that
            // is not masked".
            assert_eq!(frames::unmasked(server.addr), Some(1002), "{name}");
        }
        for payload in frames::INVALID_UTF8 {
            // RFC 6455 §8.1: invalid UTF-8 in a text message fails the connection (1007).
            let reply =
                frames::split_text(server.addr, payload, payload.len() / 2, frames::Split::Reads)
                    .unwrap();
            assert_eq!((reply.opcode, reply.close_code()), (0x8, 1007), "{name}");
        }
        innocent.finish().assert_intact();
        println!("{}: protocol family as freeboard serve", server.name);
    }
}

#[test]
#[ignore = "needs the bindings built; scripts/test runs it after building them"]
fn unfinished_messages_pay_for_the_pool_not_the_innocents() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_fd_limit();
    for name in BINDINGS {
        let server = Binding::start(name, r#"{"memory": "16M"}"#);
        let others: Vec<Innocent> = (0..3).map(|_| Innocent::start(server.addr)).collect();
        // 60 clients start a message and never finish it (64 KiB continuations up to 16 MiB).
        let closes = attack(server.addr, 60, |client| {
            let piece = vec![0x33; 64 << 10];
            client.send(0x02, &piece)?;
            for _ in 1..256 {
                client.send(0x00, &piece)?;
            }
            Ok(())
        });
        for other in others {
            other.finish().assert_intact();
        }
        let allowed = |c: &Result<Option<u16>, u16>| matches!(c, Ok(None | Some(1013)) | Err(503));
        assert!(closes.iter().all(allowed), "{name}: {closes:?}");
        assert!(closes.contains(&Ok(Some(1013))), "{name}: none refused: {closes:?}");
        println!("{}: budget family as freeboard serve", server.name);
    }
}

#[test]
#[ignore = "needs the bindings built; scripts/test runs it after building them"]
fn slowloris_connections_are_dropped_at_the_handshake_timeout() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_fd_limit();
    for name in BINDINGS {
        // A byte per second against a 3 s handshake timeout (milliseconds in JavaScript,
        // seconds in Python, as each binding takes its timeouts).
        let settings = match name {
            "node" | "node-ids" => r#"{"memory": "256M", "handshakeTimeout": 3000}"#,
            _ => r#"{"memory": "256M", "handshake_timeout": 3}"#,
        };
        let server = Binding::start(name, settings);
        let innocent = Innocent::start(server.addr);
        let outcome =
            slowloris::run(server.addr, 1000, Duration::from_secs(1), Duration::from_secs(30));
        innocent.finish().assert_intact();
        assert_eq!(outcome.opened, 1000, "{name}: {outcome:?}");
        assert_eq!(outcome.dropped, 1000, "{name} kept slowloris connections: {outcome:?}");
        println!("{}: slowloris family as freeboard serve ({outcome:?})", server.name);
    }
}
