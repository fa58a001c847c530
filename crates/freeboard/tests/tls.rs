//! `wss://` on real loopback sockets, with a CA made at test time (`rcgen`): the blocking
//! client and raw rustls clients against the server (TLS 1.3 and 1.2, resumption, a plain
//! listener beside the TLS one), certificate reload, the TLS budget, idle connections that
//! hold no chunks, Python `websockets` with an `ssl` context, and hostile peers (garbage
//! instead of a ClientHello, plain HTTP, a ClientHello sent byte by byte, a TLS handshake
//! never followed by an upgrade), each with its outcome and counter while an innocent
//! `wss://` client keeps echoing.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config, start, stop_once_idle, upgrade_request, wait_until};
use freeboard::client::{Client, ClientConfig, ClientError, Event, MessageKind};
use freeboard::{RunningServer, ServerConfig, TlsConfig};
use freeboard_test::tls::TestCa;

/// TLS on its own listener beside the plain one.
fn tls_config(ca: &TestCa) -> ServerConfig {
    let mut config = config();
    config.tls = Some(
        TlsConfig::new(ca.cert_pem(), ca.key_pem()).with_listen("127.0.0.1:0".parse().unwrap()),
    );
    config
}

fn wss(server: &RunningServer, path: &str) -> String {
    format!("wss://localhost:{}{path}", server.tls_addr().unwrap().port())
}

fn client(url: &str, ca: &TestCa) -> Client {
    Client::connect(url, ClientConfig::default().ca_file(ca.ca_pem())).unwrap()
}

fn echo(client: &mut Client, kind: MessageKind, payload: &[u8]) {
    client.send(kind, payload).unwrap();
    client.flush(Some(Duration::from_secs(10))).unwrap();
    match client.recv().unwrap() {
        Event::Message(m) => {
            assert_eq!(m.kind(), kind);
            assert_eq!(m.len(), payload.len());
            assert!(m.to_vec() == payload, "echo differs");
        }
        other => panic!("expected the echo, got {other:?}"),
    }
}

#[test]
fn wss_echoes_text_binary_and_large_messages_beside_plain_ws() {
    let ca = TestCa::new("echo");
    let server = start(tls_config(&ca));
    let mut c = client(&wss(&server, "/echo"), &ca);
    echo(&mut c, MessageKind::Text, b"hello over TLS");
    echo(&mut c, MessageKind::Binary, &[0, 1, 2, 255]);
    for size in [0, 125, 16 * 1024 - 1, 16 * 1024 + 1, 100_000, 1 << 20] {
        let payload: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
        echo(&mut c, MessageKind::Binary, &payload);
    }
    // The plain listener still speaks ws://.
    let plain = format!("ws://{}/echo", server.local_addr());
    let mut p = Client::connect(&plain, ClientConfig::default()).unwrap();
    echo(&mut p, MessageKind::Text, b"plain");
    let metrics = server.metrics();
    assert_eq!(metrics.tls_handshakes(), 1);
    drop((c, p));
    stop_once_idle(server);
}

/// permessage-deflate over `wss://`: compression runs in the session, above the TLS
/// transport, so compressed frames are encrypted like any other, in both modes; a message
/// that spans many TLS records inflates whole.
#[test]
fn wss_with_permessage_deflate_in_both_modes() {
    let ca = TestCa::new("deflate");
    let json: Vec<u8> = br#"{"id":7,"symbol":"EURUSD","bid":1.0842,"ask":1.0844},"#
        .iter()
        .copied()
        .cycle()
        .take(1 << 20)
        .collect();
    for mode in [freeboard::Compression::Shared, freeboard::Compression::Dedicated] {
        let mut config = tls_config(&ca);
        config.compression = mode;
        config.compression_threshold = 0;
        let server = start(config);
        let mut c = client(&wss(&server, "/echo"), &ca);
        let agreed = c.compression().expect("compression over wss").response();
        assert!(agreed.starts_with("permessage-deflate"), "{agreed}");
        echo(&mut c, MessageKind::Text, b"hello, compressed, over TLS");
        for size in [0, 125, 16 * 1024 + 1, 100_000, 1 << 20] {
            echo(&mut c, MessageKind::Binary, &json[..size]);
        }
        echo(&mut c, MessageKind::Text, &json[..300_000]);
        drop(c);
        stop_once_idle(server);
    }
}

