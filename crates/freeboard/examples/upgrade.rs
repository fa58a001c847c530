//! `on_upgrade`: refuse requests without a token, pick a subprotocol, greet in `on_open`,
//! log in `on_close`.
//!
//!     cargo run --release -p freeboard --example upgrade
//!     # then connect to ws://127.0.0.1:9001/chat?token=secret with subprotocol "chat.v1"

use freeboard::handler::Upgrade;
use freeboard::{CloseCode, Conn, ConnId, Handler, Message, Router, Server, ServerConfig};
use freeboard_proto::handshake::Request;

struct Chat;

impl Handler for Chat {
    fn on_upgrade(&mut self, request: &Request<'_, '_>) -> Upgrade {
        if !request.path().contains("token=secret") {
            return Upgrade::Reject(401);
        }
        Upgrade::Accept { protocol: request.select_protocol(&["chat.v1"]) }
    }

    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let _ = conn.send_text("welcome");
    }

    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        if message.as_text() == Some("bye") {
            conn.close(CloseCode::NORMAL, "see you");
        } else {
            let _ = conn.send(message.kind, message.data);
        }
    }

    fn on_close(&mut self, id: ConnId, code: CloseCode, reason: &str) {
        println!("{id:?} closed: {} {reason}", code.0);
    }
}

fn main() -> std::io::Result<()> {
    let server = Server::bind(ServerConfig::default(), || Router::new().route("/chat", Chat))?;
    println!("chat on ws://{}/chat?token=secret", server.local_addr());
    server.run()
}
