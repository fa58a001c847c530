//! The host settings a crowd of connections needs, checked before a run rather than assumed:
//! each one missing is a line saying what it is, what the run needs and how to set it
//! (`scripts/scaling-sysctls` sets them all).

/// What is missing on this host for `count` connections, server and client both on it; empty
/// when nothing is.
pub fn missing_settings(count: usize) -> Vec<String> {
    let mut missing = Vec::new();
    if count == 0 {
        return missing;
    }
    let read = |key: &str| -> Option<Vec<u64>> {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let text = std::fs::read_to_string(path).ok()?;
        Some(text.split_whitespace().filter_map(|w| w.parse().ok()).collect())
    };
    let first = |key: &str| read(key).and_then(|v| v.first().copied());
    let count = count as u64;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the limit into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0
        && lim.rlim_max < count.saturating_add(100)
    {
        missing.push(format!(
            "RLIMIT_NOFILE: the hard open-file limit is {}; {count} connections need {} in the \
             generator and in the server (ulimit -Hn, LimitNOFILE=; raising it needs \
             CAP_SYS_RESOURCE). One process stops at about {} connections.",
            lim.rlim_max,
            count.saturating_add(100),
            lim.rlim_max.saturating_sub(100)
        ));
    }
    let want = |missing: &mut Vec<String>, key: &str, need: u64, why: &str| {
        if let Some(have) = first(key).filter(|&h| h < need) {
            missing.push(format!("{key} = {have}: {why} need {need} (sysctl -w {key}={need})"));
        }
    };
    want(&mut missing, "fs.nr_open", count.saturating_add(100), "the per-process limit's ceiling:");
    want(
        &mut missing,
        "fs.file-max",
        count.saturating_mul(2).saturating_add(65_536),
        "both ends on this host",
    );
    want(&mut missing, "net.core.somaxconn", 4096, "bursts of connects");
    want(&mut missing, "net.ipv4.tcp_max_syn_backlog", 4096, "bursts of connects");
    // Under memory pressure each socket may still keep its minimum buffers (tcp_rmem[0],
    // tcp_wmem[0]); above tcp_mem's third figure (pages) the kernel drops and refuses.
    if let (Some(mem), Some(rmem)) = (read("net.ipv4.tcp_mem"), read("net.ipv4.tcp_rmem")) {
        let page = 4096;
        let per_socket = rmem.first().copied().unwrap_or(4096);
        let need_pages = count.saturating_mul(2).saturating_mul(per_socket) / page;
        if mem.get(2).is_some_and(|&max| max < need_pages) {
            missing.push(format!(
                "net.ipv4.tcp_mem = {mem:?} pages: {count} connections each with one page \
                 queued at both ends need {need_pages} (sysctl -w net.ipv4.tcp_mem=\"{} {} {}\")",
                need_pages / 2,
                need_pages / 4 * 3,
                need_pages
            ));
        }
    }
    // Connection tracking, where it is loaded, refuses new flows beyond its table.
    if first("net.netfilter.nf_conntrack_count").is_some_and(|n| n > 0) {
        want(
            &mut missing,
            "net.netfilter.nf_conntrack_max",
            count.saturating_mul(2),
            "tracked flows:",
        );
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_crowd_needs_nothing_a_huge_one_is_told_what() {
        assert!(missing_settings(0).is_empty());
        let huge = missing_settings(usize::MAX / 4);
        assert!(huge.iter().any(|l| l.starts_with("RLIMIT_NOFILE")), "{huge:?}");
        assert!(huge.iter().any(|l| l.starts_with("fs.nr_open")), "{huge:?}");
    }
}
