//! Browser tests in headless Chromium: a cross-origin `fetch` that publishes only with CORS
//! permission, the resuming subscription module (`/js/freeboard.js`) across cut connections,
//! and the dashboard in a real browser: headless Chromium loads `/dashboard` from `freeboard
//! serve`, a load runs, and the test reads the page's DOM over the DevTools protocol (spoken
//! with freeboard's own client) until the numbers have moved; then it takes a screenshot
//! (`FREEBOARD_DASHBOARD_SCREENSHOT=docs/dashboard.png` to keep it, as the book's).
//!
//! Chromium comes from Debian's `chromium` package (`scripts/test` installs it); without it the
//! test is skipped with a message, unless `FREEBOARD_REQUIRE_TOOLS` is set.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::Serve;
use common::devtools::{DevTools, get, open_url};
use freeboard::client::{Client, ClientConfig, Event};
use freeboard_test::browser::{Browser, chromium};

#[test]
fn the_dashboard_shows_the_numbers_move_in_chromium() {
    let Some(chromium) = chromium() else { return };
    let serve = Serve::start(&[]);
    let addr = serve.addr.clone();

    // A library server serves no dashboard unless its Router opts in; `serve` does.
    let page = get(&addr, "/dashboard");
    assert!(page.starts_with("HTTP/1.1 200") && page.contains("<canvas"), "{page}");
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no CDN: every asset is inline"
    );

    let (_browser, profile, mut page) =
        open_page(&chromium, &format!("http://{addr}/dashboard"), "main");

    page.wait_for("a live stream", |p| p.text("status") == "live" && p.text("samples") != "0");
    let before: u64 = page.text("messages-in-total").parse().unwrap();
    assert!(before < 100, "no load yet: {before}");
    assert_eq!(page.text("connections"), "1", "the dashboard's own stream is the one connection");
    // A Server-Sent Events subscriber is counted beside the WebSockets.
    let mut sse = TcpStream::connect(&addr).unwrap();
    sse.write_all(b"GET /topic/news HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        .unwrap();
    page.wait_for("the SSE stream", |p| {
        p.text("connections") == "2" && p.text("sse-connections") == "1"
    });
    assert_eq!(page.text("ws-connections"), "1");
    drop(sse);
    page.wait_for("the SSE stream gone", |p| p.text("sse-connections") == "0");
    // The process's RSS beside the budget: a real size, in MiB (a server holds more than 1 MiB).
    let rss = page.text("rss");
    assert!(rss.ends_with(" MiB") && rss != "0.00 MiB", "RSS shown as {rss:?}");

    // A load: 2,000 echoes of 1 KiB over two connections, which stay open.
    let mut load: Vec<Client> = (0..2)
        .map(|_| Client::connect(&format!("ws://{addr}/echo"), ClientConfig::default()).unwrap())
        .collect();
    let payload = vec![b'x'; 1024];
    let echo = |load: &mut Vec<Client>| {
        for client in load.iter_mut() {
            // Batches well under the watermarks: every send is queued, every echo comes back.
            for _ in 0..20 {
                let outcome = client.send_binary(&payload).unwrap();
                assert_eq!(outcome, freeboard::SendOutcome::Queue(freeboard::PushOutcome::Queued));
            }
            for _ in 0..20 {
                let event = client.recv_timeout(Some(Duration::from_secs(30))).unwrap();
                assert!(matches!(event, Some(Event::Message(_))), "an echo");
            }
        }
    };
    for _ in 0..50 {
        echo(&mut load);
    }
    page.wait_for("the load", |p| {
        // Below 10,000 the page writes whole numbers; the page's own requests count too.
        let total = p.text("messages-in-total").parse::<u64>().unwrap_or(0);
        total >= 2000 && p.text("connections") == "3"
    });
    page.wait_for("a rate above zero", |p| p.text("messages-in-rate") != "0/s");
    assert_ne!(page.text("bytes-in-total"), "0 B");
    assert!(page.text("pool-high-water").ends_with("iB"), "{}", page.text("pool-high-water"));
    let loops = page.eval("document.querySelectorAll('#table-loops tbody tr').length");
    assert_eq!(loops, 2, "one row per event loop");
    let closes = page.eval("document.querySelectorAll('#table-closes tbody tr').length");
    assert_eq!(closes, 10, "every close reason, zero or not");

    // For the book's picture: FREEBOARD_DASHBOARD_LOAD_SECS more seconds of echoes.
    let secs = std::env::var("FREEBOARD_DASHBOARD_LOAD_SECS").ok().and_then(|s| s.parse().ok());
    let until = Instant::now() + Duration::from_secs(secs.unwrap_or(0));
    while Instant::now() < until {
        echo(&mut load);
        std::thread::sleep(Duration::from_millis(1));
    }
    // Let a few more samples in so the charts have lines, then take the picture.
    if secs.is_none() {
        let samples: u64 = page.text("samples").parse().unwrap();
        page.wait_for("more samples", |p| p.text("samples").parse::<u64>().unwrap() >= samples + 3);
    }
    let shot = page.call("Page.captureScreenshot", serde_json::json!({ "format": "png" }));
    use base64::Engine;
    let png =
        base64::engine::general_purpose::STANDARD.decode(shot["data"].as_str().unwrap()).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a real picture");
    let path = std::env::var_os("FREEBOARD_DASHBOARD_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("freeboard-dashboard.png"));
    std::fs::write(&path, &png).unwrap();
    eprintln!("dashboard screenshot: {}", path.display());
    drop(load);
    let _ = std::fs::remove_dir_all(&profile);
}

/// Chromium showing `url`, its profile folder and the DevTools protocol over the page.
fn open_page(chromium: &std::path::Path, url: &str, name: &str) -> (Browser, PathBuf, DevTools) {
    open_url(chromium, url, name, "/dashboard")
}

/// A load of `rounds` × 20 echoes of 1 KiB on each of `load`'s connections.
fn echo_load(load: &mut [Client], rounds: usize) {
    let payload = vec![b'x'; 1024];
    for _ in 0..rounds {
        for client in load.iter_mut() {
            for _ in 0..20 {
                let outcome = client.send_binary(&payload).unwrap();
                assert_eq!(outcome, freeboard::SendOutcome::Queue(freeboard::PushOutcome::Queued));
            }
            for _ in 0..20 {
                let event = client.recv_timeout(Some(Duration::from_secs(30))).unwrap();
                assert!(matches!(event, Some(Event::Message(_))), "an echo");
            }
        }
    }
}

/// The first look: a page opened after a load has run shows that load at once (the server
/// kept the last minutes), its two message lines told apart (solid and dashed), and the
/// server's version, uptime and configuration, without its secrets.
#[test]
fn the_dashboards_first_look_shows_the_minutes_before_it_opened() {
    let Some(chromium) = chromium() else { return };
    let secret = "publish-s3cret-value";
    let serve = Serve::start(&["--publish-token", secret]);
    let addr = serve.addr.clone();
    let mut load: Vec<Client> = (0..2)
        .map(|_| Client::connect(&format!("ws://{addr}/echo"), ClientConfig::default()).unwrap())
        .collect();
    // Load spread over three seconds or more, so that it falls in several samples.
    let until = Instant::now() + Duration::from_millis(3200);
    while Instant::now() < until {
        echo_load(&mut load, 5);
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(load);
    let (_browser, profile, mut page) =
        open_page(&chromium, &format!("http://{addr}/dashboard"), "first-look");
    page.wait_for("a live stream", |p| p.text("status") == "live");
    let samples: u64 = page.text("samples").parse().unwrap();
    assert!(samples >= 3, "the server's last minutes arrived at once: {samples} samples");
    let peak = page.eval("Math.max(...history.map(h => h.messagesIn))");
    assert!(peak.as_f64().is_some_and(|v| v > 0.0), "the load before the page opened: {peak}");
    let dashes = page.eval(
        "[...document.querySelectorAll('#legend-messages i')].map(i => i.dataset.dash).join()",
    );
    assert_eq!(dashes, "solid,dashed", "in and out drawn apart");
    assert_eq!(page.text("version"), format!("freeboard {}", env!("CARGO_PKG_VERSION")));
    let uptime = page.text("uptime");
    assert!(uptime.ends_with(" s") || uptime.contains("min"), "uptime {uptime:?}");
    let config = page.text("table-config");
    assert!(config.contains("memory") && config.contains("64 MiB"), "{config}");
    assert!(config.contains("topics.publish_token") && config.contains("set"), "{config}");
    let html = page.eval("document.documentElement.outerHTML");
    assert!(!html.as_str().unwrap().contains(secret), "the secret is not on the page");
    let _ = std::fs::remove_dir_all(&profile);
}

/// The issue's browser case: a page of another origin (served here on another loopback port)
/// `fetch`es a `POST text/plain`, which browsers send without a preflight. Without CORS
/// permission the server refuses it (the page sees it fail) and no subscriber gets it; with
/// the page's origin allowed, it publishes and the page reads the answer.
#[test]
fn a_cross_origin_fetch_publishes_nothing_without_cors_permission_in_chromium() {
    use std::io::Read as _;
    let Some(chromium) = chromium() else { return };
    for allowed in [false, true] {
        // The page's own server: an empty HTML page for every request (a few are made).
        let pages = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let page_origin = format!("http://{}", pages.local_addr().unwrap());
        std::thread::spawn(move || {
            for mut stream in pages.incoming().take(4).flatten() {
                let mut head = [0u8; 2048];
                let _ = stream.read(&mut head);
                let body = "<!doctype html><title>elsewhere</title>";
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        let mut args = vec![];
        if allowed {
            args.extend(["--publish-cors-origin", page_origin.as_str()]);
        }
        let serve = Serve::start(&args);
        let addr = serve.addr.clone();
        let mut sub = TcpStream::connect(&addr).unwrap();
        sub.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        sub.write_all(freeboard_test::upgrade_request("/topic/scores", "").as_bytes()).unwrap();
        let mut inbox = freeboard_test::Inbox::default();
        assert!(inbox.head(&mut sub).unwrap().unwrap().starts_with("HTTP/1.1 101"));

        let name = if allowed { "cors-allowed" } else { "cors-refused" };
        let (_browser, profile, mut page) =
            open_url(&chromium, &format!("{page_origin}/page"), name, "/page");
        page.wait_for("the page", |p| p.eval("document.title") == "elsewhere");
        let outcome = page.eval_async(&format!(
            "fetch('http://{addr}/topic/scores', {{method: 'POST', body: '2:1'}})
               .then(r => 'status ' + r.status, e => 'failed: ' + e.name)"
        ));
        sub.set_read_timeout(Some(Duration::from_millis(800))).unwrap();
        let got = inbox.frame(&mut sub).ok().flatten().map(|f| f.payload);
        if allowed {
            assert_eq!(outcome, "status 200", "an allowed origin publishes");
            assert_eq!(got.as_deref(), Some(&b"2:1"[..]));
        } else {
            assert_eq!(outcome, "failed: TypeError", "the page sees the refusal");
            assert_eq!(got, None, "the refused POST reached a subscriber");
            let line = serve.log_line("refused");
            assert!(line.contains(&format!("pages from {page_origin} may not publish")), "{line}");
            let mut metrics = TcpStream::connect(&addr).unwrap();
            write!(metrics, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut text = String::new();
            metrics.read_to_string(&mut text).unwrap();
            assert!(text.contains("freeboard_topic_publishes_total 0"), "nothing published");
        }
        let _ = std::fs::remove_dir_all(&profile);
    }
}

/// The browser module that resumes (`/js/freeboard.js`, bindings/browser) on Chromium's own
/// `WebSocket`: a subscription through a proxy cut every 25 of 100 publications (each time
/// once it is back) delivers all 100 once, in order; a `since` the server cannot resume from
/// is reported by `onGone`, and the subscription goes on without it.
#[test]
fn the_browser_module_resumes_across_cuts_in_chromium() {
    let Some(chromium) = chromium() else { return };
    let serve = Serve::start(&["--history", "1000"]);
    let proxy = freeboard_test::proxy::CutProxy::start(serve.socket_addr());
    let module = get(&serve.addr, "/js/freeboard.js");
    assert!(module.contains("Access-Control-Allow-Origin: *"), "importable from any origin");
    assert!(module.contains("text/javascript"), "{}", &module[..200]);
    // The page comes from the server itself; only the WebSocket goes through the proxy.
    let url = format!("http://{}/healthz", serve.addr);
    let (_browser, profile, mut page) = open_url(&chromium, &url, "resume", "/healthz");
    page.wait_for("the page loaded", |p| {
        p.eval("document.readyState") == "complete" && p.eval("location.pathname") == "/healthz"
    });
    let started = page.eval_async(&format!(
        r#"(async () => {{ try {{
            const m = await import("http://{addr}/js/freeboard.js");
            window.got = []; window.events = [];
            const on = (name) => (...args) => events.push(name + " " + args[0]);
            window.sub = new m.Subscription("ws://{proxy}/topic/web", {{
                backoff: {{ initial: 20, max: 200 }},
                onOpen: on("open"), onGone: on("gone"), onClose: on("close"),
                onMessage: (payload) => got.push(payload),
            }});
            return typeof m.parseOffset;
        }} catch (e) {{ return String(e); }} }})()"#,
        proxy = proxy.addr,
        addr = serve.addr
    ));
    assert_eq!(started, "function");
    let until = Instant::now() + Duration::from_secs(30);
    while page.eval("events.length") == 0 {
        assert!(Instant::now() < until, "the module never opened");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(page.eval("events[0]"), "open null");
    for i in 0..100u64 {
        post(&serve.addr, "web", &format!("m{i}"));
        if i % 25 == 24 {
            // Cut once the page is connected again after the cuts before.
            let cuts = i / 25;
            while proxy.accepted() < cuts + 1 {
                assert!(Instant::now() < until, "the page did not come back");
                std::thread::sleep(Duration::from_millis(5));
            }
            proxy.cut();
        }
    }
    page.wait_for("100 messages", |p| p.eval("got.length") == 100);
    let want: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
    assert_eq!(page.eval("got"), serde_json::json!(want), "each once, in order");
    let stats = page.eval("sub.stats");
    assert!(stats["reconnects"].as_u64() >= Some(3), "{stats}");

    // An offset this server cannot resume from (epoch-less: of no epoch it has): the
    // connection opens, closes with 4410, which is said once, then a fresh start.
    page.eval(&format!(
        r#"sub.close(); window.seen = [];
           window.fresh = new (sub.constructor)("ws://{addr}/topic/web?since=1-1", {{
               backoff: {{ initial: 20, max: 200 }},
               onGone: (last) => seen.push("gone " + last),
               onOpen: (since) => seen.push("open " + since),
           }}); 0"#,
        addr = serve.addr
    ));
    page.wait_for("a fresh start", |p| p.eval("seen.includes('open null')") == true);
    let events = page.eval("seen");
    assert_eq!(events, serde_json::json!(["open 1-1", "gone 1-1", "open null"]), "{events}");
    let _ = std::fs::remove_dir_all(&profile);
}

/// `POST /topic/{topic}` with a text body, expecting 200.
fn post(addr: &str, topic: &str, body: &str) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST /topic/{topic} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// The issue's target: 1,000 subscribers of a named topic, each with a token of its own and
/// an inbox topic of its own; eight of them get a heavy inbox feed, and one of those stops
/// reading. The dashboard (behind an admin token) lists the named topics with their
/// subscribers and names the one that stopped, by its address and its token's `sub`, among
/// the slowest; a click shows its detail. The picture is the book's
/// (`FREEBOARD_TOPICS_SCREENSHOT=docs/topics-dashboard.png`).
///
/// Why the heavy feed: on loopback the kernel grows a socket's send buffer to 4 MiB
/// (`tcp_wmem`), so a subscriber that stops reading holds about that much in the kernel
/// before its queue on the server holds a byte; 4 MiB to each of 1,000 subscribers would be
/// 4 GiB of traffic.
#[test]
fn the_dashboard_names_the_one_slow_subscriber_of_a_thousand_in_chromium() {
    let Some(chromium) = chromium() else { return };
    const JWT: &str = "topics-view-jwt-secret-of-32-bytes-or-more";
    const ADMIN: &str = "topics-view-admin-token";
    const PUBLISH: &str = "topics-view-publish-token";
    const SLOW: usize = 7;
    let serve = Serve::start(&[
        "--jwt-secret",
        JWT,
        "--admin-token",
        ADMIN,
        "--publish-token",
        PUBLISH,
        "--topic-metrics-prefix",
        "scores.",
        "--max-connections-per-ip",
        "2000",
    ]);
    let addr = serve.addr.clone();
    let far = 4_102_444_800u64; // 2100
    let token = |i: usize| {
        let claims =
            format!(r#"{{"exp":{far},"sub":"fan-{i}","subscribe":["scores.*","inbox.fan-{i}"]}}"#);
        freeboard_test::hs256_jwt(JWT, &claims)
    };
    // Every fan: the live scores, its inbox, and for every other fan the odds too.
    let target = |i: usize| {
        let odds = if i.is_multiple_of(2) { "&also=scores.odds" } else { "" };
        format!("scores.live?also=inbox.fan-{i}{odds}")
    };

    // 999 subscribers that read everything (one thread drains them all), and fan 7, with a
    // small receive buffer, that stops reading after its upgrade.
    let mut readers = Vec::new();
    let mut slow = None;
    for i in 0..1000 {
        if i == SLOW {
            let domain = socket2::Domain::IPV4;
            let socket = socket2::Socket::new(domain, socket2::Type::STREAM, None).unwrap();
            socket.set_recv_buffer_size(4096).unwrap();
            socket.connect(&serve.socket_addr().into()).unwrap();
            slow = Some(upgrade(socket.into(), &target(i), &token(i)));
        } else {
            readers.push(upgrade(TcpStream::connect(&addr).unwrap(), &target(i), &token(i)));
        }
    }
    let slow = slow.unwrap();
    let slow_peer = slow.local_addr().unwrap().to_string();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let drain = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            for r in &readers {
                r.set_nonblocking(true).unwrap();
            }
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for r in &mut readers {
                    while matches!(r.read(&mut buf), Ok(n) if n > 0) {}
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            readers
        })
    };
    // Twenty batches a second until the test ends (at most two minutes): the scores to all,
    // the odds to half, and 32 KiB to each of the first eight fans' inboxes.
    let publisher = {
        let (stop, addr) = (stop.clone(), addr.clone());
        std::thread::spawn(move || {
            let mut batch = vec![
                serde_json::json!({ "topic": "scores.live", "data": { "home": 2, "away": 1 } }),
                serde_json::json!({ "topic": "scores.odds", "data": { "home": 1.8 } }),
            ];
            for i in 0..8 {
                let topic = format!("inbox.fan-{i}");
                batch.push(serde_json::json!({ "topic": topic, "data": "m".repeat(32 << 10) }));
            }
            let body = serde_json::Value::from(batch).to_string();
            let until = Instant::now() + Duration::from_secs(120);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                post_as(&addr, "", PUBLISH, &body);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };

    let (_browser, profile, mut page) =
        open_page(&chromium, &format!("http://{addr}/dashboard?token={ADMIN}"), "topics-view");
    page.wait_for("a live stream", |p| p.text("status") == "live");
    page.wait_for("the topic and its 1,000 subscribers", |p| {
        let row = p.eval("document.querySelector('#table-topics tbody tr')?.textContent ?? ''");
        row.as_str()
            .is_some_and(|r| r.starts_with("scores.live1,000") || r.starts_with("scores.live1000"))
    });
    let slowest = |p: &mut DevTools| {
        p.eval(
            "[...document.querySelectorAll('#table-slowest tbody tr[data-id]')]\
             .map(tr => [tr.querySelector('.peer').textContent, tr.querySelector('.sub').textContent])",
        )
    };
    page.wait_for("the slow subscriber among the slowest", |p| {
        let rows = slowest(p);
        rows.as_array().into_iter().flatten().any(|r| r[0] == slow_peer.as_str())
    });
    let rows = slowest(&mut page);
    let first = &rows[0];
    eprintln!("slowest subscribers shown: {rows}");
    let named = rows.as_array().unwrap().iter().find(|r| r[0] == slow_peer.as_str()).unwrap();
    assert_eq!(named[1], "fan-7", "named by its token's sub: {rows}");
    assert!(
        rows.as_array().unwrap().iter().filter(|r| r[1] == "fan-7").count() == 1,
        "one row for it: {rows}"
    );
    // A click shows its detail: the address, the sub, the topic, the policy and its queue.
    page.eval(&format!(
        "[...document.querySelectorAll('#table-slowest tbody tr[data-id]')]\
         .find(tr => tr.querySelector('.peer').textContent === '{slow_peer}').click()"
    ));
    page.wait_for("the connection's detail", |p| {
        p.eval("document.getElementById('connection-detail').hidden") == false
            && p.text("detail-fields").contains("fan-7")
    });
    let detail = page.text("detail-fields");
    let topics = "scores.live, inbox.fan-7";
    assert!(detail.contains(&slow_peer) && detail.contains(topics), "{detail}");
    assert!(detail.contains("conflate"), "the topics' policy: {detail}");
    // Its queue has held unsent bytes for a while, and keeps doing so.
    page.wait_for("its oldest unsent message a second old", |p| {
        let fields = p.text("detail-fields");
        fields.contains("oldest unsent") && (fields.contains(" s") || fields.contains(" min"))
    });

    // The picture: the tables in view, the slow one picked out.
    page.eval(
        "window.scrollTo(0, document.getElementById('table-topics').getBoundingClientRect().top \
         + window.scrollY - 470)",
    );
    std::thread::sleep(Duration::from_millis(1500));
    let shot = page.call("Page.captureScreenshot", serde_json::json!({ "format": "png" }));
    use base64::Engine;
    let png =
        base64::engine::general_purpose::STANDARD.decode(shot["data"].as_str().unwrap()).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a real picture");
    let path = std::env::var_os("FREEBOARD_TOPICS_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("freeboard-topics-dashboard.png"));
    std::fs::write(&path, &png).unwrap();
    eprintln!("topics dashboard screenshot: {} (first row {first})", path.display());

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    publisher.join().unwrap();
    drop(drain.join().unwrap());
    drop(slow);
    let _ = std::fs::remove_dir_all(&profile);
}

/// The dashboard's JSON names clients: without the admin token each endpoint answers 401
/// (403 with a wrong one), and with it the JSON.
#[test]
fn the_topic_and_subscriber_endpoints_need_the_admin_token() {
    let serve = Serve::start(&["--admin-token", "the-admin-token"]);
    for path in ["/dashboard/topics", "/dashboard/slowest", "/dashboard/connection?id=0.1.1"] {
        let answer = get(&serve.addr, path);
        assert!(answer.starts_with("HTTP/1.1 401"), "{path}: {answer}");
        assert!(answer.contains("WWW-Authenticate: Bearer"), "{path}: {answer}");
        let sep = if path.contains('?') { '&' } else { '?' };
        let answer = get(&serve.addr, &format!("{path}{sep}token=wrong"));
        assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
    }
    let topics = get(&serve.addr, "/dashboard/topics?token=the-admin-token");
    assert!(topics.starts_with("HTTP/1.1 200") && topics.contains("\"topics\":[]"), "{topics}");
    let slowest = get(&serve.addr, "/dashboard/slowest?token=the-admin-token");
    assert!(slowest.starts_with("HTTP/1.1 200") && slowest.contains("\"slowest\":[]"), "{slowest}");
    let unknown = get(&serve.addr, "/dashboard/connection?id=0.1.1&token=the-admin-token");
    assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");
}

/// Per-topic series only for the named prefix, and at most `--topic-metrics-max` of them: a
/// subscriber of 60 topics (50 named) and a publication to each leave 16 series on
/// `/metrics`, the 34 others counted as left out, none for the unnamed topics; the series go
/// with the subscriber.
#[test]
fn per_topic_series_stay_within_the_prefix_and_the_cap() {
    let serve = Serve::start(&["--topic-metrics-prefix", "room.", "--topic-metrics-max", "16"]);
    let named: Vec<String> = (0..50).map(|i| format!("room.{i}")).collect();
    let others: Vec<String> = (0..10).map(|i| format!("lobby.{i}")).collect();
    let also: String = named[1..].iter().chain(&others).map(|t| format!("&also={t}")).collect();
    let target = format!("{}?x=1{also}", named[0]);
    let subscriber = upgrade(TcpStream::connect(&serve.addr).unwrap(), &target, "");
    let batch: Vec<serde_json::Value> = named
        .iter()
        .chain(&others)
        .map(|t| serde_json::json!({ "topic": t, "data": "hello" }))
        .collect();
    post_as(&serve.addr, "", "", &serde_json::Value::from(batch).to_string());

    let series = |metrics: &str, name: &str| -> Vec<String> {
        metrics.lines().filter(|l| l.starts_with(name)).map(str::to_owned).collect()
    };
    let metrics = get(&serve.addr, "/metrics");
    let subscribers = series(&metrics, "freeboard_named_topic_subscribers{");
    assert_eq!(subscribers.len(), 16, "{subscribers:?}");
    assert!(subscribers.iter().all(|l| l.contains("topic=\"room.") && l.ends_with(" 1")));
    let publishes = series(&metrics, "freeboard_named_topic_publishes_total{");
    assert_eq!(publishes.len(), 16);
    assert!(publishes.iter().all(|l| l.ends_with(" 1")), "each published once: {publishes:?}");
    let deliveries = series(&metrics, "freeboard_named_topic_deliveries_total{");
    assert!(deliveries.iter().all(|l| l.ends_with(" 1")), "{deliveries:?}");
    // "hello" in a 2-byte frame header, sent as published (no compression, no delta).
    for name in [
        "freeboard_named_topic_delivered_bytes_as_published_total{",
        "freeboard_named_topic_delivered_bytes_sent_total{",
    ] {
        let bytes = series(&metrics, name);
        assert!(bytes.len() == 16 && bytes.iter().all(|l| l.ends_with(" 7")), "{bytes:?}");
    }
    let drops = series(&metrics, "freeboard_named_topic_drops_total{");
    assert_eq!(drops.len(), 16 * 5, "one per topic and policy");
    assert!(!metrics.contains("topic=\"lobby."), "no series for a topic not named");
    assert!(metrics.contains("freeboard_named_topic_series 16\n"), "{metrics}");
    assert!(metrics.contains("freeboard_named_topic_left_out_total 34\n"), "{metrics}");
    let total = metrics.lines().filter(|l| l.contains("topic=\"")).count();
    assert_eq!(total, 16 * (5 + 5), "every per-topic series, bounded by the cap");

    drop(subscriber);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = get(&serve.addr, "/metrics");
        if metrics.contains("freeboard_named_topic_series 0\n") {
            assert!(!metrics.contains("topic=\""), "the series went with the subscriber");
            break;
        }
        assert!(Instant::now() < deadline, "the series stayed after the subscriber left");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A loop sweeps its connections 1,024 slots a turn: with 2,500 subscribers on one loop, the
/// sweep takes several turns, counts every subscriber in the lag distribution, and still finds
/// the one that stopped reading, subscribed last (the end of the table).
#[test]
fn the_sweep_finds_the_slow_subscriber_past_its_first_step() {
    let serve = Serve::start(&["--threads", "1", "--max-connections-per-ip", "3000"]);
    let readers: Vec<TcpStream> =
        (0..2499).map(|_| upgrade(TcpStream::connect(&serve.addr).unwrap(), "lobby", "")).collect();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&serve.socket_addr().into()).unwrap();
    let slow = upgrade(socket.into(), "lobby?also=inbox.last", "");
    let slow_peer = slow.local_addr().unwrap().to_string();
    // 64 KiB batches to the last one's inbox until its queue on the server holds bytes (the
    // kernel takes some 4 MiB first), then the sweep's answer.
    let body = serde_json::json!([{ "topic": "inbox.last", "data": "m".repeat(64 << 10) }]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let slowest = loop {
        post_as(&serve.addr, "", "", &body.to_string());
        let answer = get(&serve.addr, "/dashboard/slowest");
        let json: serde_json::Value =
            serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
        if json["slowest"].as_array().unwrap().iter().any(|s| s["peer"] == slow_peer.as_str()) {
            break json;
        }
        assert!(Instant::now() < deadline, "never named the slow subscriber: {json}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(slowest["subscribers"], 2500, "every subscriber counted: {slowest}");
    let buckets = slowest["queue_bytes"].as_array().unwrap();
    assert_eq!(buckets.last().unwrap()[1], 2500);
    assert!(buckets[0][1].as_u64().unwrap() >= 2490, "the others keep up: {slowest}");
    let first = &slowest["slowest"][0];
    assert_eq!(first["peer"], slow_peer.as_str(), "largest queue first: {slowest}");
    assert_eq!(first["topics"], serde_json::json!(["lobby", "inbox.last"]));
    let sweep = &slowest["sweeps"][0];
    eprintln!("sweep of 2,500 subscribers: {sweep}");
    assert!(sweep["steps"].as_u64().unwrap() >= 3, "2,500 slots in steps of 1,024: {sweep}");
    assert!(sweep["longest_step_us"].as_u64().unwrap() > 0, "{sweep}");
    drop((readers, slow));
}

/// Upgrades `stream` to a subscriber of `/topic/{target}` (with `?access_token=` when
/// `token` is given) and returns it once the `101` is read.
fn upgrade(mut stream: TcpStream, target: &str, token: &str) -> TcpStream {
    let sep = if target.contains('?') { '&' } else { '?' };
    let query = if token.is_empty() { String::new() } else { format!("{sep}access_token={token}") };
    write!(
        stream,
        "GET /topic/{target}{query} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).unwrap(), 1, "closed during the upgrade");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream
}

/// `POST /topic/{topic}` (a batch when `topic` is empty) with `bearer` as the publish token
/// (none when empty), expecting 200.
fn post_as(addr: &str, topic: &str, bearer: &str, body: &str) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = if bearer.is_empty() {
        String::new()
    } else {
        format!("Authorization: Bearer {bearer}\r\n")
    };
    let kind = if topic.is_empty() { "application/json" } else { "text/plain" };
    write!(
        s,
        "POST /topic/{topic} HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
