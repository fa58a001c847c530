//! The server's opening handshake on a bare tokio stream: read the request head (bounded in
//! size and time), answer `101` or refuse with the status the failure earns.

use std::sync::Arc;

use freeboard_proto::handshake::{DEFAULT_MAX_HEAD_LEN, EMPTY_HEADER, HandshakeError, Request};
use freeboard_proto::http;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Endpoint, WsConfig};

/// Why [`WebSocket::accept`](super::WebSocket::accept) did not open a connection.
#[derive(Debug)]
#[non_exhaustive]
pub enum AcceptError {
    /// The request was refused with `status` (answered on the stream).
    Refused {
        /// The HTTP status sent.
        status: u16,
        /// Why.
        error: HandshakeError,
    },
    /// The pool cannot cover a connection's reserve: answered 503.
    Busy,
    /// The request head did not arrive within 10 s.
    Timeout,
    /// The stream failed or ended.
    Io(std::io::Error),
}

impl std::fmt::Display for AcceptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AcceptError::Refused { status, error } => write!(f, "refused with {status}: {error}"),
            AcceptError::Busy => f.write_str("refused with 503: memory budget exhausted"),
            AcceptError::Timeout => f.write_str("no complete upgrade request within 10 s"),
            AcceptError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for AcceptError {}

impl From<std::io::Error> for AcceptError {
    fn from(e: std::io::Error) -> Self {
        AcceptError::Io(e)
    }
}

impl From<AcceptError> for std::io::Error {
    fn from(e: AcceptError) -> Self {
        match e {
            AcceptError::Io(e) => e,
            e => std::io::Error::other(e),
        }
    }
}

/// Answers the upgrade request on `io`; returns the chosen subprotocol and the bytes read
/// past the request head (frames the client sent right away).
pub(super) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    endpoint: &Arc<Endpoint>,
    config: &WsConfig,
) -> Result<(Option<String>, Vec<u8>), AcceptError> {
    let mut head = Vec::with_capacity(1024);
    let len = tokio::time::timeout(endpoint.limits.handshake_timeout, async {
        loop {
            let mut chunk = [0u8; 1024];
            let n = io.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
            head.extend_from_slice(&chunk[..n]);
            if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                return Ok::<usize, std::io::Error>(end + 4);
            }
            if head.len() >= DEFAULT_MAX_HEAD_LEN {
                return Ok(head.len());
            }
        }
    })
    .await
    .map_err(|_| AcceptError::Timeout)??;
    let mut headers = [EMPTY_HEADER; 64];
    let request = match Request::parse(&head[..len], &mut headers, DEFAULT_MAX_HEAD_LEN) {
        Ok(Some((request, _))) => request,
        // The head reached the limit without its end.
        Ok(None) => {
            let error = HandshakeError::HeadTooLarge;
            return Err(refuse_with(io, error.status(), &error.to_string(), error).await);
        }
        Err(error) => return Err(refuse_with(io, error.status(), &error.to_string(), error).await),
    };
    if !endpoint.has_room() {
        let mut out = [0u8; 512];
        let headers = "Retry-After: 1\r\n";
        let body = "server memory budget exhausted";
        let n = http::write_refusal(503, headers, body, &mut out).unwrap_or_default();
        io.write_all(&out[..n]).await?;
        let _ = io.shutdown().await;
        return Err(AcceptError::Busy);
    }
    let supported: Vec<&str> = config.protocols.iter().map(String::as_str).collect();
    let protocol = request.select_protocol(&supported);
    let mut response = [0u8; 1024];
    // A 101 with a subprotocol from the request fits in 1 KiB unless the name itself is
    // that long; such a request is refused as too large.
    let n = match request.accept(protocol, None, &mut response) {
        Ok(n) => n,
        Err(_) => {
            let error = HandshakeError::HeadTooLarge;
            return Err(refuse_with(io, error.status(), "subprotocol too long", error).await);
        }
    };
    io.write_all(&response[..n]).await?;
    io.flush().await?;
    Ok((protocol.map(str::to_owned), head.split_off(len)))
}

async fn refuse_with<S: AsyncWrite + Unpin>(
    io: &mut S,
    status: u16,
    why: &str,
    error: HandshakeError,
) -> AcceptError {
    let mut out = [0u8; 512];
    let n = http::write_refusal(status, "", why, &mut out).unwrap_or_default();
    if let Err(e) = io.write_all(&out[..n]).await {
        return AcceptError::Io(e);
    }
    let _ = io.shutdown().await;
    AcceptError::Refused { status, error }
}
