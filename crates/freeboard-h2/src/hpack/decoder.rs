//! The header block decoder (RFC 7541 §3, §6).

use super::header_list::HeaderList;
use super::table::{DynamicTable, entry_size};
use super::{HpackError, huffman, integer};

/// Decodes the header blocks of one direction of a connection; holds its dynamic table.
///
/// Bounded twice: the dynamic table by the size we advertise (SETTINGS_HEADER_TABLE_SIZE;
/// a size update above it is an error), and the decoded list by the [`HeaderList`]'s limit.
/// Past the list's limit decoding goes on, so the dynamic table stays in step with the
/// peer's encoder, but fields are dropped, not kept: an HPACK bomb (a large field indexed
/// once and named again many times) costs at most the list's limit plus one table-sized
/// field, and the list reports [`overflowed`](HeaderList::overflowed).
#[derive(Debug, Clone)]
pub struct Decoder {
    table: DynamicTable,
    /// The largest size the peer may choose: our SETTINGS_HEADER_TABLE_SIZE.
    max_allowed: usize,
}

impl Decoder {
    /// A decoder whose peer may use up to `max_table_size` bytes of dynamic table.
    pub fn new(max_table_size: usize) -> Self {
        Self { table: DynamicTable::new(max_table_size), max_allowed: max_table_size }
    }

    /// Changes the largest table the peer may choose (when our new SETTINGS take effect).
    pub fn set_max_allowed(&mut self, max_table_size: usize) {
        self.max_allowed = max_table_size;
        if self.table.max_size() > max_table_size {
            self.table.set_max_size(max_table_size);
        }
    }

    /// Decodes a whole header block into `list` (which it does not clear first).
    ///
    /// An error is a COMPRESSION_ERROR: the table can no longer be trusted (RFC 9113 §4.3).
    pub fn decode(&mut self, block: &[u8], list: &mut HeaderList) -> Result<(), HpackError> {
        let mut pos = 0;
        let mut fields_seen = false;
        while let Some(&first) = block.get(pos) {
            if first & 0x80 != 0 {
                // §6.1 Indexed Header Field.
                let index = integer::decode(block, &mut pos, 7)?;
                let (name, value) = self.table.get(index).ok_or(HpackError::InvalidIndex)?;
                let start = list.scratch().len();
                let complete = entry_size(name, value) <= list.remaining();
                if complete {
                    list.scratch().extend_from_slice(name);
                    list.scratch().extend_from_slice(value);
                }
                list.commit(start, name.len(), complete);
                fields_seen = true;
            } else if first & 0xe0 == 0x20 {
                // §6.3 Dynamic Table Size Update: "This dynamic table size update MUST occur
                // at the beginning of the first header block following the change", and "The
                // new maximum size MUST be lower than or equal to the limit".
                if fields_seen {
                    return Err(HpackError::MisplacedSizeUpdate);
                }
                let size = integer::decode(block, &mut pos, 5)?;
                if size > self.max_allowed {
                    return Err(HpackError::TableSizeTooLarge);
                }
                self.table.set_max_size(size);
            } else {
                // §6.2: with incremental indexing (01xxxxxx, 6-bit index), without indexing
                // (0000xxxx) or never indexed (0001xxxx), both 4-bit.
                let (indexing, prefix) = if first & 0xc0 == 0x40 { (true, 6) } else { (false, 4) };
                let index = integer::decode(block, &mut pos, prefix)?;
                let start = list.scratch().len();
                // Room for the field if it fits the list, or for one the table may keep.
                let room = list.remaining().max(self.table.max_size());
                let limit = start + room;
                let (name_len, mut complete) = if index == 0 {
                    read_string(block, &mut pos, list, limit)?
                } else {
                    let (name, _) = self.table.get(index).ok_or(HpackError::InvalidIndex)?;
                    let fits = name.len() <= room;
                    if fits {
                        list.scratch().extend_from_slice(name);
                    }
                    (name.len(), fits)
                };
                let (value_len, value_complete) = read_string(block, &mut pos, list, limit)?;
                complete &= value_complete;
                if indexing {
                    if complete {
                        let (name, value) = list.scratch()[start..].split_at(name_len);
                        self.table.insert(name, value);
                    } else {
                        // Longer than `room`, so longer than the table: it empties it.
                        debug_assert!(name_len + value_len + 32 > self.table.max_size());
                        self.table.insert_oversized();
                    }
                }
                list.commit(start, name_len, complete);
                fields_seen = true;
            }
        }
        Ok(())
    }
}

