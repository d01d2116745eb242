"""``--spark-launcher``'s names -> launcher plug-ins: the one table a new launcher adds a
line to (its name is also one of ``settings.parsers.LAUNCHER_NAMES``, the option's
choices: settings imports nothing of this package; tests/test_sparkrun_launcher.py keeps
the two in step)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_spark.access.cluster import Cluster
from pytest_spark.launchers.base import ClusterLauncher, LauncherClass, Now, Sleep
from pytest_spark.launchers.launch_cluster.launcher import LaunchClusterSh
from pytest_spark.launchers.sparkrun import SparkrunLauncher
from pytest_spark.settings.resolve import Settings

LAUNCHERS: dict[str, LauncherClass] = {
    LaunchClusterSh.name: LaunchClusterSh,
    SparkrunLauncher.name: SparkrunLauncher,
}
DEFAULT = LaunchClusterSh.name  # a saved state without "launcher" is launch-cluster.sh's


def make_launcher(
    cluster: Cluster, settings: Settings, run_dir: Path, mode: str | None, mode_source: str
) -> ClusterLauncher:
    """The plug-in ``--spark-launcher`` names, ready to stand the cluster up."""
    return LAUNCHERS[settings.launcher](cluster, settings, run_dir, mode, mode_source)


def tear_down(
    cluster: Cluster,
    state: Mapping[str, Any],
    sleep: Sleep = time.sleep,
    now: Now = time.monotonic,
) -> str | None:
    """Stop what the saved ``state`` says was launched, with the launcher that launched it
    (its ``launcher`` entry; may raise RemoteError)."""
    return LAUNCHERS[state.get("launcher", DEFAULT)].tear_down(cluster, state, sleep, now)
