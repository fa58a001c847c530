//! axum's own `extract::ws` echo at `/` on a one-worker multi-thread runtime: the stream of
//! data messages forwarded into the sink (which feeds while messages are ready and flushes
//! when the stream waits, as tokio-tungstenite's example does).

use axum::Router;
use axum::extract::ws::{Message, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::get;
use futures_util::{StreamExt, TryStreamExt, future};

async fn echo(ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(|socket| async move {
        let (write, read) = socket.split();
        let data = read.try_filter(|m| future::ready(matches!(m, Message::Text(_) | Message::Binary(_))));
        let _ = data.forward(write).await;
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9010".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    axum::serve(listener, Router::new().route("/", get(echo))).await
}
