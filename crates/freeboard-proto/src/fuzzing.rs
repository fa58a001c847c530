//! Fuzzing entry points, compiled only under `cfg(fuzzing)` (set by `cargo fuzz`).
//!
//! Each function takes the fuzzer's raw bytes, decodes from them what it needs (a role, limits,
//! cut points, an operation script) and checks invariants of the public API, not only that
//! nothing panics. The targets in `fuzz/fuzz_targets/` are one line each.
//!
//! - [`frames`]: a [`Connection`] of either role reading arbitrary bytes.
//! - [`handshake`]: [`Request::parse`] and [`Response::parse`] on arbitrary bytes.
//! - [`chunked`]: the chunked-body decoder, split at any point.
//! - [`utf8`]: the streaming [`Utf8Validator`] against `core::str::from_utf8`.
//! - [`close_payload`]: [`close::parse_payload`] against an independent model.
//! - [`pair`]: a client and a server wired together in memory, driven by an operation script.
//!
//! The helpers allocate (`std` is linked in for fuzzing only): the library itself never does.

extern crate std;

use std::format;
use std::string::{String, ToString};
use std::vec;
use std::vec::Vec;

use crate::close::{self, MAX_REASON_LEN};
use crate::frame::{MAX_CONTROL_PAYLOAD, MAX_HEADER_LEN};
use crate::handshake::{ClientRequest, EMPTY_HEADER, HandshakeError, Key, Request, Response};
use crate::http;
use crate::mask::apply_mask;
use crate::utf8::Utf8Validator;
use crate::{
    CloseCode, Config, Connection, Event, FrameHeader, Instant, MessageKind, OpCode, Payload,
    ProtocolError, Role, State, UsageError,
};

/// Frame decoding: a connection of the role chosen by the first byte reads the rest.
///
/// Layout: `flags`, `limit`, `cut count`, that many read sizes, then the byte stream.
/// `flags` bit 0 picks the client role, bit 1 turns auto-pong on, bit 2 allows RSV1, bit 3
/// lowers the size limits to `limit` (frame) and `4 * limit` (message), bit 4 starts our close
/// handshake before any input, bit 5 ends the stream with EOF.
///
/// Asserts, on every `handle_input` call: consumed ≤ given; progress (bytes consumed or a
/// piece returned); the state only moves Open → CloseSent → Closed; nothing but the single
/// `Closed` event once closed; an error's close code is 1002, 1007 or 1009 and the `Closed`
/// event repeats it; pieces of a message are marked and typed consistently and text is valid
/// UTF-8 up to its last complete code point; every transmitted frame is a well-formed control
/// frame of our role and nothing follows our close frame. Then split invariance: the stream
/// read whole, cut at the fuzzer's read sizes, and one byte at a time gives identical records,
/// transmitted bytes and final state.
pub fn frames(data: &[u8]) {
    let mut script = Script::new(data);
    let flags = script.byte();
    let limit = u64::from(script.byte());
    let role = if flags & 1 == 0 { Role::Server } else { Role::Client };
    let mut config = Config::builder().auto_pong(flags & 2 != 0).allowed_rsv(if flags & 4 != 0 {
        0b100
    } else {
        0
    });
    if flags & 8 != 0 {
        config = config.max_message_size(4 * limit).max_frame_size(limit);
    }
    let config = config.build();
    let close_first = flags & 0x10 != 0;
    let eof_at_end = flags & 0x20 != 0;
    let cut_count = usize::from(script.byte() % 16);
    let sizes: Vec<usize> = (0..cut_count).map(|_| usize::from(script.byte())).collect();
    let stream = script.rest();

    let run = |reads: &mut dyn Iterator<Item = usize>| {
        let mut observer = Observer::new(Connection::new(role, config, Instant(0)));
        if close_first {
            observer.conn.close(Instant(0), CloseCode::NORMAL, "bye").expect("a valid close");
            observer.after_call();
        }
        let mut at = 0;
        while at < stream.len() {
            let len = reads.next().unwrap_or(stream.len()).min(stream.len() - at);
            let mut buf = stream[at..at + len].to_vec();
            observer.read(Instant(0), &mut buf);
            at += len;
        }
        if eof_at_end {
            observer.conn.handle_eof();
            observer.after_call();
            assert_eq!(observer.conn.state(), State::Closed, "EOF closes");
        }
        observer.outcome()
    };
    let whole = run(&mut core::iter::once(stream.len()));
    // A size of 0 is an empty read; all zeros would never finish, so they read one byte.
    let all_zero = sizes.iter().all(|&n| n == 0);
    let mut cut = sizes.iter().cycle().map(|&n| if all_zero { 1 } else { n });
    let split = run(&mut cut);
    assert_eq!(whole, split, "read whole vs cut at {sizes:?}");
    let bytewise = run(&mut core::iter::repeat(1));
    assert_eq!(whole, bytewise, "read whole vs one byte at a time");
}

