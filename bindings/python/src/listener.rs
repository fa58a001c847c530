//! The listener model: one Python object's callbacks (`on_open`, `on_message`, `on_drain`,
//! `on_close`) for every connection of a server, with no task, coroutine or Python object
//! per connection.
//!
//! During a turn the route's handler records what happened ([`Happened`]); once the turn
//! has returned (the server is no longer borrowed), [`Listener::dispatch`] calls the
//! callbacks, each with a [`Conn`] made for that call: a key into the engine's connection
//! table, two words beside the server's reference. The application keeps it if it wants
//! to (it is hashable and compares equal to every other `Conn` of the same connection);
//! the engine keeps nothing Python for a connection but its serial number in [`Listener`]'s
//! set of open connections, so that each `on_open` has its `on_close`, even for the
//! connections a shutdown's drain left behind.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;

use freeboard::history::HISTORY_GONE;
use freeboard::topics::SubscribeError;
use freeboard::{CloseCode, ConnKey, MessageKind};
use pyo3::exceptions::{PyException, PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};
use pyo3::{PyTraverseError, PyVisit, intern};

use crate::{NativeServer, RequestHead, as_bytes};

/// What a turn did to a connection, in order, for the listener's callbacks.
pub(crate) enum Happened {
    Open { key: ConnKey, head: RequestHead },
    Message { key: ConnKey, data: Py<PyAny> },
    Drain { key: ConnKey },
    Close { serial: u64, code: u16, reason: String },
}

/// The happenings of a turn, shared by the route's handler and the server.
pub(crate) type Happenings = Rc<RefCell<Vec<Happened>>>;

/// The callbacks of a server made with a listener, and what dispatching them needs.
pub(crate) struct Listener {
    on_open: Option<Py<PyAny>>,
    on_message: Option<Py<PyAny>>,
    on_drain: Option<Py<PyAny>>,
    on_close: Option<Py<PyAny>>,
    /// `on_error(callback_name, exception)`: Python logs and counts a callback that raised.
    on_error: Py<PyAny>,
    /// `want_flush()`: Python schedules a flush (a `Conn` call made outside a callback).
    want_flush: Py<PyAny>,
    pub(crate) happened: Happenings,
    /// Serial numbers of the connections whose `on_open` ran and `on_close` not yet.
    open: RefCell<HashSet<u64>>,
    /// Callbacks are running: the turn's end flushes what they queue.
    dispatching: Cell<bool>,
    /// A flush is scheduled already.
    flush_wanted: Cell<bool>,
}

/// The close a connection that the server's stop left open gets in `on_close`.
const STOPPED: (u16, &str) = (1001, "server shutting down");

impl Listener {
    /// The callbacks of `listener` (each optional), with Python's two hooks.
    pub(crate) fn new(
        listener: &Bound<'_, PyAny>,
        on_error: Py<PyAny>,
        want_flush: Py<PyAny>,
    ) -> PyResult<Self> {
        let callback = |name: &str| -> PyResult<Option<Py<PyAny>>> {
            let found = listener.getattr_opt(name)?;
            Ok(found.filter(|f| !f.is_none()).map(Bound::unbind))
        };
        Ok(Self {
            on_open: callback("on_open")?,
            on_message: callback("on_message")?,
            on_drain: callback("on_drain")?,
            on_close: callback("on_close")?,
            on_error,
            want_flush,
            happened: Happenings::default(),
            open: RefCell::default(),
            dispatching: Cell::new(false),
            flush_wanted: Cell::new(false),
        })
    }

    /// The turn (or flush) that will write what was queued has begun.
    pub(crate) fn flushing(&self) {
        self.flush_wanted.set(false);
    }

