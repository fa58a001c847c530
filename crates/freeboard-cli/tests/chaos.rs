//! The chaos harness: a Redis Cluster of three masters with a replica each (real
//! `redis-server` processes), three `freeboard serve` nodes on it — one of them in a network
//! namespace behind a veth pair, one behind a toxiproxy — publishers that `POST` numbered
//! publications to any node, and resuming subscribers on every node and topic: the Rust
//! `freeboard::client::Subscription`, and the browser module (`/js/freeboard.js`) in headless
//! Chromium. Faults, drawn from a seeded deck so that every kind comes round:
//! - `kill-node`: `kill -9` of a node, restarted on its port a moment later;
//! - `kill-master`: `kill -9` of a Redis master (its replica takes over), restarted later
//!   (it comes back as a replica, without data);
//! - `stall-master`: SIGSTOP of a Redis master past the cluster's node timeout, then SIGCONT;
//! - `partition`: the namespaced node cut off from Redis and from its clients (its veth link
//!   down, then up);
//! - `latency`, `reset`: toxiproxy toxics on the path to one node (500 ms each way; resets of
//!   every connection).
//!
//! Afterwards every fault is healed, the subscribers are given time to settle, and the checker
//! (`freeboard_bench::chaos`) classifies every acknowledged publication at every subscriber.
//!
//! `FREEBOARD_CHAOS_SECS` (default 45) is the time under faults, `FREEBOARD_CHAOS_CUTS`
//! (default 2) the single subscriber connections cut per second besides (each Rust
//! subscriber reaches its node through a `CutProxy` of its own), and `FREEBOARD_CHAOS_SEED`
//! (default 37) the seed; `scripts/test` runs the short run, the long one is
//! `FREEBOARD_CHAOS_SECS=1800 FREEBOARD_CHAOS_CUTS=6 cargo test -p freeboard-cli --test chaos
//! -- --ignored --nocapture` (docs/operating/chaos.md). Needs root (network namespaces), `redis-server`,
//! `redis-cli` and `toxiproxy-server` (on the PATH or in `target/tools`, which `scripts/test`
//! fills with `go install`); skipped with a message without them, unless
//! `FREEBOARD_REQUIRE_TOOLS` is set.
//!
//! `FREEBOARD_CHAOS_GATE` the classes that fail the run (comma-separated: `silently-lost`,
//! `duplicated`, `out-of-order`; default all three). `FREEBOARD_CHAOS_FAULTS`
//! (comma-separated names; default all) chooses the kinds;
//! `FREEBOARD_CHAOS_BIN` runs the nodes from another `freeboard` binary (a release build),
//! `FREEBOARD_CHAOS_SERVE_ARGS` gives them more flags (split at spaces). The run
//! fails, by default, on any silently lost, duplicated or out-of-order acknowledged
//! publication; the report prints each class by fault kind.
#![cfg(feature = "bench")]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use freeboard::client::resume::{Backoff, Resume};
use freeboard::client::{ClientConfig, Subscription, SubscriptionEvent};
use freeboard_bench::chaos::{self, Class, Entry, Publication, SubscriberLog};
use freeboard_test::proxy::CutProxy;

/// Topics: on different slots, so on different masters as the cluster spreads them.
const TOPICS: u32 = 3;
const PUBLISHERS: u32 = 3;
/// Subscribers per (node, topic).
const PER_NODE_TOPIC: usize = 2;

/// The fault kinds, each once per round of the deck.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
    KillNode,
    KillMaster,
    StallMaster,
    Partition,
    Latency,
    Reset,
}

impl Fault {
    const ALL: [Fault; 6] = [
        Self::KillNode,
        Self::KillMaster,
        Self::StallMaster,
        Self::Partition,
        Self::Latency,
        Self::Reset,
    ];

