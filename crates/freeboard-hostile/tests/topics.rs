//! Topics against the budget and the books: subscriptions by the ten thousand are held inside
//! the memory budget and give their memory back when they go; subscribers that never read
//! under a flood of large publications lose only what is counted, under every slow-consumer
//! policy. An innocent client echoes beside each attack.

use std::time::Duration;

use freeboard_hostile::topics::{Publisher, drain, subscribe_many};
use freeboard_hostile::{Serve, Watch, WsClient, raise_fd_limit, upgrade_request};

/// The attacks run one at a time: each measures an innocent client beside one attack.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The budget the attacks run under.
const BUDGET_KIB: u64 = 16 << 10;

/// Subscribers, each on its own topic, that read nothing until the publishing is over.
const SUBSCRIBERS: usize = 40;
/// Publications of [`PAYLOAD`] bytes, spread round robin over the subscribers' topics.
const PUBLICATIONS: usize = 6_000;
const PAYLOAD: usize = 64 << 10;
/// Publishing threads; publisher `p` publishes to the topics `i` with `i % PUBLISHERS == p`,
/// so each topic has one publisher and its sequence numbers only go up.
const PUBLISHERS: usize = 4;

/// 40 subscribers that never read, each on its own topic, and 6,000 publications of 64 KiB
/// over those topics (`--memory 16M`); then each subscriber reads what it can and closes.
/// Every publication answered 200 is received by its subscriber, in order, or counted as a
/// drop by reason (`drops_total`: the policy's, `pool_exhausted`, `closed`;
/// `topic_drops_total`): nothing goes uncounted, under `policy`.
fn every_publication_is_accounted_for(policy: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let serve = Serve::start(&["--memory", "16M", "--topic-slow-consumer", policy]);
    let addr = serve.addr();
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let subscribers: Vec<WsClient> = (0..SUBSCRIBERS)
        .map(|i| {
            let request = upgrade_request(&format!("/topic/books{i}"), "");
            let (client, status, head) = WsClient::handshake(addr, &request).expect("upgrade");
            assert_eq!(status, 101, "{head}");
            client
        })
        .collect();
    serve
        .wait_metrics("every subscription", |m| m.get("topic_subscriptions") == SUBSCRIBERS as f64);
    // Publications answered 200, by topic.
    let published: Vec<u64> = std::thread::scope(|scope| {
        let publishers: Vec<_> = (0..PUBLISHERS)
            .map(|p| {
                scope.spawn(move || {
                    let mut ok = vec![0u64; SUBSCRIBERS];
                    let mut publisher = Publisher::connect(addr).expect("connect");
                    let mut body = vec![0x5au8; PAYLOAD];
                    for n in (p..PUBLICATIONS).step_by(PUBLISHERS) {
                        let topic = n % SUBSCRIBERS;
                        let seq = (n / SUBSCRIBERS) as u64;
                        body[..8].copy_from_slice(&seq.to_le_bytes());
                        match publisher.publish(&format!("books{topic}"), &body) {
                            Ok(answer) if answer.status == 200 => ok[topic] += 1,
                            // Taken, and lost where it had to go (the loop of its subscriber
                            // could not take it): counted in `topic_drops_total`.
                            Ok(answer)
                                if answer.status == 503
                                    && answer.body.contains("\"other_loops_dropped\"") =>
                            {
                                ok[topic] += 1
                            }
                            // Refused (503 when the pool cannot hold the body, and the server
                            // closes after it): not published; a new connection.
                            _ => publisher = Publisher::connect(addr).expect("connect"),
                        }
                    }
                    ok
                })
            })
            .collect();
        let mut total = vec![0u64; SUBSCRIBERS];
        for publisher in publishers {
            for (t, n) in publisher.join().expect("publisher").into_iter().enumerate() {
                total[t] += n;
            }
        }
        total
    });
    let drained: Vec<_> = std::thread::scope(|scope| {
        let readers: Vec<_> = subscribers
            .into_iter()
            .map(|client| scope.spawn(move || drain(client, Duration::from_millis(700))))
            .collect();
        readers.into_iter().map(|r| r.join().expect("reader").expect("drain")).collect()
    });
    let after = serve.wait_metrics("the subscribers gone", |m| m.get("topic_subscriptions") == 0.0);
    let figures = watch.finish();
    for (t, d) in drained.iter().enumerate() {
        assert!(d.sequence.windows(2).all(|w| w[0] < w[1]), "topic {t}: out of order");
        assert!(d.sequence.len() as u64 <= published[t], "topic {t}: more received than sent");
    }
    let published: u64 = published.iter().sum();
    let received: u64 = drained.iter().map(|d| d.sequence.len() as u64).sum();
    let grew = |family: &str| after.sum(family) - before.sum(family);
    let dropped = grew("drops_total") + grew("topic_drops_total");
    let closed_by_server = drained.iter().filter(|d| d.closed_by_server.is_some()).count();
    println!(
        "{policy}: {published} published, {received} received, {dropped} counted as dropped \
         ({} closed with the connection); {closed_by_server} subscribers closed by the server",
        grew("drops_total{reason=\"closed\"}"),
    );
    assert_eq!(published as f64, received as f64 + dropped, "{policy}: not all accounted for");
    assert!(
        received > 0 && dropped > 0.0,
        "{policy}: the subscribers neither read nor fell behind"
    );
    if policy == "close" {
        assert_eq!(closed_by_server, SUBSCRIBERS, "every slow consumer is closed (1008)");
        assert!(drained.iter().all(|d| d.closed_by_server == Some(1008)));
    } else {
        assert_eq!(closed_by_server, 0, "{policy}: a subscriber was closed by the server");
    }
    assert!(figures.rss_peak <= figures.rss_before + BUDGET_KIB * 11 / 10, "{figures}");
    figures.report(&format!("topic_books_{policy}"));
}

