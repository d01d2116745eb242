#!/usr/bin/env python3
"""Where a self-test tier's time goes, before and after: two JUnit XML files of the same
tier (``scripts/run-tests --tier suite --junitxml=FILE``), side by side.

Prints the session's wall time, the sum of the tests' own times (what one worker would
take), how many workers' worth of overlap the run got (sum / wall), and per module the
summed test time in each run with the ratio. Goal (issue #14): the whole ``.ci/run`` in at
most 25 minutes on 2 cores, the suite tier in about 13-14 of them::

    .venv/bin/python benchmarks/tier_times.py before.xml after.xml [--target-s 840]

A run cut short (fewer tests in one file) is compared over the modules both hold.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def read(path: Path) -> tuple[float, dict[str, float], int]:
    """(session wall s, per-module summed test s, tests) from a JUnit XML file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    wall = sum(float(s.get("time", 0)) for s in suites)
    modules: dict[str, float] = defaultdict(float)
    count = 0
    for case in root.iter("testcase"):
        module = (case.get("classname") or "?").split(".")[-1]
        modules[module] += float(case.get("time", 0))
        count += 1
    return wall, dict(modules), count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--target-s", type=float, default=840.0, help="tier goal, s")
    args = parser.parse_args()
    (wall_b, mods_b, n_b), (wall_a, mods_a, n_a) = read(args.before), read(args.after)
    sum_b, sum_a = sum(mods_b.values()), sum(mods_a.values())
    print(f"{'':34} {'before':>9} {'after':>9} {'after/before':>13}")
    print(f"{'tests':34} {n_b:>9} {n_a:>9}")
    print(f"{'session wall s':34} {wall_b:>9.0f} {wall_a:>9.0f} {wall_a / wall_b:>13.2f}")
    print(f"{'sum of test times s':34} {sum_b:>9.0f} {sum_a:>9.0f} {sum_a / sum_b:>13.2f}")
    print(f"{'overlap (sum / wall)':34} {sum_b / wall_b:>9.2f} {sum_a / wall_a:>9.2f}")
    print(f"{'goal s':34} {'':>9} {args.target_s:>9.0f} {wall_a / args.target_s:>13.2f}")
    for module in sorted(set(mods_b) | set(mods_a), key=lambda m: -mods_b.get(m, 0)):
        b, a = mods_b.get(module), mods_a.get(module)
        ratio = f"{a / b:>13.2f}" if a and b else f"{'-':>13}"
        cells = [f"{v:>9.0f}" if v is not None else f"{'-':>9}" for v in (b, a)]
        print(f"  {module[:32]:32} {cells[0]} {cells[1]} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
