//! The C ABI driven as C would drive it: raw pointers, handles in caller memory, status codes.
#![allow(unsafe_code)]
// Every call below goes through the `extern "C"` functions with pointers to live locals.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::ptr::{null, null_mut};

use freeboard_ffi::*;

fn zeroed_connection() -> FbConnection {
    // SAFETY: FbConnection is plain integers; all zeroes is its "not initialised" state.
    unsafe { std::mem::zeroed() }
}

fn input() -> FbInput {
    // SAFETY: plain integers, bools and a raw pointer: all zeroes is valid.
    unsafe { std::mem::zeroed() }
}

fn event() -> FbEvent {
    // SAFETY: as above.
    unsafe { std::mem::zeroed() }
}

fn init(role: u8) -> FbConnection {
    let mut conn = zeroed_connection();
    assert_eq!(unsafe { fb_connection_init(&mut conn, role, null(), 0) }, FB_OK);
    conn
}

/// Moves every owed control frame of `from` into `wire`.
fn transmit(from: &mut FbConnection, mask: Option<[u8; 4]>, wire: &mut Vec<u8>) {
    let key = mask.as_ref().map_or(null(), |k| k.as_ptr());
    let mut out = [0u8; FB_MAX_CONTROL_FRAME_LEN];
    let mut n = 0;
    while unsafe { fb_connection_poll_transmit(from, key, out.as_mut_ptr(), out.len(), &mut n) }
        == 1
    {
        wire.extend_from_slice(&out[..n]);
    }
}

/// An event as (kind, close code, payload or reason).
type Seen = (u8, u16, Vec<u8>);

/// Feeds `wire` to `to`; returns the payload bytes, the last status and the events.
fn receive(to: &mut FbConnection, wire: &mut [u8]) -> (Vec<u8>, i32, Vec<Seen>) {
    let (mut data, mut status, mut events) = (Vec::new(), FB_OK, Vec::new());
    let mut at = 0;
    while at < wire.len() {
        let mut got = input();
        status = unsafe {
            fb_connection_handle_input(to, 0, wire[at..].as_mut_ptr(), wire.len() - at, &mut got)
        };
        at += got.consumed;
        if got.has_payload && got.len > 0 {
            data.extend_from_slice(unsafe { std::slice::from_raw_parts(got.data, got.len) });
        }
        let mut e = event();
        while unsafe { fb_connection_poll_event(to, &mut e) } == 1 {
            let bytes = unsafe { std::slice::from_raw_parts(e.data, e.len) }.to_vec();
            events.push((e.kind, e.close_code, bytes));
        }
        if status < 0 {
            break;
        }
    }
    (data, status, events)
}

#[test]
fn null_zeroed_and_misaligned_handles_are_errors() {
    let mut got = input();
    let mut buf = [0u8; 4];
    unsafe {
        assert_eq!(fb_connection_state(null_mut()), FB_ERR_NULL);
        let mut conn = zeroed_connection();
        assert_eq!(fb_connection_state(&mut conn), FB_ERR_NOT_INITIALIZED);
        assert_eq!(
            fb_connection_handle_input(&mut conn, 0, buf.as_mut_ptr(), 4, &mut got),
            FB_ERR_NOT_INITIALIZED
        );
        assert_eq!(fb_connection_init(&mut conn, 7, null(), 0), FB_ERR_INVALID_ARGUMENT);
        assert_eq!(fb_connection_init(&mut conn, FB_ROLE_SERVER, null(), 0), FB_OK);
        assert_eq!(fb_connection_state(&mut conn), FB_STATE_OPEN);
        // A null buffer with a length, a null output.
        assert_eq!(fb_connection_handle_input(&mut conn, 0, null_mut(), 4, &mut got), FB_ERR_NULL);
        assert_eq!(
            fb_connection_handle_input(&mut conn, 0, buf.as_mut_ptr(), 4, null_mut()),
            FB_ERR_NULL
        );
        // An empty input may come with a null pointer.
        assert_eq!(fb_connection_handle_input(&mut conn, 0, null_mut(), 0, &mut got), FB_OK);
        assert_eq!(fb_connection_deinit(&mut conn), FB_OK);
        assert_eq!(fb_connection_state(&mut conn), FB_ERR_NOT_INITIALIZED);

        let mut storage = [0u64; FB_CONNECTION_SIZE / 8 + 1];
        let misaligned = storage.as_mut_ptr().cast::<u8>().add(4).cast::<FbConnection>();
        assert_eq!(
            fb_connection_init(misaligned, FB_ROLE_SERVER, null(), 0),
            FB_ERR_INVALID_ARGUMENT
        );
    }
}

