//! HPACK (RFC 7541): a bounded decoder and a stateless encoder for responses.

mod decoder;
mod encoder;
mod header_list;
pub mod huffman;
mod integer;
mod table;

use core::fmt;

pub use decoder::Decoder;
pub use encoder::{encode_field, encode_status};
pub use header_list::HeaderList;

/// A header block that cannot be decoded: a COMPRESSION_ERROR connection error
/// (RFC 9113 §4.3), since the dynamic table is no longer in step with the peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HpackError {
    /// The block ends inside a representation.
    Truncated,
    /// An integer longer than any the block could need.
    IntegerOverflow,
    /// An index past the static and dynamic tables (§2.3.3).
    InvalidIndex,
    /// Huffman data with bad padding or the EOS symbol (§5.2).
    InvalidHuffman,
    /// A dynamic table size update above our SETTINGS_HEADER_TABLE_SIZE (§6.3).
    TableSizeTooLarge,
    /// A dynamic table size update after a field (§4.2).
    MisplacedSizeUpdate,
}

impl fmt::Display for HpackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl core::error::Error for HpackError {}
