//! HTTP/2 frames (RFC 9113 §4, §6): a typed view over a frame's bytes, and their encoding.
//!
//! [`Frame::parse`] checks everything §6 asks of a frame by itself (its length, its stream
//! identifier, padding, setting values) and says what a violation earns; what depends on
//! the connection's state (which streams exist, windows) is the connection's to check.

use crate::error::{ErrorCode, FrameError, InsufficientSize};
pub use crate::stream_id::StreamId;

/// The client connection preface (RFC 9113 §3.4), before its first SETTINGS frame.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The length of a frame header (§4.1).
pub const HEADER_LEN: usize = 9;

/// The largest window a flow-control window may reach, 2³¹ − 1 (§6.9.1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// The smallest and largest SETTINGS_MAX_FRAME_SIZE (§6.5.2).
pub const MIN_MAX_FRAME_SIZE: u32 = 1 << 14;
/// See [`MIN_MAX_FRAME_SIZE`].
pub const MAX_MAX_FRAME_SIZE: u32 = (1 << 24) - 1;

/// Frame types (§6); the numbers are the wire's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameType {
    /// DATA (§6.1).
    Data,
    /// HEADERS (§6.2).
    Headers,
    /// PRIORITY (§6.3), deprecated: parsed and ignored.
    Priority,
    /// RST_STREAM (§6.4).
    RstStream,
    /// SETTINGS (§6.5).
    Settings,
    /// PUSH_PROMISE (§6.6).
    PushPromise,
    /// PING (§6.7).
    Ping,
    /// GOAWAY (§6.8).
    GoAway,
    /// WINDOW_UPDATE (§6.9).
    WindowUpdate,
    /// CONTINUATION (§6.10).
    Continuation,
    /// A type this implementation does not know: ignored (§4.1, §5.5).
    Unknown(u8),
}

impl FrameType {
    /// The type of a frame's type octet.
    pub fn from_u8(kind: u8) -> Self {
        match kind {
            0 => Self::Data,
            1 => Self::Headers,
            2 => Self::Priority,
            3 => Self::RstStream,
            4 => Self::Settings,
            5 => Self::PushPromise,
            6 => Self::Ping,
            7 => Self::GoAway,
            8 => Self::WindowUpdate,
            9 => Self::Continuation,
            other => Self::Unknown(other),
        }
    }

    /// The type octet.
    pub fn to_u8(self) -> u8 {
        match self {
            Self::Data => 0,
            Self::Headers => 1,
            Self::Priority => 2,
            Self::RstStream => 3,
            Self::Settings => 4,
            Self::PushPromise => 5,
            Self::Ping => 6,
            Self::GoAway => 7,
            Self::WindowUpdate => 8,
            Self::Continuation => 9,
            Self::Unknown(other) => other,
        }
    }
}

/// Frame flags (§6); each is meaningful only on the frame types named.
pub mod flags {
    /// DATA, HEADERS: the sender's last frame on the stream.
    pub const END_STREAM: u8 = 0x1;
    /// SETTINGS, PING: an acknowledgement.
    pub const ACK: u8 = 0x1;
    /// HEADERS, PUSH_PROMISE, CONTINUATION: the header block ends here.
    pub const END_HEADERS: u8 = 0x4;
    /// DATA, HEADERS, PUSH_PROMISE: a pad length octet and padding.
    pub const PADDED: u8 = 0x8;
    /// HEADERS: a priority block (5 octets).
    pub const PRIORITY: u8 = 0x20;
}

/// The 9-octet frame header (§4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The payload's length (24 bits).
    pub length: u32,
    /// The frame's type.
    pub kind: FrameType,
    /// The flags octet.
    pub flags: u8,
    /// The stream (the reserved bit is dropped: "MUST be ignored when receiving", §4.1).
    pub stream: StreamId,
}

impl FrameHeader {
    /// Reads a header from the front of `buf`; `None` when fewer than 9 bytes are there.
    pub fn parse(buf: &[u8]) -> Option<Self> {
        let b: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
        Some(Self {
            length: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: FrameType::from_u8(b[3]),
            flags: b[4],
            stream: StreamId(u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & MAX_WINDOW),
        })
    }

