"""The one interface every launcher plug-in answers (:class:`ClusterLauncher`), as
testinfra picks a backend and xdist a scheduler:

- ``describe()``: one line for notices and the report (``launch-cluster.sh on spark-head``,
  ``sparkrun run RECIPE --hosts ...``);
- ``stand_up(record, notify)``: start the cluster and return when the readiness watch can
  take over (:class:`StoodUp`: ray or no-ray when the launcher decides it); ``record``
  saves, before anything is started, what teardown needs, so that an interrupt during the
  start still stops what was started;
- ``watch()``: once stood up, what the readiness watch follows: the serving container on
  each node and where vLLM's output is (``ServingLayout``);
- ``serve_log()``: once stood up, the launcher's own process and output on the head when
  it keeps them (:class:`LauncherLog`), else None;
- ``tear_down(cluster, state)`` (a static method: teardown runs in the controller from the
  saved state alone): stop what ``stand_up`` started, and say what could not be stopped.

A launcher class is built with ``(cluster, settings, run_dir, mode, mode_source)``
(:class:`LauncherClass`) and listed by its ``name`` in ``registry.LAUNCHERS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pytest_spark.access.cluster import Cluster
from pytest_spark.access.layout import ServingLayout
from pytest_spark.settings.resolve import Settings


class LaunchError(Exception):
    """The launcher could not be started or answered with an error (its own words)."""


class NotServing(Exception):
    """The cluster is not (and will not become) ready; the message says what was found."""


Record = Callable[[Mapping[str, Any]], None]  # what teardown needs, saved at once
Notify = Callable[[str], None]
Sleep = Callable[[float], None]
Now = Callable[[], float]


@dataclass(frozen=True)
class StoodUp:
    """What ``stand_up`` knows once the cluster is started: ray / no-ray when the launcher
    decides it, and how that is known (None: the settings say)."""

    mode: str | None = None
    mode_source: str = ""


@dataclass(frozen=True)
class LauncherLog:
    """The launcher's own process on the head and its output, while it keeps running
    (launch-cluster.sh backgrounded there). ``read()``: its last lines; ``path``: the file
    on the head, read by the watch's probe as the head's vLLM output; ``until_container_log``:
    that file holds the head's vLLM output only until the head's container log shows some
    (no Ray: launch-cluster.sh since 2026-09-15 writes it to the container log too);
    ``exit_file``: a file in the head's container the launcher writes the head command's
    exit status to (launch-cluster.sh's sentinel), read while no ``vllm serve`` runs."""

    pid: int
    read: Callable[[], str]
    path: str
    until_container_log: bool = False
    exit_file: str | None = None


class ClusterLauncher(Protocol):
    """A launcher plug-in (module docstring)."""

    name: str

    def describe(self) -> str: ...

    def stand_up(self, record: Record, notify: Notify | None = None) -> StoodUp: ...

    def watch(self) -> ServingLayout: ...

    def serve_log(self) -> LauncherLog | None: ...

    @staticmethod
    def tear_down(
        cluster: Cluster, state: Mapping[str, Any], sleep: Sleep = ..., now: Now = ...
    ) -> str | None: ...


class LauncherClass(Protocol):
    """A launcher class as the registry lists it: built per launch, torn down from the
    saved state alone."""

    name: str

    def __call__(
        self,
        cluster: Cluster,
        settings: Settings,
        run_dir: Path,
        mode: str | None = None,
        mode_source: str = "",
    ) -> ClusterLauncher: ...

    def tear_down(
        self,
        cluster: Cluster,
        state: Mapping[str, Any],
        sleep: Sleep = ...,
        now: Now = ...,
    ) -> str | None: ...
