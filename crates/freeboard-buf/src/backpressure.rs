//! Write watermarks and the slow-consumer policy: the two halves of backpressure.

use core::fmt;

/// Low and high write watermarks plus a hard cap for one queue, with the queue's writability.
///
/// The watermarks are advisory, with hysteresis (Netty's `WriteBufferWaterMark`): the queue
/// becomes *not writable* when its level rises above `high` and *writable* again only when it
/// falls to `low` or below. [`observe`](Self::observe) reports each crossing exactly once, so
/// events alternate `NotWritable`, `Writable`, `NotWritable`, … and always match the level.
/// The cap is not advisory: a [`SendQueue`](crate::SendQueue) never holds more than `cap` bytes
/// of data messages; what happens to a message that would exceed it is the queue's
/// [`SlowConsumerPolicy`].
///
/// ```
/// use freeboard_buf::{Watermarks, Writability};
///
/// let mut w = Watermarks::new(10, 20, 100).unwrap();
/// assert_eq!(w.observe(20), None); // at high is still writable
/// assert_eq!(w.observe(21), Some(Writability::NotWritable));
/// assert_eq!(w.observe(50), None); // already reported
/// assert_eq!(w.observe(11), None); // between the marks: no change
/// assert_eq!(w.observe(10), Some(Writability::Writable));
/// assert!(w.is_writable());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    /// Invariant: `low <= high <= cap`. Four bytes each: a queue's level never passes
    /// [`MAX_CAP`](Self::MAX_CAP) by more than a control frame, and every connection's queue
    /// holds them.
    low: u32,
    high: u32,
    cap: u32,
    /// Invariant: `false` iff the last observed level rose above `high` and no level observed
    /// since has been `<= low`.
    writable: bool,
}

impl Watermarks {
    /// Netty's defaults for the marks (32 KiB, 64 KiB) and a 256 KiB cap.
    pub const DEFAULT: Self =
        Self { low: 32 << 10, high: 64 << 10, cap: 256 << 10, writable: true };

    /// The largest cap: 4 GiB less a byte.
    pub const MAX_CAP: usize = u32::MAX as usize;

    /// Watermarks at `low <= high <= cap <= MAX_CAP` bytes, starting writable.
    pub const fn new(low: usize, high: usize, cap: usize) -> Result<Self, WatermarkError> {
        if low > high || high > cap || cap > Self::MAX_CAP {
            return Err(WatermarkError { low, high, cap });
        }
        Ok(Self { low: low as u32, high: high as u32, cap: cap as u32, writable: true })
    }

    /// The level at or below which the queue becomes writable again.
    pub const fn low(&self) -> usize {
        self.low as usize
    }

    /// The level above which the queue becomes not writable.
    pub const fn high(&self) -> usize {
        self.high as usize
    }

    /// The most bytes of data messages the queue holds.
    pub const fn cap(&self) -> usize {
        self.cap as usize
    }

    /// Whether producers may keep writing.
    pub const fn is_writable(&self) -> bool {
        self.writable
    }

    /// Records the queue's new level; returns the transition if this level crossed a mark.
    #[inline]
    pub fn observe(&mut self, level: usize) -> Option<Writability> {
        if self.writable && level > self.high() {
            self.writable = false;
            Some(Writability::NotWritable)
        } else if !self.writable && level <= self.low() {
            self.writable = true;
            Some(Writability::Writable)
        } else {
            None
        }
    }
}

impl Default for Watermarks {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Watermarks that are not ordered `low <= high <= cap`, or a cap past
/// [`Watermarks::MAX_CAP`].
///
/// ```
/// use freeboard_buf::Watermarks;
///
/// let err = Watermarks::new(20, 10, 100).unwrap_err();
/// assert_eq!((err.low, err.high, err.cap), (20, 10, 100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatermarkError {
    /// The low mark given.
    pub low: usize,
    /// The high mark given.
    pub high: usize,
    /// The cap given.
    pub cap: usize,
}

