//! Property tests over random operation sequences, each checked against a plain model
//! (`VecDeque<u8>` for chains, `VecDeque` of whole messages for send queues) and against the
//! pool's own bookkeeping ([`Pool::audit`]).

use std::collections::VecDeque;
use std::vec;
use std::vec::Vec;

use proptest::prelude::*;

use crate::*;

fn config() -> ProptestConfig {
    let default = ProptestConfig::default(); // 256 cases, or PROPTEST_CASES
    ProptestConfig {
        // Miri runs each case thousands of times slower: a handful still walks every path.
        cases: if cfg!(miri) { 3 } else { default.cases },
        failure_persistence: None,
        ..default
    }
}

fn max_ops() -> usize {
    if cfg!(miri) { 24 } else { 160 }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

// ---------------------------------------------------------------------------------------------
// Chains: byte order, all-or-nothing appends, sharing, budget, every chunk returns.

#[derive(Debug, Clone)]
enum ChainOp {
    Append {
        chain: usize,
        len: usize,
        seed: u8,
    },
    AppendChunk {
        chain: usize,
        len: usize,
        seed: u8,
    },
    MakeFrame {
        len: usize,
        split: usize,
        seed: u8,
    },
    AppendFrame {
        chain: usize,
        frame: usize,
    },
    ShareFrame {
        frame: usize,
    },
    ReleaseFrame {
        frame: usize,
    },
    Consume {
        chain: usize,
        n: usize,
    },
    Clear {
        chain: usize,
    },
    Draw {
        bytes: usize,
    },
    GiveBack,
    /// The event loop's timer: `Pool::release_idle`.
    Tick,
}

fn chain_op() -> impl Strategy<Value = ChainOp> {
    prop_oneof![
        4 => (0..3usize, 0..200usize, any::<u8>()).prop_map(|(chain, len, seed)| ChainOp::Append { chain, len, seed }),
        1 => (0..3usize, 0..80usize, any::<u8>()).prop_map(|(chain, len, seed)| ChainOp::AppendChunk { chain, len, seed }),
        1 => (0..150usize, 0..150usize, any::<u8>()).prop_map(|(len, split, seed)| ChainOp::MakeFrame { len, split, seed }),
        2 => (0..3usize, 0..4usize).prop_map(|(chain, frame)| ChainOp::AppendFrame { chain, frame }),
        1 => (0..4usize).prop_map(|frame| ChainOp::ShareFrame { frame }),
        1 => (0..4usize).prop_map(|frame| ChainOp::ReleaseFrame { frame }),
        4 => (0..3usize, 0..300usize).prop_map(|(chain, n)| ChainOp::Consume { chain, n }),
        1 => (0..3usize).prop_map(|chain| ChainOp::Clear { chain }),
        1 => (0..4000usize).prop_map(|bytes| ChainOp::Draw { bytes }),
        1 => Just(ChainOp::GiveBack),
        2 => Just(ChainOp::Tick),
    ]
}

fn chain_bytes(chain: &ChunkChain, pool: &Pool<'_>) -> Vec<u8> {
    chain.segments(pool).flatten().copied().collect()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn chains_match_a_byte_model(
        chunk_size in 1..48usize,
        chunks in 1..24usize,
        segments_per_chunk in 1..4usize,
        slack in 0..5000usize,
        ops in prop::collection::vec(chain_op(), 1..max_ops()),
    ) {
        let footprint = Pool::footprint(chunk_size, chunks, chunks * segments_per_chunk);
        let config = PoolConfig::new()
            .with_chunk_size(chunk_size)
            .with_chunk_count(chunks)
            .with_segments_per_chunk(segments_per_chunk)
            .with_warm_reserve(0)
            .with_idle_ticks(1);
        let mut pool = Pool::new(Budget::new(footprint + slack), config).unwrap();
        let mut chains: [ChunkChain; 3] = Default::default();
        let mut models: [VecDeque<u8>; 3] = Default::default();
        let mut frames: Vec<(Frame, Vec<u8>)> = Vec::new();
        let mut draws: Vec<usize> = Vec::new();

        for op in ops {
            let before = (pool.chunks_in_use(), pool.segments_in_use());
            match op {
                ChainOp::Append { chain, len, seed } => {
                    let data = pattern(len, seed);
                    match chains[chain].append(&mut pool, &data) {
                        Ok(()) => models[chain].extend(&data),
                        Err(_) => prop_assert_eq!(before, (pool.chunks_in_use(), pool.segments_in_use())),
                    }
                }
                ChainOp::AppendChunk { chain, len, seed } => {
                    if let Ok(id) = pool.alloc() {
                        let data = pattern(len, seed);
                        let written = pool.append(&id, &data);
                        prop_assert_eq!(written, len.min(chunk_size));
                        if chains[chain].append_chunk(&mut pool, &id).is_ok() {
                            models[chain].extend(&data[..written]);
                        }
                        pool.release(id);
                    }
                }
                ChainOp::MakeFrame { len, split, seed } => {
                    if frames.len() < 4 {
                        let data = pattern(len, seed);
                        let (a, b) = data.split_at(split.min(len));
                        match Frame::from_parts(&mut pool, &[a, b]) {
                            Ok(frame) => frames.push((frame, data)),
                            Err(_) => prop_assert_eq!(before, (pool.chunks_in_use(), pool.segments_in_use())),
                        }
                    }
                }
                ChainOp::AppendFrame { chain, frame } => {
                    if !frames.is_empty() {
                        let (frame, data) = &frames[frame % frames.len()];
                        match chains[chain].append_frame(&mut pool, frame) {
                            Ok(()) => models[chain].extend(data),
                            Err(_) => prop_assert_eq!(before, (pool.chunks_in_use(), pool.segments_in_use())),
                        }
                    }
                }
                ChainOp::ShareFrame { frame } => {
                    if !frames.is_empty() && frames.len() < 4 {
                        let i = frame % frames.len();
                        if let Ok(copy) = frames[i].0.share(&mut pool) {
                            let data = frames[i].1.clone();
                            frames.push((copy, data));
                        }
                    }
                }
                ChainOp::ReleaseFrame { frame } => {
                    if !frames.is_empty() {
                        let i = frame % frames.len();
                        let (frame, _) = frames.swap_remove(i);
                        frame.release(&mut pool);
                    }
                }
                ChainOp::Consume { chain, n } => {
                    let expected = n.min(models[chain].len());
                    prop_assert_eq!(chains[chain].consume(&mut pool, n), expected);
                    models[chain].drain(..expected);
                }
                ChainOp::Clear { chain } => {
                    chains[chain].clear(&mut pool);
                    models[chain].clear();
                }
                ChainOp::Draw { bytes } => {
                    let available = pool.budget().available();
                    match pool.budget_mut().try_draw(bytes) {
                        Ok(()) => draws.push(bytes),
                        Err(e) => prop_assert!(e.requested > available),
                    }
                }
                ChainOp::GiveBack => {
                    if let Some(bytes) = draws.pop() {
                        pool.budget_mut().give_back(bytes);
                    }
                }
                ChainOp::Tick => {
                    pool.release_idle();
                }
            }

            // Byte order and O(1) length, through every read path.
            for (chain, model) in chains.iter().zip(&models) {
                let model: Vec<u8> = model.iter().copied().collect();
                prop_assert_eq!(chain.len(), model.len());
                prop_assert_eq!(&chain_bytes(chain, &pool), &model);
                let mut iov = [&[][..]; 3];
                let n = chain.slices(&pool, &mut iov);
                let head = iov[..n].concat();
                prop_assert_eq!(&head[..], &model[..head.len()]);
                let mut io = [std::io::IoSlice::new(&[]); 3];
                let n = chain.io_slices(&pool, &mut io);
                let head: Vec<u8> = io[..n].iter().flat_map(|s| s.iter().copied()).collect();
                prop_assert_eq!(&head[..], &model[..head.len()]);
                let mut peek = [0u8; 17];
                let n = chain.copy_to(&pool, &mut peek);
                prop_assert_eq!(&peek[..n], &model[..n.min(model.len())]);
            }
            for (frame, data) in &frames {
                let bytes: Vec<u8> = frame.segments(&pool).flatten().copied().collect();
                prop_assert_eq!(&bytes, data, "a shared frame changed under its readers");
            }
            // The budget is never exceeded, and every reference is accounted for.
            prop_assert!(pool.budget().drawn() <= pool.budget().limit());
            prop_assert!(pool.chunks_in_use() <= pool.chunks_total());
            pool.audit(chains.iter().chain(frames.iter().map(|(f, _)| f.chain())), &[]);
        }

        for chain in &mut chains {
            chain.clear(&mut pool);
        }
        for (frame, _) in frames {
            frame.release(&mut pool);
        }
        prop_assert_eq!(pool.chunks_in_use(), 0);
        prop_assert_eq!(pool.segments_in_use(), 0);
        prop_assert_eq!(pool.fragmentation_index(), 0.0);
        pool.audit([], &[]);
    }
}

// ---------------------------------------------------------------------------------------------
// Send queues: whole messages only, never a torn one, policies as specified, watermark events
// that alternate and match the level, every drop counted.
//
// Every message is self-describing: an 8-byte header (tag, body length, little endian) and a
// body, so the byte stream the "socket" receives can be parsed back into messages without the
// model's help. Tags: copied data messages use their push number; control messages set bit 30;
// frames (shared by reference) set bit 31.

const CONTROL_TAG: u32 = 1 << 30;
const FRAME_TAG: u32 = 1 << 31;

fn message(tag: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(8 + body.len());
    m.extend_from_slice(&tag.to_le_bytes());
    m.extend_from_slice(&(body.len() as u32).to_le_bytes());
    m.extend_from_slice(body);
    m
}

#[derive(Debug, Clone)]
enum QueueOp {
    Push { queue: usize, body: usize, split: usize },
    PushFrame { queue: usize, frame: usize },
    PushMixed { queue: usize, frame: usize },
    PushControl { queue: usize, body: usize },
    MakeFrame { body: usize },
    ReleaseFrame { frame: usize },
    Write { queue: usize, n: usize, iov: usize },
    Discard { queue: usize },
    Keep { queue: usize },
}

fn queue_op() -> impl Strategy<Value = QueueOp> {
    prop_oneof![
        6 => (0..2usize, 0..120usize, 0..140usize).prop_map(|(queue, body, split)| QueueOp::Push { queue, body, split }),
        2 => (0..2usize, 0..4usize).prop_map(|(queue, frame)| QueueOp::PushFrame { queue, frame }),
        1 => (0..2usize, 0..4usize).prop_map(|(queue, frame)| QueueOp::PushMixed { queue, frame }),
        1 => (0..2usize, 0..124usize).prop_map(|(queue, body)| QueueOp::PushControl { queue, body }),
        1 => (0..120usize).prop_map(|body| QueueOp::MakeFrame { body }),
        1 => (0..4usize).prop_map(|frame| QueueOp::ReleaseFrame { frame }),
        6 => (0..2usize, 0..160usize, 1..5usize).prop_map(|(queue, n, iov)| QueueOp::Write { queue, n, iov }),
        1 => (0..2usize).prop_map(|queue| QueueOp::Discard { queue }),
        1 => (0..2usize).prop_map(|queue| QueueOp::Keep { queue }),
    ]
}

fn policy() -> impl Strategy<Value = SlowConsumerPolicy> {
    prop::sample::select(SlowConsumerPolicy::ALL.to_vec())
}

fn watermarks() -> impl Strategy<Value = Watermarks> {
    (0..300usize, 0..300usize, 0..300usize).prop_map(|(a, b, c)| {
        let mut v = [a, b, c];
        v.sort_unstable();
        Watermarks::new(v[0], v[1], v[2]).unwrap()
    })
}

#[derive(Debug)]
struct ModelMessage {
    bytes: Vec<u8>,
    sent: usize,
    control: bool,
    /// Queued when [`SendQueue::keep_queued`] was called.
    kept: bool,
}

/// A send queue as plain data: whole messages and how much of each went out.
#[derive(Debug, Default)]
struct ModelQueue {
    messages: VecDeque<ModelMessage>,
    /// Everything the socket received, in order.
    socket: Vec<u8>,
    /// Every message offered, in push order.
    offered: Vec<Vec<u8>>,
    writable: bool,
    dropped: u64,
    refused: u64,
    discarded: u64,
}

impl ModelQueue {
    fn level(&self) -> usize {
        self.messages.iter().map(|m| m.bytes.len() - m.sent).sum()
    }

    fn unsent(&self) -> Vec<u8> {
        self.messages.iter().flat_map(|m| m.bytes[m.sent..].iter().copied()).collect()
    }

    fn droppable(m: &ModelMessage) -> bool {
        m.sent == 0 && !m.control && !m.kept
    }

    fn undroppable_bytes(&self) -> usize {
        self.messages.iter().filter(|m| !Self::droppable(m)).map(|m| m.bytes.len() - m.sent).sum()
    }

    fn drop_oldest(&mut self) -> Option<usize> {
        let i = self.messages.iter().position(Self::droppable)?;
        self.messages.remove(i).map(|m| m.bytes.len())
    }

    /// The outcome the specification asks for when the pool has room.
    fn expected(&self, policy: SlowConsumerPolicy, marks: &Watermarks, len: usize) -> PushOutcome {
        let level = self.level();
        let queued = |after: usize| {
            if after > marks.high() { PushOutcome::QueuedAboveHigh } else { PushOutcome::Queued }
        };
        let newest = PushOutcome::Dropped { newest: true, messages: 1, bytes: len };
        let fits = level + len <= marks.cap();
        match policy {
            SlowConsumerPolicy::Block if len > marks.cap() => newest,
            SlowConsumerPolicy::Block if !fits => PushOutcome::WouldBlock { limit: Limit::Cap },
            SlowConsumerPolicy::DropNewest if !fits => newest,
            SlowConsumerPolicy::Close if !fits => {
                PushOutcome::MustClose { limit: Limit::Cap, messages: 1 }
            }
            SlowConsumerPolicy::Block
            | SlowConsumerPolicy::DropNewest
            | SlowConsumerPolicy::Close => queued(level + len),
            // A conflating queue that keeps up keeps every message.
            SlowConsumerPolicy::Conflate if fits && self.writable => queued(level + len),
            SlowConsumerPolicy::DropOldest | SlowConsumerPolicy::Conflate => {
                if self.undroppable_bytes() + len > marks.cap() {
                    return newest;
                }
                let (mut level, mut messages, mut bytes) = (level, 0, 0);
                for m in self.messages.iter().filter(|m| Self::droppable(m)) {
                    if policy == SlowConsumerPolicy::DropOldest && level + len <= marks.cap() {
                        break;
                    }
                    level -= m.bytes.len();
                    messages += 1;
                    bytes += m.bytes.len();
                }
                if messages == 0 {
                    queued(level + len)
                } else {
                    PushOutcome::Dropped { newest: false, messages, bytes }
                }
            }
        }
    }

    /// Applies what the real queue reported; the dropped messages must be exactly the oldest
    /// droppable ones, or the contents diverge and the comparison after the step fails.
    fn apply(&mut self, outcome: PushOutcome, bytes: Vec<u8>) -> Result<(), TestCaseError> {
        let len = bytes.len();
        self.offered.push(bytes.clone());
        let keep = match outcome {
            PushOutcome::Queued | PushOutcome::QueuedAboveHigh => true,
            PushOutcome::Dropped { newest, messages, bytes: dropped_bytes } => {
                let older = if newest { messages - 1 } else { messages };
                let mut freed = 0;
                for _ in 0..older {
                    match self.drop_oldest() {
                        Some(n) => freed += n,
                        None => {
                            return Err(TestCaseError::fail(
                                "dropped a message that was in flight",
                            ));
                        }
                    }
                }
                prop_assert_eq!(freed + if newest { len } else { 0 }, dropped_bytes);
                self.dropped += u64::from(messages);
                !newest
            }
            PushOutcome::WouldBlock { .. } | PushOutcome::MustClose { .. } => {
                self.refused += 1;
                false
            }
        };
        if keep {
            self.messages.push_back(ModelMessage { bytes, sent: 0, control: false, kept: false });
        }
        Ok(())
    }

    fn write(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.messages.front_mut() else { return };
            let take = n.min(front.bytes.len() - front.sent);
            self.socket.extend_from_slice(&front.bytes[front.sent..front.sent + take]);
            front.sent += take;
            n -= take;
            if front.sent == front.bytes.len() {
                self.messages.pop_front();
            }
        }
    }

    fn observe(&mut self, event: Option<Writability>) -> Result<(), TestCaseError> {
        match event {
            Some(Writability::NotWritable) => {
                prop_assert!(self.writable, "NotWritable twice");
                self.writable = false;
            }
            Some(Writability::Writable) => {
                prop_assert!(!self.writable, "Writable twice");
                self.writable = true;
            }
            None => {}
        }
        Ok(())
    }
}

