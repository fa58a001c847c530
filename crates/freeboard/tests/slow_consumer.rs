//! A client that never reads while the server pushes: the queue stays under its cap, the
//! configured policy decides, other connections keep their echo, and the pool returns to idle.

mod common;

use std::sync::{Arc, Mutex};

use freeboard::{
    Conn, Echo, Handler, Message, PushOutcome, Router, SendOutcome, Server, SlowConsumerPolicy,
};

const CAP: usize = 64 << 10;

/// On any message, pushes 1,000 messages of 1 KiB in one loop turn and records what `send`
/// said and the most bytes ever buffered.
struct Pusher {
    log: Arc<Mutex<(Vec<SendOutcome>, usize)>>,
}

impl Handler for Pusher {
    fn on_message(&mut self, conn: &mut Conn<'_>, _message: Message<'_>) {
        let payload = [b'x'; 1024];
        let mut log = self.log.lock().unwrap();
        for _ in 0..1000 {
            let result = conn.send(freeboard::MessageKind::Binary, &payload);
            log.0.push(result);
            log.1 = log.1.max(conn.buffered_amount());
        }
    }
}

fn run(policy: SlowConsumerPolicy) -> (Vec<SendOutcome>, usize, Arc<freeboard::Metrics>) {
    let mut cfg = common::config();
    cfg.limits.send_low = 8 << 10;
    cfg.limits.send_high = 16 << 10;
    cfg.limits.send_cap = CAP;
    cfg.limits.slow_consumer = policy;
    let log = Arc::new(Mutex::new((Vec::new(), 0)));
    let shared = log.clone();
    let server = Server::bind(cfg, move || {
        Router::new().route("/", Echo).route("/push", Pusher { log: shared.clone() })
    })
    .unwrap()
    .spawn();
    let addr = server.local_addr();
    let metrics = server.metrics();
    let (mut slow, status, _) = common::Client::connect(addr, "/push");
    assert_eq!(status, 101);
    slow.send(0x81, b"go"); // and never read again
    let mut other = common::Client::open(addr);
    for i in 0..50u8 {
        other.send(0x82, &[i; 100]);
        assert_eq!(other.recv(), Some((0x2, vec![i; 100])));
    }
    common::wait_until("the pusher to finish", || log.lock().unwrap().0.len() == 1000);
    drop(slow);
    drop(other);
    common::wait_until("connections to close", || metrics.connections() == 0);
    common::wait_until("the pool to return to idle", || metrics.total_chunks_in_use() == 0);
    server.handle().shutdown();
    server.join().unwrap();
    let (results, max) = std::mem::take(&mut *log.lock().unwrap());
    (results, max, metrics)
}

#[test]
fn drop_newest_keeps_the_queue_under_its_cap_and_counts_drops() {
    let (results, max, metrics) = run(SlowConsumerPolicy::DropNewest);
    assert!(max <= CAP, "{max} bytes buffered, cap {CAP}");
    assert_eq!(results[0], SendOutcome::Queue(PushOutcome::Queued));
    assert!(results.contains(&SendOutcome::Queue(PushOutcome::QueuedAboveHigh)));
    let dropped = results
        .iter()
        .filter(|r| {
            matches!(r, SendOutcome::Queue(PushOutcome::Dropped { newest: true, messages: 1, .. }))
        })
        .count();
    assert!(dropped > 900, "{dropped} of 1000 dropped");
    assert_eq!(metrics.drops_for("drop-newest"), dropped as u64);
}

#[test]
fn close_policy_closes_the_slow_consumer_with_1008() {
    let (results, max, metrics) = run(SlowConsumerPolicy::Close);
    assert!(max <= CAP + 131, "{max} bytes buffered, cap {CAP}");
    let first_closed = results.iter().position(|r| *r == SendOutcome::Closed).unwrap();
    assert!(results[first_closed..].iter().all(|r| *r == SendOutcome::Closed));
    assert_eq!(metrics.slow_consumer_closes(), 1);
}

#[test]
fn block_policy_refuses_at_the_cap_without_dropping() {
    let (results, max, metrics) = run(SlowConsumerPolicy::Block);
    assert!(max <= CAP, "{max} bytes buffered, cap {CAP}");
    let blocked = results
        .iter()
        .filter(|r| matches!(r, SendOutcome::Queue(PushOutcome::WouldBlock { .. })))
        .count();
    assert!(blocked > 900, "{blocked} of 1000 blocked");
    assert!(results.iter().all(|r| !matches!(
        r,
        SendOutcome::Queue(PushOutcome::Dropped { .. }) | SendOutcome::Closed
    )));
    assert_eq!(metrics.drops_for("block"), 0);
}
