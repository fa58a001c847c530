//! The servers measured side by side: freeboard itself and echo servers built from the
//! registries, each a small program under `peers/` built on first use into a cache folder.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Target;

/// A server to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// `freeboard serve`, one event loop.
    Freeboard,
    /// `freeboard serve` over plain `ws://` in a `--tls` run: the figures beside which TLS's
    /// cost is read. Not in [`Peer::ALL`]: named with `--peers`.
    FreeboardWs,
    /// `freeboard serve --io uring`, one event loop on io_uring, plain `ws://` only. Not in
    /// [`Peer::ALL`]: named with `--peers`.
    FreeboardUring,
    /// An epoll (mio) TCP echo with no WebSocket work: the physical limit of epoll.
    RawTcp,
    /// An io_uring TCP echo with no WebSocket work (multishot receive into a provided buffer
    /// ring, sends batched per loop turn): the physical limit on a kernel with io_uring.
    RawUring,
    /// tokio-tungstenite on a one-worker multi-thread runtime.
    TokioTungstenite,
    /// fastwebsockets on a one-worker multi-thread runtime.
    Fastwebsockets,
    /// Node's `ws` (single-threaded, as Node is).
    NodeWs,
    /// Go's gorilla/websocket with `GOMAXPROCS=1`.
    Gorilla,
    /// Node's `ws` as a broadcast server (`/pub` publishes to every other connection, looping
    /// over a `Map`), for the broadcast experiment only: not in [`Peer::ALL`].
    NodeWsBroadcast,
    /// An epoll (mio) TCP fan-out with no WebSocket work, writing what one connection sends to
    /// every other: the physical limit of the broadcast experiment, and only there.
    RawTcpBroadcast,
    /// tokio-tungstenite over tokio-rustls (rustls on ring, as freeboard), on a one-worker
    /// multi-thread runtime: the peer of `--tls` runs, and only there.
    TokioTungsteniteRustls,
    /// An axum app echoing with axum's own `extract::ws` (tokio-tungstenite underneath), one
    /// worker. Not in [`Peer::ALL`]: named with `--peers`.
    AxumWs,
    /// The same axum app upgraded to freeboard's tokio driver (`freeboard::tokio::axum`), one
    /// worker. Not in [`Peer::ALL`]: named with `--peers`.
    AxumFreeboard,
    /// uWebSockets' echo (`peers/uwebsockets`), one thread, compression off. Its sources come
    /// from GitHub, so it is not built here: `peers/uwebsockets/build.sh DIR` builds it from a
    /// checkout into the cache, or `FREEBOARD_UWEBSOCKETS=DIR` names the checkout to build
    /// from on first use. Not in [`Peer::ALL`]: named with `--peers`.
    Uwebsockets,
}

impl Peer {
    /// Every peer, in the order a run visits them.
    pub const ALL: [Peer; 7] = [
        Peer::Freeboard,
        Peer::RawTcp,
        Peer::RawUring,
        Peer::TokioTungstenite,
        Peer::Fastwebsockets,
        Peer::NodeWs,
        Peer::Gorilla,
    ];

    /// The name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Freeboard => "freeboard",
            Peer::FreeboardWs => "freeboard-ws",
            Peer::FreeboardUring => "freeboard-uring",
            Peer::RawTcp => "raw-tcp-echo",
            Peer::RawUring => "raw-uring-echo",
            Peer::TokioTungstenite => "tokio-tungstenite",
            Peer::Fastwebsockets => "fastwebsockets",
            Peer::NodeWs => "node-ws",
            Peer::Gorilla => "gorilla",
            Peer::NodeWsBroadcast => "node-ws-broadcast",
            Peer::RawTcpBroadcast => "raw-tcp-broadcast",
            Peer::TokioTungsteniteRustls => "tokio-tungstenite-rustls",
            Peer::AxumWs => "axum-ws",
            Peer::AxumFreeboard => "axum-freeboard",
            Peer::Uwebsockets => "uwebsockets",
        }
    }

    /// The peer called `name`.
    pub fn parse(name: &str) -> Result<Self, String> {
        let others = [
            Peer::FreeboardWs,
            Peer::FreeboardUring,
            Peer::NodeWsBroadcast,
            Peer::RawTcpBroadcast,
            Peer::TokioTungsteniteRustls,
            Peer::AxumWs,
            Peer::AxumFreeboard,
            Peer::Uwebsockets,
        ];
        let all = Self::ALL.into_iter().chain(others);
        all.clone().find(|p| p.name() == name).ok_or_else(|| {
            let names: Vec<_> = all.map(|p| p.name()).collect();
            format!("unknown peer {name:?}; known: {}", names.join(", "))
        })
    }
}

