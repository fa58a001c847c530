//! Ping floods, close floods, and floods of large publishes.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::Duration;

use crate::ws::WsClient;

/// What a ping flood got back.
#[derive(Debug, Default)]
pub struct PingOutcome {
    /// Pings sent.
    pub pings: u32,
    /// Pongs received; each carries the number of a ping, strictly increasing (a server may
    /// answer only the latest of several pings it has not answered yet, RFC 6455 §5.5.3).
    pub pongs: u32,
    /// The number in the last pong.
    pub last: Option<u32>,
    /// Whether the data message sent after the flood was echoed intact, after the pongs.
    pub echo_after: bool,
    /// How many pings the attacker could write before the server stopped reading, when it
    /// did not read (0 when it read all along).
    pub written_before_backpressure: u32,
}

/// Sends `pings` pings numbered 0.. as fast as possible from one thread while another reads
/// the pongs, then one data message; checks the pongs' order and the echo.
pub fn ping_flood(addr: SocketAddr, pings: u32) -> PingOutcome {
    let mut client = WsClient::open(addr);
    let mut writer = client.stream.try_clone().expect("clone");
    let sender = std::thread::spawn(move || -> io::Result<()> {
        let mut batch = Vec::new();
        for i in 0..pings {
            batch.extend(freeboard_test::frame(0x89, &i.to_be_bytes(), freeboard_test::TEST_MASK));
            if batch.len() > 32 << 10 || i + 1 == pings {
                writer.write_all(&batch)?;
                batch.clear();
            }
        }
        writer.write_all(&freeboard_test::frame(0x82, b"after", freeboard_test::TEST_MASK))
    });
    let mut outcome = PingOutcome { pings, ..PingOutcome::default() };
    read_pongs(&mut client, &mut outcome);
    sender.join().expect("sender").expect("send the flood");
    outcome
}

/// Sends up to `max_pings` pings without reading anything: once a write has blocked for a
/// second (the server stopped reading) the rest follows while the pongs are read, then a
/// data message whose echo must come after them.
pub fn ping_flood_unread(addr: SocketAddr, max_pings: u32) -> PingOutcome {
    let mut client = WsClient::open(addr);
    let mut writer = client.stream.try_clone().expect("clone");
    writer.set_write_timeout(Some(Duration::from_secs(1))).expect("timeout");
    let (blocked, wait) = std::sync::mpsc::channel();
    let sender = std::thread::spawn(move || -> io::Result<u32> {
        let mut blocked_at = None;
        let mut batch = Vec::new();
        for i in 0..max_pings {
            batch.extend(freeboard_test::frame(0x89, &i.to_be_bytes(), freeboard_test::TEST_MASK));
            if batch.len() < 4096 && i + 1 < max_pings {
                continue;
            }
            let mut at = 0;
            while at < batch.len() {
                match writer.write(&batch[at..]) {
                    Ok(n) => at += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) && blocked_at.is_none() =>
                    {
                        blocked_at = Some(i);
                        let _ = blocked.send(());
                        writer.set_write_timeout(None)?;
                    }
                    Err(e) => return Err(e),
                }
            }
            batch.clear();
        }
        let _ = blocked.send(());
        writer.write_all(&freeboard_test::frame(0x82, b"after", freeboard_test::TEST_MASK))?;
        Ok(blocked_at.unwrap_or(0))
    });
    let _ = wait.recv(); // nothing is read until the flood has stalled (or ended)
    let mut outcome = PingOutcome { pings: max_pings, ..PingOutcome::default() };
    read_pongs(&mut client, &mut outcome);
    outcome.written_before_backpressure = sender.join().expect("sender").expect("send the flood");
    outcome
}

