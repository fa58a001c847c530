//! The tokio driver over real sockets on loopback: echo of every size, close codes both ways,
//! each slow-consumer policy against a client that never reads, `writable`, keep-alive,
//! idle connections holding nothing, corked replies in order and surviving their reader, the
//! Sink/Stream API, and axum's upgrade. Each test is
//! bounded by a timeout and talks only to 127.0.0.1.

use std::sync::Arc;
use std::time::Duration;

use freeboard::client::CloseEvent;
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage, WebSocket, WsConfig};
use freeboard::{CloseCode, PushOutcome, SendOutcome, SlowConsumerPolicy, Watermarks};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message as TMessage;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode as TCloseCode;

/// A bound on every test: a hang fails instead of stalling CI.
const BOUND: Duration = Duration::from_secs(20);

fn endpoint(config: EndpointConfig) -> Arc<Endpoint> {
    Endpoint::new(config).expect("a valid endpoint")
}

/// A listener on loopback and its `ws://` URL.
async fn listen() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/", listener.local_addr().unwrap());
    (listener, url)
}

/// Accepts one connection as a freeboard server WebSocket.
async fn accept(
    listener: &TcpListener,
    endpoint: &Arc<Endpoint>,
    config: &WsConfig,
) -> WebSocket<TcpStream> {
    let (stream, _) = listener.accept().await.unwrap();
    stream.set_nodelay(true).unwrap();
    WebSocket::accept(stream, endpoint, config).await.unwrap()
}

type Client = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

/// One connection: the server side, accepted with `config`, runs `serve` on a task; the
/// other side is a tungstenite client.
async fn connected<T, F>(
    endpoint: &Arc<Endpoint>,
    config: WsConfig,
    serve: impl FnOnce(WebSocket<TcpStream>) -> F + Send + 'static,
) -> (tokio::task::JoinHandle<T>, Client)
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let (listener, url) = listen().await;
    let endpoint = Arc::clone(endpoint);
    let server =
        tokio::spawn(async move { serve(accept(&listener, &endpoint, &config).await).await });
    let (client, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    (server, client)
}

async fn echo(mut ws: WebSocket<TcpStream>) -> Option<CloseEvent> {
    while let Some(message) = ws.next().await {
        match message {
            OwnedMessage::Close(close) => return Some(close),
            message => {
                ws.send_async(message).await;
            }
        }
    }
    None
}

#[tokio::test]
async fn echoes_every_size_and_hears_the_clients_close() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let (server, mut client) = connected(&endpoint, WsConfig::default(), echo).await;
        let big: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
        let messages = vec![
            TMessage::text("hello"),
            TMessage::binary(Vec::new()),
            TMessage::binary(big.clone()),
            TMessage::text("é".repeat(10_000)),
        ];
        for message in &messages {
            client.send(message.clone()).await.unwrap();
        }
        for message in &messages {
            let echoed = client.next().await.unwrap().unwrap();
            assert_eq!(&echoed, message);
        }
        let frame = CloseFrame { code: TCloseCode::Normal, reason: "bye".into() };
        client.close(Some(frame)).await.unwrap();
        let answer = client.next().await;
        assert!(
            matches!(answer, Some(Ok(TMessage::Close(Some(ref f)))) if f.code == TCloseCode::Normal),
            "{answer:?}"
        );
        let close = server.await.unwrap().expect("the server heard the close");
        assert_eq!((close.code, close.reason.as_str(), close.was_clean), (CloseCode::NORMAL, "bye", true));
        assert_eq!(endpoint.counters().chunks_in_use, 0, "every chunk went back");
        assert_eq!(endpoint.connections(), 0);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_servers_close_code_reaches_the_client_and_ends_the_stream() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let (server, mut client) = connected(&endpoint, WsConfig::default(), |mut ws| async move {
            ws.close(CloseCode(4001), "done here").unwrap();
            assert_eq!(ws.send_text("late"), SendOutcome::Closed, "nothing after the close");
            let mut items = Vec::new();
            while let Some(message) = ws.next().await {
                items.push(message);
            }
            items
        })
        .await;
        match client.next().await {
            Some(Ok(TMessage::Close(Some(frame)))) => {
                assert_eq!((u16::from(frame.code), frame.reason.as_str()), (4001, "done here"))
            }
            other => panic!("expected the close, got {other:?}"),
        }
        // tungstenite answers the close; the server's stream ends with a clean close.
        while client.next().await.is_some() {}
        let items = server.await.unwrap();
        assert!(
            matches!(&items[..], [OwnedMessage::Close(c)] if c.code == CloseCode(4001) && c.was_clean),
            "{items:?}"
        );
    })
    .await
    .unwrap();
}

