//! The limits of one WebSocket connection, named once for every driver: the server
//! ([`ServerConfig::limits`](crate::ServerConfig::limits)), the blocking client and the client
//! loop ([`ClientConfig::limits`](crate::client::ClientConfig::limits)) and the tokio endpoint
//! (`EndpointConfig::limits`).

use std::time::Duration;

use freeboard_buf::{SendQueue, SlowConsumerPolicy, Watermarks};

/// What one connection may hold and how long it may take: its send queue's watermarks, hard
/// cap and slow-consumer policy, the largest message and frame it accepts, and its timeouts.
///
/// Sizes are bytes, times are [`Duration`]s. The defaults are `freeboard serve`'s; a client
/// and a tokio endpoint start from their own (see
/// [`ClientConfig::limits`](crate::client::ClientConfig::limits) and the tokio
/// `EndpointConfig::limits`). In `freeboard serve`'s TOML file each field is a top-level key
/// of the same name, and each has a flag (`send_cap = "1M"`, `--send-cap 1M`).
///
/// ```
/// use std::time::Duration;
/// use freeboard::{Limits, SlowConsumerPolicy};
///
/// let limits = Limits::default()
///     .send_cap(1 << 20)
///     .slow_consumer(SlowConsumerPolicy::DropOldest)
///     .idle_timeout(None)
///     .close_timeout(Duration::from_secs(2));
/// assert!(limits.validate().is_ok());
/// assert!(limits.send_high(2 << 20).validate().is_err(), "high above the cap");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Send queue low watermark: at or below it the connection is writable again. Default
    /// 64 KiB.
    pub send_low: usize,
    /// Send queue high watermark: above it the connection is not writable (a server
    /// connection's reads pause). Default 128 KiB, `freeboard serve`'s read buffer: corked
    /// replies count as queued, so an echo's replies to one read fit under it and leave in
    /// one write.
    pub send_high: usize,
    /// Send queue hard cap; at it the slow-consumer policy decides. Default 16 MiB + 64 KiB,
    /// enough to echo one message of the default `max_message_size`.
    pub send_cap: usize,
    /// What happens to a message that would pass the cap: `block`, `drop-newest`,
    /// `drop-oldest`, `conflate` or `close` (1008). Default `close`.
    pub slow_consumer: SlowConsumerPolicy,
    /// Largest message accepted (all its frames together); beyond it the connection is
    /// closed with 1009. Default 16 MiB.
    pub max_message_size: usize,
    /// Largest frame payload accepted; beyond it, 1009. Never more than `max_message_size`.
    /// Default `None`: as large as `max_message_size`.
    pub max_frame_size: Option<usize>,
    /// The opening handshake's time: on a server from accept to a complete upgrade request
    /// (slower clients are dropped: slowloris), on a client from connected to a checked
    /// `101`. Default 10 s.
    pub handshake_timeout: Duration,
    /// Send a ping after this long without input; `None` sends no keep-alive pings.
    /// Default 30 s.
    pub idle_timeout: Option<Duration>,
    /// How long a keep-alive ping may stay unanswered before the connection is dropped.
    /// Default 10 s.
    pub pong_timeout: Duration,
    /// How long to wait for the peer's close frame after ours. Default 5 s.
    pub close_timeout: Duration,
}

impl Limits {
    /// `freeboard serve`'s limits, as documented on each field.
    pub const DEFAULT: Self = Self {
        send_low: 64 << 10,
        send_high: 128 << 10,
        send_cap: (16 << 20) + (64 << 10),
        slow_consumer: SlowConsumerPolicy::Close,
        max_message_size: 16 << 20,
        max_frame_size: None,
        handshake_timeout: Duration::from_secs(10),
        idle_timeout: Some(Duration::from_secs(30)),
        pong_timeout: Duration::from_secs(10),
        close_timeout: Duration::from_secs(5),
    };

    /// Sets [`send_low`](Self::send_low).
    pub const fn send_low(mut self, bytes: usize) -> Self {
        self.send_low = bytes;
        self
    }

    /// Sets [`send_high`](Self::send_high).
    pub const fn send_high(mut self, bytes: usize) -> Self {
        self.send_high = bytes;
        self
    }

    /// Sets [`send_cap`](Self::send_cap).
    pub const fn send_cap(mut self, bytes: usize) -> Self {
        self.send_cap = bytes;
        self
    }

    /// Sets `send_low`, `send_high` and `send_cap` from watermarks already in order.
    pub const fn watermarks(self, marks: Watermarks) -> Self {
        self.send_low(marks.low()).send_high(marks.high()).send_cap(marks.cap())
    }

    /// Sets [`slow_consumer`](Self::slow_consumer).
    pub const fn slow_consumer(mut self, policy: SlowConsumerPolicy) -> Self {
        self.slow_consumer = policy;
        self
    }

    /// Sets [`max_message_size`](Self::max_message_size).
    pub const fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// Sets [`max_frame_size`](Self::max_frame_size).
    pub const fn max_frame_size(mut self, bytes: usize) -> Self {
        self.max_frame_size = Some(bytes);
        self
    }

    /// Sets [`handshake_timeout`](Self::handshake_timeout).
    pub const fn handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Sets [`idle_timeout`](Self::idle_timeout); `None` turns keep-alive pings off.
    pub const fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets [`pong_timeout`](Self::pong_timeout).
    pub const fn pong_timeout(mut self, timeout: Duration) -> Self {
        self.pong_timeout = timeout;
        self
    }

