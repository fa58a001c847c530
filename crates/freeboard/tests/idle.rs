//! Idle connections hold no pool chunks: 10,000 open WebSocket connections, zero chunks in use,
//! and zero again after they close.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Raises the open-file limit so that both ends of every connection fit in this process;
/// returns how many connections fit.
fn raise_nofile(wanted: usize) -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let need = (2 * wanted + 256) as libc::rlim_t;
    let raised =
        libc::rlimit { rlim_cur: need.max(lim.rlim_cur), rlim_max: need.max(lim.rlim_max) };
    // SAFETY: `raised` is a valid rlimit; failure (no privilege) leaves the limit as it was.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        let soft = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: as above.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &soft) };
        return ((lim.rlim_max as usize).saturating_sub(256) / 2).min(wanted);
    }
    wanted
}

#[test]
fn ten_thousand_idle_connections_hold_no_chunks() {
    let n = raise_nofile(10_000);
    let mut cfg = common::config();
    cfg.threads = 2;
    cfg.max_connections_per_ip = n + 1;
    let server = common::start(cfg);
    let addr = server.local_addr();
    let request = common::upgrade_request("/");
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        clients.push(s);
    }
    for s in &mut clients {
        // The 101 response is 129 bytes: read exactly the head.
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(s.read(&mut byte).unwrap(), 1);
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    }
    let metrics = server.metrics();
    assert_eq!(metrics.connections(), n as i64);
    // The 101 responses held a chunk each until flushed: all go back, none stays.
    common::wait_until("idle connections to hold no chunk", || metrics.total_chunks_in_use() == 0);
    assert_eq!(metrics.connections(), n as i64);
    drop(clients);
    common::wait_until("connections to close", || metrics.connections() == 0);
    common::wait_until("chunks to return", || metrics.total_chunks_in_use() == 0);
    server.handle().shutdown();
    server.join().unwrap();
}