    /// Whether `flag` is set.
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Writes the header into `out[..9]`.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, InsufficientSize> {
        let Some(b) = out.get_mut(..HEADER_LEN) else {
            return Err(InsufficientSize { required: HEADER_LEN });
        };
        let len = self.length.to_be_bytes();
        b[..3].copy_from_slice(&len[1..]);
        b[3] = self.kind.to_u8();
        b[4] = self.flags;
        b[5..].copy_from_slice(&(self.stream.0 & MAX_WINDOW).to_be_bytes());
        Ok(HEADER_LEN)
    }
}

/// A stream's priority block (§5.3.2 of RFC 7540), parsed only to be ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Priority {
    /// The stream it depends on.
    pub dependency: StreamId,
    /// The exclusive flag.
    pub exclusive: bool,
    /// Weight − 1.
    pub weight: u8,
}

/// One SETTINGS parameter (§6.5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The identifier (§6.5.2; 8 from RFC 8441).
    pub id: u16,
    /// The value.
    pub value: u32,
}

impl Setting {
    /// SETTINGS_HEADER_TABLE_SIZE.
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    /// SETTINGS_ENABLE_PUSH.
    pub const ENABLE_PUSH: u16 = 0x2;
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    /// SETTINGS_INITIAL_WINDOW_SIZE.
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    /// SETTINGS_MAX_FRAME_SIZE.
    pub const MAX_FRAME_SIZE: u16 = 0x5;
    /// SETTINGS_MAX_HEADER_LIST_SIZE.
    pub const MAX_HEADER_LIST_SIZE: u16 = 0x6;
    /// SETTINGS_ENABLE_CONNECT_PROTOCOL (RFC 8441 §3).
    pub const ENABLE_CONNECT_PROTOCOL: u16 = 0x8;
}

/// The parameters of a SETTINGS frame, in order (already checked by [`Frame::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings<'a>(&'a [u8]);

impl<'a> Settings<'a> {
    /// Iterates over the parameters.
    pub fn iter(&self) -> impl Iterator<Item = Setting> + 'a {
        self.0.chunks_exact(6).map(|p| Setting {
            id: u16::from_be_bytes([p[0], p[1]]),
            value: u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
        })
    }
}

/// A frame, borrowed from the buffer it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame<'a> {
    /// DATA.
    Data {
        /// The stream.
        stream: StreamId,
        /// The data, without padding.
        data: &'a [u8],
        /// END_STREAM.
        end_stream: bool,
    },
    /// HEADERS.
    Headers {
        /// The stream.
        stream: StreamId,
        /// The header block fragment, without padding and priority.
        block: &'a [u8],
        /// END_STREAM.
        end_stream: bool,
        /// END_HEADERS.
        end_headers: bool,
        /// The priority block, if the PRIORITY flag was set.
        priority: Option<Priority>,
    },
    /// PRIORITY.
    Priority {
        /// The stream.
        stream: StreamId,
        /// Its priority.
        priority: Priority,
    },
    /// RST_STREAM.
    RstStream {
        /// The stream.
        stream: StreamId,
        /// Why.
        code: ErrorCode,
    },
    /// SETTINGS.
    Settings {
        /// An acknowledgement (then without parameters).
        ack: bool,
        /// The parameters.
        settings: Settings<'a>,
    },
    /// PUSH_PROMISE.
    PushPromise {
        /// The stream it belongs to.
        stream: StreamId,
        /// The stream it reserves.
        promised: StreamId,
        /// The header block fragment.
        block: &'a [u8],
        /// END_HEADERS.
        end_headers: bool,
    },
    /// PING.
    Ping {
        /// An answer.
        ack: bool,
        /// The opaque data.
        data: [u8; 8],
    },
    /// GOAWAY.
    GoAway {
        /// The last stream the sender processed.
        last_stream: StreamId,
        /// Why.
        code: ErrorCode,
        /// Diagnostic bytes.
        debug: &'a [u8],
    },
    /// WINDOW_UPDATE.
    WindowUpdate {
        /// The stream, or 0 for the connection.
        stream: StreamId,
        /// The increment (1 to 2³¹ − 1).
        increment: u32,
    },
    /// CONTINUATION.
    Continuation {
        /// The stream.
        stream: StreamId,
        /// The header block fragment.
        block: &'a [u8],
        /// END_HEADERS.
        end_headers: bool,
    },
    /// A frame of an unknown type.
    Unknown {
        /// Its type octet.
        kind: u8,
        /// Its stream.
        stream: StreamId,
    },
}

