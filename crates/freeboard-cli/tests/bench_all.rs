//! `freeboard bench all --quick`: every experiment for a few seconds against a `freeboard serve`
//! it starts, with every file of the report written (no timing assertions).

use std::process::Command;

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
