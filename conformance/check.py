#!/usr/bin/env python3
"""Gate an Autobahn (kosoku) run on its index.json against checked-in expected results.

    check.py REPORT_DIR EXPECTED_JSON [--update] [--subset]

Every case's `behavior` and `behaviorClose` must equal the expected ones, and the expected
ones may only be OK or INFORMATIONAL: a regression, a new failure or a missing case fails.
`--update` rewrites EXPECTED_JSON from the run (review the diff before committing it).
`--subset` checks only the cases the run selected (a CI subset of a longer checked-in run).
"""
import json
import sys
from collections import Counter
from pathlib import Path

ACCEPTED = {"OK", "INFORMATIONAL"}


def case_key(case_id: str):
    return tuple(int(part) for part in case_id.split("."))


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    report_dir, expected_path = Path(args[0]), Path(args[1])
    index_path = report_dir / "index.json"
    if not index_path.exists():
        print(f"no {index_path}: the run did not finish (timed out or crashed)", file=sys.stderr)
        return 1
    index = json.loads(index_path.read_text())
    if len(index) != 1:
        print(f"expected one agent in {index_path}, found {sorted(index)}", file=sys.stderr)
        return 1
    (agent, cases), = index.items()
    actual = {
        case: {"behavior": r["behavior"], "behaviorClose": r["behaviorClose"]}
        for case, r in sorted(cases.items(), key=lambda kv: case_key(kv[0]))
    }
    tally = Counter(r["behavior"] for r in actual.values())
    print(f"{agent}: {len(actual)} cases: " + ", ".join(f"{n} {b}" for b, n in sorted(tally.items())))

    if "--update" in sys.argv:
        expected_path.write_text(json.dumps(actual, indent=1) + "\n")
        print(f"wrote {expected_path}")
        return 0

    expected = json.loads(expected_path.read_text())
    if "--subset" in sys.argv:
        expected = {case: want for case, want in expected.items() if case in actual}
    problems = []
    for case, want in expected.items():
        bad = {k: v for k, v in want.items() if v not in ACCEPTED}
        if bad:
            problems.append(f"{case}: expected results may only be OK/INFORMATIONAL, found {bad}")
        got = actual.get(case)
        if got is None:
            problems.append(f"{case}: missing from the run")
        elif got != want:
            problems.append(f"{case}: expected {want}, got {got}")
    for case in actual.keys() - expected.keys():
        problems.append(f"{case}: not in {expected_path.name} ({actual[case]})")
    for problem in problems:
        print("  " + problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} case(s) differ from {expected_path}", file=sys.stderr)
        return 1
    print(f"all {len(actual)} cases match {expected_path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
