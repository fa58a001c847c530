//! Who gets in, on real loopback sockets: origins, JWT bearer tokens and their topic grants,
//! expiry of open connections, upgrade decisions completed later, trusted proxies and the
//! PROXY protocol.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Client, config, wait_until};
use freeboard::auth::TOKEN_EXPIRED;
use freeboard::{
    Accepted, Conn, Decision, Echo, Handler, HttpRoute, Message, Request, Router, RunningServer,
    Server, ServerConfig,
};
use freeboard_topics::{Config as Topics, Service};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

const SECRET: &str = "a test secret that is at least 32 bytes long";

fn upgrade_with(path: &str, headers: &str) -> String {
    freeboard_test::upgrade_request(path, headers)
}

/// Upgrades with extra header lines (each ending in CRLF); the client, status and head.
fn connect_with(addr: SocketAddr, path: &str, headers: &str) -> (Client, u16, String) {
    let mut client = Client::raw(TcpStream::connect(addr).unwrap());
    client.stream.write_all(upgrade_with(path, headers).as_bytes()).unwrap();
    let head = client.read_head();
    let status = head[9..12].parse().unwrap();
    (client, status, head)
}

fn status(addr: SocketAddr, path: &str, headers: &str) -> u16 {
    connect_with(addr, path, headers).1
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn hs256(claims: serde_json::Value) -> String {
    let key = EncodingKey::from_secret(SECRET.as_bytes());
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).unwrap()
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}\r\n")
}

/// An echo at `/echo`, the topic service of `topics` at `/topic/` (on `config`'s hub
/// settings), `/metrics`.
fn topic_server(config: ServerConfig, mut topics: Topics) -> RunningServer {
    topics.hub = config.topics.clone();
    let service = Service::new(&topics).unwrap();
    let routes = move || {
        service.mount(Router::new().route("/echo", Echo).http("/metrics", HttpRoute::Metrics))
    };
    Server::bind(config, routes).unwrap().spawn()
}

fn stop(server: RunningServer) {
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn a_forged_origin_is_refused_and_counted() {
    let mut config = config();
    config.allowed_origins = vec!["https://app.example".into(), "https://*.example.org".into()];
    let server = topic_server(config, Topics::default());
    let addr = server.local_addr();
    let forged = status(addr, "/topic/admin?also=billing", "Origin: https://evil.example\r\n");
    assert_eq!(forged, 403);
    assert_eq!(status(addr, "/echo", "Origin: https://app.example\r\n"), 101);
    assert_eq!(status(addr, "/echo", "Origin: https://eu.example.org\r\n"), 101);
    assert_eq!(status(addr, "/echo", "Origin: null\r\n"), 403);
    // Not a browser: no Origin, nothing to protect.
    assert_eq!(status(addr, "/echo", ""), 101);
    let metrics = server.metrics();
    assert_eq!(metrics.access_refusals_for("origin"), 2);
    assert_eq!(metrics.refusals_for(403), 2);
    stop(server);
}

#[test]
fn tokens_grant_the_topics_they_list() {
    let config = config();
    let mut topics = Topics::default();
    topics.tokens.jwt_secret = Some(SECRET.into());
    let server = topic_server(config, topics);
    let addr = server.local_addr();
    let exp = now_secs() + 3600;
    let token = hs256(json!({"sub": "u42", "exp": exp, "subscribe": ["scores", "user-42.*"]}));

    let (_, missing, head) = connect_with(addr, "/topic/scores", "");
    assert_eq!(missing, 401);
    assert!(head.contains("WWW-Authenticate: Bearer"), "{head}");
    assert_eq!(status(addr, "/topic/scores", &bearer("not.a.jwt")), 401);
    let forged = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &json!({"exp": exp, "subscribe": ["*"]}),
        &EncodingKey::from_secret(b"somebody else's secret, 32 bytes or more"),
    )
    .unwrap();
    assert_eq!(status(addr, "/topic/scores", &bearer(&forged)), 401);
    // Past `exp` by more than the leeway (30 s by default).
    let expired = hs256(json!({"exp": now_secs() - 40, "subscribe": ["scores"]}));
    assert_eq!(status(addr, "/topic/scores", &bearer(&expired)), 401);
    // Every topic asked for must be granted.
    assert_eq!(status(addr, "/topic/scores?also=billing", &bearer(&token)), 403);

    assert_eq!(status(addr, "/topic/scores?also=user-42.inbox", &bearer(&token)), 101);
    // Browsers cannot set headers: the token may come as `access_token`.
    assert_eq!(status(addr, &format!("/topic/scores?access_token={token}"), ""), 101);
    // Routes other than the topics are not behind tokens.
    assert_eq!(status(addr, "/echo", ""), 101);

    let metrics = server.metrics();
    assert_eq!(metrics.access_refusals_for("token_missing"), 1);
    assert_eq!(metrics.access_refusals_for("token_invalid"), 2);
    assert_eq!(metrics.access_refusals_for("token_expired"), 1);
    assert_eq!(metrics.access_refusals_for("topic_not_granted"), 1);
    stop(server);
}

