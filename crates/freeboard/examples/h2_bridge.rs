//! A bridge from WebSockets over HTTP/1.1 to WebSockets over HTTP/2 (RFC 8441): every TCP
//! connection accepted on `LISTEN` becomes one extended-CONNECT stream of a single HTTP/2
//! connection to `UPSTREAM` (TLS, ALPN `h2`, its certificate checked against `CA_FILE`), so
//! that a client that speaks only HTTP/1.1 — the Autobahn fuzzing client, kosoku — drives a
//! server's WebSockets over HTTP/2 (`conformance/run --h2`).
//!
//! ```sh
//! cargo run --release -p freeboard --features http2 --example h2_bridge -- \
//!     127.0.0.1:9001 127.0.0.1:8443 cert.pem
//! ```
//!
//! The bridge answers the HTTP/1.1 upgrade itself (RFC 6455 §4.2.2: the `101` with
//! `Sec-WebSocket-Accept`) once the server has answered the stream's `CONNECT` with `200`, and
//! from then on moves the session's bytes verbatim in both directions: the WebSocket frames,
//! masking and closing handshake are the two ends' business. HTTP/2 flow control holds both
//! ways: bytes go to the server only as the stream's send window admits them, and the window
//! of what the server sends is opened again only once the client's socket took the bytes.
//! The end of the stream (`END_STREAM`, or `RST_STREAM`) closes the TCP connection after the
//! bytes before it, and the end of the TCP connection ends the stream — RFC 8441 §5: "The
//! HTTP/2 stream closure is also analogous to the TCP connection closure of [RFC6455].
//! Orderly TCP-level closures are represented as END_STREAM flags".
//!
//! All streams share one HTTP/2 connection, opened at start: concurrent cases are then
//! concurrent streams, which is what RFC 8441 is for and what a browser does. If that
//! connection ends, the bridge answers every later upgrade `502` rather than open another, so
//! a server that ends the connection for one stream's fault fails the run visibly. Each time
//! more streams are open at once than ever before, the bridge says so on stderr.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::{RecvStream, SendStream};
use http::{Method, Request, Response};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

/// The largest HTTP/1.1 upgrade request read.
const MAX_REQUEST_HEAD: usize = 16 << 10;
/// How long the upgrade request, the server's SETTINGS and its answer to a CONNECT may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one side may stay open after the other ended: the server's answer to the
/// client's end, or the client's close after the server's.
const LINGER: Duration = Duration::from_secs(10);
/// The bytes read from the client at a time (at most one DATA frame of the default size).
const READ_CHUNK: usize = 16 << 10;
/// This side's flow-control windows: what the server may send before the bridge wrote it on.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 4 << 20;