/// The opening handshake: the request parser (flags bit 0 clear) or the response parser for a
/// fixed client request (bit 0 set) over arbitrary bytes.
///
/// Layout: `flags`, `limit` (the head limit is `16 + 32 * limit`), `headers` (the header array
/// holds `1 + headers % 32`), then the bytes.
///
/// Asserts: the length of a complete head is ≤ the bytes given (and ≤ the limit for a
/// request); `Ok(None)` only for input shorter than the limit; a refusal's response fits 1 KiB
/// and starts with `HTTP/1.1 <status> `; an accepted request's 101 fits 1 KiB; a response's
/// protocol and extensions were offered. Prefix stability: once the head is complete at `L`
/// bytes, the first `L` bytes alone, and followed by other bytes, give the same result, and
/// shorter prefixes need more bytes (or are too large for the limit); a head longer than the
/// limit is `HeadTooLarge` even when it arrives whole, as it would be read in pieces.
pub fn handshake(data: &[u8]) {
    let mut script = Script::new(data);
    let flags = script.byte();
    let max_head_len = 16 + 32 * usize::from(script.byte());
    let header_count = 1 + usize::from(script.byte() % 32);
    let input = script.rest();
    if flags & 1 == 0 {
        let outcome = |bytes: &[u8]| request_outcome(bytes, header_count, max_head_len);
        let mut headers = vec![EMPTY_HEADER; header_count];
        let complete = httparse::Request::new(&mut headers).parse(input);
        check_prefix_stability(input, complete, max_head_len, outcome);
    } else {
        let outcome = |bytes: &[u8]| response_outcome(bytes, header_count, max_head_len);
        let mut headers = vec![EMPTY_HEADER; header_count];
        let complete = httparse::Response::new(&mut headers).parse(input);
        check_prefix_stability(input, complete, max_head_len, outcome);
    }
}

/// The chunked-body decoder ([`http::Chunked`]) over arbitrary bytes cut at fuzzer-chosen
/// points.
///
/// Layout: `limit` (the body limit is `limit * 8` bytes), `count`, then `count % 8` piece
/// lengths, then the bytes (their remainder is the last piece).
///
/// Asserts: the bytes used are at most those given, and all of them while the body is
/// unfinished; the data handed over is at most the limit and is what [`http::Chunked::decoded`]
/// counts; split invariance: the input fed whole, in the fuzzer's pieces, and one byte at a
/// time gives the same data, bytes used, completion and error; a body complete after `U` bytes
/// is complete, with the same data, from those `U` bytes alone.
pub fn chunked(data: &[u8]) {
    let mut script = Script::new(data);
    let limit = u64::from(script.byte()) * 8;
    let count = usize::from(script.byte() % 8);
    let lens: Vec<usize> = (0..count).map(|_| usize::from(script.byte())).collect();
    let input = script.rest();
    let decode = |cuts: &mut dyn Iterator<Item = usize>| {
        let mut chunked = http::Chunked::new(limit);
        let mut body = Vec::new();
        let (mut at, mut used) = (0, 0);
        loop {
            let end = cuts.next().map_or(input.len(), |len| (at + len).min(input.len()));
            let piece = &input[at..end];
            let fed = chunked.feed(piece, |d| {
                body.extend_from_slice(d);
                true
            });
            let outcome = match fed {
                Err(e) => Err(e),
                Ok((n, done)) => {
                    assert!(n <= piece.len(), "used {n} of {} bytes", piece.len());
                    assert!(done || n == piece.len(), "an unfinished body uses all its input");
                    assert_eq!(done, chunked.is_done());
                    used += n;
                    Ok(done)
                }
            };
            assert!(body.len() as u64 <= limit, "{} bytes past the limit {limit}", body.len());
            assert_eq!(chunked.decoded(), body.len() as u64);
            if outcome.is_err() {
                // An error reports no count: the body is refused whatever came before.
                return (outcome, body, 0);
            }
            if outcome == Ok(true) || end == input.len() {
                return (outcome, body, used);
            }
            at = end;
        }
    };
    let whole = decode(&mut core::iter::empty());
    let pieces = decode(&mut lens.into_iter());
    let bytes = decode(&mut core::iter::repeat(1));
    assert_eq!(pieces, whole, "the fuzzer's pieces");
    assert_eq!(bytes, whole, "one byte at a time");
    if let (Ok(true), body, used) = &whole {
        let mut alone = http::Chunked::new(limit);
        let mut again = Vec::new();
        let fed = alone.feed(&input[..*used], |d| {
            again.extend_from_slice(d);
            true
        });
        assert_eq!(fed, Ok((*used, true)), "complete from its own bytes");
        assert_eq!(&again, body);
    }
}

/// Streaming UTF-8 validation over fuzzer-cut pieces.
///
/// Layout: `count`, then `count % 8` piece lengths, then the text (its remainder is the last
/// piece).
///
/// Asserts: the validator accepts exactly what `core::str::from_utf8` accepts; it fails in the
/// piece holding the first byte after which no continuation could be valid (at most 3 bytes
/// after `valid_up_to()`), or in the last piece when the text ends inside a code point, and not
/// before; between pieces, `is_complete` says whether the text so far ends on a code point
/// boundary.
pub fn utf8(data: &[u8]) {
    let mut script = Script::new(data);
    let count = usize::from(script.byte() % 8);
    let lens: Vec<usize> = (0..count).map(|_| usize::from(script.byte())).collect();
    let text = script.rest();
    let mut pieces = Vec::new();
    let mut at = 0;
    for len in lens {
        let end = (at + len).min(text.len());
        pieces.push(&text[at..end]);
        at = end;
    }
    pieces.push(&text[at..]);

    // The index of the first byte that makes the text impossible to complete, or `len` when
    // it is only unfinished at the end.
    let fails_at = match core::str::from_utf8(text) {
        Ok(_) => None,
        Err(e) if e.error_len().is_none() => Some(text.len()),
        Err(e) => {
            let start = e.valid_up_to();
            let at = (start..text.len())
                .find(|&i| {
                    core::str::from_utf8(&text[start..=i]).is_err_and(|e| e.error_len().is_some())
                })
                .expect("an invalid sequence is found within 4 bytes");
            assert!(at <= start + 3, "an invalid sequence spans at most 4 bytes");
            Some(at)
        }
    };
    let mut validator = Utf8Validator::new();
    let mut start = 0;
    for (i, piece) in pieces.iter().enumerate() {
        let end = start + piece.len();
        let last = i + 1 == pieces.len();
        let result = validator.feed(piece, last);
        match fails_at {
            None => assert_eq!(result, Ok(()), "valid UTF-8 rejected in piece {i}"),
            Some(at) if at < end || (last && at == end) => {
                assert_eq!(result, Err(ProtocolError::InvalidUtf8), "invalid byte {at} accepted");
                return;
            }
            Some(at) => assert_eq!(result, Ok(()), "failed in piece {i} before byte {at}"),
        }
        if !last {
            let boundary = core::str::from_utf8(&text[..end]).is_ok();
            assert_eq!(validator.is_complete(), boundary, "is_complete after {end} bytes");
        }
        start = end;
    }
    assert!(validator.is_complete(), "a finished message leaves nothing carried");
}

