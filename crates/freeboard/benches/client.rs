//! Client-side operations per second, beside tokio-tungstenite's client in the same run.
//!
//! ```text
//! cargo bench -p freeboard --bench client
//! cargo bench -p freeboard --bench client -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Send benchmarks write to a loopback server that reads and discards; receive benchmarks read
//! from a loopback server that writes the same pre-framed messages forever. Both clients talk
//! to the same servers. A timed run of sends ends with a flush, so every message counted has
//! been handed to the socket. `freeboard` is the default client: `send` queues and its writer
//! thread writes at once, taking whatever queued meanwhile in the same write;
//! `freeboard, caller writes` writes each message in `send` (one `writev`, like
//! tokio-tungstenite's `send`, which flushes). tokio-tungstenite's `feed` queues without
//! writing and its timed run ends with one flush. Both clients run with Nagle's algorithm off
//! (tokio-tungstenite's default leaves it on, which lets the kernel coalesce small writes at
//! the cost of latency).

use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use freeboard::client::{Client, ClientConfig, Event, MessageKind, PushOutcome, SendOutcome};
use freeboard::{Echo, Router, Server, ServerConfig};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::{Bytes, Message, Utf8Bytes};

fn send(c: &mut Criterion) {
    let sink = server(None);
    let rt = runtime();
    for (name, size, kind) in [
        ("1KiB-text", 1 << 10, MessageKind::Text),
        ("1KiB-binary", 1 << 10, MessageKind::Binary),
        ("8KiB-binary", 8 << 10, MessageKind::Binary),
        ("64KiB-binary", 64 << 10, MessageKind::Binary),
    ] {
        let payload = vec![b'x'; size];
        let mut group = c.benchmark_group(format!("send/{name}"));
        group.throughput(Throughput::Elements(1));

        let mut client = connect(sink, true);
        group.bench_function("freeboard copied", |b| {
            b.iter_custom(|iters| timed_sends(&mut client, iters, kind, &payload))
        });
        let mut caller = connect(sink, false);
        group.bench_function("freeboard copied, caller writes", |b| {
            b.iter_custom(|iters| timed_sends(&mut caller, iters, kind, &payload))
        });
        if size >= 8 << 10 {
            // Without the writer thread, so that nothing is written while the next buffer is
            // made (untimed).
            group.bench_function("freeboard owned, caller writes", |b| {
                b.iter_batched(
                    || payload.clone(),
                    |owned| {
                        if let SendOutcome::Queue(PushOutcome::WouldBlock { .. }) =
                            caller.send_owned(kind, owned).unwrap()
                        {
                            caller.flush(None).unwrap(); // counted: a refused send is retried
                            send_all(&mut caller, kind, &payload);
                        }
                    },
                    BatchSize::SmallInput,
                )
            });
        }

        let mut ws = rt.block_on(connect_tungstenite(sink)).0;
        let bytes = Bytes::from(payload.clone());
        let text = Utf8Bytes::try_from(bytes.clone()).unwrap();
        let message = move || match kind {
            MessageKind::Text => Message::Text(text.clone()),
            MessageKind::Binary => Message::Binary(bytes.clone()),
        };
        group.bench_function("tokio-tungstenite send", |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        ws.send(message()).await.unwrap();
                    }
                    start.elapsed()
                })
            })
        });
        group.bench_function("tokio-tungstenite feed", |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        ws.feed(message()).await.unwrap();
                    }
                    ws.flush().await.unwrap();
                    start.elapsed()
                })
            })
        });
        group.finish();
    }
}

fn receive(c: &mut Criterion) {
    let rt = runtime();
    for fragments in [2, 4] {
        let mut group = c.benchmark_group(format!("receive/1KiB-in-{fragments}-frames"));
        group.throughput(Throughput::Elements(1));
        let source = server(Some(fragmented(1 << 10, fragments, 256)));

        for (name, writer_thread) in [("freeboard", true), ("freeboard, caller writes", false)] {
            let mut client = connect(source, writer_thread);
            group.bench_function(name, |b| {
                b.iter(|| match client.recv().unwrap() {
                    Event::Message(m) => black_box(m.len()),
                    Event::Closed(close) => panic!("{close:?}"),
                })
            });
        }
        let mut ws = rt.block_on(connect_tungstenite(source)).0;
        group.bench_function("tokio-tungstenite", |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(ws.next().await.unwrap().unwrap().len());
                    }
                    start.elapsed()
                })
            })
        });
        group.finish();
    }
}

