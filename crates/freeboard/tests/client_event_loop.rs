//! The event-loop client: many connections in one thread against freeboard's echo server,
//! over `ws://` and `wss://` (a CA made at test time).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use freeboard::client::{
    ClientConfig, ClientError, ClientHandler, ClientId, ClientLoop, CloseCode, CloseEvent,
    LoopConn, MessageKind, PushOutcome, SendOutcome, Watermarks,
};
use freeboard::{Echo, Router, Server, ServerConfig, TlsConfig};
use freeboard_test::tls::TestCa;

const CONNECTIONS: usize = 1000;
const ROUNDS: usize = 5;

#[derive(Default)]
struct PingPong {
    opened: usize,
    echoes: HashMap<ClientId, usize>,
    closed: Vec<CloseEvent>,
    errors: Vec<String>,
}

impl ClientHandler for PingPong {
    fn on_open(&mut self, conn: &mut LoopConn<'_>) {
        self.opened += 1;
        let _ = conn.send_text(&format!("hello from {}", conn.id().0)).unwrap();
    }

    fn on_message(&mut self, conn: &mut LoopConn<'_>, kind: MessageKind, data: &[u8]) {
        assert_eq!(kind, MessageKind::Text);
        assert_eq!(data, format!("hello from {}", conn.id().0).as_bytes());
        let n = self.echoes.entry(conn.id()).or_default();
        *n += 1;
        if *n == ROUNDS {
            conn.close(CloseCode::NORMAL, "done").unwrap();
        } else {
            let _ = conn.send(kind, data).unwrap();
        }
    }

    fn on_close(&mut self, _id: ClientId, close: CloseEvent) {
        self.closed.push(close);
    }

    fn on_error(&mut self, id: ClientId, error: ClientError) {
        self.errors.push(format!("{id:?}: {error}"));
    }
}

#[test]
fn a_thousand_connections_in_one_thread() {
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.memory = 256 << 20;
    config.max_connections_per_ip = 100_000;
    config.limits.idle_timeout = None;
    let server = Server::bind(config, || Router::new().route("/", Echo)).unwrap().spawn();
    let url = format!("ws://{}/", server.local_addr());

    let mut clients = ClientLoop::new(ClientConfig::default(), PingPong::default()).unwrap();
    for _ in 0..CONNECTIONS {
        clients.connect(&url).unwrap();
    }
    let started = Instant::now();
    clients
        .run_until(|h| {
            assert!(started.elapsed() < Duration::from_secs(30), "stuck");
            h.closed.len() + h.errors.len() == CONNECTIONS
        })
        .unwrap();
    let handler = clients.handler();
    assert!(handler.errors.is_empty(), "{:?}", &handler.errors[..handler.errors.len().min(5)]);
    assert_eq!(handler.opened, CONNECTIONS);
    assert!(handler.echoes.values().all(|&n| n == ROUNDS));
    assert!(
        handler.closed.iter().all(|c| c.code == CloseCode::NORMAL && c.was_clean),
        "{:?}",
        handler.closed[0]
    );
    assert!(clients.is_empty());
    assert_eq!(clients.pool().chunks_in_use(), 0);
    server.handle().shutdown();
}

#[test]
fn connection_failures_reach_the_handler() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!("ws://{}/", listener.local_addr().unwrap());
    let config = ClientConfig::default()
        .limits(|limits| limits.handshake_timeout(Duration::from_millis(200)));
    let mut clients = ClientLoop::new(config, PingPong::default()).unwrap();
    clients.connect(&silent).unwrap();
    clients.run_until(|h| !h.errors.is_empty()).unwrap();
    assert!(clients.handler().errors[0].contains("handshake"), "{:?}", clients.handler().errors);
}

#[test]
fn connect_to_uses_the_address_given_and_never_resolves_the_name() {
    let server = common::start(common::config());
    // RFC 6761 §6.4: `.invalid` names never resolve; only the address given can be used.
    let url = format!("ws://freeboard.invalid:{}/", server.local_addr().port());
    let mut clients = ClientLoop::new(ClientConfig::default(), PingPong::default()).unwrap();
    assert!(matches!(clients.connect(&url), Err(ClientError::Resolve { .. })));
    clients.connect_to(&url, server.local_addr(), &[]).unwrap();
    let started = Instant::now();
    clients
        .run_until(|h| {
            assert!(started.elapsed() < Duration::from_secs(30), "stuck");
            h.closed.len() + h.errors.len() == 1
        })
        .unwrap();
    let handler = clients.handler();
    assert!(handler.errors.is_empty(), "{:?}", handler.errors);
    assert_eq!(handler.echoes.values().copied().collect::<Vec<_>>(), [ROUNDS]);
    common::stop_once_idle(server);
}

