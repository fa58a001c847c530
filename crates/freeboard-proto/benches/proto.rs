//! Micro-benchmarks of the protocol core, each beside its plain reference:
//! masking (fast path vs byte loop), header parsing, UTF-8 validation (streaming validator vs
//! `core::str::from_utf8`), and reading 64-byte frames through a server connection.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use freeboard_proto::mask::{apply_mask, apply_mask_reference};
use freeboard_proto::utf8::Utf8Validator;
use freeboard_proto::{Config, Connection, FrameHeader, Instant, OpCode, Role};

const KEY: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

fn masking(c: &mut Criterion) {
    let mut group = c.benchmark_group("mask");
    for size in [64usize, 1024, 65536] {
        let mut data = vec![0xa5u8; size + 1];
        group.throughput(Throughput::Bytes(size as u64));
        // Offset by one byte so the fast path handles an unaligned head.
        group.bench_with_input(BenchmarkId::new("fast", size), &size, |b, _| {
            b.iter(|| apply_mask(black_box(&mut data[1..]), KEY, 1))
        });
        group.bench_with_input(BenchmarkId::new("reference", size), &size, |b, _| {
            b.iter(|| apply_mask_reference(black_box(&mut data[1..]), KEY, 1))
        });
    }
    group.finish();
}

fn header_parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("header_parse");
    for (name, len) in [("7-bit", 100u64), ("16-bit", 1000), ("64-bit", 1 << 20)] {
        let mut bytes = [0u8; 14];
        let header = FrameHeader {
            fin: true,
            rsv: 0,
            opcode: OpCode::Binary,
            mask: Some(KEY),
            payload_len: len,
        };
        let n = header.encode(&mut bytes).unwrap();
        group.bench_function(name, |b| b.iter(|| FrameHeader::parse(black_box(&bytes[..n]))));
    }
    group.finish();
}

fn utf8(c: &mut Criterion) {
    let mut group = c.benchmark_group("utf8");
    let ascii = "The quick brown fox jumps over the lazy dog. ".repeat(1500);
    let mixed = "Grüße, κόσμε, こんにちは, 🦀 and plain ASCII too. ".repeat(900);
    for (name, text) in [("ascii", ascii.as_bytes()), ("mixed", mixed.as_bytes())] {
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function(BenchmarkId::new("streaming", name), |b| {
            b.iter(|| Utf8Validator::new().feed(black_box(text), true))
        });
        group.bench_function(BenchmarkId::new("streaming-4k-chunks", name), |b| {
            b.iter(|| {
                let mut v = Utf8Validator::new();
                let chunks = text.chunks(4096);
                let last = chunks.len() - 1;
                chunks.enumerate().try_for_each(|(i, chunk)| v.feed(black_box(chunk), i == last))
            })
        });
        group.bench_function(BenchmarkId::new("core", name), |b| {
            b.iter(|| core::str::from_utf8(black_box(text)))
        });
    }
    group.finish();
}

/// A read buffer full of masked 64-byte binary frames, parsed and unmasked in place.
fn read_frames(c: &mut Criterion) {
    let mut group = c.benchmark_group("read_frames");
    let frame_count = 1000;
    let mut wire = Vec::new();
    for _ in 0..frame_count {
        let header = FrameHeader {
            fin: true,
            rsv: 0,
            opcode: OpCode::Binary,
            mask: Some(KEY),
            payload_len: 64,
        };
        let mut h = [0u8; 14];
        let n = header.encode(&mut h).unwrap();
        wire.extend_from_slice(&h[..n]);
        wire.extend_from_slice(&[0x5a; 64]);
    }
    group.throughput(Throughput::Elements(frame_count));
    group.bench_function("64B-masked", |b| {
        let mut buf = wire.clone();
        b.iter(|| {
            buf.copy_from_slice(&wire);
            let mut conn = Connection::new(Role::Server, Config::default(), Instant::default());
            let mut at = 0;
            let mut bytes = 0;
            while at < buf.len() {
                let input = conn.handle_input(Instant::default(), &mut buf[at..]).unwrap();
                at += input.consumed;
                bytes += input.payload.map_or(0, |p| p.data.len());
            }
            black_box(bytes)
        })
    });
    group.finish();
}

criterion_group!(benches, masking, header_parse, utf8, read_frames);
criterion_main!(benches);
