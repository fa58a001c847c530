//! What a publish made of its copies: the report every loop (and the backplane, for a
//! publication it acknowledges) adds to, and that tells the publisher once the last is in.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// What the other loops' subscribers made of a publish: each loop handed a copy adds its
/// counts; the last report tells the publisher (`notify`). The publisher holds one count of
/// `waiting` until it has handed out every copy, so an early report cannot finish it.
pub(crate) struct Receipt {
    delivered: AtomicU64,
    dropped: AtomicU64,
    /// Publications the backplane was to acknowledge and did not (not durable).
    unacknowledged: AtomicU32,
    waiting: AtomicU32,
    notify: Box<dyn Fn() + Send + Sync>,
}

impl Receipt {
    pub(crate) fn new(notify: impl Fn() + Send + Sync + 'static) -> Self {
        Self {
            delivered: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            unacknowledged: AtomicU32::new(0),
            waiting: AtomicU32::new(1),
            notify: Box::new(notify),
        }
    }

    /// A loop reports: `delivered` subscribers took the message, it was dropped for
    /// `dropped`. The last report notifies the publisher.
    pub(crate) fn report(&self, delivered: u64, dropped: u64) {
        self.delivered.fetch_add(delivered, Ordering::Relaxed);
        self.dropped.fetch_add(dropped, Ordering::Relaxed);
        if self.waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
            (self.notify)();
        }
    }

    /// The backplane reports a publication it was to acknowledge: durable or not. Like a
    /// loop's report, the last one notifies the publisher.
    pub(crate) fn acknowledge(&self, durable: bool) {
        if !durable {
            self.unacknowledged.fetch_add(1, Ordering::Relaxed);
        }
        self.report(0, 0);
    }

    /// Publications the backplane did not acknowledge as durable, so far.
    pub(crate) fn unacknowledged(&self) -> u32 {
        self.unacknowledged.load(Ordering::Acquire)
    }

    /// Counts one more report to wait for (a copy handed out, a publication to acknowledge),
    /// before it can come.
    pub(crate) fn expect(&self) {
        self.waiting.fetch_add(1, Ordering::AcqRel);
    }

    /// Takes back an [`expect`](Self::expect)ed report that will not come (a copy that was
    /// not handed out). The publisher's hold keeps the count above zero: nobody is notified.
    pub(crate) fn withdraw(&self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }

    /// The publisher has handed out every copy; whether every loop has reported already (then
    /// nobody is notified).
    pub(crate) fn release(&self) -> bool {
        self.waiting.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Subscribers reached and dropped so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.delivered.load(Ordering::Acquire), self.dropped.load(Ordering::Acquire))
    }
}
