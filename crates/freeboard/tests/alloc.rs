//! Steady-state echo allocates nothing per message: a counting global allocator sees the same
//! number of allocations whether 1,000 or 100,000 more messages go through.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Sends `count` masked binary messages of mixed sizes, 16 in flight, and checks each echo.
/// Allocates nothing itself: frames are built in `out`, replies read into `inbuf`.
fn echo(stream: &mut std::net::TcpStream, count: usize, out: &mut [u8], inbuf: &mut [u8]) {
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

#[test]
fn steady_state_echo_does_not_allocate_per_message() {
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
