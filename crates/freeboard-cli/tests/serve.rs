//! `freeboard serve` as a process: it prints its URL, echoes, and on SIGTERM closes every
//! connection with 1001 and exits 0; a second signal ends it at once.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::Serve;

fn open(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(freeboard_test::upgrade_request("/echo", "").as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"));
    s
}

#[test]
fn sigterm_closes_with_1001_and_exits_0() {
    let mut serve = Serve::start(&["--drain-timeout", "10"]);
    let addr = serve.addr.clone();
    let mut clients: Vec<TcpStream> = (0..3).map(|_| open(&addr)).collect();
    let echo = freeboard_test::frame(0x81, b"hi", freeboard_test::TEST_MASK);
    clients[0].write_all(&echo).unwrap();
    let mut reply = [0u8; 4];
    clients[0].read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"\x81\x02hi");
    serve.signal(libc::SIGTERM);
    let mut hints = Vec::new();
    for c in &mut clients {
        let mut frame = [0u8; 4];
        c.read_exact(&mut frame).unwrap();
        assert_eq!(frame[0], 0x88);
        assert_eq!(u16::from_be_bytes([frame[2], frame[3]]), 1001);
        let close = freeboard_test::frame(0x88, &1001u16.to_be_bytes(), freeboard_test::TEST_MASK);
        c.write_all(&close).unwrap();
        // The rest of the close frame is its reason; then, the close handshake complete, the
        // server closes the TCP connection.
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        // With a hint of when to come back, drawn for each client (0.25 to 5.25 s).
        let reason = String::from_utf8(rest).unwrap();
        let ms = reason
            .strip_prefix("server shutting down; retry after ")
            .and_then(|r| r.strip_suffix(" ms"))
            .and_then(|ms| ms.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{reason:?}"));
        assert!((250..5250).contains(&ms), "{reason}");
        hints.push(ms);
    }
    assert!(hints.iter().any(|h| *h != hints[0]), "one hint for all: {hints:?}");
    assert!(serve.wait().success());
}

#[test]
fn a_second_signal_exits_at_once() {
    let mut serve = Serve::start(&["--drain-timeout", "60", "--close-timeout", "60"]);
    let addr = serve.addr.clone();
    let _client = open(&addr); // never answers the close: the drain would take a minute
    serve.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(200));
    serve.signal(libc::SIGINT);
    let status = serve.wait();
    assert!(!status.success());
}

/// Access settings that cannot work fail before anything listens, naming the setting.
#[test]
fn impossible_access_settings_fail_before_listening() {
    for (flags, says) in [
        (&["--trusted-proxy", "10.0.0.0/33"][..], "trusted_proxies"),
        (&["--allowed-origin", "example.com"][..], "allowed_origins"),
        (&["--jwt-secret", "too short"][..], "jwt_secret"),
        (&["--jwks", "/nonexistent/jwks.json"][..], "jwks_file"),
        (&["--connect-webhook", "https://auth.example/connect"][..], "connect_webhook"),
        (&["--max-pending-upgrades", "0"][..], "max_pending_upgrades"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_freeboard"))
            .args(["serve", "--listen", "127.0.0.1:0", "--threads", "1", "--memory", "16M"])
            .args(flags)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flags:?} started");
        assert!(
            out.stdout.is_empty(),
            "{flags:?} printed {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}
