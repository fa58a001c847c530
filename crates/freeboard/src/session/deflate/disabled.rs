//! What stands in for the compressor and decompressor in a build without the `deflate`
//! feature: the same names, and a [`Deflate`] that cannot be made. Negotiation still parses
//! offers and responses, but no session ever holds compression state, so the code that
//! handles it compiles and never runs.

use std::convert::Infallible;

use freeboard_buf::{Frame, Pool};
use freeboard_proto::{Connection, Instant, Payload};

use super::super::{Reassembler, Reassembly, Received};
use super::{Agreement, NoMemory};

/// A session's compression: never made in this build ([`new`](Self::new) is `None`).
pub(crate) struct Deflate {
    pub(crate) agreement: Agreement,
    never: Infallible,
}

impl Deflate {
    /// `None`: this build cannot compress.
    pub(crate) fn new(
        _pool: &mut Pool<'static>,
        _agreement: Agreement,
        _server: bool,
    ) -> Option<Box<Self>> {
        None
    }

    pub(crate) fn release(&mut self, _pool: &mut Pool<'static>) {
        match self.never {}
    }

    pub(crate) fn compress(
        &mut self,
        _pool: &mut Pool<'static>,
        _codec: &mut Codec,
        _data: &[u8],
    ) -> Option<Vec<u8>> {
        match self.never {}
    }
}

/// An event loop's compression: nothing to hold in this build.
pub(crate) struct Codec;

impl Codec {
    pub(crate) fn new(_threshold: usize) -> Self {
        Self
    }

    pub(crate) fn put_scratch(&mut self, _scratch: Vec<u8>) {}

    /// `Ok(None)`: a publication goes uncompressed (no subscriber agreed to compression).
    pub(crate) fn compress_frame(
        &mut self,
        _pool: &mut Pool<'static>,
        _frame: &Frame,
        _bits: u8,
    ) -> Result<Option<Frame>, NoMemory> {
        Ok(None)
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn receive<'b>(
    _inbound: &mut Reassembler,
    deflate: &mut Deflate,
    _codec: Option<&mut Codec>,
    _pool: &mut Pool<'static>,
    _limits: &Reassembly,
    _room: impl FnOnce(&Pool<'static>) -> usize,
    _now: Instant,
    _ws: &mut Connection,
    _piece: Payload<'b>,
) -> Option<Received<'b>> {
    match deflate.never {}
}
