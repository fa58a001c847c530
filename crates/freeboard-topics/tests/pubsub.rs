//! Pub/sub on loopback: fan-out across loops in order, slow subscribers under their policy,
//! HTTP publish and its token, and what a publish to nobody costs.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use freeboard::config::TopicsConfig;
use freeboard::{
    Conn, Handler, HttpRoute, Message, MessageKind, Published, RouteOptions, Router, RunningServer,
    Server, ServerConfig, SlowConsumerPolicy, Watermarks,
};
use freeboard_topics::TopicRoute;

fn start(
    config: ServerConfig,
    routes: impl Fn() -> Router + Send + Sync + 'static,
) -> RunningServer {
    Server::bind(config, routes).unwrap().spawn()
}

/// The hub's settings for topic subscribers with `policy` and a send cap of `cap`.
fn topics(policy: SlowConsumerPolicy, cap: usize) -> TopicsConfig {
    let mut topics = TopicsConfig::default();
    topics.slow_consumer = policy;
    topics.send_low = cap / 4;
    topics.send_high = cap / 2;
    topics.send_cap = cap;
    topics
}

fn stop(server: RunningServer) {
    let metrics = server.metrics();
    common::wait_until("connections to close", || metrics.connections() == 0);
    common::wait_until("subscriptions to end", || metrics.subscriptions() == 0);
    common::wait_until("the pool to return to idle", || metrics.total_chunks_in_use() == 0);
    assert_eq!(metrics.total_bytes_buffered(), 0, "closed queues are no longer counted");
    server.handle().shutdown();
    server.join().unwrap();
}

/// `(publisher, sequence)` from a payload `"{publisher}:{sequence}"`.
fn parse(payload: &[u8]) -> (String, u64) {
    let text = std::str::from_utf8(payload).unwrap();
    let (who, seq) = text.split_once(':').unwrap();
    (who.to_owned(), seq.trim_end_matches('x').parse().unwrap())
}

#[test]
fn every_subscriber_on_every_loop_gets_every_message_in_order() {
    const SUBSCRIBERS: usize = 12;
    const PER_THREAD: u64 = 500;
    const FROM_CLIENT: u64 = 200;
    let mut config = common::config();
    config.threads = 3;
    config.topics = topics(SlowConsumerPolicy::DropOldest, 4 << 20);
    let service = common::service(&config.topics, true);
    let server = start(config, move || service.mount(Router::new()));
    let addr = server.local_addr();
    let metrics = server.metrics();
    let mut subscribers: Vec<_> = (0..SUBSCRIBERS)
        .map(|_| {
            let (client, status, head) = common::Client::connect(addr, "/topic/news");
            assert_eq!(status, 101, "{head}");
            client
        })
        .collect();
    let (mut publisher, status, _) = common::Client::connect(addr, "/topic/news");
    assert_eq!(status, 101);
    common::wait_until("every subscription", || metrics.subscriptions() == SUBSCRIBERS as i64 + 1);

    let threads: Vec<_> = (0..2)
        .map(|i| {
            let handle = server.handle();
            std::thread::spawn(move || {
                for seq in 0..PER_THREAD {
                    let published =
                        handle.publish("news", MessageKind::Text, format!("t{i}:{seq}").as_bytes());
                    assert_eq!(published.dropped, 0);
                }
            })
        })
        .collect();
    for seq in 0..FROM_CLIENT {
        publisher.send(0x81, format!("c:{seq}").as_bytes());
    }
    for thread in threads {
        thread.join().unwrap();
    }

    let total = 2 * PER_THREAD + FROM_CLIENT;
    subscribers.push(publisher); // it is subscribed too
    for client in &mut subscribers {
        let mut next = std::collections::HashMap::new();
        for _ in 0..total {
            let (opcode, payload) = client.recv().expect("a published message");
            assert_eq!(opcode, 0x1);
            let (who, seq) = parse(&payload);
            let expected = next.entry(who.clone()).or_insert(0u64);
            assert_eq!(seq, *expected, "publisher {who} out of order or lost");
            *expected += 1;
        }
    }
    assert_eq!(metrics.drops_for("drop-oldest"), 0);
    assert_eq!(metrics.publishes(), total);
    common::wait_until("deliveries counted", || {
        metrics.deliveries() == total * (SUBSCRIBERS as u64 + 1)
    });
    drop(subscribers);
    stop(server);
}

