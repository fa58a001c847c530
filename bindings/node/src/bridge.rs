//! The handler a Node server's loop calls: it does no work of its own, it writes what
//! happened into the turn's [`Batch`], which crosses into JavaScript once per turn.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use freeboard::Request;
use freeboard::{
    Accepted, CloseCode, Conn, ConnId, ConnKey, Decision, Handler, Message, MessageKind,
};
use rustc_hash::FxHashMap;
use slab::Slab;

/// Event codes, the first number of each event in [`Batch::numbers`] (`lib/index.js` reads
/// the same layout).
pub(crate) const OPEN: f64 = 0.0;
pub(crate) const MESSAGE: f64 = 1.0;
pub(crate) const DRAIN: f64 = 2.0;
pub(crate) const CLOSE: f64 = 3.0;
pub(crate) const UPGRADE: f64 = 4.0;
/// An open without its request (`OPEN_ID serial`): nobody asked for the head.
pub(crate) const OPEN_ID: f64 = 5.0;

/// Which events JavaScript wants recorded (bits of [`Bridge::interest`]); a connection
/// nobody listens to costs no JavaScript work at all.
pub(crate) mod interest {
    /// Opens (`OPEN_ID`, or `OPEN` with the head when [`HEAD`] is set too).
    pub(crate) const OPEN: u32 = 1;
    /// The upgrade request's head with each open.
    pub(crate) const HEAD: u32 = 2;
    pub(crate) const MESSAGE: u32 = 4;
    pub(crate) const DRAIN: u32 = 8;
    pub(crate) const CLOSE: u32 = 16;
    /// Everything: the ws-like mode, with a `WebSocket` per connection.
    pub(crate) const ALL: u32 = OPEN | HEAD | MESSAGE | DRAIN | CLOSE;
}

/// What happened during a turn, in order, as JavaScript reads it: numbers (event code, then
/// its fields), the payloads of the turn's messages back to back, and the few strings
/// (request heads, close reasons).
///
/// - `OPEN_ID serial`
/// - `OPEN slot serial port` + strings `url address headers`, the headers one string of
///   names (lower case) and values, each followed by `\n` (JavaScript parses it only if the
///   application reads `request.headers`: an idle connection keeps one string, not an object)
/// - `MESSAGE serial binary offset length` (the payload at `offset` in `payload`)
/// - `DRAIN serial`
/// - `CLOSE serial code` + string `reason`
/// - `UPGRADE decision port` + strings as `OPEN`'s
#[derive(Default)]
pub(crate) struct Batch {
    pub(crate) numbers: Vec<f64>,
    pub(crate) payload: Vec<u8>,
    pub(crate) strings: Vec<String>,
}

impl Batch {
    pub(crate) fn is_empty(&self) -> bool {
        self.numbers.is_empty()
    }

    fn head(&mut self, head: RequestHead) {
        self.numbers.push(f64::from(head.port));
        self.strings.extend([head.url, head.address, head.headers]);
    }
}

/// An upgrade request copied out of the loop's read buffer, for the `'upgrade'` and
/// `'connection'` events.
pub(crate) struct RequestHead {
    url: String,
    address: String,
    port: u16,
    /// Names (lower case) and values, each followed by `\n` (which no header holds).
    headers: String,
}

impl RequestHead {
    fn new(request: &Request<'_, '_>, peer: std::net::SocketAddr) -> Self {
        let mut headers = String::new();
        for header in request.headers() {
            headers.extend(header.name.chars().map(|c| c.to_ascii_lowercase()));
            headers.push('\n');
            headers.push_str(&String::from_utf8_lossy(header.value));
            headers.push('\n');
        }
        Self {
            url: request.path().to_owned(),
            address: peer.ip().to_string(),
            port: peer.port(),
            headers,
        }
    }
}

/// The slot of every open connection, by serial: JavaScript names a connection by its serial
/// alone (its id, never reused on the loop), and the engine reaches it by `(slot, serial)`.
/// One entry per open connection (16 bytes and a control byte, at most twice over while the
/// table is sparse); no JavaScript value is kept per connection.
#[derive(Default)]
pub(crate) struct SlotTable {
    /// Serials are numbers the loop hands out, not input a peer chooses: FxHash (one
    /// multiplication) needs no protection against collisions chosen by an attacker.
    slots: FxHashMap<u64, u32>,
}

impl SlotTable {
    /// The key of open connection `serial`, if it is open.
    pub(crate) fn key(&self, serial: u64) -> Option<ConnKey> {
        self.slots.get(&serial).map(|&slot| ConnKey { slot: slot as usize, serial })
    }

    fn insert(&mut self, key: ConnKey) {
        // NOTE: a loop's slots are bounded by its connections, far below u32::MAX.
        self.slots.insert(key.serial, key.slot as u32);
    }

    fn remove(&mut self, serial: u64) {
        self.slots.remove(&serial);
        // Give the memory of a storm back once it has gone (amortised: a table only shrinks
        // to twice its length after falling under a quarter of its capacity).
        let capacity = self.slots.capacity();
        if capacity > 64 && self.slots.len() < capacity / 4 {
            self.slots.shrink_to(self.slots.len() * 2);
        }
    }
}

/// Upgrade decisions JavaScript holds, by the number its `'upgrade'` event carries; each is
/// let go of (dropped) if JavaScript has not completed it [`LET_GO_AFTER`] past the handshake
/// timeout.
#[derive(Default)]
pub(crate) struct Decisions {
    waiting: Slab<(Decision, Instant)>,
}

