"""Attach to a sparkrun job (issue #35, item 1): a two-node vllm-distributed job laid out on
sparksim as sparkrun 0.4.2 lays one out (``spark-sim job start``: labelled rank containers
``sparkrun_<intent>_<hash>_node_<rank>``, PID 1 ``sleep infinity``, ``vllm serve`` exec'd
with its output in /tmp/sparkrun_serve.log), and the whole suite run against it as a user
runs it after ``sparkrun run``: ``--spark-head``/``--spark-workers``, no
``--spark-container``. The suite finds the job by its labels over SSH, as on real Sparks.

Measured before this layout was read (2026-12-05, this sim): 2 failures (the serving env
"container vllm_node not found", the all-reduce "could not run") and 33 skips (the loaded
parity, nodes alike, the container checks, the reasoning and tool-call diagnoses, ...);
on the real sparkrun the issue saw 6 failures. After: none, every such check run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.sim


def _start(sim: Any, *args: str) -> dict[str, Any]:
    job: dict[str, Any] = json.loads(sim.cli("job", "start", *args).stdout)
    return job


@pytest.fixture(scope="module")
def job(sim: Any) -> Any:
    started = _start(sim)
    try:
        sim.wait_http(f"http://{sim.head['mgmt']}:8000/health", 200, timeout=180)
        yield started
    finally:
        sim.cli("job", "stop", check=False)


def test_the_whole_suite_attached_to_a_sparkrun_job_is_green(
    sim: Any, job: dict[str, Any], run_suite: Any
) -> None:
    head, worker = (n["name"] for n in sim.cluster["nodes"])
    ps = sim.out(head, "docker inspect -f '{{.Path}} {{.Args}}' " + job["containers"][head])
    assert ps.strip() == "bash [-c sleep infinity]", "PID 1 sleeps, as sparkrun's does"
    assert sim.out(head, f"docker logs {job['containers'][head]} 2>&1") == ""
    run = run_suite(timeout=900)
    assert run.ret == 0 and not run.not_passed(), run.output[-6000:]
    outcomes = {c["nodeid"]: c for c in run.results["checks"]}
    # the checks that read the serving containers ran (before: skipped, or failed)
    for nodeid in (
        "tests_e2e/test_readiness.py::test_serving_container_running[spark-head]",
        "tests_e2e/test_readiness.py::test_serving_container_running[spark-worker-1]",
        "tests_infra/test_preflight.py::test_serving_env_matches_fabric[spark-worker-1]",
        "tests_infra/test_preflight.py::test_gpu_not_held_by_others[spark-head]",
        "tests_infra/test_nccl.py::test_allreduce_does_not_hang_at_init",
        "tests_infra/test_alike.py::test_serving_image_alike",
    ):
        assert outcomes[nodeid]["outcome"] == "passed", outcomes[nodeid]
    loaded = [c for n, c in outcomes.items() if n.startswith("tests_infra/test_loaded.py")]
    assert loaded and all(c["outcome"] == "passed" for c in loaded), loaded
    assert run.results["serving"]["mode"] == "no-ray", run.results["serving"]
    _ = worker


def test_two_jobs_need_spark_job_and_it_picks_one(
    sim: Any, job: dict[str, Any], run_suite: Any
) -> None:
    other = _start(sim, "--intent", "gpt-oss-120b", "--recipe", "gpt-oss-120b-tp2")
    try:
        refused = run_suite("tests_e2e/test_readiness.py")
        assert refused.ret == 4, refused.output[-3000:]
        assert "2 sparkrun jobs run on the nodes" in refused.output, refused.output[-3000:]
        for cid in (job["cluster_id"], other["cluster_id"]):
            assert cid in refused.output
        assert not refused.results["checks"], "no check ran"
        picked = run_suite("tests_e2e/test_readiness.py", f"--spark-job={job['cluster_id']}")
        assert picked.ret == 0 and not picked.not_passed(), picked.output[-4000:]
    finally:
        sim.cli("job", "stop", "--cluster-id", other["cluster_id"], check=False)


def test_xdist_workers_attach_to_the_job_the_controller_found(
    sim: Any, job: dict[str, Any], run_suite: Any
) -> None:
    """Under xdist the controller finds the layout before its workers start; they read it
    from the run directory (the per-node containers, the serve log)."""
    run = run_suite(
        "-n", "2", "tests_e2e/test_readiness.py", "tests_infra/test_preflight.py",
        "tests_infra/test_loaded.py",
    )  # fmt: skip
    assert run.ret == 0 and not run.not_passed(), run.output[-4000:]
    outcomes = {c["nodeid"]: c["outcome"] for c in run.results["checks"]}
    for node in ("spark-head", "spark-worker-1"):
        assert outcomes[f"tests_e2e/test_readiness.py::test_serving_container_running[{node}]"] == (
            "passed"
        )


def test_rank_1_killed_in_its_running_container_is_one_failure_naming_it(
    sim: Any, job: dict[str, Any], run_suite: Any
) -> None:
    worker = sim.worker["name"]
    container = job["containers"][worker]
    sim.cli("fault", "rank-kill", "worker-1", "--name", container)
    assert sim.out(worker, f"docker inspect -f '{{{{.State.Status}}}}' {container}").strip() == (
        "running"
    ), "the container stays up: PID 1 is sleep infinity"
    run = run_suite(timeout=900)
    failed = run.not_passed()
    assert list(failed) == ["tests_e2e/test_readiness.py::test_cluster_serving"], (
        failed,
        run.output[-6000:],
    )
    headline = failed["tests_e2e/test_readiness.py::test_cluster_serving"].splitlines()[0]
    assert "on spark-worker-1: no vllm or ray process in the running container" in headline
    assert container in headline, headline
    (serving,) = [c for c in run.results["checks"] if c["nodeid"].endswith("test_cluster_serving")]
    assert serving["node"] == "spark-worker-1", serving
