//! The tokio driver's fan-out to WebSocket and to Server-Sent Events subscribers, side by
//! side in one run: `SUBSCRIBERS` connections of each kind over HTTP/1.1 on loopback, one
//! topic, `MESSAGES` publications of `SIZE` bytes; the server's CPU time per delivery (its
//! runtime is one thread, whose CPU clock is read) and the bytes per delivery on the wire.
//! The clients run on other threads of the same process and only count.
//!
//! ```sh
//! cargo run --release -p freeboard --features axum --example tokio_fan_out_bench -- 1000 2000 64
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use freeboard::MessageKind;
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::sse::EventStreamRequest;
use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage};
use futures_util::StreamExt;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Publications the publisher may be ahead of the readers.
const WINDOW: usize = 128;

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args().nth(i).and_then(|a| a.parse().ok()).unwrap_or(default)
    };
    let (subscribers, messages, size) = (arg(1, 1000), arg(2, 2000), arg(3, 64));
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<(&'static str, Arc<AtomicU64>, u64)>();
    let (cpu_tx, cpu_rx) = std::sync::mpsc::channel();
    let (cleared_tx, cleared_rx) = std::sync::mpsc::channel();
    // The server: one thread, its runtime's only one, so its CPU clock is the server's.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let endpoint = Endpoint::new(EndpointConfig::default().memory(512 << 20)).unwrap();
            let app = Router::new()
                .route("/ws", get(websocket))
                .route("/events", get(|r: EventStreamRequest| async { r.subscribe(["t"]) }))
                .layer(Extension(Arc::clone(&endpoint)));
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            tokio::spawn(async move {
                loop {
                    let (tcp, _) = listener.accept().await.unwrap();
                    let _ = tcp.set_nodelay(true);
                    let service = TowerToHyperService::new(app.clone());
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tcp), service)
                            .with_upgrades(),
                    );
                }
            });
            let payload = vec![b'p'; size];
            while let Ok((kind, done, expected)) = go_rx.recv() {
                while endpoint.subscribers("t") < subscribers {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let start = thread_cpu();
                for i in 0..messages {
                    endpoint.publish("t", MessageKind::Text, &payload);
                    // Paced: at most `WINDOW` publications ahead of the slowest reader in
                    // all, so that neither kind meets its policy and the run measures the
                    // deliveries alone.
                    let ahead = (i + 1).saturating_sub(WINDOW) as u64 * subscribers as u64;
                    while done.load(Ordering::Relaxed) < ahead {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                let mut waited = 0;
                while done.load(Ordering::Relaxed) < expected {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    waited += 1;
                    if waited % 5000 == 0 {
                        eprintln!(
                            "{kind}: stalled at {} of {expected} deliveries: {} slow-consumer \
                             closes, {:?}",
                            done.load(Ordering::Relaxed),
                            endpoint.slow_consumer_closes(),
                            endpoint.counters()
                        );
                    }
                }
                cpu_tx.send((kind, thread_cpu() - start)).unwrap();
                // The next round starts once this one's subscribers have gone.
                while endpoint.subscribers("t") > 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                cleared_tx.send(()).unwrap();
            }
        });
    });
    let addr = addr_rx.recv().unwrap();
    let deliveries = (subscribers * messages) as f64;
    for kind in ["websocket", "sse"] {
        // Each round's clients on a runtime of their own, whose end closes their sockets.
        let clients = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (done, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let tasks: Vec<_> = (0..subscribers)
            .map(|_| {
                clients.spawn(client(kind, addr, messages as u64, done.clone(), bytes.clone()))
            })
            .collect();
        go_tx.send((kind, Arc::clone(&done), (subscribers * messages) as u64)).unwrap();
        let (_, cpu) = cpu_rx.recv().unwrap();
        drop(tasks);
        clients.shutdown_background();
        cleared_rx.recv().unwrap();
        println!(
            "{kind:>9}: {subscribers} subscribers × {messages} messages of {size} B: server CPU \
             {:.0} ns per delivery, {:.1} B per delivery on the wire",
            cpu.as_nanos() as f64 / deliveries,
            bytes.load(Ordering::Relaxed) as f64 / deliveries,
        );
    }
}

async fn websocket(ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(|mut socket: AxumWebSocket| async move {
        socket.subscribe("t").unwrap();
        while let Some(message) = socket.next().await {
            if let OwnedMessage::Close(_) = message {
                break;
            }
        }
    })
}

/// One subscriber: reads until `messages` arrived (WebSocket frames, or events of the
/// chunked event stream), adding each to `done` and its bytes past the response head to
/// `bytes`, then waits for its runtime's end.
async fn client(
    kind: &'static str,
    addr: std::net::SocketAddr,
    messages: u64,
    done: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
) {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let request = match kind {
        "websocket" => {
            "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        }
        _ => "GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n",
    };
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    // The response head.
    let head = loop {
        let n = tcp.read(&mut buf).await.unwrap();
        raw.extend_from_slice(&buf[..n]);
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    raw.drain(..head);
    let (mut seen, mut counted) = (0u64, 0u64);
    let mut body_tail = 0u8; // the last body byte, for an event end split across chunks
    let sse = kind == "sse";
    let mut first = sse; // the `retry:` line ends like an event
    loop {
        // WebSocket: unmasked frames with 2-byte headers at these sizes. SSE: chunks of the
        // chunked coding, each event ending with a blank line.
        loop {
            if !sse {
                if raw.len() < 2 {
                    break;
                }
                let len = (raw[1] & 0x7f) as usize;
                let (header, len) = match len {
                    126 if raw.len() >= 4 => (4, u16::from_be_bytes([raw[2], raw[3]]) as usize),
                    126 => break,
                    len => (2, len),
                };
                if raw.len() < header + len {
                    break;
                }
                raw.drain(..header + len);
                seen += 1;
            } else {
                let Some(line) = raw.windows(2).position(|w| w == b"\r\n") else { break };
                let size = usize::from_str_radix(std::str::from_utf8(&raw[..line]).unwrap(), 16);
                let size = size.unwrap();
                if raw.len() < line + 2 + size + 2 {
                    break;
                }
                for &b in &raw[line + 2..line + 2 + size] {
                    if b == b'\n' && body_tail == b'\n' {
                        if first {
                            first = false;
                        } else {
                            seen += 1;
                        }
                    }
                    body_tail = b;
                }
                raw.drain(..line + 2 + size + 2);
            }
        }
        done.fetch_add(seen - counted, Ordering::Relaxed);
        counted = seen;
        if seen >= messages {
            std::future::pending::<()>().await;
        }
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "the server closed the connection");
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        raw.extend_from_slice(&buf[..n]);
    }
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
