"""The NCCL suite against sparksim: real gloo all-reduce over the shaped fabric veths."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, launch_args, run_suite, sim_fault  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim
NCCL = str(REPO / "tests_infra" / "test_nccl.py")


def test_healthy_fabric_passes_and_records_the_series(sim: SimCluster, tmp_path: Path) -> None:
    sim_fault(sim, "clear")
    run = run_suite(tmp_path, NCCL, *launch_args(sim), "--spark-history=off", sim=sim)
    assert run.ret == 0, run.output
    busbw = run.checks(nodeid="tests_infra/test_nccl.py::test_allreduce_busbw")[0]
    assert busbw["outcome"] == "passed"
    assert 0.18 <= busbw["measured"] <= 0.27  # 2 Gbit/s tbf = 0.25 GB/s
    series = busbw["extra"]["busbw_series"]
    assert series and series["points"][-1]["busbw_gbps"] > 0
    # the same launch's all-gather (nccl-tests' (n-1)/n busbw) and latency sweeps
    gather = run.checks(nodeid="tests_infra/test_nccl.py::test_allgather_busbw")[0]
    assert gather["outcome"] == "passed", gather
    assert gather["extra"]["busbw_series"]["collective"] == "all_gather"
    assert 0.1 <= gather["measured"] <= 0.27
    latency = run.checks(nodeid="tests_infra/test_nccl.py::test_small_message_latency")[0]
    assert latency["outcome"] == "passed", latency
    points = latency["extra"]["latency_series"]["points"]
    assert [p["size_bytes"] for p in points] == [8 << k for k in range(18)]  # 8 B..1 MiB
    assert 0 < latency["measured"] <= 5000


def test_degraded_link_fails_busbw_with_the_figures(sim: SimCluster, tmp_path: Path) -> None:
    sim_fault(sim, "clear")
    sim_fault(sim, "link-rate", "spark-1", "100000")
    try:
        run = run_suite(tmp_path, NCCL, *launch_args(sim), "--spark-history=off", sim=sim)
    finally:
        sim_fault(sim, "clear")
    failed = run.failed()
    assert list(failed) == ["test_allreduce_busbw"], failed
    message = failed["test_allreduce_busbw"]
    assert "0.18" in message and "GB/s" in message
    record = run.checks(nodeid="tests_infra/test_nccl.py::test_allreduce_busbw")[0]
    assert record["measured"] < 0.15
