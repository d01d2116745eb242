"""Launching as a plug-in (pytest_spark/launchers/): every launcher answers one interface,
the registry is the one table of them, and the readiness launch calls a launcher only
through that interface: a third launcher is one module and one registry line (here a
scripted one, registered for the test), with no change to readiness."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conn_fakes import FakeConn

from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.layout import ServingLayout
from pytest_spark.launchers import base, registry
from pytest_spark.readiness import launch
from pytest_spark.readiness.waitstate import WaitSpec

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_spark"
INTERFACE = ("describe", "stand_up", "watch", "serve_log", "tear_down")


def test_every_registered_launcher_answers_the_whole_interface() -> None:
    for name, cls in registry.LAUNCHERS.items():
        assert cls.name == name
        missing = [m for m in INTERFACE if not callable(getattr(cls, m, None))]
        assert not missing, f"{name} lacks {missing}"
        # teardown runs in the controller from the saved state alone: no instance
        assert isinstance(inspect.getattr_static(cls, "tear_down"), staticmethod), name


def test_readiness_reaches_launchers_only_through_the_interface() -> None:
    """No module of readiness imports a concrete launcher: only the interface (base), the
    registry and the container states."""
    allowed = {
        "pytest_spark.launchers",
        "pytest_spark.launchers.base",
        "pytest_spark.launchers.registry",
        "pytest_spark.launchers.containers",
    }
    found = {}
    for path in sorted((PACKAGE / "readiness").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "pytest_spark.launchers"
            ):
                module = node.module or ""
                if module == "pytest_spark.launchers":  # `from ... import registry`
                    names = {f"{module}.{a.name}" for a in node.names}
                else:
                    names = {module}
                if names - allowed:
                    found[path.name] = sorted(names - allowed)
    assert not found, found


class ThirdLauncher:
    """A launcher that is neither launch-cluster.sh nor sparkrun: containers named per node,
    vLLM's output in a file inside them, a process of its own on the head."""

    name = "third"
    torn: list[Mapping[str, Any]] = []

    def __init__(
        self,
        cluster: Cluster,
        settings: Any,
        run_dir: Path,
        mode: str | None = None,
        mode_source: str = "",
    ) -> None:
        self.cluster = cluster

    def describe(self) -> str:
        return "third on spark-head"

    def stand_up(self, record: base.Record, notify: base.Notify | None = None) -> base.StoodUp:
        record({"launcher": self.name, "token": "t-1"})
        return base.StoodUp(mode="no-ray", mode_source="the third launcher")

    def watch(self) -> ServingLayout:
        names = {n.name: f"third_{i}" for i, n in enumerate(self.cluster.nodes)}
        return ServingLayout("third_0", names, serve_log="/tmp/third.log")

    def serve_log(self) -> base.LauncherLog | None:
        return base.LauncherLog(4242, lambda: "third's last line\n", "/tmp/third-launcher.log")

    @staticmethod
    def tear_down(
        cluster: Cluster, state: Mapping[str, Any], sleep: Any = None, now: Any = None
    ) -> str | None:
        ThirdLauncher.torn.append(dict(state))
        return None


class FakeCluster(Cluster):
    def __init__(self) -> None:
        self.nodes = [
            Node(name, role, name, FakeConn(name, lambda _c: (0, "", "")))  # type: ignore[arg-type]
            for name, role in (("spark-head", "head"), ("spark-worker-1", "worker"))
        ]
        self._connected = True


def test_a_third_launcher_is_launched_watched_and_torn_down_through_the_interface(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(registry.LAUNCHERS, ThirdLauncher.name, ThirdLauncher)
    specs: list[WaitSpec] = []

    def wait_ready(cluster: Cluster, spec: WaitSpec, **_: Any) -> Any:
        specs.append(spec)
        return SimpleNamespace(timeline=lambda: [{"phase": "ready"}], facts={})

    monkeypatch.setattr(launch, "wait_ready", wait_ready)
    settings: Any = SimpleNamespace(
        launch=True,
        launcher="third",
        ray="auto",
        serve_args="vllm serve m --tensor-parallel-size 2",
        container="vllm_node",
        port=8000,
        ready_timeout=60.0,
        hang_timeout=30.0,
        profile=SimpleNamespace(readiness=SimpleNamespace(placement_group_timeout_s=20.0)),
        source=lambda attr: "default",
    )
    cluster = FakeCluster()
    info = launch.ensure_serving(cluster, settings, tmp_path)
    assert info.launched and info.mode == "no-ray" and info.mode_source == "the third launcher"
    (spec,) = specs
    # what watch() and serve_log() said is what the readiness wait watches
    assert spec.containers == {"spark-head": "third_0", "spark-worker-1": "third_1"}
    assert spec.serve_log == "/tmp/third.log"
    assert spec.launcher_pid == 4242 and spec.launcher_log_path == "/tmp/third-launcher.log"
    assert spec.launcher_log is not None and spec.launcher_log() == "third's last line\n"
    assert cluster.layout.containers["spark-worker-1"] == "third_1"
    # teardown finds the launcher by the name its stand_up recorded
    assert launch.stop_if_launched(cluster, tmp_path, keep=False) is None
    assert ThirdLauncher.torn[-1]["token"] == "t-1"
