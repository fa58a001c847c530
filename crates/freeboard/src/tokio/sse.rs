//! Server-Sent Events from an axum route: a `GET` with `Accept: text/event-stream` answered
//! with a `text/event-stream` body that is a freeboard session on the route's [`Endpoint`],
//! subscribed to its topics, so one [`Endpoint::publish`] reaches WebSocket and SSE
//! subscribers alike. hyper serves it over HTTP/1.1 and, behind
//! [`Http2Server`](super::http2::Http2Server), as a stream of an HTTP/2 connection: many
//! event streams of one browser share one TCP and TLS connection.
//!
//! ```no_run
//! use axum::{Extension, Router, extract::Path, response::Response, routing::get};
//! use freeboard::tokio::sse::EventStreamRequest;
//! use freeboard::tokio::{Endpoint, EndpointConfig};
//!
//! async fn scores(Path(topic): Path<String>, events: EventStreamRequest) -> Response {
//!     events.subscribe([topic])
//! }
//!
//! # async fn run() -> std::io::Result<()> {
//! let endpoint = Endpoint::new(EndpointConfig::default()).expect("a budget");
//! let app = Router::new().route("/events/{topic}", get(scores)).layer(Extension(endpoint));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! The stream is the session a WebSocket of the endpoint is: admitted only when the pool has
//! a connection's reserve free (else `503` with `Retry-After`, counted in
//! [`Endpoint::budget_refusals`]), with the route's send queue — watermarks, hard cap and
//! slow-consumer policy ([`WsConfig`]) — and counted among [`Endpoint::connections`] and in
//! [`Endpoint::event_streams`]. Its events are encoded as `freeboard serve` encodes them
//! (`event:` the topic when the stream carries several, `data:` lines, binary payloads as
//! base64 under `message+base64` or `{topic}+base64`); it starts with `retry:`, an idle
//! stream gets a `: keep-alive` comment every `idle_timeout` of the endpoint's limits (none
//! when that is `None`, the tokio endpoint's default), and a stream the server ends (the
//! `close` policy: `freeboard-close` `1008 slow consumer`) ends with its last event.
//!
//! The tokio driver keeps no history: events carry no `id:`, so `EventSource` never sends
//! `Last-Event-ID`; a request that does (or names `?lastEventId=` / `?since=`) asks for a
//! resume nothing can honour, and is answered `400`, as `freeboard serve` answers one on a
//! topic without history — never a stream with a silent gap.
//!
//! The body ([`EventStreamBody`]) takes bytes from the session's send queue only when hyper
//! polls it for the next frame, at most [`MAX_FRAME`] at a time: hyper's HTTP/1.1 connection
//! and HTTP/2's flow control decide when, and a reader that falls behind fills the send queue
//! and meets its policy there, not growth in hyper. What hyper holds of a stream beyond the
//! queue is at most [`MAX_IN_HYPER`] (32 KiB): each frame tells the body when hyper drops it,
//! and the body hands over no more meanwhile — tighter than hyper's own limits (over
//! HTTP/1.1 its write queue takes 16 frames; over HTTP/2 a stream's send buffer,
//! `max_send_buffer` in [`Http2Config`](super::http2::Http2Config), and one frame). The
//! kernel's socket buffers come on top, as for a WebSocket.

use std::convert::Infallible;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{self, Poll, Waker};
use std::time::Duration;

use ::tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use axum::extract::FromRequestParts;
use axum::http::{HeaderValue, Method, StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hyper::body::Frame;

use super::axum::budget_refusal;
use super::driver::Turn;
use super::{Endpoint, OwnedMessage, SubscribeError, WebSocket, WsConfig};

/// The most bytes one body frame takes from the send queue. An event is usually far smaller:
/// a frame carries what was queued when hyper polled, often one event.
pub const MAX_FRAME: usize = 16 << 10;

/// The most bytes of one stream hyper holds (frames it took and has not yet written and
/// dropped), whatever its own buffering would allow: two frames, so one is written while the
/// next waits. The body hands over no more until hyper drops one; the session's queue keeps
/// the rest, under its policy.
pub const MAX_IN_HYPER: usize = 2 * MAX_FRAME;

/// The extractor of a request for an event stream; answer it with
/// [`subscribe`](Self::subscribe).
#[derive(Debug)]
pub struct EventStreamRequest {
    endpoint: Option<Arc<Endpoint>>,
    config: WsConfig,
    retry: Duration,
}

/// Why a request cannot have an event stream; its response is the status and a one-line
/// reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventStreamRejection {
    /// Not a `GET` (405).
    Method,
    /// No `Accept: text/event-stream` (406).
    NotAccepted,
    /// A `Last-Event-ID` (or `?lastEventId=`, `?since=`) that is no offset (400).
    MalformedResume,
    /// A resume asked of an endpoint that keeps no history (400).
    NoHistory,
}