/// One fast subscriber on `/fast/` (a large cap) and one that never reads on `/topic/` (a
/// 64 KiB cap under `policy`); 20,000 messages of 1 KiB published from a handle.
fn never_reading(
    policy: SlowConsumerPolicy,
) -> (common::Client, Arc<freeboard::Metrics>, RunningServer) {
    const CAP: usize = 64 << 10;
    const MESSAGES: u64 = 20_000;
    let mut config = common::config();
    config.topics = topics(policy, CAP);
    // Under `close` the slow subscriber is closed early in the publication, and reads its
    // close frame only after all of it: the drain must wait that long (the common 1 s can pass
    // on a slow build, such as the AddressSanitizer one, and drop the close frame unsent).
    config.limits.close_timeout = std::time::Duration::from_secs(60);
    let service = common::service(&config.topics, true);
    let server = start(config, move || {
        let fast = RouteOptions::new()
            .prefix()
            .slow_consumer(SlowConsumerPolicy::Close)
            .watermarks(Watermarks::new(1 << 20, 2 << 20, 16 << 20).unwrap());
        service.mount(Router::new()).route_with("/fast/", TopicRoute::new("/fast/", false), fast)
    });
    let addr = server.local_addr();
    let metrics = server.metrics();
    let (slow, status, _) = common::Client::connect(addr, "/topic/t");
    assert_eq!(status, 101);
    let (mut fast, status, _) = common::Client::connect(addr, "/fast/t");
    assert_eq!(status, 101);
    common::wait_until("both subscriptions", || metrics.subscriptions() == 2);
    let handle = server.handle();
    for batch in 0..MESSAGES / 500 {
        for seq in batch * 500..(batch + 1) * 500 {
            let mut payload = format!("h:{seq}").into_bytes();
            payload.resize(1024, b'x');
            assert_eq!(handle.publish("t", MessageKind::Text, &payload).dropped, 0);
        }
        for seq in batch * 500..(batch + 1) * 500 {
            let (_, payload) = fast.recv().expect("the fast subscriber gets every message");
            assert_eq!(parse(&payload).1, seq);
        }
    }
    // With the fast subscriber drained, the pool holds only the slow one's queue (at most its
    // cap, in chunks packed with up to three 1 KiB frames), a close frame and a handshake.
    common::wait_until("the slow queue to settle", || {
        metrics.total_chunks_in_use() <= (2 * CAP / 4096 + 2) as i64
    });
    // The slow subscriber's queue shows in the bytes_buffered gauge, never above its cap (it
    // may be empty: the kernel's socket buffers can take a conflated stream whole).
    common::wait_until("bytes_buffered to count the slow queue alone", || {
        let (buffered, chunks) = (metrics.total_bytes_buffered(), metrics.total_chunks_in_use());
        buffered <= CAP as i64 + 1024 && (buffered > 0) == (chunks > 0)
    });
    drop(fast);
    (slow, metrics, server)
}

/// Reads every frame the slow subscriber got: each parses whole, sequences only increase.
/// Returns the sequences.
fn read_all(client: &mut common::Client, until: u64) -> Vec<u64> {
    let mut seen: Vec<u64> = Vec::new();
    while seen.last() != Some(&until) {
        let (opcode, payload) = client.recv().expect("a whole frame");
        assert_eq!((opcode, payload.len()), (0x1, 1024), "a torn or foreign frame");
        let seq = parse(&payload).1;
        assert!(seen.last().is_none_or(|last| *last < seq), "{seq} after {:?}", seen.last());
        seen.push(seq);
    }
    seen
}

