//! The session without sockets: a server session and a client session wired together through
//! their send queues, with a virtual clock (as `freeboard-test::Pair` does for the core). Each
//! case decides in microseconds what the loopback tests prove over real sockets.

use std::time::Duration;

use freeboard_buf::{
    Budget, Frame, Pool, PoolConfig, PushOutcome, SendQueue, SlowConsumerPolicy, Watermarks,
    Writability,
};
use freeboard_proto::{CloseCode, Config, Instant, MessageKind, Role, State};

use super::fair_share;
use super::*;

const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
const LINGER: Duration = Duration::from_secs(2);

/// One end: its session and everything a driver would lend it.
struct End {
    session: Session,
    pool: Pool<'static>,
    lot: ParkingLot,
    masks: Option<MaskSource>,
    limits: Reassembly,
    share: FairShare,
    /// Whole messages delivered to the application, in order.
    received: Vec<(MessageKind, Vec<u8>)>,
    closed: Option<Closed>,
}

impl End {
    fn new(role: Role, config: Config, pool_bytes: usize, queue: SendQueue) -> Self {
        let pool_config = PoolConfig::new().with_chunk_size(1024);
        let pool = Pool::new(Budget::new(pool_bytes), pool_config).unwrap();
        let (masks, limits) = match role {
            Role::Client => (Some(MaskSource::new()), Reassembly::CLIENT),
            Role::Server => (None, Reassembly::server(4096)),
        };
        let ws = ProtocolState::new(role, &config, Instant::default());
        Self {
            session: Session::open(ws, queue),
            share: FairShare::new(&pool, 1),
            pool,
            lot: ParkingLot::new(config),
            masks,
            limits,
            received: Vec::new(),
            closed: None,
        }
    }

    fn cx(&mut self, now: Instant) -> (&mut Session, Context<'_>) {
        let cx = Context {
            pool: &mut self.pool,
            lot: &mut self.lot,
            masks: self.masks.as_mut(),
            limits: &self.limits,
            share: &self.share,
            codec: None,
            cork: None,
            now,
        };
        (&mut self.session, cx)
    }

    /// [`cx`](Self::cx) with `cork` lent, as the server's loop lends its own while it reads.
    fn cx_corked<'a>(
        &'a mut self,
        now: Instant,
        cork: &'a mut Cork,
    ) -> (&'a mut Session, Context<'a>) {
        let (session, mut cx) = self.cx(now);
        cx.cork = Some(cork);
        (session, cx)
    }

    fn send(&mut self, now: Instant, kind: MessageKind, data: &[u8]) -> Option<PushOutcome> {
        let (session, mut cx) = self.cx(now);
        session.send(&mut cx, kind, data)
    }

    fn close(&mut self, now: Instant, code: CloseCode, reason: &str) {
        let (session, mut cx) = self.cx(now);
        session.close(&mut cx, code, reason).unwrap();
    }

    /// Takes up to `max` queued bytes, as a socket write would.
    fn write(&mut self, max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while out.len() < max && self.session.buffered() > 0 {
            let before = out.len();
            let mut iov = [std::io::IoSlice::new(&[]); 64];
            let n = self.session.io_slices(&self.pool, &mut iov);
            for slice in &iov[..n] {
                out.extend_from_slice(&slice[..slice.len().min(max - out.len())]);
            }
            let written = out.len() - before;
            self.session.consume(&mut self.pool, written);
        }
        out
    }

    /// Feeds `bytes` as one read, `split` bytes at a time, delivering what completes.
    fn read(&mut self, now: Instant, bytes: &mut [u8], split: usize) {
        for piece in bytes.chunks_mut(split.max(1)) {
            let mut at = 0;
            while at < piece.len() {
                let (session, mut cx) = self.cx(now);
                let (used, received) = session.receive(&mut cx, &mut piece[at..]);
                at += used;
                match received {
                    Some(Received::Whole(kind, data)) => self.received.push((kind, data.to_vec())),
                    Some(Received::Assembled(kind)) => {
                        let mut chain = self.session.take_message();
                        let mut data = Vec::new();
                        chain.segments(&self.pool).for_each(|s| data.extend_from_slice(s));
                        chain.clear(&mut self.pool);
                        self.received.push((kind, data));
                    }
                    None => {}
                }
                if let Some(closed) = self.session.poll_close() {
                    self.closed = Some(closed);
                }
            }
        }
    }

    fn timeout(&mut self, now: Instant) -> bool {
        let (session, mut cx) = self.cx(now);
        let expired = session.handle_timeout(&mut cx);
        if let Some(closed) = self.session.poll_close() {
            self.closed = Some(closed);
        }
        expired
    }
}

/// A server and a client session, and the time.
struct Pair {
    server: End,
    client: End,
    now: Instant,
}

impl Pair {
    fn new() -> Self {
        Self::with(SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::Block), 1 << 20)
    }

    /// A pair whose server sends through `queue`, with a pool of `server_pool` bytes.
    fn with(queue: SendQueue, server_pool: usize) -> Self {
        let config = Config::builder().close_timeout(CLOSE_TIMEOUT).build();
        let client_queue = SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::Block);
        Self {
            server: End::new(Role::Server, config, server_pool, queue),
            client: End::new(Role::Client, config, 1 << 20, client_queue),
            now: Instant::default(),
        }
    }

    /// Moves every queued byte both ways, `split` bytes per read, until both queues are empty.
    fn step(&mut self, split: usize) {
        loop {
            let mut up = self.client.write(usize::MAX);
            let mut down = self.server.write(usize::MAX);
            if up.is_empty() && down.is_empty() {
                return;
            }
            self.server.read(self.now, &mut up, split);
            self.client.read(self.now, &mut down, split);
        }
    }

    fn advance(&mut self, by: Duration) {
        self.now = self.now + by;
    }
}

