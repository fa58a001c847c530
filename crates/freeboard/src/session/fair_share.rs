//! Who pays when a loop's pool is contended: the connections that are behind, never the ones
//! that keep up.
//!
//! Every session of a loop queues into one pool. Without a rule, connections that never read
//! fill it, and the next echo to a client that reads everything finds no chunk. So a push is
//! judged before it is made:
//! - data must leave a *floor* free — a chunk and a slot per open connection, capped at an
//!   eighth of the pool — so every close frame and pong the loop will owe still fits (no bare
//!   EOF);
//! - once the pool is contended (a quarter of its chunks or slots left), a connection that is
//!   behind (its queue above its high watermark) may hold its *fair share* — what is above the
//!   floor divided by the open connections — and no more: past it, its own slow-consumer policy
//!   acts as if it had reached its cap;
//! - a connection that is behind is not read (its queue is above its high watermark), so it may
//!   never push again: while the pool is contended the loop also sweeps its connections and
//!   applies the policy of each one behind and past its share ([`FairShare::over_share`]) to what
//!   it already holds, before a reader's reply can find the pool short;
//! - a connection not yet behind may still hold several shares (a high watermark is per
//!   connection, a share is of the pool): once the pool is *tight* — less free than the floor
//!   and one share — the sweep charges what such a connection holds past its share too, with
//!   1013 rather than 1008 when its policy closes it (it may be reading; the pool is short);
//! - a message that arrives in pieces is judged the same way: under contention what it holds
//!   and what its connection has queued may not pass the fair share
//!   ([`FairShare::reassembly_room`]), else the connection is closed 1013;
//! - when the pool is short, a connection not yet behind that holds more than its share and
//!   more than a message in flight meets its policy too: a peer that does not read many small
//!   publications holds a slot for each long before their bytes reach its high watermark;
//! - before a fan-out that would leave less than the floor ([`FairShare::short_of`]), the loop
//!   has the connections holding the most past their share meet their policy first, until
//!   there is room, so that the subscribers it meets last are not the ones left without;
//! - when the pool is short for other reasons, the new work is refused
//!   ([`PushOutcome::WouldBlock`](freeboard_buf::PushOutcome::WouldBlock) with
//!   [`Limit::Pool`](freeboard_buf::Limit::Pool), counted as `pool_exhausted`); a connection
//!   that keeps up is never closed as a slow consumer.
//!
//! Chunks and segment slots (each queued message takes at least one) are judged alike, so
//! many small messages cannot exhaust the pool while its chunk gauge reads nearly empty.

use freeboard_buf::{Pool, SendQueue};

/// Chunks a queue that keeps up may hold whatever its share: one message, which may start in
/// one chunk and end in the next.
const IN_FLIGHT_CHUNKS: usize = 2;

/// One loop's pool as its data path may use it now.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FairShare {
    /// Chunks (and slots) data must leave free.
    floor: usize,
    /// Chunks a connection that is behind may hold while the pool is contended.
    fair_chunks: usize,
    /// Slots such a connection may hold.
    fair_slots: usize,
    /// Free chunks and slots below which the pool is contended.
    contended_chunks: usize,
    contended_slots: usize,
    /// Messages up to this size cannot reach the floor while the pool is not contended.
    small: usize,
}

/// What a push of a message may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Room {
    /// Room for it.
    Fits,
    /// The queue is behind and past its share: its policy acts as at its cap.
    Culprit,
    /// The pool is short through no fault of this queue: refuse the message.
    Exhausted,
}

impl FairShare {
    /// The share of a loop whose pool serves `open` connections. The chunks the pool withholds
    /// for the connections' kernel memory are not the data path's: shares are of the rest.
    pub(crate) fn new(pool: &Pool<'_>, open: usize) -> Self {
        Self::beside(pool, open, 0)
    }

