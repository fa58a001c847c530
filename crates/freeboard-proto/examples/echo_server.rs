//! A thread-per-connection echo server on `std::net`, over the sans-IO core.
//!
//! ```text
//! cargo run --release -p freeboard-proto --example echo_server -- 127.0.0.1:9001
//! ```
//!
//! Every message is echoed back as it came: text as text, binary as binary. It is also the
//! target of the Autobahn conformance run (`conformance/run`).

mod blocking;

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use freeboard_proto::handshake::{DEFAULT_MAX_HEAD_LEN, EMPTY_HEADER, Request};
use freeboard_proto::{Config, Connection, Instant, Role};

fn main() -> io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9001".into());
    let listener = TcpListener::bind(&addr)?;
    println!("echo server listening on ws://{}", listener.local_addr()?);
    for stream in listener.incoming() {
        let stream = stream?;
        std::thread::spawn(move || {
            if let Err(e) = serve(stream) {
                eprintln!("connection ended: {e}");
            }
        });
    }
    Ok(())
}

fn serve(mut stream: TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    // The opening handshake must complete within 10 s (slow clients hold a thread each).
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = vec![0u8; DEFAULT_MAX_HEAD_LEN];
    let mut len = 0;
    let head_len = loop {
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Ok(());
        }
        len += n;
        let mut headers = [EMPTY_HEADER; 32];
        match Request::parse(&buf[..len], &mut headers, DEFAULT_MAX_HEAD_LEN) {
            Ok(None) => continue,
            Ok(Some((request, head_len))) => {
                let mut response = [0u8; 256];
                let n = request.accept(None, None, &mut response).map_err(io::Error::other)?;
                stream.write_all(&response[..n])?;
                break head_len;
            }
            Err(refusal) => {
                let mut response = [0u8; 512];
                let n = refusal.write_response(&mut response).map_err(io::Error::other)?;
                return stream.write_all(&response[..n]);
            }
        }
    };
    let config = Config::builder().max_message_size(64 << 20).build();
    let conn = Connection::new(Role::Server, config, Instant::default());
    blocking::Driver::new(stream, conn).echo(&mut buf[head_len..len])
}
