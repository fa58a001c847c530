//! The blocking client against freeboard's own echo server and a few hand-written fakes, on
//! loopback.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::thread;
use std::time::{Duration, Instant};

use freeboard::client::{
    Client, ClientConfig, ClientError, CloseCode, Event, MessageKind, PushOutcome, ReadyState,
    SendOutcome, SlowConsumerPolicy, Watermarks,
};
use freeboard::{Echo, Router, RunningServer, Server, ServerConfig};

fn echo_server() -> RunningServer {
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.memory = 128 << 20;
    config.limits.max_message_size = 16 << 20;
    config.limits.send_cap = 64 << 20;
    config.limits.idle_timeout = None;
    Server::bind(config, || Router::new().route("/", Echo).route("/echo", Echo)).unwrap().spawn()
}

fn url(addr: SocketAddr, path: &str) -> String {
    format!("ws://{addr}{path}")
}

fn next_message(client: &mut Client) -> (MessageKind, Vec<u8>) {
    match client.recv().unwrap() {
        Event::Message(m) => (m.kind(), m.to_vec()),
        Event::Closed(c) => panic!("closed: {c:?}"),
    }
}

fn close_cleanly(mut client: Client) {
    client.close(CloseCode::NORMAL, "done").unwrap();
    assert_eq!(client.ready_state(), ReadyState::Closing);
    loop {
        match client.recv().unwrap() {
            Event::Message(_) => continue,
            Event::Closed(close) => {
                assert_eq!((close.code, close.was_clean), (CloseCode::NORMAL, true), "{close:?}");
                break;
            }
        }
    }
    assert_eq!(client.ready_state(), ReadyState::Closed);
    assert!(matches!(client.recv(), Err(ClientError::AlreadyClosed)));
}

#[test]
fn echoes_text_and_binary_of_every_size_borrowed_and_owned() {
    let server = echo_server();
    let mut client =
        Client::connect(&url(server.local_addr(), "/echo?x=1"), ClientConfig::default()).unwrap();
    assert_eq!(client.ready_state(), ReadyState::Open);
    for size in [0, 1, 125, 126, 4095, 4096, 65535, 65536, 1 << 20, 16 << 20] {
        let payload: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let pushed = client.send_binary(&payload).unwrap();
        // A 64 KiB copy waits in the queue above its high watermark (64 KiB).
        assert!(matches!(
            pushed,
            SendOutcome::Queue(PushOutcome::Queued | PushOutcome::QueuedAboveHigh)
        ));
        assert_eq!(next_message(&mut client), (MessageKind::Binary, payload.clone()), "{size}");

        let pushed = client.send_owned(MessageKind::Binary, payload.clone()).unwrap();
        assert_eq!(pushed, SendOutcome::Queue(PushOutcome::Queued));
        assert_eq!(next_message(&mut client).1.len(), size);

        let text = "é".repeat(size / 2);
        let _ = client.send_text(&text).unwrap();
        assert_eq!(next_message(&mut client), (MessageKind::Text, text.into_bytes()));
    }
    assert_eq!(client.buffered_amount(), 0);
    close_cleanly(client);
    server.handle().shutdown();
}

#[test]
fn a_thousand_requests_in_flight_are_all_answered_and_matched() {
    let server = echo_server();
    let mut client =
        Client::connect(&url(server.local_addr(), "/"), ClientConfig::default()).unwrap();
    for id in 0..1000 {
        let request = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"echo","params":[{id}]}}"#);
        let pushed = client.send_text(&request).unwrap();
        assert!(matches!(
            pushed,
            SendOutcome::Queue(PushOutcome::Queued | PushOutcome::QueuedAboveHigh)
        ));
    }
    let mut seen = vec![false; 1000];
    for _ in 0..1000 {
        let (_, bytes) = next_message(&mut client);
        let text = String::from_utf8(bytes).unwrap();
        let id: usize =
            text.split(r#""id":"#).nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
        assert!(!seen[id], "id {id} answered twice");
        seen[id] = true;
    }
    assert!(seen.iter().all(|&s| s));
    close_cleanly(client);
    server.handle().shutdown();
}

