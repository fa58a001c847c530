//! What an idle subscriber costs the heap of an axum service on the tokio driver: an event
//! stream over HTTP/1.1 against a WebSocket over HTTP/1.1 in the same run (the clients are
//! blocking `std` sockets, which allocate nothing), and an event stream as a stream of an
//! HTTP/2 connection (headless Chromium's `EventSource`s, another process). A counting
//! allocator's live bytes before and after are the server's. The kernel's socket memory is
//! not in these figures. Everything talks to 127.0.0.1; the Chromium test is skipped (with a
//! message) when no `chromium` is on the PATH, `FREEBOARD_REQUIRE_BROWSER=1` making that a
//! failure.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use axum::response::{Html, Response};
use axum::routing::get;
use axum::{Extension, Router};
use freeboard::MessageKind;
use freeboard::tls::TlsIdentity;
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::http2::{Http2Config, Http2Server};
use freeboard::tokio::sse::EventStreamRequest;
use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage};
use freeboard_test::alloc::LiveBytes;
use freeboard_test::browser::{Browser, chromium};
use freeboard_test::tls::TestCa;
use futures_util::StreamExt;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;

#[global_allocator]
static GLOBAL: LiveBytes = LiveBytes;

const SUBSCRIBERS: usize = 200;

async fn websocket(ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(|mut socket: AxumWebSocket| async move {
        socket.subscribe("t").unwrap();
        while let Some(message) = socket.next().await {
            if let OwnedMessage::Close(_) = message {
                break;
            }
        }
    })
}

async fn events(request: EventStreamRequest) -> Response {
    request.subscribe(["t"])
}

/// The live heap once it has settled: the least of a few readings.
async fn settled_heap() -> isize {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut least = isize::MAX;
    for _ in 0..10 {
        least = least.min(LiveBytes::live());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    least
}

/// Opens `SUBSCRIBERS` clients sending `request`, each read until its answer holds `until`;
/// returns the server's heap bytes per client, once every one is subscribed.
async fn per_subscriber(addr: SocketAddr, endpoint: &Endpoint, request: &str, until: &[u8]) -> f64 {
    let mut clients = Vec::with_capacity(SUBSCRIBERS);
    let before = settled_heap().await;
    for _ in 0..SUBSCRIBERS {
        let request = request.to_owned();
        let until = until.to_owned();
        // A blocking client on a thread of its own: nothing of it is on the heap but what
        // the thread's start allocates, which ends with it.
        let client = tokio::task::spawn_blocking(move || {
            let mut tcp = TcpStream::connect(addr).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            tcp.write_all(request.as_bytes()).unwrap();
            let mut answer = [0u8; 1024];
            let mut n = 0;
            while !answer[..n].windows(until.len()).any(|w| w == until) {
                let read = tcp.read(&mut answer[n..]).unwrap();
                assert!(read > 0, "the server closed the connection");
                n += read;
            }
            tcp
        });
        clients.push(client.await.unwrap());
    }
    tokio::time::timeout(Duration::from_secs(30), async {
        while endpoint.subscribers("t") < SUBSCRIBERS {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("every client subscribed");
    let after = settled_heap().await;
    drop(clients);
    (after - before) as f64 / SUBSCRIBERS as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_event_stream_over_http1_holds_hypers_connection_where_a_websocket_does_not() {
    let endpoint = Endpoint::new(EndpointConfig::default().memory(32 << 20)).unwrap();
    let app = Router::new()
        .route("/ws", get(websocket))
        .route("/events", get(events))
        .layer(Extension(Arc::clone(&endpoint)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let service = TowerToHyperService::new(app.clone());
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .with_upgrades(),
            );
        }
    });
    let upgrade = "GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                   Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let ws = per_subscriber(addr, &endpoint, upgrade, b"\r\n\r\n").await;
    // Every WebSocket has gone before the event streams come.
    while endpoint.connections() > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let get = "GET /events HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n";
    let sse = per_subscriber(addr, &endpoint, get, b"retry: 1000\n\n").await;
    serving.abort();
    eprintln!(
        "server heap per idle subscriber ({SUBSCRIBERS} of each, HTTP/1.1): WebSocket {ws:.0} B, \
         event stream {sse:.0} B; ratio {:.2}",
        sse / ws
    );
    // An event stream keeps hyper's HTTP/1.1 connection (its 8 KiB read and write buffers)
    // where an upgraded WebSocket's connection task ends: bounded, but hyper's.
    assert!(sse < 32.0 * 1024.0, "an idle event stream costs {sse:.0} B");
}

/// The page: a control stream; on its first event, `STREAMS` event streams of topic `t`.
const PAGE: &str = r#"<!doctype html><title>SSE memory</title><script>
const kept = [];
const ctl = new EventSource("/control");
ctl.onmessage = (e) => {
  for (let i = 0; i < Number(e.data); i++) kept.push(new EventSource("/events"));
};
</script>"#;

const STREAMS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_event_stream_over_http2_costs_a_stream_of_the_connection() {
    let Some(chromium) = chromium() else { return };
    let ca = TestCa::new("sse-mem-h2");
    let identity = TlsIdentity::load(&ca.cert_pem(), &ca.key_pem()).unwrap();
    let config = Http2Config::default().max_concurrent_streams(2 * STREAMS as u32);
    let server = Http2Server::new(Arc::new(identity), config).unwrap();
    let stats = Arc::clone(server.stats());
    let endpoint = Endpoint::new(EndpointConfig::default().memory(32 << 20)).unwrap();
    let app = Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/control", get(|request: EventStreamRequest| async { request.subscribe(["ctl"]) }))
        .route("/events", get(events))
        .layer(Extension(Arc::clone(&endpoint)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let serving = tokio::spawn(server.serve(listener, app));
    let profile = ca.dir().join("chromium-profile");
    let flags = [format!("--ignore-certificate-errors-spki-list={}", ca.spki_sha256)];
    let browser =
        Browser::start(&chromium, &profile, &flags, &format!("https://localhost:{port}/"));
    let subscribed = |topic: &'static str, n: usize| {
        let endpoint = Arc::clone(&endpoint);
        tokio::time::timeout(Duration::from_secs(90), async move {
            while endpoint.subscribers(topic) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    subscribed("ctl", 1).await.expect("the page's control stream");
    let before = settled_heap().await;
    endpoint.publish("ctl", MessageKind::Text, STREAMS.to_string().as_bytes());
    subscribed("t", STREAMS).await.unwrap_or_else(|_| panic!("every stream opened; {stats:?}"));
    let after = settled_heap().await;
    drop(browser);
    serving.abort();
    let per_stream = (after - before) as f64 / STREAMS as f64;
    eprintln!(
        "server heap per idle browser event stream ({STREAMS} as streams of HTTP/2): \
         {per_stream:.0} B; {} TCP connections ({} HTTP/2, {} HTTP/1.1)",
        stats.tcp_connections(),
        stats.http2_connections(),
        stats.http1_connections()
    );
    assert_eq!(stats.http1_connections(), 0, "every stream over HTTP/2: {stats:?}");
    assert!(per_stream < 8.0 * 1024.0, "an idle event stream over HTTP/2 costs {per_stream:.0} B");
}
