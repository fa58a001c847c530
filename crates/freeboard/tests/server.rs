//! The server on real loopback sockets: echo, HTTP routes, limits, shutdown.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::{Client, config, http, metric, start, upgrade_request};
use freeboard::{Conn, Handler, HttpRoute, Message, MessageKind, Router, Server};

#[test]
fn echoes_text_and_binary_whole_and_fragmented() {
    let server = start(config());
    let addr = server.local_addr();
    let mut c = Client::open(addr);
    c.send(0x81, b"hello");
    assert_eq!(c.recv(), Some((0x1, b"hello".to_vec())));
    c.send(0x82, &[0, 1, 2, 255]);
    assert_eq!(c.recv(), Some((0x2, vec![0, 1, 2, 255])));
    // A message in three frames, the last one large: assembled in pool chunks.
    let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    c.send(0x02, b"ab");
    c.send(0x00, b"cd");
    c.send(0x80, &big);
    let (op, data) = c.recv().unwrap();
    assert_eq!(op, 0x2);
    assert_eq!(&data[..4], b"abcd");
    assert_eq!(&data[4..], &big[..]);
    c.send(0x89, b"p"); // ping
    assert_eq!(c.recv(), Some((0xa, b"p".to_vec())));
    c.send(0x88, &1000u16.to_be_bytes());
    assert_eq!(c.recv_close(), Some(1000));
    assert!(c.sees_eof());
    assert!(metric(addr, "freeboard_received_messages_total") >= 3.0);
    assert_eq!(metric(addr, "freeboard_closes_total{reason=\"normal\"}"), 1.0);
    drop(c);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn http_routes_answer_plain_requests() {
    let server = start(config());
    let addr = server.local_addr();
    assert!(http(addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 200"));
    let metrics = http(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(metrics.contains("freeboard_pool_chunks_in_use"), "{metrics}");
    assert!(http(addr, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 426"));
    assert!(http(addr, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(http(addr, &upgrade_request("/nope")).starts_with("HTTP/1.1 404"));
    assert_eq!(metric(addr, "freeboard_refusals_total{status=\"426\"}"), 1.0);
    assert_eq!(metric(addr, "freeboard_refusals_total{status=\"404\"}"), 2.0);
    server.handle().shutdown();
    server.join().unwrap();
}

/// A library server serves the plain HTTP routes it asks for and nothing else: the README's
/// example must not expose metrics or an unauthenticated publish on the internet.
#[test]
fn plain_http_routes_are_opt_in() {
    let routes = || Router::new().route("/echo", freeboard::Echo);
    let server = Server::bind(config(), routes).unwrap().spawn();
    let addr = server.local_addr();
    for request in [
        "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        "POST /topic/x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
    ] {
        let answer = http(addr, request);
        assert!(answer.starts_with("HTTP/1.1 404"), "{request:?} answered {answer:?}");
    }
    assert_eq!(server.metrics().refusals_for(404), 3);
    server.handle().shutdown();
    server.join().unwrap();
}

/// A second server on a taken address fails at once instead of silently sharing its
/// connections; one that asks to share joins the group.
#[test]
fn a_taken_port_is_refused_unless_shared() {
    let first = Server::bind(config(), Router::new).unwrap().spawn();
    let mut second = config();
    second.listen = first.local_addr();
    let error = Server::bind(second.clone(), Router::new).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse, "{error}");
    assert!(error.to_string().contains(&first.local_addr().to_string()), "{error}");
    second.share_port = true;
    let joined = Server::bind(second, Router::new).unwrap();
    assert_eq!(joined.local_addr(), first.local_addr());
    drop(joined);
    first.handle().shutdown();
    first.join().unwrap();
}

/// A budget the machine cannot back fails before anything listens, naming the setting.
#[test]
fn a_budget_beyond_the_machine_is_refused() {
    let mut cfg = config();
    cfg.memory = 1 << 50;
    let error = Server::bind(cfg, Router::new).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{error}");
    assert!(error.to_string().starts_with("memory 1125899906842624 is more than"), "{error}");
}

#[test]
fn max_connections_answers_503() {
    let mut cfg = config();
    cfg.max_connections = 2;
    let server = start(cfg);
    let addr = server.local_addr();
    let a = Client::open(addr);
    let b = Client::open(addr);
    let (c, status, head) = Client::connect(addr, "/");
    assert_eq!(status, 503, "{head}");
    assert_eq!(server.metrics().refusals_for(503), 1);
    drop((a, b, c));
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn per_ip_limit_answers_429_with_retry_after() {
    let mut cfg = config();
    cfg.max_connections_per_ip = 1;
    let server = start(cfg);
    let addr = server.local_addr();
    let a = Client::open(addr);
    let (b, status, head) = Client::connect(addr, "/");
    assert_eq!(status, 429);
    assert!(head.contains("Retry-After: 1\r\n"), "{head}");
    assert_eq!(server.metrics().refusals_for(429), 1);
    drop((a, b));
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn accept_rate_limits_answer_429_per_ip_and_503_globally() {
    // A rate of 0.001/s holds one token: the first connection passes, the next does not.
    let mut cfg = config();
    cfg.accept_rate_per_ip = 0.001;
    let server = start(cfg);
    let addr = server.local_addr();
    let a = Client::open(addr);
    let (b, status, head) = Client::connect(addr, "/");
    assert_eq!(status, 429);
    assert!(head.contains("Retry-After: 1\r\n"), "{head}");
    assert_eq!(server.metrics().refusals_for(429), 1);
    drop((a, b));
    server.handle().shutdown();
    server.join().unwrap();

    let mut cfg = config();
    cfg.accept_rate = 0.001;
    let server = start(cfg);
    let addr = server.local_addr();
    let a = Client::open(addr);
    let (b, status, _) = Client::connect(addr, "/");
    assert_eq!(status, 503);
    assert_eq!(server.metrics().refusals_for(503), 1);
    drop((a, b));
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn handshake_timeout_drops_slow_clients() {
    let mut cfg = config();
    cfg.limits.handshake_timeout = Duration::from_millis(200);
    let server = start(cfg);
    let addr = server.local_addr();
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap(); // never finished
    let mut c = Client::raw(s);
    assert!(c.sees_eof());
    assert_eq!(server.metrics().handshake_timeouts(), 1);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn a_request_head_split_across_reads_is_kept_in_pool_chunks() {
    let server = start(config());
    let addr = server.local_addr();
    let request = upgrade_request("/echo");
    let mut s = TcpStream::connect(addr).unwrap();
    let (first, rest) = request.as_bytes().split_at(20);
    s.write_all(first).unwrap();
    // Wait until the server holds the partial head (one chunk), then finish it.
    let metrics = server.metrics();
    common::wait_until("the partial head to hold a chunk", || metrics.total_chunks_in_use() > 0);
    s.write_all(rest).unwrap();
    let mut c = Client::raw(s);
    assert!(c.read_head().starts_with("HTTP/1.1 101"));
    c.send(0x81, b"split");
    assert_eq!(c.recv(), Some((0x1, b"split".to_vec())));
    common::wait_until("the head's chunk to go back", || metrics.total_chunks_in_use() == 0);
    drop(c);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn oversized_head_answers_431() {
    let server = start(config());
    let addr = server.local_addr();
    let request = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Filler: {}\r\n\r\n", "a".repeat(9000));
    assert!(http(addr, &request).starts_with("HTTP/1.1 431"));
    assert_eq!(server.metrics().refusals_for(431), 1);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn oversized_message_closes_with_1009() {
    let mut cfg = config();
    cfg.limits.max_message_size = 1024;
    let server = start(cfg);
    let addr = server.local_addr();
    let mut c = Client::open(addr);
    c.send(0x82, &[7u8; 2000]);
    assert_eq!(c.recv_close(), Some(1009));
    assert!(c.sees_eof());
    assert_eq!(server.metrics().closes_for("message_too_big"), 1);
    drop(c);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn budget_admission_answers_503_while_the_pool_is_short() {
    let mut cfg = config();
    // ~345 chunks after the read buffer, the cork, the assembly reserve and the topic tables'
    // sixteenth.
    cfg.memory = 9 << 18;
    cfg.read_buffer = 64 << 10;
    if cfg.io == freeboard::IoDriver::Uring {
        // An io_uring loop's receive buffers are pool chunks, as many as the read buffer and
        // the cork hold (a power of two, at least 8), beside the read buffer and the cork it
        // keeps: the same pool for the message needs them added to the budget.
        let buffers = (2 * cfg.read_buffer / cfg.chunk_size).max(8).next_power_of_two();
        let segments = buffers * freeboard_buf::DEFAULT_SEGMENTS_PER_CHUNK;
        cfg.memory += freeboard_buf::Pool::footprint(cfg.chunk_size, buffers, segments);
    }
    cfg.limits.max_message_size = 1 << 20;
    cfg.connection_reserve = 768 << 10;
    let server = start(cfg);
    let addr = server.local_addr();
    let mut holder = Client::open(addr);
    // Half a message of 1 MiB announced, 900 KiB sent: its pieces hold pool chunks.
    let payload = vec![1u8; 900 << 10];
    let mut frame = freeboard_test::frame(0x82, &vec![0u8; 1 << 20], freeboard_test::TEST_MASK);
    frame.truncate(14 + payload.len());
    holder.stream.write_all(&frame).unwrap();
    // Wait until the server has taken the bytes in (the pool gauge moves).
    common::wait_until("the partial message to hold chunks", || {
        common::metric(addr, "freeboard_pool_chunks_in_use{event_loop=\"0\"}") >= 200.0
    });
    let (refused, status, _) = Client::connect(addr, "/");
    assert_eq!(status, 503);
    assert_eq!(server.metrics().refusals_for(503), 1);
    drop((holder, refused));
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn shutdown_closes_every_connection_with_1001() {
    let server = start(config());
    let addr = server.local_addr();
    let mut clients: Vec<Client> = (0..5).map(|_| Client::open(addr)).collect();
    let handle = server.handle();
    let joiner = std::thread::spawn(move || server.join());
    handle.shutdown();
    for c in &mut clients {
        assert_eq!(c.recv_close(), Some(1001));
        c.send(0x88, &1001u16.to_be_bytes());
        assert!(c.sees_eof(), "the server closes TCP after the close handshake");
    }
    drop(clients);
    joiner.join().unwrap().unwrap();
}

/// Every open connection is closed at once: each close frame is written as it is queued,
/// so its pool chunk is free again for the next one (a million closes need one chunk, not
/// a million).
#[test]
fn a_shutdown_writes_each_close_before_queuing_the_next() {
    const CLIENTS: usize = 300;
    let server = start(config());
    let addr = server.local_addr();
    let metrics = server.metrics();
    let mut clients: Vec<Client> = (0..CLIENTS).map(|_| Client::open(addr)).collect();
    let before = metrics.total_chunks_high_water();
    let handle = server.handle();
    let joiner = std::thread::spawn(move || server.join());
    handle.shutdown();
    for c in &mut clients {
        assert_eq!(c.recv_close(), Some(1001));
        c.send(0x88, &1001u16.to_be_bytes());
    }
    drop(clients);
    joiner.join().unwrap().unwrap();
    let during = metrics.total_chunks_high_water();
    assert!(
        during <= before + 4,
        "{CLIENTS} closes took the pool from {before} to {during} chunks"
    );
}

#[test]
fn a_message_the_pool_cannot_hold_closes_with_1013() {
    let mut cfg = config();
    cfg.memory = 1 << 20; // about 170 chunks: less than the message below
    cfg.limits.max_message_size = 1 << 20;
    cfg.connection_reserve = 4096;
    let server = start(cfg);
    let addr = server.local_addr();
    let mut c = Client::open(addr);
    c.send(0x02, b"start");
    c.send(0x80, &vec![3u8; 900 << 10]);
    // No truncated echo: the first frame back is the close.
    let (opcode, payload) = c.recv().unwrap();
    assert_eq!((opcode, &payload[..2]), (0x8, &1013u16.to_be_bytes()[..]));
    c.send(0x88, &1013u16.to_be_bytes());
    assert!(c.sees_eof());
    let metrics = server.metrics();
    common::wait_until("the close to be counted", || metrics.closes_for("try_again_later") == 1);
    common::wait_until("the chunks to return", || metrics.total_chunks_in_use() == 0);
    drop(c);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn idle_connections_are_pinged_and_dropped_without_a_pong() {
    let mut cfg = config();
    cfg.limits.idle_timeout = Some(Duration::from_millis(100));
    cfg.limits.pong_timeout = Duration::from_millis(100);
    let server = start(cfg);
    let addr = server.local_addr();
    let mut answering = Client::open(addr);
    let mut silent = Client::open(addr);
    // The answering client gets pings and stays; three rounds prove the timer re-arms.
    for _ in 0..3 {
        let (opcode, payload) = answering.recv().unwrap();
        assert_eq!(opcode, 0x9);
        answering.send(0x8a, &payload);
    }
    answering.send(0x81, b"still here");
    loop {
        match answering.recv().unwrap() {
            (0x9, payload) => answering.send(0x8a, &payload), // a slow machine: another round
            reply => break assert_eq!(reply, (0x1, b"still here".to_vec())),
        }
    }
    // The silent one gets a ping, ignores it, and is dropped.
    assert_eq!(silent.recv().map(|(op, _)| op), Some(0x9));
    assert!(silent.sees_eof());
    let metrics = server.metrics();
    common::wait_until("the abnormal close to be counted", || metrics.closes_for("abnormal") == 1);
    drop((answering, silent));
    server.handle().shutdown();
    server.join().unwrap();
}

/// Many messages in one read take the echo above the high watermark mid-buffer: reading from
/// the socket pauses, but the bytes already read are still parsed, so every message comes back
/// whole and in order (dropping them once tore the stream: close 1002 after 64 echoes).
#[test]
fn a_pause_above_the_high_watermark_keeps_the_bytes_already_read() {
    let mut config = config();
    config.limits.send_low = 4 << 10;
    config.limits.send_high = 16 << 10;
    let server = start(config);
    let mut c = Client::open(server.local_addr());
    let count = 300u32;
    let frames: Vec<u8> = (0..count)
        .flat_map(|i| freeboard_test::frame(0x82, &[i as u8; 1024], freeboard_test::TEST_MASK))
        .collect();
    // Written from a second thread: the server stops reading until this side reads.
    let mut writer = c.stream.try_clone().unwrap();
    let writing = std::thread::spawn(move || writer.write_all(&frames).unwrap());
    for i in 0..count {
        assert_eq!(c.recv(), Some((0x2, vec![i as u8; 1024])), "message {i}");
    }
    writing.join().unwrap();
    c.send(0x88, &1000u16.to_be_bytes());
    assert_eq!(c.recv_close(), Some(1000));
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn an_exhausted_pool_still_answers_503() {
    let mut cfg = config();
    cfg.memory = 2 << 20; // ~320 chunks after the read buffer, the cork and the assembly reserve
    // Watermarks and cap above the pool: the pool runs out first, and drop-newest keeps
    // reading (and counting drops) once it has.
    cfg.limits.send_low = 3 << 20;
    cfg.limits.send_high = 3 << 20;
    cfg.limits.send_cap = 4 << 20;
    cfg.limits.slow_consumer = freeboard::SlowConsumerPolicy::DropNewest;
    cfg.limits.close_timeout = Duration::from_secs(10);
    // The chunks a new connection's reserve needs: fewer free, and its upgrade gets 503.
    let reserve = (cfg.connection_reserve / cfg.chunk_size) as f64;
    let server = start(cfg);
    let addr = server.local_addr();
    let total = metric(addr, "freeboard_pool_chunks_capacity{event_loop=\"0\"}");
    // Watched in process: a scrape of `/metrics` is a connection of the loop too, and while
    // it is open the hog's fair share of a contended pool halves (a message it has in pieces
    // may then be refused with 1013 before the pool runs short).
    let metrics = server.metrics();
    let short = || {
        let taken = metrics.total_chunks_in_use() + metrics.total_chunks_withheld();
        total - (taken as f64) < reserve
    };
    // A client that reads nothing, with the usual socket buffers: the kernel takes a few MB of
    // echoes, the pool the rest. (A receive buffer shrunk to a page, as `non_reader` sets, can
    // stall loopback TCP for seconds under load: the acknowledgements ride on the echoes it
    // has no room for, and the writer backs off as if they were lost.)
    let hog = Client::open(addr);
    // Written from a second thread until the socket fails: drop-newest keeps reading, but once
    // the pool is that short a message split across reads may be refused with 1013, and the
    // server then reads no more (the connection and its queue stay until the close timeout).
    // The writes run ahead of the server by what the kernel buffers, so the pool may go from
    // roomy to exhausted in one read: this thread watches while the other writes.
    let mut writer = hog.stream.try_clone().unwrap();
    let writing = std::thread::spawn(move || {
        let frame = freeboard_test::frame(0x82, &[7u8; 1000], freeboard_test::TEST_MASK);
        let _ = (0..100_000).try_for_each(|_| writer.write_all(&frame));
    });
    common::wait_until("the pool to run short", short);
    let (refused, status, head) = Client::connect(addr, "/");
    assert_eq!(status, 503, "{head}");
    assert_eq!(server.metrics().refusals_for(503), 1);
    // The writer, if still writing or blocked, fails once the socket is shut.
    hog.stream.shutdown(std::net::Shutdown::Both).unwrap();
    writing.join().unwrap();
    drop((hog, refused));
    common::stop_once_idle(server);
}

#[test]
fn echo_under_block_loses_no_echo_and_closes_only_with_1013() {
    let mut cfg = config();
    cfg.limits.send_low = 8 << 10;
    cfg.limits.send_high = 16 << 10;
    cfg.limits.send_cap = 20 << 10;
    cfg.limits.slow_consumer = freeboard::SlowConsumerPolicy::Block;
    let server = start(cfg);
    let mut c = Client::open(server.local_addr());
    // 20 MB of 100-byte messages, written by a thread while nothing is read: the server echoes
    // as it reads until the kernel's buffers are full, then `block` stops reading above the
    // high watermark. Whether an echo then finds no room below the cap depends on where the
    // queue stood when reading stopped (a loaded machine reaches it, a quiet one may not);
    // either way no echo may be lost: every echo arrives in order, and the only way to stop
    // short is Echo's close 1013 for the one it could not keep.
    const MESSAGES: u32 = 200_000;
    let mut burst = Vec::new();
    for seq in 0..MESSAGES {
        let mut message = [0u8; 100];
        message[..4].copy_from_slice(&seq.to_be_bytes());
        burst.extend(freeboard_test::frame(0x82, &message, freeboard_test::TEST_MASK));
    }
    let mut writer = c.stream.try_clone().unwrap();
    let writing = std::thread::spawn(move || writer.write_all(&burst));
    std::thread::sleep(Duration::from_millis(500));
    let mut next = 0u32;
    let code = loop {
        if next == MESSAGES {
            break None;
        }
        match c.recv() {
            Some((0x2, payload)) => {
                assert_eq!(payload[..4], next.to_be_bytes(), "echo {next} missing");
                next += 1;
            }
            Some((0x8, payload)) => break Some(u16::from_be_bytes([payload[0], payload[1]])),
            other => panic!("unexpected {other:?} after {next} echoes"),
        }
    };
    if let Some(code) = code {
        assert_eq!(code, 1013, "after {next} echoes");
        assert!(next >= 1000, "{next} echoes before the close");
    }
    drop(c);
    // After a close the rest of the burst is discarded until the server's linger ends.
    let _ = writing.join();
    common::stop_once_idle(server);
}

#[test]
fn a_closed_connection_whose_peer_stops_reading_is_dropped_at_the_close_timeout() {
    let mut cfg = config();
    cfg.limits.close_timeout = Duration::from_millis(500);
    // Watermarks above all the flood's sends: the server never stops reading it.
    cfg.limits.send_low = 16 << 20;
    cfg.limits.send_high = 16 << 20;
    cfg.limits.send_cap = 32 << 20;
    let routes = || Router::new().route("/", Flood).http("/metrics", HttpRoute::Metrics);
    let server = Server::bind(cfg, routes).unwrap().spawn();
    let addr = server.local_addr();
    let mut hog = non_reader(addr);
    // One message asks for more than the kernel's buffers take, so some stays in the server's
    // queue; then a close, which the server answers behind what the peer never reads. The
    // peer itself sends a few bytes only: a peer that wrote megabytes while reading nothing
    // could meet the kernel's retransmission back-off (up to 120 s) on its own writes.
    hog.send(0x82, b"flood");
    let metrics = server.metrics();
    common::wait_until("the queue to hold the flood", || metrics.total_chunks_in_use() > 0);
    hog.send(0x88, &1000u16.to_be_bytes());
    common::wait_until("the connection to be dropped with its chunks", || {
        metric(addr, "freeboard_connections") == 0.0 && metrics.total_chunks_in_use() == 0
    });
    drop(hog);
    common::stop_once_idle(server);
}

/// Answers any message with 6 MiB of 16 KiB messages.
struct Flood;

impl Handler for Flood {
    fn on_message(&mut self, conn: &mut Conn<'_>, _: Message<'_>) {
        let message = vec![7u8; 16 << 10];
        for _ in 0..384 {
            let _ = conn.send(MessageKind::Binary, &message);
        }
    }
}

/// An upgraded client that will not read: a small receive buffer (no autotuning to
/// megabytes), so what the server sends it beyond the kernel buffers (the server's send buffer
/// grows to 4 MiB here) stays in the server's pool.
fn non_reader(addr: std::net::SocketAddr) -> Client {
    let stream = TcpStream::connect(addr).unwrap();
    socket2::SockRef::from(&stream).set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut client = Client::raw(stream);
    client.stream.write_all(upgrade_request("/").as_bytes()).unwrap();
    assert!(client.read_head().starts_with("HTTP/1.1 101"));
    client
}
