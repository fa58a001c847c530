//! Defects found by the fuzz targets in `fuzz/`, each with the smallest input that showed it.

use freeboard_proto::handshake::{ClientRequest, EMPTY_HEADER, HandshakeError, Response};

/// The RFC 6455 sample key, whose accept value is `s3pPLMBiTxaQ9kYGzzhZRbK+xOo=`.
const KEY: &[u8; 24] = b"dGhlIHNhbXBsZSBub25jZQ==";

/// The RFC's sample request to `server.example.com/chat`, offering `protocols` and
/// `extensions`.
fn request(
    protocols: &'static [&'static str],
    extensions: Option<&'static str>,
) -> ClientRequest<'static> {
    ClientRequest {
        host: "server.example.com",
        path: "/chat",
        key: KEY,
        protocols,
        extensions,
        headers: &[],
    }
}

/// fuzz target `handshake` (response side): a complete response head longer than
/// `max_head_len` was accepted when it arrived in one read, although the same bytes arriving
/// in pieces are refused with `HeadTooLarge` once `max_head_len` of them are in. The result
/// must not depend on how the head was cut into reads (the request side already refused it).
#[test]
fn response_head_over_the_limit_is_refused_however_it_is_read() {
    let request = request(&[], None);
    let head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
    let limit = 64;
    assert!(head.len() > limit);
    let mut headers = [EMPTY_HEADER; 16];
    let piecewise = Response::parse(&head[..limit], &mut headers, &request, limit).map(|_| ());
    assert_eq!(piecewise, Err(HandshakeError::HeadTooLarge));
    let mut headers = [EMPTY_HEADER; 16];
    let whole = Response::parse(head, &mut headers, &request, limit).map(|_| ());
    assert_eq!(whole, Err(HandshakeError::HeadTooLarge));

    // A refusal over the limit is too large as well, not `Refused` with its status.
    let refusal =
        b"HTTP/1.1 403 Forbidden\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut headers = [EMPTY_HEADER; 16];
    let whole = Response::parse(refusal, &mut headers, &request, limit).map(|_| ());
    assert_eq!(whole, Err(HandshakeError::HeadTooLarge));
}

/// fuzz target `handshake` (response side), after extension names became case-insensitive: a
/// `101` that names `permessaGe-deflate` is accepted (the name as the server wrote it) and is
/// the same extension as the offer's; the target's own check still compared names exactly.
#[test]
fn an_extension_accepted_in_another_case_is_the_one_offered() {
    let request = request(&["chat"], Some("permessage-deflate; client_max_window_bits, x-custom"));
    let head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nSec-WebSocket-Protocol: chat\r\n\
        Sec-WebSocket-Extensions: permessaGe-deflate; server_no_context_takeover\r\n\r\n";
    let mut headers = [EMPTY_HEADER; 16];
    let (response, len) = Response::parse(head, &mut headers, &request, 1024).unwrap().unwrap();
    assert_eq!(len, head.len());
    let names: Vec<&str> = response.extensions().map(|e| e.name).collect();
    assert_eq!(names, ["permessaGe-deflate"]);
    assert!(names[0].eq_ignore_ascii_case("permessage-deflate"));
}
