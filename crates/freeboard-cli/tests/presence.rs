//! Presence (`--presence-prefix`) on real `freeboard serve` processes: listings and counts
//! paginated and behind the subscribe path's access rules, join/leave events in order per
//! connection, and — across two nodes on a real `redis-server` — a subscriber killed with
//! SIGKILL, then a whole node killed, leaving the other node's listing within the TTL.
//! Everything talks to 127.0.0.1 and is stopped by PID.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Serve;
use freeboard_test::{Inbox, frame, hs256_jwt};

const SECRET: &str = "a secret of at least thirty-two bytes!";

/// A `GET` on `addr`: the status and the body.
fn get(addr: &str, target: &str, extra: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!("GET {target} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

/// Every member of `topic` on `addr`, page by page (`limit` each), as `(node, id)`; checks
/// that no page is longer than asked.
fn members(addr: &str, topic: &str, limit: usize) -> Vec<serde_json::Value> {
    let (mut all, mut cursor) = (Vec::new(), String::new());
    loop {
        let target = format!("/topic/{topic}/presence?limit={limit}&cursor={cursor}");
        let (status, body) = get(addr, &target, "");
        assert_eq!(status, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        let list = page["members"].as_array().unwrap();
        assert!(list.len() <= limit, "{} members in a page of {limit}", list.len());
        all.extend(list.iter().cloned());
        match page["next"].as_str() {
            Some(next) => cursor = next.to_owned(),
            None => return all,
        }
    }
}

/// A WebSocket on `target`, its 101 read.
fn subscribe(addr: &str, target: &str, extra: &str) -> (TcpStream, Inbox) {
    common::upgrade(TcpStream::connect(addr).unwrap(), target, extra)
}

/// The next presence event a watcher gets, as JSON (publications are not expected).
fn event(s: &mut TcpStream, inbox: &mut Inbox) -> serde_json::Value {
    let f = inbox.frame(s).unwrap().expect("a presence event");
    let text = String::from_utf8(f.payload).unwrap();
    let json = text.strip_prefix("freeboard-presence:").unwrap_or_else(|| panic!("{text}"));
    serde_json::from_str(json).unwrap()
}

/// `freeboard client` subscribed to `url`, its stdin held open so that it stays.
fn client(url: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_freeboard"))
        .args(["client", url])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Polls `check` every 50 ms until it holds; how long that took (panics after `limit`).
fn within(limit: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

#[test]
fn listings_are_paginated_counted_and_refused_where_presence_is_off() {
    let serve = Serve::start(&["--presence-prefix", "room", "--presence-max-per-topic", "30"]);
    let addr = &serve.addr;
    let mut held: Vec<_> = (0..25).map(|_| subscribe(addr, "/topic/room1", "")).collect();
    let all = members(addr, "room1", 10);
    assert_eq!(all.len(), 25);
    let mut ids: Vec<_> = all.iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect();
    ids.dedup();
    assert_eq!(ids.len(), 25, "each member once across pages");
    assert_eq!(
        get(addr, "/topic/room1/presence/count", ""),
        (200, r#"{"topic":"room1","count":25}"#.into())
    );
    // A page never holds more than the maximum, whatever is asked.
    let (_, body) = get(addr, "/topic/room1/presence?limit=1000000", "");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["members"]
            .as_array()
            .unwrap()
            .len(),
        25
    );
    // Empty, not unknown: nobody subscribes to room2 yet.
    assert_eq!(get(addr, "/topic/room2/presence/count", "").0, 200);
    let (status, body) = get(addr, "/topic/lobby/presence", "");
    assert_eq!(status, 400);
    assert!(body.contains("has no presence"), "{body}");
    let (status, _) = get(addr, "/topic/a%20b/presence", "");
    assert_eq!(status, 404);
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(freeboard_test::upgrade_request("/topic/lobby?presence=1", "").as_bytes()).unwrap();
    let head = Inbox::default().head(&mut s).unwrap().expect("a response");
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    // The cap: the 31st member is refused, closed with 1013, counted.
    for _ in 0..5 {
        held.push(subscribe(addr, "/topic/room1", ""));
    }
    let (mut s, mut inbox) = subscribe(addr, "/topic/room1", "");
    let close = inbox.frame(&mut s).unwrap().expect("a close");
    assert_eq!((close.opcode, &close.payload[..2]), (0x8, &1013u16.to_be_bytes()[..]));
    let (_, metrics) = get(addr, "/metrics", "");
    assert!(
        metrics.contains("freeboard_topic_refusals_total{reason=\"presence_topic_full\"} 1"),
        "{metrics}"
    );
    // A publication that would read as an event is refused.
    let mut post = TcpStream::connect(addr).unwrap();
    let body = "freeboard-presence:{}";
    let request = format!(
        "POST /topic/room1 HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    post.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = post.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
}

#[test]
fn listings_need_what_subscribing_needs_and_show_the_allowed_claims() {
    let serve = Serve::start(&[
        "--presence-prefix",
        "room",
        "--presence-claims",
        "name,team",
        "--jwt-secret",
        SECRET,
    ]);
    let addr = &serve.addr;
    let exp =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 600;
    let alice = hs256_jwt(
        SECRET,
        &format!(
            r#"{{"sub":"alice","exp":{exp},"subscribe":["room*"],"name":"Alice","team":7,"secret":"x"}}"#
        ),
    );
    let other = hs256_jwt(SECRET, &format!(r#"{{"sub":"bob","exp":{exp},"subscribe":["lobby"]}}"#));
    let _alice = subscribe(addr, "/topic/room1", &format!("Authorization: Bearer {alice}\r\n"));
    assert_eq!(get(addr, "/topic/room1/presence", "").0, 401);
    assert_eq!(get(addr, "/topic/room1/presence/count", "").0, 401);
    assert_eq!(
        get(addr, "/topic/room1/presence", &format!("Authorization: Bearer {other}\r\n")).0,
        403
    );
    let (status, body) = get(addr, &format!("/topic/room1/presence?access_token={alice}"), "");
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    let member = &page["members"][0];
    assert_eq!(member["sub"], "alice");
    assert_eq!(
        member["claims"],
        serde_json::json!({"name": "Alice", "team": 7}),
        "only the allowed claims"
    );
}

#[test]
fn join_and_leave_events_arrive_in_order_per_connection() {
    let serve = Serve::start(&["--presence-prefix", "room", "--threads", "2"]);
    let addr = &serve.addr;
    let (mut watcher, mut inbox) = subscribe(addr, "/topic/room1?presence=1", "");
    let own = event(&mut watcher, &mut inbox);
    assert_eq!(own["event"], "join", "the watcher's own join first");
    // 40 connections, on both loops, each joining and leaving at once.
    for _ in 0..40 {
        let (s, _) = subscribe(addr, "/topic/room1", "");
        drop(s);
    }
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    let mut events = 0;
    while events < 80 {
        let e = event(&mut watcher, &mut inbox);
        assert_eq!(e["topic"], "room1");
        seen.entry(e["id"].as_str().unwrap().to_owned())
            .or_default()
            .push(e["event"].as_str().unwrap().to_owned());
        events += 1;
    }
    assert_eq!(seen.len(), 40);
    for (id, order) in &seen {
        assert_eq!(order, &["join", "leave"], "connection {id}");
    }
    // Nobody but the watcher is left.
    within(Duration::from_secs(5), "leaves counted", || {
        get(addr, "/topic/room1/presence/count", "").1.contains("\"count\":1}")
    });
    // A client's publication that would read as an event is closed 1008 (client publishing on).
    drop(serve);
    let serve = Serve::start(&["--presence-prefix", "room", "--client-publish"]);
    let (mut s, mut inbox) = subscribe(&serve.addr, "/topic/room1", "");
    s.write_all(&frame(0x81, b"freeboard-presence:{}", Some([1, 2, 3, 4]))).unwrap();
    let close = inbox.frame(&mut s).unwrap().expect("a close");
    assert_eq!((close.opcode, &close.payload[..2]), (0x8, &1008u16.to_be_bytes()[..]));
}

#[test]
fn across_two_nodes_a_killed_subscriber_and_a_killed_node_leave_within_the_ttl() {
    let port = common::free_port();
    let Some(_redis) = common::redis_server(port) else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let url = format!("redis://127.0.0.1:{port}/");
    const TTL: Duration = Duration::from_secs(3);
    let flags = ["--redis", &url, "--presence-prefix", "room", "--presence-ttl", "3s"];
    let mut a = Serve::start(&flags);
    let b = Serve::start(&flags);
    let (mut watcher, mut inbox) = subscribe(&b.addr, "/topic/room1?presence=1", "");
    let own = event(&mut watcher, &mut inbox);
    let b_node = own["node"].as_str().unwrap().to_owned();
    let mut first = client(&format!("ws://{}/topic/room1", a.addr));
    let mut second = client(&format!("ws://{}/topic/room1", a.addr));
    let on_a = |addr: &str| {
        let all = members(addr, "room1", 2);
        all.into_iter().filter(|m| m["node"] != b_node.as_str()).collect::<Vec<_>>()
    };
    within(Duration::from_secs(10), "A's members listed on B", || on_a(&b.addr).len() == 2);
    let joins = [event(&mut watcher, &mut inbox), event(&mut watcher, &mut inbox)];
    assert!(
        joins.iter().all(|e| e["event"] == "join" && e["node"] != b_node.as_str()),
        "{joins:?}"
    );
    let a_node = joins[0]["node"].as_str().unwrap().to_owned();
    assert_eq!(on_a(&a.addr).len(), 2, "A lists its own");

    // A subscriber killed: A sees its connection end, B's listing follows.
    let killed_id = {
        first.kill().unwrap(); // SIGKILL
        first.wait().unwrap();
        let gone =
            within(TTL, "the killed subscriber left B's listing", || on_a(&b.addr).len() == 1);
        eprintln!("killed subscriber gone from node B after {gone:?}");
        let left = event(&mut watcher, &mut inbox);
        assert_eq!(
            (left["event"].as_str(), left["node"].as_str()),
            (Some("leave"), Some(a_node.as_str()))
        );
        left["id"].as_str().unwrap().to_owned()
    };
    assert!(
        joins.iter().any(|j| j["id"] == killed_id.as_str()),
        "the leave is of a member that joined"
    );

    // Node A killed: its part expires, B lists none of its members and tells its watcher.
    a.signal(libc::SIGKILL);
    a.wait();
    let gone = within(TTL + Duration::from_secs(1), "the dead node left B's listing", || {
        on_a(&b.addr).is_empty()
    });
    eprintln!("dead node's members gone from node B after {gone:?} (TTL {TTL:?})");
    let left = event(&mut watcher, &mut inbox);
    assert_eq!(
        (left["event"].as_str(), left["node"].as_str()),
        (Some("leave"), Some(a_node.as_str()))
    );
    assert_ne!(left["id"], killed_id.as_str());
    let _ = second.kill();
    let _ = second.wait();
}

#[test]
fn a_restarted_redis_gets_every_nodes_members_again() {
    let port = common::free_port();
    let Some(redis) = common::redis_server(port) else {
        eprintln!("redis-server is not installed: skipped");
        return;
    };
    let url = format!("redis://127.0.0.1:{port}/");
    let flags = ["--redis", &url, "--presence-prefix", "room", "--presence-ttl", "2s"];
    let a = Serve::start(&flags);
    let b = Serve::start(&flags);
    let (_held, _) = subscribe(&a.addr, "/topic/room1", "");
    let count = |addr: &str| get(addr, "/topic/room1/presence/count", "").1;
    within(Duration::from_secs(10), "A's member listed on B", || {
        count(&b.addr).contains("\"count\":1}")
    });
    // Redis gone, its data with it: past the TTL, B can no longer vouch for A's member; A
    // still lists its own.
    drop(redis);
    within(Duration::from_secs(10), "A's member dropped by B", || {
        count(&b.addr).contains("\"count\":0}")
    });
    assert!(count(&a.addr).contains("\"count\":1}"));
    // A new, empty Redis: A writes its part afresh, B reads it.
    let _redis = common::redis_server(port).expect("redis-server again");
    let back = within(Duration::from_secs(15), "A's member listed on B again", || {
        count(&b.addr).contains("\"count\":1}")
    });
    eprintln!("listed again {back:?} after Redis restarted");
}
