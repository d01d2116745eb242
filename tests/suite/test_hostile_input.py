"""Config values reach remote shells literally: a served model name with spaces, quotes,
`$()` and `;` is served, reported and compared as written; nothing it names runs."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_suite, sim_fault  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim


def test_hostile_served_model_name_is_literal(sim: SimCluster, tmp_path: Path) -> None:
    launch = sim.info.get("launch")
    if not launch:
        pytest.skip("sparksim has no serving stack here (docker missing)")
    sim_fault(sim, "clear")
    canary = f"/tmp/pytest-spark-pwned-{tmp_path.name}"
    name = f"""my model's "x" $(touch {canary}); touch {canary} `touch {canary}`"""
    serve = shlex.split(launch["serve_args"])
    serve[serve.index("--served-model-name") + 1] = name
    run = run_suite(
        tmp_path,
        str(REPO / "tests_e2e" / "test_readiness.py"),
        "--spark-launch",
        f"--spark-launch-script={launch['script']}",
        f"--spark-serve-args={shlex.join(serve)}",
        "--spark-history=off",
        sim=sim,
    )
    assert run.ret == 0, run.output
    check = run.checks(nodeid="tests_e2e/test_readiness.py::test_served_model_matches_launch_args")[
        0
    ]
    assert check["measured"]["id"] == name
    for node in sim.info["nodes"]:
        probe = subprocess.run(
            [
                "ssh",
                "-F",
                str(sim.ssh_config),
                node["mgmt"],
                f"ls {canary} 2>/dev/null; docker ps -aq",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert canary not in probe.stdout, f"{node['name']} ran a command from the name"
    assert not Path(canary).exists()
