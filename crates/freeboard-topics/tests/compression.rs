//! permessage-deflate (RFC 7692) through a real server on loopback: negotiation, compressed
//! echo in both modes, RSV1 on the first frame only, publications compressed once for every
//! compressing subscriber, and the defined outcome of bad input (a bomb, corrupt data,
//! invalid text, an offer the server does not accept).

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{config, start};
use flate2::{Compress, Compression as Level, Decompress, FlushCompress, FlushDecompress};
use freeboard::config::TopicsConfig;
use freeboard::{
    Compression, Conn, Handler, Message, MessageKind, RouteOptions, Router, Server, ServerConfig,
    SlowConsumerPolicy,
};
use freeboard_test::{Frame, Inbox, TEST_MASK};

struct DeflateClient {
    stream: TcpStream,
    inbox: Inbox,
    head: String,
    /// The server's context (taken over between messages unless it said otherwise).
    inflater: Decompress,
}

impl DeflateClient {
    fn connect(addr: SocketAddr, offer: &str) -> Self {
        Self::connect_to(addr, "/", Some(offer))
    }

    /// Upgrades at `path`, offering `offer` if any.
    fn connect_to(addr: SocketAddr, path: &str, offer: Option<&str>) -> Self {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let extra = offer.map_or(String::new(), |o| format!("Sec-WebSocket-Extensions: {o}\r\n"));
        stream.write_all(freeboard_test::upgrade_request(path, &extra).as_bytes()).unwrap();
        let mut inbox = Inbox::default();
        let head = inbox.head(&mut stream).unwrap().unwrap();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        Self { stream, inbox, head, inflater: Decompress::new(false) }
    }

    fn extensions(&self) -> Option<&str> {
        self.head.lines().find_map(|l| l.strip_prefix("Sec-WebSocket-Extensions: ")).map(str::trim)
    }

    fn send(&mut self, first_byte: u8, payload: &[u8]) {
        self.stream.write_all(&freeboard_test::frame(first_byte, payload, TEST_MASK)).unwrap();
    }

    fn recv(&mut self) -> Frame {
        self.inbox.frame(&mut self.stream).unwrap().expect("a frame")
    }

    /// Inflates a compressed message from the server with the connection's context.
    fn inflate(&mut self, data: &[u8]) -> Vec<u8> {
        inflate_with(&mut self.inflater, data)
    }

    fn recv_close(&mut self) -> u16 {
        loop {
            let frame = self.recv();
            if frame.opcode == 0x8 {
                return frame.close_code();
            }
        }
    }
}

/// Raw deflate with a sync flush and the tail removed (§7.2.1).
fn deflate(data: &[u8]) -> Vec<u8> {
    let mut z = Compress::new(Level::default(), false);
    let mut out = Vec::with_capacity(data.len() + 1024);
    loop {
        let at = z.total_in() as usize;
        z.compress_vec(&data[at..], &mut out, FlushCompress::Sync).unwrap();
        if z.total_in() as usize == data.len() && out.len() < out.capacity() {
            break;
        }
        out.reserve(out.capacity());
    }
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    out
}

fn inflate(data: &[u8]) -> Vec<u8> {
    inflate_with(&mut Decompress::new(false), data)
}

fn inflate_with(z: &mut Decompress, data: &[u8]) -> Vec<u8> {
    let mut input = data.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut out = Vec::with_capacity(1 << 20);
    z.decompress_vec(&input, &mut out, FlushDecompress::Sync).unwrap();
    out
}

fn server(mode: Compression, tweak: impl FnOnce(&mut ServerConfig)) -> freeboard::RunningServer {
    let mut c = config();
    c.compression = mode;
    c.compression_threshold = 16;
    tweak(&mut c);
    start(c)
}

const JSON: &[u8] =
    br#"{"id":42,"method":"scores.update","params":{"home":2,"away":1,"minute":77}}"#;

