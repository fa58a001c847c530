//! The connection state machine, driven through in-memory pairs, each case in both directions.

use std::time::Duration;

use freeboard_proto::{
    CloseCode, Config, Connection, Instant, MessageKind, OpCode, Parked, ProtocolError, Role,
    State, UsageError,
};
use freeboard_test::{Chunker, Endpoint, Pair, Record, Side, TEST_MASK, frame};

const SIDES: [Side; 2] = [Side::Client, Side::Server];

fn chunkers() -> [Chunker; 4] {
    [Chunker::Whole, Chunker::Max(1), Chunker::Max(7), Chunker::Pattern(vec![3, 1, 20, 2])]
}

#[test]
fn messages_arrive_whole_and_in_order_under_any_chunking() {
    for chunker in chunkers() {
        for from in SIDES {
            let mut pair = Pair::new(Config::default());
            pair.chunker = chunker.clone();
            let big: Vec<u8> = (0..70_000u32).map(|i| i as u8).collect();
            pair.send_message(from, MessageKind::Text, "héllo wörld".as_bytes());
            pair.send_message(from, MessageKind::Binary, &big);
            pair.send_message(from, MessageKind::Text, b"");
            pair.drive();
            let to = pair.end(from.peer());
            assert_eq!(
                to.messages(),
                [
                    (MessageKind::Text, "héllo wörld".as_bytes().to_vec()),
                    (MessageKind::Binary, big),
                    (MessageKind::Text, vec![]),
                ],
                "{chunker:?} from {from:?}"
            );
        }
    }
}

#[test]
fn fragmented_message_with_interleaved_ping_is_reassembled_and_ponged() {
    for chunker in chunkers() {
        for from in SIDES {
            let mut pair = Pair::new(Config::default());
            pair.chunker = chunker.clone();
            pair.send(from, OpCode::Text, false, "κό".as_bytes()).unwrap();
            pair.ping(from, b"are you there").unwrap();
            // A code point split across frames.
            pair.send(from, OpCode::Continuation, false, &"σμε".as_bytes()[..3]).unwrap();
            pair.send(from, OpCode::Continuation, true, &"σμε".as_bytes()[3..]).unwrap();
            pair.drive();
            let to = pair.end(from.peer());
            assert_eq!(to.records[0], Record::Ping(b"are you there".to_vec()));
            assert_eq!(to.messages(), [(MessageKind::Text, "κόσμε".as_bytes().to_vec())]);
            assert_eq!(
                pair.end(from).records,
                [Record::Pong(b"are you there".to_vec())],
                "{chunker:?}"
            );
        }
    }
}

#[test]
fn close_handshake_from_either_side_is_clean() {
    for from in SIDES {
        let mut pair = Pair::new(Config::default());
        pair.close(from, CloseCode::GOING_AWAY, "bye").unwrap();
        assert_eq!(pair.end(from).conn.state(), State::CloseSent);
        pair.drive();
        let closed = |reason: &str| Record::Closed {
            code: CloseCode::GOING_AWAY,
            reason: reason.into(),
            clean: true,
        };
        // The peer sees our reason; we see its echo, which carries the code only.
        assert_eq!(pair.end(from.peer()).records, [closed("bye")]);
        assert_eq!(pair.end(from).records, [closed("")]);
        assert_eq!(pair.end(from).conn.state(), State::Closed);
        assert_eq!(pair.end(from).conn.poll_timeout(), None, "no timer outlives the close");
    }
}

#[test]
fn data_sent_before_the_peers_close_is_still_delivered() {
    for from in SIDES {
        let mut pair = Pair::new(Config::default());
        pair.close(from, CloseCode::NORMAL, "").unwrap();
        pair.send_message(from.peer(), MessageKind::Binary, b"last words");
        pair.drive();
        assert_eq!(pair.end(from).messages(), [(MessageKind::Binary, b"last words".to_vec())]);
        assert!(matches!(pair.end(from).closed(), Some(Record::Closed { clean: true, .. })));
    }
}

