//! The plain HTTP side spoken as HTTP/1.1 on real loopback sockets: keep-alive and
//! pipelining, `Expect: 100-continue`, chunked bodies, methods, CORS, reason phrases, what a
//! publish reached, batch publish.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::{Client, config, metric, wait_until};
use freeboard::{HttpRoute, Router, RunningServer, Server, ServerConfig, SlowConsumerPolicy};

fn server(config: ServerConfig) -> RunningServer {
    let service = common::service(&config.topics, false);
    let routes = move || {
        service.mount(
            Router::new().http("/healthz", HttpRoute::Health).http("/metrics", HttpRoute::Metrics),
        )
    };
    Server::bind(config, routes).unwrap().spawn()
}

fn stop(server: RunningServer) {
    server.handle().shutdown();
    server.join().unwrap();
}

/// One HTTP/1.1 connection reading responses one at a time.
struct Http {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// A response: status line and headers, and the body.
struct Response {
    head: String,
    body: Vec<u8>,
}

impl Response {
    fn status(&self) -> u16 {
        self.head[9..12].parse().unwrap()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Http {
    fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Self { stream, buf: Vec::new() }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 65536];
        match self.stream.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Reads one response; `head_only` for a `HEAD` (no body whatever its length says).
    fn response(&mut self, head_only: bool) -> Response {
        let end = loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            assert!(self.fill(), "connection closed before a response head");
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end);
        let mut response = Response { head, body: Vec::new() };
        let len: usize = match (head_only, response.header("content-length")) {
            (false, Some(len)) => len.parse().unwrap(),
            _ => 0,
        };
        while self.buf.len() < len {
            assert!(self.fill(), "connection closed in a response body");
        }
        response.body = self.buf.drain(..len).collect();
        response
    }

