"""A second run on a degraded sim link fails on --spark-compare-fail, naming busbw."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, launch_args, run_suite, sim_fault  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim
NCCL = str(REPO / "tests_infra" / "test_nccl.py")
# nccl-tests -n 5 -w 1 (the fault matrix's): the gate compares a healthy run with one on a
# link at half the rate, a 2x drop that 5 timed iterations show as well as 20 (the sweep
# took 17 of each run's ~55 s).
SHORT = ("--spark-threshold=nccl.iters=5", "--spark-threshold=nccl.warmup=1")


def test_degraded_link_regresses_busbw(sim: SimCluster, tmp_path: Path) -> None:
    history = f"--spark-history={tmp_path / 'history'}"
    sim_fault(sim, "clear")
    first = run_suite(tmp_path / "a", NCCL, *SHORT, *launch_args(sim), history, sim=sim)
    assert first.ret == 0, first.output
    sim_fault(sim, "link-rate", "spark-1", "100000")
    try:
        second = run_suite(
            tmp_path / "b",
            NCCL,
            *SHORT,
            *launch_args(sim),
            history,
            "--spark-compare-fail=busbw:10%",
            sim=sim,
        )
    finally:
        sim_fault(sim, "clear")
    assert second.ret == 1, second.output
    assert set(second.failed()) <= {"test_allreduce_busbw"}, second.failed()
    assert "REGRESSION" in second.output and "busbw" in second.output
    regressions = second.results["report"]["compare"]["regressions"]
    assert regressions and all("busbw" in str(r) for r in regressions)