impl fmt::Display for WatermarkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "watermarks must satisfy low <= high <= cap <= 4 GiB, got {} / {} / {}",
            self.low, self.high, self.cap
        )
    }
}

impl core::error::Error for WatermarkError {}

/// A writability transition (Netty's `channelWritabilityChanged`).
///
/// ```
/// use freeboard_buf::{Watermarks, Writability};
///
/// let mut w = Watermarks::new(0, 0, 10).unwrap();
/// assert_eq!(w.observe(1), Some(Writability::NotWritable));
/// assert_eq!(w.observe(0), Some(Writability::Writable));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writability {
    /// The level fell to the low mark or below: producers may resume.
    Writable,
    /// The level rose above the high mark: producers should pause.
    NotWritable,
}

/// What a [`SendQueue`](crate::SendQueue) does with a message that would take it past its cap,
/// or that the pool has no room for. Drops always remove whole messages, and never one whose
/// first byte was already handed to the socket (that would tear a frame and corrupt the stream).
///
/// ```
/// use freeboard_buf::SlowConsumerPolicy;
///
/// assert_eq!(SlowConsumerPolicy::default(), SlowConsumerPolicy::Close);
/// assert_eq!(SlowConsumerPolicy::ALL.len(), 5);
/// assert_eq!(SlowConsumerPolicy::DropOldest.name(), "drop-oldest");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SlowConsumerPolicy {
    /// Refuse the message ([`PushOutcome::WouldBlock`](crate::PushOutcome::WouldBlock)): the
    /// caller keeps it, stops reading its producer and retries after
    /// [`Writability::Writable`]. A message larger than the cap can never fit and is dropped.
    Block = 0,
    /// Drop the new message.
    DropNewest = 1,
    /// Drop the oldest unsent messages until the new one fits.
    DropOldest = 2,
    /// Keep only the latest unsent message once behind: while the queue is writable (it has
    /// not passed its high watermark since it last fell to its low one) every message is kept,
    /// in order; a push to a queue that is behind, or one that would pass the cap, replaces the
    /// messages that have not started to go out (latest value wins, as for LED frames or a
    /// score board).
    Conflate = 3,
    /// Refuse the message and tell the caller to close the connection with 1008 (policy
    /// violation). The default: a consumer that cannot keep up is told so, nothing is lost
    /// silently.
    #[default]
    Close = 4,
}

impl SlowConsumerPolicy {
    /// Every policy, in counter order.
    pub const ALL: [SlowConsumerPolicy; 5] = [
        SlowConsumerPolicy::Block,
        SlowConsumerPolicy::DropNewest,
        SlowConsumerPolicy::DropOldest,
        SlowConsumerPolicy::Conflate,
        SlowConsumerPolicy::Close,
    ];

    /// The policy's name in configuration and metrics (`drop-newest`, …).
    pub const fn name(self) -> &'static str {
        match self {
            SlowConsumerPolicy::Block => "block",
            SlowConsumerPolicy::DropNewest => "drop-newest",
            SlowConsumerPolicy::DropOldest => "drop-oldest",
            SlowConsumerPolicy::Conflate => "conflate",
            SlowConsumerPolicy::Close => "close",
        }
    }
}

impl fmt::Display for SlowConsumerPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unordered_marks() {
        assert!(Watermarks::new(1, 0, 5).is_err());
        assert!(Watermarks::new(0, 6, 5).is_err());
        assert!(Watermarks::new(5, 5, 5).is_ok());
    }

    #[test]
    fn events_alternate_and_match_the_level() {
        let mut w = Watermarks::new(3, 6, 10).unwrap();
        let mut last = Writability::Writable;
        for level in [0, 7, 9, 6, 4, 3, 2, 7, 7, 0, 10, 3, 4, 8] {
            if let Some(event) = w.observe(level) {
                assert_ne!(event, last);
                last = event;
            }
            if level > 6 {
                assert!(!w.is_writable());
            }
            if level <= 3 {
                assert!(w.is_writable());
            }
        }
    }

    #[test]
    fn policy_indices_match_all() {
        for (i, p) in SlowConsumerPolicy::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i);
        }
    }
}
