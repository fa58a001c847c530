//! freeboard for Node.js: one freeboard event loop on the JavaScript thread, turned by
//! libuv.
//!
//! The loop's epoll descriptor is watched by a `uv_poll_t` and its deadlines by a
//! `uv_timer_t`. When either fires, [`Core::drive`] runs one turn of the
//! [`LocalServer`]: accepts, reads, parses, and writes what the turn queued. The route's
//! handler ([`bridge::Bridge`]) records what happened in the turn's batch, which crosses
//! into JavaScript once, in one `napi_make_callback` (so promises and `process.nextTick`s
//! run after it, as after any I/O callback). JavaScript's calls back (`send`, `close`,
//! `publish`, …) are plain synchronous calls between turns: the session answers at once,
//! and nothing needs a lock, since everything runs on one thread.
//!
//! Connections: JavaScript names one by `(slot, serial)` (a `WebSocket` keeps both) or by its
//! serial alone, its id (the id mode, where no JavaScript value exists per connection): the
//! slot argument [`BY_ID`] makes the core look the slot up in the bridge's
//! [`SlotTable`]. The engine checks the serial of the slot either way, so a stale id or key
//! reaches nothing. The bridge records only the events JavaScript listens to
//! ([`NativeServer::listen_to`]), so an idle connection of the id mode costs no crossing.
//!
//! Copies: a received payload is copied once, from the loop's read buffer into the turn's
//! batch (the read buffer is reused by the next read of the same turn), and the batch
//! becomes one `Buffer` without a copy (an external buffer over the batch's memory, which
//! JavaScript then owns); each message is a `subarray` of it. A sent payload is copied once,
//! from the `Buffer` into pool chunks (or the cork), as any send is.

mod bridge;
mod uv;

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::os::fd::AsRawFd;
use std::ptr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use freeboard::topics::SubscribeError;
use freeboard::{
    CloseCode, ConnKey, LocalServer, MessageKind, PushOutcome, RouteOptions, Router, SendOutcome,
    Server, ServerConfig,
};
use napi::bindgen_prelude::*;
use napi::sys;
use napi_derive::napi;

use bridge::{Batch, Bridge, Decisions, SlotTable, interest};
use uv::Handle;

/// What `send` answers, as a number JavaScript maps to its name (`lib/index.js`).
const QUEUED: u32 = 0;
const ABOVE_HIGH: u32 = 1;
const DROPPED: u32 = 2;
const WOULD_BLOCK: u32 = 3;
const CLOSED: u32 = 4;

/// The slot argument that says "look the slot up by the serial": a connection JavaScript
/// names by its id alone (`server.send(id, …)`).
const BY_ID: u32 = u32::MAX;

/// A freeboard server on the JavaScript thread (the native half of `Server` in
/// `lib/index.js`).
#[napi]
pub struct NativeServer {
    core: Rc<Core>,
}

/// Everything the JavaScript object and the libuv handles share.
struct Core {
    env: sys::napi_env,
    /// `None` once the server has stopped and released everything.
    server: RefCell<Option<LocalServer>>,
    batch: Rc<RefCell<Batch>>,
    decisions: Rc<RefCell<Decisions>>,
    decide_in_js: Rc<Cell<bool>>,
    interest: Rc<Cell<u32>>,
    slots: Rc<RefCell<SlotTable>>,
    protocols: &'static [&'static str],
    /// The JavaScript function that takes a batch: `(numbers, payload, strings)`.
    on_events: Cell<sys::napi_ref>,
    async_context: Cell<sys::napi_async_context>,
    poll: RefCell<Option<Handle>>,
    timer: RefCell<Option<Handle>>,
    /// Scratch for text: a JavaScript string is encoded into it, then sent from it.
    text: RefCell<Vec<u8>>,
    local_port: u16,
    local_address: String,
}

