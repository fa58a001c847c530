//! Zero-copy fan-out with bounded memory: one publisher, a thousand subscribers, a fifth of
//! them slow. Each published frame is written once into the pool; every subscriber's queue holds
//! a reference. Slow subscribers hit their cap and their policy decides; the counters say what
//! happened, and memory never passes the budget.
//!
//! `cargo run -p freeboard-buf --example broadcast`

use freeboard_buf::{
    Budget, Frame, Pool, PoolConfig, PushOutcome, SendQueue, SlowConsumerPolicy, Watermarks,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut pool = Pool::new(Budget::new(8 << 20), PoolConfig::new())?;
    let marks = Watermarks::new(8 << 10, 16 << 10, 64 << 10)?;
    let mut subscribers: Vec<SendQueue> = (0..1000)
        .map(|i| {
            let policy = if i % 2 == 0 {
                SlowConsumerPolicy::DropOldest
            } else {
                SlowConsumerPolicy::Conflate
            };
            SendQueue::new(marks, policy)
        })
        .collect();

    let payload = vec![b'x'; 1000];
    for tick in 0..600u32 {
        // One frame per tick: header + payload, framed once.
        let header = [0x81, 126, (payload.len() >> 8) as u8, payload.len() as u8];
        let frame = Frame::from_parts(&mut pool, &[&header, &payload])?;
        for queue in &mut subscribers {
            match queue.push_frame(&mut pool, &frame).outcome {
                PushOutcome::Queued
                | PushOutcome::QueuedAboveHigh
                | PushOutcome::Dropped { .. } => {}
                other => unreachable!("drop policies never answer {other:?}"),
            }
        }
        frame.release(&mut pool);

        // The sockets: fast subscribers take everything, slow ones 300 bytes a tick.
        for (i, queue) in subscribers.iter_mut().enumerate() {
            let n = if i % 5 == 0 { 300 } else { usize::MAX };
            let _ = queue.consume(&mut pool, n);
        }
        if tick % 100 == 0 {
            let c = pool.counters();
            println!(
                "tick {tick:3}: chunks {}/{} in use (high water {}), segments {}/{}",
                c.chunks_in_use,
                c.chunks_total,
                c.chunks_high_water,
                c.segments_in_use,
                c.segments_total
            );
        }
    }

    let c = pool.counters();
    println!("budget: {} of {} bytes drawn", c.budget_drawn, c.budget_limit);
    for policy in SlowConsumerPolicy::ALL {
        let d = c.dropped(policy);
        if d.messages > 0 {
            println!("{policy}: dropped {} messages, {} bytes", d.messages, d.bytes);
        }
    }
    println!(
        "allocation failures: {}, fragmentation index: {}",
        c.allocation_failures,
        c.fragmentation_index()
    );
    for queue in &mut subscribers {
        let _ = queue.clear(&mut pool);
    }
    assert_eq!(pool.chunks_in_use(), 0);
    Ok(())
}
