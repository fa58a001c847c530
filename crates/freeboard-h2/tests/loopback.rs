//! The core against real peers over loopback TCP: the `h2` crate's client (extended CONNECT,
//! DATA both ways, several streams, transfers far past every window, a GET) and curl.
//!
//! The server side is a tiny blocking driver: read, `receive` until quiet, act on events,
//! write what is owed. Each WebSocket stream echoes; its input is consumed (reopening the
//! client's windows) only as the echo goes out, so a client that stops reading stops
//! being read.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use freeboard_h2::{Config, Connection, Counters, Event, StreamId};

const PAGE: &[u8] = b"hello over HTTP/2\n";

#[derive(Default)]
struct StreamApp {
    /// Received and not yet echoed (consumed once echoed).
    echo: Vec<u8>,
    peer_ended: bool,
    websocket: bool,
    /// A GET's body still to send.
    body: Vec<u8>,
}

/// Serves one connection until the peer closes it or the connection is done.
fn serve(mut socket: TcpStream, config: Config) -> Counters {
    socket.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    socket.set_nodelay(true).unwrap();
    let mut conn = Connection::new(config);
    let mut apps: HashMap<StreamId, StreamApp> = HashMap::new();
    let mut buf = vec![0u8; 64 << 10];
    assert!(buf.len() >= config.min_read_buffer());
    let mut held = 0;
    loop {
        flush(&mut conn, &mut apps, &mut socket);
        if conn.is_done() {
            break;
        }
        let n = match socket.read(&mut buf[held..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        held += n;
        let mut at = 0;
        // A connection error queued GOAWAY; `flush` writes it and `is_done` ends the loop.
        while let Ok(received) = conn.receive(&buf[at..held]) {
            at += received.consumed;
            let Some(event) = received.event else {
                if received.consumed == 0 || at == held {
                    break;
                }
                continue;
            };
            match event {
                Event::WebSocket { stream, request } => {
                    assert_eq!(request.path(), Some(&b"/echo"[..]));
                    assert_eq!(request.header(b"sec-websocket-version"), Some(&b"13"[..]));
                    apps.insert(stream, StreamApp { websocket: true, ..StreamApp::default() });
                    conn.respond(stream, 200, &[], false).unwrap();
                }
                Event::Request { stream, request, .. } => {
                    let found = request.method() == b"GET" && request.path() == Some(b"/hello");
                    let body = if found { PAGE.to_vec() } else { b"not found\n".to_vec() };
                    let length = body.len().to_string();
                    let headers: [(&[u8], &[u8]); 2] =
                        [(b"content-type", b"text/plain"), (b"content-length", length.as_bytes())];
                    conn.respond(stream, if found { 200 } else { 404 }, &headers, false).unwrap();
                    apps.insert(
                        stream,
                        StreamApp { body, peer_ended: true, ..StreamApp::default() },
                    );
                }
                Event::Data { stream, data, end_stream } => {
                    let app = apps.get_mut(&stream).unwrap();
                    app.echo.extend_from_slice(data);
                    app.peer_ended |= end_stream;
                    // What is received and not consumed never passes the stream's window
                    // (65,535 until our SETTINGS are acknowledged).
                    let window = config.initial_stream_window.max(65_535) as usize;
                    assert!(app.echo.len() <= window, "{} unconsumed", app.echo.len());
                }
                Event::Reset { stream, .. } => {
                    apps.remove(&stream);
                }
                Event::GoAway { .. } => {}
            }
        }
        buf.copy_within(at..held, 0);
        held -= at;
    }
    *conn.counters()
}

/// Writes what the connection owes and whatever DATA the windows allow.
fn flush(conn: &mut Connection, apps: &mut HashMap<StreamId, StreamApp>, socket: &mut TcpStream) {
    let mut out = Vec::new();
    let take = |conn: &mut Connection, out: &mut Vec<u8>| {
        out.extend_from_slice(conn.transmit_buffer());
        let n = conn.transmit_buffer().len();
        conn.advance_transmit(n);
    };
    take(conn, &mut out);
    while conn.poll_writable().is_some() {}
    let mut done = Vec::new();
    for (&stream, app) in apps.iter_mut() {
        let pending = if app.websocket { &mut app.echo } else { &mut app.body };
        while !pending.is_empty() {
            let capacity = conn.send_capacity(stream).unwrap();
            if capacity == 0 {
                break;
            }
            let n = capacity.min(pending.len());
            let mut header = [0u8; 9];
            let end = !app.websocket && n == pending.len();
            conn.send_data_header(stream, n, end, &mut header).unwrap();
            out.extend_from_slice(&header);
            out.extend(pending.drain(..n));
            if app.websocket {
                // Echoed: now the client may send as much again.
                conn.consume(stream, n).unwrap();
            }
            take(conn, &mut out);
            if end {
                done.push(stream);
            }
        }
        if app.websocket && app.peer_ended && app.echo.is_empty() {
            let mut header = [0u8; 9];
            conn.send_data_header(stream, 0, true, &mut header).unwrap();
            out.extend_from_slice(&header);
            done.push(stream);
        }
    }
    for stream in done {
        apps.remove(&stream);
    }
    take(conn, &mut out);
    socket.write_all(&out).unwrap();
}

/// A listener on loopback serving one connection in a thread.
fn server(config: Config) -> (std::net::SocketAddr, thread::JoinHandle<Counters>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        serve(socket, config)
    });
    (addr, handle)
}