#[test]
fn messages_cross_whole_or_reassembled_at_every_split() {
    let big: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    for split in [1, 2, 7, 100, 4096, usize::MAX] {
        let mut pair = Pair::new();
        pair.client.send(pair.now, MessageKind::Text, b"hello").unwrap();
        pair.client.send(pair.now, MessageKind::Binary, &big).unwrap();
        pair.step(split);
        let expected =
            vec![(MessageKind::Text, b"hello".to_vec()), (MessageKind::Binary, big.clone())];
        assert_eq!(pair.server.received, expected, "split {split}");
        for (kind, data) in std::mem::take(&mut pair.server.received) {
            pair.server.send(pair.now, kind, &data).unwrap();
        }
        pair.step(split);
        assert_eq!(pair.client.received, expected, "split {split}");
        assert_eq!(pair.server.pool.counters().chunks_in_use, 0, "split {split}");
    }
}

#[test]
fn the_close_handshake_reports_once_on_both_ends_and_drains_then_lingers() {
    let mut pair = Pair::new();
    pair.client.close(pair.now, CloseCode::NORMAL, "bye");
    pair.step(usize::MAX);
    let server = pair.server.closed.expect("the server saw the close");
    let client = pair.client.closed.expect("the client saw the close");
    assert_eq!((server.code, server.reason(), server.clean), (CloseCode::NORMAL, "bye", true));
    assert_eq!((client.code, client.clean), (CloseCode::NORMAL, true));
    assert!(pair.server.session.poll_close().is_none(), "reported once");
    let flushed =
        pair.server.session.after_flush(&mut pair.server.pool, pair.now, CLOSE_TIMEOUT, LINGER);
    assert_eq!(flushed, Transition { closed: true, shutdown_write: true });
    let linger_end = pair.now + LINGER;
    assert!(!pair.server.timeout(Instant::from_millis(linger_end.as_millis() - 1)));
    assert!(pair.server.timeout(linger_end), "lingering ends at its deadline");
}

#[test]
fn a_peer_that_never_answers_the_close_is_failed_at_the_close_timeout() {
    let mut pair = Pair::new();
    pair.server.close(pair.now, CloseCode::GOING_AWAY, "shutting down");
    assert_eq!(pair.server.session.state(), State::CloseSent);
    assert_eq!(pair.server.session.poll_timeout(), Some(pair.now + CLOSE_TIMEOUT));
    pair.advance(CLOSE_TIMEOUT);
    assert!(!pair.server.timeout(pair.now));
    let closed = pair.server.closed.expect("the close timed out");
    assert_eq!((closed.code, closed.clean), (CloseCode::ABNORMAL, false));
    // Its close frame never left (the peer does not read): it gets the close timeout to drain.
    let flushed =
        pair.server.session.after_flush(&mut pair.server.pool, pair.now, CLOSE_TIMEOUT, LINGER);
    assert_eq!(flushed, Transition { closed: true, shutdown_write: false });
    assert!(pair.server.timeout(pair.now + CLOSE_TIMEOUT), "the drain deadline drops it");
}

#[test]
fn reading_pauses_above_the_high_watermark_and_resumes_at_the_low_one() {
    let marks = Watermarks::new(2048, 4096, 64 << 10).unwrap();
    let mut pair = Pair::with(SendQueue::new(marks, SlowConsumerPolicy::Block), 1 << 20);
    let mut sent = 0;
    while pair.server.session.wants_input() {
        pair.server.send(pair.now, MessageKind::Binary, &[7; 1000]).unwrap();
        sent += 1;
    }
    assert_eq!(pair.server.session.take_writability(), Some(Writability::NotWritable));
    assert!(pair.server.session.buffered() > 4096);
    // The client reads a little: still above the low watermark, still paused.
    let mut some = pair.server.write(1500);
    pair.client.read(pair.now, &mut some, usize::MAX);
    assert_eq!(pair.server.session.take_writability(), None);
    assert!(!pair.server.session.wants_input());
    pair.step(usize::MAX);
    assert_eq!(pair.server.session.take_writability(), Some(Writability::Writable));
    assert!(pair.server.session.wants_input());
    assert_eq!(pair.client.received.len(), sent);
}

