"""freeboard for asyncio: bounded WebSockets with a websockets-like API.

The freeboard engine's event loop runs on the asyncio thread: asyncio watches its descriptor
(``loop.add_reader``) and its deadline (``loop.call_at``) and runs one turn of it each time.
A turn's events (opens, messages, drains, closes) come back as one list; every call into the
engine (``send``, ``close``, ``publish``) is synchronous and answers what the session did.

    async def handler(ws):
        async for message in ws:
            await ws.send(message)

    async with freeboard.serve(handler, "127.0.0.1", 8765, memory="64M"):
        await asyncio.Future()

For very many mostly idle connections, :func:`serve_listener` calls one listener's
``on_open``, ``on_message``, ``on_drain`` and ``on_close`` instead: no task, no coroutine and
no Python object per connection beyond what the application keeps.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import ipaddress
import json
import logging
import socket
import urllib.parse
from typing import Any, Awaitable, Callable, Generator, Generic, Optional, TypeVar, Union

from ._native import Conn, NativeClient, NativeServer, Request

__all__ = [
    "serve",
    "serve_listener",
    "connect",
    "Server",
    "ServerConnection",
    "Listener",
    "ListenerServer",
    "Conn",
    "Request",
    "ClientConnection",
    "ConnectionClosed",
    "ConnectionClosedOK",
    "ConnectionClosedError",
    "InvalidHandshake",
    "Reach",
    "OUTCOMES",
]

logger = logging.getLogger("freeboard")

# Event codes of a turn's tuples (src/lib.rs).
_OPEN, _MESSAGE, _DRAIN, _CLOSE, _UPGRADE, _FAILED = range(6)

#: What ``send`` answers, by the native number.
OUTCOMES = ("queued", "above-high", "dropped", "blocked", "closed")

Data = Union[str, bytes]

#: Reach of a publication: subscribers whose queue took it, and those whose policy dropped it.
Reach = collections.namedtuple("Reach", "delivered dropped")

_ALIASES = {
    "max_size": "max_message_size",
    "high_watermark": "send_high",
    "low_watermark": "send_low",
    "max_backpressure": "send_cap",
}


class ConnectionClosed(Exception):
    """The connection is closed: ``code`` and ``reason`` of its close. ``code`` is ``None``
    for a :class:`Conn` used after it closed (its code went to ``on_close``)."""

    def __init__(self, code: Optional[int], reason: str) -> None:
        detail = reason if code is None else f"{code} {reason}"
        super().__init__(f"connection closed: {detail}".rstrip())
        self.code = code
        self.reason = reason


class ConnectionClosedOK(ConnectionClosed):
    """Closed with 1000 (normal) or 1001 (going away)."""


class ConnectionClosedError(ConnectionClosed):
    """Closed with any other code."""


class InvalidHandshake(Exception):
    """The connection could not be opened (refused, unreachable, timed out)."""


def _closed(code: int, reason: str) -> ConnectionClosed:
    kind = ConnectionClosedOK if code in (1000, 1001) else ConnectionClosedError
    return kind(code, reason)


def _settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Keyword settings to freeboard's configuration keys; seconds become durations."""
    out = {}
    for key, value in settings.items():
        name = _ALIASES.get(key, key)
        if value is None:
            if name.endswith("_timeout"):
                out[name] = "0s"  # no timer
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (
            name.endswith("_timeout") or name == "retry_after"
        ):
            value = f"{int(value * 1000)}ms"
        out[name] = value
    return out