    /// Calls the callbacks for what the last turn did; whether there was anything (then
    /// the callbacks may have queued sends to flush). The server must not be borrowed:
    /// the callbacks call back into it. An `Exception` from `on_open`, `on_message` or
    /// `on_drain` closes its connection with 1011 (RFC 6455 7.4.1: "1011 indicates that a
    /// server is terminating the connection because it encountered an unexpected condition
    /// that prevented it from fulfilling the request"); every one is handed to `on_error`,
    /// and the other callbacks run. Any other
    /// `BaseException` (`KeyboardInterrupt`, `SystemExit`) is raised once the turn's
    /// callbacks have all run.
    pub(crate) fn dispatch(&self, server: &Bound<'_, NativeServer>) -> PyResult<bool> {
        let py = server.py();
        let happened = std::mem::take(&mut *self.happened.borrow_mut());
        if happened.is_empty() {
            return Ok(false);
        }
        let mut fatal = None;
        self.dispatching.set(true);
        for event in happened {
            let (name, key, called) = match event {
                Happened::Open { key, head } => {
                    self.open.borrow_mut().insert(key.serial);
                    let Some(on_open) = &self.on_open else { continue };
                    let request = Request::from(head);
                    let conn = Conn::new(server, key);
                    ("on_open", key, on_open.call1(py, (conn, request)))
                }
                Happened::Message { key, data } => {
                    let Some(on_message) = &self.on_message else { continue };
                    ("on_message", key, on_message.call1(py, (Conn::new(server, key), data)))
                }
                Happened::Drain { key } => {
                    let Some(on_drain) = &self.on_drain else { continue };
                    ("on_drain", key, on_drain.call1(py, (Conn::new(server, key),)))
                }
                Happened::Close { serial, code, reason } => {
                    if !self.open.borrow_mut().remove(&serial) {
                        continue; // (closed before it opened: no `on_open`, no `on_close`)
                    }
                    let key = gone(serial);
                    let Some(on_close) = &self.on_close else { continue };
                    ("on_close", key, on_close.call1(py, (Conn::new(server, key), code, reason)))
                }
            };
            if let Err(error) = called {
                self.failed(server, name, key, error, &mut fatal);
            }
        }
        self.dispatching.set(false);
        fatal.map_or(Ok(true), Err)
    }

    /// `on_close` for every connection still open when the server stopped (a shutdown's
    /// drain deadline passed before their close handshakes ended), in the order they opened.
    pub(crate) fn close_remaining(&self, server: &Bound<'_, NativeServer>) -> PyResult<()> {
        let mut left: Vec<u64> = self.open.borrow().iter().copied().collect();
        left.sort_unstable();
        let (code, reason) = STOPPED;
        self.happened.borrow_mut().extend(left.into_iter().map(|serial| Happened::Close {
            serial,
            code,
            reason: reason.into(),
        }));
        self.dispatch(server).map(drop)
    }

    fn failed(
        &self,
        server: &Bound<'_, NativeServer>,
        name: &str,
        key: ConnKey,
        error: PyErr,
        fatal: &mut Option<PyErr>,
    ) {
        let py = server.py();
        if name != "on_close"
            && let Ok(mut native) = server.try_borrow_mut()
            && let Some(local) = &mut native.server
        {
            local.with_conn(key, |c| c.close(CloseCode::INTERNAL_ERROR, "handler error"));
        }
        if !error.is_instance_of::<PyException>(py) {
            fatal.get_or_insert(error);
            return;
        }
        if let Err(hook) = self.on_error.call1(py, (name, error.into_value(py))) {
            hook.write_unraisable(py, Some(self.on_error.bind(py)));
        }
    }

    /// After a `Conn` call queued something: outside the callbacks nothing else would write
    /// it, so Python schedules a flush (once until it runs).
    pub(crate) fn queued(&self, py: Python<'_>) -> PyResult<()> {
        if !self.dispatching.get() && !self.flush_wanted.replace(true) {
            self.want_flush.call0(py)?;
        }
        Ok(())
    }

    pub(crate) fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for callback in [&self.on_open, &self.on_message, &self.on_drain, &self.on_close] {
            visit.call(callback)?;
        }
        visit.call(&self.on_error)?;
        visit.call(&self.want_flush)
    }
}

/// The key of a connection that has closed: its slot is no longer its own, and no call
/// finds it.
fn gone(serial: u64) -> ConnKey {
    ConnKey { slot: usize::MAX, serial }
}