/// Reads a string literal (§5.2) at `pos`, appending its octets to the list's scratch while
/// it stays within `limit` bytes. Returns its decoded length and whether all of it was kept.
fn read_string(
    block: &[u8],
    pos: &mut usize,
    list: &mut HeaderList,
    limit: usize,
) -> Result<(usize, bool), HpackError> {
    let huffman = block.get(*pos).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = integer::decode(block, pos, 7)?;
    let raw = block.get(*pos..).and_then(|rest| rest.get(..len)).ok_or(HpackError::Truncated)?;
    *pos += len;
    let out = list.scratch();
    if !huffman {
        let fits = out.len() + raw.len() <= limit;
        if fits {
            out.extend_from_slice(raw);
        }
        return Ok((raw.len(), fits));
    }
    let (mut decoded, mut dropped) = (0, false);
    huffman::decode(raw, |octet| {
        decoded += 1;
        if out.len() < limit {
            out.push(octet);
        } else {
            dropped = true;
        }
    })?;
    Ok((decoded, !dropped))
}

#[cfg(test)]
mod tests {
    use alloc::vec::Vec;

    use super::*;
    use crate::hpack::{encode_field, encode_status};

    fn hex(s: &str) -> Vec<u8> {
        let s: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
        s.chunks(2)
            .map(|p| u8::from_str_radix(core::str::from_utf8(p).unwrap(), 16).unwrap())
            .collect()
    }

    fn decode_all(decoder: &mut Decoder, block: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut list = HeaderList::new(1 << 16);
        decoder.decode(&hex(block), &mut list).unwrap();
        assert!(!list.overflowed());
        list.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect()
    }

