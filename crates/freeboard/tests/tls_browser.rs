//! A real browser over `wss://`: headless Chromium (Debian's `chromium`, which `scripts/test`
//! installs) opens a page that connects to freeboard over TLS with permessage-deflate
//! (`compression = shared`, as `freeboard serve --compression shared`), checks
//! `ws.extensions`, echoes text and binary messages (small ones, sent uncompressed under the
//! threshold, and compressed ones of 70 and 100 KB that span several TLS records), and
//! reports the outcome on a second WebSocket. The test CA is not installed anywhere: Chromium trusts the
//! server's key through `--ignore-certificate-errors-spki-list`.
//!
//! Skipped (with a message) when no `chromium` is on the PATH; `FREEBOARD_REQUIRE_BROWSER=1`
//! turns the skip into a failure (CI sets it).

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::config;
use freeboard::{Conn, Echo, Handler, Message, Router, Server, TlsConfig};
use freeboard_test::browser::{Browser, chromium};
use freeboard_test::tls::TestCa;

/// Forwards every text message it gets to the test.
struct Report(mpsc::Sender<String>);

impl Handler for Report {
    fn on_message(&mut self, _conn: &mut Conn<'_>, message: Message<'_>) {
        let _ = self.0.send(message.as_text().unwrap_or("(binary)").to_owned());
    }
}

const PAGE: &str = r#"<!doctype html><title>freeboard wss</title><script>
const port = PORT;
const report = (text) => {
  const r = new WebSocket(`wss://localhost:${port}/report`);
  r.onopen = () => { r.send(text); r.close(1000); };
};
const ws = new WebSocket(`wss://localhost:${port}/echo`);
ws.binaryType = "arraybuffer";
const big = new Uint8Array(100000).map((_, i) => (i * 7) & 255);
const expected = ["hello from chromium", new Uint8Array([0, 1, 2, 255]), "x".repeat(70000), big];
let next = 0;
const same = (a, b) => {
  if (typeof b === "string") return a === b;
  if (!(a instanceof ArrayBuffer)) return false;
  const u = new Uint8Array(a);
  return u.length === b.length && u.every((v, i) => v === b[i]);
};
ws.onopen = () => {
  // permessage-deflate: Chromium offers it, freeboard (--compression shared) accepts it.
  if (!ws.extensions.startsWith("permessage-deflate")) { report(`FAIL extensions "${ws.extensions}"`); return; }
  ws.send(expected[0]);
};
ws.onmessage = (event) => {
  if (!same(event.data, expected[next])) { report(`FAIL message ${next}`); ws.close(); return; }
  next += 1;
  if (next === expected.length) { report(`OK ${next} ${ws.extensions}`); ws.close(1000); return; }
  ws.send(expected[next]);
};
ws.onerror = () => report("FAIL error");
</script>"#;

#[test]
fn chromium_echoes_text_and_binary_over_wss_with_permessage_deflate() {
    let Some(chromium) = chromium() else { return };
    let ca = TestCa::new("browser");
    let mut config = config();
    config.tls = Some(TlsConfig::new(ca.cert_pem(), ca.key_pem()));
    config.compression = freeboard::Compression::Shared;
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let server = Server::bind(config, move || {
        let tx = tx.lock().unwrap().clone();
        Router::new().route("/echo", Echo).route("/report", Report(tx))
    })
    .unwrap()
    .spawn();
    let port = server.tls_addr().unwrap().port();
    let page = PAGE.replace("PORT", &port.to_string());
    let profile = ca.dir().join("chromium-profile");
    let flags = [
        // The page is a data: URL (an opaque origin); Chromium's local network access checks
        // would stop it from reaching 127.0.0.1.
        "--disable-features=LocalNetworkAccessChecks,PrivateNetworkAccessSendPreflights,BlockInsecurePrivateNetworkRequests".to_owned(),
        format!("--ignore-certificate-errors-spki-list={}", ca.spki_sha256),
    ];
    let url = format!("data:text/html;base64,{}", base64_encode(page.as_bytes()));
    let browser = Browser::start(&chromium, &profile, &flags, &url);
    let outcome = rx.recv_timeout(Duration::from_secs(60));
    // Stop this browser (by its PID) before asserting.
    drop(browser);
    let metrics = server.metrics();
    let outcome = outcome.unwrap_or_else(|_| {
        let text = metrics.encode();
        let tls: Vec<&str> = text.lines().filter(|l| l.starts_with("freeboard_tls")).collect();
        panic!("no report from chromium within 60 s; {}", tls.join("; "))
    });
    assert_eq!(
        outcome,
        "OK 4 permessage-deflate; server_no_context_takeover; client_no_context_takeover"
    );
    let metrics = server.metrics();
    assert!(metrics.tls_handshakes() >= 2);
    server.handle().shutdown();
    server.join().unwrap();
}

fn base64_encode(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