impl<'a> Frame<'a> {
    /// Reads one whole frame from the front of `buf`: `Ok(None)` until all of it is there,
    /// then the frame and the bytes it took.
    ///
    /// `max_frame_size` is our SETTINGS_MAX_FRAME_SIZE: "An endpoint MUST send an error code
    /// of FRAME_SIZE_ERROR if a frame exceeds the size defined in SETTINGS_MAX_FRAME_SIZE"
    /// (§4.2); it is a connection error here for every type, which §4.2 allows.
    pub fn decode(buf: &'a [u8], max_frame_size: u32) -> Result<Option<(Self, usize)>, FrameError> {
        let Some(header) = FrameHeader::parse(buf) else { return Ok(None) };
        if header.length > max_frame_size {
            return Err(FrameError::connection(ErrorCode::FRAME_SIZE_ERROR, "frame too large"));
        }
        let end = HEADER_LEN + header.length as usize;
        let Some(payload) = buf.get(HEADER_LEN..end) else { return Ok(None) };
        Ok(Some((Self::parse(&header, payload)?, end)))
    }

    /// Reads a frame's payload (`payload.len()` must be `header.length`), checking what §6
    /// asks of each type.
    pub fn parse(header: &FrameHeader, payload: &'a [u8]) -> Result<Self, FrameError> {
        use FrameError::Stream;
        let protocol = |reason| FrameError::connection(ErrorCode::PROTOCOL_ERROR, reason);
        let size = |reason| FrameError::connection(ErrorCode::FRAME_SIZE_ERROR, reason);
        let stream = header.stream;
        let on_stream = stream != StreamId::CONNECTION;
        let frame = match header.kind {
            FrameType::Data => {
                // §6.1: "If a DATA frame is received whose Stream Identifier field is 0x00,
                // the recipient MUST respond with a connection error ... PROTOCOL_ERROR."
                if !on_stream {
                    return Err(protocol("DATA on stream 0"));
                }
                let data = unpad(header, payload)?;
                Self::Data { stream, data, end_stream: header.has(flags::END_STREAM) }
            }
            FrameType::Headers => {
                if !on_stream {
                    return Err(protocol("HEADERS on stream 0"));
                }
                let mut block = unpad(header, payload)?;
                let mut priority = None;
                if header.has(flags::PRIORITY) {
                    let Some((fields, rest)) = block.split_first_chunk::<5>() else {
                        return Err(size("HEADERS too short for its priority"));
                    };
                    priority = Some(parse_priority(fields));
                    block = rest;
                }
                Self::Headers {
                    stream,
                    block,
                    end_stream: header.has(flags::END_STREAM),
                    end_headers: header.has(flags::END_HEADERS),
                    priority,
                }
            }
            FrameType::Priority => {
                if !on_stream {
                    return Err(protocol("PRIORITY on stream 0"));
                }
                // §6.3: "A PRIORITY frame with a length other than 5 octets MUST be treated
                // as a stream error ... FRAME_SIZE_ERROR."
                let Ok(fields) = <&[u8; 5]>::try_from(payload) else {
                    return Err(Stream(stream, ErrorCode::FRAME_SIZE_ERROR));
                };
                Self::Priority { stream, priority: parse_priority(fields) }
            }
            FrameType::RstStream => {
                if !on_stream {
                    return Err(protocol("RST_STREAM on stream 0"));
                }
                let Ok(code) = <[u8; 4]>::try_from(payload) else {
                    return Err(size("RST_STREAM not 4 octets"));
                };
                Self::RstStream { stream, code: ErrorCode(u32::from_be_bytes(code)) }
            }
            FrameType::Settings => {
                if on_stream {
                    return Err(protocol("SETTINGS on a stream"));
                }
                let ack = header.has(flags::ACK);
                // §6.5: an ACK with a payload, and a length not a multiple of 6, are
                // FRAME_SIZE_ERROR connection errors.
                if ack && !payload.is_empty() {
                    return Err(size("SETTINGS ACK with a payload"));
                }
                if !payload.len().is_multiple_of(6) {
                    return Err(size("SETTINGS length not a multiple of 6"));
                }
                let settings = Settings(payload);
                for setting in settings.iter() {
                    check_setting(setting)?;
                }
                Self::Settings { ack, settings }
            }
            FrameType::PushPromise => {
                if !on_stream {
                    return Err(protocol("PUSH_PROMISE on stream 0"));
                }
                let block = unpad(header, payload)?;
                let Some((promised, block)) = block.split_first_chunk::<4>() else {
                    return Err(size("PUSH_PROMISE too short"));
                };
                Self::PushPromise {
                    stream,
                    promised: StreamId(u32::from_be_bytes(*promised) & MAX_WINDOW),
                    block,
                    end_headers: header.has(flags::END_HEADERS),
                }
            }
            FrameType::Ping => {
                if on_stream {
                    return Err(protocol("PING on a stream"));
                }
                let Ok(data) = <[u8; 8]>::try_from(payload) else {
                    return Err(size("PING not 8 octets"));
                };
                Self::Ping { ack: header.has(flags::ACK), data }
            }
            FrameType::GoAway => {
                if on_stream {
                    return Err(protocol("GOAWAY on a stream"));
                }
                let Some((fields, debug)) = payload.split_first_chunk::<8>() else {
                    return Err(size("GOAWAY shorter than 8 octets"));
                };
                let last = u32::from_be_bytes([fields[0], fields[1], fields[2], fields[3]]);
                let code = u32::from_be_bytes([fields[4], fields[5], fields[6], fields[7]]);
                Self::GoAway {
                    last_stream: StreamId(last & MAX_WINDOW),
                    code: ErrorCode(code),
                    debug,
                }
            }
            FrameType::WindowUpdate => {
                let Ok(increment) = <[u8; 4]>::try_from(payload) else {
                    return Err(size("WINDOW_UPDATE not 4 octets"));
                };
                let increment = u32::from_be_bytes(increment) & MAX_WINDOW;
                // §6.9: "A receiver MUST treat the receipt of a WINDOW_UPDATE frame with a
                // flow-control window increment of 0 as a stream error ... PROTOCOL_ERROR;
                // errors on the connection flow-control window MUST be treated as a
                // connection error."
                if increment == 0 {
                    return Err(if on_stream {
                        Stream(stream, ErrorCode::PROTOCOL_ERROR)
                    } else {
                        protocol("WINDOW_UPDATE of 0 on the connection")
                    });
                }
                Self::WindowUpdate { stream, increment }
            }
            FrameType::Continuation => {
                if !on_stream {
                    return Err(protocol("CONTINUATION on stream 0"));
                }
                Self::Continuation {
                    stream,
                    block: payload,
                    end_headers: header.has(flags::END_HEADERS),
                }
            }
            FrameType::Unknown(kind) => Self::Unknown { kind, stream },
        };
        Ok(frame)
    }

