//! What a user meets first, each case as a person would run it: the defaults of `freeboard
//! serve` (publishing behind the access control that subscribing has, a cross-origin `POST`
//! refused before it publishes, the demo and production), answers that say what happened,
//! `--help` against the program's behaviour, errors in words (TLS, listen addresses, URLs,
//! `since`), the client that reconnects and shows its handshake, `--redis-required`, and the
//! last line a shutdown logs.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Process, Serve};
use freeboard_test::Inbox;

const SECRET: &str = "a secret of at least thirty-two bytes!";

/// A `POST` with `headers` (each line ending `\r\n`); the status and the body.
fn post(addr: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    response(&mut s)
}

/// A `GET`; the status and the body.
fn get(addr: &str, path: &str, headers: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n").unwrap();
    response(&mut s)
}

fn response(s: &mut TcpStream) -> (u16, String) {
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    (status, body)
}

/// An upgrade to `path` with `extra` header lines: the socket, its inbox, the status and the
/// refusal's body.
fn upgrade(addr: &str, path: &str, extra: &str) -> (TcpStream, Inbox, u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(freeboard_test::upgrade_request(path, extra).as_bytes()).unwrap();
    // The head byte by byte: what follows it (a body, frames) stays in the socket.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && s.read_exact(&mut byte).is_ok() {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    let status = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let inbox = Inbox::default();
    let mut body = String::new();
    if status != 101 {
        let _ = s.read_to_string(&mut body);
    }
    (s, inbox, status, body)
}

/// A subscriber to `topic`, its subscription known to the server once this returns.
fn subscribe(serve: &Serve, topic: &str, extra: &str) -> (TcpStream, Inbox) {
    let (s, inbox, status, body) = upgrade(&serve.addr, &format!("/topic/{topic}"), extra);
    assert_eq!(status, 101, "{body}");
    (s, inbox)
}

/// The next frame's opcode and payload (panics after the read timeout).
fn next(s: &mut TcpStream, inbox: &mut Inbox) -> (u8, String) {
    let f = inbox.frame(s).unwrap().expect("a frame");
    (f.opcode, String::from_utf8_lossy(&f.payload).into_owned())
}

/// Whether nothing arrives within half a second.
fn silent(s: &mut TcpStream, inbox: &mut Inbox) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let quiet = inbox.frame(s).is_err();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    quiet
}

