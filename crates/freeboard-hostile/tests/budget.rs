//! The budget holds against the many: groups of clients that try to take the memory the others
//! need — partial POST bodies, clients that never read, and pipelines of tiny messages — while
//! an innocent client echoes. Innocents get every echo intact and in order; the attackers get
//! the documented status or close code; the counters name the reason.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use freeboard_hostile::budget::{attack, small_buffer_stream};
use freeboard_hostile::{Innocent, Serve, Watch, WsClient, raise_fd_limit, upgrade_request};

/// The attacks run one at a time: each measures an innocent client beside one attack, not
/// beside the others.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Scenario 1: bodies that never finish. Each is counted whole against a quarter of its loop's
/// pool before a byte of it is kept, so the ones beyond that share are refused at once (503)
/// and the pool never runs dry for the open connections.
#[test]
fn partial_post_bodies_cannot_take_the_pool() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_fd_limit();
    // A 1 MiB body is over the default subscriber cap once framed (413 up front): raise it so
    // the bodies reach the pool's judgement.
    let serve =
        Serve::start(&["--memory", "16M", "--handshake-timeout", "10", "--topic-send-cap", "2M"]);
    let before = serve.wait_metrics("both loops", |m| m.sum("pool_chunks_capacity") > 2000.0);
    let chunks = before.sum("pool_chunks_capacity");
    let watch = Watch::start(&serve);
    let mut held = Vec::new();
    for i in 0..26 {
        let len = if i < 12 { 1 << 20 } else { 3000 };
        let mut stream = TcpStream::connect(serve.addr()).expect("connect");
        stream.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let head = format!("POST /topic/t HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        // Half the body, then nothing (a refused one may be closed under the write: fine).
        let _ = stream.write_all(&vec![7u8; len / 2]);
        held.push(stream);
    }
    std::thread::sleep(Duration::from_millis(300));
    let during = serve.metrics();
    let in_use = during.sum("pool_chunks_in_use");
    let mut refused = 0;
    for stream in &mut held {
        let mut answer = [0u8; 12];
        if matches!(stream.read(&mut answer), Ok(12)) && answer.starts_with(b"HTTP/1.1 503") {
            refused += 1;
        }
    }
    println!("{refused} of 26 bodies refused; {in_use} of {chunks} chunks in use");
    assert!(refused >= 10, "only {refused} bodies were refused");
    assert!(in_use <= chunks / 2.0, "bodies hold {in_use} of {chunks} chunks");
    assert_eq!(during.delta(&before, "refusals_total{status=\"503\"}"), f64::from(refused));
    assert!(in_use > 0.0, "the bodies that fit were kept");
    let figures = watch.finish();
    // The held bodies go with their connections and give their chunks back.
    drop(held);
    let after = serve.wait_metrics("the pool back to idle", |m| m.sum("pool_chunks_in_use") == 0.0);
    assert_eq!(after.get("connections"), 0.0);
    figures.report("partial_post_bodies");
}

/// Scenario 2: 240 clients send 16 KiB echoes and never read, with small receive buffers so
/// their replies pile up in the server. They are behind, so once the pool is contended their
/// own policy (`close`, 1008) acts on them: when they push, and through the loop's sweep when
/// they stopped pushing (they are not read once behind). The reading client loses nothing and
/// is never refused for a pool they took. (On io_uring they are paused before the pool is
/// short, so none may need closing: there the pool must merely never run out.)
#[test]
fn clients_that_never_read_are_closed_and_the_reader_loses_nothing() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_fd_limit();
    let serve = Serve::start(&["--memory", "16M"]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let stop = Arc::new(AtomicBool::new(false));
    let addr = serve.addr();
    let attackers: Vec<_> = (0..240)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let stream = small_buffer_stream(addr);
                stream.set_write_timeout(Some(Duration::from_millis(500))).unwrap();
                let mut client = WsClient::raw(stream);
                client.send_raw(upgrade_request("/echo", "").as_bytes()).unwrap();
                let message = vec![0x5a; 16 << 10];
                let deadline = Instant::now() + Duration::from_secs(4);
                // Writes until the server stops reading it (a write times out) or closes it.
                while Instant::now() < deadline && client.send(0x82, &message).is_ok() {}
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(5));
    let during = serve.metrics();
    let figures = watch.finish();
    stop.store(true, Ordering::Relaxed);
    for attacker in attackers {
        attacker.join().unwrap();
    }
    let closed = during.delta(&before, "slow_consumer_closes_total");
    let (high, capacity) =
        (during.sum("pool_chunks_high_water"), during.sum("pool_chunks_capacity"));
    println!("{closed} slow consumers closed; pool high water {high} of {capacity} chunks");
    if std::env::var("HOSTILE_IO").is_ok_and(|io| io == "uring") {
        // On io_uring a client that is behind is not read, and what it sent meanwhile waits in
        // its socket (at most two chunks of it in the pool), so the pool need not run short
        // for the policy to have acted; it must not run out.
        assert!(high < capacity, "the never-reading clients took the whole pool");
    } else {
        // On epoll a read of `read_buffer` bytes is parsed whole, so their echoes are queued
        // past the high watermark and the pool is contended: their policy must act.
        assert!(closed > 0.0, "no never-reading client was charged for the pool");
    }
    println!("HOSTILE never_reading_echo_clients: {figures}");
    figures.echo.assert_intact();
}

