//! `decide_upgrade`: check the `Origin`, verify a bearer token as a JWT (HS256) on another
//! thread — as a database or webhook lookup would be — pick a subprotocol, attach the user to
//! the connection, greet them by name in `on_open`; the connection closes with 4001 when the
//! token expires.
//!
//!     FREEBOARD_JWT_SECRET=0123456789abcdef0123456789abcdef \
//!       cargo run --release -p freeboard-topics --example upgrade
//!     # then connect to ws://127.0.0.1:9001/chat?access_token=JWT with subprotocol "chat.v1"
//!     # (the JWT signed with that secret, with "sub" and "exp" claims)

use std::sync::Arc;
use std::time::SystemTime;

use freeboard::auth::Origins;
use freeboard::{
    Accepted, CloseCode, Conn, ConnId, Decision, Handler, Message, Request, Router, Server,
    ServerConfig,
};
use freeboard_topics::{TokenVerifier, bearer_token};

/// Who the token says the client is.
struct User {
    name: String,
}

struct Chat {
    origins: Origins,
    tokens: Arc<TokenVerifier>,
}

impl Handler for Chat {
    fn decide_upgrade(&mut self, request: &Request<'_, '_>, decision: Decision) {
        if !self.origins.allows(request.origin()) {
            return decision.reject_because(403, "origin");
        }
        let Some(token) = bearer_token(request).map(str::to_owned) else {
            return decision.reject_because(401, "token_missing");
        };
        let protocol = request.select_protocol(&["chat.v1"]);
        let tokens = self.tokens.clone();
        // Off the event loop: the loop goes on serving everyone else meanwhile.
        std::thread::spawn(move || match tokens.verify(&token, SystemTime::now()) {
            Ok(grant) => {
                let name = grant.subject.clone().unwrap_or_else(|| "anonymous".into());
                let mut accepted = Accepted::new().data(User { name }).expires_at(grant.expires);
                if let Some(protocol) = protocol {
                    accepted = accepted.protocol(protocol);
                }
                decision.accept(accepted);
            }
            Err(e) => decision.reject_because(e.status(), e.label()),
        });
    }

    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let name = conn.data::<User>().map_or("?", |u| u.name.as_str()).to_owned();
        let _ = conn.send_text(&format!("welcome, {name}"));
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
    let secret = std::env::var("FREEBOARD_JWT_SECRET")
        .unwrap_or_else(|_| "0123456789abcdef0123456789abcdef".into());
    let tokens = Arc::new(TokenVerifier::hs256(secret.as_bytes()));
    let origins = Origins::new(&["http://localhost:8000"]).map_err(std::io::Error::other)?;
    let routes = move || {
        let chat = Chat { origins: origins.clone(), tokens: tokens.clone() };
        Router::new().route("/chat", chat)
    };
    let server = Server::bind(ServerConfig::default(), routes)?;
    println!("chat on ws://{}/chat?access_token=JWT", server.local_addr());
    server.run()
}
