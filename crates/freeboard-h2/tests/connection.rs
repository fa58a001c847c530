//! The connection's behaviour without sockets: a hand-made client, frames in, frames out.

mod support;

use freeboard_h2::frame::Setting;
use freeboard_h2::hpack::Decoder;
use freeboard_h2::{Config, Connection, ErrorCode, StreamId, UsageError};
use support::*;

#[test]
fn the_server_preface_enables_extended_connect_and_acknowledges_the_client() {
    let mut conn = Connection::new(Config::default());
    let mut decoder = Decoder::new(4096);
    // The server's SETTINGS go out before the client says anything (RFC 9113 §3.4).
    let early = drain(&mut conn, &mut decoder);
    let Out::Settings { ack: false, params } = &early[0] else { panic!("{early:?}") };
    assert!(params.contains(&(Setting::ENABLE_CONNECT_PROTOCOL, 1)));
    assert!(params.contains(&(Setting::MAX_CONCURRENT_STREAMS, 100)));
    assert!(params.contains(&(Setting::INITIAL_WINDOW_SIZE, 64 << 10)));
    assert!(params.contains(&(Setting::MAX_HEADER_LIST_SIZE, 16 << 10)));
    assert!(params.contains(&(Setting::ENABLE_PUSH, 0)));
    assert_eq!(early[1], Out::WindowUpdate { stream: 0, increment: (256 << 10) - 65_535 });
    // The preface may arrive a byte at a time; what is not consumed stays with the caller.
    let mut held = Vec::new();
    for byte in preface() {
        held.push(byte);
        let (events, left) = feed(&mut conn, &held).unwrap();
        assert_eq!(events, []);
        held.drain(..held.len() - left);
    }
    assert!(held.is_empty());
    assert_eq!(drain(&mut conn, &mut decoder), [Out::Settings { ack: true, params: vec![] }]);
    assert_eq!(conn.counters().settings_acks, 1);
}

#[test]
fn a_websocket_is_accepted_and_data_flows_both_ways() {
    let (mut conn, mut decoder) = open(Config::default());
    let events = feed_all(&mut conn, &websocket_request(1, "/echo?room=7"));
    let [Ev::WebSocket { stream: 1, path, authority, headers }] = &events[..] else {
        panic!("{events:?}")
    };
    assert_eq!((&path[..], &authority[..]), (&b"/echo?room=7"[..], &b"example.com"[..]));
    assert_eq!(headers, &[(b"sec-websocket-version".to_vec(), b"13".to_vec())]);
    conn.respond(StreamId(1), 200, &[(b"sec-websocket-protocol", b"chat")], false).unwrap();
    let out = drain(&mut conn, &mut decoder);
    let [Out::Headers { stream: 1, fields, end_stream: false }] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(status(fields), b"200");
    assert!(!fields.iter().any(|(n, _)| n == b"sec-websocket-accept"), "RFC 8441 §5");

    // In: DATA lent out of the buffer, the peer's window reopened only as it is consumed.
    let events = feed_all(&mut conn, &data(1, b"\x82\x05hello", false));
    assert_eq!(
        events,
        [Ev::Data { stream: 1, data: b"\x82\x05hello".to_vec(), end_stream: false }]
    );
    assert_eq!(drain(&mut conn, &mut decoder), []);
    conn.consume(StreamId(1), 7).unwrap();
    assert_eq!(conn.consume(StreamId(1), 1), Err(UsageError::ConsumedTooMuch(StreamId(1))));

    // Out: a DATA header from the core, the payload from the caller.
    let capacity = conn.send_capacity(StreamId(1)).unwrap();
    assert_eq!(capacity, 16_384, "the peer's frame size bounds one frame");
    let mut header = [0u8; 9];
    assert_eq!(conn.send_data_header(StreamId(1), 5, false, &mut header).unwrap(), 9);
    let mut wire = header.to_vec();
    wire.extend_from_slice(b"world");
    assert_eq!(
        parse_frames(&wire, &mut decoder),
        [Out::Data { stream: 1, data: b"world".to_vec(), end_stream: false }]
    );

    // The peer ends its side, then we end ours: the stream is gone.
    let events = feed_all(&mut conn, &data(1, b"", true));
    assert_eq!(events, [Ev::Data { stream: 1, data: vec![], end_stream: true }]);
    conn.send_data_header(StreamId(1), 0, true, &mut header).unwrap();
    assert_eq!(conn.open_streams(), 0);
    assert_eq!(conn.counters().websockets, 1);
}