impl IntoResponse for EventStreamRejection {
    fn into_response(self) -> Response {
        let (status, why) = match self {
            Self::Method => (StatusCode::METHOD_NOT_ALLOWED, "an event stream is a GET"),
            Self::NotAccepted => (StatusCode::NOT_ACCEPTABLE, "expected Accept: text/event-stream"),
            Self::MalformedResume => (
                StatusCode::BAD_REQUEST,
                "Last-Event-ID is not an offset: give the id of the last event received",
            ),
            Self::NoHistory => (
                StatusCode::BAD_REQUEST,
                "these topics keep no history: an event stream cannot resume from an offset",
            ),
        };
        (status, why).into_response()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for EventStreamRequest {
    type Rejection = EventStreamRejection;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        if parts.method != Method::GET {
            return Err(EventStreamRejection::Method);
        }
        let accepts = parts.headers.get_all(header::ACCEPT).iter().any(|value| {
            value.to_str().is_ok_and(|v| {
                v.split(',').any(|range| {
                    let media = range.split(';').next().unwrap_or_default().trim();
                    media.eq_ignore_ascii_case("text/event-stream")
                })
            })
        });
        if !accepts {
            return Err(EventStreamRejection::NotAccepted);
        }
        // The resume `freeboard serve` reads from `Last-Event-ID` (or the query, for a
        // browser's first request), parsed by the same function.
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let last_event_id = parts.headers.get("last-event-id").map(HeaderValue::as_bytes);
        match crate::topics::event_stream_target(target, last_event_id) {
            Err(_) => return Err(EventStreamRejection::MalformedResume),
            Ok(std::borrow::Cow::Owned(_)) => return Err(EventStreamRejection::NoHistory),
            Ok(std::borrow::Cow::Borrowed(_)) => {}
        }
        if freeboard_proto::http::query_value(target, "since").is_some() {
            return Err(EventStreamRejection::NoHistory);
        }
        let endpoint = parts.extensions.get::<Arc<Endpoint>>().cloned();
        Ok(Self { endpoint, config: WsConfig::default(), retry: Duration::from_secs(1) })
    }
}

impl EventStreamRequest {
    /// This route's send queue settings (its subprotocols do not apply).
    pub fn config(mut self, config: WsConfig) -> Self {
        self.config = config;
        self
    }

    /// The endpoint (budget) this route's streams draw from, instead of the
    /// `Extension<Arc<Endpoint>>` layer's.
    pub fn endpoint(mut self, endpoint: &Arc<Endpoint>) -> Self {
        self.endpoint = Some(Arc::clone(endpoint));
        self
    }

    /// How long `EventSource` waits before it reconnects a stream that was cut: the `retry:`
    /// line the stream starts with. Default 1 s (`freeboard serve`'s `sse_retry_ms`).
    pub fn retry(mut self, retry: Duration) -> Self {
        self.retry = retry;
        self
    }

    /// Answers `200` with an event stream subscribed to `topics` (`event:` names the topic
    /// of each event when there are several). Answers `503` with `Retry-After` when the
    /// endpoint's pool cannot cover a connection's reserve or its topic tables the
    /// subscriptions, `400` for an invalid topic name or more topics than one connection
    /// may have, and `500` when no endpoint was given.
    pub fn subscribe<I, T>(self, topics: I) -> Response
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        let Some(endpoint) = self.endpoint else {
            let why = "no freeboard Endpoint: add .layer(Extension(endpoint)) to the router";
            return (StatusCode::INTERNAL_SERVER_ERROR, why).into_response();
        };
        if !endpoint.has_room() {
            return budget_refusal(&endpoint);
        }
        let topics: Vec<T> = topics.into_iter().collect();
        let sink = EventSink::new(self.retry);
        let socket = WebSocket::from_upgraded(sink, &endpoint, &self.config, None);
        socket.reader.writer.shared.lock().session.set_event_stream(topics.len() > 1);
        let body = EventStreamBody::new(socket);
        for topic in &topics {
            match body.socket.subscribe(topic.as_ref()) {
                Ok(_) => {}
                Err(SubscribeError::NoMemory | SubscribeError::TooManyTopicsOnServer) => {
                    return budget_refusal(&endpoint);
                }
                Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
            }
        }
        let mut response = Response::new(axum::body::Body::new(body));
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        // nginx passes each event at once instead of buffering the response.
        headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        response
    }
}

/// The body of an event stream: takes the session's queued events when hyper polls it, at
/// most [`MAX_FRAME`] bytes a frame, and runs its timers (keep-alive); it ends after the
/// last event of a stream the server ended. Dropping it (the client went away) ends the
/// session and its subscriptions.
pub struct EventStreamBody {
    socket: WebSocket<EventSink>,
    /// The session ended: what it queued before its end goes out, then the body ends.
    ended: bool,
    /// What hyper holds of this stream.
    in_hyper: Arc<InHyper>,
}

