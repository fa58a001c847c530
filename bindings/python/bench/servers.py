"""The benchmark servers of the Python comparison, one process each:

    python servers.py freeboard|websockets|picows echo|idle HOST:PORT

``echo`` sends every message back as it came; ``idle`` holds connections. Each is the
library's ordinary usage: freeboard and websockets with a handler coroutine per connection,
picows with its listener callbacks (it has no per-connection coroutine)."""

import asyncio
import sys


async def freeboard_server(mode, host, port):
    import freeboard

    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async def idle(ws):
        await ws.wait_closed()

    handler = echo if mode == "echo" else idle
    async with freeboard.serve(handler, host, port, memory="1G", max_connections=100000,
                               max_connections_per_ip=100000, idle_timeout=None):
        print(f"freeboard-python {mode} listening on {host}:{port}", flush=True)
        await asyncio.Future()


async def websockets_server(mode, host, port):
    import websockets

    async def echo(ws):
        async for message in ws:
            await ws.send(message)

    async def idle(ws):
        await ws.wait_closed()

    handler = echo if mode == "echo" else idle
    async with websockets.serve(handler, host, port, compression=None, ping_interval=None,
                                max_size=None):
        print(f"websockets {mode} listening on {host}:{port}", flush=True)
        await asyncio.Future()


async def picows_server(mode, host, port):
    import picows

    class Echo(picows.WSListener):
        def on_ws_frame(self, transport, frame):
            if frame.msg_type == picows.WSMsgType.CLOSE:
                transport.send_close(frame.get_close_code())
                transport.disconnect()
            elif frame.msg_type in (picows.WSMsgType.TEXT, picows.WSMsgType.BINARY) and mode == "echo":
                transport.send(frame.msg_type, frame.get_payload_as_memoryview())
            elif frame.msg_type == picows.WSMsgType.PING:
                transport.send_pong(frame.get_payload_as_bytes())

    server = await picows.ws_create_server(lambda _request: Echo(), host, port)
    print(f"picows {mode} listening on {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main():
    impl, mode, at = sys.argv[1:4]
    host, port = at.rsplit(":", 1)
    run = {"freeboard": freeboard_server, "websockets": websockets_server,
           "picows": picows_server}[impl]
    asyncio.run(run(mode, host, int(port)))


if __name__ == "__main__":
    main()
