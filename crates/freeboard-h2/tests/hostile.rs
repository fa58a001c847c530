//! Hostile peers, frame by hand: each defence ends in its defined outcome and is counted.

mod support;

use freeboard_h2::frame::{Frame, Settings};
use freeboard_h2::hpack::huffman;
use freeboard_h2::{Config, ErrorCode, StreamId};
use support::*;

#[test]
fn streams_past_the_concurrency_limit_are_refused() {
    let (mut conn, mut decoder) = open(Config::builder().max_concurrent_streams(3).build());
    for stream in [1, 3, 5] {
        assert_eq!(feed_all(&mut conn, &websocket_request(stream, "/")).len(), 1);
    }
    assert_eq!(feed_all(&mut conn, &websocket_request(7, "/")), []);
    assert_eq!(
        drain(&mut conn, &mut decoder),
        [Out::Rst { stream: 7, code: ErrorCode::REFUSED_STREAM }]
    );
    assert_eq!(conn.counters().refused_streams, 1);
    assert_eq!(conn.open_streams(), 3);
    // One closes; the next is served.
    feed_all(&mut conn, &rst(1, ErrorCode::CANCEL));
    assert_eq!(feed_all(&mut conn, &websocket_request(9, "/")).len(), 1);
}

#[test]
fn rapid_reset_ends_in_goaway_enhance_your_calm() {
    // CVE-2023-44487: open a stream, reset it at once, again and again. Each costs the
    // server a request event; past the bound the connection ends.
    let (mut conn, mut decoder) = open(Config::default());
    let mut bytes = Vec::new();
    for i in 0..200u32 {
        let stream = 1 + 2 * i;
        bytes.extend(get_request(stream, "/"));
        bytes.extend(rst(stream, ErrorCode::CANCEL));
    }
    let error = feed(&mut conn, &bytes).unwrap_err();
    assert_eq!(error.code, ErrorCode::ENHANCE_YOUR_CALM);
    assert_eq!(conn.counters().unanswered_resets, 101);
    assert_eq!(goaway(&drain(&mut conn, &mut decoder)), Some(ErrorCode::ENHANCE_YOUR_CALM));
}

#[test]
fn streams_answered_before_their_reset_are_not_rapid_resets() {
    let (mut conn, mut decoder) = open(Config::default());
    for i in 0..500u32 {
        let stream = 1 + 2 * i;
        feed_all(&mut conn, &websocket_request(stream, "/"));
        conn.respond(StreamId(stream), 200, &[], false).unwrap();
        feed_all(&mut conn, &rst(stream, ErrorCode::CANCEL));
        drain(&mut conn, &mut decoder);
    }
    assert_eq!(conn.counters().goaway, None);
    assert_eq!(conn.counters().unanswered_resets, 0);
}

#[test]
fn a_continuation_flood_is_bounded_in_frames_and_bytes() {
    // Many small CONTINUATIONs that never end the block.
    let (mut conn, mut decoder) = open(Config::default());
    let mut bytes = frame(Frame::Headers {
        stream: StreamId(1),
        block: &block(&[(":method", "GET")]),
        end_stream: true,
        end_headers: false,
        priority: None,
    });
    for _ in 0..100 {
        bytes.extend(frame(Frame::Continuation {
            stream: StreamId(1),
            block: &[0x40, 0, 0],
            end_headers: false,
        }));
    }
    assert_eq!(feed(&mut conn, &bytes).unwrap_err().code, ErrorCode::ENHANCE_YOUR_CALM);
    assert_eq!(conn.counters().header_block_floods, 1);
    assert_eq!(goaway(&drain(&mut conn, &mut decoder)), Some(ErrorCode::ENHANCE_YOUR_CALM));

    // Few large ones: 3 frames of 16 KiB pass the 16 KiB block bound.
    let (mut conn, mut decoder) = open(Config::default());
    let filler = vec![0u8; 16_000];
    let mut bytes = frame(Frame::Headers {
        stream: StreamId(1),
        block: &filler,
        end_stream: true,
        end_headers: false,
        priority: None,
    });
    bytes.extend(frame(Frame::Continuation {
        stream: StreamId(1),
        block: &filler,
        end_headers: false,
    }));
    assert_eq!(feed(&mut conn, &bytes).unwrap_err().code, ErrorCode::ENHANCE_YOUR_CALM);
    assert_eq!(goaway(&drain(&mut conn, &mut decoder)), Some(ErrorCode::ENHANCE_YOUR_CALM));

    // A block interrupted by another frame is a PROTOCOL_ERROR (RFC 9113 §6.10).
    let (mut conn, _) = open(Config::default());
    let mut bytes = frame(Frame::Headers {
        stream: StreamId(1),
        block: &[0x82],
        end_stream: true,
        end_headers: false,
        priority: None,
    });
    bytes.extend(ping([0; 8]));
    assert_eq!(feed(&mut conn, &bytes).unwrap_err().code, ErrorCode::PROTOCOL_ERROR);
}

