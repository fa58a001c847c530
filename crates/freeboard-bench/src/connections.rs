//! Many idle connections: how many connect, how fast, and what they cost the server in memory
//! — its own (RSS) and the kernel's (the slab objects of their sockets) — and whether it gives
//! the memory back when they close.
//!
//! Each step opens its connections in parallel with the [`crowd`] generator
//! (from many loopback source addresses when the count needs them), holds them, and closes
//! them.

use std::io;
use std::time::Duration;

use crate::Target;
use crate::crowd::{self, Crowd, Progress};
use crate::process::Sample;

/// How a step opens its connections.
#[derive(Debug, Clone)]
pub struct Opening {
    /// Connections started per second; 0 is as fast as `in_flight` allows.
    pub rate: f64,
    /// Most connections between connect and 101 at once.
    pub in_flight: usize,
    /// Loopback source addresses; 0 picks as many as the count needs.
    pub sources: usize,
    /// The first of them (the others follow it): generators run side by side give each its
    /// own range, so that they do not share ephemeral ports.
    pub sources_from: std::net::Ipv4Addr,
    /// How long the connections are held once all are in (the figures are read at its end).
    pub hold: Duration,
    /// The longest a step may take.
    pub deadline: Duration,
    /// Once every connection is in, stop the server (`SIGTERM` to its PID) and hold until it
    /// has closed them all: its graceful shutdown seen from the clients.
    pub shutdown: bool,
}

impl Default for Opening {
    fn default() -> Self {
        Opening {
            rate: 0.0,
            in_flight: 512,
            sources: 0,
            sources_from: std::net::Ipv4Addr::new(127, 0, 1, 1),
            hold: Duration::from_millis(300),
            deadline: Duration::from_secs(900),
            shutdown: false,
        }
    }
}

/// One step of the experiment: `count` connections opened, held, then closed.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// Connections attempted.
    pub count: usize,
    /// Handshakes completed.
    pub connected: usize,
    /// Connections refused or failed.
    pub failed: usize,
    /// What refused or failed them ("503 ×12, EMFILE (open-file limit) ×3", or "none").
    #[serde(default)]
    pub causes: String,
    /// Time to open all of them (in parallel), milliseconds.
    pub connect_ms: f64,
    /// Per connection, microseconds.
    pub connect_us_each: f64,
    /// Connections in per second.
    #[serde(default)]
    pub connects_per_sec: f64,
    /// Open connections over time while connecting: `(seconds, open)`.
    #[serde(default)]
    pub timeline: Vec<(f64, usize)>,
    /// Server RSS before connecting, KiB.
    pub rss_before_kib: Option<u64>,
    /// Server RSS with every connection open, KiB.
    pub rss_open_kib: Option<u64>,
    /// Server RSS after they closed, KiB.
    pub rss_closed_kib: Option<u64>,
    /// (open − before) / connected, KiB.
    pub kib_per_conn: Option<f64>,
    /// The kernel's socket slab memory per server connection, KiB: the growth of the TCP
    /// socket, inode, dentry, file and epoll caches (`/proc/slabinfo`) over the connections,
    /// halved (the client's end of each connection is on this host too and costs the same).
    #[serde(default)]
    pub kernel_kib_per_conn: Option<f64>,
    /// TCP buffer memory of the host with every connection open (`/proc/net/sockstat`), KiB.
    #[serde(default)]
    pub tcp_buffer_kib: Option<u64>,
    /// With [`Opening::shutdown`]: the close codes the server sent, by code, and the
    /// connections it dropped without one (code 1006).
    #[serde(default)]
    pub closed_by_server: std::collections::BTreeMap<u16, usize>,
    /// From the first close frame to the last connection closed by the server, seconds.
    #[serde(default)]
    pub drain_seconds: Option<f64>,
}

/// How long the server gets to settle before its RSS is read.
const SETTLE: Duration = Duration::from_millis(300);

/// Opens `count` connections to `target` as `opening` says, holds them, closes them; samples
/// the server's RSS around it when `server_pid` is given. `progress` sees the opening.
pub fn step(
    target: &Target,
    count: usize,
    server_pid: Option<u32>,
    opening: &Opening,
    progress: &mut dyn FnMut(&Progress),
) -> io::Result<Step> {
    let rss = || server_pid.and_then(|pid| Sample::of(pid).ok()).map(|s| s.rss_kib);
    let kernel_before = freeboard::kernel_memory::KernelFigures::read();
    let rss_before_kib = rss();
    let sources = match opening.sources {
        0 if count > 20_000 => Crowd::sources_needed(count, 1),
        0 => 0,
        n => n,
    };
    let crowd = Crowd {
        rate: opening.rate,
        in_flight: opening.in_flight,
        sources: Crowd::loopback_sources(opening.sources_from, sources),
        hold: opening.hold.max(SETTLE),
        deadline: opening.deadline,
        until_closed: opening.shutdown,
        ..Crowd::new(target.clone(), count)
    };
    let mut stopped = false;
    let mut at_hold = None;
    let gathered = {
        let mut watch = |p: &Progress| {
            progress(p);
            // Every connection in or lost: the server's graceful shutdown starts now.
            if let (true, false, Some(pid)) = (opening.shutdown, stopped, server_pid)
                && p.connecting == 0
                && p.open + p.lost == count
            {
                // SAFETY: kill only sends a signal to the process the caller named.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
                stopped = true;
            }
        };
        crowd::gather_then(&crowd, &mut watch, &mut || {
            at_hold = Some((rss(), freeboard::kernel_memory::KernelFigures::read()));
        })?
    };
    let (rss_open_kib, kernel_open) = at_hold.unwrap_or((None, Default::default()));
    std::thread::sleep(SETTLE * 2);
    let rss_closed_kib = rss();
    let connected = gathered.connected;
    let kib_per_conn = match (rss_before_kib, rss_open_kib) {
        (Some(b), Some(o)) if connected > 0 => Some((o as f64 - b as f64) / connected as f64),
        _ => None,
    };
    let kernel_kib_per_conn = match (kernel_before.socket_slab_bytes, kernel_open.socket_slab_bytes)
    {
        (Some(b), Some(o)) if connected > 0 => {
            Some((o as f64 - b as f64) / 2.0 / connected as f64 / 1024.0)
        }
        _ => None,
    };
    Ok(Step {
        count,
        connected,
        failed: gathered.missing(),
        causes: gathered.causes(),
        connect_ms: gathered.connect_seconds * 1e3,
        connect_us_each: gathered.connect_seconds * 1e6 / count.max(1) as f64,
        connects_per_sec: gathered.connects_per_sec,
        timeline: gathered.timeline,
        rss_before_kib,
        rss_open_kib,
        rss_closed_kib,
        kib_per_conn,
        kernel_kib_per_conn,
        tcp_buffer_kib: kernel_open.tcp_buffer_bytes.map(|b| b / 1024),
        closed_by_server: {
            let mut codes = gathered.closed_by_server.clone();
            if gathered.dropped_by_server > 0 {
                *codes.entry(1006).or_default() += gathered.dropped_by_server;
            }
            codes
        },
        drain_seconds: gathered.close_seconds,
    })
}
