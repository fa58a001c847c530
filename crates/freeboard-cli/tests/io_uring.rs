//! `freeboard serve --io uring`: the loops run on io_uring where the kernel allows it, and on
//! epoll — with one log line and the `freeboard_loop_io` gauge saying so — where it refuses,
//! the refusal forced for real by a seccomp filter installed in the server's process.
#![cfg(target_os = "linux")]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use common::Serve;

/// `GET /metrics`, the response's body.
fn metrics(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// One binary message echoed by the server at `/`.
fn echoes(addr: &str) {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut stream, mut inbox) = common::upgrade(stream, "/", "");
    let payload = vec![7u8; 3000];
    stream.write_all(&freeboard_test::frame(0x82, &payload, freeboard_test::TEST_MASK)).unwrap();
    let echo = inbox.frame(&mut stream).unwrap().expect("an echo");
    assert_eq!((echo.opcode, echo.payload), (0x2, payload));
}

/// A seccomp filter that fails `io_uring_setup` with `EPERM` (as Docker's default profile and
/// `kernel.io_uring_disabled=2` do) and allows every other call. Only the system call number
/// is looked at: the test runs native binaries of the build's own architecture.
fn refuse_io_uring() -> Vec<libc::sock_filter> {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let jump =
        |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter { code: code as u16, jt, jf, k };
    vec![
        // seccomp_data.nr, at offset 0.
        stmt(BPF_LD | BPF_W | BPF_ABS, 0),
        jump(BPF_JMP | BPF_JEQ | BPF_K, libc::SYS_io_uring_setup as u32, 0, 1),
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_ALLOW),
    ]
}

