//! The same axum app as `axum-ws`, its route upgraded to a freeboard WebSocket (the tokio
//! driver of freeboard's session) instead: one memory budget for every connection, send
//! queues in pool chunks, the endpoint's queue defaults (32/64 KiB watermarks, close 1008 at a
//! 16 MiB + 64 KiB cap). Same one-worker multi-thread runtime.

use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage};
use futures_util::StreamExt;

async fn echo(ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(|mut socket: AxumWebSocket| async move {
        while let Some(message) = socket.next().await {
            if let OwnedMessage::Close(_) = message {
                break;
            }
            let _ = socket.send(message);
        }
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9011".into());
    // The budget of `freeboard serve`'s default.
    let endpoint = Endpoint::new(EndpointConfig::default().memory(256 << 20))
        .map_err(std::io::Error::other)?;
    let app = Router::new().route("/", get(echo)).layer(Extension(endpoint));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    axum::serve(listener, app).await
}
