//! Per-stream state and the table of open streams.

use alloc::vec::Vec;

use crate::stream_id::StreamId;

/// One open stream: its windows, the bytes in flight to the caller, and a few flags.
///
/// Kept this small on purpose (24 bytes): a connection may hold a hundred idle WebSockets.
/// There are no buffers here: received DATA is lent to the caller as it arrives, and DATA to
/// send stays with the caller until the windows allow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stream {
    pub(crate) id: StreamId,
    /// What we may still send (the peer's window for us); negative after a smaller
    /// SETTINGS_INITIAL_WINDOW_SIZE (RFC 9113 §6.9.2).
    pub(crate) send_window: i32,
    /// What the peer may still send before our next WINDOW_UPDATE.
    pub(crate) recv_window: i32,
    /// Delivered to the caller and not yet consumed.
    pub(crate) unconsumed: u32,
    /// Consumed and not yet announced in a WINDOW_UPDATE.
    pub(crate) to_announce: u32,
    pub(crate) flags: u8,
}

impl Stream {
    /// The peer's END_STREAM (or reset) arrived: no more DATA from it.
    pub(crate) const REMOTE_ENDED: u8 = 1;
    /// We sent END_STREAM.
    pub(crate) const LOCAL_ENDED: u8 = 1 << 1;
    /// The caller answered the request (its response head is queued).
    pub(crate) const ANSWERED: u8 = 1 << 2;
    /// An extended CONNECT for a WebSocket.
    pub(crate) const WEBSOCKET: u8 = 1 << 3;
    /// The caller found no send capacity; it hears when there is some.
    pub(crate) const SEND_BLOCKED: u8 = 1 << 4;
    /// Capacity came back after `SEND_BLOCKED`: `poll_writable` reports it.
    pub(crate) const WRITABLE_DUE: u8 = 1 << 5;

    pub(crate) fn new(id: StreamId, send_window: u32, recv_window: u32, flags: u8) -> Self {
        Self {
            id,
            send_window: send_window as i32,
            recv_window: recv_window as i32,
            unconsumed: 0,
            to_announce: 0,
            flags,
        }
    }

    pub(crate) fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    pub(crate) fn set(&mut self, flag: u8) {
        self.flags |= flag;
    }

    /// Both sides ended and the caller consumed everything: the stream can go.
    pub(crate) fn finished(&self) -> bool {
        self.has(Self::REMOTE_ENDED) && self.has(Self::LOCAL_ENDED) && self.unconsumed == 0
    }
}

/// The open streams, ordered by identifier (the peer opens them in increasing order, so
/// inserting is a push and finding one a binary search).
#[derive(Debug, Clone, Default)]
pub(crate) struct StreamTable {
    streams: Vec<Stream>,
}

impl StreamTable {
    pub(crate) fn len(&self) -> usize {
        self.streams.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    pub(crate) fn get_mut(&mut self, id: StreamId) -> Option<&mut Stream> {
        let index = self.streams.binary_search_by_key(&id, |s| s.id).ok()?;
        Some(&mut self.streams[index])
    }

    pub(crate) fn get(&self, id: StreamId) -> Option<&Stream> {
        let index = self.streams.binary_search_by_key(&id, |s| s.id).ok()?;
        Some(&self.streams[index])
    }

    /// Adds a stream with an identifier above every other (RFC 9113 §5.1.1 makes them so).
    pub(crate) fn push(&mut self, stream: Stream) {
        debug_assert!(self.streams.last().is_none_or(|last| last.id < stream.id));
        self.streams.push(stream);
    }

    pub(crate) fn remove(&mut self, id: StreamId) -> Option<Stream> {
        let index = self.streams.binary_search_by_key(&id, |s| s.id).ok()?;
        let stream = self.streams.remove(index);
        if self.streams.is_empty() {
            // An idle connection keeps no stream table.
            self.streams = Vec::new();
        }
        Some(stream)
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Stream> {
        self.streams.iter_mut()
    }
}
