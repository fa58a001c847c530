#!/usr/bin/env python3
"""freeboard for Node beside Node's ws, same machine, same run, measured by `freeboard bench`.

    python3 bindings/node/bench/compare.py [--rounds 3] [--duration 5] [--quick] [--json FILE]
                                           [--only echo,broadcast,idle,slow]

Builds what it needs (the `freeboard` CLI in release, the addon with `npm ci`), then runs
--rounds rounds; each round starts every server in turn (interleaved, so a change in the
machine's load falls on all) for:
  echo       `freeboard bench pipeline`: 4 clients x 64 in flight, 64 B and 1 KiB:
             msg/s and server CPU per message
  broadcast  `freeboard bench broadcast`: one publisher, 1,000 and 10,000 subscribers, 64 B:
             deliveries/s (ws: its peers/node-ws-broadcast setup, started by the bench)
  idle       `freeboard bench connections`: 10,000 idle connections: server RSS per
             connection, and RSS once they have closed against RSS before
  slow       `freeboard bench slow-consumer`: one client writes 1 KiB messages to the echo
             server and never reads: the server's RSS at the end against the start
The servers: freeboard-node with a `WebSocket` per connection (ws's model), freeboard-node
held by connection ids (handlers in the options, no JavaScript object per connection: the
`-ids` modes of server.js) and ws. Every server is a single Node process; each is killed by its PID after its measurement.
Figures are medians with [min-max] over the rounds, and freeboard/ws ratios per round.
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
NODE_DIR = os.path.join(ROOT, "bindings", "node")
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
        env = dict(os.environ, NODE_PATH=os.path.join(NODE_DIR, "node_modules"))
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
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
    if server == "freeboard-node":
        argv = ["node", os.path.join(NODE_DIR, "bench", "server.js"), mode, at]
    elif server == "freeboard-node-ids":
        argv = ["node", os.path.join(NODE_DIR, "bench", "server.js"), f"{mode}-ids", at]
    elif server == "ws":
        argv = ["node", os.path.join(ROOT, "peers", "node-ws", "server.js"), at]
    else:
        raise ValueError(server)
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
    if server == "ws":
        report = bench(["broadcast", "--peers", "node-ws-broadcast", *common])
    else:
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
    parser.add_argument("--only", default="echo,broadcast,idle,slow",
                        help="the measurements to run, comma-separated (default: all)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration = 1, 2.0
    subscribers = [1000] if args.quick else [1000, 10000]
    idle_count = 1000 if args.quick else 10000

    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "freeboard-cli"], cwd=ROOT, check=True)
    if not os.path.exists(os.path.join(NODE_DIR, "freeboard.node")):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True)

    servers = ["freeboard-node", "freeboard-node-ids", "ws"]
    only = set(args.only.split(","))
    rounds = []
    for r in range(args.rounds):
        figures = {s: {} for s in servers}
        for name, run in [("echo", lambda s: echo(s, args.duration)),
                          ("broadcast", lambda s: broadcast(s, subscribers)),
                          ("idle", lambda s: idle(s, idle_count)),
                          ("slow", lambda s: slow(s, 10 if not args.quick else 4))]:
            if name not in only:
                continue
            for server in servers:
                print(f"round {r + 1}/{args.rounds}: {name} on {server}", file=sys.stderr, flush=True)
                figures[server].update(run(server))
        rounds.append(figures)

    keys = list(rounds[0]["freeboard-node"].keys())
    ours = ["freeboard-node", "freeboard-node-ids"]
    print(f"\n{len(rounds)} rounds, servers interleaved; median [min–max]\n")
    print("| figure | " + " | ".join(servers) + " | " + " | ".join(f"{s} ÷ ws" for s in ours) + " |")
    print("|---" * (len(servers) + len(ours) + 1) + "|")
    for key in keys:
        values = {s: [r[s].get(key) for r in rounds] for s in servers}
        if isinstance(values["freeboard-node"][0], str):
            print(f"| {key} | " + " | ".join(str(values[s][0]) for s in servers) + " |" + " |" * len(ours))
            continue
        ratios = [[a / b for a, b in zip(values[s], values["ws"])
                   if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b] for s in ours]
        print(f"| {key} | " + " | ".join(summary(values[s]) for s in servers) + " | "
              + " | ".join(summary(r) for r in ratios) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": rounds, "command": sys.argv}, f, indent=1)


if __name__ == "__main__":
    main()
