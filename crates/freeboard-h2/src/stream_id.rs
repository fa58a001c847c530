//! Stream identifiers (RFC 9113 §5.1.1), shared by frames, errors and the connection.

/// A stream identifier: 31 bits, 0 for the connection itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u32);

impl StreamId {
    /// The connection as a whole (SETTINGS, PING, GOAWAY, its WINDOW_UPDATEs).
    pub const CONNECTION: Self = Self(0);

    /// Whether a client opened it (odd identifiers, §5.1.1).
    pub fn is_client_initiated(self) -> bool {
        self.0 % 2 == 1
    }
}