    /// Whether the server closed the connection (after what was read).
    fn closed(&mut self) -> bool {
        !self.fill()
    }
}

fn post(topic: &str, headers: &str, body: &str) -> String {
    format!(
        "POST /topic/{topic} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The answer of a publish that reached `delivered` of this loop's subscribers and was
/// dropped for `dropped`.
fn reach(messages: u32, delivered: u32, dropped: u32) -> String {
    format!(
        "{{\"messages\":{messages},\"delivered\":{delivered},\"dropped\":{dropped},\"other_loops\":0,\"other_loops_dropped\":0,\"complete\":true}}\n"
    )
}

#[test]
fn publishes_over_one_kept_alive_connection() {
    let server = server(config());
    let addr = server.local_addr();
    let (mut sub, status, _) = Client::connect(addr, "/topic/scores");
    assert_eq!(status, 101);
    wait_until("the subscription", || server.metrics().subscriptions() == 1);
    let mut http = Http::connect(addr);
    for i in 0..200 {
        http.send(post("scores", "Content-Type: text/plain\r\n", &i.to_string()).as_bytes());
        let response = http.response(false);
        assert_eq!(response.status(), 200, "{}", response.head);
        assert_eq!(response.header("connection"), None, "kept alive");
        assert_eq!(response.text(), reach(1, 1, 0));
        assert_eq!(sub.recv(), Some((0x1, i.to_string().into_bytes())));
    }
    // Two TCP connections in all (the subscriber's and the publisher's), then the scrape's.
    assert_eq!(metric(addr, "freeboard_accepted_total"), 3.0);
    // Pipelined requests in one write, answered in order.
    http.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nHEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let first = http.response(false);
    assert_eq!((first.status(), first.text().as_str()), (200, "ok\n"));
    let head = http.response(true);
    assert_eq!((head.status(), head.header("content-length")), (200, Some("3")));
    let last = http.response(false);
    assert_eq!((last.status(), last.header("connection")), (200, Some("close")));
    assert!(http.closed());
    drop(sub);
    stop(server);
}

#[test]
fn expect_100_continue_and_chunked_bodies() {
    let server = server(config());
    let addr = server.local_addr();
    let (mut sub, _, _) = Client::connect(addr, "/topic/t");
    wait_until("the subscription", || server.metrics().subscriptions() == 1);
    let mut http = Http::connect(addr);
    http.send(b"POST /topic/t HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    assert_eq!(http.response(false).status(), 100);
    http.send(b"hello");
    assert_eq!(http.response(false).text(), reach(1, 1, 0));
    assert_eq!(sub.recv(), Some((0x1, b"hello".to_vec())));

    // Chunked, in pieces, with an extension and a trailer; then a pipelined GET.
    http.send(b"POST /topic/t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n5\r\nchu");
    std::thread::sleep(Duration::from_millis(20));
    http.send(b"nk\r\n7;x=y\r\ned body\r\n");
    std::thread::sleep(Duration::from_millis(20));
    http.send(b"0\r\nX-Checksum: 1\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let response = http.response(false);
    assert_eq!((response.status(), response.text()), (200, reach(1, 1, 0)));
    assert_eq!(sub.recv(), Some((0x1, b"chunked body".to_vec())));
    assert_eq!(http.response(false).text(), "ok\n");
    // Chunked all in the first read.
    http.send(b"POST /topic/t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n");
    assert_eq!(http.response(false).status(), 200);
    assert_eq!(sub.recv(), Some((0x2, b"hi".to_vec())));

    let refused = |request: &str| common::http(addr, request)[..12].to_owned();
    let chunked = "POST /topic/t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n";
    assert_eq!(refused(&format!("{chunked}\r\nzz\r\n")), "HTTP/1.1 400");
    assert_eq!(refused(&format!("{chunked}Content-Length: 4\r\n\r\n0\r\n\r\n")), "HTTP/1.1 400");
    let too_big = format!("{chunked}\r\n{:x}\r\n", 2 << 20);
    assert_eq!(refused(&too_big), "HTTP/1.1 413");
    // RFC 9112 §6.3: a final coding other than chunked is 400; §6.1: one the server does
    // not implement before chunked, 501.
    let gzip = "POST /topic/t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n";
    assert_eq!(refused(gzip), "HTTP/1.1 400");
    let gzip = format!("{chunked}Transfer-Encoding: gzip\r\n\r\n0\r\n\r\n");
    assert_eq!(refused(&gzip), "HTTP/1.1 400");
    let gzip_chunked = chunked.replace("chunked", "gzip, chunked");
    assert_eq!(refused(&format!("{gzip_chunked}\r\n0\r\n\r\n")), "HTTP/1.1 501");
    drop(sub);
    stop(server);
}

#[test]
fn methods_reason_phrases_and_cors() {
    let mut config = config();
    config.topics.cors_origins = vec!["https://app.example".into()];
    let server = server(config);
    let addr = server.local_addr();
    let ask = |request: &str| {
        let mut http = Http::connect(addr);
        http.send(request.as_bytes());
        http.response(request.starts_with("HEAD"))
    };
    let options = ask("OPTIONS /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(options.status(), 204);
    assert_eq!(options.header("allow"), Some("GET, HEAD, OPTIONS"));
    let delete = ask("DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(delete.head.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{}", delete.head);
    assert_eq!(delete.header("allow"), Some("GET, HEAD, OPTIONS"));
    let put = ask("PUT /topic/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    assert_eq!((put.status(), put.header("allow")), (405, Some("POST, OPTIONS")));
    let big = ask("POST /topic/x HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n");
    assert!(big.head.starts_with("HTTP/1.1 413 Content Too Large\r\n"), "{}", big.head);
    let get = ask("GET /topic/x HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(get.head.starts_with("HTTP/1.1 426 Upgrade Required\r\n"), "{}", get.head);

    let preflight = ask("OPTIONS /topic/x HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\n\
         Access-Control-Request-Method: POST\r\n\r\n");
    assert_eq!(preflight.status(), 204);
    assert_eq!(preflight.header("access-control-allow-origin"), Some("https://app.example"));
    assert_eq!(preflight.header("access-control-allow-methods"), Some("POST, OPTIONS"));
    let published = ask(&post("x", "Origin: https://app.example\r\n", "hi"));
    assert_eq!(published.header("access-control-allow-origin"), Some("https://app.example"));
    // Another origin is refused before anything is published (CORS would only have hidden
    // the answer from the page).
    let other = ask(&post("x", "Origin: https://evil.example\r\n", "hi"));
    assert_eq!((other.status(), other.header("access-control-allow-origin")), (403, None));
    stop(server);
}

/// JSON is published as text (a browser gets a string, not a Blob); the answer says how many
/// subscribers a message reached and for how many it was dropped; a batch publishes many.
#[test]
fn json_is_text_the_answer_counts_subscribers_and_batches_publish_many() {
    let mut config = config();
    config.limits.max_message_size = 4 << 20;
    config.topics.send_low = 16 << 10;
    config.topics.send_high = 32 << 10;
    config.topics.send_cap = 64 << 10;
    config.topics.slow_consumer = SlowConsumerPolicy::DropNewest;
    let server = server(config);
    let addr = server.local_addr();
    let (mut a, _, _) = Client::connect(addr, "/topic/a");
    let (mut b, _, _) = Client::connect(addr, "/topic/b?also=a");
    wait_until("the subscriptions", || server.metrics().subscriptions() == 3);
    let json = common::http(addr, &post("a", "Content-Type: application/json\r\n", "{\"x\":1}"));
    assert!(json.ends_with(&reach(1, 2, 0)), "{json}");
    assert_eq!(a.recv(), Some((0x1, b"{\"x\":1}".to_vec())));
    assert_eq!(b.recv(), Some((0x1, b"{\"x\":1}".to_vec())));

    // Larger than every subscriber's send cap once framed: refused before a byte is kept.
    let huge = "z".repeat(2 << 20);
    let answer = common::http(addr, &post("a", "", &huge));
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:.100}");

    let batch = r#"[{"topic":"a","data":"one"},{"topic":"b","data":{"two":2}}]"#;
    let answer = common::http(addr, &post("", "Content-Type: application/json\r\n", batch));
    assert!(answer.ends_with(&reach(2, 3, 0)), "{answer}");
    assert_eq!(a.recv(), Some((0x1, b"one".to_vec())));
    assert_eq!(b.recv(), Some((0x1, b"one".to_vec())));
    assert_eq!(b.recv(), Some((0x1, b"{\"two\":2}".to_vec())));
    let bad = common::http(addr, &post("", "", "[{\"topic\":\"no such\",\"data\":1}]"));
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    let bad = common::http(addr, &post("", "", "not json"));
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
    drop((a, b));
    stop(server);
}

/// With several event loops the answer waits for every loop that took a copy: it counts
/// every subscriber, wherever it is, and pipelined publishes are still answered in order.
#[test]
fn the_answer_counts_the_subscribers_of_every_loop() {
    let mut config = config();
    config.threads = 2;
    // Not `conflate`: the batch's two messages reach each subscriber in one turn, and the
    // second would replace the first.
    config.topics.slow_consumer = SlowConsumerPolicy::DropNewest;
    let server = server(config);
    let addr = server.local_addr();
    let mut subscribers: Vec<Client> = (0..20)
        .map(|_| {
            let (c, status, _) = Client::connect(addr, "/topic/wide");
            assert_eq!(status, 101);
            c
        })
        .collect();
    wait_until("the subscriptions", || server.metrics().subscriptions() == 20);
    let delivered = |answer: &Response| {
        let text = answer.text();
        assert!(text.contains("\"complete\":true"), "{text}");
        let n = text.split("\"delivered\":").nth(1).unwrap().split(',').next().unwrap();
        n.parse::<u32>().unwrap()
    };
    let mut http = Http::connect(addr);
    for i in 0..5 {
        http.send(post("wide", "Content-Type: text/plain\r\n", &format!("m{i}")).as_bytes());
        let answer = http.response(false);
        assert_eq!(delivered(&answer), 20, "{}", answer.text());
        // The kernel spreads 20 connections over both loops (all on one: odds of 2 in 2^20).
        assert!(answer.text().contains("\"other_loops\":1"), "{}", answer.text());
    }
    // Two publishes in one write: two answers, in order, each after its own reports.
    let two = [post("wide", "", "p1"), post("wide", "", "p2")].concat();
    http.send(two.as_bytes());
    assert_eq!(delivered(&http.response(false)), 20);
    assert_eq!(delivered(&http.response(false)), 20);
    let batch = r#"[{"topic":"wide","data":"b1"},{"topic":"wide","data":"b2"}]"#;
    http.send(post("", "", batch).as_bytes());
    assert_eq!(delivered(&http.response(false)), 40);
    for s in &mut subscribers {
        for expected in ["m0", "m1", "m2", "m3", "m4"] {
            assert_eq!(s.recv(), Some((0x1, expected.as_bytes().to_vec())));
        }
        assert_eq!(s.recv(), Some((0x2, b"p1".to_vec())));
        assert_eq!(s.recv(), Some((0x2, b"p2".to_vec())));
        assert_eq!(s.recv(), Some((0x1, b"b1".to_vec())));
        assert_eq!(s.recv(), Some((0x1, b"b2".to_vec())));
    }
    drop(subscribers);
    stop(server);
}

/// A refused request whose sender writes the whole body before it reads (as most simple
/// clients do) still gets its answer: the server reads and discards what was in flight, up to
/// a bound, instead of closing on unread bytes, which would reset the connection and lose the
/// answer (RFC 9112 §9.6). Without the discarding, the sender would wait for the server's
/// linger deadline (2 s) to end the stalled transfer: the answer must come well before it.
#[test]
fn a_refused_body_is_read_and_discarded_so_its_sender_gets_the_answer() {
    let mut config = config();
    config.topics.send_cap = 64 << 10;
    let server = server(config);
    for _ in 0..3 {
        let mut stream = TcpStream::connect(server.local_addr()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let body = vec![b'x'; 900 << 10];
        let head = format!(
            "POST /topic/big HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let started = std::time::Instant::now();
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(&body).expect("the refused body is read, not reset");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
        assert!(started.elapsed() < Duration::from_millis(1500), "{:?}", started.elapsed());
    }
    stop(server);
}