/// Streams open now, and the most ever open at once.
static OPEN_STREAMS: AtomicUsize = AtomicUsize::new(0);
static MOST_OPEN_STREAMS: AtomicUsize = AtomicUsize::new(0);

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream), Some(ca)) = (args.next(), args.next(), args.next()) else {
        eprintln!("usage: h2_bridge LISTEN UPSTREAM CA_FILE [SERVER_NAME]");
        return ExitCode::from(2);
    };
    let name = args.next().unwrap_or_else(|| "localhost".into());
    match run(&listen, &upstream, &ca, &name).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("h2_bridge: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(listen: &str, upstream: &str, ca: &str, name: &str) -> Result<(), String> {
    let upstream: SocketAddr = upstream.parse().map_err(|e| format!("{upstream}: {e}"))?;
    let send = connect(upstream, ca, name).await?;
    let authority = Arc::<str>::from(format!("{name}:{}", upstream.port()));
    let listener = TcpListener::bind(listen).await.map_err(|e| format!("{listen}: {e}"))?;
    println!("bridging ws://{} to https://{authority} over HTTP/2", listener.local_addr().unwrap());
    loop {
        let (tcp, _) = listener.accept().await.map_err(|e| format!("accept: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let (send, authority) = (send.clone(), authority.clone());
        tokio::spawn(async move {
            if let Err(e) = bridge(tcp, send, &authority).await {
                eprintln!("h2_bridge: {e}");
            }
        });
    }
}

/// The HTTP/2 connection: TLS with ALPN `h2`, the preface, and the server's SETTINGS, which
/// must enable extended CONNECT (RFC 8441 §3) before a stream may use it.
async fn connect(upstream: SocketAddr, ca: &str, name: &str) -> Result<SendRequest<Bytes>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| format!("{ca}: {e}"))? {
        roots.add(cert.map_err(|e| format!("{ca}: {e}"))?).map_err(|e| format!("{ca}: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(upstream).await.map_err(|e| format!("{upstream}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let server_name = ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(server_name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
        return Err(format!("{upstream} did not agree on h2 by ALPN"));
    }
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake::<_, Bytes>(tls)
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    tokio::spawn(async move {
        match connection.await {
            Ok(()) => eprintln!("h2_bridge: the HTTP/2 connection ended"),
            Err(e) => eprintln!("h2_bridge: the HTTP/2 connection failed: {e}"),
        }
    });
    // The connection's task reads the SETTINGS and wakes nobody here: look every millisecond.
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    while !send.is_extended_connect_protocol_enabled() {
        if tokio::time::Instant::now() >= deadline {
            return Err("the server did not enable extended CONNECT (RFC 8441 §3)".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(send)
}

/// One client connection: its upgrade request, the stream's CONNECT, and the two pipes.
async fn bridge(
    mut tcp: TcpStream,
    send: SendRequest<Bytes>,
    authority: &str,
) -> Result<(), String> {
    let mut head = Vec::with_capacity(1024);
    let (request, consumed, key) = match tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        read_upgrade(&mut tcp, &mut head, authority),
    )
    .await
    {
        Err(_) => return Err("no upgrade request within the timeout".into()),
        Ok(Err(Refusal { status, reason, extra })) => {
            let answer = format!(
                "HTTP/1.1 {status} {reason}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = tcp.write_all(answer.as_bytes()).await;
            return Err(format!("refused an upgrade: {status} {reason}"));
        }
        Ok(Ok(parts)) => parts,
    };
    let opened = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut send = send.ready().await.map_err(|e| format!("HTTP/2: {e}"))?;
        let (response, stream) =
            send.send_request(request, false).map_err(|e| format!("CONNECT: {e}"))?;
        let response = response.await.map_err(|e| format!("CONNECT: {e}"))?;
        Ok::<_, String>((response, stream))
    })
    .await
    .unwrap_or_else(|_| Err("no answer to the CONNECT within the timeout".into()));
    let (response, upstream) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            let _ = tcp
                .write_all(
                    b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await;
            return Err(e);
        }
    };
    if response.status() != http::StatusCode::OK {
        // The server's refusal (503 when its budget is full, 400, 404…) goes to the client as is.
        let status = response.status();
        let mut answer =
            format!("HTTP/1.1 {} {}\r\n", status.as_u16(), status.canonical_reason().unwrap_or(""));
        if let Some(retry) = response.headers().get(http::header::RETRY_AFTER) {
            answer += &format!("Retry-After: {}\r\n", retry.to_str().unwrap_or("1"));
        }
        answer += "Content-Length: 0\r\nConnection: close\r\n\r\n";
        let _ = tcp.write_all(answer.as_bytes()).await;
        return Err(format!("the server answered the CONNECT {status}"));
    }
    let answer = switching_protocols(&key, &response);
    tcp.write_all(answer.as_bytes()).await.map_err(|e| format!("client: {e}"))?;
    let open = OPEN_STREAMS.fetch_add(1, Ordering::Relaxed) + 1;
    if MOST_OPEN_STREAMS.fetch_max(open, Ordering::Relaxed) < open {
        eprintln!("h2_bridge: {open} streams open at once on the HTTP/2 connection");
    }
    let early = Bytes::copy_from_slice(&head[consumed..]);
    let (reader, writer) = tcp.into_split();
    let (receive, send_stream) = (response.into_body(), upstream);
    let mut up = std::pin::pin!(client_to_server(reader, early, send_stream));
    let mut down = std::pin::pin!(server_to_client(receive, writer));
    // Whichever side ends first, the other has LINGER to follow; then both are dropped (a
    // stream still open is reset, CANCEL, as its last handle goes).
    tokio::select! {
        () = &mut up => { let _ = tokio::time::timeout(LINGER, down).await; }
        () = &mut down => { let _ = tokio::time::timeout(LINGER, up).await; }
    }
    OPEN_STREAMS.fetch_sub(1, Ordering::Relaxed);
    Ok(())
}

/// Why the bridge answers an upgrade request itself instead of opening a stream.
struct Refusal {
    status: u16,
    reason: &'static str,
    /// Header lines to add, each ending in CRLF.
    extra: &'static str,
}

impl Refusal {
    fn bad_request() -> Self {
        Refusal { status: 400, reason: "Bad Request", extra: "" }
    }
}

/// Reads the HTTP/1.1 upgrade request into `head` and checks it (RFC 6455 §4.2.1): the
/// extended CONNECT that stands for it, how many bytes of `head` it took, and its key.
async fn read_upgrade(
    tcp: &mut TcpStream,
    head: &mut Vec<u8>,
    authority: &str,
) -> Result<(Request<()>, usize, String), Refusal> {
    loop {
        let start = head.len();
        head.resize(start + 1024, 0);
        let n = tcp.read(&mut head[start..]).await.map_err(|_| Refusal::bad_request())?;
        head.truncate(start + n);
        if n == 0 {
            return Err(Refusal::bad_request());
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(head) {
            Ok(httparse::Status::Partial) if head.len() < MAX_REQUEST_HEAD => continue,
            Ok(httparse::Status::Partial) => {
                return Err(Refusal {
                    status: 431,
                    reason: "Request Header Fields Too Large",
                    extra: "",
                });
            }
            Err(_) => return Err(Refusal::bad_request()),
            Ok(httparse::Status::Complete(consumed)) => {
                let (request, key) = connect_for(&parsed, authority)?;
                return Ok((request, consumed, key));
            }
        }
    }
}

/// The extended CONNECT (RFC 8441 §4-5) that opens the stream for an HTTP/1.1 upgrade request.
fn connect_for(
    parsed: &httparse::Request<'_, '_>,
    authority: &str,
) -> Result<(Request<()>, String), Refusal> {
    let header = |name: &str| {
        parsed
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
    };
    let has_token = |name: &str, token: &str| {
        header(name).is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    };
    // RFC 6455 §4.2.1: "An HTTP/1.1 or higher GET request", with "An |Upgrade| header field
    // containing the value "websocket"" and "A |Connection| header field that includes the
    // token "Upgrade"".
    if parsed.method != Some("GET")
        || !has_token("upgrade", "websocket")
        || !has_token("connection", "upgrade")
    {
        return Err(Refusal::bad_request());
    }
    // §4.2.1 item 5: a |Sec-WebSocket-Key| "that, when decoded, is 16 bytes in length".
    let key = header("sec-websocket-key").map(str::trim).ok_or_else(Refusal::bad_request)?;
    use base64::Engine as _;
    match base64::engine::general_purpose::STANDARD.decode(key) {
        Ok(nonce) if nonce.len() == 16 => {}
        _ => return Err(Refusal::bad_request()),
    }
    // §4.2.2: a version the server does not speak is answered 426 with the one it does.
    if header("sec-websocket-version").map(str::trim) != Some("13") {
        return Err(Refusal {
            status: 426,
            reason: "Upgrade Required",
            extra: "Sec-WebSocket-Version: 13\r\n",
        });
    }
    let path = parsed.path.unwrap_or("/");
    let mut request = Request::builder()
        .method(Method::CONNECT)
        .uri(format!("https://{authority}{path}"))
        .extension(h2::ext::Protocol::from_static("websocket"))
        // RFC 8441 §5: the version header stays, and the key (and so the accept) goes.
        .header(http::header::SEC_WEBSOCKET_VERSION, "13");
    for name in [
        http::header::SEC_WEBSOCKET_PROTOCOL,
        http::header::SEC_WEBSOCKET_EXTENSIONS,
        http::header::ORIGIN,
    ] {
        if let Some(value) = header(name.as_str()) {
            request = request.header(name, value);
        }
    }
    let request = request.body(()).map_err(|_| Refusal::bad_request())?;
    Ok((request, key.to_owned()))
}

/// The `101` for the client (RFC 6455 §4.2.2), carrying what the server chose.
fn switching_protocols(key: &str, response: &Response<RecvStream>) -> String {
    let accept = freeboard_proto::handshake::accept_key(key.as_bytes());
    // NOTE(unwrap): base64 is ASCII.
    let accept = std::str::from_utf8(&accept).unwrap();
    let mut answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n"
    );
    for name in [http::header::SEC_WEBSOCKET_PROTOCOL, http::header::SEC_WEBSOCKET_EXTENSIONS] {
        if let Some(value) = response.headers().get(&name).and_then(|v| v.to_str().ok()) {
            answer += &format!("{name}: {value}\r\n");
        }
    }
    answer + "\r\n"
}

/// Client to server: each read goes out as DATA as the stream's send window admits it (h2's
/// `send_data` would otherwise buffer without bound); the client's FIN ends the stream. Once
/// the stream can take no more, what the client still sends is read and dropped, so that its
/// socket is closed with nothing unread (a close with unread bytes is a reset, which could
/// destroy what the server sent last before the client read it).
async fn client_to_server(mut reader: OwnedReadHalf, early: Bytes, mut stream: SendStream<Bytes>) {
    let mut buf = vec![0; READ_CHUNK];
    let mut data = early;
    let mut open = true;
    loop {
        while open && !data.is_empty() {
            stream.reserve_capacity(data.len());
            match poll_fn(|cx| stream.poll_capacity(cx)).await {
                Some(Ok(capacity)) if capacity > 0 => {
                    let chunk = data.split_to(capacity.min(data.len()));
                    open = stream.send_data(chunk, false).is_ok();
                }
                Some(Ok(_)) => {}
                None | Some(Err(_)) => open = false,
            }
        }
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) if open => data = Bytes::copy_from_slice(&buf[..n]),
            Ok(_) => {}
        }
    }
    if open {
        // An empty DATA frame with END_STREAM: the client's FIN (RFC 8441 §5).
        let _ = stream.send_data(Bytes::new(), true);
    }
}

/// Server to client: each DATA frame is written to the client, and only then is its window
/// opened again; the stream's end (END_STREAM, or RST_STREAM) closes the client's socket
/// after the bytes before it (FIN).
async fn server_to_client(mut stream: RecvStream, mut writer: OwnedWriteHalf) {
    while let Some(chunk) = stream.data().await {
        let Ok(chunk) = chunk else { break };
        if writer.write_all(&chunk).await.is_err() {
            return;
        }
        let _ = stream.flow_control().release_capacity(chunk.len());
    }
    let _ = writer.shutdown().await;
}