#[test]
fn handshake_then_messages_pings_and_a_clean_close() {
    // Client request, server answer, client check: all through the ABI.
    let (host, path, nonce) = (b"example.com", b"/chat", [7u8; 16]);
    let mut key = [0u8; FB_KEY_LEN];
    let mut request = [0u8; 512];
    let mut n = 0;
    let rc = unsafe {
        fb_handshake_client_request(
            host.as_ptr(),
            host.len(),
            path.as_ptr(),
            path.len(),
            nonce.as_ptr(),
            key.as_mut_ptr(),
            request.as_mut_ptr(),
            request.len(),
            &mut n,
        )
    };
    assert_eq!(rc, FB_OK);
    let mut hs: FbHandshake = unsafe { std::mem::zeroed() };
    let mut response = [0u8; 256];
    let rc = unsafe {
        fb_handshake_accept(
            request.as_ptr(),
            n - 1,
            8192,
            null(),
            0,
            response.as_mut_ptr(),
            response.len(),
            &mut hs,
        )
    };
    assert_eq!(rc, 0, "an unfinished head asks for more");
    let rc = unsafe {
        fb_handshake_accept(
            request.as_ptr(),
            n,
            8192,
            null(),
            0,
            response.as_mut_ptr(),
            response.len(),
            &mut hs,
        )
    };
    assert_eq!(rc, 1);
    assert_eq!((hs.status, hs.head_len), (101, n));
    assert_eq!(unsafe { std::slice::from_raw_parts(hs.path, hs.path_len) }, b"/chat");
    let rc = unsafe {
        fb_handshake_client_response(
            response.as_ptr(),
            hs.response_len,
            8192,
            key.as_ptr(),
            &mut hs,
        )
    };
    assert_eq!(rc, 1);

    let (mut client, mut server) = (init(FB_ROLE_CLIENT), init(FB_ROLE_SERVER));
    // A masked text message in two frames, a ping between them.
    let mask = [1u8, 2, 3, 4];
    let mut wire = Vec::new();
    let mut out = [0u8; 64];
    for (opcode, fin, part) in
        [(FB_OPCODE_TEXT, false, &b"hel"[..]), (FB_OPCODE_CONTINUATION, true, b"lo")]
    {
        let rc = unsafe {
            fb_connection_send_frame(
                &mut client,
                opcode,
                fin,
                part.as_ptr(),
                part.len(),
                mask.as_ptr(),
                out.as_mut_ptr(),
                out.len(),
                &mut n,
            )
        };
        assert_eq!(rc, FB_OK);
        wire.extend_from_slice(&out[..n]);
        if !fin {
            let rc = unsafe {
                fb_connection_send_ping(
                    &mut client,
                    b"p".as_ptr(),
                    1,
                    mask.as_ptr(),
                    out.as_mut_ptr(),
                    out.len(),
                    &mut n,
                )
            };
            assert_eq!(rc, FB_OK);
            wire.extend_from_slice(&out[..n]);
        }
    }
    let (data, status, events) = receive(&mut server, &mut wire);
    assert_eq!((data.as_slice(), status), (&b"hello"[..], FB_OK));
    assert_eq!(events, [(FB_EVENT_PING, 0, b"p".to_vec())]);
    // The automatic pong goes back.
    let mut back = Vec::new();
    transmit(&mut server, None, &mut back);
    let (_, status, events) = receive(&mut client, &mut back);
    assert_eq!((status, events), (FB_OK, vec![(FB_EVENT_PONG, 0, b"p".to_vec())]));

    // The client closes; the server answers; both report a clean close.
    let reason = b"bye";
    let rc = unsafe { fb_connection_close(&mut client, 0, 1000, reason.as_ptr(), reason.len()) };
    assert_eq!(rc, FB_OK);
    assert_eq!(unsafe { fb_connection_state(&mut client) }, FB_STATE_CLOSE_SENT);
    let mut wire = Vec::new();
    transmit(&mut client, Some(mask), &mut wire);
    let (_, _, events) = receive(&mut server, &mut wire);
    assert_eq!(events, [(FB_EVENT_CLOSED, 1000, b"bye".to_vec())]);
    let mut back = Vec::new();
    transmit(&mut server, None, &mut back);
    let (_, _, events) = receive(&mut client, &mut back);
    assert_eq!(events, [(FB_EVENT_CLOSED, 1000, Vec::new())]);
    assert_eq!(unsafe { fb_connection_state(&mut server) }, FB_STATE_CLOSED);
    assert_eq!(unsafe { fb_connection_state(&mut client) }, FB_STATE_CLOSED);
}

