//! How many connections a server can hold, and which of its limits stops it first.
//!
//! Three limits bound the connections of one process: its open-file limit
//! (`RLIMIT_NOFILE`, one descriptor per connection), `max_connections`, and the memory
//! budget, which pays for each connection's kernel memory and table entry
//! ([`crate::kernel_memory`]). `freeboard serve` raises its open-file limit to the hard limit
//! ([`raise_open_files_limit`]) and prints the [`Capacity`] at start, so an operator reads
//! which limit binds before a crowd finds it.

use std::fmt;
use std::io;

/// Descriptors kept for everything but connections: listeners, epoll and wakers, log and
/// configuration files, Redis, a webhook.
pub const RESERVED_DESCRIPTORS: usize = 64;

/// The connections each limit allows, and the charge behind the budget's figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capacity {
    /// Open-file limit (soft) less the descriptors open now and [`RESERVED_DESCRIPTORS`].
    pub descriptors: usize,
    /// `max_connections`.
    pub max_connections: usize,
    /// Connections the budget pays for with no buffer in use: each loop's pool less its
    /// `connection_reserve`, over [`charge_bytes`](Self::charge_bytes).
    pub budget: usize,
    /// Budget bytes one open connection is charged.
    pub charge_bytes: usize,
    /// Of it, the kernel's memory ([`SocketCost`](crate::kernel_memory::SocketCost)).
    pub kernel_bytes: usize,
    /// Whether `kernel_bytes` was read from `/proc/slabinfo`.
    pub kernel_measured: bool,
}

impl Capacity {
    /// The connections the server can hold: the least of the three limits.
    pub fn connections(&self) -> usize {
        self.descriptors.min(self.max_connections).min(self.budget)
    }

    /// The limit that binds first: `"open files"`, `"max_connections"` or `"memory"`.
    pub fn binding(&self) -> &'static str {
        let least = self.connections();
        if least == self.descriptors {
            "open files"
        } else if least == self.max_connections {
            "max_connections"
        } else {
            "memory"
        }
    }
}

impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = if self.kernel_measured { "measured" } else { "assumed" };
        write!(
            f,
            "{} connections ({} binds): open files allow {}, max_connections {}, memory {} at \
             {} B each ({} B kernel, {source}, + {} B table)",
            self.connections(),
            self.binding(),
            self.descriptors,
            self.max_connections,
            self.budget,
            self.charge_bytes,
            self.kernel_bytes,
            self.charge_bytes - self.kernel_bytes,
        )
    }
}

/// Raises this process's soft open-file limit to its hard limit and returns `(soft, hard)`.
/// Raising the hard limit itself needs `CAP_SYS_RESOURCE` (and `fs.nr_open` above it); that is
/// the operator's: `LimitNOFILE=` in a systemd unit, `ulimit -Hn`, `--ulimit nofile=` in Docker.
pub fn raise_open_files_limit() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit get a pointer to a valid `rlimit`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(io::Error::last_os_error());
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(io::Error::last_os_error());
            }
            lim = raised;
        }
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// Descriptors this process may still open: the soft open-file limit less those open now.
pub(crate) fn descriptors_left() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the limit into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return usize::MAX;
    }
    let open = open_descriptors().unwrap_or(0);
    usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX).saturating_sub(open)
}

/// Descriptors this process has open. Linux 6.2 and later give the count as the size of
/// `/proc/self/fd` in one `stat`; listing the folder instead (older kernels) makes the kernel
/// build a proc inode and a dentry for every descriptor — measured, 2 × 920 B of slab per
/// connection at 100,000 connections, and a walk over all of them at every scrape.
pub(crate) fn open_descriptors() -> Option<usize> {
    let size = std::fs::metadata("/proc/self/fd").ok()?.len();
    if size > 0 {
        return usize::try_from(size).ok();
    }
    // The listing's own descriptor is in it.
    std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count().saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_limit_binds() {
        let capacity = Capacity {
            descriptors: 19_900,
            max_connections: 1_000_000,
            budget: 250_000,
            charge_bytes: 4000,
            kernel_bytes: 3768,
            kernel_measured: true,
        };
        assert_eq!((capacity.connections(), capacity.binding()), (19_900, "open files"));
        let by_memory = Capacity { descriptors: 2_000_000, ..capacity };
        assert_eq!((by_memory.connections(), by_memory.binding()), (250_000, "memory"));
        let line = by_memory.to_string();
        assert!(line.contains("3768 B kernel, measured, + 232 B table"), "{line}");
    }

    #[test]
    fn the_soft_limit_rises_to_the_hard_one() {
        let (soft, hard) = raise_open_files_limit().unwrap();
        assert_eq!(soft, hard);
        assert!(descriptors_left() > 0);
        let before = open_descriptors().unwrap();
        let file = std::fs::File::open("/proc/self/status").unwrap();
        assert_eq!(open_descriptors().unwrap(), before + 1);
        drop(file);
    }
}
