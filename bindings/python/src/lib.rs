//! freeboard for Python: one freeboard event loop on the asyncio thread.
//!
//! asyncio watches the loop's epoll descriptor (`loop.add_reader(server.fileno(), …)`) and
//! its deadline (`loop.call_at`); each time, Python calls [`NativeServer::turn`], which runs
//! one turn of the [`LocalServer`] and returns what happened as a list of event tuples. The
//! route's handler builds those tuples during the turn, holding the GIL the caller holds:
//! a received message becomes a `bytes` (or `str`) straight from the loop's read buffer,
//! the only copy. Python's calls back (`send`, `close`, `publish`, …) are synchronous calls
//! between turns: the session answers at once, and nothing needs a lock.
//!
//! A server made with a listener (`freeboard.serve_listener`) skips the tuples: the turn's
//! happenings call the listener's callbacks straight from Rust once the turn has returned
//! (see [`listener`]).
//!
//! The client side, [`NativeClient`], is a `ClientLoop` driven the same way.

mod listener;

use std::cell::{Cell, RefCell};
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use freeboard::client::{ClientConfig, ClientHandler, ClientId, ClientLoop, CloseEvent, LoopConn};
use freeboard::{
    Accepted, CloseCode, Conn, ConnId, ConnKey, Decision, Handler, LocalServer, Message,
    MessageKind, PushOutcome, Request, RouteOptions, Router, SendOutcome, Server, ServerConfig,
};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use pyo3::{PyTraverseError, PyVisit};
use slab::Slab;

use crate::listener::{Happened, Happenings, Listener};

/// Event codes, the first item of each event tuple (`freeboard/_events.py` names them).
const OPEN: u8 = 0;
const MESSAGE: u8 = 1;
const DRAIN: u8 = 2;
const CLOSE: u8 = 3;
const UPGRADE: u8 = 4;
const FAILED: u8 = 5;

/// What `send` answers, as a number Python maps to its name.
const QUEUED: u8 = 0;
const ABOVE_HIGH: u8 = 1;
const DROPPED: u8 = 2;
const WOULD_BLOCK: u8 = 3;
const CLOSED: u8 = 4;

/// The events of a turn, in order, as Python tuples.
type Events = Rc<RefCell<Vec<Py<PyAny>>>>;

fn outcome(sent: Option<SendOutcome>) -> u8 {
    match sent {
        Some(SendOutcome::Queue(PushOutcome::Queued)) => QUEUED,
        Some(SendOutcome::Queue(PushOutcome::QueuedAboveHigh)) => ABOVE_HIGH,
        Some(SendOutcome::Queue(PushOutcome::Dropped { .. })) => DROPPED,
        Some(SendOutcome::Queue(PushOutcome::WouldBlock { .. })) => WOULD_BLOCK,
        Some(SendOutcome::Queue(PushOutcome::MustClose { .. }) | SendOutcome::Closed) | None => {
            CLOSED
        }
    }
}

/// A received message as Python gets it: `str` for text (validated UTF-8 already), `bytes`
/// for binary.
fn message_object<'py>(py: Python<'py>, kind: MessageKind, data: &[u8]) -> Bound<'py, PyAny> {
    match kind {
        // NOTE: the core validated the text; the lossy path is never taken.
        MessageKind::Text => match std::str::from_utf8(data) {
            Ok(text) => PyString::new(py, text).into_any(),
            Err(_) => PyString::new(py, &String::from_utf8_lossy(data)).into_any(),
        },
        MessageKind::Binary => PyBytes::new(py, data).into_any(),
    }
}

fn push(events: &Events, event: Bound<'_, PyTuple>) {
    events.borrow_mut().push(event.into_any().unbind());
}

/// An upgrade request copied out of the read buffer: path, `(host, port)`, headers.
struct RequestHead {
    path: String,
    peer: std::net::SocketAddr,
    headers: Vec<(String, String)>,
}

impl RequestHead {
    fn new(request: &Request<'_, '_>, peer: std::net::SocketAddr) -> Self {
        let headers = request
            .headers()
            .iter()
            .map(|h| (h.name.to_owned(), String::from_utf8_lossy(h.value).into_owned()))
            .collect();
        Self { path: request.path().to_owned(), peer, headers }
    }