#[test]
fn every_publication_is_accounted_for_under_conflate() {
    every_publication_is_accounted_for("conflate");
}

#[test]
fn every_publication_is_accounted_for_under_drop_oldest() {
    every_publication_is_accounted_for("drop-oldest");
}

#[test]
fn every_publication_is_accounted_for_under_drop_newest() {
    every_publication_is_accounted_for("drop-newest");
}

#[test]
fn every_publication_is_accounted_for_under_block() {
    every_publication_is_accounted_for("block");
}

#[test]
fn every_publication_is_accounted_for_under_close() {
    every_publication_is_accounted_for("close");
}

/// 100,032 subscriptions asked for: 1,563 connections to `/topic/`, each naming 64 distinct
/// topics (`--memory 16M`, within `--max-topics`), from four loopback addresses (the per-IP
/// limit is 1,000). The topic tables are held in their part of each loop's budget: once it is
/// spent the upgrades get 503 (`topic_refusals_total{reason="budget"}`), the server's RSS stays
/// within the budget above idle, and once the subscribers close it comes back to near idle.
#[test]
fn subscriptions_are_held_inside_the_budget() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_fd_limit();
    const CONNECTIONS: usize = 1_563;
    const PER_CONNECTION: usize = 64;
    let serve = Serve::start(&["--memory", "16M"]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let (mut clients, got) = subscribe_many(serve.addr(), "many", CONNECTIONS, PER_CONNECTION, 4);
    let during = serve.wait_metrics("the subscriptions", |m| {
        m.get("topic_subscriptions") == (got.open * PER_CONNECTION) as f64
    });
    let refused = during.delta(&before, "topic_refusals_total{reason=\"budget\"}");
    println!(
        "{} connections subscribed ({} subscriptions), {} refused 503, {} closed after their 101; \
         {refused} budget refusals counted; RSS {} KiB",
        got.open,
        got.open * PER_CONNECTION,
        got.refused_503,
        got.closed,
        serve.rss_kib()
    );
    assert_eq!(got.open + got.refused_503 + got.closed, CONNECTIONS, "{got:?}");
    assert!(got.open > 0 && got.refused_503 > 0, "{got:?}");
    assert_eq!(refused, (got.refused_503 + got.closed) as f64, "every refusal is counted");
    // The subscriptions held are real: a publication to the first topic reaches its client.
    let mut publisher = Publisher::connect(serve.addr()).expect("connect");
    assert_eq!(publisher.publish("many0", b"hello").expect("publish").status, 200);
    let frame = clients[0].recv().expect("read").expect("a frame");
    assert_eq!((frame.opcode, &frame.payload[..]), (0x2, &b"hello"[..]));
    clients.clear();
    serve.wait_metrics("the subscriptions gone", |m| m.get("topic_subscriptions") == 0.0);
    // A moment for the last closes, and for the loops' end of turn.
    std::thread::sleep(Duration::from_millis(500));
    let figures = watch.finish();
    assert!(figures.rss_peak <= figures.rss_before + BUDGET_KIB * 11 / 10, "{figures}");
    assert!(figures.rss_after <= figures.rss_before + 2048, "memory kept: {figures}");
    figures.report("topic_subscriptions");
}
