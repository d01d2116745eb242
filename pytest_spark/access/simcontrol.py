"""Drive sparksim through its CLI (the suite never imports the simulator)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_spark.settings.resolve import Settings


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("spark-sim")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("spark-sim")
    return [found] if found else [sys.executable, "-m", "sparksim.cli"]


def spawn_env() -> dict[str, str]:
    """The environment for a child spawned off the main thread, as a snapshot.

    With ``env=None`` the child execs with the C ``environ`` itself, and CPython on Linux
    spawns through vfork: the child reads the parent's environment array while the main
    thread may be changing it (pytest sets and deletes PYTEST_CURRENT_TEST around every
    test phase; growing the array reallocates it). The exec then fails with EFAULT, "Bad
    address" (CI: a fault-matrix lane's ``spark-sim fault clear``; 109 of 4,500 spawns
    in a repro on this kernel). A snapshot is copied into the child's own envp first;
    copying retries when a key goes while it is read (os.environ reads key by key)."""
    while True:
        try:
            return dict(os.environ)
        except KeyError:
            continue


@dataclass
class SimCluster:
    """A sparksim instance stood up for this session."""

    state_dir: Path
    info: dict[str, Any]
    owned: bool = True

    @property
    def head(self) -> str:
        return str(self.info["nodes"][0]["mgmt"])

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(str(n["mgmt"]) for n in self.info["nodes"][1:])

    @property
    def ssh_config(self) -> Path:
        return Path(self.info["ssh_config"])

    def cli(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*_cli(), "--state-dir", str(self.state_dir), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=spawn_env(),
        )

    def down(self) -> None:
        if not self.owned:
            return
        result = self.cli("down")
        if result.returncode != 0:
            sys.stderr.write(f"spark-sim down failed:\n{result.stderr}\n")
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.owned = False


def sim_up(nodes: int, extra: tuple[str, ...] = ()) -> SimCluster:
    if os.geteuid() != 0:
        raise pytest.UsageError(
            "--spark-sim needs root (it creates network namespaces, links and an sshd per "
            "node); run as root or point --spark-head at a real cluster"
        )
    state_dir = Path(tempfile.mkdtemp(prefix="sparksim-"))
    sim = SimCluster(state_dir, {})
    result = sim.cli("up", "--nodes", str(nodes), *extra, timeout=600)
    if result.returncode != 0:
        sim.down()
        raise pytest.UsageError(
            f"spark-sim up failed (exit {result.returncode}):\n"
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    sim.info = json.loads((state_dir / "cluster.json").read_text())
    return sim


def sim_attach(cluster_json: Path) -> SimCluster:
    """A worker process (xdist) attaching to the controller's sim; it never tears down."""
    info = json.loads(cluster_json.read_text())
    return SimCluster(cluster_json.parent, info, owned=False)


def served_by_sim(settings: Settings, sim: SimCluster) -> Settings:
    """The settings pointed at the simulated cluster (its nodes, its ssh_config, root), and
    served as the sim says it is (launch script, image, container...) where the user's own
    settings do not say otherwise."""
    settings = settings.replace(
        head=sim.head, workers=sim.workers, ssh_config=sim.ssh_config, user="root"
    )
    launch = sim.info.get("launch")
    if launch:  # how the sim says it is served; the user's own settings win
        hints = {
            "launch": True,
            "launch_script": launch["script"],
            "image": launch["image"],
            "container": launch["container"],
            "port": launch["port"],
            "serve_args": launch["serve_args"],
            "model_dir": launch.get("model_dir"),
            "ray": {"ray": "on", "no-ray": "off"}.get(launch.get("mode", "")),
        }
        settings = settings.replace(
            **{k: v for k, v in hints.items() if v is not None and settings.source(k) == "default"}
        )
    return settings