/// A client that connects and never reads: under each policy the server's queue holds at most
/// its cap (plus the message in flight), and `send` says what happened.
#[tokio::test]
async fn a_client_that_never_reads_meets_each_policy_at_the_cap() {
    tokio::time::timeout(BOUND, async {
        let marks = Watermarks::new(16 << 10, 64 << 10, 256 << 10).unwrap();
        for policy in SlowConsumerPolicy::ALL {
            let endpoint = endpoint(EndpointConfig::default().memory(8 << 20));
            let (listener, url) = listen().await;
            let config = WsConfig::default().watermarks(marks).slow_consumer(policy);
            let server = {
                let endpoint = Arc::clone(&endpoint);
                tokio::spawn(async move {
                    let ws = accept(&listener, &endpoint, &config).await;
                    let payload = vec![7u8; 4000];
                    let mut outcomes = Vec::new();
                    // Far more than the socket buffers and the cap together.
                    for _ in 0..4000 {
                        let outcome = ws.send_binary(&payload);
                        outcomes.push(outcome);
                        assert!(ws.buffered_amount() <= (256 << 10) + 4004, "{policy:?}");
                        if outcome == SendOutcome::Closed {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                    (ws, outcomes)
                })
            };
            // A client that never reads after the handshake.
            let (client, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
            let (ws, outcomes) = server.await.unwrap();
            let seen = |f: fn(&SendOutcome) -> bool| outcomes.iter().any(f);
            if policy != SlowConsumerPolicy::Conflate {
                assert!(
                    seen(|o| *o == SendOutcome::Queue(PushOutcome::QueuedAboveHigh)),
                    "{policy:?}"
                );
            }
            match policy {
                SlowConsumerPolicy::Block => assert!(seen(|o| matches!(
                    o,
                    SendOutcome::Queue(PushOutcome::WouldBlock { .. })
                ))),
                SlowConsumerPolicy::DropNewest => {
                    assert!(seen(|o| matches!(
                        o,
                        SendOutcome::Queue(PushOutcome::Dropped { newest: true, .. })
                    )))
                }
                SlowConsumerPolicy::DropOldest | SlowConsumerPolicy::Conflate => {
                    assert!(seen(|o| matches!(
                        o,
                        SendOutcome::Queue(PushOutcome::Dropped { newest: false, .. })
                    )))
                }
                SlowConsumerPolicy::Close => {
                    assert_eq!(outcomes.last(), Some(&SendOutcome::Closed), "closed 1008")
                }
            }
            let held = endpoint.counters().chunks_in_use * 4096;
            assert!(held <= (256 << 10) + 2 * 4096, "{policy:?}: the pool holds {held} bytes");
            drop(ws);
            drop(client);
            assert_eq!(endpoint.counters().chunks_in_use, 0, "{policy:?}: all given back");
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn writable_waits_for_the_low_watermark() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let marks = Watermarks::new(8 << 10, 32 << 10, 1 << 20).unwrap();
        let config = WsConfig::default().watermarks(marks);
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let (server, mut client) = connected(&endpoint, config, |ws| async move {
            let (mut reader, writer) = ws.split();
            let mut sent = 0usize;
            while writer.send_binary(&[1u8; 1000])
                != SendOutcome::Queue(PushOutcome::QueuedAboveHigh)
            {
                sent += 1;
            }
            sent += 1;
            assert!(!writer.is_writable());
            let _ = go_tx.send(());
            // The reader drives the connection's writes only when polled: here it is not,
            // so `writable` writes.
            writer.writable().await;
            assert!(writer.is_writable());
            assert!(writer.buffered_amount() <= 8 << 10);
            writer.close(CloseCode::NORMAL, "").unwrap();
            while reader.next().await.is_some() {}
            sent
        })
        .await;
        go_rx.await.unwrap();
        let mut received = 0;
        while let Some(Ok(message)) = client.next().await {
            if message.is_binary() {
                received += 1;
            }
        }
        assert_eq!(received, server.await.unwrap(), "every message arrived");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn idle_connections_hold_no_read_buffer_no_cork_and_no_chunk() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let (listener, url) = listen().await;
        const N: usize = 50;
        let server = {
            let endpoint = Arc::clone(&endpoint);
            tokio::spawn(async move {
                for _ in 0..N {
                    let ws = accept(&listener, &endpoint, &WsConfig::default()).await;
                    tokio::spawn(echo(ws));
                }
            })
        };
        let mut clients = Vec::new();
        for _ in 0..N {
            let (mut client, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
            client.send(TMessage::text("ping")).await.unwrap();
            assert_eq!(client.next().await.unwrap().unwrap(), TMessage::text("ping"));
            clients.push(client);
        }
        server.await.unwrap();
        assert_eq!(endpoint.connections(), N);
        // Every echo went out and every reader waits for input: nothing is held.
        let mut quiet = false;
        for _ in 0..100 {
            if endpoint.read_buffers_in_use() == 0
                && endpoint.corks_in_use() == 0
                && endpoint.counters().chunks_in_use == 0
            {
                quiet = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(quiet, "{endpoint:?}");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_peer_that_does_not_answer_keep_alive_pings_is_dropped_with_1006() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default().limits(|limits| {
            limits.idle_timeout(Some(Duration::from_millis(100))).pong_timeout(Duration::from_millis(200))
        }));
        let (listener, _) = listen().await;
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut ws = accept(&listener, &endpoint, &WsConfig::default()).await;
            let mut last = None;
            while let Some(message) = ws.next().await {
                last = Some(message);
            }
            last
        });
        // A raw client: completes the handshake, then never answers (nor reads).
        let mut raw = TcpStream::connect(addr).await.unwrap();
        let request = "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                       Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
        raw.write_all(request.as_bytes()).await.unwrap();
        let mut head = [0u8; 12];
        raw.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 101");
        match server.await.unwrap() {
            Some(OwnedMessage::Close(close)) => {
                assert_eq!((close.code, close.was_clean), (CloseCode::ABNORMAL, false))
            }
            other => panic!("expected a 1006 close, got {other:?}"),
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn sink_and_stream_forward_an_echo() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let (_server, mut client) = connected(&endpoint, WsConfig::default(), |ws| async move {
            let (reader, writer) = ws.split();
            let data =
                reader.take_while(|m| std::future::ready(!matches!(m, OwnedMessage::Close(_))));
            let _ = data.map(Ok).forward(writer).await;
        })
        .await;
        for i in 0..100 {
            client.send(TMessage::text(format!("m{i}"))).await.unwrap();
        }
        for i in 0..100 {
            assert_eq!(client.next().await.unwrap().unwrap(), TMessage::text(format!("m{i}")));
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn split_halves_reunite_only_with_their_own_connection() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let (listener, url) = listen().await;
        let server = tokio::spawn(async move {
            let first = accept(&listener, &endpoint, &WsConfig::default()).await;
            let second = accept(&listener, &endpoint, &WsConfig::default()).await;
            let (reader, writer) = first.split();
            let (other_reader, other_writer) = second.split();
            let (reader, other_writer) = reader.reunite(other_writer).unwrap_err();
            let ws = reader.reunite(writer).unwrap();
            drop((other_reader, other_writer));
            echo(ws).await
        });
        let (mut first, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        let (mut second, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
        // The second connection's halves were dropped: its socket closes.
        assert!(matches!(second.next().await, None | Some(Err(_))));
        first.send(TMessage::text("whole again")).await.unwrap();
        assert_eq!(first.next().await.unwrap().unwrap(), TMessage::text("whole again"));
        first.close(None).await.unwrap();
        assert_eq!(server.await.unwrap().map(|close| close.code), Some(CloseCode::NO_STATUS));
    })
    .await
    .unwrap();
}

async fn axum_echo(ws: WebSocketUpgrade) -> axum::response::Response {
    ws.protocols(["chat", "json"]).on_upgrade(|mut socket: AxumWebSocket| async move {
        if let Some(protocol) = socket.protocol() {
            let _ = socket.send_text(&format!("protocol {protocol}"));
        }
        while let Some(message) = socket.next().await {
            if let OwnedMessage::Close(_) = message {
                break;
            }
            let _ = socket.send(message);
        }
    })
}

async fn serve_axum(endpoint: Arc<Endpoint>) -> std::net::SocketAddr {
    let app = axum::Router::new()
        .route("/ws", axum::routing::get(axum_echo))
        .layer(axum::Extension(endpoint));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test]
async fn axum_upgrades_a_route_with_its_subprotocols() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let addr = serve_axum(Arc::clone(&endpoint)).await;
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
        request.headers_mut().insert("Sec-WebSocket-Protocol", "json, chat".parse().unwrap());
        let (mut client, response) = tokio_tungstenite::connect_async(request).await.unwrap();
        assert_eq!(response.headers()["sec-websocket-protocol"], "chat", "the route's order");
        assert_eq!(client.next().await.unwrap().unwrap(), TMessage::text("protocol chat"));
        let big = vec![9u8; 100_000];
        client.send(TMessage::binary(big.clone())).await.unwrap();
        assert_eq!(client.next().await.unwrap().unwrap(), TMessage::binary(big));
        client.close(None).await.unwrap();
        while client.next().await.is_some() {}
        // A plain GET is not an upgrade.
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain.write_all(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        plain.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 426"), "{answer}");
    })
    .await
    .unwrap();
}

/// Sends an upgrade offering permessage-deflate to `path` on `addr`; returns the response head
/// and the socket.
async fn offer_deflate(addr: std::net::SocketAddr, path: &str) -> (String, TcpStream) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let offer = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n";
    let request = freeboard_test::upgrade_request(path, offer);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "the head ended early");
        head.push(byte[0]);
    }
    (String::from_utf8(head).unwrap(), stream)
}

/// The tokio driver does not compress: it declines permessage-deflate at both of its
/// handshakes (a bare listener's and axum's), so a frame with RSV1 is a protocol error
/// (1002), never an inflated or a broken message; freeboard's client goes on uncompressed.
#[tokio::test]
async fn the_tokio_driver_declines_permessage_deflate() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let (listener, _) = listen().await;
        let bare = listener.local_addr().unwrap();
        {
            let endpoint = Arc::clone(&endpoint);
            tokio::spawn(async move {
                loop {
                    let ws = accept(&listener, &endpoint, &WsConfig::default()).await;
                    tokio::spawn(echo(ws));
                }
            });
        }
        let axum = serve_axum(Arc::clone(&endpoint)).await;
        for (addr, path) in [(bare, "/"), (axum, "/ws")] {
            let (head, mut stream) = offer_deflate(addr, path).await;
            assert!(head.starts_with("HTTP/1.1 101"), "{head}");
            assert!(!head.to_ascii_lowercase().contains("sec-websocket-extensions"), "{head}");
            // "Hello" compressed (RFC 7692 §7.2.3.1), RSV1 set.
            let frame = freeboard_test::frame(
                0xc1,
                &[0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00],
                freeboard_test::TEST_MASK,
            );
            stream.write_all(&frame).await.unwrap();
            let mut answer = Vec::new();
            let _ = stream.read_to_end(&mut answer).await;
            // The close frame: 0x88, its length, the code.
            assert_eq!(&answer[..1], &[0x88], "{answer:?}");
            assert_eq!(u16::from_be_bytes([answer[2], answer[3]]), 1002, "{answer:?}");
            // freeboard's client offers by default, and goes on without the extension.
            let url = format!("ws://{addr}{path}");
            let echoed = tokio::task::spawn_blocking(move || {
                use freeboard::client::{Client, ClientConfig, Event};
                let mut client = Client::connect(&url, ClientConfig::default()).unwrap();
                assert!(client.compression().is_none());
                client.send_text(&"uncompressed ".repeat(20)).unwrap();
                loop {
                    match client.recv().unwrap() {
                        Event::Message(m) if m.kind() == freeboard::MessageKind::Text => {
                            let text = m.to_text().unwrap().to_owned();
                            if text.starts_with("protocol") {
                                continue;
                            }
                            break text;
                        }
                        other => panic!("{other:?}"),
                    }
                }
            })
            .await
            .unwrap();
            assert_eq!(echoed, "uncompressed ".repeat(20));
        }
    })
    .await
    .unwrap();
}