    fn fields(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec())).collect()
    }

    /// RFC 7541 C.2: one field of each representation, and what each leaves in the table.
    #[test]
    fn rfc_7541_c2_representations() {
        let cases = [
            (
                "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
                ("custom-key", "custom-header"),
                true,
            ),
            ("040c 2f73 616d 706c 652f 7061 7468", (":path", "/sample/path"), false),
            ("1008 7061 7373 776f 7264 0673 6563 7265 74", ("password", "secret"), false),
            ("82", (":method", "GET"), false),
        ];
        for (block, field, indexed) in cases {
            let mut decoder = Decoder::new(4096);
            assert_eq!(decode_all(&mut decoder, block), fields(&[field]));
            // C.2.1 leaves 55 bytes in the table; the others leave it empty.
            assert_eq!(decoder.table.get(62).is_some(), indexed);
        }
    }

    /// RFC 7541 C.3 (requests, no Huffman) and C.4 (the same with Huffman): three requests
    /// on one connection, the dynamic table carried from one to the next.
    #[test]
    fn rfc_7541_c3_and_c4_requests() {
        let first = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ];
        let second = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ];
        let third = [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ];
        let plain = [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ];
        let huffman = [
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ];
        for blocks in [plain, huffman] {
            let mut decoder = Decoder::new(4096);
            assert_eq!(decode_all(&mut decoder, blocks[0]), fields(&first));
            assert_eq!(decode_all(&mut decoder, blocks[1]), fields(&second));
            assert_eq!(decode_all(&mut decoder, blocks[2]), fields(&third));
            // After C.3.3 / C.4.3 the table holds custom-key, cache-control, :authority: 164 bytes.
            assert_eq!(decoder.table.get(62), Some((&b"custom-key"[..], &b"custom-value"[..])));
            assert_eq!(decoder.table.get(64), Some((&b":authority"[..], &b"www.example.com"[..])));
            assert_eq!(decoder.table.get(65), None);
        }
    }

    /// RFC 7541 C.5 (responses, no Huffman) and C.6 (with Huffman) with a 256-byte table,
    /// where the third response evicts entries.
    #[test]
    fn rfc_7541_c5_and_c6_responses_with_eviction() {
        let date1 = "Mon, 21 Oct 2013 20:13:21 GMT";
        let location = "https://www.example.com";
        let first = [
            (":status", "302"),
            ("cache-control", "private"),
            ("date", date1),
            ("location", location),
        ];
        let second = [
            (":status", "307"),
            ("cache-control", "private"),
            ("date", date1),
            ("location", location),
        ];
        let third = [
            (":status", "200"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
            ("location", location),
            ("content-encoding", "gzip"),
            ("set-cookie", "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"),
        ];
        let plain = [
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133
             2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70
             6c65 2e63 6f6d",
            "4803 3330 37c1 c0bf",
            "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d
             54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049
             5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e
             3d31",
        ];
        let huffman = [
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6
             2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
            "4883 640e ffc1 c0bf",
            "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab
             77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f
             9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        ];
        for blocks in [plain, huffman] {
            let mut decoder = Decoder::new(256);
            assert_eq!(decode_all(&mut decoder, blocks[0]), fields(&first));
            assert_eq!(decode_all(&mut decoder, blocks[1]), fields(&second));
            assert_eq!(decode_all(&mut decoder, blocks[2]), fields(&third));
            // C.5.3: 215 bytes in three entries, the oldest ones evicted.
            assert_eq!(decoder.table.get(62).unwrap().0, b"set-cookie");
            assert_eq!(decoder.table.get(64).unwrap().0, b"date");
            assert_eq!(decoder.table.get(65), None);
        }
    }

    #[test]
    fn an_hpack_bomb_is_dropped_not_kept() {
        // A 4,000-byte value indexed once, then named again 100 times: 400 KB decoded from
        // about 4 KB of block.
        let mut block = alloc::vec![0x40, 0x01, b'x'];
        super::integer::encode(4000, 7, 0x00, &mut block);
        block.extend(core::iter::repeat_n(b'a', 4000));
        block.extend(core::iter::repeat_n(0x80 | 62, 100));
        let mut decoder = Decoder::new(4096);
        let mut list = HeaderList::new(16 << 10);
        decoder.decode(&block, &mut list).unwrap();
        assert!(list.overflowed());
        assert!(list.size() <= 16 << 10);
        assert_eq!(list.len(), 4, "as many 4,033-byte fields as fit in 16 KiB");
        // The table stayed in step: the entry is still there for the next block.
        let mut next = HeaderList::new(16 << 10);
        decoder.decode(&[0x80 | 62], &mut next).unwrap();
        assert_eq!(next.len(), 1);
    }

    #[test]
    fn a_field_larger_than_the_list_still_updates_the_table() {
        // A 20,000-byte literal with incremental indexing: larger than both the list (16 KiB)
        // and the table (4 KiB), so it is dropped and it empties the table (§4.4).
        let mut decoder = Decoder::new(4096);
        let mut list = HeaderList::new(16 << 10);
        decoder.decode(&[0x40, 0x01, b'k', 0x01, b'v'], &mut list).unwrap();
        assert_eq!(decoder.table.get(62), Some((&b"k"[..], &b"v"[..])));
        let mut block = alloc::vec![0x40, 0x01, b'y'];
        super::integer::encode(20_000, 7, 0x00, &mut block);
        block.extend(core::iter::repeat_n(b'z', 20_000));
        decoder.decode(&block, &mut list).unwrap();
        assert!(list.overflowed());
        assert_eq!(decoder.table.get(62), None);
    }

    #[test]
    fn size_updates_are_bounded_and_first() {
        let mut decoder = Decoder::new(4096);
        let mut list = HeaderList::new(1 << 14);
        // 0x3f e1 1f = size update to 4096; 0x3f e2 1f = 4097.
        assert_eq!(decoder.decode(&[0x3f, 0xe1, 0x1f], &mut list), Ok(()));
        assert_eq!(
            decoder.decode(&[0x3f, 0xe2, 0x1f], &mut list),
            Err(HpackError::TableSizeTooLarge)
        );
        assert_eq!(decoder.decode(&[0x82, 0x20], &mut list), Err(HpackError::MisplacedSizeUpdate));
        assert_eq!(decoder.decode(&[0x80 | 70], &mut list), Err(HpackError::InvalidIndex));
        assert_eq!(decoder.decode(&[0x80], &mut list), Err(HpackError::InvalidIndex));
        assert_eq!(decoder.decode(&[0x00, 0x05, b'a'], &mut list), Err(HpackError::Truncated));
    }

    #[test]
    fn the_encoder_round_trips_through_the_decoder() {
        let mut block = Vec::new();
        for status in [200, 101, 404, 431, 503] {
            block.clear();
            encode_status(status, &mut block);
            encode_field(b"content-type", b"text/plain", &mut block);
            encode_field(b"sec-websocket-protocol", b"chat", &mut block);
            let mut list = HeaderList::new(1 << 14);
            Decoder::new(4096).decode(&block, &mut list).unwrap();
            let got: Vec<_> = list.iter().collect();
            let status = alloc::format!("{status}");
            assert_eq!(
                got,
                [
                    (&b":status"[..], status.as_bytes()),
                    (b"content-type", b"text/plain"),
                    (b"sec-websocket-protocol", b"chat"),
                ]
            );
        }
    }
}
