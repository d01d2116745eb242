"""Faults from sparkrun's own tracker, each a suite run attached to a sparkrun job on
sparksim: docs/FAULT_MATRIX.md's "sparkrun jobs" table, held to the matrix's rules
(``faultmatrix.check_row``). One two-node sim for every row, the rows one after the other:
each starts its job (``spark-sim job start``, the row's ``job ...`` flags), injects its
faults, runs the categories it names (``+only``) attached to the job as after ``sparkrun
run`` (``--spark-head``/``--spark-workers``, no ``--spark-container``), then stops the job."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faultmatrix import MATRIX, OBSERVED, TRIM, Row, check_row, parse_matrix, summary  # type: ignore[import-not-found]

from conftest import (  # type: ignore[import-not-found]
    REPO,
    SUITE_SIM_ARGS,
    SuiteRun,
    _missing,
    node_run,
    run_suite,
    sim_fault,
)
from pytest_spark.access.simcontrol import SimCluster, sim_up

pytestmark = pytest.mark.sim
TABLE = "## sparkrun jobs"
ROWS = parse_matrix(MATRIX.read_text(), TABLE)
READINESS = "tests_e2e/test_readiness.py::"
BASELINE_SKIPS: dict[str, set[str]] = {}
# A row whose job never serves must end long before this: the readiness wait's fail-fast,
# not its timeout, is the verdict (vLLM's own store timeout is ~600 s).
READY_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def sparkrun_sim() -> Iterator[SimCluster]:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    sim = sim_up(2, SUITE_SIM_ARGS)
    try:
        yield sim
    finally:
        sim.down()


def _job_args(row: Row) -> list[str]:
    jobs = [argv for argv in row.inject if argv[0] == "job"]
    assert len(jobs) == 1, f"a row starts one job: {row.inject}"
    return list(jobs[0][1:])


def _serves_first(row: Row) -> bool:
    """The healthy row, and a row whose fault comes after ready (a fault besides its job
    start): its job serves before the fault."""
    return not row.fails or len(row.inject) > 1


def _wait_healthy(sim: SimCluster) -> None:
    port = sim.info["launch"]["port"]
    health = f"curl -s -o /dev/null -w '%{{http_code}}' -m 2 http://127.0.0.1:{port}/health"
    wait = f'for i in $(seq 480); do [ "$({health})" = 200 ] && exit 0; sleep 0.5; done; exit 1'
    assert node_run(sim, sim.head, wait, timeout=300).returncode == 0, "the job never served"


def run_row(sim: SimCluster, row: Row, tmp_path: Path) -> SuiteRun:
    """The row's job started, its faults injected, its categories run attached to it."""
    sim_fault(sim, "clear")
    started = sim.cli("job", "start", *_job_args(row))
    assert started.returncode == 0, started.stderr
    try:
        if _serves_first(row):  # a fault after ready: the job serves first
            _wait_healthy(sim)
        for argv in row.inject:
            if argv[0] != "job":
                sim_fault(sim, *argv)
        args = [str(REPO / "tests_infra"), str(REPO / "tests_e2e"), *TRIM, *row.options]
        if row.only:
            args += ["-m", " or ".join(row.only)]
        args += [
            f"--spark-model-dir={sim.info['launch']['model_dir']}",
            f"--spark-ready-timeout={READY_TIMEOUT_S:g}",
        ]
        return run_suite(tmp_path, *args, sim=sim, timeout=900)
    finally:
        sim_fault(sim, "clear")
        sim.cli("job", "stop")


