//! What the kernel spends on a connection, and what it says it spends.
//!
//! An open connection costs the host more than the server's own memory: the kernel keeps its
//! socket (`struct tcp_sock`), the socket's inode, a dentry and a `struct file` for its
//! descriptor, and an epoll entry — about 3.7 KiB on Linux 6.18, more than ten times the
//! 0.24 KiB of the server's own table entry. None of it shows in the server's RSS, so a
//! budget that ignored it could not keep a host from the OOM killer. The server charges
//! [`SocketCost::bytes`] against `--memory` for every connection it holds (the event loop
//! withholds that many pool bytes), so the budget covers the kernel's share too.
//!
//! The cost is *measured*, not guessed: [`SocketCost::measure`] reads the object size of each
//! slab cache a connection allocates from `/proc/slabinfo` (readable by root). An idle
//! connection holds no buffer memory (its queues are empty; `/proc/net/sockstat`'s `mem` does
//! not move while 9,000 idle pairs are opened), so buffers are not in the charge: the bytes a
//! connection has in flight are the kernel's, bounded by `tcp_wmem` / `tcp_rmem`, and are
//! reported by [`KernelFigures`] beside the estimate.

use std::fmt;
use std::os::fd::RawFd;

/// The slab caches one accepted TCP connection allocates from, with how many objects of each:
/// the socket (IPv4 `TCP` or IPv6 `TCPv6`), its inode, the dentry and the file of its
/// descriptor, its epoll entry and the epoll head the file keeps, and the security module's
/// blobs for the inode and the file (absent without an LSM). Measured: 100,000 loopback
/// connections grew each of these caches by 2.00 objects per connection (both ends).
const CACHES: [(&str, usize); 8] = [
    ("TCP", 1),
    ("sock_inode_cache", 1),
    ("dentry", 1),
    ("filp", 1),
    ("eventpoll_epi", 1),
    ("ep_head", 1),
    ("lsm_inode_cache", 1),
    ("lsm_file_cache", 1),
];

/// Used when `/proc/slabinfo` cannot be read (not root, not Linux): the sum of `CACHES`'
/// object sizes measured on Linux 6.18 x86_64 (2368 + 832 + 192 + 192 + 128 + 16 + 32 + 24).
pub const FALLBACK_SOCKET_BYTES: usize = 3784;

/// The kernel memory of one idle connection, as charged against the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketCost {
    /// Bytes per connection.
    pub bytes: usize,
    /// Whether `bytes` was read from `/proc/slabinfo` (else it is [`FALLBACK_SOCKET_BYTES`]).
    pub measured: bool,
}

impl SocketCost {
    /// Reads the object sizes of `CACHES` from `/proc/slabinfo`; `ipv6` counts the `TCPv6`
    /// socket instead of `TCP`. Falls back to [`FALLBACK_SOCKET_BYTES`] when the file cannot
    /// be read or has no `TCP` cache.
    pub fn measure(ipv6: bool) -> Self {
        std::fs::read_to_string("/proc/slabinfo")
            .ok()
            .and_then(|text| Self::from_slabinfo(&text, ipv6))
            .unwrap_or(SocketCost { bytes: FALLBACK_SOCKET_BYTES, measured: false })
    }

    /// The cost from the text of `/proc/slabinfo`; `None` without a TCP socket cache.
    pub fn from_slabinfo(text: &str, ipv6: bool) -> Option<Self> {
        let socket = if ipv6 { "TCPv6" } else { "TCP" };
        let mut bytes = 0;
        let mut socket_seen = false;
        for (name, count) in CACHES {
            let name = if name == "TCP" { socket } else { name };
            if let Some(cache) = slab_caches(text).find(|c| c.name == name) {
                socket_seen |= name == socket;
                bytes += cache.object_size * count;
            }
        }
        socket_seen.then_some(SocketCost { bytes, measured: true })
    }
}

impl fmt::Display for SocketCost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source =
            if self.measured { "from /proc/slabinfo" } else { "assumed: no /proc/slabinfo" };
        write!(f, "{} B ({source})", self.bytes)
    }
}

