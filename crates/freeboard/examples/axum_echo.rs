//! An axum app with freeboard WebSockets: an echo at `/echo`, a broadcast room at `/room`
//! (every message goes to everyone in the room; a member that does not keep up loses its
//! oldest messages, counted, instead of growing the server), and for comparison axum's own
//! `extract::ws` echo at `/axum-echo`.
//!
//! ```sh
//! cargo run --release -p freeboard --features axum --example axum_echo -- 127.0.0.1:3000
//! ```

use std::sync::{Arc, Mutex};

use axum::extract::ws;
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::{Endpoint, EndpointConfig, Message, WsConfig, WsWriter};
use freeboard::{SendOutcome, SlowConsumerPolicy, Watermarks};
use futures_util::StreamExt;
use hyper_util::rt::TokioIo;

type Room = Arc<Mutex<Vec<WsWriter<TokioIo<hyper::upgrade::Upgraded>>>>>;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:3000".into());
    let endpoint = Endpoint::new(EndpointConfig::default().memory(256 << 20))
        .map_err(std::io::Error::other)?;
    let room: Room = Arc::default();
    let app = Router::new()
        .route("/echo", get(echo))
        .route("/room", get(join))
        .route("/axum-echo", get(axum_echo))
        .layer(Extension(endpoint))
        .layer(Extension(room));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on ws://{}/echo", listener.local_addr()?);
    axum::serve(listener, app).await
}

/// freeboard's echo: each message goes back as it came; a client that stops reading meets
/// the `block` policy at its queue's cap (`send` says `Blocked`) and is no longer read.
async fn echo(ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(|mut socket: AxumWebSocket| async move {
        while let Some(message) = socket.next().await {
            if let Message::Close(_) = message {
                break;
            }
            if socket.send(message) == SendOutcome::Blocked {
                socket.writable().await;
            }
        }
    })
}

/// A broadcast room: what one member sends, every member gets.
async fn join(ws: WebSocketUpgrade, Extension(room): Extension<Room>) -> Response {
    let marks = Watermarks::new(64 << 10, 256 << 10, 1 << 20).expect("low <= high <= cap");
    let config = WsConfig::default().watermarks(marks).policy(SlowConsumerPolicy::DropOldest);
    ws.config(config).on_upgrade(move |socket: AxumWebSocket| async move {
        let (mut reader, writer) = socket.split();
        room.lock().unwrap().push(writer.clone());
        while let Some(message) = reader.next().await {
            if let Message::Close(_) = message {
                break;
            }
            let members = room.lock().unwrap().clone();
            for member in &members {
                let _ = member.send(message.clone());
            }
        }
        room.lock().unwrap().retain(|member| !member.same_connection(&writer));
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