/// The close frame payload: [`close::parse_payload`] against a model written from RFC 6455
/// §5.5.1 and §7.4 and the IANA registry, then the same payload through a connection.
///
/// Asserts: the parse agrees with the model (empty → 1005; one byte → error; a code that may
/// not be sent → error; a reason that is not UTF-8 → error); a server reading a close frame
/// with this payload reports the same code and reason as a clean close, or fails with the same
/// error; when the code may be sent and the reason fits, `Connection::close` writes a frame
/// whose payload parses back to them.
pub fn close_payload(data: &[u8]) {
    let model: Result<(u16, &str), ProtocolError> = match data {
        [] => Ok((1005, "")),
        [_] => Err(ProtocolError::InvalidClosePayload),
        [hi, lo, reason @ ..] => {
            let code = u16::from_be_bytes([*hi, *lo]);
            let registered =
                [1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014];
            if !(registered.contains(&code) || (3000..5000).contains(&code)) {
                Err(ProtocolError::InvalidCloseCode(code))
            } else {
                core::str::from_utf8(reason)
                    .map(|reason| (code, reason))
                    .map_err(|_| ProtocolError::InvalidUtf8)
            }
        }
    };
    assert_eq!(close::parse_payload(data).map(|(code, reason)| (code.0, reason)), model);

    if data.len() <= MAX_CONTROL_PAYLOAD {
        let mut frame = vec![0u8; MAX_HEADER_LEN + data.len()];
        let key = [0x37, 0xfa, 0x21, 0x3d];
        let n = encode_frame(OpCode::Close, true, data, Some(key), &mut frame);
        let mut server = Observer::new(Connection::new(Role::Server, Config::DEFAULT, Instant(0)));
        server.read(Instant(0), &mut frame[..n]);
        let expected = match model {
            Ok((code, reason)) => {
                vec![Record::Closed { code, reason: reason.to_string(), clean: true }]
            }
            Err(e) => vec![
                Record::Error(e),
                Record::Closed {
                    code: e.close_code().0,
                    reason: e.reason().to_string(),
                    clean: false,
                },
            ],
        };
        assert_eq!(server.records, expected, "a close frame carrying {data:x?}");
    }

    if let (Ok((code, reason)), [_, _, ..]) = (model, data) {
        let mut client = Connection::new(Role::Client, Config::DEFAULT, Instant(0));
        let result = client.close(Instant(0), CloseCode(code), reason);
        if reason.len() > MAX_REASON_LEN {
            assert_eq!(result, Err(UsageError::ControlPayloadTooLong));
            return;
        }
        result.expect("a sendable code and a short reason");
        let mut out = [0u8; MAX_HEADER_LEN + MAX_CONTROL_PAYLOAD];
        let n = client.poll_transmit(Some([1, 2, 3, 4]), &mut out).unwrap().expect("a close frame");
        let (header, header_len) = FrameHeader::parse(&out[..n]).unwrap().expect("a whole header");
        let payload = &mut out[header_len..n];
        apply_mask(payload, header.mask.expect("a client masks"), 0);
        assert_eq!(close::parse_payload(payload).map(|(c, r)| (c.0, r)), Ok((code, reason)));
    }
}

