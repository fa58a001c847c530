#!/usr/bin/env python3
"""Sends one large binary message to the echo server while reading the echo concurrently, and
checks it: the case Autobahn's 9.1.6/9.2.6 make, with a client that reads while it writes.

    embedded/big-echo.py [--target 127.0.0.1:19380] [--mib 16]
"""
import argparse
import importlib.util
import sys
import threading
import time
from pathlib import Path

spec = importlib.util.spec_from_file_location("led_load", Path(__file__).with_name("led-load.py"))
led_load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(led_load)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="127.0.0.1:19380")
    ap.add_argument("--mib", type=int, default=16)
    args = ap.parse_args()
    client = led_load.Client(0, argparse.Namespace(target=args.target, size=16, fps=1))
    data = bytes(range(256)) * (args.mib << 12)
    start = time.monotonic()
    writer = threading.Thread(target=client.sock.sendall, args=(led_load.frame(0x2, data),))
    writer.start()
    echo = bytearray()
    while True:
        fin, _, piece = client.read_frame()
        echo += piece
        if fin:
            break
    writer.join()
    seconds = time.monotonic() - start
    ok = bytes(echo) == data
    print(f"{args.mib} MiB echoed {'intact' if ok else 'CORRUPTED'} in {seconds:.2f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
