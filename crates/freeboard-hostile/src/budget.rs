//! The budget family's attack, shared by the test against `freeboard serve` and the one
//! against the servers written with each binding.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::{WsClient, upgrade_request};

/// Runs `clients` attackers at once on `/echo`, each writing with `write` until a write waits
/// 4 s (a 4 KiB receive buffer, never reading), then reads what each was answered: the close
/// code, `None` if the server only stopped reading it or dropped it, or `Err(status)` if its
/// upgrade was refused (503 once the pool cannot cover a new connection's reserve).
pub fn attack(
    addr: SocketAddr,
    clients: usize,
    write: impl Fn(&mut WsClient) -> std::io::Result<()> + Send + Sync + Copy + 'static,
) -> Vec<Result<Option<u16>, u16>> {
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            std::thread::spawn(move || {
                let stream = small_buffer_stream(addr);
                stream.set_write_timeout(Some(Duration::from_secs(4))).unwrap();
                let (mut client, status, _) =
                    WsClient::handshake_over(stream, &upgrade_request("/echo", "")).unwrap();
                if status != 101 {
                    return Err(status);
                }
                let _ = write(&mut client);
                client.stream.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
                let code = client.recv_close().ok().flatten();
                if let Some(code) = code {
                    // Answered as RFC 6455 §5.5.1 asks, so the server counts the close by its
                    // code rather than as abnormal.
                    let _ = client.send(0x88, &code.to_be_bytes());
                    client.sees_eof();
                }
                Ok(code)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// A connection to `addr` with a 4 KiB receive buffer, so what the server sends it piles up
/// in the server rather than in the kernel.
pub fn small_buffer_stream(addr: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&addr.into()).unwrap();
    socket.into()
}
