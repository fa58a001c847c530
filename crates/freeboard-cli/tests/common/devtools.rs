//! Headless Chromium driven over the DevTools protocol (spoken with freeboard's own client):
//! the browser tests' page handle, shared by tests/dashboard.rs and tests/chaos.rs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use freeboard::client::{Client, ClientConfig, Event};
use freeboard_test::browser::Browser;

/// The DevTools protocol over one page's WebSocket.
pub(crate) struct DevTools {
    client: Client,
    next_id: u64,
}

impl DevTools {
    /// Sends `method` with `params`; its result.
    pub(crate) fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next_id += 1;
        let id = self.next_id;
        let request = serde_json::json!({ "id": id, "method": method, "params": params });
        self.client.send_text(&request.to_string()).unwrap();
        loop {
            let event = self.client.recv_timeout(Some(Duration::from_secs(30))).unwrap();
            match event.unwrap_or_else(|| panic!("no answer to {method} within 30 s")) {
                Event::Message(message) => {
                    let reply: serde_json::Value =
                        serde_json::from_slice(&message.to_vec()).unwrap();
                    if reply["id"] == id {
                        assert!(reply.get("error").is_none(), "{method}: {reply}");
                        return reply["result"].clone();
                    }
                }
                Event::Closed(close) => panic!("DevTools closed: {close:?}"),
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    pub(crate) fn eval(&mut self, expression: &str) -> serde_json::Value {
        let params = serde_json::json!({ "expression": expression, "returnByValue": true });
        self.call("Runtime.evaluate", params)["result"]["value"].clone()
    }

    /// The value a JavaScript promise resolves to in the page.
    pub(crate) fn eval_async(&mut self, expression: &str) -> serde_json::Value {
        let params = serde_json::json!({
            "expression": expression, "returnByValue": true, "awaitPromise": true
        });
        self.call("Runtime.evaluate", params)["result"]["value"].clone()
    }

    /// The text of the element with `id`.
    pub(crate) fn text(&mut self, id: &str) -> String {
        let value = self.eval(&format!("document.getElementById('{id}').textContent"));
        value.as_str().unwrap_or_default().to_owned()
    }

    /// Waits (up to 30 s) until `check` holds for the page.
    pub(crate) fn wait_for(&mut self, what: &str, mut check: impl FnMut(&mut Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !check(self) {
            assert!(Instant::now() < deadline, "the dashboard never showed {what}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A plain GET, read to its `Content-Length` (the DevTools server keeps connections open).
pub(crate) fn get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // One write: `write!` would send the pieces of the format one by one, and a server whose
    // budget cannot hold a partial head (`an_event_stream_the_budget_cannot_hold_gets_503`)
    // answers one that arrives in pieces 503.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 16 << 10];
    loop {
        let text = String::from_utf8_lossy(&bytes);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse().ok())?
            });
            if length.is_some_and(|n: usize| body.len() >= n) {
                return text.into_owned();
            }
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return String::from_utf8_lossy(&bytes).into_owned(),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
        }
    }
}

/// Chromium showing `url` (its page found by `part` of its URL), its profile folder and the
/// DevTools protocol over the page.
pub(crate) fn open_url(
    chromium: &std::path::Path,
    url: &str,
    name: &str,
    part: &str,
) -> (Browser, PathBuf, DevTools) {
    open_url_with(chromium, url, name, part, &[])
}

/// [`open_url`] with more Chromium flags (`--ignore-certificate-errors-spki-list=…`, say).
pub(crate) fn open_url_with(
    chromium: &std::path::Path,
    url: &str,
    name: &str,
    part: &str,
    extra: &[String],
) -> (Browser, PathBuf, DevTools) {
    let profile =
        std::env::temp_dir().join(format!("freeboard-chromium-{name}-{}", std::process::id()));
    let flags = ["--hide-scrollbars", "--window-size=1400,1250", "--remote-debugging-port=0"];
    let flags: Vec<String> =
        flags.into_iter().map(String::from).chain(extra.iter().cloned()).collect();
    let browser = Browser::start(chromium, &profile, &flags, url);

    // Chromium writes its DevTools port into the profile once it listens.
    let port_file = profile.join("DevToolsActivePort");
    let deadline = Instant::now() + Duration::from_secs(30);
    let port = loop {
        if let Some(port) = std::fs::read_to_string(&port_file)
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<u16>().ok()))
        {
            break port;
        }
        assert!(Instant::now() < deadline, "chromium did not start its DevTools endpoint");
        std::thread::sleep(Duration::from_millis(100));
    };
    let devtools = format!("127.0.0.1:{port}");
    let page_url = loop {
        let list = get(&devtools, "/json/list");
        let body = list.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let targets: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let page =
            targets.as_array().into_iter().flatten().find(|t| {
                t["type"] == "page" && t["url"].as_str().is_some_and(|u| u.contains(part))
            });
        if let Some(url) = page.and_then(|p| p["webSocketDebuggerUrl"].as_str()) {
            break url.to_owned();
        }
        assert!(Instant::now() < deadline, "no {part} page in {body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let client = Client::connect(&page_url, ClientConfig::default()).unwrap();
    (browser, profile, DevTools { client, next_id: 0 })
}
