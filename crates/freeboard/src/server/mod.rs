//! The server: its event loops, the limits they share, shutdown.

use crate::capacity::Capacity;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use mio::{Poll, Waker};
use socket2::{Domain, Protocol, Socket, Type};

mod access;
#[cfg(target_os = "linux")]
mod completions;
mod compressed_copies;
mod compression;
mod delta_copies;
mod dispatch;
mod end_of_turn;
mod event_loop;
mod fan_out;
mod http;
mod http2;
mod http2_connection;
mod http_routes;
mod kernel_buffers;
mod lag_sweep;
mod local;
mod membership;
mod requests;
#[cfg(target_os = "linux")]
mod ring_side;
mod shared;

use crate::backplane::{Arrival, Backplane, Link};
use crate::config::{ConfigError, Reload, ServerConfig};
use crate::handler::{Router, RouterFactory};
use crate::history::{History, Source};
use crate::metrics::Metrics;
use crate::presence::Presence;
use crate::tls::{self, TlsError, TlsIdentity};
use crate::topics::{Hub, Published};
use crate::transport::Stream;
use event_loop::{EventLoop, Listeners, WAKER};
use freeboard_proto::MessageKind;
pub use local::LocalServer;
use shared::Shared;

/// A bound server, ready to [`run`](Self::run).
///
/// ```no_run
/// use freeboard::{Echo, Router, Server, ServerConfig};
///
/// let server = Server::bind(ServerConfig::default(), || Router::new().route("/", Echo))?;
/// println!("listening on ws://{}", server.local_addr());
/// server.run()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Server {
    shared: Arc<Shared>,
    /// Builds each loop's router, on the loop's thread.
    routes: RouterFactory,
    /// One poll and listener per loop; the loop itself (pool, router) is built on its thread,
    /// so handlers need not be `Send`.
    seeds: Vec<UnstartedLoop>,
    wakers: Vec<Arc<Waker>>,
    local_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
}

/// What a loop is built from on its thread: its poll and its listeners.
struct UnstartedLoop {
    poll: Poll,
    listeners: Listeners,
}

impl Server {
    /// Binds one `SO_REUSEPORT` listener per event loop at `config.listen` (port 0 picks a
    /// free port shared by all loops), and one at `config.tls.listen` if set, and builds each
    /// loop's pool and router. With `config.tls`, the certificate and key are loaded here
    /// (an error says which file is wrong).
    ///
    /// Fails before anything listens when the configuration cannot work: an invalid setting
    /// ([`ConfigError`]), a memory budget larger than the machine
    /// (or its cgroup) has, or an address another process listens on (`AddrInUse`; set
    /// [`ServerConfig::share_port`] to join its `SO_REUSEPORT` group on purpose).
    pub fn bind(
        config: ServerConfig,
        routes: impl Fn() -> Router + Send + Sync + 'static,
    ) -> io::Result<Self> {
        Self::bind_inner(config, Arc::new(routes), None)
    }

    /// Binds a server whose one event loop runs on the caller's thread, a turn at a time,
    /// driven by a host's event loop (Node's libuv, Python's asyncio): see [`LocalServer`].
    /// `router` is that loop's, built here, so its handlers need not be `Send` (they may
    /// share `Rc`s with the caller). `config.threads` is ignored: the one loop has the whole
    /// budget. More cores take more processes or threads, each with its own local server on
    /// the same address ([`ServerConfig::share_port`]).
    ///
    /// Fails as [`bind`](Self::bind) does.
    pub fn bind_local(mut config: ServerConfig, router: Router) -> io::Result<LocalServer> {
        config.threads = 1;
        router.check_compression().map_err(io::Error::other)?;
        let mut server = Self::bind_inner(config, Arc::new(Router::new), None)?;
        let UnstartedLoop { poll, listeners } = server.seeds.remove(0);
        let waker = server.wakers[0].clone();
        let event_loop =
            EventLoop::new(0, false, poll, listeners, server.shared.clone(), waker, router)?;
        let handle = ServerHandle { shared: server.shared, wakers: server.wakers };
        Ok(LocalServer::new(event_loop, handle, server.local_addr, server.tls_addr))
    }

    /// [`bind`](Self::bind), with a [`Backplane`] that carries the topics to the other nodes
    /// (`freeboard-topics` has one on Redis). It is started here, before any loop runs; an
    /// error starting it fails the bind.
    pub fn bind_with_backplane(
        config: ServerConfig,
        routes: impl Fn() -> Router + Send + Sync + 'static,
        backplane: impl Backplane,
    ) -> io::Result<Self> {
        Self::bind_inner(config, Arc::new(routes), Some(Box::new(backplane)))
    }

