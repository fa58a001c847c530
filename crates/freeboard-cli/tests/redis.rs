//! Topics across two `freeboard serve` nodes on a real `redis-server` (Debian's package, with
//! `redis-cli`; `scripts/test` installs it). Each test starts its own Redis (or a 3-master
//! Redis Cluster) on free loopback ports with `--save '' --appendonly no` and stops it by
//! PID. Skipped, with a message, when `redis-server` is not on the PATH.

mod common;

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Process, Serve, text};
use freeboard_test::Inbox;

/// `redis-server` on `port`, ready for connections; `None` if it is not installed.
fn redis(port: u16) -> Option<Process> {
    common::redis_server(port)
}

/// A `freeboard serve` node on the Redis at `port`, and its address.
fn node(port: u16) -> (Serve, String) {
    node_with(port, &[])
}

/// [`node`] with more arguments.
fn node_with(port: u16, extra: &[&str]) -> (Serve, String) {
    node_on(&format!("redis://127.0.0.1:{port}/"), extra)
}

/// A `freeboard serve` node on the Redis at `url` (seeds of a cluster when several).
fn node_on(url: &str, extra: &[&str]) -> (Serve, String) {
    let serve = Serve::start(&[&["--client-publish", "--redis", url][..], extra].concat());
    let addr = serve.addr.clone();
    (serve, addr)
}

