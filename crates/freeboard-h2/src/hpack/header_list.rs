//! A decoded header list with a fixed bound on its size.

use alloc::vec::Vec;

use super::table::entry_size;

/// The fields of one header block, in order, in one byte buffer.
///
/// Its size is counted as SETTINGS_MAX_HEADER_LIST_SIZE counts it (RFC 9113 §6.5.2: each
/// field's name and value lengths plus 32); a field that would take it past `limit` is not
/// kept and [`overflowed`](Self::overflowed) turns true, so the list never holds more than
/// `limit` bytes however the block decodes.
#[derive(Debug, Clone, Default)]
pub struct HeaderList {
    bytes: Vec<u8>,
    /// (start in `bytes`, name length, value length) per field.
    fields: Vec<(u32, u32, u32)>,
    /// Invariant: the list size of `fields`, at most `limit`.
    size: usize,
    limit: usize,
    overflowed: bool,
}

impl HeaderList {
    /// An empty list that keeps at most `limit` bytes (as SETTINGS_MAX_HEADER_LIST_SIZE counts).
    pub fn new(limit: usize) -> Self {
        Self { limit, ..Self::default() }
    }

    /// The fields, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        // NOTE(unwrap): every index below `len` is a field.
        (0..self.fields.len()).map(|index| self.get(index).unwrap())
    }

    /// Field `index`, in order.
    pub fn get(&self, index: usize) -> Option<(&[u8], &[u8])> {
        let &(start, name_len, value_len) = self.fields.get(index)?;
        let start = start as usize;
        let name_end = start + name_len as usize;
        Some((&self.bytes[start..name_end], &self.bytes[name_end..name_end + value_len as usize]))
    }

    /// How many fields were kept.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether no field was kept.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The list size of the kept fields.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether a field was left out because the list would have passed its limit.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Empties the list; `release` also gives its memory back.
    pub fn clear(&mut self, release: bool) {
        self.size = 0;
        self.overflowed = false;
        if release {
            self.bytes = Vec::new();
            self.fields = Vec::new();
        } else {
            self.bytes.clear();
            self.fields.clear();
        }
    }

    /// Room left, in list-size bytes.
    pub(crate) fn remaining(&self) -> usize {
        self.limit - self.size
    }

    /// The scratch end where the decoder writes the field it is reading.
    pub(crate) fn scratch(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Keeps the field the decoder wrote at `start..` (`name_len` bytes of name, the rest
    /// value) if it fits, else drops it and marks the list overflowed.
    pub(crate) fn commit(&mut self, start: usize, name_len: usize, complete: bool) {
        if complete {
            let (name, value) = self.bytes[start..].split_at(name_len);
            let size = entry_size(name, value);
            if size <= self.remaining() {
                self.fields.push((start as u32, name_len as u32, value.len() as u32));
                self.size += size;
                return;
            }
        }
        self.bytes.truncate(start);
        self.overflowed = true;
    }
}