    /// Writes the frame into `out` and returns its length. DATA, HEADERS and PUSH_PROMISE are
    /// written without padding; a HEADERS frame's priority block is kept.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, InsufficientSize> {
        let (kind, stream, flag_bits, parts): (FrameType, StreamId, u8, [&[u8]; 3]);
        let mut fixed = [0u8; 8];
        match *self {
            Self::Data { stream: s, data, end_stream } => {
                (kind, stream, flag_bits) =
                    (FrameType::Data, s, flag(end_stream, flags::END_STREAM));
                parts = [data, &[], &[]];
            }
            Self::Headers { stream: s, block, end_stream, end_headers, priority } => {
                let mut bits =
                    flag(end_stream, flags::END_STREAM) | flag(end_headers, flags::END_HEADERS);
                let mut len = 0;
                if let Some(priority) = priority {
                    bits |= flags::PRIORITY;
                    write_priority(priority, &mut fixed);
                    len = 5;
                }
                (kind, stream, flag_bits) = (FrameType::Headers, s, bits);
                parts = [&fixed[..len], block, &[]];
            }
            Self::Priority { stream: s, priority } => {
                write_priority(priority, &mut fixed);
                (kind, stream, flag_bits) = (FrameType::Priority, s, 0);
                parts = [&fixed[..5], &[], &[]];
            }
            Self::RstStream { stream: s, code } => {
                fixed[..4].copy_from_slice(&code.0.to_be_bytes());
                (kind, stream, flag_bits) = (FrameType::RstStream, s, 0);
                parts = [&fixed[..4], &[], &[]];
            }
            Self::Settings { ack, settings } => {
                (kind, stream, flag_bits) =
                    (FrameType::Settings, StreamId::CONNECTION, flag(ack, flags::ACK));
                parts = [settings.0, &[], &[]];
            }
            Self::PushPromise { stream: s, promised, block, end_headers } => {
                fixed[..4].copy_from_slice(&promised.0.to_be_bytes());
                (kind, stream, flag_bits) =
                    (FrameType::PushPromise, s, flag(end_headers, flags::END_HEADERS));
                parts = [&fixed[..4], block, &[]];
            }
            Self::Ping { ack, data } => {
                fixed = data;
                (kind, stream, flag_bits) =
                    (FrameType::Ping, StreamId::CONNECTION, flag(ack, flags::ACK));
                parts = [&fixed[..8], &[], &[]];
            }
            Self::GoAway { last_stream, code, debug } => {
                fixed[..4].copy_from_slice(&last_stream.0.to_be_bytes());
                fixed[4..].copy_from_slice(&code.0.to_be_bytes());
                (kind, stream, flag_bits) = (FrameType::GoAway, StreamId::CONNECTION, 0);
                parts = [&fixed[..8], debug, &[]];
            }
            Self::WindowUpdate { stream: s, increment } => {
                fixed[..4].copy_from_slice(&increment.to_be_bytes());
                (kind, stream, flag_bits) = (FrameType::WindowUpdate, s, 0);
                parts = [&fixed[..4], &[], &[]];
            }
            Self::Continuation { stream: s, block, end_headers } => {
                (kind, stream, flag_bits) =
                    (FrameType::Continuation, s, flag(end_headers, flags::END_HEADERS));
                parts = [block, &[], &[]];
            }
            Self::Unknown { kind: k, stream: s } => {
                (kind, stream, flag_bits) = (FrameType::Unknown(k), s, 0);
                parts = [&[], &[], &[]];
            }
        }
        let length: usize = parts.iter().map(|p| p.len()).sum();
        let required = HEADER_LEN + length;
        if out.len() < required {
            return Err(InsufficientSize { required });
        }
        let header = FrameHeader { length: length as u32, kind, flags: flag_bits, stream };
        let mut at = header.encode(out)?;
        for part in parts {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Ok(at)
    }
}