impl Decisions {
    /// Completes decision `id`: 101 accepts (with the subprotocol `protocol`, an index into
    /// the server's list), anything else refuses with that status. `false` if it has gone.
    pub(crate) fn decide(
        &mut self,
        id: usize,
        status: u16,
        protocol: Option<&'static str>,
    ) -> bool {
        let Some((decision, _)) = self.waiting.try_remove(id) else { return false };
        if status == 101 {
            let accepted = Accepted::new().data(None::<RequestHead>);
            let accepted = match protocol {
                Some(protocol) => accepted.protocol(protocol),
                None => accepted,
            };
            decision.accept(accepted);
        } else {
            decision.reject(status);
        }
        true
    }

    /// Drops the decisions whose handshake timeout has passed.
    pub(crate) fn sweep(&mut self, now: Instant) {
        if !self.waiting.is_empty() {
            self.waiting.retain(|_, (_, deadline)| *deadline > now);
        }
    }
}

/// How long past the handshake timeout an undecided upgrade is kept. The loop answers it 503
/// at the timeout (as any Rust `Decision`); dropping the `Decision` refuses with 500, which
/// the loop ignores once it has timed out. The margin makes sure it has, whatever the timer's
/// granularity: the client always gets the 503.
const LET_GO_AFTER: Duration = Duration::from_secs(1);

/// The route's handler: every callback becomes an event of the turn's batch.
pub(crate) struct Bridge {
    pub(crate) batch: Rc<RefCell<Batch>>,
    pub(crate) decisions: Rc<RefCell<Decisions>>,
    /// JavaScript listens for `'upgrade'`: it decides, later.
    pub(crate) decide_in_js: Rc<Cell<bool>>,
    /// The subprotocols the server speaks, in order of preference.
    pub(crate) protocols: &'static [&'static str],
    pub(crate) handshake_timeout: Duration,
    /// The head of the request accepted in `decide_upgrade`, for `on_open` right after it.
    pub(crate) accepted: Option<RequestHead>,
    /// The events JavaScript listens to ([`interest`] bits).
    pub(crate) interest: Rc<Cell<u32>>,
    /// Every open connection's slot, by serial.
    pub(crate) slots: Rc<RefCell<SlotTable>>,
}

impl Bridge {
    fn wants(&self, bits: u32) -> bool {
        self.interest.get() & bits == bits
    }
}

impl Handler for Bridge {
    fn decide_upgrade(&mut self, request: &Request<'_, '_>, decision: Decision) {
        if self.decide_in_js.get() {
            let head = RequestHead::new(request, decision.peer());
            let deadline = Instant::now() + self.handshake_timeout + LET_GO_AFTER;
            let id = self.decisions.borrow_mut().waiting.insert((decision, deadline));
            let mut batch = self.batch.borrow_mut();
            batch.numbers.extend([UPGRADE, id as f64]);
            batch.head(head);
            return;
        }
        let accepted = match request.select_protocol(self.protocols) {
            Some(protocol) => Accepted::new().protocol(protocol),
            None if self.protocols.is_empty() || request.protocols().next().is_none() => {
                Accepted::new()
            }
            // ws's default: a client that offers only protocols we do not speak is refused.
            None => return decision.reject(400),
        };
        // Accepted now: the loop opens the connection as soon as this returns. The head is
        // copied out only if JavaScript will read it.
        if self.wants(interest::OPEN | interest::HEAD) {
            self.accepted = Some(RequestHead::new(request, decision.peer()));
        }
        decision.accept(accepted);
    }

    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let head = match conn.data_mut::<Option<RequestHead>>() {
            Some(later) => later.take(),
            None => self.accepted.take(),
        };
        let key = conn.key();
        self.slots.borrow_mut().insert(key);
        if !self.wants(interest::OPEN) {
            return;
        }
        let mut batch = self.batch.borrow_mut();
        if !self.wants(interest::HEAD) {
            batch.numbers.extend([OPEN_ID, key.serial as f64]);
            return;
        }
        batch.numbers.extend([OPEN, key.slot as f64, key.serial as f64]);
        match head {
            Some(head) => batch.head(head),
            None => {
                batch.numbers.push(f64::from(conn.peer().port()));
                let (url, address) = (conn.target().to_owned(), conn.peer().ip().to_string());
                batch.strings.extend([url, address, String::new()]);
            }
        }
    }

    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        if !self.wants(interest::MESSAGE) {
            return;
        }
        let mut batch = self.batch.borrow_mut();
        let offset = batch.payload.len();
        batch.payload.extend_from_slice(message.data);
        let binary = matches!(message.kind, MessageKind::Binary);
        batch.numbers.extend([
            MESSAGE,
            conn.id().serial as f64,
            f64::from(u8::from(binary)),
            offset as f64,
            message.data.len() as f64,
        ]);
    }

    fn on_writable(&mut self, conn: &mut Conn<'_>) {
        if !self.wants(interest::DRAIN) {
            return;
        }
        self.batch.borrow_mut().numbers.extend([DRAIN, conn.id().serial as f64]);
    }

    fn on_close(&mut self, id: ConnId, code: CloseCode, reason: &str) {
        self.slots.borrow_mut().remove(id.serial);
        if !self.wants(interest::CLOSE) {
            return;
        }
        let mut batch = self.batch.borrow_mut();
        batch.numbers.extend([CLOSE, id.serial as f64, f64::from(code.0)]);
        batch.strings.push(reason.to_owned());
    }
}
