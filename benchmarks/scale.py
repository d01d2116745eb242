#!/usr/bin/env python3
"""The suite's own cost as the cluster grows: the link, preflight and nodes-alike checks
(``tests_infra -m "link or preflight"``) against light sparksim nodes at 2, 8, 16 and 32
nodes, printed side by side. Goal (issue #15 section 6): 32 nodes in at most 2x the
2-node wall time, with the controller's CPU seconds and the SSH round trips per node flat.

Light nodes: sshd and the per-node tools only (``SPARKSIM_NO_DOCKER=1``: no Docker engine,
no serving stack, so no all-reduce ranks and no engine), so what is timed is the suite's
work and its waits, not the simulated nodes' (a real cluster has a CPU per node; this
machine shares its cores among all the simulated ones). The NCCL and serving checks are
not run: they need the engine. Each size gets its own sim, stood up before the timed run
and brought down after it; the sim's start-up is not counted.

Per size it prints:

- wall: the pytest run's wall time, and its ratio to the smallest size;
- CPU/node: the CPU seconds of the pytest process (the controller: its user + system time,
  RUSAGE_CHILDREN around the run), divided by the node count;
- trips/node: SSH round trips (commands run) per node, counted where they land, in each
  node's sshd log (the sim's sshd at ``LogLevel DEBUG1`` logs every ``req exec``), and
  SSH logins per node (``Accepted publickey``), so a suite that reconnects shows too;
- node CPU/node: CPU seconds the simulated nodes spent serving the run (each node's sshd
  with the sessions, commands and per-node tools it ran), per node: the work the suite
  asks of every node, which on a real cluster each node does on its own cores;
- machine busy: how much of this machine's cores the run kept busy (all processes,
  /proc/stat): near 100 % the run is bound by the cores (here shared by every simulated
  node's sshd and tools), not by the suite's waits;
- the slowest tests (pytest's ``--durations``), which say what bounds the wall time;
- the failed and errored checks, by test function with their counts: light nodes have no
  Docker engine, so the checks that need it fail on every node (expected, one per node);
  more than that says the machine lost the run (pings lost at full CPU).

    sudo .venv/bin/python benchmarks/scale.py [--nodes 2 8 16 32] [--repeat K] [-- pytest args]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common import machine_cpu_s

from pytest_spark.access.simcontrol import SimCluster, sim_up

REPO = Path(__file__).resolve().parents[1]
SELECT = "link or preflight"  # test_alike is marked preflight too
CORES = os.cpu_count() or 1
LIGHT_ENV = {"SPARKSIM_NO_DOCKER": "1", "SPARKSIM_SSHD_LOG_LEVEL": "DEBUG1"}


@dataclass
class Run:
    nodes: int
    wall_s: float
    cpu_s: float
    execs: dict[str, int]
    logins: dict[str, int]
    machine_cpu_s: float
    nodes_cpu_s: float
    summary: str
    slowest: list[str]
    failures: list[str]

    @property
    def trips_per_node(self) -> float:
        return sum(self.execs.values()) / self.nodes

    @property
    def logins_per_node(self) -> float:
        return sum(self.logins.values()) / self.nodes


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def _cpu_with_children(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` (its reaped descendants included)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def nodes_cpu_s(sim: SimCluster) -> float:
    """CPU seconds the simulated nodes spent: each node's sshd (the first process of the
    node's wrapper that is sshd) with everything it ran and reaped: the sessions, the
    commands, the per-node tools. Read after the run's connections closed."""
    total = 0.0
    for node in sim.info["nodes"]:
        pidfile = sim.state_dir / "nodes" / node["name"] / "sshd.pid"
        try:
            todo = [int(pidfile.read_text().strip())]
        except (OSError, ValueError):
            continue
        while todo:
            pid = todo.pop()
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm == "sshd":
                total += _cpu_with_children(pid)
            else:
                todo += _children(pid)
    return total


def _sshd_counts(sim: SimCluster) -> tuple[dict[str, int], dict[str, int]]:
    """(commands run, logins) per node, read from every node's sshd log."""
    execs, logins = {}, {}
    for node in sim.info["nodes"]:
        log = sim.state_dir / "nodes" / node["name"] / "sshd.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        execs[node["name"]] = len(re.findall(r"req exec\b", text))
        logins[node["name"]] = len(re.findall(r"Accepted publickey", text))
    return execs, logins


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items()}


