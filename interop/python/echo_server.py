"""A peer server for freeboard's client interop tests, on the `websockets` library.

    python3 echo_server.py [PORT]     # prints "listening PORT" once ready (PORT 0: any free port)

Paths:
  /echo                  echoes every message, text as text, binary as binary
  /fragment?n=K          echoes every message in K fragments with a ping before each fragment
  /jsonrpc               answers JSON-RPC 2.0 requests ({"result": params}), out of order:
                         every request is handled by its own task after a random short delay
"""

import asyncio
import json
import random
import sys
from urllib.parse import parse_qs, urlparse

from websockets.asyncio.server import serve
from websockets.protocol import State


def fragments(message, n):
    size = max(1, -(-len(message) // n))
    parts = [message[i : i + size] for i in range(0, len(message), size)] or [message]
    while len(parts) < n:
        parts.append(message[:0])
    return parts


async def echo(ws):
    async for message in ws:
        await ws.send(message)


async def fragment(ws, n):
    async for message in ws:
        parts = fragments(message, n)

        async def pieces():
            for part in parts:
                # ws.ping() waits for the fragmented message to end; the sans-I/O layer
                # interleaves the ping between fragments, as RFC 6455 §5.4 allows.
                if ws.protocol.state is State.OPEN:
                    ws.protocol.send_ping(b"interleaved")
                    ws.send_data()
                yield part

        await ws.send(pieces())


async def jsonrpc(ws):
    tasks = set()

    async def answer(text):
        request = json.loads(text)
        await asyncio.sleep(random.random() * 0.005)
        reply = {"jsonrpc": "2.0", "id": request["id"], "result": request.get("params")}
        await ws.send(json.dumps(reply))

    async for message in ws:
        task = asyncio.create_task(answer(message))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks, return_exceptions=True)


async def handler(ws):
    url = urlparse(ws.request.path)
    if url.path == "/fragment":
        n = int(parse_qs(url.query).get("n", ["2"])[0])
        await fragment(ws, n)
    elif url.path == "/jsonrpc":
        await jsonrpc(ws)
    else:
        await echo(ws)


async def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    async with serve(handler, "127.0.0.1", port, max_size=64 << 20, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"listening {port}", flush=True)
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