/// Where the peers' sources, their build cache and the freeboard binary are.
#[derive(Debug, Clone)]
pub struct Peers {
    /// The `peers/` folder: one Cargo project per peer, named as the peer.
    pub sources: PathBuf,
    /// Build outputs (`cargo --target-dir`); git-ignored.
    pub cache: PathBuf,
    /// The `freeboard` binary that runs `serve`.
    pub freeboard: PathBuf,
    /// Further arguments for `freeboard serve` (watermarks, policies, …).
    pub serve_args: Vec<String>,
    /// Serve `wss://` with this certificate chain and key (PEM): freeboard and
    /// tokio-tungstenite-rustls only.
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// A peer server running on loopback; killed when dropped.
#[derive(Debug)]
pub struct Running {
    child: Child,
    /// Where to point the load generator.
    pub target: Target,
    /// Its process id, to sample CPU time and RSS.
    pub pid: u32,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Peers {
    /// The layout of this repository: `peers/` next to `crates/`, the cache in
    /// `target/peers`, and `freeboard` given by the caller (usually the running binary).
    pub fn in_repository(freeboard: PathBuf) -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        Self {
            sources: root.join("peers"),
            cache: root.join("target/peers"),
            freeboard,
            serve_args: Vec::new(),
            tls: None,
        }
    }

    /// Builds `peer` if it needs building (a no-op once fresh) and returns its binary.
    pub fn build(&self, peer: Peer) -> io::Result<PathBuf> {
        let source = self.sources.join(peer.name());
        let output = self.cache.join(peer.name());
        let run = |command: &mut Command| -> io::Result<()> {
            let status = command.stdout(Stdio::null()).status()?;
            match status.success() {
                true => Ok(()),
                false => Err(io::Error::other(format!("building {} failed", source.display()))),
            }
        };
        match peer {
            Peer::Freeboard | Peer::FreeboardWs | Peer::FreeboardUring => {
                return Ok(self.freeboard.clone());
            }
            Peer::NodeWs | Peer::NodeWsBroadcast => {
                std::fs::create_dir_all(&output)?;
                for file in ["package.json", "package-lock.json", "server.js"] {
                    std::fs::copy(source.join(file), output.join(file))?;
                }
                if !output.join("node_modules/ws").exists() {
                    run(Command::new("npm")
                        .args(["ci", "--no-audit", "--no-fund", "--silent"])
                        .current_dir(&output))?;
                }
                return Ok(output.join("server.js"));
            }
            Peer::Uwebsockets => {
                let binary = self.cache.join("uws-echo");
                if binary.exists() {
                    return Ok(binary);
                }
                let Some(checkout) = std::env::var_os("FREEBOARD_UWEBSOCKETS") else {
                    return Err(io::Error::other(format!(
                        "{} is not built: run peers/uwebsockets/build.sh DIR with a uWebSockets \
                         checkout (and its uSockets submodule), or set FREEBOARD_UWEBSOCKETS=DIR",
                        binary.display()
                    )));
                };
                run(Command::new(source.join("build.sh")).arg(checkout))?;
                return Ok(binary);
            }
            Peer::Gorilla => {
                std::fs::create_dir_all(&self.cache)?;
                run(Command::new("go")
                    .args(["build", "-o"])
                    .arg(&output)
                    .arg(".")
                    .current_dir(&source))?;
                return Ok(output);
            }
            Peer::RawTcp
            | Peer::RawUring
            | Peer::RawTcpBroadcast
            | Peer::TokioTungstenite
            | Peer::TokioTungsteniteRustls
            | Peer::Fastwebsockets
            | Peer::AxumWs
            | Peer::AxumFreeboard => {}
        }
        let manifest = self.sources.join(peer.name()).join("Cargo.toml");
        let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args(["build", "--release", "--quiet", "--manifest-path"])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&self.cache)
            .stdout(Stdio::null())
            .status()?;
        if !status.success() {
            return Err(io::Error::other(format!("building {} failed", manifest.display())));
        }
        Ok(self.cache.join("release").join(peer.name()))
    }