#[napi]
impl NativeServer {
    /// Binds a server from `config` (JSON with the keys of `freeboard serve`'s TOML file),
    /// serving WebSocket upgrades on `path` (every path when empty), speaking `protocols`,
    /// and hands each turn's events to `on_events`.
    #[napi(constructor)]
    pub fn new(
        env: Env,
        config: String,
        path: String,
        protocols: Vec<String>,
        on_events: Function,
    ) -> Result<Self> {
        let config: ServerConfig =
            napi_try(serde_json::from_str(&config).map_err(|e| format!("invalid options: {e}")))?;
        // Leaked once per server (a few bytes): `Accepted::protocol` takes a `&'static str`.
        let protocols: &'static [&'static str] =
            Box::leak(protocols.into_iter().map(|p| &*Box::leak(p.into_boxed_str())).collect());
        let batch = Rc::new(RefCell::new(Batch::default()));
        let decisions = Rc::new(RefCell::new(Decisions::default()));
        let decide_in_js = Rc::new(Cell::new(false));
        let interest = Rc::new(Cell::new(interest::ALL));
        let slots = Rc::new(RefCell::new(SlotTable::default()));
        let bridge = Bridge {
            batch: batch.clone(),
            decisions: decisions.clone(),
            decide_in_js: decide_in_js.clone(),
            protocols,
            handshake_timeout: config.limits.handshake_timeout,
            accepted: None,
            interest: interest.clone(),
            slots: slots.clone(),
        };
        let router = match path.as_str() {
            "" => Router::new().route_with("/", bridge, RouteOptions::new().prefix()),
            path => Router::new().route(path, bridge),
        };
        let server = napi_try(Server::bind_local(config, router).map_err(|e| e.to_string()))?;
        let raw_env = env.raw();
        let mut on_events_ref = ptr::null_mut();
        let mut async_context = ptr::null_mut();
        // SAFETY: valid env and values of this call; the reference and the async context
        // are deleted in `Core::release`.
        unsafe {
            check(sys::napi_create_reference(raw_env, on_events.raw(), 1, &mut on_events_ref))?;
            let mut name = ptr::null_mut();
            let label = c"freeboard";
            check(sys::napi_create_string_utf8(raw_env, label.as_ptr(), 9, &mut name))?;
            check(sys::napi_async_init(raw_env, ptr::null_mut(), name, &mut async_context))?;
        }
        let addr = server.local_addr();
        let fd = server.as_raw_fd();
        let core = Rc::new(Core {
            env: raw_env,
            server: RefCell::new(Some(server)),
            batch,
            decisions,
            decide_in_js,
            interest,
            slots,
            protocols,
            on_events: Cell::new(on_events_ref),
            async_context: Cell::new(async_context),
            poll: RefCell::new(None),
            timer: RefCell::new(None),
            text: RefCell::new(Vec::new()),
            local_port: addr.port(),
            local_address: addr.ip().to_string(),
        });
        let event_loop = env.get_uv_event_loop()?.cast::<c_void>();
        // The handles hold one strong count of the core until they are closed.
        let data = Rc::into_raw(core.clone()).cast::<c_void>();
        // SAFETY: Node's loop on this thread; `data` lives until `release` closes them.
        unsafe {
            let poll = Handle::poll(event_loop, fd, data, on_readable)
                .map_err(|status| Error::from_reason(format!("uv_poll_init failed: {status}")))?;
            *core.poll.borrow_mut() = Some(poll);
            let timer = Handle::timer(event_loop, data)
                .map_err(|status| Error::from_reason(format!("uv_timer_init failed: {status}")))?;
            *core.timer.borrow_mut() = Some(timer);
        }
        core.arm_timer();
        Ok(Self { core })
    }

    /// The port the server listens on.
    #[napi(getter)]
    pub fn port(&self) -> u32 {
        u32::from(self.core.local_port)
    }

    /// The address the server listens on.
    #[napi(getter)]
    pub fn address(&self) -> String {
        self.core.local_address.clone()
    }

    /// Whether JavaScript decides upgrades (an `'upgrade'` listener is set).
    #[napi]
    pub fn decide_upgrades(&self, yes: bool) {
        self.core.decide_in_js.set(yes);
    }

    /// Records only the events of `mask` (bits: 1 opens, 2 their request heads, 4 messages,
    /// 8 drains, 16 closes); the rest cost JavaScript nothing. Every event by default.
    #[napi]
    pub fn listen_to(&self, mask: u32) {
        self.core.interest.set(mask & interest::ALL);
    }

    /// The slot and peer of the open connection `(slot, serial)` (the slot `BY_ID`: looked
    /// up by the serial), or `None` once it has closed.
    #[napi]
    pub fn peer(&self, slot: u32, serial: f64) -> Option<Peer> {
        let key = self.core.key(slot, serial)?;
        let peer = self.core.server.borrow_mut().as_mut()?.with_conn(key, |conn| conn.peer())?;
        Some(Peer { slot: key.slot as u32, address: peer.ip().to_string(), port: peer.port() })
    }

    /// Completes upgrade decision `id`: status 101 accepts (with subprotocol number
    /// `protocol` of the server's list, or none when negative), else refuses with `status`.
    #[napi]
    pub fn decide(&self, id: u32, status: u32, protocol: i32) -> bool {
        let protocol = usize::try_from(protocol).ok().and_then(|i| self.core.protocols.get(i));
        let status = u16::try_from(status).unwrap_or(500);
        self.core.decisions.borrow_mut().decide(id as usize, status, protocol.copied())
    }

    /// Sends `data` (binary, or text when `binary` is false: the bytes must be UTF-8) to the
    /// connection `(slot, serial)`; what the session decided.
    #[napi]
    pub fn send(&self, slot: u32, serial: f64, data: &[u8], binary: bool) -> u32 {
        let kind = if binary { MessageKind::Binary } else { MessageKind::Text };
        self.core.send(slot, serial, kind, data)
    }

    /// Sends the string `text` as a text message.
    #[napi]
    pub fn send_text(&self, env: Env, slot: u32, serial: f64, text: Unknown<'_>) -> Result<u32> {
        let mut scratch = self.core.text.borrow_mut();
        utf8_into(env.raw(), text.raw(), &mut scratch)?;
        Ok(self.core.send(slot, serial, MessageKind::Text, &scratch))
    }

    /// Starts the close handshake of `(slot, serial)` with `code` and `reason`: 1 started, 0
    /// closed or closing already, -1 a code no endpoint may send (RFC 6455 §7.4.1: 1005 and
    /// 1006 "MUST NOT be set as a status code in a Close control frame by an endpoint").
    #[napi]
    pub fn close(&self, slot: u32, serial: f64, code: u32, reason: String) -> i32 {
        let code = match u16::try_from(code).map(CloseCode) {
            Ok(code) if code.is_sendable() => code,
            _ => return -1,
        };
        i32::from(self.core.with_conn(slot, serial, |conn| conn.close(code, &reason)).is_some())
    }

    /// Stops (`held`) or resumes reading `(slot, serial)` (`ws.pause()`, `ws.resume()`);
    /// `false` if it has closed.
    #[napi]
    pub fn hold_input(&self, slot: u32, serial: f64, held: bool) -> bool {
        let Some(key) = self.core.key(slot, serial) else { return false };
        let held = match self.core.server.borrow_mut().as_mut() {
            Some(server) => server.hold_input(key, held),
            None => false,
        };
        self.core.arm_timer(); // a resumed connection is read at the next turn
        held
    }

    /// Unsent bytes of `(slot, serial)`, or -1 when it has closed.
    #[napi]
    pub fn buffered_amount(&self, slot: u32, serial: f64) -> f64 {
        self.core.with_conn(slot, serial, |conn| conn.buffered_amount() as f64).unwrap_or(-1.0)
    }

    /// Subscribes `(slot, serial)` to `topic`: 1 subscribed, 0 already was, -1 closed, -2 no
    /// memory for the subscription (the budget for topic tables is spent), -3 an invalid
    /// name, -4 the connection's topic limit, -5 the server's.
    #[napi]
    pub fn subscribe(&self, slot: u32, serial: f64, topic: String) -> i32 {
        let subscribed = self.core.with_conn(slot, serial, |conn| conn.subscribe(&topic));
        match subscribed {
            None => -1,
            Some(Ok(true)) => 1,
            Some(Ok(false)) => 0,
            Some(Err(SubscribeError::NoMemory)) => -2,
            Some(Err(SubscribeError::InvalidName)) => -3,
            Some(Err(SubscribeError::TooManyTopics)) => -4,
            Some(Err(_)) => -5,
        }
    }

    /// Sends `(slot, serial)` what it missed on `topic` after the offset `since` (the topic's
    /// history); `false` if the history no longer holds all of it (close with 4410 then).
    #[napi]
    pub fn recover(&self, slot: u32, serial: f64, topic: String, since: String) -> bool {
        self.core.with_conn(slot, serial, |conn| conn.recover(&topic, &since)).unwrap_or(false)
    }

    /// Unsubscribes `(slot, serial)` from `topic`; whether it was subscribed.
    #[napi]
    pub fn unsubscribe(&self, slot: u32, serial: f64, topic: String) -> bool {
        self.core.with_conn(slot, serial, |conn| conn.unsubscribe(&topic)).unwrap_or(false)
    }

    /// Publishes `data` to `topic` (framed once, queued by reference to every subscriber):
    /// `[delivered, dropped]` by this server's subscribers.
    #[napi]
    pub fn publish(&self, topic: String, data: &[u8], binary: bool) -> Vec<f64> {
        let kind = if binary { MessageKind::Binary } else { MessageKind::Text };
        self.core.publish(&topic, kind, data)
    }

    /// [`publish`](Self::publish) of a string, as text.
    #[napi]
    pub fn publish_text(&self, env: Env, topic: String, text: Unknown<'_>) -> Result<Vec<f64>> {
        let mut scratch = std::mem::take(&mut *self.core.text.borrow_mut());
        utf8_into(env.raw(), text.raw(), &mut scratch)?;
        let reach = self.core.publish(&topic, MessageKind::Text, &scratch);
        *self.core.text.borrow_mut() = scratch;
        Ok(reach)
    }

    /// Writes what JavaScript queued since the last turn (one `writev` per connection), then
    /// hands over the events that caused, if any.
    #[napi]
    pub fn flush(&self) -> Result<()> {
        self.core.flush();
        self.core.dispatch(false)?;
        self.core.arm_timer();
        Ok(())
    }

    /// Starts the graceful shutdown: no more accepts, close 1001 to every connection, stop
    /// once they are closed or the drain timeout passed (the last batch says so).
    #[napi]
    pub fn shutdown(&self) {
        if let Some(server) = &*self.core.server.borrow() {
            server.shutdown();
        }
    }

    /// The server's metrics, as OpenMetrics text.
    #[napi]
    pub fn metrics(&self) -> String {
        match &*self.core.server.borrow() {
            Some(server) => server.metrics().encode(),
            None => String::new(),
        }
    }
}

