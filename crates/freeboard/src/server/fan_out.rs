//! The loop's side of pub/sub: fanning out its own handlers' publishes and the publications
//! other loops sent to its inbox, by reference, to its subscribers' sessions.

use freeboard_buf::{Frame, PushOutcome, SlowConsumerPolicy};
use freeboard_proto::{Instant, MessageKind};

use super::compressed_copies::CompressedCopies;
use super::event_loop::{EventLoop, loop_context};
use crate::history::{Envelope, Offset, offset_in_frame};
use crate::session::event_copies::EventCopies;
use crate::session::events::Variant;
use crate::topic_series::Delivered;
use crate::topics::{Outbox, Published, Reach};
use crate::transport::{Transport, write_frames};

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

    /// Publishes from outside any handler (a [`LocalServer`](crate::LocalServer)'s caller):
    /// framed once for this loop's subscribers and fanned out now, once for the other loops
    /// and the backplane. What the loops took, and what this loop's subscribers made of it.
    pub(super) fn publish_here(
        &mut self,
        topic: &str,
        kind: MessageKind,
        payload: &[u8],
    ) -> (Published, Reach) {
        let hub = &self.shared.hub;
        let published =
            self.topics.publish(hub, &mut self.pool, &mut self.outbox, topic, kind, payload, None);
        // Queued only: the caller publishes many times between two flushes (a host's
        // callback), and each subscriber's queue then leaves in one `writev` at the flush
        // rather than one `write` per publication.
        self.write_straight = false;
        let reach = self.fan_out_outbox(self.now());
        self.write_straight = true;
        (published, reach)
    }

    /// Takes the publications other threads sent — those waiting when the drain began — each
    /// copied once into this loop's pool and fanned out by reference.
    pub(super) fn drain_inbox(&mut self, now: Instant) {
        let waiting = self.shared.hub.begin_drain(self.index);
        for _ in 0..waiting {
            let Some(publication) = self.shared.hub.receive(self.index, &self.inbox) else { break };
            if publication.ends_history {
                self.end_history(now, &publication.topic);
                continue;
            }
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

    /// Closes every subscriber of `topic` on this loop with
    /// [`HISTORY_GONE`](crate::history::HISTORY_GONE): the topic's history can no longer be
    /// vouched for, and they must not meet what comes next without being told.
    fn end_history(&mut self, now: Instant, topic: &str) {
        let tokens: Vec<usize> =
            self.topics.subscribers(topic).into_iter().flatten().map(|(_, t)| *t).collect();
        for token in tokens {
            if !self.conns.get(token).is_some_and(|e| e.session.is_open()) {
                continue;
            }
            let (entry, mut cx) = self.split(token, now);
            let why = "the topic's history was interrupted: resume with since, or start afresh";
            let _ = entry.session.close(&mut cx, crate::history::HISTORY_GONE, why);
            self.report_close(token);
            self.mark(token);
        }
    }

    /// Queues `frames` (publications to `topic`, in order) by reference to every open
    /// subscriber of `topic` on this loop, one subscriber at a time; each subscriber's policy
    /// decides alone what happens when its queue is full. From the outbox (`from`: it and the
    /// index of the first frame in it), a connection gets exactly the publications made while
    /// it was subscribed. A subscriber that compresses without server context takeover gets
    /// each publication compressed once for all of them (per window size), built when the
    /// first of them is met. An idle plain-TCP subscriber gets the frames written straight.
    fn fan_out<'f>(
        &mut self,
        now: Instant,
        topic: &str,
        frames: impl Iterator<Item = &'f Frame> + Clone,
        from: Option<(&Outbox, usize)>,
    ) -> Reach {
        let publications = frames.clone().count();
        // Room for every delivery before the first: the largest holders pay, not the
        // subscribers met last.
        let subscribed = self.topics.subscribers(topic).map_or(0, |s| s.len());
        self.make_room(now, subscribed * publications);
        let mut reach = Reach::default();
        let mut bytes = Delivered::default();
        let drops_before = self.stats.policy_drops;
        let changed = from.filter(|(outbox, _)| outbox.changed(topic));
        let subscribers = self.topics.subscribers(topic).into_iter().flatten().map(|(_, t)| *t);
        let leavers = changed.into_iter().flat_map(|(outbox, _)| outbox.leavers(topic));
        let mut changes = std::mem::take(&mut self.changes);
        let mut compressed = std::mem::take(&mut self.compressed);
        let mut events = std::mem::take(&mut self.event_copies);
        // Delta subscribers get the whole message or the delta, each made once here.
        let mut deltas = std::mem::take(&mut self.delta_copies);
        let delta_topic = self.topics.deltas.has_topic(topic);
        if delta_topic {
            let (pool, stats) = (&mut self.pool, &mut self.stats);
            self.topic_deltas.make(topic, frames.clone(), pool, &mut deltas, stats);
        } else if self.topic_deltas.keeps(topic) {
            self.topic_deltas.retire(topic, &mut self.pool);
        }
        // Filled whole for each delta subscriber; others ignore it.
        let mut plan = std::mem::take(&mut self.delta_plan);
        let history = self.shared.hub.envelope_room(topic) > 0;
        plan.clear();
        plan.resize(publications, false);
        // The frames' offsets, read only if a subscriber was just sent a replay.
        let offsets: Vec<Option<Offset>> = match self.topics.any_resumed() {
            true => frames.clone().map(|f| offset_of(f, &self.pool)).collect(),
            false => Vec::new(),
        };
        let mut resumed = Vec::new();
        for token in subscribers.chain(leavers) {
            // Sent by its replay already (the frame was in the inbox when it was read).
            let replayed = self.topics.resumed_through(token, topic);
            let sent_before = |i: usize| {
                replayed.is_some_and(|through| {
                    offsets[i]
                        .is_some_and(|o| o.epoch == through.epoch && o.position <= through.position)
                })
            };
            if replayed.is_some() && (0..publications).any(|i| !sent_before(i)) {
                resumed.push(token); // past its replay: no more to skip
            }
            let wants = |i: usize| {
                !sent_before(i)
                    && changed
                        .is_none_or(|(outbox, first)| outbox.subscribed_at(token, topic, first + i))
            };
            let wanted = (0..publications).filter(|&i| wants(i)).count() as u64;
            // NOTE: a connection's subscriptions go before its slab entry does; one that
            // left the topic may have closed since: what it was subscribed for is lost with it.
            let Some(entry) = self.conns.get_mut(token) else {
                self.stats.closed += wanted;
                reach.dropped += wanted;
                continue;
            };
            let idle = self.write_straight && !entry.dirty && entry.session.buffered() == 0;
            let policy = entry.session.queue().policy();
            // An event stream gets each publication framed as an event, made once per
            // variant; its `id:` is the offset of the topic a reconnect resumes (the first).
            let variant = entry.event_stream.map(|several| {
                // Looked up only where there are offsets to give.
                let resumes =
                    history && self.topics.first_topic_of(token).is_some_and(|f| *f == *topic);
                Variant { id: resumes, topic: several }
            });
            if let Some(variant) = variant {
                events.resize_with(events.len().max(publications), EventCopies::default);
                for (i, frame) in frames.clone().enumerate().filter(|(i, _)| wants(*i)) {
                    let scratch = &mut self.event_scratch;
                    events[i].make(variant, frame, topic, history, &mut self.pool, scratch);
                }
            }
            let compression = match variant {
                Some(_) => None,
                None => entry.session.shared_compression(),
            };
            // A delta subscriber (not an event stream: its events are text) and its plan for
            // the run if nothing is lost on the way: a delta wherever the one before went to
            // it, whole otherwise.
            let delta = match (delta_topic, variant) {
                (true, None) => self.topics.deltas.subscriber(token, topic),
                _ => None,
            };
            if let Some(subscriber) = delta {
                let mut base = subscriber.base.get();
                for (i, copies) in deltas.iter_mut().enumerate() {
                    let use_delta = wants(i) && copies.applies_to(base);
                    plan[i] = use_delta;
                    if wants(i) {
                        base = copies.get(use_delta, None).map(|_| copies.seq);
                        if let Some(bits) = compression {
                            let (codec, stats) = (&mut self.codec, &mut self.stats);
                            copies.compress(use_delta, bits, codec, &mut self.pool, stats);
                        }
                    }
                }
            }
            if let Some(bits) = compression.filter(|_| delta.is_none()) {
                compressed
                    .resize_with(compressed.len().max(publications), CompressedCopies::default);
                for (i, frame) in frames.clone().enumerate().filter(|(i, _)| wants(*i)) {
                    compressed[i].make(
                        bits,
                        frame,
                        &mut self.codec,
                        &mut self.pool,
                        &mut self.stats,
                    );
                }
            }
            // What this subscriber gets of publication `i`: compressed for it, as an event (if
            // the pool held it), its delta (`use_delta`) or whole in the delta envelope, or as
            // is.
            let as_sent = |i: usize, frame: &'f Frame, use_delta: bool| match (compression, variant)
            {
                (_, Some(variant)) => events[i].get(variant),
                (bits, None) if delta.is_some() => deltas[i].get(use_delta, bits),
                (Some(bits), None) => Some(compressed[i].get(bits).unwrap_or(frame)),
                (None, None) => Some(frame),
            };
            // With nothing else to send this turn, it gets the run written straight from the
            // shared frames, as a raw TCP fan-out does: its queue holds only what the socket
            // did not take, and the end of the turn has nothing to do for it. Only a run its
            // queue would take whole: once a frame's first byte is out, its rest is queued
            // whatever the policy says.
            let run_bytes = || {
                let wanted = frames.clone().enumerate().filter(|(i, _)| wants(*i));
                let sent = wanted.map(|(i, frame)| as_sent(i, frame, plan[i]).map(Frame::len));
                // An event the pool could not hold is dropped below: not a run to write.
                sent.sum::<Option<usize>>().unwrap_or(usize::MAX)
            };
            let straight = match entry.stream.plain() {
                Some(tcp)
                    if idle
                        && entry.session.is_open()
                        && entry
                            .session
                            .takes_whole(&loop_context!(self, now, None), run_bytes()) =>
                {
                    let wanted = frames.clone().enumerate().filter(|(i, _)| wants(*i));
                    let run = wanted.filter_map(|(i, frame)| as_sent(i, frame, plan[i]));
                    // A failed write is the end of the turn's to meet again, and close.
                    write_frames(tcp, &self.pool, run).unwrap_or(0)
                }
                _ => 0,
            };
            self.stats.bytes_out += straight as u64;
            let mut unsent = straight;
            // A delta subscriber's base as the run goes: the plan's while the frames were
            // written straight, then what each push makes of it.
            let mut base = delta.and_then(|s| s.base.get());
            let run = frames.clone().enumerate().filter(|(i, _)| wants(*i));
            for (taken, (i, frame)) in (0..).zip(run) {
                let use_delta = match delta {
                    Some(_) if unsent > 0 => plan[i],
                    // Only a delta its queue takes whole: one that its policy would make room
                    // for by dropping (or conflating) the message before it could not be
                    // applied, so it goes whole, and the policy acts on that.
                    Some(_) => {
                        deltas[i].applies_to(base)
                            && as_sent(i, frame, true).is_some_and(|d| {
                                let cx = loop_context!(self, now, None);
                                entry.session.takes_whole(&cx, d.len())
                            })
                    }
                    None => false,
                };
                let published = frame.len() as u64;
                let Some(frame) = as_sent(i, frame, use_delta) else {
                    // Its event (or delta copy) could not be framed: the pool is short, as for
                    // a queue.
                    self.stats.pool_exhausted += 1;
                    reach.dropped += 1;
                    base = None;
                    continue;
                };
                let seq = deltas.get(i).map_or(0, |c| c.seq);
                let outcome = if unsent >= frame.len() {
                    unsent -= frame.len();
                    PushOutcome::Queued // already written
                } else {
                    let mut cx = loop_context!(self, now, None);
                    let sent = match std::mem::take(&mut unsent) {
                        0 => entry.session.send_frame(&mut cx, frame),
                        part => entry.session.send_frame_rest(&mut cx, frame, part),
                    };
                    let Some(outcome) = sent else {
                        // Closing (or just torn down): this publication and the rest of the
                        // run are lost with the connection.
                        self.stats.closed += wanted - taken;
                        reach.dropped += wanted - taken;
                        break;
                    };
                    outcome
                };
                // The next delta may name this one only if it is on its way with nothing
                // before it lost: stored whole, or stored as a delta with no older message
                // dropped to make room.
                base = match outcome {
                    PushOutcome::Queued | PushOutcome::QueuedAboveHigh => Some(seq),
                    PushOutcome::Dropped { newest: false, .. } if !use_delta => Some(seq),
                    _ => None,
                };
                self.stats.delta_deliveries += u64::from(use_delta && base.is_some());
                match outcome {
                    PushOutcome::WouldBlock { .. } if policy == SlowConsumerPolicy::Block => {
                        // A publisher cannot be paused for one subscriber: the message is
                        // dropped.
                        self.stats.policy_drops[SlowConsumerPolicy::Block] += 1;
                        reach.dropped += 1;
                    }
                    PushOutcome::MustClose { messages, .. } => {
                        // This publication and the unsent ones the close discarded.
                        self.stats.policy_drops[SlowConsumerPolicy::Close] += u64::from(messages);
                        self.shared.metrics.slow_consumer_closes.inc();
                        reach.dropped += 1;
                    }
                    outcome => {
                        let queued = self.stats.count_send(outcome, policy);
                        self.stats.deliveries += queued;
                        reach.delivered += queued;
                        bytes.bytes_published += published * queued;
                        bytes.bytes_sent += frame.len() as u64 * queued;
                        reach.dropped += 1 - queued;
                    }
                }
            }
            if let Some(subscriber) = delta {
                subscriber.base.set(base);
            }
            if let Some(change) = entry.session.take_writability() {
                changes.push((token, change));
            }
            // Left for the end of the turn: what the socket did not take, and a connection
            // that is closing (or was just torn down).
            let done = entry.session.buffered() == 0 && entry.session.is_open();
            if !done && !entry.dirty {
                entry.dirty = true;
                self.dirty.push(token);
            }
        }
        for token in resumed {
            self.topics.forget_resumed(token);
        }
        for c in deltas.drain(..) {
            c.release(&mut self.pool);
        }
        self.delta_copies = deltas;
        self.delta_plan = plan;
        for c in compressed.drain(..) {
            c.release(&mut self.pool);
        }
        self.compressed = compressed;
        for e in events.drain(..) {
            e.release(&mut self.pool);
        }
        self.event_copies = events;
        for (token, change) in changes.drain(..) {
            if self.conns.contains(token) {
                self.writability_changed(token, now, change);
            }
        }
        self.changes = changes;
        let drops = self.stats.policy_drops.since(&drops_before);
        bytes.messages = reach.delivered;
        self.shared.metrics.topic_series.fanned_out(topic, &bytes, &drops);
        reach
    }
}

/// The offset in a history topic's frame (its envelope), if it has one.
fn offset_of(frame: &Frame, pool: &freeboard_buf::Pool<'_>) -> Option<Offset> {
    let mut head = [0u8; 10 + Envelope::MAX];
    let mut len = 0;
    for segment in frame.segments(pool) {
        let n = segment.len().min(head.len() - len);
        head[len..len + n].copy_from_slice(&segment[..n]);
        len += n;
        if len == head.len() {
            break;
        }
    }
    offset_in_frame(&head[..len])
}