#[test]
fn each_slow_consumer_policy_acts_when_the_cap_is_reached() {
    let marks = Watermarks::new(1024, 2048, 4096).unwrap();
    for policy in SlowConsumerPolicy::ALL {
        let mut pair = Pair::with(SendQueue::new(marks, policy), 1 << 20);
        // 1004 bytes a frame: the third passes the high watermark, the fifth the cap.
        let outcomes: Vec<PushOutcome> = (0..6)
            .map_while(|_| pair.server.send(pair.now, MessageKind::Binary, &[1; 1000]))
            .collect();
        if policy == SlowConsumerPolicy::Conflate {
            // Every message is kept while the queue keeps up; the first push after it passed
            // its high watermark replaces the three unsent ones (the latest value wins), which
            // takes it below its low watermark: it keeps up again.
            let replaced = PushOutcome::Dropped { newest: false, messages: 3, bytes: 3012 };
            let (queued, above) = (PushOutcome::Queued, PushOutcome::QueuedAboveHigh);
            assert_eq!(outcomes, [queued, queued, above, replaced, queued, above]);
            pair.step(usize::MAX);
            assert_eq!(pair.client.received.len(), 3);
            continue;
        }
        assert_eq!(
            outcomes[..3],
            [PushOutcome::Queued, PushOutcome::Queued, PushOutcome::QueuedAboveHigh]
        );
        let at_cap = outcomes[4];
        match policy {
            SlowConsumerPolicy::Block => {
                assert!(matches!(at_cap, PushOutcome::WouldBlock { .. }), "{at_cap:?}")
            }
            SlowConsumerPolicy::DropNewest => assert!(
                matches!(at_cap, PushOutcome::Dropped { newest: true, messages: 1, .. }),
                "{at_cap:?}"
            ),
            SlowConsumerPolicy::DropOldest => {
                assert!(matches!(at_cap, PushOutcome::Dropped { newest: false, .. }), "{at_cap:?}")
            }
            SlowConsumerPolicy::Conflate => unreachable!("checked above"),
            SlowConsumerPolicy::Close => {
                // The new message and the four unsent ones the close discarded: all counted.
                assert_eq!(at_cap, PushOutcome::MustClose { limit: Limit::Cap, messages: 5 });
                assert_eq!(outcomes.len(), 5, "nothing is queued once the close started");
                pair.step(usize::MAX);
                let closed = pair.client.closed.expect("the client hears why");
                let why = (closed.code, closed.reason());
                assert_eq!(why, (CloseCode::POLICY_VIOLATION, "slow consumer"));
                // The messages that had not started were discarded, not delivered late.
                assert!(pair.client.received.is_empty());
            }
        }
    }
}

/// The rest of a published frame the socket took in part (a fan-out writes straight to an
/// idle subscriber) is queued whatever the policy and the pool's share say: the message is in
/// flight, and cutting it would tear the stream. Here every policy's queue has a cap of 32
/// bytes and the frame is 1,004.
#[test]
fn the_rest_of_a_frame_written_in_part_always_goes_out() {
    let marks = Watermarks::new(8, 16, 32).unwrap();
    let payload = [5u8; 1000];
    for policy in SlowConsumerPolicy::ALL {
        let mut pair = Pair::with(SendQueue::new(marks, policy), 1 << 20);
        let (head, n) = crate::topics::header(MessageKind::Binary, payload.len());
        let frame = Frame::from_parts(&mut pair.server.pool, &[&head[..n], &payload]).unwrap();
        let bytes: Vec<u8> = frame.segments(&pair.server.pool).flatten().copied().collect();
        let mut written = bytes[..100].to_vec();
        let (session, mut cx) = pair.server.cx(pair.now);
        let outcome = session.send_frame_rest(&mut cx, &frame, written.len());
        assert_eq!(outcome, Some(PushOutcome::QueuedAboveHigh), "{policy:?}");
        frame.release(&mut pair.server.pool);
        pair.client.read(pair.now, &mut written, usize::MAX);
        pair.step(usize::MAX);
        assert_eq!(pair.client.received, [(MessageKind::Binary, payload.to_vec())], "{policy:?}");
        assert_eq!(pair.server.session.state(), State::Open, "{policy:?}");
        assert_eq!(pair.server.pool.chunks_in_use(), 0, "{policy:?}");
    }
}

/// What a connection's queue still holds when it goes — unsent, or in flight — is counted as
/// lost, control frames aside.
#[test]
fn a_released_session_counts_the_data_messages_it_held() {
    let mut pair = Pair::new();
    for _ in 0..3 {
        pair.server.send(pair.now, MessageKind::Binary, &[1; 1000]).unwrap();
    }
    pair.server.close(pair.now, CloseCode::GOING_AWAY, "");
    let mut some = pair.server.write(10); // the first message is in flight
    pair.client.read(pair.now, &mut some, usize::MAX);
    assert_eq!(pair.server.session.release(&mut pair.server.pool), 3);
    assert_eq!(pair.server.pool.chunks_in_use(), 0);
}

#[test]
fn a_message_the_server_pool_cannot_hold_is_refused_with_1013() {
    // 16 chunks of 1 KiB; the server keeps half its 4 KiB connection reserve free.
    let queue = SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::Block);
    let mut pair = Pair::with(queue, 16 * 1100);
    let big = vec![3u8; 20 << 10];
    pair.client.send(pair.now, MessageKind::Binary, &big).unwrap();
    pair.step(1000);
    assert!(pair.server.received.is_empty(), "nothing truncated reaches the application");
    let closed = pair.client.closed.expect("the client hears why");
    assert_eq!(closed.code, CloseCode::TRY_AGAIN_LATER);
    assert_eq!(pair.server.pool.counters().chunks_in_use, 0, "its pieces went back");
}

#[test]
fn a_message_the_client_pool_cannot_hold_is_refused_with_1009() {
    let config = Config::builder().close_timeout(CLOSE_TIMEOUT).build();
    let marks = Watermarks::new(1 << 20, 1 << 20, 1 << 20).unwrap();
    let queue = || SendQueue::new(marks, SlowConsumerPolicy::Block);
    let mut pair = Pair {
        server: End::new(Role::Server, config, 1 << 20, queue()),
        client: End::new(Role::Client, config, 8 * 1100, queue()),
        now: Instant::default(),
    };
    pair.server.send(pair.now, MessageKind::Binary, &vec![5u8; 64 << 10]).unwrap();
    pair.step(4096);
    assert!(pair.client.received.is_empty());
    let closed = pair.server.closed.expect("the server hears why");
    assert_eq!(closed.code, CloseCode::MESSAGE_TOO_BIG);
}

