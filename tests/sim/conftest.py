"""Fixtures for the sparksim tests: a session-wide two-node sim and a CLI runner.

Tests marked ``sim`` need root, iproute2, tc, unshare and openssh-server; they are
skipped with the reason when any is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_standalone(name: str, directory: Path) -> ModuleType:
    """Import a package from ``directory`` under ``name``, without its parent package:
    the way the sim (``python3 sparksim``) and the node tools run."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def sparksim() -> ModuleType:
    """The sim package (stdlib only), loaded as ``sparksim_under_test``."""
    load_standalone("sparksim_under_test", REPO / "sparksim")
    for sub in ("topology", "node", "netns"):
        importlib.import_module(f"sparksim_under_test.{sub}")
    return sys.modules["sparksim_under_test"]


@pytest.fixture(scope="session")
def tools() -> ModuleType:
    """The node tools package, loaded standalone as on a node."""
    load_standalone("sparksim_tools_under_test", REPO / "sparksim" / "tools")
    for sub in ("ports", "links", "gpu"):
        importlib.import_module(f"sparksim_tools_under_test.{sub}")
    return sys.modules["sparksim_tools_under_test"]


def _missing() -> str | None:
    if sys.platform != "linux":
        return "sparksim needs Linux network namespaces"
    if os.geteuid() != 0:
        return "sparksim needs root (network namespaces, veth, tc, sshd)"
    for tool in ("ip", "tc", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (iproute2, util-linux, openssh-client)"
    if not os.access("/usr/sbin/sshd", os.X_OK):
        return "/usr/sbin/sshd not installed (apt-get install openssh-server)"
    return None


SKIP_REASON = _missing()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SKIP_REASON is None:
        return
    here = Path(__file__).parent
    for item in items:
        if item.get_closest_marker("sim") and here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


# The sim run as a directory: standard library only, without importing pytest_spark
# (whose dependencies cost ~1 s per call); `-m sparksim` is tested separately.
SPARK_SIM = [sys.executable, "-I", str(REPO / "sparksim")]


def spark_sim(state_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``spark-sim --state-dir DIR ARGS`` as a user would (a separate process)."""
    env = {k: v for k, v in os.environ.items() if k != "SPARKSIM_STATE_DIR"}
    proc = subprocess.run(
        [*SPARK_SIM, "--state-dir", str(state_dir), *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
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
    # One multiplexed SSH connection per node (a fresh login costs 0.2-0.4 s here).
    control_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="spk")))

    @property
    def instance(self) -> int:
        return int(self.cluster["instance"])

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.cluster["nodes"] if n["name"] == name)

    def ssh(self, name: str, command: str, *opts: str) -> subprocess.CompletedProcess[str]:
        """``ssh NODE COMMAND``; ``opts`` come first, so they win over the mux options."""
        mgmt = self.node(name)["mgmt"]
        mux = [
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={self.control_dir}/%C",
            "-o",
            "ControlPersist=30",
        ]
        return subprocess.run(
            ["ssh", "-F", self.cluster["ssh_config"], *opts, *mux, mgmt, command],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip

    def close(self) -> None:
        """Stop the multiplexing masters (they also exit when the sim goes down)."""
        for node in self.cluster["nodes"]:
            subprocess.run(
                ["ssh", "-F", self.cluster["ssh_config"], "-o",
                 f"ControlPath={self.control_dir}/%C", "-O", "exit", node["mgmt"]],
                capture_output=True, timeout=10,
            )  # fmt: skip
        shutil.rmtree(self.control_dir, ignore_errors=True)

    def out(self, name: str, command: str) -> str:
        proc = self.ssh(name, command)
        assert proc.returncode == 0, f"{name}: {command!r} -> {proc.returncode}: {proc.stderr}"
        return proc.stdout

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return spark_sim(self.state_dir, *args, check=check)

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.cli("status", "--json").stdout)
        return data


def start_sim(state_dir: Path, nodes: int = 2) -> Sim:
    proc = spark_sim(state_dir, "up", "--nodes", str(nodes))
    return Sim(state_dir=state_dir, cluster=json.loads(proc.stdout))


@pytest.fixture(scope="session")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """One two-node sim for the whole session, always taken down."""
    if SKIP_REASON is not None:
        pytest.skip(SKIP_REASON)
    state_dir = tmp_path_factory.mktemp("sparksim")
    started = None
    try:
        started = start_sim(state_dir)
        yield started
    finally:
        if started is not None:
            started.close()
        spark_sim(state_dir, "down", check=False)


@pytest.fixture
def healthy_sim(sim: Sim) -> Iterator[Sim]:
    """The session sim, with every fault cleared after the test."""
    yield sim
    sim.cli("fault", "clear")


@pytest.fixture(name="spark_sim")
def spark_sim_fixture() -> Any:
    """The CLI runner: ``spark_sim(state_dir, *args, check=True)``."""
    return spark_sim


@pytest.fixture
def spark_sim_argv() -> list[str]:
    """The command line that runs spark-sim."""
    return list(SPARK_SIM)


@pytest.fixture(name="start_sim")
def start_sim_fixture() -> Iterator[Any]:
    """``start_sim(state_dir, nodes=2) -> Sim`` (take it down with own_state_dir)."""
    started: list[Sim] = []

    def start(state_dir: Path, nodes: int = 2) -> Sim:
        started.append(start_sim(state_dir, nodes))
        return started[-1]

    yield start
    for one in started:
        one.close()


@pytest.fixture
def own_state_dir(tmp_path: Path) -> Iterator[Path]:
    """A state dir for a test that brings up its own sim; always taken down."""
    state_dir = tmp_path / "sim"
    try:
        yield state_dir
    finally:
        spark_sim(state_dir, "down", check=False)