/// A publication written straight to an idle subscriber's socket, which takes only part of
/// it, has its rest queued ahead of everything after it: the subscriber reads every
/// publication whole and in order, and the pool gets every chunk back.
#[test]
fn a_publication_the_socket_takes_in_part_arrives_whole_and_in_order() {
    const PUBLICATIONS: u64 = 100;
    const SIZE: usize = 50 << 10; // a dozen pool chunks, written straight in one call
    let mut config = common::config();
    config.topics = topics(SlowConsumerPolicy::DropOldest, 16 << 20);
    let service = common::service(&config.topics, true);
    let server = start(config, move || service.mount(Router::new()));
    let metrics = server.metrics();
    let (mut slow, status, _) = common::Client::connect(server.local_addr(), "/topic/t");
    assert_eq!(status, 101);
    common::wait_until("the subscription", || metrics.subscriptions() == 1);
    // 5 MB to a subscriber that does not read yet: its socket fills part way through one.
    let handle = server.handle();
    for seq in 0..PUBLICATIONS {
        let mut payload = format!("h:{seq}").into_bytes();
        payload.resize(SIZE, b'x');
        assert_eq!(handle.publish("t", MessageKind::Text, &payload).dropped, 0);
    }
    for seq in 0..PUBLICATIONS {
        let (opcode, payload) = slow.recv().expect("a whole frame");
        assert_eq!((opcode, payload.len()), (0x1, SIZE), "a torn or foreign frame");
        assert_eq!(parse(&payload).1, seq, "lost or out of order");
    }
    assert_eq!(metrics.drops_for("drop-oldest"), 0);
    drop(slow);
    stop(server);
}

#[test]
fn conflate_keeps_a_never_reading_subscriber_under_its_cap_and_delivers_the_newest() {
    let (mut slow, metrics, server) = never_reading(SlowConsumerPolicy::Conflate);
    let seen = read_all(&mut slow, 19_999);
    assert!(seen.len() < 20_000);
    common::wait_until("every message delivered or counted", || {
        seen.len() as u64 + metrics.drops_for("conflate") == 20_000
    });
    assert!(metrics.drops_for("conflate") > 0);
    drop(slow);
    stop(server);
}

#[test]
fn a_new_subscriber_gets_its_101_before_any_message_under_conflate() {
    // Conflate replaces every unsent message: it once replaced the queued 101 response of a
    // subscriber whose first publication arrived in the same turn, so the client read a
    // frame where the response head belonged.
    const SUBSCRIBERS: usize = 300;
    let mut config = common::config();
    config.threads = 2;
    config.topics = topics(SlowConsumerPolicy::Conflate, 64 << 10);
    let service = common::service(&config.topics, true);
    let server = start(config, move || service.mount(Router::new()));
    let addr = server.local_addr();
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (handle, stop) = (server.handle(), stop_publishing.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                handle.publish("busy", MessageKind::Binary, b"tick");
            }
        })
    };
    for i in 0..SUBSCRIBERS {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        stream.write_all(common::upgrade_request("/topic/busy").as_bytes()).unwrap();
        let mut first = [0u8; 12];
        stream.read_exact(&mut first).unwrap_or_else(|e| panic!("subscriber {i}: {e}"));
        assert_eq!(&first, b"HTTP/1.1 101", "subscriber {i} read {first:?} first");
    }
    stop_publishing.store(true, Ordering::Relaxed);
    publisher.join().unwrap();
    stop(server);
}

#[test]
fn drop_oldest_never_tears_a_frame_for_a_never_reading_subscriber() {
    let (mut slow, metrics, server) = never_reading(SlowConsumerPolicy::DropOldest);
    let seen = read_all(&mut slow, 19_999);
    common::wait_until("every message delivered or counted", || {
        seen.len() as u64 + metrics.drops_for("drop-oldest") == 20_000
    });
    assert!(metrics.drops_for("drop-oldest") > 0);
    drop(slow);
    stop(server);
}

#[test]
fn close_policy_closes_a_never_reading_subscriber_with_1008() {
    let (mut slow, metrics, server) = never_reading(SlowConsumerPolicy::Close);
    assert_eq!(slow.recv_close(), Some(1008));
    assert_eq!(metrics.slow_consumer_closes(), 1);
    drop(slow);
    stop(server);
}

