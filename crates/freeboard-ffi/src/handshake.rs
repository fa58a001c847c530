//! The opening handshake: `fb_handshake_*`. The request and response heads are parsed into a
//! header array on the stack (`FB_MAX_HEADERS` entries), nothing is kept between calls.

use freeboard_proto::handshake::{
    ClientRequest, EMPTY_HEADER, Header, Key, Request, Response, generate_key,
};

use crate::{
    FB_ERR_INSUFFICIENT_SIZE, FB_ERR_INVALID_ARGUMENT, FB_ERR_NULL, FB_OK, bytes, bytes_mut,
    handshake_code, put, status,
};

/// Headers a request or response may have; more is refused with 431
/// (`FB_ERR_HANDSHAKE_HEAD_TOO_LARGE`).
pub const FB_MAX_HEADERS: usize = 32;
/// Bytes of a `Sec-WebSocket-Key`.
pub const FB_KEY_LEN: usize = 24;

/// The outcome of `fb_handshake_accept` or `fb_handshake_client_response`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FbHandshake {
    /// The length of the request or response head; the bytes after it are the first frames.
    pub head_len: usize,
    /// Bytes written to `out`: the 101 response, or the refusal to send before closing.
    pub response_len: usize,
    /// The HTTP status: 101 when accepted, the refusal's otherwise (client side: the server's).
    pub status: u16,
    /// Server side: the request path (inside the request buffer, not NUL-terminated).
    pub path: *const u8,
    /// Its length.
    pub path_len: usize,
}

/// Server side: parses the upgrade request in `request[0..len]` and answers it into
/// `out[0..cap]` (256 bytes suffice for a 101 without a subprotocol, 512 for any refusal).
///
/// Returns 1 when the request is complete and accepted: `result` has the head length, the
/// 101 response length and the path. Returns 0 while the head is unfinished and shorter than
/// `max_head_len` (read more and call again with the whole head so far). Returns an
/// `FB_ERR_HANDSHAKE_*` code when the request is refused: the refusal (status line, headers, a
/// one-line body) is in `out` when it fits, `result->status` holds its status; send it, then
/// close. `protocol` (UTF-8, `protocol_len` bytes, or null) is the subprotocol this server
/// speaks: when the client offers it, the 101 selects it.
///
/// # Safety
/// `request` valid for reads of `len` bytes; `protocol` null or valid for `protocol_len`
/// bytes; `out` valid for writes of `cap` bytes; `result` valid for writing an `FbHandshake`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_handshake_accept(
    request: *const u8,
    len: usize,
    max_head_len: usize,
    protocol: *const u8,
    protocol_len: usize,
    out: *mut u8,
    cap: usize,
    result: *mut FbHandshake,
) -> i32 {
    let run = || {
        if result.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: as this function's contract.
        let request = unsafe { bytes(request, len) }?;
        // SAFETY: as this function's contract.
        let protocol = unsafe { bytes(protocol, protocol_len) }?;
        let protocol = core::str::from_utf8(protocol).map_err(|_| FB_ERR_INVALID_ARGUMENT)?;
        // SAFETY: as this function's contract.
        let out = unsafe { bytes_mut(out, cap) }?;
        let mut answer = FbHandshake {
            head_len: 0,
            response_len: 0,
            status: 0,
            path: core::ptr::null(),
            path_len: 0,
        };
        let mut headers = [EMPTY_HEADER; FB_MAX_HEADERS];
        let outcome = match Request::parse(request, &mut headers, max_head_len) {
            Ok(None) => Ok(0),
            Ok(Some((req, head_len))) => {
                let selected =
                    (!protocol.is_empty()).then(|| req.select_protocol(&[protocol])).flatten();
                answer.head_len = head_len;
                answer.path = req.path().as_ptr();
                answer.path_len = req.path().len();
                match req.accept(selected, None, out) {
                    Ok(n) => {
                        answer.response_len = n;
                        answer.status = 101;
                        Ok(1)
                    }
                    Err(e) => {
                        answer.response_len = e.required;
                        Err(FB_ERR_INSUFFICIENT_SIZE)
                    }
                }
            }
            Err(refusal) => {
                answer.status = refusal.status();
                answer.response_len = refusal.write_response(out).unwrap_or(0);
                Err(handshake_code(refusal))
            }
        };
        // SAFETY: non-null (checked) and valid for writes (this function's contract).
        unsafe { put(result, answer) }?;
        outcome
    };
    status(run())
}