#[test]
fn an_open_connection_is_closed_with_4001_when_its_token_expires() {
    let config = config();
    let mut topics = Topics::default();
    topics.tokens.jwt_secret = Some(SECRET.into());
    // The grant lapses at `exp` plus the leeway: none here, so the test waits 2 s, not 32.
    topics.tokens.jwt_leeway = Duration::ZERO;
    let server = topic_server(config, topics);
    let addr = server.local_addr();
    let token = hs256(json!({"exp": now_secs() + 2, "subscribe": ["scores"]}));
    let (mut client, status, _) = connect_with(addr, "/topic/scores", &bearer(&token));
    assert_eq!(status, 101);
    assert_eq!(client.recv_close(), Some(TOKEN_EXPIRED.0));
    client.send(0x88, &TOKEN_EXPIRED.0.to_be_bytes());
    assert!(client.sees_eof());
    assert_eq!(server.metrics().token_expiries(), 1);
    stop(server);
}

#[test]
fn publishing_needs_a_publish_grant() {
    let config = config();
    let mut topics = Topics::default();
    topics.tokens.jwt_secret = Some(SECRET.into());
    topics.route.client_publish = true;
    let server = topic_server(config, topics);
    let addr = server.local_addr();
    let exp = now_secs() + 3600;
    let reader = hs256(json!({"exp": exp, "subscribe": ["scores"]}));
    let writer = hs256(json!({"exp": exp, "subscribe": ["scores"], "publish": ["scores"]}));
    let (mut subscriber, s, _) = connect_with(addr, "/topic/scores", &bearer(&reader));
    assert_eq!(s, 101);
    let (mut publisher, s, _) = connect_with(addr, "/topic/scores", &bearer(&writer));
    assert_eq!(s, 101);
    wait_until("two subscriptions", || server.metrics().subscriptions() == 2);
    publisher.send(0x81, b"2:1");
    assert_eq!(subscriber.recv(), Some((0x1, b"2:1".to_vec())));
    subscriber.send(0x81, b"forged score");
    assert_eq!(subscriber.recv_close(), Some(1008));
    stop(server);
}