    /// [`new`](Self::new) for a loop that holds `own` of the pool's chunks for itself (an
    /// io_uring loop's receive buffers): they are no connection's data, so shares are of the
    /// rest, or the connections behind would be granted those chunks too and leave a reader's
    /// reply without one.
    pub(crate) fn beside(pool: &Pool<'_>, open: usize, own: usize) -> Self {
        let open = open.max(1);
        let chunks = pool.chunks_total().saturating_sub(pool.chunks_withheld() + own);
        let slots = pool.segments_total();
        let floor = open.min(chunks / 8);
        Self {
            floor,
            fair_chunks: (chunks - floor) / open,
            fair_slots: slots.saturating_sub(floor) / open,
            contended_chunks: chunks / 4,
            contended_slots: slots / 4,
            small: (chunks / 4).saturating_sub(floor + 1) * pool.chunk_size(),
        }
    }

    /// Whether `bytes` may join the cork unjudged: the pool is not contended and they cannot
    /// reach the floor. Under contention every message is judged against its own queue, so a
    /// peer that is behind meets its policy message by message, as without a cork.
    #[inline]
    pub(crate) fn uncontended(&self, pool: &Pool<'_>, bytes: usize) -> bool {
        pool.chunks_free() >= self.contended_chunks
            && pool.segments_total() - pool.segments_in_use() >= self.contended_slots
            && bytes <= self.small
    }

    /// The most bytes a reply may take while [`uncontended`](Self::uncontended) says yes for
    /// the pool as it is now, `0` if the pool is contended: a driver that decides without the
    /// pool at hand (the tokio driver's cork) keeps this as of its last look at the pool.
    #[cfg(feature = "tokio")]
    pub(crate) fn uncontended_room(&self, pool: &Pool<'_>) -> usize {
        if self.uncontended(pool, 0) { self.small } else { 0 }
    }

    /// Judges a push of `bytes` (header included) onto `queue`. Costs two comparisons while
    /// the pool is not contended.
    #[inline]
    pub(crate) fn judge(&self, pool: &Pool<'_>, queue: &SendQueue, bytes: usize) -> Room {
        if self.uncontended(pool, bytes) {
            return Room::Fits;
        }
        self.judge_contended(pool, queue, bytes)
    }

    /// [`judge`](Self::judge) while the pool is contended.
    #[inline(never)]
    fn judge_contended(&self, pool: &Pool<'_>, queue: &SendQueue, bytes: usize) -> Room {
        let free_chunks = pool.chunks_free();
        let free_slots = pool.segments_total() - pool.segments_in_use();
        let need = message_chunks(pool, bytes);
        let short = free_chunks < self.floor + need || free_slots < self.floor + need;
        if !short && free_chunks >= self.contended_chunks && free_slots >= self.contended_slots {
            return Room::Fits;
        }
        let behind = !queue.is_writable();
        let past_share = self.past_share(pool, queue, need);
        match (behind, short) {
            (true, _) if past_share || short => Room::Culprit,
            // Below its high watermark yet holding more than its share and more than a
            // message in flight: many small publications a peer does not read take a slot
            // each long before their bytes reach a watermark.
            (false, true) if past_share && self.beyond_in_flight(pool, queue) => Room::Culprit,
            (false, true) => Room::Exhausted,
            _ => Room::Fits,
        }
    }

    /// Whether the loop's sweep charges `queue` for a contended pool: it is behind and holds
    /// its fair share or more; or the pool is [tight](Self::tight) — with `need` more slots
    /// about to be taken by a fan-out — and it holds more than its share and more than one
    /// message in flight, behind or not.
    pub(crate) fn over_share(&self, pool: &Pool<'_>, queue: &SendQueue, need: usize) -> bool {
        if need == 0 && self.uncontended(pool, 0) {
            return false;
        }
        if queue.is_writable() {
            self.tight(pool, need)
                && self.past_share(pool, queue, 0)
                && self.beyond_in_flight(pool, queue)
        } else {
            self.past_share(pool, queue, 1)
        }
    }