class _Connection:
    """What server and client connections share: the message queue, send, close."""

    # Slots, and the queue and futures made at first use: an idle connection holds a few
    # words here, not a dict, a deque (0.6 KiB empty) and futures.
    __slots__ = ("_loop", "_messages", "_receiver", "_drain", "_closed", "_close_event",
                 "_max_queue", "_held")

    def __init__(self, loop: asyncio.AbstractEventLoop, max_queue: int) -> None:
        self._loop = loop
        self._messages: Optional[collections.deque[Data]] = None
        self._receiver: Optional[asyncio.Future[None]] = None
        self._drain: Optional[asyncio.Future[None]] = None
        self._closed: Optional[asyncio.Future[None]] = None
        self._close_event: Optional[tuple[int, str]] = None
        self._max_queue = max_queue
        #: Reading is stopped: ``max_queue`` messages wait for the handler.
        self._held = False

    def _closed_future(self) -> asyncio.Future[None]:
        if self._closed is None:
            self._closed = self._loop.create_future()
            if self._close_event is not None:
                self._closed.set_result(None)
        return self._closed

    # Native calls, per kind of connection.
    def _send_native(self, message: Data) -> int:
        raise NotImplementedError

    def _close_native(self, code: int, reason: str) -> None:
        raise NotImplementedError

    def _after_call(self) -> None:
        raise NotImplementedError

    def _hold_native(self, held: bool) -> None:
        """Stops or resumes reading the connection (clients are never held)."""

    async def recv(self) -> Data:
        """The next message: ``str`` for text, ``bytes`` for binary. Raises
        :class:`ConnectionClosed` once the connection is closed and no message is left."""
        while not self._messages:
            if self._close_event is not None:
                raise _closed(*self._close_event)
            self._receiver = self._loop.create_future()
            try:
                await self._receiver
            finally:
                self._receiver = None
        assert self._messages is not None  # (it holds a message)
        message = self._messages.popleft()
        if self._held and len(self._messages) <= self._max_queue // 4:
            self._held = False
            self._hold_native(False)
        return message

    def __aiter__(self) -> "_Connection":
        return self

    async def __anext__(self) -> Data:
        try:
            return await self.recv()
        except ConnectionClosedOK:
            raise StopAsyncIteration from None

    async def send(self, message: Data) -> str:
        """Sends ``message`` (``str``: text, bytes-like: binary) and returns what the session
        did: ``'queued'``; ``'above-high'`` after waiting for the queue to drain to its low
        watermark (asyncio backpressure); ``'dropped'`` when the slow-consumer policy dropped
        this message or older ones (counted). Under the ``block`` policy a message with no
        room waits for the drain and is sent then. Raises :class:`ConnectionClosed` if the
        connection is closed."""
        if isinstance(message, (bytearray, memoryview)):
            message = bytes(message)
        while True:
            outcome = OUTCOMES[self._send_native(message)]
            self._after_call()
            if outcome == "closed":
                raise _closed(*(self._close_event or (1006, "")))
            if outcome == "queued" or outcome == "dropped":
                return outcome
            if outcome == "above-high":
                await self._wait_drain()
                return outcome
            # 'blocked': the queue is at its cap (a drain comes) or the shared pool is short
            # (no event of this connection says when it has room): retry at the drain or
            # after a few turns, whichever comes first.
            try:
                await asyncio.wait_for(self._wait_drain(), 0.02)
            except asyncio.TimeoutError:
                pass

    def send_nowait(self, message: Data) -> str:
        """Sends without waiting: what the session did (``'closed'`` included)."""
        outcome = OUTCOMES[self._send_native(message)]
        self._after_call()
        return outcome

    async def _wait_drain(self) -> None:
        if self._close_event is not None:
            return
        if self._drain is None:
            self._drain = self._loop.create_future()
        await asyncio.shield(self._drain)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Starts the close handshake and waits for it to end. ``ValueError`` for a code no
        endpoint may send (1005, 1006, …: RFC 6455 §7.4)."""
        if self._close_event is None:
            self._close_native(code, reason)
            self._after_call()
        await asyncio.shield(self._closed_future())

    async def wait_closed(self) -> None:
        """Waits for the connection to close."""
        await asyncio.shield(self._closed_future())

    @property
    def close_code(self) -> Optional[int]:
        return self._close_event[0] if self._close_event else None

    @property
    def close_reason(self) -> Optional[str]:
        return self._close_event[1] if self._close_event else None

    # Events from the engine.
    def _on_message(self, data: Data) -> None:
        if self._messages is None:
            self._messages = collections.deque()
        self._messages.append(data)
        if len(self._messages) >= self._max_queue and not self._held:
            # The handler does not keep up: stop reading the connection (its peer meets TCP's
            # flow control) until the handler has taken three quarters of the queue. What
            # the engine read already still arrives: at most one read beyond ``max_queue``.
            self._held = True
            self._hold_native(True)
        if self._receiver is not None and not self._receiver.done():
            self._receiver.set_result(None)

    def _on_drain(self) -> None:
        if self._drain is not None:
            if not self._drain.done():
                self._drain.set_result(None)
            self._drain = None

    def _on_close(self, code: int, reason: str) -> None:
        self._close_event = (code, reason)
        if self._receiver is not None and not self._receiver.done():
            self._receiver.set_result(None)
        self._on_drain()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)


class ServerConnection(_Connection):
    """One connection of a :class:`Server`, handed to the handler."""

    __slots__ = ("_server", "_slot", "_serial", "path", "remote_address", "_headers")

    def __init__(self, server: "Server", slot: int, serial: int, path: str, remote: tuple[str, int],
                 headers: str) -> None:
        super().__init__(server._loop, server._max_queue)
        self._server = server
        self._slot = slot
        self._serial = serial
        #: The request target (path and query).
        self.path = path
        #: ``(host, port)`` of the client.
        self.remote_address = remote
        self._headers: Union[str, list[tuple[str, str]]] = headers

    @property
    def request_headers(self) -> list[tuple[str, str]]:
        """The upgrade request's headers, as ``(name, value)`` pairs."""
        if isinstance(self._headers, str):
            parts = self._headers.split("\n")
            self._headers = list(zip(parts[0:-1:2], parts[1::2]))
        return self._headers

    def _send_native(self, message: Data) -> int:
        if self._server._native is None:
            return 4
        return self._server._native.send(self._slot, self._serial, message)

    def _close_native(self, code: int, reason: str) -> None:
        if self._server._native is not None:
            self._server._native.close(self._slot, self._serial, code, reason)

    def _after_call(self) -> None:
        self._server._schedule_flush()

    def _hold_native(self, held: bool) -> None:
        if self._server._native is not None:
            self._server._native.hold_input(self._slot, self._serial, held)
            if not held:
                self._server._schedule_flush()  # (which re-arms: the next turn reads it)

    @property
    def buffered_amount(self) -> int:
        """Unsent bytes in the connection's queue."""
        if self._server._native is None:
            return 0
        return max(0, self._server._native.buffered_amount(self._slot, self._serial))

    def subscribe(self, topic: str, since: Optional[str] = None) -> bool:
        """Subscribes to ``topic`` (``server.publish`` reaches it, framed once for all);
        ``True`` if newly subscribed. With ``since`` (a topic with history: the ``topics``
        setting's ``history``), what it missed after that offset is sent first; if the
        history no longer holds it all the connection is closed 4410 and ``False``
        returned. Raises :class:`ConnectionClosed` once closed, ``MemoryError`` when the
        topic tables' budget is spent and ``ValueError`` for a name or a topic limit the
        server refuses."""
        native = self._server._native
        answer = -1 if native is None else native.subscribe(self._slot, self._serial, topic)
        if answer == -1:
            raise _closed(*(self._close_event or (1006, "")))
        if since is not None and native is not None:
            if not native.recover(self._slot, self._serial, topic, since):
                self._close_native(4410, "history gone")
                self._server._schedule_flush()
                return False
            self._server._schedule_flush()
        return answer == 1

    def unsubscribe(self, topic: str) -> bool:
        native = self._server._native
        return bool(native and native.unsubscribe(self._slot, self._serial, topic))