#[test]
fn rs256_and_es256_tokens_are_checked_against_the_jwks() {
    let config = config();
    let mut topics = Topics::default();
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    topics.tokens.jwks_file = Some(format!("{fixtures}/test-jwks.json").into());
    let server = topic_server(config, topics);
    let addr = server.local_addr();
    let claims = json!({"exp": now_secs() + 3600, "subscribe": ["scores"]});
    let rsa = EncodingKey::from_rsa_der(include_bytes!("fixtures/test-rsa-private.der"));
    let ec = EncodingKey::from_ec_der(include_bytes!("fixtures/test-ec-private.der"));
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("rsa-1".into());
    let rs256 = jsonwebtoken::encode(&header, &claims, &rsa).unwrap();
    let es256 = jsonwebtoken::encode(&Header::new(Algorithm::ES256), &claims, &ec).unwrap();
    assert_eq!(status(addr, "/topic/scores", &bearer(&rs256)), 101);
    assert_eq!(status(addr, "/topic/scores", &bearer(&es256)), 101);
    // No HS256 secret is configured: an HS256 token (say, signed with the public key's
    // bytes, the classic algorithm confusion) has no key to be checked with.
    let jwks = std::fs::read(format!("{fixtures}/test-jwks.json")).unwrap();
    let confused = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(&jwks),
    )
    .unwrap();
    assert_eq!(status(addr, "/topic/scores", &bearer(&confused)), 401);
    // `alg: none` is never accepted.
    let none = format!(
        "{}.{}.",
        freeboard_test::b64url(br#"{"alg":"none","typ":"JWT"}"#),
        freeboard_test::b64url(claims.to_string().as_bytes())
    );
    assert_eq!(status(addr, "/topic/scores", &bearer(&none)), 401);
    // A kid the set does not have.
    header.kid = Some("rotated-away".into());
    let unknown = jsonwebtoken::encode(&header, &claims, &rsa).unwrap();
    assert_eq!(status(addr, "/topic/scores", &bearer(&unknown)), 401);
    assert_eq!(server.metrics().access_refusals_for("token_invalid"), 3);
    // Signed with the right key but not valid yet (`nbf` an hour ahead, beyond the 30 s
    // leeway), in the header and in the query; and one issued an hour in the future.
    header.kid = Some("rsa-1".into());
    let (now, exp) = (now_secs(), now_secs() + 7200);
    let early = json!({"exp": exp, "nbf": now + 3600, "subscribe": ["scores"]});
    let early = jsonwebtoken::encode(&header, &early, &rsa).unwrap();
    assert_eq!(status(addr, "/topic/scores", &bearer(&early)), 401);
    assert_eq!(status(addr, &format!("/topic/scores?access_token={early}"), ""), 401);
    let ahead = json!({"exp": exp, "iat": now + 3600, "subscribe": ["scores"]});
    let ahead = jsonwebtoken::encode(&header, &ahead, &rsa).unwrap();
    assert_eq!(status(addr, "/topic/scores", &bearer(&ahead)), 401);
    // Within the leeway both pass.
    let skewed = json!({"exp": exp, "nbf": now + 10, "iat": now + 10, "subscribe": ["scores"]});
    let skewed = jsonwebtoken::encode(&header, &skewed, &rsa).unwrap();
    assert_eq!(status(addr, "/topic/scores", &bearer(&skewed)), 101);
    assert_eq!(server.metrics().access_refusals_for("token_not_yet_valid"), 2);
    assert_eq!(server.metrics().access_refusals_for("token_issued_in_future"), 1);
    stop(server);
}

/// A user the authorizer looked up, attached to the connection.
struct User {
    name: String,
}

/// Decides on another thread, after a while: `/later?name=N` is accepted with `User { N }`,
/// anything else is refused 403.
struct SlowAuthorizer;

impl Handler for SlowAuthorizer {
    fn decide_upgrade(&mut self, request: &Request<'_, '_>, decision: Decision) {
        let name = request.path().split_once("?name=").map(|(_, n)| n.to_owned());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            match name {
                Some(name) => decision.accept(Accepted::new().data(User { name })),
                None => decision.reject_because(403, "unknown_user"),
            }
        });
    }

    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let name = conn.data::<User>().map(|u| u.name.clone()).unwrap_or_default();
        let _ = conn.send_text(&format!("hello {name}"));
    }

    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        let name = conn.data::<User>().map(|u| u.name.clone()).unwrap_or_default();
        let _ = conn.send_text(&format!("{name}: {}", message.as_text().unwrap_or("")));
    }
}

