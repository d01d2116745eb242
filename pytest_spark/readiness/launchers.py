"""What ``--spark-launch`` starts the serving cluster with: a launcher plug-in chosen by
name (``--spark-launcher``), as testinfra picks a backend and xdist a scheduler.

Every launcher answers three things (:class:`ClusterLauncher`):

- ``describe()``: one line for notices and the report (``launch-cluster.sh on spark-head``,
  ``sparkrun run RECIPE --hosts ...``);
- ``stand_up(record, notify)``: start the cluster and return when the readiness watch can
  take over (:class:`StoodUp`: the launcher's own process and log, if it keeps one, and
  what its containers are); ``record`` saves, before anything is started, what teardown
  needs, so that an interrupt during the start still stops what was started;
- ``tear_down(cluster, state)`` (a static method: teardown runs in the controller from the
  saved state alone): stop what ``stand_up`` started, and say what could not be stopped.

Launchers: ``launch-cluster`` (eugr/spark-vllm-docker's ``launch-cluster.sh`` on the head,
readiness/launch.py, the default) and ``sparkrun`` (the sparkrun CLI on this machine,
readiness/sparkrun_launch.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_spark.access.cluster import Cluster


class LaunchError(Exception):
    """The launcher could not be started or answered with an error (its own words)."""


Record = Callable[[Mapping[str, Any]], None]  # what teardown needs, saved at once
Notify = Callable[[str], None]


@dataclass(frozen=True)
class StoodUp:
    """What a launcher started, for the readiness watch. ``container``: one serving
    container name on every node (launch-cluster.sh's); ``job``: a sparkrun job's cluster
    id, its containers found by their labels; ``pid``/``log``/``log_path``: the launcher's
    own process on the head and its output, when it keeps running (launch-cluster.sh);
    ``mode``: ray / no-ray when the launcher decides it, and how that is known."""

    container: str | None = None
    job: str | None = None
    pid: int | None = None
    log: Callable[[], str] | None = None
    log_path: str | None = None
    mode: str | None = None
    mode_source: str = ""
    facts: Mapping[str, str] = field(default_factory=dict)


class ClusterLauncher(Protocol):
    """A launcher plug-in (module docstring)."""

    name: str

    def describe(self) -> str: ...

    def stand_up(self, record: Record, notify: Notify | None = None) -> StoodUp: ...

    @staticmethod
    def tear_down(cluster: Cluster, state: Mapping[str, Any]) -> str | None: ...