#[test]
fn peer_errors_carry_their_close_codes() {
    // An unmasked frame to a server: 1002, and the close frame is queued.
    let mut server = init(FB_ROLE_SERVER);
    let mut wire = b"\x81\x02hi".to_vec();
    let (_, status, _) = receive(&mut server, &mut wire);
    assert_eq!(status, FB_ERR_PROTO_UNMASKED_FRAME);
    assert_eq!(fb_error_close_code(status), 1002);
    let mut back = Vec::new();
    transmit(&mut server, None, &mut back);
    assert_eq!(&back[..4], b"\x88\x19\x03\xea"); // close, 25 bytes, 1002
    assert_eq!(unsafe { fb_connection_state(&mut server) }, FB_STATE_CLOSED);

    // Invalid UTF-8 to a client: 1007, reported in the input too.
    let mut client = init(FB_ROLE_CLIENT);
    let mut got = input();
    let mut wire = b"\x81\x02\xc3\x28".to_vec();
    let rc = unsafe {
        fb_connection_handle_input(&mut client, 0, wire.as_mut_ptr(), wire.len(), &mut got)
    };
    assert_eq!((rc, got.close_code), (FB_ERR_PROTO_INVALID_UTF8, 1007));

    // Over max_message_size (which caps max_frame_size): 1009.
    let mut config: FbConfig = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { fb_config_default(&mut config) }, FB_OK);
    config.max_message_size = 4;
    let mut client = zeroed_connection();
    assert_eq!(unsafe { fb_connection_init(&mut client, FB_ROLE_CLIENT, &config, 0) }, FB_OK);
    let mut wire = b"\x82\x05hello".to_vec();
    let (_, status, _) = receive(&mut client, &mut wire);
    assert_eq!((status, fb_error_close_code(status)), (FB_ERR_PROTO_FRAME_TOO_LARGE, 1009));

    // Every status has a description; only peer errors have close codes.
    for status in -400..=1 {
        assert!(!fb_error_str(status).is_null());
        let close = fb_error_close_code(status);
        assert_eq!(close != 0, (-115..=-100).contains(&status), "status {status}");
    }
}