#[test]
fn a_certificate_for_another_ca_or_name_is_refused() {
    let ca = TestCa::new("trust");
    let other = TestCa::new("other");
    let server = start(tls_config(&ca));
    let url = wss(&server, "/");
    let err = Client::connect(&url, ClientConfig::default().ca_file(other.ca_pem())).unwrap_err();
    assert!(matches!(err, ClientError::Tls(_)), "{err}");
    // The certificate names localhost, 127.0.0.1 and ::1; not this name.
    let port = server.tls_addr().unwrap().port();
    let wrong = format!("wss://127.0.0.2.nip.invalid:{port}/");
    assert!(Client::connect(&wrong, ClientConfig::default().ca_file(ca.ca_pem())).is_err());
    // By IP address: verified against the certificate's IP names.
    let mut c = client(&format!("wss://127.0.0.1:{port}/"), &ca);
    echo(&mut c, MessageKind::Text, b"by address");
    // --insecure accepts anything.
    let insecure = Client::connect(&url, ClientConfig::default().insecure(true));
    assert!(insecure.is_ok());
    wait_until("the alert to be counted", || {
        server.metrics().tls_refusals("alert_unknown_ca")
            + server.metrics().tls_refusals("alert_bad_certificate")
            >= 1
    });
    drop((c, insecure));
    stop_once_idle(server);
}

/// A raw rustls client with `versions`, trusting `ca`.
fn rustls_config(
    ca: &TestCa,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca.ca_pem()).unwrap();
    for cert in rustls_pemfile_certs(&pem) {
        roots.add(cert).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

fn rustls_pemfile_certs(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem).map(|c| c.unwrap()).collect()
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn tls_connect(addr: SocketAddr, config: &Arc<rustls::ClientConfig>) -> Tls {
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).unwrap();
    }
    tls
}

/// Upgrades over `tls` and echoes one masked text frame.
fn upgrade_and_echo(tls: &mut Tls) {
    tls.write_all(upgrade_request("/echo").as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tls.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    let frame = freeboard_test::frame(0x81, b"hi", Some([1, 2, 3, 4]));
    tls.write_all(&frame).unwrap();
    let mut reply = [0u8; 4];
    tls.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"\x81\x02hi");
}

