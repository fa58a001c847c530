//! tokio-tungstenite's echo server example on a one-worker multi-thread runtime.

use futures_util::{StreamExt, TryStreamExt, future};
use tokio::net::TcpListener;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:9003".into());
    let listener = TcpListener::bind(&addr).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        tokio::spawn(async move {
            let Ok(ws) = tokio_tungstenite::accept_async(stream).await else { return };
            let (write, read) = ws.split();
            let _ = read
                .try_filter(|m| future::ready(m.is_text() || m.is_binary()))
                .forward(write)
                .await;
        });
    }
}