/// JSON-RPC style: every connection sends `REQUESTS` requests at once, then matches each
/// answer to its id, then closes.
#[derive(Default)]
struct InFlight {
    opened: usize,
    answered: HashMap<ClientId, Vec<bool>>,
    closed: Vec<CloseEvent>,
    errors: Vec<ClientError>,
}

const REQUESTS: usize = 1000;

impl ClientHandler for InFlight {
    fn on_open(&mut self, conn: &mut LoopConn<'_>) {
        self.opened += 1;
        for id in 0..REQUESTS {
            let request =
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"echo","params":[{id}]}}"#);
            let _ = conn.send_text(&request).unwrap();
        }
        self.answered.insert(conn.id(), vec![false; REQUESTS]);
    }

    fn on_message(&mut self, conn: &mut LoopConn<'_>, kind: MessageKind, data: &[u8]) {
        assert_eq!(kind, MessageKind::Text);
        let text = std::str::from_utf8(data).unwrap();
        let id: usize =
            text.split(r#""id":"#).nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
        let seen = self.answered.get_mut(&conn.id()).unwrap();
        assert!(!seen[id], "id {id} answered twice");
        seen[id] = true;
        if seen.iter().all(|&s| s) {
            conn.close(CloseCode::NORMAL, "done").unwrap();
        }
    }

    fn on_close(&mut self, _id: ClientId, close: CloseEvent) {
        self.closed.push(close);
    }

    fn on_error(&mut self, _id: ClientId, error: ClientError) {
        self.errors.push(error);
    }
}

fn tls_server(ca: &TestCa) -> freeboard::RunningServer {
    let mut config = common::config();
    config.memory = 256 << 20;
    config.tls = Some(
        TlsConfig::new(ca.cert_pem(), ca.key_pem()).with_listen("127.0.0.1:0".parse().unwrap()),
    );
    common::start(config)
}

fn run(clients: &mut ClientLoop<InFlight>, expected: usize) {
    let started = Instant::now();
    clients
        .run_until(|h| {
            assert!(started.elapsed() < Duration::from_secs(60), "stuck");
            h.closed.len() + h.errors.len() == expected
        })
        .unwrap();
}

#[test]
fn wss_a_thousand_requests_in_flight_per_connection_all_answered_and_matched() {
    const CONNECTIONS: usize = 20;
    let ca = TestCa::new("client-loop");
    let server = tls_server(&ca);
    let port = server.tls_addr().unwrap().port();
    let config = ClientConfig::default().ca_file(ca.ca_pem()).memory(64 << 20);
    let mut clients = ClientLoop::new(config, InFlight::default()).unwrap();
    // By name (SNI "localhost") and by address (verified against the certificate's IP names).
    for i in 0..CONNECTIONS {
        let host = if i % 2 == 0 { "localhost" } else { "127.0.0.1" };
        clients.connect(&format!("wss://{host}:{port}/echo")).unwrap();
    }
    // And a plain connection beside them, in the same loop.
    clients.connect(&format!("ws://{}/echo", server.local_addr())).unwrap();
    run(&mut clients, CONNECTIONS + 1);
    let handler = clients.handler();
    assert!(handler.errors.is_empty(), "{:?}", handler.errors);
    assert_eq!(handler.opened, CONNECTIONS + 1);
    assert!(handler.answered.values().all(|seen| seen.iter().all(|&s| s)));
    assert!(handler.closed.iter().all(|c| c.code == CloseCode::NORMAL && c.was_clean));
    assert_eq!(clients.pool().chunks_in_use(), 0);
    let metrics = server.metrics();
    assert_eq!(metrics.tls_handshakes(), CONNECTIONS as u64);
    // One TLS configuration per loop: once a ticket has come back, connections resume.
    let before = metrics.tls_resumptions();
    clients.connect(&format!("wss://localhost:{port}/echo")).unwrap();
    run(&mut clients, CONNECTIONS + 2);
    assert!(clients.handler().errors.is_empty(), "{:?}", clients.handler().errors);
    assert_eq!(metrics.tls_resumptions(), before + 1);
    common::stop_once_idle(server);
}

