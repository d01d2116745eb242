"""The NCCL suite against sparksim: real gloo all-reduce over the shaped fabric veths.

The healthy run launches serving (the all-reduce runs in its containers, where torch
lives) and keeps it up (``--spark-keep``); the degraded-link and low-memory runs attach to
that stack with their fault injected, as the fault matrix's `serving` rows do, instead of
launching one each (the all-reduce is started afresh in the running containers by every
run either way). The no-RDMA run launches its own: what it holds is the launch finding no
fabric interface. One work unit under xdist (tests/conftest.py ORDERED_MODULES).

The regression gate rides the same two runs (it was tests/suite/test_regression_gate.py,
two launched runs of its own): the healthy run is recorded in the module's history, and
the degraded run, compared with it by ``--spark-compare-fail=busbw:10%``, fails naming
busbw."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultmatrix import Stack  # type: ignore[import-not-found]

from conftest import REPO, launch_args, run_suite, sim_fault  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim
NCCL = str(REPO / "tests_infra" / "test_nccl.py")


@pytest.fixture(scope="module")
def stack(sim: SimCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The serving stack the module's attached runs share; stopped after the module (the
    session's sim goes on to other tests)."""
    kept = Stack(sim, tmp_path_factory.mktemp("nccl-stack"))
    try:
        yield kept
    finally:
        kept.stop()


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``--spark-history=DIR``: the healthy run's record, the degraded run's baseline."""
    return f"--spark-history={tmp_path_factory.mktemp('nccl-history')}"


def attach_args(sim: SimCluster, stack: Stack) -> list[str]:
    """Suite options that attach to the kept stack (launched here if no test left one up)."""
    stack.ensure()
    launch = sim.info["launch"]
    return [
        f"--spark-serve-args={launch['serve_args']}",
        f"--spark-container={launch['container']}",
    ]


def test_healthy_fabric_passes_and_records_the_series(
    sim: SimCluster, stack: Stack, history: str, tmp_path: Path
) -> None:
    sim_fault(sim, "clear")
    stack.stop()  # a launch of its own, kept for the attached runs below
    launched = [*launch_args(sim), "--spark-keep"]
    run = run_suite(tmp_path, NCCL, *launched, history, sim=sim)
    assert run.ret == 0, run.output
    busbw = run.checks(nodeid="tests_infra/test_nccl.py::test_allreduce_busbw")[0]
    assert busbw["outcome"] == "passed"
    assert 0.09 <= busbw["measured"] <= 0.15  # 1 Gbit/s tbf = 0.125 GB/s, +tbf burst
    series = busbw["extra"]["busbw_series"]
    assert series and series["points"][-1]["busbw_gbps"] > 0
    # the same launch's all-gather (nccl-tests' (n-1)/n busbw) and latency sweeps
    gather = run.checks(nodeid="tests_infra/test_nccl.py::test_allgather_busbw")[0]
    assert gather["outcome"] == "passed", gather
    assert gather["extra"]["busbw_series"]["collective"] == "all_gather"
    assert 0.045 <= gather["measured"] <= 0.135
    latency = run.checks(nodeid="tests_infra/test_nccl.py::test_small_message_latency")[0]
    assert latency["outcome"] == "passed", latency
    points = latency["extra"]["latency_series"]["points"]
    assert [p["size_bytes"] for p in points] == [8 << k for k in range(18)]  # 8 B..1 MiB
    assert 0 < latency["measured"] <= 5000
    # the sweep's live line (issue #16 section 8): in a log, the first as the ranks start,
    # then one every 10 s with the size reached and its figure, and the last at 100%
    lines = [line for line in run.output.splitlines() if re.match(r"nccl [a-z_]+[ ,]", line)]
    (tmp_path / "progress.txt").write_text("\n".join(lines) + "\n")  # beside results.json
    assert re.match(
        r"nccl all_reduce, all_gather, latency: 2 ranks starting, 0/\d+ sizes", lines[0]
    )
    assert re.fullmatch(
        r"nccl all_reduce, all_gather, latency: 2 ranks done 100% in \d+ s, (\d+)/\1 sizes; "
        r"all_reduce busbw 0\.\d+ GB/s at 8 MiB",
        lines[-1],
    ), lines


def test_degraded_link_fails_busbw_with_the_figures(
    sim: SimCluster, stack: Stack, history: str, tmp_path: Path
) -> None:
    """A link at half the rate: the busbw check fails with the figures, and the regression
    gate, against the healthy run before it (the module's history), fails the session on
    busbw: ``--spark-compare-fail`` adds no check failure of its own."""
    sim_fault(sim, "clear")
    attached = attach_args(sim, stack)
    sim_fault(sim, "link-rate", "spark-1", "100000")
    try:
        run = run_suite(
            tmp_path, NCCL, *attached, history, "--spark-compare-fail=busbw:10%", sim=sim
        )
    finally:
        sim_fault(sim, "clear")
    failed = run.failed()
    assert list(failed) == ["test_allreduce_busbw"], failed
    message = failed["test_allreduce_busbw"]
    assert "0.09" in message and "GB/s" in message
    record = run.checks(nodeid="tests_infra/test_nccl.py::test_allreduce_busbw")[0]
    assert record["measured"] < 0.075
    assert run.ret == 1, run.output
    compared = run.results["report"]["compare"]  # the healthy test's run is the baseline
    assert "REGRESSION" in run.output and "busbw" in run.output, (compared, run.output[-3000:])
    regressions = compared["regressions"]
    assert regressions and all("busbw" in str(r) for r in regressions)


def test_low_memory_caps_the_sweep_rather_than_run_it(
    sim: SimCluster, stack: Stack, tmp_path: Path
) -> None:
    """The memory guard (pytest_spark/infra/nccl/sizing_check.py): a node whose MemAvailable is
    down to sparksim's floor (335 MiB, another process holding the rest: fault memory-held)
    runs a 256 MiB sweep capped at 32 MiB (two buffers in a quarter of 335 MiB), and the
    report and the live line say so; the all-reduce itself still passes."""
    sim_fault(sim, "clear")
    attached = attach_args(sim, stack)
    sim_fault(sim, "memory-held", "spark-2", "--gib", "117")
    try:
        run = run_suite(
            tmp_path,
            NCCL + "::test_allreduce_busbw",
            *attached,
            "--spark-history=off",
            "--spark-threshold=nccl.max_bytes=268435456",
            "--spark-threshold=nccl.iters=2",
            "--spark-threshold=nccl.warmup=1",
            sim=sim,
        )
    finally:
        sim_fault(sim, "clear")
    busbw = run.checks(nodeid="tests_infra/test_nccl.py::test_allreduce_busbw")[0]
    assert busbw["outcome"] == "passed", run.output
    capped = busbw["extra"]["sweep_capped"]
    assert capped.startswith("sweep capped at 32 MiB (profile nccl.max_bytes 256 MiB)"), capped
    assert "has 0.3 GiB MemAvailable" in capped
    assert busbw["extra"]["busbw_series"]["points"][-1]["size_bytes"] == 32 << 20
    assert "sweep capped at 32 MiB" in busbw["message"]
    last = [line for line in run.output.splitlines() if " 100% " in f" {line} "]
    assert last and "sweep capped at 32 MiB" in last[-1], run.output[-2000:]


def test_no_rdma_on_the_nodes_is_one_failure(sim: SimCluster, stack: Stack, tmp_path: Path) -> None:
    """Issue #25 part 4: the RDMA drivers not loaded on any node (sparksim's no-rdma: no
    /sys/class/infiniband, ibdev2netdev silent, the netdevs up) was a GID failure per node
    plus the transport check's socket fallback. One failure: the first node's
    test_roce_gid_is_v2, naming every node and the fix; the other node's GID check and the
    transport check skip citing it."""
    stack.stop()  # launched here: the launcher finding no fabric interface is the point
    sim_fault(sim, "clear")
    sim_fault(sim, "no-rdma", "all")
    try:
        run = run_suite(
            tmp_path,
            NCCL,
            str(REPO / "tests_infra" / "test_nccl_gid.py"),
            *launch_args(sim),
            "--spark-history=off",
            sim=sim,
        )
    finally:
        sim_fault(sim, "clear")
    failed = run.failed()
    head, worker = "spark-head", "spark-worker-1"
    verdict = f"test_roce_gid_is_v2[{head}]"
    assert list(failed) == [verdict], (failed, run.output[-4000:])
    message = failed[verdict]
    assert message.startswith(f"{head}: /sys/class/infiniband does not exist (nor on {worker}")
    assert f"Load them (modprobe mlx5_ib) on {head}, {worker}" in message, message
    assert "DOCA-host / MLNX_OFED" in message, message
    outcomes = run.outcomes()
    skipped = {k for k, v in outcomes.items() if v == "skipped"}
    # every other check: the other node's GID check, the GID comparison, the transport
    # check and the checks that need the launched cluster (the launcher finds no fabric
    # interface without RDMA), each citing the one failure
    assert set(outcomes) - skipped == {verdict}, outcomes
    assert {f"test_roce_gid_is_v2[{worker}]", "test_transport_is_rdma_on_the_fabric"} <= skipped
    for record in run.results["checks"]:
        if record["outcome"] == "skipped":
            assert f"no RDMA on {head}, {worker}" in record["message"], record
            assert record["message"].endswith(f"({verdict} has the evidence)"), record
