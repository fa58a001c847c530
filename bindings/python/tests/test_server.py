"""The Python binding against real sockets on 127.0.0.1 (websockets as the peer client,
and freeboard's own client)."""

import asyncio

import pytest
import websockets

import freeboard


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def url(server, path="/"):
    return f"ws://127.0.0.1:{server.port}{path}"


async def echo(ws):
    async for message in ws:
        await ws.send(message)


def test_echoes_text_as_str_and_binary_as_bytes():
    async def main():
        async with freeboard.serve(echo, "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(url(server)) as client:
                await client.send("hello")
                assert await client.recv() == "hello"
                await client.send(b"\x00\x01\xff")
                assert await client.recv() == b"\x00\x01\xff"

    run(main())


def test_the_client_has_the_same_semantics():
    async def main():
        async with freeboard.serve(echo, "127.0.0.1", 0, memory="64M") as server:
            async with freeboard.connect(url(server, "/x")) as client:
                assert await client.send("hi") == "queued"
                assert await client.recv() == "hi"
                assert await client.send(b"raw") == "queued"
                assert await client.recv() == b"raw"
            assert client.close_code == 1000
            with pytest.raises(freeboard.ConnectionClosed):
                await client.send("late")
            with pytest.raises(freeboard.InvalidHandshake):
                await freeboard.connect(f"ws://127.0.0.1:{server.port + 1 or 1}/")
            # A name is resolved by asyncio, off its thread; the engine connects to the address.
            async with freeboard.connect(f"ws://localhost:{server.port}/named") as named:
                assert await named.send("by name") == "queued"
                assert await named.recv() == "by name"
            with pytest.raises(freeboard.InvalidHandshake):
                await freeboard.connect("ws://freeboard.invalid/")  # RFC 6761: never resolves

    run(main())


def test_the_clients_send_waits_at_the_high_watermark_until_the_server_reads():
    received = []

    async def late_reader(ws):
        await asyncio.sleep(0.5)  # reads nothing yet: the kernel's buffers fill, then the queue
        async for message in ws:
            received.append(len(message))

    async def main():
        async with freeboard.serve(late_reader, "127.0.0.1", 0, memory="64M",
                                   max_queue=4) as server:
            settings = dict(memory="64M", low_watermark="16K", high_watermark="64K",
                            max_backpressure="8M")
            async with freeboard.connect(url(server), **settings) as client:
                chunk = b"c" * (16 << 10)
                outcomes = []
                for _ in range(2000):
                    outcomes.append(await client.send(chunk))
                    if outcomes[-1] == "above-high":
                        # It waited for the server to read, down to the low watermark.
                        assert client.buffered_amount <= 16 << 10
                        break
                assert outcomes[-1] == "above-high" and set(outcomes[:-1]) == {"queued"}
                # And it goes on: the next sends are queued, and every message arrives.
                assert await client.send(chunk) == "queued"
                while len(received) < len(outcomes) + 1:
                    await asyncio.sleep(0.01)
        assert received == [16 << 10] * (len(outcomes) + 1)

    run(main())


def test_messages_of_one_read_arrive_in_order():
    received = []

    async def collect(ws):
        async for message in ws:
            received.append(message)

    async def main():
        async with freeboard.serve(collect, "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(url(server)) as client:
                sent = [f"message {i}" for i in range(500)]
                for message in sent:
                    await client.send(message)
                while len(received) < len(sent):
                    await asyncio.sleep(0.005)
                assert received == sent

    run(main())


def test_request_path_and_headers_reach_the_handler_and_close_code_the_client():
    seen = {}

    async def handler(ws):
        seen["path"] = ws.path
        seen["user"] = dict(ws.request_headers).get("X-User")
        seen["remote"] = ws.remote_address[0]
        await ws.close(4000, "done here")

    async def main():
        async with freeboard.serve(handler, "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(
                url(server, "/room?id=7"), additional_headers={"X-User": "ada"}
            ) as client:
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await client.recv()
                assert closed.value.rcvd.code == 4000
                assert closed.value.rcvd.reason == "done here"
        assert seen == {"path": "/room?id=7", "user": "ada", "remote": "127.0.0.1"}

    run(main())


def test_send_waits_at_the_high_watermark_until_the_reader_catches_up():
    outcomes = []

    async def producer(ws):
        chunk = b"x" * (16 << 10)
        for _ in range(2000):
            outcome = await ws.send(chunk)
            outcomes.append(outcome)
            if outcome == "above-high":
                assert ws.buffered_amount <= 16 << 10  # it waited for the drain
                break
        await ws.close()

    async def main():
        settings = dict(low_watermark="16K", high_watermark="64K", max_backpressure="8M",
                        close_timeout=0.5)
        async with freeboard.serve(producer, "127.0.0.1", 0, memory="64M", **settings) as server:
            # A client that reads slowly: small reads with pauses.
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(
                b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            await writer.drain()
            await asyncio.sleep(0.3)  # the server fills the kernel's buffers, then its queue
            while await reader.read(1 << 16):
                pass
            writer.close()

    run(main())
    assert outcomes[-1] == "above-high"
    assert set(outcomes[:-1]) == {"queued"}


def test_drop_newest_reports_every_drop_and_counts_it():
    outcomes = []
    server_ref = {}

    async def producer(ws):
        for i in range(400):
            outcomes.append(ws.send_nowait(b"y" * (8 << 10)))
            if i % 8 == 7:
                await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        server_ref["metrics"] = server_ref["server"].metrics()

    async def main():
        settings = dict(slow_consumer="drop-newest", low_watermark="16K",
                        high_watermark="32K", max_backpressure="64K")
        async with freeboard.serve(producer, "127.0.0.1", 0, memory="64M", **settings) as server:
            server_ref["server"] = server
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(
                b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            while "metrics" not in server_ref:
                await asyncio.sleep(0.01)  # never reads: the slow consumer
            writer.close()

    run(main())
    dropped = outcomes.count("dropped")
    assert dropped > 0 and "closed" not in outcomes
    line = next(l for l in server_ref["metrics"].splitlines()
                if l.startswith('freeboard_drops_total{reason="drop-newest"}'))
    assert int(float(line.split()[-1])) == dropped


def test_publish_is_framed_once_and_says_what_it_reached():
    async def handler(ws):
        if ws.path == "/match":
            assert ws.subscribe("match") is True
            assert ws.subscribe("match") is False
        await ws.wait_closed()

    async def main():
        async with freeboard.serve(handler, "127.0.0.1", 0, memory="64M") as server:
            fans = [await websockets.connect(url(server, "/match")) for _ in range(2)]
            other = await websockets.connect(url(server, "/other"))
            while len(server.connections) < 3:
                await asyncio.sleep(0.005)
            assert server.publish("match", "goal 1-0") == (2, 0)
            for fan in fans:
                assert await fan.recv() == "goal 1-0"
            assert server.publish("nobody", "x") == freeboard.Reach(0, 0)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(other.recv(), 0.1)
            for c in fans + [other]:
                await c.close()

    run(main())


async def upgrade_status(server, path):
    """The status a websockets client's upgrade to ``path`` gets: 101, or the refusal's."""
    try:
        async with websockets.connect(url(server, path)):
            return 101
    except websockets.InvalidStatus as refused:
        return refused.response.status_code


def metric(server, name):
    """The value of the metrics line that starts with ``name`` (0 when absent)."""
    line = next((l for l in server.metrics().splitlines() if l.startswith(name)), None)
    return 0 if line is None else float(line.split()[-1])


def test_process_request_decides_later_and_the_timeout_answers_503():
    async def process_request(path, headers):
        await asyncio.sleep(0.02)
        if path == "/yes":
            return None
        if path == "/no":
            return 401
        if path == "/raise":
            raise LookupError("no such user")
        if path == "/ok-is-no-refusal":
            return 200
        await asyncio.sleep(10)  # past the handshake timeout

    async def main():
        async with freeboard.serve(echo, "127.0.0.1", 0, memory="64M", handshake_timeout=0.3,
                                   process_request=process_request) as server:
            assert await upgrade_status(server, "/yes") == 101
            assert await upgrade_status(server, "/no") == 401
            assert await upgrade_status(server, "/never") == 503
            # Counted as the Rust server counts a Decision that timed out.
            assert metric(server, 'freeboard_access_refusals_total{reason="decision_timeout"}') == 1
            # A process_request that raises refuses with 500, is counted, and the server goes on.
            assert await upgrade_status(server, "/raise") == 500
            assert await upgrade_status(server, "/ok-is-no-refusal") == 500
            assert server.handler_errors == 2
            assert await upgrade_status(server, "/yes") == 101
            server.close()

    run(main())


def test_past_max_pending_upgrades_the_next_gets_503_at_once():
    waiting = {}

    async def process_request(path, headers):
        decided = asyncio.get_running_loop().create_future()
        waiting[path] = decided
        return await decided

    async def main():
        async with freeboard.serve(echo, "127.0.0.1", 0, memory="64M", handshake_timeout=20,
                                   max_pending_upgrades=2,
                                   process_request=process_request) as server:
            first = asyncio.ensure_future(upgrade_status(server, "/first"))
            second = asyncio.ensure_future(upgrade_status(server, "/second"))
            while len(waiting) < 2:
                await asyncio.sleep(0.005)
            # Two wait for Python: a third is refused by the engine without waiting for it.
            assert await upgrade_status(server, "/third") == 503
            assert metric(server, 'freeboard_access_refusals_total{reason="pending_full"}') == 1
            assert metric(server, "freeboard_access_pending_upgrades") == 2
            waiting["/first"].set_result(None)
            waiting["/second"].set_result(403)
            assert await first == 101
            assert await second == 403
            # Their places are free again.
            fourth = asyncio.ensure_future(upgrade_status(server, "/fourth"))
            while "/fourth" not in waiting:
                await asyncio.sleep(0.005)
            waiting["/fourth"].set_result(None)
            assert await fourth == 101
            for decided in waiting.values():  # (the third's, which nobody waits for)
                if not decided.done():
                    decided.set_result(None)

    run(main())


def test_a_handler_that_raises_closes_1011_is_counted_and_the_server_goes_on():
    async def handler(ws):
        message = await ws.recv()
        if message == "raise":
            raise RuntimeError("boom")
        await ws.send(message)
        await ws.wait_closed()

    async def main():
        async with freeboard.serve(handler, "127.0.0.1", 0, memory="64M") as server:
            async with websockets.connect(url(server)) as client:
                await client.send("raise")
                with pytest.raises(websockets.ConnectionClosedError) as closed:
                    await client.recv()
                assert closed.value.rcvd.code == 1011
            assert server.handler_errors == 1
            async with websockets.connect(url(server)) as client:
                await client.send("still here")
                assert await client.recv() == "still here"

    run(main())


def test_close_sends_1001_drains_and_refuses_use_after_it():
    kept = []

    async def handler(ws):
        kept.append(ws)
        await ws.wait_closed()

    async def main():
        server = await freeboard.serve(handler, "127.0.0.1", 0, memory="64M")
        clients = [await websockets.connect(url(server)) for _ in range(2)]
        while len(server.connections) < 2:
            await asyncio.sleep(0.005)
        server.close()
        for client in clients:
            with pytest.raises(websockets.ConnectionClosedOK) as closed:
                await client.recv()
            assert closed.value.rcvd.code == 1001
        await server.wait_closed()
        with pytest.raises(RuntimeError, match="closed"):
            server.publish("t", "x")
        with pytest.raises(RuntimeError, match="closed"):
            server.metrics()
        # Its connections: closed with the server's 1001, and they say so.
        for ws in kept:
            with pytest.raises(freeboard.ConnectionClosedOK, match="1001"):
                await ws.send("late")
            with pytest.raises(freeboard.ConnectionClosedOK):
                ws.subscribe("t")
            with pytest.raises(freeboard.ConnectionClosedOK):
                await ws.recv()
            assert ws.send_nowait("late") == "closed" and ws.buffered_amount == 0

    run(main())


def test_misuse_is_a_clear_error_a_close_code_or_a_topic_the_server_refuses():
    checked = []

    async def handler(ws):
        if ws.path == "/client":
            return await ws.wait_closed()
        for code in (1005, 1006, 1004, 999, 5000):
            with pytest.raises(ValueError, match="cannot be sent"):
                await ws.close(code)
        with pytest.raises(OverflowError):
            await ws.close(70000)
        with pytest.raises(ValueError, match="invalid topic name"):
            ws.subscribe("no spaces")
        assert ws.subscribe("a") and ws.subscribe("b")
        with pytest.raises(ValueError, match="too many topics"):
            ws.subscribe("c")
        checked.append(True)
        await ws.close(4000, "fine")

    async def main():
        async with freeboard.serve(handler, "127.0.0.1", 0, memory="64M",
                                   topics={"max_topics_per_connection": 2}) as server:
            async with websockets.connect(url(server)) as client:
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await client.recv()
                assert closed.value.rcvd.code == 4000
            # The client's close checks the code the same way.
            async with freeboard.connect(url(server, "/client")) as mine:
                with pytest.raises(ValueError, match="cannot be sent"):
                    await mine.close(1006)
        assert checked == [True]

    run(main())


def test_a_message_past_max_size_closes_1009():
    async def main():
        async with freeboard.serve(echo, "127.0.0.1", 0, memory="64M", max_size="1K") as server:
            async with websockets.connect(url(server)) as client:
                await client.send(b"z" * 4096)
                with pytest.raises(websockets.ConnectionClosedError) as closed:
                    await client.recv()
                assert closed.value.rcvd.code == 1009

    run(main())


def test_a_handler_that_reads_slowly_stops_the_reads_not_the_connection():
    received = []
    longest = []

    async def slow(ws):
        async for message in ws:
            received.append(message)
            longest.append(len(ws._messages))
            await asyncio.sleep(0.001)  # slower than the client sends

    async def main():
        async with freeboard.serve(slow, "127.0.0.1", 0, memory="64M", max_queue=8) as server:
            async with websockets.connect(url(server)) as client:
                sent = [i.to_bytes(2, "big") * 2048 for i in range(300)]
                for message in sent:
                    await client.send(message)
                while len(received) < len(sent):
                    await asyncio.sleep(0.01)
        assert received == sent
        # Bounded: max_queue, plus what one turn had read when the hold came (at most
        # 64 KiB and one more read of 128 KiB), not the 300 messages the client sent.
        assert max(longest) <= 8 + (192 << 10) // 4096, max(longest)

    run(main())


def test_history_a_subscriber_that_comes_back_with_since_gets_what_it_missed():
    import re
    import urllib.parse

    async def handler(ws):
        since = urllib.parse.parse_qs(urllib.parse.urlsplit(ws.path).query).get("since")
        ws.subscribe("match", since=since[0] if since else None)
        await ws.wait_closed()

    async def main():
        async with freeboard.serve(handler, "127.0.0.1", 0, memory="64M",
                                   topics={"history": 100}) as server:
            async with websockets.connect(url(server)) as first:
                while len(server.connections) < 1:
                    await asyncio.sleep(0.005)
                server.publish("match", "kick-off")
                offset, payload = re.fullmatch(r"([0-9a-f]+\.\d+-\d+):(.*)", await first.recv()).groups()
                assert payload == "kick-off"
            server.publish("match", "goal 1-0")
            server.publish("match", "goal 2-0")
            async with websockets.connect(url(server, f"/?since={offset}")) as back:
                replay = [re.sub(r"^[0-9a-f]+\.\d+-\d+:", "", await back.recv()) for _ in range(2)]
                assert replay == ["goal 1-0", "goal 2-0"]
            async with websockets.connect(url(server, "/?since=1-999999")) as stranger:
                with pytest.raises(websockets.ConnectionClosedError) as closed:
                    await stranger.recv()
                assert closed.value.rcvd.code == 4410

    run(main())
