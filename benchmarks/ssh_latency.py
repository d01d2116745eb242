#!/usr/bin/env python3
"""Median per-command latency of the suite's SSH layer against sparksim, side by side with
testinfra's default ssh backend (and its paramiko backend), on the same node in one run.

    sudo .venv/bin/python benchmarks/ssh_latency.py [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import testinfra

from pytest_spark.access.simcontrol import sim_up
from pytest_spark.access.ssh import SSHConnection, resolve_target


def median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm: connect, first login
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    sim = sim_up(2)
    try:
        head, cfg = sim.head, Path(sim.ssh_config)
        ours = SSHConnection("spark-head", resolve_target(head, ssh_config=cfg))
        ours_ms = median_ms(lambda: ours.run("true"), args.runs)
        ours.close()
        ti_ssh = testinfra.get_host(f"ssh://{head}", ssh_config=str(cfg))
        ti_ssh_ms = median_ms(lambda: ti_ssh.run("true"), args.runs)
        ti_pmk = testinfra.get_host(f"paramiko://{head}", ssh_config=str(cfg))
        ti_pmk_ms = median_ms(lambda: ti_pmk.run("true"), args.runs)
    finally:
        sim.down()
    print(f"median per-command latency over {args.runs} runs (sparksim head {head}):")
    print(f"  pytest_spark SSH layer (paramiko, TCP_NODELAY, reused): {ours_ms:8.2f} ms")
    print(f"  testinfra ssh:// (default backend)                   : {ti_ssh_ms:8.2f} ms")
    print(f"  testinfra paramiko://                                : {ti_pmk_ms:8.2f} ms")
    print(f"  ratio testinfra ssh:// / ours                        : {ti_ssh_ms / ours_ms:8.1f}x")
    print(f"  ratio testinfra paramiko:// / ours                   : {ti_pmk_ms / ours_ms:8.1f}x")


if __name__ == "__main__":
    main()
