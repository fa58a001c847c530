//! What every event loop of a server shares: configuration (reloadable), metrics, admission (connection
//! counts and accept-rate buckets), the shutdown flag and the topic hub.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::auth::{Origins, TrustedProxies};
use crate::config::{Reload, ServerConfig};
use crate::kernel_memory::SocketCost;
use crate::metrics::Metrics;
use crate::rate::Bucket;
use crate::tls::{HandshakeAdmission, ServerTls, TlsIdentity};
use crate::topics::Hub;

/// State every event loop of a server shares: configuration, metrics, connection counts.
pub(crate) struct Shared {
    /// The configuration in force; a reload replaces it and bumps `generation`.
    config: RwLock<Arc<ServerConfig>>,
    /// How many reloads have been applied: each loop keeps its own copy of the configuration
    /// and takes the new one when this moves (one relaxed load per loop turn).
    pub(crate) generation: AtomicU64,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) start: std::time::Instant,
    /// TCP connections open across all loops (handshaking ones included).
    pub(crate) open: AtomicUsize,
    /// Per-address counts and accept-rate buckets, and the global bucket.
    admission: Mutex<Admission>,
    /// Each address's bucket of admin requests (`admin.rate_per_ip`).
    admin_requests: Mutex<AdminRequests>,
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
    /// The rustls configuration of the TLS listener, and the certificate it serves.
    pub(crate) tls: Option<(ServerTls, Arc<TlsIdentity>)>,
    /// With TLS: every address's share of the handshakes (`tls.handshakes_per_ip`,
    /// `tls.handshake_rate_per_ip`), across the loops.
    pub(crate) handshakes: Option<Arc<HandshakeAdmission>>,
    /// The kernel memory of one connection, charged against the budget by every loop.
    pub(crate) socket_cost: SocketCost,
    /// What every loop charges now for its sockets' buffers
    /// ([`kernel_buffers`](super::kernel_buffers)).
    pub(crate) kernel_buffers: AtomicUsize,
}

impl Shared {
    pub(crate) fn new(
        config: ServerConfig,
        metrics: Arc<Metrics>,
        hub: Hub,
        tls: Option<(ServerTls, Arc<TlsIdentity>)>,
    ) -> Self {
        let handshakes = config
            .tls
            .as_ref()
            .map(|tls| HandshakeAdmission::new(tls.handshakes_per_ip, tls.handshake_rate_per_ip));
        let socket_cost = SocketCost::measure(config.listen.is_ipv6());
        metrics.connection_kernel_bytes.set(socket_cost.bytes as i64);
        Self {
            socket_cost,
            kernel_buffers: AtomicUsize::new(0),
            tls,
            handshakes,
            hub,
            metrics,
            start: std::time::Instant::now(),
            open: AtomicUsize::new(0),
            admission: Mutex::new(Admission {
                global: Bucket::full_at(config.accept_rate, 0.0),
                by_ip: HashMap::new(),
                sweep_at: 1024,
            }),
            admin_requests: Mutex::new(AdminRequests { by_ip: HashMap::new(), sweep_at: 1024 }),
            shutdown: AtomicBool::new(false),
            // NOTE(unwrap): both lists were checked by `ServerConfig::validate`.
            origins: Origins::new(&config.allowed_origins).unwrap_or_default(),
            proxies: TrustedProxies::new(&config.trusted_proxies).unwrap_or_default(),
            cors: Origins::new(&config.topics.cors_origins).unwrap_or_default(),
            pending: AtomicUsize::new(0),
            config: RwLock::new(Arc::new(config)),
            generation: AtomicU64::new(0),
        }
    }