/// Connections on a multi-worker runtime share the endpoint's pool but take its lock only for
/// the pool: their common messages and corked replies use each worker's own spares, while
/// large messages (read in pieces, queued in chunks) and publications go through the pool.
/// Every connection gets its echoes and the publications in order, and once they close every
/// chunk, read buffer and cork is back, whichever worker took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_on_several_workers_echo_and_hear_publications_and_give_everything_back() {
    tokio::time::timeout(BOUND, async {
        const CLIENTS: usize = 8;
        const MESSAGES: usize = 300;
        const PUBLICATIONS: usize = 100;
        let endpoint = endpoint(EndpointConfig::default());
        let (listener, url) = listen().await;
        let served = Arc::clone(&endpoint);
        tokio::spawn(async move {
            loop {
                let ws = accept(&listener, &served, &WsConfig::default()).await;
                ws.subscribe("news").unwrap();
                tokio::spawn(echo(ws));
            }
        });
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            let (client, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
            clients.push(tokio::spawn(async move {
                let (mut write, mut read) = client.split();
                let sizes = move |i: usize| [1, 64, 700, 5_000, 100_000][(i + c) % 5];
                let sender = tokio::spawn(async move {
                    for i in 0..MESSAGES {
                        write.send(TMessage::binary(vec![i as u8; sizes(i)])).await.unwrap();
                    }
                    write
                });
                let (mut echoes, mut publications) = (0, 0);
                while echoes < MESSAGES || publications < PUBLICATIONS {
                    match read.next().await.unwrap().unwrap() {
                        TMessage::Binary(data) => {
                            assert_eq!(data.len(), sizes(echoes), "echo {echoes} of client {c}");
                            assert!(data.iter().all(|&b| b == echoes as u8));
                            echoes += 1;
                        }
                        TMessage::Text(text) => {
                            assert_eq!(text.as_str(), format!("news {publications}"));
                            publications += 1;
                        }
                        other => panic!("{other:?}"),
                    }
                }
                let mut write = sender.await.unwrap();
                write.send(TMessage::Close(None)).await.unwrap();
                while read.next().await.is_some() {}
            }));
        }
        while endpoint.subscribers("news") < CLIENTS {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for i in 0..PUBLICATIONS {
            let reach = endpoint.publish(
                "news",
                freeboard::MessageKind::Text,
                format!("news {i}").as_bytes(),
            );
            assert_eq!(reach.delivered as usize, CLIENTS, "publication {i}: {reach:?}");
            tokio::task::yield_now().await;
        }
        for client in clients {
            client.await.unwrap();
        }
        while endpoint.connections() > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(endpoint.counters().chunks_in_use, 0, "every chunk went back");
        assert_eq!((endpoint.read_buffers_in_use(), endpoint.corks_in_use()), (0, 0));
    })
    .await
    .unwrap();
}