#[test]
fn a_decision_completed_on_another_thread_carries_data_into_the_handler() {
    let routes = || Router::new().route_with("/later", SlowAuthorizer, prefix());
    let server = Server::bind(config(), routes).unwrap().spawn();
    let addr = server.local_addr();
    let (mut alice, s, _) = connect_with(addr, "/later?name=alice", "");
    assert_eq!(s, 101);
    assert_eq!(alice.recv(), Some((0x1, b"hello alice".to_vec())));
    alice.send(0x81, b"hi");
    assert_eq!(alice.recv(), Some((0x1, b"alice: hi".to_vec())));
    assert_eq!(status(addr, "/later", ""), 403);
    assert_eq!(server.metrics().access_refusals_for("unknown_user"), 1);
    assert_eq!(server.metrics().pending_upgrades(), 0);
    stop(server);
}

fn prefix() -> freeboard::RouteOptions {
    freeboard::RouteOptions::new().prefix()
}

/// Keeps every decision and never completes one (until the test says so).
struct NeverDecides(Arc<Mutex<Vec<Decision>>>);

impl Handler for NeverDecides {
    fn decide_upgrade(&mut self, _: &Request<'_, '_>, decision: Decision) {
        self.0.lock().unwrap().push(decision);
    }

    fn on_message(&mut self, _: &mut Conn<'_>, _: Message<'_>) {}
}

/// A slow authorizer cannot hold more than `max_pending_upgrades` connections, each at most
/// the handshake timeout (then 503, counted); late decisions are ignored; a client of
/// another route is not held up.
#[test]
fn pending_decisions_are_bounded_and_time_out() {
    let mut config = config();
    config.max_pending_upgrades = 5;
    config.limits.handshake_timeout = Duration::from_secs(1);
    let parked = Arc::new(Mutex::new(Vec::new()));
    let held = parked.clone();
    let routes =
        move || Router::new().route("/slow", NeverDecides(held.clone())).route("/echo", Echo);
    let server = Server::bind(config, routes).unwrap().spawn();
    let addr = server.local_addr();
    let metrics = server.metrics();
    let mut waiting: Vec<TcpStream> = (0..5)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(upgrade_with("/slow", "").as_bytes()).unwrap();
            s
        })
        .collect();
    wait_until("five pending decisions", || metrics.pending_upgrades() == 5);
    let (_, full, head) = connect_with(addr, "/slow", "");
    assert_eq!(full, 503, "{head}");
    assert!(head.contains("Retry-After"), "{head}");
    let (mut innocent, s, _) = connect_with(addr, "/echo", "");
    assert_eq!(s, 101);
    innocent.send(0x81, b"still here");
    assert_eq!(innocent.recv(), Some((0x1, b"still here".to_vec())));
    for stream in &mut waiting {
        let mut client = Client::raw(stream.try_clone().unwrap());
        assert!(client.read_head().starts_with("HTTP/1.1 503"));
    }
    assert_eq!(metrics.access_refusals_for("decision_timeout"), 5);
    assert_eq!(metrics.access_refusals_for("pending_full"), 1);
    assert_eq!(metrics.pending_upgrades(), 0);
    // The authorizer answers at last: too late, ignored.
    for decision in parked.lock().unwrap().drain(..) {
        decision.accept(Accepted::new());
    }
    innocent.send(0x81, b"after");
    assert_eq!(innocent.recv(), Some((0x1, b"after".to_vec())));
    stop(server);
}

/// A decision dropped without an answer refuses the upgrade with 500 rather than leaving it
/// waiting.
#[test]
fn a_dropped_decision_refuses_with_500() {
    struct Forgets;
    impl Handler for Forgets {
        fn decide_upgrade(&mut self, _: &Request<'_, '_>, decision: Decision) {
            std::thread::spawn(move || drop(decision));
        }
        fn on_message(&mut self, _: &mut Conn<'_>, _: Message<'_>) {}
    }
    let server = Server::bind(config(), || Router::new().route("/", Forgets)).unwrap().spawn();
    assert_eq!(status(server.local_addr(), "/", ""), 500);
    stop(server);
}

