#!/usr/bin/env python3
"""The whole suite against sparksim, as the README runs it, side by side: the functional
serving checks one request at a time (``--spark-serving-concurrency=1``, the suite before
issue #27) and sent ahead together (the default: every functional module's at once, 16 in
flight), alternating, in one run. Prints each run's
wall time, the functional categories' summed check time, and the ratios.

    sudo .venv/bin/python benchmarks/suite_time.py [--rounds N] [pytest args...]

Each run is a whole ``pytest --spark-sim`` session (the sim brought up and torn down by the
plugin); the two settings alternate so that a machine's drift (other work on its 2 cores)
falls on both.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FUNCTIONAL = ("tool_calls", "reasoning", "structured_output")


def run(concurrency: int, extra: list[str], out: Path) -> tuple[float, float, int, str]:
    results = out / f"results-{concurrency}-{time.monotonic_ns()}.json"
    argv = [
        str(REPO / ".venv" / "bin" / "pytest"),
        "-p",
        "no:cacheprovider",
        "-q",
        "--spark-sim",
        f"--spark-serving-concurrency={concurrency}",
        f"--spark-results={results}",
        "--spark-history=off",
        *extra,
    ]
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - t0
    doc = json.loads(results.read_text()) if results.exists() else {"checks": []}
    functional = sum(
        c.get("duration_s") or 0.0 for c in doc["checks"] if c["category"] in FUNCTIONAL
    )
    # pytest's own last line ("1 failed, 24 passed in 5.10s"; the verdict line follows it)
    lines = proc.stdout.strip().splitlines() or ["(no output)"]
    last = next(
        (ln for ln in reversed(lines) if re.search(r" in [0-9.]+s( \([0-9:]+\))?( =+)?$", ln)),
        lines[-1],
    )
    return wall, functional, proc.returncode, last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args, extra = parser.parse_known_args()
    walls: dict[int, list[float]] = {1: [], 16: []}
    funcs: dict[int, list[float]] = {1: [], 16: []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for n in (1, 16):
                wall, functional, ret, last = run(n, extra, Path(tmp))
                walls[n].append(wall)
                funcs[n].append(functional)
                print(
                    f"concurrency {n}: whole suite {wall:6.1f} s, functional checks "
                    f"{functional:5.1f} s, exit {ret}: {last}",
                    flush=True,
                )
    before, after = statistics.median(walls[1]), statistics.median(walls[16])
    fb, fa = statistics.median(funcs[1]), statistics.median(funcs[16])
    print(f"whole suite: before {before:.1f} s, after {after:.1f} s: {after / before:.2f}x")
    print(f"functional checks: before {fb:.1f} s, after {fa:.1f} s: {fa / max(fb, 1e-9):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