/// Scenario 3: 60 clients pipeline 9,000 one-byte messages each and read everything. Each
/// queued message holds a pool slot; replies are written through every 256 messages, so the
/// slots never run out and no reading client is closed.
#[test]
fn pipelines_of_tiny_messages_do_not_exhaust_the_slots() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_fd_limit();
    const MESSAGES: usize = 9_000;
    let serve = Serve::start(&["--memory", "16M", "--threads", "1"]);
    let addr = serve.addr();
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..60)
            .map(|c| {
                scope.spawn(move || -> Result<(), String> {
                    let (mut client, status, _) =
                        WsClient::handshake(addr, &upgrade_request("/echo", ""))
                            .map_err(|e| e.to_string())?;
                    if status != 101 {
                        return Err(format!("client {c}: status {status}"));
                    }
                    client.stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let mut reader = client.reader().map_err(|e| e.to_string())?;
                    let writer = std::thread::spawn(move || {
                        for i in 0..MESSAGES {
                            if client.send(0x82, &[i as u8]).is_err() {
                                return;
                            }
                        }
                    });
                    for i in 0..MESSAGES {
                        match reader.recv() {
                            Ok(Some(f)) if f.opcode == 0x2 && f.payload == [i as u8] => {}
                            other => return Err(format!("client {c}, echo {i}: {other:?}")),
                        }
                    }
                    writer.join().map_err(|_| "writer panicked".to_string())
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failures.is_empty(), "{} clients failed, first: {:?}", failures.len(), failures[0]);
    let after = serve.metrics();
    assert_eq!(after.get("slow_consumer_closes_total"), 0.0);
    println!("slot high water {}", after.sum("pool_slots_high_water"));
    assert!(after.sum("pool_slots_high_water") < after.sum("pool_slots_capacity"));
}

/// Scenario 4: 60 clients each start a message and never finish it, sending continuation
/// frames up to the message limit, beside four innocent echo clients. Under contention a
/// message being reassembled counts against its sender's fair share with what it has queued:
/// the senders past it are closed 1013 and counted, and the innocents lose nothing.
#[test]
fn unfinished_messages_pay_for_the_pool_not_the_innocents() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_fd_limit();
    let serve = Serve::start(&["--memory", "16M"]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let others: Vec<Innocent> = (0..3).map(|_| Innocent::start(serve.addr())).collect();
    let closes = attack(serve.addr(), 60, |client| {
        // A first fragment, then 64 KiB continuations until 16 MiB or the server stops us.
        let piece = vec![0x33; 64 << 10];
        client.send(0x02, &piece)?;
        for _ in 1..256 {
            client.send(0x00, &piece)?;
        }
        Ok(())
    });
    let figures = watch.finish();
    for other in others {
        other.finish().assert_intact();
    }
    let after = serve.wait_metrics("the attackers gone", |m| m.get("connections") == 0.0);
    println!("attackers' closes {closes:?}");
    let allowed = |c: &Result<Option<u16>, u16>| matches!(c, Ok(None | Some(1013)) | Err(503));
    assert!(closes.iter().all(allowed), "{closes:?}");
    let told = closes.iter().filter(|c| matches!(c, Ok(Some(1013)))).count() as f64;
    assert!(told > 0.0, "no unfinished message was refused");
    // Each is counted: 1013 when its answer was read, 1006 when it waited behind the
    // continuations the server no longer reads and the close timeout came first.
    let counted = after.delta(&before, "closes_total{reason=\"try_again_later\"}")
        + after.delta(&before, "closes_total{reason=\"abnormal\"}");
    assert!(counted >= told, "{counted} closes counted for {told} refused");
    figures.assert_rss_within(16);
    figures.report("unfinished_messages");
}

/// Scenario 5: 40 clients send 64 KiB messages and never read their echoes, beside four
/// innocent echo clients: the never-readers meet their policy (close 1008), the innocents
/// lose nothing.
#[test]
fn large_messages_never_read_pay_for_the_pool_not_the_innocents() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    raise_fd_limit();
    let serve = Serve::start(&["--memory", "16M"]);
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    let others: Vec<Innocent> = (0..3).map(|_| Innocent::start(serve.addr())).collect();
    let closes = attack(serve.addr(), 40, |client| {
        let message = vec![0x44; 64 << 10];
        for _ in 0..400 {
            client.send(0x82, &message)?;
        }
        Ok(())
    });
    let figures = watch.finish();
    for other in others {
        other.finish().assert_intact();
    }
    let after = serve.wait_metrics("the attackers gone", |m| m.get("connections") == 0.0);
    println!("attackers' closes {closes:?}");
    // A 64 KiB message arrives in pieces: past its share it is refused (1013); an echo queued
    // past the share meets the `close` policy (1008).
    let allowed =
        |c: &Result<Option<u16>, u16>| matches!(c, Ok(None | Some(1008 | 1013)) | Err(503));
    assert!(closes.iter().all(allowed), "{closes:?}");
    let charged = after.delta(&before, "slow_consumer_closes_total")
        + after.delta(&before, "closes_total{reason=\"try_again_later\"}")
        + after.delta(&before, "closes_total{reason=\"abnormal\"}");
    assert!(charged > 0.0, "no never-reading client was charged for the pool");
    figures.assert_rss_within(16);
    figures.report("large_messages_never_read");
}