#[test]
fn buffered_amount_counts_what_the_socket_has_not_taken_and_block_refuses_past_the_cap() {
    // A server that completes the handshake and then never reads.
    let (addr, _server) = fake_server(|mut s, request| {
        s.write_all(&switching_protocols(&request, None)).unwrap();
        thread::sleep(Duration::from_secs(3));
    });
    let marks = Watermarks::new(64 << 10, 128 << 10, 256 << 10).unwrap();
    let config = ClientConfig::default()
        .limits(|limits| limits.watermarks(marks).slow_consumer(SlowConsumerPolicy::Block));
    let mut client = Client::connect(&url(addr, "/"), config).unwrap();
    let payload = vec![7u8; 16 << 10];
    let mut refused = 0;
    for _ in 0..10_000 {
        if let SendOutcome::Queue(PushOutcome::WouldBlock { .. }) =
            client.send_binary(&payload).unwrap()
        {
            // The queue reached its cap; the writer thread may not have filled the socket yet
            // (on a busy machine it may not have run at all). Refused again after it had time
            // to, the queue stays at the cap: the socket takes nothing more.
            refused += 1;
            if refused == 2 {
                break;
            }
            thread::sleep(Duration::from_millis(200));
        }
    }
    assert_eq!(refused, 2, "the socket buffers should fill and the cap refuse");
    assert!(client.buffered_amount() > 128 << 10);
    assert!(!client.is_writable());
    assert!(client.send_counters().chunks_in_use > 0);
}

#[test]
fn drop_newest_drops_and_counts_what_does_not_fit() {
    let (addr, _server) = fake_server(|mut s, request| {
        s.write_all(&switching_protocols(&request, None)).unwrap();
        thread::sleep(Duration::from_secs(3));
    });
    let marks = Watermarks::new(16 << 10, 32 << 10, 64 << 10).unwrap();
    let config = ClientConfig::default()
        .limits(|limits| limits.watermarks(marks).slow_consumer(SlowConsumerPolicy::DropNewest));
    let mut client = Client::connect(&url(addr, "/"), config).unwrap();
    let payload = vec![1u8; 8 << 10];
    let mut dropped = 0;
    for _ in 0..2_000 {
        if let SendOutcome::Queue(PushOutcome::Dropped { newest: true, messages: 1, .. }) =
            client.send_binary(&payload).unwrap()
        {
            dropped += 1;
        }
    }
    assert!(dropped > 0);
    // The cap, plus what the writer thread has taken from the queue and not yet written.
    assert!(client.buffered_amount() <= (64 << 10) + (64 << 10));
    let tally = client.send_counters().dropped(SlowConsumerPolicy::DropNewest);
    assert_eq!(tally.messages, dropped);
}

#[test]
fn a_message_over_max_message_size_closes_with_1009() {
    let server = echo_server();
    let config = ClientConfig::default().limits(|limits| limits.max_message_size(1000));
    let mut client = Client::connect(&url(server.local_addr(), "/"), config).unwrap();
    let _ = client.send_binary(&[1u8; 1001]).unwrap();
    match client.recv().unwrap() {
        Event::Closed(close) => assert_eq!(close.code, CloseCode::MESSAGE_TOO_BIG, "{close:?}"),
        Event::Message(m) => panic!("delivered {} bytes", m.len()),
    }
    server.handle().shutdown();
}

#[test]
fn a_refusal_reports_status_and_body() {
    let (addr, _server) = fake_server(|mut s, _| {
        let body = "no such endpoint: try /echo";
        let response = format!(
            "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(response.as_bytes()).unwrap();
        thread::sleep(Duration::from_secs(3)); // the body must be read without waiting for EOF
    });
    let started = Instant::now();
    let err = Client::connect(&url(addr, "/nope"), ClientConfig::default()).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    match &err {
        ClientError::Refused { status, reason, body } => {
            assert_eq!((*status, reason.as_str()), (404, "Not Found"));
            assert_eq!(body, "no such endpoint: try /echo");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "server refused the WebSocket upgrade: 404 Not Found: no such endpoint: try /echo"
    );
}

#[test]
fn headers_subprotocols_and_ipv6_reach_the_server() {
    let Ok(listener) = TcpListener::bind("[::1]:0") else {
        eprintln!("no IPv6 loopback here; skipped");
        return;
    };
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let request = read_head(&s);
        let mut s = s;
        s.write_all(&switching_protocols(&request, Some("v2.rpc"))).unwrap();
        // One text message, then a close frame.
        s.write_all(b"\x81\x02hi\x88\x02\x03\xe8").unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        request
    });
    let config = ClientConfig::default()
        .header("Authorization", "Bearer abc")
        .subprotocol("v1.rpc")
        .subprotocol("v2.rpc");
    let mut client =
        Client::connect(&format!("ws://[::1]:{}/rpc?k=v", addr.port()), config).unwrap();
    assert_eq!(client.protocol(), Some("v2.rpc"));
    assert_eq!(next_message(&mut client), (MessageKind::Text, b"hi".to_vec()));
    match client.recv().unwrap() {
        Event::Closed(close) => {
            assert_eq!((close.code, close.was_clean), (CloseCode::NORMAL, true))
        }
        Event::Message(_) => panic!("one message only"),
    }
    drop(client);
    let request = server.join().unwrap();
    assert!(request.starts_with("GET /rpc?k=v HTTP/1.1\r\n"), "{request}");
    assert!(request.contains(&format!("Host: [::1]:{}\r\n", addr.port())), "{request}");
    assert!(request.contains("Authorization: Bearer abc\r\n"), "{request}");
    assert!(request.contains("Sec-WebSocket-Protocol: v1.rpc, v2.rpc\r\n"), "{request}");
}