    /// Path, `(host, port)`, and the headers as one string of names and values each followed
    /// by `\n` (which no header holds): Python splits it at first use, so an idle
    /// connection keeps one string rather than a list of tuples.
    fn into_py(self) -> (String, (String, u16), String) {
        let mut headers = String::new();
        for (name, value) in &self.headers {
            headers.push_str(name);
            headers.push('\n');
            headers.push_str(value);
            headers.push('\n');
        }
        (self.path, (self.peer.ip().to_string(), self.peer.port()), headers)
    }
}

/// How long past the handshake timeout an undecided upgrade is kept. The loop answers it 503
/// at the timeout (as any Rust `Decision`); dropping the `Decision` refuses with 500, which
/// the loop ignores once it has timed out. The margin makes sure it has, whatever the timer's
/// granularity: the client always gets the 503.
const LET_GO_AFTER: Duration = Duration::from_secs(1);

/// The route's handler: every callback becomes an event tuple of the turn, or with a
/// listener a [`Happened`] for its callbacks.
struct Bridge {
    events: Events,
    /// A listener's happenings: open, message, drain and close go there.
    happened: Option<Happenings>,
    decisions: Rc<RefCell<Slab<(Decision, Instant)>>>,
    decide_in_py: Rc<Cell<bool>>,
    protocols: &'static [&'static str],
    handshake_timeout: Duration,
    /// The head of the request accepted in `decide_upgrade`, for `on_open` right after it.
    accepted: Option<RequestHead>,
}

impl Handler for Bridge {
    fn decide_upgrade(&mut self, request: &Request<'_, '_>, decision: Decision) {
        let head = RequestHead::new(request, decision.peer());
        if self.decide_in_py.get() {
            let deadline = Instant::now() + self.handshake_timeout + LET_GO_AFTER;
            let id = self.decisions.borrow_mut().insert((decision, deadline));
            Python::attach(|py| {
                let (path, peer, headers) = head.into_py();
                if let Ok(event) = (UPGRADE, id, path, peer, headers).into_pyobject(py) {
                    push(&self.events, event);
                }
            });
            return;
        }
        let accepted = match request.select_protocol(self.protocols) {
            Some(protocol) => Accepted::new().protocol(protocol),
            None if self.protocols.is_empty() || request.protocols().next().is_none() => {
                Accepted::new()
            }
            None => return decision.reject(400),
        };
        self.accepted = Some(head);
        decision.accept(accepted);
    }

    fn on_open(&mut self, conn: &mut Conn<'_>) {
        let head = match conn.data_mut::<Option<RequestHead>>() {
            Some(later) => later.take(),
            None => self.accepted.take(),
        };
        let head = head.unwrap_or_else(|| RequestHead {
            path: conn.target().to_owned(),
            peer: conn.peer(),
            headers: Vec::new(),
        });
        let key = conn.key();
        if let Some(happened) = &self.happened {
            happened.borrow_mut().push(Happened::Open { key, head });
            return;
        }
        Python::attach(|py| {
            let (path, peer, headers) = head.into_py();
            let event = (OPEN, key.slot, key.serial, path, peer, headers).into_pyobject(py);
            if let Ok(event) = event {
                push(&self.events, event);
            }
        });
    }

    fn on_message(&mut self, conn: &mut Conn<'_>, message: Message<'_>) {
        let serial = conn.id().serial;
        Python::attach(|py| {
            let data = message_object(py, message.kind, message.data);
            if let Some(happened) = &self.happened {
                let key = conn.key();
                happened.borrow_mut().push(Happened::Message { key, data: data.unbind() });
                return;
            }
            if let Ok(event) = (MESSAGE, serial, data).into_pyobject(py) {
                push(&self.events, event);
            }
        });
    }

    fn on_writable(&mut self, conn: &mut Conn<'_>) {
        if let Some(happened) = &self.happened {
            happened.borrow_mut().push(Happened::Drain { key: conn.key() });
            return;
        }
        let serial = conn.id().serial;
        Python::attach(|py| {
            if let Ok(event) = (DRAIN, serial).into_pyobject(py) {
                push(&self.events, event);
            }
        });
    }

    fn on_close(&mut self, id: ConnId, code: CloseCode, reason: &str) {
        if let Some(happened) = &self.happened {
            let (serial, code, reason) = (id.serial, code.0, reason.to_owned());
            happened.borrow_mut().push(Happened::Close { serial, code, reason });
            return;
        }
        Python::attach(|py| {
            if let Ok(event) = (CLOSE, id.serial, code.0, reason).into_pyobject(py) {
                push(&self.events, event);
            }
        });
    }
}

