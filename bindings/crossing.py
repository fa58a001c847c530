#!/usr/bin/env python3
"""What the crossing into JavaScript or Python costs: the echo's server CPU per message of
`freeboard serve --threads 1` (the engine with a Rust handler) beside the same engine under
each binding, same machine, same run, the servers interleaved round by round.

    python3 bindings/crossing.py [--rounds 3] [--duration 5] [--json FILE]

Uses the comparison scripts of both bindings (bindings/node/bench/compare.py,
bindings/python/bench/compare.py: their servers and `freeboard bench pipeline`, 4 clients x 64
in flight, 64 B and 1 KiB); builds the CLI, the addon and the venv as they do. Every server is
one process on 127.0.0.1, killed by its PID after its measurement. Prints medians with
[min-max] and the ratio to `freeboard serve` per round.
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


node = load("node_compare", os.path.join(HERE, "node", "bench", "compare.py"))
python = load("python_compare", os.path.join(HERE, "python", "bench", "compare.py"))


def rust_echo(duration):
    port = python.free_port()
    argv = [python.FREEBOARD, "serve", "--listen", f"127.0.0.1:{port}", "--threads", "1",
            "--memory", "1G"]
    running = python.Running(argv, port)
    try:
        report = python.bench(["pipeline", running.url(), "--server-pid", str(running.proc.pid),
                               "--clients", "4", "--in-flight", "64", "--size", "64,1024",
                               "--duration", str(duration)])
    finally:
        running.stop()
    out = {}
    for load_ in report["loads"]:
        out[f"echo {load_['size']} B msg/s"] = load_["msgs_per_sec"]["median"]
        out[f"echo {load_['size']} B server CPU µs/msg"] = load_["server_cpu_us_per_msg"]["median"]
    return out


SERVERS = {
    "freeboard serve": rust_echo,
    "Node, a WebSocket each": lambda d: node.echo("freeboard-node", d),
    "Node, by id": lambda d: node.echo("freeboard-node-ids", d),
    "Python, serve": lambda d: python.echo("freeboard-python", d),
    "Python, serve_listener": lambda d: python.echo("freeboard-listener", d),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--json", help="write every figure of every round here")
    args = parser.parse_args()
    root = os.path.dirname(HERE)
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "freeboard-cli"], cwd=root,
                   check=True)
    if not os.path.exists(os.path.join(HERE, "node", "freeboard.node")):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=os.path.join(HERE, "node"),
                       check=True)
    if not os.path.exists(python.PYTHON):
        raise SystemExit("run bindings/python/bench/compare.py once first (it makes the venv)")
    rounds = {name: [] for name in SERVERS}
    for r in range(args.rounds):
        for name, run in SERVERS.items():
            print(f"round {r + 1}/{args.rounds}: {name}", flush=True)
            rounds[name].append(run(args.duration))
    rust = rounds["freeboard serve"]
    print("\n| figure | " + " | ".join(SERVERS) + " |")
    print("|---" * (len(SERVERS) + 1) + "|")
    for key in rust[0]:
        cells = []
        for name in SERVERS:
            values = [figures[key] for figures in rounds[name]]
            ratios = [v / r[key] for v, r in zip(values, rust)]
            cell = f"{statistics.median(values):.3g} [{min(values):.3g}–{max(values):.3g}]"
            if name != "freeboard serve":
                cell += f", ×{statistics.median(ratios):.3g}"
            cells.append(cell)
        print(f"| {key} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rounds, f, indent=1)


if __name__ == "__main__":
    main()