#[test]
fn an_hpack_bomb_is_answered_431_and_the_connection_goes_on() {
    // A 4,000-byte value indexed once, then named again 100 times: 4 KB on the wire that
    // would decode to 400 KB. Spread over CONTINUATIONs for good measure.
    let (mut conn, mut decoder) = open(Config::default());
    let mut block = vec![0x82, 0x87, 0x84, 0x41, 0x01, b'a']; // GET https / :authority a
    block.extend([0x40, 0x01, b'x', 0x7f, 0xa1, 0x1e]); // x: 4000 bytes (127 + 3873)
    block.extend(std::iter::repeat_n(b'b', 4000));
    block.extend(std::iter::repeat_n(0x80 | 62, 100));
    let (first, rest) = block.split_at(3000);
    let mut bytes = frame(Frame::Headers {
        stream: StreamId(1),
        block: first,
        end_stream: true,
        end_headers: false,
        priority: None,
    });
    bytes.extend(frame(Frame::Continuation {
        stream: StreamId(1),
        block: rest,
        end_headers: true,
    }));
    assert_eq!(feed_all(&mut conn, &bytes), []);
    let out = drain(&mut conn, &mut decoder);
    let [Out::Headers { stream: 1, fields, end_stream: true }] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(status(fields), b"431");
    assert_eq!(conn.counters().header_lists_too_large, 1);
    // The dynamic table stayed in step: the next request names the bomb's entry twice,
    // 8 KB, within the bound.
    let next = frame(Frame::Headers {
        stream: StreamId(3),
        block: &[0x82, 0x87, 0x84, 0xbe, 0x80 | 62],
        end_stream: true,
        end_headers: true,
        priority: None,
    });
    let events = feed_all(&mut conn, &next);
    assert!(matches!(events[..], [Ev::Request { stream: 3, .. }]), "{events:?}");
}

#[test]
fn a_table_size_update_past_our_setting_is_a_compression_error() {
    let (mut conn, mut decoder) = open(Config::default());
    let bytes = frame(Frame::Headers {
        stream: StreamId(1),
        block: &[0x3f, 0xe2, 0x1f, 0x82], // size update to 4097
        end_stream: true,
        end_headers: true,
        priority: None,
    });
    assert_eq!(feed(&mut conn, &bytes).unwrap_err().code, ErrorCode::COMPRESSION_ERROR);
    assert_eq!(goaway(&drain(&mut conn, &mut decoder)), Some(ErrorCode::COMPRESSION_ERROR));
    // Huffman with bad padding too.
    let (mut conn, _) = open(Config::default());
    let mut value = Vec::new();
    huffman::encode(b"a", &mut value);
    *value.last_mut().unwrap() &= 0xf8; // padding zeros instead of ones
    let mut block = vec![0x82, 0x00, 0x01, b'x', 0x80 | value.len() as u8];
    block.extend(value);
    let bytes = frame(Frame::Headers {
        stream: StreamId(1),
        block: &block,
        end_stream: true,
        end_headers: true,
        priority: None,
    });
    assert_eq!(feed(&mut conn, &bytes).unwrap_err().code, ErrorCode::COMPRESSION_ERROR);
}

#[test]
fn a_ping_flood_that_is_not_read_ends_in_goaway() {
    // CVE-2019-9512: pings whose answers the peer never reads. A driver that cannot write
    // (the peer's receive buffer is full) keeps feeding input; the answers pile up to the
    // bound, then the connection ends.
    let (mut conn, mut decoder) = open(Config::default());
    let mut bytes = Vec::new();
    for i in 0..1000u32 {
        bytes.extend(ping([i as u8; 8]));
    }
    assert_eq!(feed(&mut conn, &bytes).unwrap_err().code, ErrorCode::ENHANCE_YOUR_CALM);
    assert_eq!(conn.counters().control_floods, 1);
    assert_eq!(conn.counters().ping_acks, 65);
    let out = drain(&mut conn, &mut decoder);
    assert_eq!(out.len(), 66, "65 answers (the last one past the bound of 64), then GOAWAY");
    assert_eq!(goaway(&out), Some(ErrorCode::ENHANCE_YOUR_CALM));
}

