//! New `wss://` connections per second: each client opens a connection (TCP, the TLS
//! handshake, the WebSocket upgrade), drops it and opens the next, for a fixed time. Full
//! handshakes, or resumed ones (a ticket from the shared client session cache); against a
//! `ws://` server, the same without TLS (the cost TLS adds). Besides the
//! rate on this shared machine, the server's CPU time per handshake: handshakes per second of
//! one core is its inverse, and does not depend on how much CPU the load generator took.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::Target;
use crate::load::{Rng, open_any};
use crate::process::Sample;

/// What one run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Handshakes {
    /// Connections opened (TLS and upgrade completed).
    pub completed: u64,
    /// Of those, handshakes that resumed a session (as the client saw them).
    pub resumed: u64,
    /// Connections that failed.
    pub failed: u64,
    /// Wall seconds.
    pub seconds: f64,
    /// Server user CPU µs per handshake, when its PID is known.
    pub server_user_us: Option<f64>,
    /// Server system CPU µs per handshake, when its PID is known.
    pub server_sys_us: Option<f64>,
}

impl Handshakes {
    /// Completed handshakes per wall second.
    pub fn per_sec(&self) -> f64 {
        self.completed as f64 / self.seconds.max(1e-9)
    }

    /// Handshakes per second of one server core (from its user + system time).
    pub fn per_core_sec(&self) -> Option<f64> {
        let us = self.server_user_us? + self.server_sys_us?;
        (us > 0.0).then(|| 1e6 / us)
    }
}

/// Opens and drops connections to `target` from `clients` threads for `duration`
/// (`target.resume` says whether TLS handshakes resume).
pub fn run(
    target: &Target,
    clients: usize,
    duration: Duration,
    server_pid: Option<u32>,
) -> io::Result<Handshakes> {
    // A first connection fills the client's session cache (and warms the server).
    let mut rng = Rng::seeded();
    drop(open_any(target, Duration::from_secs(5), &mut rng)?);
    let completed = AtomicU64::new(0);
    let resumed = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let before = server_pid.and_then(|pid| Sample::of(pid).ok());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..clients.max(1) {
            s.spawn(|| {
                let mut rng = Rng::seeded();
                while !stop.load(Ordering::Relaxed) {
                    match open_any(target, Duration::from_secs(5), &mut rng) {
                        Ok((opened, _)) => {
                            completed.fetch_add(1, Ordering::Relaxed);
                            let kind = opened.tls.as_ref().and_then(|t| t.handshake_kind());
                            if kind == Some(rustls::HandshakeKind::Resumed) {
                                resumed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
    });
    let seconds = start.elapsed().as_secs_f64();
    let after = server_pid.and_then(|pid| Sample::of(pid).ok());
    let completed = completed.into_inner();
    let per = |f: fn(&Sample) -> Duration| match (&before, &after) {
        (Some(b), Some(a)) if completed > 0 => {
            Some(f(a).saturating_sub(f(b)).as_secs_f64() * 1e6 / completed as f64)
        }
        _ => None,
    };
    Ok(Handshakes {
        completed,
        resumed: resumed.into_inner(),
        failed: failed.into_inner(),
        seconds,
        server_user_us: per(|s| s.user),
        server_sys_us: per(|s| s.system),
    })
}
