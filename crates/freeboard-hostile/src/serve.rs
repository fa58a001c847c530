//! The real `freeboard serve` process: built on first use, started on a free loopback port,
//! killed on drop.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::metrics::Scrape;

/// A running `freeboard serve --listen 127.0.0.1:0`; killed (and reaped) on drop.
pub struct Serve {
    child: Child,
    addr: SocketAddr,
    tls_addr: Option<SocketAddr>,
}

impl Serve {
    /// Starts `freeboard serve --listen 127.0.0.1:0` with `flags` (and `--threads 2` and
    /// `--memory 64M` unless `flags` set them) and waits for its "listening" line.
    pub fn start(flags: &[&str]) -> Self {
        Self::start_with_fd_limit(flags, None)
    }

    /// [`start`](Self::start), with the server's `RLIMIT_NOFILE` (soft and hard) set to
    /// `limit` before it runs, so its accepts fail with `EMFILE` once it holds that many
    /// descriptors.
    pub fn start_with_fd_limit(flags: &[&str], limit: Option<u64>) -> Self {
        let mut command = Command::new(binary());
        command.args(["serve", "--listen", "127.0.0.1:0"]);
        // The I/O driver `HOSTILE_IO` names (`epoll`, `uring`), so the suite runs under each.
        let io = std::env::var("HOSTILE_IO").unwrap_or_else(|_| "epoll".into());
        for (flag, default) in [("--threads", "2"), ("--memory", "64M"), ("--io", io.as_str())] {
            if !flags.contains(&flag) {
                command.args([flag, default]);
            }
        }
        command
            .args(flags)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(limit) = limit {
            // SAFETY: the closure only calls `setrlimit`, which is async-signal-safe, and
            // touches no memory of the parent but the `rlimit` on its own stack.
            unsafe {
                command.pre_exec(move || {
                    let lim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().expect("freeboard serve starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("freeboard serve prints its address");
        // "freeboard listening on ws://A/", "… on wss://A/" or "… on ws://A/ and wss://B/".
        let url = |scheme: &str| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix(scheme))
                .and_then(|a| a.trim_end_matches('/').parse::<SocketAddr>().ok())
        };
        let tls_addr = url("wss://");
        let addr =
            url("ws://").or(tls_addr).unwrap_or_else(|| panic!("freeboard serve printed {line:?}"));
        Self { child, addr, tls_addr }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address that speaks TLS (`--listen-tls`, or `--listen` with `--tls-cert` alone).
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_addr
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident set size in KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }

    /// A scrape of its `/metrics`.
    pub fn metrics(&self) -> Scrape {
        Scrape::of(self.addr)
    }

    /// Waits up to 10 s for `cond` to hold on a fresh scrape (gauges are published at the
    /// end of a loop turn, after the bytes a client may already have read); returns the
    /// scrape that satisfied it.
    pub fn wait_metrics(&self, what: &str, mut cond: impl FnMut(&Scrape) -> bool) -> Scrape {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let scrape = self.metrics();
            if cond(&scrape) {
                return scrape;
            }
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// CPU time the process has used so far (user and system), in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.pid())
    }

    /// Sends SIGTERM and waits up to `limit` for the process to exit; how long it took, or
    /// `None` if it was still running at `limit` (then it is killed).
    pub fn terminate(&mut self, limit: Duration) -> Option<Duration> {
        let start = std::time::Instant::now();
        // SAFETY: kill with a pid of our own child and a valid signal number.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        while start.elapsed() < limit {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resident set size of process `pid` in KiB (`VmRSS`), 0 if it cannot be read.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
            line.trim().trim_end_matches("kB").trim().parse().ok()
        })
        .unwrap_or(0)
}

/// CPU time (user + system) process `pid` has used, in seconds; 0 if it cannot be read.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // The fields after the command name (which may hold spaces) in parentheses: utime and
    // stime are the 12th and 13th of them, in clock ticks.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
}

/// Raises this process's open-file soft limit to its hard limit; returns the new limit.
pub fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: both calls get a pointer to a valid `rlimit`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    lim.rlim_cur
}

/// The `freeboard` binary of this build: `cargo build -p freeboard-cli` is run once per test
/// process, in the profile and target directory the tests themselves were built in (a no-op
/// when `cargo test --workspace` has already built it).
fn binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        // Tests run from `<target>/<profile>/deps/<test>-<hash>`.
        let exe = std::env::current_exe().expect("the test knows its path");
        let profile_dir = exe.parent().and_then(|deps| deps.parent()).expect("target/profile");
        let profile = profile_dir.file_name().and_then(|p| p.to_str()).unwrap_or("debug");
        let target_dir = profile_dir.parent().expect("target directory");
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args(["build", "--quiet", "-p", "freeboard-cli", "--bin", "freeboard"])
            .arg("--manifest-path")
            .arg(manifest)
            .env("CARGO_TARGET_DIR", target_dir);
        // The variables cargo sets for this test's run are not the build's: a build script
        // that watches one (ring's watches CARGO_MANIFEST_DIR) would otherwise run again, and
        // everything above it be rebuilt, each time this build and `cargo test`'s alternate.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            let set_for_test = ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_BIN_", "CARGO_CRATE_"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
                || name == "CARGO_PRIMARY_PACKAGE"
                || name == "CARGO_TARGET_TMPDIR";
            if set_for_test {
                build.env_remove(&*name);
            }
        }
        match profile {
            "debug" => {}
            "release" => {
                build.arg("--release");
            }
            other => {
                build.args(["--profile", other]);
            }
        }
        let status = build.status().expect("cargo runs");
        assert!(status.success(), "cargo build -p freeboard-cli failed");
        let binary = profile_dir.join("freeboard");
        assert!(binary.exists(), "{} was not built", binary.display());
        binary
    })
}
