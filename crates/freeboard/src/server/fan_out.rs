//! The loop's side of pub/sub: fanning out its own handlers' publishes and the publications
//! other loops sent to its inbox, by reference, to its subscribers' sessions.

use freeboard_buf::{Frame, Pool, PushOutcome, SlowConsumerPolicy};
use freeboard_proto::Instant;

use super::event_loop::{EventLoop, loop_context};
use crate::metrics::LoopStats;
use crate::session::Session;
use crate::session::deflate::{Codec, NoMemory};
use crate::topics::{Outbox, Reach};
use crate::transport::{Io, Transport};

impl<T: Transport> EventLoop<T> {
    /// Fans out this loop's own publishes, in publish order; their reach. Each run of
    /// publications to one topic goes out subscriber by subscriber: a subscriber's entry and
    /// queue are touched once per run, not once per message.
    pub(super) fn fan_out_outbox(&mut self, now: Instant) -> Reach {
        let mut reach = Reach::default();
        if self.fanning_out {
            return reach; // the outer call picks them up after the publishes before them
        }
        self.fanning_out = true;
        while !self.outbox.is_empty() {
            let mut batch = std::mem::take(&mut self.outbox_spare);
            std::mem::swap(&mut batch, &mut self.outbox);
            let mut first = 0;
            for run in batch.publications.chunk_by(|a, b| a.0 == b.0) {
                let frames = run.iter().map(|(_, frame)| frame);
                reach += self.fan_out(now, &run[0].0, frames, Some((&batch, first)));
                first += run.len();
            }
            batch.clear(&mut self.pool);
            self.outbox_spare = batch;
        }
        self.fanning_out = false;
        reach
    }

    /// Takes the publications other threads sent, each copied once into this loop's pool and
    /// fanned out by reference.
    pub(super) fn drain_inbox(&mut self, now: Instant) {
        self.shared.hub.begin_drain(self.index);
        while let Some(publication) = self.shared.hub.receive(self.index, &self.inbox) {
            let Some(subscribers) = self.topics.subscribers(&publication.topic) else {
                // The last subscriber left after the publisher looked.
                if let Some(receipt) = &publication.receipt {
                    receipt.report(0, 0);
                }
                continue;
            };
            let reach = match publication.frame.to_frame(&mut self.pool) {
                Ok(frame) => {
                    let frames = std::iter::once(&frame);
                    let reach = self.fan_out(now, &publication.topic, frames, None);
                    frame.release(&mut self.pool);
                    reach
                }
                Err(_) => {
                    self.shared.metrics.topic_drop("pool");
                    Reach { delivered: 0, dropped: subscribers.len() as u64 }
                }
            };
            if let Some(receipt) = &publication.receipt {
                receipt.report(reach.delivered, reach.dropped);
            }
        }
    }