#[test]
fn wss_refuses_an_unknown_ca_and_a_certificate_for_another_name() {
    let ca = TestCa::new("trusted");
    let other = TestCa::new("untrusted");
    let server = tls_server(&ca);
    let port = server.tls_addr().unwrap().port();
    let url = format!("wss://localhost:{port}/echo");

    // A CA the client does not trust: the handshake fails, the server counts the alert.
    let config = ClientConfig::default().ca_file(other.ca_pem());
    let mut clients = ClientLoop::new(config, InFlight::default()).unwrap();
    clients.connect(&url).unwrap();
    run(&mut clients, 1);
    let errors = &clients.handler().errors;
    assert!(
        matches!(&errors[..], [ClientError::Tls(why)] if why.contains("a CA this client does not trust")),
        "{errors:?}"
    );
    common::wait_until("the alert to be counted", || {
        server.metrics().tls_refusals("alert_unknown_ca")
            + server.metrics().tls_refusals("alert_bad_certificate")
            == 1
    });

    // A certificate of the trusted CA, but for another name than the one asked for.
    let mut server_ca = ca;
    server_ca.issue_for("elsewhere", &["elsewhere.test"]);
    let mut config = common::config();
    config.tls = Some(
        TlsConfig::new(server_ca.cert_pem(), server_ca.key_pem())
            .with_listen("127.0.0.1:0".parse().unwrap()),
    );
    let elsewhere = common::start(config);
    let port = elsewhere.tls_addr().unwrap().port();
    let config = ClientConfig::default().ca_file(server_ca.ca_pem());
    let mut clients = ClientLoop::new(config, InFlight::default()).unwrap();
    clients.connect(&format!("wss://localhost:{port}/")).unwrap();
    clients.connect(&format!("wss://127.0.0.1:{port}/")).unwrap();
    run(&mut clients, 2);
    let errors = &clients.handler().errors;
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors
            .iter()
            .all(|e| matches!(e, ClientError::Tls(why) if why.contains("certificate is not for"))),
        "{errors:?}"
    );
    assert_eq!(clients.handler().opened, 0);

    // --insecure accepts it.
    let config = ClientConfig::default().insecure(true);
    let mut clients = ClientLoop::new(config, InFlight::default()).unwrap();
    clients.connect(&format!("wss://localhost:{port}/")).unwrap();
    run(&mut clients, 1);
    assert!(clients.handler().errors.is_empty(), "{:?}", clients.handler().errors);
    assert_eq!(clients.handler().closed.len(), 1);
    common::stop_once_idle(server);
    common::stop_once_idle(elsewhere);
}

/// Sends `BIG` messages of 512 KiB at once: the socket fills (over TLS rustls keeps the
/// records it could not write, and they leave as the socket drains), and each echo arrives
/// in many reads, reassembled for the handler.
#[derive(Default)]
struct Large {
    echoed: usize,
    closed: Vec<CloseEvent>,
    errors: Vec<ClientError>,
}

const BIG: usize = 8;

fn large_payload(i: usize) -> Vec<u8> {
    (0..512 * 1024).map(|j| (i * 31 + j * 7) as u8).collect()
}

impl ClientHandler for Large {
    fn on_open(&mut self, conn: &mut LoopConn<'_>) {
        for i in 0..BIG {
            let outcome = conn.send(MessageKind::Binary, &large_payload(i)).unwrap();
            assert_eq!(outcome, SendOutcome::Queue(PushOutcome::Queued));
        }
    }

    fn on_message(&mut self, conn: &mut LoopConn<'_>, kind: MessageKind, data: &[u8]) {
        assert_eq!(kind, MessageKind::Binary);
        assert!(data == large_payload(self.echoed), "echo {} differs", self.echoed);
        self.echoed += 1;
        if self.echoed == BIG {
            conn.close(CloseCode::NORMAL, "done").unwrap();
        }
    }

    fn on_close(&mut self, _id: ClientId, close: CloseEvent) {
        self.closed.push(close);
    }

    fn on_error(&mut self, _id: ClientId, error: ClientError) {
        self.errors.push(error);
    }
}

#[test]
fn large_messages_leave_as_the_socket_drains_and_are_reassembled_over_wss_and_ws() {
    let ca = TestCa::new("client-loop-large");
    let server = tls_server(&ca);
    let port = server.tls_addr().unwrap().port();
    let urls =
        [format!("wss://localhost:{port}/echo"), format!("ws://{}/echo", server.local_addr())];
    for url in urls {
        let marks = Watermarks::new(8 << 20, 16 << 20, 32 << 20).unwrap();
        let config = ClientConfig::default()
            .ca_file(ca.ca_pem())
            .memory(64 << 20)
            .limits(|limits| limits.watermarks(marks));
        let mut clients = ClientLoop::new(config, Large::default()).unwrap();
        clients.connect(&url).unwrap();
        let started = Instant::now();
        clients
            .run_until(|h| {
                assert!(started.elapsed() < Duration::from_secs(60), "stuck");
                h.closed.len() + h.errors.len() == 1
            })
            .unwrap();
        let handler = clients.handler();
        assert!(handler.errors.is_empty(), "{url}: {:?}", handler.errors);
        assert_eq!(handler.echoed, BIG, "{url}: {:?}", handler.closed);
        assert!(handler.closed[0].code == CloseCode::NORMAL && handler.closed[0].was_clean);
        assert_eq!(clients.pool().chunks_in_use(), 0);
    }
    common::stop_once_idle(server);
}