#[test]
fn the_upgrade_response_leads_and_no_policy_drops_it() {
    let marks = Watermarks::new(64, 128, 256).unwrap();
    let mut server = End::new(
        Role::Server,
        Config::default(),
        1 << 20,
        SendQueue::new(marks, SlowConsumerPolicy::Block),
    );
    let conflate = SendQueue::new(marks, SlowConsumerPolicy::Conflate);
    server.session = Session::request(conflate, Instant::default());
    assert!(!server.session.wants_input(), "no WebSocket input before the upgrade");
    let response = b"HTTP/1.1 101 Switching Protocols\r\n\r\n";
    let ws = ProtocolState::new(Role::Server, &Config::default(), Instant::default());
    server.session.upgrade(&mut server.pool, ws, None, response).unwrap();
    for i in 0..3u8 {
        server.send(Instant::default(), MessageKind::Binary, &[i; 100]).unwrap();
    }
    let out = server.write(usize::MAX);
    assert!(out.starts_with(response), "the 101 stays first under conflate");
    let (head, latest) = out[response.len()..].split_at(2);
    assert_eq!((head, latest), (&[0x82, 100][..], &[2u8; 100][..]), "then the latest message");
}

#[test]
fn a_request_that_never_completes_times_out() {
    let queue = || SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::Block);
    let deadline = Instant::from_millis(10_000);
    let mut end = End::new(Role::Server, Config::default(), 1 << 20, queue());
    end.session = Session::request(queue(), deadline);
    assert_eq!(end.session.poll_timeout(), Some(deadline));
    assert!(!end.timeout(Instant::from_millis(9_999)));
    assert!(end.timeout(deadline));
}

/// A queue that keeps up is never the one that pays for a short pool; one that is behind and
/// holds more than its share of a contended pool is.
#[test]
fn a_contended_pool_is_charged_to_the_queue_that_is_behind() {
    let chunk = 1024;
    let mut pool =
        Pool::new(Budget::new(64 * 1100), PoolConfig::new().with_chunk_size(chunk)).unwrap();
    let total = pool.chunks_total();
    let marks = Watermarks::new(2 * chunk, 4 * chunk, 64 * chunk).unwrap();
    let share = FairShare::new(&pool, 4);
    let mut behind = SendQueue::new(marks, SlowConsumerPolicy::Close);
    let keeping_up = SendQueue::new(marks, SlowConsumerPolicy::Close);
    assert_eq!(share.judge(&pool, &behind, 100), fair_share::Room::Fits, "plenty free");
    // The reader that stopped fills its queue past its high watermark and beyond a quarter
    // of the pool: once the pool is contended, it is the culprit.
    while pool.chunks_free() > total / 5 {
        let _ = behind.push_message(&mut pool, &[&[0u8; 1000]]);
    }
    assert!(!behind.is_writable());
    assert_eq!(share.judge(&pool, &behind, 100), fair_share::Room::Culprit);
    assert!(share.over_share(&pool, &behind, 0), "the loop's sweep charges it too");
    assert_eq!(share.judge(&pool, &keeping_up, 100), fair_share::Room::Fits, "room for readers");
    assert!(!share.over_share(&pool, &keeping_up, 0));
    // Short for everyone: the reader's new message is refused, not the reader closed.
    let mut others = SendQueue::new(
        Watermarks::new(1 << 20, 1 << 20, 1 << 20).unwrap(),
        SlowConsumerPolicy::Block,
    );
    while others.push_message(&mut pool, &[&[0u8; 1000]]).outcome == PushOutcome::Queued {}
    assert_eq!(share.judge(&pool, &keeping_up, 100), fair_share::Room::Exhausted);
    let _ = behind.clear(&mut pool);
    let _ = others.clear(&mut pool);
}

/// A queue behind and past its share of a contended pool meets its policy without another
/// push (a connection behind is not read, so it may never push again): `close` ends it with
/// 1008, `drop_oldest` gives back what had not started (as `conflate` does: the same branch,
/// but a conflating queue replaces its backlog at every push once behind, so it cannot be
/// filled here); `block` and `drop_newest` keep what they queued.
#[test]
fn a_queue_past_its_share_is_reclaimed_without_a_push() {
    let marks = Watermarks::new(2048, 4096, 1 << 20).unwrap();
    for policy in SlowConsumerPolicy::ALL.into_iter().filter(|&p| p != SlowConsumerPolicy::Conflate)
    {
        let mut pair = Pair::with(SendQueue::new(marks, policy), 64 * 1100);
        pair.server.share = FairShare::new(&pair.server.pool, 4);
        // It fills its queue while the pool is not contended, then stops.
        while pair.server.share.uncontended(&pair.server.pool, 0) {
            let outcome = pair.server.send(pair.now, MessageKind::Binary, &[7; 1000]);
            assert!(matches!(outcome, Some(PushOutcome::Queued | PushOutcome::QueuedAboveHigh)));
        }
        let held = pair.server.session.queue().messages();
        let (session, mut cx) = pair.server.cx(pair.now);
        let reclaimed = session.reclaim(&mut cx, 0);
        match policy {
            SlowConsumerPolicy::Close => {
                let closed = PushOutcome::MustClose { limit: Limit::Pool, messages: held };
                assert_eq!(reclaimed, Some(closed), "every unsent message counted");
                pair.step(usize::MAX);
                let closed = pair.client.closed.expect("the client hears why");
                assert_eq!(closed.code, CloseCode::POLICY_VIOLATION);
                assert!(pair.client.received.is_empty(), "nothing unsent is delivered late");
            }
            SlowConsumerPolicy::DropOldest => {
                let Some(PushOutcome::Dropped { newest: false, messages, .. }) = reclaimed else {
                    panic!("{policy:?}: {reclaimed:?}");
                };
                assert_eq!(messages, held);
                assert!(pair.server.session.queue().is_writable(), "it keeps up again");
                assert!(pair.server.share.uncontended(&pair.server.pool, 0), "the pool is back");
            }
            SlowConsumerPolicy::Block | SlowConsumerPolicy::DropNewest => {
                assert_eq!(reclaimed, None, "{policy:?}");
                assert_eq!(pair.server.session.queue().messages(), held);
            }
            SlowConsumerPolicy::Conflate => unreachable!("filtered above"),
        }
    }
}

