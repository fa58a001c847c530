//! The loop's sweep of its subscribers' lag (see [`lag`](crate::lag) for why it is spread over
//! turns): it moves the loop's [`LagSweep`](crate::lag::LagSweep) cursor over the connection
//! table, keeps the largest queues seen so far and the distribution, and reports them to the
//! [`LagBoard`](crate::lag::LagBoard) when the cursor passes the end of the table.

use freeboard_proto::Instant;

use super::event_loop::EventLoop;
use crate::lag::{SLOWEST, SWEEP_INTERVAL, SWEEP_STEP, SlowSubscriber, TOPICS_SHOWN};
use crate::session::Phase;
use crate::transport::Transport;

impl<T: Transport> EventLoop<T> {
    /// Sweeps at most [`SWEEP_STEP`] slots of the connection table; starts a sweep if the last
    /// began [`SWEEP_INTERVAL`] ago, reports one that reached the end.
    pub(super) fn sweep_lag(&mut self, now: Instant) {
        let sweep = &mut self.sweep;
        let cursor = match sweep.cursor {
            Some(cursor) => cursor,
            None if sweep.started.is_none_or(|at| now >= at + SWEEP_INTERVAL) => {
                sweep.started = Some(now);
                0
            }
            None => return,
        };
        let step_began = std::time::Instant::now();
        let now_ms = now.as_millis() as u32;
        let end = (cursor + SWEEP_STEP).min(self.conns.capacity());
        for token in cursor..end {
            let Some(entry) = self.conns.get(token) else { continue };
            if !matches!(entry.session.phase, Phase::Open(_)) {
                continue;
            }
            // A topic route's connections subscribe; on other routes a handler may have
            // subscribed it (a hash look-up, so asked only there).
            let subscribes = self.router.options(entry.route as usize).subscribes;
            if !subscribes && self.topics.topics_of(token).next().is_none() {
                continue; // not a subscriber
            }
            let bytes = entry.session.buffered();
            sweep.lag.observe(bytes as u64, u64::from(unsent_for(entry.queued_at, now_ms)));
            let slowest = &mut sweep.slowest;
            if bytes > 0 && (slowest.len() < SLOWEST || slowest[SLOWEST - 1].0 < bytes) {
                let at = slowest.partition_point(|s| s.0 >= bytes);
                slowest.insert(at, (bytes, token, entry.serial));
                slowest.truncate(SLOWEST);
            }
        }
        sweep.lag.steps += 1;
        if end < self.conns.capacity() {
            sweep.cursor = Some(end);
            let step = step_began.elapsed().as_micros() as u64;
            sweep.lag.longest_step_us = sweep.lag.longest_step_us.max(step);
            return;
        }
        // The end of the table: the records of the slowest, as they are now.
        let wall_ms = crate::metrics::now_ms();
        let mut lag = std::mem::take(&mut sweep.lag);
        let started = sweep.started.unwrap_or(now);
        lag.took_ms = now.as_millis().saturating_sub(started.as_millis());
        lag.swept_at_ms = wall_ms;
        sweep.cursor = None;
        sweep.started = Some(now);
        for (_, token, serial) in std::mem::take(&mut sweep.slowest) {
            let Some(entry) = self.conns.get(token).filter(|e| e.serial == serial) else {
                continue; // gone since
            };
            let queue = entry.session.queue();
            let age = unsent_for(entry.queued_at, now_ms);
            let mut topics = self.topics.topic_names_of(token);
            let shown: Vec<_> = topics.by_ref().take(TOPICS_SHOWN).cloned().collect();
            lag.slowest.push(SlowSubscriber {
                id: format!("{}.{token}.{serial}", self.index),
                peer: entry.peer,
                subject: self.subjects.get(&token).cloned(),
                path: self.router.path(entry.route as usize).to_owned(),
                policy: queue.policy(),
                queue_bytes: entry.session.buffered(),
                queued_messages: queue.messages(),
                unsent_since_ms: wall_ms.saturating_sub(u64::from(age)),
                high_watermark: queue.watermarks().high(),
                cap: queue.watermarks().cap(),
                writable: queue.is_writable(),
                compressed: entry.session.shared_compression().is_some(),
                topic_count: shown.len() + topics.count(),
                topics: shown,
            });
        }
        lag.slowest.sort_by_key(|s| std::cmp::Reverse(s.queue_bytes));
        let step = step_began.elapsed().as_micros() as u64;
        lag.longest_step_us = lag.longest_step_us.max(step);
        self.shared.metrics.lag.report(self.index, lag);
    }
}

/// How long a queue has held unsent bytes, in ms: `queued_at` is when it got its first byte,
/// in the loop's milliseconds plus one (0: empty), as the end of the turn keeps it.
fn unsent_for(queued_at: u32, now_ms: u32) -> u32 {
    match queued_at {
        0 => 0,
        at => now_ms.wrapping_sub(at - 1),
    }
}
