//! The event-loop client: many connections in one thread against freeboard's echo server.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use freeboard::client::{
    ClientConfig, ClientError, ClientHandler, ClientId, ClientLoop, CloseCode, CloseEvent,
    LoopConn, MessageKind,
};
use freeboard::{Echo, Router, Server, ServerConfig};

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
    config.idle_timeout = None;
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
    let config = ClientConfig::default().handshake_timeout(Duration::from_millis(200));
    let mut clients = ClientLoop::new(config, PingPong::default()).unwrap();
    clients.connect(&silent).unwrap();
    clients.run_until(|h| !h.errors.is_empty()).unwrap();
    assert!(clients.handler().errors[0].contains("handshake"), "{:?}", clients.handler().errors);
    assert!(matches!(clients.connect("wss://x/"), Err(ClientError::TlsNotSupported)));
}
