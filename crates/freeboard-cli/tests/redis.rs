//! Topics across two `freeboard serve` nodes on a real `redis-server` (Debian's package;
//! `scripts/test` installs it). Each test starts its own Redis on a free loopback port with
//! `--save '' --appendonly no` and stops it by PID. Skipped, with a message, when
//! `redis-server` is not on the PATH.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use freeboard_test::{Inbox, frame};

/// A child process killed (by PID) and reaped on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `redis-server` on `port`, ready for connections; `None` if it is not installed.
fn redis(port: u16) -> Option<Process> {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let process = Process(child);
    let until = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < until, "redis-server did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(process)
}

/// A `freeboard serve` node on the Redis at `port`, and its address.
fn node(port: u16) -> (Process, String) {
    node_with(port, &[])
}

/// [`node`] with more arguments.
fn node_with(port: u16, extra: &[&str]) -> (Process, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_freeboard"))
        .args(["serve", "--listen", "127.0.0.1:0", "--memory", "64M", "--threads", "2"])
        .args(["--client-publish", "--redis", &format!("redis://127.0.0.1:{port}/")])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().rsplit(' ').next().unwrap().to_owned();
    let addr = url.trim_start_matches("ws://").trim_end_matches('/').to_owned();
    (Process(child), addr)
}

/// A WebSocket on `/topic/{topic}`, its 101 read.
fn subscribe(addr: &str, topic: &str) -> (TcpStream, Inbox) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(freeboard_test::upgrade_request(&format!("/topic/{topic}"), "").as_bytes())
        .unwrap();
    let mut inbox = Inbox::default();
    let head = inbox.head(&mut s).unwrap().expect("a response");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    (s, inbox)
}

fn text(payload: &[u8]) -> Vec<u8> {
    frame(0x81, payload, Some([1, 2, 3, 4]))
}

/// Publishes "warm" from `publisher` until every reader has seen one: every node's
/// subscription has reached Redis.
fn warm_up(publisher: &mut TcpStream, readers: &mut [(TcpStream, Inbox)]) {
    for (reader, inbox) in readers.iter_mut() {
        reader.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        'seen: loop {
            assert!(Instant::now() < until, "a subscription never reached Redis");
            publisher.write_all(&text(b"warm")).unwrap();
            while let Ok(Some(f)) = inbox.frame(reader) {
                if f.payload == b"warm" {
                    break 'seen;
                }
            }
        }
        reader.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
}

/// A counter's value in a node's `/metrics` (0 if absent).
fn metric(addr: &str, name: &str) -> u64 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[test]
fn two_nodes_deliver_every_publication_once_in_order_per_publisher() {
    let port = free_port();
    let Some(_redis) = redis(port) else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let (_a, addr_a) = node(port);
    let (_b, addr_b) = node(port);
    let mut readers = vec![
        subscribe(&addr_a, "chat"),
        subscribe(&addr_a, "chat"),
        subscribe(&addr_b, "chat"),
        subscribe(&addr_b, "chat"),
    ];
    let (mut pub_a, _) = subscribe(&addr_a, "chat");
    let (mut pub_b, _) = subscribe(&addr_b, "chat");
    warm_up(&mut pub_a, &mut readers);
    warm_up(&mut pub_b, &mut readers);
    const EACH: usize = 500;
    let burst = |tag: &str| -> Vec<u8> {
        (0..EACH).flat_map(|i| text(format!("{tag}{i}").as_bytes())).collect()
    };
    pub_a.write_all(&burst("a")).unwrap();
    pub_b.write_all(&burst("b")).unwrap();
    for (n, (reader, inbox)) in readers.iter_mut().enumerate() {
        let (mut next_a, mut next_b) = (0, 0);
        while next_a < EACH || next_b < EACH {
            let f = inbox
                .frame(reader)
                .unwrap()
                .unwrap_or_else(|| panic!("reader {n}: the stream ended at a{next_a} b{next_b}"));
            let got = String::from_utf8(f.payload).unwrap();
            if got == "warm" {
                continue;
            }
            let (tag, i) = got.split_at(1);
            let i: usize = i.parse().unwrap();
            let next = if tag == "a" { &mut next_a } else { &mut next_b };
            assert_eq!(i, *next, "reader {n}: {got} out of order, twice or after a loss");
            *next += 1;
        }
    }
    // A POST on node B reaches the subscribers of both nodes, once.
    let mut post = TcpStream::connect(&addr_b).unwrap();
    post.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    post.write_all(
        b"POST /topic/chat HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 4\r\nConnection: close\r\n\r\npost",
    )
    .unwrap();
    let mut answer = String::new();
    let _ = post.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    for (n, (reader, inbox)) in readers.iter_mut().enumerate() {
        let f = loop {
            let f = inbox.frame(reader).unwrap().expect("the POST's publication");
            if f.payload != b"warm" {
                break f;
            }
        };
        assert_eq!((f.opcode, f.payload.as_slice()), (0x1, &b"post"[..]), "reader {n}");
    }
    // Each node skipped its own publications coming back from Redis.
    assert!(metric(&addr_b, "freeboard_backplane_received_total") >= EACH as u64);
}

