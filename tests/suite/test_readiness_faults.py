"""Readiness against sparksim: a worker dying after ready is caught in attach mode; attach
mode reports what it finds. That every load failure is caught by the startup watch with
the node, the signature, a fix and every node's log tail, long before the ready timeout,
is proved on the fault matrix's crash and hang rows, with Ray and without
(tests/suite/test_fault_matrix.py, ``prove_fails_fast_with_evidence``): the same launches,
run once."""

from __future__ import annotations

import shlex
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest

from conftest import (  # type: ignore[import-not-found]
    REPO,
    SuiteRun,
    assert_one_failure_the_rest_point_at_it,
    launch_args,
    node_run,
    node_ssh,
    run_suite,
    serving_containers,
    sim_fault,
    stop_serving,
)
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim
READINESS = str(REPO / "tests_e2e" / "test_readiness.py")
READINESS_ID = "tests_e2e/test_readiness.py"


def launch_with(sim: SimCluster, tmp_path: Path, *extra: str) -> tuple[SuiteRun, float]:
    t0 = time.monotonic()
    run = run_suite(
        tmp_path,
        READINESS,
        *launch_args(sim),
        "--spark-history=off",
        "--spark-ready-timeout=300",
        *extra,
        sim=sim,
    )
    return run, time.monotonic() - t0


def test_keep_then_attach_then_worker_death(sim: SimCluster, tmp_path: Path) -> None:
    sim_fault(sim, "clear")
    attach = [
        READINESS,
        "--spark-history=off",
        "--spark-container=vllm_node",
        f"--spark-serve-args={sim.info['launch']['serve_args']}",
    ]
    try:
        run, _ = launch_with(sim, tmp_path / "keep", "--spark-keep")
        assert run.ret == 0, run.output
        assert all(serving_containers(sim).values()), "--spark-keep left nothing running"
        again = run_suite(tmp_path / "attach", *attach, sim=sim)
        assert again.ret == 0, again.output
        assert again.results["serving"]["launched"] is False
        sim_fault(sim, "worker-kill", "spark-2")
        time.sleep(3)
        t0 = time.monotonic()
        dead = run_suite(tmp_path / "dead", *attach, sim=sim)
        assert time.monotonic() - t0 < 60
        assert_one_failure_the_rest_point_at_it(dead, "serving container exited on spark-worker-1")
        # The lost rank is the serving verdict's one failure; the container check on that
        # node says what it saw and skips citing it.
        (lost,) = dead.checks(
            nodeid=f"{READINESS_ID}::test_serving_container_running[spark-worker-1]"
        )
        assert lost["outcome"] == "skipped", lost
        assert lost["message"].startswith("spark-worker-1: container"), lost
        assert "test_cluster_serving has the evidence" in lost["message"], lost
        message = dead.results["serving"]["message"]
        assert "serving container exited on spark-worker-1" in message, message
        assert "/health answers 503" in message and "TP rank" in message
    finally:
        stop_serving(sim)
        sim_fault(sim, "clear")
    assert list(serving_containers(sim).values()) == ["", ""]


def test_attach_to_a_cluster_that_is_not_serving(sim: SimCluster, tmp_path: Path) -> None:
    sim_fault(sim, "clear")
    t0 = time.monotonic()
    run = run_suite(tmp_path, READINESS, "--spark-history=off", sim=sim)
    assert time.monotonic() - t0 < 60
    assert_one_failure_the_rest_point_at_it(run, "attach mode")
    message = run.checks(outcome="failed")[0]["message"]
    assert "attach mode: the cluster is not serving" in message
    assert (
        "connection refused" in message and "vllm_node" in message and "--spark-launch" in message
    )


def operator_container(sim: SimCluster, serve: str) -> str:
    """``docker run`` of a serving container the way an operator runs one by hand (compose
    style, no --rm: ``docker start`` brings it back with its earlier output kept), with
    the mounts sparksim's launcher gives its containers; the emulator loads in ~7 s."""
    mounts = {
        "/root/.sparksim": "/etc/sparksim:ro",
        "/root/models": "/models",
        "/usr/local/sbin": "/usr/local/sbin:ro",
        str(sim.state_dir): f"{sim.state_dir}:ro",
        sysconfig.get_paths()["purelib"]: "/opt/sparksim/torch-site:ro",
    }
    argv = ["docker", "run", "-d", "--name", "vllm_node", "--network", "host", "--ipc=host"]
    for host, inside in mounts.items():
        argv += ["-v", f"{host}:{inside}"]
    for env in (
        "PYTHONPATH=/opt/sparksim/torch-site",
        "PYTHONUNBUFFERED=1",
        "SPARKSIM_EMU_TIME_SCALE=0.02",
        "SPARKSIM_EMU_MODEL_GIB=20",
    ):
        argv += ["-e", env]
    image = sim.info["launch"]["image"]
    return shlex.join([*argv, "--entrypoint=", image, *shlex.split(serve)])