def test_the_table_has_a_healthy_row_first() -> None:
    assert [r.fails for r in ROWS[:1]] == [()], "the healthy row first: the others' baseline"
    for row in ROWS:
        assert row.run == "serving" and row.only, row  # attached, a few categories each
        _job_args(row)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_sparkrun_row(
    sparkrun_sim: SimCluster, row: Row, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if row.fails and "serving/ray" not in BASELINE_SKIPS:
        pytest.skip("select the healthy row too (-k 'healthy or ...'): its skips are the baseline")
    run = run_row(sparkrun_sim, row, tmp_path_factory.mktemp(row.id))
    OBSERVED.mkdir(exist_ok=True)
    (OBSERVED / f"sparkrun-{row.id}.json").write_text(json.dumps(summary(run), indent=1))
    check_row(row, run, BASELINE_SKIPS)
    proof = PROOFS.get(row.id)  # a row may hold more than check_row's rules
    if proof is not None:
        proof(run)


def _checks(run: SuiteRun, prefix: str) -> dict[str, dict[str, Any]]:
    return {
        c["nodeid"].removeprefix(prefix): c
        for c in run.results["checks"]
        if c["nodeid"].startswith(prefix)
    }


def prove_attached(run: SuiteRun) -> None:
    """Healthy: the suite found the job by its labels and read each rank's container."""
    serving = run.results["serving"]
    assert serving["status"] == "ready" and serving["mode"] == "no-ray", serving
    readiness = _checks(run, READINESS)
    for node in ("spark-head", "spark-worker-1"):
        check = readiness[f"test_serving_container_running[{node}]"]
        assert check["outcome"] == "passed", check


def _the_failure(run: SuiteRun) -> dict[str, Any]:
    failed = [c for c in run.results["checks"] if c["outcome"] in ("failed", "error")]
    assert len(failed) == 1, [c["nodeid"] for c in failed]
    return failed[0]


def _containers_up(run: SuiteRun) -> None:
    """Every rank container is Up (what `sparkrun status` shows green): its check passes."""
    readiness = _checks(run, READINESS)
    for node in ("spark-head", "spark-worker-1"):
        check = readiness[f"test_serving_container_running[{node}]"]
        assert check["outcome"] == "passed", check


def prove_loopback_master(run: SuiteRun) -> None:
    """sparkrun#249: read from the ranks' command lines, not waited out: both ranks named
    with their ranks, vLLM's own late words quoted, the fix names sparkrun's cluster."""
    failure = _the_failure(run)
    message = failure["message"]
    assert failure["node"] == "spark-worker-1", failure
    assert "on spark-head (rank 0), spark-worker-1 (rank 1)" in message, message
    assert "DistStoreError ... 1/2 clients joined` after ~600 s" in message, message
    assert "~/.config/sparkrun/clusters" in message and "sparkrun stop" in message, message
    assert run.results["serving"]["status"] != "ready", run.results["serving"]


def prove_never_started(run: SuiteRun) -> None:
    """sparkrun#292: the rank named, told from a rank that died (its log empty), its
    container Up all along."""
    failure = _the_failure(run)
    message = failure["message"]
    assert failure["node"] == "spark-worker-1", failure
    assert "serve log /tmp/sparkrun_serve.log empty or absent" in message, message
    assert "`sparkrun stop` and run the job again" in message, message
    _containers_up(run)


def prove_unresponsive(run: SuiteRun) -> None:
    """sparkrun#252: containers Up, /health and /v1/models answer, the model does not: the
    one failure names the head and the probe's timeout; no request check runs into it."""
    failure = _the_failure(run)
    assert failure["node"] == "spark-head", failure
    assert "got no answer in 30 s" in failure["message"], failure["message"]
    _containers_up(run)


PROOFS: dict[str, Callable[[SuiteRun], None]] = {
    "healthy-sparkrun-job": prove_attached,
    "loopback-head-address-as-master-addr-sparkrun-249": prove_loopback_master,
    "rank-container-on-sleep-infinity-its-serve-never-started-sparkrun-292": prove_never_started,
    "containers-up-model-unresponsive-sparkrun-252": prove_unresponsive,
}


def test_every_proof_names_a_row() -> None:
    assert set(PROOFS) <= {row.id for row in ROWS}, set(PROOFS) - {row.id for row in ROWS}