#[test]
fn tls12_tls13_alpn_and_resumption_with_tickets() {
    let ca = TestCa::new("versions");
    let server = start(tls_config(&ca));
    let addr = server.tls_addr().unwrap();
    for versions in [&[&rustls::version::TLS12][..], &[&rustls::version::TLS13][..]] {
        let config = rustls_config(&ca, versions);
        let mut first = tls_connect(addr, &config);
        assert_eq!(first.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
        assert_eq!(first.conn.protocol_version(), Some(versions[0].version));
        upgrade_and_echo(&mut first);
        let mut second = tls_connect(addr, &config);
        assert_eq!(
            second.conn.handshake_kind(),
            Some(rustls::HandshakeKind::Resumed),
            "{:?}",
            versions[0].version
        );
        upgrade_and_echo(&mut second);
    }
    // Counted by the server: four handshakes, the second of each version resumed.
    assert_eq!(server.metrics().tls_handshakes(), 4);
    assert_eq!(server.metrics().tls_resumptions(), 2);
    stop_once_idle(server);
}

#[test]
fn reload_serves_the_new_certificate_to_new_handshakes_and_keeps_open_connections() {
    let ca = TestCa::new("before");
    let server = start(tls_config(&ca));
    let url = wss(&server, "/echo");
    let mut open = client(&url, &ca);
    let next = TestCa::new("after");
    std::fs::copy(next.cert_pem(), ca.cert_pem()).unwrap();
    std::fs::copy(next.key_pem(), ca.key_pem()).unwrap();
    assert!(server.handle().reload_tls().unwrap());
    let mut fresh = client(&url, &next);
    echo(&mut fresh, MessageKind::Text, b"new pair");
    assert!(Client::connect(&url, ClientConfig::default().ca_file(ca.ca_pem())).is_err());
    echo(&mut open, MessageKind::Text, b"still here");
    // A broken file is refused and the pair in use stays.
    std::fs::write(ca.key_pem(), "not a key").unwrap();
    assert!(server.handle().reload_tls().is_err());
    let mut again = client(&url, &next);
    echo(&mut again, MessageKind::Text, b"unchanged");
    drop((open, fresh, again));
    stop_once_idle(server);
}

#[test]
fn idle_tls_connections_hold_no_chunks() {
    let ca = TestCa::new("idle");
    let server = start(tls_config(&ca));
    let url = wss(&server, "/echo");
    let mut clients: Vec<Client> = (0..20).map(|_| client(&url, &ca)).collect();
    for c in &mut clients {
        echo(c, MessageKind::Binary, &[7u8; 10_000]);
    }
    let metrics = server.metrics();
    wait_until("idle TLS connections to give their chunks back", || {
        metrics.total_chunks_in_use() == 0
    });
    assert_eq!(metrics.tls_handshakes(), 20);
    drop(clients);
    stop_once_idle(server);
}

#[test]
fn a_tls_budget_too_small_for_a_handshake_refuses_and_counts() {
    let ca = TestCa::new("budget");
    let mut config = tls_config(&ca);
    // 64 MiB / 16384 = 4 KiB for rustls state: less than one handshake's charge (8 KiB).
    config.tls.as_mut().unwrap().state_share = 16384;
    let server = start(config);
    assert!(
        Client::connect(&wss(&server, "/"), ClientConfig::default().ca_file(ca.ca_pem())).is_err()
    );
    assert_eq!(server.metrics().tls_refusals("budget"), 1);
    let plain = format!("ws://{}/echo", server.local_addr());
    let mut p = Client::connect(&plain, ClientConfig::default()).unwrap();
    echo(&mut p, MessageKind::Text, b"plain still served");
    drop(p);
    stop_once_idle(server);
}

/// `tls.handshakes_per_ip` 2: a third partial ClientHello from the same address is closed
/// at accept and counted, before it draws on the TLS budget; a place comes back as soon as a
/// stalled handshake's client hangs up (also when its FIN comes with its bytes, which raises
/// no second readiness event), not at the handshake timeout; an established connection holds
/// none (five open `wss://` clients from the same address).
#[test]
fn an_address_past_its_share_of_handshakes_is_refused_at_accept() {
    let ca = TestCa::new("per-ip");
    let mut config = tls_config(&ca);
    config.tls.as_mut().unwrap().handshakes_per_ip = 2;
    config.limits.handshake_timeout = Duration::from_secs(30);
    let server = start(config);
    let addr = server.tls_addr().unwrap();
    let metrics = server.metrics();
    let hello = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01];
    let stall = || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&hello).unwrap();
        s
    };
    let held = (stall(), stall());
    let mut third = stall();
    let (reply, _) = read_to_end(&mut third, Duration::from_secs(5));
    assert!(reply.is_empty(), "closed at accept, without an answer: {reply:?}");
    assert_eq!(metrics.tls_refusals("per_ip_handshakes"), 1);
    assert_eq!(metrics.tls_refusals("budget"), 0);
    drop(held);
    // Half a ClientHello and the FIN at once, twice: both places come back within the wait
    // (10 s), well before the handshake timeout (30 s).
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&hello).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let url = wss(&server, "/echo");
    let mut open = Vec::new();
    wait_until("a place to come back", || {
        let connected = Client::connect(&url, ClientConfig::default().ca_file(ca.ca_pem()));
        connected.map(|c| open.push(c)).is_ok()
    });
    for _ in 0..4 {
        open.push(client(&url, &ca));
    }
    for c in &mut open {
        echo(c, MessageKind::Text, b"one of five from one address");
    }
    assert_eq!(metrics.tls_handshakes(), 5);
    // Both places are free again: two stalled handshakes are held, a third is refused
    // (one loop accepts in order, so its EOF says the two before it were taken).
    let refused = metrics.tls_refusals("per_ip_handshakes");
    let again = (stall(), stall());
    let (reply, _) = read_to_end(&mut stall(), Duration::from_secs(5));
    assert!(reply.is_empty());
    assert_eq!(metrics.tls_refusals("per_ip_handshakes"), refused + 1);
    assert_eq!(metrics.tls_refusals("handshake_timeout"), 0);
    drop((open, again));
    stop_once_idle(server);
}

