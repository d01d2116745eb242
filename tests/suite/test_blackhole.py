"""A node blackholed mid-session (``spark-sim fault unreachable NODE --how cut``: its
namespace cut from the management bridge, packets silently dropped) while the readiness
watch talks to it over SSH:

- a drop that heals within the retry window costs nothing: readiness passes, the retries
  show in the terminal;
- a node that stays cut is reported by name, with the last error, and the whole session
  (readiness retries, teardown of what was launched, JSON results) ends within a budget
  computed from the settings, with an explicit margin; checks of the other node keep
  their verdicts and nothing is left running.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import (  # type: ignore[import-not-found]
    REPO,
    launch_args,
    serving_containers,
    sim_fault,
    stop_serving,
)
from pytest_spark.access.retry import for_connection
from pytest_spark.access.simcontrol import SimCluster
from pytest_spark.launchers.launch_cluster.launcher import STOP_TIMEOUT_S
from pytest_spark.readiness.probe import PROBE_TIMEOUT_S

pytestmark = pytest.mark.sim

CONNECT_TIMEOUT = 3.0  # --spark-connect-timeout: every bound below follows from it
# Start-up, result writing and a machine shared with other test runs: the margin on top
# of what the settings allow.
MARGIN_S = 60.0
READINESS = str(REPO / "tests_e2e" / "test_readiness.py")
INFRA = str(REPO / "tests_infra")


def session_budget() -> float:
    """From the blackhole on: the readiness retries (detection, backoff and every retry,
    ``Backoff.budget_s``), then the teardown's stop of what was launched (its own command
    bound, or two connect timeouts when the head is gone), plus the margin."""
    policy = for_connection(CONNECT_TIMEOUT, PROBE_TIMEOUT_S)
    return policy.budget_s + STOP_TIMEOUT_S + 2 * CONNECT_TIMEOUT + MARGIN_S


@dataclass
class LiveRun:
    """The suite running in a subprocess, its output read as it comes."""

    proc: subprocess.Popen[str]
    results: Path
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(predicate(line) for line in list(self.lines)):
                return True
            if self.proc.poll() is not None:
                self._reader.join(5)
                return any(predicate(line) for line in self.lines)
            time.sleep(0.1)
        return False

    def finish(self, timeout: float) -> tuple[int, str, dict[str, object]]:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            rc = -9
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        if rc == -9:
            pytest.fail(
                f"session still running {timeout:.0f} s after the blackhole:\n{self.output}"
            )
        data = json.loads(self.results.read_text()) if self.results.exists() else {}
        return rc, self.output, data

    @property
    def output(self) -> str:
        return "".join(self.lines)


def start_suite(sim: SimCluster, tmp_path: Path, *args: str) -> LiveRun:
    results = tmp_path / "results.json"
    argv = [
        str(REPO / ".venv" / "bin" / "pytest"), "-p", "no:cacheprovider", "-q", "-rfEs",
        "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"),
        f"--spark-head={sim.head}", f"--spark-workers={','.join(sim.workers)}",
        f"--spark-ssh-config={sim.ssh_config}", "--spark-profile=sim",
        f"--spark-results={results}", "--spark-history=off",
        f"--spark-connect-timeout={CONNECT_TIMEOUT:g}",
        "--spark-ready-timeout=300", "--spark-hang-timeout=120",
        "--spark-threshold=readiness.max_load_s=300",  # slow-load and a drop: a long load
        *launch_args(sim), *args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    return LiveRun(proc, results)


def loading(line: str) -> bool:
    """The launch is under way and the readiness watch polls every node."""
    return "vLLM startup:" in line


def _loading_sim(sim: SimCluster, fault: str) -> Iterator[SimCluster]:
    if not sim.info.get("launch"):
        pytest.skip("sparksim has no serving stack here (docker missing)")
    sim_fault(sim, "clear")
    sim_fault(sim, "engine", fault)
    yield sim
    sim_fault(sim, "clear")
    stop_serving(sim)


@pytest.fixture
def slow_sim(sim: SimCluster) -> Iterator[SimCluster]:
    """A load long enough to cut a node in and heal it (~25 s), short enough to end."""
    yield from _loading_sim(sim, "slow-load")


@pytest.fixture
def crawling_sim(sim: SimCluster) -> Iterator[SimCluster]:
    """A load (~150 s) that cannot end before the watch gives a cut node up: with
    slow-load's ~25 s, a loaded machine let the load finish first (the session then went
    ready without the worker, and its checks met the cut node one by one)."""
    yield from _loading_sim(sim, "crawl-load")


def test_transient_drop_during_readiness_heals(slow_sim: SimCluster, tmp_path: Path) -> None:
    run = start_suite(slow_sim, tmp_path, READINESS)
    assert run.wait_for(loading, 120), run.output
    sim_fault(slow_sim, "unreachable", "worker-1")
    # Healed as soon as the watch has noticed the loss (TCP itself rides out shorter
    # drops): the node then answers within the retry window.
    noticed = run.wait_for(lambda line: "lost connection to spark-worker-1" in line, 120)
    sim_fault(slow_sim, "unreachable", "worker-1", "--restore")
    assert noticed, run.output
    rc, output, results = run.finish(timeout=session_budget())
    assert "lost connection to spark-worker-1, retry 1/" in output, output
    assert "spark-worker-1 answers again after" in output, output
    assert rc == 0, output
    serving = results["serving"]
    assert isinstance(serving, dict) and serving["status"] == "ready", serving


@pytest.mark.parametrize(
    ("node", "name", "other"),
    [("worker-1", "spark-worker-1", "spark-head"), ("head", "spark-head", "spark-worker-1")],
)
def test_blackholed_node_ends_the_session_within_budget(
    crawling_sim: SimCluster, tmp_path: Path, node: str, name: str, other: str
) -> None:
    run = start_suite(
        crawling_sim, tmp_path, INFRA, READINESS, "-m", "link or preflight or readiness"
    )
    assert run.wait_for(loading, 300), run.output
    sim_fault(crawling_sim, "unreachable", node)
    cut_at = time.monotonic()
    budget = session_budget()
    rc, output, results = run.finish(timeout=budget)
    took = time.monotonic() - cut_at
    print(f"{name} blackholed: session ended {took:.1f} s later (budget {budget:.0f} s)")
    assert took < budget, output
    assert rc == 1, output

    # The blackholed node is named, with the last error and what to check.
    serving = results["serving"]
    assert isinstance(serving, dict) and serving["status"] == "failed", serving
    message = str(serving["message"])
    assert f"lost the node while waiting on {name}" in message, message
    assert "no SSH connection after" in message and "last error" in message, message
    assert "management link" in message and "sshd" in message, message
    assert f"lost connection to {name}, retry 1/" in output, output
    verdicts = results["checks"]
    assert isinstance(verdicts, list)
    bad = [c for c in verdicts if c["outcome"] in ("failed", "error")]
    assert bad and all(name in c["message"] for c in bad), bad  # each one names the node

    # The other node's infra checks gave verdicts before the cut, and they stand.
    theirs = {
        c["nodeid"]: c["outcome"]
        for c in verdicts
        if c.get("node") == other and c["category"] in ("link", "preflight")
    }
    assert "passed" in theirs.values() and "error" not in theirs.values(), theirs

    # Teardown of what was launched was attempted and bounded; nothing is left running.
    assert serving["launched"] is True
    if node == "head":
        assert "could not stop the cluster" in output and name in output, output
    else:
        assert serving.get("stopped") is True, serving
    sim_fault(crawling_sim, "clear")
    stop_serving(crawling_sim)  # the head could not be told while it was cut
    assert serving_containers(crawling_sim) == {n["name"]: "" for n in crawling_sim.info["nodes"]}
