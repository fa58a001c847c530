//! The kernel's memory is in the budget: every open connection is charged its socket's kernel
//! memory and its table entry against `--memory`, so a server whose budget pays for N
//! connections admits N and answers the next ones 503 with `Retry-After` (counted), and admits
//! again once some leave.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use freeboard::{Echo, HttpRoute, Router, Server};

/// Opens a connection and sends the upgrade; returns it and the status of the answer.
fn upgrade(addr: SocketAddr, request: &str) -> (TcpStream, u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "the server closed before answering");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let status = head[9..12].parse().unwrap();
    (s, status, head)
}

#[test]
fn connections_beyond_what_the_budget_pays_for_are_refused_503_and_counted() {
    let mut config = common::config();
    // A budget that pays for a few hundred connections' kernel memory.
    config.memory = 3 << 20;
    config.read_buffer = 16 << 10;
    config.limits.max_message_size = 64 << 10;
    config.limits.send_cap = 128 << 10;
    config.max_connections_per_ip = 100_000;
    let routes = || Router::new().route("/", Echo).http("/metrics", HttpRoute::Metrics);
    let server = Server::bind(config, routes).unwrap();
    let capacity = server.capacity();
    assert_eq!(capacity.binding(), "memory", "{capacity}");
    assert!(capacity.kernel_bytes >= 1024, "{capacity}");
    let admissible = capacity.budget;
    assert!((100..5_000).contains(&admissible), "{capacity}");
    let server = server.spawn();
    let addr = server.local_addr();
    let metrics = server.metrics();
    let request = common::upgrade_request("/");

    let extra = 20;
    let mut open = Vec::new();
    let mut refused = 0;
    for _ in 0..admissible + extra {
        let (s, status, head) = upgrade(addr, &request);
        match status {
            101 => open.push(s),
            503 => {
                assert!(head.contains("\r\nRetry-After: "), "{head}");
                refused += 1;
            }
            other => panic!("unexpected {other}: {head}"),
        }
    }
    // The charge rounds up to whole chunks: one connection either way of the arithmetic.
    assert!(open.len().abs_diff(admissible) <= 1, "{} admitted, {capacity}", open.len());
    assert_eq!(open.len() + refused, admissible + extra);
    common::wait_until("the refusals to be counted", || {
        metrics.access_refusals_for("budget") == refused as u64
    });
    assert_eq!(metrics.refusals_for(503), refused as u64);

    // The estimate is the open connections times the charge, and is exported.
    common::wait_until("the refused connections to go", || {
        let text = metrics.encode();
        let estimate = series(&text, "freeboard_kernel_memory_estimate_bytes");
        estimate == (open.len() * capacity.kernel_bytes) as f64
    });
    let text = metrics.encode();
    assert_eq!(series(&text, "freeboard_connection_kernel_bytes"), capacity.kernel_bytes as f64);
    assert!(series(&text, "freeboard_pool_chunks_withheld{event_loop=\"0\"}") > 0.0);

    // An admitted connection still has the reserve to talk in.
    let mut first = open.swap_remove(0);
    first.write_all(&[0x81, 0x82, 1, 2, 3, 4, b'h' ^ 1, b'i' ^ 2]).unwrap();
    let mut echo = [0u8; 4];
    first.read_exact(&mut echo).unwrap();
    if echo[0] == 0x88 {
        let mut rest = vec![0u8; echo[1] as usize - 2];
        first.read_exact(&mut rest).unwrap();
        panic!("closed: {}", String::from_utf8_lossy(&rest));
    }
    assert_eq!(echo, [0x81, 2, b'h', b'i']);
    open.push(first);

    // Ten leave: ten more get in, and the next is refused again.
    open.truncate(open.len() - 10);
    common::wait_until("ten connections to close", || metrics.connections() == open.len() as i64);
    for _ in 0..10 {
        let (s, status, head) = upgrade(addr, &request);
        assert_eq!(status, 101, "{head}");
        open.push(s);
    }
    let (_, status, _) = upgrade(addr, &request);
    assert_eq!(status, 503);
    drop(open);
    common::stop_once_idle(server);
}