fn freeboard() -> Command {
    Command::new(env!("CARGO_BIN_EXE_freeboard"))
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("freeboard-first-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------------------------------------
// Safe defaults

/// `serve --jwt-secret`: subscribing needs a token, and so does publishing: a `POST` without
/// one is refused and reaches nobody; a token whose `publish` claim grants the topic publishes.
#[test]
fn with_jwt_access_a_post_needs_a_token_that_grants_publishing() {
    let serve = Serve::start(&["--jwt-secret", SECRET]);
    let far = 4_102_444_800u64; // 2100
    let reader = freeboard_test::hs256_jwt(
        SECRET,
        &format!(r#"{{"exp":{far},"subscribe":["scores"],"publish":[]}}"#),
    );
    let writer =
        freeboard_test::hs256_jwt(SECRET, &format!(r#"{{"exp":{far},"publish":["scores"]}}"#));
    let (mut sub, mut inbox) =
        subscribe(&serve, "scores", &format!("Authorization: Bearer {reader}\r\n"));
    let text = "Content-Type: text/plain\r\n";

    let (status, body) = post(&serve.addr, "/topic/scores", text, "no token");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("bearer token"), "{body}");
    let bearer = |t: &str| format!("{text}Authorization: Bearer {t}\r\n");
    let (status, body) = post(&serve.addr, "/topic/scores", &bearer(&reader), "read only");
    assert_eq!(status, 403, "a token without the publish claim: {body}");
    let (status, body) = post(&serve.addr, "/topic/scores", &bearer("forged.token.x"), "forged");
    assert_eq!(status, 401, "{body}");
    assert!(silent(&mut sub, &mut inbox), "a refused POST published nothing");

    let (status, body) = post(&serve.addr, "/topic/scores", &bearer(&writer), "2:1");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"delivered\":1"), "{body}");
    assert_eq!(next(&mut sub, &mut inbox), (0x1, "2:1".into()));
}

/// A `POST` from a page of another origin (a browser sends `Origin`) is refused before it
/// publishes unless `--publish-cors-origin` allows that origin; the server's own origin and
/// non-browser clients (no `Origin`) publish.
#[test]
fn a_cross_origin_post_is_refused_before_it_publishes() {
    let serve = Serve::start(&["--publish-cors-origin", "https://allowed.example"]);
    let (mut sub, mut inbox) = subscribe(&serve, "scores", "");
    let text = "Content-Type: text/plain\r\n";
    let from = |origin: &str| format!("{text}Origin: {origin}\r\n");

    let (status, body) = post(&serve.addr, "/topic/scores", &from("https://evil.example"), "x");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("evil.example") && body.contains("cors"), "{body}");
    assert!(silent(&mut sub, &mut inbox), "the refused POST reached a subscriber");

    let own = format!("http://{}", serve.addr);
    for (origin, message) in [("https://allowed.example", "allowed"), (own.as_str(), "own")] {
        let (status, body) = post(&serve.addr, "/topic/scores", &from(origin), message);
        assert_eq!(status, 200, "{origin}: {body}");
        assert_eq!(next(&mut sub, &mut inbox), (0x1, message.into()));
    }
    let (status, _) = post(&serve.addr, "/topic/scores", text, "curl");
    assert_eq!(status, 200);
    assert_eq!(next(&mut sub, &mut inbox), (0x1, "curl".into()));
}

/// With `--config` (production) the echo routes are off unless asked for, `/metrics` and
/// `/dashboard` are served only behind an admin token (or on the admin listener), and a
/// `POST` needs a credential; the demo (no `--config`) serves all of them on loopback.
#[test]
fn production_serves_echo_metrics_and_anonymous_posts_only_when_asked() {
    let dir = temp_dir("production");
    let file = dir.join("serve.toml");
    std::fs::write(&file, "max_connections = 100\n").unwrap();
    let production = Serve::start(&["--config", file.to_str().unwrap()]);
    let (_, _, status, _) = upgrade(&production.addr, "/echo", "");
    assert_eq!(status, 404, "no echo in production");
    assert_eq!(get(&production.addr, "/metrics", "").0, 404, "no unguarded /metrics");
    assert_eq!(get(&production.addr, "/dashboard", "").0, 404, "no unguarded /dashboard");
    let (status, body) = post(&production.addr, "/topic/a", "", "x");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("publish token"), "{body}");
    assert_eq!(get(&production.addr, "/healthz", "").0, 200);
    let log = production.log_line("defaults");
    assert!(log.contains("production"), "{log}");
    drop(production);

    std::fs::write(
        &file,
        "[routes]\necho = true\n[admin]\ntoken = \"admin-t0ken\"\n[topics]\npublish_token = \"p\"\n",
    )
    .unwrap();
    let asked = Serve::start(&["--config", file.to_str().unwrap()]);
    let (_, _, status, _) = upgrade(&asked.addr, "/echo", "");
    assert_eq!(status, 101, "echo asked for");
    assert_eq!(get(&asked.addr, "/metrics", "").0, 401, "behind the admin token");
    let admin = "Authorization: Bearer admin-t0ken\r\n";
    assert_eq!(get(&asked.addr, "/metrics", admin).0, 200);
    assert_eq!(post(&asked.addr, "/topic/a", "Authorization: Bearer p\r\n", "x").0, 200);
    drop(asked);

    let demo = Serve::start(&[]);
    let (_, _, status, _) = upgrade(&demo.addr, "/echo", "");
    assert_eq!(status, 101, "the demo echoes");
    assert_eq!(get(&demo.addr, "/metrics", "").0, 200, "to loopback clients");
    assert_eq!(post(&demo.addr, "/topic/a", "", "x").0, 200, "the demo publishes openly");
    assert!(demo.log_line("defaults").contains("demo"));
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Truthful answers, and --help against the program

/// The keys of the JSON object template after `after` in `text` (`"key":` each).
fn keys_after(text: &str, after: &str) -> Vec<String> {
    let at = text.find(after).unwrap_or_else(|| panic!("{after:?} not in {text}"));
    let rest = &text[at + after.len()..];
    let end = rest.find(['}', '`']).unwrap_or(rest.len());
    keys(&rest[..end])
}

/// Every `"key":` of `json`, in order.
fn keys(json: &str) -> Vec<String> {
    json.split('"')
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[1].trim_start().starts_with(':'))
        .map(|w| w[0].to_owned())
        .collect()
}

