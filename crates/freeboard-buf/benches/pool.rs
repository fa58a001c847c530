//! The pool beside the system allocator, in the same run.
//!
//! - `alloc_free`: one chunk alloc + free against `Vec<u8>` of the same size; and 64 held at
//!   once, then freed (so the allocator cannot just hand back the block it was given).
//! - `append_consume`: 64 messages (2-byte header + payload) queued then written out, as a
//!   [`ChunkChain`], as a [`SendQueue`], and as a `VecDeque<Vec<u8>>` of one `Vec` per message.
//! - `share_release`: the local reference count (`Pool::share`, `Frame::share`) against
//!   `Arc<[u8]>` clone + drop, and a 100-subscriber fan-out of one frame against
//!   `VecDeque<Arc<[u8]>>` queues.
//! - `release`: what giving memory back costs — `Pool::release_idle` on a steady pool (nothing
//!   to give back), and 64 chunks given back (`madvise`) then taken and written again (a page
//!   fault each), per chunk.
#![allow(missing_docs)]

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use freeboard_buf::{
    Budget, ChunkChain, Frame, Pool, PoolConfig, PushOutcome, SendQueue, SlowConsumerPolicy,
    Watermarks,
};

const CHUNK: usize = 4096;
const BATCH: usize = 64;
const SUBSCRIBERS: usize = 100;

fn pool(chunks: usize) -> Pool<'static> {
    let config = PoolConfig::new().with_chunk_size(CHUNK).with_chunk_count(chunks);
    Pool::new(Budget::new(usize::MAX), config).unwrap()
}

fn alloc_free(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free");
    let mut p = pool(BATCH);
    group.bench_function("pool_chunk_4096", |b| {
        b.iter(|| {
            let id = p.alloc().unwrap();
            p.release(black_box(id));
        })
    });
    group.bench_function("vec_4096", |b| {
        b.iter(|| {
            let v: Vec<u8> = Vec::with_capacity(CHUNK);
            drop(black_box(v));
        })
    });
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("pool_chunk_4096_x64_held", |b| {
        let mut held = Vec::with_capacity(BATCH);
        b.iter(|| {
            for _ in 0..BATCH {
                held.push(p.alloc().unwrap());
            }
            for id in held.drain(..) {
                p.release(black_box(id));
            }
        })
    });
    group.bench_function("vec_4096_x64_held", |b| {
        let mut held: Vec<Vec<u8>> = Vec::with_capacity(BATCH);
        b.iter(|| {
            for _ in 0..BATCH {
                held.push(black_box(Vec::with_capacity(CHUNK)));
            }
            held.clear();
        })
    });
    group.finish();
}

/// Gathers a writev's worth of slices from `queue` and drops them: what the runtime does.
fn vecdeque_write_all(queue: &mut VecDeque<Vec<u8>>) -> usize {
    let mut written = 0;
    while !queue.is_empty() {
        let mut iov = [&[][..]; 64];
        let n = iov.len().min(queue.len());
        for (slot, msg) in iov.iter_mut().zip(queue.iter()) {
            *slot = msg.as_slice();
        }
        let bytes: usize = black_box(&iov[..n]).iter().map(|s| s.len()).sum();
        written += bytes;
        queue.drain(..n);
    }
    written
}

fn append_consume(c: &mut Criterion) {
    let mut group = c.benchmark_group("append_consume");
    for size in [64usize, 1024, 16384] {
        let header = [0x82u8, 0x7e];
        let payload = vec![0xa5u8; size - header.len()];
        group.throughput(Throughput::Bytes((size * BATCH) as u64));
        let mut p = pool(BATCH * size / CHUNK + 2 * BATCH);

        group.bench_with_input(BenchmarkId::new("chunk_chain", size), &size, |b, _| {
            let mut chain = ChunkChain::new();
            b.iter(|| {
                for _ in 0..BATCH {
                    chain.append(&mut p, &header).unwrap();
                    chain.append(&mut p, &payload).unwrap();
                }
                while !chain.is_empty() {
                    let mut iov = [&[][..]; 64];
                    let n = chain.slices(&p, &mut iov);
                    let bytes: usize = black_box(&iov[..n]).iter().map(|s| s.len()).sum();
                    chain.consume(&mut p, bytes);
                }
            })
        });
        group.bench_with_input(BenchmarkId::new("send_queue", size), &size, |b, _| {
            let marks =
                Watermarks::new(Watermarks::MAX_CAP, Watermarks::MAX_CAP, Watermarks::MAX_CAP)
                    .unwrap();
            let mut queue = SendQueue::new(marks, SlowConsumerPolicy::Close);
            b.iter(|| {
                for _ in 0..BATCH {
                    let pushed = queue.push_message(&mut p, &[&header, &payload]);
                    assert_eq!(black_box(pushed).outcome, PushOutcome::Queued);
                }
                while !queue.is_empty() {
                    let mut iov = [&[][..]; 64];
                    let n = queue.slices(&p, &mut iov);
                    let bytes: usize = black_box(&iov[..n]).iter().map(|s| s.len()).sum();
                    let _ = queue.consume(&mut p, bytes);
                }
            })
        });
        group.bench_with_input(BenchmarkId::new("vecdeque_vec", size), &size, |b, _| {
            let mut queue: VecDeque<Vec<u8>> = VecDeque::with_capacity(BATCH);
            b.iter(|| {
                for _ in 0..BATCH {
                    let mut msg = Vec::with_capacity(header.len() + payload.len());
                    msg.extend_from_slice(&header);
                    msg.extend_from_slice(&payload);
                    queue.push_back(msg);
                }
                black_box(vecdeque_write_all(&mut queue));
            })
        });
    }
    group.finish();
}