/// A freeboard server on the asyncio thread (the native half of `freeboard.Server`).
#[pyclass(unsendable, module = "freeboard._native")]
pub struct NativeServer {
    /// `None` once it has stopped and released everything.
    server: Option<LocalServer>,
    fd: i32,
    host: String,
    port: u16,
    events: Events,
    decisions: Rc<RefCell<Slab<(Decision, Instant)>>>,
    decide_in_py: Rc<Cell<bool>>,
    protocols: &'static [&'static str],
    /// The callbacks, for a server made with a listener.
    listener: Option<Rc<Listener>>,
}

#[pymethods]
impl NativeServer {
    /// Binds a server from `config` (JSON with the keys of `freeboard serve`'s TOML file),
    /// serving upgrades on `path` (every path when empty) and speaking `protocols`. With a
    /// `listener`, its callbacks get the connections' happenings, `on_error(name,
    /// exception)` a callback's exception and `want_flush()` is called when a call between
    /// turns queued something.
    #[new]
    #[pyo3(signature = (config, path, protocols, listener = None, on_error = None, want_flush = None))]
    fn new(
        config: &str,
        path: &str,
        protocols: Vec<String>,
        listener: Option<&Bound<'_, PyAny>>,
        on_error: Option<Py<PyAny>>,
        want_flush: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let config: ServerConfig = serde_json::from_str(config)
            .map_err(|e| PyValueError::new_err(format!("invalid setting: {e}")))?;
        let listener = match (listener, on_error, want_flush) {
            (None, _, _) => None,
            (Some(listener), Some(on_error), Some(want_flush)) => {
                Some(Rc::new(Listener::new(listener, on_error, want_flush)?))
            }
            _ => return Err(PyValueError::new_err("a listener needs on_error and want_flush")),
        };
        // Leaked once per server (a few bytes): `Accepted::protocol` takes a `&'static str`.
        let protocols: &'static [&'static str] =
            Box::leak(protocols.into_iter().map(|p| &*Box::leak(p.into_boxed_str())).collect());
        let events = Events::default();
        let decisions = Rc::new(RefCell::new(Slab::new()));
        let decide_in_py = Rc::new(Cell::new(false));
        let bridge = Bridge {
            events: events.clone(),
            happened: listener.as_ref().map(|l| l.happened.clone()),
            decisions: decisions.clone(),
            decide_in_py: decide_in_py.clone(),
            protocols,
            handshake_timeout: config.limits.handshake_timeout,
            accepted: None,
        };
        let router = match path {
            "" => Router::new().route_with("/", bridge, RouteOptions::new().prefix()),
            path => Router::new().route(path, bridge),
        };
        let server =
            Server::bind_local(config, router).map_err(|e| PyOSError::new_err(e.to_string()))?;
        let addr = server.local_addr();
        Ok(Self {
            fd: server.as_raw_fd(),
            host: addr.ip().to_string(),
            port: addr.port(),
            server: Some(server),
            events,
            decisions,
            decide_in_py,
            protocols,
            listener,
        })
    }

    /// The loop's epoll descriptor: readable when a turn has work.
    fn fileno(&self) -> i32 {
        self.fd
    }

    /// The address it listens on.
    #[getter]
    fn host(&self) -> &str {
        &self.host
    }

    /// The port it listens on.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Runs one turn without waiting; the events it produced, or `None` once the server has
    /// stopped (then everything is released). With a listener, its callbacks run first and
    /// the events are the upgrade requests only.
    fn turn<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyList>>> {
        let py = slf.py();
        let (running, listener) = {
            let mut this = slf.borrow_mut();
            let Some(server) = &mut this.server else { return Ok(None) };
            let running = server.turn(Some(Duration::ZERO));
            let now = Instant::now();
            this.decisions.borrow_mut().retain(|_, (_, deadline)| *deadline > now);
            if !matches!(running, Ok(true)) {
                this.server = None; // the events are the last; the next turn answers None
            }
            (running, this.listener.clone())
        };
        if let Some(listener) = listener {
            listener.flushing();
            let dispatched = listener.dispatch(slf).map(drop);
            if !matches!(running, Ok(true)) {
                listener.close_remaining(slf)?;
            }
            dispatched?;
        }
        let events = slf.borrow().take_events(py)?;
        match running {
            Ok(_) => Ok(Some(events)),
            Err(e) => Err(PyOSError::new_err(format!("freeboard event loop failed: {e}"))),
        }
    }

    /// Seconds until the loop needs a turn even without readiness; `None` when nothing is
    /// due.
    fn timeout(&self) -> Option<f64> {
        self.server.as_ref()?.timeout().map(|t| t.as_secs_f64())
    }

    /// Whether the server has stopped.
    #[getter]
    fn stopped(&self) -> bool {
        self.server.is_none()
    }

    /// Writes what Python queued since the last turn; the events that caused (with a
    /// listener: its callbacks run, and the events are upgrade requests only).
    fn flush<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        // With a listener, what a flush causes (a close, a drain) calls back, and what those
        // callbacks queue is written too: a few rounds, then at the asyncio loop's next
        // pass.
        let mut unwritten = None;
        for _ in 0..4 {
            let listener = {
                let mut this = slf.borrow_mut();
                if let Some(server) = &mut this.server {
                    server.flush();
                }
                this.listener.clone()
            };
            let Some(listener) = listener else { break };
            listener.flushing();
            unwritten = None;
            if !listener.dispatch(slf)? {
                break;
            }
            unwritten = Some(listener);
        }
        if let Some(listener) = unwritten {
            listener.queued(slf.py())?;
        }
        slf.borrow().take_events(slf.py())
    }

    /// Whether Python decides upgrades (a `process_request` hook is set).
    fn decide_upgrades(&self, yes: bool) {
        self.decide_in_py.set(yes);
    }

    /// Completes upgrade decision `id`: 101 accepts (with subprotocol number `protocol`, or
    /// none when negative), else refuses with `status`. `False` if it has gone.
    fn decide(&self, id: usize, status: u16, protocol: i64) -> bool {
        let Some((decision, _)) = self.decisions.borrow_mut().try_remove(id) else {
            return false;
        };
        if status == 101 {
            let mut accepted = Accepted::new().data(None::<RequestHead>);
            if let Some(p) = usize::try_from(protocol).ok().and_then(|i| self.protocols.get(i)) {
                accepted = accepted.protocol(p);
            }
            decision.accept(accepted);
        } else {
            decision.reject(status);
        }
        true
    }

    /// Sends `data` (bytes: binary; str: text) to `(slot, serial)`; what the session did.
    fn send(&mut self, slot: usize, serial: u64, data: &Bound<'_, PyAny>) -> PyResult<u8> {
        let key = ConnKey { slot, serial };
        let Some(server) = &mut self.server else { return Ok(CLOSED) };
        if let Ok(text) = data.cast::<PyString>() {
            let text = text.to_str()?;
            return Ok(outcome(
                server.with_conn(key, |c| c.send(MessageKind::Text, text.as_bytes())),
            ));
        }
        let bytes = as_bytes(data)?;
        Ok(outcome(server.with_conn(key, |c| c.send(MessageKind::Binary, bytes))))
    }

    /// Starts the close handshake; `False` if closed or closing already, `ValueError` for a
    /// code no endpoint may send.
    fn close(&mut self, slot: usize, serial: u64, code: u16, reason: &str) -> PyResult<bool> {
        let code = sendable(code)?;
        let Some(server) = &mut self.server else { return Ok(false) };
        Ok(server.with_conn(ConnKey { slot, serial }, |c| c.close(code, reason)).is_some())
    }

    /// Stops (`held`) or resumes reading `(slot, serial)`; `False` if it has closed.
    fn hold_input(&mut self, slot: usize, serial: u64, held: bool) -> bool {
        let Some(server) = &mut self.server else { return false };
        server.hold_input(ConnKey { slot, serial }, held)
    }

    /// Unsent bytes of `(slot, serial)`; -1 once closed.
    fn buffered_amount(&mut self, slot: usize, serial: u64) -> i64 {
        let Some(server) = &mut self.server else { return -1 };
        server.with_conn(ConnKey { slot, serial }, |c| c.buffered_amount() as i64).unwrap_or(-1)
    }

    /// 1 subscribed, 0 already was, -1 closed; `MemoryError` when the topic tables' budget
    /// is spent, `ValueError` for another refusal (the name, the topic limits).
    fn subscribe(&mut self, slot: usize, serial: u64, topic: &str) -> PyResult<i8> {
        let Some(server) = &mut self.server else { return Ok(-1) };
        match server.with_conn(ConnKey { slot, serial }, |c| c.subscribe(topic)) {
            None => Ok(-1),
            Some(Ok(true)) => Ok(1),
            Some(Ok(false)) => Ok(0),
            Some(Err(refused)) => Err(listener::subscribe_refused(refused)),
        }
    }

    /// Sends `(slot, serial)` what it missed on `topic` after the offset `since` (the
    /// topic's history); `False` if the history no longer holds all of it.
    fn recover(&mut self, slot: usize, serial: u64, topic: &str, since: &str) -> bool {
        let Some(server) = &mut self.server else { return false };
        server.with_conn(ConnKey { slot, serial }, |c| c.recover(topic, since)).unwrap_or(false)
    }

    /// Whether it was subscribed.
    fn unsubscribe(&mut self, slot: usize, serial: u64, topic: &str) -> bool {
        let Some(server) = &mut self.server else { return false };
        server.with_conn(ConnKey { slot, serial }, |c| c.unsubscribe(topic)).unwrap_or(false)
    }

    /// Publishes to `topic`: `(delivered, dropped)` by this server's subscribers.
    fn publish(&mut self, topic: &str, data: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
        let Some(server) = &mut self.server else {
            return Err(PyRuntimeError::new_err("freeboard: the server is closed"));
        };
        let (_, reach) = if let Ok(text) = data.cast::<PyString>() {
            server.publish(topic, MessageKind::Text, text.to_str()?.as_bytes())
        } else {
            server.publish(topic, MessageKind::Binary, as_bytes(data)?)
        };
        Ok((reach.delivered, reach.dropped))
    }

    /// Starts the graceful shutdown (1001 to every connection, then drain).
    fn shutdown(&self) {
        if let Some(server) = &self.server {
            server.shutdown();
        }
    }

    /// The server's metrics, as OpenMetrics text.
    fn metrics(&self) -> PyResult<String> {
        match &self.server {
            Some(server) => Ok(server.metrics().encode()),
            None => Err(PyRuntimeError::new_err("freeboard: the server is closed")),
        }
    }

    /// The listener's callbacks and Python's hooks, for the cycle collector: the hooks are
    /// bound methods of the Python server, which holds this one.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        match &self.listener {
            Some(listener) => listener.traverse(&visit),
            None => Ok(()),
        }
    }

    fn __clear__(&mut self) {
        self.listener = None;
    }
}