/// Where an open connection is (`server.connection(id)` makes its `WebSocket` from it).
#[napi(object)]
pub struct Peer {
    /// Its slot on the loop.
    pub slot: u32,
    /// The client's address.
    pub address: String,
    /// The client's port.
    pub port: u16,
}

impl Core {
    fn send(&self, slot: u32, serial: f64, kind: MessageKind, data: &[u8]) -> u32 {
        match self.with_conn(slot, serial, |conn| conn.send(kind, data)) {
            Some(SendOutcome::Queue(PushOutcome::Queued)) => QUEUED,
            Some(SendOutcome::Queue(PushOutcome::QueuedAboveHigh)) => ABOVE_HIGH,
            Some(SendOutcome::Queue(PushOutcome::Dropped { .. })) => DROPPED,
            Some(SendOutcome::Queue(PushOutcome::WouldBlock { .. })) => WOULD_BLOCK,
            Some(SendOutcome::Queue(PushOutcome::MustClose { .. })) => CLOSED,
            Some(SendOutcome::Closed) | None => CLOSED,
        }
    }

    /// The key of `(slot, serial)`; with the slot [`BY_ID`], the open connection whose
    /// serial is `serial`. A stale id finds nothing (its serial is gone from the table), and
    /// a stale key finds nothing either (the engine checks the serial of the slot).
    fn key(&self, slot: u32, serial: f64) -> Option<ConnKey> {
        if slot == BY_ID {
            self.slots.borrow().key(serial as u64)
        } else {
            Some(ConnKey { slot: slot as usize, serial: serial as u64 })
        }
    }