    /// Starts `peer` on a free loopback port, pinned to `cpu` if given, and waits until it
    /// accepts connections.
    pub fn start(&self, peer: Peer, cpu: Option<usize>) -> io::Result<Running> {
        let tls_peer = matches!(peer, Peer::Freeboard | Peer::TokioTungsteniteRustls);
        let both = matches!(peer, Peer::Freeboard | Peer::FreeboardWs);
        let serves = both || peer == Peer::FreeboardUring;
        if self.tls.is_some() != tls_peer && !both {
            let what = if self.tls.is_some() { "does not serve TLS" } else { "serves TLS only" };
            return Err(io::Error::other(format!("{} {what}", peer.name())));
        }
        let binary = self.build(peer)?;
        let addr = free_port()?;
        let mut command = match peer {
            Peer::NodeWs | Peer::NodeWsBroadcast => {
                let mut node = Command::new("node");
                node.arg(&binary);
                node
            }
            _ => Command::new(&binary),
        };
        command.env("GOMAXPROCS", "1");
        let tls = self.tls.as_ref().filter(|_| peer != Peer::FreeboardWs);
        if serves {
            command.args(["serve", "--threads", "1", "--no-auto-ping"]);
            if peer == Peer::FreeboardUring {
                command.args(["--io", "uring"]);
            }
            command.args(["--max-connections", "1000000", "--max-connections-per-ip", "1000000"]);
            command.args(&self.serve_args);
            if let Some((cert, key)) = tls {
                command.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
                // The load comes from one address: no per-address share of the handshakes.
                command.args(["--tls-handshakes-per-ip", "1000000"]);
            }
            command.arg("--listen");
        }
        match peer {
            // uWebSockets' echo listens on 127.0.0.1 and takes the port alone.
            Peer::Uwebsockets => command.arg(addr.port().to_string()),
            _ => command.arg(addr.to_string()),
        };
        command.env("RUST_LOG", "warn").stdout(Stdio::null());
        if let (Peer::TokioTungsteniteRustls, Some((cert, key))) = (peer, &self.tls) {
            command.arg(cert).arg(key);
        }
        if let Some(cpu) = cpu {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the child between fork and exec and only calls
            // `sched_setaffinity`, which is async-signal-safe and allocates nothing.
            unsafe {
                command.pre_exec(move || crate::process::pin(0, cpu));
            }
        }
        let child = command.spawn()?;
        let pid = child.id();
        let mut running = Running {
            child,
            target: Target::at(
                addr,
                "/",
                matches!(peer, Peer::RawTcp | Peer::RawUring | Peer::RawTcpBroadcast),
            )
            .with_tls(tls.is_some()),
            pid,
        };
        let start = Instant::now();
        loop {
            // A connection to a free port in the ephemeral range can meet itself (TCP
            // simultaneous open) and look like a listener: only a real peer counts.
            match TcpStream::connect(addr) {
                Ok(s) if s.local_addr().ok() != s.peer_addr().ok() => break,
                _ => {}
            }
            if let Some(status) = running.child.try_wait()? {
                let name = peer.name();
                return Err(io::Error::other(format!("{name} exited before listening: {status}")));
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err(io::Error::other(format!("{} did not start listening", peer.name())));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(running)
    }
}

/// A loopback address with a port nobody uses right now.
fn free_port() -> io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}