/// The bytes of a stream's frames hyper took and has not dropped, and the body's task to wake
/// when it drops one.
#[derive(Default)]
struct InHyper {
    bytes: AtomicUsize,
    waker: Mutex<Option<Waker>>,
}

/// A body frame's bytes: dropping them (hyper wrote them, or gave up) tells the body.
struct HeldFrame {
    bytes: Vec<u8>,
    in_hyper: Arc<InHyper>,
}

impl AsRef<[u8]> for HeldFrame {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for HeldFrame {
    fn drop(&mut self) {
        self.in_hyper.bytes.fetch_sub(self.bytes.len(), Ordering::AcqRel);
        let waker = self.in_hyper.waker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl EventStreamBody {
    fn new(socket: WebSocket<EventSink>) -> Self {
        socket.endpoint().event_streams.fetch_add(1, Ordering::Relaxed);
        Self { socket, ended: false, in_hyper: Arc::default() }
    }

    /// Whether hyper holds so much of this stream that the next frame of `len` bytes must
    /// wait; if so, the task is woken when hyper drops a frame. One frame always may go.
    fn hyper_is_full(&self, len: usize, task: &task::Context<'_>) -> bool {
        let held = self.in_hyper.bytes.load(Ordering::Acquire);
        if held == 0 || held + len <= MAX_IN_HYPER {
            return false;
        }
        *self.in_hyper.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(task.waker().clone());
        // A frame dropped before the waker was in place woke nobody: look again.
        self.in_hyper.bytes.load(Ordering::Acquire) == held
    }
}

impl hyper::body::Body for EventStreamBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        task: &mut task::Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let shared = &this.socket.reader.writer.shared;
        if !this.ended {
            // The reader's turn writes what is queued into the sink (as far as a frame
            // goes), runs the timers and reports the end; an event stream reads nothing.
            loop {
                match shared.poll_recv(task) {
                    Poll::Ready(Some(OwnedMessage::Close(_)) | None) => this.ended = true,
                    Poll::Ready(Some(_)) => continue,
                    Poll::Pending => {}
                }
                break;
            }
        }
        let mut guard = shared.lock();
        let conn = &mut *guard;
        if this.ended && conn.io.out.is_empty() {
            // The end event, and what was queued before it, leave before the body ends.
            let _ = conn.write(&mut Turn::new(&shared.endpoint), task);
        }
        if !conn.io.out.is_empty() {
            if this.hyper_is_full(conn.io.out.len(), task) {
                // The frame waits in the sink, and the queue behind it.
                return Poll::Pending;
            }
            let bytes = std::mem::take(&mut conn.io.out);
            this.in_hyper.bytes.fetch_add(bytes.len(), Ordering::AcqRel);
            let held = HeldFrame { bytes, in_hyper: Arc::clone(&this.in_hyper) };
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_owner(held)))));
        }
        match this.ended {
            true => Poll::Ready(None),
            // Woken by a publication queued, a timer, or room in the queue.
            false => Poll::Pending,
        }
    }
}

impl Drop for EventStreamBody {
    fn drop(&mut self) {
        self.socket.endpoint().event_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for EventStreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.socket.shared.fmt("EventStreamBody", f)
    }
}

/// The transport of an event stream's session: its writes fill the next body frame, up to
/// [`MAX_FRAME`] bytes (a full frame makes the write wait: the queue keeps the rest, under
/// its policy, until hyper takes the frame); it has nothing to read.
pub(super) struct EventSink {
    /// The next body frame. Invariant: at most [`MAX_FRAME`] bytes.
    out: Vec<u8>,
}

impl EventSink {
    fn new(retry: Duration) -> Self {
        // The stream's first line (WHATWG HTML §9.2.6: "If the field name is "retry"… set the
        // event stream's reconnection time to that integer").
        Self { out: format!("retry: {}\n\n", retry.as_millis()).into_bytes() }
    }
}

impl AsyncWrite for EventSink {
    fn poll_write(
        self: Pin<&mut Self>,
        task: &mut task::Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(task, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        _: &mut task::Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let out = &mut self.get_mut().out;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let room = MAX_FRAME - out.len();
        if total > 0 && room == 0 {
            // The body hands this frame to hyper, which polls again when it wants more.
            return Poll::Pending;
        }
        out.reserve(total.min(room));
        let mut written = 0;
        for buf in bufs {
            let n = buf.len().min(room - written);
            out.extend_from_slice(&buf[..n]);
            written += n;
            if written == room {
                break;
            }
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut task::Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut task::Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for EventSink {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut task::Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // Nothing comes back on an event stream (hyper reads the request): the session's
        // reader waits for what it writes and for its timers, which wake the body.
        Poll::Pending
    }
}