#[test]
fn consuming_reopens_the_stream_and_connection_windows() {
    let (mut conn, mut decoder) = open(Config::default());
    feed_all(&mut conn, &websocket_request(1, "/"));
    conn.respond(StreamId(1), 200, &[], false).unwrap();
    drain(&mut conn, &mut decoder);
    // 64 KiB arrives (the stream's whole window) in 16 KiB frames.
    let chunk = vec![7u8; 16_384];
    for _ in 0..4 {
        feed_all(&mut conn, &data(1, &chunk, false));
    }
    assert_eq!(drain(&mut conn, &mut decoder), [], "nothing consumed, no window opened");
    // One byte more is past the stream's window: reset, the connection goes on.
    let events = feed_all(&mut conn, &data(1, b"x", false));
    assert_eq!(
        events,
        [Ev::Reset { stream: 1, code: ErrorCode::FLOW_CONTROL_ERROR, remote: false }]
    );
    assert_eq!(
        drain(&mut conn, &mut decoder),
        [Out::Rst { stream: 1, code: ErrorCode::FLOW_CONTROL_ERROR }]
    );

    feed_all(&mut conn, &websocket_request(3, "/"));
    conn.respond(StreamId(3), 200, &[], false).unwrap();
    drain(&mut conn, &mut decoder);
    feed_all(&mut conn, &data(3, &chunk, false));
    feed_all(&mut conn, &data(3, &chunk, false));
    conn.consume(StreamId(3), 16_384).unwrap();
    assert_eq!(drain(&mut conn, &mut decoder), []);
    conn.consume(StreamId(3), 16_384).unwrap();
    // Half the stream's window consumed: announced.
    assert_eq!(
        drain(&mut conn, &mut decoder),
        [Out::WindowUpdate { stream: 3, increment: 32_768 }]
    );
    // The connection's: 64 KiB + 1 (the reset stream's, credited back when it went) and
    // 64 KiB consumed on stream 3 pass half of 256 KiB.
    feed_all(&mut conn, &data(3, &chunk, false));
    feed_all(&mut conn, &data(3, &chunk, false));
    conn.consume(StreamId(3), 32_768).unwrap();
    assert_eq!(
        drain(&mut conn, &mut decoder),
        [
            Out::WindowUpdate { stream: 3, increment: 32_768 },
            Out::WindowUpdate { stream: 0, increment: 2 * 65_536 + 1 },
        ]
    );
}

#[test]
fn a_get_is_answered_with_a_status_headers_and_a_body() {
    let (mut conn, mut decoder) = open(Config::default());
    let events = feed_all(&mut conn, &get_request(1, "/metrics"));
    assert_eq!(
        events,
        [Ev::Request {
            stream: 1,
            method: b"GET".to_vec(),
            path: b"/metrics".to_vec(),
            end_stream: true
        }]
    );
    let body = b"freeboard_up 1\n";
    conn.respond(
        StreamId(1),
        200,
        &[(b"content-type", b"text/plain"), (b"content-length", b"15")],
        false,
    )
    .unwrap();
    let mut header = [0u8; 9];
    assert_eq!(
        conn.send_data_header(StreamId(1), body.len(), true, &mut header),
        Err(UsageError::TransmitPending),
        "the response head goes first"
    );
    let mut wire = vec![0u8; 4096];
    let n = conn.poll_transmit(&mut wire);
    wire.truncate(n);
    conn.send_data_header(StreamId(1), body.len(), true, &mut header).unwrap();
    wire.extend_from_slice(&header);
    wire.extend_from_slice(body);
    let out = parse_frames(&wire, &mut decoder);
    let Out::Headers { stream: 1, fields, end_stream: false } = &out[0] else { panic!("{out:?}") };
    assert_eq!(fields[0], (b":status".to_vec(), b"200".to_vec()));
    assert_eq!(fields[1], (b"content-type".to_vec(), b"text/plain".to_vec()));
    assert_eq!(out[1], Out::Data { stream: 1, data: body.to_vec(), end_stream: true });
    assert_eq!(conn.open_streams(), 0);
    assert_eq!(conn.counters().requests, 1);
}

