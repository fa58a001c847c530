//! WebSockets over HTTP/2 (RFC 8441): an HTTPS server offering `h2` and `http/1.1` by ALPN,
//! with a page at `/` whose sockets (`?n=10` of them) echo through `/echo` — a browser opens
//! them all as streams of the one HTTP/2 connection that loaded the page — and the server's
//! counts as Prometheus metrics at `/metrics`. Each HTTP/2 connection's buffers are charged
//! to the endpoint's budget (64 MiB: about 16 connections under the default limits).
//!
//! ```sh
//! cargo run --release -p freeboard --features http2 --example h2_echo -- 127.0.0.1:8443 cert.pem key.pem
//! curl --http2 -k https://127.0.0.1:8443/metrics
//! ```

use std::sync::Arc;

use axum::http::Uri;
use axum::response::{Html, Response};
use axum::routing::{any, get};
use axum::{Extension, Router};
use freeboard::tls::TlsIdentity;
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::http2::{Http2Config, Http2Server};
use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage};
use freeboard::{PushOutcome, SendOutcome};
use futures_util::StreamExt;
use prometheus_client::registry::Registry;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8443".into());
    let cert = args.next().unwrap_or_else(|| "cert.pem".into());
    let key = args.next().unwrap_or_else(|| "key.pem".into());
    let identity = TlsIdentity::load(cert.as_ref(), key.as_ref()).map_err(std::io::Error::other)?;
    let endpoint =
        Endpoint::new(EndpointConfig::default().memory(64 << 20)).map_err(std::io::Error::other)?;
    let server = Http2Server::new(Arc::new(identity), Http2Config::default())
        .map_err(std::io::Error::other)?
        .charge_to(&endpoint);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(server.collector()));
    let app = Router::new()
        .route("/", get(page))
        // `any`: an HTTP/2 WebSocket is a CONNECT, an HTTP/1.1 one a GET.
        .route("/echo", any(echo))
        .route("/metrics", get(metrics))
        .layer(Extension(endpoint))
        .layer(Extension(Arc::new(registry)));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on https://{}/", listener.local_addr()?);
    server.serve(listener, app).await
}

async fn echo(ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(|mut socket: AxumWebSocket| async move {
        while let Some(message) = socket.next().await {
            // As examples/axum_echo.rs: wait while the `block` policy refuses the echo, and
            // above the high watermark (the client is then no longer read).
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

/// A page that opens `n` sockets to `/echo` and shows how many echoed.
async fn page(uri: Uri) -> Html<String> {
    let n = uri
        .query()
        .and_then(|q| q.strip_prefix("n="))
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(10)
        .min(1000);
    Html(format!(
        r#"<!doctype html><title>freeboard over HTTP/2</title><p id=out>opening {n}</p><script>
let echoed = 0;
for (let i = 0; i < {n}; i++) {{
  const ws = new WebSocket(`wss://${{location.host}}/echo`);
  ws.onopen = () => ws.send(`hello ${{i}}`);
  ws.onmessage = (e) => {{ if (e.data === `hello ${{i}}`) echoed++;
    document.getElementById("out").textContent = `${{echoed}} of {n} echoed`; }};
}}
</script>"#
    ))
}

async fn metrics(Extension(registry): Extension<Arc<Registry>>) -> String {
    let mut text = String::new();
    // NOTE(unwrap): writing to a String cannot fail.
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}