    /// The kinds named in `FREEBOARD_CHAOS_FAULTS` (comma-separated; all when unset).
    fn chosen() -> Vec<Fault> {
        match std::env::var("FREEBOARD_CHAOS_FAULTS") {
            Err(_) => Self::ALL.to_vec(),
            Ok(list) => list
                .split(',')
                .map(|name| {
                    let found = Self::ALL.into_iter().find(|f| f.name() == name.trim());
                    found.unwrap_or_else(|| panic!("FREEBOARD_CHAOS_FAULTS: no fault {name:?}"))
                })
                .collect(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::KillNode => "kill-node",
            Self::KillMaster => "kill-master",
            Self::StallMaster => "stall-master",
            Self::Partition => "partition",
            Self::Latency => "latency",
            Self::Reset => "reset",
        }
    }
}

/// xorshift64*: the run's only source of chance, from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A child process killed and reaped when dropped.
struct Proc(Option<Child>);

impl Proc {
    fn pid(&self) -> Option<libc::pid_t> {
        self.0.as_ref().map(|c| c.id() as libc::pid_t)
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// `kill -9` and reap.
    fn kill(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.kill();
    }
}

/// A network namespace joined to the host by a veth pair: `host` on this side, `inside`
/// in the namespace. Removed when dropped.
struct Netns {
    name: String,
    link: String,
    host: String,
    inside: String,
    subnet: String,
}

impl Netns {
    fn create() -> Option<Self> {
        let id = std::process::id() % 100_000;
        let net = 64 + id % 190;
        let ns = Self {
            name: format!("fbchaos{id}"),
            link: format!("fbc{id}h"),
            host: format!("10.37.{net}.1"),
            inside: format!("10.37.{net}.2"),
            subnet: format!("10.37.{net}.0/30"),
        };
        let peer = format!("fbc{id}n");
        let steps: [&[&str]; 9] = [
            &["netns", "add", &ns.name],
            &["link", "add", &ns.link, "type", "veth", "peer", "name", &peer],
            &["link", "set", &peer, "netns", &ns.name],
            &["addr", "add", &format!("{}/30", ns.host), "dev", &ns.link],
            &["link", "set", &ns.link, "up"],
            &["-n", &ns.name, "addr", "add", &format!("{}/30", ns.inside), "dev", &peer],
            &["-n", &ns.name, "link", "set", &peer, "up"],
            &["-n", &ns.name, "link", "set", "lo", "up"],
            // While the link is down its own route is gone: without this one, packets to the
            // namespace would take the default route off the machine, and a connection to it
            // would wait for minutes instead of failing at once as a partitioned one does.
            &["route", "add", "unreachable", &ns.subnet, "metric", "4242"],
        ];
        for step in steps {
            let ok = Command::new("ip").args(step).stderr(Stdio::null()).status();
            if !ok.is_ok_and(|s| s.success()) {
                eprintln!("ip {step:?} failed");
                return None;
            }
        }
        Some(ns)
    }