    /// Sets [`close_timeout`](Self::close_timeout).
    pub const fn close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// Checks that the limits can work; the error names the setting that cannot. Every
    /// driver calls it before its first connection.
    pub fn validate(&self) -> Result<(), LimitsError> {
        self.send_watermarks()?;
        let sizes = [
            ("max_message_size", self.max_message_size),
            ("max_frame_size", self.max_frame_size.unwrap_or(1)),
            ("send_cap", self.send_cap),
        ];
        if let Some((setting, _)) = sizes.into_iter().find(|&(_, bytes)| bytes == 0) {
            return Err(LimitsError::Zero(setting));
        }
        let times = [
            ("handshake_timeout", self.handshake_timeout),
            ("idle_timeout", self.idle_timeout.unwrap_or(Duration::MAX)),
            ("pong_timeout", self.pong_timeout),
            ("close_timeout", self.close_timeout),
        ];
        match times.into_iter().find(|(_, time)| time.is_zero()) {
            Some((setting, _)) => Err(LimitsError::Zero(setting)),
            None => Ok(()),
        }
    }

    /// The send queue's watermarks and cap; `Err` when `send_low <= send_high <= send_cap <= 4 GiB`
    /// does not hold.
    pub fn send_watermarks(&self) -> Result<Watermarks, LimitsError> {
        let (low, high, cap) = (self.send_low, self.send_high, self.send_cap);
        Watermarks::new(low, high, cap).map_err(|_| LimitsError::Watermarks { low, high, cap })
    }

    /// An empty send queue with these watermarks and policy.
    pub(crate) fn send_queue(&self) -> SendQueue {
        // NOTE(unwrap): every driver validates its limits before its first connection (the
        // server at bind and reload, the clients at connect, the tokio endpoint at `new`).
        let marks = self.send_watermarks().expect("validated limits");
        SendQueue::new(marks, self.slow_consumer)
    }

    /// The protocol core's per-connection configuration: the message and frame limits and
    /// the timers.
    pub fn protocol(&self) -> freeboard_proto::Config {
        freeboard_proto::Config::builder()
            .max_message_size(self.max_message_size as u64)
            .max_frame_size(self.max_frame_size.unwrap_or(self.max_message_size) as u64)
            .ping_interval(self.idle_timeout)
            .pong_timeout(self.pong_timeout)
            .close_timeout(self.close_timeout)
            .build()
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A [`Limits`] that cannot work, and which setting says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitsError {
    /// A size or a time that must be more than 0 is 0 (its name).
    Zero(&'static str),
    /// `send_low <= send_high <= send_cap` does not hold.
    Watermarks {
        /// `send_low` as given.
        low: usize,
        /// `send_high` as given.
        high: usize,
        /// `send_cap` as given.
        cap: usize,
    },
}

impl std::fmt::Display for LimitsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Zero(setting) => write!(f, "{setting} must be more than 0"),
            Self::Watermarks { low, high, cap } => write!(
                f,
                "send watermarks must satisfy send_low <= send_high <= send_cap <= 4 GiB, not {low} / {high} / {cap}"
            ),
        }
    }
}

impl std::error::Error for LimitsError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_that_cannot_work_is_named() {
        let limits = Limits::default();
        assert_eq!(limits.validate(), Ok(()));
        let cases = [
            (limits.send_low(2 << 20), "send watermarks"),
            (limits.send_high(32 << 20), "send watermarks"),
            (limits.send_low(0).send_high(0).send_cap(0), "send_cap"),
            (limits.max_message_size(0), "max_message_size"),
            (limits.max_frame_size(0), "max_frame_size"),
            (limits.handshake_timeout(Duration::ZERO), "handshake_timeout"),
            (limits.idle_timeout(Some(Duration::ZERO)), "idle_timeout"),
            (limits.pong_timeout(Duration::ZERO), "pong_timeout"),
            (limits.close_timeout(Duration::ZERO), "close_timeout"),
        ];
        for (limits, named) in cases {
            let error = limits.validate().expect_err(named).to_string();
            assert!(error.starts_with(named), "{error:?} should name {named}");
        }
        assert_eq!(limits.idle_timeout(None).validate(), Ok(()), "no pings is a choice");
    }

    #[test]
    fn the_protocol_core_gets_the_same_limits() {
        let limits = Limits::default()
            .max_message_size(1 << 20)
            .idle_timeout(None)
            .pong_timeout(Duration::from_secs(3))
            .close_timeout(Duration::from_secs(2));
        let protocol = limits.protocol();
        assert_eq!(protocol.max_message_size, 1 << 20);
        assert_eq!(protocol.max_frame_size, 1 << 20, "frames follow the message limit");
        assert_eq!(protocol.ping_interval, None);
        assert_eq!(protocol.pong_timeout, Duration::from_secs(3));
        assert_eq!(protocol.close_timeout, Duration::from_secs(2));
        assert_eq!(limits.max_frame_size(4096).protocol().max_frame_size, 4096);
        // A frame is never larger than a message may be.
        assert_eq!(limits.max_frame_size(2 << 20).protocol().max_frame_size, 1 << 20);
    }

    #[test]
    fn watermarks_set_all_three_and_come_back_the_same() {
        let marks = Watermarks::new(1, 2, 3).unwrap();
        let limits = Limits::default().watermarks(marks);
        assert_eq!((limits.send_low, limits.send_high, limits.send_cap), (1, 2, 3));
        assert_eq!(limits.send_watermarks(), Ok(marks));
    }
}
