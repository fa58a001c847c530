//! The client that resumes (`freeboard::client::Subscription`, `freeboard client --reconnect
//! --offsets`) against a real `freeboard serve --history`, its connections cut by a loopback
//! proxy (`freeboard_test::proxy::CutProxy`) or its server restarted.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use common::{Process, Serve};
use freeboard::client::resume::{Backoff, OffsetToken, Resume};
use freeboard::client::{
    ClientConfig, Subscription, SubscriptionEvent, SubscriptionHandler, SubscriptionId,
    SubscriptionLoop,
};
use freeboard_test::proxy::CutProxy;

/// `POST /topic/{topic}` with `headers`; the status.
fn post(addr: &str, topic: &str, headers: &str, body: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /topic/{topic} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// A subscription with short waits between attempts, seeded.
fn subscription(url: &str) -> Subscription {
    let backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(200));
    Subscription::with_resume(Resume::with_seed(url, backoff, 37), ClientConfig::default())
}

/// Receives on `feed` until `last` is delivered (20 s at most): the payloads, and the offsets
/// of those that had one.
fn collect(feed: &mut Subscription, last: &str) -> (Vec<String>, Vec<OffsetToken>) {
    let (mut payloads, mut offsets) = (Vec::new(), Vec::new());
    let until = Instant::now() + Duration::from_secs(20);
    while payloads.last().map(String::as_str) != Some(last) {
        assert!(Instant::now() < until, "{last} never came; got {} messages", payloads.len());
        match feed.recv_timeout(Duration::from_millis(100)).unwrap() {
            Some(SubscriptionEvent::Message { offset, payload, .. }) => {
                payloads.push(String::from_utf8(payload.to_vec()).unwrap());
                offsets.extend(offset.cloned());
            }
            Some(SubscriptionEvent::Closed(close)) => panic!("closed for good: {close:?}"),
            Some(SubscriptionEvent::Gone { last }) => panic!("4410 after {last:?}"),
            _ => {}
        }
    }
    (payloads, offsets)
}