#[test]
fn close_without_answer_times_out_with_1006() {
    for from in SIDES {
        let config = Config::builder().close_timeout(Duration::from_secs(2)).build();
        let mut pair = Pair::new(config);
        pair.close(from, CloseCode::NORMAL, "").unwrap();
        let _ = pair.end(from).transmit(); // the close frame is lost
        pair.advance(Duration::from_millis(1999));
        assert_eq!(pair.end(from).conn.state(), State::CloseSent);
        pair.advance(Duration::from_millis(1));
        let expected = Record::Closed {
            code: CloseCode::ABNORMAL,
            reason: "close timeout".into(),
            clean: false,
        };
        assert_eq!(pair.end(from).records, [expected]);
    }
}

#[test]
fn end_of_stream_is_an_abnormal_close() {
    for side in SIDES {
        let mut pair = Pair::new(Config::default());
        pair.eof(side);
        let expected =
            Record::Closed { code: CloseCode::ABNORMAL, reason: String::new(), clean: false };
        assert_eq!(pair.end(side).records, [expected]);
        pair.eof(side);
        assert_eq!(pair.end(side).records.len(), 1, "closed is reported once");
    }
}

#[test]
fn keep_alive_pings_and_drops_a_silent_peer() {
    let config = Config::builder()
        .ping_interval(Some(Duration::from_secs(30)))
        .pong_timeout(Duration::from_secs(10))
        .build();
    // Parking an idle connection between reads must not change its timers.
    for (side, park) in SIDES.into_iter().flat_map(|side| [(side, false), (side, true)]) {
        let mut pair = Pair::new(Config::default());
        let role = pair.end(side).conn.role();
        *pair.end(side) = Endpoint::new(role, config);
        pair.client.park_when_idle = park;
        pair.server.park_when_idle = park;
        // Traffic postpones the ping.
        pair.advance(Duration::from_secs(20));
        pair.send_message(side.peer(), MessageKind::Binary, b"tick");
        pair.drive();
        pair.advance(Duration::from_secs(20));
        assert_eq!(pair.end(side).records.len(), 1, "no ping 20 s after the last input");
        // The peer answers the ping automatically.
        pair.advance(Duration::from_secs(10));
        assert_eq!(pair.end(side).records[1], Record::Pong(vec![]));
        assert_eq!(pair.end(side).conn.state(), State::Open);

        // Now the peer goes silent: the next ping is lost and no pong comes.
        pair.now = pair.now + Duration::from_secs(30);
        let now = pair.now;
        pair.end(side).conn.handle_timeout(now);
        assert_eq!(
            pair.end(side).transmit().len(),
            2 + usize::from(role == Role::Client) * 4,
            "an empty ping"
        );
        pair.now = pair.now + Duration::from_secs(10);
        let now = pair.now;
        pair.end(side).conn.handle_timeout(now);
        assert_eq!(pair.end(side).conn.state(), State::Closed);
        let event = pair.end(side).conn.poll_event().map(|e| format!("{e:?}"));
        assert!(event.unwrap().contains("pong timeout"));
    }
}

/// On a one-way transport the keep-alive is sent and nothing is awaited: the connection stays
/// open through any number of intervals, and the next keep-alive is a full interval later.
#[test]
fn a_keep_alive_that_needs_no_answer_never_times_out() {
    let config = Config::builder()
        .ping_interval(Some(Duration::from_secs(30)))
        .pong_timeout(Duration::from_secs(10))
        .build();
    let mut conn = Connection::new(Role::Server, config, Instant::default());
    let mut out = [0u8; 131];
    let mut now = Instant::default();
    for _ in 0..10 {
        let due = conn.poll_timeout().expect("a keep-alive is due");
        assert_eq!(due, now + Duration::from_secs(30));
        now = due;
        conn.handle_timeout(now);
        assert_eq!(conn.poll_transmit(None, &mut out), Ok(Some(2)), "a ping");
        conn.keep_alive_unanswered(now);
    }
    conn.handle_timeout(now + Duration::from_secs(29));
    assert_eq!(conn.state(), State::Open);
}

