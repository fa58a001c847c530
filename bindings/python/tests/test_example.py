"""The live-commentary example as a user runs it (its own process), with 1,000 fans."""

import asyncio
import json
import os
import subprocess
import sys

import websockets

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "live_commentary.py")


def test_one_line_reaches_1000_fans_and_the_ack_says_so():
    env = dict(os.environ, PORT="0", COMMENTATOR_SECRET="s3cret")
    example = subprocess.Popen([sys.executable, EXAMPLE], env=env, stdout=subprocess.PIPE, text=True)
    try:
        port = int(example.stdout.readline().rsplit(":", 1)[1].split("/")[0])

        async def main():
            at = lambda path: f"ws://127.0.0.1:{port}{path}"  # noqa: E731
            fans = [await websockets.connect(at("/match/final")) for _ in range(1000)]
            other = await websockets.connect(at("/match/semi"))
            async with websockets.connect(at("/match/final?commentator=s3cret")) as commentator:
                await commentator.send("GOAL! 1-0")
                assert json.loads(await commentator.recv()) == {"delivered": 1000, "dropped": 0}
            for fan in fans:
                assert await asyncio.wait_for(fan.recv(), 10) == "GOAL! 1-0"
            try:
                await asyncio.wait_for(other.recv(), 0.1)
                raise AssertionError("a fan of another match heard it")
            except asyncio.TimeoutError:
                pass
            async with websockets.connect(at("/nowhere")) as refused:
                try:
                    await refused.recv()
                except websockets.ConnectionClosed as closed:
                    assert closed.rcvd.code == 4404
            for ws in fans + [other]:
                await ws.close()

        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        example.terminate()
        example.wait(10)
