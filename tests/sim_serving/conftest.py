"""Fixtures for the sparksim serving-stack tests: one two-node sim per module, driven
through the ``spark-sim`` CLI, SSH and the nodes' docker CLI exactly as users drive it.

Tests marked ``sim`` need root, iproute2, openssh-server and docker.io (dockerd,
containerd, runc); they are skipped with the reason when any is missing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = "/root/spark-vllm-docker/launch-cluster.sh"


def _missing() -> str | None:
    if sys.platform != "linux":
        return "sparksim needs Linux network namespaces"
    if os.geteuid() != 0:
        return "sparksim needs root (network namespaces, veth, tc, sshd, dockerd)"
    for tool in ("ip", "tc", "unshare", "nsenter", "ssh", "ssh-keygen", "docker"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (iproute2, util-linux, openssh-client, docker.io)"
    for path, pkg in (("/usr/sbin/sshd", "openssh-server"), ("/usr/sbin/dockerd", "docker.io")):
        if not os.access(path, os.X_OK):
            return f"{path} not installed (apt-get install {pkg})"
    for tool in ("containerd", "runc"):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"{tool} not installed (apt-get install docker.io)"
    return None


SKIP_REASON = _missing()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SKIP_REASON is None:
        return
    here = Path(__file__).parent
    for item in items:
        if item.get_closest_marker("sim") and here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def spark_sim(
    state_dir: Path, *args: str, check: bool = True, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SPARKSIM_STATE_DIR", None)
    env.pop("SPARKSIM_NO_DOCKER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "sparksim", "--state-dir", str(state_dir), *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout,
    )  # fmt: skip
    if check:
        assert proc.returncode == 0, (
            f"spark-sim {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


@dataclass
class Sim:
    state_dir: Path
    cluster: dict[str, Any]

    @property
    def instance(self) -> int:
        return int(self.cluster["instance"])

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.cluster["nodes"] if n["name"] == name)

    @property
    def head(self) -> dict[str, Any]:
        return self.cluster["nodes"][0]

    @property
    def worker(self) -> dict[str, Any]:
        return self.cluster["nodes"][1]

    def fabric_ip(self, name: str) -> str:
        return str(self.node(name)["fabric"][0]["addr"])

    def ssh(self, name: str, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ssh", "-F", self.cluster["ssh_config"], self.node(name)["mgmt"], command],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def out(self, name: str, command: str, timeout: float = 60) -> str:
        proc = self.ssh(name, command, timeout)
        assert proc.returncode == 0, (
            f"{name}: {command!r} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
        return proc.stdout

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return spark_sim(self.state_dir, *args, check=check)

    def launch(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``launch-cluster.sh -n HEAD,WORKER ARGS`` on the head, over SSH."""
        nodes = ",".join(self.fabric_ip(n["name"]) for n in self.cluster["nodes"])
        cmd = shlex.join([LAUNCHER, "-n", nodes, *args])
        return self.ssh(self.head["name"], cmd, timeout)

    def http_status(self, url: str) -> int | None:
        """HTTP status of GET url; None while nothing listens (connection refused)."""
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError):
            return None

    def wait_http(self, url: str, want: int, timeout: float) -> float:
        start = time.monotonic()
        last: int | None = None
        while time.monotonic() - start < timeout:
            last = self.http_status(url)
            if last == want:
                return time.monotonic() - start
            time.sleep(0.1)
        raise AssertionError(f"GET {url}: {last}, expected {want} within {timeout:.0f} s")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One two-node sim (with its serving stack) per module, always taken down."""
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    state_dir = tmp_path_factory.mktemp("sparksim-serving")
    try:
        proc = spark_sim(state_dir, "up", "--nodes", "2")
        yield Sim(state_dir=state_dir, cluster=json.loads(proc.stdout))
    finally:
        spark_sim(state_dir, "down", check=False)


@dataclass
class SuiteRun:
    """One run of the suite (tests_infra / tests_e2e) against a sim, as a user runs it."""

    ret: int
    output: str
    results: dict[str, Any]

    def not_passed(self) -> dict[str, str]:
        """nodeid -> message of every failed or error check."""
        return {
            c["nodeid"]: c.get("message") or ""
            for c in self.results.get("checks", [])
            if c["outcome"] in ("failed", "error")
        }


@pytest.fixture
def run_suite(sim: Sim, tmp_path: Path) -> Any:
    """``run_suite(*args)``: ``pytest --spark-head=... ARGS`` against ``sim`` in a
    subprocess, from the checkout, reading the verdicts from its JSON results."""
    runs = iter(range(1000))

    def run(*args: str, timeout: float = 600, workers: bool = True) -> SuiteRun:
        results = tmp_path / f"results-{next(runs)}.json"
        nodes = [f"--spark-workers={sim.worker['mgmt']}"] if workers else []
        argv = [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs",
            f"--spark-results={results}", "--rootdir", str(REPO),
            "-c", str(REPO / "pyproject.toml"),
            f"--spark-head={sim.head['mgmt']}", *nodes,
            f"--spark-ssh-config={sim.cluster['ssh_config']}", "--spark-profile=sim", *args,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
        proc = subprocess.run(
            argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env
        )
        data = json.loads(results.read_text()) if results.exists() else {"checks": []}
        return SuiteRun(proc.returncode, proc.stdout + proc.stderr, data)

    return run