    /// The configuration in force.
    pub(crate) fn config(&self) -> Arc<ServerConfig> {
        self.config.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Applies what can change of `new` (validated) and says what differed.
    pub(crate) fn reload(&self, new: &ServerConfig) -> Reload {
        let mut config = self.config.write().unwrap_or_else(|e| e.into_inner());
        let mut next = ServerConfig::clone(&config);
        let reload = next.reload_from(new);
        if !reload.applied.is_empty() {
            *config = Arc::new(next);
            self.generation.fetch_add(1, Ordering::Release);
            self.metrics.reloads.inc();
        }
        reload
    }

    /// Whether a connection from `peer` names its client later (a PROXY protocol header, or
    /// a trusted proxy's forwarding headers): it is then counted per address only once
    /// [`attribute`](Self::attribute) knows the client's.
    pub(crate) fn forwards(&self, config: &ServerConfig, peer: SocketAddr) -> bool {
        config.proxy_protocol || self.proxies.contains(peer.ip())
    }

    /// Counts an accepted connection; returns the status to refuse its upgrade with if it
    /// came faster than the accept rate allows (503 global, 429 per address). A connection
    /// that [`forwards`](Self::forwards) its client's address is counted per address later.
    pub(crate) fn admit(
        &self,
        config: &ServerConfig,
        peer: SocketAddr,
        now_secs: f64,
    ) -> Option<u16> {
        self.open.fetch_add(1, Ordering::Relaxed);
        let global_ok = {
            let mut admission = self.admission.lock().unwrap_or_else(|e| e.into_inner());
            admission.global.take(config.accept_rate, now_secs)
        };
        if self.forwards(config, peer) {
            return (!global_ok).then_some(503);
        }
        match (global_ok, self.attribute(config, peer.ip(), now_secs)) {
            (_, Some(status)) => Some(status),
            (false, _) => Some(503),
            _ => None,
        }
    }

    /// Counts a connection against its client's address `ip`: once at accept for a direct
    /// connection, once its proxy has named the client for a forwarded one. Returns 429 if
    /// the address connects faster than `accept_rate_per_ip` allows.
    pub(crate) fn attribute(
        &self,
        config: &ServerConfig,
        ip: IpAddr,
        now_secs: f64,
    ) -> Option<u16> {
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

    /// Takes one of `ip`'s admin requests (`admin.rate_per_ip`); `false` if it asks faster.
    pub(crate) fn admin_request(&self, config: &ServerConfig, ip: IpAddr, now_secs: f64) -> bool {
        let rate = config.admin.rate_per_ip;
        let mut requests = self.admin_requests.lock().unwrap_or_else(|e| e.into_inner());
        if requests.by_ip.len() > requests.sweep_at {
            // Forget the addresses whose bucket has refilled: the map holds recent askers only.
            requests.by_ip.retain(|_, bucket| !bucket.full(rate, now_secs));
            requests.sweep_at = (requests.by_ip.len() * 2).max(1024);
        }
        let bucket = requests.by_ip.entry(ip).or_insert_with(|| Bucket::full_at(rate, now_secs));
        bucket.take(rate, now_secs)
    }

    /// Forgets a connection: `attributed` says whether it was counted against `peer`'s
    /// address.
    pub(crate) fn release(&self, config: &ServerConfig, peer: SocketAddr, attributed: bool) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        if !attributed {
            return;
        }
        let mut admission = self.admission.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ip) = admission.by_ip.get_mut(&peer.ip()) {
            ip.count -= 1;
            if ip.count == 0 && config.accept_rate_per_ip == 0.0 {
                admission.by_ip.remove(&peer.ip());
            }
        }
    }

    pub(crate) fn per_ip(&self, peer: SocketAddr) -> usize {
        let admission = self.admission.lock().unwrap_or_else(|e| e.into_inner());
        admission.by_ip.get(&peer.ip()).map_or(0, |ip| ip.count)
    }
}

impl Shared {
    /// Whether a browser page from `origin` may publish (CORS): `topics.cors_origins` lists
    /// it (an empty list allows none).
    pub(crate) fn cors_allows(&self, config: &ServerConfig, origin: &str) -> bool {
        !config.topics.cors_origins.is_empty() && self.cors.allows(Some(origin.as_bytes()))
    }

    /// Reserves a place for a pending upgrade decision; `false` when all are taken.
    pub(crate) fn reserve_pending(&self, config: &ServerConfig) -> bool {
        let max = config.max_pending_upgrades;
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

struct AdminRequests {
    by_ip: HashMap<IpAddr, Bucket>,
    /// Sweep full buckets when the map grows past this.
    sweep_at: usize,
}

struct PerIp {
    /// Open connections from the address.
    count: usize,
    bucket: Bucket,
}
