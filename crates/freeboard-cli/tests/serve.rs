//! `freeboard serve` as a process: it prints its URL, echoes, and on SIGTERM closes every
//! connection with 1001 and exits 0; a second signal ends it at once.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn spawn(extra: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_freeboard"))
        .args(["serve", "--listen", "127.0.0.1:0", "--threads", "2", "--memory", "64M"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().rsplit(' ').next().unwrap().to_owned();
    assert!(url.starts_with("ws://127.0.0.1:"), "{line}");
    let addr = url.trim_start_matches("ws://").trim_end_matches('/').to_owned();
    (child, addr)
}

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

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

#[test]
fn sigterm_closes_with_1001_and_exits_0() {
    let (mut child, addr) = spawn(&["--drain-timeout", "10"]);
    let mut clients: Vec<TcpStream> = (0..3).map(|_| open(&addr)).collect();
    let echo = freeboard_test::frame(0x81, b"hi", freeboard_test::TEST_MASK);
    clients[0].write_all(&echo).unwrap();
    let mut reply = [0u8; 4];
    clients[0].read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"\x81\x02hi");
    signal(&child, libc::SIGTERM);
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
        assert_eq!(rest, b"server shutting down");
    }
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_second_signal_exits_at_once() {
    let (mut child, addr) = spawn(&["--drain-timeout", "60", "--close-timeout", "60"]);
    let _client = open(&addr); // never answers the close: the drain would take a minute
    signal(&child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(200));
    signal(&child, libc::SIGINT);
    let status = child.wait().unwrap();
    assert!(!status.success());
}
