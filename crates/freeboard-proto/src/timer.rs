//! Time as the caller gives it, and the connection's timer table.

use core::ops::Add;
use core::time::Duration;

/// A point in time, in milliseconds since an epoch of the caller's choosing.
///
/// The core never reads a clock: the runtime converts its own clock (e.g. `std::time::Instant`
/// minus a start instant, or a hardware tick counter) into this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

impl Instant {
    /// An instant `ms` milliseconds after the epoch.
    pub const fn from_millis(ms: u64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// The time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    fn add(self, rhs: Duration) -> Instant {
        let ms = u64::try_from(rhs.as_millis()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(ms))
    }
}

/// The timers a connection runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// Our close frame is out and the peer's has not arrived (`Config::close_timeout`).
    Close,
    /// The connection has been quiet for `Config::ping_interval`: time to send a ping.
    KeepAlive,
    /// A keep-alive ping is unanswered (`Config::pong_timeout`).
    PongDeadline,
}

impl Timer {
    const ALL: [Timer; 3] = [Timer::Close, Timer::KeepAlive, Timer::PongDeadline];
}

/// One optional deadline per [`Timer`]; the next deadline is the earliest.
#[derive(Debug, Clone, Default)]
pub(crate) struct TimerTable {
    deadlines: [Option<Instant>; Timer::ALL.len()],
}

impl TimerTable {
    pub(crate) fn set(&mut self, timer: Timer, at: Instant) {
        self.deadlines[timer as usize] = Some(at);
    }

    pub(crate) fn stop(&mut self, timer: Timer) {
        self.deadlines[timer as usize] = None;
    }

    pub(crate) fn get(&self, timer: Timer) -> Option<Instant> {
        self.deadlines[timer as usize]
    }

    pub(crate) fn stop_all(&mut self) {
        self.deadlines = Default::default();
    }

    /// The earliest deadline, if any timer runs.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.deadlines.iter().flatten().min().copied()
    }

    /// Stops and returns the first timer that has expired at `now`.
    pub(crate) fn expire(&mut self, now: Instant) -> Option<Timer> {
        let timer = Timer::ALL.into_iter().find(|&t| self.get(t).is_some_and(|at| at <= now))?;
        self.stop(timer);
        Some(timer)
    }
}