/// What the kernel reports about its socket memory, host-wide (and for the server's memory
/// cgroup where one is found). Every field is `None` where the file is missing or unreadable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelFigures {
    /// TCP sockets in use (`/proc/net/sockstat`, `TCP: inuse`), every process's.
    pub tcp_sockets: Option<u64>,
    /// Bytes of TCP buffer memory (`TCP: mem`, pages, times the page size).
    pub tcp_buffer_bytes: Option<u64>,
    /// Bytes of the slab objects of `CACHES` in use (active objects × object size), every
    /// process's: the kernel's own count of what the estimate estimates.
    pub socket_slab_bytes: Option<u64>,
    /// The memory cgroup's usage (v2 `memory.current`, v1 `memory.usage_in_bytes`).
    pub cgroup_bytes: Option<u64>,
    /// Of it, kernel memory (v2 `memory.stat` `kernel`, v1 `memory.kmem.usage_in_bytes`).
    pub cgroup_kernel_bytes: Option<u64>,
    /// Of it, socket buffers (v2 `memory.stat` `sock`, v1 `memory.kmem.tcp.usage_in_bytes`).
    pub cgroup_socket_bytes: Option<u64>,
}

impl KernelFigures {
    /// Reads the figures now (a few small files under `/proc` and `/sys/fs/cgroup`).
    pub fn read() -> Self {
        let mut figures = KernelFigures::default();
        if let Ok(sockstat) = std::fs::read_to_string("/proc/net/sockstat") {
            let tcp = sockstat.lines().find_map(|l| l.strip_prefix("TCP:")).unwrap_or("");
            let field = |name: &str| {
                let mut words = tcp.split_whitespace();
                words.position(|w| w == name)?;
                words.next()?.parse::<u64>().ok()
            };
            figures.tcp_sockets = field("inuse");
            figures.tcp_buffer_bytes = field("mem").map(|pages| pages * page_size());
        }
        if let Ok(slabinfo) = std::fs::read_to_string("/proc/slabinfo") {
            let names: Vec<&str> =
                CACHES.iter().map(|(n, _)| *n).chain(std::iter::once("TCPv6")).collect();
            let total = slab_caches(&slabinfo)
                .filter(|c| names.contains(&c.name))
                .map(|c| c.active_objects * c.object_size as u64)
                .sum();
            figures.socket_slab_bytes = Some(total);
        }
        if let Some(dir) = cgroup_dir() {
            let read = |file: &str| -> Option<u64> {
                std::fs::read_to_string(dir.join(file)).ok()?.trim().parse().ok()
            };
            let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
            let stat_field = |name: &str| {
                stat.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                    .and_then(|v| v.trim().parse().ok())
            };
            figures.cgroup_bytes = read("memory.current").or_else(|| read("memory.usage_in_bytes"));
            figures.cgroup_kernel_bytes =
                stat_field("kernel").or_else(|| read("memory.kmem.usage_in_bytes"));
            figures.cgroup_socket_bytes =
                stat_field("sock").or_else(|| read("memory.kmem.tcp.usage_in_bytes"));
        }
        figures
    }
}

/// One line of `/proc/slabinfo`.
struct SlabCache<'a> {
    name: &'a str,
    active_objects: u64,
    object_size: usize,
}

/// The caches of `/proc/slabinfo` (version 2.1: `name active_objs num_objs objsize …`).
fn slab_caches(text: &str) -> impl Iterator<Item = SlabCache<'_>> {
    text.lines().filter(|l| !l.starts_with('#') && !l.starts_with("slabinfo")).filter_map(|l| {
        let mut words = l.split_whitespace();
        let name = words.next()?;
        let active_objects = words.next()?.parse().ok()?;
        let _objects = words.next()?;
        let object_size = words.next()?.parse().ok()?;
        Some(SlabCache { name, active_objects, object_size })
    })
}

/// This process's memory cgroup directory: the v2 unified path, else the v1 `memory`
/// controller's.
fn cgroup_dir() -> Option<std::path::PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut v1 = None;
    let mut v2 = None;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.is_empty() {
            v2 = Some(path.to_owned());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_owned());
        }
    }
    let root = std::path::Path::new("/sys/fs/cgroup");
    if let Some(path) = v1 {
        let dir = root.join("memory").join(path.trim_start_matches('/'));
        if dir.join("memory.usage_in_bytes").exists() {
            return Some(dir);
        }
    }
    let dir = root.join(v2?.trim_start_matches('/'));
    dir.join("memory.current").exists().then_some(dir)
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64
}

/// What the kernel holds for one socket, in its own accounting (`getsockopt(SO_MEMINFO)`):
/// the bytes it has queued to send (`sk_wmem_queued`: unsent and unacknowledged data with
/// its buffers' overhead) and those received and not yet read (`sk_rmem_alloc`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SocketBuffers {
    pub(crate) queued: usize,
    pub(crate) received: usize,
}