/// Text is validated once, by the core, as it streams: a message whose code point is split
/// across fragments (and across writes) is delivered whole; invalid UTF-8 closes the
/// connection with 1007 — whole in one frame, or in the last of three fragments, where
/// nothing of the message reaches the application (Autobahn 6.x).
#[tokio::test]
async fn invalid_utf8_closes_1007_whole_or_in_fragments() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let (listener, _) = listen().await;
        let addr = listener.local_addr().unwrap();
        let served = Arc::clone(&endpoint);
        let server = tokio::spawn(async move {
            let mut closes = Vec::new();
            for _ in 0..2 {
                let mut ws = accept(&listener, &served, &WsConfig::default()).await;
                let mut texts = Vec::new();
                while let Some(message) = ws.next().await {
                    match message {
                        OwnedMessage::Close(close) => {
                            closes.push((close.code, std::mem::take(&mut texts)));
                        }
                        OwnedMessage::Text(text) => {
                            texts.push(text.clone());
                            let _ = ws.send(OwnedMessage::Text(text));
                        }
                        OwnedMessage::Binary(_) => panic!("no binary message was sent"),
                    }
                }
            }
            closes
        });
        let mask = freeboard_test::TEST_MASK;
        // "é" is 0xc3 0xa9; 0xed 0xa0 0x80 is a UTF-16 surrogate, never valid UTF-8 (§8.1).
        let cases: [&[Vec<u8>]; 2] = [
            &[
                freeboard_test::frame(0x01, b"caf\xc3", mask),
                freeboard_test::frame(0x80, b"\xa9!", mask),
                freeboard_test::frame(0x81, b"\xed\xa0\x80", mask),
            ],
            &[
                freeboard_test::frame(0x01, b"first ", mask),
                freeboard_test::frame(0x00, b"\xce\xba", mask),
                freeboard_test::frame(0x80, b"\xed\xa0\x80 last", mask),
            ],
        ];
        for frames in cases {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let request = freeboard_test::upgrade_request("/", "");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "the head ended early");
                head.push(byte[0]);
            }
            for frame in frames {
                // Each frame in its own write: the validator carries state across reads.
                stream.write_all(frame).await.unwrap();
                stream.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let mut answer = Vec::new();
            let _ = stream.read_to_end(&mut answer).await;
            // Whatever was echoed, then the close frame: 0x88, its length, the code.
            let close = answer.windows(2).position(|w| w[0] == 0x88).expect("a close frame");
            let code = u16::from_be_bytes([answer[close + 2], answer[close + 3]]);
            assert_eq!(code, 1007, "{answer:?}");
        }
        let closes = server.await.unwrap();
        let codes: Vec<_> = closes.iter().map(|(code, _)| *code).collect();
        assert_eq!(codes, [CloseCode::INVALID_PAYLOAD; 2]);
        assert_eq!(closes[0].1, ["café!"], "the valid message, split mid code point, arrived");
        assert!(closes[1].1.is_empty(), "nothing of the invalid message reached the handler");
        assert_eq!(endpoint.counters().chunks_in_use, 0, "the fragments' chunks went back");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn axum_answers_503_when_the_budget_cannot_cover_a_connection() {
    tokio::time::timeout(BOUND, async {
        // A reserve larger than the whole pool: no upgrade can be covered.
        let config = EndpointConfig::default().memory(256 << 10).connection_reserve(1 << 20);
        let addr = serve_axum(endpoint(config)).await;
        let error = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await.unwrap_err();
        match error {
            tokio_tungstenite::tungstenite::Error::Http(response) => {
                assert_eq!(response.status(), 503);
                assert_eq!(response.headers()["retry-after"], "1");
            }
            other => panic!("expected 503, got {other:?}"),
        }
    })
    .await
    .unwrap();
}

