"""One cause, one failure against sparksim (issue #36 part 4), as a user runs the suite (a
pytest subprocess, verdicts from the JSON results):

- the same dockerd open-files limit on both nodes is one failure, on the head, naming the
  worker; the worker's check skips citing it (it gave 2 identical failures);
- a worker whose serving container stopped, attached without --spark-serve-args, is the
  readiness check's one failure: the memory check reads the claim from the running head
  rank (it took vLLM's default 0.92 and failed the worker: a second failure).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import (  # type: ignore[import-not-found]
    REPO,
    launch_args,
    node_ssh,
    run_suite,
    serving_containers,
    sim_fault,
    stop_serving,
)
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim
INFRA = REPO / "tests_infra"
H, W = "spark-head", "spark-worker-1"


def test_the_same_fd_limit_on_both_nodes_is_one_failure(sim: SimCluster, tmp_path: Path) -> None:
    sim_fault(sim, "clear")
    try:
        sim_fault(sim, "fd-limit", "head", "--nofile", "4096")
        sim_fault(sim, "fd-limit", "worker-1", "--nofile", "4096")
        run = run_suite(tmp_path, str(INFRA / "test_fdlimit.py"), "--spark-history=off", sim=sim)
    finally:
        sim_fault(sim, "clear")
    assert run.ret == 1, run.output[-3000:]
    failed = run.failed()
    assert list(failed) == [f"test_dockerd_open_files_limit[{H}]"], run.output[-3000:]
    message = failed[f"test_dockerd_open_files_limit[{H}]"]
    assert message.startswith(
        f"{H} (and {W}, the same: one cause, this failure; fix it there too): dockerd (pid "
    ), message
    assert "hard 4096" in message and "LimitNOFILE=" in message, message
    (worker,) = run.checks(
        nodeid=f"tests_infra/test_fdlimit.py::test_dockerd_open_files_limit[{W}]"
    )
    assert worker["outcome"] == "skipped", worker
    assert worker["message"].startswith(f"{W}: the same failure as on {H} (dockerd (pid "), worker
    assert worker["message"].endswith(
        f"one cause, test_dockerd_open_files_limit[{H}] has the evidence"
    ), worker


def test_a_stopped_worker_is_one_failure_not_a_memory_one(sim: SimCluster, tmp_path: Path) -> None:
    """Attached without --spark-serve-args, a 3 GiB holder on the worker: vLLM's default
    claim (0.92 x 119.7 GiB + 4 GiB headroom = 114.1 GiB) is more than its 113.3 GiB
    available, the sim's serve args' 0.90 (111.7 GiB) is not."""
    sim_fault(sim, "clear")
    launch = sim.info["launch"]
    try:
        kept = run_suite(
            tmp_path / "keep",
            str(REPO / "tests_e2e" / "test_readiness.py"),
            *launch_args(sim),
            "--spark-keep",
            "--spark-history=off",
            sim=sim,
        )
        assert kept.ret == 0, kept.output[-3000:]
        assert all(serving_containers(sim).values()), "--spark-keep left nothing running"
        node_ssh(sim, sim.workers[0], f"docker stop {launch['container']}")
        sim_fault(sim, "memory-held", "worker-1", "--gib", "3")
        run = run_suite(
            tmp_path / "attached",
            str(INFRA / "test_memory.py"),
            str(REPO / "tests_e2e" / "test_readiness.py"),
            f"--spark-container={launch['container']}",
            "--spark-history=off",
            sim=sim,
        )
    finally:
        stop_serving(sim)
        for node in (sim.head, *sim.workers):
            node_ssh(sim, node, f"docker rm -f {launch['container']} >/dev/null 2>&1")
        sim_fault(sim, "clear")
    assert run.ret == 1, run.output[-3000:]
    failed = run.failed()
    assert list(failed) == ["test_cluster_serving"], run.output[-3000:]
    assert W in failed["test_cluster_serving"], failed
    (memory,) = run.checks(nodeid=f"tests_infra/test_memory.py::test_memory_headroom[{W}]")
    assert memory["outcome"] == "passed", memory
    assert "0.9 x MemTotal" in memory["message"], memory
    assert f"read from {H}'s vllm serve" in memory["message"], memory
