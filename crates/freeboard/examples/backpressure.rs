//! `on_writable` / `on_not_writable` and `send` results: stream numbered messages as fast as
//! the client reads them, pausing above the high watermark instead of buffering without end.
//!
//!     cargo run --release -p freeboard --example backpressure
//!     # connect to ws://127.0.0.1:9001/stream and send anything to start

use freeboard::{Conn, Handler, Message, PushOutcome, Router, SendOutcome, Server, ServerConfig};

#[derive(Default)]
struct Stream {
    next: u64,
}

impl Stream {
    /// Sends until the queue passes its high watermark; `on_writable` resumes.
    fn pump(&mut self, conn: &mut Conn<'_>) {
        loop {
            self.next += 1;
            match conn.send_text(&format!("message {}", self.next)) {
                SendOutcome::Queue(PushOutcome::Queued) => {}
                SendOutcome::Queue(PushOutcome::QueuedAboveHigh) => return,
                other => {
                    println!("stopping at {}: {other:?}", self.next);
                    return;
                }
            }
        }
    }
}

impl Handler for Stream {
    fn on_message(&mut self, conn: &mut Conn<'_>, _message: Message<'_>) {
        self.pump(conn);
    }

    fn on_writable(&mut self, conn: &mut Conn<'_>) {
        self.pump(conn);
    }

    fn on_not_writable(&mut self, conn: &mut Conn<'_>) {
        println!("paused with {} bytes buffered", conn.buffered_amount());
    }
}

fn main() -> std::io::Result<()> {
    let server = Server::bind(ServerConfig::default(), || {
        Router::new().route("/stream", Stream::default())
    })?;
    println!("streaming on ws://{}/stream", server.local_addr());
    server.run()
}