fn compressed_echo(mode: Compression, expected: &str) {
    let server = server(mode, |_| {});
    let mut c =
        DeflateClient::connect(server.local_addr(), "permessage-deflate; client_max_window_bits");
    assert_eq!(c.extensions(), Some(expected));
    // A compressed message in one frame: RSV1 on it, echoed compressed.
    for _ in 0..3 {
        c.send(0xc1, &deflate(JSON));
        let f = c.recv();
        assert_eq!((f.fin, f.opcode, f.rsv), (true, 0x1, 0b100));
        assert_eq!(c.inflate(&f.payload), JSON);
    }
    // Fragmented: RSV1 on the first frame only, a ping between the pieces.
    let wire = deflate(JSON);
    c.send(0x42, &wire[..5]);
    c.send(0x89, b"p");
    c.send(0x80, &wire[5..]);
    let pong = c.recv();
    assert_eq!((pong.opcode, pong.rsv), (0xa, 0));
    let f = c.recv();
    assert_eq!((f.opcode, f.rsv), (0x2, 0b100));
    assert_eq!(c.inflate(&f.payload), JSON);
    // Below the threshold: uncompressed, whether it came compressed or not.
    c.send(0xc1, &deflate(b"short"));
    let f = c.recv();
    assert_eq!((f.opcode, f.rsv, &f.payload[..]), (0x1, 0, &b"short"[..]));
    c.send(0x81, b"plain");
    assert_eq!(c.recv().payload, b"plain");
    // A 300 KB message that arrives in pieces and leaves in one compressed frame.
    let big: Vec<u8> = JSON.iter().copied().cycle().take(300_000).collect();
    c.send(0xc2, &deflate(&big));
    let f = c.recv();
    assert_eq!(f.rsv, 0b100);
    assert!(f.payload.len() < big.len() / 10);
    assert_eq!(c.inflate(&f.payload), big);
    c.send(0x88, &1000u16.to_be_bytes());
    assert_eq!(c.recv_close(), 1000);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn shared_mode_echoes_compressed_with_no_context_takeover() {
    compressed_echo(
        Compression::Shared,
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
    );
}

#[test]
fn dedicated_mode_echoes_compressed_with_its_window() {
    compressed_echo(Compression::Dedicated, "permessage-deflate");
    let server = server(Compression::Dedicated, |c| c.compression_window = 10);
    let addr = server.local_addr();
    let mut c = DeflateClient::connect(addr, "permessage-deflate; client_max_window_bits");
    assert_eq!(
        c.extensions(),
        Some("permessage-deflate; server_max_window_bits=10; client_max_window_bits=10")
    );
    c.send(0xc1, &deflate(JSON));
    let f = c.recv();
    assert_eq!(c.inflate(&f.payload), JSON);
    server.handle().shutdown();
    server.join().unwrap();
}

/// Under a policy that may drop or refuse a message the dedicated server keeps no context
/// of its own: a dropped message would leave the client's window behind the server's.
#[test]
fn dedicated_mode_keeps_no_server_context_under_a_dropping_policy() {
    for policy in [SlowConsumerPolicy::DropNewest, SlowConsumerPolicy::Block] {
        let running = server(Compression::Dedicated, |c| c.limits.slow_consumer = policy);
        let c = DeflateClient::connect(running.local_addr(), "permessage-deflate");
        assert_eq!(c.extensions(), Some("permessage-deflate; server_no_context_takeover"));
        running.handle().shutdown();
        running.join().unwrap();
    }
}

#[test]
fn malformed_offers_and_off_upgrade_without_the_extension() {
    let server = server(Compression::Shared, |_| {});
    let addr = server.local_addr();
    for offer in [
        "permessage-deflate; server_max_window_bits=7",
        "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
        "permessage-deflate; unknown_parameter",
        "x-webkit-deflate-frame",
    ] {
        let mut c = DeflateClient::connect(addr, offer);
        assert_eq!(c.extensions(), None, "{offer}");
        // Without the extension RSV1 is a protocol error (RFC 6455 §5.2).
        c.send(0xc1, &deflate(JSON));
        assert_eq!(c.recv_close(), 1002, "{offer}");
    }
    // The next offer in the list is taken when the first is malformed.
    let c = DeflateClient::connect(addr, "permessage-deflate; foo, permessage-deflate");
    assert!(c.extensions().is_some());
    server.handle().shutdown();
    server.join().unwrap();
    let server = server_off();
    let mut c = DeflateClient::connect(server.local_addr(), "permessage-deflate");
    assert_eq!(c.extensions(), None);
    c.send(0xc1, &deflate(JSON));
    assert_eq!(c.recv_close(), 1002);
    server.handle().shutdown();
    server.join().unwrap();
}

fn server_off() -> freeboard::RunningServer {
    server(Compression::Off, |_| {})
}

/// 16 MiB of zeros (about 16 KB compressed) against a 1 MiB `max_message_size`: close 1009
/// while inflating; the server keeps serving.
#[test]
fn a_bomb_gets_1009_and_bad_data_1007() {
    let bomb = deflate(&vec![0u8; 16 << 20]);
    assert!(bomb.len() < 64 << 10, "{}", bomb.len());
    for mode in [Compression::Shared, Compression::Dedicated] {
        let server = server(mode, |_| {});
        let addr = server.local_addr();
        let mut c = DeflateClient::connect(addr, "permessage-deflate");
        c.send(0xc2, &bomb);
        assert_eq!(c.recv_close(), 1009);
        // The same bomb spread over 64 fragments.
        let mut c = DeflateClient::connect(addr, "permessage-deflate");
        let pieces: Vec<&[u8]> = bomb.chunks(bomb.len() / 63).collect();
        for (i, piece) in pieces.iter().enumerate() {
            let first = match (i, i + 1 == pieces.len()) {
                (0, _) => 0x42,
                (_, true) => 0x80,
                _ => 0x00,
            };
            c.send(first, piece);
        }
        assert_eq!(c.recv_close(), 1009);
        // Not deflate data.
        let mut c = DeflateClient::connect(addr, "permessage-deflate");
        c.send(0xc2, &[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(c.recv_close(), 1007);
        // Text that is not UTF-8 once inflated.
        let mut c = DeflateClient::connect(addr, "permessage-deflate");
        c.send(0xc1, &deflate(&[b'a'; 40].iter().copied().chain([0xc3, 0x28]).collect::<Vec<_>>()));
        assert_eq!(c.recv_close(), 1007);
        // RSV1 on a continuation frame.
        let mut c = DeflateClient::connect(addr, "permessage-deflate");
        c.send(0x41, &deflate(JSON)[..3]);
        c.send(0xc0, b"x");
        assert_eq!(c.recv_close(), 1002);
        // An innocent client is served throughout.
        let mut c = DeflateClient::connect(addr, "permessage-deflate");
        c.send(0xc1, &deflate(JSON));
        assert_eq!(inflate(&c.recv().payload), JSON);
        server.handle().shutdown();
        server.join().unwrap();
    }
}

/// A publication of `i`: JSON over the threshold, except every fifth, which is short.
fn publication(i: usize) -> Vec<u8> {
    if i % 5 == 4 {
        format!("p{i}").into_bytes()
    } else {
        format!(r#"{{"seq":{i},"scores":{}}}"#, String::from_utf8_lossy(JSON)).into_bytes()
    }
}

fn topic_server(
    mode: Compression,
    tweak: impl FnOnce(&mut ServerConfig),
) -> freeboard::RunningServer {
    let mut c = config();
    c.compression = mode;
    c.compression_threshold = 16;
    tweak(&mut c);
    let service = common::service(&TopicsConfig::default(), false);
    Server::bind(c, move || service.mount(Router::new())).unwrap().spawn()
}

/// Reads the publications `0..n` of a subscriber: compressed ones (RSV1) are inflated
/// afresh (no context takeover), uncompressed ones taken as they are; returns how many
/// came compressed.
fn receive_publications(c: &mut DeflateClient, n: usize) -> usize {
    let mut compressed = 0;
    for i in 0..n {
        let f = c.recv();
        assert_eq!((f.fin, f.opcode), (true, 0x1));
        let payload = if f.rsv == 0b100 {
            compressed += 1;
            inflate(&f.payload)
        } else {
            assert_eq!(f.rsv, 0);
            f.payload
        };
        assert_eq!(payload, publication(i), "publication {i}");
    }
    compressed
}

/// N compressing and M plain subscribers of one topic get every publication intact; the
/// compressing ones get RSV1 frames (over the threshold), and each publication is compressed
/// once for all of them.
#[test]
fn a_publication_is_compressed_once_for_every_compressing_subscriber() {
    const PUBLICATIONS: usize = 60;
    let server = topic_server(Compression::Shared, |_| {});
    let addr = server.local_addr();
    let metrics = server.metrics();
    let mut compressing: Vec<_> = (0..6)
        .map(|i| {
            // One asks for a smaller window: its publications are compressed once more.
            let offer = if i == 0 {
                "permessage-deflate; server_max_window_bits=10"
            } else {
                "permessage-deflate"
            };
            let c = DeflateClient::connect_to(addr, "/topic/news", Some(offer));
            assert!(c.extensions().is_some_and(|e| e.contains("server_no_context_takeover")));
            c
        })
        .collect();
    let mut plain: Vec<_> =
        (0..4).map(|_| DeflateClient::connect_to(addr, "/topic/news", None)).collect();
    assert!(plain.iter().all(|c| c.extensions().is_none()));
    common::wait_until("every subscription", || metrics.subscriptions() == 10);
    for i in 0..PUBLICATIONS {
        let published = server.handle().publish("news", MessageKind::Text, &publication(i));
        assert_eq!(published.loops, 1);
    }
    let long = (0..PUBLICATIONS).filter(|i| i % 5 != 4).count();
    for c in &mut compressing {
        assert_eq!(receive_publications(c, PUBLICATIONS), long);
    }
    for c in &mut plain {
        assert_eq!(receive_publications(c, PUBLICATIONS), 0);
    }
    // Once per publication over the threshold, and once more for the 10-bit window (the
    // loop adds its counts to the metrics at the end of its turn, after its writes).
    common::wait_until("the counts", || metrics.deliveries() == 10 * PUBLICATIONS as u64);
    assert_eq!(metrics.topic_compressions(), 2 * long as u64);
    assert_eq!(metrics.topic_compression_fallbacks(), 0);
    assert_eq!(metrics.deliveries(), 10 * PUBLICATIONS as u64);
    server.handle().shutdown();
    server.join().unwrap();
}

/// Subscribes every connection to `news` and echoes what it sends.
struct SubscribeAndEcho;

impl Handler for SubscribeAndEcho {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        conn.subscribe("news").unwrap();
    }

    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        let _ = conn.send(message.kind, message.data);
    }
}

/// A dedicated connection that keeps its server context gets publications uncompressed (a
/// message compressed without its context would desynchronise its window) and its echoes
/// compressed against that context; interleaved, every one decodes. A dedicated connection
/// without server context takeover shares the compressed publication.
#[test]
fn dedicated_subscribers_with_context_takeover_decode_publications_among_their_echoes() {
    const ROUNDS: usize = 40;
    let mut c = config();
    c.compression = Compression::Dedicated;
    c.compression_threshold = 16;
    c.limits.slow_consumer = SlowConsumerPolicy::Close; // the server keeps its context only then
    let server =
        Server::bind(c, || Router::new().route_with("/", SubscribeAndEcho, RouteOptions::new()))
            .unwrap()
            .spawn();
    let addr = server.local_addr();
    let metrics = server.metrics();
    let mut keeping = DeflateClient::connect(addr, "permessage-deflate");
    assert_eq!(keeping.extensions(), Some("permessage-deflate"));
    let mut fresh: Vec<_> = (0..2)
        .map(|_| DeflateClient::connect(addr, "permessage-deflate; server_no_context_takeover"))
        .collect();
    assert!(
        fresh
            .iter()
            .all(|c| c.extensions() == Some("permessage-deflate; server_no_context_takeover"))
    );
    common::wait_until("every subscription", || metrics.subscriptions() == 3);
    let echo = |i: usize| format!(r#"{{"echo":{i},"body":{}}}"#, String::from_utf8_lossy(JSON));
    for i in 0..ROUNDS {
        keeping.send(0xc1, &deflate(echo(i).as_bytes()));
        server.handle().publish("news", MessageKind::Text, &publication(i));
        // The echo and the publication arrive in either order; the context follows the
        // order the server sent them in, which is the order they arrive in.
        let (mut echoed, mut published) = (false, false);
        while !(echoed && published) {
            let f = keeping.recv();
            if f.rsv == 0b100 {
                assert!(!echoed);
                assert_eq!(keeping.inflate(&f.payload), echo(i).as_bytes(), "echo {i}");
                echoed = true;
            } else {
                assert!(!published);
                assert_eq!(f.payload, publication(i), "publication {i}");
                published = true;
            }
        }
    }
    let long = (0..ROUNDS).filter(|i| i % 5 != 4).count();
    for c in &mut fresh {
        assert_eq!(receive_publications(c, ROUNDS), long);
    }
    common::wait_until("the counts", || metrics.deliveries() == 3 * ROUNDS as u64);
    assert_eq!(metrics.topic_compressions(), long as u64);
    server.handle().shutdown();
    server.join().unwrap();
}

/// When the budget cannot cover the loop's compressor (dedicated contexts hold it all),
/// publications go uncompressed to the subscribers that would have shared it, and each such
/// fallback is counted.
#[test]
fn a_publication_the_budget_cannot_compress_goes_uncompressed_and_is_counted() {
    let mut c = config();
    c.memory = 2 << 20;
    c.compression = Compression::Dedicated;
    c.compression_threshold = 16;
    c.limits.slow_consumer = SlowConsumerPolicy::Close;
    let server =
        Server::bind(c, || Router::new().route_with("/", SubscribeAndEcho, RouteOptions::new()))
            .unwrap()
            .spawn();
    let addr = server.local_addr();
    let metrics = server.metrics();
    // Each keeps a 15-bit server context, as big as the loop's shared compressor, until the
    // budget cannot cover one more (that one goes on uncompressed).
    let mut hogs = Vec::new();
    loop {
        let hog = DeflateClient::connect(addr, "permessage-deflate; client_no_context_takeover");
        let refused = hog.extensions().is_none();
        hogs.push(hog);
        if refused {
            break;
        }
        assert!(hogs.len() < 16, "the budget never ran short");
    }
    let mut c = DeflateClient::connect(
        addr,
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
    );
    assert!(c.extensions().is_some());
    common::wait_until("the subscriptions", || metrics.subscriptions() == hogs.len() as i64 + 1);
    for i in 0..4 {
        server.handle().publish("news", MessageKind::Text, &publication(i));
    }
    assert_eq!(receive_publications(&mut c, 4), 0);
    common::wait_until("the counts", || metrics.topic_compression_fallbacks() >= 4);
    assert_eq!(metrics.topic_compressions(), 0);
    assert_eq!(metrics.topic_compression_fallbacks(), 4);
    drop(hogs);
    server.handle().shutdown();
    server.join().unwrap();
}
