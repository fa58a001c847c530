//! Topics of `freeboard serve` as a process: a subscriber that keeps up receives every
//! publication in order under every slow-consumer policy; a publication larger than a
//! subscriber's cap is refused up front; a subscriber reconnecting with `?since=` gets what it
//! missed from the topic's history, or close 4410.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use freeboard_test::Inbox;

use common::{Serve, subscribe, subscribe_slow, text};

/// Publications in the burst.
const BURST: usize = 2000;

/// Publishes "warm" from `publisher` until `reader` has seen one, so both subscriptions are
/// known to every loop before the burst.
fn warm_up(publisher: &mut TcpStream, reader: &mut TcpStream, inbox: &mut Inbox) {
    reader.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    'outer: while Instant::now() < until {
        publisher.write_all(&text(b"warm")).unwrap();
        while let Ok(Some(f)) = inbox.frame(reader) {
            if f.payload == b"warm" {
                break 'outer;
            }
        }
    }
    reader.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
}

#[test]
fn a_subscriber_that_keeps_up_gets_every_publication_under_every_policy() {
    let burst: Vec<u8> = (0..BURST).flat_map(|i| text(format!("m{i}").as_bytes())).collect();
    for policy in ["conflate", "drop-oldest", "drop-newest", "block", "close"] {
        for threads in ["1", "2"] {
            let serve = Serve::start(&[
                "--client-publish",
                "--threads",
                threads,
                "--topic-slow-consumer",
                policy,
            ]);
            let (mut reader, mut inbox) = subscribe(&serve.addr, "/topic/chat");
            let (mut publisher, _) = subscribe(&serve.addr, "/topic/chat");
            warm_up(&mut publisher, &mut reader, &mut inbox);
            // As fast as it can: the whole burst in one write.
            publisher.write_all(&burst).unwrap();
            let mut next = 0;
            while next < BURST {
                let Some(f) = inbox.frame(&mut reader).unwrap() else {
                    panic!("{policy}, {threads} loops: the stream ended after {next} of {BURST}")
                };
                if f.payload == b"warm" {
                    continue;
                }
                assert_eq!(f.opcode, 0x1);
                let got = String::from_utf8(f.payload).unwrap();
                assert_eq!(
                    got,
                    format!("m{next}"),
                    "{policy}, {threads} loops: out of order or lost"
                );
                next += 1;
            }
        }
    }
}