#[test]
fn api_misuse_and_small_buffers_are_codes() {
    let mut server = init(FB_ROLE_SERVER);
    let mut out = [0u8; 4];
    let mut n = 0;
    let payload = [0u8; 10];
    let send = |conn: &mut FbConnection, opcode, mask: *const u8, out: &mut [u8], n: &mut usize| unsafe {
        fb_connection_send_frame(
            conn,
            opcode,
            true,
            payload.as_ptr(),
            payload.len(),
            mask,
            out.as_mut_ptr(),
            out.len(),
            n,
        )
    };
    assert_eq!(
        send(&mut server, FB_OPCODE_BINARY, null(), &mut out, &mut n),
        FB_ERR_INSUFFICIENT_SIZE
    );
    assert_eq!(n, 12, "the size required");
    let mut big = [0u8; 16];
    assert_eq!(send(&mut server, 0x9, null(), &mut big, &mut n), FB_ERR_INVALID_ARGUMENT);
    assert_eq!(
        send(&mut server, FB_OPCODE_CONTINUATION, null(), &mut big, &mut n),
        FB_ERR_NO_MESSAGE_IN_PROGRESS
    );
    assert_eq!(
        send(&mut server, FB_OPCODE_TEXT, [1, 2, 3, 4].as_ptr(), &mut big, &mut n),
        FB_ERR_WRONG_MASKING
    );
    let reason = [0xffu8];
    assert_eq!(
        unsafe { fb_connection_close(&mut server, 0, 1000, reason.as_ptr(), 1) },
        FB_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        unsafe { fb_connection_close(&mut server, 0, 1006, null(), 0) },
        FB_ERR_INVALID_CLOSE_CODE
    );
    assert_eq!(unsafe { fb_connection_close(&mut server, 0, 1001, null(), 0) }, FB_OK);
    assert_eq!(send(&mut server, FB_OPCODE_TEXT, null(), &mut big, &mut n), FB_ERR_AFTER_CLOSE);
    let mut at = 0;
    assert_eq!(unsafe { fb_connection_poll_timeout(&mut server, &mut at) }, 1);
    assert_eq!(at, 5000, "the close timer");

    // A refused upgrade writes its response and says its status.
    let request = b"POST / HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut hs: FbHandshake = unsafe { std::mem::zeroed() };
    let mut response = [0u8; 512];
    let rc = unsafe {
        fb_handshake_accept(
            request.as_ptr(),
            request.len(),
            8192,
            null(),
            0,
            response.as_mut_ptr(),
            response.len(),
            &mut hs,
        )
    };
    assert_eq!(
        (rc, hs.status, fb_error_http_status(rc)),
        (FB_ERR_HANDSHAKE_METHOD_NOT_ALLOWED, 405, 405)
    );
    assert!(response[..hs.response_len].starts_with(b"HTTP/1.1 405 "));
}

#[test]
fn pool_over_caller_regions() {
    const CHUNK: usize = 64;
    let mut data = vec![0u8; CHUNK * 3];
    // SAFETY: the slot types are plain integers.
    let mut chunks: Vec<FbChunkSlot> = (0..3).map(|_| unsafe { std::mem::zeroed() }).collect();
    let mut segments: Vec<FbSegmentSlot> = (0..1).map(|_| unsafe { std::mem::zeroed() }).collect();
    let mut pool: FbPool = unsafe { std::mem::zeroed() };
    let footprint = fb_pool_footprint(CHUNK, 3, 1);
    assert_eq!(footprint, 3 * (CHUNK + 8) + 16);
    let init = |pool: &mut FbPool,
                budget,
                data: &mut [u8],
                chunks: &mut [FbChunkSlot],
                segs: &mut [FbSegmentSlot]| unsafe {
        fb_pool_init(
            pool,
            budget,
            CHUNK,
            data.as_mut_ptr(),
            data.len(),
            chunks.as_mut_ptr(),
            chunks.len(),
            segs.as_mut_ptr(),
            segs.len(),
        )
    };
    let mut id = 0;
    assert_eq!(unsafe { fb_pool_alloc(&mut pool, &mut id) }, FB_ERR_NOT_INITIALIZED);
    assert_eq!(
        init(&mut pool, footprint - 1, &mut data, &mut chunks, &mut segments),
        FB_ERR_POOL_BUDGET
    );
    assert_eq!(
        init(&mut pool, footprint, &mut data[1..], &mut chunks, &mut segments),
        FB_ERR_POOL_CONFIG
    );
    assert_eq!(init(&mut pool, footprint, &mut data, &mut chunks, &mut segments), FB_OK);

    let mut ids = [0u32; 3];
    for id in &mut ids {
        assert_eq!(unsafe { fb_pool_alloc(&mut pool, id) }, FB_OK);
    }
    assert_eq!(unsafe { fb_pool_alloc(&mut pool, &mut id) }, FB_ERR_POOL_CHUNKS_EXHAUSTED);
    let text = [b'x'; 100];
    assert_eq!(unsafe { fb_pool_append(&mut pool, ids[0], text.as_ptr(), text.len()) }, 64);
    let (mut ptr, mut len) = (null(), 0);
    assert_eq!(unsafe { fb_pool_bytes(&mut pool, ids[0], &mut ptr, &mut len) }, FB_OK);
    assert_eq!(unsafe { std::slice::from_raw_parts(ptr, len) }, &text[..64]);
    let (mut spare, mut room) = (null_mut(), 0);
    assert_eq!(unsafe { fb_pool_spare(&mut pool, ids[1], &mut spare, &mut room) }, FB_OK);
    assert_eq!(room, CHUNK);
    unsafe { spare.write(b'y') };
    assert_eq!(unsafe { fb_pool_commit(&mut pool, ids[1], 1) }, 1);

    assert_eq!(unsafe { fb_pool_share(&mut pool, ids[2]) }, FB_OK);
    assert_eq!(unsafe { fb_pool_release(&mut pool, ids[2]) }, FB_OK);
    assert_eq!(unsafe { fb_pool_release(&mut pool, ids[2]) }, FB_OK);
    assert_eq!(
        unsafe { fb_pool_release(&mut pool, ids[2]) },
        FB_ERR_POOL_BAD_CHUNK,
        "already free"
    );
    assert_eq!(unsafe { fb_pool_release(&mut pool, 99) }, FB_ERR_POOL_BAD_CHUNK, "out of range");
    let mut stats: FbPoolStats = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { fb_pool_stats(&mut pool, &mut stats) }, FB_OK);
    assert_eq!((stats.chunks_total, stats.chunks_in_use, stats.allocation_failures), (3, 2, 1));
    assert_eq!(unsafe { fb_pool_deinit(&mut pool) }, FB_OK);
}