    fn bind_inner(
        config: ServerConfig,
        routes: crate::handler::RouterFactory,
        backplane: Option<Box<dyn Backplane>>,
    ) -> io::Result<Self> {
        config.validate().map_err(io::Error::other)?;
        Router::check_features(&*routes).map_err(io::Error::other)?;
        if let Some(machine) = machine_memory()
            && config.memory > machine
        {
            let error = ConfigError::MemoryExceedsMachine { memory: config.memory, machine };
            return Err(io::Error::new(io::ErrorKind::InvalidInput, error));
        }
        if !config.share_port && config.listen.port() != 0 {
            ensure_port_free(config.listen)?;
        }
        let tls = match &config.tls {
            Some(tls) => {
                let identity =
                    Arc::new(TlsIdentity::load(&tls.cert, &tls.key).map_err(io::Error::other)?);
                Some((
                    tls::server_config(identity.clone(), config.http2).map_err(io::Error::other)?,
                    identity,
                ))
            }
            None => None,
        };
        let metrics = Arc::new(Metrics::new());
        metrics.set_loops(config.threads as u32);
        metrics.watch_topics(&config.topics.metrics_prefixes, config.topics.metrics_topics);
        let mut addr = config.listen;
        let mut tls_addr = config.tls.as_ref().and_then(|tls| tls.listen);
        let mut admin_addr = config.admin.listen;
        let mut loops = Vec::new();
        let mut wakers = Vec::new();
        for _ in 0..config.threads {
            let listener = reuseport_listener(addr)?;
            addr = listener.local_addr()?;
            // Port 0 picks a free port once; the other loops join it.
            let beside = |at: &mut Option<SocketAddr>| -> io::Result<_> {
                let Some(addr) = at else { return Ok(None) };
                let listener = reuseport_listener(*addr)?;
                *at = Some(listener.local_addr()?);
                Ok(Some(mio::net::TcpListener::from_std(listener)))
            };
            let listeners = Listeners {
                plain: mio::net::TcpListener::from_std(listener),
                tls: beside(&mut tls_addr)?,
                admin: beside(&mut admin_addr)?,
            };
            let poll = Poll::new()?;
            wakers.push(Arc::new(Waker::new(poll.registry(), WAKER)?));
            loops.push(UnstartedLoop { poll, listeners });
        }
        let tls_addr = match (&tls, tls_addr) {
            (Some(_), None) => Some(addr),
            (_, at) => at,
        };
        let topics = &config.topics;
        let history = (topics.history > 0).then(|| {
            let max_age = (topics.history_seconds > 0)
                .then(|| std::time::Duration::from_secs(topics.history_seconds));
            let prefix = &topics.history_prefix;
            let source = match &backplane {
                Some(backplane) if backplane.keeps_history() => Source::Backplane,
                _ => Source::Memory,
            };
            Arc::new(History::new(prefix, topics.history, max_age, topics.history_memory, source))
        });
        let hub = Hub::new(&wakers, topics.inbox, topics.max_topics, history, metrics.clone());
        if let Some(presence) = Presence::new(topics, presence_node(), metrics.clone()) {
            hub.attach_presence(Arc::new(presence));
        }
        let shared = Arc::new(Shared::new(config, metrics, hub, tls));
        if let Some(presence) = shared.hub.presence() {
            // Events go to the subscribers that watch, on every loop of this node; no offset,
            // no history, no backplane (each node makes its own from the members' changes).
            let weak = Arc::downgrade(&shared);
            presence.set_events(Box::new(move |watch: &str, payload: &[u8]| {
                let Some(shared) = weak.upgrade() else { return };
                let (head, n) = crate::topics::header(MessageKind::Text, payload.len());
                let mut published = Published::default();
                shared.hub.publish_remote(
                    watch,
                    &[&head[..n], payload],
                    None,
                    &mut published,
                    None,
                );
            }));
        }
        if let Some(mut backplane) = backplane {
            let weak = Arc::downgrade(&shared);
            let deliver = move |arrival: Arrival<'_>| match weak.upgrade() {
                Some(shared) => {
                    shared.hub.deliver_from_backplane(arrival);
                    true
                }
                None => false,
            };
            let weak = Arc::downgrade(&shared);
            let end_history = move |topic: &str| {
                if let Some(shared) = weak.upgrade() {
                    shared.hub.end_history(topic);
                }
            };
            let history = shared.hub.history().cloned();
            let presence = shared.hub.presence().cloned();
            let link = Link::new(deliver, end_history, history, presence, shared.metrics.clone());
            backplane.start(link)?;
            shared.hub.attach_backplane(Arc::from(backplane));
        }
        Ok(Self { shared, routes, seeds: loops, wakers, local_addr: addr, tls_addr, admin_addr })
    }

    /// The address the server listens on (`config.listen`; TLS when `config.tls` has no
    /// listener of its own).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address that speaks TLS, if any: `config.tls.listen`, or the one listener.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// The admin listener's address (`config.admin.listen`), if any.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The server's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// How many connections the server can hold, by each of its limits (its open-file limit
    /// as it is now: raise it first with
    /// [`raise_open_files_limit`](crate::capacity::raise_open_files_limit)).
    pub fn capacity(&self) -> Capacity {
        let config = self.shared.config();
        let charge = event_loop::connection_charge::<crate::transport::Stream>(&self.shared);
        let per_loop = event_loop::LoopBudget::of(&config).connections(&config, charge);
        let descriptors = crate::capacity::descriptors_left()
            .saturating_sub(crate::capacity::RESERVED_DESCRIPTORS);
        Capacity {
            descriptors,
            max_connections: config.max_connections,
            budget: per_loop * config.threads,
            charge_bytes: charge,
            kernel_bytes: self.shared.socket_cost.bytes,
            kernel_measured: self.shared.socket_cost.measured,
        }
    }

    /// A handle that can publish to topics and stop the server from another thread (or a
    /// signal handler thread).
    pub fn handle(&self) -> ServerHandle {
        ServerHandle { shared: self.shared.clone(), wakers: self.wakers.clone() }
    }

    /// Runs every loop on its own thread until a shutdown has drained.
    pub fn run(self) -> io::Result<()> {
        self.spawn().join()
    }

    /// Starts the loops and returns at once.
    pub fn spawn(self) -> RunningServer {
        let threads = self
            .seeds
            .into_iter()
            .enumerate()
            .map(|(i, seed)| {
                let shared = self.shared.clone();
                let routes = self.routes.clone();
                let waker = self.wakers[i].clone();
                std::thread::Builder::new()
                    .name(format!("freeboard-loop-{i}"))
                    .spawn(move || {
                        let UnstartedLoop { poll, listeners } = seed;
                        let router = routes();
                        EventLoop::<Stream>::new(
                            i as u32, true, poll, listeners, shared, waker, router,
                        )?
                        .run()
                    })
                    .expect("the OS can start a thread")
            })
            .collect();
        RunningServer {
            handle: ServerHandle { shared: self.shared, wakers: self.wakers },
            threads,
            local_addr: self.local_addr,
            tls_addr: self.tls_addr,
            admin_addr: self.admin_addr,
        }
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr)
            .field("loops", &self.seeds.len())
            .finish_non_exhaustive()
    }
}

