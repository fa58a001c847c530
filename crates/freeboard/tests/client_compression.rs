//! permessage-deflate in the clients: the blocking `Client` and `ClientLoop` offer it by
//! default and echo through freeboard's server in both modes; against a hand-written server
//! every answer a server may give has its outcome (uncompressed, compressed with or without
//! the server's context, a smaller window, or a refused handshake); a bomb gets 1009.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use flate2::{Compress, Compression as Level, Decompress, FlushCompress, FlushDecompress};
use freeboard::client::{
    Client, ClientConfig, ClientError, ClientHandler, ClientLoop, CloseCode, Event, LoopConn,
    MessageKind,
};
use freeboard::{Compression, Echo, NegotiationError, Router, RunningServer, Server, ServerConfig};
use freeboard_test::{Frame, Inbox};

const JSON: &str = r#"{"id":42,"method":"scores.update","params":{"home":2,"away":1,"minute":77}}"#;

fn server(mode: Compression) -> RunningServer {
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.memory = 64 << 20;
    config.limits.idle_timeout = None;
    config.compression = mode;
    config.compression_threshold = 0;
    Server::bind(config, || Router::new().route("/echo", Echo)).unwrap().spawn()
}

fn next(client: &mut Client) -> (MessageKind, Vec<u8>) {
    match client.recv().unwrap() {
        Event::Message(m) => (m.kind(), m.to_vec()),
        Event::Closed(c) => panic!("closed: {c:?}"),
    }
}

#[test]
fn the_blocking_client_offers_compression_and_echoes_through_both_modes() {
    let big: Vec<u8> = JSON.bytes().cycle().take(300_000).collect();
    for (mode, response) in [
        (
            Compression::Shared,
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
        ),
        (Compression::Dedicated, "permessage-deflate; client_no_context_takeover"),
    ] {
        let server = server(mode);
        let url = format!("ws://{}/echo", server.local_addr());
        let mut client = Client::connect(&url, ClientConfig::default()).unwrap();
        let agreed = client.compression().expect("compression agreed");
        assert_eq!(agreed.response(), response, "{mode:?}");
        for _ in 0..3 {
            client.send_text(JSON).unwrap();
            assert_eq!(next(&mut client), (MessageKind::Text, JSON.as_bytes().to_vec()));
        }
        client.send_binary(&big).unwrap();
        assert_eq!(next(&mut client), (MessageKind::Binary, big.clone()));
        // Under the client's threshold (64 bytes): sent uncompressed, echoed compressed.
        client.send_text("short").unwrap();
        assert_eq!(next(&mut client).1, b"short");
        // Compression off: no offer, the same echo.
        let mut plain = Client::connect(&url, ClientConfig::default().compression(false)).unwrap();
        assert!(plain.compression().is_none());
        plain.send_text(JSON).unwrap();
        assert_eq!(next(&mut plain).1, JSON.as_bytes());
        server.handle().shutdown();
        server.join().unwrap();
    }
}

/// Echoes 3 messages per connection and records what it saw.
#[derive(Default)]
struct Echoes {
    agreed: Vec<Option<String>>,
    received: Vec<Vec<u8>>,
    closed: usize,
}

impl ClientHandler for Echoes {
    fn on_open(&mut self, conn: &mut LoopConn<'_>) {
        self.agreed.push(conn.compression().map(|a| a.response()));
        conn.send_text(JSON).unwrap();
    }

    fn on_message(&mut self, conn: &mut LoopConn<'_>, _kind: MessageKind, data: &[u8]) {
        self.received.push(data.to_vec());
        if self.received.len().is_multiple_of(3) {
            conn.close(CloseCode::NORMAL, "done").unwrap();
        } else {
            conn.send_text(JSON).unwrap();
        }
    }

    fn on_close(
        &mut self,
        _id: freeboard::client::ClientId,
        _close: freeboard::client::CloseEvent,
    ) {
        self.closed += 1;
    }

    fn on_error(&mut self, _id: freeboard::client::ClientId, error: ClientError) {
        panic!("{error}");
    }
}