    fn with_conn<R>(
        &self,
        slot: u32,
        serial: f64,
        f: impl FnOnce(&mut freeboard::Conn<'_>) -> R,
    ) -> Option<R> {
        let key = self.key(slot, serial)?;
        self.server.borrow_mut().as_mut()?.with_conn(key, f)
    }

    fn publish(&self, topic: &str, kind: MessageKind, data: &[u8]) -> Vec<f64> {
        match self.server.borrow_mut().as_mut() {
            Some(server) => {
                let (_, reach) = server.publish(topic, kind, data);
                vec![reach.delivered as f64, reach.dropped as f64]
            }
            None => vec![0.0, 0.0],
        }
    }

    fn flush(&self) {
        if let Some(server) = self.server.borrow_mut().as_mut() {
            server.flush();
        }
    }

    /// One turn, from libuv: the loop's work, then its events into JavaScript in a callback
    /// scope, then what JavaScript sent out (and what that caused back in, a few rounds).
    fn drive(&self) {
        let mut scope = ptr::null_mut();
        // SAFETY: called on the JavaScript thread from a libuv callback, with no scope open.
        unsafe { sys::napi_open_handle_scope(self.env, &mut scope) };
        let turned = match self.server.borrow_mut().as_mut() {
            Some(server) => server.turn(Some(Duration::ZERO)),
            None => Ok(false),
        };
        self.decisions.borrow_mut().sweep(Instant::now());
        for _ in 0..4 {
            match self.dispatch(true) {
                Ok(true) => self.flush(),
                _ => break,
            }
        }
        match turned {
            Ok(true) => self.arm_timer(),
            Ok(false) => self.release(),
            Err(e) => {
                self.fatal(&format!("freeboard event loop failed: {e}"));
                self.release();
            }
        }
        // SAFETY: the scope opened above.
        unsafe { sys::napi_close_handle_scope(self.env, scope) };
    }

    /// Hands the pending batch to JavaScript; whether there was one. From libuv
    /// (`from_loop`) it goes through `napi_make_callback`, so that the microtasks it queues
    /// run right after; from JavaScript, it is an ordinary call.
    fn dispatch(&self, from_loop: bool) -> Result<bool> {
        let on_events = self.on_events.get();
        if self.batch.borrow().is_empty() || on_events.is_null() {
            return Ok(false);
        }
        let batch = std::mem::take(&mut *self.batch.borrow_mut());
        let env = self.env;
        // SAFETY: on the JavaScript thread inside a handle scope; the values made here live
        // in it, the payload's memory is handed to JavaScript with its finalizer.
        unsafe {
            let numbers = Float64Array::new(batch.numbers);
            let numbers = Float64Array::to_napi_value(env, numbers)?;
            let payload = Buffer::to_napi_value(env, Buffer::from(batch.payload))?;
            let strings = Vec::<String>::to_napi_value(env, batch.strings)?;
            let args = [numbers, payload, strings];
            let mut function = ptr::null_mut();
            check(sys::napi_get_reference_value(env, on_events, &mut function))?;
            let mut this = ptr::null_mut();
            check(sys::napi_get_global(env, &mut this))?;
            let mut result = ptr::null_mut();
            let status = if from_loop {
                sys::napi_make_callback(
                    env,
                    self.async_context.get(),
                    this,
                    function,
                    args.len(),
                    args.as_ptr(),
                    &mut result,
                )
            } else {
                sys::napi_call_function(env, this, function, args.len(), args.as_ptr(), &mut result)
            };
            if status == sys::Status::napi_pending_exception && from_loop {
                // The dispatcher catches what handlers throw: this is a fault of its own.
                let mut error = ptr::null_mut();
                sys::napi_get_and_clear_last_exception(env, &mut error);
                sys::napi_fatal_exception(env, error);
            } else if status != sys::Status::napi_ok && !from_loop {
                return Err(Error::new(Status::from(status), "event dispatch failed"));
            }
        }
        Ok(true)
    }

    /// Arms the timer for the loop's next deadline (or stops it when none is due).
    fn arm_timer(&self) {
        let timeout = self.server.borrow().as_ref().and_then(LocalServer::timeout);
        if let Some(timer) = &*self.timer.borrow() {
            match timeout {
                Some(after) => {
                    timer.start_timer(after.as_millis().min(1 << 40) as u64, on_deadline)
                }
                None => timer.stop_timer(),
            }
        }
    }

    /// The server has stopped: closes the handles (releasing their count of the core), tells
    /// JavaScript (an empty batch ends the stream), and lets go of the callback.
    fn release(&self) {
        self.server.borrow_mut().take();
        let handles = [self.poll.borrow_mut().take(), self.timer.borrow_mut().take()];
        let had_handles = handles.iter().any(Option::is_some);
        for handle in handles.into_iter().flatten() {
            handle.close();
        }
        // The last batch: JavaScript learns that the server has stopped.
        self.batch.borrow_mut().numbers.push(-1.0);
        let _ = self.dispatch(true);
        let env = self.env;
        // SAFETY: the reference and async context made in the constructor, deleted once.
        unsafe {
            let on_events = self.on_events.replace(ptr::null_mut());
            if !on_events.is_null() {
                sys::napi_delete_reference(env, on_events);
            }
            let context = self.async_context.replace(ptr::null_mut());
            if !context.is_null() {
                sys::napi_async_destroy(env, context);
            }
        }
        if had_handles {
            // SAFETY: the count `new` gave the handles, which libuv will call no more.
            unsafe { Rc::decrement_strong_count(self as *const Core) };
        }
    }

    fn fatal(&self, message: &str) {
        let env = self.env;
        // SAFETY: on the JavaScript thread inside a handle scope.
        unsafe {
            let mut text = ptr::null_mut();
            sys::napi_create_string_utf8(
                env,
                message.as_ptr().cast(),
                message.len() as isize,
                &mut text,
            );
            let mut error = ptr::null_mut();
            sys::napi_create_error(env, ptr::null_mut(), text, &mut error);
            sys::napi_fatal_exception(env, error);
        }
    }
}

/// libuv: the loop's descriptor is readable.
unsafe extern "C" fn on_readable(handle: *mut c_void, _status: i32, _events: i32) {
    // SAFETY: our poll handle, whose data is the core it holds a count of.
    unsafe { drive_from(handle) }
}

/// libuv: the loop's deadline has come.
unsafe extern "C" fn on_deadline(handle: *mut c_void) {
    // SAFETY: our timer handle, whose data is the core.
    unsafe { drive_from(handle) }
}

/// # Safety
/// `handle` is one of a core's handles, still open.
unsafe fn drive_from(handle: *mut c_void) {
    // SAFETY: the handle's data is a core the handles hold a count of; take one more for
    // this call, since the turn may release the handles' own.
    let core = unsafe {
        let core = Handle::data_of(handle).cast::<Core>();
        Rc::increment_strong_count(core);
        Rc::from_raw(core)
    };
    core.drive();
}

/// Encodes the JavaScript string `value` as UTF-8 into `out` (replacing its contents).
fn utf8_into(env: sys::napi_env, value: sys::napi_value, out: &mut Vec<u8>) -> Result<()> {
    let mut len = 0;
    // SAFETY: valid env and value; the first call only measures, the second writes at most
    // `len + 1` bytes (the NUL) into a buffer of that size.
    unsafe {
        check(sys::napi_get_value_string_utf8(env, value, ptr::null_mut(), 0, &mut len))?;
        out.clear();
        out.reserve(len + 1);
        let mut written = 0;
        check(sys::napi_get_value_string_utf8(
            env,
            value,
            out.as_mut_ptr().cast(),
            len + 1,
            &mut written,
        ))?;
        out.set_len(written);
    }
    Ok(())
}

fn check(status: sys::napi_status) -> Result<()> {
    match status {
        sys::Status::napi_ok => Ok(()),
        status => Err(Error::new(Status::from(status), "N-API call failed")),
    }
}

fn napi_try<T>(result: std::result::Result<T, String>) -> Result<T> {
    result.map_err(Error::from_reason)
}
