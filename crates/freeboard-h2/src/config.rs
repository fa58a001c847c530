//! The limits of one connection: what we advertise in SETTINGS and what the defences allow.

use crate::frame::{MAX_MAX_FRAME_SIZE, MAX_WINDOW, MIN_MAX_FRAME_SIZE};

/// The window every stream and the connection start with before SETTINGS (RFC 9113 §6.9.2).
pub const DEFAULT_WINDOW: u32 = 65_535;

/// The limits of one connection. Build it with [`Config::builder`].
///
/// ```
/// use freeboard_h2::Config;
///
/// let config = Config::builder().max_concurrent_streams(32).build();
/// assert_eq!(config.max_concurrent_streams, 32);
/// assert_eq!(config.max_header_list_size, 16 << 10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// SETTINGS_MAX_CONCURRENT_STREAMS: streams the peer may have open; one more is refused
    /// with `RST_STREAM` `REFUSED_STREAM`. Default 100.
    pub max_concurrent_streams: u32,
    /// SETTINGS_INITIAL_WINDOW_SIZE: what the peer may send on one stream before the caller
    /// consumes it, so the most a stream's unconsumed input can reach. Default 64 KiB.
    pub initial_stream_window: u32,
    /// The connection's receive window (raised from 65,535 by a WINDOW_UPDATE at start): what
    /// the peer may send on all streams together before the caller consumes it. Default
    /// 256 KiB; never below 65,535 (the builder clamps it).
    pub connection_window: u32,
    /// SETTINGS_MAX_FRAME_SIZE: the largest frame payload accepted; larger is a
    /// `FRAME_SIZE_ERROR`. Default 16 KiB, so the caller's read buffer needs 16 KiB + 9 to
    /// hold any whole frame.
    pub max_frame_size: u32,
    /// SETTINGS_HEADER_TABLE_SIZE: the HPACK dynamic table the peer's encoder may use.
    /// Default 4 KiB.
    pub header_table_size: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: the decoded request head (names, values, 32 bytes per
    /// field). Past it the request is answered `431` and the fields are not kept. The
    /// encoded block (HEADERS and CONTINUATION together) is bounded by the same number of
    /// bytes; past that, `GOAWAY` `ENHANCE_YOUR_CALM`. Default 16 KiB.
    pub max_header_list_size: u32,
    /// The most frames one header block may span (HEADERS and its CONTINUATIONs); past it,
    /// `GOAWAY` `ENHANCE_YOUR_CALM` (the CONTINUATION flood). Default 8.
    pub max_header_block_frames: u32,
    /// Streams the peer may reset before they are answered, less those answered, before the
    /// connection ends with `GOAWAY` `ENHANCE_YOUR_CALM` (rapid reset, CVE-2023-44487).
    /// Default 100.
    pub max_unanswered_resets: u32,
    /// Streams we may reset for the peer's errors (refused ones too) before the connection
    /// ends with `GOAWAY` `ENHANCE_YOUR_CALM`. Default 1,024.
    pub max_error_resets: u32,
    /// Frames the peer made us queue (PING and SETTINGS acknowledgements, `RST_STREAM`s)
    /// that the caller has not yet taken with `poll_transmit`; past it, `GOAWAY`
    /// `ENHANCE_YOUR_CALM` (PING and SETTINGS floods, CVE-2019-9512 and -9515). Default 64.
    pub max_queued_control_frames: u32,
}

impl Config {
    /// The defaults listed on each field.
    pub const DEFAULT: Self = Self {
        max_concurrent_streams: 100,
        initial_stream_window: 64 << 10,
        connection_window: 256 << 10,
        max_frame_size: MIN_MAX_FRAME_SIZE,
        header_table_size: 4096,
        max_header_list_size: 16 << 10,
        max_header_block_frames: 8,
        max_unanswered_resets: 100,
        max_error_resets: 1024,
        max_queued_control_frames: 64,
    };

    /// A builder starting from [`Config::DEFAULT`].
    pub const fn builder() -> ConfigBuilder {
        ConfigBuilder(Self::DEFAULT)
    }

    /// The smallest read buffer that holds any frame this configuration accepts whole.
    pub const fn min_read_buffer(&self) -> usize {
        crate::frame::HEADER_LEN + self.max_frame_size as usize
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
    /// See [`Config::max_concurrent_streams`].
    pub const fn max_concurrent_streams(mut self, streams: u32) -> Self {
        self.0.max_concurrent_streams = streams;
        self
    }

    /// See [`Config::initial_stream_window`]; at most 2³¹ − 1.
    pub const fn initial_stream_window(mut self, bytes: u32) -> Self {
        self.0.initial_stream_window = if bytes > MAX_WINDOW { MAX_WINDOW } else { bytes };
        self
    }

    /// See [`Config::connection_window`]; 65,535 to 2³¹ − 1.
    pub const fn connection_window(mut self, bytes: u32) -> Self {
        self.0.connection_window = if bytes > MAX_WINDOW {
            MAX_WINDOW
        } else if bytes < DEFAULT_WINDOW {
            DEFAULT_WINDOW
        } else {
            bytes
        };
        self
    }

    /// See [`Config::max_frame_size`]; 16 KiB to 16 MiB − 1.
    pub const fn max_frame_size(mut self, bytes: u32) -> Self {
        self.0.max_frame_size = if bytes < MIN_MAX_FRAME_SIZE {
            MIN_MAX_FRAME_SIZE
        } else if bytes > MAX_MAX_FRAME_SIZE {
            MAX_MAX_FRAME_SIZE
        } else {
            bytes
        };
        self
    }

    /// See [`Config::header_table_size`].
    pub const fn header_table_size(mut self, bytes: u32) -> Self {
        self.0.header_table_size = bytes;
        self
    }

    /// See [`Config::max_header_list_size`]; at most 1 MiB (a request head's fields are
    /// indexed with 16 bits).
    pub const fn max_header_list_size(mut self, bytes: u32) -> Self {
        self.0.max_header_list_size = if bytes > 1 << 20 { 1 << 20 } else { bytes };
        self
    }

    /// See [`Config::max_header_block_frames`]; at least 1.
    pub const fn max_header_block_frames(mut self, frames: u32) -> Self {
        self.0.max_header_block_frames = if frames == 0 { 1 } else { frames };
        self
    }

    /// See [`Config::max_unanswered_resets`].
    pub const fn max_unanswered_resets(mut self, streams: u32) -> Self {
        self.0.max_unanswered_resets = streams;
        self
    }

    /// See [`Config::max_error_resets`].
    pub const fn max_error_resets(mut self, streams: u32) -> Self {
        self.0.max_error_resets = streams;
        self
    }

    /// See [`Config::max_queued_control_frames`].
    pub const fn max_queued_control_frames(mut self, frames: u32) -> Self {
        self.0.max_queued_control_frames = frames;
        self
    }

    /// The configuration.
    pub const fn build(self) -> Config {
        self.0
    }
}