#[test]
fn the_client_loop_asks_for_no_context_takeover_both_ways() {
    for mode in [Compression::Shared, Compression::Dedicated] {
        let server = server(mode);
        let url = format!("ws://{}/echo", server.local_addr());
        let mut clients = ClientLoop::new(ClientConfig::default(), Echoes::default()).unwrap();
        for _ in 0..4 {
            clients.connect(&url).unwrap();
        }
        clients.run_until(|h| h.closed == 4).unwrap();
        let echoes = clients.handler();
        let both = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";
        assert_eq!(echoes.agreed, vec![Some(both.to_owned()); 4], "{mode:?}");
        assert_eq!(echoes.received, vec![JSON.as_bytes().to_vec(); 12]);
        // Nothing stays drawn for compression once the connections are gone, but the loop's
        // compressor and decompressor.
        assert_eq!(clients.pool().counters().chunks_in_use, 0);
        server.handle().shutdown();
        server.join().unwrap();
    }
}

/// Raw deflate with a sync flush and the tail removed (§7.2.1), with `z`'s context.
fn deflate(z: &mut Compress, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 64);
    let start = z.total_in();
    loop {
        let at = (z.total_in() - start) as usize;
        z.compress_vec(&data[at..], &mut out, FlushCompress::Sync).unwrap();
        if (z.total_in() - start) as usize == data.len() && out.len() < out.capacity() {
            break;
        }
        out.reserve(out.capacity());
    }
    out.truncate(out.len() - 4);
    out
}

fn inflate(z: &mut Decompress, data: &[u8]) -> Vec<u8> {
    let mut input = data.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut out = Vec::with_capacity(1 << 20);
    z.decompress_vec(&input, &mut out, FlushDecompress::Sync).unwrap();
    out
}

/// A one-connection server that answers the upgrade with `extensions` (a raw header value,
/// or none) and then runs `then` on the socket; returns its address and the request it got.
fn fake_server(
    extensions: Option<&'static str>,
    then: impl FnOnce(TcpStream, Inbox) + Send + 'static,
) -> (SocketAddr, thread::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut inbox = Inbox::default();
        let head = inbox.head(&mut stream).unwrap().unwrap();
        let key =
            head.lines().find_map(|l| l.strip_prefix("Sec-WebSocket-Key: ")).expect("a key").trim();
        let accept = freeboard_proto::handshake::accept_key(key.as_bytes());
        let mut response = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {}\r\n",
            std::str::from_utf8(&accept).unwrap()
        );
        if let Some(extensions) = extensions {
            response.push_str(&format!("Sec-WebSocket-Extensions: {extensions}\r\n"));
        }
        response.push_str("\r\n");
        stream.write_all(response.as_bytes()).unwrap();
        then(stream, inbox);
        head
    });
    (addr, server)
}

fn recv(stream: &mut TcpStream, inbox: &mut Inbox) -> Frame {
    inbox.frame(stream).unwrap().expect("a frame")
}

