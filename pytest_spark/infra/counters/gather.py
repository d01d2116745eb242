"""The fabric counters of every node, read before and after each measurement that sends
traffic (:func:`counted`: the all-reduce run, the throughput sweep). The readings go to
the session's run directory (``counters-<name>.json``, beside ``measure-<name>.json``),
so the check reads them in whichever xdist worker runs it; the check is pure
(:mod:`pytest_spark.infra.counters.check`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pytest_spark.access.cluster import Cluster
from pytest_spark.access.files import write_json
from pytest_spark.infra.counters.probe import (
    WINDOWS,
    NodeCounters,
    Window,
    counters_probe_command,
    parse_counters,
)
from pytest_spark.infra.errors import ParseError

__all__ = ["counted", "windows"]

T = TypeVar("T")


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


def counted(
    where: Path | None, cluster: Cluster, name: str, compute: Callable[[], T]
) -> Callable[[], T]:
    """``compute`` with every node's counters read before and after it, kept in
    ``where`` (the session's run directory, :func:`pytest_spark.measure.once.measure_dir`;
    None: not kept) for :func:`windows`; a reading that fails is kept as its error, never
    fails the measurement."""

    def run() -> T:
        before = _read(cluster)
        try:
            return compute()
        finally:
            if where is not None:
                write_json(
                    where / f"counters-{name}.json", {"before": before, "after": _read(cluster)}
                )

    return run


def windows(where: Path | None) -> list[Window]:
    """The readings kept in ``where`` of the measurements that ran in this session, in
    :data:`WINDOWS`' order."""
    out = []
    for name in WINDOWS:
        path = where / f"counters-{name}.json" if where is not None else None
        if path is None or not path.exists():
            continue
        doc = json.loads(path.read_text())
        out.append(Window(name, _decode(doc["before"]), _decode(doc["after"])))
    return out
