#!/usr/bin/env python3
"""freeboard for Python beside websockets and picows, same machine, same run, measured by
`freeboard bench`.

    python3 bindings/python/bench/compare.py [--rounds 3] [--duration 5] [--quick] [--json FILE]
                                             [--figures echo,broadcast,idle,slow]

Builds what it needs (the `freeboard` CLI in release; a venv in bindings/python/.venv with
this package, websockets and picows from PyPI), then runs --rounds rounds; each round starts
every server in turn (interleaved, so a change in the machine's load falls on all) for:
  echo       `freeboard bench pipeline`: 4 clients x 64 in flight, 64 B and 1 KiB:
             msg/s and server CPU per message
  broadcast  `freeboard bench broadcast`: one publisher, 1,000 and 10,000 subscribers, 64 B:
             deliveries/s
  idle       `freeboard bench connections`: 10,000 idle connections: server RSS per
             connection, and RSS once they have closed against RSS before
  slow       `freeboard bench slow-consumer`: one client writes 1 KiB messages to the echo
             server and never reads: the server's RSS at the end against the start
The servers: freeboard-python (`serve`, a handler coroutine per connection),
freeboard-listener (`serve_listener`, one listener's callbacks), websockets and picows.
Every server is one asyncio process (bench/servers.py); each is killed by its PID after its
measurement. Figures are medians with [min-max] over the rounds, and freeboard/peer ratios per
round.
Loopback only (127.0.0.1).
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PY_DIR = os.path.join(ROOT, "bindings", "python")
VENV = os.path.join(PY_DIR, ".venv")
PYTHON = os.path.join(VENV, "bin", "python")
FREEBOARD = os.path.join(ROOT, "target", "release", "freeboard")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class Running:
    """A server process started for one measurement; killed by its PID."""

    def __init__(self, argv, port):
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL)
        self.port = port
        wait_listening(port)

    def url(self, path="/"):
        return f"ws://127.0.0.1:{self.port}{path}"

    def stop(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def start(server, mode):
    port = free_port()
    at = f"127.0.0.1:{port}"
    impl = server.replace("freeboard-python", "freeboard")
    argv = [PYTHON, os.path.join(PY_DIR, "bench", "servers.py"), impl, mode, at]
    return Running(argv, port)


def bench(args, timeout=900):
    """Runs `freeboard bench ARGS --json FILE`; the report."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [FREEBOARD, "bench", *args, "--repeat", "1", "--json", out.name]
        subprocess.run(cmd, cwd=ROOT, check=True, timeout=timeout, stdout=subprocess.DEVNULL)
        with open(out.name) as f:
            return json.load(f)


def echo(server, duration):
    running = start(server, "echo")
    try:
        report = bench(["pipeline", running.url(), "--server-pid", str(running.proc.pid),
                        "--clients", "4", "--in-flight", "64", "--size", "64,1024",
                        "--duration", str(duration)])
    finally:
        running.stop()
    out = {}
    for load in report["loads"]:
        out[f"echo {load['size']} B msg/s"] = load["msgs_per_sec"]["median"]
        out[f"echo {load['size']} B server CPU µs/msg"] = load["server_cpu_us_per_msg"]["median"]
    return out


def broadcast(server, subscribers):
    counts = ",".join(str(n) for n in subscribers)
    common = ["--subscribers", counts, "--size", "64"]
    running = start(server, "broadcast")
    try:
        report = bench(["broadcast", running.url("/topic/bench"), "--server-pid",
                        str(running.proc.pid), *common])
    finally:
        running.stop()
    return {f"broadcast {row['subscribers']} deliveries/s": row["deliveries_per_sec"]
            for row in report["broadcasts"]}


def idle(server, count):
    running = start(server, "idle")
    try:
        report = bench(["connections", running.url(), "--server-pid", str(running.proc.pid),
                        "--counts", str(count), "--cycles", "1"])
    finally:
        running.stop()
    step = report["connections"][0]["steps"][-1]
    return {
        f"idle {count} KiB/conn": step["kib_per_conn"],
        f"idle {count} RSS after close / before": step["rss_closed_kib"] / step["rss_before_kib"],
        f"idle {count} RSS after close - before MiB":
            (step["rss_closed_kib"] - step["rss_before_kib"]) / 1024,
    }


def slow(server, duration):
    running = start(server, "echo")
    try:
        report = bench(["slow-consumer", running.url(), "--server-pid", str(running.proc.pid),
                        "--duration", str(duration)])
    finally:
        running.stop()
    _, row = report["slow_consumers"][0]
    rss = [r for r in row["rss_kib"] if r]
    return {"slow reader RSS growth MiB": (max(rss) - rss[0]) / 1024,
            "slow reader verdict": row["verdict"]}


def summary(values):
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return "–"
    med = statistics.median(values)
    fmt = (lambda v: f"{v:,.0f}") if abs(med) >= 100 else (lambda v: f"{v:.3g}")
    return f"{fmt(med)} [{fmt(min(values))}–{fmt(max(values))}]"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="1 round, 2 s runs, 1,000 idle")
    parser.add_argument("--json", help="write every figure of every round here")
    parser.add_argument("--figures", default="echo,broadcast,idle,slow",
                        help="which measurements (comma-separated), e.g. idle alone")
    args = parser.parse_args()
    figures_wanted = args.figures.split(",")
    if args.quick:
        args.rounds, args.duration = 1, 2.0
    subscribers = [1000] if args.quick else [1000, 10000]
    idle_count = 1000 if args.quick else 10000

    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "freeboard-cli"], cwd=ROOT, check=True)
    if not os.path.exists(PYTHON):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    subprocess.run([PYTHON, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    PY_DIR, "websockets==17.4", "picows==2.3.1"], check=True)

    ours = ["freeboard-python", "freeboard-listener"]
    peers = ["websockets", "picows"]
    servers = ours + peers
    rounds = []
    for r in range(args.rounds):
        figures = {s: {} for s in servers}
        for name, run in [("echo", lambda s: echo(s, args.duration)),
                          ("broadcast", lambda s: broadcast(s, subscribers)),
                          ("idle", lambda s: idle(s, idle_count)),
                          ("slow", lambda s: slow(s, 10 if not args.quick else 4))]:
            if name not in figures_wanted:
                continue
            for server in servers:
                print(f"round {r + 1}/{args.rounds}: {name} on {server}", file=sys.stderr, flush=True)
                figures[server].update(run(server))
        rounds.append(figures)

    keys = list(rounds[0]["freeboard-python"].keys())
    print(f"\n{len(rounds)} rounds, servers interleaved; median [min–max]\n")
    ratios = [(a, b) for a in ours for b in peers]
    print("| figure | " + " | ".join(servers) + " | "
          + " | ".join(f"{a} ÷ {b}" for a, b in ratios) + " |")
    print("|---" * (1 + len(servers) + len(ratios)) + "|")
    for key in keys:
        values = {s: [r[s].get(key) for r in rounds] for s in servers}
        if isinstance(values["freeboard-python"][0], str):
            print(f"| {key} | " + " | ".join(str(values[s][0]) for s in servers)
                  + " |" * (len(ratios) + 1))
            continue
        cells = [summary(values[s]) for s in servers]
        for a, b in ratios:
            cells.append(summary([x / y for x, y in zip(values[a], values[b])
                                  if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y]))
        print(f"| {key} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": rounds, "command": sys.argv}, f, indent=1)


if __name__ == "__main__":
    main()