#[test]
fn http_publish_checks_the_bearer_token_and_the_length() {
    let mut config = common::config();
    config.limits.max_message_size = 4096;
    config.topics = topics(SlowConsumerPolicy::DropOldest, 1 << 20);
    config.topics.publish_token = Some("s3cret".into());
    let service = common::service(&config.topics, true);
    let server = start(config, move || service.mount(Router::new()));
    let addr = server.local_addr();
    let (mut sub, status, _) = common::Client::connect(addr, "/topic/scores");
    assert_eq!(status, 101);
    let post = |auth: &str, body: &str| {
        common::http(
            addr,
            &format!(
                "POST /topic/scores HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: text/plain\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    let answer = post("", "1-0");
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("WWW-Authenticate: Bearer"), "{answer}");
    let answer = post("Authorization: Bearer wrong\r\n", "1-0");
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let answer = post("Authorization: Bearer s3cret\r\n", "1-0");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let reach = "{\"messages\":1,\"delivered\":1,\"dropped\":0,\"other_loops\":0,\"other_loops_dropped\":0,\"complete\":true}\n";
    assert!(answer.ends_with(reach), "{answer}");
    assert_eq!(sub.recv(), Some((0x1, b"1-0".to_vec())));

    // A body that arrives after the head, in pieces.
    let mut s = TcpStream::connect(addr).unwrap();
    let body = vec![b'b'; 3000];
    write!(
        s,
        "POST /topic/scores HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    for piece in body.chunks(1000) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        s.write_all(piece).unwrap();
    }
    let mut answer = common::Client::raw(s);
    assert!(answer.read_head().starts_with("HTTP/1.1 200"));
    assert_eq!(sub.recv(), Some((0x2, body)), "no text/* type: binary");

    let big = common::http(
        addr,
        "POST /topic/scores HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n\
         Content-Length: 4097\r\n\r\n",
    );
    assert!(big.starts_with("HTTP/1.1 413"), "{big}");
    let bad = common::http(
        addr,
        "POST /topic/no%20such HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n\
         Content-Length: 0\r\n\r\n",
    );
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    drop(sub);
    stop(server);
}

/// Publishes every message it gets to `nobody` and to `echo`, recording what each reached.
struct Publisher {
    log: Arc<Mutex<Vec<Published>>>,
}

impl Handler for Publisher {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        assert_eq!(conn.subscribe("echo"), Ok(true));
        assert_eq!(conn.subscribe("echo"), Ok(false));
        assert!(conn.subscribe("no such").is_err());
    }

    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        let mut log = self.log.lock().unwrap();
        // Framed for nobody, these would all wait in the outbox until the handler returns.
        for _ in 0..999 {
            assert_eq!(conn.publish("nobody", message.kind, message.data), Published::default());
        }
        log.push(conn.publish("nobody", message.kind, message.data));
        if message.data == b"leave" {
            assert!(conn.unsubscribe("echo"));
            assert_eq!(conn.topics().count(), 0);
        }
        log.push(conn.publish("echo", message.kind, message.data));
    }
}