/// A client and a server in memory, driven by an operation script decoded from `data`.
///
/// The first byte configures both ends (bit 0 auto-pong, bit 1 a 1 s keep-alive ping, bit 2 a
/// short close timeout). Then each operation is a byte (its value modulo 9 picks it) and its
/// arguments: send a whole message (through `send_frame` or `send_header`), start or continue
/// a fragmented one (cuts may fall inside a code point), ping, close with a code from a table
/// (some not sendable) and a reason (sometimes too long), deliver some of the bytes in flight
/// to one side cut in a pattern of reads, advance the virtual clock and run the timers, end
/// one side's transport, deliver everything.
///
/// Asserts, beside each connection's per-call invariants (see [`frames`]): every API misuse
/// gets the `UsageError` a model predicts; honest peers never see a protocol error; each side
/// receives a prefix of the messages and pings the other sent, intact and in order, and all of
/// them once its close is clean; a close is clean unless it is 1006 (EOF or a timer); after
/// `handle_timeout` no deadline is due and a closed connection has none. At the end every open
/// side closes and the pair is driven: both end `Closed`, cleanly if no 1006 happened before.
pub fn pair(data: &[u8]) {
    let mut script = Script::new(data);
    let setup = script.byte();
    let mut config = Config::builder().auto_pong(setup & 1 != 0);
    if setup & 2 != 0 {
        config = config.ping_interval(Some(core::time::Duration::from_secs(1)));
    }
    if setup & 4 != 0 {
        config = config.close_timeout(core::time::Duration::from_millis(100));
    }
    let config = config.build();
    let mut pair = Pair {
        ends: [Peer::new(Role::Client, config), Peer::new(Role::Server, config)],
        now: Instant(0),
    };
    let mut ops = 0;
    while !script.is_empty() && ops < 256 {
        ops += 1;
        let op = script.byte() % 9;
        let side = usize::from(script.byte() & 1);
        match op {
            0 => {
                let kind =
                    if script.byte() & 1 == 0 { MessageKind::Text } else { MessageKind::Binary };
                let via_header = script.byte() & 1 != 0;
                let content = content(kind, &mut script);
                pair.send_whole(side, kind, content, via_header);
            }
            1 => {
                let kind =
                    if script.byte() & 1 == 0 { MessageKind::Text } else { MessageKind::Binary };
                let content = content(kind, &mut script);
                let first = usize::from(script.byte());
                pair.start_fragmented(side, kind, content, first);
            }
            2 => {
                let n = usize::from(script.byte());
                let fin = script.byte() & 1 != 0;
                pair.continue_fragmented(side, n, fin);
            }
            3 => {
                let len = usize::from(script.byte() % 131);
                let payload: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7) ^ 0x5a).collect();
                pair.ping(side, &payload);
            }
            4 => {
                const CODES: [u16; 10] =
                    [1000, 1001, 1003, 1011, 4000, 1005, 1006, 999, 1015, 5000];
                let code = CODES[usize::from(script.byte()) % CODES.len()];
                let reason = "ø".repeat(usize::from(script.byte() % 64));
                pair.close(side, CloseCode(code), &reason);
            }
            5 => {
                let n = usize::from(script.u16());
                let pattern = [usize::from(script.byte() % 32), usize::from(script.byte() % 32)];
                pair.deliver(side, n, &pattern);
            }
            6 => {
                let ms = u64::from(script.u16()) * 4;
                pair.advance(ms);
            }
            7 => pair.eof(side),
            _ => pair.drive(),
        }
        pair.check();
    }
    pair.finish();
}

/// The fuzzer's bytes read front to back as small decisions; zeros once they run out.
struct Script<'a> {
    bytes: &'a [u8],
}

impl<'a> Script<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    fn byte(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&b, rest)) => {
                self.bytes = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn rest(&mut self) -> &'a [u8] {
        core::mem::take(&mut self.bytes)
    }
}

/// What a connection reported, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Record {
    Message { kind: MessageKind, compressed: bool, data: Vec<u8> },
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Closed { code: u16, reason: String, clean: bool },
    Error(ProtocolError),
}

/// Everything a run produced: compared across different cuttings of the same bytes.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    records: Vec<Record>,
    transmitted: Vec<u8>,
    state: State,
}

/// A message being reassembled from its pieces.
struct Assembly {
    kind: MessageKind,
    compressed: bool,
    data: Vec<u8>,
    /// `data[..valid_to]` ends on a code point boundary (text only).
    valid_to: usize,
}

/// Drives one connection the way [`Connection`]'s documentation says and checks every answer.
struct Observer {
    conn: Connection,
    records: Vec<Record>,
    assembling: Option<Assembly>,
    /// Frames transmitted and not yet collected.
    transmitted: Vec<u8>,
    /// Every frame ever transmitted, for [`Outcome`].
    transmitted_all: Vec<u8>,
    state: State,
    closed_seen: bool,
    close_sent: bool,
    /// Counts transmitted frames; gives deterministic masking keys.
    frames_out: u32,
}

impl Observer {
    fn new(conn: Connection) -> Self {
        let state = conn.state();
        assert_eq!(state, State::Open, "a new connection is open");
        Self {
            conn,
            records: Vec::new(),
            assembling: None,
            transmitted: Vec::new(),
            transmitted_all: Vec::new(),
            state,
            closed_seen: false,
            close_sent: false,
            frames_out: 0,
        }
    }

    fn role(&self) -> Role {
        self.conn.role()
    }

    fn mask(&self) -> Option<[u8; 4]> {
        (self.role() == Role::Client).then(|| {
            self.frames_out.wrapping_mul(0x9e37_79b9).wrapping_add(0x7f4a_7c15).to_le_bytes()
        })
    }

    /// One read: `handle_input` until the buffer is used up, draining after each call.
    fn read(&mut self, now: Instant, buf: &mut [u8]) {
        if buf.is_empty() {
            let input = self.conn.handle_input(now, buf).expect("an empty read cannot fail");
            assert_eq!((input.consumed, input.payload), (0, None), "an empty read does nothing");
            self.after_call();
            return;
        }
        let mut at = 0;
        while at < buf.len() {
            let before = self.conn.state();
            let available = buf.len() - at;
            match self.conn.handle_input(now, &mut buf[at..]) {
                Ok(input) => {
                    assert!(
                        input.consumed <= available,
                        "consumed {} of {available}",
                        input.consumed
                    );
                    assert!(
                        input.consumed > 0 || input.payload.is_some(),
                        "handle_input made no progress"
                    );
                    if before == State::Closed {
                        assert_eq!(input.consumed, available, "a closed connection ignores input");
                        assert!(input.payload.is_none(), "a payload after Closed");
                    }
                    if let Some(piece) = input.payload {
                        self.piece(piece);
                    }
                    at += input.consumed;
                    self.after_call();
                }
                Err(e) => {
                    assert_ne!(before, State::Closed, "an error after Closed");
                    assert!(
                        matches!(e.close_code().0, 1002 | 1007 | 1009),
                        "{e:?} maps to close code {}",
                        e.close_code()
                    );
                    self.records.push(Record::Error(e));
                    self.after_call();
                    assert_eq!(self.conn.state(), State::Closed, "an error closes");
                    let expected = Record::Closed {
                        code: e.close_code().0,
                        reason: e.reason().to_string(),
                        clean: false,
                    };
                    assert_eq!(
                        self.records.last(),
                        Some(&expected),
                        "the Closed event after {e:?}"
                    );
                    return;
                }
            }
        }
    }

