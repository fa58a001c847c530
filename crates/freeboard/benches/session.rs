//! The server session's per-message path without a socket: one read of 64 pipelined masked
//! frames parsed and unmasked in place, each echoed as the `Echo` handler does, the replies
//! queued and written. Reported per message.
//!
//! ```text
//! cargo bench -p freeboard --bench session
//! ```

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use freeboard::session_bench::EchoSession;

fn echo(c: &mut Criterion) {
    let mut group = c.benchmark_group("session echo");
    for (name, size) in [("64B", 64), ("1KiB", 1024)] {
        let mut session = EchoSession::new(size, 64);
        group.throughput(Throughput::Elements(session.messages() as u64));
        group.bench_function(name, |b| b.iter(|| black_box(session.round())));
    }
    group.finish();
}

criterion_group!(benches, echo);
criterion_main!(benches);
