"""Where an idle connection's bytes go, in one process: the server (``serve_listener`` or
``serve`` with a handler that waits for the close) holds N connections that a child process
opens with raw sockets and keeps open; per connection, the growth of

- RSS (``/proc/self/statm``; tracemalloc's own bookkeeping adds to it, the more so the
  more Python objects there are: ``compare.py``'s RSS figures run without it),
- malloc's bytes in use (glibc's ``mallinfo2``, mmapped blocks included): the engine's
  heap, and Python's blocks over 512 bytes,
- Python's objects (``tracemalloc``, every file),

measured after a warm-up of 200 connections opened and closed. Loopback only.

    python bench/idle_bytes.py listener|handler [N]
"""

import asyncio
import ctypes
import gc
import os
import subprocess
import sys
import tracemalloc

import freeboard

CLIENT = r"""
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
hs = (b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
socks = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(hs)
    assert s.recv(4096).startswith(b"HTTP/1.1 101")
    socks.append(s)
print("ready", flush=True)
sys.stdin.read()  # until the server's process says so
"""


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


LIBC = ctypes.CDLL("libc.so.6")
LIBC.mallinfo2.restype = MallInfo2


def sample():
    gc.collect()
    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    heap = LIBC.mallinfo2()
    return {"RSS": rss, "malloc in use": heap.uordblks + heap.hblkhd,
            "Python objects (tracemalloc)": tracemalloc.get_traced_memory()[0]}


async def main(model, count):
    tracemalloc.start(1)
    opened = [0]

    class Idle:
        def on_open(self, conn, request):
            opened[0] += 1

    async def idle(ws):
        opened[0] += 1
        await ws.wait_closed()

    settings = dict(memory="1G", max_connections=100000, max_connections_per_ip=100000,
                    idle_timeout=None)
    if model == "listener":
        server = await freeboard.serve_listener(Idle(), "127.0.0.1", 0, **settings)
    else:
        server = await freeboard.serve(idle, "127.0.0.1", 0, **settings)
    warm_up = 200
    for n, measured in ((warm_up, False), (count, True)):
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, str(server.port), str(n),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            before = sample()
            assert await client.stdout.readline() == b"ready\n"
            while opened[0] < n + (warm_up if measured else 0):
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # a few idle turns
            after = sample()
        finally:
            client.stdin.close()
            await client.wait()
        await asyncio.sleep(0.5)
    print(f"{model}, {count} idle connections, KiB per connection:")
    for key in before:
        print(f"  {key}: {(after[key] - before[key]) / count / 1024:.3f}")
    server.close()
    await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10000))