    fn piece(&mut self, piece: Payload<'_>) {
        assert!(!self.closed_seen, "a payload after the Closed event");
        assert!(piece.frame_fin || !piece.message_fin, "a message ends with its frame");
        match &self.assembling {
            None => {
                assert!(piece.message_start, "the first piece of a message is marked");
                self.assembling = Some(Assembly {
                    kind: piece.kind,
                    compressed: piece.compressed,
                    data: Vec::new(),
                    valid_to: 0,
                });
            }
            Some(assembly) => {
                assert!(!piece.message_start, "only the first piece is marked");
                assert_eq!((assembly.kind, assembly.compressed), (piece.kind, piece.compressed));
            }
        }
        let assembly = self.assembling.as_mut().expect("set above");
        assembly.data.extend_from_slice(piece.data);
        let max = self.conn.config().max_message_size;
        assert!(assembly.data.len() as u64 <= max, "a message over max_message_size");
        if assembly.kind == MessageKind::Text && !assembly.compressed {
            match core::str::from_utf8(&assembly.data[assembly.valid_to..]) {
                Ok(_) => assembly.valid_to = assembly.data.len(),
                Err(e) if e.error_len().is_none() && !piece.message_fin => {
                    assembly.valid_to += e.valid_up_to();
                }
                Err(e) => panic!("text returned that is not UTF-8: {e}"),
            }
        }
        if piece.message_fin {
            let Assembly { kind, compressed, data, .. } =
                self.assembling.take().expect("a message is assembling");
            self.records.push(Record::Message { kind, compressed, data });
        }
    }

    /// Drains events and transmissions after any call, checking the state's progress.
    fn after_call(&mut self) {
        let state = self.conn.state();
        let rank = |s: State| match s {
            State::Open => 0,
            State::CloseSent => 1,
            State::Closed => 2,
        };
        assert!(rank(state) >= rank(self.state), "state went from {:?} to {state:?}", self.state);
        self.state = state;
        while let Some(event) = self.conn.poll_event() {
            assert!(!self.closed_seen, "an event after Closed: {event:?}");
            self.records.push(match event {
                Event::Ping(p) => {
                    assert!(p.len() <= MAX_CONTROL_PAYLOAD);
                    Record::Ping(p.to_vec())
                }
                Event::Pong(p) => {
                    assert!(p.len() <= MAX_CONTROL_PAYLOAD);
                    Record::Pong(p.to_vec())
                }
                Event::Closed { code, reason, clean } => {
                    assert_eq!(state, State::Closed, "a Closed event in state {state:?}");
                    self.closed_seen = true;
                    Record::Closed { code: code.0, reason: reason.to_string(), clean }
                }
            });
        }
        if state == State::Closed {
            assert!(self.closed_seen, "Closed without its event");
            assert_eq!(self.conn.poll_timeout(), None, "a closed connection runs no timer");
        }
        let mut out = [0u8; MAX_HEADER_LEN + MAX_CONTROL_PAYLOAD];
        loop {
            let mask = self.mask();
            let Some(n) = self.conn.poll_transmit(mask, &mut out).expect("131 bytes suffice")
            else {
                break;
            };
            self.check_transmitted(&out[..n]);
            self.frames_out += 1;
            self.transmitted.extend_from_slice(&out[..n]);
            self.transmitted_all.extend_from_slice(&out[..n]);
        }
    }

    /// A frame from `poll_transmit`: one whole control frame, masked as our role requires.
    fn check_transmitted(&mut self, frame: &[u8]) {
        assert!(!self.close_sent, "a frame after our close frame");
        let (header, header_len) =
            FrameHeader::parse(frame).expect("a valid header").expect("a whole header");
        assert_eq!(header_len as u64 + header.payload_len, frame.len() as u64, "one whole frame");
        assert!(header.opcode.is_control() && header.fin && header.rsv == 0);
        assert_eq!(header.mask, self.mask(), "the key we passed, and only on the client");
        let mut payload = frame[header_len..].to_vec();
        if let Some(key) = header.mask {
            apply_mask(&mut payload, key, 0);
        }
        if header.opcode == OpCode::Close {
            self.close_sent = true;
            close::parse_payload(&payload).expect("our close payload is valid");
        }
    }

    fn outcome(self) -> Outcome {
        Outcome { records: self.records, transmitted: self.transmitted_all, state: self.state }
    }

    fn closed_record(&self) -> Option<(u16, bool)> {
        self.records.iter().find_map(|r| match r {
            Record::Closed { code, clean, .. } => Some((*code, *clean)),
            _ => None,
        })
    }
}

/// The result of a request parse, owned so that runs over different bytes compare.
type RequestOutcome = Result<Option<(String, usize)>, HandshakeError>;
/// The result of a response parse: length, protocol, extension names.
type ResponseOutcome = Result<Option<(usize, Option<String>, Vec<String>)>, HandshakeError>;

