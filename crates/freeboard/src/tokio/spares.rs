//! What a worker thread keeps for the connections it drives next: read buffers, corks, the
//! buffers of received payloads and the boxes of woken protocol states. Kept per thread, as
//! the event loop keeps its one read buffer for all its connections, so a connection takes
//! and gives them back without a lock; idle connections still hold none of them.
//!
//! Each function borrows the thread's spares for its own length only and calls nothing
//! outside this module meanwhile, so no borrow can overlap another.

use std::cell::RefCell;

use freeboard_proto::Config;

use crate::parking::ParkingLot;
use crate::session::Cork;

/// Read buffers (and corks) a thread keeps: a turn that reads takes one and gives it back
/// when the read is parsed; the others cover connections whose messages wait for their
/// application. Bounded per thread (8 × 64 KiB of each by default), so a runtime's spares
/// grow with its workers, not with its connections.
const SPARE_READ_BUFFERS: usize = 8;
/// Payload buffers a thread keeps for the next received messages: a message sent back (an
/// echo, a forward) gives its buffer back, so a steady stream allocates nothing.
const SPARE_PAYLOADS: usize = 16;
/// The largest payload buffer kept (what a thread's spares may hold is bounded:
/// `SPARE_PAYLOADS` × this).
const SPARE_PAYLOAD_BYTES: usize = 16 << 10;

/// One thread's spares; each list is bounded (the `SPARE_*` constants).
struct Spares {
    reads: Vec<Box<[u8]>>,
    // Boxed as a connection holds them (a cork is over a KiB inline): lending one moves a
    // pointer, never allocates.
    #[allow(clippy::vec_box)]
    corks: Vec<Box<Cork>>,
    payloads: Vec<Vec<u8>>,
    /// Boxes for woken protocol states, made at the thread's first wake; `None` while a
    /// call has it out.
    lot: Option<ParkingLot>,
}

thread_local! {
    static SPARES: RefCell<Spares> = const {
        RefCell::new(Spares { reads: Vec::new(), corks: Vec::new(), payloads: Vec::new(), lot: None })
    };
}

/// Runs `f` on the thread's spares; `None` while the thread exits (its spares are gone).
fn with<T>(f: impl FnOnce(&mut Spares) -> T) -> Option<T> {
    SPARES.try_with(|spares| f(&mut spares.borrow_mut())).ok()
}

/// A read buffer of `size` bytes.
pub(super) fn read_buffer(size: usize) -> Box<[u8]> {
    with(|spares| {
        // Buffers of another endpoint's size are not kept.
        while let Some(bytes) = spares.reads.pop() {
            if bytes.len() == size {
                return Some(bytes);
            }
        }
        None
    })
    .flatten()
    .unwrap_or_else(|| vec![0u8; size].into_boxed_slice())
}

/// Keeps a read buffer no connection holds any more.
pub(super) fn keep_read_buffer(bytes: Box<[u8]>) {
    with(|spares| {
        if spares.reads.len() < SPARE_READ_BUFFERS {
            spares.reads.push(bytes);
        }
    });
}

/// An empty cork of `size` bytes.
pub(super) fn cork(size: usize) -> Box<Cork> {
    with(|spares| {
        while let Some(cork) = spares.corks.pop() {
            if cork.capacity() == size {
                return Some(cork);
            }
        }
        None
    })
    .flatten()
    .unwrap_or_else(|| Box::new(Cork::new(size)))
}

/// Keeps an empty cork.
pub(super) fn keep_cork(cork: Box<Cork>) {
    with(|spares| {
        if spares.corks.len() < SPARE_READ_BUFFERS {
            spares.corks.push(cork);
        }
    });
}

/// An empty buffer for a received payload of `len` bytes: a spare one if any.
pub(super) fn payload(len: usize) -> Vec<u8> {
    let mut payload = with(|spares| spares.payloads.pop()).flatten().unwrap_or_default();
    payload.reserve_exact(len);
    payload
}

/// Keeps a sent message's buffer for a message received later.
pub(super) fn keep_payload(mut payload: Vec<u8>) {
    let size = payload.capacity();
    if size > 0 && size <= SPARE_PAYLOAD_BYTES {
        payload.clear();
        with(|spares| {
            if spares.payloads.len() < SPARE_PAYLOADS {
                spares.payloads.push(payload);
            }
        });
    }
}

/// The thread's boxes for protocol states, resumed with `config`, taken out for one call
/// of the driver (give them back with [`keep_lot`]); a call nested in another on the same
/// thread gets a lot of its own.
pub(super) fn take_lot(config: Config) -> ParkingLot {
    let mut lot =
        with(|spares| spares.lot.take()).flatten().unwrap_or_else(|| ParkingLot::new(config));
    lot.reconfigure(config);
    lot
}

/// Gives the thread its lot back.
pub(super) fn keep_lot(lot: ParkingLot) {
    with(|spares| spares.lot = Some(lot));
}
