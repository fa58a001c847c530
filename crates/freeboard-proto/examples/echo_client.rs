//! A blocking client that echoes what it receives, driving an Autobahn fuzzing server.
//!
//! ```text
//! cargo run --release -p freeboard-proto --example echo_client -- ws://127.0.0.1:9002 freeboard
//! ```
//!
//! It asks `/getCaseCount`, runs `/runCase?case=N&agent=AGENT` for every case (echoing every
//! message back until the server closes), then asks `/updateReports`.

mod blocking;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use freeboard_proto::handshake::{ClientRequest, EMPTY_HEADER, Response, generate_key};
use freeboard_proto::{Config, Connection, Instant, Role, State};

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let base = args.next().unwrap_or_else(|| "ws://127.0.0.1:9001".into());
    let agent = args.next().unwrap_or_else(|| "freeboard".into());
    let host = base
        .strip_prefix("ws://")
        .ok_or_else(|| io::Error::other("the URL must start with ws://"))?;
    let host = host.trim_end_matches('/');

    let count = case_count(host)?;
    println!("running {count} cases against ws://{host} as {agent}");
    for case in 1..=count {
        let (stream, conn, mut first) =
            connect(host, &format!("/runCase?case={case}&agent={agent}"))?;
        if let Err(e) = blocking::Driver::new(stream, conn).echo(&mut first) {
            eprintln!("case {case}: {e}");
        }
    }
    let (stream, conn, mut first) = connect(host, &format!("/updateReports?agent={agent}"))?;
    blocking::Driver::new(stream, conn).echo(&mut first)?;
    println!("reports updated");
    Ok(())
}

/// Opens a WebSocket: returns the stream, the connection and any bytes after the handshake.
fn connect(host: &str, path: &str) -> io::Result<(TcpStream, Connection, Vec<u8>)> {
    let mut stream = TcpStream::connect(host)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut nonce = [0u8; 16];
    getrandom::fill(&mut nonce).map_err(io::Error::other)?;
    let key = generate_key(nonce);
    let request =
        ClientRequest { host, path, key: &key, protocols: &[], extensions: None, headers: &[] };
    let mut buf = vec![0u8; 8192];
    let n = request.encode(&mut buf).map_err(io::Error::other)?;
    stream.write_all(&buf[..n])?;
    let mut len = 0;
    loop {
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        len += n;
        let mut headers = [EMPTY_HEADER; 32];
        match Response::parse(&buf[..len], &mut headers, &request, buf.len()) {
            Ok(None) => continue,
            Ok(Some((_, head_len))) => {
                let config = Config::builder().max_message_size(64 << 20).build();
                let conn = Connection::new(Role::Client, config, Instant::default());
                return Ok((stream, conn, buf[head_len..len].to_vec()));
            }
            Err(e) => return Err(io::Error::other(format!("{path}: {e}"))),
        }
    }
}

/// Reads the single text message `/getCaseCount` sends.
fn case_count(host: &str) -> io::Result<u32> {
    let (mut stream, mut conn, mut data) = connect(host, "/getCaseCount")?;
    let mut text = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        let mut at = 0;
        while at < data.len() {
            let input =
                conn.handle_input(Instant::default(), &mut data[at..]).map_err(io::Error::other)?;
            at += input.consumed;
            if let Some(piece) = input.payload {
                text.extend_from_slice(piece.data);
                if piece.message_fin {
                    let count =
                        String::from_utf8_lossy(&text).trim().parse().map_err(io::Error::other)?;
                    conn.close(Instant::default(), freeboard_proto::CloseCode::NORMAL, "")
                        .map_err(io::Error::other)?;
                    let mut out = [0u8; 131];
                    while let Some(n) = conn
                        .poll_transmit(Some(blocking::random_key()), &mut out)
                        .map_err(io::Error::other)?
                    {
                        stream.write_all(&out[..n])?;
                    }
                    return Ok(count);
                }
            }
        }
        if conn.state() == State::Closed {
            return Err(io::Error::other("closed before sending the case count"));
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        data = buf[..n].to_vec();
    }
}