fn request_outcome(buf: &[u8], header_count: usize, max_head_len: usize) -> RequestOutcome {
    let mut headers = vec![EMPTY_HEADER; header_count];
    match Request::parse(buf, &mut headers, max_head_len) {
        Ok(Some((request, len))) => {
            assert!(len <= buf.len() && len <= max_head_len, "head of {len} bytes");
            let mut out = [0u8; 1024];
            let n = request.accept(None, None, &mut out).expect("a 101 fits 1 KiB");
            assert!(out[..n].starts_with(b"HTTP/1.1 101 Switching Protocols\r\n"));
            let _ = (request.host(), request.origin(), request.headers().len());
            let _ = request.check_origin(&["https://example.com"]);
            let _ = request.select_protocol(&["chat", "superchat"]);
            let _ = request.extensions().count();
            Ok(Some((request.path().to_string(), len)))
        }
        Ok(None) => {
            assert!(buf.len() < max_head_len, "Ok(None) for {} bytes", buf.len());
            Ok(None)
        }
        Err(e) => {
            let mut out = [0u8; 1024];
            let n = e.write_response(&mut out).expect("a refusal fits 1 KiB");
            let status = e.status();
            assert!(matches!(status, 400 | 403 | 405 | 426 | 431), "{e:?} answers {status}");
            let line = format!("HTTP/1.1 {status} ");
            assert!(out[..n].starts_with(line.as_bytes()), "{e:?} starts its response wrong");
            Err(e)
        }
    }
}

/// The key of the fixed client request the response fuzzer answers.
const CLIENT_KEY: Key = *b"dGhlIHNhbXBsZSBub25jZQ==";

fn response_outcome(buf: &[u8], header_count: usize, max_head_len: usize) -> ResponseOutcome {
    let protocols = ["chat", "superchat"];
    let request = ClientRequest {
        host: "server.example.com",
        path: "/chat",
        key: &CLIENT_KEY,
        protocols: &protocols,
        extensions: Some("permessage-deflate; client_max_window_bits, x-custom"),
        headers: &[],
    };
    let mut headers = vec![EMPTY_HEADER; header_count];
    match Response::parse(buf, &mut headers, &request, max_head_len) {
        Ok(Some((response, len))) => {
            assert!(len <= buf.len(), "head of {len} bytes in {}", buf.len());
            let protocol = response.protocol();
            assert!(protocol.is_none_or(|p| protocols.contains(&p)), "{protocol:?} not offered");
            let extensions: Vec<String> =
                response.extensions().map(|e| e.name.to_string()).collect();
            // Extension names match the offer whatever their case (as HTTP tokens do).
            for name in &extensions {
                assert!(
                    ["permessage-deflate", "x-custom"].iter().any(|o| name.eq_ignore_ascii_case(o)),
                    "{name} not offered"
                );
            }
            Ok(Some((len, protocol.map(ToString::to_string), extensions)))
        }
        Ok(None) => {
            assert!(buf.len() < max_head_len, "Ok(None) for {} bytes", buf.len());
            Ok(None)
        }
        Err(HandshakeError::Refused { status, head_len }) => {
            assert_ne!(status, 101);
            assert!(head_len <= buf.len());
            Err(HandshakeError::Refused { status, head_len })
        }
        Err(e) => Err(e),
    }
}

/// Once httparse finds the head complete at `L` bytes, the result depends on those `L` bytes
/// only, and every shorter prefix needs more bytes (or is over the limit).
fn check_prefix_stability<T: PartialEq + core::fmt::Debug>(
    input: &[u8],
    complete: httparse::Result<usize>,
    max_head_len: usize,
    outcome: impl Fn(&[u8]) -> Result<Option<T>, HandshakeError>,
) {
    let result = outcome(input);
    let Ok(httparse::Status::Complete(len)) = complete else { return };
    if len > max_head_len {
        // Read in pieces, the head would have been refused once `max_head_len` bytes were in.
        assert_eq!(result, Err(HandshakeError::HeadTooLarge), "a {len}-byte head read whole");
    }
    assert_eq!(outcome(&input[..len]), result, "the head alone");
    let mut longer = input[..len].to_vec();
    longer.extend_from_slice(b"\x81\x85\x00\x00\x00\x00hello\r\n\r\n");
    assert_eq!(outcome(&longer), result, "the head followed by other bytes");
    for cut in [0, len / 2, len.saturating_sub(1)] {
        if cut < len {
            let shorter = outcome(&input[..cut]);
            if cut < max_head_len {
                assert_eq!(shorter, Ok(None), "a {cut}-byte prefix of a {len}-byte head");
            } else {
                assert_eq!(
                    shorter,
                    Err(HandshakeError::HeadTooLarge),
                    "{cut} bytes over the limit"
                );
            }
        }
    }
}

/// Writes a frame with no checks (test input).
fn encode_frame(
    opcode: OpCode,
    fin: bool,
    payload: &[u8],
    mask: Option<[u8; 4]>,
    out: &mut [u8],
) -> usize {
    let header = FrameHeader { fin, rsv: 0, opcode, mask, payload_len: payload.len() as u64 };
    let n = header.encode(out).expect("sized by the caller");
    out[n..n + payload.len()].copy_from_slice(payload);
    if let Some(key) = mask {
        apply_mask(&mut out[n..n + payload.len()], key, 0);
    }
    n + payload.len()
}

/// A message body from a length and a seed: text mixes 1- to 4-byte code points.
fn content(kind: MessageKind, script: &mut Script<'_>) -> Vec<u8> {
    let spec = script.byte();
    let len = if spec & 0x80 != 0 { usize::from(script.u16()) } else { usize::from(spec) };
    let mut seed = u32::from(script.byte()) | 1;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    match kind {
        MessageKind::Binary => (0..len).map(|_| next() as u8).collect(),
        MessageKind::Text => {
            const CHARS: [&str; 8] = ["a", "Z", " ", "é", "ж", "€", "한", "𝄞"];
            let mut text = String::new();
            while text.len() < len {
                text.push_str(CHARS[next() as usize % CHARS.len()]);
            }
            text.into_bytes()
        }
    }
}

