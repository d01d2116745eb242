"""tests_e2e's test_startup_within_budget holds the launch's load time to the profile's
``readiness.max_load_s``: a launch that became ready within --spark-ready-timeout (so the
wait itself passed) but later than the profile's clusters load fails, with the figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, launch_args, run_suite, sim_fault  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim
BUDGET = "tests_e2e/test_readiness.py::test_startup_within_budget"


def test_a_load_slower_than_the_profile_fails(sim: SimCluster, tmp_path: Path) -> None:
    sim_fault(sim, "clear")
    run = run_suite(
        tmp_path,
        str(REPO / "tests_e2e" / "test_readiness.py"),
        "-k",
        "cluster_serving or startup_within_budget",
        *launch_args(sim),
        "--spark-threshold=readiness.max_load_s=1",
        "--spark-history=off",
        sim=sim,
    )
    outcomes = run.outcomes()
    assert outcomes.get("test_cluster_serving") == "passed", run.output  # it did load
    (check,) = run.checks(nodeid=BUDGET)
    assert check["outcome"] == "failed", check
    ready_s = run.results["serving"]["ready_s"]
    assert check["measured"] == ready_s and ready_s > 1, check
    assert check["expected"] == "<= 1" and check["unit"] == "s", check
    message = check["message"]
    assert f"cluster ready {ready_s:.1f} s after launch" in message, message
    assert "slower than this profile's 1 s (readiness.max_load_s)" in message, message
    assert run.ret == 1, run.output