/// Encodes SETTINGS parameters as a payload: 6 bytes each.
pub fn encode_settings(settings: &[Setting], out: &mut [u8]) -> Result<usize, InsufficientSize> {
    let required = settings.len() * 6;
    let Some(out) = out.get_mut(..required) else { return Err(InsufficientSize { required }) };
    for (setting, slot) in settings.iter().zip(out.chunks_exact_mut(6)) {
        slot[..2].copy_from_slice(&setting.id.to_be_bytes());
        slot[2..].copy_from_slice(&setting.value.to_be_bytes());
    }
    Ok(required)
}

impl Settings<'static> {
    /// No parameters (the payload of an acknowledgement).
    pub const EMPTY: Self = Self(&[]);
}

impl<'a> Settings<'a> {
    /// A view over an encoded payload (see [`encode_settings`]); its length must be a
    /// multiple of 6.
    pub fn from_payload(payload: &'a [u8]) -> Option<Self> {
        payload.len().is_multiple_of(6).then_some(Self(payload))
    }
}

/// Checks a SETTINGS value against §6.5.2 and RFC 8441 §3.
fn check_setting(setting: Setting) -> Result<(), FrameError> {
    let protocol = |reason| Err(FrameError::connection(ErrorCode::PROTOCOL_ERROR, reason));
    match setting.id {
        // "Any value other than 0 or 1 MUST be treated as a connection error ... PROTOCOL_ERROR."
        Setting::ENABLE_PUSH if setting.value > 1 => protocol("SETTINGS_ENABLE_PUSH not 0 or 1"),
        // RFC 8441 §3 defines only 0 and 1.
        Setting::ENABLE_CONNECT_PROTOCOL if setting.value > 1 => {
            protocol("SETTINGS_ENABLE_CONNECT_PROTOCOL not 0 or 1")
        }
        // "Values above the maximum flow-control window size of 2^31-1 MUST be treated as a
        // connection error ... FLOW_CONTROL_ERROR."
        Setting::INITIAL_WINDOW_SIZE if setting.value > MAX_WINDOW => {
            Err(FrameError::connection(ErrorCode::FLOW_CONTROL_ERROR, "initial window over 2^31-1"))
        }
        // "Values outside this range MUST be treated as a connection error ... PROTOCOL_ERROR."
        Setting::MAX_FRAME_SIZE
            if !(MIN_MAX_FRAME_SIZE..=MAX_MAX_FRAME_SIZE).contains(&setting.value) =>
        {
            protocol("SETTINGS_MAX_FRAME_SIZE out of range")
        }
        _ => Ok(()),
    }
}