/// The exception a refused subscription raises: `MemoryError` when the topic tables' budget
/// is spent (try again later), `ValueError` for the name or a topic limit.
pub(crate) fn subscribe_refused(refused: SubscribeError) -> PyErr {
    match refused {
        SubscribeError::NoMemory => {
            PyMemoryError::new_err("freeboard: the memory budget for topic subscriptions is spent")
        }
        refused => PyValueError::new_err(format!("freeboard: {refused}")),
    }
}

/// One connection of a server made with a listener (`freeboard.Conn`), as the callbacks
/// get it: the server's reference and the connection's key, nothing more. Made for each
/// call; two `Conn`s of one connection are equal and hash alike.
#[pyclass(frozen, module = "freeboard._native", name = "Conn")]
pub struct Conn {
    server: Py<NativeServer>,
    /// Invariant: `slot` is `usize::MAX` once the connection has closed.
    key: ConnKey,
}

#[pymethods]
impl Conn {
    /// The connection's serial number on its server, never reused: a key for the
    /// application's tables.
    #[getter]
    fn id(&self) -> u64 {
        self.key.serial
    }

    /// Whether it is open (not closing nor closed).
    #[getter]
    fn open(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.with(py, |_| ())?.is_some())
    }

    /// Sends `data` (str: text; bytes: binary); what the session did: `'queued'`,
    /// `'above-high'` (queued; wait for `on_drain` before sending more), `'dropped'` (the
    /// slow-consumer policy dropped it or older messages, counted), `'blocked'` (the
    /// `block` policy: not queued, no room). Raises `ConnectionClosed` if it is closed or
    /// closing.
    fn send<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyString>> {
        let (kind, bytes) = match data.cast::<PyString>() {
            Ok(text) => (MessageKind::Text, text.to_str()?.as_bytes()),
            Err(_) => (MessageKind::Binary, as_bytes(data)?),
        };
        let sent = self.with(py, |c| c.send(kind, bytes))?;
        let outcome = match crate::outcome(sent) {
            crate::QUEUED => intern!(py, "queued"),
            crate::ABOVE_HIGH => intern!(py, "above-high"),
            crate::DROPPED => intern!(py, "dropped"),
            crate::WOULD_BLOCK => intern!(py, "blocked"),
            _ => return Err(self.closed(py)),
        };
        Ok(outcome.clone())
    }

    /// Starts the close handshake with `code` and `reason`; `False` if it is closing or
    /// closed already.
    #[pyo3(signature = (code = 1000, reason = ""))]
    fn close(&self, py: Python<'_>, code: u16, reason: &str) -> PyResult<bool> {
        let code = crate::sendable(code)?;
        Ok(self.with(py, |c| c.close(code, reason))?.is_some())
    }

    /// Unsent bytes in its queue; 0 once closed.
    #[getter]
    fn buffered_amount(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.with(py, |c| c.buffered_amount())?.unwrap_or(0))
    }

    /// `(host, port)` of the peer. Raises `ConnectionClosed` once closed.
    #[getter]
    fn remote_address(&self, py: Python<'_>) -> PyResult<(String, u16)> {
        match self.with(py, |c| c.peer())? {
            Some(peer) => Ok((peer.ip().to_string(), peer.port())),
            None => Err(self.closed(py)),
        }
    }

    /// Subscribes to `topic` (the server's `publish` reaches it, framed once for all);
    /// `True` if newly subscribed. With `since`, what the topic's history holds after that
    /// offset is sent first; if it no longer holds all of it the connection is closed 4410
    /// and `False` returned. Raises `ConnectionClosed` once closed, `MemoryError` when the
    /// topic tables' budget is spent.
    #[pyo3(signature = (topic, since = None))]
    fn subscribe(&self, py: Python<'_>, topic: &str, since: Option<&str>) -> PyResult<bool> {
        let done = self.with(py, |c| {
            let new = c.subscribe(topic)?;
            let recovered = since.is_none_or(|since| c.recover(topic, since));
            if !recovered {
                c.close(HISTORY_GONE, "history gone");
            }
            Ok(new && recovered)
        })?;
        match done {
            None => Err(self.closed(py)),
            Some(Ok(answer)) => Ok(answer),
            Some(Err(refused)) => Err(subscribe_refused(refused)),
        }
    }

    /// Unsubscribes from `topic`; whether it was subscribed.
    fn unsubscribe(&self, py: Python<'_>, topic: &str) -> PyResult<bool> {
        Ok(self.with(py, |c| c.unsubscribe(topic))?.unwrap_or(false))
    }

    /// Stops reading it: its peer meets TCP's flow control (messages of a read already made
    /// still arrive). `False` if it has closed.
    fn pause_reading(&self, py: Python<'_>) -> PyResult<bool> {
        self.hold(py, true)
    }

    /// Reads it again (at the next turn). `False` if it has closed.
    fn resume_reading(&self, py: Python<'_>) -> PyResult<bool> {
        self.hold(py, false)
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.key.serial == other.key.serial && self.server.is(&other.server)
    }

    fn __hash__(&self) -> u64 {
        self.key.serial
    }

    fn __repr__(&self) -> String {
        format!("<freeboard.Conn {}>", self.key.serial)
    }
}

