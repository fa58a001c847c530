#!/usr/bin/env python3
"""Hostile clients against the bare-metal echo server: each attack must get its defined answer
(an HTTP status or a close code), and the firmware must keep serving afterwards.

    embedded/hostile.py [--target 127.0.0.1:19380] [--sockets 16]

Attacks: bytes that are not HTTP (400), a head that never ends (431), a plain GET (426), an
unmasked client frame (1002), a 2^63-byte length (1002), invalid UTF-8 (1007), a reset in the
middle of a frame, a peer that sends 2 MiB without reading and only then reads every echo back,
and more connections at once than the firmware has sockets (beyond what the pool admits: 503). Exits 1 on the first surprise.
"""
import argparse
import importlib.util
import socket
import struct
import sys
import time
from pathlib import Path

spec = importlib.util.spec_from_file_location("led_load", Path(__file__).with_name("led-load.py"))
led_load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(led_load)


def raw(target, data, read_for=2.0):
    """Sends `data` on a fresh connection and returns what came back until EOF or `read_for`."""
    host, port = target.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=read_for) as s:
        s.sendall(data)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (socket.timeout, ConnectionResetError):
            pass
        return got


def ws(target):
    return led_load.Client(0, argparse.Namespace(target=target, size=16, fps=1))


def close_code(client):
    """Reads frames until a close frame; returns its code."""
    while True:
        _, opcode, data = client.read_frame()
        if opcode == 0x8:
            return struct.unpack(">H", data[:2])[0] if len(data) >= 2 else 1005


def check(name, ok, detail=""):
    print(f"  {'ok' if ok else 'FAILED'}: {name}{' (' + detail + ')' if detail else ''}", flush=True)
    if not ok:
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="127.0.0.1:19380")
    ap.add_argument("--sockets", type=int, default=16, help="the firmware's socket count")
    ap.add_argument("--admits", type=int, default=31, help="connections the firmware's pool admits")
    args = ap.parse_args()
    t = args.target

    got = raw(t, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(200) + b"\r\n\r\n")
    check("a TLS hello is answered 400", got.startswith(b"HTTP/1.1 400"), got[:20].decode("latin1"))
    got = raw(t, b"GET / HTTP/1.1\r\nX: " + b"a" * 3000)
    check("an endless head is answered 431", got.startswith(b"HTTP/1.1 431"), got[:20].decode("latin1"))
    got = raw(t, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    check("a plain GET is answered 426", got.startswith(b"HTTP/1.1 426"), got[:20].decode("latin1"))

    c = ws(t)
    c.sock.sendall(b"\x82\x03abc")
    check("an unmasked frame is closed 1002", close_code(c) == 1002)
    c = ws(t)
    c.sock.sendall(b"\x82\xff" + struct.pack(">Q", 1 << 63) + b"\x00\x00\x00\x00")
    code = close_code(c)
    check("a 2^63-byte length is closed 1002 or 1009", code in (1002, 1009), str(code))
    c = ws(t)
    c.sock.sendall(led_load.frame(0x1, b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80"))
    code = close_code(c)
    check("invalid UTF-8 is closed 1007", code == 1007, str(code))

    c = ws(t)
    c.sock.sendall(led_load.frame(0x2, bytes(5000))[:3000])
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.sock.close()  # a reset in the middle of a frame
    check("a reset mid-frame is survived", True)

    c = ws(t)
    c.sock.settimeout(60)
    message = bytes(range(256)) * 64  # 16 KiB
    count = 128
    c.sock.sendall(b"".join(led_load.frame(0x2, message) for _ in range(count)))
    time.sleep(2)  # not reading: the firmware's queue fills, then it stops reading (TCP window)
    intact = 0
    buf = bytearray()
    for _ in range(count):
        while True:
            fin, opcode, data = c.read_frame()
            buf += data
            if fin:
                break
        intact += bytes(buf) == message
        buf.clear()
    check(f"a peer that sent 2 MiB without reading gets its {count} echoes intact",
          intact == count, f"{intact} intact")
    c.sock.sendall(led_load.frame(0x8, struct.pack(">H", 1000)))
    check("and a clean close", close_code(c) == 1000)

    crowd, busy, refused = [], 0, 0
    for _ in range(args.sockets + 4):
        try:
            crowd.append(ws(t))
        except ConnectionError as e:
            busy += " 503 " in str(e)
            refused += " 503 " not in str(e)
        except OSError:
            refused += 1  # no socket left: smoltcp resets the SYN
    limit = min(args.sockets, args.admits)
    # A socket or a reserve may still be held by the previous attack's connection.
    check(f"{args.sockets + 4} connections at once: {len(crowd)} upgraded, {busy} answered 503 "
          f"(pool full), {refused} reset (no socket)",
          limit - 2 <= len(crowd) <= limit and (busy > 0) == (args.admits < args.sockets))
    for c in crowd:
        c.sock.close()
    time.sleep(1)

    c = ws(t)
    c.sock.sendall(led_load.frame(0x1, b"still here"))
    _, opcode, data = c.read_frame()
    check("the firmware still echoes", (opcode, data) == (0x1, b"still here"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