#[test]
fn an_idle_connection_parks_in_32_bytes_and_resumes() {
    let mut config: FbConfig = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { fb_config_default(&mut config) }, FB_OK);
    config.ping_interval_ms = 30_000;
    let mut conn = zeroed_connection();
    assert_eq!(unsafe { fb_connection_init(&mut conn, FB_ROLE_SERVER, &config, 1_000) }, FB_OK);
    let mut parked: FbParked = unsafe { std::mem::zeroed() };
    assert_eq!(std::mem::size_of::<FbParked>(), FB_PARKED_SIZE);
    let mut at = 0;
    assert_eq!(unsafe { fb_parked_poll_timeout(&mut parked, &mut at) }, FB_ERR_NOT_INITIALIZED);

    // Half a frame in flight: not parkable.
    let mut half = b"\x81\x85\x01\x02".to_vec();
    let mut got = input();
    let rc =
        unsafe { fb_connection_handle_input(&mut conn, 1_000, half.as_mut_ptr(), 4, &mut got) };
    assert_eq!((rc, got.consumed), (FB_OK, 4));
    assert_eq!(unsafe { fb_connection_park(&mut conn, &mut parked) }, 0);

    // A fresh idle connection parks; its keep-alive deadline goes with it.
    assert_eq!(unsafe { fb_connection_init(&mut conn, FB_ROLE_SERVER, &config, 1_000) }, FB_OK);
    assert_eq!(unsafe { fb_connection_park(&mut conn, &mut parked) }, 1);
    assert_eq!(unsafe { fb_connection_deinit(&mut conn) }, FB_OK);
    assert_eq!(unsafe { fb_parked_poll_timeout(&mut parked, &mut at) }, 1);
    assert_eq!(at, 31_000);

    // Resumed into other storage, it reads a masked frame as before.
    let mut other = zeroed_connection();
    assert_eq!(unsafe { fb_connection_resume(&mut parked, &config, &mut other) }, FB_OK);
    let mut frame = b"\x81\x82\x00\x00\x00\x00hi".to_vec();
    let (data, status, _) = receive(&mut other, &mut frame);
    assert_eq!((data.as_slice(), status), (&b"hi"[..], FB_OK));
    assert_eq!(unsafe { fb_connection_poll_timeout(&mut other, &mut at) }, 1);
    assert_eq!(at, 30_000, "input restarts the keep-alive interval from its time (0 here)");
}
