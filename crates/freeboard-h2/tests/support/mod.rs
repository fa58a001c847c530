//! A hand-made HTTP/2 client for the tests: frames built byte by byte, the server's
//! output parsed back into frames, events copied out of the connection.
#![allow(dead_code, unreachable_pub)]

use freeboard_h2::frame::{Frame, Setting, Settings, encode_settings};
use freeboard_h2::hpack::{Decoder, HeaderList, encode_field};
use freeboard_h2::{Connection, ConnectionError, ErrorCode, Event, StreamId};

/// An event, copied out of the connection's borrow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ev {
    WebSocket { stream: u32, path: Vec<u8>, authority: Vec<u8>, headers: Vec<(Vec<u8>, Vec<u8>)> },
    Request { stream: u32, method: Vec<u8>, path: Vec<u8>, end_stream: bool },
    Data { stream: u32, data: Vec<u8>, end_stream: bool },
    Reset { stream: u32, code: ErrorCode, remote: bool },
    GoAway { last: u32, code: ErrorCode },
}

/// A frame the server wrote, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    Settings { ack: bool, params: Vec<(u16, u32)> },
    WindowUpdate { stream: u32, increment: u32 },
    Headers { stream: u32, fields: Vec<(Vec<u8>, Vec<u8>)>, end_stream: bool },
    Data { stream: u32, data: Vec<u8>, end_stream: bool },
    Rst { stream: u32, code: ErrorCode },
    GoAway { last: u32, code: ErrorCode, debug: Vec<u8> },
    Ping { ack: bool, data: [u8; 8] },
}

pub fn frame(frame: Frame<'_>) -> Vec<u8> {
    let mut out = vec![0; 9 + (1 << 20)];
    let n = frame.encode(&mut out).unwrap();
    out.truncate(n);
    out
}

pub fn settings(params: &[(u16, u32)]) -> Vec<u8> {
    let params: Vec<Setting> = params.iter().map(|&(id, value)| Setting { id, value }).collect();
    let mut payload = vec![0; params.len() * 6];
    encode_settings(&params, &mut payload).unwrap();
    frame(Frame::Settings { ack: false, settings: Settings::from_payload(&payload).unwrap() })
}

/// The client preface and an empty SETTINGS frame.
pub fn preface() -> Vec<u8> {
    let mut bytes = freeboard_h2::frame::PREFACE.to_vec();
    bytes.extend(settings(&[]));
    bytes
}

/// A header block of literal fields (no dynamic table), as our own encoder writes them.
pub fn block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        encode_field(name.as_bytes(), value.as_bytes(), &mut block);
    }
    block
}

pub fn headers(stream: u32, fields: &[(&str, &str)], end_stream: bool) -> Vec<u8> {
    frame(Frame::Headers {
        stream: StreamId(stream),
        block: &block(fields),
        end_stream,
        end_headers: true,
        priority: None,
    })
}

pub fn websocket_request(stream: u32, path: &str) -> Vec<u8> {
    headers(
        stream,
        &[
            (":method", "CONNECT"),
            (":protocol", "websocket"),
            (":scheme", "https"),
            (":path", path),
            (":authority", "example.com"),
            ("sec-websocket-version", "13"),
        ],
        false,
    )
}

pub fn get_request(stream: u32, path: &str) -> Vec<u8> {
    headers(
        stream,
        &[(":method", "GET"), (":scheme", "https"), (":path", path), (":authority", "example.com")],
        true,
    )
}

pub fn data(stream: u32, data: &[u8], end_stream: bool) -> Vec<u8> {
    frame(Frame::Data { stream: StreamId(stream), data, end_stream })
}

pub fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    frame(Frame::WindowUpdate { stream: StreamId(stream), increment })
}

pub fn rst(stream: u32, code: ErrorCode) -> Vec<u8> {
    frame(Frame::RstStream { stream: StreamId(stream), code })
}

pub fn ping(data: [u8; 8]) -> Vec<u8> {
    frame(Frame::Ping { ack: false, data })
}