fn read_pongs(client: &mut WsClient, outcome: &mut PingOutcome) {
    while let Some(frame) = client.recv().expect("read pongs") {
        match frame.opcode {
            0xA => {
                let n = u32::from_be_bytes(frame.payload[..4].try_into().expect("4 bytes"));
                assert!(outcome.last.is_none_or(|last| n > last), "pong {n} out of order");
                outcome.last = Some(n);
                outcome.pongs += 1;
            }
            0x2 => {
                outcome.echo_after = frame.payload == b"after";
                break;
            }
            0x8 => panic!(
                "the server closed during the ping flood after pong {:?}: {:?} {:?}",
                outcome.last,
                frame.payload.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]])),
                String::from_utf8_lossy(frame.payload.get(2..).unwrap_or_default()),
            ),
            other => panic!("unexpected opcode {other} during the ping flood"),
        }
    }
}

/// What a close flood got back.
#[derive(Debug, Default)]
pub struct CloseOutcome {
    /// Connections that sent the flood.
    pub connections: usize,
    /// Connections that got exactly one close frame (1000), nothing after it, then EOF.
    pub clean: usize,
}

/// On each of `connections` connections sends `closes` close frames back to back, then a
/// data frame; each must get exactly one close (1000) and then the end of the stream.
pub fn close_flood(addr: SocketAddr, connections: usize, closes: usize) -> CloseOutcome {
    let mut outcome = CloseOutcome { connections, ..CloseOutcome::default() };
    let mut burst = Vec::new();
    for _ in 0..closes {
        burst.extend(freeboard_test::frame(
            0x88,
            &1000u16.to_be_bytes(),
            freeboard_test::TEST_MASK,
        ));
    }
    burst.extend(freeboard_test::frame(0x82, b"too late", freeboard_test::TEST_MASK));
    for _ in 0..connections {
        let mut client = WsClient::open(addr);
        let _ = client.send_raw(&burst); // the server may stop reading after the first
        let first = client.recv().expect("read the close");
        let second = client.recv();
        if first.as_ref().is_some_and(|f| f.opcode == 0x8 && f.close_code() == 1000)
            && matches!(second, Ok(None))
        {
            outcome.clean += 1;
        }
    }
    outcome
}

/// What a flood of large publishes got back.
#[derive(Debug, Default, Clone)]
pub struct PostFlood {
    /// Bodies sent whole.
    pub posts: u64,
    /// Answers by status.
    pub statuses: std::collections::BTreeMap<u16, u64>,
}

/// `threads` threads each `POST path` bodies of `body` bytes on keep-alive connections,
/// one after the other as fast as they are answered, for `duration`.
pub fn post_flood(
    addr: SocketAddr,
    path: &str,
    threads: usize,
    body: usize,
    duration: Duration,
) -> PostFlood {
    use std::io::Read;
    let deadline = std::time::Instant::now() + duration;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {body}\r\n\r\n"
    );
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let head = head.clone();
            std::thread::spawn(move || {
                let mut outcome = PostFlood::default();
                let payload = vec![0x5a; body];
                while std::time::Instant::now() < deadline {
                    let Ok(mut stream) = std::net::TcpStream::connect(addr) else { break };
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    while std::time::Instant::now() < deadline {
                        if stream.write_all(head.as_bytes()).is_err()
                            || stream.write_all(&payload).is_err()
                        {
                            break;
                        }
                        outcome.posts += 1;
                        // The answer is small: its head and a JSON body in one read or two.
                        let mut answer = [0u8; 4096];
                        let Ok(n) = stream.read(&mut answer) else { break };
                        let status = std::str::from_utf8(answer.get(9..12).unwrap_or_default())
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(0);
                        *outcome.statuses.entry(status).or_default() += 1;
                        let text = String::from_utf8_lossy(&answer[..n]).to_ascii_lowercase();
                        if n == 0 || text.contains("connection: close") {
                            break;
                        }
                    }
                }
                outcome
            })
        })
        .collect();
    let mut total = PostFlood::default();
    for worker in workers {
        let outcome = worker.join().unwrap_or_default();
        total.posts += outcome.posts;
        for (status, n) in outcome.statuses {
            *total.statuses.entry(status).or_default() += n;
        }
    }
    total
}
