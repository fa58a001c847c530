//! What stands in for TLS in a build without the `tls` feature: the names the server's loop
//! uses, none of which can be made, so the code that handles a TLS connection compiles and
//! never runs. A server configured with `tls` is refused at bind, naming the feature.

use std::convert::Infallible;
use std::fmt;
use std::io::{self, IoSlice};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use freeboard_buf::Budget;
use mio::net::TcpStream;

use super::{HandshakeAdmission, Io};
use crate::MissingFeature;
use crate::session::Session;

/// Why TLS could not be set up: nothing can fail in a build without TLS.
#[derive(Debug)]
pub enum TlsError {}

impl fmt::Display for TlsError {
    fn fmt(&self, _: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {}
    }
}

impl std::error::Error for TlsError {}

/// The server's certificate and key: none in this build.
#[derive(Debug)]
pub(crate) struct TlsIdentity {
    never: Infallible,
}

impl TlsIdentity {
    /// Refuses: this build has no TLS.
    pub(crate) fn load(_cert: &Path, _key: &Path) -> Result<Self, MissingFeature> {
        Err(MissingFeature { setting: "tls", feature: "tls" })
    }

    pub(crate) fn reload(&self) -> Result<(), TlsError> {
        match self.never {}
    }
}

/// The configuration TLS connections are accepted with: none in this build.
#[derive(Clone)]
pub(crate) struct ServerTls {
    never: Infallible,
}

pub(crate) fn server_config(
    identity: Arc<TlsIdentity>,
    _http2: bool,
) -> Result<ServerTls, TlsError> {
    match identity.never {}
}

/// The loop's TLS buffers: none in this build.
pub(crate) struct TlsScratch;

impl TlsScratch {
    pub(crate) const BYTES: usize = 0;

    pub(crate) fn new(_state_budget: Budget, _handshakes: Arc<HandshakeAdmission>) -> Self {
        Self
    }

    pub(crate) fn none() -> Self {
        Self
    }
}

/// A server-side TLS connection: none in this build.
#[derive(Debug)]
pub(crate) struct TlsStream {
    never: Infallible,
}

impl TlsStream {
    pub(crate) fn accept(
        _tcp: TcpStream,
        config: &ServerTls,
        _io: &mut Io<'_>,
        _client: Option<IpAddr>,
    ) -> Option<Self> {
        match config.never {}
    }

    pub(crate) fn tcp(&mut self) -> &mut TcpStream {
        match self.never {}
    }

    pub(crate) fn established(&self) -> bool {
        match self.never {}
    }

    pub(crate) fn more_input(&self) -> bool {
        match self.never {}
    }

    pub(crate) fn read(&mut self, _io: &mut Io<'_>, _buf: &mut [u8]) -> io::Result<usize> {
        match self.never {}
    }

    pub(crate) fn write_pending(&mut self, _io: &mut Io<'_>) -> io::Result<bool> {
        match self.never {}
    }

    pub(crate) fn write_queue(
        &mut self,
        _session: &mut Session,
        _io: &mut Io<'_>,
    ) -> io::Result<(usize, bool)> {
        match self.never {}
    }

    pub(crate) fn write_vectored(
        &mut self,
        _io: &mut Io<'_>,
        _bufs: &[IoSlice<'_>],
    ) -> io::Result<usize> {
        match self.never {}
    }

    pub(crate) fn shutdown_write(&mut self, _io: &mut Io<'_>) -> io::Result<()> {
        match self.never {}
    }

    pub(crate) fn release(&mut self, _io: &mut Io<'_>) {
        match self.never {}
    }
}