/// Parses the socket's byte stream into whole messages; fails on a torn or corrupt one.
fn parse_stream(mut stream: &[u8]) -> Result<Vec<Vec<u8>>, TestCaseError> {
    let mut messages = Vec::new();
    while !stream.is_empty() {
        prop_assert!(stream.len() >= 8, "torn header");
        let body = u32::from_le_bytes(stream[4..8].try_into().unwrap()) as usize;
        prop_assert!(stream.len() >= 8 + body, "torn body");
        messages.push(stream[..8 + body].to_vec());
        stream = &stream[8 + body..];
    }
    Ok(messages)
}

fn check_writability(queue: &SendQueue, model: &ModelQueue) -> Result<(), TestCaseError> {
    prop_assert_eq!(queue.is_writable(), model.writable);
    if queue.len() > queue.watermarks().high() {
        prop_assert!(!queue.is_writable(), "above high but writable");
    }
    if queue.len() <= queue.watermarks().low() {
        prop_assert!(queue.is_writable(), "at or below low but not writable");
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn send_queues_drop_only_whole_unsent_messages(
        policies in (policy(), policy()),
        marks in (watermarks(), watermarks()),
        chunk_size in 8..64usize,
        tight in any::<bool>(),
        chunks in 2..16usize,
        segments_per_chunk in 1..4usize,
        ops in prop::collection::vec(queue_op(), 1..max_ops()),
    ) {
        // A roomy pool never runs out, so outcomes must match the specification exactly; a
        // tight one runs out often, and then the policy decides.
        let config = if tight {
            PoolConfig::new().with_chunk_size(chunk_size).with_chunk_count(chunks)
                .with_segments_per_chunk(segments_per_chunk)
        } else {
            // ~1.5 KiB can be queued at once (two caps of < 300 bytes plus control frames, four
            // frames of < 140): 600 chunks of at least 8 bytes, 4 segments each, never run out.
            PoolConfig::new().with_chunk_size(chunk_size).with_chunk_count(600).with_segments_per_chunk(4)
        };
        let mut pool = Pool::new(Budget::new(usize::MAX), config).unwrap();
        let mut queues = [SendQueue::new(marks.0, policies.0), SendQueue::new(marks.1, policies.1)];
        let mut models = [ModelQueue { writable: true, ..ModelQueue::default() }, ModelQueue { writable: true, ..ModelQueue::default() }];
        let mut frames: Vec<(Frame, Vec<u8>)> = Vec::new();
        let mut next_tag = 1u32;
        let mut next_frame = 0u32;

        for op in ops {
            if matches!(op, QueueOp::PushFrame { .. } | QueueOp::PushMixed { .. }) && frames.is_empty() {
                continue;
            }
            match op {
                QueueOp::Push { queue: q, body, split } => {
                    let bytes = message(next_tag, &pattern(body, next_tag as u8));
                    next_tag += 1;
                    let (a, rest) = bytes.split_at(split.min(bytes.len()));
                    let (b, c) = rest.split_at(rest.len() / 2);
                    let expected = models[q].expected(queues[q].policy(), queues[q].watermarks(), bytes.len());
                    let level = queues[q].len();
                    let pushed = if split % 2 == 1 {
                        // Masked while copied: the fill takes off a mask put on beforehand.
                        let key = [0x3c, 0x5a, 0xa5, 0x0f];
                        let masked: Vec<u8> =
                            rest.iter().enumerate().map(|(i, byte)| byte ^ key[i % 4]).collect();
                        queues[q].push_message_with(&mut pool, a, &masked, |dst, src, offset| {
                            for (i, (d, s)) in dst.iter_mut().zip(src).enumerate() {
                                *d = s ^ key[(offset + i) % 4];
                            }
                        })
                    } else {
                        queues[q].push_message(&mut pool, &[a, b, c])
                    };
                    check_outcome(&queues[q], pushed.outcome, expected, tight, level, bytes.len())?;
                    models[q].apply(pushed.outcome, bytes)?;
                    models[q].observe(pushed.writability)?;
                }
                QueueOp::PushFrame { queue: q, frame } => {
                    let (frame, bytes) = &frames[frame % frames.len()];
                    let expected = models[q].expected(queues[q].policy(), queues[q].watermarks(), bytes.len());
                    let level = queues[q].len();
                    let pushed = queues[q].push_frame(&mut pool, frame);
                    check_outcome(&queues[q], pushed.outcome, expected, tight, level, bytes.len())?;
                    models[q].apply(pushed.outcome, bytes.clone())?;
                    models[q].observe(pushed.writability)?;
                }
                QueueOp::PushMixed { queue: q, frame } => {
                    let (frame, body) = &frames[frame % frames.len()];
                    let mut header = Vec::new();
                    header.extend_from_slice(&next_tag.to_le_bytes());
                    header.extend_from_slice(&(body.len() as u32).to_le_bytes());
                    next_tag += 1;
                    let mut bytes = header.clone();
                    bytes.extend_from_slice(body);
                    let expected = models[q].expected(queues[q].policy(), queues[q].watermarks(), bytes.len());
                    let level = queues[q].len();
                    let pushed = queues[q].push_parts(&mut pool, &[Part::Bytes(&header), Part::Frame(frame)]);
                    check_outcome(&queues[q], pushed.outcome, expected, tight, level, bytes.len())?;
                    models[q].apply(pushed.outcome, bytes)?;
                    models[q].observe(pushed.writability)?;
                }
                QueueOp::PushControl { queue: q, body } => {
                    let bytes = message(CONTROL_TAG | next_tag, &pattern(body, 7));
                    next_tag += 1;
                    let level = queues[q].len();
                    let cap = queues[q].watermarks().cap();
                    match queues[q].push_control(&mut pool, &[&bytes[..3], &bytes[3..]]) {
                        Ok(event) => {
                            prop_assert!(level + bytes.len() <= cap + MAX_CONTROL_FRAME);
                            models[q].offered.push(bytes.clone());
                            models[q].messages.push_back(ModelMessage { bytes, sent: 0, control: true, kept: false });
                            models[q].observe(event)?;
                        }
                        Err(Limit::Cap) => prop_assert!(level + bytes.len() > cap + MAX_CONTROL_FRAME),
                        Err(Limit::Pool) => prop_assert!(tight, "a roomy pool ran out"),
                    }
                }
                QueueOp::MakeFrame { body } => {
                    if frames.len() < 4 {
                        let bytes = message(FRAME_TAG | next_frame, &pattern(body, 99));
                        next_frame += 1;
                        if let Ok(frame) = Frame::from_parts(&mut pool, &[&bytes[..5], &bytes[5..]]) {
                            frames.push((frame, bytes));
                        } else {
                            prop_assert!(tight, "a roomy pool ran out");
                        }
                    }
                }
                QueueOp::ReleaseFrame { frame } => {
                    if !frames.is_empty() {
                        let i = frame % frames.len();
                        frames.swap_remove(i).0.release(&mut pool);
                    }
                }
                QueueOp::Write { queue: q, n, iov } => {
                    write(&mut queues[q], &mut models[q], &mut pool, n, iov)?;
                }
                QueueOp::Keep { queue: q } => {
                    queues[q].keep_queued();
                    models[q].messages.iter_mut().for_each(|m| m.kept = true);
                }
                QueueOp::Discard { queue: q } => {
                    // A closing connection's discard takes kept messages too.
                    models[q].messages.iter_mut().for_each(|m| m.kept = false);
                    let before = models[q].messages.len();
                    let gone = queues[q].discard_unsent(&mut pool);
                    let mut bytes = 0;
                    for _ in 0..gone.messages {
                        bytes += models[q].drop_oldest().unwrap_or(0);
                    }
                    prop_assert_eq!(bytes, gone.bytes);
                    prop_assert!(models[q].messages.iter().all(|m| !ModelQueue::droppable(m)));
                    prop_assert_eq!(before - models[q].messages.len(), gone.messages as usize);
                    models[q].discarded += u64::from(gone.messages);
                    models[q].observe(gone.writability)?;
                }
            }

            for (queue, model) in queues.iter().zip(&models) {
                prop_assert_eq!(queue.len(), model.level());
                prop_assert_eq!(queue.messages() as usize, model.messages.len());
                prop_assert_eq!(queue.kept() as usize, model.messages.iter().filter(|m| m.kept).count());
                prop_assert_eq!(queue.segments(&pool).flatten().copied().collect::<Vec<u8>>(), model.unsent());
                prop_assert!(queue.len() <= queue.watermarks().cap() + MAX_CONTROL_FRAME);
                prop_assert_eq!(
                    queue.has_message_in_flight(&pool),
                    model.messages.front().is_some_and(|m| m.sent > 0)
                );
                check_writability(queue, model)?;
                if queue.policy() == SlowConsumerPolicy::Conflate {
                    // Unsent messages pile up only while the queue keeps up (at most the high
                    // watermark before the newest); once behind, the newest replaces them.
                    let droppable: Vec<usize> = model.messages.iter().filter(|m| ModelQueue::droppable(m)).map(|m| m.bytes.len()).collect();
                    let before_newest: usize = droppable.iter().rev().skip(1).sum();
                    prop_assert!(before_newest <= queue.watermarks().high());
                }
            }
            for (frame, bytes) in &frames {
                prop_assert_eq!(&frame.segments(&pool).flatten().copied().collect::<Vec<u8>>(), bytes);
            }
            pool.audit(queues.iter().map(SendQueue::chain).chain(frames.iter().map(|(f, _)| f.chain())), &[]);
        }

        // Drain: the socket must see whole messages, in push order, minus whole dropped ones,
        // and every message must be accounted for.
        for (queue, model) in queues.iter_mut().zip(&mut models) {
            write(queue, model, &mut pool, usize::MAX, 64)?;
            prop_assert!(queue.is_empty());
            let delivered = parse_stream(&model.socket)?;
            let mut next = 0;
            for message in &delivered {
                match model.offered[next..].iter().position(|m| m == message) {
                    Some(i) => next += i + 1,
                    None => return Err(TestCaseError::fail("a delivered message was never offered, or out of order")),
                }
            }
            prop_assert_eq!(
                delivered.len() as u64 + model.dropped + model.refused + model.discarded,
                model.offered.len() as u64
            );
        }
        let counters = pool.counters();
        prop_assert_eq!(counters.dropped_total().messages, models.iter().map(|m| m.dropped).sum::<u64>());
        prop_assert_eq!(counters.would_block + counters.slow_consumer_closes, models.iter().map(|m| m.refused).sum::<u64>());
        prop_assert_eq!(counters.discarded.messages, models.iter().map(|m| m.discarded).sum::<u64>());
        for (frame, _) in frames {
            frame.release(&mut pool);
        }
        for queue in &mut queues {
            let _ = queue.clear(&mut pool);
        }
        prop_assert_eq!(pool.chunks_in_use(), 0);
        prop_assert_eq!(pool.segments_in_use(), 0);
        pool.audit([], &[]);
    }
}

/// One `writev`: gathers at most `iov` slices, the socket takes up to `n` bytes of them.
fn write(
    queue: &mut SendQueue,
    model: &mut ModelQueue,
    pool: &mut Pool<'_>,
    n: usize,
    iov: usize,
) -> Result<(), TestCaseError> {
    let mut slices = vec![&[][..]; iov];
    let filled = queue.slices(pool, &mut slices);
    let gathered: Vec<u8> = slices[..filled].concat();
    let taken = n.min(gathered.len());
    let unsent = model.unsent();
    prop_assert_eq!(&gathered[..], &unsent[..gathered.len()]);
    model.write(taken);
    let event = queue.consume(pool, taken);
    model.observe(event)?;
    if n == usize::MAX && !queue.is_empty() {
        return write(queue, model, pool, n, iov);
    }
    Ok(())
}

fn check_outcome(
    queue: &SendQueue,
    outcome: PushOutcome,
    expected: PushOutcome,
    tight: bool,
    level: usize,
    len: usize,
) -> Result<(), TestCaseError> {
    if !tight {
        prop_assert_eq!(outcome, expected);
        return Ok(());
    }
    let cap = queue.watermarks().cap();
    match (queue.policy(), outcome) {
        (
            _,
            PushOutcome::WouldBlock { limit: Limit::Cap }
            | PushOutcome::MustClose { limit: Limit::Cap, .. },
        ) => {
            prop_assert!(level + len > cap)
        }
        (SlowConsumerPolicy::Block, PushOutcome::WouldBlock { .. }) => {}
        (SlowConsumerPolicy::Block, PushOutcome::Dropped { newest: true, messages: 1, .. }) => {
            prop_assert!(len > cap)
        }
        (SlowConsumerPolicy::Close, PushOutcome::MustClose { .. }) => {}
        (
            SlowConsumerPolicy::DropNewest,
            PushOutcome::Dropped { newest: true, messages: 1, .. },
        ) => {}
        (
            SlowConsumerPolicy::DropOldest | SlowConsumerPolicy::Conflate,
            PushOutcome::Dropped { .. },
        ) => {}
        (_, PushOutcome::Queued | PushOutcome::QueuedAboveHigh) => prop_assert!(level + len <= cap),
        (policy, outcome) => {
            return Err(TestCaseError::fail(std::format!("{policy:?} may not answer {outcome:?}")));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Watermarks on their own, and the ring buffer against a `VecDeque`.

proptest! {
    #![proptest_config(config())]

    #[test]
    fn watermark_events_alternate_and_match_the_level(
        marks in watermarks(),
        levels in prop::collection::vec(0..320usize, 0..200),
    ) {
        let mut marks = marks;
        let mut writable = true;
        for level in levels {
            match marks.observe(level) {
                Some(Writability::NotWritable) => {
                    prop_assert!(writable && level > marks.high());
                    writable = false;
                }
                Some(Writability::Writable) => {
                    prop_assert!(!writable && level <= marks.low());
                    writable = true;
                }
                None => {}
            }
            prop_assert_eq!(marks.is_writable(), writable);
            prop_assert!(level <= marks.high() || !writable);
            prop_assert!(level > marks.low() || writable);
        }
    }
}

#[derive(Debug, Clone)]
enum RingOp {
    EnqueueOne(u8),
    DequeueOne,
    EnqueueSlice(Vec<u8>),
    DequeueSlice(usize),
    EnqueueMany(usize, u8),
    DequeueMany(usize),
    WriteUnallocated(Vec<u8>, Vec<u8>),
    ReadAllocated(usize, usize),
    DequeueAllocated(usize),
    Clear,
}

fn ring_op() -> impl Strategy<Value = RingOp> {
    let bytes = || prop::collection::vec(any::<u8>(), 0..12);
    prop_oneof![
        any::<u8>().prop_map(RingOp::EnqueueOne),
        Just(RingOp::DequeueOne),
        bytes().prop_map(RingOp::EnqueueSlice),
        (0..12usize).prop_map(RingOp::DequeueSlice),
        (0..12usize, any::<u8>()).prop_map(|(n, v)| RingOp::EnqueueMany(n, v)),
        (0..12usize).prop_map(RingOp::DequeueMany),
        (bytes(), bytes()).prop_map(|(a, b)| RingOp::WriteUnallocated(a, b)),
        (0..12usize, 0..12usize).prop_map(|(o, n)| RingOp::ReadAllocated(o, n)),
        (0..12usize).prop_map(RingOp::DequeueAllocated),
        Just(RingOp::Clear),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn ring_buffer_matches_a_vecdeque(
        capacity in 0..10usize,
        ops in prop::collection::vec(ring_op(), 0..max_ops()),
    ) {
        let mut storage = vec![0u8; capacity];
        let mut ring = RingBuffer::new(&mut storage[..]);
        let mut model: VecDeque<u8> = VecDeque::new();
        for op in ops {
            let window = capacity - model.len();
            match op {
                RingOp::EnqueueOne(v) => match ring.enqueue_one() {
                    Ok(slot) => {
                        *slot = v;
                        model.push_back(v);
                    }
                    Err(Full) => prop_assert_eq!(window, 0),
                },
                RingOp::DequeueOne => match ring.dequeue_one() {
                    Ok(v) => prop_assert_eq!(Some(*v), model.pop_front()),
                    Err(Empty) => prop_assert!(model.is_empty()),
                },
                RingOp::EnqueueSlice(data) => {
                    let n = ring.enqueue_slice(&data);
                    prop_assert_eq!(n, data.len().min(window));
                    model.extend(&data[..n]);
                }
                RingOp::DequeueSlice(n) => {
                    let mut out = vec![0u8; n];
                    let got = ring.dequeue_slice(&mut out);
                    prop_assert_eq!(got, n.min(model.len()));
                    let expected: Vec<u8> = model.drain(..got).collect();
                    prop_assert_eq!(&out[..got], &expected[..]);
                }
                RingOp::EnqueueMany(n, v) => {
                    let contiguous = ring.contiguous_window();
                    let slice = ring.enqueue_many(n);
                    prop_assert_eq!(slice.len(), n.min(contiguous));
                    slice.fill(v);
                    let len = slice.len();
                    model.extend(core::iter::repeat_n(v, len));
                }
                RingOp::DequeueMany(n) => {
                    let slice = ring.dequeue_many(n);
                    prop_assert!(slice.len() <= n);
                    let expected: Vec<u8> = model.drain(..slice.len()).collect();
                    prop_assert_eq!(&slice[..], &expected[..]);
                    prop_assert!(!slice.is_empty() || n == 0 || model.is_empty());
                }
                RingOp::WriteUnallocated(a, b) => {
                    let wa = ring.write_unallocated(0, &a);
                    let wb = ring.write_unallocated(wa, &b);
                    prop_assert_eq!(wa, a.len().min(window));
                    prop_assert_eq!(wb, b.len().min(window - wa));
                    prop_assert_eq!(ring.enqueue_unallocated(wa + wb), wa + wb);
                    model.extend(&a[..wa]);
                    model.extend(&b[..wb]);
                }
                RingOp::ReadAllocated(offset, n) => {
                    let mut out = vec![0u8; n];
                    let got = ring.read_allocated(offset, &mut out);
                    let expected: Vec<u8> = model.iter().skip(offset).take(n).copied().collect();
                    prop_assert_eq!(&out[..got], &expected[..]);
                }
                RingOp::DequeueAllocated(n) => {
                    let n = n.min(model.len());
                    prop_assert_eq!(ring.dequeue_allocated(n), n);
                    model.drain(..n);
                }
                RingOp::Clear => {
                    ring.clear();
                    model.clear();
                }
            }
            prop_assert_eq!(ring.len(), model.len());
            prop_assert_eq!(ring.window(), capacity - model.len());
            prop_assert_eq!(ring.is_full(), model.len() == capacity);
            prop_assert!(ring.contiguous_window() <= ring.window() || ring.is_empty());
            prop_assert!(ring.contiguous_window() > 0 || ring.is_full());
            let all: Vec<u8> = model.iter().copied().collect();
            let mut peek = vec![0u8; all.len()];
            prop_assert_eq!(ring.read_allocated(0, &mut peek), all.len());
            prop_assert_eq!(peek, all);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Giving memory back: `release_idle` never takes a page that is in use or warm in the reserve,
// what is written stays written, a quiet pool returns to nothing, and reuse after a release
// works.

#[derive(Debug, Clone)]
enum ReleaseOp {
    Alloc { seed: u8 },
    Write { held: usize, len: usize },
    Share { held: usize },
    Release { held: usize },
    Tick,
}

fn release_op() -> impl Strategy<Value = ReleaseOp> {
    prop_oneof![
        4 => any::<u8>().prop_map(|seed| ReleaseOp::Alloc { seed }),
        2 => (0..16usize, 1..5000usize).prop_map(|(held, len)| ReleaseOp::Write { held, len }),
        1 => (0..16usize).prop_map(|held| ReleaseOp::Share { held }),
        4 => (0..16usize).prop_map(|held| ReleaseOp::Release { held }),
        3 => Just(ReleaseOp::Tick),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn released_pages_are_never_in_use(
        chunks in 1..24usize,
        pages_per_chunk in 1..3usize,
        reserve in 0..6usize,
        idle_ticks in 0..4u32,
        ops in prop::collection::vec(release_op(), 1..max_ops()),
    ) {
        // Chunks of whole pages, so `release_idle` gives chunk pages back one by one too.
        let chunk_size = 4096 * pages_per_chunk;
        let config = PoolConfig::new()
            .with_chunk_size(chunk_size)
            .with_chunk_count(chunks)
            .with_segments_per_chunk(1)
            .with_warm_reserve(reserve * chunk_size)
            .with_idle_ticks(idle_ticks);
        let mut pool = Pool::new(Budget::new(usize::MAX), config).unwrap();
        prop_assert_eq!(pool.resident_bytes(), 0, "a new pool has touched nothing");
        // Each held reference with the bytes its chunk must hold.
        let mut held: Vec<(ChunkId, Vec<u8>)> = Vec::new();
        let mut quiet = 0u32;
        let mut used_since_tick = false;
        for op in ops {
            match op {
                ReleaseOp::Alloc { seed } => {
                    used_since_tick = true;
                    match pool.alloc() {
                        Ok(id) => {
                            // A chunk fresh from any list may hold anything; write its start.
                            let bytes = pattern(64.min(chunk_size), seed);
                            prop_assert_eq!(pool.append(&id, &bytes), bytes.len());
                            held.push((id, bytes));
                        }
                        Err(e) => {
                            prop_assert_eq!(e, PoolError::ChunksExhausted);
                            prop_assert_eq!(pool.chunks_in_use(), chunks);
                        }
                    }
                }
                ReleaseOp::Write { held: i, len } => {
                    if !held.is_empty() {
                        let k = i % held.len();
                        let index = held[k].0.index();
                        let more = pattern(len, held[k].1.len() as u8);
                        let n = pool.append(&held[k].0, &more);
                        // A shared chunk's bytes are the same through every reference.
                        for (id, bytes) in held.iter_mut() {
                            if id.index() == index {
                                bytes.extend_from_slice(&more[..n]);
                            }
                        }
                    }
                }
                ReleaseOp::Share { held: i } => {
                    if !held.is_empty() {
                        let (id, bytes) = &held[i % held.len()];
                        let copy = pool.share(id).unwrap();
                        let bytes = bytes.clone();
                        held.push((copy, bytes));
                    }
                }
                ReleaseOp::Release { held: i } => {
                    if !held.is_empty() {
                        let (id, _) = held.swap_remove(i % held.len());
                        pool.release(id);
                    }
                }
                ReleaseOp::Tick => {
                    let resident = pool.chunks_resident();
                    let released = pool.release_idle();
                    prop_assert!(released.chunks <= resident);
                    // The reserve stays warm while the pool is in use.
                    if pool.chunks_in_use() > 0 {
                        prop_assert!(pool.chunks_resident() >= pool.chunks_in_use() + reserve.min(resident - pool.chunks_in_use()));
                    }
                    quiet = if pool.chunks_in_use() == 0 && !used_since_tick && held.is_empty() { quiet + 1 } else { 0 };
                    if idle_ticks > 0 && quiet >= idle_ticks {
                        prop_assert_eq!(pool.resident_bytes(), 0, "quiet long enough: everything back");
                    }
                    used_since_tick = !held.is_empty();
                }
            }
            for (id, bytes) in &held {
                prop_assert_eq!(pool.bytes(id), &bytes[..], "chunk {} lost its bytes", id.index());
            }
            let handles: Vec<&ChunkId> = held.iter().map(|(id, _)| id).collect();
            pool.audit([], &handles);
        }
        for (id, _) in held.drain(..) {
            pool.release(id);
        }
        pool.audit([], &[]);
        // Whatever happened, quiet ticks give everything back and the pool works again.
        if idle_ticks > 0 {
            for _ in 0..=idle_ticks {
                pool.release_idle();
            }
            prop_assert_eq!(pool.resident_bytes(), 0);
            prop_assert_eq!(pool.chunks_resident(), 0);
            let id = pool.alloc().unwrap();
            prop_assert_eq!(id.index(), 0, "a reset pool starts again at chunk 0");
            pool.release(id);
        }
    }
}
