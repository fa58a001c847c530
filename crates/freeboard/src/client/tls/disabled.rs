//! What stands in for `wss://` in a build without the `tls` feature: a [`Connector`] that
//! refuses, naming the feature, and a TLS state that cannot be made.

use std::convert::Infallible;
use std::io::{self, Read, Write};
use std::net::TcpStream;

use crate::MissingFeature;
use crate::client::{ClientError, TlsRoots};

/// A client connection's TLS state: none in this build.
pub(super) struct Connection {
    never: Infallible,
}

impl Connection {
    /// Anything at all: no connection exists to ask.
    pub(super) fn absurd<T>(self) -> T {
        match self.never {}
    }
}

/// The blocking stream the opening handshake runs over: none in this build.
pub(super) struct Handshaking {
    pub(super) sock: TcpStream,
    never: Infallible,
}

impl Handshaking {
    pub(super) fn new(conn: Connection, _sock: TcpStream) -> Self {
        conn.absurd()
    }

    pub(super) fn into_parts(self) -> (Connection, TcpStream) {
        match self.never {}
    }
}

impl Read for Handshaking {
    fn read(&mut self, _buf: &mut [u8]) -> io::Result<usize> {
        match self.never {}
    }
}

impl Write for Handshaking {
    fn write(&mut self, _buf: &[u8]) -> io::Result<usize> {
        match self.never {}
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.never {}
    }
}

/// Refuses every `wss://` URL: this build has no TLS.
pub(super) struct Connector {
    never: Infallible,
}

impl Connector {
    pub(super) fn new(_roots: &TlsRoots) -> Result<Self, ClientError> {
        Err(ClientError::MissingFeature(MissingFeature { setting: "wss://", feature: "tls" }))
    }

    pub(super) fn connect(&self, _host: &str) -> Result<Connection, ClientError> {
        match self.never {}
    }
}

/// Whether `e` carries a TLS failure: never in this build.
pub(super) fn is_tls(_e: &io::Error) -> bool {
    false
}

/// A socket error as the client reports it.
pub(super) fn tls_or_io(e: io::Error) -> ClientError {
    e.into()
}
