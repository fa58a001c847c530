//! Delta compression per topic on `freeboard serve` as a process: delta subscribers apply
//! every delta and get, by content hash, exactly what was published — a subscriber that keeps
//! up and one that is made to lose messages under each dropping policy, which never applies a
//! delta to the wrong base; one delta per publication however many subscribers; deltas under
//! permessage-deflate; and the refusals (`?delta=` of an unknown format, of a topic that offers
//! none, with several topics; garbage from a delta subscriber).

mod common;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use freeboard::MessageKind;
use freeboard::client::{Client, ClientConfig, DeltaDecoder, DeltaRefusal, Event};
use freeboard_test::{Inbox, frame};

use common::{Serve, subscribe, subscribe_slow, text};

/// Publications in the burst a slow subscriber does not read, then after it caught up.
const BURST: usize = 500;
const AFTER: usize = 5;

/// Document `n` of a topic: about 10 KB of JSON, of which each publication changes about 1 %
/// (one row of 100, and the sequence number).
fn document(n: usize) -> Vec<u8> {
    document_changing(n, 0)
}

/// [`document`] with `noise` bytes more that change all the time (hex digits no delta can
/// copy from the document before).
fn document_changing(n: usize, noise: usize) -> Vec<u8> {
    let mut x = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let noise: String = (0..noise)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from_digit((x % 16) as u32, 16).unwrap()
        })
        .collect();
    let rows: Vec<String> = (0..100)
        .map(|r| {
            let v = if r == n % 100 { n * 7 + r } else { r * 3 };
            format!(r#"{{"id":{r},"value":{v},"label":"sensor {r:03} on the north wall"}}"#)
        })
        .collect();
    format!(r#"{{"seq":{n},"noise":"{noise}","rows":[{}]}}"#, rows.join(",")).into_bytes()
}

fn content_hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// The sequence number a decoded document names.
fn seq_of(doc: &[u8]) -> usize {
    let text = std::str::from_utf8(doc).expect("text");
    let digits = text.strip_prefix(r#"{"seq":"#).expect("a document");
    digits[..digits.find(',').unwrap()].parse().unwrap()
}

/// What a delta subscriber made of its stream.
#[derive(Debug, Default)]
struct Applied {
    /// Sequence numbers of the documents decoded, in order.
    seqs: Vec<usize>,
    deltas: usize,
    gaps: usize,
}

/// Decodes the frames `inbox` reads from `s` until document `last` (or the stream is quiet
/// for `quiet`), checking each against the published document's hash.
fn apply_until(
    s: &mut TcpStream,
    inbox: &mut Inbox,
    decoder: &mut DeltaDecoder,
    hashes: &[u64],
    last: usize,
    quiet: Duration,
    applied: &mut Applied,
) {
    s.set_read_timeout(Some(quiet)).unwrap();
    loop {
        let f = match inbox.frame(s) {
            Ok(Some(f)) => f,
            Ok(None) => panic!("the stream ended"),
            Err(_) => return, // quiet
        };
        let kind = match f.opcode {
            0x1 => MessageKind::Text,
            0x2 => MessageKind::Binary,
            op => panic!("opcode {op}"),
        };
        match decoder.decode(kind, &f.payload) {
            Ok(d) => {
                assert_eq!(d.kind, MessageKind::Text);
                let seq = seq_of(d.data);
                assert_eq!(content_hash(d.data), hashes[seq], "document {seq} differs");
                assert!(applied.seqs.last().is_none_or(|&before| seq > before), "went back");
                applied.seqs.push(seq);
                applied.deltas += usize::from(d.was_delta);
                if seq == last {
                    return;
                }
            }
            Err(DeltaRefusal::Gap { .. }) => applied.gaps += 1,
            Err(e) => panic!("a delta did not apply: {e}"),
        }
    }
}

fn metric(addr: &str, name: &str) -> u64 {
    std::thread::sleep(freeboard::metrics::ADMIN_REFRESH);
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut metrics = String::new();
    let _ = s.read_to_string(&mut metrics);
    metrics
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Publishes documents `range` from `publisher` and waits until the server has published
/// them all (`freeboard_topic_publishes_total` reaches `range.end`): its own subscription to
/// the topic is left unread, since under drop-newest it would not see them all.
fn publish(
    serve: &Serve,
    publisher: &mut TcpStream,
    range: std::ops::Range<usize>,
    doc: impl Fn(usize) -> Vec<u8>,
) {
    let end = range.end as u64;
    let burst: Vec<u8> = range.flat_map(|n| text(&doc(n))).collect();
    let writer = {
        let mut publisher = publisher.try_clone().unwrap();
        std::thread::spawn(move || publisher.write_all(&burst))
    };
    let until = Instant::now() + Duration::from_secs(30);
    while metric(&serve.addr, "freeboard_topic_publishes_total") < end {
        assert!(Instant::now() < until, "the server did not publish them all");
    }
    writer.join().unwrap().unwrap();
}

/// Waits until the server queued `n` deliveries of publications (a `drop-newest` drop
/// standing in for one): under `drop-oldest` and `conflate` every publication is queued, an
/// older one making room.
fn fanned_out(serve: &Serve, policy: &str, n: u64) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let mut reached = metric(&serve.addr, "freeboard_topic_deliveries_total");
        if policy == "drop-newest" {
            reached += metric(&serve.addr, "freeboard_drops_total{reason=\"drop-newest\"");
        }
        if reached >= n {
            return;
        }
        assert!(Instant::now() < until, "{policy}: {reached} of {n} deliveries");
    }
}

#[test]
fn delta_subscribers_get_every_document_and_one_that_drops_never_applies_a_wrong_base() {
    // 16 KB of each document change: deltas of about 16 KB, 500 of which (8 MB) are more than
    // the slow subscriber's queue (capped at 64 KiB) and its socket's buffers (at most 4 MiB
    // and 8 KiB) hold.
    let doc = |n| document_changing(n, 16_000);
    let hashes: Vec<u64> = (0..BURST + AFTER).map(|n| content_hash(&doc(n))).collect();
    for policy in ["conflate", "drop-oldest", "drop-newest"] {
        let serve = Serve::start(&[
            "--client-publish",
            "--delta-prefix",
            "doc.",
            "--topic-slow-consumer",
            policy,
            "--topic-send-cap",
            "64K",
        ]);
        let path = "/topic/doc.board?delta=fossil";
        // Two that keep up (on both loops, with two connections each side), one that does not
        // read during the burst (an 8 KiB receive buffer: soon behind).
        let keepers: Vec<_> = (0..2).map(|_| subscribe(&serve.addr, path)).collect();
        let (mut slow, mut slow_inbox) = subscribe_slow(&serve.addr, path);
        let (mut publisher, _) = subscribe(&serve.addr, "/topic/doc.board");
        // Every subscription is known to every loop before the burst: the publisher's first
        // document reaches the slow subscriber, which reads it.
        publish(&serve, &mut publisher, 0..1, doc);
        let mut slow_decoder = DeltaDecoder::new(1 << 20);
        let mut slow_applied = Applied::default();
        let wait = Duration::from_secs(10);
        let (s, i) = (&mut slow, &mut slow_inbox);
        apply_until(s, i, &mut slow_decoder, &hashes, 0, wait, &mut slow_applied);
        let readers: Vec<_> = keepers
            .into_iter()
            .map(|(mut s, mut inbox)| {
                let hashes = hashes.clone();
                std::thread::spawn(move || {
                    let mut decoder = DeltaDecoder::new(1 << 20);
                    let mut applied = Applied::default();
                    let last = BURST + AFTER - 1;
                    let wait = Duration::from_secs(10);
                    apply_until(
                        &mut s,
                        &mut inbox,
                        &mut decoder,
                        &hashes,
                        last,
                        wait,
                        &mut applied,
                    );
                    applied
                })
            })
            .collect();
        publish(&serve, &mut publisher, 1..BURST, doc);
        // Counted as published is not yet fanned out on the other loop: wait until each of
        // the four subscribers (the publisher among them) got every publication or its drop,
        // or the slow one would read in time to lose nothing.
        fanned_out(&serve, policy, 4 * BURST as u64);
        // Now the slow one reads what its queue kept, until it is quiet ...
        let quiet = Duration::from_millis(500);
        let (s, i) = (&mut slow, &mut slow_inbox);
        apply_until(s, i, &mut slow_decoder, &hashes, BURST - 1, quiet, &mut slow_applied);
        // ... and keeps up with what follows, read as it comes (a burst of it could meet the
        // policy again): the first goes whole, the rest as deltas.
        for n in BURST..BURST + AFTER {
            publish(&serve, &mut publisher, n..n + 1, doc);
            apply_until(s, i, &mut slow_decoder, &hashes, n, wait, &mut slow_applied);
        }
        let tail: Vec<_> = slow_applied.seqs.iter().rev().take(AFTER - 1).collect();
        assert!(tail.iter().all(|&&n| n >= BURST), "{policy}: caught up: {tail:?}");
        let mut lost = BURST + AFTER - slow_applied.seqs.len();
        for reader in readers {
            let applied = reader.join().unwrap();
            lost += BURST + AFTER - applied.seqs.len();
            // They read as fast as a debug build decodes and hashes 26 KB documents, which a
            // 64 KiB queue does not always cover: what they lost the policy counted, and
            // they decoded the rest (checked by hash in `apply_until`), to the last.
            assert_eq!(applied.seqs.last(), Some(&(BURST + AFTER - 1)), "{policy}");
            assert!(applied.deltas > 0, "{policy}: {applied:?}");
            eprintln!(
                "{policy}: a reader decoded {} documents ({} as deltas), refused {}",
                applied.seqs.len(),
                applied.deltas,
                applied.gaps
            );
        }
        let dropped = metric(&serve.addr, &format!("freeboard_drops_total{{reason=\"{}\"", policy));
        assert!(
            dropped > 0 && lost > 0,
            "{policy}: {dropped} drops counted, {lost} documents lost, the slow subscriber \
             decoded {slow_applied:?}"
        );
        assert!(slow_applied.deltas > 0, "{policy}: {slow_applied:?}");
        eprintln!(
            "{policy}: the slow subscriber decoded {} documents ({} as deltas), refused {} \
             deltas for a lost base; {dropped} drops counted",
            slow_applied.seqs.len(),
            slow_applied.deltas,
            slow_applied.gaps
        );
    }
}

#[test]
fn one_delta_per_publication_for_every_subscriber_and_under_permessage_deflate() {
    const N: usize = 50;
    let serve = Serve::start(&[
        "--client-publish",
        "--threads",
        "1",
        "--delta-prefix",
        "",
        "--compression",
        "shared",
        "--topic-metrics-prefix",
        "board",
    ]);
    let url = format!("ws://{}/topic/board?delta=fossil", serve.addr);
    let mut clients: Vec<Client> =
        (0..3).map(|_| Client::connect(&url, ClientConfig::default()).unwrap()).collect();
    assert!(clients.iter().all(|c| c.compression().is_some()), "permessage-deflate agreed");
    let (mut publisher, _) = subscribe(&serve.addr, "/topic/board");
    publish(&serve, &mut publisher, 0..N, document);
    let hashes: Vec<u64> = (0..N).map(|n| content_hash(&document(n))).collect();
    // Message bytes as inflated: the envelopes and deltas, before permessage-deflate.
    let mut received = 0;
    for client in &mut clients {
        let mut decoder = DeltaDecoder::new(1 << 20);
        for (n, hash) in hashes.iter().enumerate() {
            let Event::Message(m) = client.recv().unwrap() else { panic!("closed") };
            let (kind, bytes) = (m.kind(), m.to_vec());
            received += bytes.len();
            let d = decoder.decode(kind, &bytes).unwrap();
            assert_eq!((seq_of(d.data), content_hash(d.data)), (n, *hash));
            assert_eq!(d.was_delta, n > 0, "document {n}");
        }
    }
    let whole: usize = 3 * (0..N).map(|n| document(n).len()).sum::<usize>();
    assert!(received * 10 < whole, "{received} bytes received for {whole} published");
    assert_eq!(metric(&serve.addr, "freeboard_topic_deltas_total"), N as u64 - 1, "once each");
    let deliveries = metric(&serve.addr, "freeboard_topic_delta_deliveries_total");
    assert_eq!(deliveries, 3 * (N as u64 - 1));
    // Compressed once per publication for the three (its whole copy and its delta at most,
    // those above the 64-byte threshold), not once per subscriber.
    let compressions = metric(&serve.addr, "freeboard_topic_compressions_total");
    assert!((1..=2 * N as u64).contains(&compressions), "{compressions}");
    // The topic's series (and the dashboard's topics table) show the saving: three of its
    // four subscribers take deltas, compressed; the publisher takes the documents whole.
    let topic = "{topic=\"board\"}";
    let published = metric(
        &serve.addr,
        &format!("freeboard_named_topic_delivered_bytes_as_published_total{topic}"),
    );
    let sent =
        metric(&serve.addr, &format!("freeboard_named_topic_delivered_bytes_sent_total{topic}"));
    assert!(sent * 3 < published, "{sent} bytes sent of {published} as published");
}

#[test]
fn delta_refusals_and_garbage_from_a_delta_subscriber() {
    let serve = Serve::start(&["--delta-prefix", "doc."]);
    let status = |path: &str| {
        let mut s = TcpStream::connect(&serve.addr).unwrap();
        s.write_all(freeboard_test::upgrade_request(path, "").as_bytes()).unwrap();
        let mut response = vec![0u8; 4096];
        let n = s.read(&mut response).unwrap();
        String::from_utf8_lossy(&response[..n]).into_owned()
    };
    let unknown = status("/topic/doc.a?delta=xdelta");
    assert!(unknown.starts_with("HTTP/1.1 400"), "{unknown}");
    assert!(unknown.contains("\"xdelta\""), "names the value: {unknown}");
    let not_offered = status("/topic/news?delta=fossil");
    assert!(
        not_offered.starts_with("HTTP/1.1 400") && not_offered.contains("doc."),
        "{not_offered}"
    );
    let several = status("/topic/doc.a?delta=fossil&also=doc.b");
    assert!(several.starts_with("HTTP/1.1 400") && several.contains("also="), "{several}");
    // Garbage: an unmasked frame (§5.1: the server MUST close) gets 1002; a message where
    // clients may not publish, 1008.
    for (bytes, code) in [(frame(0x81, b"hi", None), 1002), (text(b"hi"), 1008)] {
        let (mut s, mut inbox) = subscribe(&serve.addr, "/topic/doc.a?delta=fossil");
        s.write_all(&bytes).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        let close = loop {
            let f = inbox.frame(&mut s).unwrap().expect("a close frame");
            if f.opcode == 0x8 || Instant::now() > until {
                break f;
            }
        };
        assert_eq!(close.close_code(), code);
    }
}

/// A history topic: the delta subscriber's decoded messages carry the offset envelope; one
/// that resumes with `since` gets the replay whole (without the delta envelope), then the
/// live stream whole first and as deltas after, each document exactly once.
#[test]
fn a_delta_subscriber_resumes_with_since_and_the_replay_goes_whole() {
    let serve = Serve::start(&["--client-publish", "--history", "100", "--delta-prefix", "doc."]);
    let path = "/topic/doc.h?delta=fossil";
    let (mut first, mut inbox) = subscribe(&serve.addr, path);
    let (mut publisher, _) = subscribe(&serve.addr, "/topic/doc.h");
    publish(&serve, &mut publisher, 0..5, document);
    let hashes: Vec<u64> = (0..12).map(|n| content_hash(&document(n))).collect();
    // Reads `count` messages; each decoded one is `OFFSET:document`.
    let read = |s: &mut TcpStream, inbox: &mut Inbox, decoder: &mut DeltaDecoder, count| {
        let mut got = Vec::new();
        for _ in 0..count {
            let f = inbox.frame(s).unwrap().expect("a message");
            let kind = if f.opcode == 0x2 { MessageKind::Binary } else { MessageKind::Text };
            let d = decoder.decode(kind, &f.payload).unwrap();
            let text = std::str::from_utf8(d.data).unwrap();
            let (offset, doc) = text.split_once(':').expect("an offset envelope");
            let seq = seq_of(doc.as_bytes());
            assert_eq!(content_hash(doc.as_bytes()), hashes[seq], "document {seq}");
            got.push((offset.to_owned(), seq, d.was_delta, d.seq.is_some()));
        }
        got
    };
    let mut decoder = DeltaDecoder::new(1 << 20);
    let before = read(&mut first, &mut inbox, &mut decoder, 5);
    let shape: Vec<_> = before.iter().map(|(_, n, delta, _)| (*n, *delta)).collect();
    assert_eq!(shape, [(0, false), (1, true), (2, true), (3, true), (4, true)]);
    drop(first);
    // Gone after document 2; 5..8 published meanwhile; back with since = 2's offset.
    publish(&serve, &mut publisher, 5..8, document);
    let since = &before[2].0;
    let path = format!("/topic/doc.h?delta=fossil&since={since}");
    let (mut back, mut inbox) = subscribe(&serve.addr, &path);
    let mut decoder = DeltaDecoder::new(1 << 20);
    let replay = read(&mut back, &mut inbox, &mut decoder, 5);
    // The replay: whole, without the delta envelope.
    let shape: Vec<_> = replay.iter().map(|(_, n, delta, env)| (*n, *delta, *env)).collect();
    assert_eq!(shape, [3, 4, 5, 6, 7].map(|n| (n, false, false)));
    publish(&serve, &mut publisher, 8..12, document);
    let live = read(&mut back, &mut inbox, &mut decoder, 4);
    let shape: Vec<_> = live.iter().map(|(_, n, delta, _)| (*n, *delta)).collect();
    assert_eq!(shape, [(8, false), (9, true), (10, true), (11, true)], "whole first, then deltas");
}

/// A delta subscriber that also watches presence: the join and leave events come between the
/// publications, and the deltas after them still apply.
#[test]
fn presence_events_between_deltas_leave_the_base_alone() {
    let serve =
        Serve::start(&["--client-publish", "--presence-prefix", "doc.", "--delta-prefix", "doc."]);
    let (mut watcher, mut inbox) = subscribe(&serve.addr, "/topic/doc.p?delta=fossil&presence=1");
    let (mut publisher, _) = subscribe(&serve.addr, "/topic/doc.p");
    publish(&serve, &mut publisher, 0..3, document);
    let visitor = subscribe(&serve.addr, "/topic/doc.p");
    drop(visitor);
    std::thread::sleep(Duration::from_millis(200)); // the leave is seen
    publish(&serve, &mut publisher, 3..6, document);
    let mut decoder = DeltaDecoder::new(1 << 20);
    let (mut docs, mut events) = (Vec::new(), 0);
    while docs.len() < 6 {
        let f = inbox.frame(&mut watcher).unwrap().expect("a message");
        let kind = if f.opcode == 0x2 { MessageKind::Binary } else { MessageKind::Text };
        let d = decoder.decode(kind, &f.payload).unwrap();
        if d.data.starts_with(b"freeboard-presence:") {
            events += 1;
            continue;
        }
        assert_eq!(content_hash(d.data), content_hash(&document(seq_of(d.data))));
        docs.push((seq_of(d.data), d.was_delta));
    }
    assert_eq!(docs, [(0, false), (1, true), (2, true), (3, true), (4, true), (5, true)]);
    assert!(events >= 3, "its own join, the publisher's, the visitor's join and leave: {events}");
}
