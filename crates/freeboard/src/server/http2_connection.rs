//! The state of one HTTP/2 connection of a loop beside its core, and what it is charged:
//! shared by the loop (its table, its budget) and the HTTP/2 driver (`http2.rs`).

use std::collections::HashMap;

use freeboard_h2::{Config, Connection, Counters, StreamId};

/// The largest DATA frame we send (the peer's SETTINGS_MAX_FRAME_SIZE may not be less).
pub(super) const MAX_DATA: usize = 16_384;

/// One HTTP/2 connection of a loop.
pub(super) struct Http2Connection {
    pub(super) core: Connection,
    /// Its streams with a session, by id.
    pub(super) streams: HashMap<StreamId, StreamSlot>,
    /// The rest of a DATA frame the socket took part of; written before anything else (its
    /// payload has left its session's queue). At most one frame.
    pub(super) torn: Vec<u8>,
    /// The core's counters as last added to the metrics.
    pub(super) exported: Counters,
    /// A GOAWAY ends it: removed once what is owed is written.
    pub(super) ending: bool,
}

/// The loop's side of one stream: its entry, and what the core does not keep.
pub(super) struct StreamSlot {
    pub(super) token: usize,
    pub(super) serial: u64,
    /// Its response head is sent.
    pub(super) answered: bool,
    /// DATA its session has processed but whose window is not reopened (it paused).
    pub(super) unconsumed: usize,
    /// The peer ended its side.
    pub(super) remote_ended: bool,
}

/// The limits of the loop's HTTP/2 connections.
pub(super) fn core_config() -> Config {
    Config::builder().build()
}

/// Budget bytes an HTTP/2 connection is charged beside its entry while it is open: its own
/// state, the HPACK table and the decoded header list it may hold, and one torn DATA frame.
/// (The windows it grants cost nothing: DATA is processed in the read buffer.)
pub(super) fn connection_bound() -> usize {
    let config = core_config();
    size_of::<Http2Connection>()
        + size_of::<Connection>()
        + config.header_table_size as usize
        + config.max_header_list_size as usize
        + freeboard_h2::frame::HEADER_LEN
        + MAX_DATA
}

/// Budget bytes a stream is charged beyond its entry: its state in the core and here.
pub(super) fn stream_bound() -> usize {
    freeboard_h2::stream_state_size() + size_of::<(StreamId, StreamSlot)>() + 8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an idle WebSocket stream is charged (its entry in the loop's table and its state
    /// in the core and here) stays within the half KiB aimed at, beyond its connection's
    /// own; the connection's bound is what a crowd of idle connections would withhold.
    #[test]
    fn a_stream_is_charged_under_half_a_kib() {
        let entry = size_of::<super::super::event_loop::Entry<crate::transport::Stream>>();
        let stream = entry + stream_bound();
        println!(
            "stream: entry {entry} B + state {} B = {stream} B; connection bound {} B",
            stream_bound(),
            connection_bound()
        );
        assert!(stream <= 512, "{stream} bytes");
        assert!(connection_bound() < 40 << 10, "{} bytes", connection_bound());
    }
}
