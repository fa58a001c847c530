//! `freeboard serve --trusted-proxy` behind a real nginx (Debian's package; `scripts/test`
//! installs it): per-address limits apply to each real client, not to the proxy, and the
//! upgrade, messages and the close handshake pass through.
//!
//! nginx runs on a free loopback port with a generated configuration, in the foreground
//! (`master_process off`, one process), and is stopped by its PID. Without an `nginx` binary
//! the test says so and passes.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use socket2::{Domain, Socket, Type};

use common::{Process, Serve};

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn nginx_binary() -> Option<String> {
    ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .map(str::to_owned)
}

/// nginx proxying WebSockets to `upstream`, configured as docs/operating/proxies.md recommends.
fn nginx(binary: &str, dir: &std::path::Path, upstream: SocketAddr) -> (Process, SocketAddr) {
    let port = common::free_port();
    let d = dir.display();
    let conf = format!(
        r#"daemon off;
master_process off;
worker_rlimit_nofile 16384;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://{upstream};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
            proxy_buffering off;
        }}
    }}
}}
"#
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let child = Command::new(binary)
        .args(["-p", &dir.display().to_string(), "-c", &path.display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let process = Process(child);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !common::listening(addr) {
        let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
        assert!(std::time::Instant::now() < deadline, "nginx did not start: {log}");
        std::thread::sleep(Duration::from_millis(20));
    }
    (process, addr)
}

/// Upgrades at `/echo` through `proxy` from the loopback address `from`; the stream and the
/// status.
fn upgrade(proxy: SocketAddr, from: Ipv4Addr) -> (TcpStream, u16) {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    socket.connect(&proxy.into()).unwrap();
    let mut s: TcpStream = socket.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!(
        "GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let status = std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap();
    if status != 101 {
        // The refusal's body, so the stream ends cleanly.
        let _ = s.read_to_end(&mut Vec::new());
    }
    (s, status)
}

fn metrics(proxy: SocketAddr) -> String {
    std::thread::sleep(freeboard::metrics::ADMIN_REFRESH); // a build after the change
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn per_address_limits_apply_to_each_client_behind_nginx() {
    let Some(binary) = nginx_binary() else {
        eprintln!("SKIPPED: no nginx binary (scripts/test installs Debian's nginx)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("freeboard-nginx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let args =
        ["--trusted-proxy", "127.0.0.1/32", "--max-connections-per-ip", "100", "--memory", "256M"];
    let server = Serve::start(&args);
    let upstream = server.socket_addr();
    let (nginx, proxy) = nginx(&binary, &dir, upstream);

    // 2,000 clients from 20 loopback addresses, 100 each: the cap of each address, not of
    // the proxy's, applies.
    let mut clients = Vec::with_capacity(2000);
    for i in 0..2000u32 {
        let from = Ipv4Addr::new(127, 0, 0, 2 + (i % 20) as u8);
        let (stream, status) = upgrade(proxy, from);
        assert_eq!(status, 101, "client {i} from {from}");
        clients.push(stream);
    }
    // The 101st from one address is over its cap.
    assert_eq!(upgrade(proxy, Ipv4Addr::new(127, 0, 0, 2)).1, 429);
    let text = metrics(proxy);
    let forwarded = text
        .lines()
        .find_map(|l| l.strip_prefix("freeboard_access_forwarded_total "))
        .map(|v| v.trim().parse::<f64>().unwrap());
    assert!(forwarded >= Some(2001.0), "{text}");

    // Messages and the close handshake pass through.
    let c = &mut clients[0];
    c.write_all(&freeboard_test::frame(0x81, b"via nginx", freeboard_test::TEST_MASK)).unwrap();
    let mut reply = [0u8; 11];
    c.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"\x81\x09via nginx");
    c.write_all(&freeboard_test::frame(0x88, &1000u16.to_be_bytes(), freeboard_test::TEST_MASK))
        .unwrap();
    let mut close = [0u8; 4];
    c.read_exact(&mut close).unwrap();
    assert_eq!(close, [0x88, 0x02, 0x03, 0xe8]);
    assert_eq!(c.read(&mut [0u8; 16]).unwrap(), 0, "the server ends the TCP connection");

    drop(clients);
    drop(nginx);
    let _ = std::fs::remove_dir_all(&dir);
}
