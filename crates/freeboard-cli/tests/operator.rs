//! What an operator sees of a running `freeboard serve`: `/metrics` read by Prometheus'
//! own Python parser, JSON log lines, SIGHUP changing a limit while open connections stay,
//! and `freeboard bench` failing loudly (a refused port, a 404 path, a failed threshold).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use common::{Process, Serve};

/// The admin token of the servers these tests start in production (with `--config`).
const ADMIN_TOKEN: &str = "operator-token";

/// The `[routes]` table that serves the echo routes in production.
const ECHO: &str = "\n[routes]\necho = true\n";

/// A plain GET; the whole response. It asks the server to close after it: a kept-alive
/// connection would only end at the server's idle timeout, as long as this read's.
fn get(addr: &str, path: &str) -> String {
    if path == "/metrics" {
        // Rebuilt at most every ADMIN_REFRESH: after that, the build is fresh.
        std::thread::sleep(freeboard::metrics::ADMIN_REFRESH);
    }
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The admin token of the servers started with --config (production, where the admin
    // routes need it); a server without one does not look at it.
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n").unwrap();
    write!(s, "Connection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// An upgrade to `/echo`: the stream and the status line's code.
fn upgrade(addr: &str) -> (TcpStream, u16) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && s.read_exact(&mut byte).is_ok() {
        head.push(byte[0]);
    }
    let status = String::from_utf8_lossy(&head).get(9..12).and_then(|c| c.parse().ok());
    (s, status.unwrap_or(0))
}

fn echo(s: &mut TcpStream, text: &[u8]) {
    s.write_all(&freeboard_test::frame(0x81, text, freeboard_test::TEST_MASK)).unwrap();
    let mut reply = vec![0u8; 2 + text.len()];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[2..], text);
}

/// The repository's test venv (made by `scripts/test`), if it has `module`.
fn venv_python(module: &str) -> Option<PathBuf> {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    let ok = Command::new(&python).args(["-c", &format!("import {module}")]).status();
    if ok.is_ok_and(|s| s.success()) {
        return Some(python);
    }
    assert!(
        std::env::var_os("FREEBOARD_REQUIRE_TOOLS").is_none(),
        "{} has no {module} (scripts/test installs it)",
        python.display()
    );
    eprintln!("SKIPPED: no {module} in {} (scripts/test installs it)", python.display());
    None
}

#[test]
fn prometheus_reads_metrics_without_a_warning() {
    let serve = Serve::start(&[]);
    let (mut ws, status) = upgrade(&serve.addr);
    assert_eq!(status, 101);
    echo(&mut ws, b"count me");
    drop(ws);
    let _ = get(&serve.addr, "/nowhere"); // a refusal, so a labelled series moves
    let response = get(&serve.addr, "/metrics");
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.contains("Content-Type: application/openmetrics-text; version=1.0.0"), "{head}");
    assert!(body.ends_with("# EOF\n"));
    let Some(python) = venv_python("prometheus_client") else { return };
    // The strict OpenMetrics parser, with every Python warning an error.
    let script = r#"
import sys, warnings
warnings.simplefilter("error")
from prometheus_client.openmetrics.parser import text_string_to_metric_families
families = {f.name: f for f in text_string_to_metric_families(sys.stdin.read())}
def value(name, **labels):
    for s in families[name].samples:
        if s.name.endswith(("_total", "_count")) or s.name == name:
            if all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
for name in ["process_cpu_seconds", "process_resident_memory_bytes", "freeboard_build",
             "freeboard_handshake_duration_seconds", "freeboard_send_queue_delay_seconds",
             "freeboard_message_size_bytes"]:
    assert name in families, name
assert families["freeboard_received_messages"].type == "counter"
assert families["freeboard_pool_chunks_capacity"].type == "gauge"
assert families["freeboard_message_size_bytes"].type == "histogram"
assert value("freeboard_received_messages") >= 1
assert value("freeboard_refusals", status="404") == 1
assert value("freeboard_refusals", status="503") == 0, "present from the start"
assert value("freeboard_drops", reason="conflate") == 0, "present from the start"
assert value("freeboard_handshake_duration_seconds") >= 1
for f in families.values():
    if f.type != "counter":
        assert not f.name.endswith("_total"), f.name
print(len(families))
"#;
    let mut child = Command::new(python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "prometheus_client: {}\n{body}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn json_logs_are_one_object_a_line_with_refusals_at_info() {
    let serve = Serve::start(&["--log-format", "json"]);
    let listening = serve.log_line("listening");
    let line: serde_json::Value = serde_json::from_str(&listening).unwrap();
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["addr"], serve.addr.as_str());
    let _ = get(&serve.addr, "/nowhere");
    let refused: serde_json::Value = serde_json::from_str(&serve.log_line("refused")).unwrap();
    assert_eq!(refused["status"], 404);
    assert_eq!(refused["why"], "no such route");
    assert!(!listening.contains('\u{1b}'), "no ANSI escapes in a pipe");
}