impl NativeServer {
    fn take_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = std::mem::take(&mut *self.events.borrow_mut());
        PyList::new(py, events)
    }
}

/// `code` if an endpoint may send it in a close frame, else `ValueError`. RFC 6455 §7.4.1:
/// 1005 and 1006 "MUST NOT be set as a status code in a Close control frame by an endpoint".
pub(crate) fn sendable(code: u16) -> PyResult<CloseCode> {
    match CloseCode(code) {
        code if code.is_sendable() => Ok(code),
        code => Err(PyValueError::new_err(format!(
            "freeboard: close code {code} cannot be sent (1000-1003, 1007-1014 or 3000-4999)"
        ))),
    }
}

/// The bytes of a `bytes`, `bytearray` or `memoryview` (contiguous).
fn as_bytes<'a>(data: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    if let Ok(bytes) = data.cast::<PyBytes>() {
        return Ok(bytes.as_bytes());
    }
    Err(pyo3::exceptions::PyTypeError::new_err("data must be str or bytes"))
}

/// The client's handler: events as tuples, like the server's.
struct ClientBridge {
    events: Events,
}

impl ClientHandler for ClientBridge {
    fn on_open(&mut self, conn: &mut LoopConn<'_>) {
        let (id, protocol) = (conn.id().0, conn.protocol().map(str::to_owned));
        Python::attach(|py| {
            if let Ok(event) = (OPEN, id, protocol).into_pyobject(py) {
                push(&self.events, event);
            }
        });
    }

