"""The fabric counters of every node, read before and after each measurement that sends
traffic (:func:`counted`: the all-reduce run, the throughput sweep). The readings go to
the session's run directory (``counters-<name>.json``, beside ``measure-<name>.json``),
so the check reads them in whichever xdist worker runs it; the check is pure
(:mod:`pytest_spark.infra.counters.check`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from pytest_spark.access.cluster import Cluster
from pytest_spark.access.files import write_json
from pytest_spark.infra.counters.probe import NodeCounters, counters_probe_command, parse_counters
from pytest_spark.infra.errors import ParseError
from pytest_spark.measure.once import MEASURE_KEY

__all__ = ["WINDOWS", "Window", "counted", "windows"]

T = TypeVar("T")
# The measurements that send traffic over the fabric, and what a message calls them.
WINDOWS = {"collective-run": "the all-reduce run", "throughput-sweep": "the throughput sweep"}


@dataclass(frozen=True)
class Window:
    """One measurement's readings: node -> counters (or why they could not be read)."""

    name: str
    before: dict[str, NodeCounters | str]
    after: dict[str, NodeCounters | str]

    @property
    def what(self) -> str:
        return WINDOWS.get(self.name, self.name)


def _read(cluster: Cluster) -> dict[str, dict[str, str]]:
    command = counters_probe_command()
    out: dict[str, dict[str, str]] = {}
    for name, result in cluster.map(lambda node: node.run(command, timeout=60)).items():
        out[name] = (
            {"text": result.stdout} if not isinstance(result, Exception) else {"error": str(result)}
        )
    return out


def _decode(doc: dict[str, dict[str, str]]) -> dict[str, NodeCounters | str]:
    out: dict[str, NodeCounters | str] = {}
    for node, entry in doc.items():
        if "text" not in entry:
            out[node] = entry.get("error", "not read")
            continue
        try:
            out[node] = parse_counters(entry["text"])
        except ParseError as exc:
            out[node] = str(exc)
    return out


def _dir(config: pytest.Config) -> Path | None:
    measurements = config.stash.get(MEASURE_KEY, None)
    return measurements.run_dir if measurements is not None else None


def counted(
    config: pytest.Config, cluster: Cluster, name: str, compute: Callable[[], T]
) -> Callable[[], T]:
    """``compute`` with every node's counters read before and after it (kept for
    :func:`windows`); a reading that fails is kept as its error, never fails the
    measurement."""

    def run() -> T:
        before = _read(cluster)
        try:
            return compute()
        finally:
            where = _dir(config)
            if where is not None:
                write_json(
                    where / f"counters-{name}.json", {"before": before, "after": _read(cluster)}
                )

    return run


def windows(config: pytest.Config) -> list[Window]:
    """The readings of the measurements that ran in this session, in :data:`WINDOWS`'
    order."""
    where = _dir(config)
    out = []
    for name in WINDOWS:
        path = where / f"counters-{name}.json" if where is not None else None
        if path is None or not path.exists():
            continue
        doc = json.loads(path.read_text())
        out.append(Window(name, _decode(doc["before"]), _decode(doc["after"])))
    return out