/// Strips the pad length octet and the padding of a PADDED frame (§6.1, §6.2).
fn unpad<'a>(header: &FrameHeader, payload: &'a [u8]) -> Result<&'a [u8], FrameError> {
    if !header.has(flags::PADDED) {
        return Ok(payload);
    }
    let Some((&pad, rest)) = payload.split_first() else {
        return Err(FrameError::connection(
            ErrorCode::FRAME_SIZE_ERROR,
            "padded frame of 0 octets",
        ));
    };
    // §6.1: "If the length of the padding is the length of the frame payload or greater, the
    // recipient MUST treat this as a connection error ... PROTOCOL_ERROR."
    rest.len()
        .checked_sub(usize::from(pad))
        .map(|len| &rest[..len])
        .ok_or(FrameError::connection(ErrorCode::PROTOCOL_ERROR, "padding longer than the frame"))
}

fn parse_priority(fields: &[u8; 5]) -> Priority {
    let dependency = u32::from_be_bytes([fields[0], fields[1], fields[2], fields[3]]);
    Priority {
        dependency: StreamId(dependency & MAX_WINDOW),
        exclusive: dependency >> 31 == 1,
        weight: fields[4],
    }
}

fn write_priority(priority: Priority, out: &mut [u8; 8]) {
    let exclusive = if priority.exclusive { 1 << 31 } else { 0 };
    out[..4].copy_from_slice(&(priority.dependency.0 | exclusive).to_be_bytes());
    out[4] = priority.weight;
}

