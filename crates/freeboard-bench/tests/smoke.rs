//! A short run of each experiment against an in-process freeboard server and a raw TCP echo
//! on loopback: the counts must add up (no timing assertions).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use freeboard::{Echo, Router, Server, ServerConfig};
use freeboard_bench::Target;
use freeboard_bench::load::{self, Load};
use freeboard_bench::report::{LoadRow, Report};
use freeboard_bench::suite::{self, Subject};

fn server() -> freeboard::RunningServer {
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.memory = 64 << 20;
    config.idle_timeout = None;
    config.max_connections_per_ip = 100_000;
    Server::bind(config, || Router::new().route("/", Echo).route("/echo", Echo)).unwrap().spawn()
}

fn subject(target: Target) -> Subject {
    Subject { name: target.to_string(), target, pid: Some(std::process::id()) }
}

fn assert_consistent(row: &LoadRow) {
    for run in &row.runs {
        assert_eq!(run.failed, 0, "{run:?}");
        assert_eq!(run.sent, run.received, "{run:?}");
        assert_eq!(run.mismatched, 0, "{run:?}");
        assert!(run.received > 0);
        assert!(run.server_cpu_us_per_msg.is_some());
    }
}

#[test]
fn echo_counts_every_message() {
    let server = server();
    let target = Target::parse(&format!("ws://{}/echo", server.local_addr())).unwrap();
    let cases: Vec<Load> = [(1, 8), (1, 1024), (4, 64), (2, 70_000)]
        .into_iter()
        .map(|(clients, size)| Load {
            clients,
            in_flight: 1,
            size,
            messages: Some(500),
            duration: Duration::from_secs(10),
            server_pid: None,
        })
        .collect();
    let rows = suite::loads(&subject(target), "echo", &cases, 2).unwrap();
    for row in &rows {
        assert_consistent(row);
        assert_eq!(row.runs[0].sent, 500 * row.clients as u64);
    }
    let report = Report { loads: rows, ..Report::default() };
    assert!(report.markdown().contains("| ws://"));
    assert_eq!(report.csv().lines().count(), 1 + 4 * 2);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn pipeline_drains_what_is_in_flight() {
    let server = server();
    let target = Target::parse(&format!("ws://{}/", server.local_addr())).unwrap();
    let case = Load {
        clients: 4,
        in_flight: 64,
        size: 1024,
        messages: None,
        duration: Duration::from_millis(1500),
        server_pid: None,
    };
    let rows = suite::loads(&subject(target), "pipeline", &[case], 1).unwrap();
    assert_consistent(&rows[0]);
    assert!(rows[0].mib_per_sec.median > 0.0);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn raw_tcp_echo_returns_the_frames() {
    // A minimal blocking TCP echo: one thread per connection.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    let target = Target::parse(&format!("tcp://{addr}")).unwrap();
    let load = Load {
        clients: 2,
        in_flight: 8,
        size: 100,
        messages: Some(2000),
        duration: Duration::from_secs(10),
        server_pid: None,
    };
    let m = load::run(&target, &load, &mut |_| {}).unwrap();
    assert_eq!((m.failed, m.sent, m.received, m.mismatched), (0, 4000, 4000, 0));
}

#[test]
fn connections_open_and_close() {
    let server = server();
    let target = Target::parse(&format!("ws://{}/", server.local_addr())).unwrap();
    let metrics = server.metrics();
    let row = suite::connections(&subject(target), &[10, 200], 1).unwrap();
    for step in &row.steps {
        assert_eq!((step.connected, step.failed), (step.count, 0), "{step:?}");
        assert!(step.kib_per_conn.is_some());
    }
    assert_eq!(row.cycle_rss_kib.len(), 2);
    let start = std::time::Instant::now();
    while metrics.connections.get() != 0 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metrics.connections.get(), 0);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn slow_consumer_leaves_the_innocent_client_its_echoes() {
    let server = server();
    let target = Target::parse(&format!("ws://{}/", server.local_addr())).unwrap();
    let outcome = freeboard_bench::slow_consumer::run(
        &target,
        1024,
        Duration::from_millis(1500),
        Some(std::process::id()),
    )
    .unwrap();
    let m = &outcome.innocent;
    assert_eq!((m.failed, m.mismatched), (0, 0), "{m:?}");
    assert_eq!(m.sent, m.received);
    assert!(m.received > 0 && outcome.bytes_written > 0);
    assert!(!outcome.rss_kib.is_empty());
    let report = Report { slow_consumers: vec![("x".into(), outcome)], ..Report::default() };
    assert!(report.markdown().contains("slow consumer"));
    server.handle().shutdown();
    server.join().unwrap();
}