/// RFC 9112 framing: a body length that is not one run of digits, or several that disagree,
/// is refused rather than guessed at; the absolute form of a target is routed by its path.
#[test]
fn post_framing_follows_rfc_9112() {
    let config = common::config();
    let service = common::service(&config.topics, true);
    let server = start(config, move || service.mount(Router::new()));
    let addr = server.local_addr();
    let post = |lengths: &str| {
        common::http(addr, &format!("POST /topic/x HTTP/1.1\r\nHost: x\r\n{lengths}\r\nhi"))
    };
    for bad in [
        "Content-Length: +2\r\n",
        "Content-Length: 2\r\nContent-Length: 3\r\n",
        "Content-Length: 2, 3\r\n",
    ] {
        let answer = post(bad);
        assert!(answer.starts_with("HTTP/1.1 400"), "{bad:?} answered {answer:?}");
    }
    for good in ["Content-Length: 2\r\n", "Content-Length: 2\r\nContent-Length: 2\r\n"] {
        let answer = post(good);
        assert!(answer.starts_with("HTTP/1.1 200"), "{good:?} answered {answer:?}");
    }
    let absolute = "POST http://x/topic/x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi";
    let answer = common::http(addr, absolute);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    let (_, status, _) = common::Client::connect(addr, "http://x/topic/x");
    assert_eq!(status, 101, "an absolute-form upgrade target");
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn a_publish_to_nobody_costs_no_pool_chunks() {
    let mut config = common::config();
    config.threads = 2;
    let log = Arc::new(Mutex::new(Vec::new()));
    let shared = log.clone();
    let server = start(config, move || {
        Router::new()
            .route("/", Publisher { log: shared.clone() })
            .http("/topic/", HttpRoute::Publish)
    });
    let addr = server.local_addr();
    let metrics = server.metrics();
    assert_eq!(
        server.handle().publish("nobody", MessageKind::Binary, &[0; 4096]),
        Published::default()
    );
    let mut client = common::Client::open(addr);
    client.send(0x82, &[7; 3000]);
    assert_eq!(client.recv(), Some((0x2, vec![7; 3000])), "its own publish, by reference");
    client.send(0x81, b"leave");
    let mut post =
        common::http(addr, "POST /topic/nobody HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi");
    let reach = "{\"messages\":1,\"delivered\":0,\"dropped\":0,\"other_loops\":0,\"other_loops_dropped\":0,\"complete\":true}\n";
    assert!(post.ends_with(reach), "{post}");
    post.clear();
    common::wait_until("both messages handled", || log.lock().unwrap().len() == 4);
    assert_eq!(metrics.publishes(), 1 + 2 * 1001 + 1);
    let log = log.lock().unwrap().clone();
    let nobody = Published::default();
    let one = Published { loops: 1, ..Published::default() };
    assert_eq!(log, vec![nobody, one, nobody, nobody]);
    // 2,000 publishes to nobody: had they been framed, a thousand chunks would have been in use
    // at once. Only responses, the echo frame and the client's input ever held chunks.
    let high_water = metrics.total_chunks_high_water();
    assert!(high_water <= 8, "{high_water} chunks at the high-water mark");
    assert_eq!(metrics.topic_drops_for("pool"), 0);
    drop(client);
    stop(server);
}

#[test]
fn also_subscribes_to_more_topics_and_client_publish_needs_permission() {
    let config = common::config();
    let service = common::service(&config.topics, false);
    let server = start(config, move || service.mount(Router::new()));
    let addr = server.local_addr();
    let metrics = server.metrics();
    let (mut client, status, _) = common::Client::connect(addr, "/topic/a?also=b&also=c");
    assert_eq!(status, 101);
    common::wait_until("three subscriptions", || metrics.subscriptions() == 3);
    for topic in ["c", "a", "b"] {
        assert_eq!(server.handle().publish(topic, MessageKind::Text, topic.as_bytes()).loops, 1);
        assert_eq!(client.recv(), Some((0x1, topic.as_bytes().to_vec())));
    }
    let (_, status, _) = common::Client::connect(addr, "/topic/a?also=no%20such");
    assert_eq!(status, 400);
    client.send(0x81, b"may I?");
    assert_eq!(client.recv_close(), Some(1008));
    drop(client);
    stop(server);
}

/// Text commands on topic `t`: `pub:X` publishes `X`, `sub` and `unsub` (answered `ok:sub`,
/// `ok:unsub`), anything else is answered `ok:{it}`.
struct Commands;

impl Handler for Commands {
    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        let text = std::str::from_utf8(message.data).unwrap();
        match text.strip_prefix("pub:") {
            Some(payload) => {
                let _ = conn.publish("t", MessageKind::Text, payload.as_bytes());
            }
            None => {
                match text {
                    "sub" => assert_eq!(conn.subscribe("t"), Ok(true)),
                    "unsub" => assert!(conn.unsubscribe("t")),
                    _ => {}
                }
                let _ = conn.send(MessageKind::Text, format!("ok:{text}").as_bytes());
            }
        }
    }

    /// Tells the connection its queue went past its high watermark (a send from outside
    /// `on_message`, made while another connection's read may be handled).
    fn on_not_writable(&mut self, conn: &mut Conn<'_>) {
        let _ = conn.send(MessageKind::Text, b"ok:not-writable");
    }
}

/// Reads until the reply `ok:{marker}`; returns the publications seen, in order.
fn publications_until(client: &mut common::Client, marker: &str) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let (_, payload) = client.recv().expect("the marker's reply");
        let text = String::from_utf8(payload).unwrap();
        if text == format!("ok:{marker}") {
            return seen;
        }
        if !text.starts_with("ok:") {
            seen.push(text);
        }
    }
}