#[test]
fn a_parked_connection_resumes_with_its_deadlines() {
    let config = Config::builder().ping_interval(Some(Duration::from_secs(30))).build();
    let now = Instant::from_millis(5_000);
    for role in [Role::Server, Role::Client] {
        let fresh = Connection::new(role, config, now);
        let parked = Parked::new(role, &config, now);
        assert_eq!(fresh.park(), Some(parked), "a new connection parks as Parked::new");
        assert_eq!(parked.poll_timeout(), fresh.poll_timeout());
        assert_eq!(parked.poll_timeout(), Some(Instant::from_millis(35_000)));
        let mut resumed = parked.resume(config);
        assert_eq!(resumed.role(), role);
        assert_eq!(resumed.poll_timeout(), fresh.poll_timeout());
        // The keep-alive fires as it would have: a ping is due and the pong deadline runs.
        resumed.handle_timeout(Instant::from_millis(35_000));
        assert_eq!(resumed.park(), None, "an owed ping keeps the connection awake");
        assert_eq!(resumed.poll_timeout(), Some(Instant::from_millis(45_000)));
    }
    let no_keep_alive = Parked::new(Role::Server, &Config::default(), now);
    assert_eq!(no_keep_alive.poll_timeout(), None);
}

#[test]
fn a_connection_with_something_in_flight_does_not_park() {
    let mut end = Endpoint::new(Role::Server, Config::default());
    // Half a header, then half a payload, then a ping owed a pong, then closing.
    end.feed(
        Instant::default(),
        &remask(&[0x82, 0x03], mask_for(Role::Server))[..1],
        &Chunker::Whole,
    );
    assert_eq!(end.conn.park(), None, "half a header");
    let mut end = Endpoint::new(Role::Server, Config::default());
    let frame = remask(&[0x82, 0x03, 1, 2, 3], mask_for(Role::Server));
    end.feed(Instant::default(), &frame[..4], &Chunker::Whole);
    assert_eq!(end.conn.park(), None, "half a payload");
    let mut end = Endpoint::new(Role::Server, Config::default());
    let mut buf = remask(&[0x89, 0x00], mask_for(Role::Server));
    let input = end.conn.handle_input(Instant::default(), &mut buf).unwrap();
    assert_eq!(input.consumed, buf.len());
    assert_eq!(end.conn.park(), None, "a ping event and its pong are waiting");
    let mut end = Endpoint::new(Role::Server, Config::default());
    end.conn.close(Instant::default(), CloseCode::NORMAL, "").unwrap();
    assert_eq!(end.conn.park(), None, "closing");
    assert!(Endpoint::new(Role::Server, Config::default()).conn.park().is_some());
}

/// `read_whole` takes a whole unfragmented data frame, unmasked and validated in place, and
/// gives anything else back untouched for `handle_input`, which reads it as before.
#[test]
fn read_whole_takes_the_common_frame_and_gives_back_the_rest() {
    let now = Instant::default();
    let mut end = Endpoint::new(Role::Server, Config::default());
    let mut buf = remask(&[0x82, 0x03, 1, 2, 3, 0x81, 0x02, b'h', b'i'], TEST_MASK);
    let whole = end.conn.read_whole(now, &mut buf).unwrap().unwrap();
    assert_eq!(
        (whole.consumed, whole.kind, &whole.data[..]),
        (9, MessageKind::Binary, &[1, 2, 3][..])
    );
    let whole = end.conn.read_whole(now, &mut buf[9..]).unwrap().unwrap();
    assert_eq!((whole.consumed, whole.kind, &whole.data[..]), (8, MessageKind::Text, &b"hi"[..]));

    // Not whole, not data, not one frame: given back untouched.
    let others = [
        remask(&[0x82, 0x03, 1, 2], TEST_MASK), // cut by the read
        remask(&[0x89, 0x00], TEST_MASK),       // a ping
        remask(&[0x02, 0x01, 7], TEST_MASK),    // a first fragment
        remask(&[0xc2, 0x01, 7], TEST_MASK),    // RSV1 (compressed)
        vec![0x82, 0x83, 0x12],                 // a header cut in its key
    ];
    for mut buf in others {
        let mut end = Endpoint::new(Role::Server, Config::default());
        let untouched = buf.clone();
        let rest = end.conn.read_whole(now, &mut buf).unwrap().unwrap_err();
        assert_eq!(rest, &untouched[..], "{untouched:02x?}");
    }

    // A fragment in progress: the next frame, however whole, is the general path's.
    let mut end = Endpoint::new(Role::Server, Config::default());
    let mut buf = remask(&[0x02, 0x01, 7, 0x80, 0x01, 8], TEST_MASK);
    let consumed = end.conn.handle_input(now, &mut buf).unwrap().consumed;
    assert!(end.conn.read_whole(now, &mut buf[consumed..]).unwrap().is_err());

    // Invalid UTF-8 in a whole text frame fails the connection (1007), as `handle_input` does.
    let mut end = Endpoint::new(Role::Server, Config::default());
    let mut buf = remask(&[0x81, 0x02, 0xc3, 0x28], TEST_MASK);
    assert!(end.conn.read_whole(now, &mut buf).is_err());
    assert_eq!(end.conn.state(), State::Closed);
    let close = end.transmit();
    assert_eq!(unmask_single_frame(&close)[..2], CloseCode::INVALID_PAYLOAD.0.to_be_bytes());
}