/// Reads until EOF or `limit`; returns what arrived and how long it took.
fn read_to_end(stream: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return (out, start.elapsed()),
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn hostile_peers_get_an_outcome_and_a_counter_while_an_innocent_client_echoes() {
    let ca = TestCa::new("hostile");
    let mut config = tls_config(&ca);
    config.limits.handshake_timeout = Duration::from_secs(1);
    let server = start(config);
    let addr = server.tls_addr().unwrap();
    let metrics = server.metrics();
    let mut innocent = client(&wss(&server, "/echo"), &ca);
    echo(&mut innocent, MessageKind::Text, b"before");

    // Garbage instead of a ClientHello: a handshake_failure alert, then EOF.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"\x00\x01\x02 this is not TLS at all").unwrap();
    let (reply, _) = read_to_end(&mut s, Duration::from_secs(5));
    assert_eq!(reply, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28]);
    assert_eq!(metrics.tls_refusals("not_tls"), 1);
    echo(&mut innocent, MessageKind::Text, b"after garbage");

    // Plain HTTP to the TLS port: a plain 400 that says what to use.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(upgrade_request("/echo").as_bytes()).unwrap();
    let (reply, _) = read_to_end(&mut s, Duration::from_secs(5));
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 400") && reply.contains("wss://"), "{reply}");
    assert_eq!(metrics.tls_refusals("plain_http"), 1);

    // A handshake record whose ClientHello is malformed: an alert (decode_error), counted.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0x00, 0x08, 0x01, 0x00, 0x00, 0x04, 0xff, 0xff, 0xff, 0xff])
        .unwrap();
    let (reply, _) = read_to_end(&mut s, Duration::from_secs(5));
    assert_eq!(reply.first(), Some(&0x15), "an alert record: {reply:?}");
    assert_eq!(metrics.tls_refusals("bad_client_hello"), 1);
    echo(&mut innocent, MessageKind::Binary, b"after a bad hello");

    // ClientHello slowloris: a record header that promises 512 bytes, then a byte every
    // 200 ms. The handshake timeout (1 s here) drops it.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).unwrap();
    let started = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut dropped = false;
    while started.elapsed() < Duration::from_secs(5) {
        if s.write_all(&[0x01]).is_err() {
            dropped = true;
            break;
        }
        let mut b = [0u8; 16];
        match s.read(&mut b) {
            Ok(0) => {
                dropped = true;
                break;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => {
                dropped = true;
                break;
            }
        }
    }
    assert!(dropped, "the slow ClientHello was not dropped");
    assert!(started.elapsed() < Duration::from_secs(3), "dropped after {:?}", started.elapsed());
    wait_until("the slowloris to be counted", || metrics.tls_refusals("handshake_timeout") == 1);
    echo(&mut innocent, MessageKind::Text, b"after slowloris");

    // TLS completed, no upgrade request: dropped at the handshake timeout, counted.
    let tls_config = rustls_config(&ca, &[&rustls::version::TLS13]);
    let mut idle = tls_connect(addr, &tls_config);
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let ended = matches!(idle.read(&mut buf), Ok(0) | Err(_));
    assert!(ended && started.elapsed() < Duration::from_secs(3));
    wait_until("the missing upgrade to be counted", || {
        metrics.tls_refusals("upgrade_timeout") == 1
    });
    echo(&mut innocent, MessageKind::Text, b"after all of them");
    assert!(metrics.handshake_timeouts() >= 2);
    drop(innocent);
    stop_once_idle(server);
}

fn python() -> Option<PathBuf> {
    let python =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../interop/python/.venv/bin/python");
    let ok =
        Command::new(&python).args(["-c", "import websockets"]).status().is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIPPED: no interop/python/.venv with websockets (scripts/test makes it)");
        return None;
    }
    Some(python)
}

const PYTHON_CLIENT: &str = r#"
import asyncio, ssl, sys, websockets
async def main(uri, ca, version):
    ctx = ssl.create_default_context(cafile=ca)
    if version == "1.2":
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    async with websockets.connect(uri, ssl=ctx, max_size=None) as ws:
        for payload in ["hello", b"\x00\x01\x02binary", "x" * 70000, bytes(range(256)) * 4000]:
            await ws.send(payload)
            got = await ws.recv()
            assert got == payload, (type(got), len(got), len(payload))
        print(ws.transport.get_extra_info("ssl_object").version())
asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"#;

#[test]
fn python_websockets_with_an_ssl_context() {
    let Some(python) = python() else { return };
    let ca = TestCa::new("python");
    let server = start(tls_config(&ca));
    for (version, expect) in [("1.3", "TLSv1.3"), ("1.2", "TLSv1.2")] {
        let out = Command::new(&python)
            .args(["-c", PYTHON_CLIENT, &wss(&server, "/echo")])
            .arg(ca.ca_pem())
            .arg(version)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), expect);
    }
    stop_once_idle(server);
}