    /// The veth link up or down: the namespace reaches the host, or nothing at all.
    fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        let ok = Command::new("ip").args(["link", "set", &self.link, state]).status().unwrap();
        assert!(ok.success(), "ip link set {} {state}", self.link);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["route", "del", "unreachable", &self.subnet]).status();
        let _ = Command::new("ip").args(["link", "del", &self.link]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Redis Cluster: three masters with a replica each, on `ip`.
struct Cluster {
    ip: String,
    dir: PathBuf,
    ports: Vec<u16>,
    servers: Vec<Proc>,
}

impl Cluster {
    fn start(ip: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("freeboard-chaos-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ports: Vec<u16> = (0..6).map(|_| common::free_port()).collect();
        let mut cluster = Cluster { ip: ip.to_owned(), dir, ports, servers: Vec::new() };
        for i in 0..6 {
            let server = cluster.server(i);
            cluster.servers.push(server);
        }
        let addrs: Vec<String> = cluster.ports.iter().map(|p| format!("{ip}:{p}")).collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(created.success(), "redis-cli --cluster create failed");
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// Server `i`, listening; its cluster state in `dir`, no persistence (a restarted server
    /// has no data).
    fn server(&self, i: usize) -> Proc {
        let port = self.ports[i];
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", &self.ip, "--protected-mode", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes", "--cluster-config-file"])
            .arg(format!("nodes-{port}.conf"))
            .args(["--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0"])
            .args(["--cluster-require-full-coverage", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let until = Instant::now() + Duration::from_secs(10);
        while !common::listening((self.ip.as_str(), port)) {
            assert!(Instant::now() < until, "redis-server did not listen on {port}");
            thread::sleep(Duration::from_millis(20));
        }
        Proc(Some(child))
    }

    fn cli(&self, i: usize, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", &self.ip, "-p", &self.ports[i].to_string()])
            .args(args)
            .stderr(Stdio::null())
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    }

    /// The servers that are masters now (asked of each live one).
    fn masters(&self) -> Vec<usize> {
        (0..6)
            .filter(|&i| self.servers[i].0.is_some())
            .filter(|&i| self.cli(i, &["ROLE"]).starts_with("master"))
            .collect()
    }

    /// Waits until every server runs, says the cluster is ok, and three masters with a
    /// replica each are seen.
    fn wait_healthy(&self, within: Duration) -> bool {
        let until = Instant::now() + within;
        while Instant::now() < until {
            let ok = (0..6).all(|i| self.cli(i, &["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            let nodes = self.cli(0, &["CLUSTER", "NODES"]);
            let masters =
                nodes.lines().filter(|l| l.contains("master") && !l.contains("fail")).count();
            let replicas =
                nodes.lines().filter(|l| l.contains("slave") && !l.contains("fail")).count();
            if ok && masters == 3 && replicas == 3 {
                return true;
            }
            thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// The seeds a node is given.
    fn url(&self) -> String {
        let seeds: Vec<String> =
            self.ports.iter().map(|p| format!("redis://{}:{p}/", self.ip)).collect();
        seeds.join(",")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.servers.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `freeboard serve` node on a fixed address, restartable.
struct Node {
    name: String,
    /// `ip netns exec NAME` when it runs in the namespace.
    netns: Option<String>,
    listen: SocketAddr,
    redis: String,
    proc: Proc,
}

impl Node {
    fn start(name: &str, netns: Option<&str>, listen: SocketAddr, redis: &str) -> Self {
        let mut node = Node {
            name: name.to_owned(),
            netns: netns.map(str::to_owned),
            listen,
            redis: redis.to_owned(),
            proc: Proc(None),
        };
        node.restart();
        node
    }

    fn restart(&mut self) {
        let bin = std::env::var("FREEBOARD_CHAOS_BIN");
        let bin = bin.as_deref().unwrap_or(env!("CARGO_BIN_EXE_freeboard"));
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin]);
                c
            }
            None => Command::new(bin),
        };
        let child = command
            .args(["serve", "--listen", &self.listen.to_string(), "--threads", "1"])
            .args(["--memory", "64M", "--redis", &self.redis])
            .args(["--history", "100000", "--history-prefix", "chaos"])
            .args(
                std::env::var("FREEBOARD_CHAOS_SERVE_ARGS").unwrap_or_default().split_whitespace(),
            )
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start freeboard serve");
        self.proc = Proc(Some(child));
        let until = Instant::now() + Duration::from_secs(15);
        while !common::listening(self.listen) {
            assert!(Instant::now() < until, "{} did not listen", self.name);
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// toxiproxy-server and one proxy to a node.
struct Toxiproxy {
    binary: PathBuf,
    api: SocketAddr,
    /// Where the node is reached through it.
    listen: SocketAddr,
    upstream: SocketAddr,
    server: Proc,
    /// Times its control API froze and it was started again.
    restarts: u32,
}

impl Toxiproxy {
    fn start(binary: &Path, upstream: SocketAddr) -> Self {
        let api: SocketAddr = format!("127.0.0.1:{}", common::free_port()).parse().unwrap();
        let listen: SocketAddr = format!("127.0.0.1:{}", common::free_port()).parse().unwrap();
        let binary = binary.to_owned();
        let mut proxy =
            Toxiproxy { binary, api, listen, upstream, server: Proc(None), restarts: 0 };
        proxy.spawn();
        proxy
    }

    /// Starts toxiproxy-server and its proxy to the node.
    fn spawn(&mut self) {
        let server = Command::new(&self.binary)
            .args(["-host", "127.0.0.1", "-port", &self.api.port().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start toxiproxy-server");
        self.server = Proc(Some(server));
        let until = Instant::now() + Duration::from_secs(10);
        while !common::listening(self.api) {
            assert!(Instant::now() < until, "toxiproxy-server did not listen");
            thread::sleep(Duration::from_millis(20));
        }
        let (listen, upstream) = (self.listen, self.upstream);
        let body = format!(r#"{{"name":"node","listen":"{listen}","upstream":"{upstream}"}}"#);
        assert_eq!(self.try_request("POST", "/proxies", &body), 201, "toxiproxy's proxy");
    }

    /// An HTTP request to the API; its status. Its API can stall on a loaded machine, so a
    /// request is tried three times a second apart; and it can freeze for good when a toxic
    /// is removed while the links it held are gone (toxiproxy issues 412 and 558: the removal
    /// waits for ever holding the lock every request needs). Then toxiproxy-server is started
    /// again — which ends the connections through it, as the `reset` fault does — and the
    /// request goes to the new one.
    fn request(&mut self, method: &str, path: &str, body: &str) -> u16 {
        for _ in 0..3 {
            match self.try_request(method, path, body) {
                0 => thread::sleep(Duration::from_secs(1)),
                status => return status,
            }
        }
        self.server.kill();
        self.restarts += 1;
        eprintln!("chaos: toxiproxy's API froze at {method} {path}; started again");
        self.spawn();
        self.try_request(method, path, body)
    }

    fn try_request(&self, method: &str, path: &str, body: &str) -> u16 {
        let Ok(mut s) = TcpStream::connect(self.api) else { return 0 };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: toxiproxy\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap_or(());
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
    }

    /// Adds toxic `name` of `kind` both ways (`name` downstream, `name_up` upstream).
    fn add(&mut self, name: &str, kind: &str, attributes: &str) {
        for (name, stream) in [(name.to_owned(), "downstream"), (format!("{name}_up"), "upstream")]
        {
            let body = format!(
                r#"{{"name":"{name}","type":"{kind}","stream":"{stream}","toxicity":1.0,"attributes":{attributes}}}"#
            );
            // 409: a retried request whose first try was applied.
            let status = self.request("POST", "/proxies/node/toxics", &body);
            assert!(matches!(status, 200 | 409), "toxic {name}: {status}");
        }
    }

    /// Removes toxic `name` both ways (404 from a toxiproxy started again: it is gone).
    fn remove(&mut self, name: &str) {
        self.request("DELETE", &format!("/proxies/node/toxics/{name}"), "");
        self.request("DELETE", &format!("/proxies/node/toxics/{name}_up"), "");
    }
}

/// `POST /topic/{topic}`: whether it was acknowledged (200).
fn publish(addr: SocketAddr, topic: &str, body: &str) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!(
        "POST /topic/{topic} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

fn topic_name(t: u32) -> String {
    format!("chaos{t}")
}

/// A tool on the PATH, or in target/tools.
fn tool(name: &str) -> Option<PathBuf> {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tools").join(name);
    if tools.exists() {
        return Some(tools);
    }
    let out = Command::new("sh").args(["-c", &format!("command -v {name}")]).output().ok()?;
    out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
#[ignore = "the chaos run needs root, Redis and toxiproxy: scripts/test runs it on its own"]
fn chaos_every_acknowledged_publication_is_delivered_or_signalled() {
    let required = std::env::var_os("FREEBOARD_REQUIRE_TOOLS").is_some();
    let missing: Vec<&str> = ["redis-server", "redis-cli", "toxiproxy-server", "ip"]
        .into_iter()
        .filter(|t| tool(t).is_none())
        .collect();
    // SAFETY: geteuid(2) has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !missing.is_empty() || !root {
        let why = format!("missing {missing:?}, root: {root}");
        assert!(!required, "the chaos run cannot run: {why}");
        eprintln!("SKIPPED: the chaos run: {why}");
        return;
    }
    let secs = env_u64("FREEBOARD_CHAOS_SECS", 45);
    let chosen = Fault::chosen();
    // The classes that fail the run (FREEBOARD_CHAOS_GATE, comma-separated; default every
    // failing class).
    let gate: Vec<Class> = match std::env::var("FREEBOARD_CHAOS_GATE") {
        Err(_) => vec![Class::SilentlyLost, Class::Duplicated, Class::OutOfOrder],
        Ok(list) => list
            .split(',')
            .map(|n| Class::parse(n.trim()).unwrap_or_else(|| panic!("no class {n:?}")))
            .collect(),
    };
    let seed = env_u64("FREEBOARD_CHAOS_SEED", 37);
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let began = Instant::now();
    let netns = Netns::create().expect("a network namespace with a veth pair");
    let cluster = Arc::new(Mutex::new(Cluster::start(&netns.host)));
    let redis = cluster.lock().unwrap().url();
    let port = || common::free_port();
    let mut nodes = vec![
        Node::start("node0", None, format!("127.0.0.1:{}", port()).parse().unwrap(), &redis),
        Node::start("node1", None, format!("127.0.0.1:{}", port()).parse().unwrap(), &redis),
        Node::start(
            "node2",
            Some(&netns.name),
            format!("{}:{}", netns.inside, port()).parse().unwrap(),
            &redis,
        ),
    ];
    let mut toxiproxy = Toxiproxy::start(&tool("toxiproxy-server").unwrap(), nodes[1].listen);
    // Where clients reach each node: node1 through the fault proxy.
    let reach = [nodes[0].listen, toxiproxy.listen, nodes[2].listen];
    eprintln!(
        "chaos: cluster and nodes up in {:.1} s (seed {seed})",
        began.elapsed().as_secs_f64()
    );

    // Subscribers: PER_NODE_TOPIC on every (node, topic), each logging what it receives.
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut subscribers = Vec::new();
    let mut cut_proxies = Vec::new();
    for (n, addr) in reach.iter().enumerate() {
        for t in 0..TOPICS {
            for k in 0..PER_NODE_TOPIC {
                let name = format!("node{n}/{}#{k}", topic_name(t));
                // Each Rust subscriber through a proxy of its own, which cuts it at random.
                let proxy = CutProxy::start(*addr);
                let url = format!("ws://{}/topic/{}", proxy.addr, topic_name(t));
                cut_proxies.push(proxy);
                let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
                let resume = Resume::with_seed(
                    &url,
                    backoff,
                    seed ^ (n as u64 * 97 + t as u64 * 7 + k as u64),
                );
                let config = ClientConfig::default().connect_timeout(Duration::from_secs(2));
                let log = Arc::new(Mutex::new(SubscriberLog {
                    name,
                    topic: t,
                    from: Duration::MAX,
                    entries: Vec::new(),
                }));
                let warm = Arc::new(AtomicBool::new(false));
                let up = Arc::new(AtomicBool::new(false));
                let handle = {
                    let (log, warm, up, stop) =
                        (Arc::clone(&log), Arc::clone(&warm), Arc::clone(&up), Arc::clone(&stop));
                    thread::spawn(move || {
                        let mut feed = Subscription::with_resume(resume, config);
                        while !stop.load(Ordering::Relaxed) {
                            let event = match feed.recv_timeout(Duration::from_millis(100)) {
                                Ok(Some(event)) => event,
                                Ok(None) => continue,
                                Err(e) => panic!("a subscription stopped: {e}"),
                            };
                            let at = start.elapsed();
                            match event {
                                SubscriptionEvent::Message { payload, .. } => {
                                    let text = String::from_utf8_lossy(payload);
                                    if text == "warm" {
                                        warm.store(true, Ordering::Relaxed);
                                        continue;
                                    }
                                    // `p{publisher}-{seq}`
                                    let (p, s) = text[1..].split_once('-').expect("a publication");
                                    let entry = Entry::Message {
                                        publisher: p.parse().unwrap(),
                                        seq: s.parse().unwrap(),
                                        at,
                                    };
                                    log.lock().unwrap().entries.push(entry);
                                }
                                SubscriptionEvent::Gone { .. } => {
                                    up.store(false, Ordering::Relaxed);
                                    log.lock().unwrap().entries.push(Entry::Gone { at })
                                }
                                SubscriptionEvent::Closed(close) => {
                                    panic!("a subscription was closed for good: {close:?}")
                                }
                                SubscriptionEvent::Opened { .. } => {
                                    up.store(true, Ordering::Relaxed)
                                }
                                SubscriptionEvent::Reconnecting { .. } => {
                                    up.store(false, Ordering::Relaxed)
                                }
                                _ => {}
                            }
                        }
                        feed.stats()
                    })
                };
                subscribers.push((log, warm, up, handle));
            }
        }
    }
    // Browser subscribers: the module that `freeboard serve` serves, on headless Chromium's
    // own WebSocket, one on each node and topic, in a page of node 0's.
    let mut browser_names = Vec::new();
    for (n, _) in reach.iter().enumerate() {
        for t in 0..TOPICS {
            browser_names.push((format!("browser/node{n}/{}", topic_name(t)), t));
        }
    }
    let mut browser = freeboard_test::browser::chromium().map(|chromium| {
        let page_url = format!("http://{}/healthz", nodes[0].listen);
        let (browser, profile, mut page) =
            common::devtools::open_url(&chromium, &page_url, "chaos", "/healthz");
        page.wait_for("the page loaded", |p| {
            p.eval("document.readyState") == "complete" && p.eval("location.pathname") == "/healthz"
        });
        let urls: Vec<String> = reach
            .iter()
            .flat_map(|addr| {
                (0..TOPICS).map(move |t| format!("ws://{addr}/topic/{}", topic_name(t)))
            })
            .collect();
        let script = format!(
            r#"(async () => {{
                // The repository's module (served at /js/freeboard.js; loaded from its source
                // here, so that a FREEBOARD_CHAOS_BIN without that route runs it too).
                const source = new Blob([{module:?}], {{ type: "text/javascript" }});
                const m = await import(URL.createObjectURL(source));
                window.logs = []; window.warm = []; window.up = [];
                {urls:?}.forEach((url, i) => {{
                    logs.push([]); warm.push(false); up.push(false);
                    new m.Subscription(url, {{
                        backoff: {{ initial: 50, max: 1000 }},
                        onMessage: (p) => {{
                            if (p === "warm") {{ warm[i] = true; return; }}
                            const [a, b] = p.slice(1).split("-");
                            logs[i].push([Number(a), Number(b)]);
                        }},
                        onGone: () => {{ up[i] = false; logs[i].push(["gone"]); }},
                        onOpen: () => {{ up[i] = true; }},
                        onReconnecting: () => {{ up[i] = false; }},
                    }});
                }});
                return logs.length;
            }})()"#,
            module = include_str!("../../../bindings/browser/freeboard.js")
        );
        assert_eq!(page.eval_async(&script), urls.len(), "the browser's subscriptions");
        (browser, profile, page)
    });

    // Warm up: every node's subscription has reached Redis once each subscriber saw "warm".
    let until = Instant::now() + Duration::from_secs(30);
    let browser_warm = |browser: &mut Option<(_, _, common::devtools::DevTools)>| {
        browser.as_mut().is_none_or(|(_, _, page)| page.eval("warm.every(Boolean)") == true)
    };
    while subscribers.iter().any(|(_, warm, _, _)| !warm.load(Ordering::Relaxed))
        || !browser_warm(&mut browser)
    {
        assert!(Instant::now() < until, "the subscribers never all saw a warm-up publication");
        for t in 0..TOPICS {
            for node in &nodes {
                publish(node.listen, &topic_name(t), "warm");
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
    let from = start.elapsed();
    for (log, _, _, _) in &subscribers {
        log.lock().unwrap().from = from;
    }
    if let Some((_, _, page)) = &mut browser {
        // What the browser received so far was warm-up: its logs start now.
        page.eval("logs.forEach((l) => { l.length = 0; }), 0");
    }

    // Publishers: each POSTs `p{id}-{seq}` to the topics in turn, on a node drawn at random,
    // one at a time (a publication is sent only once its predecessor was answered).
    let publications = Arc::new(Mutex::new(Vec::<Publication>::new()));
    // The publishers stop first; the subscribers (`stop`) once they have settled.
    let publishing_over = Arc::new(AtomicBool::new(false));
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|id| {
            let (publications, stop) = (Arc::clone(&publications), Arc::clone(&publishing_over));
            let mut rng = Rng(seed ^ 0x5851_f42d_4c95_7f2du64.wrapping_mul(id as u64 + 1) | 1);
            let targets: Vec<SocketAddr> = nodes.iter().map(|n| n.listen).collect();
            thread::spawn(move || {
                let mut seqs = [0u64; TOPICS as usize];
                let mut t = id % TOPICS;
                while !stop.load(Ordering::Relaxed) {
                    let seq = seqs[t as usize];
                    seqs[t as usize] += 1;
                    let sent_at = start.elapsed();
                    let node = targets[rng.below(targets.len() as u64) as usize];
                    let acked = publish(node, &topic_name(t), &format!("p{id}-{seq}"));
                    publications.lock().unwrap().push(Publication {
                        publisher: id,
                        topic: t,
                        seq,
                        acked,
                        sent_at,
                    });
                    t = (t + 1) % TOPICS;
                    thread::sleep(Duration::from_millis(15));
                }
            })
        })
        .collect();

    // Faults, from a deck that holds each kind once, shuffled anew each round.
    let mut faults: Vec<(Fault, Duration, Duration)> = Vec::new();
    let mut deck: Vec<Fault> = Vec::new();
    let chaos_until = Instant::now() + Duration::from_secs(secs);
    // Besides the deck: single connections cut at random (FREEBOARD_CHAOS_CUTS per second,
    // default 2), each a subscriber's drop and resume.
    let cuts_per_sec = env_u64("FREEBOARD_CHAOS_CUTS", 2);
    let cut_proxies = Arc::new(cut_proxies);
    let cutter = {
        let (proxies, over) = (Arc::clone(&cut_proxies), Arc::clone(&publishing_over));
        let mut rng = Rng(seed ^ 0xc2b2_ae3d_27d4_eb4f | 1);
        thread::spawn(move || {
            let mut cuts = 0u64;
            while cuts_per_sec > 0 && Instant::now() < chaos_until && !over.load(Ordering::Relaxed)
            {
                thread::sleep(Duration::from_millis(1000 / cuts_per_sec));
                let victim = &proxies[rng.below(proxies.len() as u64) as usize];
                cuts += victim.cut() as u64;
            }
            cuts
        })
    };
    while Instant::now() < chaos_until {
        if deck.is_empty() {
            deck = chosen.clone();
            for i in (1..deck.len()).rev() {
                deck.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        let fault = deck.pop().unwrap();
        let began = start.elapsed();
        let hold = Duration::from_millis(1500 + rng.below(1500));
        match fault {
            Fault::KillNode => {
                let node = &mut nodes[rng.below(3) as usize];
                node.proc.kill();
                thread::sleep(hold.min(Duration::from_secs(2)));
                node.restart();
            }
            Fault::KillMaster | Fault::StallMaster => {
                let masters = cluster.lock().unwrap().masters();
                if masters.is_empty() {
                    continue;
                }
                let victim = masters[rng.below(masters.len() as u64) as usize];
                if fault == Fault::KillMaster {
                    cluster.lock().unwrap().servers[victim].kill();
                    // The replica takes over after the node timeout (1 s) and an election.
                    thread::sleep(hold + Duration::from_secs(1));
                    let mut cluster = cluster.lock().unwrap();
                    let server = cluster.server(victim);
                    cluster.servers[victim] = server;
                } else {
                    let cluster = cluster.lock().unwrap();
                    cluster.servers[victim].signal(libc::SIGSTOP);
                    // Past the node timeout: the replica may be promoted meanwhile.
                    thread::sleep(hold + Duration::from_secs(1));
                    cluster.servers[victim].signal(libc::SIGCONT);
                }
            }
            Fault::Partition => {
                netns.link(false);
                thread::sleep(hold);
                netns.link(true);
            }
            Fault::Latency => {
                toxiproxy.add("slow", "latency", r#"{"latency":500,"jitter":100}"#);
                thread::sleep(hold);
                toxiproxy.remove("slow");
            }
            Fault::Reset => {
                toxiproxy.add("reset", "reset_peer", r#"{"timeout":0}"#);
                thread::sleep(Duration::from_millis(300));
                toxiproxy.remove("reset");
            }
        }
        faults.push((fault, began, start.elapsed()));
        eprintln!("chaos: {} at {:.1} s", fault.name(), began.as_secs_f64());
        // Let the cluster come back to three masters with a replica each before the next.
        let healthy = cluster.lock().unwrap().wait_healthy(Duration::from_secs(15));
        if !healthy {
            eprintln!("chaos: the cluster was not back to 3 + 3 within 15 s");
        }
        thread::sleep(Duration::from_millis(500 + rng.below(1000)));
    }

    // Heal, stop publishing, let the subscribers catch up, then stop them.
    netns.link(true);
    let settle_from = Instant::now();
    thread::sleep(Duration::from_secs(1));
    publishing_over.store(true, Ordering::Relaxed);
    for publisher in publishers {
        publisher.join().unwrap();
    }
    // Settled: every subscriber connected, and none received anything for 3 s (30 s at
    // most: one still away then misses what it misses, and the checker says so).
    let mut state = || {
        let rust =
            subscribers.iter().map(|(l, _, _, _)| l.lock().unwrap().entries.len()).sum::<usize>();
        let rust_up = subscribers.iter().all(|(_, _, up, _)| up.load(Ordering::Relaxed));
        let (in_browser, browser_up) = browser.as_mut().map_or((0, true), |(_, _, page)| {
            let n = page.eval("logs.reduce((n, l) => n + l.length, 0)").as_u64().unwrap_or(0);
            (n as usize, page.eval("up.every(Boolean)") == true)
        });
        (rust + in_browser, rust_up && browser_up)
    };
    let mut last = (state().0, Instant::now());
    loop {
        thread::sleep(Duration::from_millis(200));
        let (now, all_up) = state();
        if now != last.0 {
            last = (now, Instant::now());
        }
        let settled = all_up && last.1.elapsed() >= Duration::from_secs(3);
        if settled || settle_from.elapsed() >= Duration::from_secs(30) {
            if !settled {
                let away: Vec<String> = subscribers
                    .iter()
                    .filter(|(_, _, up, _)| !up.load(Ordering::Relaxed))
                    .map(|(log, _, _, _)| log.lock().unwrap().name.clone())
                    .collect();
                let browser_up = browser.as_mut().map(|(_, _, page)| page.eval("up"));
                eprintln!(
                    "chaos: not every subscriber was back and quiet within 30 s \
                     (away: {away:?}; the browser's up: {browser_up:?})"
                );
            }
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut stats = Vec::new();
    let mut logs = Vec::new();
    for (log, _, _, handle) in subscribers {
        stats.push(handle.join().unwrap());
        logs.push(Arc::try_unwrap(log).unwrap().into_inner().unwrap());
    }
    if let Some((_browser, profile, mut page)) = browser.take() {
        let received = page.eval("logs");
        for ((name, topic), got) in browser_names.iter().zip(received.as_array().unwrap()) {
            let entries = got
                .as_array()
                .unwrap()
                .iter()
                .map(|e| match (e[0].as_u64(), e[1].as_u64()) {
                    (Some(publisher), Some(seq)) => {
                        Entry::Message { publisher: publisher as u32, seq, at: Duration::ZERO }
                    }
                    _ => Entry::Gone { at: Duration::ZERO },
                })
                .collect();
            logs.push(SubscriberLog { name: name.clone(), topic: *topic, from, entries });
        }
        let _ = std::fs::remove_dir_all(profile);
    }
    let publications = Arc::try_unwrap(publications).unwrap().into_inner().unwrap();
    let verdict = chaos::check(&publications, &logs);

    // The report: every class, and the failing ones by the fault they fall in: the last one
    // that began before the publication was sent (or within 1 s after), if it had not ended
    // more than 5 s before.
    let mut by_fault: HashMap<(&str, Class), u64> = HashMap::new();
    for finding in &verdict.findings {
        let kind = faults
            .iter()
            .rev()
            .find(|(_, from, _)| *from <= finding.sent_at + Duration::from_secs(1))
            .filter(|(_, _, to)| finding.sent_at <= *to + Duration::from_secs(5))
            .map_or("none", |(f, _, _)| f.name());
        *by_fault.entry((kind, finding.class)).or_default() += 1;
    }
    let mut counts: HashMap<Fault, usize> = HashMap::new();
    for (f, _, _) in &faults {
        *counts.entry(*f).or_default() += 1;
    }
    let cuts = cutter.join().unwrap();
    let reconnects: u64 = stats.iter().map(|s| s.reconnects).sum();
    let gone: u64 = stats.iter().map(|s| s.gone).sum();
    let duplicates_dropped: u64 = stats.iter().map(|s| s.duplicates).sum();
    eprintln!(
        "\nchaos report (seed {seed}, {secs} s of faults, {} subscribers, {} faults from the deck \
         and {cuts} single connections cut):",
        logs.len(),
        faults.len()
    );
    let mut kinds: Vec<_> = counts.iter().collect();
    kinds.sort();
    for (fault, n) in kinds {
        let failing: Vec<String> = [Class::SilentlyLost, Class::Duplicated, Class::OutOfOrder]
            .iter()
            .map(|c| format!("{} {}", c.name(), by_fault.get(&(fault.name(), *c)).unwrap_or(&0)))
            .collect();
        eprintln!("  {:<13} x{n:<3} {}", fault.name(), failing.join(", "));
    }
    eprintln!(
        "  client: {reconnects} reconnects, {gone} told 4410, {duplicates_dropped} repeated offsets dropped"
    );
    if toxiproxy.restarts > 0 {
        eprintln!("  toxiproxy started again {} times (its API froze)", toxiproxy.restarts);
    }
    let in_browser: usize = logs
        .iter()
        .filter(|l| l.name.starts_with("browser/"))
        .map(|l| l.entries.iter().filter(|e| matches!(e, Entry::Message { .. })).count())
        .sum();
    if logs.iter().any(|l| l.name.starts_with("browser/")) {
        eprintln!(
            "  browser: {in_browser} deliveries to its {} subscriptions",
            browser_names.len()
        );
    }
    eprint!("{verdict}");
    let examples = [Class::SilentlyLost, Class::Duplicated, Class::OutOfOrder]
        .map(|c| verdict.findings.iter().filter(move |f| f.class == c).take(2));
    for finding in examples.into_iter().flatten() {
        eprintln!("  e.g. {finding:?}");
        // What that subscriber received from that publisher around it.
        let log = logs.iter().find(|l| l.name == finding.subscriber).unwrap();
        let around: Vec<String> = log
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::Message { publisher, seq, at } if *publisher == finding.publisher => {
                    (seq.abs_diff(finding.seq) <= 4)
                        .then(|| format!("{seq}@{:.3}", at.as_secs_f64()))
                }
                Entry::Gone { at } => Some(format!("gone@{:.3}", at.as_secs_f64())),
                _ => None,
            })
            .collect();
        eprintln!("       received: {}", around.join(" "));
    }
    if let Ok(path) = std::env::var("FREEBOARD_CHAOS_DUMP") {
        let mut out = String::new();
        for p in &publications {
            out += &format!(
                "pub {} {} {} {} {:.3}\n",
                p.publisher,
                p.topic,
                p.seq,
                p.acked,
                p.sent_at.as_secs_f64()
            );
        }
        for log in &logs {
            for e in &log.entries {
                match e {
                    Entry::Message { publisher, seq, at } => {
                        out += &format!(
                            "msg {} {} {publisher} {seq} {:.3}\n",
                            log.name,
                            log.topic,
                            at.as_secs_f64()
                        )
                    }
                    Entry::Gone { at } => {
                        out += &format!("gone {} {:.3}\n", log.name, at.as_secs_f64())
                    }
                }
            }
        }
        for (f, from, to) in &faults {
            out +=
                &format!("fault {} {:.3} {:.3}\n", f.name(), from.as_secs_f64(), to.as_secs_f64());
        }
        std::fs::write(path, out).unwrap();
    }
    assert!(verdict.acked > 0, "nothing was acknowledged");
    assert!(verdict.count(Class::Delivered) > 0, "nothing was delivered");
    for class in gate {
        assert_eq!(verdict.count(class), 0, "{} publications: {verdict}", class.name());
    }
}