/// Feeds raw bytes to a fresh endpoint and returns its records and its answer on the wire.
fn receive(role: Role, config: Config, bytes: &[u8]) -> (Vec<Record>, Vec<u8>) {
    let mut end = Endpoint::new(role, config);
    end.feed(Default::default(), bytes, &Chunker::Whole);
    let answer = end.transmit();
    (end.records, answer)
}

/// The mask a frame needs to be well-formed towards `role`.
fn mask_for(role: Role) -> Option<[u8; 4]> {
    if role == Role::Server { TEST_MASK } else { None }
}

#[test]
fn every_protocol_violation_fails_with_its_close_code() {
    let limits = Config::builder().max_message_size(1000).max_frame_size(600).build();
    let cases: Vec<(&str, Vec<u8>, ProtocolError)> = vec![
        ("reserved opcode", vec![0x83, 0x00], ProtocolError::ReservedOpcode(3)),
        ("reserved control opcode", vec![0x8F, 0x00], ProtocolError::ReservedOpcode(0xF)),
        ("rsv1 without extension", vec![0xC1, 0x00], ProtocolError::ReservedBits(0b100)),
        ("rsv3", vec![0x91, 0x00], ProtocolError::ReservedBits(0b001)),
        ("continuation first", vec![0x80, 0x00], ProtocolError::UnexpectedContinuation),
        (
            "text inside fragmented",
            [&[0x01, 0x00][..], &[0x81, 0x00]].concat(),
            ProtocolError::ExpectedContinuation,
        ),
        (
            "ping of 126 bytes",
            [&[0x89, 126, 0, 126][..], &[0; 126]].concat(),
            ProtocolError::ControlFrameTooLong,
        ),
        ("fragmented ping", vec![0x09, 0x00], ProtocolError::FragmentedControlFrame),
        ("non-minimal length", vec![0x82, 126, 0, 5], ProtocolError::NonMinimalLength),
        ("2^63 length", vec![0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 0], ProtocolError::LengthTopBit),
        ("frame over limit", vec![0x82, 126, 0x02, 0x59], ProtocolError::FrameTooLarge),
        (
            "message over limit",
            [&[0x02, 126, 0x02, 0x58][..], &[0; 600], &[0x80, 126, 0x01, 0x91]].concat(),
            ProtocolError::MessageTooLarge,
        ),
        ("invalid utf-8", vec![0x81, 0x02, 0xc3, 0x28], ProtocolError::InvalidUtf8),
        ("close of one byte", vec![0x88, 0x01, 0x03], ProtocolError::InvalidClosePayload),
        ("close code 1005", vec![0x88, 0x02, 0x03, 0xed], ProtocolError::InvalidCloseCode(1005)),
        ("close code 999", vec![0x88, 0x02, 0x03, 0xe7], ProtocolError::InvalidCloseCode(999)),
        ("close reason not utf-8", vec![0x88, 0x03, 0x03, 0xe8, 0xff], ProtocolError::InvalidUtf8),
    ];
    for role in [Role::Server, Role::Client] {
        for (name, unmasked, error) in &cases {
            let bytes = remask(unmasked, mask_for(role));
            let (records, answer) = receive(role, limits, &bytes);
            assert_eq!(records[0], Record::Error(*error), "{name} to {role:?}");
            let code = error.close_code();
            assert!(
                matches!(&records[1], Record::Closed { code: c, clean: false, .. } if *c == code),
                "{name} to {role:?}: {records:?}"
            );
            // The answer on the wire is a close frame carrying the code.
            let payload = unmask_single_frame(&answer);
            assert_eq!(payload[..2], code.0.to_be_bytes(), "{name} to {role:?}");
        }
    }
    assert_eq!(ProtocolError::InvalidUtf8.close_code(), CloseCode::INVALID_PAYLOAD);
    assert_eq!(ProtocolError::MessageTooLarge.close_code(), CloseCode::MESSAGE_TOO_BIG);
    assert_eq!(ProtocolError::UnmaskedFrame.close_code(), CloseCode::PROTOCOL_ERROR);
}