/// Waits until the node has `n` subscriptions to topics.
fn subscribed(addr: &str, n: usize) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        let count = body
            .lines()
            .find(|l| l.starts_with("freeboard_topic_subscriptions "))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        if count == Some(n as f64) {
            return;
        }
        assert!(Instant::now() < until, "{n} subscriptions never seen: {count:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Cuts every connection through `proxy` once all `n` subscribers are connected through it
/// again after `cuts` earlier cuts: every cut meets each subscriber live.
fn cut_all(proxy: &CutProxy, n: u64, cuts: u64) {
    let until = Instant::now() + Duration::from_secs(20);
    while proxy.accepted() < n * (cuts + 1) {
        assert!(Instant::now() < until, "the subscribers did not come back");
        thread::sleep(Duration::from_millis(2));
    }
    proxy.cut();
}

/// 400 publications while the subscriber's connection is cut every 40 (once it is back):
/// each cut is a reconnect with `since`, and the subscriber gets all 400 once, in order, offsets rising.
#[test]
fn a_subscription_cut_ten_times_delivers_every_publication_once_in_order() {
    let serve = Serve::start(&["--history", "1000"]);
    let proxy = Arc::new(CutProxy::start(serve.socket_addr()));
    let mut feed = subscription(&format!("ws://{}/topic/feed", proxy.addr));
    let (tx, rx) = mpsc::channel();
    let publisher = {
        let (addr, proxy) = (serve.addr.clone(), Arc::clone(&proxy));
        thread::spawn(move || {
            // The subscriber is there before the first publication.
            let _ = rx.recv();
            for i in 0..400 {
                assert_eq!(post(&addr, "feed", "", &format!("m{i}")), 200);
                if i % 40 == 39 {
                    cut_all(&proxy, 1, i / 40);
                }
            }
        })
    };
    match feed.recv().unwrap() {
        SubscriptionEvent::Opened { since: None } => {}
        other => panic!("{other:?}"),
    }
    subscribed(&serve.addr, 1);
    tx.send(()).unwrap();
    let (payloads, offsets) = collect(&mut feed, "m399");
    publisher.join().unwrap();
    let want: Vec<String> = (0..400).map(|i| format!("m{i}")).collect();
    assert_eq!(payloads, want, "every publication once, in order");
    assert_eq!(offsets.len(), 400, "each with its offset");
    assert!(offsets.windows(2).all(|w| w[1].is_after(&w[0]) == Some(true)), "offsets rise");
    let stats = feed.stats();
    // The last cut may come after m399 arrived.
    assert!(stats.reconnects >= 9, "each cut ended a connection or an attempt: {stats:?}");
    assert_eq!(stats.gone, 0, "{stats:?}");
}

/// What each subscription of a loop delivered, and how many opened.
#[derive(Default)]
struct Delivered {
    payloads: Vec<Vec<String>>,
    opened: usize,
}

impl SubscriptionHandler for Delivered {
    fn on_event(&mut self, id: SubscriptionId, event: SubscriptionEvent<'_>) {
        match event {
            SubscriptionEvent::Message { payload, .. } => {
                self.payloads[id.0].push(String::from_utf8(payload.to_vec()).unwrap())
            }
            SubscriptionEvent::Opened { .. } => self.opened += 1,
            SubscriptionEvent::Gone { last } => panic!("{id:?}: 4410 after {last:?}"),
            SubscriptionEvent::Closed(close) => panic!("{id:?}: closed for good: {close:?}"),
            SubscriptionEvent::Failed(e) => panic!("{id:?}: {e}"),
            SubscriptionEvent::Reconnecting { .. } => {}
        }
    }
}

/// The same on a client loop: 20 subscriptions in one thread, all cut every 40 publications
/// of 200, each gets all 200 once, in order.
#[test]
fn a_subscription_loop_resumes_each_of_its_subscriptions() {
    let serve = Serve::start(&["--history", "1000"]);
    let proxy = Arc::new(CutProxy::start(serve.socket_addr()));
    let n = 20;
    let handler = Delivered { payloads: vec![Vec::new(); n], opened: 0 };
    let mut subs = SubscriptionLoop::new(ClientConfig::default(), handler).unwrap();
    let backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(200));
    let ids: Vec<SubscriptionId> = (0..n as u64)
        .map(|i| {
            let url = format!("ws://{}/topic/many", proxy.addr);
            subs.subscribe(Resume::with_seed(&url, backoff, i))
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(20);
    while subs.handler().opened < n {
        assert!(Instant::now() < until, "not all opened");
        subs.turn(Duration::from_millis(50)).unwrap();
    }
    subscribed(&serve.addr, n);
    let publisher = {
        let (addr, proxy) = (serve.addr.clone(), Arc::clone(&proxy));
        thread::spawn(move || {
            for i in 0..200 {
                assert_eq!(post(&addr, "many", "", &format!("m{i}")), 200);
                if i % 40 == 39 {
                    cut_all(&proxy, n as u64, i / 40);
                }
            }
        })
    };
    let want: Vec<String> = (0..200).map(|i| format!("m{i}")).collect();
    let until = Instant::now() + Duration::from_secs(30);
    while subs.handler().payloads.iter().any(|p| p.len() < want.len()) {
        if Instant::now() >= until {
            let lens: Vec<_> = subs.handler().payloads.iter().map(Vec::len).collect();
            let stats: Vec<_> = ids.iter().map(|&id| subs.stats(id)).collect();
            panic!("not all delivered: {lens:?} {stats:?} conns {}", subs.connections());
        }
        subs.turn(Duration::from_millis(50)).unwrap();
    }
    publisher.join().unwrap();
    for id in ids {
        assert_eq!(subs.handler().payloads[id.0], want, "{id:?}");
        assert!(subs.stats(id).reconnects >= 4, "{:?}", subs.stats(id));
    }
}

/// A server restarted loses its local history: the offset the subscriber resumes from is of
/// another life, the server says 4410, and the subscription reports it as `Gone`, then goes
/// on from the new stream without `since`.
#[test]
fn a_restarted_server_is_reported_as_gone_and_the_subscription_starts_afresh() {
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut first = Serve::start(&["--history", "100", "--listen", &listen]);
    let mut feed = subscription(&format!("ws://{listen}/topic/news"));
    assert!(matches!(feed.recv().unwrap(), SubscriptionEvent::Opened { .. }));
    subscribed(&listen, 1);
    assert_eq!(post(&listen, "news", "", "before"), 200);
    let (payloads, _) = collect(&mut feed, "before");
    assert_eq!(payloads, ["before"]);
    let resumed_from = feed.resume().last().cloned().expect("an offset");

    first.signal(libc::SIGTERM);
    assert!(first.wait().success());
    let second = Serve::start(&["--history", "100", "--listen", &listen]);
    let until = Instant::now() + Duration::from_secs(20);
    let gone = loop {
        assert!(Instant::now() < until, "no 4410 came");
        match feed.recv_timeout(Duration::from_millis(100)).unwrap() {
            Some(SubscriptionEvent::Gone { last }) => break last,
            Some(SubscriptionEvent::Message { payload, .. }) => {
                panic!("a message before 4410: {payload:?}")
            }
            _ => {}
        }
    };
    assert_eq!(gone, Some(resumed_from));
    assert_eq!(feed.resume().url(), format!("ws://{listen}/topic/news"), "no since any more");
    loop {
        match feed.recv_timeout(Duration::from_secs(20)).unwrap() {
            Some(SubscriptionEvent::Opened { since: None }) => break,
            Some(SubscriptionEvent::Reconnecting { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    subscribed(&second.addr, 1);
    assert_eq!(post(&second.addr, "news", "", "after"), 200);
    assert_eq!(collect(&mut feed, "after").0, ["after"]);
    assert_eq!(feed.stats().gone, 1);
}

/// With JWT access, the token comes from the application's callback before every attempt:
/// the first (forged) is refused with 401, which is retried, and the next one opens.
#[test]
fn every_attempt_asks_for_a_fresh_token() {
    const SECRET: &str = "a secret of at least thirty-two bytes";
    let serve = Serve::start(&["--history", "10", "--jwt-secret", SECRET]);
    let far = 4_102_444_800u64; // 2100
    let claims = format!(r#"{{"exp":{far},"subscribe":["vip"],"publish":["vip"]}}"#);
    let valid = freeboard_test::hs256_jwt(SECRET, &claims);
    let calls = Arc::new(AtomicUsize::new(0));
    let mut feed = subscription(&format!("ws://{}/topic/vip", serve.addr)).token({
        let (calls, valid) = (Arc::clone(&calls), valid.clone());
        move || match calls.fetch_add(1, Ordering::Relaxed) {
            0 => Some("forged.token.x".to_owned()),
            _ => Some(valid.clone()),
        }
    });
    match feed.recv().unwrap() {
        SubscriptionEvent::Reconnecting { cause, .. } => assert!(cause.contains("401"), "{cause}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(feed.recv().unwrap(), SubscriptionEvent::Opened { .. }));
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    subscribed(&serve.addr, 1);
    assert_eq!(post(&serve.addr, "vip", &format!("Authorization: Bearer {valid}\r\n"), "in"), 200);
    assert_eq!(collect(&mut feed, "in").0, ["in"]);
}

/// `freeboard client --listen --reconnect --offsets` across a cut: each message once, as
/// `OFFSET:payload`, offsets rising.
#[test]
fn the_cli_client_resumes_and_prints_offsets() {
    let serve = Serve::start(&["--history", "100"]);
    let proxy = CutProxy::start(serve.socket_addr());
    let url = format!("ws://{}/topic/cli", proxy.addr);
    let mut child = Process(
        Command::new(env!("CARGO_BIN_EXE_freeboard"))
            .args(["client", "--listen", "--reconnect", "--offsets", &url])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (tx, lines) = mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    subscribed(&serve.addr, 1);
    for i in 0..20 {
        assert_eq!(post(&serve.addr, "cli", "", &format!("a{i}")), 200);
    }
    let mut got: Vec<String> =
        (0..20).map(|_| lines.recv_timeout(Duration::from_secs(20)).unwrap()).collect();
    assert!(proxy.cut() >= 1);
    for i in 0..20 {
        assert_eq!(post(&serve.addr, "cli", "", &format!("b{i}")), 200);
    }
    got.extend((0..20).map(|_| lines.recv_timeout(Duration::from_secs(20)).unwrap()));
    assert!(lines.recv_timeout(Duration::from_millis(300)).is_err(), "nothing twice");
    let split: Vec<(OffsetToken, &str)> = got
        .iter()
        .map(|line| {
            let (offset, payload) = line.split_once(':').unwrap();
            (OffsetToken::parse(offset).expect(line), payload)
        })
        .collect();
    let want: Vec<String> =
        (0..20).map(|i| format!("a{i}")).chain((0..20).map(|i| format!("b{i}"))).collect();
    assert_eq!(split.iter().map(|(_, p)| p.to_string()).collect::<Vec<_>>(), want);
    assert!(split.windows(2).all(|w| w[1].0.is_after(&w[0].0) == Some(true)));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}

/// `freeboard bench drops`, briefly: the resuming client gets every publication once across
/// the drops, beside the baseline that reconnects without `since` in the same run.
#[test]
#[cfg(feature = "bench")]
fn the_drops_benchmark_reports_the_resuming_client_beside_the_baseline() {
    let out = Command::new(env!("CARGO_BIN_EXE_freeboard"))
        .args(["bench", "drops", "--subscribers", "3", "--rate", "50", "--duration", "6"])
        .args(["--every", "2", "--outage", "0.5"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}{}", String::from_utf8_lossy(&out.stderr));
    let row = |kind: &str| -> Vec<String> {
        let line = table.lines().find(|l| l.starts_with(&format!("| {kind} |"))).expect(kind);
        line.split('|').map(|c| c.trim().to_owned()).filter(|c| !c.is_empty()).collect()
    };
    let resuming = row("resuming");
    assert_eq!((resuming[1].as_str(), resuming[2].as_str()), ("100.000 %", "0"), "{table}");
    let baseline = row("baseline");
    assert!(baseline[1].ends_with('%'), "{table}");
    assert!(table.contains(" drops)"), "{table}");
}
