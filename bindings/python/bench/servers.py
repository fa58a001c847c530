"""The benchmark servers of the Python comparison, one process each:

    python servers.py freeboard|freeboard-listener|websockets|picows echo|idle|broadcast HOST:PORT [SETTINGS]

``echo`` sends every message back as it came; ``idle`` holds connections; ``broadcast``
makes every connection a subscriber until it sends, and publishes what it sends to the
others (as bindings/node/bench/server.js). Each is the library's ordinary usage: freeboard
and websockets with a handler coroutine per connection (websockets' ``broadcast()`` for the
fan-out), freeboard-listener with ``serve_listener``'s callbacks (one listener for every
connection), picows with its listener callbacks (one listener object per connection, no
coroutine, no broadcast helper: a loop over the subscribers). SETTINGS, JSON, adds
freeboard settings (the hostile suite's budget and timeouts)."""

import asyncio
import json
import sys


async def freeboard_server(mode, host, port, extra):
    import freeboard

    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async def idle(ws):
        await ws.wait_closed()

    async def broadcast(ws):
        ws.subscribe("bench")
        publishing = False
        async for message in ws:
            if not publishing:
                publishing = True
                ws.unsubscribe("bench")
            server.publish("bench", message)

    handler = {"echo": echo, "idle": idle, "broadcast": broadcast}[mode]
    settings = freeboard_settings(mode, extra)
    async with freeboard.serve(handler, host, port, **settings) as server:
        print(f"freeboard-python {mode} listening on {host}:{port}", flush=True)
        await asyncio.Future()


def freeboard_settings(mode, extra):
    settings = dict(memory="1G", max_connections=100000, max_connections_per_ip=100000,
                    idle_timeout=None)
    if mode == "broadcast":
        settings.update(slow_consumer="drop-oldest", max_backpressure="4M")
    settings.update(extra)
    return settings


async def freeboard_listener_server(mode, host, port, extra):
    import freeboard

    class Echo:
        def on_message(self, conn, data):
            # Past the high watermark, stop reading the peer until the queue drains.
            if conn.send(data) == "above-high":
                conn.pause_reading()

        def on_drain(self, conn):
            conn.resume_reading()

    class Idle:
        pass

    class Broadcast:
        def on_open(self, conn, request):
            conn.subscribe("bench")

        def on_message(self, conn, data):
            conn.unsubscribe("bench")  # a publisher from its first message on
            server.publish("bench", data)

    listener = {"echo": Echo, "idle": Idle, "broadcast": Broadcast}[mode]()
    settings = freeboard_settings(mode, extra)
    async with freeboard.serve_listener(listener, host, port, **settings) as server:
        print(f"freeboard-listener {mode} listening on {host}:{port}", flush=True)
        await asyncio.Future()


async def websockets_server(mode, host, port, extra):
    import websockets

    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async def idle(ws):
        await ws.wait_closed()

    subscribers = set()

    async def broadcast(ws):
        subscribers.add(ws)
        try:
            async for message in ws:
                subscribers.discard(ws)
                websockets.broadcast(subscribers, message)
        finally:
            subscribers.discard(ws)

    handler = {"echo": echo, "idle": idle, "broadcast": broadcast}[mode]
    async with websockets.serve(handler, host, port, compression=None, ping_interval=None,
                                max_size=None):
        print(f"websockets {mode} listening on {host}:{port}", flush=True)
        await asyncio.Future()


async def picows_server(mode, host, port, extra):
    import picows

    subscribers = set()

    class Echo(picows.WSListener):
        def on_ws_connected(self, transport):
            if mode == "broadcast":
                subscribers.add(transport)

        def on_ws_disconnected(self, transport):
            subscribers.discard(transport)

        def on_ws_frame(self, transport, frame):
            if frame.msg_type == picows.WSMsgType.CLOSE:
                transport.send_close(frame.get_close_code())
                transport.disconnect()
            elif frame.msg_type in (picows.WSMsgType.TEXT, picows.WSMsgType.BINARY):
                if mode == "echo":
                    transport.send(frame.msg_type, frame.get_payload_as_memoryview())
                elif mode == "broadcast":
                    subscribers.discard(transport)
                    payload = frame.get_payload_as_bytes()
                    for subscriber in subscribers:
                        subscriber.send(frame.msg_type, payload)
            elif frame.msg_type == picows.WSMsgType.PING:
                transport.send_pong(frame.get_payload_as_bytes())

    server = await picows.ws_create_server(lambda _request: Echo(), host, port)
    print(f"picows {mode} listening on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main():
    impl, mode, at = sys.argv[1:4]
    extra = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    host, port = at.rsplit(":", 1)
    run = {"freeboard": freeboard_server, "freeboard-listener": freeboard_listener_server,
           "websockets": websockets_server, "picows": picows_server}[impl]
    asyncio.run(run(mode, host, int(port), extra))


if __name__ == "__main__":
    main()