#[test]
fn refusing_a_websocket_that_is_still_sending_also_resets_it() {
    let (mut conn, mut decoder) = open(Config::default());
    feed_all(&mut conn, &websocket_request(1, "/full"));
    conn.respond(StreamId(1), 503, &[(b"retry-after", b"1")], true).unwrap();
    let out = drain(&mut conn, &mut decoder);
    let Out::Headers { stream: 1, fields, end_stream: true } = &out[0] else { panic!("{out:?}") };
    assert_eq!(status(fields), b"503");
    assert_eq!(out[1], Out::Rst { stream: 1, code: ErrorCode::NO_ERROR });
    assert_eq!(conn.open_streams(), 0);
    // DATA that crossed the reset is dropped and credited, not answered.
    assert_eq!(feed_all(&mut conn, &data(1, b"late", false)), []);
    assert_eq!(drain(&mut conn, &mut decoder), []);
}

#[test]
fn large_response_heads_are_split_into_continuations() {
    let (mut conn, mut decoder) = open(Config::default());
    feed_all(&mut conn, &get_request(1, "/"));
    let big = vec![b'v'; 20_000];
    conn.respond(StreamId(1), 200, &[(b"x-big", &big)], true).unwrap();
    let out = drain(&mut conn, &mut decoder);
    let Out::Headers { fields, end_stream: true, .. } = &out[0] else { panic!("{out:?}") };
    assert_eq!(fields[1].1, big);
}

#[test]
fn feeding_a_byte_at_a_time_gives_the_same_events() {
    let mut conversation = preface();
    conversation.extend(websocket_request(1, "/a"));
    conversation.extend(get_request(3, "/b"));
    conversation.extend(data(1, &[1, 2, 3, 4, 5, 6, 7, 8, 9], false));
    conversation.extend(ping([1; 8]));
    conversation.extend(data(1, b"", true));
    let merge = |events: Vec<Ev>| {
        let mut merged: Vec<Ev> = Vec::new();
        for event in events {
            match (merged.last_mut(), event) {
                (
                    Some(Ev::Data { stream: s, data: d, end_stream: e }),
                    Ev::Data { stream, data, end_stream },
                ) if *s == stream && !*e => {
                    d.extend(data);
                    *e = end_stream;
                }
                (_, event) => merged.push(event),
            }
        }
        merged
    };
    let mut whole = Connection::new(Config::default());
    let all = merge(feed_all(&mut whole, &conversation));
    let mut split = Connection::new(Config::default());
    let mut events = Vec::new();
    let mut held = Vec::new();
    for &byte in &conversation {
        held.push(byte);
        let (got, left) = feed(&mut split, &held).unwrap();
        events.extend(got);
        held.drain(..held.len() - left);
    }
    assert!(held.is_empty());
    assert_eq!(merge(events), all);
    assert_eq!(all.len(), 3, "{all:?}");
}