fn flag(on: bool, bit: u8) -> u8 {
    if on { bit } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ConnectionError;

    fn round_trip(frame: Frame<'_>) {
        let mut out = [0u8; 128];
        let n = frame.encode(&mut out).unwrap();
        assert_eq!(Frame::decode(&out[..n], MIN_MAX_FRAME_SIZE), Ok(Some((frame, n))));
        // Every prefix is "need more", never an error or a different frame.
        for end in 0..n {
            assert_eq!(Frame::decode(&out[..end], MIN_MAX_FRAME_SIZE), Ok(None));
        }
        assert_eq!(frame.encode(&mut out[..n - 1]), Err(InsufficientSize { required: n }));
    }

    #[test]
    fn every_frame_type_round_trips() {
        let s = StreamId(3);
        let priority = Priority { dependency: StreamId(1), exclusive: true, weight: 200 };
        let mut settings = [0u8; 12];
        encode_settings(
            &[Setting { id: 8, value: 1 }, Setting { id: 0xabc, value: 7 }],
            &mut settings,
        )
        .unwrap();
        for frame in [
            Frame::Data { stream: s, data: b"abc", end_stream: true },
            Frame::Headers {
                stream: s,
                block: b"\x82",
                end_stream: false,
                end_headers: true,
                priority: None,
            },
            Frame::Headers {
                stream: s,
                block: b"\x82",
                end_stream: true,
                end_headers: false,
                priority: Some(priority),
            },
            Frame::Priority { stream: s, priority },
            Frame::RstStream { stream: s, code: ErrorCode::CANCEL },
            Frame::Settings { ack: false, settings: Settings(&settings) },
            Frame::Settings { ack: true, settings: Settings::EMPTY },
            Frame::PushPromise {
                stream: s,
                promised: StreamId(2),
                block: b"\x82",
                end_headers: true,
            },
            Frame::Ping { ack: true, data: *b"12345678" },
            Frame::GoAway { last_stream: s, code: ErrorCode(0x1234), debug: b"why" },
            Frame::WindowUpdate { stream: StreamId::CONNECTION, increment: MAX_WINDOW },
            Frame::Continuation { stream: s, block: b"\x83", end_headers: false },
            Frame::Unknown { kind: 0xee, stream: s },
        ] {
            round_trip(frame);
        }
        let ids: alloc::vec::Vec<u16> = Settings(&settings).iter().map(|s| s.id).collect();
        assert_eq!(ids, [8, 0xabc]);
    }

    #[test]
    fn malformed_frames_earn_their_codes() {
        use ErrorCode as C;
        // `Ok(code)`: a connection error; `Err((stream, code))`: a stream error.
        type Expected = Result<ErrorCode, (u32, ErrorCode)>;
        let cases: [(&[u8], Expected); 14] = [
            (&[0, 0, 0, 0, 0, 0, 0, 0, 0], Ok(C::PROTOCOL_ERROR)), // DATA on stream 0
            (&[0, 0, 1, 0, 0x8, 0, 0, 0, 1, 1], Ok(C::PROTOCOL_ERROR)), // pad = payload
            (&[0, 0, 0, 0, 0x8, 0, 0, 0, 1], Ok(C::FRAME_SIZE_ERROR)), // PADDED, no octet
            (&[0, 0, 0, 1, 0x20, 0, 0, 0, 1], Ok(C::FRAME_SIZE_ERROR)), // PRIORITY flag, no block
            (&[0, 0, 4, 2, 0, 0, 0, 0, 1, 0, 0, 0, 0], Err((1, C::FRAME_SIZE_ERROR))), // PRIORITY of 4
            (&[0, 0, 3, 3, 0, 0, 0, 0, 1, 0, 0, 0], Ok(C::FRAME_SIZE_ERROR)), // RST_STREAM of 3
            (&[0, 0, 6, 4, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0], Ok(C::FRAME_SIZE_ERROR)), // ACK with payload
            (&[0, 0, 5, 4, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], Ok(C::FRAME_SIZE_ERROR)),    // 5 octets
            (&[0, 0, 0, 4, 0, 0, 0, 0, 1], Ok(C::PROTOCOL_ERROR)), // SETTINGS on a stream
            (&[0, 0, 7, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], Ok(C::FRAME_SIZE_ERROR)), // PING of 7
            (&[0, 0, 8, 6, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0], Ok(C::PROTOCOL_ERROR)), // PING on a stream
            (&[0, 0, 4, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0], Ok(C::FRAME_SIZE_ERROR)), // GOAWAY of 4
            (&[0, 0, 4, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0], Ok(C::PROTOCOL_ERROR)),   // increment 0
            (&[0, 0, 4, 8, 0, 0, 0, 0, 5, 0, 0, 0, 0], Err((5, C::PROTOCOL_ERROR))), // on a stream
        ];
        for (bytes, expected) in cases {
            let got = Frame::decode(bytes, MIN_MAX_FRAME_SIZE);
            match expected {
                Ok(code) => match got {
                    Err(FrameError::Connection(error)) => assert_eq!(error.code, code, "{bytes:?}"),
                    other => panic!("{bytes:?}: {other:?}"),
                },
                Err((stream, code)) => {
                    assert_eq!(got, Err(FrameError::Stream(StreamId(stream), code)), "{bytes:?}")
                }
            }
        }
        // Past our SETTINGS_MAX_FRAME_SIZE, decided from the header alone.
        let big = [0, 0x40, 1, 0, 0, 0, 0, 0, 1];
        assert!(matches!(
            Frame::decode(&big, MIN_MAX_FRAME_SIZE),
            Err(FrameError::Connection(ConnectionError { code: ErrorCode::FRAME_SIZE_ERROR, .. }))
        ));
        // The reserved bit of the stream identifier is ignored.
        let header = FrameHeader::parse(&[0, 0, 0, 0xfa, 0, 0x80, 0, 0, 7]).unwrap();
        assert_eq!(header.stream, StreamId(7));
    }
}
