//! The echo over HTTP/2 streams beside the echo over HTTP/1.1 WebSockets, TLS both, same
//! run: messages per second and the server's CPU time per message.
//!
//! The server (`Http2Server`, the tokio driver, one worker thread) runs in a child process so
//! that its CPU time is its own (`/proc/PID/stat`); the clients run here on one worker
//! thread, freeboard's client session over hyper's HTTP/2 streams or HTTP/1.1 upgrades, so
//! both sides differ only in what carries the WebSocket. Each round runs both modes, one
//! after the other, for the same time; the medians of the rounds are printed.
//!
//! ```sh
//! cargo run --release -p freeboard --features http2 --example h2_echo_bench -- [sockets] [in-flight] [bytes] [seconds] [rounds]
//! ```
//! Defaults: 16 sockets (16 streams of one HTTP/2 connection, or 16 TLS connections), 16
//! messages in flight per socket, 64-byte messages, 3 s per run, 3 rounds.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::Response;
use axum::routing::any;
use axum::{Extension, Router};
use freeboard::tls::TlsIdentity;
use freeboard::tokio::axum::{AxumWebSocket, WebSocketUpgrade};
use freeboard::tokio::http2::{Http2Client, Http2Config, Http2Server};
use freeboard::tokio::{Endpoint, EndpointConfig, OwnedMessage, WebSocket, WsConfig};
use freeboard_test::tls::TestCa;
use futures_util::StreamExt;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--serve") {
        return serve(&args[1], &args[2]);
    }
    let arg = |i: usize, default: f64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (sockets, in_flight, bytes) = (arg(0, 16.0) as usize, arg(1, 16.0) as usize, arg(2, 64.0));
    let (seconds, rounds) = (arg(3, 3.0), arg(4, 3.0) as usize);
    let ca = TestCa::new("h2-echo-bench");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--serve")
        .arg(ca.cert_pem())
        .arg(ca.key_pem())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the server process");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let addr: SocketAddr = line.trim().parse().expect("the server's address");
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    println!(
        "{sockets} sockets, {in_flight} messages in flight each, {bytes} bytes, {seconds} s per run"
    );
    let mut results: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (mode, result) in results.iter_mut().enumerate() {
            let http2 = mode == 0;
            let (messages, elapsed, cpu) = runtime.block_on(run(
                &ca,
                addr,
                child.id(),
                http2,
                sockets,
                in_flight,
                bytes as usize,
                Duration::from_secs_f64(seconds),
            ));
            let rate = messages as f64 / elapsed.as_secs_f64();
            let cpu_per_message = cpu.as_secs_f64() * 1e6 / messages as f64;
            let name = if http2 { "HTTP/2 streams" } else { "HTTP/1.1      " };
            println!(
                "round {round} {name}: {rate:>9.0} msg/s, server {cpu_per_message:.2} µs CPU per message"
            );
            result.push((rate, cpu_per_message));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut medians = Vec::new();
    for (name, result) in ["HTTP/2 streams", "HTTP/1.1"].into_iter().zip(&results) {
        let (mut rates, mut cpus): (Vec<f64>, Vec<f64>) = result.iter().copied().unzip();
        let (rate, cpu) = (median(&mut rates), median(&mut cpus));
        println!("median {name}: {rate:.0} msg/s, {cpu:.2} µs server CPU per message");
        medians.push((rate, cpu));
    }
    println!(
        "HTTP/2 / HTTP/1.1: {:.2}x the msg/s, {:.2}x the CPU per message",
        medians[0].0 / medians[1].0,
        medians[0].1 / medians[1].1
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// The server process: `/echo` on both protocols, its address printed on stdout.
fn serve(cert: &str, key: &str) {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    runtime.block_on(async {
        let identity = TlsIdentity::load(cert.as_ref(), key.as_ref()).expect("the certificate");
        let endpoint = Endpoint::new(EndpointConfig::default().memory(256 << 20)).unwrap();
        let server = Http2Server::new(Arc::new(identity), Http2Config::default())
            .expect("TLS")
            .charge_to(&endpoint);
        let app = Router::new().route("/echo", any(echo)).layer(Extension(endpoint));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        server.serve(listener, app).await.unwrap();
    });
}

async fn echo(ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(|mut socket: AxumWebSocket| async move {
        while let Some(message) = socket.next().await {
            if let OwnedMessage::Close(_) = message {
                break;
            }
            let _ = socket.send(message);
        }
    })
}

/// One run: `sockets` echo clients over HTTP/2 streams of one connection or over HTTP/1.1
/// connections, for `time`. Returns the messages echoed, the time, and the server's CPU time.
#[allow(clippy::too_many_arguments)]
async fn run(
    ca: &TestCa,
    addr: SocketAddr,
    server: u32,
    http2: bool,
    sockets: usize,
    in_flight: usize,
    bytes: usize,
    time: Duration,
) -> (u64, Duration, Duration) {
    let endpoint = Endpoint::new(EndpointConfig::default().memory(256 << 20)).unwrap();
    let config = WsConfig::default();
    let mut opened = Vec::new();
    if http2 {
        let origin = format!("https://localhost:{}", addr.port());
        let client = Http2Client::handshake(tls(ca, addr, b"h2").await, &origin).await.unwrap();
        for _ in 0..sockets {
            opened.push(client.websocket("/echo", &endpoint, &config).await.unwrap());
        }
    } else {
        for _ in 0..sockets {
            opened.push(http1_websocket(ca, addr, &endpoint, &config).await);
        }
    }
    let (echoed, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let payload = vec![7u8; bytes];
    let (cpu_before, started) = (cpu_time(server), Instant::now());
    let tasks: Vec<_> = opened
        .into_iter()
        .map(|mut ws| {
            let (echoed, stop, payload) = (echoed.clone(), stop.clone(), payload.clone());
            tokio::spawn(async move {
                for _ in 0..in_flight {
                    ws.send_binary(&payload);
                }
                let mut outstanding = in_flight;
                while outstanding > 0 {
                    match ws.next().await {
                        Some(OwnedMessage::Binary(_)) => {
                            echoed.fetch_add(1, Ordering::Relaxed);
                            if stop.load(Ordering::Relaxed) {
                                outstanding -= 1;
                            } else {
                                ws.send_binary(&payload);
                            }
                        }
                        other => panic!("expected an echo, got {other:?}"),
                    }
                }
                let _ = ws.close(freeboard::CloseCode::NORMAL, "done");
            })
        })
        .collect();
    tokio::time::sleep(time).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let (elapsed, cpu) = (started.elapsed(), cpu_time(server) - cpu_before);
    (echoed.load(Ordering::Relaxed), elapsed, cpu)
}

/// A WebSocket over its own TLS connection: hyper's HTTP/1.1 client sends the upgrade, and
/// the upgraded connection carries freeboard's client session, as an HTTP/2 stream does.
async fn http1_websocket(
    ca: &TestCa,
    addr: SocketAddr,
    endpoint: &Arc<Endpoint>,
    config: &WsConfig,
) -> WebSocket<TokioIo<hyper::upgrade::Upgraded>> {
    let io = TokioIo::new(tls(ca, addr, b"http/1.1").await);
    let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Body>(io).await.unwrap();
    tokio::spawn(conn.with_upgrades());
    let request = Request::get("/echo")
        .header(header::HOST, format!("localhost:{}", addr.port()))
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_VERSION, "13")
        .header(header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
        .body(Body::empty())
        .unwrap();
    let mut response = send.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    let upgraded = hyper::upgrade::on(&mut response).await.unwrap();
    WebSocket::client_from_upgraded(TokioIo::new(upgraded), endpoint, config, None)
}

/// A TLS connection to `addr` offering `alpn`, trusting the bench's CA.
async fn tls(ca: &TestCa, addr: SocketAddr, alpn: &[u8]) -> TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca.ca_pem()).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap()
}

/// The user and system CPU time of process `pid` (`/proc/PID/stat`, fields 14 and 15, in
/// clock ticks of 10 ms).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which may hold spaces, in its parentheses.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}
