#!/usr/bin/env python3
"""What the plugin costs a suite that does not ask for it (installed, inert).

Runs ``pytest --co -q -p no:cacheprovider`` on a tiny suite of its own (one test file in a
temporary directory, no ini file, no ``SPARK_*`` variables) with the plugin installed and
with ``-p no:spark``, alternating, and prints the median wall time of each and their
ratio. Goal: the inert plugin adds no more than a few per cent (it imports its options and
activation check only; paramiko, httpx and the rest wait until a cluster is asked for).
Note: testinfra's own pytest plugin (entry point ``testinfra``) imports testinfra in both
columns: that is not ours.

    .venv/bin/python benchmarks/plugin_import.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def wall(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="runs per column (default 15)")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    # As on a user's machine: byte code cached (the warm-up run writes it), so both columns
    # time imports, not compiling every module (and pytest's assertion rewriting) again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    base = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"]
    with tempfile.TemporaryDirectory(prefix="spark-import-") as tmp:
        root = Path(tmp)
        (root / "test_tiny.py").write_text("def test_tiny():\n    assert True\n")
        columns: dict[str, list[float]] = {"installed": [], "-p no:spark": []}
        wall(base, root, env)  # warm the page cache and the .pyc files
        for _ in range(args.runs):
            columns["installed"].append(wall(base, root, env))
            columns["-p no:spark"].append(wall([*base, "-p", "no:spark"], root, env))
    installed = statistics.median(columns["installed"])
    without = statistics.median(columns["-p no:spark"])
    print(f"pytest --co -q on a one-test suite, median of {args.runs} runs")
    print(f"{'plugin installed (inert)':<28}{installed * 1000:>9.0f} ms")
    print(f"{'-p no:spark':<28}{without * 1000:>9.0f} ms")
    print(f"{'ratio installed / no:spark':<28}{installed / without:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
