//! The send half's framing: the control frames the core owes, and a client's masking keys.

use freeboard_buf::{Limit, MAX_CONTROL_FRAME, Pool, SendQueue, Writability};
use freeboard_proto::Connection;

/// Moves every control frame the core owes (pong, ping, close) into `queue`, masked when
/// `masks` is given; returns the last watermark crossing they caused. Control frames may
/// pass the queue's cap by one frame; `Err` when even that finds no room.
pub(crate) fn queue_control(
    ws: &mut Connection,
    queue: &mut SendQueue,
    pool: &mut Pool<'static>,
    mut masks: Option<&mut MaskSource>,
) -> Result<Option<Writability>, Limit> {
    let mut out = [0u8; MAX_CONTROL_FRAME];
    let mut change = None;
    loop {
        let mask = masks.as_deref_mut().map(MaskSource::next);
        let Ok(Some(n)) = ws.poll_transmit(mask, &mut out) else { return Ok(change) };
        change = queue.push_control(pool, &[&out[..n]])?.or(change);
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Masking keys from the OS random source, fetched 64 at a time; each is used once.
pub(crate) struct MaskSource {
    keys: [u8; 256],
    /// Invariant: `at <= keys.len()`, a multiple of 4.
    at: usize,
}

impl MaskSource {
    pub(crate) fn new() -> Self {
        Self { keys: [0; 256], at: 256 }
    }

    /// A fresh key (§5.3: "unpredictable"), never handed out twice.
    pub(crate) fn next(&mut self) -> [u8; 4] {
        if self.at == self.keys.len() {
            getrandom::fill(&mut self.keys).expect("the OS random source is available");
            self.at = 0;
        }
        let key = [
            self.keys[self.at],
            self.keys[self.at + 1],
            self.keys[self.at + 2],
            self.keys[self.at + 3],
        ];
        self.at += 4;
        key
    }
}
