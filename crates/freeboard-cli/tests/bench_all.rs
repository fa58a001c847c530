//! `freeboard bench all --quick`: every experiment for a few seconds against a `freeboard serve`
//! it starts, with every file of the report written (no timing assertions).

use std::process::Command;

mod common;

use common::Serve;

/// Runs `freeboard bench broadcast` with `args` and `--json json`, asserting it succeeded
/// (`what` names the run); its first broadcast row, and its Markdown.
fn broadcast(args: &[&str], json: &std::path::Path, what: &str) -> (serde_json::Value, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_freeboard"))
        .args(["bench", "broadcast"])
        .args(args)
        .arg("--json")
        .arg(json)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{what}: {stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    (report["broadcasts"][0].clone(), String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The messages the servers of a broadcast row counted as dropped for `reason`.
fn drops(row: &serde_json::Value, reason: &str) -> u64 {
    let drops = row["drops"].as_array().expect("the servers' drop counters").iter();
    drops
        .filter(|d| d[0].as_str().unwrap().contains(&format!("\"{reason}\"")))
        .map(|d| d[1].as_u64().unwrap())
        .sum()
}

#[test]
fn the_whole_suite_runs_in_seconds() {
    let out = std::env::temp_dir().join(format!("freeboard-bench-all-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let output = Command::new(env!("CARGO_BIN_EXE_freeboard"))
        .args(["bench", "all", "--quick", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let markdown = String::from_utf8_lossy(&output.stdout);
    for heading in [
        "### echo",
        "### pipeline",
        "### connections",
        "### slow consumer",
        "### broadcast",
        "### capacity at p99",
        "### at a fixed rate",
        "### watermarks",
        "### buffers: simulation",
        "### buffers: soak",
    ] {
        assert!(markdown.contains(heading), "{heading} missing from\n{markdown}");
    }
    for name in [
        "echo",
        "pipeline",
        "connections",
        "slow-consumer",
        "broadcast",
        "latency",
        "watermarks",
        "buffers-simulation",
        "buffers-soak",
    ] {
        for ext in ["json", "csv", "md"] {
            let file = out.join(format!("{name}.{ext}"));
            assert!(std::fs::metadata(&file).is_ok_and(|m| m.len() > 0), "{}", file.display());
        }
    }
    assert!(out.join("REPORT.md").exists());
    let charts = std::fs::read_dir(&out)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "svg"))
        .count();
    assert!(charts >= 7, "{charts} charts");
    // `bench report DIR` rebuilds the tables from the saved JSON.
    let report = Command::new(env!("CARGO_BIN_EXE_freeboard"))
        .args(["bench", "report"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(report.status.success());
    assert!(String::from_utf8_lossy(&report.stdout).contains("### watermarks"));
    std::fs::remove_dir_all(&out).unwrap();
}

/// Options `bench broadcast` would otherwise ignore are refused by name, before any server
/// starts or any connection is made.
#[test]
fn broadcast_refuses_options_it_would_ignore() {
    for (args, says) in [
        (&["--pin", "0,1", "ws://127.0.0.1:9/topic/x"][..], "--pin goes with --peers"),
        (&["--peers", "freeboard", "--server-pid", "1"][..], "--server-pid goes with a topic URL"),
        (&["--peers", "freeboard", "--pin", "0"][..], "--pin 0: expected SERVER_CPU,CLIENT_CPU"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_freeboard"))
            .args(["bench", "broadcast"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} ran");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// A sharded broadcast: two subscriber processes against one `freeboard serve`, then against
/// two that share nothing (each gets every publication from its own publisher connection).
/// Many small publications to subscribers that never read take a pool slot each long before
/// their bytes reach the high watermark: a quarter of 400 subscribers never reading 3,000
/// publications of 64 B hold more slots than a 4 MiB pool has. The largest holders past their
/// share pay before each fan-out (their policy acts), so every reader gets every publication
/// and the pool never refuses one (`pool_exhausted`).
#[test]
fn subscribers_that_never_read_small_publications_leave_the_readers_their_slots() {
    let json = std::env::temp_dir().join(format!("freeboard-slots-{}.json", std::process::id()));
    for policy in ["drop-oldest", "conflate"] {
        let serve = Serve::start(&[
            "--threads",
            "1",
            "--memory",
            "4M",
            "--client-publish",
            "--topic-slow-consumer",
            policy,
            "--topic-send-cap",
            "64K",
            "--no-auto-ping",
            "--max-connections-per-ip",
            "1000",
        ]);
        let (subscribers, messages, non_readers) = (400u64, 3000u64, 100u64);
        let (url, pid) = (format!("ws://{}/topic/slots", serve.addr), serve.pid().to_string());
        let args: Vec<&str> = [url.as_str(), "--shards", "1", "--subscribers", "400"]
            .into_iter()
            .chain(["--size", "64", "--messages", "3000", "--non-readers", "25"])
            .chain(["--memory", "32M", "--server-pid", &pid])
            .collect();
        let (row, _) = broadcast(&args, &json, policy);
        assert_eq!(row["non_readers"], non_readers, "{row}");
        assert_eq!(row["reader_deliveries"], messages * (subscribers - non_readers), "{row}");
        assert!(drops(&row, policy) > 0, "{policy}: the non-readers met no policy: {row}");
        assert_eq!(drops(&row, "pool_exhausted"), 0, "{policy}: {row}");
    }
    let _ = std::fs::remove_file(&json);
}

/// Every reader gets every message; a tenth of the subscribers never read, and the servers
/// count what they drop for them.
#[test]
fn sharded_broadcast_reaches_every_reader_of_every_server() {
    let flags = [
        "--threads",
        "1",
        "--client-publish",
        "--topic-slow-consumer",
        "drop-oldest",
        "--topic-send-cap",
        "64K",
        "--max-connections-per-ip",
        "1000",
    ];
    let json = std::env::temp_dir().join(format!("freeboard-shards-{}.json", std::process::id()));
    for count in [1, 2] {
        // Fresh servers, so that the drops counted are this run's.
        let servers: Vec<Serve> = (0..count).map(|_| Serve::start(&flags)).collect();
        let urls: Vec<String> =
            servers.iter().map(|s| format!("ws://{}/topic/shards", s.addr)).collect();
        let pids: Vec<String> = servers.iter().map(|s| s.pid().to_string()).collect();
        // 20 subscribers, 2 never reading. 1,000 messages of 16 KiB are 16 MiB for each
        // non-reader: more than its socket buffers and its 64 KiB queue hold, so the server
        // drops the oldest for it; two in flight (33 KiB) fit a reader's queue.
        let (subscribers, messages, non_readers) = (20u64, 1000u64, 2u64);
        let pids = pids.join(",");
        let args: Vec<&str> = urls
            .iter()
            .map(String::as_str)
            .chain(["--shards", "2", "--subscribers", "20", "--size", "16384"])
            .chain(["--messages", "1000", "--window", "2", "--non-readers", "10"])
            .chain(["--memory", "64M", "--server-pid", &pids])
            .collect();
        let (row, markdown) = broadcast(&args, &json, &format!("{count} server(s)"));
        assert_eq!(row["shards"], 2, "{row}");
        assert_eq!(row["servers"], count, "{row}");
        assert_eq!(row["messages"], messages, "{row}");
        assert_eq!(row["non_readers"], non_readers, "{row}");
        // Every reader counted every message, once.
        assert_eq!(row["reader_deliveries"], messages * (subscribers - non_readers), "{row}");
        assert!(drops(&row, "drop-oldest") > 0, "the non-readers met no policy: {row}");
        assert!(row["servers_rss_kib"].as_u64().unwrap() > 0, "{row}");
        assert_eq!(row["budget_kib"], 65_536 * count, "{row}");
        assert!(markdown.contains("Sharded runs"), "{markdown}");
    }
    let _ = std::fs::remove_file(&json);
}

/// A shard that fails says why in the bench's own error: what it wrote to its standard error
/// and how it exited, so a failed run needs no other log to explain it.
#[test]
fn a_failed_shard_says_why_in_the_benchs_error() {
    // A port with nothing listening: every shard's first connection is refused.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_freeboard"))
        .args(["bench", "broadcast", &format!("ws://{addr}/topic/shards")])
        .args(["--shards", "2", "--subscribers", "4", "--size", "64", "--messages", "10"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("freeboard bench: "), "{stderr}");
    assert!(last.contains("failed: its output ended; it exited with status 1"), "{stderr}");
    assert!(last.contains("its last errors: freeboard bench: shard: "), "{stderr}");
    assert!(last.contains("refused"), "the shard's own error is missing: {stderr}");
    // Its lines reached this process's standard error as they were written, marked as its.
    assert!(stderr.lines().any(|l| l.starts_with("shard ") && l.contains("refused")), "{stderr}");
}
