//! A short run of each experiment against an in-process freeboard server and a raw TCP echo
//! on loopback: the counts must add up (no timing assertions).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use freeboard::{Echo, HttpRoute, Router, Server, ServerConfig};
use freeboard_bench::Target;
use freeboard_bench::load::{self, Load};
use freeboard_bench::report::{LoadRow, Report};
use freeboard_bench::suite::{self, Subject};

fn server() -> freeboard::RunningServer {
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.memory = 64 << 20;
    config.limits.idle_timeout = None;
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
    let charts: Vec<_> = freeboard_bench::charts::charts(&report).iter().map(|c| c.file).collect();
    assert_eq!(charts, ["latency_by_payload.svg", "msgs_by_clients.svg"]);
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
    let opening = freeboard_bench::connections::Opening::default();
    let row = suite::connections(&subject(target), &[10, 200], 1, &opening).unwrap();
    for step in &row.steps {
        assert_eq!((step.connected, step.failed), (step.count, 0), "{step:?}");
        assert!(step.kib_per_conn.is_some());
    }
    assert_eq!(row.cycle_rss_kib.len(), 2);
    let start = std::time::Instant::now();
    while metrics.connections() != 0 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metrics.connections(), 0);
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

#[test]
fn buffers_simulation_has_a_row_per_configuration() {
    use freeboard_bench::buffers::simulation::{self, Allocator, Workload};
    let workload = Workload { seconds: 10 * 60, sample_every: 30, ..Workload::default() };
    let mut outcomes = Vec::new();
    for size in [1024, 2048, 4096, 8192, 16384] {
        for allocator in [Allocator::Pool { chunk: size }, Allocator::TlsfBuffer { buffer: size }] {
            outcomes.push(simulation::simulate(&workload, allocator, &mut |_| {}).unwrap());
        }
    }
    outcomes.push(simulation::simulate(&workload, Allocator::TlsfExact, &mut |_| {}).unwrap());
    for o in &outcomes {
        assert!(o.frames_delivered > 0 && o.delivered_fps > 0.0, "{o:?}");
        assert_eq!(o.samples.len(), 20);
    }
    let report = Report { simulation: Some((workload, outcomes)), ..Report::default() };
    let markdown = report.markdown();
    assert_eq!(markdown.matches("| freeboard pool |").count(), 5);
    assert_eq!(markdown.matches("| TLSF, buffer/msg |").count(), 5);
    assert_eq!(markdown.matches("| TLSF, exact size |").count(), 1);
    assert_eq!(report.buffers_csv().lines().count(), 1 + 11 * 20);
    let back = Report::from_json(&report.to_json()).unwrap();
    assert_eq!(back.markdown(), markdown);
    let dir = std::env::temp_dir().join(format!("freeboard-smoke-charts-{}", std::process::id()));
    let written = freeboard_bench::charts::write(&report, &dir).unwrap();
    let names: Vec<_> = written.iter().filter_map(|p| p.file_name()?.to_str()).collect();
    assert_eq!(names, ["fragmentation_over_time.svg", "fps_by_buffer_size.svg"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn buffers_soak_delivers_frames_through_a_small_budget() {
    use freeboard_bench::buffers::soak::{self, Soak};
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.memory = 400 << 10;
    config.read_buffer = 16 << 10;
    config.limits.max_message_size = 16 << 10;
    config.connection_reserve = 16 << 10;
    config.limits.idle_timeout = None;
    let service = topic_service(&config);
    let routes =
        move || service.mount(Router::new().route("/", Echo).http("/metrics", HttpRoute::Metrics));
    let server = Server::bind(config, routes).unwrap().spawn();
    let settings = Soak {
        target: Target::parse(&format!("ws://{}/topic/led", server.local_addr())).unwrap(),
        producers: 2,
        fps: 60,
        frame_bytes: 960,
        pattern_bytes: 8 << 10,
        pattern_every: Duration::from_millis(500),
        stalls: true,
        duration: Duration::from_secs(3),
        sample: Duration::from_secs(1),
        server_pid: Some(std::process::id()),
    };
    let run = soak::run(&settings, &mut |_| {}).unwrap();
    assert_eq!(run.samples.len(), 3, "{run:?}");
    assert!(run.totals.0 > 0 && run.totals.1 > 0, "{run:?}");
    assert!(run.samples.iter().map(|s| s.pattern_switches).sum::<usize>() > 0, "{run:?}");
    for s in &run.samples {
        assert!(s.chunks_total.is_some_and(|n| n > 0), "{s:?}");
        assert!(s.server_rss_kib.is_some());
    }
    let report = Report { soaks: vec![run], ..Report::default() };
    assert!(report.markdown().contains("buffers: soak"));
    assert_eq!(report.buffers_csv().lines().count(), 1 + 3);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn watermarks_score_every_iteration() {
    use freeboard_bench::watermarks::{self, Plan};
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.limits.idle_timeout = None;
    config.limits.send_low = 4 << 10;
    config.limits.send_high = 16 << 10;
    let server = Server::bind(config, || Router::new().route("/", Echo)).unwrap().spawn();
    let target = Target::parse(&format!("ws://{}/", server.local_addr())).unwrap();
    let plan = Plan { batch: 300, burst: 200, bursts: 2, size: 1024, warmup: 1, iterations: 3 };
    let mut lines = 0;
    let rows =
        watermarks::run(&target, "freeboard", (4 << 10, 16 << 10), &plan, &mut |_| lines += 1)
            .unwrap();
    assert_eq!(lines, 2 * 4);
    assert_eq!(rows.iter().map(|r| r.mode.as_str()).collect::<Vec<_>>(), ["sequential", "burst"]);
    for r in &rows {
        assert_eq!((r.warmup.len(), r.iterations.len(), r.lost), (1, 3, 0), "{r:?}");
        let s = r.score;
        assert!(s.n == 3 && s.min > 0.0 && s.min <= s.mean && s.mean <= s.max, "{s:?}");
        assert!(s.error.is_finite());
    }
    let report = Report { watermarks: rows, ..Report::default() };
    assert_eq!(report.markdown().matches("| freeboard | 4/16 |").count(), 2);
    assert_eq!(report.watermarks_csv().lines().count(), 1 + 2 * 4);
    let charts: Vec<_> = freeboard_bench::charts::charts(&report).iter().map(|c| c.file).collect();
    assert_eq!(charts, ["watermarks.svg"]);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn compressing_connections_have_their_memory_measured() {
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.limits.idle_timeout = None;
    config.compression = freeboard::Compression::Shared;
    let server =
        Server::bind(config, || Router::new().route("/", freeboard::Echo)).unwrap().spawn();
    let target = Target::parse(&format!("ws://{}/", server.local_addr())).unwrap();
    let row = freeboard_bench::compression::memory("shared", &target, 20, 1024, std::process::id())
        .unwrap();
    assert_eq!((row.connections, row.compressing), (20, 20), "{row:?}");
    assert!(row.echo_wire_bytes < 512.0, "{row:?}");
    let table = freeboard_bench::compression::memory_markdown(&[row]);
    assert!(table.contains("| shared | 20 | 20 |"), "{table}");
    server.handle().shutdown();
    server.join().unwrap();
}

/// The same fan-out to WebSocket and to Server-Sent Events subscribers of the library's topic
/// route: every subscriber gets every message, in order, and the comparison table pairs them.
#[test]
fn broadcast_reaches_event_stream_subscribers_as_websocket_ones() {
    use freeboard_bench::broadcast::{self, Broadcast};
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 2;
    config.limits.idle_timeout = None;
    config.topics.slow_consumer = freeboard::SlowConsumerPolicy::DropOldest;
    config.topics.send_cap = 4 << 20;
    let service = topic_service(&config);
    let server = Server::bind(config, move || service.mount(Router::new())).unwrap().spawn();
    let target = Target::parse(&format!("ws://{}/topic/bench", server.local_addr())).unwrap();
    let mut rows = Vec::new();
    for sse in [false, true] {
        let run = Broadcast {
            subscribe: vec![target.clone()],
            publish: vec![target.clone()],
            subscribers: 20,
            size: 256,
            window: 4,
            messages: 200,
            deflate: false,
            server_pids: vec![std::process::id()],
            text: true,
            sse,
            document: false,
            delta: false,
            shards: 1,
            non_readers: 0,
            memory: None,
        };
        let name = if sse { "freeboard+sse" } else { "freeboard+ws-text" };
        let row = broadcast::run(&run, name, &mut |_| {}).unwrap();
        assert_eq!((row.subscribers, row.messages), (20, 200), "{row:?}");
        // A text frame's 4-byte header, or an event's `data: ` and empty line.
        let framing = if sse { 8.0 } else { 4.0 };
        assert_eq!(row.wire_bytes_per_delivery, 256.0 + framing, "{row:?}");
        rows.push(row);
    }
    // The server sees the streams' ends at its next turns.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.metrics().sse_connections() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(server.metrics().sse_connections(), 0, "the streams closed with the run");
    let table = broadcast::sse_markdown(&rows);
    assert!(table.contains("| 20 | 256 |") && table.contains("| 260 | 264 | 1.02 |"), "{table}");
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn broadcast_of_a_changing_document_whole_and_as_deltas() {
    use freeboard_bench::broadcast::{self, Broadcast};
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 2;
    config.limits.idle_timeout = None;
    config.topics.slow_consumer = freeboard::SlowConsumerPolicy::DropOldest;
    config.topics.send_cap = 4 << 20;
    config.topics.delta_prefix = Some(String::new());
    let service = topic_service(&config);
    let server = Server::bind(config, move || service.mount(Router::new())).unwrap().spawn();
    let target = Target::parse(&format!("ws://{}/topic/bench", server.local_addr())).unwrap();
    let mut rows = Vec::new();
    for delta in [false, true] {
        let run = Broadcast {
            subscribe: vec![target.clone()],
            publish: vec![target.clone()],
            subscribers: 20,
            size: 10_000,
            window: 4,
            messages: 100,
            deflate: false,
            server_pids: vec![std::process::id()],
            text: true,
            sse: false,
            document: true,
            delta,
            shards: 1,
            non_readers: 0,
            memory: None,
        };
        let name = if delta { "freeboard+delta" } else { "freeboard+whole" };
        let row = broadcast::run(&run, name, &mut |_| {}).unwrap();
        assert_eq!((row.subscribers, row.messages), (20, 100), "{row:?}");
        rows.push(row);
    }
    // About 1 % of each document changes: a delta is a small part of it (the first message
    // of each subscriber goes whole).
    assert_eq!(rows[0].wire_bytes_per_delivery, 10_004.0);
    assert!(rows[1].wire_bytes_per_delivery < 1000.0, "{:?}", rows[1]);
    let table = broadcast::delta_markdown(&rows);
    assert!(table.contains("| 20 | 10000 | 1 |"), "{table}");
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn broadcast_reaches_every_subscriber() {
    use freeboard_bench::broadcast::{self, Broadcast};
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.limits.idle_timeout = None;
    config.topics.slow_consumer = freeboard::SlowConsumerPolicy::DropOldest;
    config.topics.send_cap = 4 << 20;
    config.compression = freeboard::Compression::Shared;
    let service = topic_service(&config);
    let server = Server::bind(config, move || service.mount(Router::new())).unwrap().spawn();
    let target = Target::parse(&format!("ws://{}/topic/bench", server.local_addr())).unwrap();
    let mut rows = Vec::new();
    for (subscribers, size, deflate) in [(5, 64, false), (20, 1024, false), (20, 1024, true)] {
        let run = Broadcast {
            subscribe: vec![target.clone()],
            publish: vec![target.clone()],
            subscribers,
            size,
            window: 4,
            messages: 100,
            deflate,
            server_pids: vec![std::process::id()],
            text: false,
            sse: false,
            document: false,
            delta: false,
            shards: 1,
            non_readers: 0,
            memory: None,
        };
        let name = if deflate { "freeboard+deflate" } else { "freeboard" };
        let row = broadcast::run(&run, name, &mut |_| {}).unwrap();
        assert_eq!((row.subscribers, row.messages), (subscribers, 100), "{row:?}");
        assert!(row.deliveries_per_sec > 0.0 && row.latency_ms[0] <= row.latency_ms[2]);
        assert!(row.server_cpu_us_per_msg.is_some());
        // Compressing subscribers read the JSON payloads compressed, the others whole.
        assert_eq!(row.compressing, if deflate { subscribers } else { 0 });
        let whole = (size + 2 + if size > 125 { 2 } else { 0 }) as f64;
        match deflate {
            true => assert!(row.wire_bytes_per_delivery < whole / 2.0, "{row:?}"),
            false => assert_eq!(row.wire_bytes_per_delivery, whole, "{row:?}"),
        }
        rows.push(row);
    }
    // A loop adds its counts to the shared metrics at the end of its turn, which may come
    // just after the last subscriber has read the last message.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.metrics().topic_compressions() < 100 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(server.metrics().topic_compressions(), 100);
    assert_eq!(server.metrics().topic_compression_fallbacks(), 0);
    let table = freeboard_bench::compression::broadcast_markdown(&rows);
    assert!(table.contains("| 20 | 1024 | permessage-deflate | 20 |"), "{table}");
    let report = Report { broadcasts: rows, ..Report::default() };
    assert_eq!(report.markdown().matches("| freeboard |").count(), 2);
    assert_eq!(report.broadcasts_csv().lines().count(), 4);
    server.handle().shutdown();
    server.join().unwrap();
}

/// The topic service on `config`'s hub settings, clients allowed to publish.
fn topic_service(config: &ServerConfig) -> freeboard_topics::Service {
    let mut topics = freeboard_topics::Config::default();
    topics.hub = config.topics.clone();
    topics.route.client_publish = true;
    freeboard_topics::Service::new(&topics).unwrap()
}

#[test]
fn a_crowd_beyond_the_budget_is_refused_503_counted_by_cause_and_the_rest_held() {
    let (server, admissible, target) = small_budget_server();
    let extra = 100;
    let crowd = freeboard_bench::crowd::Crowd {
        in_flight: 64,
        sources: freeboard_bench::crowd::Crowd::loopback_sources(
            std::net::Ipv4Addr::new(127, 0, 9, 1),
            2,
        ),
        ..freeboard_bench::crowd::Crowd::new(target, admissible + extra)
    };
    let mut seen = 0;
    let gathered =
        freeboard_bench::crowd::gather(&crowd, &mut |p| seen = seen.max(p.open)).unwrap();
    // Handshakes in flight hold pool chunks for their 101s: a few fewer may get in.
    assert!(gathered.connected <= admissible + 1, "{gathered:?}");
    assert!(gathered.connected + 64 >= admissible, "{gathered:?}");
    let refused = gathered.refused.get(&503).copied().unwrap_or(0);
    assert_eq!(gathered.connected + refused, admissible + extra, "{}", gathered.causes());
    assert_eq!(gathered.refused_with_retry_after, refused);
    assert_eq!(gathered.held, gathered.connected);
    assert_eq!(server.metrics().access_refusals_for("budget"), refused as u64);
    server.handle().shutdown();
    server.join().unwrap();
}

#[test]
fn a_reconnect_storm_brings_every_client_back_inside_the_budget() {
    let (server, admissible, target) = small_budget_server();
    // Room for the handshakes in flight, whose 101s hold pool chunks.
    let count = admissible - 64;
    // Others hold part of the budget when the storm starts, and leave a second later: the
    // first connect meets 503s with Retry-After, and its clients come back after it.
    let others = {
        let target = target.clone();
        std::thread::spawn(move || {
            let crowd = freeboard_bench::crowd::Crowd {
                in_flight: 64,
                hold: Duration::from_secs(1),
                sources: freeboard_bench::crowd::Crowd::loopback_sources(
                    std::net::Ipv4Addr::new(127, 0, 11, 1),
                    1,
                ),
                ..freeboard_bench::crowd::Crowd::new(target, 200)
            };
            freeboard_bench::crowd::gather(&crowd, &mut |_| {}).unwrap()
        })
    };
    let metrics = server.metrics();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while metrics.connections() < 200 {
        assert!(std::time::Instant::now() < deadline, "{} connected", metrics.connections());
        std::thread::sleep(Duration::from_millis(5));
    }
    let storm = freeboard_bench::storm::Storm {
        rounds: 2,
        in_flight: 64,
        sources: freeboard_bench::crowd::Crowd::loopback_sources(
            std::net::Ipv4Addr::new(127, 0, 10, 1),
            2,
        ),
        initial: Duration::from_millis(1),
        max: Duration::from_secs(1),
        hold: Duration::from_millis(100),
        round_deadline: Duration::from_secs(60),
        ..freeboard_bench::storm::Storm::new(target, count)
    };
    let rounds = freeboard_bench::storm::run(&storm, &mut |_, _, _, _| {}).unwrap();
    assert_eq!(others.join().unwrap().connected, 200);
    assert_eq!(rounds.len(), 3);
    assert!(rounds[0].refused_with_retry_after > 0, "{:?}", rounds[0]);
    let mut refused = 0;
    for round in &rounds {
        assert_eq!(round.back, count, "{round:?}");
        let failed: u64 = round.failed.values().sum();
        let round_refused: u64 = round.refused.values().sum();
        assert_eq!(round.attempts, count as u64 + round_refused + failed, "{round:?}");
        // A refusal for a passing shortage says when to come back.
        assert_eq!(round.refused_with_retry_after, round_refused, "{round:?}");
        assert!(round.refused.keys().all(|&status| status == 503), "{round:?}");
        refused += round_refused;
    }
    assert_eq!(metrics.refusals_for(503), refused);
    server.handle().shutdown();
    server.join().unwrap();
}

/// An echo server whose budget pays for a few hundred connections' kernel memory, how many
/// it admits, and its URL.
fn small_budget_server() -> (freeboard::RunningServer, usize, Target) {
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.memory = 3 << 20;
    config.read_buffer = 16 << 10;
    config.limits.max_message_size = 64 << 10;
    config.limits.send_cap = 128 << 10;
    config.limits.idle_timeout = None;
    config.max_connections_per_ip = 100_000;
    let server = Server::bind(config, || Router::new().route("/", Echo)).unwrap();
    let admissible = server.capacity().budget;
    let server = server.spawn();
    let target = Target::parse(&format!("ws://{}/", server.local_addr())).unwrap();
    (server, admissible, target)
}
