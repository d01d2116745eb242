"""``pytest -n 4`` gives the verdicts of ``-n 0``, launches the cluster once and stops it once."""

from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, launch_args, run_suite, sim_fault  # type: ignore[import-not-found]
from pytest_spark.simcontrol import SimCluster

pytestmark = pytest.mark.sim
LOGS = "/tmp/pytest-spark-launch-*.log"  # one launcher output file per launch


def serving_containers(sim: SimCluster, name: str) -> list[str]:
    out = []
    for node in sim.info["nodes"]:
        proc = subprocess.run(
            [
                "ssh",
                "-F",
                str(sim.ssh_config),
                node["mgmt"],
                f"docker ps -q --filter name=^{name}$",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        out.append(proc.stdout.strip())
    return out


def test_xdist_same_verdicts_one_launch(sim: SimCluster, tmp_path: Path) -> None:
    sim_fault(sim, "clear")
    suite = [
        str(REPO / "tests_infra" / "test_link.py"),
        str(REPO / "tests_e2e" / "test_readiness.py"),
        *launch_args(sim),
        "--spark-history=off",
    ]
    verdicts = {}
    for workers in ("0", "4"):
        name = f"vllm_xdist_{workers}_{os.getpid()}"  # this run's launches alone
        before = set(glob.glob(LOGS))
        run = run_suite(
            tmp_path / workers, "-n", workers, *suite, f"--spark-container={name}", sim=sim
        )
        assert run.ret == 0, run.output
        launches = [p for p in set(glob.glob(LOGS)) - before if name in Path(p).read_text()]
        assert len(launches) == 1, (workers, launches)
        assert serving_containers(sim, name) == ["", ""], "not torn down"
        assert run.results["serving"]["stopped"] is True
        verdicts[workers] = run.outcomes()
    assert verdicts["4"] == verdicts["0"]
    assert len(verdicts["0"]) == 26 + 8
