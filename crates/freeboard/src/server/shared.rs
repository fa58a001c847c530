//! What every event loop of a server shares: configuration, metrics, admission (connection
//! counts and accept-rate buckets), the shutdown flag and the topic hub.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::auth::{Origins, TrustedProxies};
use crate::config::ServerConfig;
use crate::handler::RouterFactory;
use crate::metrics::Metrics;
use crate::tls::TlsIdentity;
use crate::topics::Hub;

/// State every event loop of a server shares: configuration, metrics, connection counts.
pub(crate) struct Shared {
    pub(crate) config: ServerConfig,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) factory: RouterFactory,
    pub(crate) start: std::time::Instant,
    /// TCP connections open across all loops (handshaking ones included).
    pub(crate) open: AtomicUsize,
    /// Per-address counts and accept-rate buckets, and the global bucket.
    admission: Mutex<Admission>,
    pub(crate) shutdown: AtomicBool,
    /// Topics across loops: which loops subscribe to what, and their inboxes.
    pub(crate) hub: Hub,
    /// `config.allowed_origins`, parsed.
    pub(crate) origins: Origins,
    /// `config.topics.cors_origins`, parsed (empty: no CORS).
    cors: Origins,
    /// `config.trusted_proxies`, parsed.
    pub(crate) proxies: TrustedProxies,
    /// Upgrade decisions pending across all loops (at most `config.max_pending_upgrades`).
    pub(crate) pending: AtomicUsize,
    /// Refusals are logged at `info`, at most one line a second.
    refusal_log: RateLimitedLog,
    /// The rustls configuration of the TLS listener, and the certificate it serves.
    pub(crate) tls: Option<(Arc<rustls::ServerConfig>, Arc<TlsIdentity>)>,
}

impl Shared {
    pub(crate) fn new(
        config: ServerConfig,
        metrics: Arc<Metrics>,
        hub: Hub,
        factory: RouterFactory,
        tls: Option<(Arc<rustls::ServerConfig>, Arc<TlsIdentity>)>,
    ) -> Self {
        Self {
            tls,
            hub,
            metrics,
            factory,
            start: std::time::Instant::now(),
            open: AtomicUsize::new(0),
            admission: Mutex::new(Admission {
                global: Bucket::full_at(config.accept_rate, 0.0),
                by_ip: HashMap::new(),
                sweep_at: 1024,
            }),
            shutdown: AtomicBool::new(false),
            // NOTE(unwrap): both lists were checked by `ServerConfig::validate`.
            origins: Origins::new(&config.allowed_origins).unwrap_or_default(),
            proxies: TrustedProxies::new(&config.trusted_proxies).unwrap_or_default(),
            cors: Origins::new(&config.topics.cors_origins).unwrap_or_default(),
            pending: AtomicUsize::new(0),
            refusal_log: RateLimitedLog::default(),
            config,
        }
    }

    /// Whether a connection from `peer` names its client later (a PROXY protocol header, or
    /// a trusted proxy's forwarding headers): it is then counted per address only once
    /// [`attribute`](Self::attribute) knows the client's.
    pub(crate) fn forwards(&self, peer: SocketAddr) -> bool {
        self.config.proxy_protocol || self.proxies.contains(peer.ip())
    }

    /// Counts an accepted connection; returns the status to refuse its upgrade with if it
    /// came faster than the accept rate allows (503 global, 429 per address). A connection
    /// that [`forwards`](Self::forwards) its client's address is counted per address later.
    pub(crate) fn admit(&self, peer: SocketAddr, now_secs: f64) -> Option<u16> {
        self.open.fetch_add(1, Ordering::Relaxed);
        let config = &self.config;
        let global_ok = {
            let mut admission = self.admission.lock().unwrap_or_else(|e| e.into_inner());
            admission.global.take(config.accept_rate, now_secs)
        };
        if self.forwards(peer) {
            return (!global_ok).then_some(503);
        }
        match (global_ok, self.attribute(peer.ip(), now_secs)) {
            (_, Some(status)) => Some(status),
            (false, _) => Some(503),
            _ => None,
        }
    }

