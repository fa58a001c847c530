//! CPU time, memory and placement of the two processes in a run (Linux).

use std::io;
use std::time::Duration;

/// CPU time this process has used so far (user + system, all threads), from `getrusage`.
pub fn own_cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` writes a `rusage` into the pointer it is given, which is valid and
    // writable for one `rusage`; zeroed memory is a valid `rusage` should it fail.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// A process's CPU time and resident memory at one moment, from `/proc/PID/stat` and
/// `/proc/PID/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// User + system time of all its threads. Its resolution is one clock tick (usually
    /// 10 ms): runs must last seconds for per-message figures to mean anything.
    pub cpu: Duration,
    /// Of that, user time.
    pub user: Duration,
    /// Of that, system time (in the kernel on its behalf: system calls, TCP).
    pub system: Duration,
    /// Resident set size in KiB (`VmRSS`).
    pub rss_kib: u64,
}

impl Sample {
    /// Reads the figures of process `pid`.
    pub fn of(pid: u32) -> io::Result<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // The command name (field 2) may hold spaces; the fields after its `)` are fixed.
        let rest = &stat[stat.rfind(')').ok_or_else(|| io::Error::other("bad stat"))? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after `)`.
        let ticks = fields.get(11..13).ok_or_else(|| io::Error::other("short stat"))?;
        // SAFETY: `sysconf` only reads a configuration value.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        let time =
            |f: &str| Duration::from_nanos(f.parse::<u64>().unwrap_or(0) * 1_000_000_000 / hz);
        let (user, system) = (time(ticks[0]), time(ticks[1]));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        Ok(Self { cpu: user + system, user, system, rss_kib })
    }
}

/// Pins the calling thread (and the threads it starts later) to `cpu`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    pin(0, cpu)
}

/// Pins thread or process `tid` (0: the caller) to `cpu`. Async-signal-safe, so it may run
/// in a child between `fork` and `exec`.
pub fn pin(tid: libc::pid_t, cpu: usize) -> io::Result<()> {
    // SAFETY: `cpu_set_t` is plain data, valid when zeroed; `CPU_SET` and `sched_setaffinity`
    // get a pointer to it and its exact size.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Raises this process's open-file limit to its hard limit (children inherit it) and returns
/// the new soft limit.
pub fn raise_fd_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: both calls get a pointer to a valid `rlimit`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}

/// The one-minute load average, from `/proc/loadavg`.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_itself() {
        let mut x = 0u64;
        for i in 0..10_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let s = Sample::of(std::process::id()).unwrap();
        assert!(s.rss_kib > 0);
        assert!(own_cpu_time() > Duration::ZERO);
        assert!(load_average().is_some());
    }
}