/// Feeds `bytes` as one read, as a driver would: `receive` until nothing more is consumed.
/// Returns the events and the bytes left unconsumed (an incomplete frame).
pub fn feed(conn: &mut Connection, bytes: &[u8]) -> Result<(Vec<Ev>, usize), ConnectionError> {
    let mut events = Vec::new();
    let mut at = 0;
    loop {
        let received = conn.receive(&bytes[at..])?;
        at += received.consumed;
        let Some(event) = received.event else {
            if received.consumed == 0 || at == bytes.len() {
                return Ok((events, bytes.len() - at));
            }
            continue;
        };
        events.push(match event {
            Event::WebSocket { stream, request } => Ev::WebSocket {
                stream: stream.0,
                path: request.path().unwrap().to_vec(),
                authority: request.authority().unwrap().to_vec(),
                headers: request.headers().map(|(n, v)| (n.to_vec(), v.to_vec())).collect(),
            },
            Event::Request { stream, request, end_stream } => Ev::Request {
                stream: stream.0,
                method: request.method().to_vec(),
                path: request.path().unwrap_or_default().to_vec(),
                end_stream,
            },
            Event::Data { stream, data, end_stream } => {
                Ev::Data { stream: stream.0, data: data.to_vec(), end_stream }
            }
            Event::Reset { stream, code, remote } => Ev::Reset { stream: stream.0, code, remote },
            Event::GoAway { last_stream, code } => Ev::GoAway { last: last_stream.0, code },
        });
    }
}

/// Feeds `bytes`, expecting every byte to be consumed.
pub fn feed_all(conn: &mut Connection, bytes: &[u8]) -> Vec<Ev> {
    let (events, left) = feed(conn, bytes).unwrap();
    assert_eq!(left, 0, "all bytes consumed");
    events
}

/// The frames the server owes, decoded (response heads with `decoder`).
pub fn drain(conn: &mut Connection, decoder: &mut Decoder) -> Vec<Out> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.poll_transmit(&mut chunk);
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
    parse_frames(&bytes, decoder)
}

pub fn parse_frames(mut bytes: &[u8], decoder: &mut Decoder) -> Vec<Out> {
    let mut frames = Vec::new();
    let mut pending: Option<(u32, Vec<u8>, bool)> = None;
    while let Some((frame, used)) = Frame::decode(bytes, 1 << 24).unwrap() {
        bytes = &bytes[used..];
        let out = match frame {
            Frame::Settings { ack, settings } => {
                Out::Settings { ack, params: settings.iter().map(|s| (s.id, s.value)).collect() }
            }
            Frame::WindowUpdate { stream, increment } => {
                Out::WindowUpdate { stream: stream.0, increment }
            }
            Frame::Headers { stream, block, end_stream, end_headers, .. } => {
                pending = Some((stream.0, block.to_vec(), end_stream));
                if !end_headers {
                    continue;
                }
                decode_headers(pending.take().unwrap(), decoder)
            }
            Frame::Continuation { block, end_headers, .. } => {
                pending.as_mut().unwrap().1.extend_from_slice(block);
                if !end_headers {
                    continue;
                }
                decode_headers(pending.take().unwrap(), decoder)
            }
            Frame::Data { stream, data, end_stream } => {
                Out::Data { stream: stream.0, data: data.to_vec(), end_stream }
            }
            Frame::RstStream { stream, code } => Out::Rst { stream: stream.0, code },
            Frame::GoAway { last_stream, code, debug } => {
                Out::GoAway { last: last_stream.0, code, debug: debug.to_vec() }
            }
            Frame::Ping { ack, data } => Out::Ping { ack, data },
            other => panic!("the server wrote {other:?}"),
        };
        frames.push(out);
    }
    assert!(bytes.is_empty(), "the server's output ends with a whole frame");
    frames
}

fn decode_headers((stream, block, end_stream): (u32, Vec<u8>, bool), decoder: &mut Decoder) -> Out {
    let mut list = HeaderList::new(1 << 20);
    decoder.decode(&block, &mut list).unwrap();
    let fields = list.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
    Out::Headers { stream, fields, end_stream }
}

/// A server past the handshake: preface and SETTINGS exchanged and acknowledged.
pub fn open(config: freeboard_h2::Config) -> (Connection, Decoder) {
    let mut conn = Connection::new(config);
    let mut decoder = Decoder::new(4096);
    let mut bytes = preface();
    bytes.extend(frame(Frame::Settings { ack: true, settings: Settings::EMPTY }));
    assert_eq!(feed_all(&mut conn, &bytes), []);
    drain(&mut conn, &mut decoder);
    (conn, decoder)
}

pub fn status(fields: &[(Vec<u8>, Vec<u8>)]) -> &[u8] {
    &fields.iter().find(|(n, _)| n == b":status").unwrap().1
}

/// The GOAWAY among `frames`, if any.
pub fn goaway(frames: &[Out]) -> Option<ErrorCode> {
    frames.iter().find_map(|f| match f {
        Out::GoAway { code, .. } => Some(*code),
        _ => None,
    })
}

pub const SETTING_INITIAL_WINDOW_SIZE: u16 = Setting::INITIAL_WINDOW_SIZE;
pub const SETTING_MAX_FRAME_SIZE: u16 = Setting::MAX_FRAME_SIZE;
pub const SETTING_HEADER_TABLE_SIZE: u16 = Setting::HEADER_TABLE_SIZE;
