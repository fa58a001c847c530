#!/usr/bin/env python3
"""The LED workload against an echo server: CLIENTS connections, each sending SIZE-byte binary
frames at FPS for DURATION seconds, every echo checked byte for byte and in order.

    embedded/led-load.py [--target 127.0.0.1:19380] [--clients 2] [--fps 60] [--size 960]
                         [--duration 600]

Each frame carries its sequence number and send time, then a pattern derived from both, so a
lost, duplicated, reordered or corrupted echo is caught. Frames go out on a fixed schedule
(frame n at start + n/FPS, never in bursts to catch up more than one frame). After DURATION the
clients stop sending, wait up to 10 s for the echoes still in flight, and close with 1000.
Prints one line per client and a summary; exits 1 unless every frame sent came back intact and
every close handshake completed. Standard library only; talks only to the given address.
"""
import argparse
import base64
import hashlib
import json
import os
import socket
import struct
import sys
import threading
import time

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def payload(seq: int, sent_ns: int, size: int) -> bytes:
    head = struct.pack(">QQ", seq, sent_ns)
    body = bytes((seq + i) & 0xFF for i in range(256))
    fill = (body * (size // 256 + 1))[: size - len(head)]
    return head + fill


def mask(data: bytes, key: bytes) -> bytes:
    n = len(data)
    k = int.from_bytes((key * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(data, "big") ^ k).to_bytes(n, "big")


def frame(opcode: int, data: bytes) -> bytes:
    key = os.urandom(4)
    n = len(data)
    if n < 126:
        head = struct.pack(">BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        head = struct.pack(">BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack(">BBQ", 0x80 | opcode, 0x80 | 127, n)
    return head + key + mask(data, key)


class Client:
    def __init__(self, index, args):
        self.index = index
        self.args = args
        self.sent = 0
        self.received = 0
        self.bad = []  # descriptions of wrong echoes
        self.latencies = []
        self.closed_clean = False
        self.error = None
        self.done_sending = threading.Event()
        self.lock = threading.Lock()
        host, port = args.target.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16))
        self.sock.sendall(
            b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: " + key + b"\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            head += chunk
        head, self.buf = head.split(b"\r\n\r\n", 1)
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        if not head.startswith(b"HTTP/1.1 101") or accept not in head:
            raise ConnectionError(f"handshake refused: {head[:80]!r}")
        self.sock.settimeout(None)

    def send_loop(self, start, frames):
        period = 1.0 / self.args.fps
        try:
            for seq in range(frames):
                due = start + seq * period
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                data = payload(seq, time.monotonic_ns(), self.args.size)
                self.sock.sendall(frame(0x2, data))
                with self.lock:
                    self.sent += 1
        except OSError as e:
            self.error = f"send: {e}"
        self.done_sending.set()

    def read_exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_frame(self):
        b0, b1 = self.read_exact(2)
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack(">H", self.read_exact(2))
        elif n == 127:
            (n,) = struct.unpack(">Q", self.read_exact(8))
        if b1 & 0x80:
            raise ConnectionError("the server masked a frame")
        return b0 & 0x80, b0 & 0x0F, self.read_exact(n)

    def read_loop(self):
        """Reassembles echoed messages (the server may fragment them) and checks each."""
        expected = 0
        message = None
        try:
            while True:
                fin, opcode, data = self.read_frame()
                if opcode == 0x8:
                    self.closed_clean = data[:2] == b"\x03\xe8"
                    return
                if opcode in (0x9, 0xA):
                    continue
                if opcode in (0x1, 0x2):
                    if message is not None:
                        self.bad.append("new message inside a fragmented one")
                    message = bytearray(data)
                    kind = opcode
                elif opcode == 0x0 and message is not None:
                    message += data
                else:
                    self.bad.append(f"unexpected opcode {opcode}")
                    continue
                if not fin:
                    continue
                got = bytes(message)
                message = None
                now = time.monotonic_ns()
                if kind != 0x2 or len(got) < 16:
                    self.bad.append(f"echo {expected}: kind {kind}, {len(got)} bytes")
                    continue
                seq, sent_ns = struct.unpack(">QQ", got[:16])
                if seq != expected or got != payload(seq, sent_ns, self.args.size):
                    self.bad.append(f"echo {expected}: got sequence {seq}, intact={got == payload(seq, sent_ns, self.args.size)}")
                expected = seq + 1
                with self.lock:
                    self.received += 1
                    self.latencies.append((now - sent_ns) / 1e6)
        except (OSError, ConnectionError) as e:
            if self.error is None:
                self.error = f"read: {e}"


def percentile(values, p):
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="127.0.0.1:19380", help="host:port of the echo server")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--fps", type=int, default=60)
    ap.add_argument("--size", type=int, default=960)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of sending")
    ap.add_argument("--json", help="write the summary as JSON to this file")
    args = ap.parse_args()
    if args.size < 16:
        ap.error("--size must be at least 16 (sequence number and timestamp)")

    clients = [Client(i, args) for i in range(args.clients)]
    frames = int(args.duration * args.fps)
    start = time.monotonic() + 0.1
    readers = [threading.Thread(target=c.read_loop, daemon=True) for c in clients]
    senders = [threading.Thread(target=c.send_loop, args=(start, frames), daemon=True) for c in clients]
    for t in readers + senders:
        t.start()
    last = time.monotonic()
    while any(s.is_alive() for s in senders):
        time.sleep(0.5)
        if time.monotonic() - last >= 10:
            last = time.monotonic()
            done = ", ".join(f"{c.sent}/{c.received}" for c in clients)
            print(f"  t={last - start:5.0f} s  sent/received per client: {done}", flush=True)
    send_end = time.monotonic()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(c.received < c.sent for c in clients):
        time.sleep(0.05)
    for c in clients:
        try:
            c.sock.sendall(frame(0x8, struct.pack(">H", 1000)))
        except OSError as e:
            c.error = c.error or f"close: {e}"
    for t in readers:
        t.join(timeout=5)
    for c in clients:
        c.sock.close()

    ok = True
    summary = {"clients": args.clients, "fps": args.fps, "size": args.size,
               "seconds": round(send_end - start, 1), "per_client": []}
    for c in clients:
        good = c.sent == c.received == frames and not c.bad and c.closed_clean and c.error is None
        ok &= good
        row = {"sent": c.sent, "received": c.received, "bad": len(c.bad),
               "closed_clean": c.closed_clean, "error": c.error,
               "latency_ms_p50": round(percentile(c.latencies, 50), 2),
               "latency_ms_p99": round(percentile(c.latencies, 99), 2),
               "latency_ms_max": round(max(c.latencies, default=0.0), 2),
               "later_than_a_frame": sum(l > 1000 / args.fps for l in c.latencies)}
        summary["per_client"].append(row)
        print(f"client {c.index}: sent {c.sent}, received {c.received} intact and in order "
              f"({len(c.bad)} wrong), latency p50 {row['latency_ms_p50']} ms, p99 "
              f"{row['latency_ms_p99']} ms, max {row['latency_ms_max']} ms, "
              f"{row['later_than_a_frame']} later than a frame period, clean close: "
              f"{c.closed_clean}{', error: ' + c.error if c.error else ''}")
        for problem in c.bad[:5]:
            print(f"  {problem}")
    sent = sum(c.sent for c in clients)
    received = sum(c.received for c in clients)
    summary.update(sent=sent, received=received, ok=ok)
    print(f"LED run: {args.clients} clients x {args.size} B x {args.fps} FPS for "
          f"{summary['seconds']} s: {sent} frames sent, {received} echoed intact "
          f"-> {'every frame accounted for' if ok else 'FAILED'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
