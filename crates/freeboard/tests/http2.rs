//! WebSockets over HTTP/2 (RFC 8441) from the tokio driver's HTTPS server, with real clients:
//! headless Chromium opening its sockets as streams of the HTTP/2 connection that loaded the
//! page, freeboard's own HTTP/2 client (several WebSockets on one connection) beside an
//! HTTP/1.1 upgrade on the same port, `curl --http2`, and a hand-written HTTP/2 client for
//! what no polite client sends: a stream flood past `SETTINGS_MAX_CONCURRENT_STREAMS`, rapid
//! reset, a CONTINUATION flood, a `CONNECT` without `:protocol`, wrong versions and protocols, and a stream whose
//! flow-control window never opens. Innocents keep echoing.
//!
//! Everything talks to 127.0.0.1, each test is bounded by a timeout, and Chromium is killed
//! with its process group. Skipped (with a message) when no `chromium` is on the PATH;
//! `FREEBOARD_REQUIRE_BROWSER=1` turns the skip into a failure.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, Uri};
use axum::response::{Html, Response};
use axum::routing::{any, get};
use axum::{Extension, Router};
use freeboard::tls::TlsIdentity;
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::http2::{ERROR_CODES, Http2Client, Http2Config, Http2Server, Http2Stats};
use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage, WsConfig};
use freeboard_test::browser::{Browser, chromium};
use freeboard_test::tls::TestCa;
use futures_util::{SinkExt, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::Message as TMessage;

/// A bound on every test: a hang fails instead of stalling CI.
const BOUND: Duration = Duration::from_secs(60);

/// The server under test: its address, counts and endpoint.
struct Running {
    addr: SocketAddr,
    stats: Arc<Http2Stats>,
    endpoint: Arc<Endpoint>,
}

/// Starts the HTTPS server with `config` on loopback: `/echo` (both forms of WebSocket),
/// `/metrics` (the server's collector in a Prometheus registry) and the routes of `extra`.
async fn start(ca: &TestCa, config: Http2Config, extra: Router) -> Running {
    let endpoint = Endpoint::new(EndpointConfig::default().memory(32 << 20)).expect("a budget");
    start_on(ca, config, extra, endpoint, false).await
}

/// As [`start`], on `endpoint`; `charged`: each HTTP/2 connection's buffers are charged to
/// its budget.
async fn start_on(
    ca: &TestCa,
    config: Http2Config,
    extra: Router,
    endpoint: Arc<Endpoint>,
    charged: bool,
) -> Running {
    let identity = TlsIdentity::load(&ca.cert_pem(), &ca.key_pem()).expect("test certificate");
    let mut server = Http2Server::new(Arc::new(identity), config).expect("TLS configuration");
    if charged {
        server = server.charge_to(&endpoint);
    }
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(server.collector()));
    let registry = Arc::new(registry);
    let metrics = get(move || async move {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    });
    let app = Router::new()
        .route("/echo", any(echo))
        .route("/metrics", metrics)
        .merge(extra)
        .layer(Extension(Arc::clone(&endpoint)));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::clone(server.stats());
    tokio::spawn(server.serve(listener, app));
    Running { addr, stats, endpoint }
}

async fn echo(ws: WebSocketUpgrade) -> Response {
    ws.protocols(["echo"]).on_upgrade(|mut socket: AxumWebSocket| async move {
        while let Some(message) = socket.next().await {
            if let OwnedMessage::Close(_) = message {
                break;
            }
            let _ = socket.send(message);
        }
    })
}

/// A TLS connection to `addr` that offers `alpn`, trusting the test CA.
async fn tls(ca: &TestCa, addr: SocketAddr, alpn: &[u8]) -> TlsStream<TcpStream> {
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
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let stream = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(alpn), "ALPN agreed");
    stream
}

async fn http2_client(ca: &TestCa, addr: SocketAddr) -> Http2Client {
    let io = tls(ca, addr, b"h2").await;
    Http2Client::handshake(io, &format!("https://localhost:{}", addr.port())).await.unwrap()
}

fn client_endpoint() -> Arc<Endpoint> {
    Endpoint::new(EndpointConfig::default().memory(8 << 20)).expect("a budget")
}

