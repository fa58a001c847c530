//! HPACK's index space (RFC 7541 §2.3): the static table (Appendix A) then the dynamic table.

use alloc::boxed::Box;
use alloc::collections::VecDeque;

/// The static table, Appendix A; index 1 is `STATIC[0]`.
pub(crate) const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// An entry's size: "the sum of its name's length in octets, its value's length in octets,
/// and 32" (§4.1).
pub(crate) const fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

/// The dynamic table (§2.3.2, §4): newest entry first, evicted oldest first.
#[derive(Debug, Clone, Default)]
pub(crate) struct DynamicTable {
    /// Each entry's name and value in one allocation, with the name's length.
    entries: VecDeque<(Box<[u8]>, usize)>,
    /// Invariant: the sum of `entry_size` over `entries`, never above `max_size`.
    size: usize,
    /// The size the encoder chose last (at most what we allow).
    max_size: usize,
}

impl DynamicTable {
    pub(crate) fn new(max_size: usize) -> Self {
        Self { entries: VecDeque::new(), size: 0, max_size }
    }

    pub(crate) fn max_size(&self) -> usize {
        self.max_size
    }

    /// Entry `index` of the whole index space (1-based, static table first).
    pub(crate) fn get(&self, index: usize) -> Option<(&[u8], &[u8])> {
        if index == 0 {
            return None;
        }
        if let Some(&entry) = STATIC.get(index - 1) {
            return Some(entry);
        }
        let (bytes, name_len) = self.entries.get(index - 1 - STATIC.len())?;
        Some(bytes.split_at(*name_len))
    }

    /// Adds an entry, evicting as §4.4 says: "an attempt to add an entry larger than the
    /// maximum size causes the table to be emptied of all existing entries and results in an
    /// empty table."
    pub(crate) fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = entry_size(name, value);
        self.evict_to(self.max_size.saturating_sub(size));
        if size > self.max_size {
            return;
        }
        let mut bytes = alloc::vec::Vec::with_capacity(name.len() + value.len());
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(value);
        self.entries.push_front((bytes.into_boxed_slice(), name.len()));
        self.size += size;
    }

    /// Empties the table as an entry of `size` bytes would (one larger than the table).
    pub(crate) fn insert_oversized(&mut self) {
        self.evict_to(0);
    }

    /// A dynamic table size update (§6.3): evicts down to the new size.
    pub(crate) fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
    }

    fn evict_to(&mut self, size: usize) {
        while self.size > size {
            // NOTE(unwrap): a non-zero size means an entry is there (the invariant on `size`).
            let (bytes, name_len) = self.entries.pop_back().unwrap();
            self.size -= entry_size(&bytes[..name_len], &bytes[name_len..]);
        }
        if self.entries.is_empty() {
            // Give the ring's memory back: an idle connection keeps no table.
            self.entries = VecDeque::new();
        }
    }
}
