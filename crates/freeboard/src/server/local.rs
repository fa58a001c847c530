//! A server whose one event loop is driven by its caller: a host event loop (Node's libuv,
//! Python's asyncio) watches the loop's descriptor and runs a turn when it is readable or
//! the loop's deadline has come.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use freeboard_proto::MessageKind;
use mio::Events;

use super::ServerHandle;
use super::event_loop::EventLoop;
use crate::handler::{Conn, ConnKey};
use crate::metrics::Metrics;
use crate::topics::{Published, Reach};
use crate::transport::Stream;

/// A server with one event loop that runs on the caller's thread, a turn at a time (made by
/// [`Server::bind_local`](crate::Server::bind_local)). It is the loop [`Server::run`]
/// runs on a thread of its own, turned inside out: the caller owns the thread and decides
/// when to turn.
///
/// In a host with an event loop of its own (the model of uWebSockets.js):
/// 1. watch [`as_raw_fd`](AsRawFd::as_raw_fd) (the loop's epoll descriptor) for
///    readability: libuv's `uv_poll_t`, asyncio's `loop.add_reader`;
/// 2. when it is readable, or [`timeout`](Self::timeout) has passed since the last turn,
///    call [`turn`](Self::turn)`(Some(Duration::ZERO))`. The handlers run inside it,
///    on the caller's thread: their calls need no lock, and a send's outcome is the
///    session's decision, at once;
/// 3. between turns (a host timer's callback, the handling of what a turn reported), reach a
///    connection with [`with_conn`](Self::with_conn) and publish with
///    [`publish`](Self::publish), then [`flush`](Self::flush) once: what was queued leaves
///    in one `writev` per connection;
/// 4. [`shutdown`](Self::shutdown) closes every connection with 1001; keep turning until
///    `turn` answers `false` (all closed, or `drain_timeout` passed).
///
/// [`Server::run`]: crate::Server::run
///
/// ```no_run
/// use std::time::Duration;
/// use freeboard::{Echo, Router, Server, ServerConfig};
///
/// let mut server = Server::bind_local(ServerConfig::default(), Router::new().route("/", Echo))?;
/// // A host would wait for `server.as_raw_fd()` instead of letting the turn wait.
/// while server.turn(Some(Duration::from_millis(100)))? {}
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct LocalServer {
    event_loop: EventLoop<Stream>,
    events: Events,
    handle: ServerHandle,
    local_addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
    /// The last turn answered `false` and the loop released what it held.
    finished: bool,
}

impl LocalServer {
    pub(super) fn new(
        mut event_loop: EventLoop<Stream>,
        handle: ServerHandle,
        local_addr: SocketAddr,
        tls_addr: Option<SocketAddr>,
    ) -> Self {
        event_loop.start();
        let events = Events::with_capacity(1024);
        Self { event_loop, events, handle, local_addr, tls_addr, finished: false }
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address that speaks TLS, if any.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// A handle that publishes and stops the server from any thread (its calls wake the
    /// loop: its descriptor turns readable).
    pub fn handle(&self) -> ServerHandle {
        self.handle.clone()
    }

    /// The server's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.handle.shared.metrics.clone()
    }

    /// Runs one turn: waits for readiness at most `max_wait` (`None`: until the loop's next
    /// deadline), then accepts, reads and calls the handlers, runs the timers, and writes
    /// what the turn queued. `Ok(false)` once the server has stopped: a shutdown has drained
    /// (or its deadline passed), and everything the loop held is released.
    pub fn turn(&mut self, max_wait: Option<Duration>) -> io::Result<bool> {
        if self.finished {
            return Ok(false);
        }
        let running = self.event_loop.turn(&mut self.events, max_wait)?;
        if !running {
            self.event_loop.finish();
            self.finished = true;
        }
        Ok(running)
    }

    /// How long the host may wait for the descriptor before it must turn anyway: the loop's
    /// next deadline (a timeout, a close, the pool's release), zero while work is left from
    /// the last turn (a busy peer, a backlog, a shutdown to begin), `None` when nothing is
    /// due.
    pub fn timeout(&self) -> Option<Duration> {
        if self.finished {
            return None;
        }
        let stopping = self.handle.shared.shutdown.load(std::sync::atomic::Ordering::Acquire);
        if stopping && !self.event_loop.shutting_down() {
            return Some(Duration::ZERO);
        }
        self.event_loop.wait(self.event_loop.now())
    }

    /// Runs `f` with a handle on the open connection `key` ([`Conn::key`]), between turns:
    /// what it sends is queued (and leaves at the next [`flush`](Self::flush) or turn), what
    /// it publishes is fanned out when it returns, and a writability change it causes is
    /// reported to the handler at once. `None` if the connection has closed (or is closing).
    pub fn with_conn<R>(&mut self, key: ConnKey, f: impl FnOnce(&mut Conn<'_>) -> R) -> Option<R> {
        if self.finished {
            return None;
        }
        self.event_loop.with_conn(key, f)
    }

    /// Stops (`held`) or resumes reading the open connection `key`: for a host whose handler
    /// takes messages at its own pace (an `async for` over a bounded queue), so the peer meets
    /// TCP's flow control rather than the host's memory growing. Messages of a read already
    /// made are still delivered; a resumed connection is read at the next turn
    /// ([`timeout`](Self::timeout) says zero). `false` if the connection has closed.
    pub fn hold_input(&mut self, key: ConnKey, held: bool) -> bool {
        !self.finished && self.event_loop.hold_input(key, held)
    }

    /// Publishes one message to every subscriber of `topic`, between turns: framed once and
    /// queued by reference to this loop's subscribers now (they get it at the next
    /// [`flush`](Self::flush) or turn; one that was idle gets it written at once), and sent to
    /// the other loops or the backplane as [`ServerHandle::publish`] does. Returns what the
    /// loops took ([`Published`]) and what this loop's subscribers made of it ([`Reach`]:
    /// queued, or dropped by their policy).
    pub fn publish(
        &mut self,
        topic: &str,
        kind: MessageKind,
        payload: &[u8],
    ) -> (Published, Reach) {
        if self.finished {
            return (Published::default(), Reach::default());
        }
        self.event_loop.publish_here(topic, kind, payload)
    }

    /// Writes what was queued since the last turn: one `writev` per connection touched, and
    /// the moves to draining and linger that follow.
    pub fn flush(&mut self) {
        if !self.finished {
            let now = self.event_loop.now();
            self.event_loop.end_turn(now);
        }
    }

    /// Starts the graceful shutdown: no more accepts, close 1001 to every connection at the
    /// next turn; keep turning until [`turn`](Self::turn) answers `false`. Idempotent.
    pub fn shutdown(&self) {
        self.handle.shutdown();
    }

    /// Whether the server has stopped (a [`turn`](Self::turn) answered `false`).
    pub fn is_finished(&self) -> bool {
        self.finished
    }
}

impl AsRawFd for LocalServer {
    /// The loop's epoll descriptor: readable when a turn has something to do.
    fn as_raw_fd(&self) -> RawFd {
        self.event_loop.poll().as_raw_fd()
    }
}

impl std::fmt::Debug for LocalServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalServer")
            .field("local_addr", &self.local_addr)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}
