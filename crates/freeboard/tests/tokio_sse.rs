//! Server-Sent Events from the tokio driver's axum extractor, with real clients: `curl -N` and
//! a WebSocket subscriber receiving the same publications over HTTP/1.1; several event
//! streams as streams of one HTTP/2 connection (the `h2` crate as client) and `curl --http2`;
//! headless Chromium's `EventSource` over HTTP/2; a reader that never reads (small socket
//! buffers) meeting its policy while an innocent subscriber gets every event; the resume
//! requests a driver without history cannot honour, and `503` when the budget is spent.
//!
//! Everything talks to 127.0.0.1, each test is bounded by a timeout, and the processes it
//! starts (curl, Chromium) are killed by their PID. The Chromium test is skipped (with a
//! message) when no `chromium` is on the PATH; `FREEBOARD_REQUIRE_BROWSER=1` makes that a
//! failure.

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use axum::http::{StatusCode, Uri, Version};
use axum::response::Html;
use axum::routing::get;
use axum::{Extension, Router};
use freeboard::tls::TlsIdentity;
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::http2::{Http2Config, Http2Server};
use freeboard::tokio::sse::{EventStreamRequest, MAX_FRAME, MAX_IN_HYPER};
use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage, WsConfig};
use freeboard::{MessageKind, SlowConsumerPolicy, Watermarks};
use freeboard_test::browser::{Browser, chromium};
use freeboard_test::tls::TestCa;
use futures_util::StreamExt;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::Message as TMessage;

/// A bound on every test: a hang fails instead of stalling CI.
const BOUND: Duration = Duration::from_secs(60);

/// The HTTP versions the event-stream routes were asked over.
type Versions = Arc<Mutex<Vec<Version>>>;

/// `/one` (an event stream of `scores`), `/two` (`scores` and `news`), `/close` (`scores`
/// under the `close` policy), `/ws` (a WebSocket subscribed to `scores`), each with `config`'s
/// send queue, on `endpoint`.
fn routes(endpoint: &Arc<Endpoint>, config: WsConfig, versions: &Versions) -> Router {
    let (one, two, close) = (config.clone(), config.clone(), config.clone());
    Router::new()
        .route(
            "/one",
            get(
                move |version: Version,
                      Extension(v): Extension<Versions>,
                      events: EventStreamRequest| async move {
                    v.lock().unwrap().push(version);
                    events.config(one).subscribe(["scores"])
                },
            ),
        )
        .route(
            "/two",
            get(
                move |version: Version,
                      Extension(v): Extension<Versions>,
                      events: EventStreamRequest| async move {
                    v.lock().unwrap().push(version);
                    events.config(two).subscribe(["scores", "news"])
                },
            ),
        )
        .route(
            "/close",
            get(move |events: EventStreamRequest| async move {
                events.config(close.slow_consumer(SlowConsumerPolicy::Close)).subscribe(["scores"])
            }),
        )
        .route(
            "/ws",
            get(move |ws: WebSocketUpgrade| async move {
                ws.config(config).on_upgrade(|mut socket: AxumWebSocket| async move {
                    socket.subscribe("scores").unwrap();
                    while let Some(message) = socket.next().await {
                        if let OwnedMessage::Close(_) = message {
                            break;
                        }
                    }
                })
            }),
        )
        .layer(Extension(Arc::clone(versions)))
        .layer(Extension(Arc::clone(endpoint)))
}

/// Serves `router` over plain HTTP/1.1 on loopback, each accepted socket's send buffer set
/// to `send_buffer` bytes if given.
async fn serve_plain(router: Router, send_buffer: Option<usize>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            if let Some(bytes) = send_buffer {
                socket2::SockRef::from(&tcp).set_send_buffer_size(bytes).unwrap();
            }
            let service = TowerToHyperService::new(router.clone());
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .with_upgrades(),
            );
        }
    });
    addr
}

fn endpoint(config: EndpointConfig) -> Arc<Endpoint> {
    Endpoint::new(config).expect("a valid endpoint")
}

