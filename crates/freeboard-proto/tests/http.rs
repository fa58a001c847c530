//! Property tests of the HTTP/1.1 parsers: the chunked decoder against a plain encoder and
//! under every way of splitting its input, `Content-Length` against `u64`'s own parser, query
//! values and header lists against the strings they were built from.

use freeboard_proto::http::{self, ChunkError, Chunked, FramingError, Header, ResponseHead};
use proptest::prelude::*;

/// A chunked body carrying `pieces` (empty ones are left out: a zero size ends the body),
/// with `extension` after every size and `trailer` lines after the last chunk.
fn encode(pieces: &[Vec<u8>], extension: &str, uppercase: bool, trailer: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for piece in pieces.iter().filter(|p| !p.is_empty()) {
        let size = match uppercase {
            true => format!("{:X}", piece.len()),
            false => format!("{:x}", piece.len()),
        };
        out.extend_from_slice(format!("{size}{extension}\r\n").as_bytes());
        out.extend_from_slice(piece);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("0{extension}\r\n").as_bytes());
    for line in trailer {
        out.extend_from_slice(format!("{line}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Decodes `input` fed in the pieces `cuts` makes of it: the data, the bytes used in all, and
/// whether the body completed.
fn decode_in_pieces(
    input: &[u8],
    cuts: &[usize],
    limit: u64,
) -> Result<(Vec<u8>, usize, bool), ChunkError> {
    let mut chunked = Chunked::new(limit);
    let mut data = Vec::new();
    let (mut at, mut used) = (0, 0);
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    bounds.sort_unstable();
    bounds.push(input.len());
    for end in bounds {
        if end < at {
            continue;
        }
        let (n, done) = chunked.feed(&input[at..end], |d| {
            data.extend_from_slice(d);
            true
        })?;
        used += n;
        if done {
            return Ok((data, used, true));
        }
        assert_eq!(n, end - at, "an unfinished body uses all its input");
        at = end;
    }
    Ok((data, used, false))
}

fn extension() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "(;[a-z]{1,8}(=[a-z0-9]{0,8})?){1,3}"]
}

fn trailer() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec("X-[A-Za-z]{1,10}: [ -~]{0,20}", 0..3)
}

proptest! {
    /// What an encoder wrote, the decoder gives back — whole or in any number of pieces,
    /// using exactly the body's bytes and none of what follows it.
    #[test]
    fn chunked_round_trip_at_any_split(
        pieces in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..6),
        extension in extension(),
        uppercase in any::<bool>(),
        trailer in trailer(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
        next in prop::collection::vec(any::<u8>(), 0..20),
    ) {
        let body = encode(&pieces, &extension, uppercase, &trailer);
        let input = [body.as_slice(), &next].concat();
        let whole: Vec<u8> = pieces.concat();
        let limit = whole.len() as u64;
        let (data, used, done) = decode_in_pieces(&input, &[], limit).unwrap();
        prop_assert_eq!((&data, used, done), (&whole, body.len(), true));
        let split = decode_in_pieces(&input, &cuts, limit).unwrap();
        prop_assert_eq!(split, (whole, body.len(), true));
    }

    /// A body one byte over the limit is refused as too large, never decoded past it.
    #[test]
    fn chunked_limit_is_exact(
        pieces in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..200), 1..5),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let body = encode(&pieces, "", false, &[]);
        let total: usize = pieces.iter().map(Vec::len).sum();
        prop_assert_eq!(
            decode_in_pieces(&body, &cuts, total as u64 - 1),
            Err(ChunkError::TooLarge)
        );
    }

    /// Any input: the decoder never panics, never hands over more than the limit, and reports
    /// the same outcome however the input is split.
    #[test]
    fn chunked_split_invariance_on_any_input(
        input in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..200),
            prop::collection::vec(prop::sample::select(b"0123456789abcdefXx;=\r\n :".to_vec()), 0..200),
        ],
        cuts in prop::collection::vec(any::<usize>(), 0..8),
        limit in 0u64..300,
    ) {
        let whole = decode_in_pieces(&input, &[], limit);
        if let Ok((data, _, _)) = &whole {
            prop_assert!(data.len() as u64 <= limit);
        }
        prop_assert_eq!(decode_in_pieces(&input, &cuts, limit), whole);
    }

    /// `Content-Length` is `1*DIGIT` as `u64` reads it (no sign, no blanks inside), trimmed
    /// of whitespace around, and repeated values must agree.
    #[test]
    fn content_length_is_strict(value in "[ \t]{0,2}[+-]?[0-9 ,a]{0,22}[ \t]{0,2}", copies in 1usize..4) {
        let headers: Vec<Header<'_>> = (0..copies)
            .map(|_| Header { name: "Content-Length", value: value.as_bytes() })
            .collect();
        let elements: Vec<&str> = value.split(',').map(|e| e.trim_matches([' ', '\t'])).collect();
        let digits = |e: &str| !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit());
        let parsed: Vec<Option<u64>> =
            elements.iter().map(|e| digits(e).then(|| e.parse().ok()).flatten()).collect();
        let expected = match parsed.first() {
            Some(&Some(n)) if parsed.iter().all(|&p| p == Some(n)) => Ok(Some(n)),
            _ => Err(FramingError::InvalidContentLength),
        };
        prop_assert_eq!(http::content_length(&headers), expected);
    }

    /// The value of the first pair with the key, whatever surrounds it.
    #[test]
    fn query_values_are_found(
        path in "/[a-z/]{0,10}",
        before in prop::collection::vec(("[a-z]{1,6}", "[a-zA-Z0-9._~:-]{0,8}"), 0..4),
        key in "[a-z]{1,6}",
        value in "[a-zA-Z0-9._~:-]{0,12}",
        after in prop::collection::vec(("[a-z]{1,6}", "[a-zA-Z0-9._~:-]{0,8}"), 0..4),
    ) {
        let pairs: Vec<String> = before
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .chain(std::iter::once(format!("{key}={value}")))
            .chain(after.iter().map(|(k, v)| format!("{k}={v}")))
            .collect();
        let target = format!("{path}?{}", pairs.join("&"));
        let first = before.iter().find(|(k, _)| *k == key).map_or(value.as_str(), |(_, v)| v);
        prop_assert_eq!(http::query_value(&target, &key), Some(first));
        prop_assert_eq!(http::target_path(&target), path.as_str());
        let all = http::query_values(&target, &key).count();
        let expected = 1 + before.iter().chain(&after).filter(|(k, _)| *k == key).count();
        prop_assert_eq!(all, expected);
    }

    /// A list spread over fields, with blanks and empty elements, reads as its tokens.
    #[test]
    fn lists_read_across_fields(
        fields in prop::collection::vec(prop::collection::vec("[a-zA-Z0-9-]{1,8}", 0..4), 1..4),
        blanks in prop::collection::vec("[ \t]{0,2}(,[ \t]{0,2})?", 16),
    ) {
        let mut blank = blanks.iter().cycle();
        let values: Vec<String> = fields
            .iter()
            .map(|tokens| {
                tokens.iter().map(|t| format!("{t}{}", blank.next().unwrap())).collect::<Vec<_>>().join(",")
            })
            .collect();
        let headers: Vec<Header<'_>> =
            values.iter().map(|v| Header { name: "Connection", value: v.as_bytes() }).collect();
        let read: Vec<&[u8]> = http::list(&headers, "connection").collect();
        let expected: Vec<&[u8]> = fields.iter().flatten().map(|t| t.as_bytes()).collect();
        prop_assert_eq!(&read, &expected);
        for token in fields.iter().flatten() {
            let upper = token.to_ascii_uppercase();
            prop_assert!(headers.iter().any(|h| http::has_token(h.value, upper.as_bytes())));
        }
    }

    /// A response head written into a buffer is its `Display` text; a buffer one byte short
    /// says how much was required.
    #[test]
    fn response_heads_encode_as_displayed(
        status in 100u16..600,
        headers in "([A-Z][a-z]{0,8}: [ -~]{0,16}\r\n){0,3}",
        content_type in prop::option::of("[a-z]{1,8}/[a-z+]{1,8}"),
        content_length in prop::option::of(0usize..1 << 40),
        close in any::<bool>(),
    ) {
        let head = ResponseHead {
            status,
            headers: &headers,
            content_type: content_type.as_deref(),
            content_length,
            close,
        };
        let text = head.to_string();
        let mut out = vec![0u8; text.len()];
        prop_assert_eq!(head.encode(&mut out), Ok(text.len()));
        prop_assert_eq!(&out, text.as_bytes());
        let short = head.encode(&mut out[..text.len() - 1]).unwrap_err();
        prop_assert_eq!(short.required, text.len());
        let mut headers = [http::EMPTY_HEADER; 8];
        let mut parsed = httparse::Response::new(&mut headers);
        prop_assert_eq!(parsed.parse(text.as_bytes()), Ok(httparse::Status::Complete(text.len())));
        prop_assert_eq!(parsed.code, Some(status));
        let length = http::content_length(parsed.headers);
        prop_assert_eq!(length, Ok(content_length.map(|n| n as u64)));
        let closes = http::header(parsed.headers, "connection").is_some_and(|v| http::has_token(v, b"close"));
        prop_assert_eq!(closes, close);
    }
}