/// Client side: writes the upgrade request for `host` (the `Host` header: host, and port when
/// not 80) and `path` (starting with `/`) into `out[0..cap]`, stores its length in `written`
/// and the `Sec-WebSocket-Key` made from `nonce` (16 random bytes) in `key` (24 bytes); keep
/// the key for `fb_handshake_client_response`.
///
/// # Safety
/// `host`/`path` valid for their lengths; `nonce` 16 readable bytes; `key` 24 writable bytes;
/// `out` valid for writes of `cap` bytes; `written` valid for writing a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_handshake_client_request(
    host: *const u8,
    host_len: usize,
    path: *const u8,
    path_len: usize,
    nonce: *const u8,
    key: *mut u8,
    out: *mut u8,
    cap: usize,
    written: *mut usize,
) -> i32 {
    let run = || {
        if nonce.is_null() || key.is_null() || written.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: as this function's contract.
        let (host, path) = unsafe { (text(host, host_len)?, text(path, path_len)?) };
        // SAFETY: non-null (checked), 16 readable bytes (this function's contract), align 1.
        let nonce = unsafe { nonce.cast::<[u8; 16]>().read() };
        // SAFETY: as this function's contract.
        let out = unsafe { bytes_mut(out, cap) }?;
        let generated: Key = generate_key(nonce);
        let request = ClientRequest {
            host,
            path,
            key: &generated,
            protocols: &[],
            extensions: None,
            headers: &[],
        };
        let (result, n) = match request.encode(out) {
            Ok(n) => (Ok(FB_OK), n),
            Err(e) => (Err(FB_ERR_INSUFFICIENT_SIZE), e.required),
        };
        // SAFETY: non-null (checked), valid for 24 byte writes (this function's contract).
        unsafe { put(key.cast::<Key>(), generated) }?;
        // SAFETY: non-null (checked), valid for writes (this function's contract).
        unsafe { put(written, n) }?;
        result
    };
    status(run())
}

/// Client side: checks the server's answer in `response[0..len]` to the request made with
/// `key` (from `fb_handshake_client_request`). Returns 1 when it is a valid 101 (`result`
/// has the head length; the bytes after it are the first frames), 0 while the head is
/// unfinished and shorter than `max_head_len`, or an `FB_ERR_HANDSHAKE_*` code
/// (`FB_ERR_HANDSHAKE_REFUSED` with the server's status in `result->status`).
///
/// # Safety
/// `response` valid for reads of `len` bytes; `key` 24 readable bytes; `result` valid for
/// writing an `FbHandshake`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fb_handshake_client_response(
    response: *const u8,
    len: usize,
    max_head_len: usize,
    key: *const u8,
    result: *mut FbHandshake,
) -> i32 {
    let run = || {
        if key.is_null() || result.is_null() {
            return Err(FB_ERR_NULL);
        }
        // SAFETY: as this function's contract.
        let response = unsafe { bytes(response, len) }?;
        // SAFETY: non-null (checked), 24 readable bytes (this function's contract), align 1.
        let key: Key = unsafe { key.cast::<Key>().read() };
        // Only the key and the offers are checked against the answer.
        let request = ClientRequest {
            host: "",
            path: "/",
            key: &key,
            protocols: &[],
            extensions: None,
            headers: &[],
        };
        let mut headers: [Header<'_>; FB_MAX_HEADERS] = [EMPTY_HEADER; FB_MAX_HEADERS];
        let mut answer = FbHandshake {
            head_len: 0,
            response_len: 0,
            status: 0,
            path: core::ptr::null(),
            path_len: 0,
        };
        let outcome = match Response::parse(response, &mut headers, &request, max_head_len) {
            Ok(None) => Ok(0),
            Ok(Some((_, head_len))) => {
                answer.head_len = head_len;
                answer.status = 101;
                Ok(1)
            }
            Err(e) => {
                if let freeboard_proto::handshake::HandshakeError::Refused { status, head_len } = e
                {
                    answer.status = status;
                    answer.head_len = head_len;
                }
                Err(handshake_code(e))
            }
        };
        // SAFETY: non-null (checked) and valid for writes (this function's contract).
        unsafe { put(result, answer) }?;
        outcome
    };
    status(run())
}

/// UTF-8 text from C.
///
/// # Safety
/// As [`bytes`].
unsafe fn text<'a>(ptr: *const u8, len: usize) -> Result<&'a str, i32> {
    // SAFETY: as this function's contract.
    let raw = unsafe { bytes(ptr, len) }?;
    core::str::from_utf8(raw).map_err(|_| FB_ERR_INVALID_ARGUMENT)
}