/// A send from another task while the reader waits for input: the reader is woken to write it.
#[tokio::test]
async fn a_send_while_the_reader_waits_is_written_by_the_reader() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (_server, mut client) = connected(&endpoint, WsConfig::default(), |ws| async move {
            let (mut reader, writer) = ws.split();
            let _ = ready_tx.send(writer);
            while let Some(message) = reader.next().await {
                if let OwnedMessage::Close(_) = message {
                    break;
                }
            }
        })
        .await;
        let writer = ready_rx.await.unwrap();
        // Let the reader park in its read.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let producer = tokio::spawn(async move {
            for i in 0..10 {
                assert_eq!(
                    writer.send_text(&format!("n{i}")),
                    SendOutcome::Queue(PushOutcome::Queued)
                );
            }
        });
        producer.await.unwrap();
        for i in 0..10 {
            assert_eq!(client.next().await.unwrap().unwrap(), TMessage::text(format!("n{i}")));
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn corked_replies_leave_in_order_before_the_pong_of_a_ping_read_with_them() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let (server, mut client) = connected(&endpoint, WsConfig::default(), echo).await;
        // One write: 200 messages, a ping, 200 more. The server reads them in a few reads and
        // corks its echoes; the pong must not overtake the echoes queued before it.
        for round in 0..2 {
            for i in 0..200 {
                client.feed(TMessage::binary(vec![round as u8; i % 300 + 1])).await.unwrap();
            }
            if round == 0 {
                client.feed(TMessage::Ping(b"between".to_vec().into())).await.unwrap();
            }
        }
        client.flush().await.unwrap();
        for round in 0..2 {
            for i in 0..200 {
                let expected = TMessage::binary(vec![round as u8; i % 300 + 1]);
                assert_eq!(client.next().await.unwrap().unwrap(), expected, "echo {round}/{i}");
            }
            if round == 0 {
                let pong = client.next().await.unwrap().unwrap();
                assert_eq!(pong, TMessage::Pong(b"between".to_vec().into()));
            }
        }
        let frame = CloseFrame { code: TCloseCode::Normal, reason: "".into() };
        client.close(Some(frame)).await.unwrap();
        let close = server.await.unwrap().expect("the client's close");
        assert_eq!(close.code, CloseCode::NORMAL);
        let quiet = endpoint.corks_in_use() == 0 && endpoint.read_buffers_in_use() == 0;
        assert!(quiet, "{endpoint:?}");
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn replies_corked_when_the_reader_is_dropped_leave_with_the_next_flush() {
    tokio::time::timeout(BOUND, async {
        let endpoint = endpoint(EndpointConfig::default());
        let corks = Arc::clone(&endpoint);
        let (server, mut client) =
            connected(&endpoint, WsConfig::default(), move |ws| async move {
                let (mut reader, writer) = ws.split();
                let message = reader.next().await.expect("a message");
                // The reply joins the cork the reader holds since its read…
                assert_eq!(writer.send(message), SendOutcome::Queue(PushOutcome::Queued));
                assert!(writer.buffered_amount() > 0, "corked bytes count as buffered");
                assert_eq!(corks.corks_in_use(), 1);
                // …and the reader goes away before writing it: the reply is not lost.
                drop(reader);
                assert_eq!(corks.corks_in_use(), 0);
                writer.flush().await;
                assert_eq!(writer.buffered_amount(), 0);
                writer
            })
            .await;
        client.send(TMessage::text("hello")).await.unwrap();
        assert_eq!(client.next().await.unwrap().unwrap(), TMessage::text("hello"));
        drop(server.await.unwrap());
    })
    .await
    .unwrap();
}

#[test]
fn an_endpoint_refuses_a_budget_below_sixteen_chunks() {
    let error = Endpoint::new(EndpointConfig::default().memory(10 * 4096)).unwrap_err();
    assert!(matches!(error, freeboard::config::ConfigError::Memory { .. }), "{error:?}");
}