#[test]
fn sending_stops_at_the_peers_windows_and_resumes_when_they_open() {
    let (mut conn, mut decoder) = open(Config::default());
    // The peer allows 10 bytes per stream.
    feed_all(&mut conn, &settings(&[(SETTING_INITIAL_WINDOW_SIZE, 10)]));
    feed_all(&mut conn, &websocket_request(1, "/"));
    conn.respond(StreamId(1), 200, &[], false).unwrap();
    drain(&mut conn, &mut decoder);
    assert_eq!(conn.send_capacity(StreamId(1)), Ok(10));
    let mut header = [0u8; 9];
    assert_eq!(
        conn.send_data_header(StreamId(1), 11, false, &mut header),
        Err(UsageError::ExceedsCapacity { requested: 11, allowed: 10 })
    );
    conn.send_data_header(StreamId(1), 10, false, &mut header).unwrap();
    assert_eq!(conn.send_capacity(StreamId(1)), Ok(0));
    assert_eq!(conn.poll_writable(), None);
    assert_eq!(conn.counters().send_blocked, 1);
    feed_all(&mut conn, &window_update(1, 100));
    assert_eq!(conn.poll_writable(), Some(StreamId(1)));
    assert_eq!(conn.poll_writable(), None);
    assert_eq!(conn.send_capacity(StreamId(1)), Ok(100));
    // A smaller initial window makes the window negative (RFC 9113 §6.9.2): no capacity.
    feed_all(&mut conn, &settings(&[(SETTING_INITIAL_WINDOW_SIZE, 0)]));
    assert_eq!(conn.send_capacity(StreamId(1)), Ok(90));
    feed_all(
        &mut conn,
        &settings(&[(SETTING_INITIAL_WINDOW_SIZE, 0), (SETTING_MAX_FRAME_SIZE, 20_000)]),
    );
    assert_eq!(conn.send_capacity(StreamId(1)), Ok(90));
}

#[test]
fn the_connection_window_bounds_all_streams_together() {
    let (mut conn, mut decoder) = open(Config::default());
    feed_all(
        &mut conn,
        &settings(&[(SETTING_INITIAL_WINDOW_SIZE, 1 << 20), (SETTING_MAX_FRAME_SIZE, 1 << 20)]),
    );
    feed_all(&mut conn, &websocket_request(1, "/"));
    feed_all(&mut conn, &websocket_request(3, "/"));
    conn.respond(StreamId(1), 200, &[], false).unwrap();
    conn.respond(StreamId(3), 200, &[], false).unwrap();
    drain(&mut conn, &mut decoder);
    let mut header = [0u8; 9];
    conn.send_data_header(StreamId(1), 60_000, false, &mut header).unwrap();
    assert_eq!(conn.send_capacity(StreamId(3)), Ok(5_535), "65,535 on the connection");
    conn.send_data_header(StreamId(3), 5_535, false, &mut header).unwrap();
    assert_eq!(conn.send_capacity(StreamId(1)), Ok(0));
    assert_eq!(conn.send_capacity(StreamId(3)), Ok(0));
    feed_all(&mut conn, &window_update(0, 1000));
    let mut woken = vec![conn.poll_writable().unwrap(), conn.poll_writable().unwrap()];
    woken.sort();
    assert_eq!(woken, [StreamId(1), StreamId(3)]);
}

#[test]
fn malformed_requests_are_reset_and_the_connection_goes_on() {
    let cases: [&[(&str, &str)]; 8] = [
        &[(":method", "GET"), (":scheme", "https"), (":authority", "a")],
        &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("Upper", "x")],
        &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("connection", "close")],
        &[(":method", "GET"), (":scheme", "https"), (":path", "/"), (":protocol", "websocket")],
        &[(":method", "CONNECT"), (":protocol", "websocket"), (":path", "/"), (":authority", "a")],
        &[(":method", "GET"), ("x", "1"), (":scheme", "https"), (":path", "/")],
        &[(":method", "GET"), (":method", "GET"), (":scheme", "https"), (":path", "/")],
        &[(":method", "GET"), (":scheme", "https"), (":path", "/"), ("te", "gzip")],
    ];
    let (mut conn, mut decoder) = open(Config::default());
    for (i, fields) in cases.iter().enumerate() {
        let stream = 1 + 2 * i as u32;
        assert_eq!(feed_all(&mut conn, &headers(stream, fields, true)), [], "{fields:?}");
        assert_eq!(
            drain(&mut conn, &mut decoder),
            [Out::Rst { stream, code: ErrorCode::PROTOCOL_ERROR }]
        );
    }
    assert_eq!(conn.counters().malformed_requests, 8);
    let events = feed_all(&mut conn, &get_request(101, "/"));
    assert!(matches!(events[..], [Ev::Request { stream: 101, .. }]));
}

