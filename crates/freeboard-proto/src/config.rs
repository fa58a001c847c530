//! Per-connection limits and behaviour.

use core::time::Duration;

/// The limits and switches of one connection. Build it with [`Config::builder`].
///
/// ```
/// use core::time::Duration;
/// use freeboard_proto::Config;
///
/// let config = Config::builder()
///     .max_message_size(1 << 20)
///     .ping_interval(Some(Duration::from_secs(30)))
///     .build();
/// assert_eq!(config.max_frame_size, 1 << 20);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// The largest frame payload accepted; a longer frame fails the connection with 1009.
    /// Default 16 MiB; never more than `max_message_size` (the builder clamps it).
    pub max_frame_size: u64,
    /// The largest message accepted (all its frames together); beyond it, 1009. Default 16 MiB.
    pub max_message_size: u64,
    /// Answer pings with pongs automatically. Default `true`; when `false` the application sees
    /// every ping as an [`Event::Ping`](crate::Event::Ping) and answers with
    /// [`Connection::pong`](crate::Connection::pong).
    pub auto_pong: bool,
    /// How long to wait for the peer's close frame after sending ours before giving up
    /// (closed with 1006). Default 5 s.
    pub close_timeout: Duration,
    /// Send a ping after this long without any input; `None` (the default) disables it.
    pub ping_interval: Option<Duration>,
    /// How long a keep-alive ping may stay unanswered before the connection is dropped
    /// (closed with 1006). Default 10 s.
    pub pong_timeout: Duration,
    /// The RSV bits a negotiated extension defines, as in [`FrameHeader::rsv`]
    /// (`0b100` = RSV1 for permessage-deflate). Frames with other RSV bits fail with 1002.
    /// Default 0: no extension.
    ///
    /// [`FrameHeader::rsv`]: crate::FrameHeader::rsv
    pub allowed_rsv: u8,
}

impl Config {
    /// The default limits: 16 MiB frames and messages, auto-pong on, 5 s close timeout,
    /// no keep-alive pings, no extensions.
    pub const DEFAULT: Self = Self {
        max_frame_size: 16 << 20,
        max_message_size: 16 << 20,
        auto_pong: true,
        close_timeout: Duration::from_secs(5),
        ping_interval: None,
        pong_timeout: Duration::from_secs(10),
        allowed_rsv: 0,
    };

    /// A builder starting from [`Config::DEFAULT`].
    pub const fn builder() -> ConfigBuilder {
        ConfigBuilder(Self::DEFAULT)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Builds a [`Config`]; every setter documents its field on [`Config`].
#[derive(Debug, Clone, Copy)]
pub struct ConfigBuilder(Config);

impl ConfigBuilder {
    /// See [`Config::max_frame_size`].
    pub const fn max_frame_size(mut self, bytes: u64) -> Self {
        self.0.max_frame_size = bytes;
        self
    }

    /// See [`Config::max_message_size`]. Also lowers `max_frame_size` to fit.
    pub const fn max_message_size(mut self, bytes: u64) -> Self {
        self.0.max_message_size = bytes;
        self
    }

    /// See [`Config::auto_pong`].
    pub const fn auto_pong(mut self, on: bool) -> Self {
        self.0.auto_pong = on;
        self
    }

    /// See [`Config::close_timeout`].
    pub const fn close_timeout(mut self, timeout: Duration) -> Self {
        self.0.close_timeout = timeout;
        self
    }

    /// See [`Config::ping_interval`].
    pub const fn ping_interval(mut self, interval: Option<Duration>) -> Self {
        self.0.ping_interval = interval;
        self
    }

    /// See [`Config::pong_timeout`].
    pub const fn pong_timeout(mut self, timeout: Duration) -> Self {
        self.0.pong_timeout = timeout;
        self
    }

    /// See [`Config::allowed_rsv`].
    pub const fn allowed_rsv(mut self, rsv: u8) -> Self {
        self.0.allowed_rsv = rsv & 0b111;
        self
    }

    /// The finished configuration.
    pub const fn build(self) -> Config {
        let mut config = self.0;
        if config.max_frame_size > config.max_message_size {
            config.max_frame_size = config.max_message_size;
        }
        config
    }
}
