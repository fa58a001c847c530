//! Ping floods and close floods.

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
