#!/usr/bin/env python3
"""Wall time of the infra suite (tests_infra: link, preflight and nccl checks) against
sparksim at 2, 4 and 8 nodes, printed side by side from one run. Goal: 8 nodes <= 1.5x
2 nodes.

Each size gets its own sim, stood up beforehand, and serving launched on it beforehand
(``launch-cluster.sh`` run on the head as an operator runs it, then /health waited for),
because the NCCL checks run the all-reduce in the serving containers and the preflight
checks read their environment.
Neither the sim start-up nor the launch is counted: the timed run is the infra suite
attached to a serving cluster, as an operator runs it against one already up. What
``--spark-launch`` adds (the emulated model load) is timed by readiness_latency.py.

All N sim nodes share this machine's CPUs (a real cluster has a CPU per node), so the
figures at 8 nodes include the simulator's own work (its per-node tools, 8 sshds, gloo
ranks) contending for the same cores. Each run therefore also prints the CPU time the
whole machine spent (all processes, /proc/stat) and how much of its cores that is: near
100 % the run is bound by the machine's cores, not by the suite's waits.

    sudo .venv/bin/python benchmarks/scale.py [--nodes 2 4 8] [--repeat K]
        [--compare-with OTHER_CHECKOUT] [-- pytest args]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pytest_spark.access.simcontrol import SimCluster, sim_up

REPO = Path(__file__).resolve().parents[1]


def _pytest(
    sim: SimCluster, *args: str, checkout: Path = REPO
) -> tuple[float, subprocess.CompletedProcess[str]]:
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
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=checkout, env=env)
    return time.monotonic() - t0, proc


def machine_cpu_s() -> float:
    """CPU seconds every core of this machine has spent busy so far (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _last(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stdout.strip().splitlines()
    return lines[-1].strip("= ") if lines else f"exit {proc.returncode}, no output"


def _serve(sim: SimCluster, timeout: float = 600) -> None:
    """Start serving the way an operator does (launch-cluster.sh in the background on the
    head) and wait for /health: the suite's own --spark-launch is not what is timed."""
    launch = sim.info["launch"]
    fabric = ",".join(n["fabric"][0]["addr"] for n in sim.info["nodes"])
    argv = [launch["script"], "-n", fabric, "--name", launch["container"], "exec"]
    argv += shlex.split(launch["serve_args"])
    command = f"setsid nohup {shlex.join(argv)} >/tmp/scale-launch.log 2>&1 </dev/null &"
    ssh = ["ssh", "-F", str(sim.ssh_config), sim.head]
    subprocess.run([*ssh, command], check=True, timeout=60, capture_output=True)
    url = f"http://{sim.head}:{launch['port']}/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=3) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    log = subprocess.run([*ssh, "tail -n 30 /tmp/scale-launch.log"], capture_output=True, text=True)
    raise SystemExit(
        f"{len(sim.info['nodes'])} nodes: not serving after {timeout:.0f} s\n{log.stdout}"
    )


def measure(n: int, repeat: int, checkouts: list[Path], extra: list[str]) -> list[list[float]]:
    """Per checkout, its timed runs, taken in turn on one sim (same serving, same load)."""
    sim = sim_up(n)
    launch = sim.info["launch"]
    serve = [
        f"--spark-container={launch['container']}",
        f"--spark-serve-args={launch['serve_args']}",
    ]
    times: list[list[float]] = [[] for _ in checkouts]
    cores = os.cpu_count() or 1
    try:
        _serve(sim)
        for _ in range(repeat):
            for i, checkout in enumerate(checkouts):
                tests = str(checkout / "tests_infra")
                busy = machine_cpu_s()
                seconds, proc = _pytest(sim, tests, *serve, *extra, checkout=checkout)
                busy = machine_cpu_s() - busy
                times[i].append(seconds)
                print(
                    f"  {n} nodes, {checkout}: {seconds:.1f} s ({_last(proc)}); machine CPU "
                    f"{busy:.1f} s, {busy / seconds / cores:.0%} of {cores} cores",
                    flush=True,
                )
        return times
    finally:
        sim.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per size (best kept)")
    parser.add_argument(
        "--compare-with",
        type=Path,
        metavar="CHECKOUT",
        help="another checkout (e.g. a git worktree of an older commit) timed in turn with "
        "this one on the same sims",
    )
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    checkouts = [REPO] + ([args.compare_with.resolve()] if args.compare_with else [])
    best: dict[int, list[float]] = {}
    for n in args.nodes:
        best[n] = [min(t) for t in measure(n, args.repeat, checkouts, extra)]
    base_n = min(best)
    for i, checkout in enumerate(checkouts):
        figures = "  ".join(
            f"{n} nodes {t[i]:5.1f} s ({t[i] / best[base_n][i]:.2f}x)" for n, t in best.items()
        )
        print(f"{checkout}: {figures}")


if __name__ == "__main__":
    main()
