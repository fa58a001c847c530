"""Live commentary: fans follow ws://HOST:PORT/match/ID; the commentator (?commentator=SECRET)
sends lines, each published to every fan, framed once; a slow fan loses the oldest (counted)."""
import asyncio, json, os, re, urllib.parse

import freeboard

SECRET = os.environ.get("COMMENTATOR_SECRET", "let-me-talk")

async def handler(ws):
    url = urllib.parse.urlsplit(ws.path)
    match = re.fullmatch(r"/match/(\w+)", url.path)
    if not match:
        return await ws.close(4404, "no such match")
    topic = f"match:{match[1]}"
    if urllib.parse.parse_qs(url.query).get("commentator") != [SECRET]:
        ws.subscribe(topic)  # a fan: every line from now on
        return await ws.wait_closed()
    async for line in ws:
        delivered, dropped = server.publish(topic, line)
        await ws.send(json.dumps({"delivered": delivered, "dropped": dropped}))


async def main():
    global server
    async with freeboard.serve(handler, "0.0.0.0", int(os.environ.get("PORT", 8080)), memory="256M",
                               slow_consumer="drop-oldest", max_backpressure="256K",
                               max_connections_per_ip=5000) as server:
        print(f"live commentary on ws://localhost:{server.port}/match/ID", flush=True)
        await server.serve_forever()
asyncio.run(main())