Handler = Callable[[ServerConnection], Awaitable[Any]]
ProcessRequest = Callable[[str, list[tuple[str, str]]], Awaitable[Optional[int]]]


class _ServerBase:
    """What both servers share: the engine's drive on the running asyncio loop, upgrade
    decisions in Python, publish, metrics and the close."""

    def __init__(self, host: str, port: int, path: str, subprotocols: Optional[list[str]],
                 process_request: Optional[ProcessRequest], settings: dict[str, Any],
                 listener: Optional[Any] = None) -> None:
        self._loop = asyncio.get_running_loop()
        config = _settings(settings)
        config["listen"] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._protocols = list(subprotocols or [])
        self._process_request = process_request
        #: Upgrade decisions in progress: cancelled when the server stops.
        self._deciding: set[asyncio.Task[None]] = set()
        self._flush_queued = False
        self._dispatching = False
        self._timer: Optional[asyncio.TimerHandle] = None
        self._deadline: Optional[float] = None
        self._stopped = self._loop.create_future()
        #: Handler (or listener callback) exceptions, each of which closed its connection
        #: with 1011.
        self.handler_errors = 0
        if listener is None:
            native = NativeServer(json.dumps(config), path, self._protocols)
        else:
            native = NativeServer(json.dumps(config), path, self._protocols, listener,
                                  self._callback_failed, self._schedule_flush)
        self._native: Optional[NativeServer] = native
        if process_request is not None:
            native.decide_upgrades(True)
        self._fd: Optional[int] = native.fileno()
        self._loop.add_reader(self._fd, self._turn)
        self._arm()

    @property
    def port(self) -> int:
        return self._native.port if self._native else 0

    @property
    def sockets(self) -> list[tuple[str, int]]:
        """``[(host, port)]`` of the listener (websockets gives socket objects)."""
        return [(self._native.host, self._native.port)] if self._native else []

    def publish(self, topic: str, message: Data) -> Reach:
        """Publishes ``message`` to every subscriber of ``topic``: framed once, queued by
        reference. Returns what it reached (``delivered``, ``dropped`` by policies)."""
        if self._native is None or self._stopped.done():
            raise RuntimeError("freeboard: the server is closed")
        if isinstance(message, (bytearray, memoryview)):
            message = bytes(message)
        reach = Reach(*self._native.publish(topic, message))
        self._schedule_flush()
        return reach

    def metrics(self) -> str:
        """The engine's metrics (budget, pool, drops by policy, closes) as OpenMetrics text."""
        if self._native is None:
            raise RuntimeError("freeboard: the server is closed")
        return self._native.metrics()

    def close(self) -> None:
        """Stops accepting and closes every connection with 1001 (then drains)."""
        if self._native is not None:
            self._native.shutdown()

    async def wait_closed(self) -> None:
        """Waits until the server has stopped."""
        await asyncio.shield(self._stopped)

    async def serve_forever(self) -> None:
        await self.wait_closed()

    async def __aenter__(self) -> "_ServerBase":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()
        await self.wait_closed()

    # The drive: a turn when the descriptor is readable or the deadline comes.
    def _turn(self) -> None:
        native = self._native
        if native is None:
            return
        events = native.turn()
        if events is None or native.stopped:
            if events:
                self._dispatch(events)
            self._stop()
            return
        self._dispatch(events)
        for _ in range(4):
            events = native.flush()
            if not events:
                break
            self._dispatch(events)
        self._arm()

    def _arm(self) -> None:
        native = self._native
        timeout = native.timeout() if native is not None else None
        if timeout is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = self._deadline = None
            return
        deadline = self._loop.time() + timeout
        if self._deadline is not None and abs(self._deadline - deadline) < 0.001:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._deadline = deadline
        self._timer = self._loop.call_at(deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = self._deadline = None
        self._turn()

    def _schedule_flush(self) -> None:
        if not self._flush_queued and not self._dispatching and self._native is not None:
            self._flush_queued = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_queued = False
        native = self._native
        if native is None:
            return
        for _ in range(4):
            events = native.flush()
            if not events:
                break
            self._dispatch(events)
        self._arm()

    def _dispatch(self, events: list[Any]) -> None:
        """Upgrade requests (all the events of a listener's server; the handler's server
        has more)."""
        for event in events:
            if event[0] == _UPGRADE:
                self._on_upgrade(event)

    def _on_upgrade(self, event: tuple[Any, ...]) -> None:
        _, decision, path, _remote, headers = event
        task = self._loop.create_task(self._decide(decision, path, headers))
        self._deciding.add(task)
        task.add_done_callback(self._deciding.discard)

    async def _decide(self, decision: int, path: str, raw_headers: str) -> None:
        parts = raw_headers.split("\n")
        headers = list(zip(parts[0:-1:2], parts[1::2]))
        assert self._process_request is not None  # (only then are upgrades decided here)
        try:
            status = await self._process_request(path, headers)
            if status is not None and not 400 <= int(status) <= 599:
                raise ValueError(f"process_request answers None or a 4xx or 5xx status, "
                                 f"not {status!r}")
        except Exception:
            self.handler_errors += 1
            logger.exception("process_request failed; the upgrade is refused with 500")
            status = 500
        native = self._native
        if native is not None:
            native.decide(decision, 101 if status is None else int(status), -1)
            self._schedule_flush()

    def _callback_failed(self, name: str, error: BaseException) -> None:
        self.handler_errors += 1
        logger.error("listener.%s failed; its connection is closed with 1011", name,
                     exc_info=(type(error), error, error.__traceback__))

    def _stop(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            self._fd = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._native = None
        for task in self._deciding:
            task.cancel()
        if not self._stopped.done():
            self._stopped.set_result(None)


class Server(_ServerBase):
    """A freeboard server on the running asyncio loop (made by :func:`serve`): a handler
    task per connection."""

    def __init__(self, handler: Handler, host: str, port: int, *, path: str = "",
                 subprotocols: Optional[list[str]] = None,
                 process_request: Optional[ProcessRequest] = None, max_queue: int = 16,
                 **settings: Any) -> None:
        self._handler = handler
        self._max_queue = max_queue
        self._conns: dict[int, ServerConnection] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        super().__init__(host, port, path, subprotocols, process_request, settings)

    @property
    def connections(self) -> list[ServerConnection]:
        """The open connections."""
        return list(self._conns.values())

    async def wait_closed(self) -> None:
        """Waits until the server has stopped and its handlers have returned."""
        await super().wait_closed()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> "Server":
        return self

    def _dispatch(self, events: list[Any]) -> None:
        self._dispatching = True
        try:
            for event in events:
                code = event[0]
                if code == _MESSAGE:
                    conn = self._conns.get(event[1])
                    if conn is not None:
                        conn._on_message(event[2])
                elif code == _OPEN:
                    _, slot, serial, path, remote, headers = event
                    conn = ServerConnection(self, slot, serial, path, remote, headers)
                    self._conns[serial] = conn
                    task = self._loop.create_task(self._run_handler(conn))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                elif code == _DRAIN:
                    conn = self._conns.get(event[1])
                    if conn is not None:
                        conn._on_drain()
                elif code == _CLOSE:
                    conn = self._conns.pop(event[1], None)
                    if conn is not None:
                        conn._on_close(event[2], event[3])
                elif code == _UPGRADE:
                    self._on_upgrade(event)
        finally:
            self._dispatching = False
        self._schedule_flush()

    async def _run_handler(self, conn: ServerConnection) -> None:
        try:
            await self._handler(conn)
        except ConnectionClosed:
            pass
        except Exception:
            self.handler_errors += 1
            logger.exception("a handler failed; its connection is closed with 1011")
            if conn._close_event is None:
                conn._close_native(1011, "handler error")
                self._schedule_flush()
            return
        if conn._close_event is None:
            conn._close_native(1000, "")
            self._schedule_flush()

    def _stop(self) -> None:
        super()._stop()
        for conn in self._conns.values():
            conn._on_close(1001, "server shutting down")
        self._conns.clear()


class Listener:
    """The callbacks of :func:`serve_listener`, one object for every connection (subclass
    it, or pass any object with some of these methods: a missing one is not called). Each
    runs on the asyncio thread, inside the turn that saw what it reports; what it sends
    leaves at the end of that turn. An exception from one closes its connection with 1011
    (counted in ``server.handler_errors``, logged) and the server goes on."""

    def on_open(self, conn: Conn, request: Request) -> None:
        """``conn`` has opened; ``request`` has its ``path``, ``remote_address`` and
        ``headers`` (dropped after this call unless kept)."""

    def on_message(self, conn: Conn, data: Data) -> None:
        """A whole message: ``str`` for text, ``bytes`` for binary."""

    def on_drain(self, conn: Conn) -> None:
        """``conn``'s queue, above its high watermark after a send, has drained to the low
        watermark: send more."""

    def on_close(self, conn: Conn, code: int, reason: str) -> None:
        """``conn`` has closed with ``code`` and ``reason``: once for every ``on_open``
        (1001 for a connection the server's stop left open). Its calls raise
        :class:`ConnectionClosed` from now on."""


class ListenerServer(_ServerBase):
    """A freeboard server whose connections are reported to one listener's callbacks (made
    by :func:`serve_listener`): no task, coroutine or object per connection."""

    def __init__(self, listener: Any, host: str, port: int, *, path: str = "",
                 subprotocols: Optional[list[str]] = None,
                 process_request: Optional[ProcessRequest] = None, **settings: Any) -> None:
        for name in ("on_open", "on_message", "on_drain", "on_close"):
            if inspect.iscoroutinefunction(getattr(listener, name, None)):
                raise TypeError(f"listener.{name} must be a plain function: the callbacks "
                                "run inside the turn (use serve() for a coroutine per "
                                "connection, or start a task from the callback)")
        self.listener = listener
        super().__init__(host, port, path, subprotocols, process_request, settings, listener)

    async def __aenter__(self) -> "ListenerServer":
        return self


_S = TypeVar("_S", bound=_ServerBase)


class _Serve(Generic[_S]):
    """What :func:`serve` and :func:`serve_listener` return: awaitable (gives the server)
    and an async context manager (closes it on exit), as websockets' ``serve``."""

    def __init__(self, make: Callable[..., _S], first: Any, host: str, port: int,
                 kwargs: dict[str, Any]) -> None:
        self._make = make
        self._args = (first, host, port)
        self._kwargs = kwargs
        self._server: Optional[_S] = None

    def __await__(self) -> Generator[Any, None, _S]:
        return self._start().__await__()

    async def _start(self) -> _S:
        self._server = self._make(*self._args, **self._kwargs)
        return self._server

    async def __aenter__(self) -> _S:
        return await self._start()

    async def __aexit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def serve(handler: Handler, host: str = "127.0.0.1", port: int = 0,
          **kwargs: Any) -> _Serve[Server]:
    """Serves WebSocket connections on ``host:port`` with ``handler(connection)``, one task
    per connection; the connection closes (1000) when the handler returns, 1011 when it
    raises (counted in ``server.handler_errors``).

    Settings are freeboard's (those of ``freeboard serve``): ``memory="256M"``,
    ``max_size``/``max_message_size``, ``low_watermark``, ``high_watermark``,
    ``max_backpressure``, ``slow_consumer`` (``"block"``, ``"drop-newest"``,
    ``"drop-oldest"``, ``"conflate"``, ``"close"``), timeouts in seconds, ``share_port``, …
    Also: ``path`` (only that path; default every path), ``subprotocols``,
    ``process_request(path, headers)`` (async; ``None`` accepts, a status refuses),
    ``max_queue`` (16: messages waiting for the handler before the connection is no longer
    read, as websockets' ``max_queue``).
    """
    return _Serve(Server, handler, host, port, kwargs)


def serve_listener(listener: Any, host: str = "127.0.0.1", port: int = 0,
                   **kwargs: Any) -> _Serve[ListenerServer]:
    """Serves WebSocket connections on ``host:port``, reporting them to ``listener``'s
    callbacks (see :class:`Listener`): ``on_open(conn, request)``, ``on_message(conn,
    data)``, ``on_drain(conn)``, ``on_close(conn, code, reason)``. Nothing runs per
    connection between events: an idle connection costs the engine's memory and what the
    application keeps. A :class:`Conn` is made for each call (equal and hashable by
    connection, so it can key the application's tables); ``conn.send(data)`` answers what
    the session did at once, and past the high watermark ``on_drain`` says when to go on.

    Awaitable, and an async context manager, as :func:`serve`; the same settings, ``path``,
    ``subprotocols`` and ``process_request`` (no ``max_queue``: a callback has each message
    as it is read; ``conn.pause_reading()`` stops the reads).
    """
    return _Serve(ListenerServer, listener, host, port, kwargs)


class _ClientLoop:
    """The one native client loop of an asyncio loop, turned like the server's."""

    _by_loop: dict[asyncio.AbstractEventLoop, "_ClientLoop"] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop, config: dict[str, Any]) -> None:
        self._loop = loop
        self.native = NativeClient(json.dumps(config))
        self.conns: dict[int, "ClientConnection"] = {}
        self._flush_queued = False
        self._timer: Optional[asyncio.TimerHandle] = None
        self._fd = self.native.fileno()
        loop.add_reader(self._fd, self._turn)

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop, config: dict[str, Any]) -> "_ClientLoop":
        client = cls._by_loop.get(loop)
        if client is None or client._loop.is_closed():
            client = cls(loop, config)
            cls._by_loop[loop] = client
        return client

    def _turn(self) -> None:
        self._dispatch(self.native.turn())
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        timeout = self.native.timeout()
        if timeout is not None:
            self._timer = self._loop.call_later(timeout, self._turn)
        if not self.conns and len(self.native) == 0:
            self._loop.remove_reader(self._fd)
            type(self)._by_loop.pop(self._loop, None)

    def schedule_flush(self) -> None:
        if not self._flush_queued:
            self._flush_queued = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_queued = False
        events = self.native.flush()
        if events:
            self._dispatch(events)
        self._arm()

    def _dispatch(self, events: list[Any]) -> None:
        for event in events:
            code, id_ = event[0], event[1]
            conn = self.conns.get(id_)
            if conn is None:
                continue
            if code == _MESSAGE:
                conn._on_message(event[2])
            elif code == _DRAIN:
                conn._on_drain()
            elif code == _OPEN:
                conn.subprotocol = event[2]
                if not conn._opened.done():
                    conn._opened.set_result(None)
            elif code == _CLOSE:
                del self.conns[id_]
                conn._on_close(event[2], event[3])
                if not conn._opened.done():
                    conn._opened.set_exception(InvalidHandshake(f"closed: {event[2]}"))
            elif code == _FAILED:
                del self.conns[id_]
                conn._on_close(1006, event[2])
                if not conn._opened.done():
                    conn._opened.set_exception(InvalidHandshake(event[2]))
        self.schedule_flush()


