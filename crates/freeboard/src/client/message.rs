//! What a client receives: whole messages (borrowed from pool chunks until the next call)
//! and the close event, as a browser's `WebSocket` reports them.

use freeboard_buf::{ChunkChain, Pool};
use freeboard_proto::{CloseCode, MessageKind};

/// What [`Client::recv`](super::Client::recv) returns.
#[derive(Debug)]
pub enum Event<'a> {
    /// A whole message.
    Message(ReceivedMessage<'a>),
    /// The connection closed; no further events follow.
    Closed(CloseEvent),
}

/// The browser's `CloseEvent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseEvent {
    /// The close code: the server's for a clean close (1005 if its frame had none), ours for a
    /// connection we failed (1002, 1007, 1009…), 1006 when the transport ended first.
    pub code: CloseCode,
    /// The close reason.
    pub reason: String,
    /// Whether both close frames were exchanged.
    pub was_clean: bool,
}

/// A received message, reassembled in pool chunks and borrowed until the next `recv`.
#[derive(Debug)]
pub struct ReceivedMessage<'a> {
    pub(super) kind: MessageKind,
    pub(super) chain: &'a ChunkChain,
    pub(super) pool: &'a Pool<'static>,
}

impl<'a> ReceivedMessage<'a> {
    /// Text or binary.
    pub fn kind(&self) -> MessageKind {
        self.kind
    }

    /// The message's length in bytes.
    pub fn len(&self) -> usize {
        self.chain.len()
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.chain.is_empty()
    }

    /// The bytes in order, one slice per pool chunk (no copy).
    pub fn segments(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.chain.segments(self.pool)
    }

    /// The bytes as one slice when they sit in one chunk (messages up to the chunk size).
    pub fn as_slice(&self) -> Option<&'a [u8]> {
        let mut segments = self.segments();
        match (segments.next(), segments.next()) {
            (None, _) => Some(&[]),
            (Some(only), None) => Some(only),
            _ => None,
        }
    }

    /// A copy of the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        self.segments().for_each(|s| out.extend_from_slice(s));
        out
    }

    /// A copy of a text message as a `String` (`None` for binary).
    pub fn to_text(&self) -> Option<String> {
        if self.kind != MessageKind::Text {
            return None;
        }
        // The core validated the UTF-8 of every text message (§8.1).
        String::from_utf8(self.to_vec()).ok()
    }
}
