//! Broadcast benchmark: one publisher, N subscribers, side by side with a Node `ws` server
//! that loops over a `Map` (`peers/node-ws-broadcast`, run `npm ci` there first).
//!
//! ```text
//! cargo run --release -p freeboard --example broadcast_bench -- [N...] [--node] [--window=W]
//!     [--freeboard=ADDR]
//! ```
//!
//! In-process, freeboard's sockets share this process's file limit with the subscribers' (10,000
//! subscribers need 20,000 descriptors). With `--freeboard=ADDR` it drives a separate
//! `freeboard serve --client-publish --topic-slow-consumer drop-oldest --topic-send-cap 4M
//! --max-connections-per-ip 100000 --threads 1` instead; the publisher then publishes from
//! `/topic/bench` (and is a subscriber too, one it never reads).
//!
//! For each N and payload size (64 B, 1 KiB) the publisher keeps at most W messages (default
//! 16) in flight (a message is complete when the last subscriber has it), so no policy drops
//! anything; reported: deliveries per second and publish-to-receive latency of the last
//! subscriber (p50/p99; with W > 1 it includes waiting behind the other messages in flight —
//! `--window=1` measures one message alone). Each experiment sends `2,000,000 / N` messages
//! (100 to 2,000). Subscribers run on one mio thread, the publisher on another; freeboard
//! runs in-process on one event loop, Node is single-threaded too.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use freeboard::config::TopicsConfig;
use freeboard::{Conn, Handler, Message, Router, Server, ServerConfig, SlowConsumerPolicy};
use mio::{Events, Interest, Poll, Token};

/// `/pub`: publishes every message to `bench`.
struct Publish;

impl Handler for Publish {
    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        let _ = conn.publish("bench", message.kind, message.data);
    }
}

fn upgrade(addr: SocketAddr, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).expect("response head");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    s
}