/// A producer that sends until a send answers above-high, then waits for `on_writable`: the
/// loop tells it when the queue has drained to the low watermark, every time, until all of
/// `STREAMED` messages have left. The server only counts them (an echo would fill the
/// client's socket while its queue is above the high watermark, where it does not read) and
/// answers the count at the end.
#[derive(Default)]
struct Producer {
    sent: usize,
    /// `buffered_amount` at each `on_writable`.
    drains: Vec<usize>,
    /// The largest `buffered_amount` right after a send.
    highest: usize,
    /// What the server counted.
    counted: Option<String>,
    closed: Vec<CloseEvent>,
    errors: Vec<ClientError>,
}

const STREAMED: usize = 256;
const PIECE: usize = 32 << 10;

impl Producer {
    fn produce(&mut self, conn: &mut LoopConn<'_>) {
        while self.sent < STREAMED {
            let outcome = conn.send(MessageKind::Binary, &[self.sent as u8; PIECE]).unwrap();
            self.sent += 1;
            self.highest = self.highest.max(conn.buffered_amount());
            if outcome == SendOutcome::Queue(PushOutcome::QueuedAboveHigh) {
                return;
            }
            assert_eq!(outcome, SendOutcome::Queue(PushOutcome::Queued));
        }
    }
}

impl ClientHandler for Producer {
    fn on_open(&mut self, conn: &mut LoopConn<'_>) {
        self.produce(conn);
    }

    fn on_writable(&mut self, conn: &mut LoopConn<'_>) {
        self.drains.push(conn.buffered_amount());
        self.produce(conn);
    }

    fn on_message(&mut self, conn: &mut LoopConn<'_>, _kind: MessageKind, data: &[u8]) {
        self.counted = Some(String::from_utf8_lossy(data).into_owned());
        conn.close(CloseCode::NORMAL, "done").unwrap();
    }

    fn on_close(&mut self, _id: ClientId, close: CloseEvent) {
        self.closed.push(close);
    }

    fn on_error(&mut self, _id: ClientId, error: ClientError) {
        self.errors.push(error);
    }
}

/// Counts the messages of a connection, checks each is the next one, and answers the count
/// after `STREAMED`.
#[derive(Default)]
struct Counter {
    seen: usize,
}

impl freeboard::Handler for Counter {
    fn on_message(&mut self, conn: &mut freeboard::Conn<'_>, message: freeboard::Message<'_>) {
        assert_eq!(message.data, &[self.seen as u8; PIECE][..]);
        self.seen += 1;
        if self.seen == STREAMED {
            let _ = conn.send(MessageKind::Text, self.seen.to_string().as_bytes());
        }
    }
}

#[test]
fn on_writable_comes_at_the_low_watermark_after_a_send_went_above_the_high() {
    let mut config = common::config();
    config.memory = 64 << 20;
    let server =
        Server::bind(config, || Router::new().route("/", Counter::default())).unwrap().spawn();
    let marks = Watermarks::new(64 << 10, 256 << 10, 16 << 20).unwrap();
    let config = ClientConfig::default().memory(32 << 20).limits(|limits| limits.watermarks(marks));
    let mut clients = ClientLoop::new(config, Producer::default()).unwrap();
    clients.connect(&format!("ws://{}/", server.local_addr())).unwrap();
    let started = Instant::now();
    clients
        .run_until(|h| {
            assert!(started.elapsed() < Duration::from_secs(30), "stuck: {} sent", h.sent);
            h.closed.len() + h.errors.len() == 1
        })
        .unwrap();
    let h = clients.handler();
    assert!(h.errors.is_empty(), "{:?}", h.errors);
    assert_eq!(h.counted.as_deref(), Some("256"));
    // 8 MiB through a 256 KiB high watermark: the producer waited for the drain many times.
    assert!(h.drains.len() >= 2, "{:?}", h.drains);
    assert!(h.drains.iter().all(|&b| b <= 64 << 10), "{:?}", h.drains);
    assert!(h.highest <= (256 << 10) + PIECE, "{}", h.highest);
    common::stop_once_idle(server);
}