#[test]
fn another_protocol_is_answered_501() {
    let (mut conn, mut decoder) = open(Config::default());
    let request = headers(
        1,
        &[
            (":method", "CONNECT"),
            (":protocol", "webtransport"),
            (":scheme", "https"),
            (":path", "/"),
            (":authority", "a"),
        ],
        false,
    );
    assert_eq!(feed_all(&mut conn, &request), []);
    let out = drain(&mut conn, &mut decoder);
    let Out::Headers { fields, end_stream: true, .. } = &out[0] else { panic!("{out:?}") };
    assert_eq!(status(fields), b"501");
    assert_eq!(out[1], Out::Rst { stream: 1, code: ErrorCode::NO_ERROR });
    assert_eq!(conn.counters().unsupported_protocols, 1);
    // A plain CONNECT (a tunnel) is a request for the caller to answer.
    let tunnel = headers(3, &[(":method", "CONNECT"), (":authority", "a:443")], false);
    assert!(matches!(feed_all(&mut conn, &tunnel)[..], [Ev::Request { stream: 3, .. }]));
}

#[test]
fn connection_errors_send_goaway_with_their_code_and_stop_reading() {
    let cases: Vec<(Vec<u8>, ErrorCode)> = vec![
        (headers(2, &[(":method", "GET")], true), ErrorCode::PROTOCOL_ERROR),
        (data(1, b"x", false), ErrorCode::PROTOCOL_ERROR),
        (rst(5, ErrorCode::CANCEL), ErrorCode::PROTOCOL_ERROR),
        (window_update(7, 1), ErrorCode::PROTOCOL_ERROR),
        (data(0, b"x", false), ErrorCode::PROTOCOL_ERROR),
        (settings(&[(Setting::ENABLE_PUSH, 2)]), ErrorCode::PROTOCOL_ERROR),
        (settings(&[(SETTING_MAX_FRAME_SIZE, 100)]), ErrorCode::PROTOCOL_ERROR),
        (settings(&[(SETTING_INITIAL_WINDOW_SIZE, 1 << 31)]), ErrorCode::FLOW_CONTROL_ERROR),
        (vec![0, 0, 3, 6, 0, 0, 0, 0, 0, 1, 2, 3], ErrorCode::FRAME_SIZE_ERROR),
        (vec![0, 0x40, 1, 0, 0, 0, 0, 0, 1], ErrorCode::FRAME_SIZE_ERROR),
        (vec![0, 0, 4, 5, 4, 0, 0, 0, 1, 0, 0, 0, 2], ErrorCode::PROTOCOL_ERROR),
        (vec![0, 0, 2, 9, 4, 0, 0, 0, 1, 0x82, 0x84], ErrorCode::PROTOCOL_ERROR),
        // HEADERS whose block names index 63: past the empty dynamic table.
        (vec![0, 0, 1, 1, 4, 0, 0, 0, 1, 0xbf], ErrorCode::COMPRESSION_ERROR),
    ];
    for (bytes, code) in cases {
        let (mut conn, mut decoder) = open(Config::default());
        let error = feed(&mut conn, &bytes).unwrap_err();
        assert_eq!(error.code, code, "{bytes:?}: {error}");
        let out = drain(&mut conn, &mut decoder);
        assert_eq!(goaway(&out), Some(code), "{out:?}");
        assert_eq!(conn.counters().goaway.map(|e| e.code), Some(code));
        // Nothing more is read or answered.
        assert_eq!(feed_all(&mut conn, &ping([0; 8])), []);
        assert_eq!(drain(&mut conn, &mut decoder), []);
        assert!(conn.is_done());
    }
    // An HTTP/1.1 request is no preface.
    let mut conn = Connection::new(Config::default());
    assert_eq!(feed(&mut conn, b"GET / HTTP/1.1\r\n").unwrap_err().code, ErrorCode::PROTOCOL_ERROR);
    // The first frame must be SETTINGS.
    let mut conn = Connection::new(Config::default());
    let mut bytes = freeboard_h2::frame::PREFACE.to_vec();
    bytes.extend(ping([0; 8]));
    assert_eq!(feed(&mut conn, &bytes).unwrap_err().code, ErrorCode::PROTOCOL_ERROR);
}

