//! What an idle WebSocket stream costs: heap measured by a counting allocator (this test
//! binary has one test, so nothing else allocates meanwhile).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

mod support;

use freeboard_h2::{Config, StreamId};
use support::*;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed to `System` unchanged; only the byte count is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `System::alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn an_idle_websocket_stream_costs_its_state_and_no_buffers() {
    // The connection's own heap, after its handshake and one WebSocket that came and went:
    // the HPACK table holds what the request indexed (nothing, with our literal encoder).
    let bytes = [preface(), websocket_request(1, "/"), data(1, b"", true)].concat();
    let start = LIVE.load(Ordering::Relaxed);
    let mut conn = freeboard_h2::Connection::new(Config::default());
    feed_all(&mut conn, &bytes);
    conn.respond(StreamId(1), 200, &[], true).unwrap();
    let mut out = [0u8; 64];
    while conn.poll_transmit(&mut out) > 0 {}
    feed_all(&mut conn, &[]);
    let idle_connection = LIVE.load(Ordering::Relaxed) - start;
    assert_eq!(conn.open_streams(), 0);
    // Only the transmit queue's capacity, kept up to 256 bytes so that small control frames
    // do not allocate on every turn.
    assert!((0..=256).contains(&idle_connection), "{idle_connection}");
    println!("an idle connection: {idle_connection} bytes of heap beside its struct");
    drop(conn);

    let (mut conn, mut decoder) = open(Config::builder().max_concurrent_streams(1000).build());
    // One request first, so the HPACK table and the connection's own buffers are warm.
    feed_all(&mut conn, &websocket_request(1, "/"));
    conn.respond(StreamId(1), 200, &[], false).unwrap();
    drain(&mut conn, &mut decoder);
    let requests: Vec<Vec<u8>> = (1..=100u32).map(|i| websocket_request(1 + 2 * i, "/")).collect();
    let before = LIVE.load(Ordering::Relaxed);
    for (i, request) in requests.iter().enumerate() {
        let stream = StreamId(3 + 2 * i as u32);
        let events = feed_all(&mut conn, request);
        drop(events);
        conn.respond(stream, 200, &[], false).unwrap();
        // The driver writes the response head out.
        let mut out = [0u8; 64];
        while conn.poll_transmit(&mut out) > 0 {}
    }
    // One more receive call lets the connection drop the last request head it lent out.
    feed_all(&mut conn, &[]);
    let after = LIVE.load(Ordering::Relaxed);
    let per_stream = (after - before) as f64 / 100.0;
    println!(
        "100 idle WebSocket streams: {per_stream:.1} bytes of heap each (stream state {} bytes, \
         Connection {} bytes)",
        freeboard_h2::stream_state_size(),
        size_of::<freeboard_h2::Connection>()
    );
    assert_eq!(conn.open_streams(), 101);
    // The table is a Vec of 24-byte entries: at most twice that after its growth.
    assert!(per_stream <= 2.0 * freeboard_h2::stream_state_size() as f64, "{per_stream}");
}