def _failures(stdout: str) -> list[str]:
    """``FAILED``/``ERROR`` summary lines counted by outcome and test function (parameters
    dropped): ``"32 x FAILED tests_infra/test_links.py::test_ping_peer_at_full_mtu"``."""
    counts: dict[str, int] = {}
    for line in stdout.splitlines():
        m = re.match(r"^(FAILED|ERROR) (\S+?)(\[|\s|$)", line)
        if m:
            key = f"{m.group(1)} {m.group(2)}"
            counts[key] = counts.get(key, 0) + 1
    return [f"{n} x {key}" for key, n in sorted(counts.items())]


def _slowest(stdout: str, count: int = 3) -> list[str]:
    lines = [ln for ln in stdout.splitlines() if re.match(r"^\d+\.\d+s (setup|call|teardown)", ln)]
    return lines[:count]


def timed_run(sim: SimCluster, extra: list[str]) -> Run:
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
        "--durations=5",
        "-rfE",
        "-m",
        SELECT,
        str(REPO / "tests_infra"),
        *extra,
    ]
    before_execs, before_logins = _sshd_counts(sim)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    nodes_before = nodes_cpu_s(sim)
    busy = machine_cpu_s()
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, check=False)
    wall = time.monotonic() - t0
    busy = machine_cpu_s() - busy
    time.sleep(1.0)  # the nodes' sshd reap the closed sessions
    nodes = nodes_cpu_s(sim) - nodes_before
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    execs, logins = _sshd_counts(sim)
    lines = proc.stdout.strip().splitlines()
    # pytest's own last line ("1 failed, 24 passed in 5.10s"; the verdict line follows it)
    stats = [ln for ln in lines if re.search(r" in [0-9.]+s( \([0-9:]+\))?( =+)?$", ln)] or lines
    summary = stats[-1].strip("= ") if stats else f"exit {proc.returncode}, no output"
    return Run(
        nodes=len(sim.info["nodes"]),
        wall_s=wall,
        cpu_s=cpu,
        execs=_delta(execs, before_execs),
        logins=_delta(logins, before_logins),
        machine_cpu_s=busy,
        nodes_cpu_s=nodes,
        summary=summary,
        slowest=_slowest(proc.stdout),
        failures=_failures(proc.stdout),
    )


def measure(n: int, repeat: int, extra: list[str]) -> Run:
    """The best of ``repeat`` runs on one light sim of ``n`` nodes (brought down after)."""
    saved = {k: os.environ.get(k) for k in LIGHT_ENV}
    os.environ.update(LIGHT_ENV)
    try:
        t0 = time.monotonic()
        sim = sim_up(n)
        print(f"  {n} nodes: sim up in {time.monotonic() - t0:.1f} s", flush=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        runs = []
        for _ in range(repeat):
            run = timed_run(sim, extra)
            print(
                f"  {n} nodes: {run.wall_s:.1f} s, controller CPU {run.cpu_s:.1f} s, "
                f"{run.trips_per_node:.1f} commands and {run.logins_per_node:.1f} logins "
                f"per node; the nodes' CPU {run.nodes_cpu_s:.1f} s; "
                f"machine CPU {run.machine_cpu_s:.1f} s, "
                f"{run.machine_cpu_s / run.wall_s / CORES:.0%} of {CORES} cores ({run.summary})",
                flush=True,
            )
            for line in run.slowest:
                print(f"      {line}")
            for line in run.failures:
                print(f"      {line}")
            runs.append(run)
        return min(runs, key=lambda r: r.wall_s)
    finally:
        sim.down()


def table(runs: list[Run]) -> str:
    base = runs[0]
    rows = [
        f"{'nodes':>5}  {'wall s':>7}  {'ratio':>6}  {'CPU s/node':>10}  {'trips/node':>10}  "
        f"{'logins/node':>11}  {'trips min..max':>14}  {'node CPU s/node':>15}  "
        f"{'machine busy':>12}"
    ]
    for r in runs:
        lo, hi = min(r.execs.values()), max(r.execs.values())
        rows.append(
            f"{r.nodes:>5}  {r.wall_s:>7.1f}  {r.wall_s / base.wall_s:>5.2f}x  "
            f"{r.cpu_s / r.nodes:>10.2f}  {r.trips_per_node:>10.1f}  "
            f"{r.logins_per_node:>11.1f}  {f'{lo}..{hi}':>14}  "
            f"{r.nodes_cpu_s / r.nodes:>15.2f}  "
            f"{r.machine_cpu_s / r.wall_s / CORES:>11.0%}"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8, 16, 32])
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per size (best kept)")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if os.geteuid() != 0:
        raise SystemExit("benchmarks/scale.py needs root: it stands up sparksim")
    runs = [measure(n, args.repeat, extra) for n in sorted(args.nodes)]
    print(table(runs))


if __name__ == "__main__":
    main()