/// The publishes of one read wait until the read's messages are handled, then go out
/// subscriber by subscriber; subscribing or leaving in between still decides exactly which
/// of them a connection gets, as if each had gone out at once.
#[test]
fn a_reads_publishes_reach_exactly_who_was_subscribed_when_each_was_made() {
    let server = start(common::config(), || Router::new().route("/", Commands));
    let addr = server.local_addr();
    let (mut steady, mut hopper, mut joiner) =
        (common::Client::open(addr), common::Client::open(addr), common::Client::open(addr));
    for client in [&mut steady, &mut hopper] {
        client.send(0x81, b"sub");
        assert_eq!(publications_until(client, "sub"), Vec::<String>::new());
    }
    let frame =
        |text: &str| freeboard_test::frame(0x81, text.as_bytes(), freeboard_test::TEST_MASK);
    // Sends `texts` in one write, then (once the read's replies are in) `end` in another: a
    // later read, so its reply comes after the first read's publications.
    let one_read = |client: &mut common::Client, texts: &[&str]| {
        let bytes: Vec<u8> = texts.iter().chain(&["mark"]).flat_map(|t| frame(t)).collect();
        client.stream.write_all(&bytes).unwrap();
        let mut seen = publications_until(client, "mark");
        client.send(0x81, b"end");
        seen.extend(publications_until(client, "end"));
        seen
    };
    // The hopper leaves, comes back and leaves again within one read: it ends outside the
    // topic, with two publications owed.
    let texts = ["pub:1", "unsub", "pub:2", "sub", "pub:3", "unsub", "pub:4"];
    assert_eq!(one_read(&mut hopper, &texts), ["1", "3"]);
    // The joiner subscribes between two publishes of its own read.
    assert_eq!(one_read(&mut joiner, &["pub:5", "sub", "pub:6", "pub:7"]), ["6", "7"]);
    steady.send(0x81, b"end");
    assert_eq!(publications_until(&mut steady, "end"), ["1", "2", "3", "4", "5", "6", "7"]);
    drop((steady, hopper, joiner));
    common::stop_once_idle(server);
}

/// A subscriber's handler that sends while the publisher's read is being handled (its queue
/// crossed its high watermark with a publication) sends to itself: the cork, lent to the
/// connection being read, holds the publisher's replies alone.
#[test]
fn a_subscriber_handler_called_during_anothers_read_sends_to_its_own_connection() {
    const PUBLICATIONS: usize = 20;
    const SIZE: usize = 400 << 10;
    let mut config = common::config();
    (config.limits.send_low, config.limits.send_high) = (512, 1024);
    // 8 MB for a subscriber that does not read: more than the socket buffers hold, and under
    // the cap, so nothing is dropped.
    config.limits.send_cap = 16 << 20;
    let server = start(config, || Router::new().route("/", Commands));
    let addr = server.local_addr();
    let (mut publisher, mut subscriber) = (common::Client::open(addr), common::Client::open(addr));
    subscriber.send(0x81, b"sub");
    assert_eq!(publications_until(&mut subscriber, "sub"), Vec::<String>::new());
    let payload = format!("pub:{}", "x".repeat(SIZE));
    let texts = std::iter::repeat_n(payload.as_str(), PUBLICATIONS).chain(["mark"]);
    let frame = |t: &str| freeboard_test::frame(0x81, t.as_bytes(), freeboard_test::TEST_MASK);
    publisher.stream.write_all(&texts.flat_map(frame).collect::<Vec<u8>>()).unwrap();
    let mut replies = Vec::new();
    let mut read_until = |client: &mut common::Client, marker: &str| loop {
        let (_, payload) = client.recv().unwrap();
        let text = String::from_utf8(payload).unwrap();
        if text == marker {
            break;
        }
        replies.push(text);
    };
    read_until(&mut publisher, "ok:mark");
    publisher.send(0x81, b"end");
    read_until(&mut publisher, "ok:end");
    assert!(replies.is_empty(), "the publisher got {:?}", replies.iter().map(|r| &r[..16]));
    subscriber.send(0x81, b"end");
    let (mut seen, mut not_writable) = (0, false);
    loop {
        let (opcode, payload) = subscriber.recv().unwrap();
        assert_eq!(opcode, 0x1, "{payload:?}");
        match std::str::from_utf8(&payload).unwrap() {
            "ok:end" => break,
            "ok:not-writable" => not_writable = true,
            text => {
                assert_eq!(text.len(), SIZE, "{}", &text[..16]);
                seen += 1;
            }
        }
    }
    assert_eq!(seen, PUBLICATIONS);
    assert!(not_writable, "its queue crossed the high watermark");
    drop((publisher, subscriber));
    common::stop_once_idle(server);
}
