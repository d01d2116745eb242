#!/usr/bin/env python3
"""Wall time of the infra suite (link checks) against sparksim at 2, 4 and 8 nodes, each on
a sim stood up beforehand (sim start-up is not counted). Goal: 8 nodes <= 1.5x 2 nodes.

    sudo .venv/bin/python benchmarks/scale.py [--nodes 2 4 8] [-- extra pytest args]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from pytest_spark.simcontrol import sim_up

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    args, extra = parser.parse_known_args()
    times: dict[int, float] = {}
    for n in args.nodes:
        sim = sim_up(n)
        try:
            argv = [
                sys.executable,
                "-m",
                "pytest",
                str(REPO / "tests_infra"),
                "-m",
                "link",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--spark-head={sim.head}",
                f"--spark-workers={','.join(sim.workers)}",
                f"--spark-ssh-config={sim.ssh_config}",
                "--spark-profile=sim",
                "--spark-history=off",
                *[a for a in extra if a != "--"],
            ]
            t0 = time.monotonic()
            proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
            times[n] = time.monotonic() - t0
            last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "?"
            print(f"{n} nodes: {times[n]:6.1f} s  ({last})")
        finally:
            sim.down()
    base = times.get(min(times))
    for n, t in times.items():
        print(f"  {n} nodes / {min(times)} nodes: {t / base:.2f}x")


if __name__ == "__main__":
    main()