fn serve_help() -> String {
    let out = freeboard().args(["serve", "--help"]).output().unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// The answer `serve --help` promises is the one `POST` gives, field for field (and with
/// `--redis` too); the content types it calls text are published as text.
#[test]
fn serve_help_describes_the_publish_answer_and_the_text_types() {
    let help = serve_help().split_whitespace().collect::<Vec<_>>().join(" ");
    let promised = keys_after(&help, "and answers `");
    let serve = Serve::start(&[]);
    let (mut sub, mut inbox) = subscribe(&serve, "t", "");
    let (status, answer) = post(&serve.addr, "/topic/t", "Content-Type: text/plain\r\n", "x");
    assert_eq!(status, 200);
    assert_eq!(keys(&answer), promised, "help: {help}\nanswer: {answer}");
    next(&mut sub, &mut inbox);

    for (content_type, opcode) in [
        ("text/plain; charset=utf-8", 0x1),
        ("application/json", 0x1),
        ("application/ld+json", 0x1),
        ("application/octet-stream", 0x2),
        ("image/png", 0x2),
    ] {
        let (status, _) =
            post(&serve.addr, "/topic/t", &format!("Content-Type: {content_type}\r\n"), "{}");
        assert_eq!(status, 200);
        assert_eq!(next(&mut sub, &mut inbox).0, opcode, "{content_type}");
    }
    for named in ["text/*", "application/json", "application/*+json"] {
        assert!(help.contains(named), "help does not name {named}");
    }

    // With a Redis that is down: the keys help adds for --redis, and a status that is not 200.
    let port = common::free_port();
    let redis = format!("redis://127.0.0.1:{port}/");
    let with_redis = Serve::start(&["--redis", &redis, "--threads", "1"]);
    let (status, answer) = post(&with_redis.addr, "/topic/t", "", "x");
    let mut expected = promised.clone();
    let last = expected.pop().unwrap(); // "complete" stays last
    expected.extend(keys_after(&help, "with --redis also `"));
    expected.push(last);
    assert_eq!(keys(&answer), expected, "{answer}");
    assert_eq!(status, 202, "queued for a Redis that is down is not delivered: {answer}");
    assert!(answer.contains("\"redis_connected\":false"), "{answer}");
}

/// `--log-format json` writes the keys `--help` names, and no `"tls":"None"`.
#[test]
fn json_logs_have_the_keys_help_names() {
    let serve = Serve::start(&["--log-format", "json"]);
    let line = serve.log_line("listening");
    let object: serde_json::Value = serde_json::from_str(&line).unwrap();
    let help = freeboard().args(["--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let at = help.find("one object per line:").expect("help names the keys");
    for key in help[at..].split('`').skip(1).step_by(2).take(4) {
        assert!(object.get(key).is_some(), "{key} named by --help, not in {line}");
    }
    assert_eq!(object["addr"], serve.addr.as_str(), "the event's fields beside them: {line}");
    assert!(object.get("tls").is_none() && !line.contains("None"), "{line}");
}

/// A bench run whose connections fail says why (the close code the server gave), and states
/// up front how long its runs take (`--duration` is per run, `--repeat` multiplies it) and at
/// the end how long it took.
#[test]
fn bench_explains_its_failures_and_states_its_duration() {
    let serve = Serve::start(&["--threads", "1", "--max-message-size", "100"]);
    let url = format!("ws://{}/echo", serve.addr);
    let bench = |size: &str| {
        freeboard()
            .args(["bench", "pipeline", &url, "--clients", "2", "--size", size])
            .args(["--duration", "0.5", "--repeat", "2", "--in-flight", "4"])
            .output()
            .unwrap()
    };
    let out = bench("1024");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "failed connections are not a clean run: {stderr}");
    assert!(stderr.contains("1 cases × 2 runs × 0.5 s = 1 s of load"), "the plan: {stderr}");
    assert!(
        stderr.contains("2 × closed by the server with 1009"),
        "every failure and the close code the server gave: {stderr}"
    );
    let out = bench("64");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("took ") && !stderr.contains("failed"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// Errors in words

/// `--listen` takes a name and a bare port (loopback); `:PORT` is refused with the fix.
#[test]
fn listen_takes_names_and_a_bare_port() {
    for (listen, expect) in [("localhost:0", "ws://127.0.0.1:"), ("0", "ws://127.0.0.1:")] {
        let mut child = Process(
            freeboard()
                .args(["serve", "--threads", "1", "--memory", "16M", "--listen", listen])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let mut line = String::new();
        BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(line.contains(expect), "--listen {listen}: {line}");
    }
    let out = freeboard().args(["serve", "--listen", ":9301"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("0.0.0.0:9301"), "{stderr}");
    let out =
        freeboard().args(["serve", "--listen", "no-such-host.invalid:9301"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("does not resolve"), "{stderr}");
}

/// `freeboard client HOST:PORT/PATH` assumes ws://.
#[test]
fn the_client_takes_host_port_without_a_scheme() {
    let serve = Serve::start(&[]);
    let out = client(&[&format!("{}/echo", serve.addr)], "hi\n");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
}

fn client(args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = freeboard()
        .arg("client")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// `?since=` that cannot be an offset, or on a topic that keeps no history: 400 before the
/// upgrade, saying which; anything shaped like an offset on a history topic is taken (and
/// told 4410 once open if this server did not issue it).
#[test]
fn since_is_checked_before_the_upgrade() {
    let serve = Serve::start(&["--history", "10", "--history-prefix", "h:"]);
    let (_, _, status, body) = upgrade(&serve.addr, "/topic/h:a?since=gar%20bage", "");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not an offset"), "{body}");
    let (_, _, status, body) = upgrade(&serve.addr, "/topic/plain?since=1-1", "");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("keeps no history") && body.contains("h:"), "{body}");
    let (_, _, status, body) = upgrade(&serve.addr, "/topic/h:a?since=1-1", "");
    assert_eq!(status, 101, "{body}");
    let none = Serve::start(&[]);
    let (_, _, status, body) = upgrade(&none.addr, "/topic/a?since=1-1", "");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("keeps no history"), "{body}");
}

/// The certificate the usual `openssl req -x509` line makes (CA:TRUE): trusted with `--ca` as
/// curl does; without it, the error says it is self-signed and to pass `--ca`. A certificate
/// for another name, an expired one and one from an unknown CA are each explained.
#[test]
fn tls_errors_say_what_is_wrong_and_how_to_fix_it() {
    let dir = temp_dir("tls");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])
        .args(["-nodes", "-days", "30", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status();
    if !made.is_ok_and(|s| s.success()) {
        assert!(std::env::var_os("FREEBOARD_REQUIRE_TOOLS").is_none(), "openssl is missing");
        eprintln!("SKIPPED: openssl is not installed");
        return;
    }
    let tls = |cert: &Path, key: &Path| {
        Serve::start(&["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()])
    };
    let wss = |serve: &Serve| format!("wss://{}/echo", serve.wss.as_deref().unwrap());
    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();

    let self_signed = tls(&cert, &key);
    let trusted = client(&["--ca", cert.to_str().unwrap(), &wss(&self_signed)], "hi\n");
    assert!(trusted.status.success(), "{}", stderr(&trusted));
    assert_eq!(String::from_utf8_lossy(&trusted.stdout), "hi\n");
    let untrusted = client(&[&wss(&self_signed)], "hi\n");
    assert_eq!(untrusted.status.code(), Some(1));
    let said = stderr(&untrusted);
    assert!(said.contains("self-signed") && said.contains("--ca FILE"), "{said}");
    assert!(!said.contains("Other(") && !said.contains("Context {"), "{said}");

    let mut ca = freeboard_test::tls::TestCa::new("first-user");
    ca.issue_for("elsewhere", &["elsewhere.example"]);
    let elsewhere = tls(&ca.cert_pem(), &ca.key_pem());
    let said = stderr(&client(&["--ca", ca.ca_pem().to_str().unwrap(), &wss(&elsewhere)], ""));
    assert!(said.contains("not for 127.0.0.1") && said.contains("elsewhere.example"), "{said}");
    drop(elsewhere);

    ca.issue_expired("expired");
    let expired = tls(&ca.cert_pem(), &ca.key_pem());
    let said = stderr(&client(&["--ca", ca.ca_pem().to_str().unwrap(), &wss(&expired)], ""));
    assert!(said.contains("expired on 2021-12-31") && said.contains("renew"), "{said}");
    drop(expired);

    ca.issue("fine");
    let fine = tls(&ca.cert_pem(), &ca.key_pem());
    let said = stderr(&client(&["--ca", cert.to_str().unwrap(), &wss(&fine)], ""));
    assert!(said.contains("CA this client does not trust"), "unknown CA: {said}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// The client that stays connected

/// A server restarted gracefully (close 1001) is where a subscriber wants to come back:
/// `--listen --reconnect` waits, reconnects and prints what the new server publishes; `-v`
/// shows the handshake, the subprotocol and the extensions.
#[test]
fn the_client_reconnects_after_a_graceful_restart_and_shows_its_handshake() {
    let port = common::free_port().to_string();
    let mut first = start_on(&port);
    let url = format!("ws://127.0.0.1:{port}/topic/news");
    let mut client = Process(
        freeboard()
            .args(["client", "--listen", "--reconnect", "-v", &url])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (lines, errors) = lines_of(&mut client);
    let said = wait_for(&errors, "extensions:");
    assert!(said.contains("permessage-deflate"), "{said}");
    wait_until(|| post(&first.addr, "/topic/news", "", "one").1.contains("\"delivered\":1"));
    assert_eq!(lines.recv_timeout(Duration::from_secs(10)).unwrap(), "one");
    first.signal(libc::SIGTERM);
    assert!(first.wait().success());
    wait_for(&errors, "1001");
    wait_for(&errors, "reconnecting in");
    let second = start_on(&port);
    wait_until(|| post(&second.addr, "/topic/news", "", "two").1.contains("\"delivered\":1"));
    assert_eq!(lines.recv_timeout(Duration::from_secs(10)).unwrap(), "two");
    assert!(client.0.try_wait().unwrap().is_none(), "still running");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(client.0.id() as libc::pid_t, libc::SIGTERM) };
    assert!(client.0.wait().unwrap().success());
}

fn start_on(port: &str) -> Serve {
    Serve::start(&["--listen", &format!("127.0.0.1:{port}"), "--compression", "shared"])
}

/// The child's stdout and stderr lines, as they come.
fn lines_of(
    child: &mut Process,
) -> (std::sync::mpsc::Receiver<String>, std::sync::mpsc::Receiver<String>) {
    let spawn = |from: Box<dyn Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(from).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        rx
    };
    let out = spawn(Box::new(child.0.stdout.take().unwrap()));
    let err = spawn(Box::new(child.0.stderr.take().unwrap()));
    (out, err)
}

/// The first line from `lines` that contains `what` (waits up to 20 s).
fn wait_for(lines: &std::sync::mpsc::Receiver<String>, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(what) => return line,
            Ok(_) => {}
            Err(e) => panic!("no line with {what:?}: {e}"),
        }
    }
}

/// Tries `done` every 100 ms for up to 20 s.
fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "not done within 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------------------------
// Getting it

/// `--redis-required` with a Redis nobody serves: exit 1 at once, saying why; without it the
/// server starts (and serves its own subscribers).
#[test]
fn redis_required_fails_fast() {
    let redis = format!("redis://127.0.0.1:{}/", common::free_port());
    let started = Instant::now();
    let out = freeboard()
        .args(["serve", "--listen", "127.0.0.1:0", "--threads", "1", "--memory", "16M"])
        .args(["--redis", &redis, "--redis-required"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot reach Redis") && out.stdout.is_empty(), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(10), "fast: {:?}", started.elapsed());
    let serve = Serve::start(&["--redis", &redis]);
    assert_eq!(get(&serve.addr, "/healthz", "").0, 200);
    // While Redis stays away the server says so once (per connection it keeps trying), then
    // once a minute: not a line every second or two.
    let lines = serve.log_lines_for(Duration::from_secs(4));
    let warnings = lines.iter().filter(|l| l.contains("WARN")).count();
    assert!((1..=3).contains(&warnings), "{warnings} warnings in 4 s: {lines:#?}");
    assert!(lines.iter().any(|l| l.contains("repeated once a minute")), "{lines:#?}");
}

/// SIGTERM drains, then the last line says what was open, what the drain closed and what the
/// server did.
#[test]
fn shutdown_ends_with_a_line_of_counts() {
    let mut serve = Serve::start(&[]);
    let (mut ws, _, status, _) = upgrade(&serve.addr, "/echo", "");
    assert_eq!(status, 101);
    serve.signal(libc::SIGTERM);
    // Answer the server's close so the drain completes.
    let mut frame = [0u8; 4];
    ws.read_exact(&mut frame).unwrap();
    let close = freeboard_test::frame(0x88, &1001u16.to_be_bytes(), freeboard_test::TEST_MASK);
    ws.write_all(&close).unwrap();
    let line = serve.log_line("stopped");
    for part in ["open_at_signal=1", "closed_in_drain=1", "cut_at_drain_timeout=0", "accepted="] {
        assert!(line.contains(part), "{part} not in {line}");
    }
    assert!(serve.wait().success());
}

/// The README's quick start, run as written (with the `freeboard` of this build on the PATH and
/// a free port for 9001): it waits for the server and for the subscriber, so the echo and the
/// publication arrive every time.
#[test]
fn the_readme_quick_start_runs_as_written() {
    use std::os::unix::process::CommandExt;
    if Command::new("curl").arg("--version").output().is_err() {
        assert!(std::env::var_os("FREEBOARD_REQUIRE_TOOLS").is_none(), "curl is missing");
        eprintln!("SKIPPED: curl is not installed");
        return;
    }
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let section = &readme[readme.find("## Quick start: run a server").unwrap()..];
    let start = section.find("```sh\n").unwrap() + "```sh\n".len();
    let block = &section[start..start + section[start..].find("```").unwrap()];
    let port = common::free_port().to_string();
    let script: String = block
        .lines()
        .filter(|line| !line.starts_with("cargo install"))
        .map(|line| line.replace("9001", &port) + "\n")
        .collect();
    assert!(script.contains("freeboard serve") && script.contains("curl"), "{script}");
    let dir = temp_dir("quick-start");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_freeboard"), dir.join("freeboard")).unwrap();
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    /// The shell and what it left in the background (its process group), ended when dropped.
    struct Group(Process);
    impl Drop for Group {
        fn drop(&mut self) {
            // SAFETY: kill(2) on the process group our own child leads (`process_group(0)`).
            unsafe { libc::kill(-(self.0.0.id() as libc::pid_t), libc::SIGTERM) };
        }
    }
    let mut shell = Process(
        Command::new("bash")
            .args(["-c", &script])
            .env("PATH", path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let (lines, _) = lines_of(&mut shell);
    let mut shell = Group(shell);
    let shell = &mut shell.0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while shell.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the quick start did not finish within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(shell.0.wait().unwrap().success());
    // The server's URL line, then what the clients print.
    let printed: Vec<String> = (0..3)
        .filter_map(|_| lines.recv_timeout(Duration::from_secs(10)).ok())
        .filter(|line| !line.starts_with("freeboard listening on"))
        .collect();
    // The server and the subscriber it left in the background: its process group.
    // SAFETY: kill(2) on the process group our own child led (`process_group(0)`).
    unsafe { libc::kill(-(shell.0.id() as libc::pid_t), libc::SIGTERM) };
    assert_eq!(printed, ["hello", "2:1"], "what the quick start says it prints");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The repository's root.
fn repository() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every Markdown file of the repository with a Rust snippet (README.md, the book, the crates'
/// READMEs) is compiled with the doctests of some crate (`include_str!` under `cfg(doctest)`),
/// and no snippet there opts out with `ignore`.
#[test]
fn every_rust_snippet_of_the_docs_is_compiled() {
    let root = repository();
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs"), root.join("crates")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() && !path.ends_with("target") {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    // What the crates' doctests include: `include_str!("…")` in each lib.rs, resolved.
    let mut included = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap().map(Result::unwrap) {
        let src = entry.path().join("src");
        let Ok(lib) = std::fs::read_to_string(src.join("lib.rs")) else { continue };
        for (at, _) in lib.match_indices("include_str!(\"") {
            let path = &lib[at + "include_str!(\"".len()..];
            let path = &path[..path.find('"').unwrap()];
            if let Ok(file) = src.join(path).canonicalize() {
                included.insert(file);
            }
        }
    }
    let mut checked = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        if !text.contains("```rust") {
            continue;
        }
        let relative = file.strip_prefix(&root).unwrap().display().to_string();
        assert!(!text.contains("```rust,ignore"), "{relative}: a snippet opts out of compiling");
        assert!(
            included.contains(&file.canonicalize().unwrap()),
            "{relative} has Rust snippets no doctest compiles"
        );
        checked += 1;
    }
    assert!(checked >= 7, "Markdown files with Rust snippets: {checked}");
}

/// deploy/: the systemd unit passes `systemd-analyze verify` (with this build's binary where
/// the unit says /usr/local/bin), the Dockerfile builds in one stage and runs in another as a
/// non-root user, and the configuration both run with starts a production server; the
/// licenses Cargo.toml names are there.
#[test]
fn the_deploy_recipes_hold() {
    let root = repository();
    let deploy = root.join("deploy");
    if Command::new("systemd-analyze").arg("--version").output().is_ok() {
        let dir = temp_dir("unit");
        let unit = std::fs::read_to_string(deploy.join("freeboard.service")).unwrap();
        let unit = unit.replace("/usr/local/bin/freeboard", env!("CARGO_BIN_EXE_freeboard"));
        std::fs::write(dir.join("freeboard.service"), unit).unwrap();
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(dir.join("freeboard.service"))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
        std::fs::remove_dir_all(&dir).unwrap();
    } else {
        eprintln!("SKIPPED: systemd-analyze is not installed");
    }

    let dockerfile = std::fs::read_to_string(deploy.join("Dockerfile")).unwrap();
    let stages: Vec<&str> = dockerfile.split("\nFROM ").skip(1).collect();
    assert_eq!(stages.len(), 2, "a build stage and a run stage");
    assert!(stages[0].contains("cargo build") && stages[0].contains("--profile dist"));
    let run = stages[1];
    assert!(run.contains("COPY --from=build") && !run.contains("cargo"), "a small final stage");
    let user = run.lines().find_map(|l| l.strip_prefix("USER ")).expect("a USER line");
    assert!(!user.starts_with('0') && !user.starts_with("root"), "non-root: {user}");
    assert!(run.contains("deploy/serve.toml") && run.contains("--config"));

    let production = Serve::start(&[
        "--config",
        deploy.join("serve.toml").to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    assert!(production.log_line("defaults").contains("production"));
    assert_eq!(get(&production.addr, "/healthz", "").0, 200);

    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("license = \"MIT OR Apache-2.0\""));
    let mit = std::fs::read_to_string(root.join("LICENSE-MIT")).unwrap();
    let apache = std::fs::read_to_string(root.join("LICENSE-APACHE")).unwrap();
    assert!(mit.starts_with("MIT License") && apache.contains("Apache License"));
    assert!(apache.contains("Version 2.0, January 2004"));
    assert!(std::fs::read_to_string(root.join("CHANGELOG.md")).unwrap().starts_with("# Changelog"));
}