#[test]
fn graceful_goaway_lets_open_streams_finish_and_ignores_new_ones() {
    let (mut conn, mut decoder) = open(Config::default());
    feed_all(&mut conn, &websocket_request(1, "/"));
    conn.respond(StreamId(1), 200, &[], false).unwrap();
    conn.go_away();
    let out = drain(&mut conn, &mut decoder);
    assert!(out.contains(&Out::GoAway { last: 1, code: ErrorCode::NO_ERROR, debug: vec![] }));
    assert_eq!(feed_all(&mut conn, &get_request(3, "/")), [], "opened after GOAWAY: ignored");
    assert_eq!(feed_all(&mut conn, &websocket_request(5, "/")), []);
    assert_eq!(feed_all(&mut conn, &data(5, b"in flight", false)), [], "and its DATA dropped");
    assert_eq!(drain(&mut conn, &mut decoder), []);
    assert_eq!(feed_all(&mut conn, &data(1, b"still", true)).len(), 1);
    assert!(!conn.is_done());
    conn.consume(StreamId(1), 5).unwrap();
    let mut header = [0u8; 9];
    conn.send_data_header(StreamId(1), 0, true, &mut header).unwrap();
    assert!(conn.is_done());
}

#[test]
fn the_peers_goaway_and_reset_reach_the_caller() {
    let (mut conn, _) = open(Config::default());
    feed_all(&mut conn, &websocket_request(1, "/"));
    conn.respond(StreamId(1), 200, &[], false).unwrap();
    assert_eq!(
        feed_all(&mut conn, &rst(1, ErrorCode::CANCEL)),
        [Ev::Reset { stream: 1, code: ErrorCode::CANCEL, remote: true }]
    );
    assert_eq!(conn.send_capacity(StreamId(1)), Err(UsageError::UnknownStream(StreamId(1))));
    let goaway = support::frame(freeboard_h2::frame::Frame::GoAway {
        last_stream: StreamId(0),
        code: ErrorCode::NO_ERROR,
        debug: b"bye",
    });
    assert_eq!(feed_all(&mut conn, &goaway), [Ev::GoAway { last: 0, code: ErrorCode::NO_ERROR }]);
    assert!(conn.is_done() || conn.wants_transmit());
}

#[test]
fn padded_data_and_trailers() {
    let (mut conn, _) = open(Config::default());
    feed_all(&mut conn, &websocket_request(1, "/"));
    // DATA, PADDED: pad length 3, "abc", 3 bytes of padding.
    let padded = [0, 0, 7, 0, 0x8, 0, 0, 0, 1, 3, b'a', b'b', b'c', 0, 0, 0];
    assert_eq!(
        feed_all(&mut conn, &padded),
        [Ev::Data { stream: 1, data: b"abc".to_vec(), end_stream: false }]
    );
    let trailers = headers(1, &[("x-done", "1")], true);
    assert_eq!(
        feed_all(&mut conn, &trailers),
        [Ev::Data { stream: 1, data: vec![], end_stream: true }]
    );
}

#[test]
fn per_stream_state_is_small() {
    // The brief's aim: an idle WebSocket stream well under 0.5 KiB beyond the connection's.
    let size = freeboard_h2::stream_state_size();
    assert!(size <= 24, "{size}");
}