/// A replay kept from the policy ([`SendQueue::keep_queued`]) is not cut when its queue is past
/// its share of a contended pool: under `drop_oldest` and `conflate` the connection closes with
/// 1013 instead, so that the client resumes from the last offset it has rather than miss the
/// rest of what it asked for.
#[test]
fn a_kept_replay_past_its_share_closes_1013_rather_than_being_cut() {
    let marks = Watermarks::new(2048, 4096, 1 << 20).unwrap();
    for policy in [SlowConsumerPolicy::DropOldest, SlowConsumerPolicy::Conflate] {
        let mut pair = Pair::with(SendQueue::new(marks, policy), 64 * 1100);
        pair.server.share = FairShare::new(&pair.server.pool, 4);
        while pair.server.share.uncontended(&pair.server.pool, 0) {
            let outcome = pair.server.send(pair.now, MessageKind::Binary, &[7; 1000]);
            assert!(
                matches!(outcome, Some(PushOutcome::Queued | PushOutcome::QueuedAboveHigh)),
                "{policy:?}: the replay is kept whole, {outcome:?}"
            );
            pair.server.session.keep_queued();
        }
        let held = pair.server.session.queue().messages();
        let (session, mut cx) = pair.server.cx(pair.now);
        let closed = PushOutcome::MustClose { limit: Limit::Pool, messages: held };
        assert_eq!(session.reclaim(&mut cx, 0), Some(closed), "{policy:?}");
        pair.step(usize::MAX);
        let closed = pair.client.closed.expect("the client hears why");
        assert_eq!(closed.code, CloseCode::TRY_AGAIN_LATER, "{policy:?}");
        assert!(pair.client.received.is_empty(), "nothing unsent is delivered late");
    }
}

/// A queue that keeps up (under its high watermark) but holds several shares is left alone
/// while the pool is merely contended, and charged once it is tight: closed 1013, not as a
/// slow consumer, so the next reply to a reader that holds nothing still finds its chunks.
#[test]
fn a_queue_that_keeps_up_pays_for_a_tight_pool_past_its_share() {
    // High watermark far above a share: it never goes behind here.
    let marks = Watermarks::new(48 << 10, 64 << 10, 1 << 20).unwrap();
    let mut pair = Pair::with(SendQueue::new(marks, SlowConsumerPolicy::Close), 64 * 1100);
    pair.server.share = FairShare::new(&pair.server.pool, 16);
    let total = pair.server.pool.chunks_total();
    for _ in 0..12 {
        let outcome = pair.server.send(pair.now, MessageKind::Binary, &[7; 1000]);
        assert_eq!(outcome, Some(PushOutcome::Queued));
    }
    // Others (under `block`, so never charged) contend the pool: a quarter free, not tight.
    let mut others = SendQueue::new(
        Watermarks::new(1 << 20, 1 << 20, 1 << 20).unwrap(),
        SlowConsumerPolicy::Block,
    );
    while pair.server.pool.chunks_free() > total / 5 {
        let _ = others.push_message(&mut pair.server.pool, &[&[0u8; 1000]]);
    }
    let (session, mut cx) = pair.server.cx(pair.now);
    assert!(session.queue().is_writable());
    assert!(!cx.share.tight(cx.pool, 0), "contended, not tight");
    assert_eq!(session.reclaim(&mut cx, 0), None, "it keeps up: it may hold more while it drains");
    // Tight: less free than the floor and one share.
    while pair.server.pool.chunks_free() > 2 {
        let _ = others.push_message(&mut pair.server.pool, &[&[0u8; 1000]]);
    }
    let (session, mut cx) = pair.server.cx(pair.now);
    assert!(cx.share.tight(cx.pool, 0));
    let closed = PushOutcome::MustClose { limit: Limit::Pool, messages: 12 };
    assert_eq!(session.reclaim(&mut cx, 0), Some(closed));
    pair.step(usize::MAX);
    let closed = pair.client.closed.expect("the client hears why");
    assert_eq!(closed.code, CloseCode::TRY_AGAIN_LATER, "not a slow consumer: the pool is short");
    let _ = others.clear(&mut pair.server.pool);
}