/// A WebSocket on `/topic/{topic}`, its 101 read.
fn subscribe(addr: &str, topic: &str) -> (TcpStream, Inbox) {
    common::subscribe(addr, &format!("/topic/{topic}"))
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

/// A node's publications lost on their way to Redis, by reason.
fn losses(addr: &str) -> String {
    let lost = |r: &str| metric(addr, &format!("freeboard_backplane_lost_total{{reason=\"{r}\"}}"));
    let reasons = ["redis_down", "unconfirmed", "refused", "queue_full"];
    reasons.map(|r| format!("{r} {}", lost(r))).join(", ")
}

/// A counter's value in a node's `/metrics` (0 if absent).
fn metric(addr: &str, name: &str) -> u64 {
    std::thread::sleep(freeboard::metrics::ADMIN_REFRESH); // a build after the change
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
    let port = common::free_port();
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
    // The answer counts the message queued towards Redis for the other node, and says that
    // Redis was connected (so 200).
    assert!(
        answer.contains("\"redis_queued\":1,\"redis_lost\":0,\"redis_connected\":true,"),
        "{answer}"
    );
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
    let port = common::free_port();
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
            publisher // still node A's subscriber to the topic
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
    let _publisher = streamer.join().unwrap();
    let lost = metric(&addr_a, "freeboard_backplane_lost_total");
    assert!(lost > 0, "the publications sent while Redis was down are counted");
    eprintln!(
        "sent {} publications, Redis killed after {killed_at} and restarted after {restarted_at}: \
         {lost} counted lost on node A ({})",
        sent.load(Ordering::Acquire),
        losses(&addr_a)
    );
    drop(redis_process);
}

/// A frame's payload as `(offset, message)`, split at the history envelope's colon.
fn enveloped(payload: &[u8]) -> (String, String) {
    let text = String::from_utf8(payload.to_vec()).unwrap();
    let (offset, message) = text.split_once(':').unwrap_or_else(|| panic!("no offset: {text}"));
    (offset.to_owned(), message.to_owned())
}

/// Publishes "warm" to a history topic until the reader on another node and the publisher
/// itself (a history topic's publications come back through Redis, with their offsets) have
/// seen one: both nodes' subscriptions have reached Redis.
fn warm_up_history(
    publisher: &mut TcpStream,
    own: &mut Inbox,
    reader: &mut TcpStream,
    inbox: &mut Inbox,
) {
    let mut writer = publisher.try_clone().unwrap();
    for (conn, inbox) in [(reader, inbox), (publisher, own)] {
        conn.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while !matches!(inbox.frame(conn), Ok(Some(_))) {
            assert!(Instant::now() < until, "a node never subscribed in Redis");
            writer.write_all(&text(b"warm")).unwrap();
        }
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
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
    let port = common::free_port();
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
    warm_up_history(&mut publisher, &mut own, &mut reader, &mut inbox);
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

    // Offsets this stream did not issue: of another epoch (the same position), in the
    // future, the epoch-less form of older versions, truncated.
    let (epoch, position) = since.split_once('.').expect("EPOCH.MS-SEQ");
    let (ms, _) = position.split_once('-').unwrap();
    let other = format!("{:x}.{position}", u64::from_str_radix(epoch, 16).unwrap() ^ 1);
    let future = format!("{epoch}.{}-0", ms.parse::<u64>().unwrap() + 3_600_000);
    let truncated = &since[..=since.rfind('-').unwrap()];
    for addr in [&addr_a, &addr_b] {
        for since in [&other, &future, position, truncated, &format!("{epoch}.")] {
            let (mut late, mut inbox) = subscribe(addr, &format!("feed?since={since}"));
            let close = inbox.frame(&mut late).unwrap().expect("a close frame");
            assert_eq!((close.opcode, close.close_code()), (0x8, 4410), "since={since}");
        }
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

/// A Redis Cluster of three masters on free loopback ports (no replicas; a master may be
/// down while the others serve: `cluster-require-full-coverage no`).
struct Cluster {
    dir: std::path::PathBuf,
    /// (client port, bus port, the server).
    nodes: Vec<(u16, u16, Option<Process>)>,
}

impl Cluster {
    fn start() -> Option<Self> {
        let dir = std::env::temp_dir().join(format!(
            "freeboard-cluster-{}-{}",
            std::process::id(),
            common::free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cluster = Cluster { dir, nodes: Vec::new() };
        for _ in 0..3 {
            let (port, bus) = (common::free_port(), common::free_port());
            cluster.nodes.push((port, bus, None));
            cluster.nodes.last_mut().unwrap().2 = Some(cluster.server(cluster.nodes.len() - 1)?);
        }
        let addrs: Vec<String> =
            cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.0)).collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(created.success(), "redis-cli --cluster create failed");
        for i in 0..3 {
            cluster.wait_ok(i);
        }
        Some(cluster)
    }

    /// Node `i`'s `redis-server`, listening (its cluster state kept in `dir`).
    fn server(&self, i: usize) -> Option<Process> {
        let (port, bus, _) = self.nodes[i];
        let (bus, config) = (bus.to_string(), format!("nodes-{port}.conf"));
        let cluster = [
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            &bus,
            "--cluster-config-file",
            &config,
            "--cluster-node-timeout",
            "1000",
            "--cluster-require-full-coverage",
            "no",
            "--dir",
        ];
        let args = cluster.map(OsStr::new).into_iter().chain([self.dir.as_os_str()]);
        common::redis_server_with(port, args)
    }

    /// Waits until node `i` says the cluster is ok.
    fn wait_ok(&self, i: usize) {
        let until = Instant::now() + Duration::from_secs(20);
        while !self.cli(i, &["CLUSTER", "INFO"]).contains("cluster_state:ok") {
            assert!(Instant::now() < until, "the cluster never became ok on node {i}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis-cli` on node `i`: its output.
    fn cli(&self, i: usize, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.nodes[i].0.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The node whose slots hold `key`.
    fn owner(&self, key: &str) -> usize {
        let slot: u16 = self.cli(0, &["CLUSTER", "KEYSLOT", key]).trim().parse().unwrap();
        (0..3)
            .find(|&i| {
                let nodes = self.cli(i, &["CLUSTER", "NODES"]);
                let me = nodes.lines().find(|l| l.contains("myself")).unwrap_or_default();
                me.split(' ').skip(8).any(|range| {
                    let (a, b) = range.split_once('-').unwrap_or((range, range));
                    matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
                })
            })
            .unwrap_or_else(|| panic!("no node owns slot {slot}"))
    }

    /// Moves the (keyless) slot of `channel` from node `from` to node `to`.
    fn move_slot(&self, channel: &str, from: usize, to: usize) {
        let slot = self.cli(0, &["CLUSTER", "KEYSLOT", channel]).trim().to_owned();
        let id = |i: usize| self.cli(i, &["CLUSTER", "MYID"]).trim().to_owned();
        let (from_id, to_id) = (id(from), id(to));
        self.cli(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
        self.cli(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
        for i in [to, from, 3 - to - from] {
            self.cli(i, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        }
    }

    /// How many connections of node `i` subscribe to `channel`: (sharded, plain).
    fn subscribers(&self, i: usize, channel: &str) -> (u32, u32) {
        let count =
            |reply: String| reply.lines().nth(1).and_then(|l| l.trim().parse().ok()).unwrap_or(0);
        (
            count(self.cli(i, &["PUBSUB", "SHARDNUMSUB", channel])),
            count(self.cli(i, &["PUBSUB", "NUMSUB", channel])),
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear(); // every server killed by PID
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reads `reader` until `want` (payloads, in this order, each once) has arrived, skipping
/// "warm"; fails on anything else from the same publisher (tag before the first '-').
fn expect_in_order(reader: &mut TcpStream, inbox: &mut Inbox, want: &[String], who: &str) {
    let mut next: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut by_tag: std::collections::HashMap<String, Vec<&String>> =
        std::collections::HashMap::new();
    for w in want {
        by_tag.entry(w.split('-').next().unwrap().to_owned()).or_default().push(w);
    }
    let mut left = want.len();
    while left > 0 {
        let f =
            inbox.frame(reader).unwrap().unwrap_or_else(|| panic!("{who}: ended, {left} missing"));
        let got = String::from_utf8(f.payload).unwrap();
        if got == "warm" {
            continue;
        }
        let tag = got.split('-').next().unwrap().to_owned();
        let i = next.entry(tag.clone()).or_default();
        let expected = by_tag.get(&tag).and_then(|w| w.get(*i)).map(|s| s.as_str());
        assert_eq!(Some(got.as_str()), expected, "{who}: out of order, twice or after a loss");
        *i += 1;
        left -= 1;
    }
}

/// Sends `body` to `/topic/{topic}` by HTTP POST; the answer's status line.
fn post(addr: &str, topic: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!(
        "POST /topic/{topic} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn a_redis_cluster_carries_topics_on_sharded_pub_sub_and_survives_a_master_restart() {
    if Command::new("redis-server").arg("--version").output().is_err() {
        eprintln!("redis-server is not installed: skipped");
        return;
    }
    let Some(mut cluster) = Cluster::start() else { return };
    // Two topics on each master.
    let mut topics: Vec<(String, usize)> = Vec::new();
    for i in 0.. {
        let topic = format!("s{i}");
        let owner = cluster.owner(&format!("freeboard:{topic}"));
        if topics.iter().filter(|(_, o)| *o == owner).count() < 2 {
            topics.push((topic, owner));
        }
        if topics.len() == 6 {
            break;
        }
    }
    let seed = |i: usize| format!("redis://127.0.0.1:{}/", cluster.nodes[i].0);
    let (_a, addr_a) = node_on(&seed(0), &[]);
    // Node B is given two seeds.
    let (_b, addr_b) = node_on(&format!("{},{}", seed(1), seed(2)), &[]);
    // On each topic: a reader on each node, a publisher on each node.
    let mut readers = Vec::new();
    let mut publishers = Vec::new();
    for (topic, _) in &topics {
        let mut pair = vec![subscribe(&addr_a, topic), subscribe(&addr_b, topic)];
        let (mut pub_a, _) = subscribe(&addr_a, topic);
        let (mut pub_b, _) = subscribe(&addr_b, topic);
        warm_up(&mut pub_a, &mut pair);
        warm_up(&mut pub_b, &mut pair);
        readers.push(pair);
        publishers.push((pub_a, pub_b));
    }
    // Each node subscribed once per topic, sharded, on the master that owns it, and nowhere
    // with plain SUBSCRIBE.
    for (topic, owner) in &topics {
        let channel = format!("freeboard:{topic}");
        for i in 0..3 {
            let expected = if i == *owner { 2 } else { 0 };
            assert_eq!(cluster.subscribers(i, &channel), (expected, 0), "{channel} on master {i}");
        }
    }
    const EACH: usize = 200;
    let burst = |tag: &str| -> Vec<String> { (0..EACH).map(|i| format!("{tag}-{i}")).collect() };
    for ((topic, _), (pub_a, pub_b)) in topics.iter().zip(&mut publishers) {
        let frames =
            |tag: &str| burst(tag).iter().flat_map(|m| text(m.as_bytes())).collect::<Vec<u8>>();
        pub_a.write_all(&frames(&format!("a{topic}"))).unwrap();
        pub_b.write_all(&frames(&format!("b{topic}"))).unwrap();
    }
    for ((topic, _), pair) in topics.iter().zip(&mut readers) {
        assert!(post(&addr_a, topic, &format!("pa{topic}-0")).starts_with("HTTP/1.1 200"));
        assert!(post(&addr_b, topic, &format!("pb{topic}-0")).starts_with("HTTP/1.1 200"));
        let mut want = burst(&format!("a{topic}"));
        want.extend(burst(&format!("b{topic}")));
        want.extend([format!("pa{topic}-0"), format!("pb{topic}-0")]);
        for (n, (reader, inbox)) in pair.iter_mut().enumerate() {
            expect_in_order(reader, inbox, &want, &format!("{topic}, reader on node {n}"));
        }
    }

    // A topic's slot moves to another master: both nodes follow it (the old master drops
    // their subscriptions, the new one has them), and publications go where it now is.
    let (moved, from) = topics[2].clone();
    let to = (from + 1) % 3;
    let channel = format!("freeboard:{moved}");
    cluster.move_slot(&channel, from, to);
    topics[2].1 = to;
    let until = Instant::now() + Duration::from_secs(10);
    while cluster.subscribers(to, &channel) != (2, 0)
        || cluster.subscribers(from, &channel) != (0, 0)
    {
        assert!(Instant::now() < until, "{channel}: the subscriptions never followed the slot");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (pub_a, pub_b) = &mut publishers[2];
    let frames =
        |tag: &str| burst(tag).iter().flat_map(|m| text(m.as_bytes())).collect::<Vec<u8>>();
    pub_a.write_all(&frames(&format!("ma{moved}"))).unwrap();
    pub_b.write_all(&frames(&format!("mb{moved}"))).unwrap();
    let mut want = burst(&format!("ma{moved}"));
    want.extend(burst(&format!("mb{moved}")));
    for (n, (reader, inbox)) in readers[2].iter_mut().enumerate() {
        expect_in_order(
            reader,
            inbox,
            &want,
            &format!("{moved} after its slot moved, reader on node {n}"),
        );
    }

    // Another slot moves while only node B subscribes to its topic: node A's map is stale,
    // so its publication is redirected (`MOVED`) and sent once more, to the new master.
    let solo = (0..)
        .map(|i| format!("solo{i}"))
        .find(|t| cluster.owner(&format!("freeboard:{t}")) == to)
        .unwrap();
    let channel = format!("freeboard:{solo}");
    let (mut reader, mut inbox) = subscribe(&addr_b, &solo);
    reader.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !matches!(inbox.frame(&mut reader), Ok(Some(_))) {
        assert!(Instant::now() < until, "{solo}: node B never subscribed");
        post(&addr_a, &solo, "warm");
    }
    reader.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    cluster.move_slot(&channel, to, from);
    let until = Instant::now() + Duration::from_secs(10);
    while cluster.subscribers(from, &channel) != (1, 0) {
        assert!(Instant::now() < until, "{channel}: node B's subscription never followed the slot");
        std::thread::sleep(Duration::from_millis(20));
    }
    let refused = metric(&addr_a, "freeboard_backplane_lost_total{reason=\"refused\"}");
    for i in 0..20 {
        assert!(post(&addr_a, &solo, &format!("solo-{i}")).starts_with("HTTP/1.1 200"));
    }
    let want: Vec<String> = (0..20).map(|i| format!("solo-{i}")).collect();
    expect_in_order(&mut reader, &mut inbox, &want, "a topic whose slot moved under node A");
    assert_eq!(metric(&addr_a, "freeboard_backplane_lost_total{reason=\"refused\"}"), refused);
    // And a slot moved before node A subscribes to its topic: the stale map sends the
    // subscription to the old master, which answers `MOVED`; node A maps again and subscribes
    // on the new one, and node B's publications (its map stale too) reach it.
    let late = (0..)
        .map(|i| format!("late{i}"))
        .find(|t| cluster.owner(&format!("freeboard:{t}")) == to)
        .unwrap();
    let channel = format!("freeboard:{late}");
    cluster.move_slot(&channel, to, from);
    let (mut reader, mut inbox) = subscribe(&addr_a, &late);
    let until = Instant::now() + Duration::from_secs(10);
    while cluster.subscribers(from, &channel) != (1, 0) {
        assert!(Instant::now() < until, "{channel}: node A never subscribed on the new master");
        std::thread::sleep(Duration::from_millis(20));
    }
    for i in 0..20 {
        assert!(post(&addr_b, &late, &format!("late-{i}")).starts_with("HTTP/1.1 200"));
    }
    let want: Vec<String> = (0..20).map(|i| format!("late-{i}")).collect();
    expect_in_order(&mut reader, &mut inbox, &want, "a topic subscribed on a stale map");

    // History on the cluster: the stream and the SPUBLISH in the script share a slot.
    let history = ["--history", "50", "--history-prefix", "h"];
    let (_ha, addr_ha) = node_on(&seed(0), &history);
    let (_hb, addr_hb) = node_on(&seed(1), &history);
    for topic in ["h1", "h2", "h3"] {
        let (mut publisher, mut own) = subscribe(&addr_hb, topic);
        let (mut reader, mut inbox) = subscribe(&addr_ha, topic);
        warm_up_history(&mut publisher, &mut own, &mut reader, &mut inbox);
        publisher.write_all(&text(b"m0")).unwrap();
        let since = read_until(&mut reader, &mut inbox, "m0");
        drop(reader);
        let frames: Vec<u8> = (1..21).flat_map(|i| text(format!("m{i}").as_bytes())).collect();
        publisher.write_all(&frames).unwrap();
        read_until(&mut publisher, &mut own, "m20");
        let (mut back, mut inbox) = subscribe(&addr_ha, &format!("{topic}?since={since}"));
        for i in 1..21 {
            let f =
                inbox.frame(&mut back).unwrap().unwrap_or_else(|| panic!("{topic}: ended at m{i}"));
            assert_eq!(enveloped(&f.payload).1, format!("m{i}"), "{topic}: recovered out of order");
        }
    }

    // A master restarted during a stream on one of its topics: counted losses, then delivery
    // resumes (in order, nothing twice) once node B has subscribed again.
    let (topic, owner) = topics[0].clone();
    let (mut publisher, _) = publishers.remove(0);
    let (mut reader, mut inbox) = readers.remove(0).pop().unwrap(); // on node B
    let sent = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let streamer = {
        let (sent, stop) = (sent.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Acquire) && i < 20_000 {
                publisher.write_all(&text(format!("t{i}").as_bytes())).unwrap();
                i += 1;
                sent.store(i, Ordering::Release);
                std::thread::sleep(Duration::from_millis(2));
            }
            publisher // still node A's subscriber to the topic
        })
    };
    let mut last: Option<usize> = None;
    let mut next_frame = |inbox: &mut Inbox, reader: &mut TcpStream| -> usize {
        loop {
            let f = inbox.frame(reader).unwrap().expect("node B's subscriber stays connected");
            let got = String::from_utf8(f.payload).unwrap();
            let Some(i) = got.strip_prefix('t').and_then(|i| i.parse::<usize>().ok()) else {
                continue;
            };
            if let Some(before) = last {
                assert!(i > before, "t{i} after t{before}: twice or out of order");
            }
            last = Some(i);
            return i;
        }
    };
    reader.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    while next_frame(&mut inbox, &mut reader) < 50 {}
    cluster.nodes[owner].2 = None; // killed by PID
    let killed_at = sent.load(Ordering::Acquire);
    // The other masters' topics go on meanwhile.
    let (other, pair) =
        topics[1..].iter().zip(&mut readers).find(|((_, o), _)| *o != owner).unwrap();
    assert!(post(&addr_a, &other.0, "during-0").starts_with("HTTP/1.1 200"));
    let (other_reader, other_inbox) = &mut pair[1];
    expect_in_order(other_reader, other_inbox, &["during-0".into()], "another master's topic");
    while sent.load(Ordering::Acquire) < killed_at + 100 {
        std::thread::sleep(Duration::from_millis(10));
    }
    cluster.nodes[owner].2 = cluster.server(owner);
    let restarted_at = sent.load(Ordering::Acquire);
    let mut after_restart = 0;
    while after_restart < 50 {
        if next_frame(&mut inbox, &mut reader) > restarted_at {
            after_restart += 1;
        }
    }
    stop.store(true, Ordering::Release);
    let _publisher = streamer.join().unwrap();
    let lost = metric(&addr_a, "freeboard_backplane_lost_total");
    assert!(lost > 0, "the publications sent while {topic}'s master was down are counted");
    let channel = format!("freeboard:{topic}");
    // Node A subscribes again too (its shard thread's backoff may run a little longer).
    let until = Instant::now() + Duration::from_secs(10);
    while cluster.subscribers(owner, &channel) != (2, 0) {
        assert!(Instant::now() < until, "{channel}: both nodes never subscribed again");
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "{topic}: master {owner} killed after {killed_at} and restarted after {restarted_at} \
         publications: {lost} counted lost on node A ({})",
        losses(&addr_a)
    );
}

/// `redis-cli -p port ARGS…`, its output.
fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli").arg("-p").arg(port.to_string()).args(args).output();
    String::from_utf8_lossy(&out.expect("redis-cli").stdout).into_owned()
}

/// Publishes by POST until the answer's status line starts with `status` (Redis or a node's
/// connection to it coming and going); how many were tried.
fn post_until(addr: &str, topic: &str, body: &str, status: &str) -> usize {
    let until = Instant::now() + Duration::from_secs(20);
    for tried in 1.. {
        if post(addr, topic, body).starts_with(status) {
            return tried;
        }
        assert!(Instant::now() < until, "POST /topic/{topic} never answered {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
    unreachable!()
}

#[test]
fn a_history_topic_lost_by_redis_gets_a_new_epoch_and_its_subscribers_are_told() {
    let port = common::free_port();
    let Some(redis_process) = redis(port) else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let history = ["--history", "100", "--history-prefix", "feed"];
    let (_a, addr_a) = node_with(port, &history);
    let (_b, addr_b) = node_with(port, &history);
    let (mut publisher, mut own) = subscribe(&addr_b, "feed");
    let (mut reader, mut inbox) = subscribe(&addr_a, "feed");
    warm_up_history(&mut publisher, &mut own, &mut reader, &mut inbox);
    // The epoch lies beside the stream, in its slot: `{freeboard:feed}:epoch`.
    let stored = redis_cli(port, &["GET", "{freeboard:feed}:epoch"]);
    assert_eq!(
        redis_cli(port, &["CLUSTER", "KEYSLOT", "{freeboard:feed}:epoch"]),
        redis_cli(port, &["CLUSTER", "KEYSLOT", "freeboard:feed"])
    );
    publisher.write_all(&text(b"m0")).unwrap();
    let since = read_until(&mut reader, &mut inbox, "m0");
    assert_eq!(since.split_once('.').unwrap().0, stored.trim(), "the offset names the epoch");

    // Redis goes away: a history topic's publication is refused (503), not accepted to be
    // lost; a client publishing on it is told to try again later (1013).
    drop(redis_process);
    // (Once each node has found its connection gone: within its idle check, 200 ms.)
    post_until(&addr_a, "feed", "while-down", "HTTP/1.1 503");
    post_until(&addr_b, "feed", "while-down", "HTTP/1.1 503");
    publisher.write_all(&text(b"while-down")).unwrap();
    let close = loop {
        let f = own.frame(&mut publisher).unwrap().expect("a close frame");
        if f.opcode == 0x8 {
            break f;
        }
    };
    assert_eq!(close.close_code(), 1013);

    // It comes back without its data: the stream and its epoch are gone. The subscriber that
    // stayed connected is told (4410) as soon as its node has subscribed again, before any
    // message of the new history could reach it.
    let _redis = redis(port).expect("redis-server again");
    let close = inbox.frame(&mut reader).unwrap().expect("a close frame");
    assert_eq!((close.opcode, close.close_code()), (0x8, 4410));
    let (mut fresh, mut inbox) = subscribe(&addr_a, "feed");
    post_until(&addr_b, "feed", "n0", "HTTP/1.1 200");
    let f = inbox.frame(&mut fresh).unwrap().expect("the new history's first message");
    let (offset, message) = enveloped(&f.payload);
    assert_eq!(message, "n0");
    assert_ne!(offset.split_once('.').unwrap().0, since.split_once('.').unwrap().0, "a new epoch");
    // The old offset cannot resume, on either node.
    for addr in [&addr_a, &addr_b] {
        let (mut late, mut inbox) = subscribe(addr, &format!("feed?since={since}"));
        let close = inbox.frame(&mut late).unwrap().expect("a close frame");
        assert_eq!((close.opcode, close.close_code()), (0x8, 4410), "the old epoch");
    }
    // The stream recreated by hand (deleted, then published to): another epoch again.
    redis_cli(port, &["DEL", "freeboard:feed"]);
    post_until(&addr_b, "feed", "n1", "HTTP/1.1 200");
    let close = loop {
        let f = inbox.frame(&mut fresh).unwrap().expect("a close frame");
        if f.opcode == 0x8 {
            break f;
        }
    };
    assert_eq!(close.close_code(), 4410, "a subscriber meets no new epoch without being told");
}

#[test]
fn resubscriptions_catch_up_history_topics_and_count_the_gaps_of_others() {
    let port = common::free_port();
    let Some(_redis) = redis(port) else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let history = ["--history", "5000", "--history-prefix", "h:"];
    let (_a, addr_a) = node_with(port, &history);
    let (_b, addr_b) = node_with(port, &history);
    let (mut publisher, mut own) = subscribe(&addr_b, "h:feed");
    let (mut kept_reader, mut kept_inbox) = subscribe(&addr_a, "h:feed");
    warm_up_history(&mut publisher, &mut own, &mut kept_reader, &mut kept_inbox);
    // The plain topic warmed up one message at a time, so none is in flight afterwards.
    let (mut plain_publisher, _) = subscribe(&addr_b, "plain");
    let (mut plain_reader, mut plain_inbox) = subscribe(&addr_a, "plain");
    plain_reader.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !matches!(plain_inbox.frame(&mut plain_reader), Ok(Some(_))) {
        assert!(Instant::now() < until, "node A never subscribed to the plain topic");
        plain_publisher.write_all(&text(b"warm")).unwrap();
    }
    plain_reader.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(metric(&addr_a, "freeboard_backplane_lost_total{reason=\"gap\"}"), 0);

    // Both nodes' subscriptions are cut six times while 2,000 publications go to each topic.
    const N: usize = 2000;
    let cutter = std::thread::spawn(move || {
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(250));
            redis_cli(port, &["CLIENT", "KILL", "TYPE", "pubsub"]);
        }
    });
    for i in 0..N {
        publisher.write_all(&text(format!("h{i}").as_bytes())).unwrap();
        plain_publisher.write_all(&text(format!("p{i}").as_bytes())).unwrap();
        std::thread::sleep(Duration::from_micros(800));
    }
    cutter.join().unwrap();

    // The history topic: every one, once, in order, on the other node as on the publisher's.
    let want: Vec<String> = (0..N).map(|i| format!("h{i}")).collect();
    for (who, (reader, inbox)) in
        [("node A", (&mut kept_reader, &mut kept_inbox)), ("node B", (&mut publisher, &mut own))]
    {
        let mut next = 0;
        while next < N {
            let f = inbox.frame(reader).unwrap().unwrap_or_else(|| panic!("{who}: ended"));
            assert_eq!(f.opcode, 0x1, "{who}: closed at {next} ({:?})", f.close_code());
            let (_, message) = enveloped(&f.payload);
            if message == "warm" {
                continue;
            }
            assert_eq!(message, want[next], "{who}: lost, twice or out of order");
            next += 1;
        }
    }

    // The plain topic: at most once, and every publication that did not arrive is counted.
    let mut received = 0;
    let mut last = None;
    let mut ends = 0;
    plain_reader.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    loop {
        match plain_inbox.frame(&mut plain_reader) {
            Ok(Some(f)) => {
                let got = String::from_utf8(f.payload).unwrap();
                if got == "end" {
                    received += 1;
                    break;
                }
                if let Some(i) = got.strip_prefix('p').and_then(|i| i.parse::<usize>().ok()) {
                    assert!(last.is_none_or(|l| i > l), "p{i} after p{last:?}");
                    last = Some(i);
                    received += 1;
                }
            }
            // Sent until one arrives: the gap before it is counted when it does.
            _ => {
                plain_publisher.write_all(&text(b"end")).unwrap();
                ends += 1;
            }
        }
    }
    let missing = (N + ends - received) as u64;
    let gaps = metric(&addr_a, "freeboard_backplane_lost_total{reason=\"gap\"}");
    eprintln!(
        "6 cuts: the history topic delivered all {N} on both nodes; the plain topic lost \
         {missing} of {} on node A, counted {gaps}",
        N + ends
    );
    assert!(missing > 0, "the cuts opened no window");
    assert_eq!(gaps, missing, "the gap counter equals what is missing");
}

/// `redis-server` on `port` as a replica of the master on `master`, once its link is up.
fn replica(port: u16, master: u16) -> Process {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
        .args(["--appendonly", "no", "--replicaof", "127.0.0.1", &master.to_string()])
        // The master's snapshot loaded from the socket, never written as a dump.rdb.
        .args(["--repl-diskless-load", "on-empty-db", "--repl-diskless-sync", "yes"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server");
    let process = Process(child);
    let until = Instant::now() + Duration::from_secs(10);
    while !redis_cli(port, &["INFO", "replication"]).contains("master_link_status:up") {
        assert!(Instant::now() < until, "the replica on {port} never linked to {master}");
        std::thread::sleep(Duration::from_millis(20));
    }
    process
}

/// A POST on a kept connection, timed: its status line and how long the answer took.
fn timed_post(s: &mut TcpStream, topic: &str, body: &str) -> (String, Duration) {
    let request = format!(
        "POST /topic/{topic} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let started = Instant::now();
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The answer is JSON with a Content-Length; it ends with a newline.
    while !answer.ends_with(b"}\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the connection closed");
        answer.extend_from_slice(&buf[..n]);
    }
    let took = started.elapsed();
    let answer = String::from_utf8(answer).unwrap();
    (answer.lines().next().unwrap_or_default().to_owned(), took)
}

/// `p`-th percentile of sorted `samples`, in µs.
fn percentile(samples: &[Duration], p: f64) -> u128 {
    let at = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[at].as_micros()
}

/// `--durability`: `redis` answers once Redis has the publication, `replica` once a replica
/// has it too (`WAIT 1`), `none` once queued; with the replica gone, `replica` answers 503
/// and `redis` 200. The latency of each, side by side in one run (POSTs interleaved, one kept
/// connection each): `FREEBOARD_DURABILITY_POSTS=5000 cargo test --release -p freeboard-cli
/// --test redis durable -- --nocapture` for the figures in docs/operating/history.md.
#[test]
fn durable_acknowledgements_wait_for_redis_or_a_replica_and_their_cost_is_measured() {
    let port = common::free_port();
    let Some(_master) = redis(port) else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let replica_port = common::free_port();
    let mut replica_process = Some(replica(replica_port, port));
    let modes = ["none", "redis", "replica"];
    let nodes: Vec<(Serve, String)> = modes
        .iter()
        .map(|m| {
            node_with(port, &["--history", "1000", "--history-prefix", "h:", "--durability", m])
        })
        .collect();
    let posts: usize = std::env::var("FREEBOARD_DURABILITY_POSTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let mut conns: Vec<TcpStream> = nodes
        .iter()
        .map(|(_, addr)| {
            post_until(addr, "h:t", "warm", "HTTP/1.1 200");
            let s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.set_nodelay(true).unwrap();
            s
        })
        .collect();
    let mut samples = vec![Vec::with_capacity(posts); modes.len()];
    for i in 0..posts {
        for (m, conn) in conns.iter_mut().enumerate() {
            let (status, took) = timed_post(conn, "h:t", &format!("{}-{i}", modes[m]));
            assert!(status.starts_with("HTTP/1.1 200"), "{}: {status}", modes[m]);
            samples[m].push(took);
        }
    }
    let mut table = String::new();
    for (m, samples) in samples.iter_mut().enumerate() {
        samples.sort_unstable();
        let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
        table.push_str(&format!("{:>8}: p50 {p50} µs, p99 {p99} µs\n", modes[m]));
    }
    eprintln!("POST latency on a history topic, {posts} each, interleaved:\n{table}");
    // Every acknowledged publication is in the stream, on the replica too.
    let on_replica = redis_cli(replica_port, &["XLEN", "freeboard:h:t"]);
    assert!(on_replica.trim().parse::<usize>().unwrap() >= 3 * posts.min(1000 / 3));

    // The replica goes away: `replica` can no longer vouch (503, after WAIT's timeout), the
    // others still answer 200.
    drop(replica_process.take());
    let until = Instant::now() + Duration::from_secs(10);
    while !redis_cli(port, &["INFO", "replication"]).contains("connected_slaves:0") {
        assert!(Instant::now() < until, "the master never saw its replica go");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, took) = timed_post(&mut conns[2], "h:t", "unreplicated");
    assert!(status.starts_with("HTTP/1.1 503"), "replica without a replica: {status}");
    assert!(took >= Duration::from_millis(900), "answered after WAIT's timeout: {took:?}");
    assert!(timed_post(&mut conns[1], "h:t", "kept").0.starts_with("HTTP/1.1 200"));
    assert!(timed_post(&mut conns[0], "h:t", "queued").0.starts_with("HTTP/1.1 200"));
}

/// A process's resident memory (`VmRSS`), in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// A reconnect storm: 10,000 subscribers of one history topic come back at once with the same
/// `since`. The node reads the stream once for all of them (single flight), admits them at
/// the pace its pending-upgrade limit allows (256 here; beyond, 503 with a jittered
/// `Retry-After` of 1 to 5 s, which they honour), and stays within its memory budget; every
/// one gets exactly what it missed. Sized by `FREEBOARD_STORM` (default 10,000; bounded,
/// loopback only).
#[test]
fn a_reconnect_storm_reads_history_once_and_is_admitted_at_a_pace() {
    let port = common::free_port();
    let Some(_redis) = redis(port) else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let storm: usize =
        std::env::var("FREEBOARD_STORM").ok().and_then(|n| n.parse().ok()).unwrap_or(10_000);
    const BUDGET: u64 = 256 << 20;
    let history = ["--history", "1000", "--history-prefix", "h:", "--memory", "256M"];
    let limits = ["--max-connections-per-ip", "20000", "--max-pending-upgrades", "256"];
    let (a, addr_a) = node_with(port, &[&history[..], &limits].concat());
    let (_b, addr_b) = node_with(port, &history);
    let (mut first, mut inbox) = subscribe(&addr_a, "h:storm");
    // Until node A's subscription has reached Redis.
    first.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !matches!(inbox.frame(&mut first), Ok(Some(_))) {
        assert!(Instant::now() < until, "node A never subscribed");
        post(&addr_b, "h:storm", "warm");
    }
    first.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert!(post(&addr_b, "h:storm", "m0").starts_with("HTTP/1.1 200"));
    let since = read_until(&mut first, &mut inbox, "m0");
    const MISSED: usize = 50;
    for i in 1..=MISSED {
        assert!(post(&addr_b, "h:storm", &format!("m{i}")).starts_with("HTTP/1.1 200"));
    }
    read_until(&mut first, &mut inbox, &format!("m{MISSED}"));
    let reads_before = metric(&addr_a, "freeboard_backplane_history_reads_total");

    // Each subscriber: when it is due, its connection, when it first tried.
    let started = Instant::now();
    let mut due: Vec<(Instant, usize)> = (0..storm).map(|i| (started, i)).collect();
    let mut resumed: Vec<TcpStream> = Vec::with_capacity(storm);
    let mut times = Vec::with_capacity(storm);
    let (mut refused, mut gone) = (0usize, 0usize);
    let request = freeboard_test::upgrade_request(&format!("/topic/h:storm?since={since}"), "");
    let until = started + Duration::from_secs(120);
    while !due.is_empty() {
        assert!(Instant::now() < until, "{} subscribers never resumed", due.len());
        due.sort_unstable();
        let now = Instant::now();
        let ready = due.partition_point(|(at, _)| *at <= now);
        if ready == 0 {
            std::thread::sleep(due[0].0 - now);
            continue;
        }
        // All that are due connect at once, then each is read.
        let wave: Vec<(usize, TcpStream)> = due
            .drain(..ready)
            .map(|(_, i)| {
                let mut s = TcpStream::connect(&addr_a).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                s.write_all(request.as_bytes()).unwrap();
                (i, s)
            })
            .collect();
        for (i, mut s) in wave {
            let mut inbox = Inbox::default();
            let head = inbox.head(&mut s).unwrap().expect("a response");
            if head.starts_with("HTTP/1.1 503") {
                let after: u64 = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Retry-After: "))
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or_else(|| panic!("a 503 without Retry-After: {head}"));
                assert!((1..=5).contains(&after), "{head}");
                refused += 1;
                due.push((Instant::now() + Duration::from_secs(after), i));
                continue;
            }
            assert!(head.starts_with("HTTP/1.1 101"), "{head}");
            for m in 1..=MISSED {
                let f = inbox.frame(&mut s).unwrap().expect("the replay");
                if f.opcode == 0x8 && f.close_code() == 4410 {
                    gone += 1;
                    break;
                }
                assert_eq!(enveloped(&f.payload).1, format!("m{m}"), "subscriber {i}");
            }
            times.push(started.elapsed());
            resumed.push(s);
        }
    }
    let reads = metric(&addr_a, "freeboard_backplane_history_reads_total") - reads_before;
    let rss = rss(a.pid());
    times.sort_unstable();
    let p = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize].as_millis();
    eprintln!(
        "storm of {storm}: {} resumed, {gone} told 4410, {refused} refusals (503) retried; \
         stream reads {reads}; time to resume p50 {} ms, p99 {} ms; node RSS {} MiB of a \
         {} MiB budget",
        resumed.len() - gone,
        p(0.5),
        p(0.99),
        rss >> 20,
        BUDGET >> 20
    );
    assert_eq!(gone, 0, "what they missed was kept");
    assert_eq!(resumed.len(), storm, "every one resumed");
    assert_eq!(reads, 1, "one read of the stream served the storm");
    assert!(refused > 0, "256 pending upgrades at most: the rest were paced (503)");
    assert!(rss <= BUDGET + BUDGET / 10, "RSS {rss} past the budget + 10 %");
}

/// A stream that lost entries a node delivered (as a replica promoted without the last
/// writes, or a restart from an older snapshot, would leave it — made here by rewriting the
/// stream with its first entries and the same epoch): the node, subscribing again, finds its
/// last offset past the stream's end, gives the stream a new epoch and tells its subscribers
/// (4410); an offset from before the loss, which the stream would otherwise still vouch for,
/// gets 4410 too rather than a replay that skips the lost entries.
#[test]
fn a_stream_that_lost_delivered_entries_gets_a_new_epoch() {
    let port = common::free_port();
    let Some(_redis) = redis(port) else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let history = ["--history", "100", "--history-prefix", "feed"];
    let (_a, addr_a) = node_with(port, &history);
    let (_b, addr_b) = node_with(port, &history);
    let (mut reader, mut inbox) = subscribe(&addr_a, "feed");
    reader.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !matches!(inbox.frame(&mut reader), Ok(Some(_))) {
        assert!(Instant::now() < until, "node A never subscribed");
        post(&addr_b, "feed", "warm");
    }
    reader.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut offsets = Vec::new();
    for i in 0..10 {
        assert!(post(&addr_b, "feed", &format!("m{i}")).starts_with("HTTP/1.1 200"));
        offsets.push(read_until(&mut reader, &mut inbox, &format!("m{i}")));
    }
    let epoch = redis_cli(port, &["GET", "{freeboard:feed}:epoch"]).trim().to_owned();
    // The stream as a replica that had only m0..m3 would have it.
    redis_cli(port, &["DEL", "freeboard:feed"]);
    for (i, offset) in offsets.iter().take(4).enumerate() {
        let id = offset.split_once('.').unwrap().1;
        redis_cli(port, &["XADD", "freeboard:feed", id, "k", "t", "m", &format!("m{i}")]);
    }
    assert_eq!(redis_cli(port, &["GET", "{freeboard:feed}:epoch"]).trim(), epoch);
    // Node A's subscription is cut; subscribing again, it finds m9 past the stream's end.
    redis_cli(port, &["CLIENT", "KILL", "TYPE", "pubsub"]);
    let close = loop {
        let f = inbox.frame(&mut reader).unwrap().expect("a close frame");
        if f.opcode == 0x8 {
            break f;
        }
    };
    assert_eq!(close.close_code(), 4410, "the subscriber is told");
    let renewed = redis_cli(port, &["GET", "{freeboard:feed}:epoch"]).trim().to_owned();
    assert_ne!(renewed, epoch, "a new epoch");
    // m2's offset: the stream still holds m3 after it, but not m4..m9.
    let (mut late, mut inbox) = subscribe(&addr_b, &format!("feed?since={}", offsets[2]));
    let close = inbox.frame(&mut late).unwrap().expect("a close frame");
    assert_eq!((close.opcode, close.close_code()), (0x8, 4410), "no replay that skips m4..m9");
}