#[test]
fn pings_and_settings_that_are_read_are_all_answered() {
    let (mut conn, mut decoder) = open(Config::default());
    for i in 0..1000u32 {
        feed_all(&mut conn, &ping(i.to_be_bytes().repeat(2).try_into().unwrap()));
        feed_all(&mut conn, &settings(&[]));
        let out = drain(&mut conn, &mut decoder);
        assert_eq!(
            out,
            [
                Out::Ping { ack: true, data: i.to_be_bytes().repeat(2).try_into().unwrap() },
                Out::Settings { ack: true, params: vec![] }
            ]
        );
    }
    assert_eq!(conn.counters().goaway, None);
}

#[test]
fn a_settings_flood_that_is_not_read_ends_in_goaway() {
    // CVE-2019-9515.
    let (mut conn, mut decoder) = open(Config::default());
    let bytes: Vec<u8> =
        (0..1000).flat_map(|_| settings(&[(SETTING_HEADER_TABLE_SIZE, 0)])).collect();
    assert_eq!(feed(&mut conn, &bytes).unwrap_err().code, ErrorCode::ENHANCE_YOUR_CALM);
    assert_eq!(goaway(&drain(&mut conn, &mut decoder)), Some(ErrorCode::ENHANCE_YOUR_CALM));
}

#[test]
fn a_peer_that_never_opens_its_window_gets_nothing_and_costs_nothing() {
    let (mut conn, mut decoder) = open(Config::default());
    feed_all(&mut conn, &settings(&[(SETTING_INITIAL_WINDOW_SIZE, 0)]));
    feed_all(&mut conn, &websocket_request(1, "/"));
    conn.respond(StreamId(1), 200, &[], false).unwrap();
    drain(&mut conn, &mut decoder);
    for _ in 0..10_000 {
        assert_eq!(conn.send_capacity(StreamId(1)), Ok(0));
        assert_eq!(conn.poll_writable(), None);
        // It keeps pinging (answered), never opening the window.
        feed_all(&mut conn, &ping([0; 8]));
        assert_eq!(drain(&mut conn, &mut decoder).len(), 1);
    }
    assert!(!conn.wants_transmit());
    assert_eq!(conn.counters().send_blocked, 1);
    assert_eq!(conn.open_streams(), 1);
}

#[test]
fn windows_past_2_pow_31_are_flow_control_errors() {
    // The connection's window: GOAWAY.
    let (mut conn, mut decoder) = open(Config::default());
    let error = feed(&mut conn, &window_update(0, (1 << 31) - 1)).unwrap_err();
    assert_eq!(error.code, ErrorCode::FLOW_CONTROL_ERROR);
    assert_eq!(goaway(&drain(&mut conn, &mut decoder)), Some(ErrorCode::FLOW_CONTROL_ERROR));
    assert_eq!(conn.counters().flow_control_errors, 1);

    // A stream's window: that stream is reset, the connection goes on.
    let (mut conn, mut decoder) = open(Config::default());
    feed_all(&mut conn, &websocket_request(1, "/"));
    let events = feed_all(&mut conn, &window_update(1, (1 << 31) - 1));
    assert_eq!(
        events,
        [Ev::Reset { stream: 1, code: ErrorCode::FLOW_CONTROL_ERROR, remote: false }]
    );
    assert_eq!(
        drain(&mut conn, &mut decoder),
        [Out::Rst { stream: 1, code: ErrorCode::FLOW_CONTROL_ERROR }]
    );

    // An initial window change that takes a stream past it: GOAWAY (RFC 9113 §6.9.2).
    let (mut conn, _) = open(Config::default());
    feed_all(&mut conn, &websocket_request(1, "/"));
    feed_all(&mut conn, &window_update(1, (1 << 31) - 1 - 65_535));
    let error = feed(&mut conn, &settings(&[(SETTING_INITIAL_WINDOW_SIZE, 65_536)])).unwrap_err();
    assert_eq!(error.code, ErrorCode::FLOW_CONTROL_ERROR);
}

#[test]
fn data_past_the_connection_window_is_a_goaway() {
    // Streams' windows opened wide by the peer's reading... but the connection's is 256 KiB
    // and nothing was consumed.
    let config = Config::builder().initial_stream_window(1 << 20).build();
    let (mut conn, mut decoder) = open(config);
    let chunk = vec![0u8; 16_384];
    for stream in [1, 3, 5] {
        feed_all(&mut conn, &websocket_request(stream, "/"));
    }
    let mut sent = 0;
    let error = loop {
        let stream = [1, 3, 5][sent % 3];
        match feed(&mut conn, &data(stream, &chunk, false)) {
            Ok(_) => sent += 1,
            Err(error) => break error,
        }
    };
    assert_eq!(sent, 16, "256 KiB in 16 KiB frames");
    assert_eq!(error.code, ErrorCode::FLOW_CONTROL_ERROR);
    assert_eq!(goaway(&drain(&mut conn, &mut decoder)), Some(ErrorCode::FLOW_CONTROL_ERROR));
}

