"""``pytest -n 4`` gives the verdicts of ``-n 0``, launches the cluster once and stops it once,
runs the all-reduce and the throughput sweep once, each alone on the cluster."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (  # type: ignore[import-not-found]
    REPO,
    SuiteRun,
    launch_args,
    run_suite,
    serving_containers,
    sim_fault,
)
from pytest_spark.access.simcontrol import SimCluster
from pytest_spark.report.results import CATEGORIES

pytestmark = pytest.mark.sim


def ssh(sim: SimCluster, mgmt: str, command: str) -> str:
    proc = subprocess.run(
        ["ssh", "-F", str(sim.ssh_config), mgmt, command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def container_events(sim: SimCluster, name: str, since: int) -> list[list[str]]:
    """Each node's docker events for the container since then: one launch is one ``start``
    on every node, its stop one ``die`` (the launcher's log on the head is removed when it
    stops, and a node's /tmp is its own)."""
    fmt = "{{.Action}}"
    cmd = (
        f"docker events --since {since} --until $(date +%s.%N) --filter container={name} "
        f"--filter event=start --filter event=die --format '{fmt}'"
    )
    return [ssh(sim, n["mgmt"], cmd).split() for n in sim.info["nodes"]]


MEASUREMENTS = ("gpu-load", "collective-run", "throughput-sweep")
# Trimmed for CI time: the NCCL sweep up to 2 MiB, the throughput sweep at 1 and 4 streams.
# At 2 MiB the sim's healthy busbw (~0.11 GB/s at 1 Gbit/s, less on a loaded machine) would
# straddle the profile's 0.09 floor and make the two verdicts differ by CPU load, not by -n.
TRIM = (
    "--spark-threshold",
    "nccl.max_bytes=2097152",
    "--spark-threshold",
    "nccl.iters=5",
    "--spark-threshold",
    "nccl.warmup=1",
    "--spark-threshold",
    "nccl.min_busbw_gbps=0.05",
    "--spark-threshold",
    "throughput.concurrency=1;4",
)


def measurement_ids(run: SuiteRun) -> dict[str, set[str]]:
    """The id of every measurement the checks used (each attaches its record)."""
    ids: dict[str, set[str]] = {}
    for check in run.results["checks"]:
        record = check["extra"].get("measurement")
        if record:
            ids.setdefault(record["name"], set()).add(record["id"])
    return ids


def sweep_foreign_tokens(run: SuiteRun) -> int:
    """Tokens the server generated during the sweep beyond the sweep's own levels: the
    warm-up alone when the sweep ran alone, more when other tests sent requests meanwhile."""
    (doc,) = [c["extra"]["sweep"] for c in run.results["checks"] if "sweep" in c["extra"]]
    view = doc["server_metrics"]
    assert view is not None, "the served model exposes no vllm:generation_tokens"
    return int(view["generation_tokens"]) - int(view["client_output_tokens"])


def test_xdist_same_verdicts_one_launch_one_measurement(sim: SimCluster, tmp_path: Path) -> None:
    sim_fault(sim, "clear")
    suite = [
        str(REPO / "tests_infra"),
        str(REPO / "tests_e2e"),
        *launch_args(sim),
        # The image to look for, as an operator gives it: without it test_docker_ready looks
        # for the serving container's, and passes or skips on a node by whether the launch
        # has reached that node when the preflight probe runs (a race, not a verdict).
        f"--spark-image={sim.info['launch']['image']}",
        *TRIM,
        "--spark-history=off",
    ]
    verdicts, foreign = {}, {}
    for workers in ("0", "4"):
        name = f"vllm_xdist_{workers}_{os.getpid()}"  # this run's launch alone
        since = int(time.time()) - 1
        run = run_suite(
            tmp_path / workers,
            "-n",
            workers,
            *suite,
            f"--spark-container={name}",
            sim=sim,
            timeout=1200,
        )
        assert container_events(sim, name, since) == [["start", "die"]] * 2, workers
        assert list(serving_containers(sim, name).values()) == ["", ""], "not torn down"
        assert run.results["serving"]["stopped"] is True
        ids = measurement_ids(run)
        assert {k: len(v) for k, v in ids.items()} == dict.fromkeys(MEASUREMENTS, 1), (
            workers,
            ids,
        )
        foreign[workers] = sweep_foreign_tokens(run)
        verdicts[workers] = run.outcomes()
        assert {c["category"] for c in run.results["checks"]} == set(CATEGORIES)
    assert verdicts["4"] == verdicts["0"], {
        k: (verdicts["0"].get(k), v) for k, v in verdicts["4"].items() if verdicts["0"].get(k) != v
    }
    assert foreign["4"] == foreign["0"], "requests from other tests during the throughput sweep"
