//! The server runs out of file descriptors: it keeps serving the connections it has, and
//! accepts again once descriptors are free, without a new connection to wake it.

use std::time::Duration;

use freeboard_hostile::{Serve, Watch, WsClient};

/// The server's descriptor limit: its own (listeners, epoll, wakers, stdio) and a few dozen
/// connections.
const FD_LIMIT: u64 = 64;

/// Descriptors process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// CPU time (user + system) of process `pid` in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    rest.split_whitespace().skip(11).take(2).filter_map(|f| f.parse::<u64>().ok()).sum()
}

/// Regression: after `EMFILE` the listener was only retried when another connection arrived
/// (edge-triggered epoll), so a client waiting in the backlog waited for a stranger.
#[test]
fn at_the_descriptor_limit_the_server_keeps_its_connections_and_accepts_again() {
    let serve = Serve::start_with_fd_limit(&["--threads", "1"], Some(FD_LIMIT));
    let before = serve.metrics();
    let watch = Watch::start(&serve);
    // Fill the descriptor table: open connections until an upgrade goes unanswered with the
    // server's table full (it may hold a descriptor or two it inherited above the limit).
    let mut open = Vec::new();
    let pending = loop {
        assert!(open.len() < FD_LIMIT as usize, "the descriptor limit was never reached");
        let (mut client, status) =
            WsClient::open_within(serve.addr(), Duration::from_millis(500)).expect("connect");
        let status = match status {
            None if open_fds(serve.pid()) as u64 >= FD_LIMIT - 1 => break client,
            None => client.await_status(Duration::from_secs(10)).expect("read"), // just slow
            answered => answered,
        };
        assert_eq!(status, Some(101));
        open.push(client);
    };
    println!("{} connections open, {} descriptors", open.len(), open_fds(serve.pid()));
    // Every connection the server has keeps working, and it does not spin.
    let ticks = cpu_ticks(serve.pid());
    std::thread::sleep(Duration::from_secs(1));
    let spent = cpu_ticks(serve.pid()) - ticks;
    for (i, client) in open.iter_mut().enumerate() {
        assert!(
            client.echo(format!("still here {i}").as_bytes()),
            "connection {i} stopped echoing"
        );
    }
    // Two connections go; the one waiting in the backlog is accepted with nobody else knocking.
    for client in open.drain(..2) {
        assert_eq!(client.close(1000).expect("close"), Some(1000));
    }
    let mut pending = pending;
    assert_eq!(pending.await_status(Duration::from_secs(5)).expect("read"), Some(101));
    assert!(pending.echo(b"accepted at last"));
    drop(pending);
    drop(open);
    let figures = watch.finish();
    let after = serve.metrics();
    let errors = after.delta(&before, "accept_errors_total");
    println!("{errors} failed accepts; {spent} CPU ticks in the second at the limit");
    assert!(errors >= 1.0);
    figures.report("emfile");
}