/// The 413 counts what the subscriber's queue will hold: the frame header and, on a topic
/// that keeps history, the offset envelope (at most 59 bytes) in front of the payload.
#[test]
fn a_post_larger_than_a_subscriber_cap_is_refused_with_413() {
    // (extra flags, the largest body that fits a 64 KiB cap, whether an envelope leads it)
    for (extra, largest, envelope) in
        [(&[][..], (64 << 10) - 4, false), (&["--history", "10"][..], (64 << 10) - 63, true)]
    {
        let serve =
            Serve::start(&[&["--topic-send-cap", "64K", "--threads", "1"][..], extra].concat());
        let (mut reader, mut inbox) = subscribe(&serve.addr, "/topic/big");
        let post = |len: usize| {
            let mut s = TcpStream::connect(&serve.addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let head = format!(
                "POST /topic/big HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
            );
            s.write_all(head.as_bytes()).unwrap();
            let _ = s.write_all(&vec![b'x'; len]);
            let mut answer = String::new();
            let _ = s.read_to_string(&mut answer);
            answer
        };
        let refused = post(largest + 1);
        assert!(refused.starts_with("HTTP/1.1 413"), "{extra:?}: {refused}");
        let fits = post(largest);
        assert!(
            fits.starts_with("HTTP/1.1 200") && fits.contains("\"delivered\":1,"),
            "{extra:?}: {fits}"
        );
        let f = inbox.frame(&mut reader).unwrap().expect("the publication that fits");
        let payload = f.payload.strip_suffix(&vec![b'x'; largest][..]).expect("the whole body");
        assert_eq!(payload.ends_with(b":"), envelope, "{extra:?}: {payload:?}");
    }
}

/// The status line of an upgrade to `path`.
fn upgrade_status(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(freeboard_test::upgrade_request(path, "").as_bytes()).unwrap();
    let head = Inbox::default().head(&mut s).unwrap().expect("a response");
    head.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn topic_limits_refuse_clearly_and_are_counted() {
    let serve =
        Serve::start(&["--threads", "2", "--max-topics-per-connection", "2", "--max-topics", "3"]);
    // An also= list beyond the connection's limit: 400 at the upgrade.
    assert!(upgrade_status(&serve.addr, "/topic/a?also=b&also=c").starts_with("HTTP/1.1 400"));
    let (_ab, _) = subscribe(&serve.addr, "/topic/a?also=b");
    let (_c, _) = subscribe(&serve.addr, "/topic/c");
    let (_a_again, _) = subscribe(&serve.addr, "/topic/a"); // not a new topic
    // A fourth topic on the server: the subscription is refused and the connection told why.
    let (mut d, mut inbox) = subscribe(&serve.addr, "/topic/d");
    let close = inbox.frame(&mut d).unwrap().expect("a close frame");
    assert_eq!((close.opcode, close.close_code()), (0x8, 1008));
    assert_eq!(&close.payload[2..], b"too many topics on this server");
    std::thread::sleep(freeboard::metrics::ADMIN_REFRESH); // a build after the change
    let mut s = TcpStream::connect(&serve.addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut metrics = String::new();
    let _ = s.read_to_string(&mut metrics);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("freeboard_topic_refusals_total{reason=\"server_topics\"}"))
        .unwrap_or_else(|| panic!("no server_topics refusal counted:\n{metrics}"));
    assert!(line.ends_with(" 1"), "{line}");
}

/// A frame's payload as `(offset, message)`, split at the history envelope's colon.
fn enveloped(payload: &[u8]) -> (String, String) {
    let text = String::from_utf8(payload.to_vec()).unwrap();
    let (offset, message) = text.split_once(':').unwrap_or_else(|| panic!("no offset: {text}"));
    (offset.to_owned(), message.to_owned())
}

/// An offset's sequence number (`{epoch}.{ms}-{sequence}`).
fn sequence(offset: &str) -> u64 {
    offset.rsplit_once('-').unwrap().1.parse().unwrap()
}

#[test]
fn a_reconnect_with_since_gets_what_it_missed_or_is_told_it_is_gone() {
    for threads in ["1", "2"] {
        let serve = Serve::start(&[
            "--client-publish",
            "--threads",
            threads,
            "--history",
            "150",
            "--history-prefix",
            "feed",
        ]);
        // The publisher is a subscriber too: reading its own publications back tells when
        // every one of them is published (and kept).
        let (mut publisher, mut own) = subscribe(&serve.addr, "/topic/feed");
        let publish =
            |publisher: &mut TcpStream, own: &mut Inbox, range: std::ops::Range<usize>| {
                let burst: Vec<u8> =
                    range.clone().flat_map(|i| text(format!("m{i}").as_bytes())).collect();
                publisher.write_all(&burst).unwrap();
                for i in range {
                    let f = own.frame(publisher).unwrap().expect("the publisher's own message");
                    assert_eq!(enveloped(&f.payload).1, format!("m{i}"));
                }
            };
        let (mut reader, mut inbox) = subscribe(&serve.addr, "/topic/feed");
        publish(&mut publisher, &mut own, 0..1);
        let f = inbox.frame(&mut reader).unwrap().expect("m0");
        let (since, message) = enveloped(&f.payload);
        assert_eq!(message, "m0");
        drop(reader);

        // Away while 100 are published; back with since: all 100, in order, then live.
        publish(&mut publisher, &mut own, 1..101);
        let (mut reader, mut inbox) = subscribe(&serve.addr, &format!("/topic/feed?since={since}"));
        let mut last = sequence(&since);
        for i in 1..101 {
            let f = inbox.frame(&mut reader).unwrap().unwrap_or_else(|| panic!("ended at m{i}"));
            let (offset, message) = enveloped(&f.payload);
            assert_eq!(message, format!("m{i}"), "{threads} loops: lost, twice or out of order");
            assert!(sequence(&offset) > last, "{offset} after {last}");
            last = sequence(&offset);
        }
        publish(&mut publisher, &mut own, 101..102);
        let f = inbox.frame(&mut reader).unwrap().expect("the live stream after the replay");
        assert_eq!(enveloped(&f.payload).1, "m101");

        // 100 more: the ring (150) no longer holds what followed m0.
        publish(&mut publisher, &mut own, 102..202);
        for target in [format!("/topic/feed?since={since}"), "/topic/feed?since=1.1-1".into()] {
            let (mut late, mut inbox) = subscribe(&serve.addr, &target);
            let close = inbox.frame(&mut late).unwrap().expect("a close frame");
            assert_eq!((close.opcode, close.close_code()), (0x8, 4410), "{target}");
        }

        // A topic outside the history prefix is delivered as published: no envelope.
        let (mut plain, mut plain_inbox) = subscribe(&serve.addr, "/topic/plain");
        let (mut plain_pub, _) = subscribe(&serve.addr, "/topic/plain");
        warm_up(&mut plain_pub, &mut plain, &mut plain_inbox);
        plain_pub.write_all(&text(b"as is")).unwrap();
        let f = plain_inbox.frame(&mut plain).unwrap().expect("a plain message");
        assert_eq!(f.payload, b"as is");
    }
}

#[test]
fn keyed_conflate_keeps_every_instrument_for_a_slow_subscriber() {
    const INSTRUMENTS: [&str; 5] = ["AAA", "BBB", "CCC", "DDD", "EEE"];
    const ROUNDS: usize = 2000;
    let pad = "x".repeat(1000);
    // Every instrument's price each round, but AAA's stop halfway (a quiet instrument): 9 MB
    // in all, far more than the socket buffers and the queue's watermarks hold while the
    // subscriber does not read.
    let last_round = |i: usize| if i == 0 { ROUNDS / 2 - 1 } else { ROUNDS - 1 };
    let mut burst = Vec::new();
    for r in 0..ROUNDS {
        for (_, name) in INSTRUMENTS.iter().enumerate().filter(|(i, _)| r <= last_round(*i)) {
            burst.extend(text(format!("{name}|{r}|{pad}").as_bytes()));
        }
    }
    for keyed in [true, false] {
        let mut args = vec!["--client-publish", "--threads", "1"];
        if keyed {
            args.extend(["--topic-conflate-key", "|"]);
        }
        let serve = Serve::start(&args);
        let (mut reader, mut inbox) = subscribe_slow(&serve.addr, "/topic/ticks");
        let (mut publisher, mut own) = subscribe(&serve.addr, "/topic/ticks");
        warm_up(&mut publisher, &mut reader, &mut inbox);
        // The publisher reads its own publications while it writes (it keeps up, so it gets
        // the last one): then the server has published them all. Were it to write the whole
        // burst first, the server would stop reading it once its own publications filled the
        // socket buffers, and both would wait until the keep-alive closed it.
        let writer = {
            let (mut publisher, burst) = (publisher.try_clone().unwrap(), burst.clone());
            std::thread::spawn(move || publisher.write_all(&burst))
        };
        let last_message = format!("EEE|{}", ROUNDS - 1);
        while !own
            .frame(&mut publisher)
            .unwrap()
            .expect("own")
            .payload
            .starts_with(last_message.as_bytes())
        {}
        writer.join().unwrap().unwrap();
        // Only now does the subscriber read, until the very last price.
        let mut last = [None; INSTRUMENTS.len()];
        loop {
            let f = inbox.frame(&mut reader).unwrap().expect("the stream goes on");
            let text = String::from_utf8(f.payload).unwrap();
            let mut fields = text.split('|');
            let (Some(name), Some(round)) = (fields.next(), fields.next()) else { continue };
            let i = INSTRUMENTS.iter().position(|n| *n == name).unwrap();
            let round: usize = round.parse().unwrap();
            assert!(last[i].is_none_or(|before| round > before), "{name} went back");
            last[i] = Some(round);
            if text.starts_with(&last_message) {
                break;
            }
        }
        let finals = (0..INSTRUMENTS.len()).filter(|&i| last[i] == Some(last_round(i))).count();
        std::thread::sleep(freeboard::metrics::ADMIN_REFRESH); // a build after the change
        let mut s = TcpStream::connect(&serve.addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut metrics = String::new();
        let _ = s.read_to_string(&mut metrics);
        let line =
            metrics.lines().find(|l| l.starts_with("freeboard_drops_total{reason=\"conflate\"}"));
        assert!(line.is_some_and(|l| !l.ends_with(" 0")), "the subscriber was behind: {line:?}");
        if keyed {
            assert_eq!(finals, INSTRUMENTS.len(), "every instrument's latest price: {last:?}");
        } else {
            // Plain conflate keeps only the latest messages: AAA's last price (and others')
            // was replaced by later prices of other instruments.
            assert!(last[0] < Some(last_round(0)), "{last:?}");
        }
    }
}

/// A replay larger than the high watermark puts its reader behind at once; under the default
/// `conflate`, live publications arriving behind it are conflated, and the replay is not: it
/// arrives whole, in order, then the newest publication.
#[test]
fn a_replay_above_the_high_watermark_arrives_whole_under_conflate() {
    let serve = Serve::start(&[
        "--client-publish",
        "--threads",
        "1",
        "--history",
        "5000",
        "--history-prefix",
        "feed",
    ]);
    let (mut publisher, mut own) = subscribe(&serve.addr, "/topic/feed");
    let pad = "x".repeat(200);
    // The publisher reads its own copies back: each range is published (and kept) once read.
    let mut publish = |range: std::ops::Range<usize>| {
        let burst: Vec<u8> =
            range.clone().flat_map(|i| text(format!("m{i} {pad}").as_bytes())).collect();
        publisher.write_all(&burst).unwrap();
        for _ in range {
            own.frame(&mut publisher).unwrap().expect("the publisher's own message");
        }
    };
    let (mut first, mut inbox) = subscribe(&serve.addr, "/topic/feed");
    publish(0..1);
    let (since, _) = enveloped(&inbox.frame(&mut first).unwrap().expect("m0").payload);
    drop(first);
    // About 700 KB missed: past the 64 KiB high watermark, under the 1 MiB cap.
    publish(1..3001);
    let (mut reader, mut inbox) =
        common::subscribe_slow(&serve.addr, &format!("/topic/feed?since={since}"));
    std::thread::sleep(Duration::from_millis(200));
    publish(3001..3021);
    let mut received = Vec::new();
    while received.last().is_none_or(|m: &usize| *m < 3020) {
        let f = inbox.frame(&mut reader).unwrap().expect("the replay, then live");
        assert_eq!(f.opcode, 0x1, "closed {:?} after {} messages", f.close_code(), received.len());
        let (_, message) = enveloped(&f.payload);
        let n = message[1..].split_once(' ').unwrap().0.parse().unwrap();
        received.push(n);
    }
    assert_eq!(received[..3000], (1..3001).collect::<Vec<_>>(), "the replay, whole and in order");
    assert!(received[3000..].is_sorted(), "live, in order: {:?}", &received[3000..]);
}

/// Subscribers resume with `since` while a publisher on another loop streams: the replay (read
/// from the history) and the live stream (the publications already in the loop's inbox then)
/// overlap, and each offset still arrives once, in order, none missing. The publisher stays
/// within half the history ahead of the reader, so that a slow machine does not have it
/// evict what the reader resumes from (that is 4410, tested above).
#[test]
fn a_replay_that_overlaps_the_live_stream_sends_each_offset_once() {
    let serve = Serve::start(&[
        "--client-publish",
        "--threads",
        "2",
        "--history",
        "100000",
        "--history-prefix",
        "feed",
    ]);
    let (publisher, _) = subscribe(&serve.addr, "/topic/feed");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let streamer = {
        let (mut publisher, stop, read) = (publisher, stop.clone(), read.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Acquire) && i < 200_000 {
                if i > read.load(std::sync::atomic::Ordering::Acquire) + 50_000 {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                let burst: Vec<u8> =
                    (i..i + 20).flat_map(|j| text(format!("m{j}").as_bytes())).collect();
                publisher.write_all(&burst).unwrap();
                i += 20;
                std::thread::sleep(Duration::from_micros(500));
            }
        })
    };
    let (mut reader, mut inbox) = subscribe(&serve.addr, "/topic/feed");
    let f = inbox.frame(&mut reader).unwrap().expect("a first message");
    let (mut since, _) = enveloped(&f.payload);
    for round in 0..40 {
        drop(reader);
        std::thread::sleep(Duration::from_millis(5));
        (reader, inbox) = subscribe(&serve.addr, &format!("/topic/feed?since={since}"));
        let mut last = sequence(&since);
        for _ in 0..300 {
            let f = inbox.frame(&mut reader).unwrap().expect("the replay, then live");
            let reason = String::from_utf8_lossy(f.payload.get(2..).unwrap_or_default());
            assert_eq!(f.opcode, 0x1, "round {round}: closed {:?} {reason}", f.close_code());
            let (offset, _) = enveloped(&f.payload);
            let seq = sequence(&offset);
            assert_eq!(seq, last + 1, "round {round}: {offset} after {last} (twice, or a gap)");
            last = seq;
            since = offset;
            read.fetch_add(1, std::sync::atomic::Ordering::Release);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    streamer.join().unwrap();
}