/// One message out, its echo back: what the writer thread's wake-up adds to a round trip.
fn round_trip(c: &mut Criterion) {
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    let echo = Server::bind(config, || Router::new().route("/", Echo)).unwrap().spawn();
    let addr = echo.local_addr();
    let rt = runtime();
    let payload = vec![b'x'; 64];
    let mut group = c.benchmark_group("round-trip/64B");
    group.throughput(Throughput::Elements(1));
    for (name, writer_thread) in [("freeboard", true), ("freeboard, caller writes", false)] {
        let mut client = connect(addr, writer_thread);
        group.bench_function(name, |b| {
            b.iter(|| {
                send_all(&mut client, MessageKind::Binary, &payload);
                match client.recv().unwrap() {
                    Event::Message(m) => black_box(m.len()),
                    Event::Closed(close) => panic!("{close:?}"),
                }
            })
        });
    }
    let mut ws = rt.block_on(connect_tungstenite(addr)).0;
    let message = Message::Binary(Bytes::from(payload.clone()));
    group.bench_function("tokio-tungstenite", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    ws.send(message.clone()).await.unwrap();
                    black_box(ws.next().await.unwrap().unwrap().len());
                }
                start.elapsed()
            })
        })
    });
    group.finish();
    echo.handle().shutdown();
}

fn buffered_amount(c: &mut Criterion) {
    let sink = server(None);
    let mut client = connect(sink, true);
    let _ = client.send_binary(&[0u8; 1000]).unwrap();
    c.bench_function("buffered_amount", |b| b.iter(|| black_box(&client).buffered_amount()));
}

/// `iters` sends and a flush, timed.
fn timed_sends(client: &mut Client, iters: u64, kind: MessageKind, payload: &[u8]) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        send_all(client, kind, black_box(payload));
    }
    client.flush(None).unwrap();
    start.elapsed()
}

/// Sends one message, waiting for the socket when the policy (`Block`) refuses it.
fn send_all(client: &mut Client, kind: MessageKind, payload: &[u8]) {
    while let SendOutcome::Queue(PushOutcome::WouldBlock { .. }) =
        client.send(kind, payload).unwrap()
    {
        client.flush(None).unwrap();
    }
}

fn connect(addr: SocketAddr, writer_thread: bool) -> Client {
    let config = ClientConfig::default().writer_thread(writer_thread);
    Client::connect(&format!("ws://{addr}/"), config).unwrap()
}

/// tokio-tungstenite's client with Nagle's algorithm off, as freeboard's client has it: both
/// push every write to the wire at once.
async fn connect_tungstenite(
    addr: SocketAddr,
) -> (
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    tokio_tungstenite::tungstenite::handshake::client::Response,
) {
    tokio_tungstenite::connect_async_with_config(format!("ws://{addr}/"), None, true).await.unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap()
}

/// `count` binary messages of `size` bytes, each in `fragments` unmasked frames.
fn fragmented(size: usize, fragments: usize, count: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let piece = size / fragments;
    for _ in 0..count {
        for i in 0..fragments {
            let opcode = if i == 0 { 0x2 } else { 0x0 };
            let fin = if i == fragments - 1 { 0x80 } else { 0 };
            out.push(fin | opcode);
            if piece < 126 {
                out.push(piece as u8);
            } else {
                out.push(126);
                out.extend_from_slice(&(piece as u16).to_be_bytes());
            }
            out.extend(std::iter::repeat_n(b'y', piece));
        }
    }
    out
}

/// A loopback server: after the opening handshake it discards everything (`frames: None`) or
/// writes `frames` over and over.
fn server(frames: Option<Vec<u8>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let frames = frames.clone();
            thread::spawn(move || {
                if accept(&mut stream).is_err() {
                    return;
                }
                let _ = stream.set_nodelay(true);
                match frames {
                    None => {
                        let mut buf = vec![0u8; 256 << 10];
                        while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                    }
                    Some(frames) => while stream.write_all(&frames).is_ok() {},
                }
            });
        }
    });
    thread::sleep(Duration::from_millis(10));
    addr
}

fn accept(stream: &mut TcpStream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte)?;
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let key = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("sec-websocket-key").then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    let accept = freeboard_proto::handshake::accept_key(key.as_bytes());
    write!(
        stream,
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        String::from_utf8_lossy(&accept)
    )
}

criterion_group!(benches, send, receive, round_trip, buffered_amount);
criterion_main!(benches);