/// Sends a text and a binary message on a client WebSocket and checks both come back.
async fn echo_twice(ws: &mut freeboard::tokio::http2::Http2WebSocket, tag: usize) {
    let text = format!("stream {tag}");
    let binary: Vec<u8> = (0..3000).map(|i| (i * 7 + tag) as u8).collect();
    ws.send_text(&text);
    ws.send_binary(&binary);
    assert_eq!(ws.next().await, Some(OwnedMessage::Text(text)));
    assert_eq!(ws.next().await, Some(OwnedMessage::Binary(binary)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_opens_ten_websockets_on_one_http2_connection_beside_http1() {
    tokio::time::timeout(BOUND, async {
        let ca = TestCa::new("h2-client");
        let server = start(&ca, Http2Config::default(), Router::new()).await;
        let client = http2_client(&ca, server.addr).await;
        let endpoint = client_endpoint();
        let config = WsConfig::default().protocols(["echo"]);
        let mut sockets = Vec::new();
        for _ in 0..10 {
            sockets.push(client.websocket("/echo", &endpoint, &config).await.unwrap());
        }
        // Concurrently, each on its own stream of the one connection.
        let tasks: Vec<_> = sockets
            .into_iter()
            .enumerate()
            .map(|(i, mut ws)| {
                tokio::spawn(async move {
                    assert_eq!(ws.protocol().as_deref(), Some("echo"));
                    for round in 0..20 {
                        echo_twice(&mut ws, i * 100 + round).await;
                    }
                    ws.close(freeboard::CloseCode::NORMAL, "done").unwrap();
                    match ws.next().await {
                        Some(OwnedMessage::Close(close)) => assert!(close.was_clean, "{close:?}"),
                        other => panic!("expected the close, got {other:?}"),
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        // HTTP/1.1 upgrades on the same port, side by side (tungstenite over TLS).
        let io = tls(&ca, server.addr, b"http/1.1").await;
        let url = format!("wss://localhost:{}/echo", server.addr.port());
        let (mut h1, _) = tokio_tungstenite::client_async(url, io).await.unwrap();
        h1.send(TMessage::text("over HTTP/1.1")).await.unwrap();
        assert_eq!(h1.next().await.unwrap().unwrap(), TMessage::text("over HTTP/1.1"));

        let stats = &server.stats;
        assert_eq!(stats.http2_websockets(), 10);
        assert_eq!(stats.most_websockets_on_a_connection(), 10);
        assert_eq!(stats.http2_connections(), 1);
        assert_eq!(stats.http1_websockets(), 1);
        assert_eq!(stats.http1_connections(), 1);
        assert_eq!(stats.tcp_connections(), 2, "ten streams on one TCP connection, one for 1.1");
        drop(h1);
        drop(client);
        // Every session and connection of the server ends and gives its memory back.
        while server.endpoint.connections() > 0 || stats.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_connect_errors_name_the_bad_input() {
    tokio::time::timeout(BOUND, async {
        let ca = TestCa::new("h2-errors");
        let server = start(&ca, Http2Config::default(), Router::new()).await;
        let io = hyper_util::rt::TokioIo::new(tls(&ca, server.addr, b"h2").await);
        let (mut send, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .handshake::<_, Body>(io)
                .await
                .unwrap();
        tokio::spawn(conn);
        let origin = format!("https://localhost:{}", server.addr.port());
        let request = |protocol: &'static str, version: Option<&str>| {
            let mut builder = Request::builder()
                .method(Method::CONNECT)
                .uri(format!("{origin}/echo"))
                .extension(hyper::ext::Protocol::from_static(protocol));
            if let Some(version) = version {
                builder = builder.header("sec-websocket-version", version);
            }
            builder.body(Body::empty()).unwrap()
        };
        // The first request waits for the server's SETTINGS to allow extended CONNECT.
        send.ready().await.unwrap();
        let mut answer = |request| {
            let response = send.send_request(request);
            async move {
                let response = response.await.unwrap();
                let status = response.status();
                let version = response.headers().get("sec-websocket-version").cloned();
                let body = axum::body::to_bytes(Body::new(response.into_body()), 1024).await;
                (status, version, String::from_utf8(body.unwrap().to_vec()).unwrap())
            }
        };
        let (status, _, why) = answer(request("chat", Some("13"))).await;
        assert_eq!(
            (status, why.as_str()),
            (StatusCode::NOT_IMPLEMENTED, "only :protocol websocket")
        );
        let (status, version, why) = answer(request("websocket", Some("8"))).await;
        assert_eq!(
            (status, why.as_str()),
            (StatusCode::BAD_REQUEST, "Sec-WebSocket-Version must be 13")
        );
        assert_eq!(version.unwrap(), "13", "the version the server speaks, as RFC 6455 §4.4");
        let (status, _, _) = answer(request("websocket", None)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(server.stats.refused_connects(), 3);
        assert_eq!(server.stats.http2_websockets(), 0);
        // A tunnel CONNECT (no :protocol, :authority only): not a WebSocket, and not served.
        let tunnel = Request::builder()
            .method(Method::CONNECT)
            .uri(format!("localhost:{}", server.addr.port()))
            .body(Body::empty())
            .unwrap();
        let (status, _, _) = answer(tunnel).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "an authority-form target matches no route");
        assert_eq!(server.stats.refused_connects(), 4);
        // The connection still serves a good one after the refusals.
        let (status, _, _) = answer(request("websocket", Some("13"))).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(server.stats.http2_websockets(), 1);
    })
    .await
    .expect("bounded");
}

/// One HTTP/2 frame: a 9-byte header and its payload (RFC 9113 §4.1).
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PING: u8 = 0x6;
const ACK: u8 = 0x1;
const END_STREAM: u8 = 0x1;
const PROTOCOL_ERROR: u32 = 0x1;
const FLOW_CONTROL_ERROR: u32 = 0x3;
const CANCEL: u32 = 0x8;
const REFUSED_STREAM: u32 = 0x7;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// A header block of literal fields without indexing, names and values sent raw (RFC 7541
/// §6.2.2; every length here is under 127, so one octet).
fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.push(value.len() as u8);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

async fn read_frame<R: AsyncRead + Unpin>(io: &mut R) -> (u8, u8, u32, Vec<u8>) {
    let mut head = [0u8; 9];
    io.read_exact(&mut head).await.unwrap();
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    io.read_exact(&mut payload).await.unwrap();
    (head[3], head[4], stream, payload)
}

/// A hand-written HTTP/2 client: the preface, an empty SETTINGS, the server's SETTINGS
/// (returned as id → value) acknowledged.
async fn raw_http2(ca: &TestCa, addr: SocketAddr) -> (TlsStream<TcpStream>, Vec<(u16, u32)>) {
    raw_http2_with(ca, addr, &[]).await
}

/// As [`raw_http2`], sending `settings` (id, value).
async fn raw_http2_with(
    ca: &TestCa,
    addr: SocketAddr,
    settings: &[(u16, u32)],
) -> (TlsStream<TcpStream>, Vec<(u16, u32)>) {
    let mut io = tls(ca, addr, b"h2").await;
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    let ours: Vec<u8> = settings
        .iter()
        .flat_map(|(id, v)| [&id.to_be_bytes()[..], &v.to_be_bytes()].concat())
        .collect();
    hello.extend(frame(SETTINGS, 0, 0, &ours));
    io.write_all(&hello).await.unwrap();
    loop {
        let (kind, flags, _, payload) = read_frame(&mut io).await;
        if kind == SETTINGS && flags & ACK == 0 {
            let settings = payload
                .chunks_exact(6)
                .map(|s| {
                    (u16::from_be_bytes([s[0], s[1]]), u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
                })
                .collect();
            io.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
            return (io, settings);
        }
    }
}

fn extended_connect(port: u16) -> Vec<u8> {
    extended_connect_to(port, "/echo")
}

fn extended_connect_to(port: u16, path: &str) -> Vec<u8> {
    let authority = format!("localhost:{port}");
    header_block(&[
        (":method", "CONNECT"),
        (":protocol", "websocket"),
        (":scheme", "https"),
        (":path", path),
        (":authority", &authority),
        ("sec-websocket-version", "13"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_advertises_extended_connect_and_its_limits() {
    tokio::time::timeout(BOUND, async {
        let ca = TestCa::new("h2-settings");
        let config = Http2Config::default()
            .max_concurrent_streams(50)
            .max_header_list_size(8 << 10)
            .windows(32 << 10, 128 << 10);
        let server = start(&ca, config, Router::new()).await;
        let (_io, settings) = raw_http2(&ca, server.addr).await;
        let get = |id: u16| settings.iter().find(|(i, _)| *i == id).map(|(_, v)| *v);
        // RFC 8441 §3: SETTINGS_ENABLE_CONNECT_PROTOCOL (0x8) = 1.
        assert_eq!(get(0x8), Some(1), "{settings:?}");
        assert_eq!(get(0x3), Some(50), "MAX_CONCURRENT_STREAMS");
        assert_eq!(get(0x4), Some(32 << 10), "INITIAL_WINDOW_SIZE");
        assert_eq!(get(0x6), Some(8 << 10), "MAX_HEADER_LIST_SIZE");
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_reset_and_continuation_floods_meet_their_limits_and_innocents_keep_echoing() {
    tokio::time::timeout(BOUND, async {
        let ca = TestCa::new("h2-flood");
        let limit = 8;
        let server =
            start(&ca, Http2Config::default().max_concurrent_streams(limit), Router::new()).await;
        // The innocent: another connection with four WebSockets, echoing before and after.
        let client = http2_client(&ca, server.addr).await;
        let endpoint = client_endpoint();
        let config = WsConfig::default();
        let mut innocents = Vec::new();
        for i in 0..4 {
            let mut ws = client.websocket("/echo", &endpoint, &config).await.unwrap();
            echo_twice(&mut ws, i).await;
            innocents.push(ws);
        }

        // The attacker opens three times the limit at once, ignoring the SETTINGS.
        let (mut io, _) = raw_http2(&ca, server.addr).await;
        let block = extended_connect(server.addr.port());
        let flood = 3 * limit;
        let mut burst = Vec::new();
        for n in 0..flood {
            burst.extend(frame(HEADERS, END_HEADERS, 1 + 2 * n, &block));
        }
        io.write_all(&burst).await.unwrap();
        let (mut accepted, mut refused) = (0, 0);
        while accepted + refused < flood {
            let (kind, _, stream, payload) = read_frame(&mut io).await;
            match kind {
                HEADERS => accepted += 1,
                RST_STREAM => {
                    let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                    assert_eq!(code, REFUSED_STREAM, "stream {stream}");
                    refused += 1;
                }
                GOAWAY => panic!("GOAWAY {:?}", &payload[4..8]),
                _ => {}
            }
        }
        assert_eq!((accepted, refused), (limit, 2 * limit), "the limit holds");
        // Counted by the server as its writes return and its sessions start, which may be
        // after the client read the frames.
        until(|| server.stats.http2_websockets() == 4 + u64::from(limit)).await;
        until(|| server.stats.refused_streams() == u64::from(2 * limit)).await;

        // On a second connection, a CONNECT without :protocol but with :path: malformed
        // (RFC 9113 §8.5: a CONNECT "MUST" omit :scheme and :path unless it is extended,
        // RFC 8441 §4), so the stream is reset and the connection goes on.
        let (mut other, _) = raw_http2(&ca, server.addr).await;
        let authority = format!("localhost:{}", server.addr.port());
        let malformed = header_block(&[
            (":method", "CONNECT"),
            (":scheme", "https"),
            (":path", "/echo"),
            (":authority", &authority),
        ]);
        let mut requests = frame(HEADERS, END_HEADERS, 1, &malformed);
        requests.extend(frame(HEADERS, END_HEADERS, 3, &block));
        other.write_all(&requests).await.unwrap();
        let (mut reset, mut answered) = (None, false);
        while reset.is_none() || !answered {
            let (kind, _, stream, payload) = read_frame(&mut other).await;
            match (kind, stream) {
                (RST_STREAM, 1) => {
                    reset = Some(u32::from_be_bytes(payload[..4].try_into().unwrap()))
                }
                // `:status 200`, indexed (RFC 7541 Appendix A: entry 8).
                (HEADERS, 3) => answered = payload.first() == Some(&0x88),
                (GOAWAY, _) => panic!("GOAWAY {:?}", &payload[4..8]),
                _ => {}
            }
        }
        assert_eq!(reset, Some(PROTOCOL_ERROR));
        assert_eq!(server.stats.reset_streams(), 1);
        assert_eq!(server.stats.goaways(), 0, "a bad stream does not end the connection");

        // The accepted streams are WebSockets: one echoes a masked frame over DATA.
        let masked = [0x81, 0x82, 1, 2, 3, 4, b'h' ^ 1, b'i' ^ 2];
        io.write_all(&frame(DATA, 0, 1, &masked)).await.unwrap();
        loop {
            let (kind, _, stream, payload) = read_frame(&mut io).await;
            if kind == DATA && stream == 1 {
                assert_eq!(payload, [0x81, 0x02, b'h', b'i']);
                break;
            }
        }
        // Rapid reset (CVE-2023-44487): streams opened and reset at once, a thousand times.
        // h2 keeps at most `max_pending_reset_streams` (20) such resets waiting, then ends
        // the connection with GOAWAY ENHANCE_YOUR_CALM.
        let (mut rapid, _) = raw_http2(&ca, server.addr).await;
        let mut burst = Vec::new();
        for n in 0..1000u32 {
            burst.extend(frame(HEADERS, END_HEADERS, 1 + 2 * n, &block));
            burst.extend(frame(RST_STREAM, 0, 1 + 2 * n, &0x8u32.to_be_bytes()));
        }
        // The server may close while the burst is still being written.
        let _ = rapid.write_all(&burst).await;
        let goaway = loop {
            let (kind, _, _, payload) = read_frame(&mut rapid).await;
            if kind == GOAWAY {
                break u32::from_be_bytes(payload[4..8].try_into().unwrap());
            }
        };
        assert_eq!(goaway, ENHANCE_YOUR_CALM);
        assert_eq!((server.stats.goaways(), server.stats.goaway_errors()), (1, 1));

        // CONTINUATION flood: one request head sent as a HEADERS and then endless
        // CONTINUATION frames, never ending it. h2 stops at the header list size.
        let (mut flood_io, _) = raw_http2(&ca, server.addr).await;
        let mut burst = frame(HEADERS, 0, 1, &block);
        let pad = header_block(&[("x-pad", &"p".repeat(100))]);
        for _ in 0..2000 {
            burst.extend(frame(CONTINUATION, 0, 1, &pad));
        }
        let _ = flood_io.write_all(&burst).await;
        let mut outcome = None;
        while outcome.is_none() {
            let (kind, _, stream, payload) = read_frame(&mut flood_io).await;
            match kind {
                GOAWAY => {
                    outcome =
                        Some(("GOAWAY", u32::from_be_bytes(payload[4..8].try_into().unwrap())))
                }
                RST_STREAM => {
                    outcome =
                        Some(("RST_STREAM", u32::from_be_bytes(payload[..4].try_into().unwrap())))
                }
                HEADERS if stream == 1 => outcome = Some(("HEADERS", u32::from(payload[0]))),
                _ => {}
            }
        }
        assert_eq!(outcome, Some(("GOAWAY", ENHANCE_YOUR_CALM)));
        assert_eq!((server.stats.goaways(), server.stats.goaway_errors()), (2, 2));

        // The innocents lost nothing.
        for (i, ws) in innocents.iter_mut().enumerate() {
            echo_twice(ws, 10 + i).await;
        }
        assert!(client.websocket("/echo", &endpoint, &config).await.is_ok());
    })
    .await
    .expect("bounded");
}

#[test]
fn curl_speaks_http2_to_the_server() {
    let Ok(out) = std::process::Command::new("curl").arg("--version").output() else {
        eprintln!("SKIPPED: curl is not installed");
        return;
    };
    assert!(String::from_utf8_lossy(&out.stdout).contains("HTTP2"), "curl without HTTP/2");
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let ca = TestCa::new("h2-curl");
    let hello = Router::new().route("/hello", get(|| async { "hello over HTTP/2\n" }));
    let server = runtime.block_on(start(&ca, Http2Config::default(), hello));
    let url = format!("https://localhost:{}/hello", server.addr.port());
    let out = std::process::Command::new("curl")
        .args(["--http2", "-sS", "-v", "--max-time", "20", "--cacert"])
        .arg(ca.ca_pem())
        .args(["--resolve", &format!("localhost:{}:127.0.0.1", server.addr.port()), &url])
        .output()
        .unwrap();
    let verbose = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello over HTTP/2\n", "{verbose}");
    assert!(verbose.contains("ALPN: server accepted h2"), "{verbose}");
    assert!(verbose.contains("< HTTP/2 200"), "{verbose}");
    assert_eq!(server.stats.http2_connections(), 1);
}

/// The page: `n` WebSockets to `/echo`, each echoing a text and a binary message, then the
/// count reported with `fetch` (over the same connection).
const PAGE: &str = r#"<!doctype html><title>freeboard over HTTP/2</title><script>
const n = N;
let done = 0, failed = 0;
const finish = () => { if (done + failed === n) fetch(`/report?ok=${done}&failed=${failed}`); };
for (let i = 0; i < n; i++) {
  const ws = new WebSocket(`wss://${location.host}/echo`);
  ws.binaryType = "arraybuffer";
  const bytes = new Uint8Array(5000).map((_, k) => (k * 3 + i) & 255);
  let step = 0;
  ws.onopen = () => { ws.send(`hello ${i}`); ws.send(bytes); };
  ws.onmessage = (e) => {
    const ok = step === 0 ? e.data === `hello ${i}`
      : new Uint8Array(e.data).every((v, k) => v === bytes[k]) && e.data.byteLength === 5000;
    if (!ok) { failed++; finish(); ws.close(); return; }
    step++;
    if (step === 2) { done++; finish(); }
  };
  ws.onerror = () => { failed++; finish(); };
}
</script>"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_opens_its_websockets_as_streams_of_one_http2_connection() {
    let Some(chromium) = chromium() else { return };
    let sockets = 20;
    let ca = TestCa::new("h2-browser");
    let (tx, rx) = mpsc::channel::<String>();
    let page = PAGE.replace("N", &sockets.to_string());
    let routes = Router::new()
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
    let server = start(&ca, Http2Config::default(), routes).await;
    let profile = ca.dir().join("chromium-profile");
    let flags = [format!("--ignore-certificate-errors-spki-list={}", ca.spki_sha256)];
    let url = format!("https://localhost:{}/", server.addr.port());
    let browser = Browser::start(&chromium, &profile, &flags, &url);
    let report = tokio::task::spawn_blocking(move || rx.recv_timeout(BOUND)).await.unwrap();
    // Stop this browser (by its process group) before asserting.
    drop(browser);
    let stats = &server.stats;
    let report = report.unwrap_or_else(|_| panic!("no report from chromium; {stats:?}"));
    assert_eq!(report, format!("ok={sockets}&failed=0"));
    assert_eq!(stats.http2_websockets(), sockets);
    assert_eq!(
        stats.most_websockets_on_a_connection(),
        sockets,
        "every socket a stream of one HTTP/2 connection; {stats:?}"
    );
    assert_eq!(stats.http1_websockets(), 0);
    assert_eq!(stats.http1_connections(), 0);
    eprintln!(
        "chromium: {} WebSockets over {} TCP connections ({} HTTP/2), most on one connection: {}",
        stats.http2_websockets(),
        stats.tcp_connections(),
        stats.http2_connections(),
        stats.most_websockets_on_a_connection()
    );
}

/// Waits for the DATA frame of `stream` that echoes a masked "hi", skipping other frames.
async fn echoed_hi(io: &mut TlsStream<TcpStream>, stream: u32) {
    let masked = [0x81, 0x82, 1, 2, 3, 4, b'h' ^ 1, b'i' ^ 2];
    io.write_all(&frame(DATA, 0, stream, &masked)).await.unwrap();
    loop {
        let (kind, _, on, payload) = read_frame(io).await;
        assert_ne!(kind, GOAWAY, "the connection must go on");
        if kind == DATA && on == stream {
            assert_eq!(payload, [0x81, 0x02, b'h', b'i']);
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_window_never_opens_meets_its_policy_and_its_neighbour_keeps_echoing() {
    tokio::time::timeout(BOUND, async {
        let ca = TestCa::new("h2-window");
        let (report, mut reports) = tokio::sync::mpsc::unbounded_channel::<String>();
        // `/hog`: pushes 4,000-byte messages (as a subscription would) to a reader whose
        // window never opens; its queue may hold 16 KiB, and the `close` policy ends it (1008).
        let hog = Router::new().route(
            "/hog",
            any(move |ws: WebSocketUpgrade| {
                let report = report.clone();
                async move {
                    let marks = freeboard::Watermarks::new(4 << 10, 8 << 10, 16 << 10).unwrap();
                    let config = WsConfig::default()
                        .watermarks(marks)
                        .slow_consumer(freeboard::SlowConsumerPolicy::Close);
                    ws.config(config).on_upgrade(|socket: AxumWebSocket| async move {
                        let message = vec![7u8; 4000];
                        for sent in 0..1000 {
                            if socket.send_binary(&message) == freeboard::SendOutcome::Closed {
                                let _ = report.send(format!("closed by the policy after {sent}"));
                                return;
                            }
                            // Let hyper's connection task move what the window admits.
                            tokio::task::yield_now().await;
                        }
                        let _ = report.send("never closed".into());
                    })
                }
            }),
        );
        let server = start(&ca, Http2Config::default(), hog).await;
        // Every stream's send window is 1 KiB (SETTINGS_INITIAL_WINDOW_SIZE) and only the
        // echo's stream and the connection are ever opened wider.
        let (mut io, _) = raw_http2_with(&ca, server.addr, &[(0x4, 1024)]).await;
        let port = server.addr.port();
        let mut opening = frame(WINDOW_UPDATE, 0, 0, &(8u32 << 20).to_be_bytes());
        opening.extend(frame(HEADERS, END_HEADERS, 1, &extended_connect_to(port, "/hog")));
        opening.extend(frame(HEADERS, END_HEADERS, 3, &extended_connect(port)));
        opening.extend(frame(WINDOW_UPDATE, 0, 3, &(1u32 << 20).to_be_bytes()));
        io.write_all(&opening).await.unwrap();
        let mut answered = 0;
        while answered < 2 {
            if read_frame(&mut io).await.0 == HEADERS {
                answered += 1;
            }
        }
        echoed_hi(&mut io, 3).await;
        let report = tokio::time::timeout(BOUND, reports.recv()).await.unwrap().unwrap();
        // 1 KiB leaves, h2 holds at most `max_send_buffer` (16 KiB), the queue its cap
        // (16 KiB): some 8 messages, then the ninth or so meets the policy.
        let sent: usize = report
            .strip_prefix("closed by the policy after ")
            .unwrap_or_else(|| panic!("{report}"))
            .parse()
            .unwrap();
        assert!((4..=12).contains(&sent), "{report}");
        eprintln!("a reader whose window never opens: {report}");
        // The neighbour on the same connection echoes on.
        echoed_hi(&mut io, 3).await;
        assert_eq!(server.stats.goaways(), 0);
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_closed_and_counted() {
    tokio::time::timeout(BOUND, async {
        let ca = TestCa::new("h2-connections");
        let server = start(&ca, Http2Config::default().max_connections(2), Router::new()).await;
        let endpoint = client_endpoint();
        let config = WsConfig::default();
        let (first, second) =
            (http2_client(&ca, server.addr).await, http2_client(&ca, server.addr).await);
        let mut ws = first.websocket("/echo", &endpoint, &config).await.unwrap();
        // The third TCP connection is closed before its TLS handshake completes.
        let mut third = TcpStream::connect(server.addr).await.unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(third.read(&mut byte).await.unwrap_or(0), 0, "closed at once");
        assert_eq!(server.stats.refused_connections(), 1);
        assert_eq!(server.stats.open_connections(), 2);
        echo_twice(&mut ws, 1).await;
        // A connection that ends makes room for the next.
        drop(ws);
        drop(first);
        drop(second);
        while server.stats.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let client = http2_client(&ca, server.addr).await;
        let mut ws = client.websocket("/echo", &endpoint, &config).await.unwrap();
        echo_twice(&mut ws, 2).await;
    })
    .await
    .expect("bounded");
}

/// Waits until `holds`: the server counts a frame once its write returns, which may be after
/// the client has read it, and a session once its task starts, which may be after its `200`.
/// A count that has not arrived in 10 s fails the test rather than hang it.
async fn until(holds: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !holds() {
        assert!(std::time::Instant::now() < deadline, "the server's count did not arrive in 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An HPACK integer with an `n`-bit prefix under the bits `flags` (RFC 7541 §5.1).
fn hpack_int(flags: u8, n: u32, value: usize) -> Vec<u8> {
    let max = (1usize << n) - 1;
    if value < max {
        return vec![flags | value as u8];
    }
    let (mut out, mut rest) = (vec![flags | max as u8], value - max);
    while rest >= 128 {
        out.push(0x80 | (rest % 128) as u8);
        rest /= 128;
    }
    out.push(rest as u8);
    out
}

/// Reads frames until one satisfies `wanted` (kind, flags, stream, payload), and returns it.
async fn next_of<R: AsyncRead + Unpin>(
    io: &mut R,
    wanted: impl Fn(u8, u8, u32, &[u8]) -> bool,
) -> (u8, u8, u32, Vec<u8>) {
    loop {
        let (kind, flags, stream, payload) = read_frame(io).await;
        if wanted(kind, flags, stream, &payload) {
            return (kind, flags, stream, payload);
        }
    }
}

/// The code of a `GOAWAY` (its second word) or `RST_STREAM` (its only word).
fn error_code(kind: u8, payload: &[u8]) -> u32 {
    let at = if kind == GOAWAY { 4 } else { 0 };
    u32::from_be_bytes(payload[at..at + 4].try_into().unwrap())
}

/// Reads frames up to the `GOAWAY` and returns its error code.
async fn goaway(io: &mut TlsStream<TcpStream>) -> u32 {
    let (kind, _, _, payload) = next_of(io, |kind, _, _, _| kind == GOAWAY).await;
    error_code(kind, &payload)
}

/// Opens `streams` as extended CONNECTs to `path` and waits for each `200`.
async fn open_streams(io: &mut TlsStream<TcpStream>, port: u16, path: &str, streams: &[u32]) {
    let mut requests = Vec::new();
    for &stream in streams {
        requests.extend(frame(HEADERS, END_HEADERS, stream, &extended_connect_to(port, path)));
    }
    io.write_all(&requests).await.unwrap();
    for _ in streams {
        let (_, _, stream, payload) = next_of(io, |kind, _, _, _| {
            assert_ne!(kind, GOAWAY);
            kind == HEADERS
        })
        .await;
        // `:status 200`, indexed (RFC 7541 Appendix A: entry 8).
        assert_eq!(payload.first(), Some(&0x88), "stream {stream} answered 200");
    }
}

/// GETs `/metrics` over HTTP/2, as a scraper would.
async fn scrape(ca: &TestCa, addr: SocketAddr) -> String {
    let io = hyper_util::rt::TokioIo::new(tls(ca, addr, b"h2").await);
    let (mut send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake::<_, Body>(io)
            .await
            .unwrap();
    tokio::spawn(conn);
    let uri = format!("https://localhost:{}/metrics", addr.port());
    let response = send.send_request(Request::get(uri).body(Body::empty()).unwrap()).await;
    let response = response.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = axum::body::to_bytes(Body::new(response.into_body()), 1 << 20).await.unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

/// The value of `series` (name and labels, as exposed) in a scraped `text`.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_settings_floods_are_answered_in_order_while_the_streams_beside_them_echo() {
    tokio::time::timeout(BOUND, async {
        let ca = TestCa::new("h2-ping");
        let server = start(&ca, Http2Config::default(), Router::new()).await;
        let (client, endpoint) = (http2_client(&ca, server.addr).await, client_endpoint());
        let innocent = client.websocket("/echo", &endpoint, &WsConfig::default()).await;
        let mut innocent = innocent.unwrap();
        echo_twice(&mut innocent, 0).await;

        // The attacker's own WebSocket, then 20,000 PINGs and 2,000 SETTINGS (each changing
        // every stream's send window) in one burst, and a message on its stream after them.
        let (mut io, _) = raw_http2(&ca, server.addr).await;
        open_streams(&mut io, server.addr.port(), "/echo", &[1]).await;
        let settings_before = server.stats.settings_acks();
        let (pings, settings) = (20_000u64, 2_000u64);
        let mut burst = Vec::new();
        for n in 0..pings {
            burst.extend(frame(PING, 0, 0, &n.to_be_bytes()));
            if n % 10 == 0 {
                let window: u32 = if n % 20 == 0 { 65_535 } else { 1 << 20 };
                burst.extend(frame(SETTINGS, 0, 0, &[&[0, 4][..], &window.to_be_bytes()].concat()));
            }
        }
        burst.extend(frame(DATA, 0, 1, &[0x81, 0x82, 1, 2, 3, 4, b'h' ^ 1, b'i' ^ 2]));
        let (mut rx, mut tx) = tokio::io::split(io);
        // Read while writing: a peer that stops reading is not read either (h2 writes one
        // PING's answer before it reads the next frame).
        let reader = tokio::spawn(async move {
            let (mut ping_acks, mut settings_acks, mut echoed) = (0u64, 0u64, false);
            while ping_acks < pings || settings_acks < settings || !echoed {
                let (kind, flags, stream, payload) = read_frame(&mut rx).await;
                match kind {
                    PING if flags & ACK != 0 => {
                        let n = u64::from_be_bytes(payload[..8].try_into().unwrap());
                        assert_eq!(n, ping_acks, "each PING answered once, in order");
                        ping_acks += 1;
                    }
                    SETTINGS if flags & ACK != 0 => settings_acks += 1,
                    DATA if stream == 1 => {
                        assert_eq!(payload, [0x81, 0x02, b'h', b'i']);
                        echoed = true;
                    }
                    GOAWAY => panic!("GOAWAY {}", error_code(kind, &payload)),
                    _ => {}
                }
            }
            rx
        });
        tx.write_all(&burst).await.unwrap();
        let mut io = reader.await.unwrap().unsplit(tx);
        until(|| server.stats.ping_acks() == pings).await;
        until(|| server.stats.settings_acks() - settings_before == settings).await;
        assert_eq!(server.stats.goaways(), 0);
        echoed_hi(&mut io, 1).await;
        echo_twice(&mut innocent, 1).await;

        let text = scrape(&ca, server.addr).await;
        assert_eq!(sample(&text, "freeboard_http2_ping_acks_total"), pings);
        assert_eq!(sample(&text, "freeboard_http2_open_websockets"), 2, "{text}");
        assert_eq!(sample(&text, "freeboard_https_websockets_total{protocol=\"h2\"}"), 2);
        assert_eq!(sample(&text, "freeboard_https_connections_total{protocol=\"h2\"}"), 3);
        assert_eq!(sample(&text, "freeboard_http2_goaways_total{code=\"NO_ERROR\"}"), 0);
    })
    .await
    .expect("bounded");
}

/// A header block that adds a 4,000-byte field to the HPACK dynamic table (RFC 7541 §6.2.1)
/// after an extended CONNECT's fields, then names it again `references` times with one
/// byte each (§6.1: index 62, the newest entry).
fn hpack_bomb(port: u16, references: usize) -> Vec<u8> {
    let mut block = extended_connect(port);
    block.push(0x40);
    block.extend(hpack_int(0, 7, 6));
    block.extend_from_slice(b"x-bomb");
    block.extend(hpack_int(0, 7, 4000));
    block.extend(std::iter::repeat_n(b'b', 4000));
    block.extend(std::iter::repeat_n(0x80 | 62, references));
    block
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hpack_bombs_and_a_table_past_the_advertised_size_meet_431_or_goaway() {
    tokio::time::timeout(BOUND, async {
        let ca = TestCa::new("h2-hpack");
        let server = start(&ca, Http2Config::default(), Router::new()).await;
        let port = server.addr.port();
        let (client, endpoint) = (http2_client(&ca, server.addr).await, client_endpoint());
        let innocent = client.websocket("/echo", &endpoint, &WsConfig::default()).await;
        let mut innocent = innocent.unwrap();

        // 4 KiB sent that decode to 20 KiB, past the 16 KiB header list size: the request is
        // answered 431 and its stream reset; the connection and its other streams go on.
        let (mut io, _) = raw_http2(&ca, server.addr).await;
        open_streams(&mut io, port, "/echo", &[1]).await;
        io.write_all(&frame(HEADERS, END_HEADERS, 3, &hpack_bomb(port, 4))).await.unwrap();
        let (_, flags, _, status) =
            next_of(&mut io, |kind, _, stream, _| kind == HEADERS && stream == 3).await;
        assert_eq!(flags & END_STREAM, END_STREAM, "the answer ends the stream");
        // `:status` (static name 8, incremental indexing: RFC 7541 §6.2.1), "431" Huffman-coded
        // in 3 bytes (Appendix B: '4' 011010, '3' 011001, '1' 00001, then EOS padding).
        assert_eq!(status, [0x48, 0x83, 0x69, 0x90, 0xff], ":status 431");
        let (kind, _, _, reset) = next_of(&mut io, |kind, _, stream, _| {
            assert_ne!(kind, GOAWAY);
            kind == RST_STREAM && stream == 3
        })
        .await;
        assert_eq!(error_code(kind, &reset), PROTOCOL_ERROR);
        until(|| server.stats.resets_with(PROTOCOL_ERROR) == 1).await;
        echoed_hi(&mut io, 1).await;

        // 100 more bytes that would decode to 400 KB, past 4 times the list size: h2 stops
        // decoding and ends the connection with GOAWAY ENHANCE_YOUR_CALM.
        let references = frame(HEADERS, END_HEADERS, 5, &{
            let mut block = extended_connect(port);
            block.extend(std::iter::repeat_n(0x80 | 62, 100));
            block
        });
        io.write_all(&references).await.unwrap();
        assert_eq!(goaway(&mut io).await, ENHANCE_YOUR_CALM);
        until(|| server.stats.goaways_with(ENHANCE_YOUR_CALM) == 1).await;

        // A dynamic table size update past the 4,096 bytes the server advertised (RFC 7541
        // §4.2: "MUST be treated as a decoding error"): the connection ends.
        let (mut io, _) = raw_http2(&ca, server.addr).await;
        let mut block = hpack_int(0x20, 5, 1 << 20);
        block.extend(extended_connect(port));
        io.write_all(&frame(HEADERS, END_HEADERS, 1, &block)).await.unwrap();
        // RFC 9113 §4.3 names this COMPRESSION_ERROR; h2 0.4 sends PROTOCOL_ERROR for every
        // HPACK decoding error (its `framed_read.rs`). Either ends the connection.
        let code = goaway(&mut io).await;
        assert_eq!(code, PROTOCOL_ERROR);
        until(|| server.stats.goaways_with(code) == 1).await;
        until(|| server.stats.goaway_errors() == 2).await;

        echo_twice(&mut innocent, 1).await;
        let text = scrape(&ca, server.addr).await;
        let code = ERROR_CODES[code as usize];
        assert_eq!(sample(&text, &format!("freeboard_http2_goaways_total{{code=\"{code}\"}}")), 1);
        assert_eq!(sample(&text, "freeboard_http2_goaways_total{code=\"ENHANCE_YOUR_CALM\"}"), 1);
        assert_eq!(
            sample(&text, "freeboard_http2_stream_resets_total{code=\"PROTOCOL_ERROR\"}"),
            1
        );
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_past_a_window_and_reset_floods_meet_their_errors_while_the_streams_beside_echo() {
    tokio::time::timeout(BOUND, async {
        let ca = TestCa::new("h2-window-abuse");
        // `/sink`: a WebSocket whose handler never reads, so the stream's window never reopens.
        let sink = Router::new().route(
            "/sink",
            any(|ws: WebSocketUpgrade| async move {
                ws.on_upgrade(|socket: AxumWebSocket| async move {
                    tokio::time::sleep(BOUND).await;
                    drop(socket);
                })
            }),
        );
        let server = start(&ca, Http2Config::default(), sink).await;
        let port = server.addr.port();
        let (client, endpoint) = (http2_client(&ca, server.addr).await, client_endpoint());
        let innocent = client.websocket("/echo", &endpoint, &WsConfig::default()).await;
        let mut innocent = innocent.unwrap();

        // 80,000 bytes on a stream whose window is 64 KiB (RFC 9113 §6.9.1: "A sender MUST
        // NOT send a flow-controlled frame with a length that exceeds the space available"):
        // the stream is reset with FLOW_CONTROL_ERROR, its neighbour echoes on.
        let (mut io, _) = raw_http2(&ca, server.addr).await;
        open_streams(&mut io, port, "/sink", &[1]).await;
        open_streams(&mut io, port, "/echo", &[3]).await;
        let mut data = Vec::new();
        for _ in 0..5 {
            data.extend(frame(DATA, 0, 1, &[0u8; 16_000]));
        }
        io.write_all(&data).await.unwrap();
        let (kind, _, _, reset) = next_of(&mut io, |kind, _, stream, _| {
            assert_ne!(kind, GOAWAY);
            kind == RST_STREAM && stream == 1
        })
        .await;
        assert_eq!(error_code(kind, &reset), FLOW_CONTROL_ERROR);
        until(|| server.stats.resets_with(FLOW_CONTROL_ERROR) == 1).await;
        echoed_hi(&mut io, 3).await;

        // 10,000 RST_STREAMs for the stream the server reset: ignored (RFC 9113 §5.1, closed:
        // "An endpoint MUST ignore frames that it receives on closed streams after it has
        // sent a RST_STREAM frame").
        let stray: Vec<u8> =
            (0..10_000).flat_map(|_| frame(RST_STREAM, 0, 1, &CANCEL.to_be_bytes())).collect();
        io.write_all(&stray).await.unwrap();
        echoed_hi(&mut io, 3).await;

        // Twenty WebSockets opened, then reset by the client: each session ends and gives its
        // stream back; no GOAWAY (they were accepted, so this is not rapid reset).
        let opened: Vec<u32> = (0..20).map(|n| 5 + 2 * n).collect();
        open_streams(&mut io, port, "/echo", &opened).await;
        // The innocent, stream 3 and the sink's session (still running) beside them.
        until(|| server.stats.open_http2_websockets() == 23).await;
        let resets: Vec<u8> =
            opened.iter().flat_map(|&n| frame(RST_STREAM, 0, n, &CANCEL.to_be_bytes())).collect();
        io.write_all(&resets).await.unwrap();
        while server.stats.open_http2_websockets() > 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        echoed_hi(&mut io, 3).await;

        // Past the connection's window (256 KiB) over five streams that are never read: the
        // connection ends with GOAWAY FLOW_CONTROL_ERROR.
        let sinks: Vec<u32> = (0..5).map(|n| 45 + 2 * n).collect();
        open_streams(&mut io, port, "/sink", &sinks).await;
        let mut data = Vec::new();
        for &stream in &sinks {
            for _ in 0..4 {
                data.extend(frame(DATA, 0, stream, &[0u8; 15_000]));
            }
        }
        let _ = io.write_all(&data).await;
        assert_eq!(goaway(&mut io).await, FLOW_CONTROL_ERROR);

        // A RST_STREAM for a stream never opened (RFC 9113 §6.4: "MUST treat this as a
        // connection error ... of type PROTOCOL_ERROR").
        let (mut io, _) = raw_http2(&ca, server.addr).await;
        io.write_all(&frame(RST_STREAM, 0, 7, &CANCEL.to_be_bytes())).await.unwrap();
        assert_eq!(goaway(&mut io).await, PROTOCOL_ERROR);

        until(|| server.stats.goaways_with(PROTOCOL_ERROR) == 1).await;
        until(|| server.stats.goaways_with(FLOW_CONTROL_ERROR) == 1).await;
        echo_twice(&mut innocent, 1).await;
        let text = scrape(&ca, server.addr).await;
        for (series, value) in [
            ("freeboard_http2_goaways_total{code=\"FLOW_CONTROL_ERROR\"}", 1),
            ("freeboard_http2_goaways_total{code=\"PROTOCOL_ERROR\"}", 1),
            ("freeboard_http2_stream_resets_total{code=\"FLOW_CONTROL_ERROR\"}", 1),
            ("freeboard_http2_stream_resets_total{code=\"CANCEL\"}", 0),
        ] {
            assert_eq!(sample(&text, series), value, "{series}\n{text}");
        }
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_that_covers_n_http2_connections_refuses_the_next_until_one_ends() {
    tokio::time::timeout(BOUND, async {
        let ca = TestCa::new("h2-budget");
        let config = Http2Config::default()
            .max_concurrent_streams(4)
            .max_header_list_size(4 << 10)
            .windows(16 << 10, 32 << 10)
            .max_send_buffer(8 << 10);
        // 32 KiB + 4 × (8 + 4 + 2) KiB + 4 KiB + 40 KiB.
        assert_eq!(config.connection_charge(), 132 << 10);
        let reserve = 16 << 10;
        let endpoint_config = EndpointConfig::default().memory(1 << 20).connection_reserve(reserve);
        let endpoint = Endpoint::new(endpoint_config).expect("a budget");
        let counters = endpoint.counters();
        let (chunk, free) = (counters.chunk_size, counters.chunks_total - counters.chunks_in_use);
        let charge = config.connection_charge().div_ceil(chunk);
        // What the budget covers, leaving a connection's reserve for the WebSockets (the
        // endpoint admits a charge only so).
        let n = (free - reserve / chunk) / charge;
        assert!((2..20).contains(&n), "{n} connections from {free} chunks");
        let server = start_on(&ca, config, Router::new(), Arc::clone(&endpoint), true).await;
        let (client_endpoint, ws_config) = (client_endpoint(), WsConfig::default());
        let mut admitted = Vec::new();
        for _ in 0..n {
            admitted.push(http2_client(&ca, server.addr).await);
        }
        // Each is charged before the server's SETTINGS leave, so before the handshake ends.
        assert_eq!(endpoint.chunks_charged(), n * charge);
        // Once admitted, a connection serves its WebSockets from what is left.
        let mut ws = admitted[0].websocket("/echo", &client_endpoint, &ws_config).await.unwrap();
        echo_twice(&mut ws, 0).await;

        // The next one: the server's preface, then GOAWAY REFUSED_STREAM with last stream 0.
        let (mut io, settings) = raw_http2(&ca, server.addr).await;
        assert!(settings.is_empty(), "an empty SETTINGS: {settings:?}");
        let (kind, _, _, payload) = next_of(&mut io, |kind, _, _, _| kind == GOAWAY).await;
        assert_eq!(payload[..4], [0, 0, 0, 0], "no stream processed");
        assert_eq!(error_code(kind, &payload), REFUSED_STREAM);
        let mut rest = Vec::new();
        let _ = io.read_to_end(&mut rest).await;
        assert_eq!(server.stats.unaffordable_connections(), 1);
        until(|| server.stats.goaways_with(REFUSED_STREAM) == 1).await;
        assert_eq!(endpoint.chunks_charged(), n * charge, "a refused connection holds nothing");

        // One ends: its charge comes back and the next connection is admitted.
        admitted.pop();
        while endpoint.chunks_charged() > (n - 1) * charge {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let text = scrape(&ca, server.addr).await;
        assert_eq!(
            sample(&text, "freeboard_https_refused_connections_total{reason=\"memory\"}"),
            1
        );
        echo_twice(&mut ws, 1).await;
        drop((ws, admitted));
        while endpoint.chunks_charged() > 0 || server.stats.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(endpoint.counters().chunks_in_use, counters.chunks_in_use);
    })
    .await
    .expect("bounded");
}