#[test]
fn masking_direction_is_enforced() {
    let (records, _) = receive(Role::Server, Config::default(), &frame(0x82, b"x", None));
    assert_eq!(records[0], Record::Error(ProtocolError::UnmaskedFrame));
    let (records, _) = receive(Role::Client, Config::default(), &frame(0x82, b"x", TEST_MASK));
    assert_eq!(records[0], Record::Error(ProtocolError::MaskedFrame));
}

#[test]
fn rsv1_is_accepted_on_a_first_frame_when_an_extension_allows_it() {
    let deflate = Config::builder().allowed_rsv(0b100).build();
    let (records, _) = receive(
        Role::Client,
        deflate,
        &[frame(0x41, b"ab", None), frame(0x80, b"c", None)].concat(),
    );
    assert_eq!(records, [Record::Message(MessageKind::Text, b"abc".to_vec())]);
    // RFC 7692: never on continuation or control frames.
    let (records, _) = receive(
        Role::Client,
        deflate,
        &[frame(0x01, b"ab", None), frame(0xC0, b"c", None)].concat(),
    );
    assert_eq!(records[0], Record::Error(ProtocolError::ReservedBits(0b100)));
    let (records, _) = receive(Role::Client, deflate, &frame(0xC9, b"", None));
    assert_eq!(records[0], Record::Error(ProtocolError::ReservedBits(0b100)));
}

#[test]
fn nothing_is_read_or_reported_after_close() {
    for role in [Role::Server, Role::Client] {
        let mask = mask_for(role);
        let bytes =
            [frame(0x88, &[0x03, 0xe8], mask), frame(0x81, b"late", mask), frame(0x89, b"", mask)]
                .concat();
        let (records, answer) = receive(role, Config::default(), &bytes);
        assert_eq!(
            records,
            [Record::Closed { code: CloseCode::NORMAL, reason: String::new(), clean: true }]
        );
        assert_eq!(unmask_single_frame(&answer), [0x03, 0xe8], "the close is echoed, nothing else");
    }
}