    /// Queues `frames` (publications to `topic`, in order) by reference to every open
    /// subscriber of `topic` on this loop, one subscriber at a time; each subscriber's policy
    /// decides alone what happens when its queue is full. From the outbox (`from`: it and the
    /// index of the first frame in it), a connection gets exactly the publications made while
    /// it was subscribed. A subscriber that compresses without server context takeover gets
    /// each publication compressed once for all of them (per window size), built when the
    /// first of them is met.
    fn fan_out<'f>(
        &mut self,
        now: Instant,
        topic: &str,
        frames: impl Iterator<Item = &'f Frame> + Clone,
        from: Option<(&Outbox, usize)>,
    ) -> Reach {
        let mut reach = Reach::default();
        let changed = from.filter(|(outbox, _)| outbox.changed(topic));
        let subscribers = self.topics.subscribers(topic).into_iter().flatten().map(|(_, t)| *t);
        let leavers = changed.into_iter().flat_map(|(outbox, _)| outbox.leavers(topic));
        let mut changes = std::mem::take(&mut self.changes);
        let mut compressed = std::mem::take(&mut self.compressed);
        for token in subscribers.chain(leavers) {
            // NOTE: a connection's subscriptions go before its slab entry does; one that
            // left the topic may have closed since.
            let Some(entry) = self.conns.get_mut(token) else { continue };
            let idle = !entry.dirty && entry.session.buffered() == 0;
            let policy = entry.session.queue().policy();
            let compression = entry.session.shared_compression();
            for (i, frame) in frames.clone().enumerate() {
                if let Some((outbox, first)) = changed
                    && !outbox.subscribed_at(token, topic, first + i)
                {
                    continue;
                }
                let frame = match compression {
                    Some(bits) => {
                        if compressed.len() <= i {
                            compressed.resize_with(i + 1, Compressed::default);
                        }
                        compressed[i]
                            .get(bits, frame, &mut self.codec, &mut self.pool, &mut self.stats)
                            .unwrap_or(frame)
                    }
                    None => frame,
                };
                let mut cx = loop_context!(self, now, None);
                let Some(outcome) = entry.session.send_frame(&mut cx, frame) else { break };
                match outcome {
                    PushOutcome::WouldBlock { .. } if policy == SlowConsumerPolicy::Block => {
                        // A publisher cannot be paused for one subscriber: the message is
                        // dropped.
                        self.stats.policy_drops[SlowConsumerPolicy::Block] += 1;
                        reach.dropped += 1;
                    }
                    PushOutcome::MustClose { .. } => {
                        self.shared.metrics.slow_consumer_closes.inc();
                        reach.dropped += 1;
                    }
                    outcome => {
                        let queued = self.stats.count_send(outcome, policy);
                        self.stats.deliveries += queued;
                        reach.delivered += queued;
                        reach.dropped += 1 - queued;
                    }
                }
            }
            // A subscriber with nothing else to send this turn gets the run now, in one write
            // (as a raw TCP fan-out does): its segments go back while still in the cache, and
            // the end of the turn has nothing left to do for it.
            let (written, sent) = match idle {
                true => {
                    let metrics = &self.shared.metrics;
                    let mut io = Io { pool: &mut self.pool, tls: &mut self.tls, metrics };
                    write_now(&mut entry.stream, &mut entry.session, &mut io)
                }
                false => (0, false),
            };
            self.stats.bytes_out += written as u64;
            if sent {
                self.stats.queue_drained(0);
            }
            if let Some(change) = entry.session.take_writability() {
                changes.push((token, change));
            }
            if !sent && !entry.dirty {
                entry.dirty = true;
                self.dirty.push(token);
            }
        }
        for c in compressed.drain(..) {
            c.release(&mut self.pool);
        }
        self.compressed = compressed;
        for (token, change) in changes.drain(..) {
            if self.conns.contains(token) {
                self.writability_changed(token, now, change);
            }
        }
        self.changes = changes;
        reach
    }
}

/// Writes a plain TCP connection's queue now (one write); the bytes written and whether that
/// emptied it. Nothing queued (the connection is closing) is the end of the turn's to handle,
/// and so is a failed write, which it meets again and closes the connection.
fn write_now<T: Transport>(
    stream: &mut T,
    session: &mut Session,
    io: &mut Io<'_>,
) -> (usize, bool) {
    if stream.tls_established().is_some() || session.buffered() == 0 {
        return (0, false); // (a TLS layer's own pending records are the flush's to write)
    }
    match stream.write_queue(session, io) {
        Ok((written, _)) => (written, session.buffered() == 0),
        Err(_) => (0, false),
    }
}

/// One publication's compressed frames in one fan-out, by window bits − 9 (nearly always
/// one: 15 bits, unless a client asked for a smaller window).
#[derive(Default)]
pub(super) struct Compressed([Option<Option<Frame>>; 7]);

impl Compressed {
    /// The frame compressed for a `bits` window, compressed on first use; `None` when the
    /// publication goes uncompressed (under the threshold, or the budget could not cover
    /// it: counted, and the subscriber gets the uncompressed frame, always valid).
    fn get(
        &mut self,
        bits: u8,
        frame: &Frame,
        codec: &mut Codec,
        pool: &mut Pool<'static>,
        stats: &mut LoopStats,
    ) -> Option<&Frame> {
        let slot = &mut self.0[usize::from(bits.clamp(9, 15) - 9)];
        slot.get_or_insert_with(|| match codec.compress_frame(pool, frame, bits) {
            Ok(compressed) => {
                stats.compressions += u64::from(compressed.is_some());
                compressed
            }
            Err(NoMemory) => {
                stats.compression_fallbacks += 1;
                None
            }
        })
        .as_ref()
    }

    fn release(self, pool: &mut Pool<'static>) {
        for frame in self.0.into_iter().flatten().flatten() {
            frame.release(pool);
        }
    }
}
