#!/usr/bin/env python3
"""Wall time of the infra suite (tests_infra: link, preflight and nccl checks) against
sparksim at 2, 4 and 8 nodes, printed side by side from one run. Goal: 8 nodes <= 1.5x
2 nodes.

Each size gets its own sim, stood up beforehand, and serving launched on it beforehand
(``--spark-launch --spark-keep`` on the readiness checks), because the NCCL checks run the
all-reduce in the serving containers and the preflight checks read their environment.
Neither the sim start-up nor the launch is counted: the timed run is the infra suite
attached to a serving cluster, as an operator runs it against one already up. What
``--spark-launch`` adds (the emulated model load) is timed by readiness_latency.py.

All N sim nodes share this machine's CPUs (a real cluster has a CPU per node), so the
figures at 8 nodes include the simulator's own work (its per-node tools, 8 sshds, gloo
ranks) contending for the same cores.

    sudo .venv/bin/python benchmarks/scale.py [--nodes 2 4 8] [--repeat K] [-- pytest args]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from pytest_spark.simcontrol import SimCluster, sim_up

REPO = Path(__file__).resolve().parents[1]


def _pytest(sim: SimCluster, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--spark-head={sim.head}",
        f"--spark-workers={','.join(sim.workers)}",
        f"--spark-ssh-config={sim.ssh_config}",
        "--spark-profile=sim",
        "--spark-history=off",
        *args,
    ]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    return time.monotonic() - t0, proc


def _last(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stdout.strip().splitlines()
    return lines[-1].strip("= ") if lines else f"exit {proc.returncode}, no output"


def measure(n: int, repeat: int, extra: list[str]) -> tuple[list[float], str]:
    sim = sim_up(n)
    launch = sim.info["launch"]
    serve = [
        f"--spark-container={launch['container']}",
        f"--spark-serve-args={launch['serve_args']}",
    ]
    try:
        _, up = _pytest(
            sim,
            str(REPO / "tests_e2e" / "test_readiness.py"),
            "--spark-launch",
            f"--spark-launch-script={launch['script']}",
            "--spark-keep",
            *serve,
        )
        if up.returncode != 0:
            raise SystemExit(f"{n} nodes: could not launch serving: {_last(up)}\n{up.stdout}")
        times, summary = [], ""
        for _ in range(repeat):
            seconds, proc = _pytest(sim, str(REPO / "tests_infra"), *serve, *extra)
            times.append(seconds)
            summary = _last(proc)
        return times, summary
    finally:
        sim.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per size (best kept)")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    best: dict[int, float] = {}
    for n in args.nodes:
        times, summary = measure(n, args.repeat, extra)
        best[n] = min(times)
        runs = ", ".join(f"{t:.1f}" for t in times)
        print(f"{n} nodes: {best[n]:6.1f} s  (runs: {runs} s; {summary})", flush=True)
    base_n = min(best)
    print(
        f"ratios to {base_n} nodes: "
        + "  ".join(f"{n} nodes {t / best[base_n]:.2f}x" for n, t in best.items())
    )


if __name__ == "__main__":
    main()