/// A server whose loops are running.
pub struct RunningServer {
    handle: ServerHandle,
    threads: Vec<JoinHandle<io::Result<()>>>,
    local_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
}

impl RunningServer {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address that speaks TLS, if any.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// The admin listener's address, if any.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The shutdown handle.
    pub fn handle(&self) -> ServerHandle {
        self.handle.clone()
    }

    /// The server's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.handle.shared.metrics.clone()
    }

    /// Waits for every loop to end (after [`ServerHandle::shutdown`]).
    pub fn join(self) -> io::Result<()> {
        let mut result = Ok(());
        for thread in self.threads {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(_) => result = Err(io::Error::other("an event loop panicked")),
            }
        }
        result
    }
}

impl std::fmt::Debug for RunningServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningServer")
            .field("local_addr", &self.local_addr)
            .field("loops", &self.threads.len())
            .finish_non_exhaustive()
    }
}

/// Publishes to a server's topics from any thread, and stops the server: no more accepts,
/// close 1001 to every connection, exit once they are closed or the drain deadline passes.
#[derive(Clone)]
pub struct ServerHandle {
    shared: Arc<Shared>,
    wakers: Vec<Arc<Waker>>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stopping = self.shared.shutdown.load(Ordering::Relaxed);
        f.debug_struct("ServerHandle").field("stopping", &stopping).finish_non_exhaustive()
    }
}

impl ServerHandle {
    /// Who subscribes to the topics with presence, on this node and the others the backplane
    /// tells of (see [`presence`](crate::presence)); `None` when
    /// [`TopicsConfig::presence_prefix`](crate::config::TopicsConfig) is not set.
    ///
    /// ```no_run
    /// use freeboard::{Router, Server, ServerConfig};
    ///
    /// let mut config = ServerConfig::default();
    /// config.topics.presence_prefix = Some("room".into());
    /// let server = Server::bind(config, Router::new)?;
    /// let handle = server.handle();
    /// if let Some(presence) = handle.presence() {
    ///     let page = presence.page("room1", None, 100);
    ///     println!("{} members, first page {:?}", presence.count("room1"), page.members);
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn presence(&self) -> Option<&Arc<Presence>> {
        self.shared.hub.presence()
    }