    fn on_message(&mut self, conn: &mut LoopConn<'_>, kind: MessageKind, data: &[u8]) {
        let id = conn.id().0;
        Python::attach(|py| {
            let data = message_object(py, kind, data);
            if let Ok(event) = (MESSAGE, id, data).into_pyobject(py) {
                push(&self.events, event);
            }
        });
    }

    fn on_writable(&mut self, conn: &mut LoopConn<'_>) {
        let id = conn.id().0;
        Python::attach(|py| {
            if let Ok(event) = (DRAIN, id).into_pyobject(py) {
                push(&self.events, event);
            }
        });
    }

    fn on_close(&mut self, id: ClientId, close: CloseEvent) {
        Python::attach(|py| {
            let (code, reason) = (close.code.0, close.reason.clone());
            if let Ok(event) = (CLOSE, id.0, code, reason).into_pyobject(py) {
                push(&self.events, event);
            }
        });
    }

    fn on_error(&mut self, id: ClientId, error: freeboard::client::ClientError) {
        Python::attach(|py| {
            if let Ok(event) = (FAILED, id.0, error.to_string()).into_pyobject(py) {
                push(&self.events, event);
            }
        });
    }
}

/// Client connections on the asyncio thread (the native half of `freeboard.connect`): one
/// `ClientLoop` per asyncio loop, turned like the server's.
#[pyclass(unsendable, module = "freeboard._native")]
pub struct NativeClient {
    clients: ClientLoop<ClientBridge>,
    events: Events,
}

