//! A request head: its pseudo-header fields checked (RFC 9113 §8.3, RFC 8441 §4) and
//! found again without copying.

use crate::hpack::HeaderList;

/// What a well-formed request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestKind {
    /// Extended CONNECT with `:protocol = websocket` (RFC 8441 §4).
    WebSocket,
    /// Extended CONNECT with another `:protocol`.
    OtherProtocol,
    /// Anything else: GET, HEAD, POST, a plain CONNECT.
    Plain,
}

/// Where the pseudo-header fields are in the list (`NONE` when absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PseudoFields {
    method: u16,
    scheme: u16,
    path: u16,
    authority: u16,
    protocol: u16,
    /// The first regular field.
    regular: u16,
}

const NONE: u16 = u16::MAX;

/// Why a request is malformed: a stream error `PROTOCOL_ERROR` (RFC 9113 §8.1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) &'static str);

impl PseudoFields {
    /// Checks a request head and says what it asks for.
    pub(crate) fn check(list: &HeaderList) -> Result<(Self, RequestKind), Malformed> {
        let mut p = Self {
            method: NONE,
            scheme: NONE,
            path: NONE,
            authority: NONE,
            protocol: NONE,
            regular: list.len() as u16,
        };
        for (index, (name, value)) in list.iter().enumerate() {
            let index = index as u16;
            // §8.2.1: names MUST NOT contain 0x00-0x20, 0x41-0x5a (uppercase) or 0x7f-0xff;
            // values MUST NOT contain NUL, LF or CR nor start or end with SP or HTAB.
            let name_chars = name.strip_prefix(b":").unwrap_or(name);
            if name_chars.is_empty()
                || name_chars
                    .iter()
                    .any(|&c| c <= 0x20 || c.is_ascii_uppercase() || c >= 0x7f || c == b':')
            {
                return Err(Malformed("invalid field name"));
            }
            if value.iter().any(|&c| matches!(c, 0 | b'\n' | b'\r'))
                || value.first().is_some_and(|&c| c == b' ' || c == b'\t')
                || value.last().is_some_and(|&c| c == b' ' || c == b'\t')
            {
                return Err(Malformed("invalid field value"));
            }
            if name[0] == b':' {
                // §8.3: "All pseudo-header fields MUST appear in a field block before all
                // regular field lines"; no other pseudo-header fields; none twice.
                if p.regular != list.len() as u16 {
                    return Err(Malformed("pseudo-header after a regular field"));
                }
                let slot = match name {
                    b":method" => &mut p.method,
                    b":scheme" => &mut p.scheme,
                    b":path" => &mut p.path,
                    b":authority" => &mut p.authority,
                    b":protocol" => &mut p.protocol,
                    _ => return Err(Malformed("unknown pseudo-header")),
                };
                if *slot != NONE {
                    return Err(Malformed("duplicate pseudo-header"));
                }
                *slot = index;
                continue;
            }
            if p.regular == list.len() as u16 {
                p.regular = index;
            }
            // §8.2.2: connection-specific fields make a request malformed; "TE ... MUST NOT
            // contain any value other than trailers".
            match name {
                b"connection" | b"proxy-connection" | b"keep-alive" | b"transfer-encoding"
                | b"upgrade" => return Err(Malformed("connection-specific field")),
                b"te" if value != b"trailers" => return Err(Malformed("te other than trailers")),
                _ => {}
            }
        }
        let get = |index: u16| (index != NONE).then(|| list.get(usize::from(index))).flatten();
        let Some((_, method)) = get(p.method) else { return Err(Malformed("no :method")) };
        if method == b"CONNECT" {
            if p.protocol == NONE {
                // §8.5: a plain CONNECT has only :method and :authority.
                if p.scheme != NONE || p.path != NONE || p.authority == NONE {
                    return Err(Malformed("CONNECT with :scheme or :path, or no :authority"));
                }
                return Ok((p, RequestKind::Plain));
            }
            // RFC 8441 §4: "the :scheme and :path pseudo-header fields MUST be included" (and
            // :authority, as for any CONNECT).
            if p.scheme == NONE || p.path == NONE || p.authority == NONE {
                return Err(Malformed("extended CONNECT without :scheme, :path or :authority"));
            }
            let kind = match get(p.protocol) {
                Some((_, b"websocket")) => RequestKind::WebSocket,
                _ => RequestKind::OtherProtocol,
            };
            return Ok((p, kind));
        }
        // RFC 8441 §4: :protocol only on CONNECT. §8.3.1: :method, :scheme, :path required,
        // :path not empty.
        if p.protocol != NONE {
            return Err(Malformed(":protocol without CONNECT"));
        }
        if p.scheme == NONE || get(p.path).is_none_or(|(_, path)| path.is_empty()) {
            return Err(Malformed("no :scheme or :path"));
        }
        Ok((p, RequestKind::Plain))
    }
}

/// A request head, borrowed from the connection until the caller's next call.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    list: &'a HeaderList,
    pseudo: PseudoFields,
}

impl<'a> Request<'a> {
    pub(crate) fn new(list: &'a HeaderList, pseudo: PseudoFields) -> Self {
        Self { list, pseudo }
    }

    fn field(&self, index: u16) -> Option<&'a [u8]> {
        if index == NONE {
            return None;
        }
        self.list.get(usize::from(index)).map(|(_, value)| value)
    }

    /// `:method`.
    pub fn method(&self) -> &'a [u8] {
        // NOTE(unwrap): `PseudoFields::check` made sure it is there.
        self.field(self.pseudo.method).unwrap()
    }

    /// `:scheme` (absent on a plain CONNECT).
    pub fn scheme(&self) -> Option<&'a [u8]> {
        self.field(self.pseudo.scheme)
    }

    /// `:path`, with its query (absent on a plain CONNECT).
    pub fn path(&self) -> Option<&'a [u8]> {
        self.field(self.pseudo.path)
    }

    /// `:authority`.
    pub fn authority(&self) -> Option<&'a [u8]> {
        self.field(self.pseudo.authority)
    }

    /// `:protocol` (RFC 8441), on an extended CONNECT.
    pub fn protocol(&self) -> Option<&'a [u8]> {
        self.field(self.pseudo.protocol)
    }

    /// The regular fields, in order (names lowercase, checked).
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let list = self.list;
        (usize::from(self.pseudo.regular)..list.len()).filter_map(move |index| list.get(index))
    }

    /// The first value of the field `name` (lowercase).
    pub fn header(&self, name: &[u8]) -> Option<&'a [u8]> {
        self.headers().find(|(n, _)| *n == name).map(|(_, value)| value)
    }
}

impl core::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        fn text(b: Option<&[u8]>) -> Option<alloc::borrow::Cow<'_, str>> {
            b.map(alloc::string::String::from_utf8_lossy)
        }
        f.debug_struct("Request")
            .field("method", &text(Some(self.method())))
            .field("path", &text(self.path()))
            .field("authority", &text(self.authority()))
            .field("protocol", &text(self.protocol()))
            .field("headers", &self.headers().count())
            .finish()
    }
}
