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
    PROOFS.get(row.id, _nothing_more)(run)


def _checks(run: SuiteRun, prefix: str) -> dict[str, dict[str, Any]]:
    return {
        c["nodeid"].removeprefix(prefix): c
        for c in run.results["checks"]
        if c["nodeid"].startswith(prefix)
    }


def _nothing_more(run: SuiteRun) -> None:
    _ = run


def prove_attached(run: SuiteRun) -> None:
    """Healthy: the suite found the job by its labels and read each rank's container."""
    serving = run.results["serving"]
    assert serving["status"] == "ready" and serving["mode"] == "no-ray", serving
    readiness = _checks(run, READINESS)
    for node in ("spark-head", "spark-worker-1"):
        check = readiness[f"test_serving_container_running[{node}]"]
        assert check["outcome"] == "passed", check


PROOFS: dict[str, Callable[[SuiteRun], None]] = {
    "healthy-sparkrun-job": prove_attached,
}
