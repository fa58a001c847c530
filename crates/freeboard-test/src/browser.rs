//! Headless Chromium for the browser tests: found on the PATH (Debian's `chromium`, which
//! `scripts/test` installs), started with the flags every test needs, and killed with its
//! process group when dropped (Debian's `chromium` is a script that starts the browser as its
//! child).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The Chromium binary on the PATH. `None` (the test says it is skipped) when there is none,
/// unless `FREEBOARD_REQUIRE_TOOLS` or `FREEBOARD_REQUIRE_BROWSER` is set: then it panics.
pub fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| {
        let out = Command::new("sh").args(["-c", &format!("command -v {name}")]).output().ok()?;
        out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    });
    if found.is_none() {
        let required = ["FREEBOARD_REQUIRE_TOOLS", "FREEBOARD_REQUIRE_BROWSER"];
        assert!(
            required.iter().all(|v| std::env::var_os(v).is_none()),
            "chromium is not installed (scripts/test installs it)"
        );
        eprintln!("SKIPPED: chromium is not installed (apt-get install -y chromium)");
    }
    found
}

/// A headless Chromium, killed with its process group when dropped.
#[derive(Debug)]
pub struct Browser(Child);

impl Browser {
    /// Starts `chromium` headless on `url`, with a fresh profile in `profile` and `extra`
    /// flags after the common ones.
    pub fn start(chromium: &Path, profile: &Path, extra: &[String], url: &str) -> Self {
        let _ = std::fs::remove_dir_all(profile);
        let child = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(extra)
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromium");
        Self(child)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group our own child leads (`process_group(0)`).
        unsafe { libc::kill(-(self.0.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
