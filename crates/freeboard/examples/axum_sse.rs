//! Server-Sent Events from an axum app: `/events/{topic}` is an event stream of a topic (with
//! `?also=other` for more), `/ws/{topic}` a WebSocket subscribed to the same topic, and a task
//! publishes the time to `clock` every second: one publication reaches both kinds of
//! subscriber, each under its own send queue and policy. `/metrics` counts them.
//!
//! ```sh
//! cargo run --release -p freeboard --features axum --example axum_sse -- 127.0.0.1:3000
//! curl -N -H 'Accept: text/event-stream' http://127.0.0.1:3000/events/clock
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::Path;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::sse::EventStreamRequest;
use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage, WsConfig};
use freeboard::{MessageKind, SlowConsumerPolicy};
use futures_util::StreamExt;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:3000".into());
    // A `: keep-alive` comment on streams idle for 15 s keeps proxies from cutting them.
    let config = EndpointConfig::default()
        .memory(256 << 20)
        .limits(|l| l.idle_timeout(Some(Duration::from_secs(15))));
    let endpoint = Endpoint::new(config).map_err(std::io::Error::other)?;
    let clock = Arc::clone(&endpoint);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            clock.publish("clock", MessageKind::Text, now.as_secs().to_string().as_bytes());
        }
    });
    let metrics = {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(endpoint.collector()));
        let registry = Arc::new(registry);
        move || async move {
            let mut text = String::new();
            let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
            text
        }
    };
    let app = Router::new()
        .route("/events/{topic}", get(events))
        .route("/ws/{topic}", get(websocket))
        .route("/metrics", get(metrics))
        .layer(Extension(endpoint));
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}/events/clock", listener.local_addr()?);
    axum::serve(listener, app).await
}

/// An event stream of the topic the path names and the `also=` ones (read by the parser
/// `freeboard serve`'s `/topic/` route uses); a subscriber that falls behind loses its oldest
/// events (counted in `freeboard_drops_total{reason="drop-oldest"}`).
async fn events(uri: Uri, request: EventStreamRequest) -> Response {
    let target = uri.path_and_query().map_or("/", |p| p.as_str());
    let Some(topics) = freeboard::topics::topics_in_target("/events/", target) else {
        return (StatusCode::BAD_REQUEST, "invalid topic name").into_response();
    };
    let config = WsConfig::default().slow_consumer(SlowConsumerPolicy::DropOldest);
    request.config(config).subscribe(topics)
}

/// A WebSocket subscribed to `topic`, read until it closes.
async fn websocket(Path(topic): Path<String>, ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(|mut socket: AxumWebSocket| async move {
        if socket.subscribe(&topic).is_err() {
            return;
        }
        while let Some(message) = socket.next().await {
            if let OwnedMessage::Close(_) = message {
                break;
            }
        }
    })
}