    /// Whether a fan-out that takes `need` slots (a shared frame's delivery takes one each)
    /// would leave less free than the floor: the loop then has the largest holders past
    /// their share pay first, before the subscribers the fan-out meets first find no slot.
    pub(crate) fn short_of(&self, pool: &Pool<'_>, need: usize) -> bool {
        need > 0 && pool.segments_total() - pool.segments_in_use() < self.floor + need
    }

    /// Whether `queue` holds more than a message in flight: more than [`IN_FLIGHT_CHUNKS`]
    /// chunks, or more messages than that. Where shares are smaller (a budget spent on
    /// connections' kernel memory), a reader's one reply — or its 101 — is not what starves
    /// the pool. Messages count on their own: a queue of many small publications holds few
    /// chunks (they are shared frames) and a slot for each.
    fn beyond_in_flight(&self, pool: &Pool<'_>, queue: &SendQueue) -> bool {
        held_chunks(pool, queue) > IN_FLIGHT_CHUNKS || queue.messages() as usize > IN_FLIGHT_CHUNKS
    }

    /// Whether the pool has less free than the floor plus one fair share: a connection within
    /// its share could not count on the rest of it. Queues that keep up may hold more than
    /// their share while the pool is merely contended (they drain); when it is tight, what
    /// they hold past it is what leaves a reader's next reply without a chunk.
    /// With `need` more slots about to be taken, less than that beside.
    pub(crate) fn tight(&self, pool: &Pool<'_>, need: usize) -> bool {
        pool.chunks_free() < self.floor + self.fair_chunks.min(self.contended_chunks)
            || pool.segments_total() - pool.segments_in_use()
                < self.floor + self.fair_slots.min(self.contended_slots) + need
    }

    /// How many bytes a message that `queue`'s connection is reassembling may hold in all:
    /// no limit while the pool is not contended; under contention what is left of its fair
    /// share beside what it has queued. A sender of messages in pieces is then charged like a
    /// reader that is behind, before a reply to a connection that keeps up finds the pool
    /// short.
    pub(crate) fn reassembly_room(&self, pool: &Pool<'_>, queue: &SendQueue) -> usize {
        if self.uncontended(pool, 0) {
            return usize::MAX;
        }
        // (A message held in pieces may start and end mid-chunk: one chunk of slack.)
        self.fair_chunks.saturating_sub(held_chunks(pool, queue) + 1) * pool.chunk_size()
    }

    /// Whether the pool is too short for a push of `bytes` onto any queue: it has less free
    /// than the floor and the message's chunks (or slots), so [`judge`](Self::judge) cannot
    /// say it fits. A driver whose push the pool refused waits at least until this clears.
    #[cfg(feature = "tokio")]
    pub(crate) fn short(&self, pool: &Pool<'_>, bytes: usize) -> bool {
        let need = message_chunks(pool, bytes);
        pool.chunks_free() < self.floor + need
            || pool.segments_total() - pool.segments_in_use() < self.floor + need
    }

    /// Whether `queue` plus `need` more chunks (and slots) would pass its fair share.
    fn past_share(&self, pool: &Pool<'_>, queue: &SendQueue, need: usize) -> bool {
        let held_chunks = held_chunks(pool, queue);
        let held_slots = queue.messages() as usize + held_chunks;
        held_chunks + need > self.fair_chunks || held_slots + need > self.fair_slots
    }
}

/// The chunks (and slots) a message of `bytes` may take: it may start in one chunk and end
/// in another.
fn message_chunks(pool: &Pool<'_>, bytes: usize) -> usize {
    bytes.div_ceil(pool.chunk_size()) + 1
}

/// The chunks `queue` holds: its bytes, and one more for a start or an end mid-chunk.
fn held_chunks(pool: &Pool<'_>, queue: &SendQueue) -> usize {
    queue.len().div_ceil(pool.chunk_size()) + usize::from(!queue.is_empty())
}
