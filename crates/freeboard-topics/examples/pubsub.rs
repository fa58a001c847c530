//! Pub/sub: a score board fanned out to every browser watching a match.
//!
//! ```text
//! cargo run -p freeboard-topics --example pubsub
//! websocat ws://127.0.0.1:9001/topic/match-1?also=news   # subscribe to two topics
//! curl -d 'kick-off' -H 'Content-Type: text/plain' http://127.0.0.1:9001/topic/news
//! ```
//!
//! - `/topic/{name}` (the [`TopicRoute`](freeboard_topics::TopicRoute) mounted by
//!   [`Service::mount`](freeboard_topics::Service::mount)) subscribes a connection;
//!   `POST /topic/{name}` publishes its body.
//! - A ticker thread publishes the score to `match-1` every second through a
//!   [`ServerHandle`](freeboard::ServerHandle): framed once, queued to every subscriber by
//!   reference. Under the topic routes' default `conflate` policy a subscriber that falls
//!   behind gets the latest score, not a backlog.
//! - `/chat` is a handler of its own: it subscribes each connection to `chat` and publishes
//!   what they say with [`Conn::publish`].

use std::time::Duration;

use freeboard::{Conn, Handler, Message, MessageKind, Router, Server, ServerConfig};

/// Everyone on `/chat` hears everyone (themselves included).
struct Chat;

impl Handler for Chat {
    fn on_open(&mut self, conn: &mut Conn<'_>) {
        // NOTE(unwrap): a valid name, the connection's first topic.
        conn.subscribe("chat").unwrap();
    }

    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        let _ = conn.publish("chat", message.kind, message.data);
    }
}

fn main() -> std::io::Result<()> {
    let config = ServerConfig::default();
    let mut topics = freeboard_topics::Config::default();
    topics.hub = config.topics.clone();
    // The /topic/ route and `POST /topic/NAME`, beside the application's own route.
    let service = freeboard_topics::Service::new(&topics).map_err(std::io::Error::other)?;
    let server = Server::bind(config, move || service.mount(Router::new().route("/chat", Chat)))?;
    println!("ws://{}/topic/match-1 and ws://{0}/chat", server.local_addr());
    let running = server.spawn();
    let handle = running.handle();
    std::thread::spawn(move || {
        for minute in 0u32.. {
            let score = format!(
                "{{\"minute\":{minute},\"home\":{},\"away\":{}}}",
                minute / 17,
                minute / 29
            );
            let published = handle.publish("match-1", MessageKind::Text, score.as_bytes());
            if published.dropped > 0 {
                eprintln!("{} event loops missed minute {minute}", published.dropped);
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    running.join()
}