class ClientConnection(_Connection):
    """A client connection (made by :func:`connect`), with the server connection's
    semantics: ``recv``, ``async for``, ``send`` that waits at the high watermark."""

    __slots__ = ("_client", "_id", "_opened", "subprotocol")

    def __init__(self, client: _ClientLoop, id_: int, max_queue: int) -> None:
        super().__init__(client._loop, max_queue)
        self._client = client
        self._id = id_
        self._opened = client._loop.create_future()
        #: The subprotocol the server chose, if any.
        self.subprotocol: Optional[str] = None

    def _send_native(self, message: Data) -> int:
        return self._client.native.send(self._id, message)

    def _close_native(self, code: int, reason: str) -> None:
        self._client.native.close(self._id, code, reason)

    def _after_call(self) -> None:
        self._client.schedule_flush()

    def _hold_native(self, held: bool) -> None:
        # The engine's client loop cannot stop reading one connection: past ``max_queue``
        # the connection is closed 1013 rather than Python's memory growing without end.
        if held and self._close_event is None:
            self._close_native(1013, "handler too slow")
            self._after_call()

    @property
    def buffered_amount(self) -> int:
        return max(0, self._client.native.buffered_amount(self._id))


class _Connect:
    def __init__(self, uri: str, max_queue: int, settings: dict[str, Any]) -> None:
        self._uri = uri
        self._max_queue = max_queue
        self._settings = settings
        self._conn: Optional[ClientConnection] = None

    def __await__(self) -> Generator[Any, None, "ClientConnection"]:
        return self._open().__await__()

    async def _open(self) -> ClientConnection:
        loop = asyncio.get_running_loop()
        client = _ClientLoop.of(loop, _settings(self._settings))
        try:
            address = await self._resolve(loop)
            if address is None:
                id_ = client.native.connect(self._uri)
            else:
                id_ = client.native.connect_to(self._uri, *address)
        except OSError as error:
            raise InvalidHandshake(str(error)) from error
        conn = ClientConnection(client, id_, self._max_queue)
        client.conns[id_] = conn
        client._arm()
        await conn._opened
        self._conn = conn
        return conn

    async def _resolve(self, loop: asyncio.AbstractEventLoop) -> Optional[tuple[str, int]]:
        """The address of the URL's host, resolved by asyncio (in its executor: the asyncio
        thread never waits for a resolver); ``None`` for an IP address, or a URL the engine
        refuses anyway."""
        parts = urllib.parse.urlsplit(self._uri)
        try:
            host, port = parts.hostname, parts.port
        except ValueError:
            return None  # a bad port: the engine says so
        if not host:
            return None
        try:
            ipaddress.ip_address(host)
            return None
        except ValueError:
            pass
        if port is None:
            port = 443 if parts.scheme.lower() == "wss" else 80
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(f"{host}: no address")
        sockaddr = infos[0][4]
        return str(sockaddr[0]), int(sockaddr[1])

    async def __aenter__(self) -> ClientConnection:
        return await self._open()

    async def __aexit__(self, *exc: Any) -> None:
        if self._conn is not None:
            await self._conn.close()


def connect(uri: str, *, max_queue: int = 4096, **settings: Any) -> _Connect:
    """Opens a client connection to ``uri`` (``ws://``; ``wss://`` with the engine's TLS
    feature); a host name is resolved by asyncio's ``getaddrinfo`` (off the asyncio thread).
    Awaitable, or an async context manager that closes it on exit. Settings as
    for :func:`serve` (the first connection of an asyncio loop sets its client's budget);
    past ``max_queue`` messages waiting for the application it is closed 1013."""
    return _Connect(uri, max_queue, settings)
