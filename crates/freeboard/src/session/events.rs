//! Server-Sent Events: the framing a subscriber over an `text/event-stream` response gets
//! instead of WebSocket frames (WHATWG HTML §9.2, "Server-sent events"). The session, its
//! send queue and its policies are the WebSocket's; only the bytes of a message differ.
//!
//! An event is `id:` (a history topic's offset, for the topic a reconnect resumes), `event:`
//! (the topic, when the response carries several), one `data:` line per line of the payload,
//! and an empty line. A binary payload goes as one `data:` line of base64, its event type
//! marked `+base64` (`message+base64`, or `{topic}+base64`): `+` is in no topic name, so it
//! cannot be mistaken for a topic's text.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use freeboard_proto::{CloseCode, MessageKind};

use super::Closed;
use crate::history::{CLOSE_EVENT, GAP_EVENT, HISTORY_GONE, Offset};

/// The keep-alive an idle stream gets at the idle interval: a comment, which `EventSource`
/// ignores (§9.2.6: "If the line starts with a U+003A COLON character (:) — Ignore the
/// line").
pub(crate) const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";

/// The state an event-stream session keeps beside the WebSocket one.
pub(crate) struct EventStream {
    /// The response carries several topics: each event names its topic.
    pub(crate) several: bool,
    /// The end of the stream, once it was written (the WebSocket core knows only that its
    /// transport ended); boxed, so an open stream's state stays a few bytes.
    pub(crate) closed: Option<Box<Closed>>,
}

impl EventStream {
    pub(crate) fn new(several: bool) -> Self {
        Self { several, closed: None }
    }
}

/// How one publication is framed for a kind of subscriber: with its `id:`, with its
/// `event:`. A fan-out makes each of the four at most once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Variant {
    pub(crate) id: bool,
    pub(crate) topic: bool,
}

impl Variant {
    pub(crate) fn slot(self) -> usize {
        usize::from(self.id) * 2 + usize::from(self.topic)
    }
}

/// Writes one event into `out` (cleared first): `id` if given, `event` (the topic, or
/// `message` when `None` and the payload is binary), and `data` as data lines (text) or
/// one line of base64 (binary).
pub(crate) fn write_event(
    out: &mut Vec<u8>,
    id: Option<Offset>,
    event: Option<&str>,
    kind: MessageKind,
    data: &[u8],
) {
    use std::io::Write as _;
    out.clear();
    if let Some(id) = id {
        // NOTE(unwrap): writing into a Vec cannot fail.
        writeln!(out, "id: {id}").unwrap();
    }
    match (kind, event) {
        (MessageKind::Binary, name) => {
            let name = name.unwrap_or("message");
            writeln!(out, "event: {name}+base64").unwrap();
            out.extend_from_slice(b"data: ");
            let at = out.len();
            out.resize(at + data.len().div_ceil(3) * 4, 0);
            // NOTE(unwrap): sized for the encoding just above.
            let n = BASE64.encode_slice(data, &mut out[at..]).unwrap();
            out.truncate(at + n);
            out.push(b'\n');
        }
        (MessageKind::Text, name) => {
            if let Some(name) = name {
                writeln!(out, "event: {name}").unwrap();
            }
            // §9.2.6: lines end with CRLF, LF or CR; each of the payload's lines is a data
            // line, and the client joins them with LF.
            let mut rest = data;
            loop {
                let end = rest.iter().position(|b| *b == b'\n' || *b == b'\r');
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(&rest[..end.unwrap_or(rest.len())]);
                out.push(b'\n');
                let Some(end) = end else { break };
                let skip = if rest[end..].starts_with(b"\r\n") { 2 } else { 1 };
                rest = &rest[end + skip..];
            }
        }
    }
    out.push(b'\n');
}

/// The bytes of [`write_end`]'s event besides its reason (its type, its code, the line
/// ends): the reason is cut to fit the room a control frame has past a queue's cap.
pub(crate) const END_OVERHEAD: usize = "event: freeboard-close\ndata: 1008 \n\n".len();

/// The last event of a stream the server ends: [`GAP_EVENT`] for [`HISTORY_GONE`], else
/// [`CLOSE_EVENT`]; the data is the close code and reason.
pub(crate) fn write_end(out: &mut Vec<u8>, code: CloseCode, reason: &str) {
    let event = if code == HISTORY_GONE { GAP_EVENT } else { CLOSE_EVENT };
    let data = format!("{} {reason}", code.0);
    write_event(out, None, Some(event), MessageKind::Text, data.as_bytes());
    // A reason is one line; one with a line break still reads as one event.
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Position;

    fn event(id: Option<Offset>, name: Option<&str>, kind: MessageKind, data: &[u8]) -> String {
        let mut out = Vec::new();
        write_event(&mut out, id, name, kind, data);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn each_payload_line_is_a_data_line() {
        assert_eq!(event(None, None, MessageKind::Text, b"hi"), "data: hi\n\n");
        assert_eq!(event(None, None, MessageKind::Text, b""), "data: \n\n");
        assert_eq!(
            event(None, Some("a"), MessageKind::Text, b"1\n2\r\n3\r4\n"),
            "event: a\ndata: 1\ndata: 2\ndata: 3\ndata: 4\ndata: \n\n"
        );
        let id = Offset { epoch: 0xab, position: Position(17, 3) };
        assert_eq!(event(Some(id), None, MessageKind::Text, b"x"), "id: ab.17-3\ndata: x\n\n");
    }

    #[test]
    fn binary_is_base64_under_a_marked_type() {
        assert_eq!(
            event(None, None, MessageKind::Binary, &[0, 0xff, 1, 2]),
            "event: message+base64\ndata: AP8BAg==\n\n"
        );
        assert_eq!(event(None, Some("t"), MessageKind::Binary, b""), "event: t+base64\ndata: \n\n");
    }

    #[test]
    fn the_end_says_what_to_do() {
        let mut out = Vec::new();
        write_end(&mut out, HISTORY_GONE, "gone");
        assert_eq!(out, b"event: freeboard-gap\ndata: 4410 gone\n\n");
        write_end(&mut out, CloseCode::POLICY_VIOLATION, "slow consumer");
        assert_eq!(out, b"event: freeboard-close\ndata: 1008 slow consumer\n\n");
    }
}