#[test]
fn a_kernel_that_refuses_io_uring_gets_epoll_and_one_log_line() {
    let mut filter = refuse_io_uring();
    // The filter's address crosses into the child as a number (a raw pointer is not `Send`).
    let (at, len) = (filter.as_mut_ptr() as usize, filter.len() as u16);
    let prepare = |command: &mut std::process::Command| {
        // SAFETY: between fork and exec the closure makes two prctl calls (async-signal-safe)
        // on the filter the parent allocated before the fork and keeps alive until `spawn`
        // returns (`filter` outlives the command).
        unsafe {
            command.pre_exec(move || {
                let program = libc::sock_fprog { len, filter: at as *mut libc::sock_filter };
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::prctl(
                        libc::PR_SET_SECCOMP,
                        libc::SECCOMP_MODE_FILTER,
                        &program as *const libc::sock_fprog,
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    };
    let serve = Serve::start_with(&["--io", "uring", "--threads", "2"], prepare);
    let line = serve.log_line("io_uring refused");
    assert!(line.contains("Operation not permitted"), "{line}");
    // One line for the process, not one per loop.
    let more = serve.log_lines_for(Duration::from_millis(500));
    assert!(!more.iter().any(|l| l.contains("io_uring refused")), "{more:?}");
    let metrics = metrics(&serve.addr);
    for event_loop in 0..2 {
        let series = format!("freeboard_loop_io{{event_loop=\"{event_loop}\",io=\"epoll\"}} 1");
        assert!(metrics.contains(&series), "{series} not in\n{metrics}");
    }
    assert!(!metrics.contains("io=\"uring\""), "{metrics}");
    echoes(&serve.addr);
}

#[test]
fn a_kernel_that_allows_io_uring_gets_it() {
    let serve = Serve::start(&["--io", "uring", "--threads", "2"]);
    echoes(&serve.addr);
    let scraped = metrics(&serve.addr);
    for event_loop in 0..2 {
        let series = format!("freeboard_loop_io{{event_loop=\"{event_loop}\",io=\"uring\"}} 1");
        assert!(scraped.contains(&series), "{series} not in\n{scraped}");
    }
    let epoll = Serve::start(&["--io", "epoll", "--threads", "1"]);
    let series = "freeboard_loop_io{event_loop=\"0\",io=\"epoll\"} 1";
    assert!(metrics(&epoll.addr).contains(series));
}

/// A fan-out through the ring: 40 subscribers over two loops each get every publication of a
/// burst, in order, and then a publication of 200 KiB whole (sends of several staged chunks).
#[test]
fn a_fan_out_over_io_uring_reaches_every_subscriber_in_order() {
    const SUBSCRIBERS: usize = 40;
    const BURST: usize = 500;
    let serve = Serve::start(&["--io", "uring", "--client-publish", "--threads", "2"]);
    let mut subscribers: Vec<_> =
        (0..SUBSCRIBERS).map(|_| common::subscribe(&serve.addr, "/topic/feed")).collect();
    let (mut publisher, _) = common::subscribe(&serve.addr, "/topic/feed");
    // Every subscription is known to every loop once each subscriber has seen a "warm".
    for (reader, inbox) in &mut subscribers {
        reader.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        'warm: loop {
            publisher.write_all(&common::text(b"warm")).unwrap();
            while let Ok(Some(f)) = inbox.frame(reader) {
                if f.payload == b"warm" {
                    break 'warm;
                }
            }
        }
        reader.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    let burst: Vec<u8> =
        (0..BURST).flat_map(|i| common::text(format!("m{i}").as_bytes())).collect();
    publisher.write_all(&burst).unwrap();
    let big: Vec<u8> = b"0123456789abcdef".iter().copied().cycle().take(200 << 10).collect();
    publisher.write_all(&common::text(&big)).unwrap();
    for (i, (reader, inbox)) in subscribers.iter_mut().enumerate() {
        let mut next = 0;
        while next <= BURST {
            let f = inbox.frame(reader).unwrap().expect("the stream goes on");
            if f.payload == b"warm" {
                continue;
            }
            if next == BURST {
                assert!(f.payload == big, "subscriber {i}: the large publication differs");
            } else {
                assert_eq!(f.payload, format!("m{next}").as_bytes(), "subscriber {i}");
            }
            next += 1;
        }
    }
}

/// Bundled receives: two clients at once each write 5,000 messages of 1 B to 3,000 B in one
/// go, more than the ring's buffers hold, so receives take runs of buffers, wrap the ring and
/// interleave with the other client's; each gets every message back whole and in order.
#[test]
fn pipelined_messages_over_io_uring_come_back_whole_and_in_order() {
    const MESSAGES: usize = 5_000;
    let serve = Serve::start(&["--io", "uring", "--threads", "1"]);
    let clients: Vec<_> = (0..2)
        .map(|client| {
            let addr = serve.addr.clone();
            std::thread::spawn(move || {
                let stream = TcpStream::connect(&addr).unwrap();
                stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let (mut stream, mut inbox) = common::upgrade(stream, "/", "");
                let payload = move |i: usize| vec![(i + client) as u8; 1 + (i * 7919) % 3000];
                let mut writer = stream.try_clone().unwrap();
                let sender = std::thread::spawn(move || {
                    let all: Vec<u8> = (0..MESSAGES)
                        .flat_map(|i| {
                            freeboard_test::frame(0x82, &payload(i), freeboard_test::TEST_MASK)
                        })
                        .collect();
                    writer.write_all(&all).unwrap();
                });
                for i in 0..MESSAGES {
                    let echo = inbox.frame(&mut stream).unwrap().expect("an echo");
                    assert!(echo.payload == payload(i), "client {client}: message {i} differs");
                }
                sender.join().unwrap();
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
}

/// A loop that waits on its ring (not on its epoll) still wakes for its timers: a connection
/// that sends nothing is closed at the handshake timeout.
#[test]
fn a_loop_waiting_on_its_ring_wakes_for_its_timers() {
    let serve = Serve::start(&["--io", "uring", "--threads", "1", "--handshake-timeout", "1s"]);
    let mut silent = TcpStream::connect(&serve.addr).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = std::time::Instant::now();
    let mut rest = Vec::new();
    // Closed (an answer, then EOF, or a reset) rather than left waiting for the read timeout.
    let _ = silent.read_to_end(&mut rest);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(8), "closed after {waited:?}");
    assert!(waited >= Duration::from_millis(900), "closed after {waited:?}");
    echoes(&serve.addr);
}

/// `freeboard bench --peers freeboard-uring` starts `freeboard serve --io uring` beside the
/// other peers: a broadcast through it reaches every subscriber with every publication.
#[test]
fn the_bench_measures_freeboard_on_io_uring_as_a_peer() {
    let json =
        std::env::temp_dir().join(format!("freeboard-uring-peer-{}.json", std::process::id()));
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_freeboard"))
        .args(["bench", "broadcast", "--peers", "freeboard-uring", "--subscribers", "20"])
        .args(["--size", "64", "--messages", "50", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    let row = &report["broadcasts"][0];
    assert_eq!(row["server"], "freeboard-uring", "{report}");
    assert_eq!(row["reader_deliveries"], 20 * 50, "{report}");
}