#[pymethods]
impl NativeClient {
    /// A client loop with the memory budget `memory` bytes and the limits of `config` (JSON:
    /// `max_message_size`, `send_high`, … as for the server).
    #[new]
    fn new(config: &str) -> PyResult<Self> {
        let settings: ServerConfig = serde_json::from_str(config)
            .map_err(|e| PyValueError::new_err(format!("invalid setting: {e}")))?;
        let mut client = ClientConfig::default();
        client.memory = settings.memory;
        client.limits = settings.limits;
        let events = Events::default();
        let clients = ClientLoop::new(client, ClientBridge { events: events.clone() })
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        Ok(Self { clients, events })
    }

    /// The loop's epoll descriptor.
    fn fileno(&self) -> i32 {
        self.clients.as_raw_fd()
    }

    /// Starts a connection to `url`; its id. Name resolution blocks: Python resolves a name
    /// itself (asynchronously) and calls [`connect_to`](Self::connect_to).
    fn connect(&mut self, url: &str) -> PyResult<usize> {
        self.clients.connect(url).map(|id| id.0).map_err(|e| PyOSError::new_err(e.to_string()))
    }

    /// Starts a connection to `url` at `host` (an IP address its name resolved to) and
    /// `port`; its id. Nothing waits for name resolution.
    fn connect_to(&mut self, url: &str, host: &str, port: u16) -> PyResult<usize> {
        let ip: std::net::IpAddr = host
            .parse()
            .map_err(|_| PyValueError::new_err(format!("not an IP address: {host:?}")))?;
        let addr = std::net::SocketAddr::new(ip, port);
        self.clients
            .connect_to(url, addr, &[])
            .map(|id| id.0)
            .map_err(|e| PyOSError::new_err(e.to_string()))
    }

    /// Runs one turn without waiting; its events.
    fn turn<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.clients.turn(Some(Duration::ZERO)).map_err(|e| PyOSError::new_err(e.to_string()))?;
        let events = std::mem::take(&mut *self.events.borrow_mut());
        PyList::new(py, events)
    }

    /// Seconds until the loop needs a turn even without readiness.
    fn timeout(&self) -> Option<f64> {
        self.clients.timeout().map(|t| t.as_secs_f64())
    }

    /// Writes what was queued since the last turn; the events that caused (a drain to the
    /// low watermark, a close whose output has left).
    fn flush<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.clients.flush_all();
        let events = std::mem::take(&mut *self.events.borrow_mut());
        PyList::new(py, events)
    }

    /// Sends on connection `id`; what its session did.
    fn send(&mut self, id: usize, data: &Bound<'_, PyAny>) -> PyResult<u8> {
        let Some(mut conn) = self.clients.conn(ClientId(id)) else { return Ok(CLOSED) };
        let sent = if let Ok(text) = data.cast::<PyString>() {
            conn.send(MessageKind::Text, text.to_str()?.as_bytes())
        } else {
            conn.send(MessageKind::Binary, as_bytes(data)?)
        };
        Ok(outcome(sent.ok()))
    }

    /// Starts the close handshake of connection `id`; `ValueError` for a code no endpoint
    /// may send.
    fn close(&mut self, id: usize, code: u16, reason: &str) -> PyResult<bool> {
        let code = sendable(code)?;
        Ok(match self.clients.conn(ClientId(id)) {
            Some(mut conn) => conn.close(code, reason).is_ok(),
            None => false,
        })
    }

    /// Unsent bytes of connection `id`; -1 once closed.
    fn buffered_amount(&mut self, id: usize) -> i64 {
        self.clients.conn(ClientId(id)).map_or(-1, |c| c.buffered_amount() as i64)
    }

    /// Connections opening or open.
    fn __len__(&self) -> usize {
        self.clients.len()
    }
}

/// The extension module.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<NativeServer>()?;
    module.add_class::<NativeClient>()?;
    module.add_class::<listener::Conn>()?;
    module.add_class::<listener::Request>()?;
    Ok(())
}
