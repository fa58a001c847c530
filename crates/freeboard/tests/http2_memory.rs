//! What an idle browser WebSocket costs the server's heap over HTTP/2 (a stream of the
//! connection that loaded the page) and over HTTP/1.1 (a TLS connection of its own), in the
//! same run: headless Chromium opens 100 of each from a page, and a counting allocator adds
//! up the server's live heap before and after (the browser is another process, so every
//! byte counted is the server's). The kernel's socket memory, which each HTTP/1.1 socket
//! adds and an HTTP/2 stream does not, is not in these figures.
//!
//! Skipped (with a message) when no `chromium` is on the PATH; `FREEBOARD_REQUIRE_BROWSER=1`
//! turns the skip into a failure.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::{Html, Response};
use axum::routing::{any, get};
use axum::{Extension, Router};
use freeboard::tls::TlsIdentity;
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::http2::{Http2Config, Http2Server, Http2Stats};
use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage};
use freeboard_test::alloc::LiveBytes;
use freeboard_test::browser::{Browser, chromium};
use freeboard_test::tls::TestCa;
use futures_util::StreamExt;
use tokio::sync::mpsc;

#[global_allocator]
static GLOBAL: LiveBytes = LiveBytes;

const SOCKETS: usize = 100;

/// The page: a control socket first; on the server's "open", `SOCKETS` echo sockets, each
/// echoing one message; "ready" on the control socket once all have.
const PAGE: &str = r#"<!doctype html><title>freeboard memory</title><script>
const ctl = new WebSocket(`wss://${location.host}/ctl`);
const kept = [];
ctl.onmessage = (e) => {
  const n = Number(e.data);
  let echoed = 0;
  for (let i = 0; i < n; i++) {
    const ws = new WebSocket(`wss://${location.host}/echo`);
    kept.push(ws);
    ws.onopen = () => ws.send(`hello ${i}`);
    ws.onmessage = (m) => { if (m.data === `hello ${i}` && ++echoed === n) ctl.send("ready"); };
  }
};
</script>"#;

/// The control socket's side of the test: `up` when the page's control socket is open, then
/// the count to open from `open`, then `ready` once the page says so.
struct Control {
    up: mpsc::UnboundedSender<()>,
    open: Mutex<Option<mpsc::UnboundedReceiver<usize>>>,
    ready: mpsc::UnboundedSender<()>,
}

async fn control(ws: WebSocketUpgrade, Extension(control): Extension<Arc<Control>>) -> Response {
    ws.on_upgrade(|mut socket: AxumWebSocket| async move {
        let Some(mut open) = control.open.lock().unwrap().take() else { return };
        let _ = control.up.send(());
        let Some(n) = open.recv().await else { return };
        socket.send_text(&n.to_string());
        socket.flush().await;
        while let Some(message) = socket.next().await {
            match message {
                OwnedMessage::Text(text) if text == "ready" => {
                    let _ = control.ready.send(());
                }
                OwnedMessage::Close(_) => break,
                _ => {}
            }
        }
    })
}

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

/// Loads the page from a server offering `h2` (or `http/1.1` only) and returns the heap
/// bytes per echo socket the browser then opened, and the server's counts.
async fn per_socket(chromium: &std::path::Path, http2: bool) -> (f64, Arc<Http2Stats>) {
    let ca = TestCa::new(if http2 { "mem-h2" } else { "mem-h1" });
    let identity = TlsIdentity::load(&ca.cert_pem(), &ca.key_pem()).unwrap();
    // Room for the control socket and the page's requests beside the echo sockets: a
    // browser holds back a stream past the limit until one ends.
    let config = Http2Config::default().http2(http2).max_concurrent_streams(2 * SOCKETS as u32);
    let server = Http2Server::new(Arc::new(identity), config).unwrap();
    let stats = Arc::clone(server.stats());
    let endpoint = Endpoint::new(EndpointConfig::default().memory(32 << 20)).unwrap();
    let (up_tx, mut up) = mpsc::unbounded_channel();
    let (open, open_rx) = mpsc::unbounded_channel();
    let (ready_tx, mut ready) = mpsc::unbounded_channel();
    let control_state =
        Arc::new(Control { up: up_tx, open: Mutex::new(Some(open_rx)), ready: ready_tx });
    let app = Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/ctl", any(control))
        .route("/echo", any(echo))
        .layer(Extension(control_state))
        .layer(Extension(endpoint));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let serving = tokio::spawn(server.serve(listener, app));
    let profile = ca.dir().join("chromium-profile");
    let flags = [format!("--ignore-certificate-errors-spki-list={}", ca.spki_sha256)];
    let browser = Browser::start(chromium, &profile, &flags, &format!("https://localhost:{port}/"));
    let bound = Duration::from_secs(90);
    tokio::time::timeout(bound, up.recv()).await.expect("the page's control socket").unwrap();
    let before = settled_heap().await;
    open.send(SOCKETS).unwrap();
    let echoed = tokio::time::timeout(bound, ready.recv()).await;
    assert!(echoed.is_ok_and(|r| r.is_some()), "every socket echoed; {stats:?}");
    let after = settled_heap().await;
    drop(browser);
    serving.abort();
    ((after - before) as f64 / SOCKETS as f64, stats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_websocket_costs_less_as_an_http2_stream_than_over_its_own_connection() {
    let Some(chromium) = chromium() else { return };
    let (h2, h2_stats) = per_socket(&chromium, true).await;
    let (h1, h1_stats) = per_socket(&chromium, false).await;
    eprintln!(
        "server heap per idle browser WebSocket ({SOCKETS} of each): HTTP/2 stream {h2:.0} B \
         ({} WebSockets, most on one connection {}, {} TCP connections); HTTP/1.1 {h1:.0} B \
         ({} WebSockets, {} TCP connections); ratio {:.2}",
        h2_stats.http2_websockets(),
        h2_stats.most_websockets_on_a_connection(),
        h2_stats.tcp_connections(),
        h1_stats.http1_websockets(),
        h1_stats.tcp_connections(),
        h2 / h1,
    );
    // The measured sockets share one HTTP/2 connection. The page's control socket, opened
    // before them, may not: Chromium opens it over HTTP/1.1 when the HTTP/2 connection's
    // SETTINGS (extended CONNECT on) have not arrived yet.
    assert!(h2_stats.most_websockets_on_a_connection() >= SOCKETS as u64, "one connection");
    assert_eq!(h2_stats.http2_websockets() + h2_stats.http1_websockets(), SOCKETS as u64 + 1);
    assert_eq!(h1_stats.http1_websockets(), SOCKETS as u64 + 1);
    assert!(h2 < h1, "an HTTP/2 stream ({h2:.0} B) costs less than a connection ({h1:.0} B)");
}