#[test]
fn text_logs_carry_no_colour_into_a_pipe() {
    let serve = Serve::start(&[]);
    let line = serve.log_line("listening");
    assert!(!line.contains('\u{1b}'), "{line:?}");
}

#[test]
fn sighup_lowers_a_limit_and_keeps_open_connections() {
    let dir = std::env::temp_dir().join(format!("freeboard-sighup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("serve.toml");
    std::fs::write(&file, format!("max_connections = 100\nslow_consumer = \"close\"\n{ECHO}"))
        .unwrap();
    let serve = Serve::start(&["--config", file.to_str().unwrap(), "--admin-token", ADMIN_TOKEN]);
    let mut open: Vec<TcpStream> = (0..2).map(|_| upgrade(&serve.addr).0).collect();
    std::fs::write(&file, format!("max_connections = 1\nslow_consumer = \"drop-oldest\"\n{ECHO}"))
        .unwrap();
    serve.signal(libc::SIGHUP);
    // (The start's capacity line names max_connections too: the reload's lines are asked for.)
    let changes = [serve.log_line("SIGHUP: changed"), serve.log_line("SIGHUP: changed")];
    let changed = changes.iter().find(|l| l.contains("max_connections")).expect("its change");
    assert!(changed.contains("100"), "{changed}");
    assert!(changes.iter().any(|l| l.contains("slow_consumer")), "{changes:?}");
    let (_, status) = upgrade(&serve.addr);
    assert_eq!(status, 503, "the new limit refuses a third connection");
    for ws in &mut open {
        echo(ws, b"still here");
    }
    let metrics = get(&serve.addr, "/metrics");
    assert!(metrics.contains("freeboard_config_reloads_total 1"), "{metrics}");
    // A setting that needs a restart is reported and left alone; the server stays up.
    std::fs::write(&file, format!("max_connections = 1\nchunk_size = \"8K\"\n{ECHO}")).unwrap();
    serve.signal(libc::SIGHUP);
    assert!(serve.log_line("chunk_size").contains("needs a restart"));
    echo(&mut open[0], b"and still");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One SIGHUP reloads both: the settings of the file and, with TLS, the certificate and key.
#[test]
fn one_sighup_reloads_the_settings_and_the_tls_certificate() {
    use freeboard::client::{Client, ClientConfig, Event};
    let ca = freeboard_test::tls::TestCa::new("sighup");
    let file = ca.dir().join("serve.toml");
    std::fs::write(&file, format!("max_connections = 100\n{ECHO}")).unwrap();
    let (cert, key) = (ca.cert_pem(), ca.key_pem());
    let tls = ["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()];
    let listen_tls = ["--listen-tls", "127.0.0.1:0", "--config", file.to_str().unwrap()];
    let args = [&["--threads", "1"][..], &tls, &listen_tls].concat();
    let serve = Serve::start(&args);
    let url = format!("wss://{}/echo", serve.wss.as_deref().expect("a wss:// address"));
    let connect = |ca: &freeboard_test::tls::TestCa| {
        Client::connect(&url, ClientConfig::default().ca_file(ca.ca_pem()))
    };
    let echo = |client: &mut Client, text: &str| {
        client.send_text(text).unwrap();
        match client.recv_timeout(Some(Duration::from_secs(10))).unwrap() {
            Some(Event::Message(m)) => assert_eq!(m.to_text().as_deref(), Some(text)),
            other => panic!("no echo: {other:?}"),
        }
    };
    let mut open = connect(&ca).unwrap();
    echo(&mut open, "before");
    // A new CA's pair in the same files, and a new limit in the same file; one signal.
    let next = freeboard_test::tls::TestCa::new("sighup-next");
    std::fs::copy(next.cert_pem(), ca.cert_pem()).unwrap();
    std::fs::copy(next.key_pem(), ca.key_pem()).unwrap();
    std::fs::write(&file, format!("max_connections = 50\n{ECHO}")).unwrap();
    serve.signal(libc::SIGHUP);
    serve.log_line("SIGHUP: TLS certificate and key reloaded");
    let changed = serve.log_line("max_connections");
    assert!(changed.contains("SIGHUP: changed") && changed.contains("50"), "{changed}");
    let mut fresh = connect(&next).unwrap();
    echo(&mut fresh, "new pair");
    assert!(connect(&ca).is_err(), "new handshakes get the new pair, not the old CA's");
    echo(&mut open, "still here");
}

fn bench(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_freeboard"))
        .arg("bench")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bench_fails_on_a_refused_port_and_a_404_path() {
    let port = common::free_port();
    let url = format!("ws://127.0.0.1:{port}/");
    let (code, stderr) = bench(&["echo", &url, "--messages", "10", "--repeat", "1"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("could not connect") && stderr.contains("refused"), "{stderr}");
    let serve = Serve::start(&[]);
    let url = format!("ws://{}/no-such-path", serve.addr);
    let (code, stderr) = bench(&["echo", &url, "--messages", "10", "--repeat", "1"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("404"), "{stderr}");
}

#[test]
fn bench_thresholds_set_the_exit_status() {
    let serve = Serve::start(&[]);
    let url = format!("ws://{}/", serve.addr);
    let run = |threshold: &str| {
        bench(&["echo", &url, "--messages", "200", "--repeat", "1", "--threshold", threshold])
    };
    let (code, stderr) = run("msg/s>1");
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = run("msg/s>1000M");
    assert_eq!(code, Some(99), "{stderr}");
    assert!(stderr.contains("threshold msg/s>1000M failed"), "{stderr}");
    let (code, stderr) = run("p99<5");
    assert_eq!(code, Some(2), "a bound without a unit is a usage error: {stderr}");
}

#[test]
fn bench_takes_ipv6_literals_as_the_client_does() {
    // Nothing listens on [::1]:1: the URL parses, and the failure is the connection's.
    let (code, stderr) = bench(&["echo", "ws://[::1]:1/", "--messages", "1", "--repeat", "1"]);
    assert_eq!(code, Some(1));
    assert!(!stderr.contains("invalid") && stderr.contains("could not connect"), "{stderr}");
}

/// `freeboard client ARGS`, its stdout lines and its stderr lines.
fn client(args: &[&str]) -> (Process, Receiver<String>, Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_freeboard"))
        .arg("client")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = |pipe: Box<dyn Read + Send>| {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        rx
    };
    let out = lines(Box::new(child.stdout.take().unwrap()));
    let err = lines(Box::new(child.stderr.take().unwrap()));
    (Process(child), out, err)
}

fn metric(addr: &str, series: &str) -> f64 {
    let text = get(addr, "/metrics");
    let line = text.lines().find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '));
    line.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(f64::NAN)
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_listening_client_gets_a_publish_and_ctrl_c_closes_with_1000() {
    let serve = Serve::start(&[]);
    // stdin is /dev/null, as for a job started with `&` in a script: --listen stays.
    let url = format!("ws://{}/topic/scores", serve.addr);
    let (mut child, out, _) = client(&["--listen", &url]);
    let subscriptions = "freeboard_topic_subscriptions";
    wait_until("the subscription", || metric(&serve.addr, subscriptions) == 1.0);
    let mut s = TcpStream::connect(&serve.addr).unwrap();
    write!(s, "POST /topic/scores HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\n2:1").unwrap();
    assert_eq!(out.recv_timeout(Duration::from_secs(20)).unwrap(), "2:1");
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGINT) }, 0);
    let status = child.0.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a clean close after Ctrl-C");
    wait_until("the close to be counted", || {
        metric(&serve.addr, "freeboard_closes_total{reason=\"normal\"}") == 1.0
    });
    assert_eq!(metric(&serve.addr, "freeboard_closes_total{reason=\"abnormal\"}"), 0.0);
}

#[test]
fn a_reconnecting_client_comes_back_when_the_server_does() {
    // Reserve a port, start the client against it before any server listens there.
    let port = common::free_port();
    let url = format!("ws://127.0.0.1:{port}/topic/news");
    let (mut child, out, err) = client(&["--listen", "--reconnect", &url]);
    let line = err.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(line.contains("could not connect") || line.contains("refused"), "{line}");
    assert!(err.recv_timeout(Duration::from_secs(20)).unwrap().contains("reconnecting in"));
    let _serve = Process(
        Command::new(env!("CARGO_BIN_EXE_freeboard"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--threads", "1"])
            .args(["--memory", "64M"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let addr = format!("127.0.0.1:{port}");
    wait_until("the client to be back", || {
        common::listening(&addr) && metric(&addr, "freeboard_topic_subscriptions") == 1.0
    });
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(s, "POST /topic/news HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok").unwrap();
    assert_eq!(out.recv_timeout(Duration::from_secs(20)).unwrap(), "ok");
    // SAFETY: kill(2) on our own children's pids.
    unsafe { libc::kill(child.0.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}