/// Behind a trusted proxy the per-address limit applies to the forwarded client; from an
/// untrusted peer the headers are ignored.
#[test]
fn a_trusted_proxy_forwards_the_client_address_for_limits() {
    let mut config = config();
    config.max_connections_per_ip = 2;
    config.trusted_proxies = vec!["127.0.0.1/32".into()];
    let server = topic_server(config, Topics::default());
    let addr = server.local_addr();
    let from = |ip: &str| format!("X-Forwarded-For: {ip}\r\n");
    let mut open = Vec::new();
    for _ in 0..2 {
        let (c, s, _) = connect_with(addr, "/echo", &from("203.0.113.1"));
        assert_eq!(s, 101);
        open.push(c);
    }
    assert_eq!(connect_with(addr, "/echo", &from("203.0.113.1")).1, 429);
    let forwarded = "Forwarded: for=\"[2001:db8::7]:4711\";proto=https\r\n";
    for _ in 0..2 {
        let (c, s, _) = connect_with(addr, "/echo", forwarded);
        assert_eq!(s, 101);
        open.push(c);
    }
    // A client-written address left of an untrusted hop is not believed.
    let (c, s, _) = connect_with(addr, "/echo", &from("203.0.113.1, 198.51.100.5"));
    assert_eq!(s, 101);
    open.push(c);
    // Without headers the connection is the proxy's own.
    for _ in 0..2 {
        let (c, s, _) = connect_with(addr, "/echo", "");
        assert_eq!(s, 101);
        open.push(c);
    }
    assert_eq!(connect_with(addr, "/echo", "").1, 429);
    assert_eq!(server.metrics().forwarded(), 6);
    drop(open);
    stop(server);

    let mut config = common::config();
    config.max_connections_per_ip = 2;
    let server = topic_server(config, Topics::default());
    let addr = server.local_addr();
    let a = connect_with(addr, "/echo", &from("203.0.113.1"));
    let b = connect_with(addr, "/echo", &from("203.0.113.2"));
    assert_eq!((a.1, b.1), (101, 101));
    assert_eq!(connect_with(addr, "/echo", &from("203.0.113.3")).1, 429);
    assert_eq!(server.metrics().forwarded(), 0);
    drop((a, b));
    stop(server);
}

#[test]
fn the_proxy_protocol_names_the_client() {
    let mut config = config();
    config.max_connections_per_ip = 1;
    config.proxy_protocol = true;
    let server = topic_server(config, Topics::default());
    let addr = server.local_addr();
    let v1 = |ip: &str| format!("PROXY TCP4 {ip} 127.0.0.1 40000 9001\r\n");
    let connect = |preamble: &[u8]| {
        let mut client = Client::raw(TcpStream::connect(addr).unwrap());
        // In two writes: the header may arrive alone.
        client.stream.write_all(preamble).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        client.stream.write_all(upgrade_with("/echo", "").as_bytes()).unwrap();
        let head = client.read_head();
        (client, head[9..12].parse::<u16>().unwrap())
    };
    let (mut a, s) = connect(v1("192.0.2.1").as_bytes());
    assert_eq!(s, 101);
    a.send(0x81, b"through the balancer");
    assert_eq!(a.recv(), Some((0x1, b"through the balancer".to_vec())));
    assert_eq!(connect(v1("192.0.2.1").as_bytes()).1, 429);
    let mut v2 = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    v2.extend_from_slice(&[0x21, 0x11, 0, 12, 192, 0, 2, 2, 127, 0, 0, 1, 0x9c, 0x40, 0x23, 0x29]);
    let (b, s) = connect(&v2);
    assert_eq!(s, 101);
    // Without the header: 400, counted.
    assert_eq!(status(addr, "/echo", ""), 400);
    assert_eq!(server.metrics().access_refusals_for("proxy_header"), 1);
    assert_eq!(server.metrics().forwarded(), 3);
    drop((a, b));
    stop(server);
}