    /// Counts a connection against its client's address `ip`: once at accept for a direct
    /// connection, once its proxy has named the client for a forwarded one. Returns 429 if
    /// the address connects faster than `accept_rate_per_ip` allows.
    pub(crate) fn attribute(&self, ip: IpAddr, now_secs: f64) -> Option<u16> {
        let config = &self.config;
        let mut admission = self.admission.lock().unwrap_or_else(|e| e.into_inner());
        if admission.by_ip.len() > admission.sweep_at {
            // Forget idle addresses whose bucket has refilled, so the map stays bounded by
            // the addresses that are connected or recently active.
            let (rate, at) = (config.accept_rate_per_ip, now_secs);
            admission.by_ip.retain(|_, ip| ip.count > 0 || !ip.bucket.full(rate, at));
            admission.sweep_at = (admission.by_ip.len() * 2).max(1024);
        }
        let ip = admission.by_ip.entry(ip).or_insert_with(|| PerIp {
            count: 0,
            bucket: Bucket::full_at(config.accept_rate_per_ip, now_secs),
        });
        ip.count += 1;
        (!ip.bucket.take(config.accept_rate_per_ip, now_secs)).then_some(429)
    }

    /// Forgets a connection: `attributed` says whether it was counted against `peer`'s
    /// address.
    pub(crate) fn release(&self, peer: SocketAddr, attributed: bool) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        if !attributed {
            return;
        }
        let mut admission = self.admission.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ip) = admission.by_ip.get_mut(&peer.ip()) {
            ip.count -= 1;
            if ip.count == 0 && self.config.accept_rate_per_ip == 0.0 {
                admission.by_ip.remove(&peer.ip());
            }
        }
    }

    pub(crate) fn per_ip(&self, peer: SocketAddr) -> usize {
        let admission = self.admission.lock().unwrap_or_else(|e| e.into_inner());
        admission.by_ip.get(&peer.ip()).map_or(0, |ip| ip.count)
    }

    /// Logs a refusal at `info`, at most one line a second (with the number of refusals the
    /// previous lines left out), so a flood of refusals cannot flood the log.
    pub(crate) fn log_refusal(&self, status: u16, peer: SocketAddr, why: &str) {
        let second = self.start.elapsed().as_secs() + 1;
        let log = &self.refusal_log;
        let last = log.second.load(Ordering::Relaxed);
        if last != second
            && log
                .second
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let suppressed = log.suppressed.swap(0, Ordering::Relaxed);
            tracing::info!(status, %peer, why, suppressed, "refused");
        } else {
            log.suppressed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(status, %peer, why, "refused");
        }
    }
}

/// The state of a log line written at most once a second.
#[derive(Default)]
struct RateLimitedLog {
    /// The second (since start, plus one) of the last line.
    second: AtomicU64,
    /// Lines left out since.
    suppressed: AtomicU64,
}

impl Shared {
    /// Whether a browser page from `origin` may publish (CORS): `topics.cors_origins` lists
    /// it (an empty list allows none).
    pub(crate) fn cors_allows(&self, origin: &str) -> bool {
        !self.config.topics.cors_origins.is_empty() && self.cors.allows(Some(origin.as_bytes()))
    }

    /// Reserves a place for a pending upgrade decision; `false` when all are taken.
    pub(crate) fn reserve_pending(&self) -> bool {
        let max = self.config.max_pending_upgrades;
        let taken = self
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < max).then_some(n + 1))
            .is_ok();
        if taken {
            self.metrics.access.pending_upgrades.inc();
        }
        taken
    }

    /// Gives back a pending upgrade's place.
    pub(crate) fn release_pending(&self) {
        self.pending.fetch_sub(1, Ordering::Relaxed);
        self.metrics.access.pending_upgrades.dec();
    }
}

struct Admission {
    global: Bucket,
    by_ip: HashMap<IpAddr, PerIp>,
    /// Sweep idle entries when the map grows past this.
    sweep_at: usize,
}

struct PerIp {
    /// Open connections from the address.
    count: usize,
    bucket: Bucket,
}

/// A token bucket of `rate` tokens per second holding at most `max(rate, 1)`; rate 0 is off.
#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    /// Seconds (server clock) of the last refill.
    at: f64,
}

impl Bucket {
    fn full_at(rate: f64, now: f64) -> Self {
        Self { tokens: rate.max(1.0), at: now }
    }

    fn refill(&mut self, rate: f64, now: f64) {
        self.tokens = (self.tokens + (now - self.at) * rate).min(rate.max(1.0));
        self.at = now;
    }

    fn full(&self, rate: f64, now: f64) -> bool {
        let mut b = *self;
        b.refill(rate, now);
        b.tokens >= rate.max(1.0)
    }

    /// Takes a token if there is one (always, when the rate is 0).
    fn take(&mut self, rate: f64, now: f64) -> bool {
        if rate == 0.0 {
            return true;
        }
        self.refill(rate, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