/// What the client must do with each answer a server may give to its offer.
#[test]
fn every_answer_a_server_may_give() {
    let message = JSON.repeat(4);
    for (answer, server_context, window) in [
        (None, false, 15),
        (Some("permessage-deflate"), true, 15),
        (Some("permessage-deflate; client_no_context_takeover"), true, 15),
        (Some("permessage-deflate; server_no_context_takeover"), false, 15),
        (Some("permessage-deflate; server_max_window_bits=10"), true, 10),
        (Some("permessage-deflate; client_max_window_bits=9; server_max_window_bits=9"), true, 9),
        (
            Some("permessage-deflate; server_no_context_takeover; client_max_window_bits=15"),
            false,
            15,
        ),
    ] {
        let expected = message.clone();
        let (addr, server) = fake_server(answer, move |mut stream, mut inbox| {
            // The client's message: RSV1 with the extension (compressed afresh: the client
            // promised no context takeover), plain without.
            for _ in 0..2 {
                let f = recv(&mut stream, &mut inbox);
                match answer {
                    None => assert_eq!((f.rsv, &f.payload[..]), (0, expected.as_bytes())),
                    Some(_) => {
                        assert_eq!(f.rsv, 0b100);
                        let got = inflate(&mut Decompress::new(false), &f.payload);
                        assert_eq!(got, expected.as_bytes());
                    }
                }
            }
            // Two messages back, the second compressed with the first's context when the
            // server keeps it, then one uncompressed.
            let mut z = Compress::new_with_window_bits(Level::default(), false, window);
            for _ in 0..2 {
                let frame = match answer {
                    None => freeboard_test::frame(0x81, expected.as_bytes(), None),
                    Some(_) => {
                        if !server_context {
                            z.reset();
                        }
                        freeboard_test::frame(0xc1, &deflate(&mut z, expected.as_bytes()), None)
                    }
                };
                stream.write_all(&frame).unwrap();
            }
            stream.write_all(&freeboard_test::frame(0x82, b"raw", None)).unwrap();
            let close = recv(&mut stream, &mut inbox);
            assert_eq!(close.close_code(), 1000);
            stream.write_all(&freeboard_test::frame(0x88, &1000u16.to_be_bytes(), None)).unwrap();
        });
        let config = ClientConfig::default().compression_threshold(0);
        let mut client = Client::connect(&format!("ws://{addr}/"), config).unwrap();
        assert_eq!(client.compression().is_some(), answer.is_some(), "{answer:?}");
        client.send_text(&message).unwrap();
        client.send_text(&message).unwrap();
        assert_eq!(next(&mut client).1, message.as_bytes(), "{answer:?}");
        assert_eq!(next(&mut client).1, message.as_bytes(), "{answer:?}");
        assert_eq!(next(&mut client), (MessageKind::Binary, b"raw".to_vec()));
        client.close(CloseCode::NORMAL, "").unwrap();
        while let Ok(Event::Message(_)) = client.recv() {}
        let head = server.join().unwrap();
        assert!(
            head.contains(
                "Sec-WebSocket-Extensions: permessage-deflate; client_no_context_takeover; client_max_window_bits\r\n"
            ),
            "{head}"
        );
    }
    // Answers the client cannot honour fail the connection (RFC 7692 §5).
    for (answer, error) in [
        ("permessage-deflate; client_max_window_bits", Some(NegotiationError::InvalidValue)),
        ("permessage-deflate; client_max_window_bits=8", Some(NegotiationError::Unacceptable)),
        ("permessage-deflate; server_max_window_bits=16", Some(NegotiationError::InvalidValue)),
        ("permessage-deflate; mystery", Some(NegotiationError::UnknownParameter)),
        (
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            Some(NegotiationError::DuplicateParameter),
        ),
        ("permessage-deflate, permessage-deflate", Some(NegotiationError::Unacceptable)),
        ("x-webkit-deflate-frame", None),
    ] {
        let (addr, server) = fake_server(Some(answer), |_, _| {});
        let outcome = Client::connect(&format!("ws://{addr}/"), ClientConfig::default());
        match (outcome, error) {
            (Err(ClientError::Compression(e)), Some(want)) => assert_eq!(e, want, "{answer}"),
            (Err(ClientError::Handshake(_)), None) => {}
            (other, _) => panic!("{answer}: {other:?}"),
        }
        server.join().unwrap();
    }
    // Without the offer, any extension in the answer is a handshake failure.
    let (addr, server) = fake_server(Some("permessage-deflate"), |_, _| {});
    let config = ClientConfig::default().compression(false);
    let outcome = Client::connect(&format!("ws://{addr}/"), config);
    assert!(matches!(outcome, Err(ClientError::Handshake(_))), "{outcome:?}");
    let head = server.join().unwrap();
    assert!(!head.contains("Sec-WebSocket-Extensions"), "{head}");
}

/// A server that sends 64 MiB of zeros (about 64 KB compressed) to a client with a 1 MiB
/// limit: the client fails the connection with 1009 while inflating.
#[test]
fn a_bomb_from_the_server_gets_1009() {
    let (addr, server) = fake_server(Some("permessage-deflate"), |mut stream, mut inbox| {
        let bomb = deflate(&mut Compress::new(Level::best(), false), &vec![0u8; 64 << 20]);
        assert!(bomb.len() < 128 << 10, "{}", bomb.len());
        stream.write_all(&freeboard_test::frame(0xc2, &bomb, None)).unwrap();
        let close = recv(&mut stream, &mut inbox);
        assert_eq!(close.close_code(), 1009);
        let _ = stream.write_all(&freeboard_test::frame(0x88, &1009u16.to_be_bytes(), None));
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
    });
    let config = ClientConfig::default().limits(|limits| limits.max_message_size(1 << 20));
    let mut client = Client::connect(&format!("ws://{addr}/"), config).unwrap();
    match client.recv().unwrap() {
        Event::Closed(close) => assert_eq!(close.code, CloseCode::MESSAGE_TOO_BIG, "{close:?}"),
        Event::Message(m) => panic!("a message of {} bytes", m.len()),
    }
    assert_eq!(client.receive_pool().counters().chunks_in_use, 0);
    server.join().unwrap();
}
