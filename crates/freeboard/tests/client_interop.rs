//! The blocking client against real peers from the registries, on loopback: a Python
//! `websockets` server and a Node `ws` server (`interop/`). Text and binary from 0 B to 16 MiB,
//! echoed whole or in 2 and 4 fragments with a ping before each fragment, and 1,000 JSON-RPC
//! requests in flight answered out of order.
//!
//! The peers are installed on first use when missing: `python3 -m venv interop/python/.venv`
//! plus `pip install -r interop/python/requirements.txt`, and `npm ci` in `interop/node`.
//! Set `FREEBOARD_SKIP_INTEROP=1` to skip these tests where neither is possible.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use freeboard::client::{
    Client, ClientConfig, CloseCode, Event, MessageKind, PushOutcome, SendOutcome, Watermarks,
};

#[test]
fn python_websockets() {
    let Some(python) = python() else { return };
    let peer = Peer::start(Command::new(python).arg(interop().join("python/echo_server.py")));
    exercise(&peer);
}

#[test]
fn node_ws() {
    let Some(node) = node() else { return };
    let peer = Peer::start(Command::new(node).arg(interop().join("node/echo_server.js")));
    exercise(&peer);
}

fn exercise(peer: &Peer) {
    let sizes = [0, 1, 125, 126, 4095, 4096, 65535, 65536, 1 << 20, 16 << 20];
    let mut client = peer.connect("/echo");
    for (i, &size) in sizes.iter().enumerate() {
        for kind in [MessageKind::Text, MessageKind::Binary] {
            let payload = payload(kind, size, i);
            let pushed = if i % 2 == 0 {
                client.send(kind, &payload).unwrap()
            } else {
                client.send_owned(kind, payload.clone()).unwrap()
            };
            assert_eq!(pushed, SendOutcome::Queue(PushOutcome::Queued));
            assert_eq!(next(&mut client), (kind, payload), "echo of {kind:?} {size} B");
        }
    }
    close(client);

    for n in [2, 4] {
        let mut client = peer.connect(&format!("/fragment?n={n}"));
        for (i, &size) in sizes.iter().enumerate() {
            for kind in [MessageKind::Text, MessageKind::Binary] {
                let payload = payload(kind, size, i);
                let _ = client.send(kind, &payload).unwrap();
                assert_eq!(next(&mut client), (kind, payload), "{kind:?} {size} B in {n}");
            }
        }
        close(client);
    }

    let mut client = peer.connect("/jsonrpc");
    for id in 0..1000 {
        let request = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"echo","params":[{id}]}}"#);
        let pushed = client.send_text(&request).unwrap();
        assert!(matches!(
            pushed,
            SendOutcome::Queue(PushOutcome::Queued | PushOutcome::QueuedAboveHigh)
        ));
    }
    let mut answered = vec![false; 1000];
    let mut in_order = true;
    for expected in 0..1000 {
        let (_, bytes) = next(&mut client);
        let text = String::from_utf8(bytes).unwrap();
        let id: usize = field(&text, "\"id\":").parse().unwrap();
        assert_eq!(field(&text, "\"result\":"), format!("[{id}]"), "{text}");
        assert!(!std::mem::replace(&mut answered[id], true), "id {id} answered twice");
        in_order &= id == expected;
    }
    assert!(answered.iter().all(|&a| a));
    assert!(!in_order, "the peer is meant to answer out of order");
    close(client);
}

/// A payload of `size` bytes: for text, UTF-8 with 1- to 4-byte code points, so fragment
/// boundaries fall inside them.
fn payload(kind: MessageKind, size: usize, seed: usize) -> Vec<u8> {
    match kind {
        MessageKind::Binary => (0..size).map(|i| (i * 31 + seed) as u8).collect(),
        MessageKind::Text => {
            let mut text = String::with_capacity(size);
            let alphabet = ['a', 'é', '€', '𝄞'];
            let mut i = seed;
            while text.len() < size {
                let c = alphabet[i % 4];
                if text.len() + c.len_utf8() > size {
                    text.push('z');
                } else {
                    text.push(c);
                }
                i += 1;
            }
            text.into_bytes()
        }
    }
}

fn field<'a>(json: &'a str, name: &str) -> &'a str {
    let rest = json.split(name).nth(1).unwrap().trim_start();
    let end = rest.find([',', '}']).unwrap();
    rest[..end].trim()
}

fn next(client: &mut Client) -> (MessageKind, Vec<u8>) {
    match client.recv().unwrap() {
        Event::Message(m) => (m.kind(), m.to_vec()),
        Event::Closed(c) => panic!("closed: {c:?}"),
    }
}

fn close(mut client: Client) {
    client.close(CloseCode::NORMAL, "").unwrap();
    loop {
        match client.recv().unwrap() {
            Event::Message(_) => {}
            Event::Closed(close) => {
                assert_eq!((close.code, close.was_clean), (CloseCode::NORMAL, true), "{close:?}");
                return;
            }
        }
    }
}

/// A peer server process, killed on drop.
struct Peer {
    child: Child,
    port: u16,
}

impl Peer {
    fn start(command: &mut Command) -> Self {
        let mut child = command.stdout(Stdio::piped()).spawn().expect("start the peer server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("listening ").expect(&line).parse().unwrap();
        Self { child, port }
    }

    fn connect(&self, path: &str) -> Client {
        // 16 MiB messages: room in the pool and the queue for one in each direction.
        let marks = Watermarks::new(8 << 20, 16 << 20, 32 << 20).unwrap();
        let config =
            ClientConfig::default().memory(96 << 20).limits(|limits| limits.watermarks(marks));
        Client::connect(&format!("ws://127.0.0.1:{}{path}", self.port), config).unwrap()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn interop() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop")
}

fn skip(why: &str) -> bool {
    if std::env::var_os("FREEBOARD_SKIP_INTEROP").is_some() {
        eprintln!("skipped: {why}");
        return true;
    }
    panic!("{why} (set FREEBOARD_SKIP_INTEROP=1 to skip the interop tests)");
}

/// Installs the peers once per test binary, one at a time.
static INSTALL: Mutex<()> = Mutex::new(());

fn python() -> Option<PathBuf> {
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let _guard = INSTALL.lock().unwrap();
            let dir = interop().join("python");
            let venv_python = dir.join(".venv/bin/python");
            let ready = || {
                Command::new(&venv_python)
                    .args(["-c", "import websockets"])
                    .status()
                    .is_ok_and(|s| s.success())
            };
            if !ready() {
                let ok =
                    run(Command::new("python3").args(["-m", "venv", ".venv"]).current_dir(&dir))
                        && run(Command::new(dir.join(".venv/bin/pip"))
                            .args(["install", "-q", "-r", "requirements.txt"])
                            .current_dir(&dir));
                if !ok || !ready() {
                    skip("cannot install the Python websockets peer");
                    return None;
                }
            }
            Some(venv_python)
        })
        .clone()
}

fn node() -> Option<PathBuf> {
    static NODE: OnceLock<Option<PathBuf>> = OnceLock::new();
    NODE.get_or_init(|| {
        let _guard = INSTALL.lock().unwrap();
        let dir = interop().join("node");
        if !run(Command::new("node").arg("--version").stdout(Stdio::null())) {
            skip("node is not installed");
            return None;
        }
        if !dir.join("node_modules/ws").exists()
            && !run(Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(&dir))
        {
            skip("cannot install the Node ws peer (npm ci)");
            return None;
        }
        Some(PathBuf::from("node"))
    })
    .clone()
}

fn run(command: &mut Command) -> bool {
    command.status().is_ok_and(|s| s.success())
}
