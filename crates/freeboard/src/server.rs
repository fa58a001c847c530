//! The server: its event loops, the limits they share, shutdown.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use mio::{Poll, Waker};
use socket2::{Domain, Protocol, Socket, Type};

use crate::config::ServerConfig;
use crate::event_loop::{EventLoop, WAKER};
use crate::handler::{Router, RouterFactory};
use crate::metrics::Metrics;

/// State every event loop of a server shares: configuration, metrics, connection counts.
pub(crate) struct Shared {
    pub(crate) config: ServerConfig,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) factory: RouterFactory,
    pub(crate) start: std::time::Instant,
    /// TCP connections open across all loops (handshaking ones included).
    pub(crate) open: AtomicUsize,
    /// Connections per peer address; entries go when their count reaches zero.
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    pub(crate) shutdown: AtomicBool,
}

impl Shared {
    pub(crate) fn admit(&self, peer: SocketAddr) {
        self.open.fetch_add(1, Ordering::Relaxed);
        *self.per_ip.lock().unwrap_or_else(|e| e.into_inner()).entry(peer.ip()).or_default() += 1;
    }

    pub(crate) fn release(&self, peer: SocketAddr) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        let mut map = self.per_ip.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&peer.ip()) {
            *n -= 1;
            if *n == 0 {
                map.remove(&peer.ip());
            }
        }
    }

    pub(crate) fn per_ip(&self, peer: SocketAddr) -> usize {
        self.per_ip.lock().unwrap_or_else(|e| e.into_inner()).get(&peer.ip()).copied().unwrap_or(0)
    }
}

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
    /// One poll and listener per loop; the loop itself (pool, router) is built on its thread,
    /// so handlers need not be `Send`.
    seeds: Vec<(Poll, mio::net::TcpListener)>,
    wakers: Vec<Arc<Waker>>,
    local_addr: SocketAddr,
}

impl Server {
    /// Binds one `SO_REUSEPORT` listener per event loop at `config.listen` (port 0 picks a
    /// free port shared by all loops) and builds each loop's pool and router.
    pub fn bind(
        config: ServerConfig,
        routes: impl Fn() -> Router + Send + Sync + 'static,
    ) -> io::Result<Self> {
        config.validate().map_err(io::Error::other)?;
        let metrics = Arc::new(Metrics::new());
        metrics.set_loops(config.threads as u32);
        let shared = Arc::new(Shared {
            metrics,
            factory: Arc::new(routes),
            start: std::time::Instant::now(),
            open: AtomicUsize::new(0),
            per_ip: Mutex::new(HashMap::new()),
            shutdown: AtomicBool::new(false),
            config,
        });
        let mut addr = shared.config.listen;
        let mut loops = Vec::new();
        let mut wakers = Vec::new();
        for _ in 0..shared.config.threads {
            let listener = reuseport_listener(addr)?;
            addr = listener.local_addr()?;
            let poll = Poll::new()?;
            wakers.push(Arc::new(Waker::new(poll.registry(), WAKER)?));
            let listener = mio::net::TcpListener::from_std(listener);
            loops.push((poll, listener));
        }
        Ok(Self { shared, seeds: loops, wakers, local_addr: addr })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The server's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// A handle that can stop the server from another thread (or a signal handler thread).
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
            .map(|(i, (poll, listener))| {
                let shared = self.shared.clone();
                std::thread::Builder::new()
                    .name(format!("freeboard-loop-{i}"))
                    .spawn(move || EventLoop::new(i as u32, poll, listener, shared)?.run())
                    .expect("the OS can start a thread")
            })
            .collect();
        RunningServer {
            handle: ServerHandle { shared: self.shared, wakers: self.wakers },
            threads,
            local_addr: self.local_addr,
        }
    }
}

/// A server whose loops are running.
pub struct RunningServer {
    handle: ServerHandle,
    threads: Vec<JoinHandle<io::Result<()>>>,
    local_addr: SocketAddr,
}

impl RunningServer {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
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

/// Stops a server: no more accepts, close 1001 to every connection, exit once they are
/// closed or the drain deadline passes.
#[derive(Clone)]
pub struct ServerHandle {
    shared: Arc<Shared>,
    wakers: Vec<Arc<Waker>>,
}

impl ServerHandle {
    /// Starts the graceful shutdown. Idempotent.
    pub fn shutdown(&self) {
        self.shared.shutdown.store(true, Ordering::Release);
        for waker in &self.wakers {
            let _ = waker.wake();
        }
    }
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
