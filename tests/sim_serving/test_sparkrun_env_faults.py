"""Faults on a sparkrun job laid out on sparksim (``spark-sim job start``: real dockerd per
node, the rank containers' real environment read from the rank process's /proc/PID/environ),
the suite attached as after ``sparkrun run``: exactly one failure in the categories that
judge it, naming node, measured, expected, fix.

- sparkrun#135, the head's NCCL_IB_HCA / NCCL_SOCKET_IFNAME pushed to a worker cabled on
  the other port. The sim cables every node on the f1 port; the worker's rank gets the
  f0 port's names, the port with no cable there (Down in its ibdev2netdev), as a worker
  cabled the other way has the head's port Down. (The emulator does not bind NCCL or gloo
  to these names: the serve stays up, where real vLLM would hang at NCCL init.)

- rank 1 killed in its running container (``spark-sim fault rank-kill``), the whole suite
  attached: one failure, naming it (it was tests/sim_serving/test_sparkrun_attach.py's, on
  this job model; the module's other tests run on the real CLI's job now, whose container
  goes when its rank is killed).

The others run on the real CLI's job (tests/sim_serving/test_real_sparkrun.py), not on a
job of their own here: PR #219's GLOO/NCCL on the wired management link, passing with a
note, is sparkrun's own init there (the attached and the launched whole-suite runs hold
the note); #229, a job left running beside the one ``--spark-job`` picks, is its two-jobs
test. PR #219 on the default-route WiFi, and the healthy job, are docs/FAULT_MATRIX.md's
"sparkrun jobs" table (tests/suite/test_sparkrun_faults.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.sim
W = "spark-worker-1"
CATEGORIES = "preflight or nccl"
CABLED_OTHER_WAY = [
    *("--env-node", W, "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0"),
    *("--env-node", W, "NCCL_SOCKET_IFNAME=enp1s0f0np0"),
    *("--env-node", W, "GLOO_SOCKET_IFNAME=enp1s0f0np0"),
]


def _start(sim: Any, *args: str) -> dict[str, Any]:
    job: dict[str, Any] = json.loads(sim.cli("job", "start", *args).stdout)
    sim.wait_http(f"http://{sim.head['mgmt']}:8000/health", 200, timeout=180)
    return job


def _run(run_suite: Any, job: dict[str, Any]) -> Any:
    run = run_suite(
        "tests_infra", "-m", CATEGORIES, f"--spark-job={job['cluster_id']}", timeout=900
    )
    print(json.dumps(run.not_passed(), indent=1))  # the failures, for -s
    return run


def _names(sim: Any) -> tuple[str, str]:
    """The sim's names of the head and the worker (the suite's are their hostnames)."""
    head, worker = (n["name"] for n in sim.cluster["nodes"])
    return head, worker


def test_head_env_on_a_worker_cabled_the_other_way(sim: Any, run_suite: Any) -> None:
    job = _start(sim, *CABLED_OTHER_WAY)
    try:
        worker = _names(sim)[1]
        env = sim.out(worker, f"docker exec {job['containers'][worker]} env")
        assert "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0" in env, env
        run = _run(run_suite, job)
    finally:
        sim.cli("job", "stop", check=False)
    failed = run.not_passed()
    assert list(failed) == [
        f"tests_infra/test_preflight.py::test_serving_env_matches_fabric[{W}]"
    ], run.output[-6000:]
    message = next(iter(failed.values()))
    assert "NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f0 names rocep1s0f0 (port not Up on" in message
    assert f"Up on {W} (ibdev2netdev): " in message
    assert f"on {W} set its own NCCL_IB_HCA=" in message


def test_rank_1_killed_in_its_running_container_is_one_failure_naming_it(
    sim: Any, run_suite: Any
) -> None:
    job = _start(sim)
    head, worker = _names(sim)
    container = job["containers"][worker]
    try:
        # sparksim's job model is sparkrun's layout: PID 1 sleeps, and vLLM's output is in
        # the serve log, not docker's
        ps = sim.out(head, "docker inspect -f '{{.Path}} {{.Args}}' " + job["containers"][head])
        assert ps.strip() == "bash [-c sleep infinity]", "PID 1 sleeps, as sparkrun's does"
        assert sim.out(head, f"docker logs {job['containers'][head]} 2>&1") == ""
        sim.cli("fault", "rank-kill", "worker-1", "--name", container)
        status = sim.out(worker, f"docker inspect -f '{{{{.State.Status}}}}' {container}")
        assert status.strip() == "running", "the container stays up: PID 1 is sleep infinity"
        run = run_suite(timeout=900)
    finally:
        sim.cli("job", "stop", check=False)
    failed = run.not_passed()
    assert list(failed) == ["tests_e2e/test_readiness.py::test_cluster_serving"], (
        failed,
        run.output[-6000:],
    )
    headline = failed["tests_e2e/test_readiness.py::test_cluster_serving"].splitlines()[0]
    assert f"on {W}: no vllm or ray process in the running container" in headline
    assert container in headline, headline
    (serving,) = [c for c in run.results["checks"] if c["nodeid"].endswith("test_cluster_serving")]
    assert serving["node"] == W, serving
