"""Checked by mypy --strict only (scripts/test), never run: the typed API accepts what the
guide shows, as bindings/node/test/types.ts does for TypeScript."""

import freeboard


async def echo(ws: freeboard.ServerConnection) -> None:
    async for message in ws:
        outcome: str = await ws.send(message)
        print(outcome, ws.buffered_amount, ws.path, ws.request_headers, ws.close_code)
    ws.subscribe("scores", since=None)


class Room(freeboard.Listener):
    def on_open(self, conn: freeboard.Conn, request: freeboard.Request) -> None:
        conn.subscribe("room")
        print(request.path, request.headers, request.remote_address)

    def on_message(self, conn: freeboard.Conn, data: str | bytes) -> None:
        if conn.send(data) == "above-high":
            conn.pause_reading()

    def on_drain(self, conn: freeboard.Conn) -> None:
        conn.resume_reading()


async def allow(path: str, headers: list[tuple[str, str]]) -> int | None:
    return None if dict(headers).get("Authorization") else 401


async def main() -> None:
    async with freeboard.serve(echo, "127.0.0.1", 0, memory="64M",
                               process_request=allow) as server:
        reach: freeboard.Reach = server.publish("scores", "x")
        print(reach.delivered, reach.dropped, server.port, server.connections, server.metrics())
    listener = await freeboard.serve_listener(Room(), "127.0.0.1", 0, max_size="1M")
    listener.close()
    await listener.wait_closed()
    async with freeboard.connect("ws://localhost:8765/") as client:
        print(await client.send(b"x"), client.subprotocol, await client.recv())
    try:
        await (await freeboard.connect("ws://127.0.0.1:8765/")).close(4000, "bye")
    except (freeboard.InvalidHandshake, freeboard.ConnectionClosed) as error:
        print(error)
