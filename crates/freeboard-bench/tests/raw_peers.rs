//! The raw echo peers (`peers/raw-tcp-echo` on epoll, `peers/raw-uring-echo` on io_uring),
//! built and started as `freeboard bench --peers` does, return every byte over real loopback
//! sockets: pipelined frames from the load generator, a stream larger than any one buffer or
//! socket buffer, a client that stops reading beside one that goes on, and many short
//! connections.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use freeboard_bench::load::{self, Load};
use freeboard_bench::peers::{Peer, Peers};

/// Whether this kernel lets a process create an io_uring (`kernel.io_uring_disabled` is 0, or
/// the file is missing on kernels before 6.6, where nothing but seccomp disables it).
fn io_uring_allowed() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").map_or(true, |v| v.trim() == "0")
}

fn echoes_every_byte(peer: Peer) {
    // The freeboard binary is not started for a raw peer.
    let peers = Peers::in_repository(PathBuf::from("freeboard"));
    let running = peers.start(peer, None).unwrap();
    let addr = running.target.addr;

    let load = Load {
        clients: 4,
        in_flight: 64,
        size: 1000,
        messages: Some(5000),
        duration: Duration::from_secs(20),
        server_pid: Some(running.pid),
    };
    let m = load::run(&running.target, &load, &mut |_| {}).unwrap();
    assert_eq!((m.failed, m.sent, m.received, m.mismatched), (0, 20_000, 20_000, 0), "{m:?}");
    assert!(m.server_cpu_us_per_msg.is_some());

    // 8 MiB in one direction while reading on another thread: many receive buffers, sends
    // the socket takes only in part, and the bytes must come back in order.
    let sent: Vec<u8> =
        (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut reader = stream.try_clone().unwrap();
    let len = sent.len();
    let reading = std::thread::spawn(move || {
        let mut got = vec![0u8; len];
        reader.read_exact(&mut got).map(|()| got)
    });
    (&stream).write_all(&sent).unwrap();
    let got = reading.join().unwrap().unwrap();
    assert!(got == sent, "the echo differs from what was sent");
    stream.shutdown(Shutdown::Both).unwrap();

    // A client that writes and never reads fills its socket buffers and the echo's queue for
    // it; another client is still served.
    let stalled = TcpStream::connect(addr).unwrap();
    stalled.set_nonblocking(true).unwrap();
    let chunk = [7u8; 64 * 1024];
    let mut stuffed = 0usize;
    let start = std::time::Instant::now();
    while stuffed < 256 << 20 && start.elapsed() < Duration::from_secs(10) {
        match (&stalled).write(&chunk) {
            Ok(n) => stuffed += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("writing to the echo: {e}"),
        }
    }
    assert!(stuffed < 256 << 20, "the echo kept reading from a client that does not read");
    let mut other = TcpStream::connect(addr).unwrap();
    other.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    other.write_all(b"still served").unwrap();
    let mut back = [0u8; 12];
    other.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"still served");
    drop((stalled, other));

    // Connections opened and closed one after another: each is echoed, and a closed one
    // leaves nothing behind that would stop the next.
    for i in 0..500u32 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&i.to_le_bytes()).unwrap();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).unwrap();
        assert_eq!(u32::from_le_bytes(back), i);
    }
    // Every socket the echo accepted on its port is closed once its client has: none is left
    // in CLOSE_WAIT (the io_uring echo keeps its sockets in the ring's file table, not among
    // its descriptors, so this looks at the sockets themselves).
    let start = std::time::Instant::now();
    let mut waiting = close_wait(addr.port());
    while waiting > 0 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        waiting = close_wait(addr.port());
    }
    assert_eq!(waiting, 0, "{} left sockets in CLOSE_WAIT", peer.name());
}

#[test]
fn raw_tcp_echo_echoes_every_byte() {
    echoes_every_byte(Peer::RawTcp);
}

#[test]
fn raw_uring_echo_echoes_every_byte() {
    if !io_uring_allowed() {
        eprintln!("skipped: kernel.io_uring_disabled is set on this host");
        return;
    }
    echoes_every_byte(Peer::RawUring);
}

/// Sockets on local `port` in CLOSE_WAIT: closed by their peer, not yet by their owner.
fn close_wait(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address is ADDR:PORT in hex; state 08 is CLOSE_WAIT.
            fields[1].ends_with(&format!(":{port:04X}")) && fields[3] == "08"
        })
        .count()
}
