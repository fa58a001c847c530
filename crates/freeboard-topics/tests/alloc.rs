//! Steady-state echo allocates nothing per message: a counting global allocator sees the same
//! number of allocations whether 1,000 or 100,000 more messages go through. Over `wss://` the
//! server allocates once per TLS record it receives and once per record it sends, inside
//! rustls 0.23 (see `wss_echo_allocates_per_tls_record_not_per_message`), and nothing per
//! message.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use freeboard::TlsConfig;
use freeboard::client::{TlsRoots, tls_client_config, tls_connection};
use freeboard_test::tls::TestCa;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set on a thread whose allocations are not the server's (a TLS client's).
    static UNCOUNTED: Cell<bool> = const { Cell::new(false) };
}

/// One test at a time: the count is process-wide.
static SERIAL: Mutex<()> = Mutex::new(());

fn count() {
    if !UNCOUNTED.with(Cell::get) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Sends `count` masked binary messages of mixed sizes, 16 in flight, and checks each echo.
/// Allocates nothing itself: frames are built in `out`, replies read into `inbuf`.
fn echo(stream: &mut impl ReadWrite, count: usize, out: &mut [u8], inbuf: &mut [u8]) {
    const SIZES: [usize; 5] = [1, 64, 125, 1000, 3000];
    let mut sent = 0;
    while sent < count {
        let batch = 16.min(count - sent);
        let mut at = 0;
        let mut expect = 0;
        for i in 0..batch {
            let len = SIZES[(sent + i) % SIZES.len()];
            let payload = [(i % 251) as u8; 3000];
            // A zero mask: the payload is sent as is.
            let n =
                freeboard_test::encode_frame(0x82, &payload[..len], Some([0; 4]), &mut out[at..])
                    .unwrap();
            at += n;
            expect += n - 4; // the echo is not masked
        }
        stream.write_all(&out[..at]).unwrap();
        stream.read_exact(&mut inbuf[..expect]).unwrap();
        assert_eq!(inbuf[0], 0x82);
        sent += batch;
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

#[test]
fn steady_state_echo_does_not_allocate_per_message() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let server = common::start(common::config());
    let mut client = common::Client::open(server.local_addr());
    let mut out = vec![0u8; 16 * 3010];
    let mut inbuf = vec![0u8; 16 * 3010];
    echo(&mut client.stream, 2_000, &mut out, &mut inbuf); // warm up: buffers reach their size
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    echo(&mut client.stream, 1_000, &mut out, &mut inbuf);
    let small = ALLOCATIONS.load(Ordering::Relaxed) - before;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    echo(&mut client.stream, 100_000, &mut out, &mut inbuf);
    let large = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert!(large <= small + 16, "{large} allocations for 100,000 messages vs {small} for 1,000");
    assert!(large < 100, "{large} allocations for 100,000 messages");
    server.handle().shutdown();
    server.join().unwrap();
}

/// rustls 0.23's unbuffered API decrypts a record in place, in the caller's buffer, and then
/// copies its plaintext into a new `Vec` (`CommonState::take_received_plaintext`), which
/// `ReadTraffic::next_record` hands out; sending, `WriteTraffic::encrypt` builds each record
/// in a new `Vec` (`MessageEncrypter::encrypt` returns an owned message) before copying it
/// into the caller's buffer. Neither can be avoided through its public API (a custom
/// `CryptoProvider` still returns owned records), so the bound here is one allocation per
/// record each way: this client writes 16 messages in one record, and the server gathers its
/// 16 echoes into one.
#[test]
fn wss_echo_allocates_per_tls_record_not_per_message() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    UNCOUNTED.with(|u| u.set(true));
    let ca = TestCa::new("alloc");
    let mut config = common::config();
    config.tls = Some(TlsConfig::new(ca.cert_pem(), ca.key_pem()));
    let server = common::start(config);
    let client_config = tls_client_config(&TlsRoots::CaFile(ca.ca_pem())).unwrap();
    let conn = tls_connection(client_config, "localhost").unwrap();
    let tcp = std::net::TcpStream::connect(server.local_addr()).unwrap();
    tcp.set_nodelay(true).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(common::upgrade_request("/").as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tls.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    let mut out = vec![0u8; 16 * 3010];
    let mut inbuf = vec![0u8; 16 * 3010];
    echo(&mut tls, 2_000, &mut out, &mut inbuf); // warm up
    let batches = 20_000 / 16;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    echo(&mut tls, 20_000, &mut out, &mut inbuf);
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    eprintln!("{allocations} server allocations for {batches} batches of 16 messages over wss");
    // One record in and one out per batch (measured: exactly 2 per batch); the slack is for
    // an echo that leaves in two turns. Nothing per message.
    let bound = 2 * batches as u64 + batches as u64 / 8;
    assert!(allocations <= bound, "{allocations} allocations for {batches} batches");
    drop(tls);
    server.handle().shutdown();
    server.join().unwrap();
}

/// Publishes through the topic route, 16 per read, to the publisher and two more subscribers
/// on its loop: framing, the outbox and the fan-out by reference allocate nothing per message.
#[test]
fn steady_state_fan_out_does_not_allocate_per_message() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    UNCOUNTED.with(|u| u.set(true)); // the clients are this thread
    let config = common::config();
    let service = common::service(&config.topics, true);
    let server = freeboard::Server::bind(config, move || service.mount(freeboard::Router::new()))
        .unwrap()
        .spawn();
    let connect = || {
        let (client, status, head) = common::Client::connect(server.local_addr(), "/topic/news");
        assert_eq!(status, 101, "{head}");
        client
    };
    let mut clients = [connect(), connect(), connect()];
    let metrics = server.metrics();
    common::wait_until("three subscriptions", || metrics.subscriptions() == 3);
    let frame = freeboard_test::frame(0x82, &[7; 64], freeboard_test::TEST_MASK);
    let batch = frame.repeat(16);
    let mut publish = |count: usize| {
        for _ in 0..count / 16 {
            clients[0].stream.write_all(&batch).unwrap();
            for client in &mut clients {
                for _ in 0..16 {
                    assert_eq!(client.recv(), Some((0x2, vec![7; 64])));
                }
            }
        }
    };
    publish(2_000); // warm up
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    publish(1_008);
    let small = ALLOCATIONS.load(Ordering::Relaxed) - before;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    publish(20_000);
    let large = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert!(large <= small + 16, "{large} allocations for 20,000 publishes vs {small} for 1,008");
    drop(clients);
    server.handle().shutdown();
    server.join().unwrap();
}
