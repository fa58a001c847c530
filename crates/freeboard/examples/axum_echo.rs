//! An axum app with freeboard WebSockets: an echo at `/echo`, a broadcast room at `/room`
//! (every message goes to everyone in the room, framed once and shared by reference through
//! the endpoint's topic; a member that does not keep up loses its oldest messages, counted,
//! instead of growing the server), and for comparison axum's own `extract::ws` echo at
//! `/axum-echo`.
//!
//! ```sh
//! cargo run --release -p freeboard --features axum --example axum_echo -- 127.0.0.1:3000
//! ```

use axum::extract::ws;
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage, WsConfig};
use freeboard::{PushOutcome, SendOutcome, SlowConsumerPolicy, Watermarks};
use futures_util::StreamExt;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:3000".into());
    let endpoint = Endpoint::new(EndpointConfig::default().memory(256 << 20))
        .map_err(std::io::Error::other)?;
    let app = Router::new()
        .route("/echo", get(echo))
        .route("/room", get(join))
        .route("/axum-echo", get(axum_echo))
        .layer(Extension(endpoint));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on ws://{}/echo", listener.local_addr()?);
    axum::serve(listener, app).await
}

/// freeboard's echo: each message goes back as it came. `send_async` waits while the `block`
/// policy refuses a message (at the cap, or while the pool is short), so no echo is lost; a
/// client that stops reading is no longer read once its queue passes the high watermark
/// (`QueuedAboveHigh`: wait until it drains).
async fn echo(ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(|mut socket: AxumWebSocket| async move {
        while let Some(message) = socket.next().await {
            if let OwnedMessage::Close(_) = message {
                return;
            }
            if let SendOutcome::Queue(PushOutcome::QueuedAboveHigh) =
                socket.send_async(message).await
            {
                socket.writable().await;
            }
        }
    })
}

/// A broadcast room: what one member sends, every member gets (the endpoint's topic "room").
async fn join(ws: WebSocketUpgrade) -> Response {
    let marks = Watermarks::new(64 << 10, 256 << 10, 1 << 20).expect("low <= high <= cap");
    let config =
        WsConfig::default().watermarks(marks).slow_consumer(SlowConsumerPolicy::DropOldest);
    ws.config(config).on_upgrade(|mut socket: AxumWebSocket| async move {
        if socket.subscribe("room").is_err() {
            return;
        }
        while let Some(message) = socket.next().await {
            let Some((kind, data)) = message.as_data() else { break };
            socket.endpoint().publish("room", kind, data);
        }
    })
}

/// axum's own `extract::ws` echo, for side-by-side runs.
async fn axum_echo(ws: ws::WebSocketUpgrade) -> Response {
    ws.on_upgrade(|mut socket| async move {
        while let Some(Ok(message)) = socket.recv().await {
            if matches!(message, ws::Message::Text(_) | ws::Message::Binary(_))
                && socket.send(message).await.is_err()
            {
                break;
            }
        }
    })
}