#[test]
fn connect_and_handshake_time_out() {
    // A listener that accepts (the kernel does) but never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let config = ClientConfig::default()
        .limits(|limits| limits.handshake_timeout(Duration::from_millis(200)));
    let started = Instant::now();
    let err = Client::connect(&url(listener.local_addr().unwrap(), "/"), config).unwrap_err();
    assert!(matches!(err, ClientError::HandshakeTimeout(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));

    // Nobody listening: refused at once.
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let err =
        Client::connect(&format!("ws://127.0.0.1:{port}/"), ClientConfig::default()).unwrap_err();
    assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
    assert!(err.is_connect_failure());

    // wss://: the TLS handshake counts inside the handshake timeout.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let config = ClientConfig::default()
        .limits(|limits| limits.handshake_timeout(Duration::from_millis(200)));
    let wss = format!("wss://127.0.0.1:{}/", listener.local_addr().unwrap().port());
    let started = Instant::now();
    let err = Client::connect(&wss, config.insecure(true)).unwrap_err();
    assert!(matches!(err, ClientError::HandshakeTimeout(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn a_memory_budget_smaller_than_the_send_pool_is_refused_before_connecting() {
    // Port 9 (discard) is never dialled: the configuration is checked first.
    let config = ClientConfig::default().memory(100 << 10);
    let err = Client::connect("ws://127.0.0.1:9/", config).unwrap_err();
    assert!(matches!(err, ClientError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("less than the send queue's pool"), "{err}");
}

#[test]
fn sends_after_close_are_refused() {
    let server = echo_server();
    let mut client =
        Client::connect(&url(server.local_addr(), "/"), ClientConfig::default()).unwrap();
    client.close(CloseCode(4000), "bye").unwrap();
    assert!(matches!(client.send_text("late"), Err(ClientError::NotOpen(ReadyState::Closing))));
    match client.recv().unwrap() {
        Event::Closed(close) => assert_eq!((close.code, close.was_clean), (CloseCode(4000), true)),
        Event::Message(_) => panic!(),
    }
    server.handle().shutdown();
}

#[test]
fn queued_sends_leave_without_another_call_when_the_server_reads_again() {
    // The server reads nothing until the client has queued everything (32 MiB: more than the
    // socket buffers hold), then everything; meanwhile the client is not called at all: its
    // writer thread must deliver what queued behind the full socket.
    const COUNT: u32 = 32 << 10;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (read_tx, read_rx) = std::sync::mpsc::channel::<()>();
    let (addr, _server) = fake_server(move |mut s, request| {
        s.write_all(&switching_protocols(&request, None)).unwrap();
        read_rx.recv_timeout(Duration::from_secs(60)).expect("the client queued everything");
        let mut s = std::io::BufReader::with_capacity(1 << 20, s);
        for i in 0..COUNT {
            let payload = read_client_frame(&mut s);
            assert_eq!(payload.len(), 1024);
            assert_eq!(payload[..4], i.to_be_bytes(), "message {i}");
        }
        done_tx.send(()).unwrap();
    });
    let marks = Watermarks::new(32 << 20, 48 << 20, 64 << 20).unwrap();
    let config = ClientConfig::default().limits(|limits| limits.watermarks(marks)).memory(96 << 20);
    let mut client = Client::connect(&url(addr, "/"), config).unwrap();
    let mut payload = vec![0u8; 1024];
    for i in 0..COUNT {
        payload[..4].copy_from_slice(&i.to_be_bytes());
        let pushed = client.send_binary(&payload).unwrap();
        assert!(matches!(
            pushed,
            SendOutcome::Queue(PushOutcome::Queued | PushOutcome::QueuedAboveHigh)
        ));
    }
    assert!(client.buffered_amount() > 0, "the socket buffers should have filled");
    read_tx.send(()).unwrap();
    done_rx.recv_timeout(Duration::from_secs(60)).expect("every message reaches the server");
    assert_eq!(client.buffered_amount(), 0);
}

#[test]
fn a_message_larger_than_the_cap_waits_for_the_queue_and_keeps_its_place() {
    let server = echo_server();
    let mut client =
        Client::connect(&url(server.local_addr(), "/"), ClientConfig::default()).unwrap();
    let large: Vec<u8> = (0..1 << 20).map(|i| (i % 253) as u8).collect();
    for i in 0..50u8 {
        let _ = client.send_binary(&[i; 10]).unwrap();
    }
    assert_eq!(client.send_binary(&large).unwrap(), SendOutcome::Queue(PushOutcome::Queued));
    let _ = client.send_binary(b"after").unwrap();
    for i in 0..50u8 {
        assert_eq!(next_message(&mut client).1, [i; 10]);
    }
    assert_eq!(next_message(&mut client).1, large);
    assert_eq!(next_message(&mut client).1, b"after");
    assert_eq!(client.send_counters().dropped_total().messages, 0);
    close_cleanly(client);
    server.handle().shutdown();
}

#[test]
fn a_write_failure_is_reported_by_send_and_ends_the_connection_with_1006() {
    let (addr, server) = fake_server(|mut s, request| {
        s.write_all(&switching_protocols(&request, None)).unwrap();
    });
    let mut client = Client::connect(&url(addr, "/"), ClientConfig::default()).unwrap();
    server.join().unwrap(); // the server has closed its socket
    let payload = [0u8; 1024];
    let deadline = Instant::now() + Duration::from_secs(10);
    let error = loop {
        match client.send_binary(&payload) {
            Err(e) => break e,
            Ok(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(1)),
            Ok(_) => panic!("sends to a closed socket kept succeeding"),
        }
    };
    assert!(matches!(error, ClientError::Io(_) | ClientError::NotOpen(_)), "{error:?}");
    match client.recv().unwrap() {
        Event::Closed(close) => {
            assert_eq!((close.code, close.was_clean), (CloseCode::ABNORMAL, false))
        }
        Event::Message(_) => panic!("no message was sent"),
    }
}

/// Reads one masked client frame (unfragmented, payload under 64 KiB) and unmasks it.
fn read_client_frame(s: &mut impl Read) -> Vec<u8> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0x82, "a final binary frame");
    assert_eq!(head[1] & 0x80, 0x80, "masked");
    let len = match head[1] & 0x7f {
        126 => {
            let mut ext = [0u8; 2];
            s.read_exact(&mut ext).unwrap();
            u16::from_be_bytes(ext) as usize
        }
        n => n as usize,
    };
    let mut mask = [0u8; 4];
    s.read_exact(&mut mask).unwrap();
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).unwrap();
    payload.iter_mut().enumerate().for_each(|(i, b)| *b ^= mask[i % 4]);
    payload
}

/// Accepts one connection on an ephemeral port, reads the request head and hands both to
/// `serve`.
fn fake_server(
    serve: impl FnOnce(std::net::TcpStream, String) + Send + 'static,
) -> (SocketAddr, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let request = read_head(&s);
        serve(s, request);
    });
    (addr, handle)
}

fn read_head(mut s: &std::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

fn switching_protocols(request: &str, protocol: Option<&str>) -> Vec<u8> {
    let key = request.lines().find_map(|l| l.strip_prefix("Sec-WebSocket-Key: ")).unwrap().trim();
    let accept = freeboard_proto::handshake::accept_key(key.as_bytes());
    let protocol = protocol.map(|p| format!("Sec-WebSocket-Protocol: {p}\r\n")).unwrap_or_default();
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n{protocol}\r\n",
        std::str::from_utf8(&accept).unwrap()
    )
    .into_bytes()
}