/// A message that arrives in pieces is held to its connection's fair share of a contended
/// pool: once the pool is contended, a sender whose unfinished message passes the share is
/// closed 1013 and gives its pieces back, while a message within the share still arrives.
#[test]
fn a_message_in_pieces_is_held_to_its_share_of_a_contended_pool() {
    let queue = || SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::Close);
    let mut pair = Pair::with(queue(), 64 * 1100);
    pair.server.share = FairShare::new(&pair.server.pool, 8);
    let total = pair.server.pool.chunks_total();
    // Other connections' queues contend the pool (below a quarter free).
    let mut others = SendQueue::new(
        Watermarks::new(1 << 20, 1 << 20, 1 << 20).unwrap(),
        SlowConsumerPolicy::Block,
    );
    while pair.server.pool.chunks_free() > total / 5 {
        let _ = others.push_message(&mut pair.server.pool, &[&[0u8; 1000]]);
    }
    let room = pair.server.share.reassembly_room(&pair.server.pool, pair.server.session.queue());
    assert!(room < 16 << 10, "a share of {room} bytes");
    // Within the share: two fragments arrive as one message.
    let piece = vec![5u8; room / 4];
    let mut frames = freeboard_test::frame(0x02, &piece, freeboard_test::TEST_MASK);
    frames.extend(freeboard_test::frame(0x80, &piece, freeboard_test::TEST_MASK));
    pair.server.read(pair.now, &mut frames, usize::MAX);
    assert_eq!(pair.server.received.len(), 1, "a message within its share arrives");
    // Past it: the unfinished message is refused with 1013 and its pieces go back.
    let mut frames = freeboard_test::frame(0x02, &piece, freeboard_test::TEST_MASK);
    for _ in 0..4 {
        frames.extend(freeboard_test::frame(0x00, &piece, freeboard_test::TEST_MASK));
    }
    pair.server.read(pair.now, &mut frames, usize::MAX);
    assert_eq!(pair.server.session.state(), State::CloseSent);
    assert!(pair.server.session.partial_mut().is_empty(), "its pieces went back");
    pair.step(usize::MAX);
    let closed = pair.client.closed.expect("the client hears why");
    assert_eq!(closed.code, CloseCode::TRY_AGAIN_LATER);
    let _ = others.clear(&mut pair.server.pool);
}

/// A message in pieces taken while few connections were open keeps what it took until the
/// loop's sweep: once more connections share the pool (the share shrinks) and the pool is
/// contended, `reclaim_reassembly` ends it with 1013 and gives its pieces back without
/// waiting for its next piece, which a sender that stalls may never write.
#[test]
fn a_message_in_pieces_past_a_shrunken_share_is_reclaimed_without_a_piece() {
    let queue = || SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::Close);
    let mut pair = Pair::with(queue(), 64 * 1100);
    // Alone on the loop: the whole pool is its share, and the pool is not contended.
    pair.server.share = FairShare::new(&pair.server.pool, 1);
    let piece = vec![5u8; 8 << 10];
    let mut frames = freeboard_test::frame(0x02, &piece, freeboard_test::TEST_MASK);
    frames.extend(freeboard_test::frame(0x00, &piece, freeboard_test::TEST_MASK));
    pair.server.read(pair.now, &mut frames, usize::MAX);
    assert_eq!(pair.server.session.state(), State::Open);
    let held = pair.server.session.partial_mut().len();
    assert_eq!(held, 16 << 10, "both pieces kept");
    let (session, mut cx) = pair.server.cx(pair.now);
    assert!(!session.reclaim_reassembly(&mut cx), "within its share: kept");
    // Sixty-three more connections open and their queues contend the pool.
    pair.server.share = FairShare::new(&pair.server.pool, 64);
    let total = pair.server.pool.chunks_total();
    let mut others = SendQueue::new(
        Watermarks::new(1 << 20, 1 << 20, 1 << 20).unwrap(),
        SlowConsumerPolicy::Block,
    );
    while pair.server.pool.chunks_free() > total / 5 {
        let _ = others.push_message(&mut pair.server.pool, &[&[0u8; 1000]]);
    }
    let free = pair.server.pool.chunks_free();
    let (session, mut cx) = pair.server.cx(pair.now);
    assert!(session.reclaim_reassembly(&mut cx), "past its new share: ended");
    assert!(pair.server.session.partial_mut().is_empty(), "its pieces went back");
    assert!(pair.server.pool.chunks_free() > free);
    assert_eq!(pair.server.session.state(), State::CloseSent);
    pair.step(usize::MAX);
    let closed = pair.client.closed.expect("the client hears why");
    assert_eq!(closed.code, CloseCode::TRY_AGAIN_LATER);
    let (session, mut cx) = pair.server.cx(pair.now);
    assert!(!session.reclaim_reassembly(&mut cx), "once");
    let _ = others.clear(&mut pair.server.pool);
}

/// The `close` policy closes a connection only when its own queue is behind: a pool that runs
/// out under a queue that keeps up refuses the message (`WouldBlock` on the pool) instead.
#[test]
fn a_short_pool_never_closes_a_reader_as_a_slow_consumer() {
    let queue = SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::Close);
    let mut pair = Pair::with(queue, 8 * 1100);
    let mut hog = freeboard_buf::ChunkChain::new();
    while hog.append(&mut pair.server.pool, &[9u8; 1000]).is_ok() {}
    let outcome = pair.server.send(pair.now, MessageKind::Binary, &[1; 3000]);
    assert_eq!(outcome, Some(PushOutcome::WouldBlock { limit: freeboard_buf::Limit::Pool }));
    assert_eq!(pair.server.session.state(), State::Open, "a reader is not a slow consumer");
    hog.clear(&mut pair.server.pool);
    pair.server.send(pair.now, MessageKind::Binary, &[1; 3000]).unwrap();
    pair.step(usize::MAX);
    assert_eq!(pair.client.received.len(), 1);
}