fn share_release(c: &mut Criterion) {
    let mut group = c.benchmark_group("share_release");
    let mut p = pool(SUBSCRIBERS + 4);
    let msg = vec![0x5au8; 256];

    let chunk = p.alloc().unwrap();
    p.append(&chunk, &msg);
    group.bench_function("pool_chunk_refcount", |b| {
        b.iter(|| {
            let other = p.share(black_box(&chunk)).unwrap();
            p.release(black_box(other));
        })
    });
    let frame = Frame::from_parts(&mut p, &[&msg]).unwrap();
    group.bench_function("pool_frame", |b| {
        b.iter(|| {
            let other = frame.share(&mut p).unwrap();
            other.release(&mut p);
        })
    });
    let arc: Arc<[u8]> = Arc::from(&msg[..]);
    group.bench_function("arc_clone_drop", |b| {
        b.iter(|| {
            let other = Arc::clone(black_box(&arc));
            drop(black_box(other));
        })
    });

    group.throughput(Throughput::Elements(SUBSCRIBERS as u64));
    group.bench_function("fanout_100_send_queues", |b| {
        let mut queues: Vec<SendQueue> = (0..SUBSCRIBERS).map(|_| SendQueue::default()).collect();
        b.iter(|| {
            for queue in &mut queues {
                let pushed = queue.push_frame(&mut p, &frame);
                assert_eq!(black_box(pushed).outcome, PushOutcome::Queued);
            }
            for queue in &mut queues {
                let len = queue.len();
                black_box(queue.segments(&p).next());
                let _ = queue.consume(&mut p, len);
            }
        })
    });
    group.bench_function("fanout_100_vecdeque_arc", |b| {
        let mut queues: Vec<VecDeque<Arc<[u8]>>> =
            (0..SUBSCRIBERS).map(|_| VecDeque::with_capacity(4)).collect();
        b.iter(|| {
            for queue in &mut queues {
                queue.push_back(Arc::clone(&arc));
            }
            for queue in &mut queues {
                black_box(queue.front().map(|m| m.len()));
                drop(queue.pop_front());
            }
        })
    });
    group.finish();
    frame.release(&mut p);
    p.release(chunk);
}

fn release(c: &mut Criterion) {
    let mut group = c.benchmark_group("release");
    let config =
        PoolConfig::new().with_chunk_size(CHUNK).with_chunk_count(1024).with_warm_reserve(0);
    let mut p = Pool::new(Budget::new(usize::MAX), config).unwrap();
    let mut held = Vec::with_capacity(BATCH);
    // A steady pool: the same 64 chunks every interval, so a tick finds nothing to give back.
    group.bench_function("release_idle_steady", |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                held.push(p.alloc().unwrap());
            }
            for id in held.drain(..) {
                p.release(id);
            }
            black_box(p.release_idle())
        })
    });
    group.throughput(Throughput::Elements(BATCH as u64));
    // Each round: 64 chunks taken from the cold list and written (one page fault each), freed,
    // and given back by the next quiet tick (runs of adjacent chunks, one madvise each).
    group.bench_function("give_back_and_fault_in_x64", |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                let id = p.alloc().unwrap();
                p.spare_mut(&id)[0] = 1;
                held.push(id);
            }
            for id in held.drain(..) {
                p.release(id);
            }
            p.release_idle(); // the interval that used them
            black_box(p.release_idle()) // a quiet one: they go
        })
    });
    // The same with the chunks scattered (every other one), so each is its own madvise: 64
    // given back while 64 others are in use, then those 64.
    group.throughput(Throughput::Elements(2 * BATCH as u64));
    group.bench_function("give_back_scattered_and_fault_in_x128", |b| {
        let mut spacers = Vec::with_capacity(BATCH);
        b.iter(|| {
            for _ in 0..BATCH {
                let id = p.alloc().unwrap();
                p.spare_mut(&id)[0] = 1;
                held.push(id);
                spacers.push(p.alloc().unwrap());
            }
            for id in held.drain(..) {
                p.release(id);
            }
            p.release_idle();
            black_box(p.release_idle());
            for id in spacers.drain(..) {
                p.release(id);
            }
            p.release_idle();
            black_box(p.release_idle())
        })
    });
    group.finish();
}

criterion_group!(benches, alloc_free, append_consume, share_release, release);
criterion_main!(benches);