# No container named vllm_node, in any state: an earlier test's --rm container may still be
# being removed (`docker stop` returns before the daemon removes it), holding the name.
NO_VLLM_NODE = (
    "docker rm -f vllm_node >/dev/null 2>&1; i=0; "
    "while docker inspect vllm_node >/dev/null 2>&1 && [ $i -lt 60 ]; "
    "do sleep 0.5; i=$((i+1)); done"
)


def start_operator_container(sim: SimCluster, serve: str) -> None:
    """The operator's container, started on the head; a `docker run` that fails (a name
    still held, a start refused on a loaded machine) is tried once more, and two failures
    fail the test with both errors: the setup, not the verdict under test."""
    errors = []
    for _ in range(2):
        started = node_run(sim, sim.head, f"{NO_VLLM_NODE}; {operator_container(sim, serve)}")
        if started.returncode == 0:
            return
        errors.append(f"exit {started.returncode}: {started.stderr.strip()[-600:]}")
    pytest.fail(f"docker run of the operator's container on {sim.head} failed twice: {errors}")


def _not_healthy(sim: SimCluster, probe: subprocess.CompletedProcess[str]) -> str:
    """Why the operator's container is not healthy after 120 s: the last probe (exit 255:
    ssh itself failed), the container's state and its last log lines."""
    state = node_run(
        sim,
        sim.head,
        "docker ps -a --filter name=^vllm_node$ --format '{{.Status}}'; "
        "docker logs vllm_node 2>&1 | tail -20",
    )
    return f"/health probe: {probe}\ncontainer: {state}"


def test_attach_while_loading_after_a_restart(sim: SimCluster, tmp_path: Path) -> None:
    """Issue #13 part 3: a `docker start`ed container loads again with its previous run's
    "Application startup complete." still in `docker logs`. Attached at once, the watch
    reads only this start: its phases in order, and ready when /health answers 200. Its
    engine then killed, test_cluster_serving is the one failure, with the container's
    state and its last log lines."""
    sim_fault(sim, "clear")
    serve = (
        "vllm serve /models/Qwen3.5-122B-A10B-FP8 --served-model-name qwen3.5-122b "
        "--tensor-parallel-size 1 --gpu-memory-utilization 0.90 --port 8000"
    )
    health = "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health"
    try:
        start_operator_container(sim, serve)
        deadline = time.monotonic() + 120
        while (probe := node_run(sim, sim.head, health)).stdout.strip() != "200":
            assert time.monotonic() < deadline, _not_healthy(sim, probe)
            time.sleep(1)
        node_ssh(sim, sim.head, "docker stop vllm_node >/dev/null && docker start vllm_node")
        assert "startup complete" in node_ssh(sim, sim.head, "docker logs vllm_node 2>&1")
        run = run_suite(
            tmp_path, READINESS, "--spark-history=off", f"--spark-serve-args={serve}", sim=sim
        )
        # Then the head's engine is killed (SIGKILL, as the OOM killer does): the container
        # stays, exited (code 137). Issue #25 part 4: the one failure carries its state
        # and its last log lines, not only "Connection refused".
        node_ssh(sim, sim.head, "docker kill vllm_node >/dev/null")
        (tmp_path / "killed").mkdir()
        killed = run_suite(
            tmp_path / "killed",
            READINESS,
            "--spark-history=off",
            f"--spark-serve-args={serve}",
            sim=sim,
        )
    finally:
        node_ssh(sim, sim.head, "docker rm -f vllm_node >/dev/null 2>&1; true")
    failed = killed.failed()
    assert list(failed) == ["test_cluster_serving"], (failed, killed.output[-3000:])
    message = failed["test_cluster_serving"]
    assert "exited (code 137)" in message, message
    assert "startup complete" in message, message  # the head's last log lines
    assert run.ret == 0, run.output
    serving = run.results["serving"]
    assert serving["status"] == "ready" and serving["launched"] is False
    phases = [p["phase"] for p in serving["timeline"]]
    assert phases[:2] == ["start", "weights"] and phases[-1] == "ready", serving["timeline"]
    ready_at = serving["timeline"][-1]["start_s"]
    assert ready_at > 1.0, serving["timeline"]  # the earlier run's "ready" was not read