/// Replies corked while the queue is empty leave in one write; what the socket does not take
/// is spilled into the queue message by message: the message cut by the write is in flight
/// (no policy drops it), the ones after it stay whole and droppable, and the bytes on the
/// wire are the same as without a cork. A pong owed meanwhile goes after the corked replies.
#[test]
fn corked_replies_spill_whole_messages_behind_a_partial_write() {
    let mut pair =
        Pair::with(SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::DropOldest), 1 << 20);
    let server = &mut pair.server;
    let mut cork = Cork::new(64 << 10);
    let mut expected = Vec::new();
    for message in [&b"first"[..], b"second", b"third"] {
        let (session, mut cx) = server.cx_corked(pair.now, &mut cork);
        let outcome = session.send(&mut cx, MessageKind::Binary, message);
        assert_eq!(outcome, Some(PushOutcome::Queued));
        expected.extend_from_slice(&[0x82, message.len() as u8]);
        expected.extend_from_slice(message);
    }
    assert_eq!(server.session.buffered(), 0, "corked, not queued");
    assert_eq!(cork.bytes(), &expected[..]);
    // The socket takes the first message and two bytes of the second.
    let mut wire = cork.bytes()[..9].to_vec();
    let written = server.session.corked_written(&mut cork, &mut server.pool, Ok(9));
    assert_eq!(written.unwrap(), 9);
    assert!(cork.is_empty());
    assert_eq!(server.session.buffered(), expected.len() - 9);
    assert_eq!(server.session.queue().messages(), 2);
    assert!(server.session.queue().has_message_in_flight(&server.pool));
    // A policy may drop the third message, never the rest of the second.
    let mut probe = SendQueue::default();
    std::mem::swap(&mut probe, &mut server.session.queue);
    let gone = probe.discard_unsent(&mut server.pool);
    std::mem::swap(&mut probe, &mut server.session.queue);
    assert_eq!((gone.messages, gone.bytes), (1, 7));
    wire.extend(server.write(usize::MAX));
    assert_eq!(wire, &expected[..expected.len() - 7]);

    // A ping arrives while a reply is corked: the pong follows the reply.
    let (session, mut cx) = server.cx_corked(pair.now, &mut cork);
    let _ = session.send(&mut cx, MessageKind::Binary, b"reply");
    let mut ping = freeboard_test::frame(0x89, b"p", freeboard_test::TEST_MASK);
    let _ = session.receive(&mut cx, &mut ping);
    assert!(cork.is_empty(), "spilled before the pong");
    assert_eq!(server.write(usize::MAX), b"\x82\x05reply\x8a\x01p");
}

/// A reply the cork does not take goes to the queue framed the same, after what the cork
/// held: one past the high watermark (its header already written into the cork's slot), and
/// one larger than the cork's room while the queue is empty.
#[test]
fn replies_the_cork_does_not_take_are_queued_framed_the_same() {
    let watermarks = Watermarks::new(8, 16, 1 << 20).unwrap();
    let mut pair = Pair::with(SendQueue::new(watermarks, SlowConsumerPolicy::Block), 1 << 20);
    let server = &mut pair.server;
    let mut cork = Cork::new(4096);
    let big = vec![7u8; 8192];
    // The first reply is corked (12 bytes, under the high watermark of 16); the second would
    // make 24, so the cork is spilled and both go to the queue. Then, with the queue written
    // out, a reply larger than the cork goes straight to the queue.
    for (replies, queued) in [(&[&b"0123456789"[..], b"abcdefghij"][..], 2), (&[&big[..]][..], 1)] {
        let mut expected = Vec::new();
        for &message in replies {
            let (session, mut cx) = server.cx_corked(pair.now, &mut cork);
            assert!(session.send(&mut cx, MessageKind::Binary, message).is_some());
            let header = match message.len() {
                len @ 0..126 => vec![0x82, len as u8],
                len => vec![0x82, 126, (len >> 8) as u8, len as u8],
            };
            expected.extend(header.into_iter().chain(message.iter().copied()));
        }
        assert!(cork.is_empty(), "nothing left in the cork");
        assert_eq!(server.session.queue().messages(), queued);
        assert_eq!(server.write(usize::MAX), expected);
    }
}

/// The cork is written early only when the reply to the next frame, whole in the read,
/// might not fit: a frame the read cuts is answered after a later read, and the replies to
/// a read that fits leave in one write.
#[test]
fn a_cork_is_written_early_only_when_the_next_frames_reply_might_not_fit() {
    // A client's binary frame of `len` (< 64 KiB) payload bytes, masked with a zero key.
    let frame = |len: usize| {
        let mut bytes = match len {
            0..126 => vec![0x82, 0x80 | len as u8],
            _ => vec![0x82, 0x80 | 126, (len >> 8) as u8, len as u8],
        };
        bytes.extend_from_slice(&[0; 4]);
        bytes.resize(bytes.len() + len, 7);
        bytes
    };
    let mut cork = Cork::new(4096);
    let header = [0x82, 126, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let payload = [7u8; 1000];
    let high = 64 << 10;
    assert!(!cork.must_write(high, &frame(5000)), "an empty cork: nothing to write");
    for _ in 0..3 {
        *cork.slot(payload.len()).expect("room") = header;
        cork.commit(4, &payload);
    }
    // 3,012 of 4,096 held: 1,084 left.
    assert!(!cork.must_write(high, &frame(1000)), "1,000 bytes and a header fit");
    assert!(cork.must_write(high, &frame(1100)), "1,100 bytes and a header would not");
    assert!(!cork.must_write(high, &frame(1100)[..600]), "a cut frame waits for the read's end");
    assert!(!cork.must_write(high, &[0x82]), "nor does a cut header");
    // The high watermark is the limit when it is below the cork's size.
    assert!(cork.must_write(3_100, &frame(80)), "3,012 of 3,100: 88 left");
    cork.clear();
    for _ in 0..super::cork::CORK_MESSAGES {
        *cork.slot(0).expect("room") = header;
        cork.commit(2, &[]);
    }
    assert!(cork.must_write(high, &[]), "no room for another message's start");
}

/// A server session made an event stream, with keep-alives every second.
fn event_stream(queue: SendQueue) -> End {
    let config = Config::builder().ping_interval(Some(Duration::from_secs(1))).build();
    let mut end = End::new(Role::Server, config, 64 << 10, queue);
    end.session.set_event_stream(false);
    end
}

#[test]
fn an_event_stream_sends_events_and_ignores_input() {
    let mut end = event_stream(SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::Close));
    let now = Instant::default();
    assert_eq!(end.send(now, MessageKind::Text, b"a\nb"), Some(PushOutcome::Queued));
    assert_eq!(end.send(now, MessageKind::Binary, &[1, 2, 3]), Some(PushOutcome::Queued));
    assert_eq!(end.write(usize::MAX), b"data: a\ndata: b\n\nevent: message+base64\ndata: AQID\n\n");
    // A client that sends anything (even a valid WebSocket frame) is not read as WebSocket.
    let mut frame = *b"\x81\x82abcd\x00\x00";
    end.read(now, &mut frame, 3);
    assert!(end.received.is_empty() && end.session.is_open());
}