/// One end of the in-memory pair and what its user did.
struct Peer {
    observer: Observer,
    /// Bytes in flight towards this end.
    inbox: Vec<u8>,
    /// Messages this end finished sending, in order.
    sent: Vec<(MessageKind, Vec<u8>)>,
    /// Payloads of the pings this end sent, in order.
    pings: Vec<Vec<u8>>,
    /// A fragmented message being sent: its kind, its content, the bytes sent so far.
    outgoing: Option<(MessageKind, Vec<u8>, usize)>,
    eof: bool,
}

impl Peer {
    fn new(role: Role, config: Config) -> Self {
        Self {
            observer: Observer::new(Connection::new(role, config, Instant(0))),
            inbox: Vec::new(),
            sent: Vec::new(),
            pings: Vec::new(),
            outgoing: None,
            eof: false,
        }
    }

    /// The `UsageError` a data frame send gets, by the documented rules.
    fn expected_send(&mut self, continuation: bool) -> Result<(), UsageError> {
        if self.observer.conn.state() != State::Open {
            self.outgoing = None;
            return Err(UsageError::AfterClose);
        }
        match (continuation, self.outgoing.is_some()) {
            (false, true) => Err(UsageError::MessageInProgress),
            (true, false) => Err(UsageError::NoMessageInProgress),
            _ => Ok(()),
        }
    }

    /// Sends one data frame, through `send_frame` or `send_header` plus the payload.
    fn send_frame(
        &mut self,
        opcode: OpCode,
        fin: bool,
        payload: &[u8],
        via_header: bool,
    ) -> Result<Vec<u8>, UsageError> {
        let mask = self.observer.mask();
        self.observer.frames_out += 1;
        let mut out = vec![0u8; MAX_HEADER_LEN + payload.len()];
        let conn = &mut self.observer.conn;
        let n = if via_header {
            let n = conn.send_header(opcode, fin, payload.len() as u64, mask, &mut out)?;
            out[n..n + payload.len()].copy_from_slice(payload);
            if let Some(key) = mask {
                apply_mask(&mut out[n..n + payload.len()], key, 0);
            }
            n + payload.len()
        } else {
            conn.send_frame(opcode, fin, payload, mask, &mut out)?
        };
        out.truncate(n);
        Ok(out)
    }
}

struct Pair {
    /// The client (0) and the server (1).
    ends: [Peer; 2],
    now: Instant,
}

impl Pair {
    fn send_whole(&mut self, side: usize, kind: MessageKind, content: Vec<u8>, via_header: bool) {
        let end = &mut self.ends[side];
        let expected = end.expected_send(false);
        let opcode = if kind == MessageKind::Text { OpCode::Text } else { OpCode::Binary };
        let result = end.send_frame(opcode, true, &content, via_header);
        assert_eq!(result.as_ref().err(), expected.as_ref().err(), "sending a whole message");
        if let Ok(bytes) = result {
            end.sent.push((kind, content));
            self.ends[1 - side].inbox.extend_from_slice(&bytes);
        }
    }

    fn start_fragmented(&mut self, side: usize, kind: MessageKind, content: Vec<u8>, first: usize) {
        let end = &mut self.ends[side];
        let expected = end.expected_send(false);
        let opcode = if kind == MessageKind::Text { OpCode::Text } else { OpCode::Binary };
        let first = first.min(content.len());
        let result = end.send_frame(opcode, false, &content[..first], false);
        assert_eq!(result.as_ref().err(), expected.as_ref().err(), "starting a fragmented message");
        if let Ok(bytes) = result {
            end.outgoing = Some((kind, content, first));
            self.ends[1 - side].inbox.extend_from_slice(&bytes);
        }
    }

    fn continue_fragmented(&mut self, side: usize, n: usize, fin: bool) {
        let end = &mut self.ends[side];
        let expected = end.expected_send(true);
        let (kind, content, at) =
            end.outgoing.take().unwrap_or((MessageKind::Binary, Vec::new(), 0));
        // The last fragment carries the rest, so that a text message ends on a code point.
        let to = if fin { content.len() } else { (at + n).min(content.len()) };
        let result = end.send_frame(OpCode::Continuation, fin, &content[at..to], n & 1 != 0);
        assert_eq!(
            result.as_ref().err(),
            expected.as_ref().err(),
            "continuing a fragmented message"
        );
        if let Ok(bytes) = result {
            if fin {
                end.sent.push((kind, content));
            } else {
                end.outgoing = Some((kind, content, to));
            }
            self.ends[1 - side].inbox.extend_from_slice(&bytes);
        }
    }

    fn ping(&mut self, side: usize, payload: &[u8]) {
        let end = &mut self.ends[side];
        let expected = if end.observer.conn.state() != State::Open {
            Err(UsageError::AfterClose)
        } else if payload.len() > MAX_CONTROL_PAYLOAD {
            Err(UsageError::ControlPayloadTooLong)
        } else {
            Ok(())
        };
        let mask = end.observer.mask();
        let mut out = [0u8; MAX_HEADER_LEN + MAX_CONTROL_PAYLOAD];
        let result = end.observer.conn.send_ping(payload, mask, &mut out);
        assert_eq!(result.map(|_| ()), expected, "sending a ping of {} bytes", payload.len());
        if let Ok(n) = result {
            end.observer.frames_out += 1;
            end.pings.push(payload.to_vec());
            self.ends[1 - side].inbox.extend_from_slice(&out[..n]);
        }
    }

