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

/// One optional deadline per [`Timer`], in milliseconds; the next deadline is the earliest.
///
/// A stopped timer holds [`NEVER`](Self::NEVER) rather than `None`: 8 bytes per timer instead
/// of 16. A deadline of `u64::MAX` ms (`now + interval` saturates there) is hundreds of
/// millions of years away, so treating it as "never" changes nothing a caller can observe
/// short of that, and it is what [`Parked`](crate::Parked) does too.
#[derive(Debug, Clone)]
pub(crate) struct TimerTable {
    deadlines: [u64; Timer::ALL.len()],
}

impl Default for TimerTable {
    fn default() -> Self {
        Self { deadlines: [Self::NEVER; Timer::ALL.len()] }
    }
}

impl TimerTable {
    const NEVER: u64 = u64::MAX;

    pub(crate) fn set(&mut self, timer: Timer, at: Instant) {
        self.deadlines[timer as usize] = at.0;
    }

    pub(crate) fn stop(&mut self, timer: Timer) {
        self.deadlines[timer as usize] = Self::NEVER;
    }

    pub(crate) fn get(&self, timer: Timer) -> Option<Instant> {
        let at = self.deadlines[timer as usize];
        (at != Self::NEVER).then_some(Instant(at))
    }

    pub(crate) fn stop_all(&mut self) {
        *self = Self::default();
    }

    /// The earliest deadline, if any timer runs.
    pub(crate) fn next(&self) -> Option<Instant> {
        let at = self.deadlines.iter().copied().min().unwrap_or(Self::NEVER);
        (at != Self::NEVER).then_some(Instant(at))
    }

    /// Stops and returns the first timer that has expired at `now`.
    pub(crate) fn expire(&mut self, now: Instant) -> Option<Timer> {
        let timer = Timer::ALL.into_iter().find(|&t| self.get(t).is_some_and(|at| at <= now))?;
        self.stop(timer);
        Some(timer)
    }
}
