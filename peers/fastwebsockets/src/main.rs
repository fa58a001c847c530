//! fastwebsockets' echo server example on a one-worker multi-thread runtime. The HTTP upgrade is
//! answered by hand (fastwebsockets' own `upgrade` needs hyper); the frames are its business.

use base64::Engine;
use fastwebsockets::{Frame, OpCode, Role, WebSocket};
use sha1::{Digest, Sha1};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9004".into());
    let listener = TcpListener::bind(&addr).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(async move {
            let _ = serve(stream).await;
        });
    }
}

async fn serve(mut stream: TcpStream) -> Result<(), Box<dyn std::error::Error>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 || head.len() > 16 * 1024 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let key = text
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("sec-websocket-key").then(|| value.trim().to_string())
        })
        .ok_or("no Sec-WebSocket-Key")?;
    let mut sha = Sha1::new();
    sha.update(key.as_bytes());
    sha.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let accept = base64::engine::general_purpose::STANDARD.encode(sha.finalize());
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    stream.write_all(response.as_bytes()).await?;
    let mut ws = WebSocket::after_handshake(stream, Role::Server);
    ws.set_auto_close(true);
    ws.set_auto_pong(true);
    loop {
        let frame = ws.read_frame().await?;
        match frame.opcode {
            OpCode::Close => break,
            // A frame as read still carries the client's mask bit: answer with an unmasked
            // frame over the same (already unmasked) payload.
            OpCode::Text | OpCode::Binary => {
                ws.write_frame(Frame::new(true, frame.opcode, None, frame.payload)).await?
            }
            _ => {}
        }
    }
    Ok(())
}