impl Conn {
    fn new(server: &Bound<'_, NativeServer>, key: ConnKey) -> Self {
        Self { server: server.clone().unbind(), key }
    }

    /// Runs `f` on the open connection; `None` once it is closing or closed.
    fn with<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut freeboard::Conn<'_>) -> R,
    ) -> PyResult<Option<R>> {
        let server = self.server.bind(py);
        let Ok(mut native) = server.try_borrow_mut() else {
            return Err(PyRuntimeError::new_err("freeboard: the server is busy (a turn runs)"));
        };
        let Some(local) = &mut native.server else { return Ok(None) };
        let Some(result) = local.with_conn(self.key, f) else { return Ok(None) };
        let listener = native.listener.clone();
        drop(native);
        if let Some(listener) = listener {
            listener.queued(py)?;
        }
        Ok(Some(result))
    }

    fn hold(&self, py: Python<'_>, held: bool) -> PyResult<bool> {
        let server = self.server.bind(py);
        let held = {
            let mut native = server.borrow_mut();
            let Some(local) = &mut native.server else { return Ok(false) };
            if !local.hold_input(self.key, held) {
                return Ok(false);
            }
            native.listener.clone()
        };
        if let Some(listener) = held {
            listener.queued(py)?; // a resumed connection is read at the next turn
        }
        Ok(true)
    }

    /// `freeboard.ConnectionClosed` for a call on a connection that is closing or closed:
    /// its close code went to `on_close`.
    fn closed(&self, py: Python<'_>) -> PyErr {
        static CONNECTION_CLOSED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
        let reason =
            format!("Conn {} is closing or closed (on_close has its code)", self.key.serial);
        match CONNECTION_CLOSED.import(py, "freeboard", "ConnectionClosed") {
            Ok(class) => match class.call1((py.None(), reason)) {
                Ok(error) => PyErr::from_value(error),
                Err(error) => error,
            },
            Err(error) => error,
        }
    }
}

/// The upgrade request of a connection (`freeboard.Request`), given to `on_open`.
#[pyclass(frozen, module = "freeboard._native", name = "Request")]
pub struct Request {
    /// The request target (path and query).
    #[pyo3(get)]
    path: String,
    /// `(host, port)` of the client.
    #[pyo3(get)]
    remote_address: (String, u16),
    /// The headers as `(name, value)` pairs, in order.
    #[pyo3(get)]
    headers: Vec<(String, String)>,
}

#[pymethods]
impl Request {
    fn __repr__(&self) -> String {
        format!("<freeboard.Request {}>", self.path)
    }
}

impl From<RequestHead> for Request {
    fn from(head: RequestHead) -> Self {
        Self {
            path: head.path,
            remote_address: (head.peer.ip().to_string(), head.peer.port()),
            headers: head.headers,
        }
    }
}