#[test]
fn an_event_streams_keep_alive_is_a_comment_that_needs_no_answer() {
    let mut end = event_stream(SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::Close));
    // Far past the pong timeout: the stream stays open, a comment each interval.
    for _ in 0..30 {
        let now = end.session.poll_timeout().expect("a keep-alive is due");
        assert!(!end.timeout(now));
    }
    assert!(end.session.is_open() && end.closed.is_none());
    assert_eq!(end.write(usize::MAX), b": keep-alive\n\n".repeat(30));
}

#[test]
fn an_event_stream_ends_with_an_event_saying_why() {
    let mut end = event_stream(SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::Close));
    let now = Instant::default();
    end.close(now, crate::history::HISTORY_GONE, "the messages since that offset are gone");
    assert_eq!(
        end.write(usize::MAX),
        b"event: freeboard-gap\ndata: 4410 the messages since that offset are gone\n\n"
    );
    // Over at once: nothing comes back on a stream.
    let closed = end.session.poll_close().expect("closed");
    assert_eq!(
        (closed.code, closed.reason(), closed.clean),
        (crate::history::HISTORY_GONE, "the messages since that offset are gone", true)
    );
    assert_eq!(end.send(now, MessageKind::Text, b"late"), None);
    let t = end.session.after_flush(&mut end.pool, now, CLOSE_TIMEOUT, LINGER);
    assert!(t.closed && t.shutdown_write, "its last event out: our FIN");
}

#[test]
fn an_event_stream_that_is_not_read_meets_its_policy() {
    let marks = Watermarks::new(256, 512, 1024).unwrap();
    let mut end = event_stream(SendQueue::new(marks, SlowConsumerPolicy::Close));
    let now = Instant::default();
    let mut outcomes = Vec::new();
    for _ in 0..20 {
        outcomes.push(end.send(now, MessageKind::Text, &[b'x'; 100]));
    }
    assert!(
        outcomes.iter().any(|o| matches!(o, Some(PushOutcome::MustClose { .. }))),
        "{outcomes:?}"
    );
    let out = end.write(usize::MAX);
    assert_eq!(
        out, b"event: freeboard-close\ndata: 1008 slow consumer\n\n",
        "unsent events dropped"
    );
    assert_eq!(end.session.poll_close().map(|c| c.code), Some(CloseCode::POLICY_VIOLATION));
}

#[test]
fn a_client_that_hangs_up_leaves_an_event_stream_cleanly() {
    let mut end = event_stream(SendQueue::new(Watermarks::DEFAULT, SlowConsumerPolicy::Close));
    let (session, mut cx) = end.cx(Instant::default());
    session.handle_eof(&mut cx);
    let closed = end.session.poll_close().expect("closed");
    assert_eq!((closed.code, closed.clean), (CloseCode::GOING_AWAY, true));
}

/// Many small publications to a peer that does not read take a slot each long before their
/// bytes reach its high watermark: once the pool's slots are short, such a queue holding more
/// than its share is the culprit (its policy acts), and a queue that keeps up is refused
/// only for want of room, never charged.
#[test]
fn a_queue_of_small_messages_past_its_share_of_slots_pays_below_its_watermark() {
    let chunk = 1024;
    let config = PoolConfig::new().with_chunk_size(chunk).with_segments_per_chunk(2);
    let mut pool = Pool::new(Budget::new(64 * 1100), config).unwrap();
    let marks = Watermarks::new(32 * chunk, 48 * chunk, 64 * chunk).unwrap();
    let share = FairShare::new(&pool, 8);
    let frame = Frame::from_parts(&mut pool, &[b"publication"]).unwrap();
    let mut hog = SendQueue::new(marks, SlowConsumerPolicy::DropOldest);
    let keeping_up = SendQueue::new(marks, SlowConsumerPolicy::DropOldest);
    while pool.segments_total() - pool.segments_in_use() > 4 {
        assert!(matches!(hog.push_frame(&mut pool, &frame).outcome, PushOutcome::Queued));
    }
    assert!(hog.is_writable(), "its bytes are far below its high watermark");
    assert!(pool.chunks_free() > pool.chunks_total() / 2, "chunks are plentiful");
    assert_eq!(share.judge(&pool, &hog, 13), fair_share::Room::Culprit);
    assert_eq!(share.judge(&pool, &keeping_up, 13), fair_share::Room::Exhausted);
    let _ = hog.clear(&mut pool);
    frame.release(&mut pool);
}