#[test]
fn redis_restarted_during_a_stream_loses_counted_messages_and_delivery_resumes() {
    let port = free_port();
    let Some(redis_process) = redis(port) else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let mut redis_process = Some(redis_process);
    let (_a, addr_a) = node(port);
    let (_b, addr_b) = node(port);
    let mut readers = vec![subscribe(&addr_b, "ticks")];
    let (mut publisher, _) = subscribe(&addr_a, "ticks");
    warm_up(&mut publisher, &mut readers);
    let (mut reader, mut inbox) = readers.pop().unwrap();

    // A stream from node A: one publication every 2 ms, until told to stop.
    let sent = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let streamer = {
        let (sent, stop) = (sent.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Acquire) && i < 50_000 {
                publisher.write_all(&text(format!("t{i}").as_bytes())).unwrap();
                i += 1;
                sent.store(i, Ordering::Release);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let mut last: Option<usize> = None;
    let mut next_frame = |inbox: &mut Inbox, reader: &mut TcpStream| -> usize {
        loop {
            let f = inbox.frame(reader).unwrap().expect("node B's subscriber stays connected");
            let got = String::from_utf8(f.payload).unwrap();
            if got == "warm" {
                continue;
            }
            let i: usize = got[1..].parse().unwrap();
            if let Some(before) = last {
                assert!(i > before, "t{i} after t{before}: twice or out of order");
            }
            last = Some(i);
            return i;
        }
    };
    while next_frame(&mut inbox, &mut reader) < 100 {}
    // Kill Redis mid-stream, by PID, and start it again on the same port.
    drop(redis_process.take());
    let killed_at = sent.load(Ordering::Acquire);
    while sent.load(Ordering::Acquire) < killed_at + 100 {
        std::thread::sleep(Duration::from_millis(10));
    }
    redis_process = redis(port);
    assert!(redis_process.is_some());
    let restarted_at = sent.load(Ordering::Acquire);
    // Delivery resumes once both nodes have reconnected and B has subscribed again.
    let mut after_restart = 0;
    while after_restart < 50 {
        if next_frame(&mut inbox, &mut reader) > restarted_at {
            after_restart += 1;
        }
    }
    stop.store(true, Ordering::Release);
    streamer.join().unwrap();
    let lost = metric(&addr_a, "freeboard_backplane_lost_total");
    assert!(lost > 0, "the publications sent while Redis was down are counted");
    eprintln!(
        "sent {} publications, Redis killed after {killed_at} and restarted after {restarted_at}: \
         {lost} counted lost on node A",
        sent.load(Ordering::Acquire)
    );
    drop(redis_process);
}

/// A frame's payload as `(offset, message)`, split at the history envelope's colon.
fn enveloped(payload: &[u8]) -> (String, String) {
    let text = String::from_utf8(payload.to_vec()).unwrap();
    let (offset, message) = text.split_once(':').unwrap_or_else(|| panic!("no offset: {text}"));
    (offset.to_owned(), message.to_owned())
}

/// Reads until `message` arrives; its offset.
fn read_until(reader: &mut TcpStream, inbox: &mut Inbox, message: &str) -> String {
    loop {
        let f = inbox.frame(reader).unwrap().unwrap_or_else(|| panic!("ended before {message}"));
        let (offset, got) = enveloped(&f.payload);
        if got == message {
            return offset;
        }
    }
}

#[test]
fn history_in_redis_streams_recovers_a_reconnect_on_any_node_or_says_it_is_gone() {
    let port = free_port();
    let Some(_redis) = redis(port) else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let (_a, addr_a) = node_with(port, &["--history", "150", "--history-prefix", "feed"]);
    let (_b, addr_b) = node_with(port, &["--history", "150", "--history-prefix", "feed"]);
    // The publisher on B gets its own publications through Redis, with their offsets:
    // reading them back tells when Redis has kept them all.
    let (mut publisher, mut own) = subscribe(&addr_b, "feed");
    let (mut reader, mut inbox) = subscribe(&addr_a, "feed");
    // Until A's subscription reached Redis.
    reader.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    'warm: loop {
        assert!(Instant::now() < until, "node A never subscribed in Redis");
        publisher.write_all(&text(b"warm")).unwrap();
        if let Ok(Some(_)) = inbox.frame(&mut reader) {
            break 'warm;
        }
    }
    reader.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    publisher.write_all(&text(b"m0")).unwrap();
    let since = read_until(&mut reader, &mut inbox, "m0");
    read_until(&mut publisher, &mut own, "m0");
    drop(reader);

    // Away while 100 are published; back with since, on either node (A has no subscriber
    // left, so it subscribes again for the fetch): all 100, in order, then live.
    let burst: Vec<u8> = (1..101).flat_map(|i| text(format!("m{i}").as_bytes())).collect();
    publisher.write_all(&burst).unwrap();
    read_until(&mut publisher, &mut own, "m100");
    for (n, addr) in [&addr_a, &addr_b].into_iter().enumerate() {
        let (mut back, mut inbox) = subscribe(addr, &format!("feed?since={since}"));
        for i in 1..101 {
            let f = inbox.frame(&mut back).unwrap().unwrap_or_else(|| panic!("ended at m{i}"));
            assert_eq!(
                enveloped(&f.payload).1,
                format!("m{i}"),
                "node {n}: lost, twice or out of order"
            );
        }
        // What followed (the first pass's live message, for the second), then live.
        for earlier in 0..n {
            let f = inbox.frame(&mut back).unwrap().expect("a later message");
            assert_eq!(enveloped(&f.payload).1, format!("live{earlier}"), "node {n}");
        }
        let live = format!("live{n}");
        publisher.write_all(&text(live.as_bytes())).unwrap();
        let f = inbox.frame(&mut back).unwrap().expect("the live stream after the replay");
        assert_eq!(enveloped(&f.payload).1, live, "node {n}");
    }

    // 200 more: the stream (150) no longer holds what followed m0.
    let burst: Vec<u8> = (101..301).flat_map(|i| text(format!("m{i}").as_bytes())).collect();
    publisher.write_all(&burst).unwrap();
    read_until(&mut publisher, &mut own, "m300");
    for addr in [&addr_a, &addr_b] {
        for since in [since.as_str(), "1-1", "99999999999999-0"] {
            let (mut late, mut inbox) = subscribe(addr, &format!("feed?since={since}"));
            let close = inbox.frame(&mut late).unwrap().expect("a close frame");
            assert_eq!((close.opcode, close.close_code()), (0x8, 4410), "since={since}");
        }
    }
}
