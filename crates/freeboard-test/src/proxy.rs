//! A loopback TCP proxy that a test or benchmark cuts on purpose: every connection through it
//! ends abruptly (no close frame; FIN, then RST) at [`CutProxy::cut`], and new ones are refused while it is [`down`](CutProxy::down)
//! (the client sees a dropped network, the server a peer that vanished).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// How long the proxy waits for its upstream to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A proxy from a loopback port to `upstream`, cut on command.
#[derive(Debug)]
pub struct CutProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    /// Both sockets of every live connection (the client's and the upstream's).
    live: Mutex<Vec<(TcpStream, TcpStream)>>,
    down: AtomicBool,
    stopped: AtomicBool,
    accepted: AtomicU64,
}

impl CutProxy {
    /// Listens on `127.0.0.1:0` and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let shared = Arc::new(Shared {
            upstream,
            live: Mutex::new(Vec::new()),
            down: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
        });
        let accept = Arc::clone(&shared);
        thread::spawn(move || {
            for client in listener.incoming() {
                if accept.stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                if accept.down.load(Ordering::Relaxed) {
                    reset(&client);
                    continue;
                }
                // Bounded, so that an upstream out of reach stalls no later client for long.
                let Ok(server) = TcpStream::connect_timeout(&accept.upstream, CONNECT_TIMEOUT)
                else {
                    reset(&client);
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                let mut live = accept.live.lock().unwrap();
                live.retain(|(c, _)| c.peer_addr().is_ok());
                live.push((c2, s2));
                // Counted once a `cut` would end it: a caller that waits for the count and
                // then cuts never misses the connection it waited for.
                accept.accepted.fetch_add(1, Ordering::Relaxed);
                drop(live);
                pump(&client, &server);
                pump(&server, &client);
            }
        });
        Self { addr, shared }
    }

    /// Ends every connection through the proxy now, both sides, without a close frame;
    /// returns how many.
    pub fn cut(&self) -> usize {
        let live = std::mem::take(&mut *self.shared.live.lock().unwrap());
        for (client, server) in &live {
            reset(client);
            reset(server);
        }
        live.len()
    }

    /// While `true`, new connections are reset as soon as they are accepted: the network is
    /// down for the clients.
    pub fn down(&self, down: bool) {
        self.shared.down.store(down, Ordering::Relaxed);
    }

    /// Connections forwarded so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Relaxed);
        self.cut();
        // Wake the accept loop so that its thread ends.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
    }
}

/// Copies `from` to `to` on a thread until either ends, then shuts both down.
fn pump(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else { return };
    thread::spawn(move || {
        let mut buf = [0u8; 16 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

/// Closes `stream` with an RST (SO_LINGER 0), as a dropped network path ends it.
fn reset(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt(2) on a socket we own, with a value of the size we pass.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    let _ = stream.shutdown(Shutdown::Both);
}