/// A connect webhook on loopback that answers each request with what `answer` returns for
/// its body (status, JSON), or never answers when it returns `None`; serves `n` requests.
fn webhook(n: usize, answer: fn(&str) -> Option<(u16, String)>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/connect", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().take(n) {
            let mut stream = stream.unwrap();
            let mut request = Vec::new();
            let mut chunk = [0u8; 4096];
            // The head, then the body its Content-Length announces.
            loop {
                let k = std::io::Read::read(&mut stream, &mut chunk).unwrap();
                request.extend_from_slice(&chunk[..k]);
                let text = String::from_utf8_lossy(&request);
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .map_or(0, |v| v.parse().unwrap());
                    if body.len() >= len {
                        break;
                    }
                }
            }
            let text = String::from_utf8_lossy(&request).into_owned();
            let body = text.split_once("\r\n\r\n").unwrap().1;
            match answer(body) {
                Some((status, json)) => {
                    let response = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
                        json.len()
                    );
                    stream.write_all(response.as_bytes()).unwrap();
                }
                None => held.push(stream),
            }
        }
        std::thread::sleep(Duration::from_secs(5));
    });
    url
}

fn webhook_server(url: String, timeout: Duration) -> RunningServer {
    let config = config();
    let mut topics = Topics::default();
    topics.webhook.connect_webhook = Some(url);
    topics.webhook.webhook_timeout = timeout;
    topics.route.client_publish = true;
    topics.hub = config.topics.clone();
    let service = Service::new(&topics).unwrap();
    Server::bind(config, move || service.mount(Router::new())).unwrap().spawn()
}

/// The backend decides: it sees the client, the topics and the token, grants topics (the
/// connection's publish rights follow its answer) or refuses.
#[test]
fn a_connect_webhook_grants_or_refuses() {
    let url = webhook(4, |body| {
        let request: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(request["client"].as_str().unwrap().split(':').next(), Some("127.0.0.1"));
        match request["token"].as_str() {
            Some("alice") => Some((200, r#"{"subscribe":["news*"],"publish":["news"]}"#.into())),
            Some("broken") => Some((200, "not json".into())),
            Some(_) => Some((403, "{}".into())),
            None => Some((200, "{}".into())),
        }
    });
    let server = webhook_server(url, Duration::from_secs(5));
    let addr = server.local_addr();
    let (mut alice, s, _) = connect_with(addr, "/topic/news", &bearer("alice"));
    assert_eq!(s, 101);
    assert_eq!(status(addr, "/topic/news", &bearer("mallory")), 403);
    // An answer that is not the JSON agreed on: 503, counted.
    assert_eq!(status(addr, "/topic/news", &bearer("broken")), 503);
    assert_eq!(server.metrics().access_refusals_for("webhook_error"), 1);
    // Without a subscribe list every topic asked for is granted, but nothing may be published.
    let (mut anonymous, s, _) = connect_with(addr, "/topic/news", "");
    assert_eq!(s, 101);
    wait_until("two subscriptions", || server.metrics().subscriptions() == 2);
    alice.send(0x81, b"headline");
    assert_eq!(anonymous.recv(), Some((0x1, b"headline".to_vec())));
    anonymous.send(0x81, b"forged headline");
    assert_eq!(anonymous.recv_close(), Some(1008));
    assert_eq!(server.metrics().access_refusals_for("webhook_refused"), 1);
    stop(server);
}

#[test]
fn a_connect_webhook_that_times_out_refuses_with_503() {
    let url = webhook(1, |_| None);
    let server = webhook_server(url, Duration::from_millis(300));
    let (_, s, head) = connect_with(server.local_addr(), "/topic/news", "");
    assert_eq!(s, 503, "{head}");
    assert_eq!(server.metrics().access_refusals_for("webhook_timeout"), 1);
    assert_eq!(server.metrics().pending_upgrades(), 0);
    stop(server);
}