    /// Starts the graceful shutdown. Idempotent.
    pub fn shutdown(&self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for waker in &self.wakers {
            let _ = waker.wake();
        }
    }

    /// Loads the TLS certificate and key again from their files (on `SIGHUP` in
    /// `freeboard serve`): new handshakes use the new pair, open connections keep theirs.
    /// On error the old pair stays. `Ok(false)` when the server has no TLS.
    pub fn reload_tls(&self) -> Result<bool, TlsError> {
        match &self.shared.tls {
            Some((_, identity)) => identity.reload().map(|()| true),
            None => Ok(false),
        }
    }

    /// Applies the settings of `config` that a running server can change (admission limits,
    /// timeouts of new requests and closes, send queues and policies of new connections, the
    /// publish token) and reports every setting that differed, applied or needing a restart
    /// ([`ServerConfig::reload_from`] lists which is which). Open connections are kept as
    /// they are. An invalid `config` changes nothing. The TLS certificate and key are read
    /// again by [`reload_tls`](Self::reload_tls) (`freeboard serve` calls both on `SIGHUP`).
    pub fn reload(&self, config: ServerConfig) -> Result<Reload, ConfigError> {
        config.validate()?;
        let reload = self.shared.reload(&config);
        for waker in &self.wakers {
            let _ = waker.wake();
        }
        Ok(reload)
    }

    /// Publishes one message to every subscriber of `topic`, on every loop: framed once into a
    /// shared frame, sent to each loop that has subscribers (and only those), copied once
    /// into each such loop's pool and queued to its subscribers by reference. Messages
    /// published through one handle (or from one thread) reach each subscriber in order.
    /// Never blocks: a loop whose inbox is full misses the message (counted, and reported in
    /// [`Published::dropped`]).
    ///
    /// ```no_run
    /// use freeboard::{Conn, Handler, Message, MessageKind, Router, Server, ServerConfig};
    ///
    /// struct Subscriber;
    /// impl Handler for Subscriber {
    ///     fn on_open(&mut self, conn: &mut Conn<'_>) {
    ///         let _ = conn.subscribe("scores");
    ///     }
    ///     fn on_message(&mut self, _: &mut Conn<'_>, _: Message<'_>) {}
    /// }
    ///
    /// let server =
    ///     Server::bind(ServerConfig::default(), || Router::new().route("/scores", Subscriber))?
    ///         .spawn();
    /// let scores = server.handle();
    /// std::thread::spawn(move || {
    ///     scores.publish("scores", MessageKind::Text, b"{\"home\":1,\"away\":0}");
    /// });
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn publish(&self, topic: &str, kind: MessageKind, payload: &[u8]) -> Published {
        self.shared.metrics.publishes.inc();
        self.shared.metrics.topic_series.published(topic);
        let hub = &self.shared.hub;
        let mut published = Published::default();
        if !hub.kept_by_backplane(topic) {
            let head = hub.publication_head(topic, kind, payload);
            hub.publish_remote(topic, &head.parts(payload), None, &mut published, None);
        }
        hub.send_to_backplane(topic, kind, payload, &mut published, None);
        published
    }
}

/// Fails with `AddrInUse` if anything listens on `addr`. `SO_REUSEPORT` would let this
/// process's listeners join another's group and share its connections; a probe socket without
/// it cannot bind where a listener is (a closed connection's `TIME_WAIT` does not count,
/// thanks to `SO_REUSEADDR`), so a second instance learns at once that the port is taken.
fn ensure_port_free(addr: SocketAddr) -> io::Result<()> {
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
    match probe.bind(&addr.into()) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{addr} is in use by another process (share_port joins its listeners on purpose)"
            ),
        )),
        result => result,
    }
}

/// The memory this process may use at most: the machine's, or its cgroup's limit if lower.
fn machine_memory() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: usize = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok());
    Some(cgroup.map_or(kib * 1024, |limit| limit.min(kib * 1024)))
}

fn reuseport_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    #[cfg(unix)]
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// A name for this node's presence: `n` and 8 random hex digits (what the other nodes list
/// its members under; a restarted node is another node, as its connections are new).
fn presence_node() -> Arc<str> {
    let mut bytes = [0u8; 4];
    if getrandom::fill(&mut bytes).is_err() {
        bytes = std::process::id().to_le_bytes();
    }
    Arc::from(format!("n{:08x}", u32::from_le_bytes(bytes)))
}