async fn h2_client(addr: std::net::SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.unwrap();
    // The server's SETTINGS (with ENABLE_CONNECT_PROTOCOL) may not have been read yet.
    for _ in 0..1000 {
        if client.is_extended_connect_protocol_enabled() {
            return client;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
        client = client.ready().await.unwrap();
    }
    panic!("the server never enabled extended CONNECT");
}

/// Opens a WebSocket stream and sends `payload` while reading its echo; returns the echo.
async fn echo(client: h2::client::SendRequest<Bytes>, payload: Vec<u8>) -> Vec<u8> {
    let mut client = client.ready().await.unwrap();
    let request = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri("https://localhost/echo")
        .extension(h2::ext::Protocol::from_static("websocket"))
        .header("sec-websocket-version", "13")
        .body(())
        .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let sender = tokio::spawn(async move {
        let mut rest = &payload[..];
        while !rest.is_empty() {
            // Only within the server's windows: h2 says how much.
            send.reserve_capacity(rest.len().min(64 << 10));
            let capacity =
                std::future::poll_fn(|cx| send.poll_capacity(cx)).await.unwrap().unwrap();
            let n = capacity.min(rest.len());
            send.send_data(Bytes::copy_from_slice(&rest[..n]), false).unwrap();
            rest = &rest[n..];
        }
        send.send_data(Bytes::new(), true).unwrap();
    });
    let mut received = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        body.flow_control().release_capacity(chunk.len()).unwrap();
        received.extend_from_slice(&chunk);
    }
    sender.await.unwrap();
    received
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn h2_client_opens_a_websocket_and_exchanges_data() {
    let (addr, server) = server(Config::default());
    runtime().block_on(async {
        let client = h2_client(addr).await;
        assert_eq!(echo(client.clone(), b"\x82\x05hello".to_vec()).await, b"\x82\x05hello");
        drop(client);
    });
    let counters = server.join().unwrap();
    assert_eq!(counters.websockets, 1);
    assert_eq!(counters.goaway, None);
}

#[test]
fn h2_client_runs_several_websockets_on_one_connection() {
    let (addr, server) = server(Config::default());
    runtime().block_on(async {
        let client = h2_client(addr).await;
        let tasks: Vec<_> = (0..8u8)
            .map(|i| {
                let payload = pattern(100_000 + usize::from(i) * 1000, i);
                let client = client.clone();
                tokio::spawn(async move { (echo(client, payload.clone()).await, payload) })
            })
            .collect();
        for task in tasks {
            let (echoed, sent) = task.await.unwrap();
            assert_eq!(echoed.len(), sent.len());
            assert!(echoed == sent);
        }
    });
    let counters = server.join().unwrap();
    assert_eq!(counters.websockets, 8);
    assert_eq!((counters.refused_streams, counters.error_resets, counters.goaway), (0, 0, None));
}

#[test]
fn a_large_transfer_crosses_every_window_both_ways() {
    // 4 MiB each way: 64 times our 64 KiB stream window and 16 times the connection's, and
    // 64 times the h2 client's 64 KiB windows for our sends.
    let (addr, server) = server(Config::default());
    runtime().block_on(async {
        let client = h2_client(addr).await;
        let payload = pattern(4 << 20, 7);
        let echoed = echo(client, payload.clone()).await;
        assert_eq!(echoed.len(), payload.len());
        assert!(echoed == payload);
    });
    let counters = server.join().unwrap();
    assert!(counters.send_blocked > 0, "our sends waited for the client's windows");
    assert_eq!(counters.flow_control_errors, 0);
}

#[test]
fn a_small_stream_window_still_carries_a_large_transfer() {
    let config = Config::builder().initial_stream_window(1024).connection_window(65_535).build();
    let (addr, server) = server(config);
    runtime().block_on(async {
        let client = h2_client(addr).await;
        let payload = pattern(300_000, 3);
        assert!(echo(client, payload.clone()).await == payload);
    });
    assert_eq!(server.join().unwrap().flow_control_errors, 0);
}

#[test]
fn h2_client_gets_a_page() {
    let (addr, server) = server(Config::default());
    runtime().block_on(async {
        let mut client = h2_client(addr).await;
        for (path, status, body) in [("/hello", 200, PAGE), ("/nowhere", 404, &b"not found\n"[..])]
        {
            let request = http::Request::get(format!("https://localhost{path}")).body(()).unwrap();
            let (response, _) = client.send_request(request, true).unwrap();
            let response = response.await.unwrap();
            assert_eq!(response.status(), status);
            assert_eq!(response.headers()["content-type"], "text/plain");
            let mut received = Vec::new();
            let mut stream = response.into_body();
            while let Some(chunk) = stream.data().await {
                received.extend_from_slice(&chunk.unwrap());
            }
            assert_eq!(received, body);
            client = client.ready().await.unwrap();
        }
    });
    assert_eq!(server.join().unwrap().requests, 2);
}

#[test]
fn curl_gets_a_page_with_prior_knowledge() {
    if std::process::Command::new("curl").arg("--version").output().is_err() {
        assert!(std::env::var_os("FREEBOARD_REQUIRE_TOOLS").is_none(), "curl is missing");
        eprintln!("curl is not installed: skipped");
        return;
    }
    let (addr, server) = server(Config::default());
    let output = std::process::Command::new("curl")
        .args(["--http2-prior-knowledge", "--silent", "--show-error", "--max-time", "10"])
        .args(["--write-out", "%{http_version} %{http_code}"])
        .arg(format!("http://{addr}/hello"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let expected = [PAGE, b"2 200"].concat();
    assert_eq!(String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&expected));
    let counters = server.join().unwrap();
    assert_eq!(counters.requests, 1);
}

#[test]
fn a_client_that_stops_reading_is_stopped_from_sending() {
    // The client sends 2 MiB without reading the echo: our sends stop at its windows, so we
    // stop consuming, so its sends stop at ours. Then it reads, and everything arrives.
    let (addr, server) = server(Config::default());
    runtime().block_on(async {
        let mut client = h2_client(addr).await.ready().await.unwrap();
        let request = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri("https://localhost/echo")
            .extension(h2::ext::Protocol::from_static("websocket"))
            .header("sec-websocket-version", "13")
            .body(())
            .unwrap();
        let (response, mut send) = client.send_request(request, false).unwrap();
        let mut body = response.await.unwrap().into_body();
        let payload = pattern(2 << 20, 9);
        let (progress, mut sent) = tokio::sync::watch::channel(0usize);
        let to_send = payload.clone();
        let sender = tokio::spawn(async move {
            let mut at = 0;
            while at < to_send.len() {
                send.reserve_capacity((to_send.len() - at).min(16 << 10));
                let capacity =
                    std::future::poll_fn(|cx| send.poll_capacity(cx)).await.unwrap().unwrap();
                let n = capacity.min(to_send.len() - at);
                send.send_data(Bytes::copy_from_slice(&to_send[at..at + n]), false).unwrap();
                at += n;
                progress.send_replace(at);
            }
            send.send_data(Bytes::new(), true).unwrap();
        });
        // Not reading: the sender stalls. Wait until it has made no progress for a while.
        let mut last = 0;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = *sent.borrow_and_update();
            if now == last && now > 0 {
                break;
            }
            last = now;
        }
        // Our 64 KiB stream window, the client's 64 KiB receive window, and what the
        // server holds to echo (at most its window): far below the 2 MiB.
        assert!(last < 3 * 65_536, "the client sent {last} bytes without reading");
        let mut received = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            body.flow_control().release_capacity(chunk.len()).unwrap();
            received.extend_from_slice(&chunk);
        }
        sender.await.unwrap();
        assert!(received == payload);
    });
    let counters = server.join().unwrap();
    assert!(counters.send_blocked > 0);
}
