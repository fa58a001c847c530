"""serve_listener against real sockets on 127.0.0.1: one listener's callbacks for every
connection, no task, coroutine or Python object per connection."""

import asyncio
import gc
import re
import socket
import threading
import tracemalloc

import pytest
import websockets

import freeboard

HANDSHAKE = (
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def url(server, path="/"):
    return f"ws://127.0.0.1:{server.port}{path}"


async def until(condition, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


class Recorder(freeboard.Listener):
    """Records every callback; echoes what it receives."""

    def __init__(self):
        self.calls = []

    def on_open(self, conn, request):
        self.calls.append(("open", conn, request))

    def on_message(self, conn, data):
        self.calls.append(("message", conn, data, conn.send(data)))

    def on_close(self, conn, code, reason):
        self.calls.append(("close", conn, code, reason))

    def named(self, name):
        return [call for call in self.calls if call[0] == name]


def test_echoes_and_reports_open_message_close_with_one_conn_per_connection():
    listener = Recorder()

    async def main():
        async with freeboard.serve_listener(listener, "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(
                url(server, "/room?id=7"), additional_headers={"X-User": "ada"}
            ) as client:
                await client.send("hello")
                assert await client.recv() == "hello"
                await client.send(b"\x00\x01\xff")
                assert await client.recv() == b"\x00\x01\xff"
                (_, conn, request), = listener.named("open")
                assert conn.open and conn.remote_address[0] == "127.0.0.1"
                assert conn.remote_address == request.remote_address
            await until(lambda: listener.named("close"))

    run(main())
    (_, opened, request), = listener.named("open")
    assert request.path == "/room?id=7"
    assert dict(request.headers)["X-User"] == "ada"
    messages = listener.named("message")
    assert [(m[2], m[3]) for m in messages] == [("hello", "queued"), (b"\x00\x01\xff", "queued")]
    (_, closed, code, _), = listener.named("close")
    assert code == 1000
    # A Conn per call, all equal: the application can key its tables with any of them.
    conns = [opened, closed] + [m[1] for m in messages]
    assert len({id(c) for c in conns}) == len(conns)
    assert len(set(conns)) == 1 and all(c == opened and c.id == opened.id for c in conns)


def test_a_listener_need_not_have_every_callback():
    class OnlyMessages:
        def on_message(self, conn, data):
            conn.send(data.upper())

    async def main():
        async with freeboard.serve_listener(OnlyMessages(), "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(url(server)) as client:
                await client.send("shout")
                assert await client.recv() == "SHOUT"

    run(main())


def test_a_coroutine_callback_is_refused_when_the_server_is_made():
    class Async:
        async def on_message(self, conn, data):
            conn.send(data)

    async def main():
        with pytest.raises(TypeError, match="on_message must be a plain function"):
            await freeboard.serve_listener(Async(), "127.0.0.1", 0, memory="64M")

    run(main())


def test_a_send_between_callbacks_leaves_without_another_event():
    conns = []

    class Keep:
        def on_open(self, conn, request):
            conns.append(conn)

    async def main():
        async with freeboard.serve_listener(Keep(), "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(url(server)) as client:
                await until(lambda: conns)
                # From a coroutine of the application, not a callback: it is flushed.
                assert conns[0].send("tick") == "queued"
                assert await asyncio.wait_for(client.recv(), 5) == "tick"
                loop = asyncio.get_running_loop()
                loop.call_later(0.01, conns[0].send, b"tock")
                assert await asyncio.wait_for(client.recv(), 5) == b"tock"

    run(main())


def test_close_codes_both_ways():
    listener = Recorder()

    class Closer(Recorder):
        def on_message(self, conn, data):
            with pytest.raises(ValueError, match="cannot be sent"):
                conn.close(1005)  # RFC 6455 §7.4.1: never sent
            assert conn.close(4000, "done here") is True
            assert conn.close(4001, "again") is False  # closing already
            with pytest.raises(freeboard.ConnectionClosed):
                conn.send("too late")

    closer = Closer()

    async def main():
        async with freeboard.serve_listener(closer, "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(url(server)) as client:
                await client.send("bye")
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await client.recv()
                assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4000, "done here")
        async with freeboard.serve_listener(listener, "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(url(server)) as client:
                await client.close(4321, "client leaves")
            await until(lambda: listener.named("close"))
        async with freeboard.serve_listener(listener, "127.0.0.1", 0, memory="64M",
                                            max_size="1K") as server:
            async with websockets.connect(url(server)) as client:
                await client.send(b"z" * 4096)
                with pytest.raises(websockets.ConnectionClosedError) as closed:
                    await client.recv()
                assert closed.value.rcvd.code == 1009
            await until(lambda: len(listener.named("close")) == 2)

    run(main())
    assert [c[2:] for c in closer.named("close")] == [(4000, "done here")]
    assert [c[2] for c in listener.named("close")] == [4321, 1009]
    assert listener.named("close")[0][3] == "client leaves"


def test_a_callback_that_raises_closes_1011_is_counted_and_the_server_goes_on(caplog):
    closes = []

    class Fragile:
        def on_open(self, conn, request):
            if request.path == "/open-fails":
                raise KeyError("no such room")

        def on_message(self, conn, data):
            if data == "raise":
                raise RuntimeError("boom")
            conn.send(data)

        def on_close(self, conn, code, reason):
            closes.append(code)
            if len(closes) == 2:
                raise ValueError("even on_close")

    async def main():
        async with freeboard.serve_listener(Fragile(), "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(url(server)) as client:
                await client.send("raise")
                with pytest.raises(websockets.ConnectionClosedError) as closed:
                    await client.recv()
                assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1011, "handler error")
            async with websockets.connect(url(server, "/open-fails")) as client:
                with pytest.raises(websockets.ConnectionClosedError) as closed:
                    await client.recv()
                assert closed.value.rcvd.code == 1011
            await until(lambda: len(closes) == 2)
            assert server.handler_errors == 3
            async with websockets.connect(url(server)) as client:
                await client.send("still here")
                assert await client.recv() == "still here"

    run(main())
    assert closes[:2] == [1011, 1011]
    failures = [r.getMessage() for r in caplog.records if r.name == "freeboard"]
    assert failures == [f"listener.{name} failed; its connection is closed with 1011"
                        for name in ("on_message", "on_open", "on_close")]


def test_a_stale_conn_raises_a_clear_error():
    kept = []

    class Keep:
        def on_open(self, conn, request):
            kept.append(conn)

        def on_close(self, conn, code, reason):
            kept.append(conn)

    async def main():
        async with freeboard.serve_listener(Keep(), "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(url(server)):
                await until(lambda: kept)
            await until(lambda: len(kept) == 2)
            for conn in kept:
                assert conn.open is False and conn.buffered_amount == 0
                with pytest.raises(freeboard.ConnectionClosed, match="closing or closed") as stale:
                    conn.send("anyone?")
                assert stale.value.code is None
                with pytest.raises(freeboard.ConnectionClosed):
                    conn.subscribe("t")
                with pytest.raises(freeboard.ConnectionClosed):
                    conn.remote_address
                assert conn.close() is False and conn.unsubscribe("t") is False
                assert conn.pause_reading() is False
        # And once the server itself has stopped.
        with pytest.raises(freeboard.ConnectionClosed):
            kept[0].send("anyone?")
        with pytest.raises(RuntimeError, match="closed"):
            server.publish("t", "x")

    run(main())


def test_send_above_the_high_watermark_then_on_drain():
    events = []
    chunk = b"x" * (16 << 10)

    class Producer:
        def on_open(self, conn, request):
            self.produce(conn)

        def on_drain(self, conn):
            events.append(("drain", conn.buffered_amount))
            self.produce(conn)

        def produce(self, conn):
            while len(events) < 1000:
                outcome = conn.send(chunk)
                events.append((outcome, conn.buffered_amount))
                if outcome == "above-high":
                    return  # on_drain says when to go on
            conn.close()

    async def main():
        settings = dict(low_watermark="16K", high_watermark="64K", max_backpressure="8M")
        async with freeboard.serve_listener(Producer(), "127.0.0.1", 0, memory="64M",
                                            **settings) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(HANDSHAKE)
            await writer.drain()
            await asyncio.sleep(0.3)  # not read: the kernel's buffers fill, then the queue
            assert events[-1][0] == "above-high"
            while await reader.read(1 << 16):  # reads slowly enough to drain in steps
                await asyncio.sleep(0.001)
            writer.close()

    run(main())
    outcomes = [e[0] for e in events]
    assert set(outcomes) == {"queued", "above-high", "drain"}
    for i, (outcome, buffered) in enumerate(events):
        if outcome == "drain":
            assert events[i - 1][0] == "above-high"  # only after a send said so
            assert buffered <= 16 << 10  # at the low watermark
        if outcome == "above-high":
            assert buffered > 64 << 10


def test_pause_reading_holds_messages_until_resume_reading():
    received = []
    conns = []

    class Paused:
        def on_open(self, conn, request):
            assert conn.pause_reading() is True
            conns.append(conn)

        def on_message(self, conn, data):
            received.append(data)

    async def main():
        async with freeboard.serve_listener(Paused(), "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(url(server)) as client:
                await until(lambda: conns)
                for i in range(3):
                    await client.send(f"m{i}")
                await asyncio.sleep(0.2)
                assert received == []  # not read
                assert conns[0].resume_reading() is True  # from outside a callback
                await until(lambda: len(received) == 3)
                assert received == ["m0", "m1", "m2"]

    run(main())


def test_drop_newest_reports_every_drop_and_counts_it():
    outcomes = []

    class Flood:
        def on_open(self, conn, request):
            for _ in range(200):
                outcomes.append(conn.send(b"y" * (8 << 10)))

    async def main():
        settings = dict(slow_consumer="drop-newest", low_watermark="16K",
                        high_watermark="32K", max_backpressure="64K")
        async with freeboard.serve_listener(Flood(), "127.0.0.1", 0, memory="64M",
                                            **settings) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(HANDSHAKE)  # and never reads: the slow consumer
            await until(lambda: len(outcomes) == 200)
            metrics = server.metrics()
            writer.close()
        return metrics

    metrics = run(main())
    dropped = outcomes.count("dropped")
    assert dropped > 0 and set(outcomes) <= {"queued", "above-high", "dropped"}
    line = next(l for l in metrics.splitlines()
                if l.startswith('freeboard_drops_total{reason="drop-newest"}'))
    assert int(float(line.split()[-1])) == dropped


def test_subscribe_publish_and_history_since():
    class Fans:
        def on_open(self, conn, request):
            since = re.search(r"since=([^&]+)", request.path)
            if request.path.startswith("/match"):
                assert conn.subscribe("match", since=since and since.group(1)) in (True, False)
                assert conn.subscribe("match") is False  # already

    async def main():
        async with freeboard.serve_listener(Fans(), "127.0.0.1", 0, memory="64M",
                                            topics={"history": 100}) as server:
            fans = [await websockets.connect(url(server, "/match")) for _ in range(2)]
            other = await websockets.connect(url(server, "/other"))
            await asyncio.sleep(0.05)
            assert server.publish("match", "kick-off") == (2, 0)
            first = [await fan.recv() for fan in fans]
            offset, payload = re.fullmatch(r"([0-9a-f]+\.\d+-\d+):(.*)", first[0]).groups()
            assert payload == "kick-off" and first[0] == first[1]
            assert server.publish("nobody", "x") == freeboard.Reach(0, 0)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(other.recv(), 0.1)
            server.publish("match", "goal 1-0")
            async with websockets.connect(url(server, f"/match?since={offset}")) as back:
                replay = [re.sub(r"^[0-9a-f.]+-\d+:", "", await back.recv()) for _ in range(1)]
                assert replay == ["goal 1-0"]
            async with websockets.connect(url(server, "/match?since=1-999999")) as stranger:
                with pytest.raises(websockets.ConnectionClosedError) as closed:
                    await stranger.recv()
                assert closed.value.rcvd.code == 4410
            for c in fans + [other]:
                await c.close()

    run(main())


def test_close_sends_1001_and_every_open_gets_its_close():
    listener = Recorder()

    async def main():
        server = await freeboard.serve_listener(listener, "127.0.0.1", 0, memory="64M",
                                                drain_timeout=0.3)
        clients = [await websockets.connect(url(server)) for _ in range(2)]
        # One more that never answers the close: the drain's deadline leaves it open.
        mute = socket.create_connection(("127.0.0.1", server.port))
        mute.sendall(HANDSHAKE)
        await until(lambda: len(listener.named("open")) == 3)
        server.close()
        for client in clients:
            with pytest.raises(websockets.ConnectionClosedOK) as closed:
                await client.recv()
            assert closed.value.rcvd.code == 1001
        await server.wait_closed()
        mute.close()
        with pytest.raises(RuntimeError, match="closed"):
            server.metrics()

    run(main())
    opened = [c[1] for c in listener.named("open")]
    closed = {c[1]: c[2:] for c in listener.named("close")}
    assert set(closed) == set(opened)
    assert sorted(code for code, _ in closed.values()) == [1001, 1001, 1001]


def test_process_request_decides_upgrades_for_a_listener_too():
    async def process_request(path, headers):
        return None if path == "/yes" else 403

    async def main():
        async with freeboard.serve_listener(Recorder(), "127.0.0.1", 0, memory="64M",
                                            process_request=process_request) as server:
            async with websockets.connect(url(server, "/yes")) as client:
                await client.send("in")
                assert await client.recv() == "in"
            with pytest.raises(websockets.InvalidStatus) as refused:
                await websockets.connect(url(server, "/no"))
            assert refused.value.response.status_code == 403

    run(main())


def test_idle_connections_hold_no_python_memory():
    """300 idle connections, opened by raw sockets on another thread: what Python allocated
    from freeboard's code for them and still holds is next to nothing: the engine's share is
    in its budget, outside Python's heap, and each Conn lives as long as its callback. (The
    handler model holds about 1.3 KiB here per connection: its task, coroutine and
    connection object.)"""

    def open_raw(port, count, sockets, ready):
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(HANDSHAKE)
            assert s.recv(4096).startswith(b"HTTP/1.1 101")
            sockets.append(s)
        ready.set()

    async def opened(server, count):
        sockets, ready = [], threading.Event()
        thread = threading.Thread(target=open_raw, args=(server.port, count, sockets, ready))
        thread.start()
        await until(ready.is_set)
        thread.join()
        await asyncio.sleep(0.05)  # a few idle turns
        return sockets

    def freeboard_bytes(snapshot):
        keep = [tracemalloc.Filter(True, freeboard.__file__)]
        return sum(s.size for s in snapshot.filter_traces(keep).statistics("filename"))

    class Quiet:
        def on_open(self, conn, request):
            pass

    async def main():
        async with freeboard.serve_listener(Quiet(), "127.0.0.1", 0, memory="64M") as server:
            warm = await opened(server, 10)
            gc.collect()
            tracemalloc.start(1)
            try:
                before = freeboard_bytes(tracemalloc.take_snapshot())
                idle = await opened(server, 300)
                gc.collect()
                after = freeboard_bytes(tracemalloc.take_snapshot())
            finally:
                tracemalloc.stop()
            for s in warm + idle:
                s.close()
        return after - before

    grown = run(main())
    assert grown < 300 * 16, f"{grown} bytes for 300 idle connections"