/// The value of the series `name` (with its labels) in an exposition.
fn series(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(-1.0, |v| v.trim().parse().unwrap())
}

/// On any message, queues 4 MiB in 16 KiB messages, each carrying its sequence number.
struct Flood;

const FLOOD: usize = 256;
const PIECE: usize = 16 << 10;

impl freeboard::Handler for Flood {
    fn on_message(&mut self, conn: &mut freeboard::Conn<'_>, _message: freeboard::Message<'_>) {
        for i in 0..FLOOD {
            let mut payload = vec![0u8; PIECE];
            payload[..4].copy_from_slice(&(i as u32).to_be_bytes());
            conn.send(freeboard::MessageKind::Binary, &payload);
        }
    }
}

/// A client that stops reading while the server floods it, with the kernel's send limit at
/// `kernel_send_queue`: what the server's socket holds is charged (the gauge, withheld from
/// the pool), and when the client reads again it gets every message and the charge goes.
/// Returns the charge while it did not read.
fn charge_of_a_reader_that_stops(kernel_send_queue: usize) -> usize {
    let mut config = common::config();
    config.memory = 64 << 20;
    config.limits.send_cap = 8 << 20;
    config.kernel_send_queue = kernel_send_queue;
    let server = Server::bind(config, || Router::new().route("/", Flood)).unwrap().spawn();
    let addr = server.local_addr();
    let metrics = server.metrics();
    // A small receive window, so that the flood waits on the server's side.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4 << 10).unwrap();
    socket.connect(&addr.into()).unwrap();
    let mut client = common::Client::raw(socket.into());
    client.stream.write_all(common::upgrade_request("/").as_bytes()).unwrap();
    assert!(client.read_head().starts_with("HTTP/1.1 101"));
    client.send(0x82, b"go");

    let charge = || series(&metrics.encode(), "freeboard_kernel_buffer_charge_bytes");
    // Charged when the socket refuses, and again when the queue passes its high watermark
    // and reads pause: settled once the loop has queued the whole flood.
    common::wait_until("the socket's buffers to be charged", || {
        series(&metrics.encode(), "freeboard_send_queue_bytes{event_loop=\"0\"}") > 0.0
            && charge() > 0.0
    });
    std::thread::sleep(Duration::from_millis(200));
    let charged = charge();
    let withheld = series(&metrics.encode(), "freeboard_pool_chunks_withheld{event_loop=\"0\"}");
    assert!(withheld * 4096.0 >= charged, "{withheld} chunks withheld for {charged} bytes");
    let estimate = series(&metrics.encode(), "freeboard_kernel_memory_estimate_bytes");
    assert!(estimate >= charged + 1024.0, "estimate {estimate}, buffers {charged}");

    for i in 0..FLOOD {
        let (opcode, payload) = client.recv().expect("every message of the flood");
        assert_eq!((opcode, payload.len()), (0x2, PIECE));
        assert_eq!(payload[..4], (i as u32).to_be_bytes());
    }
    common::wait_until("the charge to go once the queue drained", || charge() == 0.0);
    drop(client);
    common::stop_once_idle(server);
    charged as usize
}

#[test]
fn a_reader_that_stops_leaves_its_backlog_in_the_budget_not_in_the_kernel() {
    // With the default limit, the kernel holds 64 KiB unsent and its overhead, and the paused
    // connection's receive buffer frozen small; the rest waits in the server's send queue.
    let bounded = charge_of_a_reader_that_stops(64 << 10);
    assert!(bounded <= 256 << 10, "{bounded} bytes charged");
    // Without it the kernel grows the socket's send buffer by itself, towards `tcp_wmem`'s
    // maximum (4 MiB by default): what it holds then is still charged.
    let unbounded = charge_of_a_reader_that_stops(0);
    assert!(unbounded > 2 * bounded, "{unbounded} bytes charged without the limit, {bounded} with");
}
