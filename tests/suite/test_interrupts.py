"""Ctrl-C and SIGTERM during the readiness wait: the launched cluster is stopped on every
node, the JSON results and the HTML report are written, the exit code is pytest's
interrupted code (2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, serving_containers, sim_fault  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim


@pytest.fixture
def slow_sim(sim: SimCluster) -> Iterator[SimCluster]:
    if not sim.info.get("launch"):
        pytest.skip("sparksim has no serving stack here (docker missing)")
    sim_fault(sim, "clear")
    sim_fault(sim, "engine", "slow-load")  # a load long enough to interrupt
    yield sim
    sim_fault(sim, "clear")


def default_sigint() -> None:
    """In the child: Ctrl-C's default. A run started in the background (`cmd &` in a
    script, as some CI runners do) inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler: the signal this test sends would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_readiness_stops_what_was_launched(
    slow_sim: SimCluster, tmp_path: Path, sig: signal.Signals
) -> None:
    launch = slow_sim.info["launch"]
    results, html = tmp_path / "results.json", tmp_path / "report.html"
    argv = [
        str(REPO / ".venv" / "bin" / "pytest"),
        str(REPO / "tests_e2e" / "test_readiness.py"),
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(REPO),
        "-c",
        str(REPO / "pyproject.toml"),
        f"--spark-head={slow_sim.head}",
        f"--spark-workers={','.join(slow_sim.workers)}",
        f"--spark-ssh-config={slow_sim.ssh_config}",
        "--spark-profile=sim",
        "--spark-launch",
        f"--spark-launch-script={launch['script']}",
        f"--spark-serve-args={launch['serve_args']}",
        "--spark-ready-timeout=300",
        "--spark-hang-timeout=120",
        f"--spark-results={results}",
        f"--html={html}",
        "--spark-history=off",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=default_sigint,
    )
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:  # wait until the launcher runs and readiness is being watched
        seen.append(line)
        if ("vLLM startup:" in line and "weights" in line) or time.monotonic() > deadline:
            break
    assert any("vLLM startup:" in line for line in seen), "".join(seen)
    # The progress line reaches a pipe (a CI log) while the wait goes on, not at exit.
    assert proc.poll() is None, "progress came only when pytest ended: not flushed"
    during = serving_containers(slow_sim)
    assert all(during.values()), during  # launched on every node
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=180)
    output = "".join(seen) + rest
    assert proc.returncode == 2, output
    assert serving_containers(slow_sim) == {n["name"]: "" for n in slow_sim.info["nodes"]}, output
    doc = json.loads(results.read_text())
    assert doc["exitstatus"] == 2
    assert doc["serving"]["launched"] is True and doc["serving"]["stopped"] is True
    assert doc["serving"]["status"] == "launching", doc["serving"]  # caught mid-wait
    assert html.exists() and "INTERRUPTED" in html.read_text().upper()