impl SocketBuffers {
    /// The socket's figures; `None` where the kernel does not say (not Linux).
    pub(crate) fn of(fd: RawFd) -> Option<Self> {
        #[cfg(target_os = "linux")]
        {
            let mut info = [0u32; 9]; // SK_MEMINFO_VARS
            let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
            // SAFETY: the kernel writes at most `len` bytes into `info`, which outlives the call.
            let rc = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_MEMINFO,
                    info.as_mut_ptr().cast(),
                    &mut len,
                )
            };
            let at = |i: libc::c_int| info[i as usize] as usize;
            (rc == 0).then(|| SocketBuffers {
                queued: at(libc::SK_MEMINFO_WMEM_QUEUED),
                received: at(libc::SK_MEMINFO_RMEM_ALLOC),
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = fd;
            None
        }
    }
}

/// The part of a loop's pool its sockets' buffers may take: 1/`BUFFER_SHARE`. The rest stays
/// the data path of the connections that keep up.
pub(crate) const BUFFER_SHARE: usize = 4;

/// What the kernel's buffers of a loop's sockets are charged, by connection (the loop's
/// slab key): only those whose sockets hold some, or whose reads pause.
#[derive(Debug, Default)]
pub(crate) struct BufferCharges {
    charged: std::collections::HashMap<usize, Charge>,
    bytes: usize,
}

#[derive(Debug, Clone, Copy)]
struct Charge {
    bytes: usize,
    /// Its reads pause: what it has received counts too.
    paused: bool,
}

impl BufferCharges {
    /// The sum of the charges.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.charged.is_empty()
    }

    /// Whether `key` is charged (`None`: it is not), and whether its reads pause.
    pub(crate) fn paused(&self, key: usize) -> Option<bool> {
        self.charged.get(&key).map(|c| c.paused)
    }

    /// Charges `key` `bytes` (none if 0 and not paused) in place of its charge before; the
    /// bytes that charge was.
    pub(crate) fn charge(&mut self, key: usize, bytes: usize, paused: bool) -> usize {
        let before = self.forget(key);
        if bytes > 0 || paused {
            self.charged.insert(key, Charge { bytes, paused });
            self.bytes += bytes;
        }
        before
    }

    /// Drops `key`'s charge; the bytes it was charged.
    pub(crate) fn forget(&mut self, key: usize) -> usize {
        let bytes = self.charged.remove(&key).map_or(0, |c| c.bytes);
        self.bytes -= bytes;
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLABINFO: &str = "slabinfo - version: 2.1
# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>
TCPv6                 26     26   2496   13    8 : tunables    0    0    0 : slabdata      2      2      0
request_sock_TCP     168    168    320   12    1 : tunables    0    0    0 : slabdata     14     14      0
TCP                   92    156   2368   13    8 : tunables    0    0    0 : slabdata     12     12      0
eventpoll_epi        763   1216    128   32    1 : tunables    0    0    0 : slabdata     38     38      0
sock_inode_cache     156    228    832   19    4 : tunables    0    0    0 : slabdata     12     12      0
filp                 780    861    192   21    1 : tunables    0    0    0 : slabdata     41     41      0
dentry            578221 609819    192   21    1 : tunables    0    0    0 : slabdata  29039  29039      0
lsm_file_cache     17884  18000     24  170    1 : tunables    0    0    0 : slabdata    100    100      0
lsm_inode_cache    34319  35000     32  128    1 : tunables    0    0    0 : slabdata    300    300      0
ep_head             8688   8704     16  256    1 : tunables    0    0    0 : slabdata     34     34      0
";

    #[test]
    fn the_cost_is_the_sum_of_the_caches_a_connection_uses() {
        let v4 = SocketCost::from_slabinfo(SLABINFO, false).unwrap();
        assert_eq!(v4, SocketCost { bytes: FALLBACK_SOCKET_BYTES, measured: true });
        let v6 = SocketCost::from_slabinfo(SLABINFO, true).unwrap();
        assert_eq!(v6.bytes, FALLBACK_SOCKET_BYTES - 2368 + 2496);
        // Without the socket's cache there is nothing to measure from.
        let no_tcp: String = SLABINFO.lines().filter(|l| !l.starts_with("TCP ")).collect();
        assert_eq!(SocketCost::from_slabinfo(&no_tcp, false), None);
    }

    #[test]
    fn this_host_reports_its_sockets() {
        let cost = SocketCost::measure(false);
        assert!(cost.bytes >= 1024, "{cost}");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let figures = KernelFigures::read();
        if cfg!(target_os = "linux") {
            assert!(figures.tcp_sockets.is_some_and(|n| n >= 1), "{figures:?}");
            assert!(figures.tcp_buffer_bytes.is_some(), "{figures:?}");
        }
        if cost.measured {
            assert!(figures.socket_slab_bytes.is_some_and(|b| b >= 2048), "{figures:?}");
        }
        drop(listener);
    }
}