#[test]
fn resets_of_closed_streams_are_ignored_and_of_idle_ones_are_errors() {
    let (mut conn, mut decoder) = open(Config::default());
    feed_all(&mut conn, &websocket_request(1, "/"));
    conn.reset(StreamId(1), ErrorCode::CANCEL).unwrap();
    drain(&mut conn, &mut decoder);
    let bytes: Vec<u8> = (0..10_000).flat_map(|_| rst(1, ErrorCode::CANCEL)).collect();
    assert_eq!(feed_all(&mut conn, &bytes), []);
    assert_eq!(drain(&mut conn, &mut decoder), []);
    assert_eq!(
        feed(&mut conn, &rst(3, ErrorCode::CANCEL)).unwrap_err().code,
        ErrorCode::PROTOCOL_ERROR
    );
}

#[test]
fn too_many_stream_errors_end_the_connection() {
    let (mut conn, mut decoder) = open(Config::builder().max_error_resets(10).build());
    let mut bytes = Vec::new();
    for i in 0..20u32 {
        // Malformed: no :path.
        bytes.extend(headers(1 + 2 * i, &[(":method", "GET"), (":scheme", "https")], true));
    }
    let mut held = &bytes[..];
    let error = loop {
        match feed(&mut conn, held) {
            Ok((_, left)) => held = &held[held.len() - left..],
            Err(error) => break error,
        }
        drain(&mut conn, &mut decoder);
    };
    assert_eq!(error.code, ErrorCode::ENHANCE_YOUR_CALM);
    assert_eq!(conn.counters().error_resets, 11);
}

#[test]
fn oversized_frames_are_frame_size_errors() {
    let (mut conn, mut decoder) = open(Config::default());
    let big = vec![0u8; 16_385];
    feed_all(&mut conn, &websocket_request(1, "/"));
    assert_eq!(
        feed(&mut conn, &data(1, &big, false)).unwrap_err().code,
        ErrorCode::FRAME_SIZE_ERROR
    );
    assert_eq!(goaway(&drain(&mut conn, &mut decoder)), Some(ErrorCode::FRAME_SIZE_ERROR));
    // Only the header was needed to decide: the caller's buffer need not hold the frame.
    let (mut conn, _) = open(Config::default());
    assert_eq!(
        feed(&mut conn, &[0, 0x40, 1, 1, 4, 0, 0, 0, 1]).unwrap_err().code,
        ErrorCode::FRAME_SIZE_ERROR
    );
}

#[test]
fn unknown_frames_and_priority_are_ignored() {
    let (mut conn, mut decoder) = open(Config::default());
    let mut bytes = vec![0, 0, 3, 0xfa, 0xff, 0, 0, 0, 1, 1, 2, 3]; // type 0xfa
    bytes.extend(frame(Frame::Priority {
        stream: StreamId(9),
        priority: freeboard_h2::frame::Priority {
            dependency: StreamId(0),
            exclusive: false,
            weight: 15,
        },
    }));
    bytes.extend(frame(Frame::Settings { ack: true, settings: Settings::EMPTY }));
    assert_eq!(feed_all(&mut conn, &bytes), []);
    assert_eq!(drain(&mut conn, &mut decoder), []);
    assert!(matches!(
        feed_all(&mut conn, &get_request(1, "/"))[..],
        [Ev::Request { stream: 1, .. }]
    ));
}

#[test]
fn a_stream_that_depends_on_itself_is_reset() {
    // RFC 9113 §5.3.1: a stream error PROTOCOL_ERROR; its block is still decoded, so the
    // dynamic table stays in step for the next request.
    let (mut conn, mut decoder) = open(Config::default());
    let mut block = vec![0x82, 0x87, 0x84];
    block.extend([0x41, 0x01, b'a']); // :authority a, indexed into the dynamic table
    let bytes = frame(Frame::Headers {
        stream: StreamId(1),
        block: &block,
        end_stream: true,
        end_headers: true,
        priority: Some(freeboard_h2::frame::Priority {
            dependency: StreamId(1),
            exclusive: false,
            weight: 0,
        }),
    });
    assert_eq!(feed_all(&mut conn, &bytes), []);
    assert_eq!(
        drain(&mut conn, &mut decoder),
        [Out::Rst { stream: 1, code: ErrorCode::PROTOCOL_ERROR }]
    );
    let next = frame(Frame::Headers {
        stream: StreamId(3),
        block: &[0x82, 0x87, 0x84, 0xbe],
        end_stream: true,
        end_headers: true,
        priority: None,
    });
    assert!(matches!(feed_all(&mut conn, &next)[..], [Ev::Request { stream: 3, .. }]));
}
