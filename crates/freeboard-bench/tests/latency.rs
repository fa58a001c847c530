//! The open-loop generator against real sockets on loopback: a server that stalls, one that
//! cannot keep up, and freeboard. Bounds are generous and follow from the schedule (a stall of
//! 300 ms delays every message sent during it), not from the machine's speed.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use freeboard::{Echo, Router, Server, ServerConfig};
use freeboard_bench::Target;
use freeboard_bench::latency::{self, Generator, LatencyReport, SweepPlan};
use freeboard_bench::report::Report;

/// A raw TCP echo for one connection on loopback, which `serve` drives; stops when `stop` is
/// set or the connection closes.
fn raw_echo(
    serve: impl FnOnce(TcpStream, &AtomicBool) + Send + 'static,
) -> (Target, Arc<AtomicBool>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = Target::parse(&format!("tcp://{}", listener.local_addr().unwrap())).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        serve(stream, &flag);
    });
    (target, stop, thread)
}

/// Echoes what arrives, reading at most `chunk` bytes at a time; `pause(bytes so far)` says
/// how long to sleep after each read.
fn echo_with(
    mut stream: TcpStream,
    stop: &AtomicBool,
    chunk: usize,
    pause: impl Fn(u64) -> Duration,
) {
    let mut buf = vec![0u8; chunk];
    let mut total = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if stream.write_all(&buf[..n]).is_err() {
                    return;
                }
                total += n as u64;
                std::thread::sleep(pause(total));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

#[test]
fn a_stall_counts_for_every_message_it_held_up() {
    // 500 msg/s for 1.2 s; after about 100 messages (70 B frames) the server sleeps 300 ms
    // once. A closed-loop client would time one slow echo; here every message intended during
    // the stall waits until it ends.
    let stalled = AtomicBool::new(false);
    let (target, stop, server) = raw_echo(move |stream, stop| {
        echo_with(stream, stop, 64 * 1024, |total| {
            // The opening byte, then 100 frames of 70 bytes.
            if total > 100 * 70 && !stalled.swap(true, Ordering::Relaxed) {
                Duration::from_millis(300)
            } else {
                Duration::ZERO
            }
        })
    });
    let mut generator = Generator::connect(&target, 1, 64).unwrap();
    let run = generator.run(500.0, Duration::from_millis(1200), Duration::ZERO, None).unwrap();
    stop.store(true, Ordering::Relaxed);
    drop(generator);
    server.join().unwrap();

    assert_eq!(
        (run.sent, run.received, run.unanswered, run.mismatched),
        (600, 600, 0, 0),
        "{run:?}"
    );
    assert!(run.failures.is_empty(), "{run:?}");
    // The message sent as the stall began waited all of it.
    assert!(run.latency_us.max >= 250_000.0, "{run:?}");
    // About 150 of the 600 (25 %) were sent during the stall, 100 of them in its first 200 ms.
    assert!(run.latency_us.p90 >= 100_000.0, "{run:?}");
    // The generator kept to its schedule: the stall is in the round trips, not in the sends.
    assert!(run.send_lag_us.p99 < 100_000.0, "{run:?}");
    assert!(run.achieved_rate > 0.8 * run.target_rate, "{run:?}");
    let p = run.latency_us;
    assert!(p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.p999 && p.p999 <= p.max, "{p:?}");
}

#[test]
fn a_rate_the_server_cannot_keep_up_with_is_reported_short() {
    // The server echoes one read of at most 70 bytes (a frame) every 10 ms: at most ~100
    // msg/s against the 1,000 asked for.
    let (target, stop, server) =
        raw_echo(|stream, stop| echo_with(stream, stop, 70, |_| Duration::from_millis(10)));
    let mut generator = Generator::connect(&target, 1, 64).unwrap();
    let run = generator.run(1000.0, Duration::from_secs(1), Duration::ZERO, None).unwrap();
    stop.store(true, Ordering::Relaxed);
    drop(generator);
    server.join().unwrap();

    assert_eq!(run.sent, 1000, "the schedule does not wait for echoes: {run:?}");
    assert!(!run.reached, "{run:?}");
    assert!(run.achieved_rate < 500.0, "{run:?}");
    // The run gave up waiting with most still owed; each is in the histogram at least as
    // late as it was by then, so the tail reflects the backlog.
    assert!(run.unanswered > 0 && run.received + run.unanswered == 1000, "{run:?}");
    assert!(run.latency_us.max >= 1_000_000.0, "{run:?}");
    let mut report = LatencyReport::default();
    report.add_fixed("slow", "1000/s per connection", run);
    assert!(report.markdown().contains("target not reached"), "{}", report.markdown());
    assert_eq!(report.csv().lines().count(), 2);
}

#[test]
fn against_freeboard_every_message_comes_back_and_a_sweep_steps_up() {
    let mut config = ServerConfig::default();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.threads = 1;
    config.memory = 64 << 20;
    config.limits.idle_timeout = None;
    let server = Server::bind(config, || Router::new().route("/", Echo)).unwrap().spawn();
    let target = Target::parse(&format!("ws://{}/", server.local_addr())).unwrap();
    let mut generator = Generator::connect(&target, 10, 64).unwrap();

    // Two runs on the same connections: nothing carries over from one to the next.
    for _ in 0..2 {
        let run =
            generator.run(100.0, Duration::from_secs(1), Duration::from_millis(200), None).unwrap();
        assert_eq!((run.sent, run.received, run.unanswered), (1000, 1000, 0), "{run:?}");
        assert_eq!((run.connections, run.mismatched), (10, 0), "{run:?}");
        assert!(run.failures.is_empty() && run.latency_us.p50 > 0.0, "{run:?}");
    }

    // A bound no loopback round trip comes near: every step passes, so the sweep doubles
    // each time and its capacity is a lower bound.
    let plan = SweepPlan {
        bound: Duration::from_secs(1),
        from: 500.0,
        resolution: 1.1,
        max_steps: 3,
        duration: Duration::from_millis(500),
        warmup: Duration::from_millis(100),
    };
    let mut seen = Vec::new();
    let sweep = latency::sweep(&mut generator, &plan, None, &mut |r, passed| {
        seen.push((r.target_rate, passed));
    })
    .unwrap();
    assert_eq!(seen, [(500.0, true), (1000.0, true), (2000.0, true)]);
    assert_eq!((sweep.capacity, sweep.failed_at, sweep.steps.len()), (2000.0, None, 3));
    let mut report = LatencyReport::default();
    report.add_sweep("freeboard", 10, 64, sweep);
    assert!(report.markdown().contains("at least"), "{}", report.markdown());
    let report = Report { latency: report, ..Report::default() };
    let charts = freeboard_bench::charts::charts(&report);
    let chart = charts.iter().find(|c| c.file == "latency_sweep.svg").expect("a sweep chart");
    assert_eq!(chart.series[0].points.len(), 3);
}