/// Runs one experiment; returns (deliveries/s, p50, p99 of the last subscriber's latency).
fn run(
    addr: SocketAddr,
    sub_path: &str,
    pub_path: &str,
    n: usize,
    size: usize,
    window: u64,
) -> (f64, Duration, Duration) {
    let messages = (2_000_000 / n as u64).clamp(100, 2_000);
    let mut poll = Poll::new().unwrap();
    let mut subs: Vec<(mio::net::TcpStream, Vec<u8>)> = (0..n)
        .map(|i| {
            let s = upgrade(addr, sub_path);
            s.set_nonblocking(true).unwrap();
            let mut s = mio::net::TcpStream::from_std(s);
            poll.registry().register(&mut s, Token(i), Interest::READABLE).unwrap();
            (s, Vec::new())
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200)); // subscriptions settle
    let start = Instant::now();
    let completed = Arc::new(AtomicU64::new(0));
    let publisher = {
        let completed = completed.clone();
        let mut s = upgrade(addr, pub_path);
        std::thread::spawn(move || {
            let mut frame = Vec::with_capacity(size + 14);
            for seq in 0..messages {
                while seq >= completed.load(Ordering::Acquire) + window {
                    // Sleep rather than spin: on a small machine a spinning publisher would take
                    // a core from the server and the subscribers.
                    std::thread::sleep(Duration::from_micros(20));
                }
                let mut payload = vec![0u8; size];
                payload[..8].copy_from_slice(&seq.to_le_bytes());
                let t = start.elapsed().as_nanos() as u64;
                payload[8..16].copy_from_slice(&t.to_le_bytes());
                frame.clear();
                frame.push(0x82);
                if size < 126 {
                    frame.push(0x80 | size as u8);
                } else {
                    frame.push(0x80 | 126);
                    frame.extend_from_slice(&(size as u16).to_be_bytes());
                }
                frame.extend_from_slice(&[0; 4]); // a zero mask leaves the payload as is
                frame.extend_from_slice(&payload);
                s.write_all(&frame).unwrap();
            }
            s
        })
    };
    let mut counts = vec![0usize; messages as usize];
    let mut latencies = Vec::with_capacity(messages as usize);
    let mut events = Events::with_capacity(4096);
    let mut buf = vec![0u8; 1 << 16];
    let mut done = 0u64;
    while done < messages {
        poll.poll(&mut events, Some(Duration::from_secs(10))).unwrap();
        assert!(!events.is_empty(), "stalled after {done} messages");
        for event in events.iter() {
            let (s, pending) = &mut subs[event.token().0];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => panic!("subscriber closed"),
                    Ok(k) => pending.extend_from_slice(&buf[..k]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("{e}"),
                }
            }
            let mut at = 0;
            while pending.len() - at >= 2 {
                let (len, head) = match pending[at + 1] & 0x7f {
                    126 if pending.len() - at >= 4 => {
                        (u16::from_be_bytes([pending[at + 2], pending[at + 3]]) as usize, 4)
                    }
                    126 => break,
                    n => (n as usize, 2),
                };
                if pending.len() - at < head + len {
                    break;
                }
                let p = &pending[at + head..at + head + len];
                let seq = u64::from_le_bytes(p[..8].try_into().unwrap()) as usize;
                counts[seq] += 1;
                if counts[seq] == n {
                    let sent = u64::from_le_bytes(p[8..16].try_into().unwrap());
                    let now = start.elapsed().as_nanos() as u64;
                    latencies.push(Duration::from_nanos(now.saturating_sub(sent)));
                    done += 1;
                    completed.store(done, Ordering::Release);
                }
                at += head + len;
            }
            pending.drain(..at);
        }
    }
    let elapsed = start.elapsed();
    drop(publisher.join());
    latencies.sort();
    let pct = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    ((messages * n as u64) as f64 / elapsed.as_secs_f64(), pct(0.5), pct(0.99))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let node = args.iter().any(|a| a == "--node");
    let window =
        args.iter().find_map(|a| a.strip_prefix("--window=")).map_or(16, |w| w.parse().unwrap());
    let mut sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if sizes.is_empty() {
        sizes = vec![100, 1_000, 10_000];
    }
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.max_connections_per_ip = 100_000;
    config.idle_timeout = None;
    let mut topics = TopicsConfig::default();
    topics.slow_consumer = SlowConsumerPolicy::DropOldest;
    topics.send_cap = 4 << 20;
    config.topics = topics.clone();
    let external: Option<SocketAddr> =
        args.iter().find_map(|a| a.strip_prefix("--freeboard=")).map(|a| a.parse().unwrap());
    let running = external.is_none().then(|| {
        Server::bind(config, move || Router::new().topics(&topics).route("/pub", Publish))
            .unwrap()
            .spawn()
    });
    let fb = external.unwrap_or_else(|| running.as_ref().unwrap().local_addr());
    let fb_pub = if external.is_some() { "/topic/bench" } else { "/pub" };
    let mut peer = node.then(|| {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../peers/node-ws-broadcast");
        let child = std::process::Command::new("node")
            .args([&format!("{dir}/server.js"), "9477"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("node");
        std::thread::sleep(Duration::from_millis(800));
        child
    });
    println!("| subscribers | size | server | deliveries/s | last p50 | last p99 |");
    println!("|---|---|---|---|---|---|");
    for &n in &sizes {
        for size in [64, 1024] {
            let row = |name: &str, addr: SocketAddr, path: &str, pub_path: &str| {
                let (rate, p50, p99) = run(addr, path, pub_path, n, size, window);
                println!("| {n} | {size} | {name} | {rate:.0} | {p50:.2?} | {p99:.2?} |");
                rate
            };
            let ours = row("freeboard", fb, "/topic/bench", fb_pub);
            if peer.is_some() {
                let theirs = row("node ws", "127.0.0.1:9477".parse().unwrap(), "/sub", "/pub");
                println!("| {n} | {size} | ratio | {:.2}x | | |", ours / theirs);
            }
        }
    }
    if let Some(child) = &mut peer {
        let _ = child.kill();
        let _ = child.wait();
    }
    if let Some(running) = running {
        running.handle().shutdown();
        let _ = running.join();
    }
}