#[test]
fn invalid_text_fails_before_the_message_ends() {
    // Autobahn 6.4.1: the bad byte arrives in the first fragment; the rest never does.
    let mut end = Endpoint::new(Role::Client, Config::default());
    let first = frame(0x01, b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xf4\x90\x80\x80", None);
    end.feed(Default::default(), &first, &Chunker::Whole);
    assert_eq!(end.records[0], Record::Error(ProtocolError::InvalidUtf8));
}

#[test]
fn close_without_status_is_echoed_without_status() {
    let (records, answer) = receive(Role::Client, Config::default(), &frame(0x88, b"", None));
    assert_eq!(
        records,
        [Record::Closed { code: CloseCode::NO_STATUS, reason: String::new(), clean: true }]
    );
    assert_eq!(answer.len(), 6, "an empty masked close frame");
}

#[test]
fn auto_pong_can_be_turned_off() {
    let config = Config::builder().auto_pong(false).build();
    let (records, answer) = receive(Role::Client, config, &frame(0x89, b"hi", None));
    assert_eq!(records, [Record::Ping(b"hi".to_vec())]);
    assert!(answer.is_empty());
    let mut end = Endpoint::new(Role::Client, config);
    let mut out = [0u8; 16];
    assert_eq!(end.conn.pong(b"hi", Some([0; 4]), &mut out), Ok(8));
}

#[test]
fn api_misuse_is_a_usage_error() {
    let mut end = Endpoint::new(Role::Client, Config::default());
    let mut out = [0u8; 256];
    let mask = Some([1, 2, 3, 4]);
    assert_eq!(
        end.conn.send_frame(OpCode::Text, true, b"x", None, &mut out),
        Err(UsageError::WrongMasking)
    );
    assert_eq!(
        end.conn.send_frame(OpCode::Continuation, true, b"x", mask, &mut out),
        Err(UsageError::NoMessageInProgress)
    );
    assert_eq!(
        end.conn.send_frame(OpCode::Ping, true, b"x", mask, &mut out),
        Err(UsageError::NotData)
    );
    end.conn.send_frame(OpCode::Binary, false, b"x", mask, &mut out).unwrap();
    assert_eq!(
        end.conn.send_frame(OpCode::Text, true, b"x", mask, &mut out),
        Err(UsageError::MessageInProgress)
    );
    assert!(
        matches!(end.conn.send_frame(OpCode::Continuation, true, &[0; 300], mask, &mut out), Err(UsageError::InsufficientSize(s)) if s.required == 308)
    );
    assert_eq!(
        end.conn.send_ping(&[0; 126], mask, &mut out),
        Err(UsageError::ControlPayloadTooLong)
    );
    assert_eq!(
        end.conn.close(Default::default(), CloseCode(1006), ""),
        Err(UsageError::InvalidCloseCode(1006))
    );
    assert_eq!(
        end.conn.close(Default::default(), CloseCode::NORMAL, &"x".repeat(124)),
        Err(UsageError::ControlPayloadTooLong)
    );
    end.conn.close(Default::default(), CloseCode::NORMAL, "done").unwrap();
    assert_eq!(
        end.conn.send_frame(OpCode::Continuation, true, b"x", mask, &mut out),
        Err(UsageError::AfterClose)
    );
    assert_eq!(end.conn.send_ping(b"", mask, &mut out), Err(UsageError::AfterClose));
    assert_eq!(
        end.conn.close(Default::default(), CloseCode::NORMAL, "again"),
        Ok(()),
        "closing twice is harmless"
    );
}

#[test]
fn rfc_examples_through_a_connection() {
    // §5.7: unmasked "Hello" to a client, masked "Hello" to a server, fragmented "Hel"+"lo".
    let (records, _) =
        receive(Role::Client, Config::default(), &[0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f]);
    assert_eq!(records, [Record::Message(MessageKind::Text, b"Hello".to_vec())]);
    let masked = [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58];
    let (records, _) = receive(Role::Server, Config::default(), &masked);
    assert_eq!(records, [Record::Message(MessageKind::Text, b"Hello".to_vec())]);
    let (records, _) = receive(
        Role::Client,
        Config::default(),
        &[0x01, 0x03, 0x48, 0x65, 0x6c, 0x80, 0x02, 0x6c, 0x6f],
    );
    assert_eq!(records, [Record::Message(MessageKind::Text, b"Hello".to_vec())]);
}

/// Re-encodes a frame built unmasked with `mask`, for sending to a server.
fn remask(frames: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let Some(key) = mask else { return frames.to_vec() };
    let mut out = Vec::new();
    let mut rest = frames;
    while !rest.is_empty() {
        // Raw test frames may be invalid; split them by the length field alone.
        let len7 = usize::from(rest[1] & 0x7f);
        let (len, at): (usize, usize) = match len7 {
            126 => (usize::from(u16::from_be_bytes([rest[2], rest[3]])), 4),
            127 => (usize::MAX, 10),
            n => (n, 2),
        };
        let end = at.saturating_add(len).min(rest.len());
        let mut head = rest[..at].to_vec();
        head[1] |= 0x80;
        head.extend_from_slice(&key);
        let mut body = rest[at..end].to_vec();
        freeboard_proto::mask::apply_mask(&mut body, key, 0);
        out.extend(head.into_iter().chain(body));
        rest = &rest[end..];
    }
    out
}

/// The payload of the single frame in `bytes`, unmasked.
fn unmask_single_frame(bytes: &[u8]) -> Vec<u8> {
    let (header, n) = freeboard_proto::FrameHeader::parse(bytes).unwrap().unwrap();
    assert_eq!(header.opcode, OpCode::Close);
    let mut payload = bytes[n..].to_vec();
    assert_eq!(payload.len() as u64, header.payload_len, "exactly one frame");
    if let Some(key) = header.mask {
        freeboard_proto::mask::apply_mask(&mut payload, key, 0);
    }
    payload
}