    fn close(&mut self, side: usize, code: CloseCode, reason: &str) {
        let now = self.now;
        let end = &mut self.ends[side];
        let expected = if !matches!(code.0, 1000..=1003 | 1007..=1014 | 3000..=4999) {
            Err(UsageError::InvalidCloseCode(code.0))
        } else if reason.len() > MAX_REASON_LEN {
            Err(UsageError::ControlPayloadTooLong)
        } else {
            Ok(())
        };
        let before = end.observer.conn.state();
        let result = end.observer.conn.close(now, code, reason);
        assert_eq!(result, expected, "closing with {code} and {} bytes", reason.len());
        if result.is_ok() {
            end.outgoing = None;
            let after = end.observer.conn.state();
            let expected_state = if before == State::Open { State::CloseSent } else { before };
            assert_eq!(after, expected_state, "close() in state {before:?}");
        }
        end.observer.after_call();
    }

    /// Delivers up to `n` bytes in flight towards `side`, in reads cut by `pattern`.
    fn deliver(&mut self, side: usize, n: usize, pattern: &[usize]) {
        let now = self.now;
        let end = &mut self.ends[side];
        let n = n.min(end.inbox.len());
        let mut bytes: Vec<u8> = end.inbox.drain(..n).collect();
        let mut at = 0;
        let mut turn = 0;
        while at < bytes.len() {
            let size = (0..pattern.len())
                .map(|i| pattern[(turn + i) % pattern.len()])
                .find(|&s| s > 0)
                .unwrap_or(bytes.len());
            let to = (at + size).min(bytes.len());
            end.observer.read(now, &mut bytes[at..to]);
            at = to;
            turn += 1;
        }
        self.collect();
    }

    /// Moves what each end transmitted towards its peer.
    fn collect(&mut self) {
        for side in 0..2 {
            self.ends[side].observer.after_call();
            let out = core::mem::take(&mut self.ends[side].observer.transmitted);
            if !self.ends[1 - side].eof {
                self.ends[1 - side].inbox.extend_from_slice(&out);
            }
        }
    }

    fn advance(&mut self, ms: u64) {
        self.now = Instant(self.now.0 + ms);
        let now = self.now;
        for end in &mut self.ends {
            let conn = &mut end.observer.conn;
            if conn.poll_timeout().is_some_and(|at| at <= now) {
                conn.handle_timeout(now);
                assert!(conn.poll_timeout().is_none_or(|at| at > now), "a deadline still due");
                end.observer.after_call();
            }
        }
        self.collect();
    }

    fn eof(&mut self, side: usize) {
        let end = &mut self.ends[side];
        end.eof = true;
        end.inbox.clear();
        end.observer.conn.handle_eof();
        end.observer.after_call();
        assert_eq!(end.observer.conn.state(), State::Closed, "EOF closes");
        self.collect();
    }

    /// Delivers everything in flight, whole, until nothing moves.
    fn drive(&mut self) {
        for _ in 0..64 {
            self.collect();
            if self.ends.iter().all(|e| e.inbox.is_empty()) {
                return;
            }
            for side in 0..2 {
                self.deliver(side, usize::MAX, &[0]);
            }
        }
        panic!("the pair did not settle");
    }

    /// Invariants between operations.
    fn check(&self) {
        for side in 0..2 {
            let (receiver, sender) = (&self.ends[side], &self.ends[1 - side]);
            let records = &receiver.observer.records;
            if let Some(error) = records.iter().find(|r| matches!(r, Record::Error(_))) {
                panic!("an honest peer caused {error:?}");
            }
            let messages: Vec<(MessageKind, Vec<u8>)> = records
                .iter()
                .filter_map(|r| match r {
                    Record::Message { kind, compressed, data } => {
                        assert!(!compressed, "no extension was negotiated");
                        Some((*kind, data.clone()))
                    }
                    _ => None,
                })
                .collect();
            assert!(messages.len() <= sender.sent.len(), "more messages than were sent");
            assert!(
                messages[..] == sender.sent[..messages.len()],
                "messages out of order or altered"
            );
            // Keep-alive pings carry no payload: compare the others.
            let pings: Vec<&Vec<u8>> = records
                .iter()
                .filter_map(|r| match r {
                    Record::Ping(p) if !p.is_empty() => Some(p),
                    _ => None,
                })
                .collect();
            let sent_pings: Vec<&Vec<u8>> = sender.pings.iter().filter(|p| !p.is_empty()).collect();
            assert!(pings.len() <= sent_pings.len() && pings[..] == sent_pings[..pings.len()]);
            for record in records {
                if let Record::Pong(p) = record {
                    assert!(p.is_empty() || receiver.pings.contains(p), "a pong for no ping");
                }
            }
            if let Some((code, clean)) = receiver.observer.closed_record() {
                assert!(clean || code == 1006, "an unclean close with {code} between honest peers");
                if clean {
                    assert_eq!(messages.len(), sender.sent.len(), "a clean close lost messages");
                    assert_eq!(pings.len(), sent_pings.len(), "a clean close lost pings");
                }
            }
        }
    }

    /// Closes every open end, drives the close handshake, and lets the timers end the rest.
    fn finish(&mut self) {
        let abnormal =
            self.ends.iter().any(|e| e.observer.closed_record().is_some_and(|(c, _)| c == 1006));
        for side in 0..2 {
            if self.ends[side].observer.conn.state() == State::Open {
                self.close(side, CloseCode::NORMAL, "done");
            }
        }
        self.drive();
        self.check();
        if !abnormal {
            for end in &self.ends {
                assert_eq!(end.observer.conn.state(), State::Closed, "the close handshake ends");
                assert_eq!(end.observer.closed_record().map(|(_, clean)| clean), Some(true));
            }
            return;
        }
        let close_timeout = self.ends[0].observer.conn.config().close_timeout;
        self.advance(u64::try_from(close_timeout.as_millis()).unwrap_or(u64::MAX / 2) + 1);
        self.check();
        for end in &self.ends {
            assert_eq!(end.observer.conn.state(), State::Closed, "the close timer ends the rest");
        }
    }
}