/// The endpoint's metrics as a Prometheus registry encodes them.
fn scrape(endpoint: &Arc<Endpoint>) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(endpoint.collector()));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

async fn until(holds: impl Fn() -> bool) {
    tokio::time::timeout(BOUND, async {
        while !holds() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the condition held within the bound");
}

/// `curl` with `args`, its output piped; killed by its PID when dropped.
struct Curl(Child);

impl Curl {
    fn start(args: &[&str]) -> Self {
        let child = Command::new("curl")
            .args(["-N", "-s", "--max-time", "30"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("curl on the PATH");
        Self(child)
    }

    /// Reads its output until it holds `expected` (or curl ends); returns what was read.
    async fn read_until(&mut self, expected: &str) -> String {
        let mut stdout = self.0.stdout.take().unwrap();
        let expected = expected.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut text = String::new();
            let mut buf = [0u8; 4096];
            while !text.contains(&expected) {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
                }
            }
            text
        })
        .await
        .unwrap()
    }

    /// What curl wrote on stderr, once it was stopped.
    fn stop(mut self) -> String {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut text = String::new();
        let _ = self.0.stderr.take().unwrap().read_to_string(&mut text);
        text
    }
}

impl Drop for Curl {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An event stream read over a raw HTTP/1.1 connection: the response head, then the events
/// of its chunked body.
struct RawStream {
    tcp: TcpStream,
    /// Received bytes not yet decoded.
    raw: Vec<u8>,
    /// The decoded body not yet returned as events.
    body: String,
    /// The body's last chunk arrived.
    ended: bool,
}

impl RawStream {
    /// Sends `GET path` with `Accept: text/event-stream`; `receive_buffer`: the socket's
    /// receive buffer, set before connecting.
    async fn open(addr: SocketAddr, path: &str, receive_buffer: Option<u32>) -> Self {
        let socket = TcpSocket::new_v4().unwrap();
        if let Some(bytes) = receive_buffer {
            socket.set_recv_buffer_size(bytes).unwrap();
        }
        let mut tcp = socket.connect(addr).await.unwrap();
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n");
        tcp.write_all(request.as_bytes()).await.unwrap();
        Self { tcp, raw: Vec::new(), body: String::new(), ended: false }
    }

    /// The response head, once it arrived.
    async fn head(&mut self) -> String {
        loop {
            if let Some(end) = self.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8(self.raw[..end].to_vec()).unwrap();
                self.raw.drain(..end + 4);
                return head;
            }
            self.fill().await;
        }
    }

    async fn fill(&mut self) {
        let mut buf = [0u8; 16 << 10];
        let n = tokio::time::timeout(BOUND, self.tcp.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "the server closed the connection");
        self.raw.extend_from_slice(&buf[..n]);
    }

    /// The next event (its lines, without the blank line ending it); `None` once the body
    /// ended.
    async fn event(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.body.find("\n\n") {
                let event = self.body[..end].to_owned();
                self.body.drain(..end + 2);
                return Some(event);
            }
            if self.ended {
                return None;
            }
            // One chunk of the chunked coding: its size in hex, CRLF, the bytes, CRLF.
            if let Some(line) = self.raw.windows(2).position(|w| w == b"\r\n") {
                let size = std::str::from_utf8(&self.raw[..line]).unwrap();
                let size = usize::from_str_radix(size, 16).unwrap();
                if self.raw.len() >= line + 2 + size + 2 {
                    let data = &self.raw[line + 2..line + 2 + size];
                    self.body.push_str(std::str::from_utf8(data).unwrap());
                    self.raw.drain(..line + 2 + size + 2);
                    self.ended = size == 0;
                    continue;
                }
            }
            self.fill().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_and_a_websocket_receive_the_same_publications_over_http1() {
    let endpoint = endpoint(EndpointConfig::default());
    let versions = Versions::default();
    let addr = serve_plain(routes(&endpoint, WsConfig::default(), &versions), None).await;
    let mut curl = Curl::start(&["-H", "Accept: text/event-stream", &format!("http://{addr}/two")]);
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await.unwrap();
    until(|| endpoint.subscribers("scores") == 2 && endpoint.subscribers("news") == 1).await;
    assert_eq!(endpoint.event_streams(), 1);
    assert_eq!(endpoint.connections(), 2, "the event stream and the WebSocket");
    let metrics = scrape(&endpoint);
    assert!(metrics.contains("\nfreeboard_connections 2\n"), "{metrics}");
    assert!(metrics.contains("\nfreeboard_sse_connections 1\n"), "{metrics}");

    let mut expected = String::from("retry: 1000\n\n");
    for i in 0..10 {
        let reach = endpoint.publish("scores", MessageKind::Text, format!("s{i}").as_bytes());
        assert_eq!((reach.delivered, reach.dropped), (2, 0), "one event stream, one WebSocket");
        expected.push_str(&format!("event: scores\ndata: s{i}\n\n"));
    }
    endpoint.publish("news", MessageKind::Text, b"two\nlines");
    endpoint.publish("news", MessageKind::Binary, &[0, 0xff, 1, 2]);
    expected
        .push_str("event: news\ndata: two\ndata: lines\n\nevent: news+base64\ndata: AP8BAg==\n\n");
    let text = curl.read_until("AP8BAg==\n\n").await;
    assert_eq!(text, expected);
    for i in 0..10 {
        let message = tokio::time::timeout(BOUND, ws.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(message, TMessage::text(format!("s{i}")));
    }
    assert_eq!(*versions.lock().unwrap(), [Version::HTTP_11]);

    // The stream ends with its client: its session and subscriptions go.
    drop(curl);
    until(|| endpoint.event_streams() == 0 && endpoint.subscribers("news") == 0).await;
    assert_eq!(endpoint.subscribers("scores"), 1, "the WebSocket's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_is_idle_gets_keep_alive_comments() {
    let config =
        EndpointConfig::default().limits(|l| l.idle_timeout(Some(Duration::from_millis(100))));
    let endpoint = endpoint(config);
    let addr =
        serve_plain(routes(&endpoint, WsConfig::default(), &Versions::default()), None).await;
    let mut stream = RawStream::open(addr, "/one", None).await;
    let head = stream.head().await.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    assert!(head.contains("cache-control: no-store"), "{head}");
    assert_eq!(stream.event().await.as_deref(), Some("retry: 1000"));
    // Nothing published: the idle interval passes twice, a comment each time.
    assert_eq!(stream.event().await.as_deref(), Some(": keep-alive"));
    assert_eq!(stream.event().await.as_deref(), Some(": keep-alive"));
    endpoint.publish("scores", MessageKind::Text, b"after");
    let mut event = stream.event().await.unwrap();
    while event == ": keep-alive" {
        event = stream.event().await.unwrap();
    }
    assert_eq!(event, "data: after", "one topic: no event: line");
}

/// TLS to `addr` offering `h2` only, trusting the test CA.
async fn h2_connection(ca: &TestCa, addr: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca.ca_pem()).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap();
    // Each stream's window is h2's default (64 KiB); the connection's holds what the streams
    // not being read yet receive meanwhile.
    let (send, connection) = h2::client::Builder::new()
        .initial_connection_window_size(4 << 20)
        .handshake(tls)
        .await
        .unwrap();
    tokio::spawn(connection);
    send
}

/// Starts the HTTPS server (HTTP/2 and HTTP/1.1) with `extra` beside the event-stream
/// routes.
async fn serve_https(
    ca: &TestCa,
    endpoint: &Arc<Endpoint>,
    versions: &Versions,
    extra: Router,
) -> (SocketAddr, Arc<freeboard::tokio::http2::Http2Stats>) {
    let identity = TlsIdentity::load(&ca.cert_pem(), &ca.key_pem()).expect("test certificate");
    let server = Http2Server::new(Arc::new(identity), Http2Config::default()).unwrap();
    let stats = Arc::clone(server.stats());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = routes(endpoint, WsConfig::default(), versions).merge(extra);
    tokio::spawn(server.serve(listener, app));
    (addr, stats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_event_streams_share_one_http2_connection_and_curl_reads_one() {
    let ca = TestCa::new("sse-h2");
    let endpoint = endpoint(EndpointConfig::default());
    let versions = Versions::default();
    let (addr, stats) = serve_https(&ca, &endpoint, &versions, Router::new()).await;
    let send = h2_connection(&ca, addr).await;
    let streams = 3;
    let mut bodies = Vec::new();
    for _ in 0..streams {
        let mut send = send.clone().ready().await.unwrap();
        let request = http::Request::get(format!("https://localhost:{}/two", addr.port()))
            .header("accept", "text/event-stream")
            .body(())
            .unwrap();
        let (response, _) = send.send_request(request, true).unwrap();
        let response = tokio::time::timeout(BOUND, response).await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        bodies.push(response.into_body());
    }
    until(|| endpoint.subscribers("scores") == streams).await;
    assert_eq!(endpoint.event_streams(), streams);
    assert_eq!((stats.tcp_connections(), stats.http2_connections()), (1, 1), "{stats:?}");
    assert_eq!(*versions.lock().unwrap(), [Version::HTTP_2; 3]);

    // More than the stream's initial window (64 KiB): the client's flow control paces them.
    let n = 200;
    let payload = "x".repeat(1000);
    let mut expected = String::from("retry: 1000\n\n");
    for i in 0..n {
        let data = format!("{i:04} {payload}");
        let reach = endpoint.publish("scores", MessageKind::Text, data.as_bytes());
        assert_eq!(reach.dropped, 0);
        expected.push_str(&format!("event: scores\ndata: {data}\n\n"));
        if i % 20 == 0 {
            tokio::task::yield_now().await;
        }
    }
    endpoint.publish("news", MessageKind::Text, b"last");
    expected.push_str("event: news\ndata: last\n\n");
    for body in &mut bodies {
        let mut text = String::new();
        while text.len() < expected.len() {
            let chunk = tokio::time::timeout(BOUND, body.data()).await.unwrap().unwrap().unwrap();
            body.flow_control().release_capacity(chunk.len()).unwrap();
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        assert_eq!(text, expected, "every event, in order, on each stream");
    }

    // curl over HTTP/2 beside them (its own connection).
    let url = format!("https://localhost:{}/one", addr.port());
    let ca_pem = ca.ca_pem();
    let mut curl = Curl::start(&[
        "--http2",
        "-v",
        "--cacert",
        ca_pem.to_str().unwrap(),
        "-H",
        "Accept: text/event-stream",
        &url,
    ]);
    until(|| endpoint.subscribers("scores") == streams + 1).await;
    endpoint.publish("scores", MessageKind::Text, b"to curl");
    let text = curl.read_until("data: to curl\n\n").await;
    assert_eq!(text, "retry: 1000\n\ndata: to curl\n\n");
    let stderr = curl.stop();
    assert!(stderr.contains("< HTTP/2 200"), "curl spoke HTTP/2: {stderr}");

    // The streams end with their client: every session and subscription goes.
    drop((bodies, send));
    until(|| endpoint.event_streams() == 0 && endpoint.connections() == 0).await;
    assert_eq!(endpoint.subscribers("scores"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_never_reads_meets_its_policy_while_an_innocent_gets_every_event() {
    // The stream the `close` policy ends keeps its last event until it reads (below).
    let config = EndpointConfig::default().limits(|l| l.close_timeout(Duration::from_secs(60)));
    let endpoint = endpoint(config);
    // A queue of 16 KiB at most beside what hyper and the sockets hold.
    let marks = Watermarks::new(4 << 10, 8 << 10, 16 << 10).unwrap();
    let config =
        WsConfig::default().watermarks(marks).slow_consumer(SlowConsumerPolicy::DropOldest);
    let addr = serve_plain(routes(&endpoint, config, &Versions::default()), Some(4096)).await;
    let mut slow = RawStream::open(addr, "/one", Some(4096)).await;
    let mut closing = RawStream::open(addr, "/close", Some(4096)).await;
    let mut innocent = RawStream::open(addr, "/one", None).await;
    until(|| endpoint.subscribers("scores") == 3).await;
    assert!(innocent.head().await.starts_with("HTTP/1.1 200"));
    assert_eq!(innocent.event().await.as_deref(), Some("retry: 1000"));

    let n = 3000;
    let payload = "y".repeat(1000);
    let (mut delivered, mut dropped) = (0, 0);
    for i in 0..n {
        let reach =
            endpoint.publish("scores", MessageKind::Text, format!("{i:05} {payload}").as_bytes());
        delivered += reach.delivered;
        dropped += reach.dropped;
        // The innocent reads each event as it comes: it never falls behind.
        let event = innocent.event().await.unwrap();
        assert_eq!(event, format!("data: {i:05} {payload}"), "in order, none missing");
    }
    let (oldest, closed) =
        (endpoint.drops(SlowConsumerPolicy::DropOldest), endpoint.drops(SlowConsumerPolicy::Close));
    eprintln!(
        "{n} publications to 3 subscribers: {delivered} queued, {dropped} refused; \
         dropped by drop-oldest {oldest}, by close {closed}"
    );
    assert!(oldest > 0, "the reader under drop-oldest lost its oldest events, counted");
    assert_eq!(endpoint.slow_consumer_closes(), 1, "the reader under close was closed, counted");
    assert!(closed >= 1 && dropped >= 1);
    assert!(delivered >= n, "the innocent took every one");
    // What the slow readers hold in the pool is bounded by their queues' caps.
    let counters = endpoint.counters();
    eprintln!("pool after {n} publications: {} chunks in use", counters.chunks_in_use);
    assert!(counters.chunks_in_use <= 64, "bounded by the caps, not by n: {counters:?}");

    // The one under `close` ended with its last event: it reads what was queued, then that.
    assert!(closing.head().await.starts_with("HTTP/1.1 200"));
    let mut last = None;
    while let Some(event) = closing.event().await {
        last = Some(event);
    }
    assert_eq!(last.as_deref(), Some("event: freeboard-close\ndata: 1008 slow consumer"));
    // The one under `drop-oldest` is still subscribed and gets the newest once it reads.
    endpoint.publish("scores", MessageKind::Text, b"newest");
    assert!(slow.head().await.starts_with("HTTP/1.1 200"));
    let mut seen = Vec::new();
    loop {
        let event = slow.event().await.unwrap();
        if event == "data: newest" {
            break;
        }
        seen.push(event);
    }
    // What it got after it stalled was held by its queue (16 KiB cap), hyper (at most
    // `MAX_IN_HYPER`), the sink (a frame) and the sockets (4 KiB each way, doubled by Linux):
    // bounded, whatever was published meanwhile.
    let held: usize = seen.iter().map(|e| e.len() + 2).sum();
    eprintln!("the reader that never read then got {} events, {held} bytes", seen.len());
    let bound = (16 << 10) + MAX_IN_HYPER + MAX_FRAME + 4 * (8 << 10);
    assert!(held <= bound, "{held} bytes");
    until(|| endpoint.subscribers("scores") == 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stream_whose_reader_never_reads_gives_its_queue_back_after_the_close_timeout() {
    let config = EndpointConfig::default().limits(|l| l.close_timeout(Duration::from_millis(100)));
    let endpoint = endpoint(config);
    let marks = Watermarks::new(16 << 10, 32 << 10, 256 << 10).unwrap();
    let config = WsConfig::default().watermarks(marks);
    let addr = serve_plain(routes(&endpoint, config, &Versions::default()), Some(4096)).await;
    let mut slow = RawStream::open(addr, "/close", Some(4096)).await;
    until(|| endpoint.subscribers("scores") == 1).await;
    // Messages larger than what hyper and the sockets hold: the one being written when the
    // policy closes the stream is still in its queue, with the last event behind it.
    let payload = vec![b'c'; 200_000];
    endpoint.publish("scores", MessageKind::Text, &payload);
    // The body started on the first: the policy cannot discard it whole.
    until(|| endpoint.counters().chunks_in_use < payload.len() / 4096).await;
    for _ in 0..100 {
        if endpoint.slow_consumer_closes() == 1 {
            break;
        }
        endpoint.publish("scores", MessageKind::Text, &payload);
        tokio::task::yield_now().await;
    }
    assert_eq!(endpoint.slow_consumer_closes(), 1);
    let held = endpoint.counters().chunks_in_use;
    assert!(held > 10, "its queue holds the rest of a message, then its last event: {held}");
    // Nothing of it is written while the reader does not read: after the close timeout its
    // queue goes back to the pool.
    until(|| endpoint.counters().chunks_in_use == 0).await;
    eprintln!("{held} chunks held by the closed stream went back to the pool");
    // Once it reads: what hyper and the sockets held, then the end of the body (an
    // `EventSource` discards a last event the end cut).
    assert!(slow.head().await.starts_with("HTTP/1.1 200"));
    let mut events = 0;
    while slow.event().await.is_some() {
        events += 1;
    }
    assert!(events < 100, "{events} events");
    until(|| endpoint.connections() == 0 && endpoint.event_streams() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_a_driver_without_history_cannot_honour_are_refused_never_a_silent_gap() {
    let endpoint = endpoint(EndpointConfig::default());
    let addr =
        serve_plain(routes(&endpoint, WsConfig::default(), &Versions::default()), None).await;
    let long = "9".repeat(65);
    for (path, header, why) in [
        ("/one", Some(("last-event-id", "ab.17-3")), "keep no history"),
        ("/one?lastEventId=ab.17-3", None, "keep no history"),
        ("/one?since=ab.17-3", None, "keep no history"),
        ("/one", Some(("last-event-id", "not an offset")), "not an offset"),
        ("/one", Some(("last-event-id", &*long)), "not an offset"),
    ] {
        let (status, text) = request(addr, path, header, true).await;
        assert_eq!(status, 400, "{path} {header:?}: {text}");
        assert!(text.contains(why), "{path} {header:?}: {text}");
    }
    let (status, text) = request(addr, "/one", None, false).await;
    assert_eq!(status, 406, "no Accept: text/event-stream: {text}");
    assert_eq!(endpoint.connections(), 0, "no stream was opened");
}

/// The status and whole response of `GET path` with `header` (and `Accept:
/// text/event-stream` if `accept`) on a connection of its own.
async fn request(
    addr: SocketAddr,
    path: &str,
    header: Option<(&str, &str)>,
    accept: bool,
) -> (u16, String) {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if accept {
        request.push_str("Accept: text/event-stream\r\n");
    }
    if let Some((name, value)) = header {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    tokio::time::timeout(BOUND, tcp.read_to_string(&mut text)).await.unwrap().unwrap();
    (text[9..12].parse().unwrap(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_answers_503_counted_until_memory_comes_back() {
    // A pool of 512 KiB, of which a stream needs 64 KiB free to be admitted.
    let endpoint = endpoint(EndpointConfig::default().memory(512 << 10));
    // A queue that may hold the whole pool: the reader that never reads spends it.
    let marks = Watermarks::new(8 << 10, 16 << 10, 1 << 20).unwrap();
    let config =
        WsConfig::default().watermarks(marks).slow_consumer(SlowConsumerPolicy::DropNewest);
    let addr = serve_plain(routes(&endpoint, config, &Versions::default()), Some(4096)).await;
    let hog = RawStream::open(addr, "/one", Some(4096)).await;
    until(|| endpoint.subscribers("scores") == 1).await;
    let payload = vec![b'z'; 8 << 10];
    // Publish until the pool stays spent once hyper and the sockets took what they take.
    for _ in 0..100 {
        for _ in 0..100 {
            if !endpoint.has_room() {
                break;
            }
            endpoint.publish("scores", MessageKind::Text, &payload);
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        if !endpoint.has_room() {
            break;
        }
    }
    assert!(!endpoint.has_room(), "the hog spent the pool: {:?}", endpoint.counters());

    let mut refused = RawStream::open(addr, "/one", None).await;
    let head = refused.head().await.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 503"), "{head}");
    assert!(head.contains("retry-after: 1"), "{head}");
    match tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE)
        }
        other => panic!("the WebSocket upgrade is refused too: {:?}", other.map(|_| ())),
    }
    assert_eq!(endpoint.budget_refusals(), 2, "the event stream and the WebSocket, counted");
    let metrics = scrape(&endpoint);
    let series = "freeboard_access_refusals_total{reason=\"budget\"} 2";
    assert!(metrics.contains(series), "{metrics}");
    assert_eq!(endpoint.event_streams(), 1, "the hog alone");

    // The hog goes: its queue comes back to the pool, and a stream is admitted again.
    drop(hog);
    until(|| endpoint.has_room()).await;
    let mut admitted = RawStream::open(addr, "/one", None).await;
    assert!(admitted.head().await.starts_with("HTTP/1.1 200"));
}

const PAGE: &str = r#"<!doctype html><title>SSE over HTTP/2</title><script>
const n = N;
const got = [];
const es = new EventSource("/two");
es.addEventListener("scores", (e) => {
  got.push(e.data);
  if (got.length === n) {
    const ok = got.every((d, i) => d === `m${i}`);
    es.close();
    fetch(`/report?ok=${ok}&n=${got.length}`);
  }
});
es.onerror = () => fetch(`/report?error&n=${got.length}`);
</script>"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_event_source_receives_every_event_over_http2() {
    let Some(chromium) = chromium() else { return };
    let n = 500;
    let ca = TestCa::new("sse-browser");
    let endpoint = endpoint(EndpointConfig::default());
    let versions = Versions::default();
    let (tx, rx) = mpsc::channel::<String>();
    let page = PAGE.replace("N", &n.to_string());
    let extra = Router::new()
        .route("/", get(move || async move { Html(page) }))
        .route(
            "/report",
            get(
                |Extension(tx): Extension<Arc<Mutex<mpsc::Sender<String>>>>, uri: Uri| async move {
                    let _ = tx.lock().unwrap().send(uri.query().unwrap_or_default().to_owned());
                },
            ),
        )
        .layer(Extension(Arc::new(Mutex::new(tx))));
    let (addr, stats) = serve_https(&ca, &endpoint, &versions, extra).await;
    let profile = ca.dir().join("chromium-profile");
    let flags = [format!("--ignore-certificate-errors-spki-list={}", ca.spki_sha256)];
    let browser =
        Browser::start(&chromium, &profile, &flags, &format!("https://localhost:{}/", addr.port()));
    until(|| endpoint.subscribers("scores") == 1).await;
    for i in 0..n {
        endpoint.publish("scores", MessageKind::Text, format!("m{i}").as_bytes());
    }
    let report = tokio::task::spawn_blocking(move || rx.recv_timeout(BOUND)).await.unwrap();
    drop(browser);
    let report = report.unwrap_or_else(|_| panic!("no report from chromium; {stats:?}"));
    assert_eq!(report, format!("ok=true&n={n}"));
    assert_eq!(*versions.lock().unwrap(), [Version::HTTP_2], "the EventSource went over HTTP/2");
    assert_eq!(stats.http1_connections(), 0, "{stats:?}");
    eprintln!(
        "chromium: {n} events over an EventSource on HTTP/2; {} TCP connections ({} HTTP/2)",
        stats.tcp_connections(),
        stats.http2_connections()
    );
}
